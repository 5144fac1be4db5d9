/*
 * PostgreSQL: the statements of each mode, and a semaphore's wait for a
 * slot. The recipe (postgres.c) calls down here; this file calls only the
 * statement layer (postgres_io.c) below it.
 *
 * A name's locks. Its key K (the bigint of dlock_pg_key()) is the
 * read-write lock: an exclusive holder holds pg_advisory_lock(K), as every
 * release before shared modes did, so an older client still excludes and
 * is excluded; a shared holder holds pg_advisory_lock_shared(K). The
 * server's lock queue is first-come first-served across modes: a shared
 * request waits behind a queued exclusive one (a try fails then), and the
 * shared requests at its head are granted together. The other locks of a
 * name are two-int advisory locks (pg_locks' objsubid 2, apart from every
 * bigint key), (hi ^ tag, ...) where hi and lo are the key's halves:
 *   - gate     (hi ^ 'gate', lo): a semaphore's queue, taken exclusively;
 *   - mutex    (hi ^ 'mutx', lo): a transaction lock that makes the check of
 *              the name's kind and the grant one step (see below);
 *   - slots    (hi ^ 'slot', lo + i), i < limit: a semaphore's permits;
 *   - limit    (hi ^ 'limt', lo & 0xffff0000 | N): held shared by every
 *              holder of a semaphore of limit N, so pg_locks tells the limit;
 *   - token    (hi ^ 'tokn', token's low 32 bits): held shared by each
 *              shared holder and permit, so inspect tells each one's token.
 * A permit's holder also holds K shared: an exclusive request (an older
 * client's too) is excluded by a semaphore's holders, by the server.
 *
 * The kind of a name. Shared holders and permits both hold K shared, so
 * the server does not keep them apart: a shared request looks in pg_locks
 * for a limit lock (a semaphore's holder), a semaphore request for a
 * holder of K without one (a read-write lock's) or a limit lock of another
 * limit, each under the mutex, after its own lock of K and before its
 * grant: of two requests of different kinds, the one that looks second
 * sees the other's grant, and refuses (DLOCK_EMODE). An exclusive request
 * looks only when its try fails (an uncontended one costs nothing more),
 * and then refuses rather than waits behind a semaphore.
 *
 * A semaphore (limit N). Its requests pass its gate one at a time, in the
 * server's lock queue (first-come first-served; a try fails while anyone
 * waits there): the one at the gate takes the first free slot and its
 * token and lets go of the gate; with no slot free, a wait keeps the gate
 * (the next ones queue behind it), LISTENs on the name's channel, and
 * looks again whenever a holder's release NOTIFYs it, and every
 * SEM_POLL_MS at least: a holder whose session ended (died, its lease ran
 * out) frees its slot with no NOTIFY. A dead holder's permit is freed by
 * its session's end, as a lock is; only the waiter at the gate polls.
 *
 * Tokens: every grant, in every mode, bumps the name's counter (or the
 * sequence) in its own statement, after its lock, before the statement
 * ends: holders of a read-write lock in shared mode are granted in one
 * transaction each, and an exclusive grant waits until every earlier
 * grant's holder has unlocked, which it does after its bump has committed.
 */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/postgres_int.h"
#include "core/md5.h"
#include "core/sha256.h"


/* The longest a semaphore's waiter at the gate goes without looking at the
 * slots: a slot freed by a session's end sends no notification. */
#define SEM_POLL_MS 50u


/* An int4 argument of the two-int advisory functions from a uint32_t. */
static int32_t i4(uint32_t v)
{
    return (int32_t)v;
}

/* The key of a name: see "Key" in postgres.c. */
int64_t dlock_pg_key(const char *ns, const char *name, size_t len)
{
    unsigned char d[DLOCK_SHA256_LEN];
    uint64_t k = 0;
    if (ns) {
        /* Bounded by the URI and name limits: no allocation to fail. */
        unsigned char buf[DLOCK_URI_MAX + 1 + DLOCK_NAME_MAX];
        size_t nlen = strnlen(ns, DLOCK_URI_MAX);
        memcpy(buf, ns, nlen);
        buf[nlen] = 0;
        memcpy(buf + nlen + 1, name, len);
        dlock_sha256(buf, nlen + 1 + len, d);
    } else {
        dlock_sha256(name, len, d);
    }
    for (int i = 0; i < 8; i++)
        k = k << 8 | d[i];
    return (int64_t)k;
}

/* layout=int: the canonical decimal spelling of a bigint ("-" only before
 * a digit other than 0, no leading zeros, no sign "+" or spaces), so that
 * one key has one name. 1 and *v when it is one. */
static int decimal_bigint(const char *name, size_t len, int64_t *v)
{
    size_t i = name[0] == '-';
    uint64_t u = 0, max = i ? 9223372036854775808ull : 9223372036854775807ull;
    if (len == i || len - i > 19 || (name[i] == '0' && (len - i > 1 || i)))
        return 0;
    for (; i < len; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        unsigned d = (unsigned)(name[i] - '0');
        if (u > (max - d) / 10)
            return 0;
        u = u * 10 + d;
    }
    *v = name[0] == '-' ? (int64_t)(0 - u) : (int64_t)u;
    return 1;
}

int dlock_pg_layout_key(struct pg_conn *pc, const char *name, size_t len, int64_t *key)
{
    unsigned char d[DLOCK_MD5_LEN];
    switch (pc->layout) {
    case PG_LAYOUT_TOOZ:
        dlock_md5(name, len, d);
        *key = TOOZ_KEY(d[0], d[1]);
        return 0;
    case PG_LAYOUT_INT:
        if (decimal_bigint(name, len, key))
            return 0;
        return dlock_seterr(cl(pc), DLOCK_EINVAL,
                            "postgresql: layout=int takes names that are decimal integers in the"
                            " bigint range (-9223372036854775808 to 9223372036854775807, no"
                            " leading zeros or '+'), the key as pg_advisory_lock(42) takes it;"
                            " not '%.*s'",
                            (int)(len > 64 ? 64 : len), name);
    default:
        *key = dlock_pg_key(pc->namespace, name, len);
        return 0;
    }
}

void dlock_pg_key_args(const struct pg_conn *pc, int64_t key, char *buf, size_t len)
{
    if (pc->layout == PG_LAYOUT_TOOZ)
        snprintf(buf, len, "%u, %u", (unsigned)(key >> 8 & 0xff), (unsigned)(key & 0xff));
    else
        snprintf(buf, len, "%" PRId64, key);
}

void dlock_pg_key_match(const struct pg_conn *pc, int64_t key, const char *a, char *buf,
                        size_t len)
{
    uint64_t u = (uint64_t)key;
    if (pc->layout == PG_LAYOUT_TOOZ)
        snprintf(buf, len, "%sobjsubid = 2 AND %sclassid = %u AND %sobjid = %u", a, a,
                 (unsigned)(u >> 8 & 0xff), a, (unsigned)(u & 0xff));
    else
        snprintf(buf, len, "%sobjsubid = 1 AND %sclassid = %" PRIu64 " AND %sobjid = %" PRIu64, a,
                 a, u >> 32, a, u & 0xffffffffu);
}

void dlock_pg_name(int64_t key, struct pg_name *n)
{
    uint64_t u = (uint64_t)key;
    n->key = key;
    n->hi = (uint32_t)(u >> 32);
    n->lo = (uint32_t)u;
}

void dlock_pg_tag(char *buf, size_t len, const char *owner_hex, uint32_t ttl_ms, uint64_t token,
                  int64_t key)
{
    if (token)
        snprintf(buf, len, TAG_HEAD "%s ttl=%" PRIu32 " token=%" PRIu64 " key=%" PRId64 "*/ ",
                 owner_hex, ttl_ms, token, key);
    else
        snprintf(buf, len, TAG_HEAD "%s ttl=%" PRIu32 " key=%" PRId64 "*/ ", owner_hex, ttl_ms,
                 key);
}

/* The channel a semaphore's releases NOTIFY. */
static void channel(char *buf, size_t len, int64_t key)
{
    snprintf(buf, len, "dlock_sem_%016" PRIx64, (uint64_t)key);
}

/* The limit of a semaphore holding n, from its holders' limit locks; NULL
 * when none holds it as a semaphore. */
static void held_as_sem(char *buf, size_t len, const struct pg_name *n)
{
    snprintf(buf, len,
             "(SELECT min(l.objid::bigint & 65535) FROM pg_locks l WHERE " IN_DB
             " AND l.granted AND l.objsubid = 2 AND l.classid = %" PRIu32
             " AND l.objid::bigint >> 16 = %" PRIu32 " AND l.objid::bigint & 65535 <> 0)",
             n->hi ^ T_LIMIT, n->lo >> 16);
}

/* "No one else holds this two-int lock" (two int4 arguments, twice): taken
 * and let go at once, in the statement, under the name's mutex. A lock
 * taken for the transaction would outlive the mutex: a transaction's locks
 * are let go one by one at its end, and the next holder of the mutex could
 * find it still taken. */
#define FREE "(CASE WHEN pg_try_advisory_lock(%" PRId32 ", %" PRId32 ") THEN" \
             " pg_advisory_unlock(%" PRId32 ", %" PRId32 ") ELSE false END)"

/* 0 when a read-write lock's exclusive holder holds n, else NULL. */
static void held_exclusive(char *buf, size_t len, const struct pg_name *n)
{
    snprintf(buf, len,
             "(SELECT 0 FROM pg_locks l WHERE " IN_DB " AND l.granted AND l.objsubid = 1 AND"
             " l.classid = %" PRIu32 " AND l.objid = %" PRIu32 " AND l.mode = 'ExclusiveLock'"
             " LIMIT 1)",
             n->hi, n->lo);
}

/* CTE f: the token of a grant, from CTE src where cond (one row or none). */
static void token_cte(char *buf, size_t len, const struct pg_conn *pc, int64_t key,
                      const char *src, const char *cond)
{
    if (pc->use_sequence)
        snprintf(buf, len, "f AS MATERIALIZED (SELECT nextval('%s_seq') AS token FROM %s WHERE %s)",
                 pc->table, src, cond);
    else /* the store's floor (the row -2^63, NULL when missing) read in the same statement */
        snprintf(buf, len,
                 "f AS (INSERT INTO %s (key, token) SELECT %" PRId64 ", GREATEST(1, (SELECT token"
                 " FROM %s WHERE key = -9223372036854775808) + 1) FROM %s WHERE %s "
                 "ON CONFLICT (key) DO UPDATE SET token = GREATEST(%s.token + 1, EXCLUDED.token)"
                 " RETURNING token)",
                 pc->table, key, pc->table, src, cond, pc->table);
}

/* The token lock of the grant in f (its token's low 32 bits, as an int4). */
static void token_lock(char *buf, size_t len, const struct pg_name *n)
{
    snprintf(buf, len,
             "(SELECT pg_advisory_lock_shared(%" PRId32 ", ((token + 2147483648) %% 4294967296"
             " - 2147483648)::int4) IS NOT NULL FROM f)",
             i4(n->hi ^ T_TOKEN));
}

void dlock_pg_lock_sql(const struct pg_conn *pc, const dlock_request *req, int64_t key,
                       int have_gate, char *buf, size_t len)
{
    struct pg_name n;
    char f[700], q[700], tl[200];
    int try = req->wait == DLOCK_WAIT_TRY;
    dlock_pg_name(key, &n);
    held_as_sem(q, sizeof q, &n);
    if (req->limit == 0 && req->mode == DLOCK_MODE_EXCLUSIVE) {
        /* Today's lock; a failed try, or a wait that would queue, asks
         * whether a semaphore holds the name (tooz's layout has none). */
        char k[48];
        dlock_pg_key_args(pc, key, k, sizeof k);
        if (pc->layout == PG_LAYOUT_TOOZ)
            snprintf(q, sizeof q, "NULL::bigint");
        token_cte(f, sizeof f, pc, key, "l", "got");
        if (try)
            snprintf(buf, len,
                     "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock(%s) AS got), %s "
                     "SELECT (SELECT token FROM f), (SELECT CASE WHEN NOT got THEN %s END FROM l)",
                     k, f, q);
        else
            snprintf(buf, len,
                     "WITH l AS MATERIALIZED (SELECT CASE WHEN pg_try_advisory_lock(%s)"
                     " THEN true WHEN %s IS NOT NULL THEN false ELSE pg_advisory_lock(%s)"
                     " IS NOT NULL END AS got), %s "
                     "SELECT (SELECT token FROM f), (SELECT CASE WHEN NOT got THEN %s END FROM l)",
                     k, q, k, f, q);
        return;
    }
    token_lock(tl, sizeof tl, &n);
    if (req->mode == DLOCK_MODE_SHARED) {
        /* Under the mutex, a semaphore's holder (its marker held) stands
         * in the way; else the reader's marker is taken. */
        token_cte(f, sizeof f, pc, key, "r", "rm");
        snprintf(buf, len,
                 "WITH l AS MATERIALIZED (SELECT %s(%" PRId64 ")%s AS got), "
                 "x AS MATERIALIZED (SELECT pg_advisory_xact_lock(%" PRId32 ", %" PRId32 ")"
                 " IS NOT NULL AS m FROM l WHERE got), "
                 "k AS MATERIALIZED (SELECT CASE WHEN " FREE " THEN NULL ELSE %s END AS kind"
                 " FROM x), "
                 "r AS MATERIALIZED (SELECT pg_advisory_lock_shared(%" PRId32 ", %" PRId32 ")"
                 " IS NOT NULL AS rm FROM k WHERE kind IS NULL), %s "
                 "SELECT (SELECT token FROM f), (SELECT kind FROM k), NULL::int, false, %s,"
                 " (SELECT pg_advisory_unlock_shared(%" PRId64 ") FROM k WHERE kind IS NOT NULL)",
                 try ? "pg_try_advisory_lock_shared" : "pg_advisory_lock_shared", key,
                 try ? "" : " IS NOT NULL", i4(n.hi ^ T_MUTEX), i4(n.lo), i4(n.hi ^ T_LIMIT),
                 i4(n.lo & 0xffff0000u), i4(n.hi ^ T_LIMIT), i4(n.lo & 0xffff0000u), q,
                 i4(n.hi ^ T_READ), i4(n.lo), f, tl, key);
        return;
    }
    /* A semaphore: through its gate; keep the gate when waiting. The slots
     * are tried in a subquery of b's row (one per statement, only where
     * the key was taken), first free first, so that no plan can try a slot
     * it then does not keep. */
    char gate[160], excl[400];
    int keep = !try;
    if (have_gate)
        snprintf(gate, sizeof gate, "true");
    else
        snprintf(gate, sizeof gate, "%s(%" PRId32 ", %" PRId32 ")%s",
                 try ? "pg_try_advisory_lock" : "pg_advisory_lock", i4(n.hi ^ T_GATE), i4(n.lo),
                 try ? "" : " IS NOT NULL");
    held_exclusive(excl, sizeof excl, &n);
    token_cte(f, sizeof f, pc, key, "m", "lm");
    /* The slot: the first free one; a semaphore of 1's waiter at the gate
     * (have_gate 2) waits for its one slot in the server's queue, before
     * the mutex, and gives it back when the grant is refused after all. */
    char w[200] = "", xfrom[16] = "g WHERE gate", s0[400], back[200] = "";
    if (have_gate == 2) {
        snprintf(w, sizeof w,
                 "w AS MATERIALIZED (SELECT pg_advisory_lock(%" PRId32 ", %" PRId32 ") IS NOT NULL"
                 " AS got FROM g), ",
                 i4(n.hi ^ T_SLOT), i4(n.lo));
        snprintf(xfrom, sizeof xfrom, "w");
        snprintf(s0, sizeof s0, "SELECT 0 AS i FROM b WHERE bs");
        snprintf(back, sizeof back,
                 ", (SELECT pg_advisory_unlock(%" PRId32 ", %" PRId32 ") FROM w WHERE NOT EXISTS"
                 " (SELECT 1 FROM s))",
                 i4(n.hi ^ T_SLOT), i4(n.lo));
    } else {
        snprintf(s0, sizeof s0,
                 "SELECT (SELECT i FROM generate_series(0, %" PRIu32 ") i WHERE"
                 " pg_try_advisory_lock(%" PRId32 ", ((%" PRIu32 " + i + 2147483648) %% 4294967296"
                 " - 2147483648)::int4) LIMIT 1) AS i FROM b WHERE bs",
                 req->limit - 1, i4(n.hi ^ T_SLOT), n.lo);
    }
    /* Under the mutex: readers (their marker held: 0), or a semaphore's
     * holders (its marker held) none of which holds this limit's lock
     * (their limit). An exclusive holder shows when the key's shared lock
     * is refused (0). */
    snprintf(buf, len,
             "WITH g AS MATERIALIZED (SELECT %s AS gate), %s"
             "x AS MATERIALIZED (SELECT pg_advisory_xact_lock(%" PRId32 ", %" PRId32 ")"
             " IS NOT NULL AS m FROM %s), "
             "k AS MATERIALIZED (SELECT CASE WHEN NOT " FREE " THEN 0 WHEN NOT " FREE " AND "
             FREE " THEN %s END AS kind FROM x), "
             "b AS MATERIALIZED (SELECT pg_try_advisory_lock_shared(%" PRId64 ") AS bs FROM k"
             " WHERE kind IS NULL), "
             "kk AS MATERIALIZED (SELECT coalesce((SELECT kind FROM k), (SELECT %s FROM b WHERE"
             " NOT bs)) AS kind), "
             "s0 AS MATERIALIZED (%s), "
             "s AS MATERIALIZED (SELECT i FROM s0 WHERE i IS NOT NULL), "
             "m AS MATERIALIZED (SELECT pg_advisory_lock_shared(%" PRId32 ", %" PRId32 ")"
             " IS NOT NULL AS a, pg_advisory_lock_shared(%" PRId32 ", %" PRId32 ") IS NOT NULL"
             " AS lm FROM s), %s "
             "SELECT (SELECT token FROM f), (SELECT kind FROM kk), (SELECT i FROM s),"
             " (SELECT gate AND %s AND NOT EXISTS (SELECT 1 FROM s) AND NOT EXISTS (SELECT 1"
             " FROM kk WHERE kind IS NOT NULL) FROM g), %s,"
             " (SELECT pg_advisory_unlock_shared(%" PRId64 ") FROM b WHERE bs AND NOT EXISTS"
             " (SELECT 1 FROM s)),"
             " (SELECT pg_advisory_unlock(%" PRId32 ", %" PRId32 ") FROM g WHERE gate AND"
             " (%s OR EXISTS (SELECT 1 FROM s) OR EXISTS (SELECT 1 FROM kk WHERE kind IS NOT"
             " NULL)))%s",
             gate, w, i4(n.hi ^ T_MUTEX), i4(n.lo), xfrom, i4(n.hi ^ T_READ), i4(n.lo),
             i4(n.hi ^ T_READ),
             i4(n.lo), i4(n.hi ^ T_LIMIT), i4(n.lo & 0xffff0000u), i4(n.hi ^ T_LIMIT),
             i4(n.lo & 0xffff0000u), i4(n.hi ^ T_LIMIT), i4((n.lo & 0xffff0000u) | req->limit),
             i4(n.hi ^ T_LIMIT), i4((n.lo & 0xffff0000u) | req->limit), q,
             key, excl, s0, i4(n.hi ^ T_LIMIT),
             i4((n.lo & 0xffff0000u) | req->limit), i4(n.hi ^ T_LIMIT), i4(n.lo & 0xffff0000u), f,
             keep ? "true" : "false", tl, key, i4(n.hi ^ T_GATE), i4(n.lo),
             keep ? "false" : "true", back);
}

void dlock_pg_unlock_if_held(const struct pg_conn *pc, char *sql, size_t len, int64_t key)
{
    struct pg_name n;
    if (pc->layout == PG_LAYOUT_TOOZ) { /* one lock, exclusive, two int4 */
        char k[48], m[160];
        dlock_pg_key_args(pc, key, k, sizeof k);
        dlock_pg_key_match(pc, key, "l.", m, sizeof m);
        snprintf(sql, len,
                 "SELECT pg_advisory_unlock(%s) FROM pg_locks l WHERE l.locktype = 'advisory' AND"
                 " l.pid = pg_backend_pid() AND l.granted AND l.mode = 'ExclusiveLock' AND %s",
                 k, m);
        return;
    }
    dlock_pg_name(key, &n);
    snprintf(sql, len,
             "SELECT CASE WHEN l.objsubid = 1 THEN CASE WHEN l.mode = 'ExclusiveLock' THEN"
             " pg_advisory_unlock(%" PRId64 ") ELSE pg_advisory_unlock_shared(%" PRId64 ") END"
             " ELSE CASE WHEN l.mode = 'ExclusiveLock' THEN pg_advisory_unlock(c, o) ELSE"
             " pg_advisory_unlock_shared(c, o) END END "
             "FROM pg_locks l, LATERAL (SELECT ((l.classid::bigint + 2147483648) %% 4294967296"
             " - 2147483648)::int4 AS c, ((l.objid::bigint + 2147483648) %% 4294967296"
             " - 2147483648)::int4 AS o) v "
             "WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted AND"
             " ((l.objsubid = 1 AND l.classid = %" PRIu32 " AND l.objid = %" PRIu32 ") OR"
             " (l.objsubid = 2 AND ((l.classid = %" PRIu32 " AND l.objid = %" PRIu32 ") OR"
             " (l.classid = %" PRIu32 " AND (l.objid::bigint - %" PRIu32 " + 4294967296)"
             " %% 4294967296 < 65536) OR (l.classid = %" PRIu32 " AND l.objid::bigint >> 16 = %"
             PRIu32 ") OR l.classid = %" PRIu32 " OR (l.classid = %" PRIu32 " AND l.objid = %" PRIu32
             "))))",
             key, key, n.hi, n.lo, n.hi ^ T_GATE, n.lo, n.hi ^ T_SLOT, n.lo, n.hi ^ T_LIMIT,
             n.lo >> 16, n.hi ^ T_TOKEN, n.hi ^ T_READ, n.lo);
}

void dlock_pg_unlock_exprs(const struct pg_conn *pc, const struct pg_held *h, char *buf,
                           size_t len)
{
    struct pg_name n;
    char ch[40];
    dlock_pg_name(h->key, &n);
    if (h->limit == 0 && h->mode == DLOCK_MODE_EXCLUSIVE) {
        char k[48], la[40], lead[72] = "";
        dlock_pg_key_args(pc, h->key, k, sizeof k);
        if (h->leading) { /* an election's leader lock goes with it */
            dlock_pg_leader_args(h->key, la, sizeof la);
            snprintf(lead, sizeof lead, ", pg_advisory_unlock(%s)", la);
        }
        snprintf(buf, len, "pg_advisory_unlock(%s)%s", k, lead);
        return;
    }
    int32_t tok = i4((uint32_t)h->base.token);
    if (h->limit == 0) {
        snprintf(buf, len,
                 "pg_advisory_unlock_shared(%" PRId64 "), pg_advisory_unlock_shared(%" PRId32
                 ", %" PRId32 "), pg_advisory_unlock_shared(%" PRId32 ", %" PRId32 ")",
                 h->key, i4(n.hi ^ T_READ), i4(n.lo), i4(n.hi ^ T_TOKEN), tok);
        return;
    }
    /* A semaphore of 1's waiter waits in the server for the slot: no one
     * listens for its releases. */
    char notify[80] = "";
    channel(ch, sizeof ch, h->key);
    if (h->limit > 1)
        snprintf(notify, sizeof notify, ", pg_notify('%s', '')", ch);
    snprintf(buf, len,
             "pg_advisory_unlock(%" PRId32 ", %" PRId32 "), pg_advisory_unlock_shared(%" PRId64
             "), pg_advisory_unlock_shared(%" PRId32 ", %" PRId32 "),"
             " pg_advisory_unlock_shared(%" PRId32 ", %" PRId32 "),"
             " pg_advisory_unlock_shared(%" PRId32 ", %" PRId32 ")%s",
             i4(n.hi ^ T_SLOT), i4(n.lo + h->slot), h->key, i4(n.hi ^ T_LIMIT),
             i4((n.lo & 0xffff0000u) | h->limit), i4(n.hi ^ T_LIMIT), i4(n.lo & 0xffff0000u),
             i4(n.hi ^ T_TOKEN), tok, notify);
}

int dlock_pg_mode_error(struct pg_conn *pc, const dlock_request *req, long long kind)
{
    if (kind == 0)
        return dlock_seterr(cl(pc), DLOCK_EMODE,
                            "postgresql: the name is held as a read-write lock, not as a"
                            " semaphore of limit %" PRIu32, req->limit);
    if (req->limit)
        return dlock_seterr(cl(pc), DLOCK_EMODE,
                            "postgresql: the name is held as a semaphore of limit %lld, not %"
                            PRIu32, kind, req->limit);
    return dlock_seterr(cl(pc), DLOCK_EMODE,
                        "postgresql: the name is held as a semaphore of limit %lld, not as a"
                        " read-write lock", kind);
}

/* A semaphore's waiter gives up (deadline, cancel): lets go of the gate and
 * stops listening. A session that cannot is closed (its locks go with it).
 * The caller's error stays reported. */
static void sem_give_up(struct pg_conn *pc, struct pg_session *s, int64_t key)
{
    char sql[1400], ch[40];
    size_t o;
    PGresult *r = NULL;
    dlock_errsave why;
    dlock_pg_unlock_if_held(pc, sql, sizeof sql, key);
    o = strlen(sql);
    channel(ch, sizeof ch, key);
    snprintf(sql + o, sizeof sql - o, "; UNLISTEN %s", ch);
    dlock_err_save(cl(pc), &why);
    if (dlock_pg_run(pc, s, sql, 0, &r, "leaving the semaphore's queue",
                     dlock_monotonic_ns() + CANCEL_MS * MS) == 0)
        PQclear(r);
    else
        dlock_pg_session_close(s);
    dlock_err_restore(cl(pc), &why);
}

/* What a look at the slots found: 1 a permit (*token, *slot), -1 the
 * name's other kind (reported, the gate let go), 0 nothing yet (the gate
 * kept). r is cleared. */
static int looked(struct pg_conn *pc, struct pg_session *s, const dlock_request *req,
                  int64_t key, PGresult *r, uint64_t *token, uint32_t *slot)
{
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, PG_COL_TOKEN)) {
        *token = strtoull(PQgetvalue(r, 0, PG_COL_TOKEN), NULL, 10);
        *slot = (uint32_t)strtoul(PQgetvalue(r, 0, PG_COL_SLOT), NULL, 10);
        PQclear(r);
        return 1;
    }
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, PG_COL_KIND)) {
        long long kind = strtoll(PQgetvalue(r, 0, PG_COL_KIND), NULL, 10);
        PQclear(r);
        sem_give_up(pc, s, key);
        dlock_pg_mode_error(pc, req, kind);
        return -1;
    }
    PQclear(r);
    return 0;
}

/* A semaphore of 1: the waiter at the gate waits for the one slot in the
 * server's lock queue, woken by the server at the holder's release or its
 * session's end, as an exclusive lock's waiter is; bounded by lock_timeout
 * for a deadline and cancelled as its wait is. A look that finds the name's
 * key refused (an exclusive request queued there) gives the slot back and
 * tries again SEM_POLL_MS later. */
static int sem_wait_one(struct pg_conn *pc, struct pg_session *s, const dlock_request *req,
                        int64_t key, uint64_t *token, uint32_t *slot, uint64_t *granted_ns)
{
    char sql[8192], lock[6000], tg[160];
    uint64_t margin = pc->timeout_ms < DEADLINE_MARGIN_MS ? pc->timeout_ms : DEADLINE_MARGIN_MS;
    dlock_pg_tag(tg, sizeof tg, req->owner_hex, s->base.lease, 0, key);
    dlock_pg_lock_sql(pc, req, key, 2, lock, sizeof lock);
    for (;;) {
        uint64_t now = dlock_monotonic_ns(), lock_ms = 0, until = 0;
        if (req->wait == DLOCK_WAIT_DEADLINE) {
            if (now >= req->deadline_ns)
                break;
            lock_ms = (req->deadline_ns - now + MS - 1) / MS;
            if (lock_ms > INT32_MAX)
                lock_ms = 0;
            until = req->deadline_ns + margin * MS;
        }
        snprintf(sql, sizeof sql,
                 "%sSET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit"
                 " = on; SET LOCAL lock_timeout = %" PRIu64 "; SET LOCAL statement_timeout = %"
                 PRIu64 "; " CHECK_CLIENT_SQL "%s",
                 tg, lock_ms, lock_ms, lock);
        PGresult *r = NULL;
        int cancelled = 0;
        int err = dlock_pg_run_cancellable(pc, s, sql, 5, &r, "waiting for a permit", until,
                                           req->cancel_fd, &cancelled);
        if (err) {
            int timed = err == DLOCK_ETIMEDOUT || (err == DLOCK_ESTORE &&
                        strcmp(s->sqlstate, "57014") == 0 && !cancelled);
            if (s->pg && PQstatus(s->pg) == CONNECTION_OK)
                sem_give_up(pc, s, key);
            if (cancelled)
                return dlock_cancelled(cl(pc));
            if (timed && req->wait == DLOCK_WAIT_DEADLINE)
                break;
            return err;
        }
        *granted_ns = dlock_monotonic_ns();
        int got = looked(pc, s, req, key, r, token, slot);
        if (got)
            return got > 0 ? 0 : DLOCK_EMODE;
        uint64_t next = dlock_monotonic_ns() + SEM_POLL_MS * MS;
        if (req->wait == DLOCK_WAIT_DEADLINE && next > req->deadline_ns)
            next = req->deadline_ns;
        if (dlock_pause_until(next, req->cancel_fd) == DLOCK_ECANCELED) {
            sem_give_up(pc, s, key);
            return dlock_cancelled(cl(pc));
        }
    }
    int e = dlock_seterr(cl(pc), DLOCK_ETIMEDOUT, "the deadline passed with every permit still held");
    sem_give_up(pc, s, key);
    return e;
}

int dlock_pg_sem_wait(struct pg_conn *pc, struct pg_session *s, const dlock_request *req,
                      int64_t key, uint64_t *token, uint32_t *slot, uint64_t *granted_ns)
{
    if (req->limit == 1)
        return sem_wait_one(pc, s, req, key, token, slot, granted_ns);
    char sql[8192], lock[6000], tg[160], ch[40];
    uint64_t deadline = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns : DLOCK_POLL_FOREVER;
    uint64_t poll_ms = req->ttl_ms / 2 < SEM_POLL_MS ? req->ttl_ms / 2 : SEM_POLL_MS;
    int first = 1, err;
    if (poll_ms == 0)
        poll_ms = 1;
    channel(ch, sizeof ch, key);
    dlock_pg_tag(tg, sizeof tg, req->owner_hex, s->base.lease, 0, key);
    dlock_pg_lock_sql(pc, req, key, 1, lock, sizeof lock);
    for (;;) {
        PGresult *r = NULL;
        /* The first look follows the LISTEN's commit: a release from then
         * on wakes this wait. */
        char head[120] = "";
        if (first)
            snprintf(head, sizeof head, "BEGIN; LISTEN %s; COMMIT; ", ch);
        snprintf(sql, sizeof sql,
                 "%s%sSET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL"
                 " synchronous_commit = on; SET LOCAL lock_timeout = %" PRIu64 "; SET LOCAL"
                 " statement_timeout = %" PRIu64 "; %s",
                 tg, head, pc->timeout_ms, pc->timeout_ms, lock);
        err = dlock_pg_run(pc, s, sql, first ? 7 : 4, &r, "waiting for a permit",
                           after_timeout(pc));
        first = 0;
        if (err) {
            if (s->pg && PQstatus(s->pg) == CONNECTION_OK)
                sem_give_up(pc, s, key);
            return err;
        }
        *granted_ns = dlock_monotonic_ns();
        int got = looked(pc, s, req, key, r, token, slot);
        if (got)
            return got > 0 ? 0 : DLOCK_EMODE;
        uint64_t now = dlock_monotonic_ns();
        if (now >= deadline) {
            int e = dlock_seterr(cl(pc), DLOCK_ETIMEDOUT,
                                 "the deadline passed with every permit still held");
            sem_give_up(pc, s, key);
            return e;
        }
        uint64_t until = now + poll_ms * MS;
        if (until > deadline)
            until = deadline;
        struct pollfd pfd = {.fd = PQsocket(s->pg), .events = POLLIN};
        int n = dlock_poll_until(&pfd, 1, req->cancel_fd, until, 0);
        if (n > 0 && (n & DLOCK_POLL_CANCEL)) {
            int e = dlock_cancelled(cl(pc));
            sem_give_up(pc, s, key);
            return e;
        }
        if (n < 0 || ((n & DLOCK_POLL_READY) && (!PQconsumeInput(s->pg) || s->ended))) {
            dlock_pg_session_close(s);
            return dlock_seterr(cl(pc), DLOCK_ECONNECT,
                                "postgresql: the session ended while waiting for a permit");
        }
    }
}
