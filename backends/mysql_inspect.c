/*
 * The MariaDB backend's inspect for row locks (lock=row, both token
 * sources): dlock_inspect and dlock_inspect_holders, from <table>_grants or
 * the lock row's uncommitted grant, <table>_shared's readers and InnoDB's
 * views, on the control session; taking, waiting for and changing nothing.
 * What differs between the token sources is a small table (struct
 * row_view) the mode points to. How: docs/mysql.md, "Inspect". Calls
 * mysql_seq.c and mysql_conn.c only.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysqld_error.h>

#include "config.h"
#include "backends/mysql_int.h"

static const struct row_view *view(const struct mysql_conn *mc)
{
    return mc->mode->view;
}

/*
 * inspect: a text statement on the control session (autocommit, no
 * locking read, no row lock taken or waited for), then for token=table
 * row_locked's NOWAIT read of the row, bounded by `timeout` together.
 * The first is a UNION ALL of:
 *
 *  'g' the name's row of <table>_grants (a consistent read): token,
 *      owner and the grant's age;
 *  'p' COUNT(*) of INNODB_TRX, read whatever the grants say, so that a
 *      user without the PROCESS privilege always gets error 1227 rather
 *      than a "free" that was never seen;
 *  'w' (MariaDB) the transactions in LOCK WAIT for the name's row, a
 *      shared or an exclusive lock (INNODB_LOCKS' record), whose session is
 *      still running its lock statement (information_schema.PROCESSLIST
 *      is live, the InnoDB views are a snapshot up to 0.1 s old: a waiter
 *      that gave up is not counted), in queue order: by the number of
 *      transactions each waits behind (the holder and the waiters queued
 *      before it), then trx_wait_started and trx_id.
 */
/* InnoDB's views are a snapshot refreshed when read at most every 0.1 s
 * (trx_i_s_cache): a grant recorded less than this long ago may not be in
 * it yet. */
#define VIEWS_AGE_MS "120"

/* 'w': the sessions waiting for the name's row (their requested lock's
 * record, lock_data, is the row's key; trx_id cannot tell them apart: a
 * transaction that has only read, a reader's, shows 0), still running the
 * statement that matches info (see above). */
#define INSPECT_WAITERS(info)                                                                     \
    " UNION ALL SELECT 'w', w.trx_mysql_thread_id, w.trx_id,"                                      \
    " (SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS q"                               \
    " WHERE q.requesting_trx_id = w.trx_id), w.trx_wait_started"                                 \
    " FROM information_schema.INNODB_TRX w WHERE w.trx_state = 'LOCK WAIT' AND EXISTS (SELECT 1"   \
    " FROM information_schema.INNODB_LOCKS r WHERE r.lock_id = w.trx_requested_lock_id AND"       \
    " r.lock_table = CONCAT('`', DATABASE(), '`.`%s`') AND r.lock_data = '0x%s')"                  \
    " AND EXISTS (SELECT 1 FROM information_schema.PROCESSLIST p"                                  \
    " WHERE p.ID = w.trx_mysql_thread_id AND p.COMMAND IN ('Query', 'Execute') AND " info ")"

/*
 * token=sequence's inspect statement, read on the control session at READ
 * UNCOMMITTED: the holder's grant is the lock row's uncommitted owner,
 * token, session and time (a release rolls them back to '' and 0: a row
 * with an owner has a live holder); 'p' as above; 'w' as above, the holder's
 * transaction found by the row's session_id, the waiters' sessions running
 * the locking UPDATE (its NEXTVAL names the sequence).
 */
static int inspect_seq_sql(struct mysql_conn *mc, const char *kx, int mariadb, char *sql,
                           size_t size)
{
    (void)mariadb; /* token=sequence is MariaDB's only */
    const char *t = mc->table;
    return snprintf(sql, size,
                    "SELECT 'g' AS x, l.token AS a, l.owner AS b, l.session_id AS c,"
                    " GREATEST(0, " VIEWS_AGE_MS " - TIMESTAMPDIFF(MICROSECOND, l.acquired_at,"
                    " UTC_TIMESTAMP(6)) DIV 1000) AS d FROM `%s` l"
                    " WHERE l.k = X'%s' AND l.owner <> ''"
                    " UNION ALL SELECT 'p', COUNT(*), NULL, NULL, NULL"
                    " FROM information_schema.INNODB_TRX"
                    INSPECT_WAITERS("p.INFO LIKE '%%NEXTVAL(`%s_seq`)%%'"),
                    t, kx, t, kx, t);
}

/* token=table's inspect statement (see above): 'g', 'p', and on MariaDB
 * 'w'. */
static int inspect_table_sql(struct mysql_conn *mc, const char *kx, int mariadb, char *sql,
                             size_t size)
{
    int n = snprintf(sql, size,
                     /* c: held is row_locked's, not the views' (below) */
                     "SELECT 'g' AS x, g.token AS a, g.owner AS b, NULL AS c,"
                     " GREATEST(0, " VIEWS_AGE_MS " - TIMESTAMPDIFF(MICROSECOND, g.acquired_at,"
                     " UTC_TIMESTAMP(6)) DIV 1000) AS d FROM `%s_grants` g WHERE g.k = X'%s'"
                     " UNION ALL SELECT 'p', COUNT(*), NULL, NULL, NULL"
                     " FROM information_schema.INNODB_TRX",
                     mc->table, kx);
    if (mariadb && n > 0 && (size_t)n < size)
        n += snprintf(sql + n, size - n,
                      INSPECT_WAITERS("(p.INFO LIKE '%%FOR UPDATE' OR"
                                      " p.INFO LIKE '%%LOCK IN SHARE MODE')"),
                      mc->table, kx);
    return n;
}

/*
 * token=table's held: whether the name's row is locked, asked of the row
 * itself, live (InnoDB's views are a snapshot that is not refreshed while
 * anybody read it in the last 0.1 s: a client inspecting in a loop, or
 * two, keep it stale for as long as they go on). A shared locking read
 * with NOWAIT in the control session's autocommit: refused at once when a
 * holder's (or a queued waiter's) exclusive lock is there, and when the
 * row is free a shared lock for the statement's own moment, which no
 * other inspect conflicts with and which a lock statement arriving then
 * waits out (microseconds; it queues no one and passes no one).
 */
static int row_locked(struct mysql_conn *mc, struct session *ctl, const char *kx, int mariadb,
                      const struct bound *b, int *locked)
{
    char sql[256];
    MYSQL_RES *res = NULL;
    snprintf(sql, sizeof sql, "SELECT 1 FROM `%s` WHERE k = X'%s' %s", mc->table, kx,
             mariadb ? "LOCK IN SHARE MODE NOWAIT" : "FOR SHARE NOWAIT");
    int err = mc_query_result(mc, ctl, sql, b, "inspect", &res);
    *locked = 0;
    if (err == 0) {
        mysql_free_result(res);
        return 0;
    }
    if (!ctl->dead && (ctl->last_errno == ER_LOCK_WAIT_TIMEOUT || ctl->last_errno == ERR_LOCK_NOWAIT)) {
        dlock_clearerr(cl(mc));
        *locked = 1;
        return 0;
    }
    return err;
}

/* Adds the requests for permits of the name whose key is k to info's
 * waiters: the one at its gate and those queued for it (GET_LOCK). */
static int permit_waiters(struct mysql_conn *mc, const unsigned char *k, struct bound *call,
                          dlock_info *info)
{
    char gate[65], sql[320];
    uint64_t n = 0;
    int isnull = 0;
    mc_gate_name(mc, k, gate);
    snprintf(sql, sizeof sql,
             "SELECT (IS_USED_LOCK('%s') IS NOT NULL) + (SELECT COUNT(*) FROM"
             " information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT GET_LOCK(''%s''%%')",
             gate, gate);
    int err = mc_ctl_query_u64(mc, sql, call, "inspect", &n, &isnull);
    if (err == 0)
        info->waiters += (uint32_t)n;
    return err;
}

int mc_row_inspect(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info)
{
    static const char what[] = "inspect";
    static const char hexd[] = "0123456789abcdef";
    unsigned char k[DLOCK_SHA256_LEN];
    char kx[2 * DLOCK_SHA256_LEN + 1], sql[3072];
    struct session *ctl;
    MYSQL_RES *res = NULL;
    int err = 0;
    dlock_sha256(name, len, k);
    for (size_t i = 0; i < DLOCK_SHA256_LEN; i++) {
        kx[2 * i] = hexd[k[i] >> 4];
        kx[2 * i + 1] = hexd[k[i] & 15];
    }
    kx[sizeof kx - 1] = '\0';
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    for (int tries = 0, again = 0; tries < 2; tries++) {
    retry:
        if ((err = mc_ctl_session(mc, &call, &ctl)) != 0)
            goto failed;
        /* MySQL 8 has no INNODB_LOCK_WAITS (performance_schema's
         * data_lock_waits instead): no waiters there. */
        int mariadb = strstr(mysql_get_server_info(ctl->db), "MariaDB") != NULL;
        int n = view(mc)->inspect_sql(mc, kx, mariadb, sql, sizeof sql);
        if (n > 0 && (size_t)n < sizeof sql)
            n += snprintf(sql + n, sizeof sql - n, " ORDER BY x, c, d, b");
        if (n <= 0 || (size_t)n >= sizeof sql)
            return dlock_seterr(cl(mc), DLOCK_EINVAL, "mysql: inspect: statement too long");
        if ((err = mc_query_result(mc, ctl, sql, &call, what, &res)) != 0) {
            if (!ctl->dead && ctl->last_errno == ER_SPECIFIC_ACCESS_DENIED_ERROR)
                return dlock_seterr(cl(mc), DLOCK_ENOTSUP,
                                    "mysql %s: inspecting MySQL locks needs the PROCESS privilege"
                                    " (information_schema.INNODB_TRX); grant it with"
                                    " GRANT PROCESS ON *.* TO user", mc->where);
            goto failed;
        }
        uint64_t token = 0, young = 0;
        int granted = 0, held = 0, seen = 0;
        char owner[33] = "";
        info->waiters = 0;
        info->listed = 0;
        for (MYSQL_ROW row; (row = mysql_fetch_row(res)) != NULL;) {
            if (!row[0])
                continue;
            if (row[0][0] == 'g' && row[1] && row[2]) {
                granted = 1;
                token = strtoull(row[1], NULL, 10);
                snprintf(owner, sizeof owner, "%s", row[2]);
                held = row[3] != NULL;
                young = row[4] ? strtoull(row[4], NULL, 10) : 0;
            } else if (row[0][0] == 'p') {
                seen = 1;
            } else if (row[0][0] == 'w' && row[1]) {
                if (info->listed < DLOCK_INFO_LISTED)
                    snprintf(info->waiter[info->listed++], DLOCK_HOLDER_MAX, "session %s", row[1]);
                info->waiters++;
            }
        }
        mysql_free_result(res);
        /* The grant was recorded after the views' snapshot may have been
         * taken: read them again once the snapshot has expired. */
        if (young && !again && dlock_monotonic_ns() + 110 * MS < call.until) {
            again = 1;
            /* 0.1 s without reads refreshes it */
            if ((err = mc_pause_ms(mc, 110, call.until, -1)) != 0)
                return dlock_seterr(cl(mc), err, "mysql %s: inspect: interrupted", mc->where);
            memset(info->waiter, 0, sizeof info->waiter);
            goto retry;
        }
        if (!seen)
            return dlock_seterr(cl(mc), DLOCK_EPROTO,
                                "mysql %s: inspect: information_schema.INNODB_TRX gave no count",
                                mc->where);
        /* token=table: held is the row's lock, the grant the latest
         * recorded (the views above only find the holder's transaction
         * for the waiters it blocks). */
        if (view(mc)->held && (err = view(mc)->held(mc, ctl, kx, mariadb, &call, &held)) != 0)
            goto failed;
        /* Readers: held, and the newest one's grant is told. */
        dlock_holder last;
        size_t readers = 0;
        if ((err = mc_shared_read(mc, ctl, kx, &call, NULL, 0, &readers, &last)) != 0)
            goto failed;
        /* Permits' waiters: at the gate (it looks for a free permit) and
         * queued for it. */
        if (mariadb && (err = permit_waiters(mc, k, &call, info)) != 0)
            goto failed;
        if (readers) {
            held = granted = 1;
            token = last.token;
            snprintf(owner, sizeof owner, "%.32s", last.owner);
        }
        /* token=sequence keeps no token of a free name (one sequence for
         * every name; a grant is never committed). */
        info->known |= DLOCK_KNOWS_HELD | view(mc)->known;
        info->held = held;
        info->last_token = granted && (view(mc)->known & DLOCK_KNOWS_LAST_TOKEN) ? token : 0;
        if (held && granted) {
            info->token = token;
            info->known |= DLOCK_KNOWS_TOKEN;
            if (strlen(owner) == 32) {
                snprintf(info->owner, sizeof info->owner, "%s", owner);
                info->known |= DLOCK_KNOWS_OWNER;
            }
        }
        if (mariadb)
            info->known |= DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_ORDER;
        return 0;
    failed:
        if (!mc_ctl_dropped(mc))
            return err;
    }
    return err;
}

/* Every holder: the readers of <table>_shared, else the one inspect tells. */
int mc_row_inspect_holders(struct mysql_conn *mc, const char *name, size_t len,
                               dlock_holder *holders, size_t capacity, size_t *count)
{
    unsigned char k[DLOCK_SHA256_LEN];
    char kx[2 * DLOCK_SHA256_LEN + 1];
    struct session *ctl;
    dlock_holder last;
    dlock_info info;
    int err = 0;
    dlock_sha256(name, len, k);
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    for (int tries = 0; tries < 2; tries++) {
        if ((err = mc_ctl_session(mc, &call, &ctl)) == 0 &&
            (err = mc_shared_read(mc, ctl, kx, &call, holders, capacity, count, &last)) == 0)
            break;
        if (!mc_ctl_dropped(mc))
            return err;
    }
    if (err || *count)
        return err;
    memset(&info, 0, sizeof info);
    info.version = DLOCK_INFO_VERSION;
    if ((err = mc_row_inspect(mc, name, len, &info)) != 0)
        return err;
    return mc_one_holder(&info, holders, capacity, count);
}

const struct row_view mc_table_view = {
    .inspect_sql = inspect_table_sql,
    .held = row_locked,
    .known = DLOCK_KNOWS_LAST_TOKEN,
    .grant_table = "_grants",
    .grant_live = "",
};

const struct row_view mc_seq_view = {
    .inspect_sql = inspect_seq_sql,
    .grant_table = "",
    .grant_live = " AND g.owner <> ''",
};
