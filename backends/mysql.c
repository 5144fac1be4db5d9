/*
 * mysql://[user[:password]@]host[:port]/database[?options] (also mariadb://):
 * locks are InnoDB rows, through MariaDB Connector/C (libmariadb). The
 * server may be MariaDB (10.3 or later) or MySQL (8.0 or later).
 *
 * A held lock is an open transaction holding the row lock of its name
 * (`SELECT 1 FROM <table> WHERE k = ? FOR UPDATE`); rolling the transaction
 * back releases it, and so does the server when the session ends. Waiters
 * block in InnoDB's own lock queue, which grants the row to the next waiter
 * inside the releaser's ROLLBACK: no polling, no herd, no barging.
 *
 * Sessions. One transaction per session, so every held lock has its own
 * session (releasing one lock must not release another). A client keeps a
 * small pool of idle lock sessions, plus one autocommit "control" session
 * for what must not wait for, or be undone with, a lock transaction: the
 * fencing token, creating rows, and KILL QUERY to end a wait at its
 * deadline.
 *
 * Fencing token. It must be committed while the lock is held (a holder that
 * dies rolls back its transaction, and the next holder must still get a
 * higher token), but the lock row is locked by the holder's own open
 * transaction. So the token lives in another table, <table>_grants, and the
 * control session bumps it in autocommit right after the grant, one round
 * trip: INSERT ... ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1).
 *
 * Lease. The holding session is the lease: its wait_timeout is the TTL
 * rounded up to whole seconds, so a holder that stops talking (paused,
 * partitioned, dead) has its session closed by the server, which rolls the
 * transaction back. Renew is one SET of wait_timeout (it also resets the
 * idle timer). The client also remembers the TTL on CLOCK_MONOTONIC, so a
 * renew or release after it reports DLOCK_ELOST even within the rounding.
 *
 * Deadlines. innodb_lock_wait_timeout counts whole seconds, so it is set to
 * cover the deadline (a server-side backstop) and the wait itself runs on
 * the non-blocking API, polling the socket until the exact deadline; then
 * the control session sends KILL QUERY, and the transaction is rolled back.
 *
 * Bounds. Connecting is bounded by connect_timeout (whole seconds, the
 * server's greeting included), every other statement by `timeout`: a try's
 * lock, renew, keep and release on the non-blocking API to the
 * millisecond, the rest by Connector/C's read and write timeouts (whole
 * seconds). No reply in time closes the session (DLOCK_ECONNECT naming the
 * timeout); the server rolls back once it notices, at the latest after the
 * session's wait_timeout. A session that timed out is never retried on a
 * new one (the retry would wait as long again); one the server dropped
 * while idle is. A wait without a deadline has no client-side bound: TCP
 * keepalives (idle 5 s, every 2 s, 3 probes) end it about 11 s after the
 * peer or the network died, and TCP_USER_TIMEOUT (= timeout) fails a
 * connection whose sent data stays unacknowledged.
 *
 * Keeping. keep() renews on the lock's own session (SET SESSION
 * wait_timeout), bounded by the timeout and the lease's end, and touches
 * nothing else: the pool and the control session belong to the
 * application's thread. A grant after a wait counts its lease from the
 * grant's arrival.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <errmsg.h>
#include <mysql.h>
#include <mysqld_error.h>

#include "config.h"
#include "core/internal.h"
#include "core/sha256.h"

#ifndef LIBMARIADB
#error "the mysql backend needs MariaDB Connector/C (libmariadb) for its non-blocking API"
#endif

#define DEFAULT_PORT 3306
#define DEFAULT_CONNECT_MS 5000
#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_TABLE "dlock_locks"
#define TABLE_NAME_MAX 57      /* 64 (MySQL's identifier limit) - "_grants" */
#define NAME_COLUMN_MAX 255    /* bytes of the name kept for people to read */
#define LOCK_WAIT_MAX_S 1073741824u /* innodb_lock_wait_timeout's maximum */
#define IDLE_SESSIONS_MAX 4
#define MS 1000000ull

/* Server errors not in every client's headers. */
#define ERR_LOCK_NOWAIT 3572             /* MySQL 8: NOWAIT found the row locked */
#define ERR_CLIENT_INTERACTION_TIMEOUT 4031 /* MySQL 8.0.24+: wait_timeout closed us */
#define ERR_ACCESS_DENIED_NO_PASSWORD 1698

static const char *const mysql_schemes[] = {"mysql", "mariadb", NULL};
static const char *const mysql_options_list[] = {
    "connect_timeout", "timeout", "table", "socket", "tls", "tls_ca", "tls_cert", "tls_key", NULL,
};

enum stmt_id { ST_LOCK_WAIT, ST_LOCK_NOWAIT, ST_CREATE_ROW, ST_GRANT, N_STMTS };

/* "@T" stands for the lock table's name. */
static const char *const stmt_sql[N_STMTS] = {
    [ST_LOCK_WAIT] = "SELECT 1 FROM `@T` WHERE k = ? FOR UPDATE",
    [ST_LOCK_NOWAIT] = "SELECT 1 FROM `@T` WHERE k = ? FOR UPDATE NOWAIT",
    [ST_CREATE_ROW] = "INSERT IGNORE INTO `@T` (k, name, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))",
    [ST_GRANT] = "INSERT INTO `@T_grants` (k, token, owner, session_id, acquired_at) "
                 "VALUES (?, LAST_INSERT_ID(1), ?, ?, UTC_TIMESTAMP(6)) "
                 "ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), owner = ?, "
                 "session_id = ?, acquired_at = UTC_TIMESTAMP(6)",
};

static const char *const create_sql[] = {
    "CREATE TABLE IF NOT EXISTS `@T` ("
    " k BINARY(32) NOT NULL PRIMARY KEY COMMENT 'SHA-256 of the lock name',"
    " name VARBINARY(255) NOT NULL COMMENT 'the name, cut to 255 bytes, for people',"
    " created_at DATETIME(6) NOT NULL COMMENT 'UTC'"
    ") ENGINE=InnoDB COMMENT='dlock: one row per lock name, row-locked by its holder'",
    "CREATE TABLE IF NOT EXISTS `@T_grants` ("
    " k BINARY(32) NOT NULL PRIMARY KEY COMMENT 'SHA-256 of the lock name',"
    " token BIGINT UNSIGNED NOT NULL COMMENT 'fencing token of the latest grant',"
    " owner CHAR(32) CHARACTER SET ascii NOT NULL COMMENT 'owner id of the latest grant',"
    " session_id BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of the holding session',"
    " acquired_at DATETIME(6) NOT NULL COMMENT 'UTC'"
    ") ENGINE=InnoDB COMMENT='dlock: latest grant of each lock, committed at grant time'",
};

struct session {
    MYSQL *db;
    MYSQL_STMT *stmt[N_STMTS]; /* prepared on first use */
    unsigned wait_timeout_s;   /* as last set by us; 0 = server default */
    unsigned lock_wait_s;      /* innodb_lock_wait_timeout as last set; 0 = default */
    unsigned last_errno;       /* of the last failure on it */
    int dead;                  /* the server dropped it: close, never reuse */
    uint64_t silent_ms;        /* dead because no reply came in this long:
                                  the server may still be working on it, so
                                  a retry would only wait again; 0: no */
    struct session *next;      /* in the idle pool */
};

struct mysql_conn {
    dlock_conn base;
    char *host, *user, *password, *database, *socket, *table;
    char *tls_ca, *tls_cert, *tls_key;
    unsigned port;
    int tls; /* 0 off, 1 encrypt, 2 encrypt and verify the server */
    uint64_t connect_ms, timeout_ms;
    char where[128];        /* "host:port" or the socket path, for messages */
    char *sql[N_STMTS];
    struct session *ctl;    /* autocommit control session; NULL after it dropped */
    struct session *idle;   /* pool of idle lock sessions */
    unsigned nidle;
};

struct mysql_held {
    dlock_held base;
    struct session *s;      /* holding session; NULL once the lock is lost */
    unsigned char k[DLOCK_SHA256_LEN];
    uint32_t ttl_ms;
    uint64_t expires_ns;    /* end of the lease as the client sees it */
};

static dlock_client *cl(struct mysql_conn *mc)
{
    return mc->base.client;
}

static unsigned ceil_s(uint64_t ms)
{
    uint64_t s = (ms + 999) / 1000;
    return s == 0 ? 1 : s > LOCK_WAIT_MAX_S ? LOCK_WAIT_MAX_S : (unsigned)s;
}

/* ---- errors ------------------------------------------------------------- */

/* The session is gone: killed, timed out by wait_timeout, server restarted. */
static int session_dropped(unsigned e)
{
    return e == CR_SERVER_GONE_ERROR || e == CR_SERVER_LOST || e == CR_SERVER_LOST_EXTENDED ||
           e == ER_CONNECTION_KILLED || e == ER_SERVER_SHUTDOWN ||
           e == ERR_CLIENT_INTERACTION_TIMEOUT || e == CR_CONN_HOST_ERROR ||
           e == CR_CONNECTION_ERROR;
}

static int map_errno(unsigned e)
{
    switch (e) {
    case ER_ACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ERR_ACCESS_DENIED_NO_PASSWORD:
    case CR_AUTH_PLUGIN_CANNOT_LOAD:
        return DLOCK_EAUTH;
    case ER_LOCK_WAIT_TIMEOUT:
        return DLOCK_ETIMEDOUT;
    case ERR_LOCK_NOWAIT:
        return DLOCK_EBUSY;
    case ER_LOCK_DEADLOCK:
        return DLOCK_EDEADLK;
    case CR_OUT_OF_MEMORY:
        return DLOCK_ENOMEM;
    case CR_COMMANDS_OUT_OF_SYNC:
    case CR_MALFORMED_PACKET:
        return DLOCK_EPROTO;
    case CR_UNKNOWN_HOST:
    case CR_SSL_CONNECTION_ERROR:
    case ER_CON_COUNT_ERROR:
    case ER_TOO_MANY_USER_CONNECTIONS:
        return DLOCK_ECONNECT;
    default:
        return session_dropped(e) ? DLOCK_ECONNECT : DLOCK_ESTORE;
    }
}

/* Records the last error of s (of its statement st when given), and
 * whether it means the session itself is gone. */
static int fail_on(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, const char *what)
{
    int sys = errno; /* Connector/C leaves ETIMEDOUT there after a read or write timeout */
    unsigned e = st ? mysql_stmt_errno(st) : mysql_errno(s->db);
    s->last_errno = e;
    if (session_dropped(e))
        s->dead = 1;
    if (e == CR_SERVER_LOST && sys == ETIMEDOUT) {
        s->silent_ms = ceil_s(mc->timeout_ms) * 1000ull;
        return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                            "mysql %s: %s: the connection timed out (no reply within the %" PRIu64
                            " ms timeout, or keepalive probes unanswered); the session was closed",
                            mc->where, what, s->silent_ms);
    }
    return dlock_seterr(cl(mc), map_errno(e), "mysql %s: %s: %s (%u)", mc->where, what,
                        st ? mysql_stmt_error(st) : mysql_error(s->db), e);
}

/* No reply by a deadline of the client's own: the session is unusable (a
 * statement is outstanding); the caller closes it. */
static int no_reply(struct mysql_conn *mc, struct session *s, const char *what, uint64_t start)
{
    uint64_t ms = (dlock_monotonic_ns() - start + MS / 2) / MS;
    s->dead = 1;
    s->silent_ms = ms ? ms : 1;
    return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                        "mysql %s: %s: no reply from the server within %" PRIu64
                        " ms; the session was closed", mc->where, what, s->silent_ms);
}

/* ---- sessions ----------------------------------------------------------- */

static void session_close(struct session *s)
{
    if (!s)
        return;
    for (int i = 0; i < N_STMTS; i++)
        if (s->stmt[i])
            mysql_stmt_close(s->stmt[i]);
    mysql_close(s->db);
    free(s);
}

static void set_tls(struct mysql_conn *mc, MYSQL *db)
{
    my_bool yes = 1, verify = mc->tls == 2;
    if (!mc->tls)
        return;
    mysql_options(db, MYSQL_OPT_SSL_ENFORCE, &yes);
    mysql_options(db, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify);
    if (mc->tls_ca)
        mysql_options(db, MYSQL_OPT_SSL_CA, mc->tls_ca);
    if (mc->tls_cert)
        mysql_options(db, MYSQL_OPT_SSL_CERT, mc->tls_cert);
    if (mc->tls_key)
        mysql_options(db, MYSQL_OPT_SSL_KEY, mc->tls_key);
}

/* A dead peer or a cut network must end even a wait without a deadline:
 * TCP keepalives probe an idle connection after 5 s, every 2 s, 3 times,
 * and data left unacknowledged for the timeout fails the connection
 * (Connector/C only turns keepalives on, with the system's 2-hour
 * default). Not for unix sockets. */
static void tune_socket(struct mysql_conn *mc, MYSQL *db)
{
    int fd = (int)mysql_get_socket(db), on = 1, idle = 5, intvl = 2, cnt = 3;
    unsigned user_ms = mc->timeout_ms > UINT32_MAX ? UINT32_MAX : (unsigned)mc->timeout_ms;
    if (mc->socket || fd < 0)
        return;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

/* Lock sessions run READ COMMITTED (a FOR UPDATE on a missing row takes no
 * gap lock) without autocommit (the FOR UPDATE opens the transaction that
 * holds the lock). The control session autocommits, and gives up quickly
 * on a row lock: it only ever waits in the rare race of creating a row. */
static int session_open(struct mysql_conn *mc, int lock_role, struct session **out)
{
    struct session *s = calloc(1, sizeof *s);
    unsigned connect_s = ceil_s(mc->connect_ms), io_s = ceil_s(mc->timeout_ms), no = 0;
    my_bool off = 0;
    if (!s || !(s->db = mysql_init(NULL))) {
        free(s);
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    }
    mysql_options(s->db, MYSQL_OPT_CONNECT_TIMEOUT, &connect_s);
    mysql_options(s->db, MYSQL_OPT_READ_TIMEOUT, &io_s);
    mysql_options(s->db, MYSQL_OPT_WRITE_TIMEOUT, &io_s);
    mysql_options(s->db, MYSQL_OPT_RECONNECT, &off); /* a silent reconnect would hide a loss */
    mysql_options(s->db, MYSQL_OPT_LOCAL_INFILE, &no);
    mysql_options(s->db, MYSQL_OPT_NONBLOCK, 0);
    set_tls(mc, s->db);
    if (lock_role) {
        mysql_options(s->db, MYSQL_INIT_COMMAND,
                      "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
        mysql_options(s->db, MYSQL_INIT_COMMAND, "SET SESSION autocommit = 0");
    } else {
        mysql_options(s->db, MYSQL_INIT_COMMAND, "SET SESSION innodb_lock_wait_timeout = 1");
    }
    if (!mysql_real_connect(s->db, mc->socket ? "localhost" : mc->host, mc->user, mc->password,
                            mc->database, mc->port, mc->socket, 0)) {
        errno = 0; /* Connector/C's own message says what timed out */
        int err = fail_on(mc, s, NULL, "cannot connect");
        session_close(s);
        return err;
    }
    /* This Connector/C enforces TLS only together with verification: with
     * tls=on a server without TLS would get a plain session. */
    if (mc->tls && !mysql_get_ssl_cipher(s->db)) {
        session_close(s);
        return dlock_seterr(cl(mc), DLOCK_ECONNECT, "mysql %s: the server did not agree to TLS",
                            mc->where);
    }
    tune_socket(mc, s->db);
    *out = s;
    return 0;
}

static int prepare(struct mysql_conn *mc, struct session *s, enum stmt_id id, MYSQL_STMT **out)
{
    MYSQL_STMT *st = s->stmt[id];
    if (!st) {
        if (!(st = mysql_stmt_init(s->db)))
            return fail_on(mc, s, NULL, "cannot allocate a statement");
        if (mysql_stmt_prepare(st, mc->sql[id], strlen(mc->sql[id])) != 0) {
            int err = fail_on(mc, s, st, "prepare");
            mysql_stmt_close(st);
            return err;
        }
        s->stmt[id] = st;
    }
    *out = st;
    return 0;
}

/* A statement without a result; on error, records it and returns its code. */
static int exec_sql(struct mysql_conn *mc, struct session *s, const char *sql, const char *what)
{
    if (mysql_real_query(s->db, sql, strlen(sql)) != 0)
        return fail_on(mc, s, NULL, what);
    return 0;
}

static int ctl_session(struct mysql_conn *mc, struct session **out)
{
    int err = 0;
    if (!mc->ctl)
        err = session_open(mc, 0, &mc->ctl);
    *out = mc->ctl;
    return err;
}

/* After an error on the control session: drop it if the server did, so the
 * next use reconnects. Returns whether that is worth one retry now: not
 * when the server did not answer in time (a retry would wait as long
 * again, doubling the call's bound). */
static int ctl_dropped(struct mysql_conn *mc)
{
    if (!mc->ctl || !mc->ctl->dead)
        return 0;
    int retry = !mc->ctl->silent_ms;
    session_close(mc->ctl);
    mc->ctl = NULL;
    return retry;
}

/* A lock session from the pool (*pooled = 1; it may have been dropped by
 * the server while idle), or a new one. */
static int pool_get(struct mysql_conn *mc, struct session **out, int *pooled)
{
    *pooled = mc->idle != NULL;
    if (mc->idle) {
        *out = mc->idle;
        mc->idle = mc->idle->next;
        mc->nidle--;
        (*out)->next = NULL;
        return 0;
    }
    return session_open(mc, 1, out);
}

static void pool_put(struct mysql_conn *mc, struct session *s)
{
    if (mc->nidle >= IDLE_SESSIONS_MAX) {
        session_close(s);
        return;
    }
    s->next = mc->idle;
    mc->idle = s;
    mc->nidle++;
}

/* Ends a lock session's transaction (whatever it holds is released) and
 * pools it; a session that cannot roll back is closed, which makes the
 * server roll back. Keeps the error already recorded on the client. */
static void rollback_and_pool(struct mysql_conn *mc, struct session *s)
{
    if (mysql_rollback(s->db) != 0 && mysql_rollback(s->db) != 0) {
        session_close(s);
        return;
    }
    pool_put(mc, s);
}

/* ---- acquire ------------------------------------------------------------ */

static void bind_bytes(MYSQL_BIND *b, const void *p, unsigned long *len)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_BLOB;
    b->buffer = (void *)p;
    b->buffer_length = *len;
    b->length = len;
}

static void bind_u64(MYSQL_BIND *b, unsigned long long *v)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_LONGLONG;
    b->buffer = v;
    b->is_unsigned = 1;
}

/* The session's lease and server-side wait bound, set only when they
 * change, so a steady workload pays no round trip for them. */
static int set_limits(struct mysql_conn *mc, struct session *s, const dlock_request *req)
{
    unsigned lease = ceil_s(req->ttl_ms), wait = s->lock_wait_s;
    char sql[128];
    int n;
    if (req->wait == DLOCK_WAIT_FOREVER) {
        wait = LOCK_WAIT_MAX_S;
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t now = dlock_monotonic_ns();
        unsigned need = ceil_s((req->deadline_ns > now ? req->deadline_ns - now : 0) / 1000000u);
        /* Never shorter than the deadline (the client ends the wait at the
         * exact deadline); not much longer either, so that a waiter that
         * died leaves InnoDB's queue soon. */
        if (wait < need || wait > 2 * need + 2)
            wait = need;
    }
    if (lease == s->wait_timeout_s && wait == s->lock_wait_s)
        return 0;
    n = snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", lease);
    if (wait != s->lock_wait_s)
        snprintf(sql + n, sizeof sql - (size_t)n, ", innodb_lock_wait_timeout = %u", wait);
    int err = exec_sql(mc, s, sql, "cannot set the session's lease");
    if (err)
        return err;
    s->wait_timeout_s = lease;
    s->lock_wait_s = wait;
    return 0;
}

/*
 * Runs a started non-blocking call to its end, polling the socket: the
 * execute of st, or without st a mysql_real_query_start() on db. *status
 * is what the call waits for. Returns 0 when done (*ret is the call's
 * result), 1 when until_ns (0: no limit) passed first, 2 when a signal
 * interrupted the wait (only with intr; otherwise the wait goes on); in
 * both last cases the statement is still running on the server.
 */
static int drive(MYSQL *db, MYSQL_STMT *st, int *status, uint64_t until_ns, int *ret, int intr)
{
    while (*status) {
        struct pollfd pfd = {.fd = mysql_get_socket(db)};
        struct timespec ts, *tsp = NULL;
        if (*status & MYSQL_WAIT_READ)
            pfd.events |= POLLIN;
        if (*status & MYSQL_WAIT_WRITE)
            pfd.events |= POLLOUT;
        if (*status & MYSQL_WAIT_EXCEPT)
            pfd.events |= POLLPRI;
        if (until_ns) {
            uint64_t now = dlock_monotonic_ns();
            if (now >= until_ns)
                return 1;
            dlock_ns_to_timespec(until_ns - now, &ts);
            tsp = &ts;
        }
        int pr = ppoll(&pfd, 1, tsp, NULL);
        if (pr < 0 && (intr || errno != EINTR))
            return 2;
        if (pr < 0)
            continue;
        if (pr == 0)
            continue;
        int ev = 0;
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR))
            ev |= MYSQL_WAIT_READ;
        if (pfd.revents & (POLLOUT | POLLHUP | POLLERR))
            ev |= MYSQL_WAIT_WRITE;
        if (pfd.revents & POLLPRI)
            ev |= MYSQL_WAIT_EXCEPT;
        *status = st ? mysql_stmt_execute_cont(ret, st, ev & *status)
                     : mysql_real_query_cont(ret, db, ev & *status);
    }
    return 0;
}

/* A statement without a result on s, with no reply by until_ns ending it
 * with DLOCK_ECONNECT (s is then dead and silent: the caller closes it).
 * Only s is touched: safe on the keeper's thread for a lock's session. */
static int query_until(struct mysql_conn *mc, struct session *s, const char *sql, uint64_t until_ns,
                       const char *what)
{
    uint64_t start = dlock_monotonic_ns();
    int ret = 0, status = mysql_real_query_start(&ret, s->db, sql, strlen(sql));
    int w = drive(s->db, NULL, &status, until_ns, &ret, 0);
    if (w != 0)
        return no_reply(mc, s, what, start);
    if (ret != 0)
        return fail_on(mc, s, NULL, what);
    return 0;
}

/* Ends a lock wait still running on the server: KILL QUERY from the
 * control session, then the statement's own end (interrupted, or granted
 * in that instant), then a rollback, and the session goes back to the pool.
 * If any of it fails the session is closed: the server then ends the wait
 * at its innodb_lock_wait_timeout, and rolls back. */
static void cancel_wait(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, int status)
{
    char sql[64];
    struct session *ctl;
    dlock_errsave why;
    int ret = 1, err = 0;
    dlock_err_save(cl(mc), &why); /* report the wait's end, not this */
    snprintf(sql, sizeof sql, "KILL QUERY %lu", mysql_thread_id(s->db));
    for (int tries = 0; tries < 2; tries++) {
        if ((err = ctl_session(mc, &ctl)) == 0 && (err = exec_sql(mc, ctl, sql, "KILL QUERY")) == 0)
            break;
        if (!ctl_dropped(mc))
            break;
    }
    if (err == 0 &&
        drive(s->db, st, &status, dlock_monotonic_ns() + mc->timeout_ms * MS, &ret, 0) == 0) {
        if (ret == 0)
            mysql_stmt_free_result(st);
        rollback_and_pool(mc, s);
    } else {
        session_close(s);
    }
    dlock_err_restore(cl(mc), &why);
}

/* The error of a locking read that the server refused. */
static int lock_error(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, int nowait)
{
    unsigned e = mysql_stmt_errno(st);
    int err = fail_on(mc, s, st, "waiting for the row lock");
    if ((e == ER_LOCK_WAIT_TIMEOUT && nowait) || e == ERR_LOCK_NOWAIT)
        return dlock_seterr(cl(mc), DLOCK_EBUSY, "the lock is held by another owner");
    if (e == ER_LOCK_WAIT_TIMEOUT)
        return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                            "mysql %s: the server's lock wait timeout passed", mc->where);
    return err;
}

/*
 * One locking read of the name's row on session s. Returns 1 when the row
 * is ours, 0 when the row does not exist yet, or an error: DLOCK_EBUSY
 * (try), DLOCK_ETIMEDOUT, DLOCK_EINTR... After a wait that was cut short
 * the session is already rolled back and pooled (or closed), and *sp is
 * NULL; after other errors the caller ends the transaction.
 */
static int lock_row(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                    const unsigned char *k)
{
    struct session *s = *sp;
    int nowait = req->wait == DLOCK_WAIT_TRY, ret = 0, err;
    unsigned long klen = DLOCK_SHA256_LEN;
    MYSQL_STMT *st;
    MYSQL_BIND b;
    if ((err = prepare(mc, s, nowait ? ST_LOCK_NOWAIT : ST_LOCK_WAIT, &st)) != 0)
        return err;
    bind_bytes(&b, k, &klen);
    if (mysql_stmt_bind_param(st, &b) != 0)
        return fail_on(mc, s, st, "bind");
    /* A try is bounded too: a server that never answers must not hang it. */
    uint64_t start = dlock_monotonic_ns();
    uint64_t until = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns
                     : nowait ? start + mc->timeout_ms * MS : 0;
    int status = mysql_stmt_execute_start(&ret, st);
    int w = drive(s->db, st, &status, until, &ret, 1);
    if (w == 1 && nowait) {
        /* A try the server does not answer: nothing to cancel, and the
         * control session would likely wait as long. Closing the session
         * undoes whatever it got once the server notices. */
        err = no_reply(mc, s, "acquire", start);
        *sp = NULL;
        session_close(s);
        return err;
    }
    if (w != 0) {
        if (w == 2)
            err = dlock_seterr(cl(mc), DLOCK_EINTR, "a signal interrupted the wait");
        else
            err = dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                               "the deadline passed with the lock still held elsewhere");
        *sp = NULL;
        cancel_wait(mc, s, st, status);
        return err;
    }
    if (ret != 0)
        return lock_error(mc, s, st, nowait);
    if (mysql_stmt_store_result(st) != 0)
        return fail_on(mc, s, st, "reading the row lock's result");
    int found = mysql_stmt_num_rows(st) > 0;
    mysql_stmt_free_result(st);
    return found;
}

/* Creates the name's row from the control session. INSERT IGNORE waits
 * for a row lock only if another client created and locked the row in the
 * meantime; a lock wait timeout then means the row exists, which is all
 * that is needed. */
static int create_row(struct mysql_conn *mc, const dlock_request *req, const unsigned char *k)
{
    unsigned long klen = DLOCK_SHA256_LEN;
    unsigned long nlen = req->name_len > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : req->name_len;
    MYSQL_BIND b[2];
    MYSQL_STMT *st;
    struct session *ctl;
    int err;
    for (int tries = 0; tries < 2; tries++) {
        if ((err = ctl_session(mc, &ctl)) != 0 || (err = prepare(mc, ctl, ST_CREATE_ROW, &st)) != 0)
            return err;
        bind_bytes(&b[0], k, &klen);
        bind_bytes(&b[1], req->name, &nlen);
        if (mysql_stmt_bind_param(st, b) != 0)
            return fail_on(mc, ctl, st, "bind");
        if (mysql_stmt_execute(st) == 0 || mysql_stmt_errno(st) == ER_LOCK_WAIT_TIMEOUT)
            return 0;
        err = fail_on(mc, ctl, st, "creating the lock's row");
        if (!ctl_dropped(mc))
            return err;
    }
    return err;
}

/* Bumps and commits the token from the control session, while s holds the
 * row; also records who holds the lock, for people looking at the table. */
static int record_grant(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req)
{
    unsigned long klen = DLOCK_SHA256_LEN, olen = 32;
    unsigned long long sid = mysql_thread_id(h->s->db);
    MYSQL_BIND b[5];
    MYSQL_STMT *st;
    struct session *ctl;
    int err;
    for (int tries = 0; tries < 2; tries++) {
        if ((err = ctl_session(mc, &ctl)) != 0 || (err = prepare(mc, ctl, ST_GRANT, &st)) != 0)
            return err;
        bind_bytes(&b[0], h->k, &klen);
        bind_bytes(&b[1], req->owner_hex, &olen);
        bind_u64(&b[2], &sid);
        bind_bytes(&b[3], req->owner_hex, &olen);
        bind_u64(&b[4], &sid);
        if (mysql_stmt_bind_param(st, b) != 0)
            return fail_on(mc, ctl, st, "bind");
        if (mysql_stmt_execute(st) == 0) {
            h->base.token = mysql_stmt_insert_id(st);
            if (h->base.token == 0)
                return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: no token from the grant",
                                    mc->where);
            return 0;
        }
        /* A bump whose reply was lost may be repeated: tokens get a gap. */
        err = fail_on(mc, ctl, st, "recording the grant");
        if (!ctl_dropped(mc))
            return err;
    }
    return err;
}

/* After a failed attempt: a dropped session is closed, a live one has its
 * transaction ended (InnoDB undoes only the failed statement) and is
 * pooled. */
static void drop_or_pool(struct mysql_conn *mc, struct session *s)
{
    if (s->dead)
        session_close(s);
    else
        rollback_and_pool(mc, s);
}

/* Takes the row lock on a session of its own (h->s). A pooled session the
 * server dropped while idle (its lease ran out, a restart) is replaced
 * once. A missing row is created, once. */
static int take_lock(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req)
{
    int retried = 0, created = 0, err, pooled = 0;
    struct session *s = NULL;
    for (;;) {
        if (!s && (err = pool_get(mc, &s, &pooled)) != 0)
            return err;
        err = set_limits(mc, s, req);
        if (err == 0)
            err = lock_row(mc, &s, req, h->k);
        if (err == 1) {
            h->s = s;
            return 0;
        }
        if (err == 0 && !created++) {
            if ((err = create_row(mc, req, h->k)) == 0)
                continue;
        } else if (err == 0) {
            err = dlock_seterr(cl(mc), DLOCK_ESTORE, "mysql %s: the lock's row keeps vanishing",
                               mc->where);
        }
        if (s && s->dead && !s->silent_ms && pooled && !retried++) {
            session_close(s);
            s = NULL;
            continue;
        }
        if (s)
            drop_or_pool(mc, s);
        return err;
    }
}

static int hold_lost(struct mysql_conn *mc, struct mysql_held *h, const char *what, int err);

static int be_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = calloc(1, sizeof *h);
    int err;
    if (!h)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    dlock_sha256(req->name, req->name_len, h->k);
    if ((err = take_lock(mc, h, req)) != 0) {
        free(h);
        return err;
    }
    /* The server's idle timer started when the grant was sent: counting from
     * its arrival makes the client's view of the lease end a little later
     * than the server's, never earlier than the TTL. */
    h->ttl_ms = req->ttl_ms;
    h->expires_ns = dlock_monotonic_ns() + (uint64_t)req->ttl_ms * MS;
    /* After a wait (possibly longer than the TTL), the lease counts from
     * the grant: the "DO 0" below restarts the server's idle timer later
     * still, so this end is never after the server's. */
    if (req->wait != DLOCK_WAIT_TRY)
        h->base.lease_end_ns = h->expires_ns;
    if ((err = record_grant(mc, h, req)) != 0) {
        rollback_and_pool(mc, h->s);
        free(h);
        return err;
    }
    /* The token was bumped on the control session, so it belongs to this
     * grant only if our lock session, and with it the row lock, lived
     * through the bump: had the server dropped it meanwhile (KILL,
     * wait_timeout), another holder may already be using a lower token.
     * One round trip on the lock session proves it is still there. */
    if (mysql_real_query(h->s->db, "DO 0", 4) != 0) {
        err = hold_lost(mc, h, "confirming the grant", fail_on(mc, h->s, NULL, "confirming the grant"));
        if (h->s)
            rollback_and_pool(mc, h->s);
        else if (err == DLOCK_ELOST)
            err = dlock_seterr(cl(mc), DLOCK_ELOST,
                               "mysql %s: the session holding the new lock ended before its "
                               "token was recorded: not acquired", mc->where);
        free(h);
        return err;
    }
    *heldp = &h->base;
    return 0;
}

/* ---- release, renew, ping ----------------------------------------------- */

/* The holding session failed with err (recorded): if the server dropped
 * it, the lock is lost (the server rolled back); if it did not answer in
 * time, the session is closed and the lock with it; either way h lets go
 * of the session. Otherwise err is the store's, and h keeps its session.
 * Touches h's own session only: safe on the keeper's thread. */
static int hold_lost(struct mysql_conn *mc, struct mysql_held *h, const char *what, int err)
{
    if (!h->s->dead)
        return err;
    if (h->s->silent_ms)
        err = dlock_seterr(cl(mc), DLOCK_ECONNECT,
                           "mysql %s: %s: no reply from the server within %" PRIu64
                           " ms; the session holding the lock was closed, and the lock is lost"
                           " with it (the server rolls it back when it notices, at the latest"
                           " after wait_timeout)", mc->where, what, h->s->silent_ms);
    else
        err = dlock_seterr(cl(mc), DLOCK_ELOST,
                           "mysql %s: %s: the session holding the lock is gone (%s); "
                           "the server rolled it back", mc->where, what, mysql_error(h->s->db));
    session_close(h->s);
    h->s = NULL;
    return err;
}

static int lease_over(struct mysql_conn *mc, struct mysql_held *h, const char *what)
{
    return dlock_seterr(cl(mc), DLOCK_ELOST, "%s: the lease (%" PRIu32 " ms) had run out",
                        what, h->ttl_ms);
}

static int be_release(dlock_conn *conn, dlock_held *held)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = (struct mysql_held *)held;
    int err = 0;
    if (!h->s) {
        err = dlock_seterr(conn->client, DLOCK_ELOST, "the lock was lost earlier");
    } else if ((err = query_until(mc, h->s, "ROLLBACK", dlock_monotonic_ns() + mc->timeout_ms * MS,
                                  "release")) != 0) {
        /* Closing the session makes the server roll back, if it still can. */
        err = hold_lost(mc, h, "release", err);
        session_close(h->s);
    } else {
        if (dlock_monotonic_ns() >= h->expires_ns)
            err = lease_over(mc, h, "release");
        pool_put(mc, h->s);
    }
    free(h);
    return err;
}

/* SET SESSION wait_timeout on h's own session, by until_ns: the renewal of
 * renew() and keep(). Only h's session is touched. */
static int set_lease(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms, uint64_t sent,
                     uint64_t until_ns)
{
    unsigned lease = ceil_s(ttl_ms);
    char sql[64];
    snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", lease);
    int err = query_until(mc, h->s, sql, until_ns, "renew");
    if (err)
        return hold_lost(mc, h, "renew", err);
    h->s->wait_timeout_s = lease;
    h->ttl_ms = ttl_ms;
    h->expires_ns = sent + (uint64_t)ttl_ms * MS;
    return 0;
}

static int be_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = (struct mysql_held *)held;
    if (!h->s)
        return dlock_seterr(conn->client, DLOCK_ELOST, "the lock was lost earlier");
    uint64_t sent = dlock_monotonic_ns();
    if (sent >= h->expires_ns) {
        /* Possibly still ours on the server (wait_timeout is whole seconds),
         * but the lease is over: free it for others, never extend it. */
        rollback_and_pool(mc, h->s);
        h->s = NULL;
        return lease_over(mc, h, "renew");
    }
    return set_lease(mc, h, ttl_ms, sent, sent + mc->timeout_ms * MS);
}

/*
 * The keeper's renewal: as renew, on the lock's own session, bounded by the
 * timeout and by the lease's end (no reply by then: the lease is over
 * anyway). It never touches the pool or the control session, which belong
 * to the application's thread: a lease found over is left for release() to
 * roll back and pool, and a session that failed is closed here (only this
 * lock used it).
 */
static int be_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = (struct mysql_held *)held;
    if (!h->s)
        return dlock_seterr(conn->client, DLOCK_ELOST, "the lock was lost earlier");
    uint64_t sent = dlock_monotonic_ns(), until = sent + mc->timeout_ms * MS;
    if (sent >= h->expires_ns)
        return dlock_seterr(conn->client, DLOCK_EEXPIRED,
                            "mysql %s: the lease (%" PRIu32 " ms) had run out before it could be"
                            " renewed", mc->where, h->ttl_ms);
    if (h->expires_ns < until)
        until = h->expires_ns;
    int err = set_lease(mc, h, ttl_ms, sent, until);
    /* The session closed for want of a reply: the lock must be assumed gone. */
    return err == DLOCK_ECONNECT && !h->s ? DLOCK_EEXPIRED : err;
}

static int be_ping(dlock_conn *conn)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct session *ctl;
    int err;
    for (int tries = 0; tries < 2; tries++) {
        if ((err = ctl_session(mc, &ctl)) != 0)
            return err;
        if (mysql_real_query(ctl->db, "SELECT 1", 8) == 0) {
            MYSQL_RES *r = mysql_store_result(ctl->db);
            if (r) {
                mysql_free_result(r);
                return 0;
            }
        }
        err = fail_on(mc, ctl, NULL, "SELECT 1");
        if (!ctl_dropped(mc))
            return err;
    }
    return err;
}

/* ---- open, close -------------------------------------------------------- */

static void be_close(dlock_conn *conn)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    while (mc->idle) {
        struct session *s = mc->idle;
        mc->idle = s->next;
        session_close(s);
    }
    session_close(mc->ctl);
    if (mc->password)
        explicit_bzero(mc->password, strlen(mc->password));
    for (int i = 0; i < N_STMTS; i++)
        free(mc->sql[i]);
    free(mc->host);
    free(mc->user);
    free(mc->password);
    free(mc->database);
    free(mc->socket);
    free(mc->table);
    free(mc->tls_ca);
    free(mc->tls_cert);
    free(mc->tls_key);
    free(mc);
}

/* tmpl with every "@T" replaced by the table name; NULL if out of memory. */
static char *with_table(const char *tmpl, const char *table)
{
    size_t tlen = strlen(table), n = strlen(tmpl) + 1;
    for (const char *p = strstr(tmpl, "@T"); p; p = strstr(p + 2, "@T"))
        n += tlen;
    char *out = malloc(n), *o = out;
    if (!out)
        return NULL;
    for (const char *p = tmpl; *p;) {
        if (p[0] == '@' && p[1] == 'T') {
            memcpy(o, table, tlen);
            o += tlen;
            p += 2;
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
}

static char *dup_param(const dlock_uri *uri, const char *key)
{
    const char *v = dlock_uri_param(uri, key);
    return v ? strdup(v) : NULL;
}

static int check_table(dlock_client *c, const char *t)
{
    size_t n = strlen(t);
    if (n == 0 || n > TABLE_NAME_MAX || strspn(t, "abcdefghijklmnopqrstuvwxyz"
                                                  "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != n)
        return dlock_seterr(c, DLOCK_EBADURI,
                            "option table: 1 to %d letters, digits or '_'", TABLE_NAME_MAX);
    return 0;
}

static int parse_tls(dlock_client *c, const dlock_uri *uri, struct mysql_conn *mc)
{
    const char *v = dlock_uri_param(uri, "tls");
    if (!v || strcmp(v, "off") == 0)
        mc->tls = 0;
    else if (strcmp(v, "on") == 0)
        mc->tls = 1;
    else if (strcmp(v, "verify") == 0)
        mc->tls = 2;
    else
        return dlock_seterr(c, DLOCK_EBADURI, "option tls: off, on or verify");
    if (!mc->tls && (dlock_uri_param(uri, "tls_ca") || dlock_uri_param(uri, "tls_cert") ||
                     dlock_uri_param(uri, "tls_key")))
        return dlock_seterr(c, DLOCK_EBADURI, "options tls_ca, tls_cert, tls_key need tls=on or tls=verify");
    mc->tls_ca = dup_param(uri, "tls_ca");
    mc->tls_cert = dup_param(uri, "tls_cert");
    mc->tls_key = dup_param(uri, "tls_key");
    return 0;
}

static int parse_uri(dlock_client *c, const dlock_uri *uri, struct mysql_conn *mc)
{
    size_t nhosts = dlock_uri_host_count(uri);
    const char *path = dlock_uri_path(uri), *table = dlock_uri_param(uri, "table");
    int err;
    mc->connect_ms = DEFAULT_CONNECT_MS;
    mc->timeout_ms = DEFAULT_TIMEOUT_MS;
    if ((err = dlock_uri_param_uint(c, uri, "connect_timeout", 1, 3600000, &mc->connect_ms)) ||
        (err = dlock_uri_param_uint(c, uri, "timeout", 1, 3600000, &mc->timeout_ms)) ||
        (err = parse_tls(c, uri, mc)) || (err = check_table(c, table ? table : DEFAULT_TABLE)))
        return err;
    mc->socket = dup_param(uri, "socket");
    if (nhosts > 1)
        return dlock_seterr(c, DLOCK_EBADURI, "a mysql:// URI names one server");
    if (nhosts == 0 && !mc->socket)
        return dlock_seterr(c, DLOCK_EBADURI, "a mysql:// URI needs a host, as in "
                                              "mysql://user:password@127.0.0.1:3306/database");
    if (mc->socket && nhosts && strcmp(dlock_uri_host(uri, 0), "localhost") != 0)
        return dlock_seterr(c, DLOCK_EBADURI, "with option socket the host must be localhost or empty");
    if (!path[0] || !path[1] || strchr(path + 1, '/'))
        return dlock_seterr(c, DLOCK_EBADURI, "the path of a mysql:// URI is the database, as in /dlock");
    mc->database = strdup(path + 1);
    mc->host = strdup(nhosts ? dlock_uri_host(uri, 0) : "localhost");
    mc->port = nhosts && dlock_uri_port(uri, 0) ? dlock_uri_port(uri, 0) : DEFAULT_PORT;
    mc->table = strdup(table ? table : DEFAULT_TABLE);
    if (dlock_uri_user(uri))
        mc->user = strdup(dlock_uri_user(uri));
    if (dlock_uri_password(uri))
        mc->password = strdup(dlock_uri_password(uri));
    if (mc->socket)
        snprintf(mc->where, sizeof mc->where, "%.120s", mc->socket);
    else
        snprintf(mc->where, sizeof mc->where, "%.100s:%u", mc->host ? mc->host : "", mc->port);
    for (int i = 0; i < N_STMTS; i++)
        if (!(mc->sql[i] = with_table(stmt_sql[i], mc->table)))
            return DLOCK_ENOMEM;
    if (!mc->database || !mc->host || !mc->table)
        return DLOCK_ENOMEM;
    return 0;
}

/* Prepares the control session's statements, creating the tables the
 * first time (that needs the CREATE privilege once). */
static int prepare_tables(struct mysql_conn *mc)
{
    MYSQL_STMT *st;
    int err = prepare(mc, mc->ctl, ST_GRANT, &st);
    if (err == 0)
        err = prepare(mc, mc->ctl, ST_CREATE_ROW, &st);
    if (err == 0 || mc->ctl->last_errno != ER_NO_SUCH_TABLE)
        return err;
    dlock_clearerr(cl(mc));
    for (size_t i = 0; i < sizeof create_sql / sizeof create_sql[0]; i++) {
        char *sql = with_table(create_sql[i], mc->table);
        if (!sql)
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
        err = exec_sql(mc, mc->ctl, sql, "cannot create the lock table");
        free(sql);
        if (err)
            return err;
    }
    if ((err = prepare(mc, mc->ctl, ST_GRANT, &st)) != 0)
        return err;
    return prepare(mc, mc->ctl, ST_CREATE_ROW, &st);
}

static void library_init(void)
{
    mysql_library_init(0, NULL, NULL);
}

static int be_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    struct mysql_conn *mc = calloc(1, sizeof *mc);
    int err;
    if (!mc)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    mc->base.client = c;
    if ((err = parse_uri(c, uri, mc)) != 0) {
        if (err == DLOCK_ENOMEM)
            dlock_seterr(c, err, "out of memory");
        goto fail;
    }
    /* mysql_init() would do this lazily, but not thread-safely. */
    pthread_once(&once, library_init);
    if ((err = session_open(mc, 0, &mc->ctl)) != 0 || (err = prepare_tables(mc)) != 0)
        goto fail;
    /* MySQL 8 schedules row-lock waiters by contention (CATS), not by
     * arrival: only MariaDB's queue is first-come first-served. */
    if (!strstr(mysql_get_server_info(mc->ctl->db), "MariaDB"))
        mc->base.caps = dlock_mysql_backend.caps & ~(unsigned)DLOCK_CAP_FIFO;
    *connp = &mc->base;
    return 0;
fail:
    be_close(&mc->base);
    return err;
}

const dlock_backend dlock_mysql_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .name = "mysql",
    .schemes = mysql_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_HOLDER_DEATH,
    .options = mysql_options_list,
    .open = be_open,
    .close = be_close,
    .acquire = be_acquire,
    .release = be_release,
    .renew = be_renew,
    .ping = be_ping,
    .keep = be_keep,
};
