/*
 * PostgreSQL's inspect: what pg_locks and pg_stat_activity tell of a
 * name's holders and waiters, read on an idle pooled session without
 * taking any lock (see "Inspect" in postgres.c). It calls only the
 * statement layer (postgres_io.c) below it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/postgres_int.h"

/* Reads the tag of a statement on a holder session (see tag()) at the
 * start of q: the owner id, the session's lease, the token when the
 * statement names it, and the key of the lock it is for (*has_key = 0 for
 * a tag without one: one lock per session, as dlock before issue 13
 * wrote them). 1 when q starts with a whole tag. */
static int read_tag(const char *q, char owner[33], uint32_t *ttl_ms, uint64_t *token,
                    int64_t *key, int *has_key)
{
    size_t h = sizeof TAG_HEAD - 1;
    char *end;
    if (strncmp(q, TAG_HEAD, h) != 0 || strspn(q + h, "0123456789abcdef") != 32 ||
        strncmp(q + h + 32, " ttl=", 5) != 0)
        return 0;
    memcpy(owner, q + h, 32);
    owner[32] = '\0';
    q += h + 37;
    if (*q < '0' || *q > '9')
        return 0;
    unsigned long long v = strtoull(q, &end, 10);
    if (v > TTL_MAX)
        return 0;
    *ttl_ms = (uint32_t)v;
    *token = 0;
    *has_key = 0;
    if (strncmp(end, " token=", 7) == 0) {
        q = end + 7;
        if (*q < '0' || *q > '9')
            return 0;
        *token = strtoull(q, &end, 10);
    }
    if (strncmp(end, " key=", 5) == 0) {
        q = end + 5;
        if (*q != '-' && (*q < '0' || *q > '9'))
            return 0;
        *key = strtoll(q, &end, 10);
        *has_key = 1;
    }
    return strncmp(end, "*/", 2) == 0;
}

/* Is the statement at the start of q tagged, and for the lock key? A
 * session's latest statement may be for another of the locks it holds. */
static int tag_for(const char *q, int64_t key, char owner[33], uint32_t *ttl_ms, uint64_t *token,
                   int *tagged)
{
    int64_t k = 0;
    int has_key = 0;
    *tagged = read_tag(q, owner, ttl_ms, token, &k, &has_key);
    return *tagged && (!has_key || k == key);
}

/* What the store knows a session by: its owner id from its statements'
 * tag when the latest statement is for this key, else its pid and client
 * address (pg_stat_activity shows those only to the same role or
 * pg_read_all_stats). */
static void session_name(const PGresult *r, int row, int64_t key, char *buf, size_t len)
{
    char owner[33];
    uint32_t ttl;
    uint64_t token;
    int tagged;
    const char *pid = PQgetvalue(r, row, 1);
    if (!PQgetisnull(r, row, 4) && tag_for(PQgetvalue(r, row, 4), key, owner, &ttl, &token, &tagged))
        snprintf(buf, len, "%s", owner);
    else if (!PQgetisnull(r, row, 5))
        snprintf(buf, len, "pid %s (client %s:%s)", pid, PQgetvalue(r, row, 5),
                 PQgetvalue(r, row, 6));
    else if (!PQgetisnull(r, row, 6) && strcmp(PQgetvalue(r, row, 6), "-1") == 0)
        snprintf(buf, len, "pid %s (unix socket)", pid);
    else
        snprintf(buf, len, "pid %s", pid);
}

/*
 * inspect: one read-only statement on an idle pooled session, bounded by
 * `timeout` on the server (lock_timeout, statement_timeout) and a little
 * longer on the client. It reads the name's advisory lock in pg_locks
 * (this database's; granted: the holder; not granted: the waiters, in
 * waitstart order, PostgreSQL 14 and later), each session's
 * pg_stat_activity row (state, state_change, the start of its query:
 * the tag, the client address), and with token=table the name's row of
 * the fencing table (a plain read: no row lock, no wait for a holder's
 * bump). It takes no advisory or row lock.
 */
int dlock_pg_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    char sql[1400], settings[256], token_sql[160], state[6];
    PGresult *r = NULL;
    int64_t key = dlock_pg_key(pc->namespace, name, len);
    uint64_t u = (uint64_t)key;
    int err;
    dlock_pg_tx_settings(settings, sizeof settings, pc->timeout_ms);
    /* Without SELECT on the fencing table (a monitoring role), the rest
     * still tells: asked again without the name's row. */
    int row_readable = !pc->use_sequence;
again:
    if (!row_readable)
        snprintf(token_sql, sizeof token_sql, "NULL::bigint");
    else
        snprintf(token_sql, sizeof token_sql, "(SELECT token FROM %s WHERE key = %" PRId64 ")",
                 pc->table, key);
    /* waitstart (PostgreSQL 14): when each waiter started waiting. */
    int ordered = pc->server_version >= 140000;
    snprintf(sql, sizeof sql,
             "%sSELECT t.token, l.pid, l.granted, a.state, substr(a.query, 1, 120),"
             " host(a.client_addr), a.client_port,"
             " floor(extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint "
             "FROM (SELECT %s AS token) t LEFT JOIN (pg_locks l LEFT JOIN pg_stat_activity a"
             " ON a.pid = l.pid) ON l.locktype = 'advisory' AND l.database = (SELECT oid FROM"
             " pg_database WHERE datname = current_database()) AND l.classid = %" PRIu64
             " AND l.objid = %" PRIu64 " AND l.objsubid = 1 "
             "ORDER BY l.granted DESC%s, l.pid",
             settings, token_sql, u >> 32, u & 0xffffffffu,
             ordered ? ", l.waitstart NULLS LAST" : "");
    if ((err = dlock_pg_run_idle(pc, sql, 4, &r, "inspect", state)) != 0) {
        if (row_readable && strcmp(state, "42501") == 0) {
            row_readable = 0;
            dlock_clearerr(conn->client);
            goto again;
        }
        return dlock_pg_store_failed(pc, err, state, "inspect");
    }
    int rows = PQntuples(r), holder = -1;
    if (rows < 1) {
        PQclear(r);
        return dlock_seterr(conn->client, DLOCK_EPROTO, "postgresql: inspect: no row returned");
    }
    info->known |= DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS;
    if (ordered)
        info->known |= DLOCK_KNOWS_ORDER;
    for (int i = 0; i < rows; i++) {
        if (PQgetisnull(r, i, 1))
            continue; /* no session holds or awaits the lock */
        if (PQgetvalue(r, i, 2)[0] == 't') {
            if (holder < 0)
                holder = i;
            continue;
        }
        if (ordered && info->listed < DLOCK_INFO_LISTED)
            session_name(r, i, key, info->waiter[info->listed++], DLOCK_HOLDER_MAX);
        info->waiters++;
    }
    int have_row = row_readable && !PQgetisnull(r, 0, 0);
    uint64_t row_token = have_row ? strtoull(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    if (holder < 0) {
        /* Free: the name's counter is the last token granted (or the floor
         * a raise_token set it to); no row: none granted yet. */
        if (row_readable) {
            info->last_token = row_token;
            info->known |= DLOCK_KNOWS_LAST_TOKEN;
        }
        PQclear(r);
        return 0;
    }
    info->held = 1;
    info->known |= DLOCK_KNOWS_OWNER;
    session_name(r, holder, key, info->owner, sizeof info->owner);
    char owner[33];
    uint32_t ttl = 0;
    uint64_t token = 0;
    const char *st = PQgetisnull(r, holder, 3) ? "" : PQgetvalue(r, holder, 3);
    /* tagged: a dlock holder session (its lease is the tag's, whichever of
     * its locks the statement was for); mine: the statement was for this
     * lock (its token is this lock's). */
    int tagged = 0;
    int mine = !PQgetisnull(r, holder, 4) &&
               tag_for(PQgetvalue(r, holder, 4), key, owner, &ttl, &token, &tagged);
    if (!mine)
        token = 0;
    if (tagged && strcmp(st, "idle") == 0 && !PQgetisnull(r, holder, 7)) {
        /* The idle timer runs from state_change. */
        long long idle = strtoll(PQgetvalue(r, holder, 7), NULL, 10);
        info->lease_ms = idle < 0 ? ttl : idle >= (long long)ttl ? 0 : ttl - (uint64_t)idle;
        info->known |= DLOCK_KNOWS_LEASE;
    } else if (tagged && strcmp(st, "active") == 0) {
        /* A statement runs: the timer starts again, at ttl, when it ends. */
        info->lease_ms = ttl;
        info->known |= DLOCK_KNOWS_LEASE;
    }
    /* The token: named by the holder's latest statement (renew, raise),
     * else, after its acquire's commit, the name's row, which only the
     * holder writes while it holds. */
    if (tagged && !token && have_row && strcmp(st, "idle") == 0)
        token = row_token;
    if (tagged && token) {
        info->token = info->last_token = token;
        info->known |= DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_LAST_TOKEN;
    }
    PQclear(r);
    return 0;
}

