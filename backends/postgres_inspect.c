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

/* What one holder's row tells (columns 1 pid, 3 state, 4 query, 5 and 6
 * the client's address, 7 ms idle): its owner (the tag's owner id, else
 * the session's name), its lease, and its token as the tag names it, or,
 * for a holder that took it last (an exclusive one), the name's row. */
struct holder_row {
    char owner[DLOCK_HOLDER_MAX];
    int owner_tagged;   /* owner is the grant's owner id */
    int has_lease;
    uint64_t lease_ms;
    uint64_t token;     /* 0: unknown */
};

static void holder_row(const PGresult *r, int row, int64_t key, int have_row, uint64_t row_token,
                       struct holder_row *out)
{
    char owner[33];
    uint32_t ttl = 0;
    uint64_t token = 0;
    memset(out, 0, sizeof *out);
    session_name(r, row, key, out->owner, sizeof out->owner);
    const char *st = PQgetisnull(r, row, 3) ? "" : PQgetvalue(r, row, 3);
    /* tagged: a dlock holder session (its lease is the tag's, whichever of
     * its locks the statement was for); mine: the statement was for this
     * lock (its token is this lock's). */
    int tagged = 0;
    int mine = !PQgetisnull(r, row, 4) &&
               tag_for(PQgetvalue(r, row, 4), key, owner, &ttl, &token, &tagged);
    out->owner_tagged = mine;
    if (!mine)
        token = 0;
    if (tagged && strcmp(st, "idle") == 0 && !PQgetisnull(r, row, 7)) {
        /* The idle timer runs from state_change. */
        long long idle = strtoll(PQgetvalue(r, row, 7), NULL, 10);
        out->lease_ms = idle < 0 ? ttl : idle >= (long long)ttl ? 0 : ttl - (uint64_t)idle;
        out->has_lease = 1;
    } else if (tagged && strcmp(st, "active") == 0) {
        /* A statement runs: the timer starts again, at ttl, when it ends. */
        out->lease_ms = ttl;
        out->has_lease = 1;
    }
    /* The token: named by the holder's latest statement (renew, raise),
     * else, after its acquire's commit, the name's row, which only the
     * holder writes while it holds. */
    if (tagged && !token && have_row && strcmp(st, "idle") == 0)
        token = row_token;
    if (tagged)
        out->token = token;
}

static int newest_holder(struct pg_conn *pc, const char *name, size_t len, dlock_info *info);

/* leader(): where the value goes, and how much room it has. */
struct pg_value {
    char *buf;   /* DLOCK_VALUE_MAX + 1 bytes */
    size_t *len; /* 0: none (the holder published none) */
};

/* The value's columns (11 ..) of inspect's statement, for the holder row
 * r: the value in hex when the session that published it is the holder's
 * (its pid and its start; a start hidden by privileges is not compared),
 * and the token and owner id of the grant that published it. It is the
 * holder's when those match what the holder is known by: its token and
 * its owner id where inspect tells them (a pooled session may hold the
 * name again for another grant of the same client). */
static void holder_value(const PGresult *r, int row, const dlock_info *info,
                         const struct holder_row *hr, struct pg_value *v)
{
    *v->len = 0;
    if (PQgetisnull(r, row, 11) || PQgetisnull(r, row, 12))
        return;
    uint64_t token = strtoull(PQgetvalue(r, row, 12), NULL, 10);
    if ((info->known & DLOCK_KNOWS_TOKEN) && token != info->token)
        return;
    if (hr->owner_tagged && strcmp(hr->owner, PQgetvalue(r, row, 13)) != 0)
        return;
    const char *hex = PQgetvalue(r, row, 11);
    size_t n = strlen(hex) / 2;
    if (n > DLOCK_VALUE_MAX)
        return;
    for (size_t i = 0; i < n; i++) {
        unsigned b = 0;
        for (int k = 0; k < 2; k++) {
            char ch = hex[2 * i + (size_t)k];
            b = b << 4 | (unsigned)(ch <= '9' ? ch - '0' : ch - 'a' + 10);
        }
        v->buf[i] = (char)b;
    }
    v->buf[n] = '\0';
    *v->len = n;
}

/*
 * inspect: one read-only statement on an idle pooled session, bounded by
 * `timeout` on the server (lock_timeout, statement_timeout) and a little
 * longer on the client. It reads the name's advisory lock in pg_locks
 * (this database's; granted: the holder; not granted, or a semaphore's
 * gate, granted or not: the waiters, in
 * waitstart order, PostgreSQL 14 and later), each session's
 * pg_stat_activity row (state, state_change, the start of its query:
 * the tag, the client address), and with token=table the name's row of
 * the fencing table (a plain read: no row lock, no wait for a holder's
 * bump). It takes no advisory or row lock. leader() (v set) reads the
 * name's row of the values table (postgres_elect.c) in the same statement.
 */
static int inspect_key(struct pg_conn *pc, const char *name, size_t len, dlock_info *info,
                       struct pg_value *v)
{
    dlock_conn *conn = &pc->base;
    char sql[2000], settings[256], token_sql[160], state[6], match[160], gate[160];
    char vjoin[160], vcols[200];
    PGresult *r = NULL;
    int64_t key = 0;
    int err = dlock_pg_layout_key(pc, name, len, &key);
    if (err)
        return err;
    uint64_t u = (uint64_t)key;
    dlock_pg_tx_settings(settings, sizeof settings, pc->timeout_ms);
    /* The name's lock, and a semaphore's gate (none in tooz's layout, whose
     * lock is itself a two-int one). */
    dlock_pg_key_match(pc, key, "l.", match, sizeof match);
    if (pc->layout == PG_LAYOUT_TOOZ)
        snprintf(gate, sizeof gate, "false");
    else
        snprintf(gate, sizeof gate,
                 "l.classid = %" PRIu32 " AND l.objid = %" PRIu64 " AND l.objsubid = 2",
                 (uint32_t)(u >> 32) ^ T_GATE, u & 0xffffffffu);
    vjoin[0] = vcols[0] = '\0';
    if (v) {
        snprintf(vjoin, sizeof vjoin, " LEFT JOIN %s" PG_VALUES_SUFFIX " v ON v.key = %" PRId64,
                 pc->table, key);
        snprintf(vcols, sizeof vcols,
                 ", CASE WHEN v.pid = l.pid AND (a.backend_start IS NULL OR"
                 " v.since = a.backend_start) THEN encode(v.value, 'hex') END, v.token, v.owner");
    }
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
             " floor(extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint,"
             " l.mode, %s, a.state_change < statement_timestamp()%s "
             "FROM (SELECT %s AS token) t%s LEFT JOIN (pg_locks l LEFT JOIN pg_stat_activity a"
             " ON a.pid = l.pid) ON l.locktype = 'advisory' AND l.database = (SELECT oid FROM"
             " pg_database WHERE datname = current_database()) AND ((%s) OR (%s)) "
             "ORDER BY l.granted DESC%s, l.pid",
             settings, gate, vcols, token_sql, vjoin, match, gate,
             ordered ? ", l.waitstart NULLS LAST" : "");
    const char *what = v ? "reading the leader" : "inspect";
    if ((err = dlock_pg_run_idle(pc, sql, 4, &r, what, state)) != 0) {
        if (row_readable && strcmp(state, "42501") == 0) {
            row_readable = 0;
            dlock_clearerr(conn->client);
            goto again;
        }
        return dlock_pg_store_failed(pc, err, state, what);
    }
    int rows = PQntuples(r), holder = -1;
    if (rows < 1) {
        PQclear(r);
        return dlock_seterr(conn->client, DLOCK_EPROTO, "postgresql: %s: no row returned", what);
    }
    info->known |= DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS;
    if (ordered)
        info->known |= DLOCK_KNOWS_ORDER;
    for (int i = 0; i < rows; i++) {
        if (PQgetisnull(r, i, 1))
            continue; /* no session holds or awaits the lock */
        /* A semaphore's gate: its holder waits for a slot, the others
         * queue behind it. */
        int at_gate = PQgetvalue(r, i, 9)[0] == 't';
        if (!at_gate && PQgetvalue(r, i, 2)[0] == 't') {
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
    if (strcmp(PQgetvalue(r, holder, 8), "ShareLock") == 0) {
        /* Shared holders or permits: the newest one's. */
        PQclear(r);
        return newest_holder(pc, name, len, info);
    }
    /* The name's row is read in the statement's snapshot, pg_locks and
     * pg_stat_activity as they are: a holder granted since (its grant's
     * bump committed after the snapshot) would be shown the previous
     * holder's token. Its row counts only when it went idle before the
     * statement began. */
    int settled = !PQgetisnull(r, holder, 10) && PQgetvalue(r, holder, 10)[0] == 't';
    struct holder_row hr;
    holder_row(r, holder, key, have_row && settled, row_token, &hr);
    info->known |= DLOCK_KNOWS_OWNER;
    snprintf(info->owner, sizeof info->owner, "%s", hr.owner);
    if (hr.has_lease) {
        info->lease_ms = hr.lease_ms;
        info->known |= DLOCK_KNOWS_LEASE;
    }
    if (hr.token) {
        info->token = info->last_token = hr.token;
        info->known |= DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_LAST_TOKEN;
    }
    if (v)
        holder_value(r, holder, info, &hr, v);
    PQclear(r);
    return 0;
}

int dlock_pg_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    return inspect_key((struct pg_conn *)conn, name, len, info, NULL);
}

/* leader(): inspect's statement, with the value of the name's row of the
 * values table when the holder published it (one round trip). A name held
 * shared has no leader's value. */
int dlock_pg_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                    char *value, size_t *value_len)
{
    struct pg_value v = {value, value_len};
    *value_len = 0;
    return inspect_key((struct pg_conn *)conn, name, len, info, &v);
}


/* Holders listed by holders_sql(), with what sorts them. */
struct listed {
    dlock_holder h;
    int pid;
};

static int by_token(const void *a, const void *b)
{
    const struct listed *x = a, *y = b;
    /* Unknown tokens last, then by session. */
    int ux = !(x->h.known & DLOCK_KNOWS_TOKEN), uy = !(y->h.known & DLOCK_KNOWS_TOKEN);
    if (ux != uy)
        return ux - uy;
    if (x->h.token != y->h.token)
        return (x->h.token > y->h.token) - (x->h.token < y->h.token);
    return (x->pid > y->pid) - (x->pid < y->pid);
}

/*
 * Every holder of the name's key (granted in pg_locks), its mode (the
 * lock's; a semaphore's permit holds the key shared and its limit lock),
 * its token (the low 32 bits its token lock names, completed from the
 * name's counter or the sequence, which are at or above it; else as
 * inspect tells an exclusive holder's), owner and lease (the tag). One
 * read-only statement, as inspect. *list (count rows) is the caller's to
 * free, sorted by token.
 */
static int list_holders(struct pg_conn *pc, int64_t key, struct listed **list, size_t *count)
{
    char sql[2400], settings[256], top_sql[200], state[6], match[160];
    PGresult *r = NULL;
    struct pg_name n;
    int err;
    dlock_pg_name(key, &n);
    dlock_pg_key_match(pc, key, "l.", match, sizeof match);
    dlock_pg_tx_settings(settings, sizeof settings, pc->timeout_ms);
    int readable = 1;
again:
    if (!readable)
        snprintf(top_sql, sizeof top_sql, "NULL::bigint");
    else if (pc->use_sequence)
        snprintf(top_sql, sizeof top_sql, "(SELECT last_value FROM %s_seq)", pc->table);
    else
        snprintf(top_sql, sizeof top_sql, "(SELECT token FROM %s WHERE key = %" PRId64 ")",
                 pc->table, key);
    snprintf(sql, sizeof sql,
             "%sWITH p AS MATERIALIZED (SELECT l.pid, l.mode, l.objsubid AS sub,"
             " l.classid::bigint AS c, l.objid::bigint AS o, (%s) AS k FROM pg_locks l WHERE "
             IN_DB " AND l.granted AND ((%s) OR (l.objsubid = 2 AND l.classid IN (%" PRIu32 ", %"
             PRIu32 ")))) "
             "SELECT p.mode, p.pid, (SELECT min(m.o & 65535) FROM p m WHERE m.sub = 2 AND"
             " m.c = %" PRIu32 " AND m.o >> 16 = %" PRIu32 " AND m.o & 65535 <> 0 AND m.pid = p.pid),"
             " a.state,"
             " substr(a.query, 1, 120), host(a.client_addr), a.client_port,"
             " floor(extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint,"
             " (SELECT max(t.o) FROM p t WHERE t.sub = 2 AND t.c = %" PRIu32
             " AND t.pid = p.pid), %s "
             "FROM p LEFT JOIN pg_stat_activity a ON a.pid = p.pid WHERE p.k ORDER BY p.pid",
             settings, match, match, n.hi ^ T_LIMIT, n.hi ^ T_TOKEN, n.hi ^ T_LIMIT, n.lo >> 16,
             n.hi ^ T_TOKEN, top_sql);
    if ((err = dlock_pg_run_idle(pc, sql, 4, &r, "inspect", state)) != 0) {
        if (readable && strcmp(state, "42501") == 0) {
            readable = 0;
            dlock_clearerr(cl(pc));
            goto again;
        }
        return dlock_pg_store_failed(pc, err, state, "inspect");
    }
    size_t rows = (size_t)PQntuples(r);
    struct listed *v = calloc(rows ? rows : 1, sizeof *v);
    if (!v) {
        PQclear(r);
        return dlock_seterr(cl(pc), DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < rows; i++) {
        int row = (int)i, exclusive = strcmp(PQgetvalue(r, row, 0), "ExclusiveLock") == 0;
        int have_top = !PQgetisnull(r, row, 9);
        uint64_t top = have_top ? strtoull(PQgetvalue(r, row, 9), NULL, 10) : 0;
        struct holder_row hr;
        /* The counter is the last token granted: an exclusive holder's
         * (token=table; a sequence is shared by every name). */
        holder_row(r, row, key, exclusive && have_top && !pc->use_sequence, top, &hr);
        dlock_holder *h = &v[i].h;
        v[i].pid = atoi(PQgetvalue(r, row, 1));
        h->known = DLOCK_KNOWS_MODE;
        h->mode = exclusive || !PQgetisnull(r, row, 2) ? DLOCK_MODE_EXCLUSIVE : DLOCK_MODE_SHARED;
        h->limit = PQgetisnull(r, row, 2) ? 0 : (uint32_t)strtoul(PQgetvalue(r, row, 2), NULL, 10);
        snprintf(h->owner, sizeof h->owner, "%s", hr.owner);
        if (hr.owner_tagged)
            h->known |= DLOCK_KNOWS_OWNER;
        if (hr.has_lease) {
            h->lease_ms = hr.lease_ms;
            h->known |= DLOCK_KNOWS_LEASE;
        }
        if (!exclusive && have_top && !PQgetisnull(r, row, 8)) {
            uint32_t low = (uint32_t)strtoull(PQgetvalue(r, row, 8), NULL, 10);
            hr.token = top - (uint32_t)((uint32_t)top - low);
        }
        if (hr.token) {
            h->token = hr.token;
            h->known |= DLOCK_KNOWS_TOKEN;
        }
    }
    PQclear(r);
    qsort(v, rows, sizeof *v, by_token);
    *list = v;
    *count = rows;
    return 0;
}

int dlock_pg_inspect_holders(dlock_conn *conn, const char *name, size_t len,
                             dlock_holder *holders, size_t capacity, size_t *count)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct listed *v = NULL;
    size_t n = 0;
    int64_t key = 0;
    int err = dlock_pg_layout_key(pc, name, len, &key);
    if (err || (err = list_holders(pc, key, &v, &n)) != 0)
        return err;
    for (size_t i = 0; i < n && i < capacity; i++)
        holders[i] = v[i].h;
    *count = n;
    free(v);
    return 0;
}

/* inspect() on a name with shared holders or permits: held, and the
 * newest holder's owner, lease and token. */
static int newest_holder(struct pg_conn *pc, const char *name, size_t len, dlock_info *info)
{
    struct listed *v = NULL;
    size_t n = 0;
    int64_t key = 0;
    int err = dlock_pg_layout_key(pc, name, len, &key);
    if (err || (err = list_holders(pc, key, &v, &n)) != 0)
        return err;
    size_t last = n;
    for (size_t i = 0; i < n; i++)
        if (v[i].h.known & DLOCK_KNOWS_TOKEN)
            last = i;
    if (last == n && n)
        last = n - 1; /* no token known: one of them */
    if (last < n) {
        dlock_holder *h = &v[last].h;
        info->known |= DLOCK_KNOWS_OWNER;
        snprintf(info->owner, sizeof info->owner, "%s", h->owner);
        if (h->known & DLOCK_KNOWS_LEASE) {
            info->lease_ms = h->lease_ms;
            info->known |= DLOCK_KNOWS_LEASE;
        }
        if (h->known & DLOCK_KNOWS_TOKEN) {
            info->token = info->last_token = h->token;
            info->known |= DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_LAST_TOKEN;
        }
    }
    free(v);
    return 0;
}
