/*
 * The MariaDB backend's elections (docs/mysql.md, "Elections"): the
 * leaders' table <table>_leaders, one row per election with the value its
 * leader published and that grant's token and session; the statement each
 * mode's publish runs on the holder's own session; the read leader() makes
 * of it. Used by mysql_row.c and mysql_named.c; calls mysql_conn.c and,
 * through the mode's row_view, mysql_inspect.c only.
 *
 * lock=row: publish writes the row in the holder's lock transaction and
 * never commits it, as a reader's <table>_shared row: it exists, for READ
 * UNCOMMITTED readers, exactly while the grant holds (a release, a dropped
 * session, a killed client roll it back), and it is written only if the
 * lock's session still answers, which proves the row lock as renew does.
 * lock=named: a user lock needs no transaction, so the row is committed,
 * by one statement that writes only while IS_USED_LOCK names the writing
 * session; leader() shows it only while IS_USED_LOCK names that session.
 *
 * No notification: the core's observers read leader() every
 * DLOCK_OBSERVE_POLL_MS, one or two statements on the control session.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysqld_error.h>

#include "config.h"
#include "backends/mysql_int.h"

static const char create_sql[] =
    "CREATE TABLE IF NOT EXISTS `@T_leaders` ("
    " k BINARY(32) NOT NULL PRIMARY KEY COMMENT 'SHA-256 of the election (lock=named: of its"
    " user lock)',"
    " token BIGINT UNSIGNED NOT NULL COMMENT 'the publishing grant''s token: its term',"
    " session_id BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of the holding session',"
    " owner CHAR(32) CHARACTER SET ascii NOT NULL COMMENT 'lock=named: the owner id (lock=row:"
    " in the grant)',"
    " ttl_ms INT UNSIGNED NOT NULL COMMENT 'the lease: wait_timeout from the session''s last"
    " statement',"
    " value VARBINARY(1024) NOT NULL COMMENT 'the published value'"
    ") ENGINE=InnoDB COMMENT='dlock: leaders'' values (lock=row: uncommitted rows of the"
    " holders'' transactions)'";

int mc_elect_table(struct mysql_conn *mc)
{
    struct bound b = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1},
                 *call = &b;
    struct session *ctl;
    char *sql = mc_with_table(create_sql, mc->table);
    int err = DLOCK_ENOMEM;
    if (!sql)
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    for (int tries = 0; tries < 2; tries++) {
        if ((err = mc_ctl_session(mc, call, &ctl)) == 0 &&
            (err = mc_exec_sql(mc, ctl, sql, call, "cannot create the leaders' table")) == 0)
            break;
        if (!mc_ctl_dropped(mc))
            break;
    }
    free(sql);
    return err;
}

int mc_elect_publish(struct mysql_conn *mc, struct session *s, const struct elect_pub *p,
                     const struct bound *b, int *no_table)
{
    char kx[2 * DLOCK_SHA256_LEN + 1];
    size_t size = 384 + strlen(mc->table) + strlen(p->guard) + 2 * p->len;
    char *sql = malloc(size), *vx = malloc(2 * p->len + 1);
    int err;
    if (!sql || !vx) {
        free(sql);
        free(vx);
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    }
    dlock_hex(p->k, DLOCK_SHA256_LEN, kx);
    dlock_hex(p->value, p->len, vx);
    snprintf(sql, size,
             "INSERT INTO `%s_leaders` (k, token, session_id, owner, ttl_ms, value) SELECT X'%s',"
             " %" PRIu64 ", CONNECTION_ID(), '%.32s', %" PRIu32 ", X'%s' FROM DUAL%s ON DUPLICATE"
             " KEY UPDATE token = VALUES(token), session_id = VALUES(session_id), owner ="
             " VALUES(owner), ttl_ms = VALUES(ttl_ms), value = VALUES(value)",
             mc->table, kx, p->token, p->owner, p->ttl_ms, vx, p->guard);
    err = mc_run(mc, s, NB_QUERY, NULL, sql, b, "publish");
    free(sql);
    free(vx);
    /* A second time (*no_table set: the table was just made), an error. */
    if (!*no_table && (*no_table = err && !s->dead && s->last_errno == ER_NO_SUCH_TABLE)) {
        dlock_clearerr(cl(mc));
        return 0;
    }
    return err;
}

void mc_elect_lease(const char *ttl_ms, dlock_info *info)
{
    if (!ttl_ms)
        return;
    info->lease_ms = strtoull(ttl_ms, NULL, 10);
    info->known |= DLOCK_KNOWS_LEASE;
}

int mc_elect_publish_on(struct mysql_conn *mc, struct session *s, const struct elect_pub *p,
                        const struct bound *b)
{
    int no_table = 0, err = mc_elect_publish(mc, s, p, b, &no_table);
    if (err == 0 && no_table && (err = mc_elect_table(mc)) == 0)
        err = mc_elect_publish(mc, s, p, b, &no_table);
    return err;
}

int mc_elect_read(struct mysql_conn *mc, const char *sql, struct bound *call,
                  struct session **ctlp, MYSQL_RES **res)
{
    static const char what[] = "leader";
    int err = 0;
    *res = NULL;
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl;
        if ((err = mc_ctl_session(mc, call, &ctl)) == 0) {
            *ctlp = ctl;
            /* lock=row's values are uncommitted: token=table's control
             * session reads committed rows but for this one statement. */
            if (mc->ctl_isolation ||
                (err = mc_exec_sql(mc, ctl, "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
                                   call, what)) == 0)
                err = mc_query_result(mc, ctl, sql, call, what, res);
            if (err == 0)
                return 0;
            if (!ctl->dead && !mc->ctl_isolation) {
                dlock_errsave why;
                dlock_err_save(cl(mc), &why);
                int reset = mc_exec_sql(mc, ctl, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
                                        call, what);
                dlock_err_restore(cl(mc), &why);
                if (reset)
                    return reset;
            }
            if (!ctl->dead && ctl->last_errno == ER_NO_SUCH_TABLE)
                return err;
        }
        if (!mc_ctl_dropped(mc))
            return err;
    }
    return err;
}

void mc_elect_value(MYSQL_RES *res, MYSQL_ROW row, int col, char *value, size_t *value_len)
{
    unsigned long *lens = mysql_fetch_lengths(res);
    size_t n = row[col] && lens ? lens[col] : 0;
    if (n > DLOCK_VALUE_MAX)
        n = 0; /* not a value dlock wrote */
    if (n)
        memcpy(value, row[col], n);
    value[n] = '\0';
    *value_len = n;
}

/*
 * lock=row's leader(): one statement (token=table: two, its control
 * session reading committed rows otherwise) reads the grant and, at READ
 * UNCOMMITTED, the value row of the grant's session: a value row means its
 * transaction is open, i.e. the row lock held; its token is the term (the
 * grant's, or the floor a list of stores raised it to). Without one, token=table
 * asks the row whether it is locked (the view's held, as inspect does);
 * token=sequence's grant is the lock row's own uncommitted one. No
 * waiters (inspect's views cost a scan of every transaction): an observer
 * reads this ten times a second. The lease: the TTL published, the most
 * the holder can have left (the server ends its session wait_timeout after
 * its last statement; the session's idle time is in PROCESSLIST, whose
 * read would triple the cost).
 */
int mc_elect_row_leader(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info,
                        char *value, size_t *value_len)
{
    const struct row_view *v = mc->mode->view;
    unsigned char k[DLOCK_SHA256_LEN];
    char kx[2 * DLOCK_SHA256_LEN + 1], sql[640], owner[33] = "";
    struct session *ctl = NULL;
    MYSQL_RES *res = NULL;
    uint64_t token = 0;
    int granted = 0, published = 0, held = 0;
    *value_len = 0;
    dlock_sha256(name, len, k);
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    snprintf(sql, sizeof sql,
             "SELECT g.token, g.owner, v.token, v.value, v.ttl_ms FROM `%s%s` g LEFT JOIN"
             " `%s_leaders` v ON v.k = g.k AND v.session_id = g.session_id WHERE g.k = X'%s'%s",
             mc->table, v->grant_table, mc->table, kx, v->grant_live);
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    int err = mc_elect_read(mc, sql, &call, &ctl, &res);
    if (err && ctl && !ctl->dead && ctl->last_errno == ER_NO_SUCH_TABLE) {
        dlock_clearerr(cl(mc)); /* nothing was ever published in this store */
        return mc->mode->inspect(mc, name, len, info);
    }
    if (err)
        return err;
    MYSQL_ROW row = mysql_fetch_row(res);
    if (row && row[0] && row[1]) {
        granted = 1;
        token = strtoull(row[0], NULL, 10);
        snprintf(owner, sizeof owner, "%s", row[1]);
        if ((published = row[2] != NULL) != 0) {
            /* its term: a list's (a token raised after the grant) */
            token = strtoull(row[2], NULL, 10) > token ? strtoull(row[2], NULL, 10) : token;
            mc_elect_value(res, row, 3, value, value_len);
            mc_elect_lease(row[4], info);
        }
    }
    mysql_free_result(res);
    held = granted;
    if (granted && !published && v->held &&
        (err = v->held(mc, ctl, kx, mc->mariadb, &call, &held)) != 0) {
        mc_ctl_dropped(mc);
        return err;
    }
    info->known |= DLOCK_KNOWS_HELD | (v->known & DLOCK_KNOWS_LAST_TOKEN);
    info->held = held;
    info->last_token = granted && (v->known & DLOCK_KNOWS_LAST_TOKEN) ? token : 0;
    if (held) {
        info->token = token;
        info->known |= DLOCK_KNOWS_TOKEN;
        if (strlen(owner) == 32) {
            snprintf(info->owner, sizeof info->owner, "%s", owner);
            info->known |= DLOCK_KNOWS_OWNER;
        }
    } else {
        *value_len = 0;
        info->known &= ~(unsigned)DLOCK_KNOWS_LEASE;
        info->lease_ms = 0;
    }
    return 0;
}
