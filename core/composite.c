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
 */
#include <stdlib.h>
#include <string.h>

#include "core/composite.h"
#include "core/internal.h"

struct comp_conn {
    dlock_conn base;
    size_t n;
    dlock_client *part[];
};

struct comp_held {
    dlock_held base;
    size_t n;
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

/* What holds for the whole lock: what every store gives. A lease only if
 * every part has one (a part without a lease keeps the whole lock held
 * past the others' TTL). */
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

/* The earliest lease end the parts reported (0: none did). */
static uint64_t parts_lease_end(const struct comp_conn *cc, const struct comp_held *h)
{
    uint64_t end = 0;
    for (size_t i = 0; i < cc->n; i++)
        if (h->part[i] && dlock_backend_v2(part_backend(cc, i)) && h->part[i]->lease_end_ns &&
            (!end || h->part[i]->lease_end_ns < end))
            end = h->part[i]->lease_end_ns;
    return end;
}

static void parts_forget_lease(const struct comp_conn *cc, const struct comp_held *h)
{
    for (size_t i = 0; i < cc->n; i++)
        if (h->part[i] && dlock_backend_v2(part_backend(cc, i)))
            h->part[i]->lease_end_ns = 0;
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

static int comp_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct comp_conn *cc = (struct comp_conn *)conn;
    struct comp_held *h = calloc(1, sizeof *h + cc->n * sizeof h->part[0]);
    uint64_t top = 0;
    int rc = 0;
    size_t i;
    if (!h)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    h->n = cc->n;
    /* One deadline (req's, absolute) covers every part. */
    for (i = 0; i < cc->n; i++) {
        dlock_err_clear(cc->part[i]);
        rc = part_backend(cc, i)->acquire(cc->part[i]->conn, req, &h->part[i]);
        if (rc) {
            part_error(cc, i, rc);
            break;
        }
        if (h->part[i]->token > top)
            top = h->part[i]->token;
    }
    if (rc == 0)
        rc = parts_raise(cc, h, top, 1);
    if (rc) {
        parts_release(cc, h, i < cc->n ? i : cc->n);
        free(h);
        return rc;
    }
    h->base.token = top;
    h->base.lease_end_ns = parts_lease_end(cc, h);
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
    free(h);
    if (rc)
        dlock_err_restore(conn->client, &first);
    return rc;
}

/* Calls renew (keep: 0, renew: 1) on every part; stops at a loss. */
static int parts_renew(struct comp_conn *cc, struct comp_held *h, uint32_t ttl_ms, int app)
{
    int rc = 0;
    parts_forget_lease(cc, h);
    for (size_t i = 0; i < cc->n; i++) {
        const dlock_backend *b = part_backend(cc, i);
        int (*fn)(dlock_conn *, dlock_held *, uint32_t) =
            app ? b->renew : (dlock_backend_v2(b) ? b->keep : NULL);
        int r;
        dlock_err_clear(cc->part[i]);
        if (!fn)
            r = dlock_seterr(cc->part[i], DLOCK_ENOTSUP, "the %s backend cannot %s", b->name,
                             app ? "renew" : "keep its locks");
        else
            r = fn(cc->part[i]->conn, h->part[i], ttl_ms);
        if (r == DLOCK_ELOST || r == DLOCK_EEXPIRED)
            return part_error(cc, i, r);
        if (r && rc == 0)
            rc = part_error(cc, i, r);
    }
    h->base.lease_end_ns = parts_lease_end(cc, h);
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
    *connp = &cc->base;
    return 0;
}
