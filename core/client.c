/*
 * Clients and locks: the users' API on top of the backend vtable.
 *
 * The core owns everything that must behave the same on every store:
 * URI checking, name and option validation, owner ids, the "a client holds
 * a name at most once" rule, deadline handling and error detail.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/internal.h"
#include "core/uri.h"

/* Schemes dlock knows, whose backend may be left out of a build. */
static const char *const known_schemes[] = {
    "redis", "postgresql", "postgres", "mysql", "mariadb", "zookeeper", NULL,
};

/* Shorter passwords are not searched for in messages: masking every "ab" in
 * a message would wreck it, and the core never formats a password anyway. */
#define REDACT_MIN_LEN 4

static void redact(char *msg, const char *secret)
{
    size_t slen;
    char *hit;
    if (!secret || (slen = strlen(secret)) < REDACT_MIN_LEN)
        return;
    while ((hit = strstr(msg, secret)) != NULL) {
        size_t tail = strlen(hit + slen);
        memmove(hit + 3, hit + slen, tail + 1);
        memcpy(hit, "***", 3);
    }
}

int dlock_vseterr(dlock_client *c, int code, const char *fmt, va_list ap)
{
    /* Redact before truncating, so that no prefix of a password cut off at
     * the buffer's end can slip through. */
    char full[4 * DLOCK_ERRMSG_MAX];
    if (!c)
        return code;
    c->err = code;
    vsnprintf(full, sizeof full, fmt, ap);
    if (c->uri)
        redact(full, dlock_uri_password(c->uri));
    size_t n = strlen(full);
    if (n >= sizeof c->errmsg)
        n = sizeof c->errmsg - 1;
    memcpy(c->errmsg, full, n);
    c->errmsg[n] = '\0';
    return code;
}

int dlock_seterr(dlock_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dlock_vseterr(c, code, fmt, ap);
    va_end(ap);
    return code;
}

void dlock_clearerr(dlock_client *c)
{
    c->err = 0;
    c->errmsg[0] = '\0';
}

/* Backends may return a code without detail; never leave the text empty. */
static int finish(dlock_client *c, int rc)
{
    if (rc && c->errmsg[0] == '\0')
        dlock_seterr(c, rc, "%s", dlock_strerror(rc));
    else if (rc)
        c->err = rc;
    return rc;
}

const char *dlock_errmsg(const dlock_client *c)
{
    if (!c)
        return "out of memory";
    return c->errmsg;
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

static int client_connect(dlock_client *c, const char *uri)
{
    const dlock_backend *b;
    dlock_conn *conn = NULL;
    int rc = dlock_uri_parse(uri, &c->uri, c->errmsg, sizeof c->errmsg);
    if (rc)
        return c->err = rc;
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
        return finish(c, rc);
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
    rc = client_connect(c, uri);
    return rc;
}

static void lock_unlink(dlock_lock *lock)
{
    for (dlock_lock **pp = &lock->client->locks; *pp; pp = &(*pp)->next)
        if (*pp == lock) {
            *pp = lock->next;
            return;
        }
}

void dlock_client_close(dlock_client *c)
{
    if (!c)
        return;
    while (c->locks) {
        dlock_lock *lock = c->locks;
        c->locks = lock->next;
        c->backend->release(c->conn, lock->held);
        free(lock);
    }
    if (c->conn)
        c->backend->close(c->conn);
    dlock_uri_free(c->uri);
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
static int check_usable(dlock_client *c)
{
    if (!c->conn)
        return dlock_seterr(c, DLOCK_EINVAL, "the client is not connected (its open failed)");
    dlock_clearerr(c);
    return 0;
}

int dlock_client_ping(dlock_client *c)
{
    int rc;
    if (!c)
        return DLOCK_EINVAL;
    if ((rc = check_usable(c)) != 0)
        return rc;
    if (!c->backend->ping)
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend has no store to ping",
                            c->backend->name);
    return finish(c, c->backend->ping(c->conn));
}

void dlock_acquire_opts_init(dlock_acquire_opts *opts)
{
    static const dlock_acquire_opts defaults = DLOCK_ACQUIRE_OPTS_INIT;
    if (opts)
        *opts = defaults;
}

static int check_request(dlock_client *c, const char *name, size_t len,
                         const dlock_acquire_opts *o)
{
    if (!name || len == 0)
        return dlock_seterr(c, DLOCK_EINVAL, "lock name is empty");
    if (len > DLOCK_NAME_MAX)
        return dlock_seterr(c, DLOCK_EINVAL, "lock name is longer than %d bytes",
                            DLOCK_NAME_MAX);
    if (memchr(name, '\0', len))
        return dlock_seterr(c, DLOCK_EINVAL, "lock name contains a NUL byte");
    if (o->version == 0 || o->version > DLOCK_ACQUIRE_OPTS_VERSION)
        return dlock_seterr(c, DLOCK_EINVAL,
                            "acquire options version %u is not supported (use DLOCK_ACQUIRE_OPTS_INIT)",
                            o->version);
    if (o->ttl_ms == 0)
        return dlock_seterr(c, DLOCK_EINVAL, "lease TTL must be at least 1 ms");
    if (o->wait != DLOCK_WAIT_TRY && o->wait != DLOCK_WAIT_DEADLINE &&
        o->wait != DLOCK_WAIT_FOREVER)
        return dlock_seterr(c, DLOCK_EINVAL, "unknown wait mode %d", (int)o->wait);
    for (dlock_lock *l = c->locks; l; l = l->next)
        if (l->name_len == len && memcmp(l->name, name, len) == 0)
            return dlock_seterr(c, DLOCK_EALREADY,
                                "this client already holds the lock (locks do not stack)");
    return 0;
}

int dlock_acquire_n(dlock_client *c, const char *name, size_t len,
                    const dlock_acquire_opts *opts, dlock_lock **lockp)
{
    dlock_acquire_opts defaults = DLOCK_ACQUIRE_OPTS_INIT;
    dlock_request req;
    dlock_held *held = NULL;
    dlock_lock *lock;
    int rc;

    if (!c || !lockp)
        return c ? dlock_seterr(c, DLOCK_EINVAL, "no place to store the lock") : DLOCK_EINVAL;
    *lockp = NULL;
    if ((rc = check_usable(c)) != 0)
        return rc;
    if (!opts)
        opts = &defaults;
    if ((rc = check_request(c, name, len, opts)) != 0)
        return rc;

    lock = malloc(sizeof *lock + len + 1);
    if (!lock)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    memcpy(lock->name, name, len);
    lock->name[len] = '\0';
    lock->name_len = len;
    lock->client = c;

    memset(&req, 0, sizeof req);
    req.name = lock->name;
    req.name_len = len;
    req.ttl_ms = opts->ttl_ms;
    req.wait = opts->wait;
    req.deadline_ns = opts->deadline_ns;
    if ((rc = dlock_owner_new(req.owner, req.owner_hex)) != 0) {
        free(lock);
        return dlock_seterr(c, rc, "cannot read random bytes for the owner id");
    }
    /* A deadline already past is one attempt that reports a timeout, so
     * backends only ever see future deadlines. */
    int expired = req.wait == DLOCK_WAIT_DEADLINE && req.deadline_ns <= dlock_monotonic_ns();
    if (expired)
        req.wait = DLOCK_WAIT_TRY;
    rc = c->backend->acquire(c->conn, &req, &held);
    if (rc == DLOCK_EBUSY && expired)
        rc = dlock_seterr(c, DLOCK_ETIMEDOUT, "the deadline passed with the lock still held elsewhere");
    if (rc) {
        free(lock);
        return finish(c, rc);
    }
    lock->held = held;
    lock->next = c->locks;
    c->locks = lock;
    *lockp = lock;
    return 0;
}

int dlock_acquire(dlock_client *c, const char *name, const dlock_acquire_opts *opts,
                  dlock_lock **lockp)
{
    /* strnlen: a missing terminator must not make us read past the limit. */
    size_t len = name ? strnlen(name, DLOCK_NAME_MAX + 1) : 0;
    return dlock_acquire_n(c, name, len, opts, lockp);
}

int dlock_release(dlock_lock *lock)
{
    dlock_client *c;
    int rc;
    if (!lock)
        return DLOCK_EINVAL;
    c = lock->client;
    dlock_clearerr(c);
    lock_unlink(lock);
    rc = c->backend->release(c->conn, lock->held);
    free(lock);
    return finish(c, rc);
}

int dlock_renew(dlock_lock *lock, uint32_t ttl_ms)
{
    dlock_client *c;
    if (!lock)
        return DLOCK_EINVAL;
    c = lock->client;
    dlock_clearerr(c);
    if (ttl_ms == 0)
        return dlock_seterr(c, DLOCK_EINVAL, "lease TTL must be at least 1 ms");
    if (!c->backend->renew)
        return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend cannot renew", c->backend->name);
    return finish(c, c->backend->renew(c->conn, lock->held, ttl_ms));
}

uint64_t dlock_lock_token(const dlock_lock *lock)
{
    return lock ? lock->held->token : 0;
}

const char *dlock_lock_name(const dlock_lock *lock, size_t *lenp)
{
    if (!lock)
        return NULL;
    if (lenp)
        *lenp = lock->name_len;
    return lock->name;
}

dlock_client *dlock_lock_client(const dlock_lock *lock)
{
    return lock ? lock->client : NULL;
}
