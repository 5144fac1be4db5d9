/*
 * Clients and locks: the users' API on top of the backend vtable.
 *
 * The core owns everything that must behave the same on every store:
 * URI checking, name and option validation, owner ids, the "a client holds
 * a name at most once" rule, deadline handling and error detail.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/composite.h"
#include "core/internal.h"
#include "core/sha256.h"
#include "core/uri.h"

/* Schemes dlock knows, whose backend may be left out of a build. */
static const char *const known_schemes[] = {
    "redis",      "redis+cluster", "redis+sentinel", "rediss", "rediss+cluster",
    "rediss+sentinel", "postgresql", "postgres",    "mysql",  "mariadb",
    "zookeeper",  "etcd",          NULL,
};

/* Backends may return a code without detail; never leave the text empty. */
int dlock_finish(dlock_client *c, int rc)
{
    if (rc && c->errmsg[0] == '\0')
        dlock_seterr(c, rc, "%s", dlock_strerror(rc));
    else if (rc)
        c->err = rc;
    return rc;
}

static int is_known_scheme(const char *scheme)
{
    for (const char *const *s = known_schemes; *s; s++)
        if (strcmp(*s, scheme) == 0)
            return 1;
    return 0;
}

/* Strict options: a typo must not silently fall back to a default. */
static int check_options(dlock_client *c, const dlock_backend *b)
{
    for (size_t i = 0; i < dlock_uri_param_count(c->uri); i++) {
        const char *key = dlock_uri_param_key(c->uri, i);
        const char *const *o;
        for (o = b->options; *o; o++)
            if (strcmp(*o, key) == 0)
                break;
        if (!*o)
            return dlock_seterr(c, DLOCK_EBADURI, "unknown option '%.64s' for %s:// URIs",
                                key, dlock_uri_scheme(c->uri));
    }
    return 0;
}

/* Several URIs separated by whitespace: a composite client (one lock in
 * every store listed, in that order). */
static int composite_connect(dlock_client *c, const char *list, size_t n)
{
    char *uris[DLOCK_COMPOSITE_MAX], *buf = NULL;
    dlock_conn *conn = NULL;
    int rc;
    if (n > DLOCK_COMPOSITE_MAX)
        return dlock_seterr(c, DLOCK_EBADURI, "%zu URIs in one list: at most %d", n,
                            DLOCK_COMPOSITE_MAX);
    if (dlock_composite_split(list, uris, n, &buf) != n)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    rc = dlock_composite_open(c, uris, n, &conn);
    free(buf);
    if (rc)
        return dlock_finish(c, rc);
    conn->client = c;
    c->backend = &dlock_composite_backend;
    c->conn = conn;
    return 0;
}

static int client_connect(dlock_client *c, const char *uri)
{
    const dlock_backend *b;
    dlock_conn *conn = NULL;
    size_t words = uri ? dlock_composite_split(uri, NULL, 0, NULL) : 0;
    char *one = NULL, *trimmed = NULL;
    if (words > 1)
        return composite_connect(c, uri, words);
    /* One URI with whitespace around it: the URI. */
    if (words == 1 && uri[strcspn(uri, " \t\r\n\v\f")] &&
        dlock_composite_split(uri, &one, 1, &trimmed) == 1)
        uri = one;
    int rc = dlock_uri_parse(uri, &c->uri, c->errmsg, sizeof c->errmsg);
    free(trimmed);
    if (rc)
        return c->err = rc;
    /* What dlock_seterr() masks in every message from now on. */
    c->secret[0] = dlock_uri_password(c->uri);
    c->secret[1] = dlock_uri_param(c->uri, "sentinel_password");
    b = dlock_backend_find(dlock_uri_scheme(c->uri));
    if (!b) {
        const char *scheme = dlock_uri_scheme(c->uri);
        if (is_known_scheme(scheme))
            return dlock_seterr(c, DLOCK_ENOBACKEND,
                                "the %s backend is not built into this libdlock", scheme);
        return dlock_seterr(c, DLOCK_ESCHEME, "unknown URI scheme '%.32s'", scheme);
    }
    rc = check_options(c, b);
    if (rc)
        return rc;
    rc = b->open(c, c->uri, &conn);
    if (rc)
        return dlock_finish(c, rc);
    conn->backend = b;
    conn->client = c;
    c->backend = b;
    c->conn = conn;
    return 0;
}

int dlock_client_open(const char *uri, dlock_client **clientp)
{
    dlock_client *c;
    int rc;
    if (!clientp)
        return DLOCK_EINVAL;
    *clientp = c = calloc(1, sizeof *c);
    if (!c)
        return DLOCK_ENOMEM;
    dlock_test_hooks_read(&c->hooks);
    if (dlock_names_init(&c->held) != 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot read random bytes for the client's name table");
    rc = client_connect(c, uri);
    /* The observer of an election opens the client's URI again. */
    if (rc == 0 && !(c->uri_text = strdup(uri)))
        rc = dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    return rc;
}

/* After an election's release: wakes its observers, keeping the release's
 * detail. Not told, observers still learn at the lease's end
 * (docs/election.md). */
static void wake_observers(dlock_client *c, dlock_lock *lock)
{
    int (*wake)(dlock_conn *, const char *, size_t) = dlock_method(dlock_lock_ops(lock), wake);
    if (!wake)
        return;
    dlock_errsave e;
    dlock_err_save(c, &e);
    (void)wake(c->conn, dlock_lock_names(lock), lock->ent[0].len);
    dlock_err_restore(c, &e);
}

/* The backend's release of lock, out of the client's table already. A lock
 * the keeper reported lost is released within DLOCK_LOST_RELEASE_MS of
 * since_ns: its store may be silent or down (dlock_call_deadline()). */
static int release_in_store(dlock_client *c, dlock_lock *lock, uint64_t since_ns)
{
    int bound = atomic_load(&lock->lost) && !c->hooks.unbounded_loss;
    uint64_t was = dlock_call_deadline();
    if (bound)
        dlock_call_deadline_set(since_ns + DLOCK_LOST_RELEASE_MS * 1000000ull);
    if (dlock_abi_has(c->backend, lease_end_ns))
        lock->held->lease_end_ns = 0;
    int rc = dlock_lock_ops(lock)->release(c->conn, lock->held);
    if (lock->elected)
        wake_observers(c, lock);
    dlock_call_deadline_set(was);
    return rc;
}

/* A lock the application had: what it may have made hangs off it. */
static void lock_free(dlock_lock *lock)
{
    free(lock->lost_detail);
    free(atomic_load(&lock->owner_hex));
    free(lock);
}

void dlock_client_close(dlock_client *c)
{
    if (!c || dlock_keeper_on_thread())
        return;
    /* The keeper stops before anything it renews goes away. */
    dlock_keeper_stop(c);
    dlock_lock *lock;
    while ((lock = dlock_names_any(&c->held)) != NULL) {
        dlock_names_remove(&c->held, lock);
        release_in_store(c, lock, dlock_monotonic_ns());
        lock_free(lock);
    }
    dlock_names_free(&c->held);
    if (c->conn)
        c->backend->close(c->conn);
    dlock_uri_free(c->uri);
    if (c->uri_text) /* it may hold the password */
        explicit_bzero(c->uri_text, strlen(c->uri_text));
    free(c->uri_text);
    free(c);
}

const char *dlock_client_backend(const dlock_client *c)
{
    return c && c->backend ? c->backend->name : NULL;
}

unsigned int dlock_client_caps(const dlock_client *c)
{
    if (!c || !c->backend)
        return 0;
    return c->conn && c->conn->caps ? c->conn->caps : c->backend->caps;
}

/* A client whose open failed carries its error and nothing else. */
int dlock_check_usable(dlock_client *c)
{
    if (!c->conn)
        return dlock_seterr(c, DLOCK_EINVAL, "the client is not connected (its open failed)");
    dlock_clearerr(c);
    return 0;
}

/* Calls that wait for the keeper would deadlock on its own threads. */
int dlock_not_on_keeper(void)
{
    /* No detail either: the client's belongs to the application's thread. */
    return dlock_keeper_on_thread() ? DLOCK_EINVAL : 0;
}

int dlock_client_ping(dlock_client *c)
{
    int rc;
    if (!c || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    if ((rc = dlock_check_usable(c)) != 0)
        return rc;
    if (!c->backend->ping)
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend has no store to ping",
                            c->backend->name);
    return dlock_finish(c, c->backend->ping(c->conn));
}

int dlock_acquire_opts_init_version(dlock_acquire_opts *opts, unsigned int version)
{
    static const dlock_acquire_opts defaults = DLOCK_ACQUIRE_OPTS_INIT;
    /* Each version's size: up to the first field of the next. */
    static const size_t size[] = {
        0,
        offsetof(dlock_acquire_opts, keep),
        offsetof(dlock_acquire_opts, cancel),
        offsetof(dlock_acquire_opts, mode),
        sizeof(dlock_acquire_opts),
    };
    _Static_assert(sizeof size / sizeof size[0] == DLOCK_ACQUIRE_OPTS_VERSION + 1,
                   "a size for every version of dlock_acquire_opts");
    if (!opts || version == 0 || version > DLOCK_ACQUIRE_OPTS_VERSION)
        return DLOCK_EINVAL;
    memcpy(opts, &defaults, size[version]);
    opts->version = version;
    return 0;
}

void dlock_acquire_opts_init(dlock_acquire_opts *opts)
{
    dlock_acquire_opts_init_version(opts, 3);
}


/* The held lock with one of names, or NULL; *same: it has exactly them.
 * O(n) expected, whatever the client holds (core/held.c). */
static dlock_lock *find_held(dlock_client *c, const dlock_name *names, size_t n, int *same)
{
    for (size_t i = 0; i < n; i++) {
        dlock_lock *l = dlock_names_find(&c->held, names[i].name, names[i].len);
        if (!l)
            continue;
        size_t k = 0;
        while (k < n && dlock_names_find(&c->held, names[k].name, names[k].len) == l)
            k++;
        *same = k == n && l->names == n;
        return l;
    }
    return NULL;
}

int dlock_check_name(dlock_client *c, const char *name, size_t len)
{
    if (!name || len == 0)
        return dlock_seterr(c, DLOCK_EINVAL, "lock name is empty");
    if (len > DLOCK_NAME_MAX)
        return dlock_seterr(c, DLOCK_EINVAL, "lock name is longer than %d bytes",
                            DLOCK_NAME_MAX);
    if (memchr(name, '\0', len))
        return dlock_seterr(c, DLOCK_EINVAL, "lock name contains a NUL byte");
    return 0;
}

/* A mode and limit the request may ask for, on this client's backend. */
static int check_mode(dlock_client *c, dlock_mode mode, uint32_t limit)
{
    unsigned caps = dlock_abi_has(c->backend, mode) ? dlock_client_caps(c) : 0;
    if (mode != DLOCK_MODE_EXCLUSIVE && mode != DLOCK_MODE_SHARED)
        return dlock_seterr(c, DLOCK_EINVAL, "unknown lock mode %d", (int)mode);
    if (limit > DLOCK_LIMIT_MAX)
        return dlock_seterr(c, DLOCK_EINVAL, "limit %u is above %u", limit, DLOCK_LIMIT_MAX);
    if (mode == DLOCK_MODE_SHARED && limit)
        return dlock_seterr(c, DLOCK_EINVAL, "a shared lock takes no limit: a name with a "
                                             "limit is a semaphore, whose holders are all alike");
    /* A peer layout (docs/interop.md) has the modes its peer has. */
    const char *layout = c->uri ? dlock_uri_param(c->uri, "layout") : NULL;
    int peer = layout && strcmp(layout, "dlock") != 0;
    if (mode == DLOCK_MODE_SHARED && !(caps & DLOCK_CAP_SHARED))
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend has no shared locks%s%.32s",
                            c->backend->name, peer ? " in layout=" : "", peer ? layout : "");
    if (limit && !(caps & DLOCK_CAP_SEMAPHORE))
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend has no semaphores%s%.32s",
                            c->backend->name, peer ? " in layout=" : "", peer ? layout : "");
    return 0;
}

static int check_request(dlock_client *c, const dlock_acquire_opts *o)
{
    if (o->version == 0 || o->version > DLOCK_ACQUIRE_OPTS_VERSION)
        return dlock_seterr(c, DLOCK_EINVAL,
                            "acquire options version %u is not supported (use DLOCK_ACQUIRE_OPTS_INIT)",
                            o->version);
    if (o->ttl_ms == 0)
        return dlock_seterr(c, DLOCK_EINVAL, "lease TTL must be at least 1 ms");
    if (o->wait != DLOCK_WAIT_TRY && o->wait != DLOCK_WAIT_DEADLINE &&
        o->wait != DLOCK_WAIT_FOREVER)
        return dlock_seterr(c, DLOCK_EINVAL, "unknown wait mode %d", (int)o->wait);
    if (o->version >= 2 && o->keep) {
        const dlock_backend *b = c->backend;
        if (!dlock_method(b, keep))
            return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot keep locks", b->name);
    }
    if (o->version >= 2 && o->on_lost && !o->keep)
        return dlock_seterr(c, DLOCK_EINVAL, "on_lost needs keep: only kept locks are watched");
    if (o->version >= 3 && o->cancel && o->wait != DLOCK_WAIT_TRY &&
        !(dlock_client_caps(c) & DLOCK_CAP_CANCEL))
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot cancel a wait",
                            c->backend->name);
    if (o->version >= 4)
        return check_mode(c, o->mode, o->limit);
    return 0;
}

/* A lock's lease end after a call sent at sent_ns (see dlock_held). */
int dlock_client_expires(const dlock_client *c)
{
    return (dlock_client_caps(c) & DLOCK_CAP_LEASE) || dlock_composite_leased(c->conn);
}

uint64_t dlock_lease_end(const dlock_client *c, const dlock_held *held, uint64_t sent_ns,
                         uint32_t ttl_ms)
{
    /* A lease-less store may still know when its session can end at the
     * earliest (ZooKeeper's keep()): that is the lock's lease end then. */
    if (dlock_abi_has(c->backend, lease_end_ns) && held->lease_end_ns)
        return held->lease_end_ns;
    if (!dlock_client_expires(c))
        return UINT64_MAX;
    return sent_ns + (uint64_t)ttl_ms * 1000000u;
}

/* Byte order; a name that is a prefix of another comes first. */
static int name_cmp(const void *a, const void *b)
{
    const dlock_name *x = a, *y = b;
    int r = memcmp(x->name, y->name, x->len < y->len ? x->len : y->len);
    return r ? r : (x->len > y->len) - (x->len < y->len);
}

/* Acquires names (sorted, distinct, checked): one lock. */
static int acquire_names(dlock_client *c, const dlock_name *names, size_t n,
                         const dlock_acquire_opts *opts, dlock_lock **lockp)
{
    dlock_request req;
    dlock_held *held = NULL;
    dlock_lock *lock;
    size_t total = 0;
    int rc, same = 0;

    if ((rc = check_request(c, opts)) != 0)
        return rc;
    /* Before anything else, a reentrant hold included: a cancelled
     * acquire never succeeds unless a grant beat the cancel. */
    if (opts->version >= 3 && dlock_cancel_fired(opts->cancel))
        return dlock_cancelled(c);
    if ((lock = find_held(c, names, n, &same)) != NULL) {
        if (opts->version < 2 || !opts->reentrant)
            return dlock_seterr(c, DLOCK_EALREADY,
                                "this client already holds the lock (locks do not stack)");
        if (!same)
            return dlock_seterr(c, DLOCK_EALREADY,
                                "this client holds a lock with some of these names but not "
                                "exactly these: a reentrant acquire needs the same names");
        if (atomic_load(&lock->lost))
            return dlock_report_lost(c, dlock_keeper_lost_detail(lock));
        if (opts->version >= 4 && (opts->mode != lock->mode || opts->limit != lock->limit))
            return dlock_seterr(c, DLOCK_EMODE,
                                "this client holds the lock %s%.0u: a reentrant acquire needs "
                                "the same mode and limit",
                                lock->limit ? "as a semaphore of limit " :
                                lock->mode == DLOCK_MODE_SHARED ? "shared" : "exclusive",
                                (unsigned)lock->limit);
        if ((opts->keep || opts->on_lost) && !lock->kept)
            return dlock_seterr(c, DLOCK_EINVAL,
                                "the lock is already held without keep: a reentrant acquire "
                                "cannot start keeping it");
        if (lock->holds == UINT_MAX)
            return dlock_seterr(c, DLOCK_EINVAL, "the lock's hold count is at its maximum");
        lock->holds++;
        *lockp = lock;
        return 0;
    }

    for (size_t i = 0; i < n; i++)
        total += names[i].len + 1;
    lock = malloc(sizeof *lock + n * sizeof lock->ent[0] + total);
    if (!lock)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    dlock_name own[DLOCK_NAMES_MAX];
    lock->names = (uint32_t)n;
    char *p = dlock_lock_names(lock);
    for (size_t i = 0; i < n; i++) {
        memcpy(p, names[i].name, names[i].len);
        p[names[i].len] = '\0';
        own[i] = (dlock_name){p, names[i].len};
        p += names[i].len + 1;
    }
    lock->client = c;
    dlock_names_prepare(&c->held, lock);
    lock->kept = NULL;
    lock->lost_detail = NULL;
    lock->holds = 1;
    lock->ttl_ms = opts->ttl_ms;
    lock->mode = opts->version >= 4 ? (uint8_t)opts->mode : DLOCK_MODE_EXCLUSIVE;
    lock->limit = opts->version >= 4 ? (uint16_t)opts->limit : 0;
    lock->elected = 0; /* dlock_campaign() sets it after the grant */
    atomic_init(&lock->lost, 0);
    atomic_init(&lock->expires_ns, 0);

    memset(&req, 0, sizeof req);
    req.name = dlock_lock_names(lock);
    req.name_len = names[0].len;
    req.ttl_ms = opts->ttl_ms;
    req.wait = opts->wait;
    req.deadline_ns = opts->deadline_ns;
    req.cancel_fd = -1;
    if (opts->version >= 4) {
        req.mode = opts->mode;
        req.limit = opts->limit;
    }
    if ((rc = dlock_owner_new(req.owner, req.owner_hex)) != 0) {
        free(lock);
        return dlock_seterr(c, rc, "cannot read random bytes for the owner id");
    }
    memcpy(lock->owner, req.owner, sizeof lock->owner);
    atomic_init(&lock->owner_hex, NULL);
    /* A deadline already past is one attempt that reports a timeout, so
     * backends only ever see future deadlines. */
    uint64_t sent = dlock_monotonic_ns(); /* also the lease's earliest start */
    int expired = req.wait == DLOCK_WAIT_DEADLINE && req.deadline_ns <= sent;
    if (expired)
        req.wait = DLOCK_WAIT_TRY;
    if (opts->version >= 3 && opts->cancel && req.wait != DLOCK_WAIT_TRY)
        req.cancel_fd = dlock_cancel_fd(opts->cancel);
    if (n > 1)
        rc = dlock_composite_acquire(c->conn, &req, own, n, &held);
    else
        rc = c->backend->acquire(c->conn, &req, &held);
    if (rc == DLOCK_EBUSY && expired)
        rc = dlock_seterr(c, DLOCK_ETIMEDOUT, "the deadline passed with the lock still held elsewhere");
    /* A signal whose handler raised the flag is a cancel, whichever the
     * backend noticed first (it left the queue either way). */
    if (rc == DLOCK_EINTR && opts->version >= 3 && dlock_cancel_fired(opts->cancel))
        rc = dlock_cancelled(c);
    lock->granted_ns = dlock_monotonic_ns();
    dlock_metrics_acquire(c, rc, lock->granted_ns - sent);
    if (rc) {
        free(lock);
        return dlock_finish(c, rc);
    }
    lock->held = held;
    atomic_store(&lock->expires_ns, dlock_lease_end(c, held, sent, req.ttl_ms));
    int estimated = dlock_abi_has(c->backend, lease_end_ns) && held->lease_end_ns != 0;
    if (opts->version >= 2 && opts->keep &&
        (rc = dlock_keeper_add(c, lock, opts->on_lost, opts->on_lost_user, estimated)) != 0) {
        dlock_errsave why;
        dlock_err_save(c, &why);
        dlock_lock_ops(lock)->release(c->conn, held);
        free(lock);
        dlock_err_restore(c, &why);
        return dlock_finish(c, rc);
    }
    /* The add can only fail for the table's first buckets, before the
     * grant is used: give the grant back rather than hold it untracked. */
    if ((rc = dlock_names_add(&c->held, lock)) != 0) {
        if (lock->kept)
            dlock_keeper_remove(lock);
        dlock_lock_ops(lock)->release(c->conn, held);
        lock_free(lock);
        return dlock_seterr(c, rc, "out of memory");
    }
    *lockp = lock;
    return 0;
}

/* The checks every acquire starts with. */
static int acquire_start(dlock_client *c, dlock_lock **lockp)
{
    if (!c || !lockp || dlock_not_on_keeper())
        return c && lockp && !dlock_keeper_on_thread()
                   ? dlock_seterr(c, DLOCK_EINVAL, "no place to store the lock")
                   : DLOCK_EINVAL;
    *lockp = NULL;
    return dlock_check_usable(c);
}

int dlock_acquire_n(dlock_client *c, const char *name, size_t len,
                    const dlock_acquire_opts *opts, dlock_lock **lockp)
{
    static const dlock_acquire_opts defaults = DLOCK_ACQUIRE_OPTS_INIT;
    int rc = acquire_start(c, lockp);
    if (rc || (rc = dlock_check_name(c, name, len)) != 0)
        return rc;
    dlock_name one = {name, len};
    return acquire_names(c, &one, 1, opts ? opts : &defaults, lockp);
}

int dlock_acquire(dlock_client *c, const char *name, const dlock_acquire_opts *opts,
                  dlock_lock **lockp)
{
    /* strnlen: a missing terminator must not make us read past the limit. */
    size_t len = name ? strnlen(name, DLOCK_NAME_MAX + 1) : 0;
    return dlock_acquire_n(c, name, len, opts, lockp);
}

int dlock_acquire_names(dlock_client *c, const char *const *names, size_t count,
                        const dlock_acquire_opts *opts, dlock_lock **lockp)
{
    static const dlock_acquire_opts defaults = DLOCK_ACQUIRE_OPTS_INIT;
    dlock_name sorted[DLOCK_NAMES_MAX];
    int rc = acquire_start(c, lockp);
    if (rc)
        return rc;
    if (!names || count == 0)
        return dlock_seterr(c, DLOCK_EINVAL, "no lock names");
    if (count > DLOCK_NAMES_MAX)
        return dlock_seterr(c, DLOCK_EINVAL, "%zu names in one lock: at most %d", count,
                            DLOCK_NAMES_MAX);
    for (size_t i = 0; i < count; i++) {
        size_t len = names[i] ? strnlen(names[i], DLOCK_NAME_MAX + 1) : 0;
        if ((rc = dlock_check_name(c, names[i], len)) != 0)
            return dlock_seterr(c, rc, "name %zu of %zu: %s", i + 1, count, dlock_errmsg(c));
        sorted[i] = (dlock_name){names[i], len};
    }
    qsort(sorted, count, sizeof sorted[0], name_cmp);
    for (size_t i = 1; i < count; i++)
        if (name_cmp(&sorted[i - 1], &sorted[i]) == 0)
            return dlock_seterr(c, DLOCK_EINVAL, "a name is listed twice: '%.64s'",
                                sorted[i].name);
    return acquire_names(c, sorted, count, opts ? opts : &defaults, lockp);
}

/* The loss the keeper reported, as the client's error. */
int dlock_report_lost(dlock_client *c, const char *detail)
{
    return dlock_seterr(c, DLOCK_ELOST, "the lock was lost: %s", detail);
}

int dlock_release(dlock_lock *lock)
{
    dlock_client *c;
    char lost_detail[DLOCK_ERRMSG_MAX];
    int rc, lost;
    if (!lock || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    uint64_t called = dlock_monotonic_ns();
    c = lock->client;
    dlock_clearerr(c);
    if (lock->holds > 1) {
        lock->holds--;
        return atomic_load(&lock->lost) ? dlock_report_lost(c, dlock_keeper_lost_detail(lock)) : 0;
    }
    dlock_keeper_remove(lock); /* no keeper call on it from here on */
    lost = atomic_load(&lock->lost);
    snprintf(lost_detail, sizeof lost_detail, "%s", dlock_keeper_lost_detail(lock));
    dlock_names_remove(&c->held, lock);
    rc = release_in_store(c, lock, called);
    dlock_metrics_release(c, rc, dlock_monotonic_ns() - lock->granted_ns);
    /* The store may not know (a Redlock quorum gone) or not answer (a
     * store down): the keeper did know. A grant reported lost is never
     * revived, and its release says so whatever the store answered. */
    if (lost)
        rc = dlock_report_lost(c, lost_detail);
    lock_free(lock);
    return dlock_finish(c, rc);
}

int dlock_renew(dlock_lock *lock, uint32_t ttl_ms)
{
    dlock_client *c;
    int rc;
    if (!lock || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    c = lock->client;
    dlock_clearerr(c);
    if (ttl_ms == 0)
        return dlock_seterr(c, DLOCK_EINVAL, "lease TTL must be at least 1 ms");
    if (!c->backend->renew)
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot renew", c->backend->name);
    if (atomic_load(&lock->lost)) /* never revive a grant reported lost */
        return dlock_report_lost(c, dlock_keeper_lost_detail(lock));
    dlock_keeper_hold(lock);
    uint64_t sent = dlock_monotonic_ns();
    if (dlock_abi_has(c->backend, lease_end_ns))
        lock->held->lease_end_ns = 0;
    rc = dlock_lock_ops(lock)->renew(c->conn, lock->held, ttl_ms);
    if (dlock_client_expires(c))
        dlock_metrics_renewal(c, rc);
    uint64_t end = 0;
    if (rc == 0) {
        lock->ttl_ms = ttl_ms;
        end = dlock_lease_end(c, lock->held, sent, ttl_ms);
    }
    rc = dlock_finish(c, rc);
    dlock_keeper_unhold(lock, rc, end);
    return rc;
}

int dlock_lock_raise_token(dlock_lock *lock, uint64_t floor)
{
    dlock_client *c;
    int rc;
    if (!lock || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    c = lock->client;
    dlock_clearerr(c);
    if (floor >= (1ull << 63))
        return dlock_seterr(c, DLOCK_EINVAL, "a token floor must be below 2^63");
    if (!dlock_method(c->backend, raise_token))
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot raise its tokens",
                            c->backend->name);
    if (atomic_load(&lock->lost)) /* never act on a grant reported lost */
        return dlock_report_lost(c, dlock_keeper_lost_detail(lock));
    dlock_keeper_hold(lock);
    rc = dlock_finish(c, dlock_lock_ops(lock)->raise_token(c->conn, lock->held, floor));
    dlock_keeper_unhold_call(lock, rc);
    return rc;
}

int dlock_client_token_top(dlock_client *c, uint64_t *top)
{
    int rc;
    if (!c || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    if ((rc = dlock_check_usable(c)) != 0)
        return rc;
    if (!top)
        return dlock_seterr(c, DLOCK_EINVAL, "no place to store the top token");
    *top = 0;
    if (!dlock_method(c->backend, token_top))
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot tell its highest token",
                            c->backend->name);
    return dlock_finish(c, c->backend->token_top(c->conn, top));
}

int dlock_client_raise_floor(dlock_client *c, uint64_t floor)
{
    int rc;
    if (!c || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    if ((rc = dlock_check_usable(c)) != 0)
        return rc;
    if (floor >= (1ull << 63))
        return dlock_seterr(c, DLOCK_EINVAL, "a token floor must be below 2^63");
    if (!dlock_method(c->backend, raise_floor))
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot raise its tokens",
                            c->backend->name);
    return dlock_finish(c, c->backend->raise_floor(c->conn, floor));
}

int dlock_inspect(dlock_client *c, const char *name, dlock_info *info)
{
    int rc;
    if (!c || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    if ((rc = dlock_check_usable(c)) != 0)
        return rc;
    if (!info)
        return dlock_seterr(c, DLOCK_EINVAL, "no place to store what the store knows");
    size_t len = name ? strnlen(name, DLOCK_NAME_MAX + 1) : 0;
    if ((rc = dlock_check_name(c, name, len)) != 0)
        return rc;
    memset(info, 0, sizeof *info);
    info->version = DLOCK_INFO_VERSION;
    if (!dlock_method(c->backend, inspect))
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot inspect its locks",
                            c->backend->name);
    rc = c->backend->inspect(c->conn, name, len, info);
    if (rc) {
        memset(info, 0, sizeof *info);
        info->version = DLOCK_INFO_VERSION;
    }
    return dlock_finish(c, rc);
}

/* One exclusive holder from what inspect() tells, for a backend that
 * cannot list holders: stores without shared modes hold one at a time. */
static int holders_from_info(dlock_client *c, const char *name, size_t len,
                             dlock_holder *holders, size_t capacity, size_t *count)
{
    dlock_info info;
    memset(&info, 0, sizeof info);
    info.version = DLOCK_INFO_VERSION;
    int rc = c->backend->inspect(c->conn, name, len, &info);
    if (rc || !(info.known & DLOCK_KNOWS_HELD) || !info.held)
        return rc;
    *count = 1;
    if (capacity) {
        dlock_holder *h = &holders[0];
        h->known = DLOCK_KNOWS_MODE |
                   (info.known & (DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER | DLOCK_KNOWS_LEASE));
        h->mode = DLOCK_MODE_EXCLUSIVE;
        h->token = info.token;
        h->lease_ms = info.lease_ms;
        memcpy(h->owner, info.owner, sizeof h->owner);
    }
    return 0;
}

int dlock_store_holders(dlock_client *c, const char *name, size_t len, dlock_holder *holders,
                        size_t capacity, size_t *count)
{
    if (dlock_method(c->backend, inspect_holders))
        return c->backend->inspect_holders(c->conn, name, len, holders, capacity, count);
    if (dlock_method(c->backend, inspect))
        return holders_from_info(c, name, len, holders, capacity, count);
    return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot inspect its locks",
                        c->backend->name);
}

int dlock_inspect_holders(dlock_client *c, const char *name, dlock_holder *holders,
                          size_t capacity, size_t *count)
{
    int rc;
    if (!c || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    if ((rc = dlock_check_usable(c)) != 0)
        return rc;
    if (!count || (capacity && !holders))
        return dlock_seterr(c, DLOCK_EINVAL, "no place to store the holders");
    *count = 0;
    size_t len = name ? strnlen(name, DLOCK_NAME_MAX + 1) : 0;
    if ((rc = dlock_check_name(c, name, len)) != 0)
        return rc;
    if (capacity)
        memset(holders, 0, capacity * sizeof *holders);
    rc = dlock_store_holders(c, name, len, holders, capacity, count);
    if (rc) {
        *count = 0;
        if (capacity)
            memset(holders, 0, capacity * sizeof *holders);
    }
    return dlock_finish(c, rc);
}

const char *dlock_lock_owner(const dlock_lock *lock)
{
    if (!lock)
        return NULL;
    dlock_lock *l = (dlock_lock *)lock;
    char *hex = atomic_load(&l->owner_hex), *mine, *none = NULL;
    if (hex)
        return hex;
    if (!(mine = malloc(33)))
        return NULL;
    dlock_hex(l->owner, sizeof l->owner, mine);
    if (atomic_compare_exchange_strong(&l->owner_hex, &none, mine))
        return mine;
    free(mine); /* another thread's is there */
    return none;
}

uint64_t dlock_lock_token(const dlock_lock *lock)
{
    return lock ? lock->held->token : 0;
}

dlock_mode dlock_lock_mode(const dlock_lock *lock)
{
    return lock ? (dlock_mode)lock->mode : DLOCK_MODE_EXCLUSIVE;
}

uint32_t dlock_lock_limit(const dlock_lock *lock)
{
    return lock ? lock->limit : 0;
}

const char *dlock_lock_name(const dlock_lock *lock, size_t *lenp)
{
    if (!lock)
        return NULL;
    if (lenp)
        *lenp = lock->ent[0].len;
    return dlock_lock_names(lock);
}

dlock_client *dlock_lock_client(const dlock_lock *lock)
{
    return lock ? lock->client : NULL;
}

uint64_t dlock_lock_expires_ns(const dlock_lock *lock)
{
    return lock ? atomic_load(&((dlock_lock *)lock)->expires_ns) : 0;
}

int dlock_lock_lost(const dlock_lock *lock)
{
    return lock ? atomic_load(&((dlock_lock *)lock)->lost) : DLOCK_EINVAL;
}

int dlock_lock_lost_fd(dlock_lock *lock)
{
    return lock ? dlock_keeper_lost_fd(lock) : DLOCK_EINVAL;
}

const char *dlock_lock_lost_detail(const dlock_lock *lock)
{
    return lock ? dlock_keeper_lost_detail(lock) : "";
}

size_t dlock_lock_name_count(const dlock_lock *lock)
{
    return lock ? lock->names : 0;
}

const char *dlock_lock_name_at(const dlock_lock *lock, size_t i, size_t *lenp)
{
    if (!lock || i >= lock->names)
        return NULL;
    const char *p = dlock_lock_names(lock);
    for (size_t k = 0; k < i; k++)
        p += lock->ent[k].len + 1;
    if (lenp)
        *lenp = lock->ent[i].len;
    return p;
}

unsigned int dlock_lock_holds(const dlock_lock *lock)
{
    return lock ? lock->holds : 0;
}
