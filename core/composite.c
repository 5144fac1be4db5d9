/*
 * Composite clients: one lock held in several stores at once, the way locks
 * move from one store to another without a gap. Opened from several URIs
 * separated by whitespace, in acquisition order, old store first:
 * "redis://old:6379/0 postgresql://new/app". Whitespace never occurs in a
 * URI, so one URI and a list cannot be confused.
 *
 * The composite is a backend of the core's own: its connection holds one
 * client per store, and its methods call each store's backend directly, so
 * everything the core does for a lock (the held-name check, reentrancy,
 * the keeper, loss reports) works on the composite as on any lock.
 *
 * An acquire takes the parts in the order listed under one deadline, all or
 * nothing: a part that fails releases the ones already taken before the
 * call returns. The grant's token is the largest of the parts' tokens, M,
 * and every part whose token is below M is raised to M (raise_token) before
 * the grant is reported, so that the composite's token is above everything
 * any of its stores granted for the name, and every later grant by any of
 * them alone is above it. A store that cannot raise its tokens to M
 * (ZooKeeper's are its transaction ids) fails the acquire with
 * DLOCK_ENOTSUP rather than hand out a token that a later grant of that
 * store alone could go below. Losing any part is losing the lock.
 *
 * Several names: a lock may also be several names at once
 * (dlock_acquire_names()), on one store or on a list. Its parts are then
 * every (store, name) pair, store-major (the stores in the order listed,
 * each store's names in byte order), and everything above applies to the
 * parts: one order for every client, so that two clients taking {a, b} and
 * {b, a} cannot deadlock; all or nothing; the token is the largest of every
 * part's and each part below it is raised. The same methods serve a
 * several-name lock on a single store: conn is then that store's own
 * connection, whose backend the parts call directly (store_at()).
 *
 * Leases: the capabilities a list declares are those every store gives (a
 * list with a file:// store is not freed for others when a TTL runs out:
 * the file part stays held). But for its holder the lock ends when the
 * first leased part's lease does, so the list's lease end is the earliest
 * of its leased parts' (each from the part's own send time, or the end the
 * part reported), and the core and the keeper go by it (dlock_client_expires).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/composite.h"
#include "core/internal.h"

struct comp_conn {
    dlock_conn base;
    int leased; /* some part has a lease */
    size_t n;
    dlock_client *part[];
};

/* One (store, name) pair of a lock. */
struct comp_part {
    size_t store;
    const char *name; /* the core's copy, which outlives the held */
    size_t name_len;
    uint64_t sent; /* when its lease last started, at the latest */
    dlock_held *h;
};

struct comp_held {
    dlock_held base;
    size_t n;
    size_t names; /* 1: details name the store only */
    struct comp_part part[];
};

/* A store a lock's parts live on: one of a list's, or a single store's own
 * connection (a several-name lock on one store). */
struct store {
    const dlock_backend *b;
    dlock_conn *conn;
    dlock_client *c;
};

static const char *const no_schemes[] = {NULL};
static const char *const no_options[] = {NULL};

static int is_list(const dlock_conn *conn)
{
    return conn->backend == &dlock_composite_backend;
}

static size_t store_count(const dlock_conn *conn)
{
    return is_list(conn) ? ((const struct comp_conn *)conn)->n : 1;
}

static struct store store_at(dlock_conn *conn, size_t i)
{
    if (is_list(conn)) {
        dlock_client *c = ((struct comp_conn *)conn)->part[i];
        return (struct store){c->backend, c->conn, c};
    }
    return (struct store){conn->backend, conn, conn->client};
}

/* Records on the lock's client what part k reported, naming the store (on
 * a list) and the name (on a several-name lock). Works on the keeper's
 * threads too: there every detail lives in the keeper's buffer. */
static int part_error(dlock_conn *conn, const struct comp_held *h, size_t k, int rc)
{
    const struct comp_part *p = &h->part[k];
    struct store s = store_at(conn, p->store);
    char where[160] = "", shown[52];
    dlock_errsave e;
    dlock_err_save(s.c, &e);
    if (is_list(conn))
        snprintf(where, sizeof where, "store %zu of %zu (%s)%s", p->store + 1,
                 store_count(conn), s.b->name, h->names > 1 ? ", " : "");
    if (h->names > 1) {
        size_t m = 0;
        for (size_t i = 0; i < p->name_len && m + 4 < sizeof shown; i++)
            shown[m++] = p->name[i] >= 0x20 && p->name[i] < 0x7f ? p->name[i] : '?';
        if (m < p->name_len)
            shown[m - 1] = shown[m - 2] = shown[m - 3] = '.';
        shown[m] = '\0';
        size_t used = strlen(where);
        snprintf(where + used, sizeof where - used, "name '%s'", shown);
    }
    return dlock_seterr(conn->client, rc, "%s: %s", where, e.msg[0] ? e.msg : dlock_strerror(rc));
}

static int store_leased(dlock_conn *conn, size_t i)
{
    return (dlock_client_caps(store_at(conn, i).c) & DLOCK_CAP_LEASE) != 0;
}

static int store_raises(dlock_conn *conn, size_t i)
{
    return (dlock_client_caps(store_at(conn, i).c) & DLOCK_CAP_RAISE) != 0;
}

/* What holds for the whole lock: what every store gives (see Leases above). */
static unsigned int comp_caps(const struct comp_conn *cc)
{
    unsigned int all = ~0u;
    for (size_t i = 0; i < cc->n; i++)
        all &= dlock_client_caps(cc->part[i]);
    /* An election is read and watched on the first store alone. */
    all &= ~(unsigned)DLOCK_CAP_WATCH;
    return all | (dlock_client_caps(cc->part[0]) & DLOCK_CAP_ELECTION & all
                      ? dlock_client_caps(cc->part[0]) & DLOCK_CAP_WATCH
                      : 0);
}

static void comp_close(dlock_conn *conn)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    for (size_t i = 0; i < cc->n; i++)
        dlock_client_close(cc->part[i]);
    free(cc);
}

/* Releases the first n parts, last first. */
static void parts_release(dlock_conn *conn, struct comp_held *h, size_t n)
{
    dlock_errsave e;
    dlock_err_save(conn->client, &e); /* the failure being reported stays */
    for (size_t k = n; k-- > 0;) {
        struct store s = store_at(conn, h->part[k].store);
        s.b->release(s.conn, h->part[k].h);
        h->part[k].h = NULL;
    }
    dlock_err_restore(conn->client, &e);
}

/* The earliest end among the leased parts' leases (0: no part has one). */
static uint64_t parts_lease_end(dlock_conn *conn, const struct comp_held *h, uint32_t ttl_ms)
{
    uint64_t end = 0;
    for (size_t k = 0; k < h->n; k++) {
        const struct comp_part *p = &h->part[k];
        if (!p->h || !store_leased(conn, p->store))
            continue;
        uint64_t e = dlock_lease_end(store_at(conn, p->store).c, p->h, p->sent, ttl_ms);
        if (!end || e < end)
            end = e;
    }
    return end;
}

/* Raises part k's later tokens above floor. */
static int part_raise(dlock_conn *conn, struct comp_held *h, size_t k, uint64_t floor)
{
    struct store s = store_at(conn, h->part[k].store);
    int rc;
    dlock_err_clear(s.c);
    if (!dlock_method(s.b, raise_token))
        rc = dlock_seterr(s.c, DLOCK_ENOTSUP, "the %s backend cannot raise its tokens", s.b->name);
    else
        rc = s.b->raise_token(s.conn, h->part[k].h, floor);
    return rc ? part_error(conn, h, k, rc) : 0;
}

/* Raises every part whose token is below floor (all parts: below_only 0).
 * The stores that cannot raise go first: they only check, so a refusal
 * leaves every counter as it was. */
static int parts_raise(dlock_conn *conn, struct comp_held *h, uint64_t floor, int below_only)
{
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < h->n; k++) {
            if (store_raises(conn, h->part[k].store) != pass ||
                (below_only && h->part[k].h->token >= floor))
                continue;
            int rc = part_raise(conn, h, k, floor);
            if (rc)
                return rc;
        }
    return 0;
}

/* Renews the leased parts among the first upto whose lease ends before
 * by (all of them: by UINT64_MAX). */
static int parts_refresh(dlock_conn *conn, struct comp_held *h, size_t upto, uint32_t ttl_ms,
                         uint64_t by)
{
    for (size_t k = 0; k < upto; k++) {
        struct comp_part *p = &h->part[k];
        struct store s = store_at(conn, p->store);
        uint64_t now = dlock_monotonic_ns();
        if (!store_leased(conn, p->store) || dlock_lease_end(s.c, p->h, p->sent, ttl_ms) > by)
            continue;
        int rc = DLOCK_ENOTSUP;
        dlock_err_clear(s.c);
        if (s.b->renew) {
            if (dlock_abi_has(s.b, lease_end_ns))
                p->h->lease_end_ns = 0;
            p->sent = now;
            rc = s.b->renew(s.conn, p->h, ttl_ms);
        }
        if (rc) {
            part_error(conn, h, k, rc);
            return dlock_seterr(conn->client, DLOCK_ETIMEDOUT,
                                "%s let its part go while the later parts were awaited; "
                                "nothing is held", dlock_errmsg(conn->client));
        }
    }
    return 0;
}

/* While part k is awaited, the leased parts taken before it must not run
 * out: the wait is cut at a third of the TTL before the earliest of their
 * lease ends (UINT64_MAX: no such part), they are renewed, and the wait
 * starts again (behind those who came meanwhile). */
static uint64_t renew_by(dlock_conn *conn, const struct comp_held *h, size_t k, uint32_t ttl_ms)
{
    uint64_t end = UINT64_MAX;
    for (size_t i = 0; i < k; i++) {
        const struct comp_part *p = &h->part[i];
        if (!store_leased(conn, p->store))
            continue;
        uint64_t e = dlock_lease_end(store_at(conn, p->store).c, p->h, p->sent, ttl_ms);
        if (e < end)
            end = e;
    }
    uint64_t margin = (uint64_t)ttl_ms * 1000000u / 3;
    return end == UINT64_MAX ? end : end > margin ? end - margin : 0;
}

/* Part k: one acquire under req's wait, cut for the parts held before it
 * (renew_by()). */
static int part_acquire(dlock_conn *conn, const dlock_request *req, struct comp_held *h, size_t k)
{
    struct comp_part *p = &h->part[k];
    struct store s = store_at(conn, p->store);
    dlock_request one = *req;
    one.name = p->name;
    one.name_len = p->name_len;
    for (;;) {
        uint64_t now = dlock_monotonic_ns(), by = renew_by(conn, h, k, req->ttl_ms);
        /* One deadline (req's, absolute) covers every part. Once it has
         * passed, the remaining parts get one attempt each, as the core
         * does. */
        int expired = req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns <= now, cut = 0;
        one.wait = expired ? DLOCK_WAIT_TRY : req->wait;
        one.deadline_ns = req->deadline_ns;
        if (one.wait != DLOCK_WAIT_TRY && by != UINT64_MAX) {
            int rc = by <= now ? parts_refresh(conn, h, k, req->ttl_ms, UINT64_MAX) : 0;
            if (rc)
                return rc;
            by = renew_by(conn, h, k, req->ttl_ms);
            if (one.wait == DLOCK_WAIT_FOREVER || by < one.deadline_ns) {
                one.wait = DLOCK_WAIT_DEADLINE;
                one.deadline_ns = by;
                cut = 1;
            }
        }
        one.cancel_fd = one.wait == DLOCK_WAIT_TRY ? -1 : req->cancel_fd;
        dlock_err_clear(s.c);
        p->sent = now;
        int rc = s.b->acquire(s.conn, &one, &p->h);
        if (rc == DLOCK_ETIMEDOUT && cut)
            continue; /* renewed at the top */
        if (rc == DLOCK_EBUSY && expired)
            rc = dlock_seterr(s.c, DLOCK_ETIMEDOUT,
                              "the deadline passed with the lock still held elsewhere");
        return rc ? part_error(conn, h, k, rc) : 0;
    }
}

int dlock_composite_acquire(dlock_conn *conn, const dlock_request *req,
                            const dlock_name *names, size_t nnames, dlock_held **heldp)
{
    size_t stores = store_count(conn), n = stores * nnames, k;
    struct comp_held *h = calloc(1, sizeof *h + n * sizeof h->part[0]);
    uint64_t top = 0;
    int rc = 0;
    if (!h)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    h->n = n;
    h->names = nnames;
    for (k = 0; k < n; k++) {
        h->part[k].store = k / nnames;
        h->part[k].name = names[k % nnames].name;
        h->part[k].name_len = names[k % nnames].len;
    }
    for (k = 0; k < n; k++) {
        if ((rc = part_acquire(conn, req, h, k)) != 0)
            break;
        if (h->part[k].h->token > top)
            top = h->part[k].h->token;
    }
    /* A leased part taken early whose lease ran low (less than half the
     * TTL left) while the later ones were awaited is renewed. */
    if (rc == 0 && dlock_client_expires(conn->client))
        rc = parts_refresh(conn, h, n - 1, req->ttl_ms,
                           dlock_monotonic_ns() + (uint64_t)req->ttl_ms * 500000u);
    if (rc == 0)
        rc = parts_raise(conn, h, top, 1);
    if (rc) {
        parts_release(conn, h, k < n ? k : n);
        free(h);
        return rc;
    }
    h->base.token = top;
    h->base.lease_end_ns = parts_lease_end(conn, h, req->ttl_ms);
    *heldp = &h->base;
    return 0;
}

static int comp_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    dlock_name one = {req->name, req->name_len};
    return dlock_composite_acquire(conn, req, &one, 1, heldp);
}

/* Releases every part; the first part's loss, else its error, is what the
 * call reports. */
static int comp_release(dlock_conn *conn, dlock_held *held)
{
    struct comp_held *h = (struct comp_held *)held;
    dlock_errsave first = {0, ""};
    int rc = 0;
    for (size_t k = 0; k < h->n; k++) {
        struct store s = store_at(conn, h->part[k].store);
        dlock_err_clear(s.c);
        int r = s.b->release(s.conn, h->part[k].h);
        if (r && (rc == 0 || (r == DLOCK_ELOST && rc != DLOCK_ELOST))) {
            rc = part_error(conn, h, k, r);
            dlock_err_save(conn->client, &first);
        }
    }
    free(h);
    if (rc)
        dlock_err_restore(conn->client, &first);
    return rc;
}

/* Calls renew (keep: 0, renew: 1) on every part; stops at a loss. On the
 * keeper's threads every detail shares one buffer: the first failure's is
 * kept aside, so a later part's clear cannot wipe it. */
static int parts_renew(dlock_conn *conn, struct comp_held *h, uint32_t ttl_ms, int app)
{
    dlock_errsave first = {0, ""};
    int rc = 0;
    for (size_t k = 0; k < h->n; k++) {
        struct comp_part *p = &h->part[k];
        struct store s = store_at(conn, p->store);
        int (*fn)(dlock_conn *, dlock_held *, uint32_t) =
            app ? s.b->renew : dlock_method(s.b, keep);
        int r;
        if (dlock_abi_has(s.b, lease_end_ns))
            p->h->lease_end_ns = 0;
        dlock_err_clear(s.c);
        uint64_t sent = dlock_monotonic_ns();
        if (!fn)
            r = dlock_seterr(s.c, DLOCK_ENOTSUP, "the %s backend cannot %s", s.b->name,
                             app ? "renew" : "keep its locks");
        else
            r = fn(s.conn, p->h, ttl_ms);
        if (r == 0)
            p->sent = sent;
        if (r == DLOCK_ELOST || r == DLOCK_EEXPIRED)
            return part_error(conn, h, k, r);
        if (r && rc == 0) {
            rc = part_error(conn, h, k, r);
            dlock_err_save(conn->client, &first);
        }
    }
    /* A part that failed keeps its last confirmed lease in the estimate. */
    h->base.lease_end_ns = parts_lease_end(conn, h, ttl_ms);
    if (rc)
        dlock_err_restore(conn->client, &first);
    return rc;
}

static int comp_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    return parts_renew(conn, (struct comp_held *)held, ttl_ms, 1);
}

static int comp_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    return parts_renew(conn, (struct comp_held *)held, ttl_ms, 0);
}

static int comp_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    return parts_raise(conn, (struct comp_held *)held, floor, 0);
}

/* Records on the list what store i reported. */
static int store_error(struct comp_conn *cc, size_t i, int rc)
{
    dlock_errsave e;
    dlock_err_save(cc->part[i], &e);
    return dlock_seterr(cc->base.client, rc, "store %zu of %zu (%s): %s", i + 1, cc->n,
                        cc->part[i]->backend->name, e.msg[0] ? e.msg : dlock_strerror(rc));
}

static int comp_ping(dlock_conn *conn)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    int pinged = 0;
    for (size_t i = 0; i < cc->n; i++) {
        if (!cc->part[i]->backend->ping)
            continue;
        dlock_err_clear(cc->part[i]);
        int rc = cc->part[i]->backend->ping(cc->part[i]->conn);
        if (rc)
            return store_error(cc, i, rc);
        pinged = 1;
    }
    return pinged ? 0 : dlock_seterr(conn->client, DLOCK_ENOTSUP, "no store of this list can be pinged");
}

/* What the first store listed knows (the lock is taken there first). */
static int comp_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    const dlock_backend *b = cc->part[0]->backend;
    int rc;
    dlock_err_clear(cc->part[0]);
    if (!dlock_method(b, inspect))
        rc = dlock_seterr(cc->part[0], DLOCK_ENOTSUP, "the %s backend cannot inspect its locks",
                          b->name);
    else
        rc = b->inspect(cc->part[0]->conn, name, len, info);
    return rc ? store_error(cc, 0, rc) : 0;
}

/* The first store's holders, as comp_inspect. */
static int comp_inspect_holders(dlock_conn *conn, const char *name, size_t len,
                                dlock_holder *holders, size_t capacity, size_t *count)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    dlock_err_clear(cc->part[0]);
    int rc = dlock_store_holders(cc->part[0], name, len, holders, capacity, count);
    return rc ? store_error(cc, 0, rc) : 0;
}

/* The largest of the stores' tops: every store must tell. */
static int comp_token_top(dlock_conn *conn, uint64_t *top)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    *top = 0;
    for (size_t i = 0; i < cc->n; i++) {
        const dlock_backend *b = cc->part[i]->backend;
        uint64_t t = 0;
        int rc;
        dlock_err_clear(cc->part[i]);
        if (!dlock_method(b, token_top))
            rc = dlock_seterr(cc->part[i], DLOCK_ENOTSUP,
                              "the %s backend cannot tell its highest token", b->name);
        else
            rc = b->token_top(cc->part[i]->conn, &t);
        if (rc)
            return store_error(cc, i, rc);
        if (t > *top)
            *top = t;
    }
    return 0;
}

/* Every store's floor; those that can only check go first, so a refusal
 * raises nothing. */
static int comp_raise_floor(dlock_conn *conn, uint64_t floor)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < cc->n; i++) {
            const dlock_backend *b = cc->part[i]->backend;
            int rc;
            if (store_raises(conn, i) != pass)
                continue;
            dlock_err_clear(cc->part[i]);
            if (!dlock_method(b, raise_floor))
                rc = dlock_seterr(cc->part[i], DLOCK_ENOTSUP,
                                  "the %s backend cannot raise its tokens", b->name);
            else
                rc = b->raise_floor(cc->part[i]->conn, floor);
            if (rc)
                return store_error(cc, i, rc);
        }
    return 0;
}

/* Elections: the value is published in every store the leadership is
 * held in; read and watched on the first store, as inspect is. */
static int comp_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len)
{
    struct comp_held *h = (struct comp_held *)held;
    for (size_t k = 0; k < h->n; k++) {
        struct store s = store_at(conn, h->part[k].store);
        dlock_err_clear(s.c);
        int rc = s.b->publish(s.conn, h->part[k].h, value, len);
        if (rc)
            return part_error(conn, h, k, rc);
    }
    return 0;
}

/* The first store's leader and value; the term is the list's token, the
 * largest of the stores' (the others were raised to it only for later
 * grants), so every store is read: a leader is one that holds in all of
 * them (a list's grant and release go store by store). */
static int comp_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                       char *value, size_t *value_len)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    char scratch[DLOCK_VALUE_MAX + 1];
    dlock_err_clear(cc->part[0]);
    int rc = cc->part[0]->backend->leader(cc->part[0]->conn, name, len, info, value, value_len);
    if (rc)
        return store_error(cc, 0, rc);
    for (size_t i = 1; i < cc->n && info->held && (info->known & DLOCK_KNOWS_TOKEN); i++) {
        dlock_info o;
        size_t vlen = 0;
        memset(&o, 0, sizeof o);
        o.version = DLOCK_INFO_VERSION;
        dlock_err_clear(cc->part[i]);
        rc = cc->part[i]->backend->leader(cc->part[i]->conn, name, len, &o, scratch, &vlen);
        if (rc)
            return store_error(cc, i, rc);
        int same = (o.known & DLOCK_KNOWS_OWNER) && (info->known & DLOCK_KNOWS_OWNER)
                       ? strcmp(o.owner, info->owner) == 0
                       : 1;
        if (!o.held || !same) {
            /* Taken or given back part by part: the list's leadership is
             * not whole, so no one leads it (yet, or any more). */
            memset(info, 0, sizeof *info);
            info->version = DLOCK_INFO_VERSION;
            info->known = DLOCK_KNOWS_HELD;
            *value_len = 0;
            return 0;
        }
        if ((o.known & DLOCK_KNOWS_TOKEN) && o.token > info->token)
            info->token = o.token;
    }
    return 0;
}

static int comp_wake(dlock_conn *conn, const char *name, size_t len)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    int rc = 0;
    for (size_t i = 0; i < cc->n; i++) {
        int (*wake)(dlock_conn *, const char *, size_t) =
            dlock_method(cc->part[i]->backend, wake);
        int r = wake ? wake(cc->part[i]->conn, name, len) : 0;
        if (r && !rc)
            rc = store_error(cc, i, r);
    }
    return rc;
}

/* The first store's watch, whose methods its own backend serves. */
static int comp_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    dlock_err_clear(cc->part[0]);
    int rc = cc->part[0]->backend->watch_open(cc->part[0]->conn, name, len, watchp);
    return rc ? store_error(cc, 0, rc) : 0;
}

static int comp_watch_fd(dlock_watch *w)
{
    return w->conn->backend->watch_fd(w);
}

static int comp_watch_read(dlock_watch *w)
{
    return w->conn->backend->watch_read(w);
}

static void comp_watch_close(dlock_watch *w)
{
    w->conn->backend->watch_close(w);
}

const dlock_backend dlock_composite_backend = {
    DLOCK_BACKEND_INIT,
    .name = "composite",
    .schemes = no_schemes,
    .caps = 0, /* per client: see comp_caps() */
    .options = no_options,
    .open = NULL, /* opened by dlock_composite_open(), never from a URI */
    .close = comp_close,
    .acquire = comp_acquire,
    .release = comp_release,
    .renew = comp_renew,
    .ping = comp_ping,
    .keep = comp_keep,
    .raise_token = comp_raise_token,
    .token_top = comp_token_top,
    .raise_floor = comp_raise_floor,
    .inspect = comp_inspect,
    .inspect_holders = comp_inspect_holders,
    .publish = comp_publish,
    .leader = comp_leader,
    .wake = comp_wake,
    .watch_open = comp_watch_open,
    .watch_fd = comp_watch_fd,
    .watch_read = comp_watch_read,
    .watch_close = comp_watch_close,
};

/* Splits s at runs of whitespace: the count of words, and with out (room for
 * max) NUL-terminated copies in one allocation *bufp. */
size_t dlock_composite_split(const char *s, char **out, size_t max, char **bufp)
{
    static const char ws[] = " \t\r\n\v\f";
    size_t n = 0;
    char *buf = NULL, *p;
    if (bufp) {
        if (!(buf = strdup(s)))
            return 0;
        *bufp = buf;
    }
    for (p = buf ? buf : (char *)s; *p;) {
        p += strspn(p, ws);
        if (!*p)
            break;
        size_t len = strcspn(p, ws);
        if (out && n < max)
            out[n] = p;
        n++;
        p += len;
        if (buf && *p)
            *p++ = '\0';
    }
    return n;
}

int dlock_composite_leased(const dlock_conn *conn)
{
    return conn && conn->backend == &dlock_composite_backend &&
           ((const struct comp_conn *)conn)->leased;
}

int dlock_composite_open(dlock_client *c, char *const *uris, size_t n, dlock_conn **connp)
{
    struct comp_conn *cc = calloc(1, sizeof *cc + n * sizeof cc->part[0]);
    if (!cc)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    cc->base.client = c;
    cc->base.backend = &dlock_composite_backend;
    /* The same store twice would hold the name twice under one owner id,
     * which the store takes for one lock. Only the same spelling can be
     * seen here. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(uris[i], uris[j]) == 0) {
                free(cc);
                return dlock_seterr(c, DLOCK_EBADURI, "store %zu of %zu is listed twice (as %zu)",
                                    i + 1, n, j + 1);
            }
    for (size_t i = 0; i < n; i++) {
        int rc = dlock_client_open(uris[i], &cc->part[i]);
        if (rc) {
            dlock_seterr(c, rc, "store %zu of %zu: %s", i + 1, n,
                         cc->part[i] ? dlock_errmsg(cc->part[i]) : dlock_strerror(rc));
            cc->n = i + 1;
            comp_close(&cc->base);
            return rc;
        }
        cc->n = i + 1;
    }
    /* A list raises every part to the list's token, and a store that
     * cannot raise its tokens (ZooKeeper's, etcd's: transaction ids,
     * revisions) only works as long as its tokens are the highest. A part
     * whose tokens come from one counter for every name (a sequence) grows
     * with every grant of its store and overtakes it: refused now rather
     * than at the first grant where it did. */
    for (size_t i = 0; i < n; i++) {
        unsigned ci = dlock_client_caps(cc->part[i]);
        if (!(ci & DLOCK_CAP_FENCING) || (ci & DLOCK_CAP_RAISE))
            continue;
        for (size_t j = 0; j < n; j++)
            if (dlock_client_caps(cc->part[j]) & DLOCK_CAP_TOKEN_SHARED) {
                dlock_seterr(c, DLOCK_EBADURI,
                             "store %zu of %zu (%s) takes its tokens from one counter for every"
                             " name, which outgrows the tokens of store %zu (%s), and those"
                             " cannot be raised: list it with per-name tokens (token=table, on"
                             " a table created with it; docs/migration.md)", j + 1, n,
                             dlock_client_backend(cc->part[j]), i + 1,
                             dlock_client_backend(cc->part[i]));
                comp_close(&cc->base);
                return DLOCK_EBADURI;
            }
    }
    cc->base.caps = comp_caps(cc);
    for (size_t i = 0; i < n; i++)
        cc->leased |= store_leased(&cc->base, i);
    *connp = &cc->base;
    return 0;
}
