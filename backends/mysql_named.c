/*
 * The MariaDB backend's lock=named recipe: a lock is a user lock
 * (GET_LOCK), its token NEXTVAL of the store's sequence in the same
 * statement (mysql_seq.c). Held locks share sessions through the SQL
 * backends' held-lock session layer (sql_session.h: which session a lock
 * goes on, DLOCK_SQL_LOCKS_MAX per session of one lease, expiry among
 * mates, trimming, the lost reason and the thread rules); this file
 * supplies its hooks (liveness, open, close, RELEASE_LOCK of a batch) and
 * the statements. The layer's lease is wait_timeout, whole seconds
 * (mc_ceil_s of a TTL), converted here at the edge. How it waits, renews,
 * recovers from a restart and what inspect shows: docs/mysql.md, "How
 * the backend works" (lock=named). Calls sql_session.c, mysql_seq.c and
 * mysql_conn.c only.
 *
 * Threads (sql_session.h's rules): a use of a shared session holds its
 * mutex for a few exchanges at most (5 for a try: docs/mysql.md,
 * "lock=named sessions"), never across a connect: an acquire's
 * durable-mark checkpoint unlocks it (the layer's pending keeps that
 * grant's lease from being lowered meanwhile).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysqld_error.h>

#include "config.h"
#include "backends/mysql_int.h"

/* layout=plain: the longest name, in characters (MySQL's documented limit
 * for user locks) and in bytes (MariaDB's: NAME_LEN, 64 characters of its
 * 3-byte system character set; it counts bytes). */
#define PLAIN_CHARS_MAX 64
#define PLAIN_BYTES_MAX 192
/* The user lock's name as an SQL literal: 'dlock:' + 58 hex digits, or
 * layout=plain's X'<hex of the name's bytes>'; with its NUL. */
#define LIT_MAX (3 + 2 * PLAIN_BYTES_MAX + 1)

/*
 * The user lock of a name, as an SQL literal that goes into statements as
 * it is (out: LIT_MAX bytes). layout=dlock: 'dlock:' + 58 hex digits of
 * SHA-256(salt || SHA-256(name)), since MariaDB's user locks are
 * server-wide (every database shares them): the database and the table
 * are in the hash. layout=plain: the name itself, as its bytes in hex
 * (X'6a6f6273' is the lock GET_LOCK('jobs') takes: MariaDB compares the
 * bytes, so no quoting and no character set conversion touch it), at most
 * PLAIN_CHARS_MAX characters (UTF-8: bytes that do not continue a
 * character) and PLAIN_BYTES_MAX bytes, else DLOCK_EINVAL (the core
 * already refused an empty name and a NUL byte, which MariaDB would take
 * as the end of the name).
 */
static int named_literal(struct mysql_conn *mc, const char *name, size_t len, char *out)
{
    unsigned char k[DLOCK_SHA256_LEN], in[2 * DLOCK_SHA256_LEN], d[DLOCK_SHA256_LEN];
    char hex[2 * DLOCK_SHA256_LEN + 1];
    if (mc->layout_plain) {
        size_t chars = 0;
        for (size_t i = 0; i < len; i++)
            chars += ((unsigned char)name[i] & 0xC0) != 0x80;
        if (chars > PLAIN_CHARS_MAX || len > PLAIN_BYTES_MAX)
            return dlock_seterr(cl(mc), DLOCK_EINVAL,
                                "layout=plain: the name is the server's user lock name, at most"
                                " %d characters and %d bytes (this one: %zu characters, %zu"
                                " bytes)", PLAIN_CHARS_MAX, PLAIN_BYTES_MAX, chars, len);
        out[0] = 'X';
        out[1] = '\'';
        dlock_hex((const unsigned char *)name, len, out + 2);
        memcpy(out + 2 + 2 * len, "'", 2);
        return 0;
    }
    dlock_sha256(name, len, k);
    memcpy(in, mc->salt, DLOCK_SHA256_LEN);
    memcpy(in + DLOCK_SHA256_LEN, k, DLOCK_SHA256_LEN);
    dlock_sha256(in, sizeof in, d);
    dlock_hex(d, sizeof d, hex);
    snprintf(out, LIT_MAX, "'dlock:%.58s'", hex);
    return 0;
}

/* A lock=named session: the shared layer's part (held locks, mutex, lease
 * in seconds) and the connection. */
struct named_session {
    struct dlock_sql_session base; /* first: see sql_session.h */
    struct session c;
};

/* A held user lock. */
struct named_held {
    dlock_held base;
    struct dlock_sql_held sh; /* its session, lease (s), client-side lease end */
    uint32_t ttl_ms;
    char owner[33];           /* the grant's owner id (publish writes it) */
    uint64_t raised;          /* the highest floor raised to: a list's term (publish) */
    char lname[];             /* the user lock, an SQL literal (named_literal) */
};

static struct named_session *ns_of(struct dlock_sql_session *b)
{
    return (struct named_session *)b;
}

static struct named_session *session_of(const struct named_held *h)
{
    return ns_of(h->sh.s);
}

static struct mysql_conn *mc_of(dlock_conn *conn)
{
    return (struct mysql_conn *)conn;
}

/* Closes the connection at once; the struct stays while handles point to
 * it, remembering why it ended (the layer's silent_ms). */
static void named_disconnect(struct named_session *s)
{
    if (s->c.silent_ms)
        s->base.silent_ms = s->c.silent_ms;
    mc_session_disconnect(&s->c);
}

/* ---- the shared layer's hooks (sql_session.h) --------------------------- */

static int session_alive(const struct dlock_sql_session *b)
{
    const struct named_session *s = (const struct named_session *)b;
    return s->c.db && !s->c.dead;
}

/* arg: the call's struct bound. */
static int session_new(dlock_conn *conn, void *arg, struct dlock_sql_session **out)
{
    struct mysql_conn *mc = mc_of(conn);
    struct named_session *s = malloc(sizeof *s);
    int err;
    if (!s || dlock_sql_session_init(&s->base) != 0) {
        free(s);
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    }
    if ((err = mc_session_connect(mc, ROLE_NAMED, arg, &s->c)) != 0) {
        dlock_sql_session_fini(&s->base);
        free(s);
        return err;
    }
    *out = &s->base;
    return 0;
}

static void session_end(struct dlock_sql_session *b)
{
    named_disconnect(ns_of(b));
}

static void session_destroy(struct dlock_sql_session *b)
{
    dlock_sql_session_fini(b);
    free(ns_of(b));
}

/*
 * RELEASE_LOCK of each lock of the batch in one statement, bounded by a
 * `timeout` of its own (s is shared). A session gone takes them all (it
 * is closed here); otherwise they are tried again at the next use.
 */
static int unlock_batch(dlock_conn *conn, struct dlock_sql_session *b,
                        struct dlock_sql_held *const *batch, size_t n)
{
    struct mysql_conn *mc = mc_of(conn);
    struct named_session *s = ns_of(b);
    size_t o = 0, size = 16;
    if (!s->c.db)
        return -1;
    for (size_t i = 0; i < n; i++)
        size += 16 + strlen(DLOCK_SQL_OF(batch[i], struct named_held, sh)->lname);
    char *sql = malloc(size);
    if (!sql)
        return -1;
    o += (size_t)snprintf(sql, size, "SELECT ");
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(sql + o, size - o, "%sRELEASE_LOCK(%s)", i ? ", " : "",
                              DLOCK_SQL_OF(batch[i], struct named_held, sh)->lname);
    dlock_errsave why;
    MYSQL_RES *res = NULL;
    struct bound bd = mc_stmt_bound(NULL, mc->timeout_ms);
    dlock_err_save(cl(mc), &why); /* not what the caller reports */
    int err = mc_query_result(mc, &s->c, sql, &bd, "releasing locks whose lease ended", &res);
    dlock_err_restore(cl(mc), &why);
    free(sql);
    if (err) {
        if (s->c.dead) /* a session gone takes them all */
            named_disconnect(s);
        return err;
    }
    mysql_free_result(res);
    return 0;
}

static int is_key(const struct dlock_sql_held *h, const void *key)
{
    return strcmp(DLOCK_SQL_OF(h, const struct named_held, sh)->lname, key) == 0;
}

static const struct dlock_sql_ops session_ops = {
    .alive = session_alive,
    .open = session_new,
    .close = session_end,
    .destroy = session_destroy,
    .unlock = unlock_batch,
    .is_key = is_key,
    .why_gone = "its lease had ended without a renewal, and it was released on the session it"
                " shared with locks that were still in use",
    .why_silent = "the session holding it was closed after the server did not answer in time",
    .why_ended = "the session holding it ended (its lease ran out, a KILL, or the connection"
                 " was lost)",
};

/* An expression that fails (ER_SUBQUERY_NO_1_ROW) where it is evaluated:
 * IF evaluates only the branch taken, so IF(ours, v, NOT_OURS) is v or an
 * error, in a statement answered by an OK packet. (NULL would not do: SET
 * takes it as 1 second, and a string makes the IF a string.) */
#define NOT_OURS "(SELECT 1 UNION ALL SELECT 2)"

/* Why h is gone, for messages. */
static const char *named_lost_why(struct mysql_conn *mc, const struct named_held *h)
{
    return dlock_sql_lost_why(&mc->pool, &h->sh);
}

/* A statement failed on s (err recorded): the session is gone if the
 * server dropped it or did not answer, and every lock on it with it. */
static int named_failed(struct named_session *s, int err)
{
    if (s->c.dead)
        named_disconnect(s);
    return err;
}

/* Undoes a grant on s whose handle will not be made (its token could not
 * be made durable); closes the session if even that fails. */
static void named_undo(struct mysql_conn *mc, struct named_session *s, const char *lname)
{
    char sql[32 + LIT_MAX];
    MYSQL_RES *res = NULL;
    dlock_errsave why;
    struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
    if (!s->c.db)
        return;
    dlock_err_save(cl(mc), &why);
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK(%s)", lname);
    if (mc_query_result(mc, &s->c, sql, &b, "undoing a grant", &res) == 0) {
        mysql_free_result(res);
    } else {
        s->c.dead = 1;
        named_disconnect(s);
    }
    dlock_err_restore(cl(mc), &why);
}

/* The acquire statement failed (err recorded) on s, which did not hold
 * lname before (the layer picks no session holding it): if s is live,
 * GET_LOCK may have granted it before the failure (NEXTVAL out of values,
 * a result that could not be read), and a handle-less grant would stay on
 * s (forever among mates, or nested by a later GET_LOCK on a pooled s):
 * released, or s closed. */
static int named_unget(struct mysql_conn *mc, struct named_session *s, const char *lname, int err)
{
    if (!s->c.dead)
        named_undo(mc, s, lname);
    return named_failed(s, err);
}

/*
 * One GET_LOCK on s, with the token in the same statement:
 *
 *   SELECT IF(GET_LOCK('dlock:<hash>', t) = 1, NEXTVAL(<table>_seq), 0)
 *
 * NEXTVAL is evaluated only when the lock was granted (a refused or timed
 * out GET_LOCK takes no value), once it was, so tokens grow in grant order.
 * t: 0 for a try, what is left of a deadline (GET_LOCK takes fractions of
 * a second), a year (its maximum) without one. The client waits for the
 * answer: a try `timeout`, a deadline until CLEANUP_MS past it, a wait
 * without one unbounded (TCP keepalives). Returns 1 (granted, *token), 0
 * (not granted) or an error. A wait cut short (signal, cancel, no answer)
 * has its session killed from the control session and closed (whatever it
 * got is freed with it).
 */
static int named_get(struct mysql_conn *mc, struct named_session *s, const dlock_request *req,
                     const char *lname, uint64_t until, uint64_t *token)
{
    char sql[192 + LIT_MAX], t[48];
    uint64_t start = dlock_monotonic_ns();
    if (req->wait == DLOCK_WAIT_TRY) {
        snprintf(t, sizeof t, "0");
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t left_us = req->deadline_ns > start ? (req->deadline_ns - start) / 1000u : 0;
        snprintf(t, sizeof t, "%" PRIu64 ".%06" PRIu64, left_us / 1000000u, left_us % 1000000u);
    } else {
        snprintf(t, sizeof t, "%u", MDL_WAIT_MAX_S);
    }
    snprintf(sql, sizeof sql, "SELECT IF(GET_LOCK(%s, %s) = 1, NEXTVAL(`%s_seq`), 0)", lname, t,
             mc->table);
    struct nb c = {.op = NB_QUERY, .db = s->c.db, .sql = sql};
    mc_nb_step(&c, -1);
    int w = mc_nb_wait(&c, until, req->wait != DLOCK_WAIT_TRY,
                       req->wait != DLOCK_WAIT_TRY ? req->cancel_fd : -1);
    if (w == -1 && req->wait == DLOCK_WAIT_TRY)
        return named_failed(s, mc_no_reply(mc, &s->c, "acquire", start, DLOCK_ECONNECT));
    if (w != 0) {
        char kill[64];
        struct session *ctl;
        struct bound kb = {mc_cleanup_until(req), DLOCK_ECONNECT, 0};
        dlock_errsave why;
        int err = w == -2   ? dlock_seterr(cl(mc), DLOCK_EINTR, "a signal interrupted the wait")
                  : w == -3 ? dlock_cancelled(cl(mc))
                            : dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                                           "the deadline passed with the lock still held elsewhere"
                                           " (the server did not end the wait in time)");
        dlock_err_save(cl(mc), &why);
        snprintf(kill, sizeof kill, "KILL %lu", mysql_thread_id(s->c.db));
        if (mc_ctl_session(mc, &kb, &ctl) == 0 &&
            mc_run(mc, ctl, NB_QUERY, NULL, kill, &kb, "KILL") != 0)
            mc_ctl_dropped(mc);
        dlock_err_restore(cl(mc), &why);
        s->c.dead = 1;
        s->c.silent_ms = (dlock_monotonic_ns() - start) / MS + 1;
        named_disconnect(s);
        return err;
    }
    if (c.ret != 0)
        return named_unget(mc, s, lname, mc_fail_on(mc, &s->c, NULL, "acquire"));
    struct nb r = {.op = NB_STORE, .db = s->c.db};
    struct bound rb = mc_stmt_bound(NULL, s->base.nheld ? mc->timeout_ms : CLEANUP_MS);
    mc_nb_step(&r, -1);
    if (mc_nb_finish(&r, rb.until, 0) != 0)
        return named_failed(s, mc_no_reply(mc, &s->c, "acquire", start, DLOCK_ECONNECT));
    if (!r.res)
        return named_unget(mc, s, lname, mc_fail_on(mc, &s->c, NULL, "acquire"));
    MYSQL_ROW row = mysql_fetch_row(r.res);
    *token = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
    mysql_free_result(r.res);
    return *token != 0;
}

/* One attempt on s (s->base.mu held): sets its lease first if it has none of
 * this length yet (a session holding nothing), then GET_LOCK, and makes
 * the token durable. 0 granted (*replied: when the last reply on s came,
 * where the server's idle timer, the lease, starts), else an error
 * (DLOCK_EBUSY, DLOCK_ETIMEDOUT...). On a shared session each statement
 * gets a `timeout` of its own, not what is left of the try's (until is
 * then ignored); the durable mark's checkpoint (the control session: a
 * connect, a commit) runs with s->base.mu unlocked, so keep() of s's mates
 * does not wait for it. */
static int named_attempt(struct mysql_conn *mc, struct named_session *s, const dlock_request *req,
                         const char *lname, struct bound *call, uint64_t until, uint64_t *token,
                         uint64_t *replied)
{
    unsigned lease = mc_ceil_s(req->ttl_ms);
    int err, behind = 0;
    if (s->base.nheld)
        dlock_sql_expire(&mc->pool, &s->base, NULL);
    if (!s->c.db)
        return dlock_seterr(cl(mc), DLOCK_ECONNECT, "mysql %s: the session ended", mc->where);
    if (s->base.nheld == 0 && s->base.lease != lease) {
        char sql[64];
        snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", lease);
        if ((err = mc_exec_sql(mc, &s->c, sql, call, "setting the session's lease")) != 0)
            return named_failed(s, err);
        s->base.lease = lease;
    }
    int shared = dlock_sql_mates(&s->base, NULL);
    if (shared)
        until = dlock_monotonic_ns() + mc->timeout_ms * MS;
    err = named_get(mc, s, req, lname, until, token);
    *replied = dlock_monotonic_ns();
    if (err < 0 || err > 1)
        return err;
    if (err == 0) {
        if (req->wait == DLOCK_WAIT_TRY)
            return dlock_seterr(cl(mc), DLOCK_EBUSY, "the lock is held by another owner");
        if (req->wait == DLOCK_WAIT_DEADLINE)
            return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                                "the deadline passed with the lock still held elsewhere");
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: GET_LOCK ended without the lock (killed?)", mc->where);
    }
    /* The mark (once per range) may need the control session and a
     * commit: `timeout` at least, as any statement. */
    struct bound db =
        mc_stmt_bound(NULL, mc->timeout_ms > CLEANUP_MS ? mc->timeout_ms : CLEANUP_MS);
    if (req->wait == DLOCK_WAIT_TRY && !shared)
        db = *call;
    if ((err = mc_seq_mark_read(mc, &s->c, *token, &db, &behind, replied)) != 0) {
        if (s->c.dead)
            named_disconnect(s);
        else
            named_undo(mc, s, lname);
        return err;
    }
    if (!behind)
        return 0;
    if (shared)
        db = mc_stmt_bound(NULL, mc->timeout_ms);
    s->base.pending = lease;
    pthread_mutex_unlock(&s->base.mu);
    err = mc_seq_mark_past(mc, *token, &db);
    pthread_mutex_lock(&s->base.mu);
    s->base.pending = 0;
    if (!s->c.db) /* keep() of a mate found the session gone meanwhile */
        return err ? err
                   : dlock_seterr(cl(mc), DLOCK_ECONNECT, "mysql %s: acquire: the session"
                                  " holding the new lock ended before its token was on disk",
                                  mc->where);
    if (err)
        named_undo(mc, s, lname);
    return err;
}

/*
 * A waiting session the server dropped, not one idle long enough to have
 * been dropped for that: was the server restarted since since_ns (queue
 * again), or was the session killed alone (an administrator's KILL: not
 * waited on again)? A session that holds nothing (opened if need be)
 * reads the server's uptime: restarted if it started after since_ns
 * (whole seconds). While the server does not answer, tries again every
 * 100 ms to 1 s, until the deadline, or for connect_timeout without one.
 * 0 with *restarted set, or the error.
 */
static int named_restarted(struct mysql_conn *mc, const dlock_request *req, uint64_t since_ns,
                           struct bound *call, int *restarted)
{
    uint64_t down_since = dlock_monotonic_ns(), backoff = 100;
    uint64_t give_up = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns
                                                        : down_since + mc->connect_ms * MS;
    int err;
    for (int dead = 0;;) {
        struct dlock_sql_session *b;
        MYSQL_RES *res = NULL;
        int opened;
        if ((err = dlock_sql_take(&mc->pool, call, &b, &opened)) == 0) {
            struct named_session *s = ns_of(b);
            struct bound sb = mc_stmt_bound(call, mc->timeout_ms);
            err = mc_query_result(mc, &s->c, "SELECT VARIABLE_VALUE FROM"
                                  " information_schema.GLOBAL_STATUS"
                                  " WHERE VARIABLE_NAME = 'UPTIME'",
                                  &sb, "checking the server", &res);
            if (err == 0) {
                MYSQL_ROW row = mysql_fetch_row(res);
                uint64_t up_s = row && row[0] ? strtoull(row[0], NULL, 10) : UINT64_MAX;
                mysql_free_result(res);
                s->c.idle_since = dlock_monotonic_ns();
                *restarted = up_s <= (dlock_monotonic_ns() - since_ns) / (1000 * MS) + 1;
                dlock_clearerr(cl(mc));
                return 0;
            }
            named_failed(s, err);
            dlock_sql_trim(&mc->pool);
            if (!opened && dead++ < DLOCK_SQL_IDLE_KEEP)
                continue; /* a free session the restart dropped too */
        }
        if (err != DLOCK_ECONNECT && err != DLOCK_ETIMEDOUT)
            return err;
        uint64_t now = dlock_monotonic_ns();
        if (now + backoff * MS >= give_up)
            return dlock_seterr(cl(mc), err == DLOCK_ETIMEDOUT ? DLOCK_ETIMEDOUT : DLOCK_ECONNECT,
                                "mysql %s: the server dropped the waiting session and was not"
                                " back in time (%s)", mc->where,
                                req->wait == DLOCK_WAIT_DEADLINE ? "deadline" : "connect_timeout");
        if ((err = mc_pause_ms(mc, backoff, give_up, req->cancel_fd)) == DLOCK_EINTR)
            return dlock_seterr(cl(mc), err, "a signal interrupted the wait");
        if (err)
            return err;
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
        dead = 0;
    }
}

/*
 * A try runs on a session holding locks of the same lease (shared, up to
 * DLOCK_SQL_LOCKS_MAX), else on one holding nothing, and the grant stays
 * there.
 * A wait first tries so on a shared session (most waits need not wait),
 * then waits on a session holding nothing: a session blocked in GET_LOCK
 * could not renew or release its other locks. A deadline nearer than
 * `timeout` skips the first try: a bound that ran out on a shared session
 * would close it and lose its mates.
 */
static int named_acquire(struct mysql_conn *mc, const dlock_request *req, dlock_held **heldp)
{
    struct named_held *h;
    struct named_session *s = NULL;
    uint64_t start = dlock_monotonic_ns(), token = 0, replied = 0;
    unsigned lease = mc_ceil_s(req->ttl_ms);
    char lit[LIT_MAX];
    int err = named_literal(mc, req->name, req->name_len, lit);
    if (err)
        return err;
    if (!(h = calloc(1, sizeof *h + strlen(lit) + 1)))
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    memcpy(h->lname, lit, strlen(lit) + 1);
    struct bound call = {0, DLOCK_ECONNECT, 0};
    if (req->wait == DLOCK_WAIT_DEADLINE)
        call = (struct bound){req->deadline_ns, DLOCK_ETIMEDOUT, 0};
    else if (req->wait == DLOCK_WAIT_TRY)
        call = (struct bound){start + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    struct dlock_sql_session *b =
        dlock_sql_holder_for_wait(&mc->pool, req, mc->timeout_ms, lease, h->lname);
    if (b) {
        s = ns_of(b);
        dlock_request t = *req;
        /* Counted once s->base.mu is ours (named_attempt counts again per
         * statement: s is shared). */
        struct bound tb = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 0};
        t.wait = DLOCK_WAIT_TRY;
        if (named_attempt(mc, s, &t, h->lname, &tb, tb.until, &token, &replied) == 0)
            goto granted;
        pthread_mutex_unlock(&s->base.mu);
        dlock_clearerr(cl(mc));
        s = NULL;
    }
    for (int tries = 0;; tries++) {
        int opened = 0;
        uint64_t attempt = dlock_monotonic_ns();
        if ((err = dlock_sql_session_for(&mc->pool, req->wait == DLOCK_WAIT_TRY, lease, h->lname,
                                         &call, &b, &opened)) != 0)
            break;
        s = ns_of(b);
        /* A session holding nothing, idle for a second or more: the server
         * may have dropped it for that (wait_timeout counts whole seconds).
         * (A holder session counts as stale too.) */
        int stale = s->base.nheld > 0 ||
                    (!opened && dlock_monotonic_ns() - s->c.idle_since >= 1000 * MS);
        uint64_t until = req->wait == DLOCK_WAIT_TRY        ? call.until
                         : req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns + CLEANUP_MS * MS
                                                            : 0;
        err = named_attempt(mc, s, req, h->lname, &call, until, &token, &replied);
        s->base.waiting = 0;
        if (err == 0)
            goto granted;
        int gone = !s->c.db, silent = s->c.silent_ms != 0;
        if (s->base.nheld == 0)
            s->c.idle_since = dlock_monotonic_ns();
        pthread_mutex_unlock(&s->base.mu);
        /* A session reused after it may have been dropped while idle (its
         * lease, a restart): once more on another. Not one that did not
         * answer (a retry would wait as long again). A wait whose session
         * was dropped otherwise queues again if the server restarted, not
         * if the session was killed alone (an administrator's KILL is not
         * waited on again). */
        if (!gone || silent || err == DLOCK_EBUSY || err == DLOCK_ETIMEDOUT || err == DLOCK_EINTR ||
            err == DLOCK_ECANCELED)
            break;
        if (req->wait != DLOCK_WAIT_TRY && (opened || !stale || tries > 0)) {
            unsigned why = s->c.last_errno;
            int restarted = 0;
            if ((err = named_restarted(mc, req, attempt, &call, &restarted)) != 0)
                break;
            if (!restarted) {
                err = dlock_seterr(cl(mc), DLOCK_ECONNECT,
                                   "mysql %s: waiting for the lock: the waiting session was"
                                   " killed (error %u; KILL from another session?) while the"
                                   " server kept answering: not waited on again", mc->where,
                                   why);
                break;
            }
        } else if (opened || tries > 0) {
            break;
        }
        dlock_count_reconnect(cl(mc)); /* the next attempt opens or takes another */
        dlock_clearerr(cl(mc));
    }
    dlock_sql_trim(&mc->pool);
    free(h);
    return err;
granted:
    h->base.token = token;
    h->ttl_ms = req->ttl_ms;
    memcpy(h->owner, req->owner_hex, sizeof h->owner);
    h->sh.lease = lease;
    /* From the last reply on s, where the server's idle timer started: not
     * after a checkpoint on the control session. */
    h->sh.lease_end_ns = replied + (uint64_t)req->ttl_ms * MS;
    if (req->wait != DLOCK_WAIT_TRY) /* the lease counts from the grant */
        h->base.lease_end_ns = h->sh.lease_end_ns;
    dlock_sql_link(&s->base, &h->sh);
    pthread_mutex_unlock(&s->base.mu);
    *heldp = &h->base;
    return 0;
}

static int named_release(struct mysql_conn *mc, dlock_held *held)
{
    struct named_held *h = (struct named_held *)held;
    struct named_session *s = session_of(h);
    char sql[96 + LIT_MAX];
    int err = 0;
    pthread_mutex_lock(&s->base.mu);
    if (h->sh.gone || !s->c.db) {
        err = dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: release: the lock was lost: %s",
                           mc->where, named_lost_why(mc, h));
    } else {
        dlock_sql_expire(&mc->pool, &s->base, &h->sh);
        struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
        /* A lost lock's release ends by the core's bound where it is alone
         * on its session (cutting it short closes the session). */
        if (!dlock_sql_mates(&s->base, &h->sh) && dlock_call_deadline() < b.until)
            b.until = dlock_call_deadline();
        snprintf(sql, sizeof sql,
                 "SET @dlock_released = IF(RELEASE_LOCK(%s) = 1, 1, " NOT_OURS ")", h->lname);
        if (!s->c.db) {
            err = dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: release: the lock was lost: %s",
                               mc->where, named_lost_why(mc, h));
        } else if ((err = mc_run(mc, &s->c, NB_QUERY, NULL, sql, &b, "release")) != 0) {
            if (!s->c.dead && s->c.last_errno == ER_SUBQUERY_NO_1_ROW)
                err = dlock_seterr(cl(mc), DLOCK_ELOST,
                                   "mysql %s: release: the session no longer held the lock",
                                   mc->where);
            else if (s->c.dead && !s->c.silent_ms)
                err = dlock_seterr(cl(mc), DLOCK_ELOST,
                                   "mysql %s: release: the server dropped the session holding"
                                   " the lock (%s): the lock is lost", mc->where,
                                   mysql_error(s->c.db));
            else if (!s->c.dead) /* RELEASE_LOCK failed on a live session: it may hold it still */
                s->c.dead = 1;
            if (s->c.dead)
                named_disconnect(s);
        } else if (dlock_monotonic_ns() >= h->sh.lease_end_ns) {
            err = mc_lease_over(mc, h->ttl_ms, "release");
        }
    }
    int fell_free = dlock_sql_unlink(&h->sh);
    if (fell_free)
        s->c.idle_since = dlock_monotonic_ns();
    pthread_mutex_unlock(&s->base.mu);
    if (fell_free)
        dlock_sql_trim(&mc->pool);
    free(h);
    return err;
}

/*
 * Renews h on its session (s->base.mu held) in one statement answered by an OK
 * packet (no result set to read):
 *
 *   SET SESSION wait_timeout = IF(IS_USED_LOCK(n) = CONNECTION_ID(), L, NOT_OURS)
 *
 * It proves the lock is still ours (IS_USED_LOCK names the session: a
 * GET_LOCK lock ends only with RELEASE_LOCK, which only its holder can do,
 * or with its session), sets the lease L, the longest the session's live
 * locks need (each mate's TTL rounded up: no mate's lease is cut short,
 * and one released no longer holds the others' up), and restarts the
 * session's idle timer. Stale mates are let go first. Each statement gets
 * `timeout` from when it starts; keep (the keeper's renewal) caps it by
 * h's lease end only when h is alone on s (a bound that runs out closes
 * the session: among mates, h's lease end must not cost them theirs), and
 * a reply that comes after h's lease end is then DLOCK_EEXPIRED for h
 * alone (h not renewed, the session kept). 0, DLOCK_ELOST, or the error.
 */
static int named_renew_on(struct mysql_conn *mc, struct named_held *h, uint32_t ttl_ms, int keep)
{
    struct named_session *s = session_of(h);
    char sql[128 + LIT_MAX];
    int err;
    if (h->sh.gone || !s->c.db)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: the lock was lost: %s", mc->where,
                            named_lost_why(mc, h));
    dlock_sql_expire(&mc->pool, &s->base, &h->sh);
    if (!s->c.db)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: the lock was lost: %s", mc->where,
                            named_lost_why(mc, h));
    unsigned lease = dlock_sql_lease(&s->base, &h->sh, mc_ceil_s(ttl_ms));
    int shared = dlock_sql_mates(&s->base, &h->sh);
    uint64_t sent = dlock_monotonic_ns();
    struct bound b = {sent + mc->timeout_ms * MS, DLOCK_ECONNECT, 0};
    if (keep && !shared && h->sh.lease_end_ns < b.until)
        b.until = h->sh.lease_end_ns;
    snprintf(sql, sizeof sql, "SET SESSION wait_timeout = IF(IS_USED_LOCK(%s) = CONNECTION_ID(),"
             " %u, " NOT_OURS ")", h->lname, lease);
    if ((err = mc_run(mc, &s->c, NB_QUERY, NULL, sql, &b, "renew")) != 0) {
        if (s->c.dead || s->c.last_errno != ER_SUBQUERY_NO_1_ROW)
            goto failed;
        h->sh.gone = 1;
        return dlock_seterr(cl(mc), DLOCK_ELOST,
                            "mysql %s: renew: the session no longer holds the lock", mc->where);
    }
    s->base.lease = lease;
    if (keep && dlock_monotonic_ns() >= h->sh.lease_end_ns)
        return dlock_seterr(cl(mc), DLOCK_EEXPIRED,
                            "mysql %s: the lease (%" PRIu32 " ms) ran out before the renewal's"
                            " reply came", mc->where, h->ttl_ms);
    h->ttl_ms = ttl_ms;
    h->sh.lease = mc_ceil_s(ttl_ms);
    h->sh.lease_end_ns = sent + (uint64_t)ttl_ms * MS;
    return 0;
failed:
    if (s->c.dead && !s->c.silent_ms)
        err = dlock_seterr(cl(mc), DLOCK_ELOST,
                           "mysql %s: renew: the server dropped the session holding the lock"
                           " (%s): the lock is lost", mc->where, mysql_error(s->c.db));
    return named_failed(s, err);
}

static int named_renew(struct mysql_conn *mc, dlock_held *held, uint32_t ttl_ms)
{
    struct named_held *h = (struct named_held *)held;
    struct named_session *s = session_of(h);
    int err;
    pthread_mutex_lock(&s->base.mu);
    uint64_t now = dlock_monotonic_ns();
    if (!h->sh.gone && s->c.db && now >= h->sh.lease_end_ns) {
        /* Possibly still ours on the server, but the lease is over: free
         * it for others, never extend it. */
        named_undo(mc, s, h->lname);
        h->sh.gone = 1;
        err = mc_lease_over(mc, h->ttl_ms, "renew");
    } else {
        err = named_renew_on(mc, h, ttl_ms, 0);
    }
    pthread_mutex_unlock(&s->base.mu);
    return err;
}

/* The keeper's renewal: as renew, bounded by the lease's end too when h is
 * alone on its session (see named_renew_on); touches h's session only (a
 * session that fails is closed, its struct kept). */
static int named_keep(struct mysql_conn *mc, dlock_held *held, uint32_t ttl_ms)
{
    struct named_held *h = (struct named_held *)held;
    struct named_session *s = session_of(h);
    int err;
    pthread_mutex_lock(&s->base.mu);
    uint64_t now = dlock_monotonic_ns();
    if (!h->sh.gone && s->c.db && now >= h->sh.lease_end_ns) {
        err = dlock_seterr(cl(mc), DLOCK_EEXPIRED,
                           "mysql %s: the lease (%" PRIu32 " ms) had run out before it could be"
                           " renewed", mc->where, h->ttl_ms);
    } else {
        err = named_renew_on(mc, h, ttl_ms, 1);
        if (err == DLOCK_ECONNECT && !s->c.db)
            err = DLOCK_EEXPIRED;
    }
    pthread_mutex_unlock(&s->base.mu);
    return err;
}

/* raise_token: proves the lock (as renew, keeping the lease's end), then
 * SETVAL on its session, then the durable mark past it (token=sequence),
 * the mark with s->base.mu unlocked. Each statement gets its own `timeout`. */
static int named_raise(struct mysql_conn *mc, dlock_held *held, uint64_t floor)
{
    struct named_held *h = (struct named_held *)held;
    static const char what[] = "raising the token";
    struct named_session *s = session_of(h);
    char sql[160];
    MYSQL_RES *res = NULL;
    uint64_t mark = 0;
    int err;
    if ((err = mc_seq_floor_check(mc, floor)) != 0)
        return err;
    pthread_mutex_lock(&s->base.mu);
    uint64_t now = dlock_monotonic_ns();
    if (!h->sh.gone && s->c.db && now >= h->sh.lease_end_ns) {
        named_undo(mc, s, h->lname);
        h->sh.gone = 1;
        pthread_mutex_unlock(&s->base.mu);
        return mc_lease_over(mc, h->ttl_ms, what);
    }
    uint32_t left = (uint32_t)((h->sh.lease_end_ns - now + MS - 1) / MS), ttl = h->ttl_ms;
    uint64_t expires = h->sh.lease_end_ns;
    if ((err = named_renew_on(mc, h, left, 0)) == 0) {
        h->sh.lease_end_ns = expires; /* proven, not renewed */
        h->ttl_ms = ttl;
        h->sh.lease = mc_ceil_s(ttl);
        struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
        snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %" PRIu64 ")", mc->table, floor);
        if ((err = mc_query_result(mc, &s->c, sql, &b, what, &res)) != 0) {
            err = named_failed(s, err);
        } else {
            mysql_free_result(res);
            h->raised = floor > h->raised ? floor : h->raised;
        }
    }
    pthread_mutex_unlock(&s->base.mu);
    if (err)
        return err;
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if ((err = mc_seq_checkpoint(mc, &call, &mark)) != 0)
        return err;
    if (mark > mc->durable)
        mc->durable = mark;
    return 0;
}

/*
 * inspect: one statement on the control session. IS_USED_LOCK names the
 * holder's session (its connection id); the waiters are the sessions
 * running GET_LOCK of the name (PROCESSLIST, live; other users' sessions
 * only with the PROCESS privilege), the longest waiting first (TIME_MS):
 * MariaDB grants a user lock to its waiters in arrival order. Not known:
 * the owner id, the token and the lease (kept on the holder's session
 * only), the last token of a free name.
 */
static int named_inspect(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info)
{
    static const char what[] = "inspect";
    char lname[LIT_MAX], quoted[2 * LIT_MAX], sql[384 + 4 * LIT_MAX];
    struct session *ctl;
    MYSQL_RES *res = NULL;
    int err = named_literal(mc, name, len, lname);
    if (err)
        return err;
    /* The literal inside the LIKE pattern's string: its quotes doubled
     * (hex digits and the prefix hold no wildcard). */
    size_t q = 0;
    for (const char *p = lname; *p; p++) {
        if (*p == '\'')
            quoted[q++] = '\'';
        quoted[q++] = *p;
    }
    quoted[q] = '\0';
    snprintf(sql, sizeof sql,
             "SELECT 'g' AS x, IS_USED_LOCK(%s) AS a, 0 AS t UNION ALL"
             " SELECT 'w', ID, TIME_MS FROM information_schema.PROCESSLIST"
             " WHERE INFO LIKE 'SELECT IF(GET_LOCK(%s,%%' AND COMMAND = 'Query'"
             " AND ID <> CONNECTION_ID() AND ID <> COALESCE(IS_USED_LOCK(%s), 0)"
             " ORDER BY x, t DESC, a",
             lname, quoted, lname);
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    for (int tries = 0; tries < 2; tries++) {
        if ((err = mc_ctl_session(mc, &call, &ctl)) == 0 &&
            (err = mc_query_result(mc, ctl, sql, &call, what, &res)) == 0)
            break;
        if (!mc_ctl_dropped(mc))
            return err;
    }
    if (err)
        return err;
    info->held = 0;
    info->waiters = 0;
    info->listed = 0;
    for (MYSQL_ROW row; (row = mysql_fetch_row(res)) != NULL;) {
        if (!row[0] || !row[1])
            continue;
        if (row[0][0] == 'g') {
            info->held = 1;
            snprintf(info->owner, sizeof info->owner, "session %s", row[1]);
        } else if (row[0][0] == 'w') {
            if (info->listed < DLOCK_INFO_LISTED)
                snprintf(info->waiter[info->listed++], DLOCK_HOLDER_MAX, "session %s", row[1]);
            info->waiters++;
        }
    }
    mysql_free_result(res);
    info->known |= DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_ORDER;
    if (info->held)
        info->known |= DLOCK_KNOWS_OWNER;
    return 0;
}

/* ---- elections (mysql_elect.c) ------------------------------------------ */

/* The user lock of a name (lname, LIT_MAX bytes) and its key in the
 * leaders' table, in hex: SHA-256 of the literal (publish's key). */
static int leader_key(struct mysql_conn *mc, const char *name, size_t len, char *lname,
                      char kx[2 * DLOCK_SHA256_LEN + 1])
{
    unsigned char k[DLOCK_SHA256_LEN];
    int err = named_literal(mc, name, len, lname);
    if (err == 0) {
        dlock_sha256(lname, strlen(lname), k);
        dlock_hex(k, DLOCK_SHA256_LEN, kx);
    }
    return err;
}

/*
 * publish: one statement on the lock's session that writes (commits) the
 * value's row only while IS_USED_LOCK names that session, else fails as
 * renew's does (NOT_OURS): the proof and the write cannot be told apart.
 * The leaders' table, when missing, is made with s->base.mu unlocked (a
 * connect), then the statement is tried once more.
 */
static int named_publish(struct mysql_conn *mc, dlock_held *held, const void *value, size_t len)
{
    struct named_held *h = (struct named_held *)held;
    struct named_session *s = session_of(h);
    unsigned char k[DLOCK_SHA256_LEN];
    char guard[64 + LIT_MAX];
    int err = 0, no_table = 0;
    dlock_sha256(h->lname, strlen(h->lname), k);
    snprintf(guard, sizeof guard, " WHERE IF(IS_USED_LOCK(%s) = CONNECTION_ID(), 1, " NOT_OURS ")",
             h->lname);
    for (int tries = 0; tries < 2 && !err; tries++) {
        pthread_mutex_lock(&s->base.mu);
        if (h->sh.gone || !s->c.db) {
            err = dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: publish: the lock was lost: %s",
                               mc->where, named_lost_why(mc, h));
        } else if (dlock_monotonic_ns() >= h->sh.lease_end_ns) {
            named_undo(mc, s, h->lname);
            h->sh.gone = 1;
            err = mc_lease_over(mc, h->ttl_ms, "publish");
        } else {
            struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
            uint64_t term = h->raised > h->base.token ? h->raised : h->base.token;
            struct elect_pub p = {k, term, h->owner, h->ttl_ms, value, len, guard};
            err = mc_elect_publish(mc, &s->c, &p, &b, &no_table);
            if (err && !s->c.dead && s->c.last_errno == ER_SUBQUERY_NO_1_ROW) {
                h->sh.gone = 1;
                err = dlock_seterr(cl(mc), DLOCK_ELOST,
                                   "mysql %s: publish: the session no longer holds the lock",
                                   mc->where);
            } else if (err && s->c.dead && !s->c.silent_ms) {
                err = named_failed(s, dlock_seterr(cl(mc), DLOCK_ELOST,
                                                   "mysql %s: publish: the server dropped the"
                                                   " session holding the lock (%s): the lock is"
                                                   " lost", mc->where, mysql_error(s->c.db)));
            } else if (err) {
                err = named_failed(s, err);
            }
        }
        pthread_mutex_unlock(&s->base.mu);
        if (err || !no_table)
            return err;
        err = mc_elect_table(mc);
    }
    return err;
}

/*
 * leader: one statement on the control session: the holder's session
 * (IS_USED_LOCK) and the value row, shown if that session published it:
 * the row's token the term, its owner id, its TTL the lease (the most it
 * can have left). A holder that published nothing (a plain acquire, a campaign
 * between its grant and its publish) is held with no token, named by its
 * session as inspect does. No waiters: an observer reads this ten times a
 * second.
 */
static int named_leader(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info,
                        char *value, size_t *value_len)
{
    char lname[LIT_MAX], kx[2 * DLOCK_SHA256_LEN + 1], sql[384 + 2 * LIT_MAX];
    struct session *ctl = NULL;
    MYSQL_RES *res = NULL;
    int err = leader_key(mc, name, len, lname, kx);
    *value_len = 0;
    if (err)
        return err;
    /* The value row first, if any; the UNION's row makes one always. */
    snprintf(sql, sizeof sql,
             "SELECT IS_USED_LOCK(%s), v.token, v.value, v.owner, v.ttl_ms, v.session_id FROM"
             " `%s_leaders` v WHERE v.k = X'%s' UNION ALL SELECT IS_USED_LOCK(%s), NULL, NULL,"
             " NULL, NULL, NULL", lname, mc->table, kx, lname);
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if ((err = mc_elect_read(mc, sql, &call, &ctl, &res)) != 0) {
        if (!ctl || ctl->dead || ctl->last_errno != ER_NO_SUCH_TABLE)
            return err;
        dlock_clearerr(cl(mc)); /* nothing was ever published in this store */
        return named_inspect(mc, name, len, info);
    }
    MYSQL_ROW row = mysql_fetch_row(res);
    info->held = row && row[0];
    info->known |= DLOCK_KNOWS_HELD;
    if (info->held) {
        snprintf(info->owner, sizeof info->owner, "session %s", row[0]);
        info->known |= DLOCK_KNOWS_OWNER;
        if (row[1] && row[5] && strcmp(row[5], row[0]) == 0) {
            info->token = strtoull(row[1], NULL, 10);
            info->known |= DLOCK_KNOWS_TOKEN;
            mc_elect_value(res, row, 2, value, value_len);
            if (row[3] && strlen(row[3]) == 32)
                snprintf(info->owner, sizeof info->owner, "%s", row[3]);
            mc_elect_lease(row[4], info);
        }
    }
    mysql_free_result(res);
    return 0;
}

/*
 * wake, after an election's release: the released grant's committed row
 * goes, unless its session holds the user lock again (a newer grant's row
 * is its own): else a session that took the name again would show the old
 * value and term until it published. Observers poll: nothing to wake.
 */
static int named_wake(struct mysql_conn *mc, const char *name, size_t len)
{
    char lname[LIT_MAX], kx[2 * DLOCK_SHA256_LEN + 1], sql[256 + LIT_MAX];
    struct session *ctl;
    int err = leader_key(mc, name, len, lname, kx);
    if (err)
        return err;
    snprintf(sql, sizeof sql,
             "DELETE FROM `%s_leaders` WHERE k = X'%s' AND session_id <> COALESCE(IS_USED_LOCK(%s),"
             " 0)", mc->table, kx, lname);
    /* Within a lost lock's release, the core's bound (dlock_call_deadline()). */
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 0};
    if (dlock_call_deadline() < call.until)
        call.until = dlock_call_deadline();
    for (int tries = 0; tries < 2; tries++) {
        if ((err = mc_ctl_session(mc, &call, &ctl)) == 0 &&
            (err = mc_exec_sql(mc, ctl, sql, &call, "wake")) == 0)
            return 0;
        if (err && ctl && !ctl->dead && ctl->last_errno == ER_NO_SUCH_TABLE)
            return 0;
        if (!mc_ctl_dropped(mc))
            return err;
    }
    return err;
}

/* The first session sets up the store (mysql_seq.c), then holds nothing
 * among the client's sessions until the first acquire. */
static int named_open(struct mysql_conn *mc)
{
    struct named_session *ns = malloc(sizeof *ns);
    int err;
    dlock_sql_pool_init(&mc->pool, &session_ops, &mc->base);
    if (!ns || dlock_sql_session_init(&ns->base) != 0) {
        free(ns);
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    }
    err = mc_seq_open(mc, ROLE_NAMED,
                      mc->layout_plain ? "layout=plain (lock=named: its tokens come from a"
                                         " sequence)"
                                       : "lock=named (its tokens come from a sequence)",
                      &ns->c);
    if (err) {
        session_destroy(&ns->base);
        return err;
    }
    ns->c.idle_since = dlock_monotonic_ns();
    if ((err = dlock_sql_pool_add(&mc->pool, &ns->base)) != 0) {
        session_end(&ns->base);
        session_destroy(&ns->base);
        return dlock_seterr(cl(mc), err, "out of memory");
    }
    return 0;
}

static void named_close(struct mysql_conn *mc)
{
    dlock_sql_pool_close(&mc->pool);
}

const struct mysql_mode mc_named_mode = {
    .open = named_open,
    .close = named_close,
    .acquire = named_acquire,
    .release = named_release,
    .renew = named_renew,
    .keep = named_keep,
    .ping = mc_ping_ctl,
    .raise_token = named_raise,
    .token_top = mc_seq_token_top,
    .raise_floor = mc_seq_raise_floor,
    .inspect = named_inspect,
    .publish = named_publish,
    .leader = named_leader,
    .wake = named_wake,
    /* GET_LOCK has no shared mode, nor a count: the core refuses both
     * with DLOCK_ENOTSUP (docs/mysql.md, "Shared locks and semaphores"). */
    .caps_off = DLOCK_CAP_SHARED | DLOCK_CAP_SEMAPHORE,
};
