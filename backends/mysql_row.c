/*
 * The MariaDB backend's row-lock recipe (lock=row, the default): a held
 * lock is an open transaction holding its name's row lock in <table>, one
 * session per held lock, waiters queued by InnoDB. Its two token sources
 * differ in a small table (struct row_source) picked with the mode at
 * open, never by a branch on the mode:
 *
 *   token=table     SELECT ... FOR UPDATE, then the control session bumps
 *                   and commits the name's counter in <table>_grants;
 *   token=sequence  one UPDATE takes the row lock and NEXTVAL of the
 *                   store's sequence (mysql_seq.c), its durable mark after.
 *
 * A reader holds the row in share mode and its row in <table>_shared; a
 * permit of a semaphore the same with its limit, after its turn at the
 * name's gate (a user lock). Readers, writers and permits of another limit
 * are refused (DLOCK_EMODE) from <table>_shared's rows (docs/mysql.md,
 * "Shared locks and semaphores").
 *
 * Deadlines, cancels, restarts, keeping, raising, the floor and inspect:
 * docs/mysql.md, "How the backend works". Calls mysql_inspect.c (inspect),
 * mysql_seq.c and mysql_conn.c only.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errmsg.h>
#include <mysqld_error.h>

#include "config.h"
#include "backends/mysql_int.h"

/* A held row lock: its session's transaction holds the row. */
struct mysql_held {
    dlock_held base;
    struct session *s;      /* holding session; NULL once the lock is lost */
    unsigned char k[DLOCK_SHA256_LEN];
    uint32_t ttl_ms;
    uint64_t expires_ns;    /* end of the lease as the client sees it */
    int shared;             /* a shared holder (LOCK IN SHARE MODE; a <table>_shared row) */
    uint32_t limit;         /* a permit of a semaphore of this limit (the same, with lim) */
    uint64_t raised;        /* the highest floor raised to: a list's term (publish) */
};

/* What the two token sources do differently. */
struct row_source {
    int seq_token;       /* the token is NEXTVAL, taken by the grant's statement */
    int server_deadline; /* the server ends a deadline's wait (max_statement_time) */
    int ctl_optional;    /* no control session is kept open (so none is not a sign) */
    /* The row lock on *sp (1: ours, h->expires_ns the time the lease starts
     * from; 0: no row yet; or an error), as lock_row. */
    int (*lock)(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                struct mysql_held *h, struct bound *call);
    /* Creates the name's row (a name's first use). */
    int (*create_row)(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                      const unsigned char *k, struct bound *call);
    /* After the grant: the token, when it did not come with the lock. */
    int (*granted)(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                   struct bound *call);
    int (*floor_check)(struct mysql_conn *mc, uint64_t floor);
    /* raise_token once the lock is proven ours, by call. */
    int (*raise)(struct mysql_conn *mc, struct mysql_held *h, uint64_t floor, struct bound *call);
};

static const struct row_source *src(const struct mysql_conn *mc)
{
    return mc->mode->row;
}

/* "@T" stands for the lock table's name. */
/* token=table's prepared statements. */
static const char *const stmt_sql[N_STMTS] = {
    [ST_LOCK_WAIT] = "SELECT 1 FROM `@T` WHERE k = ? FOR UPDATE",
    [ST_LOCK_NOWAIT] = "SELECT 1 FROM `@T` WHERE k = ? FOR UPDATE NOWAIT",
    /* A shared holder: the same row's shared lock, queued in the same
     * InnoDB queue (a reader arriving after a waiting writer waits). */
    [ST_SHARED_WAIT] = "SELECT 1 FROM `@T` WHERE k = ? LOCK IN SHARE MODE",
    [ST_SHARED_NOWAIT] = "SELECT 1 FROM `@T` WHERE k = ? LOCK IN SHARE MODE NOWAIT",
    [ST_CREATE_ROW] = "INSERT IGNORE INTO `@T` (k, name, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))",
    /* The floor row is read in the same statement (a derived table:
     * MySQL refuses a plain subquery on the table inserted into; CAST:
     * the derived value is signed), and the token is the larger of the
     * name's token + 1 and the floor + 1. */
    [ST_GRANT] = "INSERT INTO `@T_grants` (k, token, owner, session_id, acquired_at) "
                 "VALUES (?, LAST_INSERT_ID(1 + CAST(COALESCE((SELECT m FROM (SELECT MAX(token)"
                 " AS m FROM `@T_grants` WHERE k = " FLOOR_K ") AS f), 0) AS UNSIGNED)), ?, ?,"
                 " UTC_TIMESTAMP(6)) "
                 "ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1,"
                 " VALUES(token))), owner = ?, session_id = ?, acquired_at = UTC_TIMESTAMP(6)",
    /* Matches only while the latest grant recorded is the holder's own
     * (session_id); LAST_INSERT_ID(expr) hands back the counter, and 0 when
     * no row matched (the expression never ran). */
    [ST_RAISE] = "UPDATE `@T_grants` SET token = LAST_INSERT_ID(GREATEST(token, ?)) "
                 "WHERE k = ? AND session_id = ?",
    [ST_TOP] = "SELECT COALESCE(MAX(token), 0) FROM `@T_grants`",
    [ST_FLOOR] = "INSERT INTO `@T_grants` (k, token, owner, session_id, acquired_at) "
                 "VALUES (" FLOOR_K ", ?, 'floor', 0, UTC_TIMESTAMP(6)) "
                 "ON DUPLICATE KEY UPDATE acquired_at = IF(token < VALUES(token),"
                 " UTC_TIMESTAMP(6), acquired_at), token = GREATEST(token, VALUES(token))",
};
static const char stmt_sql_mysql_wait[] = "SELECT 1 FROM `@T` WHERE k = ? FOR SHARE",
                  stmt_sql_mysql_nowait[] = "SELECT 1 FROM `@T` WHERE k = ? FOR SHARE NOWAIT";

static int set_limits(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                      const struct bound *call)
{
    unsigned lease = mc_ceil_s(req->ttl_ms), wait = s->lock_wait_s;
    char sql[160];
    int n;
    if (req->wait == DLOCK_WAIT_FOREVER || (src(mc)->server_deadline && req->wait == DLOCK_WAIT_DEADLINE)) {
        /* token=sequence ends a deadline's wait with max_statement_time. */
        wait = LOCK_WAIT_MAX_S;
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t now = dlock_monotonic_ns();
        unsigned need = mc_ceil_s((req->deadline_ns > now ? req->deadline_ns - now : 0) / 1000000u);
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
        snprintf(sql + n, sizeof sql - (size_t)n,
                 ", innodb_lock_wait_timeout = %u, lock_wait_timeout = %u", wait,
                 wait > MDL_WAIT_MAX_S ? MDL_WAIT_MAX_S : wait);
    int err = mc_exec_sql(mc, s, sql, call, "setting the session's lease");
    if (err)
        return err;
    s->wait_timeout_s = lease;
    s->lock_wait_s = wait;
    return 0;
}

/*
 * Ends a lock wait still running on the server, by until_ns (a small
 * margin past the deadline): KILL QUERY from the control session, then
 * the statement's own end (interrupted, or granted in that instant), then
 * a rollback, and the session goes back to the pool. Whatever of it does
 * not finish in time is abandoned: the session is closed, the server ends
 * the wait at its innodb_lock_wait_timeout (set near the deadline) and
 * rolls back, freeing anything granted meanwhile, once it sees the
 * connection closed.
 */
static void cancel_wait(struct mysql_conn *mc, struct session *s, struct nb *wait, uint64_t until_ns,
                        int close)
{
    char sql[64];
    struct session *ctl;
    struct bound b = {until_ns, DLOCK_ECONNECT, 0};
    dlock_errsave why;
    int err = 0;
    dlock_err_save(cl(mc), &why); /* report the wait's end, not this */
    snprintf(sql, sizeof sql, "KILL QUERY %lu", mysql_thread_id(s->db));
    for (int tries = 0; tries < 2; tries++) {
        if ((err = mc_ctl_session(mc, &b, &ctl)) == 0 &&
            (err = mc_run(mc, ctl, NB_QUERY, NULL, sql, &b, "KILL QUERY")) == 0)
            break;
        if (!mc_ctl_dropped(mc))
            break;
    }
    if (err == 0 && !close && mc_nb_finish(wait, until_ns, 0) == 0) {
        if (wait->ret == 0 && wait->st) { /* granted after all: read the row, then let go */
            struct nb rd = {.op = NB_STMT_STORE, .db = s->db, .st = wait->st};
            mc_nb_step(&rd, -1);
            if (mc_nb_finish(&rd, until_ns, 0) != 0)
                err = 1;
            else
                mysql_stmt_free_result(wait->st);
        }
        if (err == 0) {
            mc_rollback_and_pool(mc, s, until_ns);
            s = NULL;
        }
    }
    if (s) {
        s->dead = 1;
        mc_session_close(s);
    }
    dlock_err_restore(cl(mc), &why);
}

/* The error of a locking read that the server refused. */
static int lock_error(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, int nowait)
{
    unsigned e = st ? mysql_stmt_errno(st) : mysql_errno(s->db);
    int err = mc_fail_on(mc, s, st, "waiting for the row lock");
    if (e == ERR_STATEMENT_TIMEOUT)
        return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                            "the deadline passed with the lock still held elsewhere");
    if ((e == ER_LOCK_WAIT_TIMEOUT && nowait) || e == ERR_LOCK_NOWAIT)
        return dlock_seterr(cl(mc), DLOCK_EBUSY, "the lock is held by another owner");
    if (e == ER_LOCK_WAIT_TIMEOUT)
        return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                            "mysql %s: the server's lock wait timeout passed", mc->where);
    return err;
}

/*
 * The end of a row lock's statement that did not reply in time (nb_wait's
 * w: -1 no reply by until, -2 a signal, -3 the request's cancel fd). A try
 * the server does not answer: nothing to cancel (the control session would
 * likely wait as long), so the session is closed, which undoes whatever it
 * got once the server notices. A wait: DLOCK_EINTR, DLOCK_ECANCELED or
 * DLOCK_ETIMEDOUT (late: the detail), and the wait is cancelled (KILL
 * QUERY, rollback) within CLEANUP_MS, and by the deadline + CLEANUP_MS in
 * all (mc_cleanup_until). *sp is no longer the caller's either way.
 */
static int lock_wait_cut(struct mysql_conn *mc, struct session *s, struct session **sp,
                         struct nb *c, int w, const dlock_request *req, uint64_t start,
                         const char *late, int close)
{
    int nowait = req->wait == DLOCK_WAIT_TRY;
    int err;
    *sp = NULL;
    if (w == -1 && nowait) {
        err = mc_no_reply(mc, s, "acquire", start, DLOCK_ECONNECT);
        mc_session_close(s);
        return err;
    }
    if (w == -2)
        err = dlock_seterr(cl(mc), DLOCK_EINTR, "a signal interrupted the wait");
    else if (w == -3)
        err = dlock_cancelled(cl(mc));
    else
        err = dlock_seterr(cl(mc), DLOCK_ETIMEDOUT, "%s", late);
    cancel_wait(mc, s, c, mc_cleanup_until(req), close);
    return err;
}

/*
 * One locking read of the name's row on session s. Returns 1 when the row
 * is ours, 0 when the row does not exist yet, or an error: DLOCK_EBUSY
 * (try), DLOCK_ETIMEDOUT, DLOCK_EINTR, DLOCK_ECANCELED... After a wait that was cut short
 * the session is already rolled back and pooled (or closed), and *sp is
 * NULL; after other errors the caller ends the transaction.
 */
static int lock_row(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                    const unsigned char *k, const struct bound *call)
{
    struct session *s = *sp;
    int nowait = req->wait == DLOCK_WAIT_TRY, err;
    unsigned long klen = DLOCK_SHA256_LEN;
    MYSQL_STMT *st;
    MYSQL_BIND b;
    struct bound pb = mc_stmt_bound(call, mc->timeout_ms);
    enum stmt_id id = req->mode == DLOCK_MODE_SHARED ? (nowait ? ST_SHARED_NOWAIT : ST_SHARED_WAIT)
                      : nowait ? ST_LOCK_NOWAIT : ST_LOCK_WAIT;
    if ((err = mc_prepare(mc, s, id, &pb, &st)) != 0)
        return err;
    mc_bind_bytes(&b, k, &klen);
    if (mysql_stmt_bind_param(st, &b) != 0)
        return mc_fail_on(mc, s, st, "bind");
    /* A try is bounded too: a server that never answers must not hang it. */
    uint64_t start = dlock_monotonic_ns();
    uint64_t until = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns
                     : nowait ? call->until : 0;
    struct nb c = {.op = NB_EXECUTE, .db = s->db, .st = st};
    mc_nb_step(&c, -1);
    int w = mc_nb_wait(&c, until, 1, nowait ? -1 : req->cancel_fd);
    if (w != 0)
        return lock_wait_cut(mc, s, sp, &c, w, req, start,
                             "the deadline passed with the lock still held elsewhere", 0);
    if (c.ret != 0)
        return lock_error(mc, s, st, nowait);
    /* The rows follow the statement's reply at once. */
    struct bound rb = mc_stmt_bound(call, mc->timeout_ms);
    if (req->wait == DLOCK_WAIT_DEADLINE)
        rb = (struct bound){mc_cleanup_until(req), DLOCK_ETIMEDOUT, 0};
    if ((err = mc_run(mc, s, NB_STMT_STORE, st, NULL, &rb, "reading the row lock's result")) != 0)
        return err;
    int found = mysql_stmt_num_rows(st) > 0;
    mysql_stmt_free_result(st);
    return found;
}
/*
 * token=sequence: the row lock and the token in one statement on the lock
 * session, in its transaction:
 *
 *   UPDATE <table> SET token = LAST_INSERT_ID(NEXTVAL(<table>_seq)),
 *     owner = ..., session_id = CONNECTION_ID(), acquired_at = ... WHERE k = ...
 *
 * UPDATE takes the row's exclusive lock, queueing in InnoDB as FOR UPDATE
 * does, and evaluates NEXTVAL only once it holds it, so tokens grow in
 * grant order; the reply carries LAST_INSERT_ID (mysql_insert_id): one
 * round trip. A try runs it under SET STATEMENT innodb_lock_wait_timeout =
 * 0, a deadline under max_statement_time = what is left of it (MariaDB
 * ends the lock wait then, to the millisecond), both part of the same
 * statement; the client waits for the answer until a margin past the
 * deadline. Returns 1 (ours, *token set, *replied the time of the last
 * reply on the session: the server's idle timer, the lease, starts
 * there), 0 (the row does not exist yet) or an error, as lock_row.
 */
static int lock_row_seq(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                        const unsigned char *k, struct bound *call, uint64_t *token,
                        uint64_t *replied)
{
    struct session *s = *sp;
    int nowait = req->wait == DLOCK_WAIT_TRY, err;
    char kx[2 * DLOCK_SHA256_LEN + 1], pre[96] = "", sql[640];
    uint64_t start = dlock_monotonic_ns(), until = 0;
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    if (nowait) {
        snprintf(pre, sizeof pre, "SET STATEMENT innodb_lock_wait_timeout = 0 FOR ");
        until = call->until; /* a server that never answers must not hang a try */
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t left_us = req->deadline_ns > start ? (req->deadline_ns - start) / 1000u : 0;
        if (left_us == 0)
            left_us = 1; /* 0 would be no limit */
        snprintf(pre, sizeof pre,
                 "SET STATEMENT max_statement_time = %" PRIu64 ".%06" PRIu64 " FOR ",
                 left_us / 1000000u, left_us % 1000000u);
        until = req->deadline_ns + CLEANUP_MS * MS;
    }
    if (req->mode == DLOCK_MODE_SHARED) /* the row's shared lock, then NEXTVAL */
        snprintf(sql, sizeof sql,
                 "%sINSERT INTO `%s_shared` (k, token, owner, session_id, acquired_at)"
                 " SELECT k, LAST_INSERT_ID(NEXTVAL(`%s_seq`)), '%.32s', CONNECTION_ID(),"
                 " UTC_TIMESTAMP(6) FROM `%s` WHERE k = X'%s' LOCK IN SHARE MODE",
                 pre, mc->table, mc->table, req->owner_hex, mc->table, kx);
    else
        snprintf(sql, sizeof sql,
                 "%sUPDATE `%s` SET token = LAST_INSERT_ID(NEXTVAL(`%s_seq`)), owner = '%.32s',"
                 " session_id = CONNECTION_ID(), acquired_at = UTC_TIMESTAMP(6) WHERE k = X'%s'",
                 pre, mc->table, mc->table, req->owner_hex, kx);
    struct nb c = {.op = NB_QUERY, .db = s->db, .sql = sql};
    mc_nb_step(&c, -1);
    int w = mc_nb_wait(&c, until, 1, nowait ? -1 : req->cancel_fd);
    if (w != 0) /* the server did not end the wait itself: KILL QUERY it */
        return lock_wait_cut(mc, s, sp, &c, w, req, start,
                             "the deadline passed with the lock still held elsewhere (the"
                             " server did not end the wait at its max_statement_time)", 0);
    if (c.ret != 0)
        return lock_error(mc, s, NULL, nowait);
    if (mysql_affected_rows(s->db) == 0)
        return 0;
    if ((*token = mysql_insert_id(s->db)) == 0)
        return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: no token from the grant", mc->where);
    *replied = dlock_monotonic_ns(); /* or the mark's read, below */
    /* After a wait the bound is the statement's, not a deadline past: the
     * mark (once per range) may need the control session opened and a
     * commit, so it gets `timeout` at least, as any statement does. */
    uint64_t mark_ns = mc->timeout_ms > CLEANUP_MS ? mc->timeout_ms * MS : CLEANUP_MS * MS;
    struct bound db = req->wait == DLOCK_WAIT_DEADLINE
                          ? (struct bound){dlock_monotonic_ns() + mark_ns, DLOCK_ETIMEDOUT, 0}
                          : *call;
    if ((err = mc_seq_durable(mc, s, *token, req->wait == DLOCK_WAIT_FOREVER ? NULL : &db,
                              replied)) != 0)
        return err;
    return 1;
}

static int table_lock(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                      struct mysql_held *h, struct bound *call)
{
    int err = lock_row(mc, sp, req, h->k, call);
    if (err == 1) /* the lease counts from the grant's arrival */
        h->expires_ns = dlock_monotonic_ns();
    return err;
}

static int seq_lock(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                    struct mysql_held *h, struct bound *call)
{
    return lock_row_seq(mc, sp, req, h->k, call, &h->base.token, &h->expires_ns);
}

/* token=sequence: creates the name's row from its lock session (a name's
 * first use only), committed at once so that it outlives the lock. A row
 * lock conflict means the row exists (its creator or holder has it): not
 * waited for (innodb_lock_wait_timeout = 0), and the UPDATE then queues. */
static int create_row_seq(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                          const unsigned char *k, struct bound *call)
{
    size_t nlen = req->name_len > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : req->name_len;
    char kx[2 * DLOCK_SHA256_LEN + 1], nx[2 * NAME_COLUMN_MAX + 1], sql[1024];
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    dlock_hex((const unsigned char *)req->name, nlen, nx);
    snprintf(sql, sizeof sql,
             "SET STATEMENT innodb_lock_wait_timeout = 0 FOR INSERT IGNORE INTO `%s` (k, name,"
             " created_at) VALUES (X'%s', X'%s', UTC_TIMESTAMP(6))", mc->table, kx, nx);
    int err = mc_exec_sql(mc, s, sql, call, "creating the lock's row");
    if (err && !s->dead && s->last_errno == ER_LOCK_WAIT_TIMEOUT) {
        dlock_clearerr(cl(mc));
        err = 0;
    }
    if (err == 0)
        err = mc_exec_sql(mc, s, "COMMIT", call, "creating the lock's row");
    return err;
}

/* Creates the name's row from the control session. INSERT IGNORE waits
 * for a row lock only if another client created and locked the row in the
 * meantime; a lock wait timeout then means the row exists, which is all
 * that is needed. */
static int create_row(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                      const unsigned char *k, struct bound *call)
{
    (void)s; /* the control session's job */
    unsigned long klen = DLOCK_SHA256_LEN;
    unsigned long nlen = req->name_len > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : req->name_len;
    MYSQL_BIND b[2];
    MYSQL_STMT *st;
    mc_bind_bytes(&b[0], k, &klen);
    mc_bind_bytes(&b[1], req->name, &nlen);
    int err = mc_ctl_exec(mc, ST_CREATE_ROW, b, 0, call, "creating the lock's row", &st);
    if (err == 0 || mc_ctl_lock_timed_out(mc)) {
        dlock_clearerr(cl(mc));
        return 0;
    }
    return err;
}

/* Bumps and commits the token from the control session, by b, while the
 * lock session holds the row; also records who holds the lock, for people
 * looking at the table. */
static int record_grant(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                        struct bound *b)
{
    unsigned long klen = DLOCK_SHA256_LEN, olen = 32;
    unsigned long long sid = mysql_thread_id(h->s->db);
    MYSQL_BIND bd[5];
    MYSQL_STMT *st;
    mc_bind_bytes(&bd[0], h->k, &klen);
    mc_bind_bytes(&bd[1], req->owner_hex, &olen);
    mc_bind_u64(&bd[2], &sid);
    mc_bind_bytes(&bd[3], req->owner_hex, &olen);
    mc_bind_u64(&bd[4], &sid);
    /* A bump whose reply was lost may be repeated: tokens get a gap. */
    int err = mc_ctl_exec(mc, ST_GRANT, bd, 0, b, "recording the grant", &st);
    if (err && mc_ctl_lock_timed_out(mc))
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: the lock's token row or the floor row in %s_grants"
                            " is locked by another transaction (not a dlock grant): gave up"
                            " after 1 s", mc->where, mc->table);
    if (err)
        return err;
    h->base.token = mysql_stmt_insert_id(st);
    if (h->base.token == 0)
        return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: no token from the grant", mc->where);
    return 0;
}

/* The statement failed for want of <table>_shared, or of its permits'
 * column (on a live session). */
static int no_shared_table(const struct session *s)
{
    return !s->dead && (s->last_errno == ER_NO_SUCH_TABLE || s->last_errno == ER_BAD_FIELD_ERROR);
}

/*
 * Whether a request of limit `limit` (0: the read-write lock) may join the
 * name's holders as kinds tells: 0, or DLOCK_EMODE with the detail.
 */
static int kind_refused(struct mysql_conn *mc, const dlock_request *req,
                        const struct shared_kinds *kd)
{
    int nl = req->name_len > 80 ? 80 : (int)req->name_len;
    unsigned long other = kd->min_lim != req->limit ? kd->min_lim : kd->max_lim;
    if (kd->permits && (req->limit == 0 || other != req->limit))
        return dlock_seterr(cl(mc), DLOCK_EMODE, "%.*s is held as a semaphore of limit %lu"
                            " (asked: %s)", nl, req->name, other,
                            req->limit ? "another limit" : "a read-write lock");
    if (req->limit && kd->readers)
        return dlock_seterr(cl(mc), DLOCK_EMODE, "%.*s is held as a read-write lock (asked: a"
                            " semaphore of limit %u)", nl, req->name, req->limit);
    return 0;
}

/* Reads the name's holders in modes and refuses req if they disagree: on
 * the lock session s when it reads at READ UNCOMMITTED (token=table), in
 * its transaction (one round trip), else on the control session. */
static int kind_check_on(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                         const unsigned char *k, struct bound *call, struct shared_kinds *kd,
                         int passing)
{
    char kx[2 * DLOCK_SHA256_LEN + 1];
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    int err = mc_shared_kinds(mc, kx, mc->row_isolation ? s : NULL,
                              passing && src(mc)->ctl_optional, call, kd);
    return err ? err : kind_refused(mc, req, kd);
}

/* Reads the name's holders in modes and refuses req if they disagree. */
static int kind_check(struct mysql_conn *mc, const dlock_request *req, const unsigned char *k,
                      struct bound *call, struct shared_kinds *kd, int passing)
{
    return kind_check_on(mc, NULL, req, k, call, kd, passing);
}

/* After a failed attempt: a dropped session is closed, a live one has its
 * transaction ended (InnoDB undoes only the failed statement) and is
 * pooled. */
static void drop_or_pool(struct mysql_conn *mc, struct session *s, const dlock_request *req)
{
    if (s->dead)
        mc_session_close(s);
    else
        mc_rollback_and_pool(mc, s, mc_cleanup_until(req));
}

/*
 * A waiting session the server dropped: was it the whole server (a
 * restart, a cut connection: the control session is gone too), or this
 * session alone (KILL from another session)? Asks the control session,
 * by until_ns. Returns 1 for the server (worth waiting again), 0 for the
 * session alone.
 */
static int server_dropped_all(struct mysql_conn *mc, uint64_t until_ns)
{
    struct bound b = {until_ns, DLOCK_ECONNECT, 0};
    dlock_errsave why;
    int alive;
    if (!mc->ctl && !src(mc)->ctl_optional)
        return 1; /* it was dropped too */
    dlock_err_save(cl(mc), &why);
    if (!mc->ctl) {
        /* token=sequence keeps no control session: a new session shows
         * whether the server answers (and joins the pool if it does). */
        struct session *p = NULL;
        alive = mc_session_open(mc, 1, &b, &p) == 0;
        if (alive)
            mc_pool_put(mc, p);
        dlock_err_restore(cl(mc), &why);
        return !alive;
    }
    alive = mc_run(mc, mc->ctl, NB_QUERY, NULL, "DO 0", &b, "checking the server") == 0;
    if (!alive)
        mc_ctl_dropped(mc);
    dlock_err_restore(cl(mc), &why);
    return !alive;
}

/* ---- semaphores --------------------------------------------------------- */

/*
 * A permit of a semaphore of limit N: its session's transaction holds the
 * name's row in share mode (a writer, of this release or an earlier one,
 * is excluded) and its own row in <table>_shared with lim = N, never
 * committed. Requests for permits queue, one at a time and in arrival
 * order, for the name's gate, a user lock (GET_LOCK, woken by the server)
 * on the request's own session; the one at the gate counts the permits
 * held and, when all N are, looks again every 50 ms (MariaDB cannot wait
 * for any one of N rows); then it takes its permit and its token and lets
 * the gate go, keeping its transaction. Readers and permits are never
 * granted together: each writes its own <table>_shared row before it reads
 * the other kind's (READ UNCOMMITTED, on the control session).
 */

/* Queues for the gate on *sp: 1 once there, or an error (a try: DLOCK_EBUSY;
 * a wait cut short: *sp closed and NULL, as lock_row). */
static int gate_take(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                     const char *gate, const struct bound *call)
{
    static const char what[] = "waiting for the semaphore's gate";
    struct session *s = *sp;
    int nowait = req->wait == DLOCK_WAIT_TRY;
    uint64_t start = dlock_monotonic_ns(), until = 0, left_us = 31536000000000ull;
    char sql[160];
    if (nowait) {
        left_us = 0;
        until = call->until;
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        left_us = req->deadline_ns > start ? (req->deadline_ns - start) / 1000u : 0;
        until = req->deadline_ns + CLEANUP_MS * MS;
    }
    snprintf(sql, sizeof sql, "SELECT GET_LOCK('%s', %" PRIu64 ".%06" PRIu64 ")", gate,
             left_us / 1000000u, left_us % 1000000u);
    struct nb c = {.op = NB_QUERY, .db = s->db, .sql = sql};
    mc_nb_step(&c, -1);
    int w = mc_nb_wait(&c, until, 1, nowait ? -1 : req->cancel_fd);
    if (w != 0) /* closed after: a gate granted meanwhile goes with the session */
        return lock_wait_cut(mc, s, sp, &c, w, req, start,
                             "the deadline passed with every permit still held elsewhere", 1);
    if (c.ret != 0)
        return mc_fail_on(mc, s, NULL, what);
    struct bound rb = mc_stmt_bound(call, mc->timeout_ms);
    struct nb r = {.op = NB_STORE, .db = s->db};
    mc_nb_step(&r, -1);
    if (mc_nb_finish(&r, rb.until, 0) != 0)
        return mc_no_reply(mc, s, what, start, rb.late);
    if (!r.res)
        return mc_fail_on(mc, s, NULL, what);
    MYSQL_ROW row = mysql_fetch_row(r.res);
    int got = row && row[0] && strcmp(row[0], "1") == 0;
    mysql_free_result(r.res);
    if (got)
        return 1;
    if (nowait)
        return dlock_seterr(cl(mc), DLOCK_EBUSY,
                            "every permit is held (another request is at the semaphore's gate)");
    return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                        "the deadline passed with every permit still held elsewhere");
}

/*
 * At the gate, all permits held: waits on s for the oldest permit's row
 * (its holder's release or end removes it, and InnoDB wakes us), for 50
 * ms at most (MariaDB cannot wait for any one of N rows: another permit
 * freed first is seen at the next look). Returns 0 to look again, or an
 * error (a wait cut short: *sp closed and NULL, as lock_row).
 */
static int permit_wait(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                       const unsigned char *k, uint64_t oldest)
{
    static const char what[] = "waiting for a permit";
    struct session *s = *sp;
    char kx[2 * DLOCK_SHA256_LEN + 1], sql[320];
    uint64_t start = dlock_monotonic_ns(), us = 50000;
    if (req->wait == DLOCK_WAIT_DEADLINE)
        us = req->deadline_ns <= start ? 1 : (req->deadline_ns - start) / 1000u < us
                                                 ? (req->deadline_ns - start) / 1000u + 1
                                                 : us;
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    snprintf(sql, sizeof sql,
             "SET STATEMENT max_statement_time = 0.%06" PRIu64 " FOR SELECT 1 FROM `%s_shared`"
             " WHERE k = X'%s' AND token = %" PRIu64 " FOR UPDATE", us, mc->table, kx, oldest);
    struct nb c = {.op = NB_QUERY, .db = s->db, .sql = sql};
    mc_nb_step(&c, -1);
    /* The server's answer by its `timeout`, and never after the deadline's cleanup. */
    uint64_t until = start + us * 1000u + mc->timeout_ms * MS;
    if (req->wait == DLOCK_WAIT_DEADLINE && mc_cleanup_until(req) < until)
        until = mc_cleanup_until(req);
    int w = mc_nb_wait(&c, until, 1, req->cancel_fd);
    if (w != 0)
        return lock_wait_cut(mc, s, sp, &c, w, req, start,
                             "the deadline passed with every permit still held elsewhere", 1);
    if (c.ret != 0) {
        unsigned e = mysql_errno(s->db);
        if (e == ERR_STATEMENT_TIMEOUT || e == ER_LOCK_WAIT_TIMEOUT)
            return 0;
        return mc_fail_on(mc, s, NULL, what);
    }
    struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
    return mc_run(mc, s, NB_STORE, NULL, NULL, &b, what);
}

/* At the gate: waits until fewer than req->limit permits are held,
 * refusing a name held in another kind. */
static int permit_free(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                       struct session **sp, struct bound *call)
{
    struct shared_kinds kd;
    int err;
    for (;;) {
        if ((err = kind_check_on(mc, *sp, req, h->k, call, &kd, 0)) != 0)
            return err;
        if (kd.permits < req->limit)
            return 0;
        if (req->wait == DLOCK_WAIT_TRY)
            return dlock_seterr(cl(mc), DLOCK_EBUSY, "all %u permits are held", req->limit);
        if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() >= req->deadline_ns)
            return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                                "the deadline passed with every permit still held elsewhere");
        if ((err = permit_wait(mc, sp, req, h->k, kd.oldest)) != 0)
            return err;
    }
}

/* At the gate, a permit free: the row in share mode (not waited for: a
 * writer holding or waiting means a read-write lock), the token and the
 * permit's row, then the other kinds looked at again. */
static int permit_grant(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                        struct session *s, struct bound *b)
{
    static const char what[] = "taking a permit";
    char kx[2 * DLOCK_SHA256_LEN + 1], tok[96], sql[768];
    int created = 0, made = 0, err, nl = req->name_len > 80 ? 80 : (int)req->name_len;
    struct shared_kinds kd;
    dlock_hex(h->k, DLOCK_SHA256_LEN, kx);
    h->s = s;
    if (src(mc)->seq_token)
        snprintf(tok, sizeof tok, "LAST_INSERT_ID(NEXTVAL(`%s_seq`))", mc->table);
    else if ((err = record_grant(mc, h, req, b)) != 0)
        return err;
    else
        snprintf(tok, sizeof tok, "%" PRIu64, h->base.token);
    snprintf(sql, sizeof sql,
             "SET STATEMENT innodb_lock_wait_timeout = 0 FOR INSERT INTO `%s_shared` (k, token,"
             " owner, session_id, acquired_at, lim) SELECT k, %s, '%.32s', CONNECTION_ID(),"
             " UTC_TIMESTAMP(6), %u FROM `%s` WHERE k = X'%s' LOCK IN SHARE MODE",
             mc->table, tok, req->owner_hex, req->limit, mc->table, kx);
    for (;;) {
        err = mc_exec_sql(mc, s, sql, b, what);
        if (err && !s->dead && s->last_errno == ER_LOCK_WAIT_TIMEOUT)
            return dlock_seterr(cl(mc), DLOCK_EMODE,
                                "%.*s is held as a read-write lock (a writer holds it or waits"
                                " for it; asked: a semaphore of limit %u)", nl, req->name,
                                req->limit);
        if (err && no_shared_table(s) && !made++) {
            /* The DDL waits for every transaction that used the table: this
             * one first (it holds nothing yet; the gate is no row). */
            if ((err = mc_exec_sql(mc, s, "ROLLBACK", b, what)) != 0 ||
                (err = mc_shared_table(mc, b)) != 0)
                return err;
            dlock_clearerr(cl(mc));
            continue;
        }
        if (err)
            return err;
        if (mysql_affected_rows(s->db) > 0)
            break;
        if (created++) /* a name's first use: its row */
            return dlock_seterr(cl(mc), DLOCK_ESTORE, "mysql %s: the lock's row keeps vanishing",
                                mc->where);
        if ((err = src(mc)->create_row(mc, s, req, h->k, b)) != 0)
            return err;
    }
    h->expires_ns = dlock_monotonic_ns();
    if (src(mc)->seq_token) {
        if ((h->base.token = mysql_insert_id(s->db)) == 0)
            return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: no token from the grant",
                                mc->where);
        if ((err = mc_seq_durable(mc, s, h->base.token, b, &h->expires_ns)) != 0)
            return err;
    }
    return kind_check_on(mc, s, req, h->k, b, &kd, 0);
}

/* A permit (req->limit > 0) on *sp, as a row source's lock (1: granted),
 * for take_lock. After a failure at the gate the gate is let go (or the
 * session marked dead, for take_lock to close: the server frees it). */
static int permit_lock(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                       struct mysql_held *h, struct bound *call)
{
    static const char what[] = "letting the semaphore's gate go";
    char gate[65], sql[96];
    struct session *s = *sp;
    int err;
    mc_gate_name(mc, h->k, gate);
    if ((err = gate_take(mc, sp, req, gate, call)) != 1)
        return err;
    snprintf(sql, sizeof sql, "DO RELEASE_LOCK('%s')", gate);
    struct bound b = mc_stmt_bound(req->wait == DLOCK_WAIT_TRY ? call : NULL, mc->timeout_ms);
    if ((err = permit_free(mc, h, req, sp, call)) == 0) {
        /* After a wait the bound is a statement's, as after a grant. */
        b = mc_stmt_bound(req->wait == DLOCK_WAIT_TRY ? call : NULL, mc->timeout_ms);
        if ((err = permit_grant(mc, h, req, s, &b)) == 0 &&
            (err = mc_exec_sql(mc, s, sql, &b, what)) == 0) {
            h->limit = req->limit;
            return 1;
        }
    }
    h->s = NULL;
    if (*sp && !s->dead) {
        dlock_errsave why;
        dlock_err_save(cl(mc), &why);
        b = (struct bound){mc_cleanup_until(req), DLOCK_ECONNECT, 0};
        if (mc_exec_sql(mc, s, sql, &b, what) != 0)
            s->dead = 1;
        dlock_err_restore(cl(mc), &why);
    }
    return err;
}

/*
 * Takes the row lock on a session of its own (h->s). A pooled session the
 * server dropped while idle (its lease ran out, a restart) is replaced,
 * and the rest of the pool with it. A missing row is created, once.
 *
 * A wait (deadline or forever) whose session the server dropped because
 * it went away (a restart, a broken connection) queues again on a new
 * session once the server is back, trying to reconnect every 100 ms to
 * 1 s, until the deadline, or for connect_timeout without a deadline; a
 * session killed alone (KILL from another session, the server still
 * answering) is not waited on again.
 */
static int take_lock(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                     struct bound *call)
{
    int retried = 0, created = 0, made = 0, err, pooled = 0, probed = 0, busy = 0;
    uint64_t down_since = 0, backoff = 100;
    struct session *s = NULL;
    struct shared_kinds kd;
    for (;;) {
        if (!s && (err = mc_pool_get(mc, call, &s, &pooled)) != 0) {
            if (!down_since || (err != DLOCK_ECONNECT && err != DLOCK_ETIMEDOUT))
                return err;
            /* The server is still away: try again, within bounds. */
            uint64_t now = dlock_monotonic_ns();
            uint64_t give_up = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns
                                                                : down_since + mc->connect_ms * MS;
            if (now + backoff * MS >= give_up)
                return dlock_seterr(cl(mc), err == DLOCK_ETIMEDOUT ? DLOCK_ETIMEDOUT : DLOCK_ECONNECT,
                                    "mysql %s: the server dropped the waiting session and was not"
                                    " back in time (%s)", mc->where,
                                    err == DLOCK_ETIMEDOUT ? "deadline" : "connect_timeout");
            if ((err = mc_pause_ms(mc, backoff, give_up, req->cancel_fd)) == DLOCK_EINTR)
                return dlock_seterr(cl(mc), err, "a signal interrupted the wait");
            if (err)
                return err;
            backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
            continue;
        }
        err = set_limits(mc, s, req, call);
        if (err == 0 && req->limit) {
            err = permit_lock(mc, &s, req, h, call);
        } else if (err == 0 && req->mode == DLOCK_MODE_EXCLUSIVE && req->wait != DLOCK_WAIT_TRY &&
                   !probed++) {
            /* A writer waits only after a look at a busy name's holders:
             * permits hold the row in share mode, and a writer is refused
             * at once there, not queued behind them. */
            dlock_request t = *req;
            t.wait = DLOCK_WAIT_TRY;
            err = src(mc)->lock(mc, &s, &t, h, call);
            if (err == DLOCK_EBUSY && s && !s->dead &&
                (err = kind_check(mc, req, h->k, call, &kd, 1)) == 0) {
                dlock_clearerr(cl(mc));
                err = src(mc)->lock(mc, &s, req, h, call);
            }
        } else if (err == 0) {
            err = src(mc)->lock(mc, &s, req, h, call);
        }
        if (err == 1) {
            if (down_since) /* the failed reconnects are over */
                dlock_clearerr(cl(mc));
            h->s = s;
            return 0;
        }
        if (err < 0 && s && no_shared_table(s) && !made++) {
            /* A store set up before shared locks: its first reader. */
            if ((err = mc_shared_table(mc, call)) == 0) {
                dlock_clearerr(cl(mc));
                continue;
            }
        }
        if (err == 0 && !created++) {
            if ((err = src(mc)->create_row(mc, s, req, h->k, call)) == 0)
                continue;
        } else if (err == 0) {
            err = dlock_seterr(cl(mc), DLOCK_ESTORE, "mysql %s: the lock's row keeps vanishing",
                               mc->where);
        }
        if (s && s->dead && !s->silent_ms) {
            int again = pooled && !retried++; /* most likely dropped while idle */
            mc_session_close(s);
            s = NULL;
            if (req->wait != DLOCK_WAIT_TRY) {
                uint64_t check = dlock_monotonic_ns() + mc->timeout_ms * MS;
                if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < check)
                    check = req->deadline_ns;
                if (server_dropped_all(mc, check)) {
                    mc_pool_drain(mc);
                    if (!down_since && src(mc)->ctl_optional) /* no control session to count it */
                        dlock_count_reconnect(cl(mc));
                    if (!down_since)
                        down_since = dlock_monotonic_ns();
                    dlock_clearerr(cl(mc));
                    continue;
                }
                if (!again)
                    return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                                        "mysql %s: waiting for the row lock: the waiting session"
                                        " was killed (KILL from another session?) while the"
                                        " server kept answering: not waited on again", mc->where);
            }
            if (!again)
                return err;
            mc_pool_drain(mc);
            if (src(mc)->ctl_optional)
                dlock_count_reconnect(cl(mc));
            continue;
        }
        if (err == DLOCK_EBUSY && req->mode == DLOCK_MODE_EXCLUSIVE && s && !s->dead) {
            /* A writer's try: busy, or held as a semaphore? */
            dlock_errsave why;
            dlock_err_save(cl(mc), &why);
            if ((err = kind_check(mc, req, h->k, call, &kd, 1)) == 0 &&
                req->wait == DLOCK_WAIT_TRY && !busy++) {
                /* Busy for an instant may be an inspect's look at the row (a
                 * share lock for one statement, over before the look at the
                 * kinds above has returned): one more try before saying so. */
                dlock_clearerr(cl(mc));
                continue;
            }
            if (err == 0) {
                dlock_err_restore(cl(mc), &why);
                err = DLOCK_EBUSY;
            }
        }
        if (s)
            drop_or_pool(mc, s, req);
        return err;
    }
}

static int row_acquire(struct mysql_conn *mc, const dlock_request *req, dlock_held **heldp)
{
    struct mysql_held *h = calloc(1, sizeof *h);
    uint64_t start = dlock_monotonic_ns();
    int err;
    if (!h)
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    dlock_sha256(req->name, req->name_len, h->k);
    h->shared = req->mode == DLOCK_MODE_SHARED;
    /* The call's bound: a deadline is the caller's; a try gets `timeout`
     * (plus the time spent connecting); a wait without a deadline has a
     * bound per statement only. */
    struct bound call = {0, DLOCK_ECONNECT, 0};
    if (req->wait == DLOCK_WAIT_DEADLINE)
        call = (struct bound){req->deadline_ns, DLOCK_ETIMEDOUT, 0};
    else if (req->wait == DLOCK_WAIT_TRY)
        call = (struct bound){start + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if ((err = take_lock(mc, h, req, &call)) != 0) {
        free(h);
        return err;
    }
    /* The server's idle timer started when the grant was sent: counting from
     * its arrival makes the client's view of the lease end a little later
     * than the server's, never earlier than the TTL. */
    h->ttl_ms = req->ttl_ms;
    /* token=sequence: from the last reply on the lock's session (take_lock
     * left its time there), not after the durable mark's checkpoint on the
     * control session (a connect, a commit), during which the server's
     * idle timer already ran; token=table: from the grant's arrival. */
    h->expires_ns += (uint64_t)req->ttl_ms * MS;
    /* After a wait (possibly longer than the TTL), the lease counts from
     * the grant: table_granted's "DO 0" restarts the server's idle timer later
     * still, so this end is never after the server's. */
    if (req->wait != DLOCK_WAIT_TRY)
        h->base.lease_end_ns = h->expires_ns;
    /* token=sequence: the token came with the row lock; a permit's, with
     * its grant. */
    if (!req->limit && src(mc)->granted && (err = src(mc)->granted(mc, h, req, &call)) != 0) {
        free(h);
        return err;
    }
    if (h->shared) { /* its row written: refused if permits hold the name */
        struct shared_kinds kd;
        struct bound b = mc_stmt_bound(req->wait == DLOCK_WAIT_TRY ? &call : NULL,
                                       mc->timeout_ms);
        if ((err = kind_check_on(mc, h->s, req, h->k, &b, &kd, 0)) != 0) {
            mc_rollback_and_pool(mc, h->s, mc_cleanup_until(req));
            free(h);
            return err;
        }
    }
    *heldp = &h->base;
    return 0;
}

static int hold_lost(struct mysql_conn *mc, struct mysql_held *h, const char *what, int err);

/* token=table: "DO 0" on the lock session; for a reader, the INSERT of its
 * <table>_shared row in its lock transaction (creating the table once). */
static int confirm_grant(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                         struct bound *b)
{
    static const char what[] = "confirming the grant";
    char kx[2 * DLOCK_SHA256_LEN + 1], sql[320];
    if (!h->shared)
        return mc_run(mc, h->s, NB_QUERY, NULL, "DO 0", b, what);
    dlock_hex(h->k, DLOCK_SHA256_LEN, kx);
    snprintf(sql, sizeof sql,
             "INSERT INTO `%s_shared` (k, token, owner, session_id, acquired_at) VALUES (X'%s',"
             " %" PRIu64 ", '%.32s', CONNECTION_ID(), UTC_TIMESTAMP(6))",
             mc->table, kx, h->base.token, req->owner_hex);
    int err = mc_run(mc, h->s, NB_QUERY, NULL, sql, b, what);
    if (err && no_shared_table(h->s) && (err = mc_shared_table(mc, b)) == 0)
        err = mc_run(mc, h->s, NB_QUERY, NULL, sql, b, what);
    return err;
}

/* token=table: bumps the name's token from the control session while the
 * lock session holds the row, then proves the lock session lived through
 * the bump. On failure the lock is let go (h->s pooled or closed). */
static int table_granted(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                         struct bound *call)
{
    int err;
    /* The token and the confirmation share one bound: what is left of a
     * try's, `timeout` for a wait without a deadline, and a small margin
     * past a deadline (the grant may come at its last instant). */
    struct bound post = mc_stmt_bound(req->wait == DLOCK_WAIT_TRY ? call : NULL, mc->timeout_ms);
    if (req->wait == DLOCK_WAIT_DEADLINE) {
        struct bound late = {req->deadline_ns + CLEANUP_MS * MS, DLOCK_ETIMEDOUT, 0};
        post = mc_stmt_bound(&late, mc->timeout_ms);
    }
    if ((err = record_grant(mc, h, req, &post)) != 0) {
        mc_rollback_and_pool(mc, h->s, mc_cleanup_until(req));
        return err;
    }
    /* The token was bumped on the control session, so it belongs to this
     * grant only if our lock session, and with it the row lock, lived
     * through the bump: had the server dropped it meanwhile (KILL,
     * wait_timeout), another holder may already be using a lower token.
     * One round trip on the lock session proves it is still there; a
     * reader's is its <table>_shared row. */
    if ((err = confirm_grant(mc, h, req, &post)) != 0) {
        err = hold_lost(mc, h, "confirming the grant", err);
        if (h->s)
            mc_rollback_and_pool(mc, h->s, mc_cleanup_until(req));
        else if (err == DLOCK_ELOST)
            err = dlock_seterr(cl(mc), DLOCK_ELOST,
                               "mysql %s: the session holding the new lock ended before its "
                               "token was recorded: not acquired", mc->where);
        return err;
    }
    return 0;
}

/* ---- release, renew, ping ----------------------------------------------- */

/* The holding session failed with err (recorded): if the server dropped
 * it, the lock is lost; if it did not answer in time, the session is
 * closed and the lock goes with it once the server sees that; either way
 * h lets go of the session. Otherwise err is the store's, and h keeps its
 * session. Touches h's own session only: safe on the keeper's thread. */
static int hold_lost(struct mysql_conn *mc, struct mysql_held *h, const char *what, int err)
{
    if (!h->s->dead)
        return err;
    if (h->s->silent_ms)
        err = dlock_seterr(cl(mc), err == DLOCK_ETIMEDOUT ? DLOCK_ETIMEDOUT : DLOCK_ECONNECT,
                           "mysql %s: %s: the server did not answer within %" PRIu64
                           " ms; the session holding the lock was closed%s: the server frees"
                           " the lock when it sees that", mc->where, what, h->s->silent_ms,
                           strcmp(what, "release") ? ", so the lock is lost" : "");
    else
        err = dlock_seterr(cl(mc), DLOCK_ELOST,
                           "mysql %s: %s: the server dropped the session holding the lock (%s):"
                           " the lock is lost", mc->where, what, mysql_error(h->s->db));
    mc_session_close(h->s);
    h->s = NULL;
    return err;
}

/* `timeout`, or the core's earlier bound (dlock_call_deadline(): a lost
 * lock's release); the session is the lock's own, so cutting it short
 * loses nothing else. */
static uint64_t release_until(const struct mysql_conn *mc)
{
    uint64_t until = dlock_monotonic_ns() + mc->timeout_ms * MS;
    return dlock_call_deadline() < until ? dlock_call_deadline() : until;
}

static int row_release(struct mysql_conn *mc, dlock_held *held)
{
    struct mysql_held *h = (struct mysql_held *)held;
    int err = 0;
    if (!h->s) {
        err = dlock_seterr(cl(mc), DLOCK_ELOST, "the lock was lost earlier");
    } else if ((err = mc_query_until(mc, h->s, "ROLLBACK", release_until(mc), "release")) != 0) {
        /* Closing the session makes the server roll back, if it still can. */
        err = hold_lost(mc, h, "release", err);
        if (h->s) {
            h->s->dead = 1;
            mc_session_close(h->s);
        }
    } else {
        if (dlock_monotonic_ns() >= h->expires_ns)
            err = mc_lease_over(mc, h->ttl_ms, "release");
        mc_pool_put(mc, h->s);
    }
    free(h);
    return err;
}

/* SET SESSION wait_timeout on h's own session, by until_ns: the renewal of
 * renew() and keep(). Only h's session is touched. */
static int set_lease(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms, uint64_t sent,
                     uint64_t until_ns)
{
    unsigned lease = mc_ceil_s(ttl_ms);
    char sql[64];
    snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", lease);
    int err = mc_query_until(mc, h->s, sql, until_ns, "renew");
    if (err)
        return hold_lost(mc, h, "renew", err);
    h->s->wait_timeout_s = lease;
    h->ttl_ms = ttl_ms;
    h->expires_ns = sent + (uint64_t)ttl_ms * MS;
    return 0;
}

static int row_renew(struct mysql_conn *mc, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_held *h = (struct mysql_held *)held;
    if (!h->s)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "the lock was lost earlier");
    uint64_t sent = dlock_monotonic_ns();
    if (sent >= h->expires_ns) {
        /* Possibly still ours on the server (wait_timeout is whole seconds),
         * but the lease is over: free it for others, never extend it. */
        mc_rollback_and_pool(mc, h->s, mc_cleanup_until(NULL));
        h->s = NULL;
        return mc_lease_over(mc, h->ttl_ms, "renew");
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
static int row_keep(struct mysql_conn *mc, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_held *h = (struct mysql_held *)held;
    if (!h->s)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "the lock was lost earlier");
    uint64_t sent = dlock_monotonic_ns(), until = sent + mc->timeout_ms * MS;
    if (sent >= h->expires_ns)
        return dlock_seterr(cl(mc), DLOCK_EEXPIRED,
                            "mysql %s: the lease (%" PRIu32 " ms) had run out before it could be"
                            " renewed", mc->where, h->ttl_ms);
    if (h->expires_ns < until)
        until = h->expires_ns;
    int err = set_lease(mc, h, ttl_ms, sent, until);
    /* The session closed for want of a reply: the lock must be assumed gone. */
    return err == DLOCK_ECONNECT && !h->s ? DLOCK_EEXPIRED : err;
}

/*
 * Proves h's row lock is still ours with one statement on its own session,
 * by until_ns: SET SESSION wait_timeout to what is left of the lease,
 * rounded up to the second as renew does (any statement restarts the
 * server's idle timer; this one keeps the server's lease end where the
 * client's is instead of pushing it a whole TTL later). An InnoDB row lock
 * lasts as long as its transaction, and the lock's session runs nothing
 * else: the session answering means the row lock is held.
 */
static int lock_alive(struct mysql_conn *mc, struct mysql_held *h, uint64_t until_ns,
                      const char *what)
{
    uint64_t now = dlock_monotonic_ns();
    char sql[64];
    if (now >= h->expires_ns) {
        mc_rollback_and_pool(mc, h->s, mc_cleanup_until(NULL));
        h->s = NULL;
        return mc_lease_over(mc, h->ttl_ms, what);
    }
    unsigned left = mc_ceil_s((h->expires_ns - now + MS - 1) / MS);
    snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", left);
    int err = mc_query_until(mc, h->s, sql, until_ns, what);
    if (err)
        return hold_lost(mc, h, what, err);
    h->s->wait_timeout_s = left;
    return 0;
}

/* publish: the value's row in the lock's own transaction (mysql_elect.c),
 * the statement proving the row lock as lock_alive's does. */
static int row_publish(struct mysql_conn *mc, dlock_held *held, const void *value, size_t len)
{
    struct mysql_held *h = (struct mysql_held *)held;
    if (!h->s)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "the lock was lost earlier");
    if (dlock_monotonic_ns() >= h->expires_ns)
        return lock_alive(mc, h, 0, "publish"); /* its lease-over error */
    struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
    uint64_t term = h->raised > h->base.token ? h->raised : h->base.token;
    struct elect_pub p = {h->k, term, "", h->ttl_ms, value, len, ""};
    int err = mc_elect_publish_on(mc, h->s, &p, &b);
    return err ? hold_lost(mc, h, "publish", err) : 0;
}

/* A floor the token column can take: the next grant adds 1. */
static int table_floor_check(struct mysql_conn *mc, uint64_t floor)
{
    if (floor > TOKEN_FLOOR_MAX)
        return dlock_seterr(cl(mc), DLOCK_EINVAL,
                            "mysql: tokens are BIGINT UNSIGNED: a floor must be at most"
                            " 2^64 - 2 (%" PRIu64 ")", (uint64_t)TOKEN_FLOOR_MAX);
    return 0;
}

/*
 * Raises the name's counter to floor (never lowers it).
 *
 * token=table: first the lock's own session proves the row lock is still
 * ours (lock_alive), then the control session, in autocommit, sets token =
 * GREATEST(token, floor) on the name's grants row only while the latest
 * grant recorded there is ours (session_id). A later holder's grant is
 * recorded only after it got the row lock, i.e. after our transaction
 * ended; so a raise that matches is committed before any later token
 * exists, and every later grant of the name gets a token above floor. A
 * raise that matches nothing raised nothing: the lock was lost (or the row
 * was changed by hand, while the session still holds the row:
 * DLOCK_ESTORE). Two round trips, bounded together by `timeout` (plus
 * connect_timeout to reopen the control session); as durable as the
 * grants' commits.
 *
 * token=sequence: the sequence is every name's, and SETVAL never moves it
 * back (a value below the sequence's is ignored) and is atomic with
 * NEXTVAL, so no lock is needed: lock_alive, then SETVAL(seq, floor) on the
 * lock's own session (not undone by the lock transaction's rollback; the
 * session answering proves the row lock still ours, as lock_alive does),
 * then the durable mark is committed past it (seq_checkpoint: on disk).
 * Every later grant of every name gets more than floor. Three round trips
 * (and a connect, the control session being opened for the mark).
 */
static int row_raise_token(struct mysql_conn *mc, dlock_held *held, uint64_t floor)
{
    struct mysql_held *h = (struct mysql_held *)held;
    static const char what[] = "raising the token";
    int err;
    if ((err = src(mc)->floor_check(mc, floor)) != 0)
        return err;
    if (!h->s)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "the lock was lost earlier");
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if ((err = lock_alive(mc, h, call.until, what)) == 0 &&
        (err = src(mc)->raise(mc, h, floor, &call)) == 0 && floor > h->raised)
        h->raised = floor;
    return err;
}

static int seq_raise(struct mysql_conn *mc, struct mysql_held *h, uint64_t floor,
                     struct bound *call)
{
    static const char what[] = "raising the token";
    unsigned long long f = floor;
    char sql[160];
    MYSQL_RES *res = NULL;
    uint64_t mark = 0;
    int err;
    snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %llu)", mc->table, f);
    if ((err = mc_query_result(mc, h->s, sql, call, what, &res)) != 0)
        return hold_lost(mc, h, what, err);
    mysql_free_result(res);
    /* On disk before the call returns (see mc_seq_durable). */
    if ((err = mc_seq_checkpoint(mc, call, &mark)) != 0)
        return err;
    if (mark > mc->durable)
        mc->durable = mark;
    return 0;
}

/*
 * token=table, a reader: the name's latest grant may be another reader's,
 * so the counter is raised whoever it names, then the lock's own session
 * proves the reader still holds: no writer was granted meanwhile (it
 * waits for this reader), so every later writer's grant, and every later
 * reader's, is recorded after the raise's commit and above floor.
 */
static int shared_raise(struct mysql_conn *mc, struct mysql_held *h, uint64_t floor,
                        struct bound *call)
{
    static const char what[] = "raising the token";
    char kx[2 * DLOCK_SHA256_LEN + 1], sql[256];
    struct session *ctl;
    int err;
    dlock_hex(h->k, DLOCK_SHA256_LEN, kx);
    snprintf(sql, sizeof sql,
             "UPDATE `%s_grants` SET token = GREATEST(token, %" PRIu64 ") WHERE k = X'%s'",
             mc->table, floor, kx);
    if ((err = mc_ctl_session(mc, call, &ctl)) != 0 ||
        (err = mc_exec_sql(mc, ctl, sql, call, what)) != 0)
        return err;
    return lock_alive(mc, h, call->until, what);
}

static int table_raise(struct mysql_conn *mc, struct mysql_held *h, uint64_t floor,
                       struct bound *call)
{
    static const char what[] = "raising the token";
    unsigned long klen = DLOCK_SHA256_LEN;
    unsigned long long f = floor, sid;
    MYSQL_BIND bd[3];
    MYSQL_STMT *st;
    int err;
    sid = mysql_thread_id(h->s->db); /* what record_grant wrote as session_id */
    if (h->shared || h->limit)
        return shared_raise(mc, h, floor, call);
    mc_bind_u64(&bd[0], &f);
    mc_bind_bytes(&bd[1], h->k, &klen);
    mc_bind_u64(&bd[2], &sid);
    err = mc_ctl_exec(mc, ST_RAISE, bd, 0, call, what, &st);
    if (err && mc_ctl_lock_timed_out(mc))
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: the lock's token row in %s_grants is locked by another"
                            " transaction (not a dlock grant): gave up after 1 s; not raised",
                            mc->where, mc->table);
    if (err)
        return err;
    if (mysql_stmt_insert_id(st) != 0)
        return 0;
    /* No row names our session: a later grant was recorded (so the session
     * is gone), or someone changed the row. */
    if ((err = lock_alive(mc, h, call->until, what)) != 0)
        return err;
    return dlock_seterr(cl(mc), DLOCK_ESTORE,
                        "mysql %s: %s: the lock is held, but its token row in %s_grants"
                        " does not name its session (changed or deleted outside dlock?):"
                        " nothing was raised", mc->where, what, mc->table);
}

/*
 * token_top, on the control session, one round trip bounded by `timeout`,
 * taking no lock a grant waits for. token=table: MAX(token) over
 * <table>_grants (a scan of every name's row, the floor's included; a
 * consistent read). token=sequence: the sequence's next_not_cached_value
 * - 1, at or above every value any server handed out (they come from the
 * cached range below it) and every floor set (SETVAL moves it past one
 * beyond the range): an upper bound, up to the cache (1000) above the last
 * token granted.
 */
static int table_token_top(struct mysql_conn *mc, uint64_t *top)
{
    static const char what[] = "reading the highest token";
    unsigned long long v = 0;
    my_bool isnull = 0;
    MYSQL_BIND rb;
    MYSQL_STMT *st;
    int err;
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    /* token=sequence: mc_seq_token_top. */
    if ((err = mc_ctl_exec(mc, ST_TOP, NULL, 1, &call, what, &st)) != 0)
        return err;
    mc_bind_u64(&rb, &v);
    rb.is_null = &isnull;
    if (mysql_stmt_bind_result(st, &rb) != 0) {
        err = mc_fail_on(mc, mc->ctl, st, what);
        mysql_stmt_free_result(st);
        return err;
    }
    int got = mysql_stmt_fetch(st); /* the stored row: no round trip */
    mysql_stmt_free_result(st);
    if (got != 0 && got != MYSQL_DATA_TRUNCATED)
        return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: %s: no value returned", mc->where,
                            what);
    *top = isnull ? 0 : v;
    return 0;
}

/*
 * raise_floor, on the control session, one round trip bounded by
 * `timeout`.
 *
 * token=table: in autocommit (committed as a grant's bump is, so as
 * durable), sets the floor row of <table>_grants (key FLOOR_K, owner
 * 'floor') to GREATEST(token, floor), inserting it if missing. Every
 * grant's statement reads that row (under a shared row lock, InnoDB's for
 * a subquery of an INSERT) and takes GREATEST(name's token + 1, floor +
 * 1), so a grant recorded after the commit is above floor. The row lock it
 * takes is held only for that statement.
 *
 * token=sequence: SETVAL(seq, floor), which never moves the sequence back:
 * every later NEXTVAL, of any name, is above floor; then the durable mark
 * is committed past it (seq_checkpoint), which puts the SETVAL on disk.
 * Two round trips.
 */
static int table_raise_floor(struct mysql_conn *mc, uint64_t floor)
{
    static const char what[] = "raising the store's token floor";
    unsigned long long f = floor;
    MYSQL_BIND bd[1];
    MYSQL_STMT *st;
    int err;
    if ((err = table_floor_check(mc, floor)) != 0)
        return err;
    if (floor == 0)
        return 0; /* every token is above 0 */
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    /* token=sequence: mc_seq_raise_floor. */
    mc_bind_u64(&bd[0], &f);
    err = mc_ctl_exec(mc, ST_FLOOR, bd, 0, &call, what, &st);
    if (err && mc_ctl_lock_timed_out(mc))
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: the floor row of %s_grants is locked by another"
                            " transaction (not dlock's): gave up after 1 s; not raised",
                            mc->where, mc->table);
    return err;
}

/* token=sequence keeps no control session: an idle lock session answers
 * then. */
static int seq_ping(struct mysql_conn *mc)
{
    return mc->ctl ? mc_ping_ctl(mc) : mc_ping_pooled(mc);
}

/* Prepares the control session's statements, creating the tables the
 * first time (that needs the CREATE privilege once). */
static int prepare_tables(struct mysql_conn *mc)
{
    MYSQL_STMT *st;
    struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
    int err = mc_prepare(mc, mc->ctl, ST_GRANT, &b, &st);
    if (err == 0)
        err = mc_prepare(mc, mc->ctl, ST_CREATE_ROW, &b, &st);
    if (err == 0 || mc->ctl->last_errno != ER_NO_SUCH_TABLE)
        return err;
    dlock_clearerr(cl(mc));
    for (size_t i = 0; i < sizeof mc_create_sql / sizeof mc_create_sql[0]; i++) {
        char *sql = mc_with_table(mc_create_sql[i], mc->table);
        if (!sql)
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
        err = mc_exec_sql(mc, mc->ctl, sql, NULL, "cannot create the lock table");
        free(sql);
        if (err)
            return err;
    }
    b = mc_stmt_bound(NULL, mc->timeout_ms);
    if ((err = mc_prepare(mc, mc->ctl, ST_GRANT, &b, &st)) != 0)
        return err;
    return mc_prepare(mc, mc->ctl, ST_CREATE_ROW, &b, &st);
}

/* token=table: the control session, as ever, which prepares its
 * statements (and creates the tables the first time). */
static int table_open(struct mysql_conn *mc)
{
    int err;
    for (int i = 0; i < N_STMTS; i++)
        if (!(mc->sql[i] = mc_with_table(stmt_sql[i], mc->table)))
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    /* Lock sessions read <table>_shared's uncommitted rows (a reader's or
     * permit's look at the other kind, in its own transaction); they make
     * no other plain read. */
    mc->row_isolation = "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED";
    if ((err = mc_session_open(mc, ROLE_CTL, NULL, &mc->ctl)) != 0)
        return err;
    mc->mariadb = strstr(mysql_get_server_info(mc->ctl->db), "MariaDB") != NULL;
    /* MySQL 8 takes NOWAIT after FOR SHARE only (LOCK IN SHARE MODE is
     * MariaDB's spelling; MariaDB has no FOR SHARE). */
    for (int i = ST_SHARED_WAIT; !mc->mariadb && i <= ST_SHARED_NOWAIT; i++) {
        free(mc->sql[i]);
        if (!(mc->sql[i] = mc_with_table(i == ST_SHARED_WAIT ? stmt_sql_mysql_wait
                                                              : stmt_sql_mysql_nowait,
                                         mc->table)))
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    }
    return prepare_tables(mc);
}

/* token=sequence: the first lock session sets up the store, then waits in
 * the pool for the first acquire. */
static int seq_open(struct mysql_conn *mc)
{
    struct session *s = malloc(sizeof *s);
    int err;
    if (!s)
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    if ((err = mc_seq_open(mc, ROLE_ROW, "token=sequence", s)) != 0) {
        free(s);
        return err;
    }
    mc_rollback_and_pool(mc, s, dlock_monotonic_ns() + mc->timeout_ms * MS);
    return 0;
}

static const struct row_source table_source = {
    .lock = table_lock,
    .create_row = create_row,
    .granted = table_granted,
    .floor_check = table_floor_check,
    .raise = table_raise,
};

static const struct row_source seq_source = {
    .seq_token = 1,
    .server_deadline = 1,
    .ctl_optional = 1,
    .lock = seq_lock,
    .create_row = create_row_seq,
    .floor_check = mc_seq_floor_check,
    .raise = seq_raise,
};

const struct mysql_mode mc_row_table_mode = {
    .open = table_open,
    .acquire = row_acquire,
    .release = row_release,
    .renew = row_renew,
    .keep = row_keep,
    .ping = mc_ping_ctl,
    .raise_token = row_raise_token,
    .token_top = table_token_top,
    .raise_floor = table_raise_floor,
    .inspect = mc_row_inspect,
    .inspect_holders = mc_row_inspect_holders,
    .publish = row_publish,
    .leader = mc_elect_row_leader,
    .row = &table_source,
    .view = &mc_table_view,
};

const struct mysql_mode mc_row_seq_mode = {
    .open = seq_open,
    .acquire = row_acquire,
    .release = row_release,
    .renew = row_renew,
    .keep = row_keep,
    .ping = seq_ping,
    .raise_token = row_raise_token,
    .token_top = mc_seq_token_top,
    .raise_floor = mc_seq_raise_floor,
    .inspect = mc_row_inspect,
    .inspect_holders = mc_row_inspect_holders,
    .publish = row_publish,
    .leader = mc_elect_row_leader,
    .row = &seq_source,
    .view = &mc_seq_view,
};
