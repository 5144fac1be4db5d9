/*
 * etcd://[user:password@]host[:port][,host[:port]...][/prefix][?options]
 * through etcd's v3 JSON gateway (etcd_http.c: libcurl and json-c; why
 * not gRPC is said there).
 *
 * The recipe is etcd's own (clientv3/concurrency's Mutex), with a lease
 * per lock and a short lease for waiting:
 *  - acquire grants a lease of the lock's TTL, then in one transaction
 *    creates <prefix>/<name>/<lease id>: on that lease when the name has
 *    no key at all (a compare over the name's range), and then it holds
 *    (two round trips); else a try creates nothing (busy), and a wait
 *    creates it on the client's waiters' lease (WAIT_TTL_S, granted once
 *    and kept alive while the client waits, so that a waiter killed while
 *    queued frees its place within seconds, not after the lock's TTL) and
 *    reads the name's two newest keys: ours and the one before it. Our
 *    key's create revision (the transaction's revision) is the fencing
 *    token: global to the cluster, strictly increasing, kept across leader
 *    changes and restarts. A repeat after a lost reply finds our key (the
 *    put's previous version) and reads the queue again.
 *  - a waiter watches only the key just before its own, for its deletion
 *    (no herd; first come, first served in create order), from the
 *    member's current revision, then reads once whether the key went
 *    before the watch started (see watch_delete: a watch from a past
 *    revision can be told 100 ms late). Once told, one transaction (claim) grants it if every key of
 *    the name was created at or after ours and ours is still there, moving
 *    ours to the lock's lease; else it reads ours and the key now before
 *    it, which is watched in turn (a waiter ahead gave up). The watch
 *    carries gRPC's "hasleader" metadata, so a member that loses its
 *    leader ends it rather than leaving it silent; a watch ended by its
 *    member (or cancelled) is started again after a new read. Watches
 *    never start from a past revision, so compaction cannot cancel them. While waiting, both leases are kept
 *    alive every third of the shorter TTL; a keep-alive that had to move
 *    to another endpoint moves the watch there too (a member stopped
 *    without closing its connections is otherwise silent). The request's
 *    cancel fd is one more descriptor of the watch's curl_multi_poll, of
 *    every call of the wait (a keep-alive, a read: curl_multi_poll too,
 *    etcd_http.c) and of the pauses between attempts. Once it fires, the
 *    wait gives up as at a deadline (below) and returns DLOCK_ECANCELED.
 *  - release revokes the lock's lease, which deletes the key in the same
 *    raft entry: only our own key can go, and a lease already gone is
 *    reported as DLOCK_ELOST. A waiter that gives up deletes its key (if
 *    still its own) and revokes the lock's lease.
 *  - renew keeps the lease alive (one round trip) and checks the key is
 *    still ours (another); a renew with another TTL (in whole seconds)
 *    moves the key to a new lease in a transaction that checks the key's
 *    create revision, then revokes the old lease. A renew after the
 *    client's lease ended is DLOCK_ELOST (and gives back what etcd still
 *    kept: TTLs there are whole seconds, at least its minimum). The keeper
 *    does the same on its own HTTP connection.
 *
 * A lease per lock, not per client: each lock keeps the TTL its acquire
 * asked for (a client lease would give every lock the first one's), a
 * paused or cut-off holder loses exactly the locks whose lease ran out,
 * and release is one call. The cost is a lease grant per acquire (one
 * round trip, a raft write) and a keep-alive per held lock. etcd counts
 * TTLs in whole seconds, at least its minimum (1.5 election timeouts,
 * 2 s with the default settings): the server keeps a lock up to that much
 * longer than the client's lease, which ends first, never later.
 *
 * Store-wide tokens (dlock migrate): create revisions are the cluster's
 * revision, one counter for every write, which dlock cannot set.
 * token_top is the current revision (from a read's header);
 * raise_floor and raise_token check rather than store: 0 when floor is at
 * most the current revision (every later grant is above it), or when it
 * is at most DLOCK_RAISE_STEPS_MAX above it, after that many writes of a
 * key of the prefix's own ("<prefix>/!revision"), else DLOCK_ENOTSUP
 * naming both.
 *
 * Inspect reads the name's keys in create order (one range, no watch,
 * nothing written): the first holds (token, owner id stored as the value),
 * the others are the waiters in the order they will be served; the
 * holder's lease time left comes from a second call (lease TimeToLive).
 * Not known: the last token of a free name (its keys are gone).
 *
 * Shared locks and semaphores (etcd_queue.c): the same queue, the kind
 * in the key's name before the lease id ("r": a reader, "s<limit>-": a
 * permit; today's exclusive key unchanged). A reader holds when no
 * writer's key is before its own and watches the nearest one; a permit
 * when fewer than its limit are before it: the first waiter watches the
 * name's range for the deletion of a key before its own, later ones the
 * key just before theirs for its deletion or the put of its grant. The
 * token is the create revision in every mode. A name's oldest key sets
 * its kind: a request of another is DLOCK_EMODE at once.
 *
 * layout=etcd3 (etcd_single.c): python-etcd3's single key per name,
 * created only when absent; a waiter watches it for its deletion and tries
 * again (no queue, no FIFO); exclusive locks only. The same leases,
 * watch, release, renew and tokens (the key's create revision).
 *
 * Elections (etcd_elect.c): the leader's value in a key beside the
 * queue, on the leader's lease (a renew that moves the key to another
 * lease moves it too); observers watch the queue and that key.
 *
 * See docs/etcd.md for what this guarantees and where it is weaker.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "backends/etcd_int.h"

#define DEFAULT_PORT 2379
#define DEFAULT_PREFIX "/dlock"
#define ETCD3_PREFIX "/locks" /* python-etcd3's Lock.lock_prefix, without its '/' */
#define DEFAULT_CONNECT_MS 2000
#define DEFAULT_TIMEOUT_MS 5000
/* The waiters' lease: a waiter's key lives on a short lease of its
 * client's, kept alive while it waits, so that a waiter that dies frees
 * its place within this long (etcd's minimum TTL is 2 s by default). */
#define WAIT_TTL_S 3
/* How far past its deadline a deadline wait may return (docs/etcd.md). Its
 * cleanup's calls are cut CLEANUP_CAP_MS past it, which leaves the return
 * itself (closing the wait's connection, waking the caller's thread on a
 * busy machine: measured up to 8 ms on the CI's two loaded cores) room
 * inside the stated bound. */
#define DEADLINE_SLACK_MS 150
#define CLEANUP_CAP_MS (DEADLINE_SLACK_MS - 10)

static const char *const etcd_schemes[] = {"etcd", NULL};
static const char *const etcd_options[] = {"connect_timeout", "timeout", "tls", "cacert",
                                           "cert", "key", "layout", NULL};
static const char *const etcd_layouts[] = {"dlock", "etcd3", NULL};

/* until, or the core's earlier bound for this call (dlock_call_deadline():
 * a keep's lease end, a lost lock's release). */
static uint64_t core_bound(uint64_t until)
{
    uint64_t core = dlock_call_deadline();
    return core < until ? core : until;
}

static int64_t ttl_seconds(uint32_t ttl_ms)
{
    return ((int64_t)ttl_ms + 999) / 1000;
}

/* Sleeps ms, or less up to until (0: none) or until cancel_fd (-1: none)
 * fires; a signal also ends it early (the caller's loop looks again). */
static void pause_ms(uint64_t ms, uint64_t until, int cancel_fd)
{
    uint64_t t = dlock_monotonic_ns() + ms * MS;
    if (until && t > until)
        t = until;
    dlock_pause_until(t, cancel_fd);
}

/* ---- keys ---------------------------------------------------------------- */

/* ---- calls ----------------------------------------------------------------- */

static int lease_grant(struct etcd_conn *ec, struct etcd_http *h, int64_t ttl_s, uint64_t until,
                       int64_t *id)
{
    json_object *req = json_object_new_object(), *root;
    if (req)
        json_object_object_add(req, "TTL", etcd_new_int(ttl_s));
    int err = etcd_call_ok(ec, h, "/v3/lease/grant", req, until, DLOCK_ECONNECT, "lease grant",
                           &root);
    if (err)
        return err;
    int64_t got = etcd_int(root, "ID");
    json_object_put(root);
    if (got <= 0) /* never a key without a lease */
        return dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: lease grant: no lease id", ec->where);
    *id = got;
    return 0;
}

/* Revokes a lease: 0, DLOCK_ELOST (already gone: expired), or an error. */
static int lease_revoke(struct etcd_conn *ec, struct etcd_http *h, int64_t id, uint64_t until)
{
    struct etcd_res r;
    json_object *req = json_object_new_object();
    if (!req)
        return oom(ec);
    json_object_object_add(req, "ID", etcd_new_int(id));
    int err = etcd_call(&ec->site, h, "/v3/lease/revoke", req, until, DLOCK_ECONNECT, &r);
    json_object_put(req);
    if (err)
        return err;
    if (r.code == ETCD_NOT_FOUND && r.again) {
        /* An earlier attempt may have revoked it before its reply was
         * lost: the lease is gone either way. */
        err = 0;
    } else if (r.code == ETCD_NOT_FOUND) {
        err = dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the lock's lease had already expired",
                           ec->where);
    } else if (r.code) {
        err = etcd_error(&ec->site, &r, "lease revoke");
    }
    json_object_put(r.root);
    return err;
}

/* Keeps a lease alive: 0 with *ttl (seconds the server gave it again), or
 * DLOCK_ELOST when it is gone. */
static int lease_keepalive(struct etcd_conn *ec, struct etcd_http *h, int64_t id, uint64_t until,
                           int64_t *ttl)
{
    json_object *req = json_object_new_object(), *root;
    if (req)
        json_object_object_add(req, "ID", etcd_new_int(id));
    int err = etcd_call_ok(ec, h, "/v3/lease/keepalive", req, until, DLOCK_ECONNECT,
                           "lease keep-alive", &root);
    if (err)
        return err;
    *ttl = etcd_int(etcd_get(root, "result"), "TTL");
    json_object_put(root);
    if (*ttl <= 0)
        return dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the lock's lease has expired", ec->where);
    return 0;
}

/* ---- the lease pool --------------------------------------------------------
 *
 * A lock's lease is granted ahead of need: released, a lock's key is
 * deleted (one transaction) and its lease, which then holds nothing, goes
 * back to the client's pool; the next acquire of the same TTL in whole
 * seconds takes it, so that an uncontended acquire is one transaction and
 * acquire + release two raft writes. Still one lease per lock: a pooled
 * lease is taken by one acquire at a time.
 *
 * A pooled lease counts from `kept`, when its grant or last keep-alive was
 * sent: etcd ends it no sooner than kept + its TTL, and no later than its
 * TTL after the acquire that takes it (the server counts from what it
 * applied, before the acquire). A lock on it is given the client's lease
 * end min(now + TTL, kept + the lease's TTL): never past the server's, and
 * short of the full TTL by at most POOL_SHORT_DIV-th of it; a lease that
 * would cut more is kept alive first (a round trip, not a raft write: the
 * leader renews a lease without raft). One kept a whole TTL ago or more
 * may be gone: dropped. The pool holds at most ETCD_POOL_MAX leases (one
 * more released is revoked); close revokes them; a client that dies
 * leaves them to expire, keyless, within their TTL of their last grant or
 * keep-alive.
 */
#define POOL_SHORT_DIV 8

uint64_t dlock_etcd_pool_taken(dlock_client *c)
{
    return __atomic_load_n(&((struct etcd_conn *)c->conn)->pool_taken, __ATOMIC_RELAXED);
}

void dlock_etcd_pool_unchecked(dlock_client *c)
{
    ((struct etcd_conn *)c->conn)->pool_unchecked = 1;
}

/* A pooled lease for held (its ttl_s): 1 with held->lease and held->kept
 * set, and *from (the client's lease counts from it: *from + ttl_ms is the
 * lock's lease end); 0 when the pool has none; else an error. */
static int pool_take(struct etcd_conn *ec, struct etcd_held *held, uint64_t *from)
{
    uint64_t now = dlock_monotonic_ns(), ttl = (uint64_t)held->ttl_ms * MS;
    while (ec->npool > 0) {
        struct etcd_pooled p = {0};
        int at = -1;
        for (int i = ec->npool - 1; i >= 0 && at < 0; i--)
            if (ec->pool[i].ttl_s == held->ttl_s)
                at = i;
        if (at < 0)
            return 0;
        p = ec->pool[at];
        ec->pool[at] = ec->pool[--ec->npool];
        uint64_t span = (uint64_t)p.ttl_s * 1000 * MS;
        if (now - p.kept >= span && !ec->pool_unchecked)
            continue; /* maybe gone already: it holds nothing */
        if (p.kept + span + ttl / POOL_SHORT_DIV < now + ttl && !ec->pool_unchecked) {
            int64_t got;
            uint64_t sent = dlock_monotonic_ns();
            int err = lease_keepalive(ec, &ec->app, p.lease, call_until(ec), &got);
            if (err == DLOCK_ELOST) {
                dlock_err_clear(cl(ec));
                continue;
            }
            if (err)
                return err;
            p.kept = sent;
        }
        held->lease = p.lease;
        held->kept = p.kept;
        *from = p.kept + span - ttl < now ? p.kept + span - ttl : now;
        __atomic_add_fetch(&ec->pool_taken, 1, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

/* Gives held's lease, which holds no key of ours now, back to the pool;
 * revoked when the pool is full. The caller's error stays. */
static void pool_put(struct etcd_conn *ec, struct etcd_held *held, uint64_t until)
{
    uint64_t span = (uint64_t)held->ttl_s * 1000 * MS;
    if (dlock_monotonic_ns() - held->kept + 100 * MS < span && ec->npool < ETCD_POOL_MAX) {
        ec->pool[ec->npool++] = (struct etcd_pooled){held->lease, held->ttl_s, held->kept};
    } else {
        dlock_errsave save;
        dlock_err_save(cl(ec), &save);
        lease_revoke(ec, &ec->app, held->lease, until);
        dlock_err_restore(cl(ec), &save);
    }
    held->lease = 0;
}

/* Close: the pool's leases revoked, all within POOL_CLOSE_MS (what is
 * left expires on its own). */
#define POOL_CLOSE_MS 500
static void pool_drain(struct etcd_conn *ec)
{
    if (ec->npool == 0)
        return;
    uint64_t until = dlock_monotonic_ns() + POOL_CLOSE_MS * MS;
    dlock_errsave save;
    dlock_err_save(cl(ec), &save);
    ec->app.cancel_fd = -1;
    for (int i = 0; i < ec->npool && dlock_monotonic_ns() < until; i++)
        if (dlock_monotonic_ns() - ec->pool[i].kept < (uint64_t)ec->pool[i].ttl_s * 1000 * MS &&
            lease_revoke(ec, &ec->app, ec->pool[i].lease, until) == DLOCK_ECONNECT)
            break;
    ec->npool = 0;
    dlock_err_restore(cl(ec), &save);
}

/* ---- the watch ---------------------------------------------------------- */

static size_t on_watch(char *data, size_t size, size_t n, void *user)
{
    struct etcd_stream *w = user;
    size_t len = size * n;
    if (etcd_stream_feed(w, data, len) != len)
        return 0;
    return w->done ? 0 : len; /* 0 ends the transfer */
}

/* The state of one wait, between the watch and the keep-alives. */
struct wait {
    struct etcd_held *held;
    int cancel_fd;       /* the request's; -1: none */
    uint64_t until;      /* the deadline; 0: none */
    uint64_t next_keep;  /* the next keep-alive */
    uint64_t lease_from; /* when the last keep-alive (or the grant) was sent */
};

/* pause_ms() within a wait: up to its deadline, cut short by its cancel. */
static void wait_pause(const struct wait *wt, uint64_t ms)
{
    pause_ms(ms, wt->until, wt->cancel_fd);
}

/* How often a wait keeps its leases alive: a third of the shorter. */
static uint64_t keep_every_ms(const struct etcd_held *held)
{
    uint64_t ms = held->ttl_ms < WAIT_TTL_S * 1000 ? held->ttl_ms : WAIT_TTL_S * 1000;
    return ms / 3 ? ms / 3 : 1;
}

/* Keeps the waiters' lease and the lock's own alive. */
static int keep_during_wait(struct etcd_conn *ec, struct wait *wt)
{
    int64_t ttl;
    uint64_t sent = dlock_monotonic_ns();
    int err = 0;
    if (wt->held->waiting) {
        err = lease_keepalive(ec, &ec->app, ec->wait_lease, call_until(ec), &ttl);
        if (err == DLOCK_ELOST)
            return etcd_place_lost(ec);
        if (err)
            return err;
        ec->wait_kept = sent;
    }
    err = lease_keepalive(ec, &ec->app, wt->held->lease, call_until(ec), &ttl);
    if (err == DLOCK_ELOST)
        return etcd_place_lost(ec);
    if (err)
        return err;
    wt->lease_from = sent;
    wt->held->kept = sent;
    wt->next_keep = sent + keep_every_ms(wt->held) * MS;
    return 0;
}

/* Whether what a wait watches went before its watch started: the key is
 * gone (or, with since, was written after since); WATCH_AHEAD: fewer
 * keys than the limit are before ours. */
static int looked_again(struct etcd_conn *ec, struct etcd_held *held, const char *key,
                        size_t klen, int64_t create, int *gone)
{
    if (held->how == WATCH_AHEAD) {
        int64_t n = 0;
        int err = etcd_count_before(ec, held, &n);
        *gone = err == 0 && n < (int64_t)held->limit;
        return err;
    }
    json_object *req = json_object_new_object(), *root;
    if (req)
        json_object_object_add(req, "key", etcd_new_bytes(key, klen));
    int err = etcd_call_ok(ec, &ec->app, "/v3/kv/range", req, call_until(ec), DLOCK_ECONNECT,
                           "reading the key before ours", &root);
    if (err == 0) {
        json_object *kvs = etcd_kvs_of(root);
        json_object *kv = kvs && json_object_array_length(kvs) ? json_object_array_get_idx(kvs, 0)
                                                               : NULL;
        /* A key of that name created again (its client's next lock on the
         * same pooled lease, or an etcd session's) is another key: the one
         * watched is gone. */
        *gone = !kv || (create && etcd_int(kv, "create_revision") != create) ||
                (held->how == WATCH_CHANGE && etcd_int(kv, "mod_revision") > held->since);
        json_object_put(root);
    }
    return err;
}

/*
 * Watches key (klen bytes; the one of create revision create, 0: any)
 * for its deletion, keeping the waiter's leases alive meanwhile. 0 when deleted, 1 when the watch ended without (read
 * again and watch again), DLOCK_ETIMEDOUT at the deadline, DLOCK_ECANCELED
 * (nothing recorded) when the wait's cancel fd fired, or an error.
 *
 * The watch starts at the member's current revision, and once the member
 * confirms it, one read says whether the key went before that: a watch
 * asked to start from an earlier revision is "unsynced" on the server,
 * which catches such watches up on a 100 ms tick, so a deletion right
 * after it started would reach the waiter up to 100 ms late (seen: a
 * handoff's p99 at 100 ms). A watch from the current revision hears every
 * later event at once; the read covers the time before.
 */
static int watch_delete(struct etcd_conn *ec, struct wait *wt, const char *key, size_t klen,
                        int64_t create)
{
    struct etcd_held *held = wt->held;
    struct etcd_stream w = {0};
    struct curl_slist *hdr = NULL;
    json_object *cr = json_object_new_object(), *req = etcd_wrap("create_request", cr);
    json_object *filters = NULL;
    int err = 0;
    if (!cr || !req) {
        json_object_put(req ? req : cr);
        return oom(ec);
    }
    if (held->how == WATCH_AHEAD) {
        /* Every deletion of the name's keys, told with the key's create
         * revision: one of a key before ours admits us. */
        json_object_object_add(cr, "key", etcd_new_bytes(held->key, held->dir));
        json_object_object_add(cr, "range_end", etcd_range_end(held->key, held->dir));
        json_object_object_add(cr, "prev_kv", json_object_new_boolean(1));
        w.before = (int64_t)held->base.token;
    } else {
        json_object_object_add(cr, "key", etcd_new_bytes(key, klen));
    }
    w.any = held->how == WATCH_CHANGE;
    if (!w.any && (filters = json_object_new_array()) != NULL)
        json_object_array_add(filters, json_object_new_string("NOPUT"));
    if (!w.any)
        json_object_object_add(cr, "filters", filters); /* NULL: a null, never sent */
    pthread_mutex_lock(&ec->site.mu);
    size_t ep = ec->site.cur;
    pthread_mutex_unlock(&ec->site.mu);
    const char *body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    CURL *h = ec->watch;
    curl_easy_reset(h);
    if (!etcd_body_ok(body)) {
        err = oom(ec);
        goto out;
    }
    if ((err = etcd_prepare(&ec->site, h, ep, "/v3/watch", body, 1, &hdr)) != 0)
        goto out;
    struct curl_slist *more = curl_slist_append(hdr, "Grpc-Metadata-hasleader: true");
    if (!more) {
        err = oom(ec);
        goto out;
    }
    hdr = more;
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_watch);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &w);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)ec->site.connect_ms);
    curl_multi_add_handle(ec->multi, h);
    for (int checked = 0;;) {
        int running = 0;
        curl_multi_perform(ec->multi, &running);
        if (w.done == 1) {
            __atomic_add_fetch(&ec->watch_events, 1, __ATOMIC_RELAXED);
            break;
        }
        if (w.created && !checked && !w.done) {
            int gone = 0;
            checked = 1;
            if ((err = looked_again(ec, held, key, klen, create, &gone)) != 0)
                break;
            if (gone)
                break; /* gone before the watch started: err 0 */
        }
        if (w.done || !running) {
            err = 1;
            break;
        }
        uint64_t now = dlock_monotonic_ns();
        if (wt->until && now >= wt->until) {
            err = DLOCK_ETIMEDOUT;
            break;
        }
        if (now >= wt->next_keep) {
            if ((err = keep_during_wait(ec, wt)) != 0)
                break;
            pthread_mutex_lock(&ec->site.mu);
            size_t cur = ec->site.cur;
            pthread_mutex_unlock(&ec->site.mu);
            if (cur != ep) { /* the keep-alive found this endpoint out of reach */
                err = 1;
                break;
            }
            continue;
        }
        uint64_t wake = wt->next_keep;
        if (wt->until && wt->until < wake)
            wake = wt->until;
        int ms = (int)((wake - now + MS - 1) / MS);
        struct curl_waitfd cancel = {wt->cancel_fd, CURL_WAIT_POLLIN, 0};
        curl_multi_poll(ec->multi, &cancel, wt->cancel_fd >= 0, ms > 0 ? ms : 1, NULL);
        if (cancel.revents) {
            err = DLOCK_ECANCELED;
            break;
        }
    }
    curl_multi_remove_handle(ec->multi, h);
out:
    curl_slist_free_all(hdr);
    json_object_put(req);
    etcd_stream_free(&w);
    return err;
}

uint64_t dlock_etcd_watch_events(dlock_client *c)
{
    return __atomic_load_n(&((struct etcd_conn *)c->conn)->watch_events, __ATOMIC_RELAXED);
}

/* ---- acquire ---------------------------------------------------------------- */

/*
 * The grant, in one transaction: if every key of the name was created at
 * or after ours (a compare over the name's range: none is before it) and
 * ours is still there, our key moves to the lock's own lease and we hold.
 * Otherwise it reads ours (still there?) and the key just before it. 0
 * with *pred NULL when granted, else *pred and *rev (the read's
 * revision, from which its deletion is watched).
 */
static int claim(struct etcd_conn *ec, struct etcd_held *held, struct etcd_kv *pred, int64_t *rev)
{
    json_object *req = json_object_new_object(), *cmps = json_object_new_array();
    json_object *ok = json_object_new_array(), *ko = json_object_new_array(), *root;
    json_object *own = json_object_new_object();
    json_object *first = etcd_create_cmp(held->key, held->dir, "GREATER",
                                         (int64_t)held->base.token - 1);
    if (!req || !cmps || !ok || !ko || !first || !own) {
        json_object_put(req), json_object_put(cmps), json_object_put(ok);
        json_object_put(ko), json_object_put(first), json_object_put(own);
        return oom(ec);
    }
    json_object_object_add(first, "range_end", etcd_range_end(held->key, held->dir));
    json_object_array_add(cmps, first);
    json_object_array_add(cmps, etcd_create_cmp(held->key, held->klen, "EQUAL",
                                                (int64_t)held->base.token));
    json_object_array_add(ok, etcd_put_lease(held->key, held->klen, held->lease));
    json_object_object_add(own, "key", etcd_new_bytes(held->key, held->klen));
    json_object_object_add(own, "count_only", json_object_new_boolean(1));
    json_object_array_add(ko, etcd_wrap("request_range", own));
    json_object_array_add(ko, etcd_wrap("request_range",
                                        etcd_range_req(held->key, held->dir, RANGE_DESCEND, 1,
                                                       (int64_t)held->base.token - 1)));
    json_object_object_add(req, "compare", cmps);
    json_object_object_add(req, "success", ok);
    json_object_object_add(req, "failure", ko);
    memset(pred, 0, sizeof *pred);
    int err = etcd_txn(ec, req, "reading the queue", 2, &root);
    if (err)
        return err; /* 2: the lock's lease expired while the store was out of reach */
    *rev = etcd_int(etcd_get(root, "header"), "revision");
    if (json_object_get_boolean(etcd_get(root, "succeeded"))) {
        held->waiting = 0;
        json_object_put(root);
        return 0;
    }
    json_object *rs = etcd_get(root, "responses");
    json_object *mine = rs ? etcd_get(json_object_array_get_idx(rs, 0), "response_range") : NULL;
    json_object *before = rs ? etcd_get(json_object_array_get_idx(rs, 1), "response_range") : NULL;
    if (!mine || !before) {
        err = dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: reading the queue: a reply without"
                           " its two ranges", ec->where);
    } else if (etcd_int(mine, "count") == 0) {
        err = etcd_place_lost(ec);
    } else if (!etcd_kvs_of(before) || json_object_array_length(etcd_kvs_of(before)) == 0) {
        /* Nobody before us, yet the compare failed: a key created in
         * between went. Read again. */
        err = 1;
    } else if (etcd_kv_read(json_object_array_get_idx(etcd_kvs_of(before), 0), pred) != 0) {
        err = dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: reading the queue: a bad key",
                           ec->where);
    }
    json_object_put(root);
    return err;
}

/* The waiters' lease, kept alive or granted anew. */
static int wait_lease(struct etcd_conn *ec)
{
    uint64_t now = dlock_monotonic_ns();
    int64_t ttl;
    if (ec->stale_lease) {
        /* Keys a failed wait could not delete go with it now. */
        dlock_errsave save;
        dlock_err_save(cl(ec), &save);
        int err = lease_revoke(ec, &ec->app, ec->stale_lease, call_until(ec));
        dlock_err_restore(cl(ec), &save);
        if (err == DLOCK_ECANCELED) /* cut short: the next wait revokes it again */
            return dlock_cancelled(cl(ec));
        ec->stale_lease = 0;
    }
    if (ec->wait_lease && now - ec->wait_kept < (WAIT_TTL_S * 1000 - 500) * MS) {
        int err = lease_keepalive(ec, &ec->app, ec->wait_lease, call_until(ec), &ttl);
        if (err == 0) {
            ec->wait_kept = now;
            return 0;
        }
        if (err != DLOCK_ELOST)
            return err;
        dlock_err_clear(cl(ec));
    }
    ec->wait_lease = 0;
    int err = lease_grant(ec, &ec->app, WAIT_TTL_S, call_until(ec), &ec->wait_lease);
    if (err == 0)
        ec->wait_kept = now;
    return err;
}

/*
 * Our key, in one transaction. If the name has no key at all (a compare
 * over its range: every key's create revision is 0 only when there is
 * none), ours is created on the lock's own lease: held, in one round trip.
 * Otherwise a try creates nothing and reads the oldest key (busy), and a
 * wait creates ours on the waiters' lease and reads the name's two newest
 * keys (ours and the one before it, which it watches) and the oldest (its
 * kind: DLOCK_EMODE when a semaphore's). Both puts ask for
 * the key's previous version: a repeat after a lost reply finds our key
 * there, and reads the queue again instead (claim). A key's create
 * revision is the revision of the transaction that made it: the token.
 */
static int create_key(struct etcd_conn *ec, struct etcd_held *held, const dlock_request *req,
                      int try, struct etcd_kv *pred, int64_t *rev)
{
    if (held->kind != ETCD_WRITER)
        return etcd_create_mode_key(ec, held, req, try, pred);
    json_object *ok = json_object_new_array(), *ko = json_object_new_array(), *root;
    if (ok)
        json_object_array_add(ok, etcd_put_key(held, req->owner_hex, held->lease));
    if (ko && !try)
        json_object_array_add(ko, etcd_put_key(held, req->owner_hex, ec->wait_lease));
    if (ko && !try)
        json_object_array_add(ko, etcd_wrap("request_range", etcd_range_req(held->key, held->dir,
                                                                            RANGE_DESCEND, 2, 0)));
    /* the oldest key (a try's busy reply; a wait's kind check) */
    if (ko)
        json_object_array_add(ko, etcd_wrap("request_range", etcd_range_req(held->key, held->dir,
                                                                            "ASCEND", 1, 0)));
    int err = etcd_create_txn(ec, held, ok, ko, try, &root);
    if (err)
        return err;
    json_object *rs = etcd_get(root, "responses");
    int succeeded = json_object_get_boolean(etcd_get(root, "succeeded"));
    json_object *put = !succeeded && try ? NULL
                       : etcd_get(json_object_array_get_idx(rs, 0), "response_put");
    json_object *range = !succeeded ? etcd_get(json_object_array_get_idx(rs, try ? 0 : 1),
                                               "response_range") : NULL;
    json_object *kvs = etcd_kvs_of(range);
    memset(pred, 0, sizeof *pred);
    *rev = etcd_int(etcd_get(root, "header"), "revision");
    held->waiting = !succeeded && !try;
    if (!rs || ((succeeded || !try) && !put) || (!succeeded && !kvs)) {
        json_object_put(root);
        return dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: creating the lock key: a reply"
                            " without its parts", ec->where);
    }
    if (!succeeded && !try &&
        (err = etcd_kind_check_range(ec, held, req, etcd_get(json_object_array_get_idx(rs, 2),
                                                             "response_range"))) != 0) {
        json_object_put(root);
        return err;
    }
    if (put && etcd_get(put, "prev_kv")) {
        /* A repeat after a lost reply found our key: read what is before it. */
        held->base.token = (uint64_t)etcd_int(etcd_get(put, "prev_kv"), "create_revision");
        held->waiting = !succeeded;
        json_object_put(root);
        for (int i = 0; (err = claim(ec, held, pred, rev)) == 1 && i < 50; i++)
            pause_ms(10, 0, -1);
        return err == 1 ? dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: the queue would not"
                                       " settle", ec->where) : err;
    }
    if (succeeded || !try)
        held->base.token = (uint64_t)*rev;
    /* Busy: the oldest key; waiting: the one after ours (ours is the newest). */
    size_t at = try ? 0 : 1;
    if (!succeeded && json_object_array_length(kvs) > at &&
        etcd_kv_read(json_object_array_get_idx(kvs, at), pred) != 0) {
        json_object_put(root);
        return oom(ec);
    }
    json_object_put(root);
    if (try && pred->key && pred->klen == held->klen &&
        memcmp(pred->key, held->key, held->klen) == 0) {
        /* A try repeated after a lost reply: the oldest key is the one its
         * first attempt created (on an empty range): held. */
        held->base.token = (uint64_t)pred->create;
        free(pred->key);
        memset(pred, 0, sizeof *pred);
        return 0;
    }
    if (!succeeded && !pred->key)
        return dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: creating the lock key: the name has"
                            " keys, yet none before ours", ec->where);
    return 0;
}

/* The waiters' lease for a new wait: the client's own if it was kept
 * alive recently enough to outlive the first keep-alive of the wait,
 * else kept alive or granted now (a round trip). */
static int wait_lease_for_wait(struct etcd_conn *ec)
{
    if (ec->wait_lease && !ec->stale_lease &&
        dlock_monotonic_ns() - ec->wait_kept < (WAIT_TTL_S * 1000 - 1500) * MS)
        return 0;
    return wait_lease(ec);
}

static void held_free(struct etcd_held *held)
{
    if (held) {
        free(held->key);
        free(held);
    }
}

/* Deletes held's key if it still has held's create revision (its token;
 * none yet: the key's name is this acquire's alone), in one transaction.
 * 0 with *deleted (whether it was there to delete), or the call's error. */
static int delete_key(struct etcd_conn *ec, struct etcd_held *held, uint64_t until,
                      const char *what, int *deleted)
{
    json_object *req = json_object_new_object(), *cmps = json_object_new_array();
    json_object *ok = json_object_new_array(), *del = json_object_new_object(), *root;
    if (!req || !cmps || !ok || !del) {
        json_object_put(req), json_object_put(cmps), json_object_put(ok), json_object_put(del);
        return oom(ec);
    }
    if (held->base.token)
        json_object_array_add(cmps, etcd_create_cmp(held->key, held->klen, "EQUAL",
                                                    (int64_t)held->base.token));
    json_object_object_add(del, "key", etcd_new_bytes(held->key, held->klen));
    json_object_array_add(ok, etcd_wrap("request_delete_range", del));
    json_object_object_add(req, "compare", cmps);
    json_object_object_add(req, "success", ok);
    int err = etcd_call_ok(ec, &ec->app, "/v3/kv/txn", req, until, DLOCK_ECONNECT, what, &root);
    if (err)
        return err;
    *deleted = json_object_get_boolean(etcd_get(root, "succeeded"));
    json_object_put(root);
    return 0;
}

/* Leaves the queue (or gives a lock back) after a failure, keeping the
 * failure's error. */
static void give_up(struct etcd_conn *ec, struct etcd_held *held)
{
    dlock_errsave save;
    int deleted = 0;
    dlock_err_save(cl(ec), &save);
    if (held->waiting || held->queued) {
        /* Maybe on the waiters' lease, which goes on (even when the
         * create's reply was lost): delete the key itself, if it is still
         * ours (its name is this acquire's: a lease id of ours, or
         * random: nobody else's). */
        int gone = 0;
        deleted = delete_key(ec, held, call_until(ec), "leaving the queue", &gone) == 0;
        if (!deleted && ec->wait_lease) {
            /* The key may still be there, on the waiters' lease: that
             * lease must not be kept alive by the next wait (which would
             * queue behind it); it is revoked at the next chance, and
             * expires anyway within WAIT_TTL_S. */
            ec->stale_lease = ec->wait_lease;
            ec->wait_lease = 0;
        }
    }
    if (held->lease)
        lease_revoke(ec, &ec->app, held->lease, call_until(ec));
    dlock_err_restore(cl(ec), &save);
}


/*
 * Whether a wait goes on after err: a store out of reach (an election, a
 * member restarting) while the deadline has not passed and the waiter's
 * key may still live (its waiters' lease was kept alive less than its TTL
 * ago): 100 ms later it reads the queue again. A key known to be gone
 * ends the wait.
 */
static int transient(struct etcd_conn *ec, const struct wait *wt, int err)
{
    uint64_t now = dlock_monotonic_ns();
    /* layout=etcd3: no key while waiting; the lock's lease must live. */
    int single = ec->layout == ETCD_LAYOUT_ETCD3;
    uint64_t kept = single ? wt->lease_from : ec->wait_kept;
    uint64_t ttl_ms = single ? wt->held->ttl_ms : WAIT_TTL_S * 1000;
    if (err != DLOCK_ECONNECT || ec->lost_place || (wt->until && now >= wt->until) ||
        now - kept >= ttl_ms * MS)
        return 0;
    wait_pause(wt, 100);
    dlock_err_clear(cl(ec));
    return 1;
}

static int etcd_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    struct etcd_held *held = calloc(1, sizeof *held);
    struct etcd_kv pred = {0};
    int64_t rev = 0;
    int err;
    if (!held)
        return oom(ec);
    held->ttl_ms = req->ttl_ms;
    held->ttl_s = ttl_seconds(req->ttl_ms);
    if (ec->layout == ETCD_LAYOUT_ETCD3)
        held->key = etcd_single_key(ec, req->name, req->name_len, &held->klen);
    else
        held->key = etcd_name_dir(ec, req->name, req->name_len, &held->dir);
    if (!held->key) {
        free(held);
        return oom(ec);
    }
    ec->lost_place = 0;
    /* A deadline wait's calls end by the deadline (a call in flight then
     * is cut); its cleanup by the deadline + DEADLINE_SLACK_MS. */
    ec->cap = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns : 0;
    struct wait wt = {.held = held,
                      .cancel_fd = req->cancel_fd,
                      .until = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns : 0,
                      .lease_from = dlock_monotonic_ns()};
    /* A cancel also ends the call in flight (a keep-alive or a read into a
     * silent network would otherwise run its whole `timeout`); the
     * cleanup below is not cut short by it. */
    ec->app.cancel_fd = req->cancel_fd;
    int single = ec->layout == ETCD_LAYOUT_ETCD3;
    /* A pooled lease (layout=dlock), else one granted now. The key's
     * name: the lease id; on a pooled lease, whose id named a
     * key already, 16 random hex digits, so that no key's name comes back
     * (a waiter of the previous release knows the key before its own by
     * its name only). */
    uint64_t id = 0;
    if ((err = single ? 0 : pool_take(ec, held, &wt.lease_from)) == 0) {
        held->kept = wt.lease_from;
        err = lease_grant(ec, &ec->app, held->ttl_s, call_until(ec), &held->lease);
    } else if (err == 1) {
        err = 0;
        if (dlock_random_bytes(&id, sizeof id) != 0)
            id = 0; /* the lease id again: waiters tell keys by create revision */
    }
    if (!id)
        id = (uint64_t)held->lease;
    if (err) {
        ec->app.cancel_fd = -1;
        ec->cap = 0;
        held_free(held);
        return err;
    }
    held->kind = req->limit ? ETCD_PERMIT
                 : req->mode == DLOCK_MODE_SHARED ? ETCD_READER : ETCD_WRITER;
    held->limit = req->limit;
    char tag[16] = "";
    if (held->kind == ETCD_READER)
        snprintf(tag, sizeof tag, "r");
    else if (held->kind == ETCD_PERMIT)
        snprintf(tag, sizeof tag, "s%u-", (unsigned)req->limit);
    if (!single)
        held->klen = held->dir + (size_t)sprintf(held->key + held->dir, "%s%016" PRIx64, tag, id);
    int try = req->wait == DLOCK_WAIT_TRY;
    held->queued = !try && !single;
    /* layout=etcd3: 1 is a key gone between compare and read: again. */
    for (int i = 0; single && (err = etcd_single_claim(ec, held, req, &pred)) == 1; i++)
        if (i == 50) {
            err = dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: the key would not settle",
                               ec->where);
            break;
        }
    if (single && err == 2)
        err = dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the lock's lease expired before its"
                           " key was created", ec->where);
    for (int tries = 0; !single; tries++) {
        if (!try && (err = wait_lease_for_wait(ec)) != 0)
            goto fail;
        if ((err = create_key(ec, held, req, try, &pred, &rev)) != 1)
            break;
        if (id != (uint64_t)held->lease) {
            /* A lease of the transaction was gone (it created nothing):
             * the waiters' or, revoked by someone else, the pooled one.
             * The lock's lease is granted anew too, the key named by it. */
            dlock_errsave save;
            dlock_err_save(cl(ec), &save);
            lease_revoke(ec, &ec->app, held->lease, call_until(ec));
            dlock_err_restore(cl(ec), &save);
            wt.lease_from = held->kept = dlock_monotonic_ns();
            if ((err = lease_grant(ec, &ec->app, held->ttl_s, call_until(ec), &held->lease)) != 0)
                goto fail;
            id = (uint64_t)held->lease;
            sprintf(held->key + held->dir, "%s%016" PRIx64, tag, id);
            tries--;
            continue;
        }
        if (tries) {
            err = etcd_place_lost(ec);
            goto fail;
        }
    }
    if (err)
        goto fail;
    if (pred.key && try) {
        if (single || held->kind != ETCD_WRITER ||
            (err = etcd_kind_check(ec, held, req, &pred)) == 0)
            err = dlock_seterr(cl(ec), DLOCK_EBUSY, "the lock is held by another owner");
        /* It created nothing: the lease goes back to the pool. */
        if (!single)
            pool_put(ec, held, call_until(ec));
        goto fail;
    }
    /* The first keep-alives: the lock's lease a third of its TTL after
     * its grant, the waiters' a third of its TTL after it was last kept. */
    wt.next_keep = wt.lease_from + keep_every_ms(held) * MS;
    if (!single && ec->wait_kept + WAIT_TTL_S * 1000 / 3 * MS < wt.next_keep)
        wt.next_keep = ec->wait_kept + WAIT_TTL_S * 1000 / 3 * MS;
    /* A reader or permit admitted with its key still on the waiters'
     * lease, or told by its WATCH_AHEAD watch: moved (grant_mode). */
    int admitted = !pred.key;
    for (int quick = 0, granted = !pred.key && !held->waiting; !granted;) {
        if (dlock_request_cancelled(req)) {
            err = dlock_cancelled(cl(ec));
            goto fail;
        }
        if (pred.key) {
            uint64_t started = dlock_monotonic_ns();
            err = watch_delete(ec, &wt, pred.key, pred.klen, pred.create);
            free(pred.key);
            pred.key = NULL;
            if (err == DLOCK_ECANCELED) {
                err = dlock_cancelled(cl(ec));
                goto fail;
            }
            if (err == DLOCK_ETIMEDOUT) {
                err = dlock_seterr(cl(ec), DLOCK_ETIMEDOUT,
                                   "the deadline passed with the lock still held elsewhere");
                goto fail;
            }
            if (err < 0 && !transient(ec, &wt, err))
                goto fail;
            /* A watch that keeps ending at once (a member refusing it):
             * not more than one start every 100 ms. */
            admitted = err == 0 && held->how == WATCH_AHEAD;
            quick = err == 1 && dlock_monotonic_ns() - started < 100 * MS ? quick + 1 : 0;
            if (quick > 2)
                wait_pause(&wt, 100);
        }
        if (single) {
            err = etcd_single_claim(ec, held, req, &pred);
        } else if (held->kind == ETCD_WRITER) {
            err = claim(ec, held, &pred, &rev);
        } else {
            if (!admitted)
                err = etcd_claim_mode(ec, held, &pred);
            if (admitted || (err == 0 && !pred.key))
                err = etcd_grant_mode(ec, held);
            admitted = 0;
        }
        if (err == 2) {
            /* The lock's lease ran out during an outage: a new one. */
            wt.lease_from = held->kept = dlock_monotonic_ns();
            if ((err = lease_grant(ec, &ec->app, held->ttl_s, call_until(ec), &held->lease)) != 0 &&
                !transient(ec, &wt, err))
                goto fail;
            continue;
        }
        if (err < 0 && !transient(ec, &wt, err))
            goto fail;
        if (err == 1) { /* a key came and went between compare and read: again */
            wait_pause(&wt, 10);
            if (wt.until && dlock_monotonic_ns() >= wt.until) {
                err = dlock_seterr(cl(ec), DLOCK_ETIMEDOUT,
                                   "the deadline passed with the lock still held elsewhere");
                goto fail;
            }
        }
        granted = err == 0 && !pred.key;
    }
    ec->cap = 0;
    ec->app.cancel_fd = -1;
    held->end_ns = wt.lease_from + (uint64_t)held->ttl_ms * MS;
    held->base.lease_end_ns = held->end_ns;
    *heldp = &held->base;
    return 0;
fail:
    free(pred.key);
    ec->app.cancel_fd = -1;
    if ((err == DLOCK_ECONNECT || err == DLOCK_ETIMEDOUT) && dlock_request_cancelled(req)) {
        /* A call that was in flight at the cancel failed (the store went
         * silent): the wait ends as cancelled, the error kept in the detail. */
        char was[DLOCK_ERRMSG_MAX];
        snprintf(was, sizeof was, "%s", dlock_errmsg(cl(ec)));
        err = dlock_seterr(cl(ec), DLOCK_ECANCELED, "the wait was cancelled (%s)", was);
    }
    if (err == DLOCK_ECANCELED) {
        /* Given up as at a deadline: the cleanup gets CLEANUP_CAP_MS. */
        ec->cap = dlock_monotonic_ns() + CLEANUP_CAP_MS * MS;
    } else if (wt.until) {
        /* A call cut short by the deadline is the deadline's doing. The
         * whole cleanup ends by the deadline + DEADLINE_SLACK_MS, however
         * late the failure (what it cannot do by then, the leases undo:
         * the waiters' within WAIT_TTL_S). */
        /* (libcurl counts whole milliseconds: a call cut at the deadline
         * may end up to 1 ms before it.) */
        if (err == DLOCK_ECONNECT && !ec->lost_place && dlock_monotonic_ns() + MS > wt.until) {
            char was[DLOCK_ERRMSG_MAX];
            snprintf(was, sizeof was, "%s", dlock_errmsg(cl(ec)));
            err = dlock_seterr(cl(ec), DLOCK_ETIMEDOUT, "the deadline passed (%s)", was);
        }
        ec->cap = wt.until + CLEANUP_CAP_MS * MS;
    }
    give_up(ec, held);
    ec->cap = 0;
    held_free(held);
    return err;
}

/*
 * Deletes our key if it still has our create revision (one transaction),
 * the lease back to the pool. A leader's lease (its election value is on
 * it) and python-etcd3's layout are revoked instead: every key on the
 * lease goes in the same raft entry.
 */
static int etcd_release(dlock_conn *conn, dlock_held *h)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    struct etcd_held *held = (struct etcd_held *)h;
    uint64_t until = core_bound(call_until(ec));
    if (held->published || ec->layout == ETCD_LAYOUT_ETCD3) {
        int err = lease_revoke(ec, &ec->app, held->lease, until);
        held_free(held);
        return err;
    }
    int deleted = 0, err = delete_key(ec, held, until, "releasing the lock", &deleted);
    if (err) { /* the key, if still there, goes with its lease */
        held_free(held);
        return err;
    }
    if (deleted)
        pool_put(ec, held, until);
    else /* gone with its lease (DLOCK_ELOST), or deleted by an earlier
          * attempt whose reply was lost, or moved by a renewal whose reply
          * was lost (as a revoke would tell): the lease goes */
        err = lease_revoke(ec, &ec->app, held->lease, until);
    held_free(held);
    return err;
}

/* Whether our key is still there with our create revision. */
static int check_key(struct etcd_conn *ec, struct etcd_http *h, struct etcd_held *held,
                     uint64_t until)
{
    json_object *req = json_object_new_object(), *root;
    if (req)
        json_object_object_add(req, "key", etcd_new_bytes(held->key, held->klen));
    int err = etcd_call_ok(ec, h, "/v3/kv/range", req, until, DLOCK_ECONNECT,
                           "reading the lock key", &root);
    if (err)
        return err;
    json_object *kvs = etcd_kvs_of(root);
    json_object *kv = kvs && json_object_array_length(kvs) > 0 ? json_object_array_get_idx(kvs, 0)
                                                               : NULL;
    int64_t create = etcd_int(kv, "create_revision"), lease = etcd_int(kv, "lease");
    json_object_put(root);
    if (create != (int64_t)held->base.token)
        return dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the lock's key is gone", ec->where);
    /* On another lease (a move whose reply was lost), nobody keeps it. */
    if (lease != held->lease)
        return dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the lock's key is on a lease this"
                            " client does not keep (a renewal's reply was lost)", ec->where);
    return 0;
}

/* Moves the key to a new lease of ttl_s (renew with another TTL). */
static int move_lease(struct etcd_conn *ec, struct etcd_http *h, struct etcd_held *held,
                      int64_t ttl_s, uint64_t until)
{
    int64_t id;
    int err = lease_grant(ec, h, ttl_s, until, &id);
    if (err)
        return err;
    json_object *txn = json_object_new_object(), *cmp = json_object_new_object();
    json_object *cmps = json_object_new_array(), *ok = json_object_new_array();
    json_object *put = json_object_new_object(), *root;
    if (!txn || !cmp || !cmps || !ok || !put) {
        json_object_put(txn), json_object_put(cmp), json_object_put(cmps);
        json_object_put(ok), json_object_put(put);
        lease_revoke(ec, h, id, until);
        return oom(ec);
    }
    json_object_object_add(cmp, "key", etcd_new_bytes(held->key, held->klen));
    json_object_object_add(cmp, "target", json_object_new_string("CREATE"));
    json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
    json_object_object_add(cmp, "create_revision", etcd_new_int((int64_t)held->base.token));
    json_object_array_add(cmps, cmp);
    json_object_object_add(put, "key", etcd_new_bytes(held->key, held->klen));
    json_object_object_add(put, "ignore_value", json_object_new_boolean(1));
    json_object_object_add(put, "lease", etcd_new_int(id));
    json_object_array_add(ok, etcd_wrap("request_put", put));
    if (ec->layout == ETCD_LAYOUT_DLOCK && held->kind == ETCD_WRITER)
        json_object_array_add(ok, etcd_value_move(held, id)); /* an election's value */
    json_object_object_add(txn, "compare", cmps);
    json_object_object_add(txn, "success", ok);
    dlock_errsave save;
    if ((err = etcd_call_ok(ec, h, "/v3/kv/txn", txn, until, DLOCK_ECONNECT, "moving the lease",
                            &root)) != 0) {
        /* The move may have happened: the new lease goes, and with it the
         * key if it moved (the next check then says lost: safe). */
        dlock_err_save(cl(ec), &save);
        lease_revoke(ec, h, id, until);
        dlock_err_restore(cl(ec), &save);
        return err;
    }
    int moved = json_object_get_boolean(etcd_get(root, "succeeded"));
    json_object_put(root);
    if (!moved) {
        lease_revoke(ec, h, id, until);
        return dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the lock's key is gone", ec->where);
    }
    int64_t old = held->lease;
    held->lease = id;
    held->ttl_s = ttl_s;
    dlock_err_save(cl(ec), &save);
    lease_revoke(ec, h, old, until); /* holds nothing now; it expires anyway */
    dlock_err_restore(cl(ec), &save);
    return 0;
}

static int renew_on(struct etcd_conn *ec, struct etcd_http *h, struct etcd_held *held,
                    uint32_t ttl_ms)
{
    uint64_t sent = dlock_monotonic_ns(), until = core_bound(sent + ec->site.timeout_ms * MS);
    int64_t ttl_s = ttl_seconds(ttl_ms), got;
    int err;
    if (sent >= held->end_ns) {
        /* The lease the client was promised is over; what etcd still
         * keeps (TTLs in whole seconds, at least its minimum) is not
         * renewed but given back. */
        dlock_errsave save;
        dlock_err_save(cl(ec), &save);
        /* Past the core's bound (the lease end) too: the lost lock's
         * release bound for the giving back. */
        lease_revoke(ec, h, held->lease, until > sent ? until : sent + DLOCK_LOST_RELEASE_MS * MS);
        dlock_err_restore(cl(ec), &save);
        return dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the lease had ended %" PRIu64
                            " ms before the renewal", ec->where, (uint64_t)((sent - held->end_ns) / MS));
    }
    if (ttl_s != held->ttl_s) {
        err = move_lease(ec, h, held, ttl_s, until);
        /* Failed, the key may be on the new lease, which nobody keeps:
         * the client's lease ends no later than that one. */
        if (err && sent + (uint64_t)ttl_ms * MS < held->end_ns)
            held->end_ns = sent + (uint64_t)ttl_ms * MS;
    } else if ((err = lease_keepalive(ec, h, held->lease, until, &got)) == 0) {
        err = check_key(ec, h, held, until);
    }
    if (err == 0) {
        held->ttl_ms = ttl_ms;
        held->kept = sent;
        held->end_ns = sent + (uint64_t)ttl_ms * MS;
        held->base.lease_end_ns = held->end_ns;
    }
    return err;
}

static int etcd_renew(dlock_conn *conn, dlock_held *h, uint32_t ttl_ms)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    return renew_on(ec, &ec->app, (struct etcd_held *)h, ttl_ms);
}

/* The keeper's thread: its own HTTP connection; the site (token,
 * endpoint) is shared under its mutex. */
static int etcd_keep(dlock_conn *conn, dlock_held *h, uint32_t ttl_ms)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    return renew_on(ec, &ec->keeper, (struct etcd_held *)h, ttl_ms);
}

static int etcd_ping(dlock_conn *conn)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    json_object *root;
    int err = etcd_call_ok(ec, &ec->app, "/v3/maintenance/status", json_object_new_object(),
                           call_until(ec), DLOCK_ECONNECT, "status", &root);
    json_object_put(root);
    return err;
}

/* <prefix><tail>, malloc'd; NULL when out of memory. */
static char *prefix_key(struct etcd_conn *ec, const char *tail)
{
    size_t plen = strlen(ec->prefix), tlen = strlen(tail);
    char *k = malloc(plen + tlen + 1);
    if (k) {
        memcpy(k, ec->prefix, plen);
        memcpy(k + plen, tail, tlen + 1);
    }
    return k;
}

/* A call whose reply header's revision goes to *rev. */
static int call_revision(struct etcd_conn *ec, const char *path, json_object *req, uint64_t until,
                         const char *what, int64_t *rev)
{
    json_object *root;
    int err = etcd_call_ok(ec, &ec->app, path, req, until, DLOCK_ECONNECT, what, &root);
    if (err)
        return err;
    *rev = etcd_int(etcd_get(root, "header"), "revision");
    json_object_put(root);
    return 0;
}

/* The current revision: a count-only read of the prefix (which also
 * checks that the user may read it). */
static int current_revision(struct etcd_conn *ec, uint64_t until, int64_t *rev)
{
    char *dir = prefix_key(ec, "/");
    if (!dir)
        return oom(ec);
    json_object *req = etcd_range_req(dir, strlen(dir), "NONE", 0, 0);
    free(dir);
    if (req) {
        json_object_object_del(req, "sort_target");
        json_object_object_del(req, "sort_order");
        json_object_object_add(req, "count_only", json_object_new_boolean(1));
    }
    return call_revision(ec, "/v3/kv/range", req, until, "reading the prefix", rev);
}

static int etcd_token_top(dlock_conn *conn, uint64_t *top)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    int64_t rev;
    int err = current_revision(ec, call_until(ec), &rev);
    if (err == 0)
        *top = (uint64_t)rev;
    return err;
}

/* One write, to move the revision up by one (or more, with other
 * writers): a put of "<prefix>/!revision", a key of the prefix's own (a
 * name's keys are "<prefix>/<name>/<lease id>"); with layout=etcd3, where
 * "<prefix>/<name>" is a name's key, "<prefix>/" (no name is empty). *rev
 * is the put's. */
static int step_revision(struct etcd_conn *ec, uint64_t until, int64_t *rev)
{
    char *key = prefix_key(ec, ec->layout == ETCD_LAYOUT_ETCD3 ? "/" : "/!revision");
    if (!key)
        return oom(ec);
    json_object *req = json_object_new_object();
    if (req) {
        json_object_object_add(req, "key", etcd_new_bytes(key, strlen(key)));
        json_object_object_add(req, "value", etcd_new_bytes("", 0));
    }
    free(key);
    return call_revision(ec, "/v3/kv/put", req, until, "moving the revision up", rev);
}

/* 0 when every later create revision is above floor: floor is at most the
 * current revision, or a few writes reach it. dlock migrate sets the
 * other store's floor to etcd's current revision, so a list's other part
 * can come back with that + 1 (or + the number of lists granting at once)
 * while etcd is quiet: up to DLOCK_RAISE_STEPS_MAX revisions are made up
 * by writes, one each. Anything higher is refused naming both. */
static int check_floor(struct etcd_conn *ec, uint64_t floor, const char *what)
{
    int64_t rev;
    uint64_t until = call_until(ec);
    int err = current_revision(ec, until, &rev);
    for (int i = 0; err == 0 && i < DLOCK_RAISE_STEPS_MAX && rev >= 0 && floor > (uint64_t)rev &&
                    floor - (uint64_t)rev <= DLOCK_RAISE_STEPS_MAX;
         i++)
        err = step_revision(ec, until, &rev);
    if (err)
        return err;
    if (rev >= 0 && floor <= (uint64_t)rev)
        return 0;
    return dlock_seterr(cl(ec), DLOCK_ENOTSUP,
                        "etcd's tokens are its revisions and cannot be raised: %s %" PRIu64
                        " is above the current revision %" PRId64
                        " (by more than the %d writes dlock makes to move it up)",
                        what, floor, rev, DLOCK_RAISE_STEPS_MAX);
}

static int etcd_raise_floor(dlock_conn *conn, uint64_t floor)
{
    return check_floor((struct etcd_conn *)conn, floor, "the floor");
}

static int etcd_raise_token(dlock_conn *conn, dlock_held *h, uint64_t floor)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    struct etcd_held *held = (struct etcd_held *)h;
    int err = check_key(ec, &ec->app, held, call_until(ec));
    return err ? err : check_floor(ec, floor, "the token");
}

/* ---- inspect ------------------------------------------------------------- */

static int inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    if (ec->layout == ETCD_LAYOUT_ETCD3)
        return etcd_single_inspect(ec, name, len, info);
    return etcd_inspect(conn, name, len, info);
}

static int inspect_holders(dlock_conn *conn, const char *name, size_t len,
                           dlock_holder *holders, size_t capacity, size_t *count)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    if (ec->layout == ETCD_LAYOUT_ETCD3)
        return etcd_single_inspect_holders(ec, name, len, holders, capacity, count);
    return etcd_inspect_holders(conn, name, len, holders, capacity, count);
}

/* ---- open and close ------------------------------------------------------ */

static void etcd_close(dlock_conn *conn)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    if (!ec)
        return;
    pool_drain(ec);
    etcd_http_free(&ec->app);
    etcd_http_free(&ec->keeper);
    if (ec->watch)
        curl_easy_cleanup(ec->watch);
    if (ec->multi)
        curl_multi_cleanup(ec->multi);
    for (size_t i = 0; i < ec->site.n; i++)
        free(ec->site.urls[i]);
    free(ec->site.urls);
    free(ec->site.user);
    if (ec->site.password) /* don't leave the secret lying in freed memory */
        explicit_bzero(ec->site.password, strlen(ec->site.password));
    free(ec->site.password);
    free(ec->site.cacert);
    free(ec->site.cert);
    free(ec->site.key);
    free(ec->site.token);
    free(ec->prefix);
    pthread_mutex_destroy(&ec->site.mu);
    free(ec);
}

static int dup_param(struct etcd_conn *ec, const dlock_uri *uri, const char *key, char **out)
{
    const char *v = dlock_uri_param(uri, key);
    if (!v)
        return 0;
    if (!v[0])
        return dlock_seterr(cl(ec), DLOCK_EBADURI, "etcd: %s= needs a file name", key);
    if (!(*out = strdup(v)))
        return oom(ec);
    return 0;
}

static int parse_uri(struct etcd_conn *ec, const dlock_uri *uri)
{
    uint64_t connect_ms = DEFAULT_CONNECT_MS, timeout_ms = DEFAULT_TIMEOUT_MS;
    const char *path = dlock_uri_path(uri);
    int err, tls = 0, layout = ETCD_LAYOUT_DLOCK;
    if ((err = dlock_uri_param_choice(cl(ec), uri, "layout", etcd_layouts, &layout)) ||
        (err = dlock_uri_param_uint(cl(ec), uri, "connect_timeout", 1, 3600000, &connect_ms)) ||
        (err = dlock_uri_param_uint(cl(ec), uri, "timeout", 1, 3600000, &timeout_ms)) ||
        (err = dlock_uri_param_bool(cl(ec), uri, "tls", &tls)) ||
        (err = dup_param(ec, uri, "cacert", &ec->site.cacert)) ||
        (err = dup_param(ec, uri, "cert", &ec->site.cert)) ||
        (err = dup_param(ec, uri, "key", &ec->site.key)))
        return err;
    if (!!ec->site.cert != !!ec->site.key)
        return dlock_seterr(cl(ec), DLOCK_EBADURI, "etcd: cert= and key= go together (a client"
                            " certificate and its private key)");
    ec->layout = (enum etcd_layout)layout;
    if (ec->layout == ETCD_LAYOUT_ETCD3) /* exclusive, no queue (etcd_single.c) */
        ec->base.caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING |
                        DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_CANCEL;
    ec->site.tls = tls || ec->site.cacert || ec->site.cert;
    ec->site.connect_ms = connect_ms;
    ec->site.timeout_ms = timeout_ms;
    size_t n = dlock_uri_host_count(uri);
    if (n == 0)
        return dlock_seterr(cl(ec), DLOCK_EBADURI, "etcd: the URI names no endpoint (host:port)");
    if (!(ec->site.urls = calloc(n, sizeof *ec->site.urls)))
        return oom(ec);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        const char *host = dlock_uri_host(uri, i);
        unsigned port = dlock_uri_port(uri, i) ? dlock_uri_port(uri, i) : DEFAULT_PORT;
        int v6 = strchr(host, ':') != NULL;
        char url[300];
        if (snprintf(url, sizeof url, "%s://%s%s%s:%u", ec->site.tls ? "https" : "http",
                     v6 ? "[" : "", host, v6 ? "]" : "", port) >= (int)sizeof url)
            return dlock_seterr(cl(ec), DLOCK_EBADURI, "etcd: host name too long");
        if (!(ec->site.urls[i] = strdup(url)))
            return oom(ec);
        ec->site.n = i + 1;
        w += (size_t)snprintf(ec->where + w, w < sizeof ec->where ? sizeof ec->where - w : 0,
                              "%s%s%s%s:%u", i ? "," : "", v6 ? "[" : "", host, v6 ? "]" : "",
                              port);
        if (w >= sizeof ec->where)
            w = sizeof ec->where - 1;
    }
    ec->site.where = ec->where;
    /* The prefix: the path without a trailing '/', "/dlock" when none
     * ("/locks", python-etcd3's, with layout=etcd3). */
    size_t plen = strlen(path);
    while (plen > 1 && path[plen - 1] == '/')
        plen--;
    if (plen <= 1)
        ec->prefix = strdup(ec->layout == ETCD_LAYOUT_ETCD3 ? ETCD3_PREFIX : DEFAULT_PREFIX);
    else
        ec->prefix = strndup(path, plen);
    if (!ec->prefix)
        return oom(ec);
    const char *user = dlock_uri_user(uri), *pw = dlock_uri_password(uri);
    if (user && !user[0] && pw && pw[0])
        return dlock_seterr(cl(ec), DLOCK_EBADURI, "etcd: a password needs a user name");
    if (user && user[0]) {
        if (!(ec->site.user = strdup(dlock_uri_user(uri))) ||
            (dlock_uri_password(uri) && !(ec->site.password = strdup(dlock_uri_password(uri)))))
            return oom(ec);
    } else if (dlock_uri_password(uri)) {
        return dlock_seterr(cl(ec), DLOCK_EBADURI, "etcd: a password needs a user name");
    }
    return 0;
}

static int etcd_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    struct etcd_conn *ec = calloc(1, sizeof *ec);
    int64_t rev;
    int err;
    if (!ec)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    ec->base.client = c;
    ec->site.client = c;
    pthread_mutex_init(&ec->site.mu, NULL);
    if ((err = parse_uri(ec, uri)) != 0 || (err = etcd_http_init(&ec->site, &ec->app)) != 0 ||
        (err = etcd_http_init(&ec->site, &ec->keeper)) != 0)
        goto fail;
    if (!(ec->watch = curl_easy_init()) || !(ec->multi = curl_multi_init())) {
        err = oom(ec);
        goto fail;
    }
    /* Reach a member (and authenticate) within connect_timeout. */
    uint64_t until = dlock_monotonic_ns() + ec->site.connect_ms * MS;
    if (ec->site.user && (err = etcd_authenticate(&ec->site, &ec->app, until, DLOCK_ECONNECT)) != 0)
        goto fail;
    if ((err = current_revision(ec, until, &rev)) != 0)
        goto fail;
    *connp = &ec->base;
    return 0;
fail:
    etcd_close(&ec->base);
    return err;
}

const dlock_backend dlock_etcd_backend = {
    DLOCK_BACKEND_INIT,
    .name = "etcd",
    .schemes = etcd_schemes,
    /* No HOLDER_DEATH: a dead holder's lock goes when its lease runs out. */
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_CANCEL | DLOCK_CAP_SHARED |
            DLOCK_CAP_SEMAPHORE | DLOCK_CAP_ELECTION | DLOCK_CAP_WATCH,
    .options = etcd_options,
    .open = etcd_open,
    .close = etcd_close,
    .acquire = etcd_acquire,
    .release = etcd_release,
    .renew = etcd_renew,
    .ping = etcd_ping,
    .keep = etcd_keep,
    .raise_token = etcd_raise_token,
    .token_top = etcd_token_top,
    .raise_floor = etcd_raise_floor,
    .inspect = inspect,
    .inspect_holders = inspect_holders,
    .publish = etcd_publish,
    .leader = etcd_leader,
    .wake = etcd_wake,
    .watch_open = etcd_watch_open,
    .watch_fd = etcd_watch_fd,
    .watch_read = etcd_watch_read,
    .watch_close = etcd_watch_close,
};
