/*
 * postgresql://[user[:password]@]host[:port][,host...]/database[?options]:
 * session-level advisory locks (libpq).
 *
 * Files: this one is the recipe (the statements of each method); below it,
 * postgres_modes.c builds each mode's statements (exclusive, shared, a
 * semaphore's permit: see its top for the locks of a name) and runs a
 * semaphore's wait for a slot, postgres_inspect.c reads pg_locks for
 * inspect, inspect_holders and an election's leader, postgres_elect.c
 * publishes a leader's value and wakes and watches observers, postgres_io.c connects and runs statements
 * with a client-side bound and cancels them, and sql_session.c decides
 * which session a lock goes on; postgres_int.h holds the types they share.
 *
 * Key: a name becomes the bigint key the first 8 bytes of
 * SHA-256(namespace || 0x00 || name), big-endian, as a signed 64-bit
 * integer (without a namespace: SHA-256(name)). Other languages can
 * compute the same key.
 *
 * Layouts (layout=, docs/postgres.md "Peer layouts"): which advisory lock a
 * name is, so that a peer library's holders and dlock's exclude each other.
 * dlock: the key above. tooz: tooz's pg_advisory_lock(b0, b1), two int4
 * arguments, the first two bytes of MD5(name) (pg_locks' objsubid 2);
 * exclusive only. int: the name is the decimal bigint N, the lock
 * pg_advisory_lock(N) an application takes, and its shared mode
 * pg_advisory_lock_shared(N). Only the key and the form of the calls
 * differ (dlock_pg_layout_key(), dlock_pg_key_args() and
 * dlock_pg_key_match() in postgres_modes.c); sessions, leases, tokens (the
 * counter row of the key: TOOZ_KEY for tooz), waits and inspect are the
 * same. A peer layout's connection declares the peer's modes in its caps.
 *
 * Sessions: the session is the lease. A session's idle_session_timeout is
 * set to its locks' TTL, so a holder that stops talking to the server
 * (paused, partitioned, dead) loses its session and with it its locks after
 * the TTL; renew is a statement on the lock's session. Held locks share
 * sessions (a session holds any number of session-level advisory locks and
 * unlocks each alone): a try runs on a "holder session" whose lease is the
 * same TTL, with fewer than DLOCK_SQL_LOCKS_MAX (256) locks and not holding
 * the key already, and the grant stays there. A blocking wait cannot run on
 * a holder session (its locks' renewals and releases would queue behind
 * it), so it first tries on a holder session, which grants most waits at
 * once, and only if the lock is taken waits on a session that holds
 * nothing; once granted, that is a holder session too. So a client's
 * connections are its holder sessions, plus one per wait in progress,
 * plus at most DLOCK_SQL_IDLE_KEEP (4) sessions left free by releases and kept for
 * reuse (more are closed). A new holder session opens only when every
 * holder session of that TTL is full, or for a wait that had to queue;
 * a lock never moves, so a session stays while any of its locks is held.
 * Locks taken without queueing under one TTL: ceil(H / 256) holder
 * sessions for H locks; each wait that queued adds at most one more while
 * its lock is held (later tries fill it). Each TTL has sessions of its own.
 *
 * Leases of session-mates. Any statement on a session restarts its idle
 * timer, so renewing one lock prolongs its mates on the store: they stay
 * held longer than their holders count on, never shorter (the client's
 * lease of each lock is its own). A renewal with another TTL sets the
 * session's lease to the longest its locks need (see dlock_sql_lease()), so a
 * dead holder's locks may then stay until that longer TTL runs out. A lock
 * whose holder stops renewing it while its mates are renewed would stay as
 * long as they do: so every use of a session (a try, a renewal, keep(), a
 * release) first unlocks the session's other locks whose client-side lease
 * has ended (dlock_sql_expire()), and their handles report DLOCK_ELOST. A
 * session that ends (its timer, a kill, no reply in time: it is closed)
 * takes every lock on it, and each one reports DLOCK_ELOST on renew, keep
 * and release.
 *
 * Waiting: a blocking pg_advisory_lock() waits in the server's lock queue
 * (first-come first-served, woken at once), bounded by lock_timeout for a
 * deadline; a try ahead of it never jumps the queue (the server refuses a
 * try while others wait). The lock and the fencing-token bump travel in one
 * statement, so an uncontended acquire is one round trip.
 *
 * Cancelling (DLOCK_CAP_CANCEL): the wait polls the request's cancel fd
 * beside the session's socket; when it fires, PQcancel() asks the server
 * to cancel the statement (a blocking call, so on a thread of its own:
 * cancel_statement() in postgres_io.c), which leaves the queue as
 * lock_timeout does. The
 * cancel gets CANCEL_MS, the error reply CANCEL_MS more, a grant that came
 * in that instant is undone as a deadline's is (CANCEL_MS more), and the
 * session stays pooled. A cancel or reply not in time closes the session
 * instead (a server the close reaches drops the waiter within a second: a
 * wait sets client_connection_check_interval; one cut off, once its
 * keepalives give up or the lock reaches the waiter), so a cancelled wait
 * returns within CANCEL_MS on a silent network, 3 x CANCEL_MS at most.
 *
 * The acquire's transaction sets what it relies on, whatever the server's,
 * the database's or the role's defaults (or PGOPTIONS) say: READ COMMITTED
 * (under repeatable read a waiter's snapshot predates the previous holder's
 * bump, and its own bump fails to serialize), synchronous_commit on (the
 * token is on disk before anyone sees it), and lock_timeout and
 * statement_timeout: 1 ms and none for a try (it never waits for a lock,
 * not even the counter row's or the table's behind someone's DDL: that is
 * DLOCK_EBUSY), the time left for a deadline wait (every lock the statement
 * waits for, together), none for a wait without a deadline.
 *
 * Token: by default a per-name row in a table (key, token) bumped with
 * INSERT ... ON CONFLICT DO UPDATE, which a protected resource in the same
 * database can read; token=sequence uses nextval() of one sequence instead,
 * cheaper (no row update) but shared by all names. raise_token() raises
 * the name's row, or the sequence (locking grants of every name out for
 * that transaction), on the lock's own session: see pg_raise_token().
 *
 * Store-wide floor and top (raise_floor, token_top: dlock migrate). The
 * table is shared by every namespace that names it, so both cover them
 * all. token=table: the floor is the row with key -2^63 (FLOOR_KEY) of the
 * fencing table, written like a grant's bump (synchronous_commit on), and
 * every grant's statement reads it, without a lock, in the statement that
 * bumps the name's row: token = GREATEST(row + 1, floor + 1), one index
 * lookup more per grant, no round trip. (A name whose key were -2^63 would
 * share its counter with the floor: tokens would only go up.) The top is
 * max(token) over the table, a scan. token=sequence: the floor is the
 * sequence itself, raised as raise_token raises it (under ALTER SEQUENCE's
 * lock); the top is its last_value. Grants cost nothing more.
 *
 * Hosts. Several hosts are tried in order, each on its own (libpq is given
 * one at a time), and only a read-write server is taken
 * (target_session_attrs=read-write: a standby is passed over). The host
 * that served the client's latest new session is tried first for the next
 * ones, so that all of a client's sessions land on one primary while it
 * accepts them; a session that lands on another host moves the client
 * there, and its idle pooled sessions on the old host are closed.
 *
 * Bounds. libpq has no statement timeout of its own, so statements are
 * sent on non-blocking connections and their replies awaited in the core's
 * cancellable wait (postgres_io.c) until a CLOCK_MONOTONIC deadline:
 * `timeout` (ms, default 5000) for every statement that is not a lock
 * wait, the deadline plus at most 200 ms for a deadline wait (lock_timeout
 * ends it on the server at the deadline). No reply in time closes the
 * session (a statement is still outstanding on it), which frees whatever
 * it held once the server notices, at the latest when its
 * idle_session_timeout ends: DLOCK_ECONNECT, naming the time.
 * Connecting is libpq's non-blocking connect, driven the same way: each
 * host gets `connect_timeout` (ms, the startup and authentication included),
 * and a deadline wait's connect ends at its deadline plus the margin too. A
 * wait without a deadline has no client-side bound; TCP keepalives (idle
 * 5 s, every 2 s, 3 probes) end it about 11 s after the peer or the network
 * died, and tcp_user_timeout (= timeout) fails a connection whose sent data
 * stays unacknowledged. Closing sends Terminate without waiting for
 * anything.
 *
 * Lost leases. A grant after a wait counts its lease from the reply's
 * arrival (the server's idle timer starts when it sends it), not from the
 * start of the call. keep() renews on the lock's session, as renew() does,
 * bounded by the timeout, and when the lock is alone on its session by the
 * end of its lease too. Every statement on a session shared with other
 * locks gets the whole `timeout` (a session closed for want of a reply
 * takes its mates' locks with it). Before its statement, keep() waits for
 * the session's mutex: the application's thread holds it for at most
 * three statements (unlocking up to 64 mates whose lease ended, then a
 * try, release or renew, or a raise's two), `timeout` each, and keep()
 * needs two itself: up to 5 x `timeout` when the server is slow but
 * answering. The keeper renews with two thirds of the TTL left, so keep a
 * kept lock's TTL above 8 x `timeout` to ride through that.
 *
 * Inspect. Every statement on a holder session (acquire, renew, keep,
 * raise) starts with a comment, "/\*dlock owner=<owner_hex> ttl=<ms>
 * [token=<n>] key=<key>*\/" (ttl: the session's lease; key: the lock the
 * statement is for), which pg_stat_activity.query shows to other sessions
 * of the same role (or pg_read_all_stats). It shows a session's latest
 * statement only, so with several locks on a session the owner id and the
 * token of a key are known when that statement was for the key; else the
 * owner is named by the session ("pid N (client addr:port)"), and the
 * lease is still the session's. inspect runs one read-only
 * statement on an idle pooled session (`timeout` on the server and the
 * client; no advisory or row lock taken, nothing waited for): pg_locks
 * rows of the name's advisory key in this database (granted: the holder;
 * not granted: the waiters, in waitstart order on PostgreSQL 14+), joined
 * with pg_stat_activity (state, state_change, the query's tag, client
 * address), and with token=table the name's row of the fencing table (a
 * plain MVCC read). It tells: held (always); the owner (the tag's owner id,
 * else "pid N (client addr:port)" for a session without the tag or one
 * whose activity the role may not see, or whose latest statement was for
 * another of its locks); the lease (the tag's TTL minus the time the
 * session has been idle, state_change; the whole TTL while it runs a
 * statement); the token (the tag's, after a renew or raise of this lock;
 * else, token=table, the name's row once the acquire committed, and went
 * idle before inspect's statement began: the row is read in its snapshot,
 * pg_locks as it is); the waiters and
 * their order (owner ids from their acquire's tag). Cannot know: a
 * waiter whose client died while queued (the server notices only when it
 * is granted: it is counted and listed); the lease and token of a holder
 * outside dlock or hidden by privileges; with token=sequence the last token
 * of a name while free (one sequence for every name), and the holder's
 * token until a renew or raise names it. With token=table, the last token
 * of a free name is its counter row, which a raise_token may have set
 * above the last grant.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/internal.h"
#include "backends/postgres_int.h"

#define DEFAULT_CONNECT_MS 5000
#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_TABLE "dlock_fence"
/* token=table: the row of the fencing table that holds the store's floor
 * (raise_floor), the lowest bigint. */
#define FLOOR_KEY "-9223372036854775808"

static const char *const pg_schemes[] = {"postgresql", "postgres", NULL};
/* layout=, in enum pg_layout's order. */
static const char *const layouts[] = {"dlock", "tooz", "int", NULL};
/* TLS options handed to libpq as they are: dlock opens none of the files. */
static const char *const pg_ssl_options[] = {
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", NULL,
};
static const char *const pg_options[] = {
    "connect_timeout", "timeout", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl",
    "application_name", "namespace", "table", "token", "layout", NULL,
};

/* After a failure that may have left key locked on a live session: free
 * it, at once and synchronously (all the session's locks when it holds no
 * other lock of ours); close the session if even that fails, which loses
 * its other locks too. s->mu held (or s unshared). */
static void session_scrub(struct pg_conn *pc, struct pg_session *s, int64_t key,
                          uint64_t until_ns)
{
    dlock_errsave why;
    PGresult *r = NULL;
    char sql[1400];
    if (s->base.nheld == 0)
        snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock_all()");
    else
        dlock_pg_unlock_if_held(pc, sql, sizeof sql, key);
    dlock_err_save(cl(pc), &why); /* report the failure, not this */
    int ok = dlock_pg_run(pc, s, sql, 0, &r, "freeing the session's lock",
                 until_ns ? until_ns : after_timeout(pc)) == 0;
    PQclear(r);
    dlock_err_restore(cl(pc), &why);
    if (!ok)
        dlock_pg_session_close(s);
}

/* The session layer's hooks (backends/sql_session.h). */
static int session_alive(const struct dlock_sql_session *b)
{
    const struct pg_session *s = (const struct pg_session *)b;
    return s->pg && PQstatus(s->pg) == CONNECTION_OK;
}

/* arg: the uint64_t bound of the connect (0: connect_timeout per host). */
static int session_new(dlock_conn *conn, void *arg, struct dlock_sql_session **out)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_session *s = calloc(1, sizeof *s);
    if (!s || dlock_sql_session_init(&s->base) != 0) {
        free(s);
        return dlock_seterr(cl(pc), DLOCK_ENOMEM, "out of memory");
    }
    int err = dlock_pg_session_open(pc, s, *(const uint64_t *)arg);
    if (err) {
        dlock_sql_session_fini(&s->base);
        free(s);
        return err;
    }
    *out = &s->base;
    return 0;
}

static void session_end(struct dlock_sql_session *b)
{
    dlock_pg_session_close((struct pg_session *)b);
}

static void session_destroy(struct dlock_sql_session *b)
{
    dlock_sql_session_fini(b);
    free(b);
}

static int unlock_batch(dlock_conn *conn, struct dlock_sql_session *b,
                        struct dlock_sql_held *const *batch, size_t n)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_session *s = (struct pg_session *)b;
    char sql[64 + DLOCK_SQL_EXPIRE_BATCH * 600], ex[600];
    size_t o = 0;
    if (!s->pg)
        return DLOCK_ECONNECT;
    o += (size_t)snprintf(sql + o, sizeof sql - o, "SELECT ");
    for (size_t i = 0; i < n; i++) {
        dlock_pg_unlock_exprs(pc, DLOCK_SQL_OF(batch[i], struct pg_held, sh), ex, sizeof ex);
        o += (size_t)snprintf(sql + o, sizeof sql - o, "%s%s", i ? ", " : "", ex);
    }
    dlock_errsave why;
    PGresult *r = NULL;
    dlock_err_save(cl(pc), &why); /* this is not what the caller reports */
    int err = dlock_pg_run(pc, s, sql, 0, &r, "unlocking locks whose lease ended",
                           after_timeout(pc));
    PQclear(r);
    dlock_err_restore(cl(pc), &why);
    return err;
}

static int is_key(const struct dlock_sql_held *h, const void *key)
{
    return DLOCK_SQL_OF(h, const struct pg_held, sh)->key == *(const int64_t *)key;
}

static const struct dlock_sql_ops session_ops = {
    .alive = session_alive,
    .open = session_new,
    .close = session_end,
    .destroy = session_destroy,
    .unlock = unlock_batch,
    .is_key = is_key,
    .why_gone = "the lock's lease had ended without a renewal, and it was unlocked on the"
                " session it shared with locks that were still renewed",
    .why_silent = "the session holding the lock was closed after the server did not answer in"
                  " time",
    .why_ended = "the session holding the lock ended (lease ran out or connection lost)",
};

/* A session that holds nothing, with a live connection, opening one if
 * needed (bounded by until_ns, 0: connect_timeout per host only); *opened
 * says which (dlock_sql_take()). Only the application's thread touches
 * such a session. */
static int session_take(struct pg_conn *pc, struct pg_session **out, int *opened,
                        uint64_t until_ns)
{
    struct dlock_sql_session *b = NULL;
    int err = dlock_sql_take(&pc->pool, &until_ns, &b, opened);
    if (err == 0)
        *out = (struct pg_session *)b;
    return err;
}

static const char *lost_why(struct pg_conn *pc, const struct pg_held *h)
{
    return dlock_sql_lost_why(&pc->pool, &h->sh);
}

static int valid_identifier(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63 || !((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

/* Every host's name and port ("5432" when the URI gave none), for libpq,
 * which is given one host at a time. */
static int split_hosts(const dlock_uri *uri, struct pg_conn *pc)
{
    size_t n = dlock_uri_host_count(uri);
    pc->hostv = calloc(n, sizeof *pc->hostv);
    pc->portv = calloc(n, sizeof *pc->portv);
    if (!pc->hostv || !pc->portv)
        return DLOCK_ENOMEM;
    pc->nhosts = n;
    for (size_t i = 0; i < n; i++) {
        char port[16];
        unsigned p = dlock_uri_port(uri, i);
        snprintf(port, sizeof port, "%u", p ? p : 5432);
        if (!(pc->hostv[i] = strdup(dlock_uri_host(uri, i))) || !(pc->portv[i] = strdup(port)))
            return DLOCK_ENOMEM;
    }
    return 0;
}

static int parse_params(dlock_client *c, const dlock_uri *uri, struct pg_conn *pc)
{
    const char *path = dlock_uri_path(uri), *v;
    size_t k = 0;
    int err;
    pc->connect_ms = DEFAULT_CONNECT_MS;
    if ((err = dlock_uri_param_uint(c, uri, "connect_timeout", 1, 3600000, &pc->connect_ms)) != 0)
        return err;
    pc->timeout_ms = DEFAULT_TIMEOUT_MS;
    if ((err = dlock_uri_param_uint(c, uri, "timeout", 1, 3600000, &pc->timeout_ms)) != 0)
        return err;
    if (dlock_uri_host_count(uri) == 0)
        return dlock_seterr(c, DLOCK_EBADURI,
                            "a postgresql:// URI needs a host, as in postgresql://user@127.0.0.1:5432/db");
    v = dlock_uri_param(uri, "table");
    if (v && (!valid_identifier(v) || strlen(v) > 59))
        return dlock_seterr(c, DLOCK_EBADURI,
                            "option 'table' must be a lower-case SQL identifier of at most 59 bytes");
    const char *tok = dlock_uri_param(uri, "token");
    if (tok && strcmp(tok, "table") != 0 && strcmp(tok, "sequence") != 0)
        return dlock_seterr(c, DLOCK_EBADURI, "option 'token' must be 'table' or 'sequence'");
    pc->use_sequence = tok && strcmp(tok, "sequence") == 0;
    snprintf(pc->table, sizeof pc->table, "%s", v ? v : DEFAULT_TABLE);
    int layout = PG_LAYOUT_DLOCK;
    if ((err = dlock_uri_param_choice(c, uri, "layout", layouts, &layout)) != 0)
        return err;
    pc->layout = (enum pg_layout)layout;
    if ((v = dlock_uri_param(uri, "namespace")) != NULL && layout != PG_LAYOUT_DLOCK)
        return dlock_seterr(c, DLOCK_EBADURI,
                            "option 'namespace' has no place in layout=%s: the peer's key comes"
                            " from the name alone", layouts[layout]);
    if (v && !(pc->namespace = strdup(v)))
        return DLOCK_ENOMEM;
    if ((err = split_hosts(uri, pc)) != 0)
        return err;
    /* Replaced by one host's for each connect (connect_host()). */
    pc->keys[k] = "host", pc->values[k++] = pc->hostv[0];
    pc->keys[k] = "port", pc->values[k++] = pc->portv[0];
    /* A standby (or a server whose default is read-only) is passed over:
     * a lock taken there would be invisible to clients of the primary. */
    pc->keys[k] = "target_session_attrs", pc->values[k++] = "read-write";
    if (path[0] && path[1])
        pc->keys[k] = "dbname", pc->values[k++] = path + 1;
    if (dlock_uri_user(uri) && dlock_uri_user(uri)[0])
        pc->keys[k] = "user", pc->values[k++] = dlock_uri_user(uri);
    if (dlock_uri_password(uri))
        pc->keys[k] = "password", pc->values[k++] = dlock_uri_password(uri);
    for (const char *const *o = pg_ssl_options; *o; o++)
        if ((v = dlock_uri_param(uri, *o)) != NULL)
            pc->keys[k] = *o, pc->values[k++] = v;
    pc->keys[k] = "application_name";
    pc->values[k++] = (v = dlock_uri_param(uri, "application_name")) ? v : "dlock";
    /* Notice a dead server or a cut network on an idle holder's socket. */
    pc->keys[k] = "keepalives", pc->values[k++] = "1";
    pc->keys[k] = "keepalives_idle", pc->values[k++] = "5";
    pc->keys[k] = "keepalives_interval", pc->values[k++] = "2";
    pc->keys[k] = "keepalives_count", pc->values[k++] = "3";
    /* Sent data left unacknowledged this long fails the connection. */
    snprintf(pc->user_timeout_ms, sizeof pc->user_timeout_ms, "%" PRIu64, pc->timeout_ms);
    pc->keys[k] = "tcp_user_timeout", pc->values[k++] = pc->user_timeout_ms;
    pc->keys[k] = NULL, pc->values[k] = NULL;
    return 0;
}

static void pg_close(dlock_conn *conn)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    dlock_sql_pool_close(&pc->pool);
    for (size_t i = 0; i < pc->nhosts; i++) {
        free(pc->hostv[i]);
        free(pc->portv[i]);
    }
    free(pc->hostv);
    free(pc->portv);
    free(pc->namespace);
    free(pc);
}

/* The fencing table or sequence, and in layout=dlock the table of
 * leaders' values beside it (postgres_elect.c), in one round trip. */
static int create_table(struct pg_conn *pc, struct pg_session *s)
{
    char sql[512], values[256] = "";
    PGresult *r = NULL;
    if (pc->layout == PG_LAYOUT_DLOCK)
        snprintf(values, sizeof values,
                 "; CREATE TABLE IF NOT EXISTS %s" PG_VALUES_SUFFIX " " PG_VALUES_COLUMNS,
                 pc->table);
    if (pc->use_sequence)
        snprintf(sql, sizeof sql, "CREATE SEQUENCE IF NOT EXISTS %s_seq%s", pc->table, values);
    else
        snprintf(sql, sizeof sql,
                 "CREATE TABLE IF NOT EXISTS %s (key bigint PRIMARY KEY, token bigint NOT NULL)%s",
                 pc->table, values);
    int err = dlock_pg_run(pc, s, sql, 0, &r, "creating the fencing table", after_timeout(pc));
    if (err == DLOCK_ESTORE) { /* two clients creating it at once: one wins */
        dlock_clearerr(cl(pc));
        err = dlock_pg_run(pc, s, sql, 0, &r, "creating the fencing table", after_timeout(pc));
    }
    PQclear(r);
    return err;
}

static int pg_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    struct pg_conn *pc = calloc(1, sizeof *pc);
    int err;
    if (!pc)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    pc->base.client = c;
    dlock_sql_pool_init(&pc->pool, &session_ops, &pc->base);
    if ((err = parse_params(c, uri, pc)) != 0)
        goto fail;
    /* A peer layout has the peer's modes only (the core refuses the others
     * with DLOCK_ENOTSUP): tooz's locks are exclusive;
     * pg_advisory_lock_shared(N) is the integer key's shared mode. The
     * peers have no elections: the core refuses them naming the layout. */
    if (pc->layout != PG_LAYOUT_DLOCK)
        pc->base.caps = dlock_postgres_backend.caps & ~(unsigned)DLOCK_CAP_SEMAPHORE &
                        ~(unsigned)(pc->layout == PG_LAYOUT_TOOZ ? DLOCK_CAP_SHARED : 0) &
                        ~(unsigned)(DLOCK_CAP_ELECTION | DLOCK_CAP_WATCH);
    /* token=sequence: one counter for every name. */
    if (pc->use_sequence)
        pc->base.caps = (pc->base.caps ? pc->base.caps : dlock_postgres_backend.caps) |
                        DLOCK_CAP_TOKEN_SHARED;
    struct pg_session *s = NULL;
    int opened;
    if ((err = session_take(pc, &s, &opened, 0)) != 0 || (err = create_table(pc, s)) != 0)
        goto fail;
    *connp = &pc->base;
    return 0;
fail:
    if (err == DLOCK_ENOMEM && !cl(pc)->errmsg[0])
        dlock_seterr(c, err, "out of memory");
    pg_close(&pc->base);
    return err;
}

/* The tag that starts every statement on a holder session, for inspect
 * (dlock_pg_tag()): pg_stat_activity.query shows it to other sessions of
 * the same role. It names the lock the statement is for (key), the
 * session's lease (its idle_session_timeout) and, once known, the lock's
 * token. */
/* "SET idle_session_timeout = ms;" when the session's differs, else "". */
static void idle_clause(struct pg_session *s, uint32_t ms, char *buf, size_t len)
{
    buf[0] = '\0';
    if (s->base.lease != ms)
        snprintf(buf, len, "SET idle_session_timeout = %" PRIu32 "; ", ms);
}

/* Was the lock granted to us in the instant lock_timeout fired, or before
 * a later lock of the statement (the counter row, the table) timed out? If
 * so it is still ours (session locks outlive the failed statement): unlock.
 * No reply by until_ns closes the session instead, which frees it too. */
static void undo_late_grant(struct pg_conn *pc, struct pg_session *s, int64_t key,
                            uint64_t until_ns)
{
    char sql[1400];
    PGresult *r = NULL;
    dlock_pg_unlock_if_held(pc, sql, sizeof sql, key);
    dlock_errsave why;
    dlock_err_save(cl(pc), &why); /* report the timeout, not this */
    if (!until_ns)
        until_ns = after_timeout(pc);
    if (dlock_pg_run(pc, s, sql, 0, &r, "checking for a late grant", until_ns) == 0)
        PQclear(r);
    dlock_err_restore(cl(pc), &why);
}

/* The client-side bound of one acquire: a try's statement gets `timeout`; a
 * deadline wait ends on the server at the deadline (lock_timeout,
 * statement_timeout), and the client waits for that reply a little longer;
 * a wait without a deadline has none (0). */
static uint64_t acquire_until(const struct pg_conn *pc, const dlock_request *req, uint64_t now)
{
    uint64_t margin = pc->timeout_ms < DEADLINE_MARGIN_MS ? pc->timeout_ms : DEADLINE_MARGIN_MS;
    if (req->wait == DLOCK_WAIT_TRY)
        return now + pc->timeout_ms * MS;
    if (req->wait == DLOCK_WAIT_DEADLINE)
        return (req->deadline_ns > now ? req->deadline_ns : now) + margin * MS;
    return 0;
}

/* One attempt on session s. On success *token is the grant's (*slot a
 * semaphore's slot), and *granted_ns the moment from which its lease
 * counts: a try's start (the server's idle timer starts later), or a
 * waited grant's arrival (the wait may have lasted longer than the TTL).
 * A semaphore's wait that finds no slot free goes on in
 * dlock_pg_sem_wait(). */
static int acquire_on(struct pg_conn *pc, struct pg_session *s, const dlock_request *req,
                      int64_t key, uint32_t *slot, uint64_t *token, uint64_t *granted_ns)
{
    char sql[8192], idle[64], settings[512], tg[128];
    PGresult *r = NULL;
    int stmt = 4, err;
    int plain = req->mode == DLOCK_MODE_EXCLUSIVE && req->limit == 0;
    uint64_t start = dlock_monotonic_ns(), until = acquire_until(pc, req, start);
    uint32_t lease_ms = dlock_sql_lease(&s->base, NULL, req->ttl_ms);
    idle_clause(s, lease_ms, idle, sizeof idle);
    stmt += idle[0] != '\0';
    /* lock_timeout bounds each lock wait, statement_timeout all of them
     * together; 0 is none. A try waits for no lock at all (1 ms: the least
     * lock_timeout takes); a shared or semaphore try still waits for the
     * transactions of other grants of the name (the mutex, the counter
     * row), `timeout` at most. */
    uint64_t lock_ms = 0, stmt_ms = 0;
    if (req->wait == DLOCK_WAIT_TRY) {
        lock_ms = plain ? 1 : pc->timeout_ms;
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        lock_ms = req->deadline_ns > start ? (req->deadline_ns - start + MS - 1) / MS : 1;
        if (lock_ms > INT32_MAX)
            lock_ms = 0; /* too far to matter: wait without a limit */
        stmt_ms = lock_ms;
    }
    /* The transaction's own settings, whatever the server's defaults. */
    dlock_pg_tag(tg, sizeof tg, req->owner_hex, lease_ms, 0, key);
    /* A wait also has the server look for its client every second
     * (client_connection_check_interval, PostgreSQL 14+): a session whose
     * close reaches the server while it is queued (its process died, or a
     * cancel or a deadline went unanswered on a live network) then leaves
     * the lock's queue within a second, not when the lock reaches it.
     * Servers that cannot check (no POLLRDHUP: Windows; version 14 off
     * Linux) refuse any value but 0: the DO block ignores that refusal,
     * which would otherwise abort the transaction. */
    snprintf(settings, sizeof settings,
             "%sSET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = on; "
             "SET LOCAL lock_timeout = %" PRIu64 "; SET LOCAL statement_timeout = %" PRIu64 "; %s",
             tg, lock_ms, stmt_ms,
             req->wait == DLOCK_WAIT_TRY ? "" : CHECK_CLIENT_SQL);
    stmt += req->wait != DLOCK_WAIT_TRY;
    /* The lock and the counter bump in one statement (postgres_modes.c). */
    size_t o = (size_t)snprintf(sql, sizeof sql, "%s%s", settings, idle);
    dlock_pg_lock_sql(pc, req, key, 0, sql + o, sizeof sql - o);
    int cancelled = 0;
    err = dlock_pg_run_cancellable(pc, s, sql, stmt, &r,
                          req->wait == DLOCK_WAIT_TRY ? "acquire" : "waiting for the lock", until,
                          req->wait == DLOCK_WAIT_TRY ? -1 : req->cancel_fd, &cancelled);
    *granted_ns = req->wait == DLOCK_WAIT_TRY ? start : dlock_monotonic_ns();
    /* Cancelled: left the queue as at a deadline (a grant in that instant
     * is undone; a session closed for it freed everything). A grant that
     * won the race is kept. */
    if (err && cancelled) {
        if (s->pg)
            undo_late_grant(pc, s, key, dlock_monotonic_ns() + CANCEL_MS * MS);
        return dlock_cancelled(cl(pc));
    }
    /* statement_timeout (57014) ends a deadline wait like lock_timeout
     * (55P03); a cancel at any other time is someone else's. */
    if (err == DLOCK_ESTORE && strcmp(s->sqlstate, "57014") == 0 &&
        req->wait == DLOCK_WAIT_DEADLINE && *granted_ns + 5 * MS >= req->deadline_ns)
        err = DLOCK_ETIMEDOUT;
    if (err == DLOCK_ETIMEDOUT && s->pg) {
        undo_late_grant(pc, s, key, until);
        if (req->wait == DLOCK_WAIT_TRY)
            return dlock_seterr(cl(pc), DLOCK_EBUSY,
                                "postgresql: the fencing %s %s%s is locked by another session"
                                " (a transaction holding its row, or DDL); a try does not wait",
                                pc->use_sequence ? "sequence" : "table", pc->table,
                                pc->use_sequence ? "_seq" : "");
        return dlock_seterr(cl(pc), DLOCK_ETIMEDOUT,
                            "the deadline passed with the lock still held elsewhere");
    }
    if (err)
        return err;
    if (idle[0])
        s->base.lease = lease_ms;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return dlock_seterr(cl(pc), DLOCK_EPROTO, "no fencing token returned");
    }
    if (PQgetisnull(r, 0, PG_COL_TOKEN)) {
        /* Refused for the name's kind (nothing held: the statement let go
         * of what it took), busy, or a semaphore's wait at the gate. */
        int kinded = !PQgetisnull(r, 0, PG_COL_KIND);
        long long kind = kinded ? strtoll(PQgetvalue(r, 0, PG_COL_KIND), NULL, 10) : 0;
        int at_gate = !plain && !kinded && PQgetvalue(r, 0, PG_COL_GATE)[0] == 't';
        PQclear(r);
        if (kinded)
            return dlock_pg_mode_error(pc, req, kind);
        if (at_gate)
            return dlock_pg_sem_wait(pc, s, req, key, token, slot, granted_ns);
        if (req->wait == DLOCK_WAIT_TRY && req->limit)
            return dlock_seterr(cl(pc), DLOCK_EBUSY,
                                "all %" PRIu32 " permits are held, or others wait for one",
                                req->limit);
        if (req->wait == DLOCK_WAIT_TRY)
            return dlock_seterr(cl(pc), DLOCK_EBUSY, "the lock is held by another owner");
        return dlock_seterr(cl(pc), DLOCK_EPROTO, "no fencing token returned");
    }
    *token = strtoull(PQgetvalue(r, 0, PG_COL_TOKEN), NULL, 10);
    if (req->limit && !PQgetisnull(r, 0, PG_COL_SLOT))
        *slot = (uint32_t)strtoul(PQgetvalue(r, 0, PG_COL_SLOT), NULL, 10);
    PQclear(r);
    /* The session can end in the instant after the grant (terminated, the
     * server stopping), and its last words come with the reply: a grant on
     * a session that is gone is no grant. Read what is there already. */
    if (!PQconsumeInput(s->pg) || (PQisBusy(s->pg), s->ended) ||
        PQstatus(s->pg) != CONNECTION_OK) {
        PQfinish(s->pg);
        s->pg = NULL;
        return dlock_seterr(cl(pc), DLOCK_ECONNECT,
                            "postgresql: the session ended as the lock was granted;"
                            " nothing is held");
    }
    return 0;
}

static int ttl_check(struct pg_conn *pc, uint32_t ttl_ms)
{
    if (ttl_ms > TTL_MAX)
        return dlock_seterr(cl(pc), DLOCK_EINVAL,
                            "postgresql: a TTL of %" PRIu32 " ms is above the longest lease"
                            " (idle_session_timeout) the server takes, 2147483647 ms",
                            ttl_ms);
    return 0;
}

/*
 * A wait's first attempt: a try on a holder session of its lease, when
 * there is one, so that a wait that need not wait (most of them) shares a
 * session too. A try never overtakes a queue: the server refuses it while
 * others wait for the lock, as it refuses the holder's rivals, and hands a
 * released lock straight to the first waiter. Each statement on the shared
 * session is bounded by `timeout`, never less: a bound that ran out would
 * close the session and lose its mates' locks, so a deadline nearer than
 * `timeout` skips this and waits on a session of its own. The session,
 * its mutex still locked, on a grant; NULL otherwise (nothing is held,
 * and nothing is reported: the wait follows), but for a name held in
 * another kind (*refused set, DLOCK_EMODE reported).
 */
static struct pg_session *pre_try(struct pg_conn *pc, const dlock_request *req, int64_t key,
                                  uint32_t *slot, uint64_t *token, uint64_t *granted_ns,
                                  int *refused)
{
    struct pg_session *s = (struct pg_session *)dlock_sql_holder_for_wait(
        &pc->pool, req, pc->timeout_ms, req->ttl_ms, &key);
    if (!s)
        return NULL;
    dlock_request t = *req;
    t.wait = DLOCK_WAIT_TRY;
    dlock_sql_expire(&pc->pool, &s->base, NULL);
    int err = acquire_on(pc, s, &t, key, slot, token, granted_ns);
    if (err == 0)
        return s;
    if (err == DLOCK_EMODE) { /* held in another kind: refused at once, nothing held */
        pthread_mutex_unlock(&s->base.mu);
        *refused = 1;
        return NULL;
    }
    if (s->pg && PQstatus(s->pg) == CONNECTION_OK) {
        if (err != DLOCK_EBUSY && err != DLOCK_ETIMEDOUT)
            session_scrub(pc, s, key, after_timeout(pc));
    } else {
        dlock_pg_session_close(s); /* gone: its locks are lost (their handles say so) */
    }
    pthread_mutex_unlock(&s->base.mu);
    dlock_clearerr(cl(pc));
    return NULL;
}

/* A deadline wait that failed past its deadline for want of an answer (a
 * silent network: its session closed for want of a reply, or a new one
 * that did not answer) is the deadline's: DLOCK_ETIMEDOUT, as on every
 * store, with what happened as its detail. */
static int deadline_err(struct pg_conn *pc, const dlock_request *req, int err)
{
    if (err != DLOCK_ECONNECT || req->wait != DLOCK_WAIT_DEADLINE ||
        dlock_monotonic_ns() < req->deadline_ns)
        return err;
    char was[DLOCK_ERRMSG_MAX];
    snprintf(was, sizeof was, "%s", dlock_errmsg(cl(pc)));
    return dlock_seterr(cl(pc), DLOCK_ETIMEDOUT, "the deadline passed (%s)", was);
}

/*
 * A try runs on a holder session (dlock_sql_session_for: shared with other
 * locks of the same lease) and the grant stays there. A wait runs on a
 * session that holds nothing, since a session blocked in pg_advisory_lock
 * could not renew or release its other locks; once granted, it is a holder
 * session that later tries may join. So the client's connections are its
 * holder sessions plus its waits in progress.
 */
static int pg_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_session *s = NULL;
    struct pg_held *h;
    uint64_t token = 0, granted = 0;
    uint32_t slot = 0;
    int64_t key = 0;
    int err, opened, refused = 0;
    if ((err = ttl_check(pc, req->ttl_ms)) != 0 ||
        (err = dlock_pg_layout_key(pc, req->name, req->name_len, &key)) != 0)
        return err;
    /* Before the grant: a grant is never left without its handle. */
    if (!(h = calloc(1, sizeof *h)))
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    if (req->wait != DLOCK_WAIT_TRY &&
        (s = pre_try(pc, req, key, &slot, &token, &granted, &refused)) != NULL)
        goto granted;
    if (refused) {
        free(h);
        return DLOCK_EMODE;
    }
    for (;;) {
        uint64_t now = dlock_monotonic_ns();
        /* A new session for a deadline wait: by the deadline (and margin). */
        uint64_t open_until = req->wait == DLOCK_WAIT_DEADLINE ? acquire_until(pc, req, now) : 0;
        struct dlock_sql_session *b = NULL;
        if ((err = dlock_sql_session_for(&pc->pool, req->wait == DLOCK_WAIT_TRY, req->ttl_ms,
                                         &key, &open_until, &b, &opened)) != 0) {
            free(h);
            return deadline_err(pc, req, err);
        }
        s = (struct pg_session *)b;
        if (s->base.nheld)
            dlock_sql_expire(&pc->pool, &s->base, NULL);
        err = acquire_on(pc, s, req, key, &slot, &token, &granted);
        s->base.waiting = 0;
        if (err == 0)
            break; /* still under s->mu */
        if (s->pg && PQstatus(s->pg) == CONNECTION_OK) {
            /* Busy, timed out and cancelled leave nothing held (a late
             * grant was undone). Any other failure may have come after the
             * lock was granted in the same statement. */
            if (err != DLOCK_EBUSY && err != DLOCK_ETIMEDOUT && err != DLOCK_ECANCELED &&
                err != DLOCK_EMODE)
                session_scrub(pc, s, key, acquire_until(pc, req, dlock_monotonic_ns()));
            pthread_mutex_unlock(&s->base.mu);
            free(h);
            return err;
        }
        /* The session is gone, and whatever it was granted with it (and
         * the locks it held: their handles report DLOCK_ELOST). A pooled
         * one may have died while idle (its idle timer, a server restart,
         * an administrator): try the next, then a new one. One closed for
         * want of a reply: no retry (that would wait as long again). */
        int silent = s->base.silent_ms != 0;
        dlock_pg_session_close(s);
        pthread_mutex_unlock(&s->base.mu);
        if (opened || silent || err == DLOCK_ETIMEDOUT || err == DLOCK_EBUSY ||
            err == DLOCK_ECANCELED || err == DLOCK_EMODE) {
            free(h);
            return silent ? deadline_err(pc, req, err) : err;
        }
        dlock_count_reconnect(conn->client); /* the next try opens or takes another */
        dlock_clearerr(conn->client);
    }
granted:
    h->base.token = token;
    h->key = key;
    h->mode = req->mode;
    h->limit = req->limit;
    h->slot = slot;
    memcpy(h->owner_hex, req->owner_hex, sizeof h->owner_hex);
    h->sh.lease = req->ttl_ms;
    h->sh.lease_end_ns = granted + (uint64_t)req->ttl_ms * MS;
    if (req->wait != DLOCK_WAIT_TRY) /* the server's idle timer started about now */
        h->base.lease_end_ns = h->sh.lease_end_ns;
    dlock_sql_link(&s->base, &h->sh);
    pthread_mutex_unlock(&s->base.mu);
    *heldp = &h->base;
    return 0;
}

/* The lock is gone with its session (idle_session_timeout, killed, cut,
 * or closed by a timeout), and so is every other lock on it: the session
 * is closed, and stays in the pool, unused, until their handles are
 * released. s->mu held. */
static int session_lost(struct pg_conn *pc, struct pg_held *h)
{
    int err = dlock_seterr(cl(pc), DLOCK_ELOST, "%s", lost_why(pc, h));
    if (!h->sh.gone)
        dlock_pg_session_close(hs(h));
    return err;
}

static int pg_release(dlock_conn *conn, dlock_held *held)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_held *h = (struct pg_held *)held;
    struct pg_session *s = hs(h);
    char sql[700];
    PGresult *r = NULL;
    int err;
    pthread_mutex_lock(&s->base.mu);
    /* The idle timer stays set: the pooled session may die of it while
     * unused, which the next acquire notices and survives; resetting it
     * here would cost every release a statement. */
    if (h->sh.gone || !s->pg) { /* lost earlier (a renew or the keeper saw it) */
        err = session_lost(pc, h);
    } else {
        dlock_sql_expire(&pc->pool, &s->base, &h->sh);
        char ex[600];
        dlock_pg_unlock_exprs(pc, h, ex, sizeof ex);
        /* A semaphore's waiter (of more than 1) may have listened on this
         * session. */
        snprintf(sql, sizeof sql, "SELECT %s%s", ex, h->limit > 1 ? "; UNLISTEN *" : "");
        /* A lost lock's release ends by the core's bound
         * (dlock_call_deadline()) where it is alone on its session: a
         * statement cut short closes the session, which would lose the
         * locks of its mates. */
        uint64_t until = after_timeout(pc);
        if (!dlock_sql_mates(&s->base, &h->sh) && dlock_call_deadline() < until)
            until = dlock_call_deadline();
        err = dlock_pg_run(pc, s, sql, 0, &r, "release", until);
        if (err && s->base.silent_ms) {
            /* Closing the session freed the lock once the server notices. */
        } else if (err && (!s->pg || PQstatus(s->pg) != CONNECTION_OK)) {
            err = session_lost(pc, h);
        } else if (err == 0) {
            int mine = PQgetvalue(r, 0, 0)[0] == 't';
            PQclear(r);
            if (!mine)
                err = dlock_seterr(conn->client, DLOCK_ELOST,
                                   "the session no longer held the lock");
        } else {
            /* Unlock failed on a live session: it may still hold the lock. */
            session_scrub(pc, s, h->key, 0);
        }
    }
    int fell_free = dlock_sql_unlink(&h->sh);
    pthread_mutex_unlock(&s->base.mu);
    if (fell_free)
        dlock_sql_trim(&pc->pool);
    free(h);
    return err;
}

/* Renews h: resets its session's idle timer (any statement does) and gives
 * the session the lease h needs (see dlock_sql_lease()). A statement that
 * succeeds proves h is still held: session locks end only with their
 * session or an unlock, a session struct is never reconnected while a
 * handle points to it, and the only unlocks of a held lock are its release
 * and dlock_sql_expire(), which marks it gone. (pg_locks would say the same
 * at a cost that grows with every lock on the server: ~1 ms a renewal
 * with 1000 held.) 0, DLOCK_ELOST (gone), or dlock_pg_run()'s error. Stale
 * session-mates are let go first. until_ns bounds the renewal's statement;
 * 0: a whole `timeout` from when it is sent (always, on a shared session).
 * Touches only h's own session, under its mutex (held by the caller): safe
 * on the keeper's thread. */
static int renew_on(struct pg_conn *pc, struct pg_held *h, uint32_t ttl_ms, uint64_t until_ns)
{
    struct pg_session *s = hs(h);
    char sql[200], tg[128];
    PGresult *r = NULL;
    if (h->sh.gone)
        return dlock_seterr(cl(pc), DLOCK_ELOST, "%s", lost_why(pc, h));
    dlock_sql_expire(&pc->pool, &s->base, &h->sh);
    if (!until_ns) /* taken after the expiry's statement: a whole `timeout` */
        until_ns = after_timeout(pc);
    uint32_t lease_ms = dlock_sql_lease(&s->base, &h->sh, ttl_ms);
    uint64_t sent = dlock_monotonic_ns();
    dlock_pg_tag(tg, sizeof tg, h->owner_hex, lease_ms, h->base.token, h->key);
    snprintf(sql, sizeof sql, "%sSET idle_session_timeout = %" PRIu32, tg, lease_ms);
    int err = dlock_pg_run(pc, s, sql, 0, &r, "renew", until_ns);
    if (err)
        return err;
    PQclear(r);
    s->base.lease = lease_ms;
    h->sh.lease = ttl_ms;
    h->sh.lease_end_ns = sent + (uint64_t)ttl_ms * MS;
    return 0;
}

static int pg_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_held *h = (struct pg_held *)held;
    struct pg_session *s = hs(h);
    int err = ttl_check(pc, ttl_ms);
    if (err)
        return err;
    pthread_mutex_lock(&s->base.mu);
    if (h->sh.gone || !s->pg)
        err = session_lost(pc, h);
    else if ((err = renew_on(pc, h, ttl_ms, 0)) != 0 && s->base.silent_ms)
        err = dlock_seterr(conn->client, DLOCK_ECONNECT,
                           "postgresql: renew: no reply from the server within %" PRIu64
                           " ms; the session was closed, and the lock is lost with it",
                           s->base.silent_ms);
    else if (err && (!s->pg || PQstatus(s->pg) != CONNECTION_OK))
        err = session_lost(pc, h);
    pthread_mutex_unlock(&s->base.mu);
    return err;
}

/* bigint tokens: the next grant after a raise (floor + 1) must still fit. */
#define RAISE_MAX 9223372036854775806ull /* 2^63 - 2 */

/* A failed raise statement on h's session, as renew reports it. The lock
 * stays held on a live session: nothing there is undone or scrubbed. */
static int raise_failed(struct pg_conn *pc, struct pg_held *h, int err, uint64_t floor)
{
    if (hs(h)->base.silent_ms)
        return dlock_seterr(cl(pc), DLOCK_ECONNECT,
                            "postgresql: raise: no reply from the server within %" PRIu64
                            " ms; the session was closed, and the lock is lost with it"
                            " (the raise may or may not have been made)",
                            hs(h)->base.silent_ms);
    if (!hs(h)->pg || PQstatus(hs(h)->pg) != CONNECTION_OK)
        return session_lost(pc, h);
    if (strcmp(hs(h)->sqlstate, "55P03") == 0 || strcmp(hs(h)->sqlstate, "57014") == 0)
        return dlock_seterr(cl(pc), DLOCK_ETIMEDOUT,
                            "postgresql: raise: the fencing %s %s%s stayed locked by another"
                            " transaction for the timeout (%" PRIu64 " ms); nothing was raised,"
                            " and the lock is still held",
                            pc->use_sequence ? "sequence" : "row of table",
                            pc->table, pc->use_sequence ? "_seq" : "", pc->timeout_ms);
    if (pc->use_sequence && strcmp(hs(h)->sqlstate, "42501") == 0) {
        char why[DLOCK_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", cl(pc)->errmsg);
        return dlock_seterr(cl(pc), DLOCK_ESTORE,
                            "postgresql: raising the fencing sequence %s_seq to %" PRIu64
                            " needs its owner's rights (ALTER SEQUENCE keeps nextval() out"
                            " while setval() raises it); nothing was raised: %s",
                            pc->table, floor, why);
    }
    return err;
}

/*
 * raise_token, on the lock's own session, in one transaction with the
 * acquire's settings (READ COMMITTED, synchronous_commit on: the raise is on
 * disk before the call returns, as a grant's bump is). The same statement
 * checks in pg_locks that the session still holds the advisory lock (as
 * renew does) and raises only then; the session cannot lose a session lock
 * while it runs a statement, so the check holds for the whole transaction.
 *
 * token=table: the name's row becomes GREATEST(token, floor) (written only
 * where it is below; inserted if missing), under the row lock a grant's bump
 * takes too. One round trip.
 *
 * token=sequence: the sequence is shared by all names and nextval() and
 * setval() are not transactional, so "setval where below" is a read then a
 * write that a concurrent nextval() (another name's grant) or raise could
 * slip between: setval would then move the sequence back below tokens
 * already handed out. Advisory locks would only serialize raises with each
 * other. So the transaction first takes ALTER SEQUENCE's
 * SHARE ROW EXCLUSIVE lock on the sequence (a no-op change, NO CYCLE, which a
 * fencing sequence must be anyway), which conflicts with the ROW EXCLUSIVE
 * lock nextval() and setval() take and with itself: grants of every name
 * wait for the raise's commit, and two raises run one after the other; the
 * read and the setval() under it are atomic. It needs the sequence's owner
 * (dlock creates it as the role that first opens the store). To keep grants
 * from waiting when nothing needs raising, a first read (with the ownership
 * check) returns at once when the sequence is already at or past floor
 * (sequences only grow: later values stay above it), after its commit has
 * made what it saw durable: one round trip; a raise that writes takes two.
 *
 * Bounds: `timeout` on the server for the whole call (lock_timeout and
 * statement_timeout: a raise waits for the row or the sequence behind
 * someone's transaction at most that long: DLOCK_ETIMEDOUT, lock still
 * held), and on the client a little longer (the deadline waits' margin) for
 * the server's answer; no answer by then closes the session, as for renew.
 */
static int raise_on(struct pg_conn *pc, struct pg_held *h, uint64_t floor)
{
    dlock_conn *conn = &pc->base;
    char sql[1400], owned[320], settings[384], tg[128], rs[256], match[160];
    PGresult *r = NULL;
    uint64_t start = dlock_monotonic_ns();
    uint64_t end = start + pc->timeout_ms * MS;
    uint64_t margin = pc->timeout_ms < DEADLINE_MARGIN_MS ? pc->timeout_ms : DEADLINE_MARGIN_MS;
    int err, held_now;
    if (floor > RAISE_MAX)
        return dlock_seterr(conn->client, DLOCK_EINVAL,
                            "postgresql: a token floor of %" PRIu64 " is beyond the fencing %s's"
                            " bigint tokens: the next token must fit, so the floor must be at"
                            " most 9223372036854775806 (2^63 - 2)",
                            floor, pc->use_sequence ? "sequence" : "table");
    if (h->sh.gone || !hs(h)->pg)
        return session_lost(pc, h);
    dlock_pg_key_match(pc, h->key, "", match, sizeof match);
    snprintf(owned, sizeof owned,
             "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
             " AND %s AND granted)",
             match);
    dlock_pg_tag(tg, sizeof tg, h->owner_hex, hs(h)->base.lease, h->base.token, h->key);
    dlock_pg_tx_settings(rs, sizeof rs, pc->timeout_ms);
    snprintf(settings, sizeof settings, "%s%s", tg, rs);
    if (pc->use_sequence) {
        /* Already past floor (the next value > floor)? Then nothing to do,
         * once what we saw is on disk: the value may come from a grant
         * whose transaction has not committed yet, so an xid makes this
         * transaction's commit flush the WAL up to here (nextval() logs
         * before it lets anyone read the new value). */
        snprintf(sql, sizeof sql,
                 "%sWITH v AS MATERIALIZED (SELECT %s AS n, last_value > %" PRIu64
                 " OR (last_value = %" PRIu64 " AND is_called) AS above FROM %s_seq) "
                 "SELECT n, above, CASE WHEN n = 1 AND above THEN pg_current_xact_id() END FROM v",
                 settings, owned, floor, floor, pc->table);
        if ((err = dlock_pg_run(pc, hs(h), sql, 4, &r, "raise", end + margin * MS)) != 0)
            return raise_failed(pc, h, err, floor);
        held_now = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "1") == 0;
        int above = PQntuples(r) == 1 && PQgetvalue(r, 0, 1)[0] == 't';
        PQclear(r);
        r = NULL;
        if (!held_now)
            return dlock_seterr(conn->client, DLOCK_ELOST,
                                "the session no longer holds the lock; nothing was raised");
        if (above)
            return 0;
        uint64_t now = dlock_monotonic_ns();
        dlock_pg_tx_settings(rs, sizeof rs, now < end ? (end - now + MS - 1) / MS : 1);
        snprintf(settings, sizeof settings, "%s%s", tg, rs);
    }
    if (pc->use_sequence)
        snprintf(sql, sizeof sql,
                 "%sALTER SEQUENCE %s_seq NO CYCLE; "
                 "WITH l AS MATERIALIZED (SELECT %s AS n) "
                 "SELECT n, (SELECT setval('%s_seq', %" PRIu64 ") FROM %s_seq WHERE n = 1 AND"
                 " (last_value < %" PRIu64 " OR (last_value = %" PRIu64 " AND NOT is_called)))"
                 " FROM l",
                 settings, pc->table, owned, pc->table, floor, pc->table, floor, floor);
    else
        snprintf(sql, sizeof sql,
                 "%sWITH l AS MATERIALIZED (SELECT %s AS n), "
                 "f AS (INSERT INTO %s (key, token) SELECT %" PRId64 ", %" PRIu64 " FROM l"
                 " WHERE n = 1 ON CONFLICT (key) DO UPDATE SET token = GREATEST(%s.token,"
                 " EXCLUDED.token) WHERE %s.token < EXCLUDED.token RETURNING token) "
                 "SELECT (SELECT n FROM l), (SELECT token FROM f)",
                 settings, owned, pc->table, h->key, floor, pc->table, pc->table);
    if ((err = dlock_pg_run(pc, hs(h), sql, pc->use_sequence ? 5 : 4, &r, "raise",
                            end + margin * MS)) != 0)
        return raise_failed(pc, h, err, floor);
    held_now = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "1") == 0;
    PQclear(r);
    if (!held_now)
        return dlock_seterr(conn->client, DLOCK_ELOST,
                            "the session no longer holds the lock; nothing was raised");
    return 0;
}

/* Under the session's mutex for both of its exchanges (a sequence raise
 * that writes), within `timeout` and the margin in all: a keep() of a
 * session-mate waits at most that long. */
static int pg_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_held *h = (struct pg_held *)held;
    pthread_mutex_lock(&hs(h)->base.mu);
    int err = raise_on(pc, h, floor);
    pthread_mutex_unlock(&hs(h)->base.mu);
    return err;
}

/*
 * token_top: token=table, max(token) over the fencing table (a scan of
 * every row, the floor's included); token=sequence, the sequence's
 * last_value (its cached values included: at or above every value handed
 * out, and at or above a floor set with setval()). One round trip, bounded
 * by `timeout`; reads only, takes no lock a grant waits for.
 */
static int pg_token_top(dlock_conn *conn, uint64_t *top)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    char sql[512], settings[256], state[6];
    PGresult *r = NULL;
    int err;
    dlock_pg_tx_settings(settings, sizeof settings, pc->timeout_ms);
    if (pc->use_sequence)
        snprintf(sql, sizeof sql, "%sSELECT last_value FROM %s_seq", settings, pc->table);
    else
        snprintf(sql, sizeof sql, "%sSELECT coalesce(max(token), 0) FROM %s", settings, pc->table);
    if ((err = dlock_pg_run_idle(pc, sql, 4, &r, "reading the highest token", state)) != 0)
        return dlock_pg_store_failed(pc, err, state, "reading the highest token");
    if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0)) {
        PQclear(r);
        return dlock_seterr(conn->client, DLOCK_EPROTO,
                            "postgresql: reading the highest token: no value returned");
    }
    const char *v = PQgetvalue(r, 0, 0);
    int64_t t = strtoll(v, NULL, 10);
    PQclear(r);
    *top = t > 0 ? (uint64_t)t : 0;
    return 0;
}

/*
 * raise_floor, on an idle pooled session, in a transaction with the
 * acquire's settings (synchronous_commit on: the floor is on disk before
 * the call returns, as a grant's bump is; `timeout` on the server for every
 * lock wait and the whole statement).
 *
 * token=table: the row FLOOR_KEY of the fencing table becomes
 * GREATEST(token, floor) (inserted if missing, written only where below).
 * Every grant's statement reads that row (statement snapshot, no lock) and
 * takes GREATEST(name's token + 1, floor + 1): a grant whose statement
 * starts after the commit sees it. One round trip.
 *
 * token=sequence: as raise_token for the sequence (see pg_raise_token): a
 * first read returns at once (after a commit that makes what it saw
 * durable) when the sequence is already at or past floor; else ALTER
 * SEQUENCE's lock keeps nextval() and other raises out while setval()
 * raises it where still below. Needs the sequence's owner; two round trips.
 */
static int pg_raise_floor(dlock_conn *conn, uint64_t floor)
{
    static const char what[] = "raising the store's token floor";
    struct pg_conn *pc = (struct pg_conn *)conn;
    char sql[1024], settings[256], state[6];
    PGresult *r = NULL;
    int err;
    if (floor > RAISE_MAX)
        return dlock_seterr(conn->client, DLOCK_EINVAL,
                            "postgresql: a token floor of %" PRIu64 " is beyond the fencing %s's"
                            " bigint tokens: the next token must fit, so the floor must be at"
                            " most 9223372036854775806 (2^63 - 2)",
                            floor, pc->use_sequence ? "sequence" : "table");
    if (floor == 0)
        return 0; /* every token is above 0 */
    dlock_pg_tx_settings(settings, sizeof settings, pc->timeout_ms);
    if (!pc->use_sequence) {
        snprintf(sql, sizeof sql,
                 "%sINSERT INTO %s (key, token) VALUES (" FLOOR_KEY ", %" PRIu64 ") "
                 "ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token"
                 " WHERE %s.token < EXCLUDED.token",
                 settings, pc->table, floor, pc->table);
        if ((err = dlock_pg_run_idle(pc, sql, 4, &r, what, state)) != 0)
            return dlock_pg_store_failed(pc, err, state, what);
        PQclear(r);
        return 0;
    }
    snprintf(sql, sizeof sql,
             "%sWITH v AS MATERIALIZED (SELECT last_value > %" PRIu64 " OR (last_value = %" PRIu64
             " AND is_called) AS above FROM %s_seq) "
             "SELECT above, CASE WHEN above THEN pg_current_xact_id() END FROM v",
             settings, floor, floor, pc->table);
    if ((err = dlock_pg_run_idle(pc, sql, 4, &r, what, state)) != 0)
        return dlock_pg_store_failed(pc, err, state, what);
    int above = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    r = NULL;
    if (above)
        return 0;
    snprintf(sql, sizeof sql,
             "%sALTER SEQUENCE %s_seq NO CYCLE; "
             "SELECT setval('%s_seq', %" PRIu64 ") FROM %s_seq WHERE last_value < %" PRIu64
             " OR (last_value = %" PRIu64 " AND NOT is_called)",
             settings, pc->table, pc->table, floor, pc->table, floor, floor);
    if ((err = dlock_pg_run_idle(pc, sql, 5, &r, what, state)) != 0) {
        if (strcmp(state, "42501") == 0) {
            char why[DLOCK_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", cl(pc)->errmsg);
            return dlock_seterr(conn->client, DLOCK_ESTORE,
                                "postgresql: raising the fencing sequence %s_seq to %" PRIu64
                                " needs its owner's rights (ALTER SEQUENCE keeps nextval() out"
                                " while setval() raises it); nothing was raised: %s",
                                pc->table, floor, why);
        }
        return dlock_pg_store_failed(pc, err, state, what);
    }
    PQclear(r);
    return 0;
}

/* The keeper's renewal: as renew, on the lock's session under its mutex,
 * but bounded by the lease's end too (no reply by then: the lease is over
 * anyway). A session it finds gone is closed (every lock on it is lost),
 * and stays in the pool until the application's thread releases them. */
static int keep_on(struct pg_conn *pc, struct pg_held *h, uint32_t ttl_ms)
{
    dlock_conn *conn = &pc->base;
    struct pg_session *s = hs(h);
    uint64_t now = dlock_monotonic_ns(), until = now + pc->timeout_ms * MS;
    if (h->sh.gone || !s->pg)
        return dlock_seterr(conn->client, DLOCK_ELOST, "%s", lost_why(pc, h));
    if (now >= h->sh.lease_end_ns)
        return dlock_seterr(conn->client, DLOCK_EEXPIRED,
                            "postgresql: the lease had run out before it could be renewed");
    /* Alone on its session, the renewal need not outlive the lease (a
     * session closed for want of a reply loses only this lock, which is
     * ending anyway). With mates it gets the whole `timeout`: closing the
     * session would lose theirs too, and a late reply is no harm (the
     * watchdog reports this lock at its lease end all the same). */
    int shared = dlock_sql_mates(&s->base, &h->sh);
    if (h->sh.lease_end_ns < until && !shared)
        until = h->sh.lease_end_ns;
    int err = renew_on(pc, h, ttl_ms, shared ? 0 : until);
    if (err && s->base.silent_ms)
        return dlock_seterr(conn->client, DLOCK_EEXPIRED,
                            "postgresql: no reply to the renewal within %" PRIu64
                            " ms%s; the session was closed, and the lock is lost with it",
                            s->base.silent_ms, until < now + pc->timeout_ms * MS
                                                 ? " (the lease's end)" : "");
    if (err && (!s->pg || PQstatus(s->pg) != CONNECTION_OK)) {
        dlock_pg_session_close(s);
        return dlock_seterr(conn->client, DLOCK_ELOST, "%s", lost_why(pc, h));
    }
    return err;
}

static int pg_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_held *h = (struct pg_held *)held;
    if (ttl_check(pc, ttl_ms) != 0)
        return DLOCK_EINVAL;
    pthread_mutex_lock(&hs(h)->base.mu);
    int err = keep_on(pc, h, ttl_ms);
    pthread_mutex_unlock(&hs(h)->base.mu);
    return err;
}

static int pg_ping(dlock_conn *conn)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    PGresult *r = NULL;
    char state[6];
    int err = dlock_pg_run_pooled(pc, "SELECT 1", 0, &r, "ping", state, pc->timeout_ms);
    if (err == 0)
        PQclear(r);
    return err;
}

const dlock_backend dlock_postgres_backend = {
    DLOCK_BACKEND_INIT,
    .name = "postgres",
    .schemes = pg_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_HOLDER_DEATH | DLOCK_CAP_RAISE |
            DLOCK_CAP_CANCEL | DLOCK_CAP_SHARED | DLOCK_CAP_SEMAPHORE | DLOCK_CAP_ELECTION |
            DLOCK_CAP_WATCH,
    .options = pg_options,
    .open = pg_open,
    .close = pg_close,
    .acquire = pg_acquire,
    .release = pg_release,
    .renew = pg_renew,
    .ping = pg_ping,
    .keep = pg_keep,
    .raise_token = pg_raise_token,
    .token_top = pg_token_top,
    .raise_floor = pg_raise_floor,
    .inspect = dlock_pg_inspect,
    .inspect_holders = dlock_pg_inspect_holders,
    .publish = dlock_pg_publish,
    .leader = dlock_pg_leader,
    .wake = dlock_pg_wake,
    .watch_open = dlock_pg_watch_open,
    .watch_fd = dlock_pg_watch_fd,
    .watch_read = dlock_pg_watch_read,
    .watch_close = dlock_pg_watch_close,
};
