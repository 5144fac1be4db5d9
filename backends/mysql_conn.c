/*
 * The MariaDB backend's connection layer (see mysql_int.h for the files
 * above it): errors and what they mean for a session, the bounds a step
 * runs by, Connector/C's non-blocking calls driven through the core's one
 * cancellable wait, sessions (open, close), prepared statements, the
 * autocommit control session and the pool of idle lock sessions. It calls
 * nothing above it. Every exchange has a bound of dlock's own, to the
 * millisecond (Connector/C's own timeouts count whole seconds); no reply
 * in time closes the session, its socket shut first so closing never
 * waits (docs/mysql.md, "How the backend works": Bounds).
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <errmsg.h>
#include <mysqld_error.h>

#include "config.h"
#include "backends/mysql_int.h"

unsigned mc_ceil_s(uint64_t ms)
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
int mc_fail_on(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, const char *what)
{
    int sys = errno; /* Connector/C leaves ETIMEDOUT there after a read or write timeout */
    unsigned e = st ? mysql_stmt_errno(st) : mysql_errno(s->db);
    s->last_errno = e;
    if (session_dropped(e))
        s->dead = 1;
    if (e == CR_SERVER_LOST && sys == ETIMEDOUT) {
        s->silent_ms = mc_ceil_s(mc->timeout_ms) * 1000ull;
        return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                            "mysql %s: %s: the server did not answer (the connection timed out:"
                            " unacknowledged data or keepalive probes); the session was closed",
                            mc->where, what);
    }
    return dlock_seterr(cl(mc), map_errno(e), "mysql %s: %s: %s (%u)", mc->where, what,
                        st ? mysql_stmt_error(st) : mysql_error(s->db), e);
}

/* A statement's bound: `ms` from now, or the call's bound if tighter. */
struct bound mc_stmt_bound(const struct bound *call, uint64_t ms)
{
    struct bound b = {dlock_monotonic_ns() + ms * MS, DLOCK_ECONNECT, 0};
    if (call && call->until && call->until <= b.until)
        b = (struct bound){call->until, call->late, 0};
    return b;
}

/* No reply by a bound: the session is unusable (a statement is
 * outstanding); the caller closes it. */
int mc_no_reply(struct mysql_conn *mc, struct session *s, const char *what, uint64_t start,
                int late)
{
    uint64_t ms = (dlock_monotonic_ns() - start + MS / 2) / MS;
    s->dead = 1;
    s->silent_ms = ms ? ms : 1;
    if (late == DLOCK_ETIMEDOUT)
        return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                            "mysql %s: %s: the deadline passed, the server not having answered"
                            " (no reply in %" PRIu64 " ms); the session was closed",
                            mc->where, what, s->silent_ms);
    return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                        "mysql %s: %s: the server did not answer (no reply within %" PRIu64
                        " ms); the session was closed", mc->where, what, s->silent_ms);
}

/* ---- non-blocking calls ------------------------------------------------- */

/* Waits for what status asks on db's socket, until until_ns (0: no
 * limit). Returns the events for the _cont call, -1 when until_ns passed
 * (the socket is polled once more at that instant), -2 when a signal
 * arrived (only with intr; otherwise the wait goes on), -3 when cancel_fd
 * (-1: none) turned readable and the socket had nothing (a reply that came
 * with the cancel is read). Connector/C's own timeouts (MYSQL_WAIT_TIMEOUT)
 * are not used: until_ns is the bound. */
static int wait_io(MYSQL *db, int status, uint64_t until_ns, int intr, int cancel_fd)
{
    for (;;) {
        struct pollfd p = {.fd = (int)mysql_get_socket(db)};
        /* Past until_ns at the start: this look is the last one. */
        int last = until_ns && dlock_monotonic_ns() >= until_ns;
        if (status & MYSQL_WAIT_READ)
            p.events |= POLLIN;
        if (status & MYSQL_WAIT_WRITE)
            p.events |= POLLOUT;
        if (status & MYSQL_WAIT_EXCEPT)
            p.events |= POLLPRI;
        int r = dlock_poll_until(&p, 1, cancel_fd, until_ns ? until_ns : DLOCK_POLL_FOREVER,
                                 intr ? DLOCK_POLL_INTR : 0);
        if (r == DLOCK_POLL_SIGNAL)
            return -2;
        if (r < 0)
            return -1;
        if (r == 0) {
            if (last)
                return -1;
            continue;
        }
        if (!(r & DLOCK_POLL_READY))
            return -3;
        if (p.revents & POLLNVAL) /* no socket: nothing will ever come */
            return -1;
        int ev = 0;
        if (p.revents & (POLLIN | POLLHUP | POLLERR))
            ev |= MYSQL_WAIT_READ;
        if (p.revents & (POLLOUT | POLLHUP | POLLERR))
            ev |= MYSQL_WAIT_WRITE;
        if (p.revents & POLLPRI)
            ev |= MYSQL_WAIT_EXCEPT;
        return ev & status;
    }
}

void mc_nb_step(struct nb *c, int ev)
{
    switch (c->op) {
    case NB_CONNECT:
        c->status = mysql_real_connect_cont(&c->cret, c->db, ev);
        break;
    case NB_QUERY:
        c->status = ev < 0 ? mysql_real_query_start(&c->ret, c->db, c->sql, strlen(c->sql))
                           : mysql_real_query_cont(&c->ret, c->db, ev);
        break;
    case NB_STORE:
        c->status = ev < 0 ? mysql_store_result_start(&c->res, c->db)
                           : mysql_store_result_cont(&c->res, c->db, ev);
        break;
    case NB_PREPARE:
        c->status = ev < 0 ? mysql_stmt_prepare_start(&c->ret, c->st, c->sql, strlen(c->sql))
                           : mysql_stmt_prepare_cont(&c->ret, c->st, ev);
        break;
    case NB_EXECUTE:
        c->status = ev < 0 ? mysql_stmt_execute_start(&c->ret, c->st)
                           : mysql_stmt_execute_cont(&c->ret, c->st, ev);
        break;
    case NB_STMT_STORE:
        c->status = ev < 0 ? mysql_stmt_store_result_start(&c->ret, c->st)
                           : mysql_stmt_store_result_cont(&c->ret, c->st, ev);
        break;
    case NB_ROLLBACK:
        c->status = ev < 0 ? mysql_rollback_start(&c->bret, c->db)
                           : mysql_rollback_cont(&c->bret, c->db, ev);
        break;
    }
}

/* Runs a started call to its end: 0 when it is over, -1 when until_ns
 * passed first, -2 when a signal interrupted it (only with intr), -3 when
 * cancel_fd (-1: none) fired; in the last three cases it is still
 * outstanding, and c->status says what it waits for. */
int mc_nb_wait(struct nb *c, uint64_t until_ns, int intr, int cancel_fd)
{
    while (c->status) {
        int ev = wait_io(c->db, c->status, until_ns, intr, cancel_fd);
        if (ev < 0)
            return ev;
        mc_nb_step(c, ev);
    }
    return 0;
}

int mc_nb_finish(struct nb *c, uint64_t until_ns, int intr)
{
    return mc_nb_wait(c, until_ns, intr, -1);
}

int mc_nb_failed(const struct nb *c)
{
    switch (c->op) {
    case NB_CONNECT:
        return c->cret == NULL;
    case NB_STORE:
        return c->res == NULL && mysql_errno(c->db) != 0;
    case NB_ROLLBACK:
        return c->bret != 0;
    default:
        return c->ret != 0;
    }
}

/* One call on s (op with st or sql), by b: 0, or its error recorded (no
 * reply by then: b's error, and s is dead). */
int mc_run(struct mysql_conn *mc, struct session *s, enum nb_op op, MYSQL_STMT *st,
           const char *sql, const struct bound *b, const char *what)
{
    struct nb c = {.op = op, .db = s->db, .st = st, .sql = sql};
    uint64_t start = dlock_monotonic_ns();
    mc_nb_step(&c, -1);
    if (mc_nb_finish(&c, b->until, 0) != 0)
        return mc_no_reply(mc, s, what, start, b->late);
    if (mc_nb_failed(&c))
        return mc_fail_on(mc, s, st, what);
    if (c.res)
        mysql_free_result(c.res);
    return 0;
}

/* ---- sessions ----------------------------------------------------------- */

/* Closing never waits for the server: a session with a statement still
 * outstanding (dead) has its socket shut first, so that Connector/C finds
 * nothing to read (it would otherwise drain the statement's reply with
 * its whole-second timeouts). The server ends the session, rolling back,
 * when it sees the connection closed. */
void mc_session_disconnect(struct session *s)
{
    if (!s->db)
        return;
    if (s->dead && (int)mysql_get_socket(s->db) >= 0)
        shutdown((int)mysql_get_socket(s->db), SHUT_RDWR);
    for (int i = 0; i < N_STMTS; i++)
        if (s->stmt[i]) {
            mysql_stmt_close(s->stmt[i]);
            s->stmt[i] = NULL;
        }
    mysql_close(s->db);
    s->db = NULL;
}

void mc_session_close(struct session *s)
{
    if (!s)
        return;
    mc_session_disconnect(s);
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

/*
 * Connects s (zeroed first; left disconnected on failure), by
 * connect_timeout or the call's deadline if sooner (a try's bound grows
 * by the time spent here instead). mc_session_open allocates one.
 *
 * Nothing is left to the server's defaults, which an administrator may
 * change (SET GLOBAL, init_connect, which these commands run after):
 * every session runs READ COMMITTED (a FOR UPDATE on a missing row takes
 * no gap lock, and the statements never depend on a snapshot), but for
 * token=sequence's control session, READ UNCOMMITTED: inspect reads the
 * holders' grants, never committed, there (nothing else it runs reads
 * rows); lock
 * sessions without autocommit (the FOR UPDATE opens the transaction that
 * holds the lock; lock=named's sessions, ROLE_NAMED, run in autocommit:
 * user locks need no transaction); the control session with autocommit,
 * so that every token is committed the moment it is bumped, and it gives
 * up on a row lock after 1 s (it only ever waits in the rare race of
 * creating a row, or behind another client's bump). Metadata locks (a DDL
 * on the tables) are waited for at most `timeout`.
 */
int mc_session_connect(struct mysql_conn *mc, enum session_role role, struct bound *call,
                       struct session *s)
{
    unsigned connect_s = mc_ceil_s(mc->connect_ms), io_s = mc_ceil_s(mc->timeout_ms), no = 0;
    uint64_t start = dlock_monotonic_ns();
    my_bool off = 0;
    char limits[128];
    memset(s, 0, sizeof *s);
    if (!(s->db = mysql_init(NULL)))
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    mysql_options(s->db, MYSQL_OPT_CONNECT_TIMEOUT, &connect_s);
    mysql_options(s->db, MYSQL_OPT_READ_TIMEOUT, &io_s);
    mysql_options(s->db, MYSQL_OPT_WRITE_TIMEOUT, &io_s);
    mysql_options(s->db, MYSQL_OPT_RECONNECT, &off); /* a silent reconnect would hide a loss */
    mysql_options(s->db, MYSQL_OPT_LOCAL_INFILE, &no);
    mysql_options(s->db, MYSQL_OPT_NONBLOCK, 0);
    set_tls(mc, s->db);
    mysql_options(s->db, MYSQL_INIT_COMMAND,
                  role == ROLE_CTL && mc->ctl_isolation
                      ? mc->ctl_isolation
                      : "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    if (role == ROLE_ROW)
        snprintf(limits, sizeof limits, "SET SESSION autocommit = 0, lock_wait_timeout = %u", io_s);
    else if (role == ROLE_NAMED) /* lock=named: GET_LOCK needs no transaction */
        snprintf(limits, sizeof limits, "SET SESSION autocommit = 1, lock_wait_timeout = %u", io_s);
    else
        snprintf(limits, sizeof limits,
                 "SET SESSION autocommit = 1, innodb_lock_wait_timeout = 1, lock_wait_timeout = %u",
                 io_s);
    mysql_options(s->db, MYSQL_INIT_COMMAND, limits);

    struct bound b = {start + mc->connect_ms * MS, DLOCK_ECONNECT, 0};
    if (call && call->until && !call->extend && call->until < b.until)
        b = (struct bound){call->until, call->late, 0};
    struct nb c = {.op = NB_CONNECT, .db = s->db};
    c.status = mysql_real_connect_start(&c.cret, s->db, mc->socket ? "localhost" : mc->host,
                                        mc->user, mc->password, mc->database, mc->port,
                                        mc->socket, 0);
    int w = mc_nb_finish(&c, b.until, 0), err = 0;
    if (call && call->until && call->extend)
        call->until += dlock_monotonic_ns() - start;
    if (w != 0) {
        err = mc_no_reply(mc, s, "cannot connect", start, b.late);
    } else if (!c.cret) {
        errno = 0; /* Connector/C's own message says what failed */
        err = mc_fail_on(mc, s, NULL, "cannot connect");
        s->dead = 1;
    } else if (mc->tls && !mysql_get_ssl_cipher(s->db)) {
        /* This Connector/C enforces TLS only together with verification:
         * with tls=on a server without TLS would get a plain session. */
        err = dlock_seterr(cl(mc), DLOCK_ECONNECT, "mysql %s: the server did not agree to TLS",
                           mc->where);
    }
    if (err) {
        mc_session_disconnect(s);
        return err;
    }
    tune_socket(mc, s->db);
    return 0;
}

int mc_session_open(struct mysql_conn *mc, enum session_role role, struct bound *call,
                    struct session **out)
{
    struct session *s = malloc(sizeof *s);
    int err;
    if (!s)
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    if ((err = mc_session_connect(mc, role, call, s)) != 0) {
        free(s);
        return err;
    }
    *out = s;
    return 0;
}

int mc_prepare(struct mysql_conn *mc, struct session *s, enum stmt_id id,
               const struct bound *b, MYSQL_STMT **out)
{
    MYSQL_STMT *st = s->stmt[id];
    if (!st) {
        if (!(st = mysql_stmt_init(s->db)))
            return mc_fail_on(mc, s, NULL, "cannot allocate a statement");
        int err = mc_run(mc, s, NB_PREPARE, st, mc->sql[id], b, "prepare");
        if (err) {
            if (s->dead)
                shutdown((int)mysql_get_socket(s->db), SHUT_RDWR);
            mysql_stmt_close(st);
            return err;
        }
        s->stmt[id] = st;
    }
    *out = st;
    return 0;
}

/* A statement without a result, by `timeout` or the call's bound. */
int mc_exec_sql(struct mysql_conn *mc, struct session *s, const char *sql,
                const struct bound *call, const char *what)
{
    struct bound b = mc_stmt_bound(call, mc->timeout_ms);
    return mc_run(mc, s, NB_QUERY, NULL, sql, &b, what);
}

int mc_ctl_session(struct mysql_conn *mc, struct bound *call, struct session **out)
{
    int err = 0;
    if (!mc->ctl) {
        err = mc_session_open(mc, ROLE_CTL, call, &mc->ctl);
        if (err == 0 && mc->ctl_dropped) {
            mc->ctl_dropped = 0;
            dlock_count_reconnect(cl(mc));
        }
    }
    *out = mc->ctl;
    return err;
}

/* After an error on the control session: drop it if the server did, so the
 * next use reconnects. Returns whether that is worth one retry now: not
 * when the server did not answer in time (a retry would wait as long
 * again, doubling the call's bound). */
int mc_ctl_dropped(struct mysql_conn *mc)
{
    if (!mc->ctl || !mc->ctl->dead)
        return 0;
    int retry = !mc->ctl->silent_ms;
    mc_session_close(mc->ctl);
    mc->ctl = NULL;
    mc->ctl_dropped = 1;
    return retry;
}

/*
 * One prepared statement on the control session, by call (each round trip
 * by `timeout` too): opens the session if needed, prepares, binds params
 * (if any), executes and, with rows, stores the result set. A control
 * session the server had dropped (idle past wait_timeout, a restart) is
 * replaced and the statement run once more; not one that did not answer
 * in time (see ctl_dropped). *stp is the statement, NULL if none.
 */
int mc_ctl_exec(struct mysql_conn *mc, enum stmt_id id, MYSQL_BIND *params, int rows,
                struct bound *call, const char *what, MYSQL_STMT **stp)
{
    int err = 0;
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl;
        struct bound sb = mc_stmt_bound(call, mc->timeout_ms);
        *stp = NULL;
        if ((err = mc_ctl_session(mc, call, &ctl)) == 0 &&
            (err = mc_prepare(mc, ctl, id, &sb, stp)) == 0) {
            if (params && mysql_stmt_bind_param(*stp, params) != 0)
                return mc_fail_on(mc, ctl, *stp, "bind");
            sb = mc_stmt_bound(call, mc->timeout_ms);
            if ((err = mc_run(mc, ctl, NB_EXECUTE, *stp, NULL, &sb, what)) == 0 &&
                (!rows || (err = mc_run(mc, ctl, NB_STMT_STORE, *stp, NULL, &sb, what)) == 0))
                return 0;
        }
        if (!mc_ctl_dropped(mc))
            return err;
    }
    *stp = NULL;
    return err;
}

/* The last failure on the control session was a row lock wait that ran
 * out (its innodb_lock_wait_timeout, 1 s), the session still usable. */
int mc_ctl_lock_timed_out(const struct mysql_conn *mc)
{
    return mc->ctl && !mc->ctl->dead && mc->ctl->last_errno == ER_LOCK_WAIT_TIMEOUT;
}

void mc_pool_drain(struct mysql_conn *mc)
{
    while (mc->idle) {
        struct session *s = mc->idle;
        mc->idle = s->next;
        mc_session_close(s);
    }
    mc->nidle = 0;
}

/* A lock session from the pool, or a new one. *pooled = 1 for a pooled
 * session idle for a second or more, which the server may have dropped for
 * it (wait_timeout counts whole seconds): a failure on it is worth one
 * retry on a new session; not a session idle for less (the one be_open
 * pooled, say), whose failure is its own (KILL). */
int mc_pool_get(struct mysql_conn *mc, struct bound *call, struct session **out, int *pooled)
{
    *pooled = mc->idle && dlock_monotonic_ns() - mc->idle->idle_since >= 1000 * MS;
    if (mc->idle) {
        *out = mc->idle;
        mc->idle = mc->idle->next;
        mc->nidle--;
        (*out)->next = NULL;
        return 0;
    }
    return mc_session_open(mc, ROLE_ROW, call, out);
}

void mc_pool_put(struct mysql_conn *mc, struct session *s)
{
    if (mc->nidle >= IDLE_SESSIONS_MAX) {
        mc_session_close(s);
        return;
    }
    s->next = mc->idle;
    s->idle_since = dlock_monotonic_ns();
    mc->idle = s;
    mc->nidle++;
}

/* Ends a lock session's transaction (whatever it holds is released) and
 * pools it, by until_ns; a session that does not roll back by then is
 * closed, which makes the server roll back when it sees it. Keeps the
 * error already recorded on the client. */
void mc_rollback_and_pool(struct mysql_conn *mc, struct session *s, uint64_t until_ns)
{
    struct nb c = {.op = NB_ROLLBACK, .db = s->db};
    mc_nb_step(&c, -1);
    if (mc_nb_finish(&c, until_ns, 0) != 0 || mc_nb_failed(&c)) {
        s->dead = 1;
        mc_session_close(s);
        return;
    }
    mc_pool_put(mc, s);
}

uint64_t mc_cleanup_until(const dlock_request *req)
{
    uint64_t end = dlock_monotonic_ns() + CLEANUP_MS * MS;
    if (req && req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns + CLEANUP_MS * MS < end)
        end = req->deadline_ns + CLEANUP_MS * MS;
    return end;
}
void mc_bind_bytes(MYSQL_BIND *b, const void *p, unsigned long *len)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_BLOB;
    b->buffer = (void *)p;
    b->buffer_length = *len;
    b->length = len;
}

void mc_bind_u64(MYSQL_BIND *b, unsigned long long *v)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_LONGLONG;
    b->buffer = v;
    b->is_unsigned = 1;
}

/* The session's lease and server-side wait bounds, set only when they
 * change, so a steady workload pays no round trip for them. */
/* A statement without a result on s, by until_ns (no reply by then:
 * DLOCK_ECONNECT, and s is dead: the caller closes it). Only s is
 * touched: safe on the keeper's thread for a lock's session. */
int mc_query_until(struct mysql_conn *mc, struct session *s, const char *sql, uint64_t until_ns,
                   const char *what)
{
    struct bound b = {until_ns, DLOCK_ECONNECT, 0};
    return mc_run(mc, s, NB_QUERY, NULL, sql, &b, what);
}

/* Sleeps ms, or less up to until_ns; DLOCK_EINTR if a signal came,
 * DLOCK_ECANCELED (recorded) once cancel_fd (-1: none) turns readable. */
int mc_pause_ms(struct mysql_conn *mc, uint64_t ms, uint64_t until_ns, int cancel_fd)
{
    uint64_t end = dlock_monotonic_ns() + ms * MS;
    if (until_ns && until_ns < end)
        end = until_ns;
    int err = dlock_pause_until(end, cancel_fd);
    return err == DLOCK_ECANCELED ? dlock_cancelled(cl(mc)) : err;
}

int mc_lease_over(struct mysql_conn *mc, uint32_t ttl_ms, const char *what)
{
    return dlock_seterr(cl(mc), DLOCK_ELOST, "%s: the lease (%" PRIu32 " ms) had run out",
                        what, ttl_ms);
}

/* A text statement with one integer result on the control session, by
 * call, retried once as ctl_exec does. *v: its value (0 if NULL); *isnull. */
int mc_ctl_query_u64(struct mysql_conn *mc, const char *sql, struct bound *call,
                     const char *what, uint64_t *v, int *isnull)
{
    int err = 0;
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl;
        MYSQL_RES *res = NULL;
        struct bound sb = mc_stmt_bound(call, mc->timeout_ms);
        if ((err = mc_ctl_session(mc, call, &ctl)) == 0 &&
            (err = mc_query_result(mc, ctl, sql, &sb, what, &res)) == 0) {
            MYSQL_ROW row = mysql_fetch_row(res);
            if (!row) {
                mysql_free_result(res);
                return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: %s: no value returned",
                                    mc->where, what);
            }
            *isnull = row[0] == NULL;
            *v = row[0] ? strtoull(row[0], NULL, 10) : 0;
            mysql_free_result(res);
            return 0;
        }
        if (!mc_ctl_dropped(mc))
            return err;
    }
    return err;
}

/* A text statement with a result set on s, by b: *out is the stored
 * result (the caller frees it), or the error is recorded. */
int mc_query_result(struct mysql_conn *mc, struct session *s, const char *sql,
                    const struct bound *b, const char *what, MYSQL_RES **out)
{
    uint64_t start = dlock_monotonic_ns();
    struct nb c = {.op = NB_QUERY, .db = s->db, .sql = sql};
    mc_nb_step(&c, -1);
    if (mc_nb_finish(&c, b->until, 0) != 0)
        return mc_no_reply(mc, s, what, start, b->late);
    if (mc_nb_failed(&c))
        return mc_fail_on(mc, s, NULL, what);
    struct nb r = {.op = NB_STORE, .db = s->db};
    mc_nb_step(&r, -1);
    if (mc_nb_finish(&r, b->until, 0) != 0)
        return mc_no_reply(mc, s, what, start, b->late);
    if (!r.res)
        return mysql_errno(s->db) ? mc_fail_on(mc, s, NULL, what)
                                  : dlock_seterr(cl(mc), DLOCK_EPROTO,
                                                 "mysql %s: %s: no result set", mc->where, what);
    *out = r.res;
    return 0;
}

/* SELECT 1 on the control session (opened if need be), once more on a new
 * one if the server had dropped it. */
int mc_ping_ctl(struct mysql_conn *mc)
{
    struct session *ctl;
    int err = 0;
    for (int tries = 0; tries < 2; tries++) {
        if ((err = mc_ctl_session(mc, NULL, &ctl)) != 0)
            return err;
        struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
        if ((err = mc_run(mc, ctl, NB_QUERY, NULL, "SELECT 1", &b, "SELECT 1")) == 0 &&
            (err = mc_run(mc, ctl, NB_STORE, NULL, NULL, &b, "SELECT 1")) == 0)
            return 0;
        if (!mc_ctl_dropped(mc))
            return err;
    }
    return err;
}

/* token=sequence without a control session: SELECT 1 on an idle lock
 * session (it reads no table, so opens no transaction), which goes back to
 * the pool; one the server dropped while idle is replaced once. */
int mc_ping_pooled(struct mysql_conn *mc)
{
    int err = 0;
    for (int tries = 0; tries < 2; tries++) {
        struct session *s;
        int pooled = 0;
        if ((err = mc_pool_get(mc, NULL, &s, &pooled)) != 0)
            return err;
        struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
        if ((err = mc_run(mc, s, NB_QUERY, NULL, "SELECT 1", &b, "SELECT 1")) == 0 &&
            (err = mc_run(mc, s, NB_STORE, NULL, NULL, &b, "SELECT 1")) == 0) {
            mc_pool_put(mc, s);
            return 0;
        }
        int retry = s->dead && !s->silent_ms;
        mc_session_close(s);
        if (!retry)
            return err;
        dlock_clearerr(cl(mc));
    }
    return err;
}

/* inspect_holders from what inspect told: its one holder, exclusive, if
 * held (a mode that holds one at a time). */
int mc_one_holder(const dlock_info *info, dlock_holder *holders, size_t capacity, size_t *count)
{
    *count = (info->known & DLOCK_KNOWS_HELD) && info->held;
    if (*count && capacity) {
        holders[0].known = DLOCK_KNOWS_MODE | (info->known & (DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER));
        holders[0].mode = DLOCK_MODE_EXCLUSIVE;
        holders[0].token = info->token;
        memcpy(holders[0].owner, info->owner, sizeof holders[0].owner);
    }
    return 0;
}

/* tmpl with every "@T" replaced by the table name; NULL if out of memory. */
char *mc_with_table(const char *tmpl, const char *table)
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

