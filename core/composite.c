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
 * Leases: the capabilities a list declares are those every store gives (a
 * list with a file:// store is not freed for others when a TTL runs out:
 * the file part stays held). But for its holder the lock ends when the
 * first leased part's lease does, so the list's lease end is the earliest
 * of its leased parts' (each from the part's own send time, or the end the
 * part reported), and the core and the keeper go by it (dlock_client_expires).
 */
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

struct comp_held {
    dlock_held base;
    size_t n;
    uint64_t *sent; /* per part: when its lease last started, at the latest */
    dlock_held *part[];
};

static const char *const no_schemes[] = {NULL};
static const char *const no_options[] = {NULL};

static const dlock_backend *part_backend(const struct comp_conn *cc, size_t i)
{
    return cc->part[i]->backend;
}

/* Records on the composite what part i reported, naming the store. Works on
 * the keeper's threads too: there both details live in the keeper's buffer. */
static int part_error(struct comp_conn *cc, size_t i, int rc)
{
    dlock_errsave e;
    dlock_err_save(cc->part[i], &e);
    return dlock_seterr(cc->base.client, rc, "store %zu of %zu (%s): %s", i + 1, cc->n,
                        part_backend(cc, i)->name, e.msg[0] ? e.msg : dlock_strerror(rc));
}

/* What holds for the whole lock: what every store gives (see Leases above). */
static unsigned int comp_caps(const struct comp_conn *cc)
{
    unsigned int all = ~0u;
    for (size_t i = 0; i < cc->n; i++)
        all &= dlock_client_caps(cc->part[i]);
    return all;
}

static void comp_close(dlock_conn *conn)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    for (size_t i = 0; i < cc->n; i++)
        dlock_client_close(cc->part[i]);
    free(cc);
}

static void parts_release(struct comp_conn *cc, struct comp_held *h, size_t n)
{
    dlock_errsave e;
    dlock_err_save(cc->base.client, &e); /* the failure being reported stays */
    for (size_t i = n; i-- > 0;) {
        part_backend(cc, i)->release(cc->part[i]->conn, h->part[i]);
        h->part[i] = NULL;
    }
    dlock_err_restore(cc->base.client, &e);
}

static int part_leased(const struct comp_conn *cc, size_t i)
{
    return (dlock_client_caps(cc->part[i]) & DLOCK_CAP_LEASE) != 0;
}

/* The earliest end among the leased parts' leases (0: no part has one). */
static uint64_t parts_lease_end(const struct comp_conn *cc, const struct comp_held *h,
                                uint32_t ttl_ms)
{
    uint64_t end = 0;
    for (size_t i = 0; i < cc->n; i++) {
        if (!h->part[i] || !part_leased(cc, i))
            continue;
        uint64_t e = dlock_lease_end(cc->part[i], h->part[i], h->sent[i], ttl_ms);
        if (!end || e < end)
            end = e;
    }
    return end;
}

static void parts_forget_lease(const struct comp_conn *cc, const struct comp_held *h)
{
    for (size_t i = 0; i < cc->n; i++)
        if (h->part[i] && dlock_backend_v2(part_backend(cc, i)))
            h->part[i]->lease_end_ns = 0;
}

static void held_free(struct comp_held *h)
{
    free(h->sent);
    free(h);
}

/* Raises part i's later tokens above floor. */
static int part_raise(struct comp_conn *cc, struct comp_held *h, size_t i, uint64_t floor)
{
    const dlock_backend *b = part_backend(cc, i);
    int rc;
    dlock_err_clear(cc->part[i]);
    if (!dlock_backend_v3(b) || !b->raise_token)
        rc = dlock_seterr(cc->part[i], DLOCK_ENOTSUP, "the %s backend cannot raise its tokens",
                          b->name);
    else
        rc = b->raise_token(cc->part[i]->conn, h->part[i], floor);
    return rc ? part_error(cc, i, rc) : 0;
}

/* Raises every part whose token is below floor (all parts: below_only 0).
 * The stores that cannot raise go first: they only check, so a refusal
 * leaves every counter as it was. */
static int parts_raise(struct comp_conn *cc, struct comp_held *h, uint64_t floor, int below_only)
{
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < cc->n; i++) {
            int can = (dlock_client_caps(cc->part[i]) & DLOCK_CAP_RAISE) != 0;
            if (can != pass || (below_only && h->part[i]->token >= floor))
                continue;
            int rc = part_raise(cc, h, i, floor);
            if (rc)
                return rc;
        }
    return 0;
}

/* A leased part taken early may have run out while the later parts were
 * awaited: renewed if less than half its TTL is left. */
static int parts_refresh(struct comp_conn *cc, struct comp_held *h, uint32_t ttl_ms)
{
    for (size_t i = 0; i + 1 < cc->n; i++) {
        const dlock_backend *b = part_backend(cc, i);
        uint64_t now = dlock_monotonic_ns();
        if (!part_leased(cc, i) ||
            dlock_lease_end(cc->part[i], h->part[i], h->sent[i], ttl_ms) >
                now + (uint64_t)ttl_ms * 500000u)
            continue;
        int rc = DLOCK_ENOTSUP;
        dlock_err_clear(cc->part[i]);
        if (b->renew) {
            if (dlock_backend_v2(b))
                h->part[i]->lease_end_ns = 0;
            h->sent[i] = now;
            rc = b->renew(cc->part[i]->conn, h->part[i], ttl_ms);
        }
        if (rc) {
            part_error(cc, i, rc);
            return dlock_seterr(cc->base.client, DLOCK_ETIMEDOUT,
                                "store %zu of %zu (%s) let its part go while the later stores "
                                "were awaited; nothing is held", i + 1, cc->n, b->name);
        }
    }
    return 0;
}

static int comp_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    struct comp_held *h = calloc(1, sizeof *h + cc->n * sizeof h->part[0]);
    dlock_request one = *req;
    uint64_t top = 0;
    int rc = 0;
    size_t i;
    if (!h || !(h->sent = calloc(cc->n, sizeof *h->sent))) {
        free(h);
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    }
    h->n = cc->n;
    /* One deadline (req's, absolute) covers every part. Once it has passed,
     * the remaining parts get one attempt each, as the core does. */
    for (i = 0; i < cc->n; i++) {
        uint64_t now = dlock_monotonic_ns();
        int expired = req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns <= now;
        one.wait = expired ? DLOCK_WAIT_TRY : req->wait;
        dlock_err_clear(cc->part[i]);
        h->sent[i] = now;
        rc = part_backend(cc, i)->acquire(cc->part[i]->conn, &one, &h->part[i]);
        if (rc == DLOCK_EBUSY && expired)
            rc = dlock_seterr(cc->part[i], DLOCK_ETIMEDOUT,
                              "the deadline passed with the lock still held elsewhere");
        if (rc) {
            part_error(cc, i, rc);
            break;
        }
        if (h->part[i]->token > top)
            top = h->part[i]->token;
    }
    if (rc == 0 && cc->leased)
        rc = parts_refresh(cc, h, req->ttl_ms);
    if (rc == 0)
        rc = parts_raise(cc, h, top, 1);
    if (rc) {
        parts_release(cc, h, i < cc->n ? i : cc->n);
        held_free(h);
        return rc;
    }
    h->base.token = top;
    h->base.lease_end_ns = parts_lease_end(cc, h, req->ttl_ms);
    *heldp = &h->base;
    return 0;
}

/* Releases every part; the first part's loss, else its error, is what the
 * call reports. */
static int comp_release(dlock_conn *conn, dlock_held *held)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    struct comp_held *h = (struct comp_held *)held;
    dlock_errsave first = {0, ""};
    int rc = 0;
    for (size_t i = 0; i < cc->n; i++) {
        dlock_err_clear(cc->part[i]);
        int r = part_backend(cc, i)->release(cc->part[i]->conn, h->part[i]);
        if (r && (rc == 0 || (r == DLOCK_ELOST && rc != DLOCK_ELOST))) {
            rc = part_error(cc, i, r);
            dlock_err_save(conn->client, &first);
        }
    }
    held_free(h);
    if (rc)
        dlock_err_restore(conn->client, &first);
    return rc;
}

/* Calls renew (keep: 0, renew: 1) on every part; stops at a loss. On the
 * keeper's threads every detail shares one buffer: the first failure's is
 * kept aside, so a later part's clear cannot wipe it. */
static int parts_renew(struct comp_conn *cc, struct comp_held *h, uint32_t ttl_ms, int app)
{
    dlock_errsave first = {0, ""};
    int rc = 0;
    parts_forget_lease(cc, h);
    for (size_t i = 0; i < cc->n; i++) {
        const dlock_backend *b = part_backend(cc, i);
        int (*fn)(dlock_conn *, dlock_held *, uint32_t) =
            app ? b->renew : (dlock_backend_v2(b) ? b->keep : NULL);
        int r;
        dlock_err_clear(cc->part[i]);
        uint64_t sent = dlock_monotonic_ns();
        if (!fn)
            r = dlock_seterr(cc->part[i], DLOCK_ENOTSUP, "the %s backend cannot %s", b->name,
                             app ? "renew" : "keep its locks");
        else
            r = fn(cc->part[i]->conn, h->part[i], ttl_ms);
        if (r == 0)
            h->sent[i] = sent;
        if (r == DLOCK_ELOST || r == DLOCK_EEXPIRED)
            return part_error(cc, i, r);
        if (r && rc == 0) {
            rc = part_error(cc, i, r);
            dlock_err_save(cc->base.client, &first);
        }
    }
    /* A part that failed keeps its last confirmed lease in the estimate. */
    h->base.lease_end_ns = parts_lease_end(cc, h, ttl_ms);
    if (rc)
        dlock_err_restore(cc->base.client, &first);
    return rc;
}

static int comp_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    return parts_renew((struct comp_conn *)conn, (struct comp_held *)held, ttl_ms, 1);
}

static int comp_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    return parts_renew((struct comp_conn *)conn, (struct comp_held *)held, ttl_ms, 0);
}

static int comp_ping(dlock_conn *conn)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    int pinged = 0;
    for (size_t i = 0; i < cc->n; i++) {
        if (!part_backend(cc, i)->ping)
            continue;
        dlock_err_clear(cc->part[i]);
        int rc = part_backend(cc, i)->ping(cc->part[i]->conn);
        if (rc)
            return part_error(cc, i, rc);
        pinged = 1;
    }
    return pinged ? 0 : dlock_seterr(conn->client, DLOCK_ENOTSUP, "no store of this list can be pinged");
}

static int comp_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    return parts_raise((struct comp_conn *)conn, (struct comp_held *)held, floor, 0);
}

const dlock_backend dlock_composite_backend = {
    .version = DLOCK_BACKEND_VERSION,
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
    cc->base.caps = comp_caps(cc);
    for (size_t i = 0; i < n; i++)
        cc->leased |= part_leased(cc, i);
    *connp = &cc->base;
    return 0;
}
