/*
 * The MariaDB backend's store objects: the tables (created at the first
 * open) and, for token=sequence and lock=named, the one sequence every
 * name's tokens come from, made durable by a committed mark once per range
 * of SEQ_CACHE values; the store-wide floor and top on the sequence. Used
 * by mysql_row.c and mysql_named.c; calls only mysql_conn.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysqld_error.h>

#include "config.h"
#include "backends/mysql_int.h"

/* token=sequence: the holder's grant, written by its locking statement and
 * never committed (a release rolls it back): visible only to READ
 * UNCOMMITTED readers, i.e. inspect, while the lock is held; owner '' when
 * free. Fixed-size and NOT NULL, so that a grant and its rollback update
 * the row in place: a change of the record's size makes InnoDB move every
 * lock queued on it (a hundred waiters made a rollback take 0.2 s). */
#define LOCK_COLUMNS                                                                              \
    " token BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'token=sequence: the holder''s token',"    \
    " owner CHAR(32) CHARACTER SET ascii NOT NULL DEFAULT ''"                                     \
    " COMMENT 'token=sequence: the holder''s owner id',"                                          \
    " session_id BIGINT UNSIGNED NOT NULL DEFAULT 0"                                              \
    " COMMENT 'token=sequence: the holder''s CONNECTION_ID()',"                                   \
    " acquired_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00'"                            \
    " COMMENT 'token=sequence: the grant, UTC'"

/* A lock table created before token=sequence gets its columns (instant in
 * MariaDB 10.3+: metadata only). Its metadata lock waits for every
 * transaction on the table, i.e. every held lock, and makes new statements
 * on it wait behind it: at most 1 s. */
static const char add_columns_sql[] =
    "SET STATEMENT lock_wait_timeout = 1 FOR ALTER TABLE `@T` ADD COLUMN IF NOT EXISTS token BIGINT UNSIGNED NOT NULL DEFAULT 0,"
    " ADD COLUMN IF NOT EXISTS owner CHAR(32) CHARACTER SET ascii NOT NULL DEFAULT '',"
    " ADD COLUMN IF NOT EXISTS session_id BIGINT UNSIGNED NOT NULL DEFAULT 0,"
    " ADD COLUMN IF NOT EXISTS acquired_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00'";

const char *const mc_create_sql[3] = {
    "CREATE TABLE IF NOT EXISTS `@T` ("
    " k BINARY(32) NOT NULL PRIMARY KEY COMMENT 'SHA-256 of the lock name',"
    " name VARBINARY(255) NOT NULL COMMENT 'the name, cut to 255 bytes, for people',"
    " created_at DATETIME(6) NOT NULL COMMENT 'UTC'," LOCK_COLUMNS
    ") ENGINE=InnoDB COMMENT='dlock: one row per lock name, row-locked by its holder'",
    "CREATE TABLE IF NOT EXISTS `@T_grants` ("
    " k BINARY(32) NOT NULL PRIMARY KEY COMMENT 'SHA-256 of the lock name',"
    " token BIGINT UNSIGNED NOT NULL COMMENT 'fencing token of the latest grant',"
    " owner CHAR(32) CHARACTER SET ascii NOT NULL COMMENT 'owner id of the latest grant',"
    " session_id BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of the holding session',"
    " acquired_at DATETIME(6) NOT NULL COMMENT 'UTC'"
    ") ENGINE=InnoDB COMMENT='dlock: latest grant of each lock, committed at grant time'",
    /* A shared holder's row, written by its lock transaction and never
     * committed: its release (a rollback) or its session's end removes it;
     * seen by inspect at READ UNCOMMITTED only. */
    "CREATE TABLE IF NOT EXISTS `@T_shared` ("
    " k BINARY(32) NOT NULL COMMENT 'SHA-256 of the lock name',"
    " token BIGINT UNSIGNED NOT NULL COMMENT 'the shared holder''s fencing token',"
    " owner CHAR(32) CHARACTER SET ascii NOT NULL COMMENT 'its owner id',"
    " session_id BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of its session',"
    " acquired_at DATETIME(6) NOT NULL COMMENT 'UTC',"
    " lim INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'a permit''s semaphore limit; 0: a reader',"
    " PRIMARY KEY (k, token)"
    ") ENGINE=InnoDB COMMENT='dlock: shared holders, uncommitted rows of their transactions'",
};

/* A <table>_shared made before semaphores gets their column (instant, but
 * the ALTER waits for the transactions using the table, readers holding
 * included, and holds back new ones meanwhile: 1 s at most, then it fails
 * and the permit with it). */
static const char add_lim_sql[] =
    "SET STATEMENT lock_wait_timeout = 1 FOR"
    " ALTER TABLE `@T_shared` ADD COLUMN IF NOT EXISTS lim INT UNSIGNED NOT NULL DEFAULT 0"
    " COMMENT 'a permit''s semaphore limit; 0: a reader'";

/*
 * A statement reading <table>_shared on the control session ctl at READ
 * UNCOMMITTED (its rows are never committed): *res its result, NULL when
 * the store has no <table>_shared (nothing held in a mode). One round
 * trip, two on a control session that reads committed rows (token=table).
 */
static int shared_query(struct mysql_conn *mc, struct session *ctl, const char *sql,
                        const char *old, struct bound *call, const char *what, MYSQL_RES **res)
{
    int err, altered = 0;
again:
    *res = NULL;
    if (!mc->ctl_isolation &&
        (err = mc_exec_sql(mc, ctl, "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED", call,
                           what)) != 0)
        return err;
    if ((err = mc_query_result(mc, ctl, sql, call, what, res)) != 0) {
        if (ctl->dead)
            return err;
        /* The level set above was not used: the next statement must read
         * committed rows, as ever. */
        int none = ctl->last_errno == ER_NO_SUCH_TABLE; /* no reader ever */
        if (!mc->ctl_isolation) {
            dlock_errsave why;
            dlock_err_save(cl(mc), &why);
            int reset = mc_exec_sql(mc, ctl, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
                                    call, what);
            if (reset)
                return reset;
            dlock_err_restore(cl(mc), &why);
        }
        if (ctl->last_errno == ER_BAD_FIELD_ERROR && !altered++) {
            /* <table>_shared from before semaphores: no permit yet (the
             * first permit adds the column; not here: a reader's own
             * transaction may be using the table). */
            dlock_clearerr(cl(mc));
            sql = old;
            goto again;
        }
        if (!none)
            return err;
        dlock_clearerr(cl(mc));
        *res = NULL;
        return 0;
    }
    return 0;
}

/*
 * The kinds holding the name whose key is kx, from <table>_shared at READ
 * UNCOMMITTED on the control session: readers (lim 0), permits, and the
 * smallest and largest limit among the permits. As mc_shared_read.
 * passing: unless the control session is open, a session of its own,
 * closed after (token=sequence's waiting writer keeps one session). on: a
 * lock session reading at READ UNCOMMITTED (token=table's) instead, one
 * round trip in its transaction.
 */
int mc_shared_kinds(struct mysql_conn *mc, const char *kx, struct session *on, int passing,
                    struct bound *call, struct shared_kinds *kinds)
{
    static const char what[] = "reading the name's holders";
    char sql[320], old[160];
    int err = 0;
    memset(kinds, 0, sizeof *kinds);
    snprintf(sql, sizeof sql,
             "SELECT COALESCE(SUM(lim = 0), 0), COALESCE(SUM(lim > 0), 0),"
             " COALESCE(MIN(NULLIF(lim, 0)), 0), COALESCE(MAX(lim), 0),"
             " COALESCE(MIN(IF(lim > 0, token, NULL)), 0) FROM `%s_shared` WHERE k = X'%s'",
             mc->table, kx);
    snprintf(old, sizeof old, "SELECT COUNT(*), 0, 0, 0, 0 FROM `%s_shared` WHERE k = X'%s'",
             mc->table, kx);
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl = NULL, *own = NULL;
        MYSQL_RES *res = NULL;
        if (on) {
            ctl = on;
            err = mc_query_result(mc, on, sql, call, what, &res);
            if (err && !on->dead && on->last_errno == ER_BAD_FIELD_ERROR) {
                dlock_clearerr(cl(mc)); /* as shared_query */
                err = mc_query_result(mc, on, old, call, what, &res);
            }
            if (err)
                return err;
        } else if (passing && !mc->ctl) {
            err = mc_session_open(mc, ROLE_CTL, call, &own);
            ctl = own;
        } else {
            err = mc_ctl_session(mc, call, &ctl);
        }
        if (err == 0 && !on)
            err = shared_query(mc, ctl, sql, old, call, what, &res);
        if (err == 0) {
            MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
            if (row && row[0] && row[1] && row[2] && row[3] && row[4]) {
                kinds->oldest = strtoull(row[4], NULL, 10);
                kinds->readers = strtoul(row[0], NULL, 10);
                kinds->permits = strtoul(row[1], NULL, 10);
                kinds->min_lim = strtoul(row[2], NULL, 10);
                kinds->max_lim = strtoul(row[3], NULL, 10);
            }
            if (res)
                mysql_free_result(res);
        }
        if (own || on) {
            if (own)
                mc_session_close(own);
            return err;
        }
        if (err == 0 || !mc_ctl_dropped(mc))
            return err;
    }
    return err;
}

/*
 * The shared holders of the name whose key is kx (hex), in grant order,
 * read on the control session ctl at READ UNCOMMITTED (their rows are never
 * committed): fills holders[0 .. min(capacity, *count)) and *last (the
 * highest token's); a store without <table>_shared has none. One round
 * trip, two on a control session that reads committed rows (token=table).
 */
int mc_shared_read(struct mysql_conn *mc, struct session *ctl, const char *kx,
                   struct bound *call, dlock_holder *holders, size_t capacity, size_t *count,
                   dlock_holder *last)
{
    static const char what[] = "inspect";
    char sql[256], old[256];
    MYSQL_RES *res = NULL;
    int err;
    *count = 0;
    memset(last, 0, sizeof *last);
    snprintf(sql, sizeof sql,
             "SELECT token, owner, lim FROM `%s_shared` WHERE k = X'%s' ORDER BY token",
             mc->table, kx);
    snprintf(old, sizeof old,
             "SELECT token, owner, 0 FROM `%s_shared` WHERE k = X'%s' ORDER BY token",
             mc->table, kx);
    if ((err = shared_query(mc, ctl, sql, old, call, what, &res)) != 0 || !res)
        return err;
    for (MYSQL_ROW row; (row = mysql_fetch_row(res)) != NULL;) {
        if (!row[0] || !row[1] || !row[2])
            continue;
        last->known = DLOCK_KNOWS_MODE | DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER;
        last->limit = (uint32_t)strtoul(row[2], NULL, 10);
        last->mode = last->limit ? DLOCK_MODE_EXCLUSIVE : DLOCK_MODE_SHARED;
        last->token = strtoull(row[0], NULL, 10);
        snprintf(last->owner, sizeof last->owner, "%s", row[1]);
        if (*count < capacity)
            holders[*count] = *last;
        ++*count;
    }
    mysql_free_result(res);
    return 0;
}

/* The gate of a name's permits (mysql_row.c): a user lock of 64
 * characters (MariaDB's longest). */
void mc_gate_name(struct mysql_conn *mc, const unsigned char *k, char out[65])
{
    size_t tl = strlen(mc->table);
    unsigned char buf[TABLE_NAME_MAX + 1 + DLOCK_SHA256_LEN + 8], d[DLOCK_SHA256_LEN];
    if (tl > TABLE_NAME_MAX)
        tl = TABLE_NAME_MAX;
    memcpy(buf, mc->table, tl);
    buf[tl] = 0;
    memcpy(buf + tl + 1, k, DLOCK_SHA256_LEN);
    dlock_sha256(buf, tl + 1 + DLOCK_SHA256_LEN, d);
    memcpy(out, "dls:", 4);
    dlock_hex(d, 30, out + 4);
}

/* Creates <table>_shared, on a session of its own (a lock session's
 * transaction must not be committed by the DDL): a store set up before
 * shared locks gets it at its first shared grant. */
int mc_shared_table(struct mysql_conn *mc, struct bound *call)
{
    struct session *s = NULL;
    char *sql = mc_with_table(mc_create_sql[2], mc->table);
    int err;
    if (!sql)
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    if ((err = mc_session_open(mc, ROLE_CTL, call, &s)) == 0)
        err = mc_exec_sql(mc, s, sql, call, "cannot create the shared holders' table");
    free(sql);
    if (err == 0 && !(sql = mc_with_table(add_lim_sql, mc->table)))
        err = dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    else if (err == 0) {
        err = mc_exec_sql(mc, s, sql, call, "cannot add the permits' column to the shared holders' table (it waits"
                            " for the readers holding then: try again once they are gone)");
        free(sql);
    }
    mc_session_close(s);
    return err;
}

/*
 * token=sequence: MariaDB writes a sequence's table (its next range, a
 * SETVAL) without writing the redo log at that moment: it reaches the disk
 * with the next commit that does, or InnoDB's once-a-second flush. A crash
 * before that restarts the sequence below tokens already handed out. So a
 * token is returned only once known to be on disk: below the mark, a row
 * of <table> with the all-zero key (FLOOR_K, no name's) whose token column
 * a committed write sets to the sequence's next_not_cached_value: the
 * commit writes the log up to itself, the sequence's earlier writes with
 * it, so every value below the mark is as durable as a commit
 * (innodb_flush_log_at_trx_commit). A commit per range of SEQ_CACHE
 * values, not per grant; clients share the mark.
 */

/* Commits the mark on a session in autocommit: the control session if
 * open, else one opened for it and closed after (rare: a new range). *mark:
 * the mark now. */
int mc_seq_checkpoint(struct mysql_conn *mc, struct bound *call, uint64_t *mark)
{
    static const char what[] = "writing the sequence's durable mark";
    char sql[640];
    int opened = !mc->ctl, err = 0;
    snprintf(sql, sizeof sql,
             "INSERT INTO `%s` (k, name, created_at, token) VALUES (" FLOOR_K ","
             " 'dlock: tokens below are on disk', UTC_TIMESTAMP(6),"
             " LAST_INSERT_ID((SELECT next_not_cached_value FROM `%s_seq`)))"
             " ON DUPLICATE KEY UPDATE created_at = VALUES(created_at),"
             " token = LAST_INSERT_ID(GREATEST(token, VALUES(token)))",
             mc->table, mc->table);
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl;
        if ((err = mc_ctl_session(mc, call, &ctl)) == 0 &&
            (err = mc_exec_sql(mc, ctl, sql, call, what)) == 0) {
            *mark = mysql_insert_id(ctl->db);
            break;
        }
        if (!mc_ctl_dropped(mc))
            break;
    }
    if (opened && mc->ctl) {
        mc_session_close(mc->ctl);
        mc->ctl = NULL;
    }
    return err;
}

/* Makes sure token is on disk before it is handed out (see above): below
 * the mark as this client last saw it (no round trip), or as read now on
 * s (a consistent read: the lock transaction stays as it is), or once a
 * checkpoint has moved the mark past it. seq_mark_read: 0 with *behind set
 * when a checkpoint is needed (*replied: when the read's reply came). */
int mc_seq_mark_read(struct mysql_conn *mc, struct session *s, uint64_t token,
                     struct bound *call, int *behind, uint64_t *replied)
{
    char sql[256];
    MYSQL_RES *res = NULL;
    uint64_t mark = 0;
    int err;
    *behind = 0;
    if (token < mc->durable)
        return 0;
    snprintf(sql, sizeof sql, "SELECT token FROM `%s` WHERE k = " FLOOR_K, mc->table);
    struct bound b = mc_stmt_bound(call, mc->timeout_ms);
    if ((err = mc_query_result(mc, s, sql, &b, "reading the sequence's durable mark", &res)) != 0)
        return err;
    if (replied)
        *replied = dlock_monotonic_ns();
    MYSQL_ROW row = mysql_fetch_row(res);
    mark = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
    mysql_free_result(res);
    if (mark <= token)
        *behind = 1;
    else if (mark > mc->durable)
        mc->durable = mark;
    return 0;
}

/* The checkpoint for a token the mark read on its session was not past:
 * the control session only, so it needs no lock session (lock=named runs
 * it without the session's mutex). */
int mc_seq_mark_past(struct mysql_conn *mc, uint64_t token, struct bound *call)
{
    uint64_t mark = 0;
    int err;
    if ((err = mc_seq_checkpoint(mc, call, &mark)) != 0)
        return err;
    if (mark <= token)
        return dlock_seterr(cl(mc), DLOCK_EPROTO,
                            "mysql %s: the sequence's durable mark (%" PRIu64 ") is not past"
                            " token %" PRIu64 ": `%s_seq` changed outside dlock?",
                            mc->where, mark, token, mc->table);
    if (mark > mc->durable)
        mc->durable = mark;
    return 0;
}

/* *replied: when the last reply on s came (the mark's read), unchanged
 * when s was not used. */
int mc_seq_durable(struct mysql_conn *mc, struct session *s, uint64_t token,
                   struct bound *call, uint64_t *replied)
{
    int behind = 0, err = mc_seq_mark_read(mc, s, token, call, &behind, replied);
    if (err == 0 && behind)
        err = mc_seq_mark_past(mc, token, call);
    return err;
}

/*
 * token=sequence's objects, checked with one statement naming every
 * column used and the sequence (reading the durable mark's row only). What is missing is
 * created: the lock table, or its token=sequence columns on a table of an
 * older dlock, and the sequence, starting above every token <table>_grants
 * ever recorded (token=table's, an older dlock's; the floor row included),
 * so that tokens keep growing across the change, and raised there if it
 * already existed. Runs on a lock session (each DDL commits at once).
 */
static int setup_seq(struct mysql_conn *mc, struct session *s)
{
    static const char what[] = "cannot create the lock table or sequence";
    char sql[512];
    MYSQL_RES *res = NULL;
    uint64_t max = 0;
    struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
    /* Also reads the durable mark (seq_durable): tokens below it need no
     * check. */
    snprintf(sql, sizeof sql,
             "SELECT (SELECT MAX(token) FROM `%s` WHERE k = " FLOOR_K " AND owner = ''"
             " AND session_id = 0 AND acquired_at IS NOT NULL), next_not_cached_value"
             " FROM `%s_seq`", mc->table, mc->table);
    int err = mc_query_result(mc, s, sql, &b, "checking the lock table", &res);
    if (err == 0) {
        MYSQL_ROW row = mysql_fetch_row(res);
        mc->durable = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
        mysql_free_result(res);
        return 0;
    }
    if (s->dead || (s->last_errno != ER_NO_SUCH_TABLE && s->last_errno != ER_BAD_FIELD_ERROR &&
                    s->last_errno != ERR_UNKNOWN_SEQUENCE))
        return err;
    dlock_clearerr(cl(mc));
    const char *ddl[] = {mc_create_sql[0], add_columns_sql};
    for (size_t i = 0; i < sizeof ddl / sizeof ddl[0]; i++) {
        char *q = mc_with_table(ddl[i], mc->table);
        if (!q)
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
        err = mc_exec_sql(mc, s, q, NULL, what);
        free(q);
        if (err && i == 1 && !s->dead && s->last_errno == ER_LOCK_WAIT_TIMEOUT)
            return dlock_seterr(cl(mc), DLOCK_ESTORE,
                                "mysql %s: token=sequence adds columns to %s, which waits for"
                                " every lock held in it: gave up after 1 s; open it again once"
                                " no lock is held (token=table clients stopped)",
                                mc->where, mc->table);
        if (err)
            return err;
    }
    snprintf(sql, sizeof sql, "SELECT COALESCE(MAX(token), 0) FROM `%s_grants`", mc->table);
    b = mc_stmt_bound(NULL, mc->timeout_ms);
    if ((err = mc_query_result(mc, s, sql, &b, what, &res)) == 0) {
        MYSQL_ROW row = mysql_fetch_row(res);
        max = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
        mysql_free_result(res);
    } else if (!s->dead && s->last_errno == ER_NO_SUCH_TABLE) {
        dlock_clearerr(cl(mc)); /* a new store */
    } else {
        return err;
    }
    if (max >= SEQ_MAX)
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: %s_grants holds a token (%" PRIu64 ") beyond what a"
                            " MariaDB sequence can exceed: use token=table", mc->where,
                            mc->table, max);
    snprintf(sql, sizeof sql,
             "CREATE SEQUENCE IF NOT EXISTS `%s_seq` START WITH %" PRIu64 " MINVALUE 1"
             " MAXVALUE %llu INCREMENT BY 1 CACHE %d NOCYCLE ENGINE=InnoDB"
             " COMMENT='dlock: fencing tokens of every name (token=sequence)'",
             mc->table, max + 1, SEQ_MAX, SEQ_CACHE);
    if ((err = mc_exec_sql(mc, s, sql, NULL, what)) != 0 || max == 0)
        return err;
    snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %" PRIu64 ")", mc->table, max);
    b = mc_stmt_bound(NULL, mc->timeout_ms);
    if ((err = mc_query_result(mc, s, sql, &b, what, &res)) != 0)
        return err;
    mysql_free_result(res);
    return mc_seq_checkpoint(mc, NULL, &max); /* on disk: see mc_seq_durable */
}

/* A floor the sequence can take: the next grant takes the value after it. */
int mc_seq_floor_check(struct mysql_conn *mc, uint64_t floor)
{
    if (floor > SEQ_FLOOR_MAX)
        return dlock_seterr(cl(mc), DLOCK_EINVAL,
                            "mysql: token=sequence: a MariaDB sequence is a signed BIGINT up to"
                            " 2^63 - 2, and the next grant takes the value after the floor: a"
                            " floor must be at most 2^63 - 3 (%" PRIu64 ")",
                            (uint64_t)SEQ_FLOOR_MAX);
    return 0;
}

/* token_top (token=sequence, lock=named): the sequence's
 * next_not_cached_value - 1 (see mysql_row.c's table_token_top for both). */
int mc_seq_token_top(struct mysql_conn *mc, uint64_t *top)
{
    static const char what[] = "reading the highest token";
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    char sql[160];
    uint64_t next = 0;
    int null = 0, err;
    snprintf(sql, sizeof sql, "SELECT next_not_cached_value FROM `%s_seq`", mc->table);
    if ((err = mc_ctl_query_u64(mc, sql, &call, what, &next, &null)) != 0)
        return err;
    *top = next > 0 ? next - 1 : 0;
    return 0;
}

/* raise_floor (token=sequence, lock=named): SETVAL(seq, floor), then the
 * durable mark past it (see mysql_row.c's table_raise_floor for both). */
int mc_seq_raise_floor(struct mysql_conn *mc, uint64_t floor)
{
    static const char what[] = "raising the store's token floor";
    unsigned long long f = floor;
    char sql[160];
    uint64_t v;
    int null, err;
    if ((err = mc_seq_floor_check(mc, floor)) != 0)
        return err;
    if (floor == 0)
        return 0; /* every token is above 0 */
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %llu)", mc->table, f);
    if ((err = mc_ctl_query_u64(mc, sql, &call, what, &v, &null)) != 0 ||
        (err = mc_seq_checkpoint(mc, &call, &v)) != 0) /* on disk: see mc_seq_durable */
        return err;
    if (v > mc->durable)
        mc->durable = v;
    return 0;
}

/* Connects the first session of a store with a sequence, s (role
 * ROLE_ROW or ROLE_NAMED; left disconnected on failure), and sets up the
 * store on it: MariaDB 10.3 or later only (what names the mode in the
 * refusal). The control session, when opened, reads at READ UNCOMMITTED
 * (inspect reads the holders' uncommitted grants). */
int mc_seq_open(struct mysql_conn *mc, enum session_role role, const char *what,
                struct session *s)
{
    int err;
    mc->ctl_isolation = "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED";
    if ((err = mc_session_connect(mc, role, NULL, s)) != 0)
        return err;
    mc->mariadb = strstr(mysql_get_server_info(s->db), "MariaDB") != NULL;
    if (!mc->mariadb || mysql_get_server_version(s->db) < 100300) {
        mc_session_disconnect(s);
        return dlock_seterr(cl(mc), DLOCK_ENOTSUP,
                            "mysql %s: %s needs MariaDB 10.3 or later (MySQL has no sequences):"
                            " use token=table", mc->where, what);
    }
    if ((err = setup_seq(mc, s)) != 0) {
        mc_session_disconnect(s);
        return err;
    }
    return 0;
}

/*
 * The store's token mode: a row of <table> with the key MODE_K (no name's
 * SHA-256 is 0...01), its name 'dlock: token=table' or 'dlock:
 * token=sequence', written when the store is created and moved by a
 * raise_floor (dlock migrate). Read at open on a session of its own, so
 * that every client follows it and the two modes never meet on a store.
 */
#define MODE_K "X'0000000000000000000000000000000000000000000000000000000000000001'"
static const char *const mode_names[3] = {"", "dlock: token=table", "dlock: token=sequence"};

static int mode_session(struct mysql_conn *mc, struct session *s)
{
    int err = mc_session_connect(mc, ROLE_CTL, NULL, s);
    if (err == 0)
        mc->mariadb = strstr(mysql_get_server_info(s->db), "MariaDB") != NULL &&
                      mysql_get_server_version(s->db) >= 100300;
    return err;
}

/* mc->store_mode, and *exists: <table> is there (a new store if not). Also
 * sets mc->mariadb: the server has sequences (MariaDB 10.3 or later). */
int mc_store_mode(struct mysql_conn *mc, int *exists)
{
    char sql[256];
    struct session s;
    MYSQL_RES *res = NULL;
    struct bound b = mc_stmt_bound(NULL, mc->timeout_ms);
    int err;
    *exists = 1;
    mc->store_mode = 0;
    if ((err = mode_session(mc, &s)) != 0)
        return err;
    snprintf(sql, sizeof sql, "SELECT name FROM `%s` WHERE k = " MODE_K, mc->table);
    if ((err = mc_query_result(mc, &s, sql, &b, "reading the store's token mode", &res)) == 0) {
        MYSQL_ROW row = mysql_fetch_row(res);
        for (int m = 1; row && row[0] && m <= 2; m++)
            if (strcmp(row[0], mode_names[m]) == 0)
                mc->store_mode = m;
        mysql_free_result(res);
    } else if (!s.dead && s.last_errno == ER_NO_SUCH_TABLE) {
        dlock_clearerr(cl(mc));
        *exists = 0;
        err = 0;
    }
    mc_session_disconnect(&s);
    return err;
}

/* Records mode as the store's: only where none is recorded yet, unless
 * replace (a raise_floor: dlock migrate moves the store). Then reads it
 * back into mc->store_mode (two clients creating a store race). */
int mc_store_mode_record(struct mysql_conn *mc, int mode, int replace)
{
    char sql[512];
    struct session s;
    int err, exists;
    if ((err = mode_session(mc, &s)) != 0)
        return err;
    snprintf(sql, sizeof sql,
             "INSERT INTO `%s` (k, name, created_at) VALUES (" MODE_K ", '%s', UTC_TIMESTAMP(6))"
             " ON DUPLICATE KEY UPDATE name = %s, created_at = UTC_TIMESTAMP(6)",
             mc->table, mode_names[mode], replace ? "VALUES(name)" : "name");
    err = mc_exec_sql(mc, &s, sql, NULL, "recording the store's token mode");
    mc_session_disconnect(&s);
    if (err)
        return err;
    return mc_store_mode(mc, &exists);
}
