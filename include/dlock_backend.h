/*
 * dlock backend ABI: what a store backend implements and what the core
 * offers it. Users of locks need only dlock.h; this header is for backend
 * authors (the built-in backends use it too).
 *
 * A backend is a dlock_backend vtable. The core parses and checks the URI,
 * then hands the backend a dlock_uri to read through getters: backends never
 * parse raw URI strings. Deadlines arrive as absolute CLOCK_MONOTONIC times.
 *
 * Versioning: `version` is the first field and methods are only ever
 * appended. The core reads a method only when the backend's version is new
 * enough to have it, and treats a NULL optional method as "not supported".
 */
#ifndef DLOCK_BACKEND_H
#define DLOCK_BACKEND_H

#include <stdarg.h>

#include "dlock.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DLOCK_BACKEND_VERSION 9

/* Capability bits: what a backend guarantees. */
enum {
    DLOCK_CAP_LEASE = 1u << 0,    /* locks expire after their TTL unless renewed */
    DLOCK_CAP_RENEW = 1u << 1,    /* renew resets the lease */
    DLOCK_CAP_FENCING = 1u << 2,  /* tokens strictly increase per name */
    DLOCK_CAP_FIFO = 1u << 3,     /* waiters are served first-come first-served */
    DLOCK_CAP_BLOCKING = 1u << 4, /* the store wakes waiters: no polling */
    DLOCK_CAP_SHARED = 1u << 5,   /* shared (reader) locks */
    DLOCK_CAP_DEADLINE = 1u << 6, /* waits honour a deadline */
    DLOCK_CAP_HOLDER_DEATH = 1u << 7, /* a dead holder's lock is freed at once
                                         (not only after its lease) */
    DLOCK_CAP_RAISE = 1u << 8,    /* a holder can raise its name's later tokens
                                     above any value (raise_token) */
    DLOCK_CAP_CANCEL = 1u << 9,   /* waits end when request.cancel_fd fires */
    DLOCK_CAP_SEMAPHORE = 1u << 10, /* counting semaphores (request.limit) */
    DLOCK_CAP_ELECTION = 1u << 11, /* elections: publish() and leader() */
    DLOCK_CAP_WATCH = 1u << 12,   /* the store wakes an election's observers
                                     (watch_open()): no polling */
    DLOCK_CAP_TOKEN_SHARED = 1u << 13, /* one token counter for every name of
                                     the store (a sequence): a name's tokens
                                     grow with every grant of every name, so a
                                     list cannot keep them at or below those of
                                     a store that cannot raise its own */
};

/* How far a backend whose tokens it cannot set, but whose counter moves
 * with every write, moves it up with writes of its own to reach a floor
 * (raise_token, raise_floor). */
#define DLOCK_RAISE_STEPS_MAX 16

/* A parsed URI. Opaque; read through the getters below. */
typedef struct dlock_uri dlock_uri;

/* Lower-cased scheme, e.g. "redis". */
DLOCK_API const char *dlock_uri_scheme(const dlock_uri *uri);
/* Percent-decoded user name and password; NULL when absent. */
DLOCK_API const char *dlock_uri_user(const dlock_uri *uri);
DLOCK_API const char *dlock_uri_password(const dlock_uri *uri);
/* Hosts of the comma-separated host list; IPv6 without its brackets. A URI
 * with an empty authority ("file:///dir") has 0 hosts. */
DLOCK_API size_t dlock_uri_host_count(const dlock_uri *uri);
DLOCK_API const char *dlock_uri_host(const dlock_uri *uri, size_t i);
/* Port of host i; 0 when the URI gave none. */
DLOCK_API unsigned int dlock_uri_port(const dlock_uri *uri, size_t i);
/* Percent-decoded path, "" when absent; otherwise starts with '/'. */
DLOCK_API const char *dlock_uri_path(const dlock_uri *uri);
/* Query parameters in URI order (keys may repeat), percent-decoded. */
DLOCK_API size_t dlock_uri_param_count(const dlock_uri *uri);
DLOCK_API const char *dlock_uri_param_key(const dlock_uri *uri, size_t i);
DLOCK_API const char *dlock_uri_param_value(const dlock_uri *uri, size_t i);
/* Value of the last parameter called key; NULL when absent. */
DLOCK_API const char *dlock_uri_param(const dlock_uri *uri, const char *key);
/* The URI with its password replaced by "***": safe for messages.
 * Owned by the uri. */
DLOCK_API const char *dlock_uri_redacted(const dlock_uri *uri);

/*
 * Typed parameter readers. Each leaves *out untouched when the key is absent
 * and returns 0; on a malformed or out-of-range value it records an error
 * naming the key on client and returns DLOCK_EBADURI.
 */
DLOCK_API int dlock_uri_param_uint(dlock_client *client, const dlock_uri *uri,
                                   const char *key, uint64_t min, uint64_t max,
                                   uint64_t *out);
/* Accepts 1/0, true/false, yes/no, on/off. */
DLOCK_API int dlock_uri_param_bool(dlock_client *client, const dlock_uri *uri,
                                   const char *key, int *out);
/* One of the NULL-terminated choices, exactly: *out = its index. Anything
 * else is DLOCK_EBADURI listing the choices ("option layout: dlock or plain"). */
DLOCK_API int dlock_uri_param_choice(dlock_client *client, const dlock_uri *uri,
                                     const char *key, const char *const *choices, int *out);

/*
 * Records an error on client (printf-style detail) and returns code, so that
 * backends can write `return dlock_seterr(c, DLOCK_ECONNECT, "...", ...)`.
 * The detail is truncated to DLOCK_ERRMSG_MAX - 1 bytes, and any occurrence
 * of the client's URI password is masked. On a keeper thread the detail goes
 * to the keeper's own buffer, not to the client.
 */
DLOCK_API int dlock_seterr(dlock_client *client, int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
DLOCK_API int dlock_vseterr(dlock_client *client, int code, const char *fmt,
                            va_list ap)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 0)))
#endif
    ;

typedef struct dlock_backend dlock_backend;

/* A backend's connection: embed as the first member of the backend's own
 * struct. The core fills backend and client after open() returns. */
typedef struct dlock_conn {
    const dlock_backend *backend;
    dlock_client *client; /* for dlock_seterr() */
    /* Capabilities of this connection when they differ from the backend's
     * (e.g. Redlock over several hosts is not FIFO); 0 means backend->caps.
     * Set by open(). */
    unsigned int caps;
} dlock_conn;

/* A backend's held lock: embed as the first member of the backend's own
 * struct, zeroed. The backend sets token on a successful acquire. */
typedef struct dlock_held {
    uint64_t token;
    /* Version 2. CLOCK_MONOTONIC instant until which the lease is known to
     * be ours, when the backend knows better than the core, which otherwise
     * takes the start of the acquire or renew call plus the TTL. Set it on
     * acquire when the grant may come long after the call started (a handoff
     * after a wait: the moment the grant reached the client, plus the TTL)
     * and on Redlock (validity less drift). 0: not set. The core reads it
     * after acquire, renew and keep, and zeroes it before each. */
    uint64_t lease_end_ns;
    /* Version 6. The length of the lease lease_end_ns ends, in ms, when it
     * is not the lock's TTL: a store whose locks live as long as a session
     * (ZooKeeper) sets lease_end_ns from keep() to the moment the session
     * can end at the earliest, and lease_ms to the session timeout. The
     * keeper reports a loss a margin before the lease end, and the margin
     * grows with the lease (docs/keeper.md). 0: the TTL. The core zeroes it
     * with lease_end_ns. */
    uint32_t lease_ms;
} dlock_held;

/* One acquire, as checked and completed by the core. name stays valid and
 * unchanged until the held it grants is released (it is the lock's own
 * copy): a backend may point at it rather than copy it. The rest of the
 * request is the call's only. */
typedef struct dlock_request {
    const char *name;       /* NUL-terminated, no embedded NUL */
    size_t name_len;        /* 1 .. DLOCK_NAME_MAX */
    uint32_t ttl_ms;        /* > 0 */
    dlock_wait wait;
    uint64_t deadline_ns;   /* absolute CLOCK_MONOTONIC; DLOCK_WAIT_DEADLINE only */
    unsigned char owner[16];/* 128 random bits, fresh for every acquire */
    char owner_hex[33];     /* the same, as lower-case hex */
    /* Readable (POLLIN) once the application cancels the wait, -1 when it
     * cannot (no dlock_cancel given, or a try). A backend with
     * DLOCK_CAP_CANCEL watches it beside whatever its wait blocks on; when
     * it fires, the backend gives the wait up as it does at a deadline
     * (leaving nothing behind in the store) and returns DLOCK_ECANCELED
     * (dlock_request_cancelled() tells it from a deadline). A grant that
     * arrived first may still be returned. Never read or close it. */
    int cancel_fd;
    /* Version 7. DLOCK_MODE_SHARED only on a backend that declares
     * DLOCK_CAP_SHARED, a limit (1..DLOCK_LIMIT_MAX, exclusive mode) only on
     * one that declares DLOCK_CAP_SEMAPHORE: the core refuses the rest.
     * Names held in another mode or limit: DLOCK_EMODE (dlock.h). */
    dlock_mode mode;
    uint32_t limit;
} dlock_request;

/* 1 when req's wait has been cancelled (cancel_fd readable), else 0. */
DLOCK_API int dlock_request_cancelled(const dlock_request *req);
/* Records "the wait was cancelled" on client and returns DLOCK_ECANCELED. */
DLOCK_API int dlock_cancelled(dlock_client *client);
/* A wait's pause where the store cannot notify (a reconnect backoff, a
 * step back after a lost race): sleeps until the CLOCK_MONOTONIC instant
 * until_ns, or less when cancel_fd (a request's cancel_fd; -1: none) turns
 * readable. Returns 0, DLOCK_ECANCELED, or DLOCK_EINTR when a signal cut it
 * short; records no detail. */
DLOCK_API int dlock_pause_until(uint64_t until_ns, int cancel_fd);

/* The one cancellable wait (core/poll.c): blocks until one of fds[0..n)
 * (n <= DLOCK_POLL_FDS_MAX; a negative fd is ignored) has an event it asks
 * for, cancel_fd (-1: none) turns readable, or the CLOCK_MONOTONIC instant
 * deadline_ns (DLOCK_POLL_FOREVER: none) passes; past it, the descriptors
 * are still looked at once. Sets each fds[i].revents. Returns a mask of
 * DLOCK_POLL_READY (some fd) and DLOCK_POLL_CANCEL (the flag), both when
 * they came together (the caller says which wins); 0 when the deadline
 * passed first; DLOCK_POLL_SIGNAL when a signal arrived and flags has
 * DLOCK_POLL_INTR (otherwise the wait goes on); DLOCK_POLL_ERROR with errno
 * when poll failed. */
#define DLOCK_POLL_FDS_MAX 512
#define DLOCK_POLL_FOREVER UINT64_MAX
#define DLOCK_POLL_READY 1
#define DLOCK_POLL_CANCEL 2
#define DLOCK_POLL_SIGNAL (-2)
#define DLOCK_POLL_ERROR (-1)
#define DLOCK_POLL_INTR 1u
struct pollfd;
DLOCK_API int dlock_poll_until(struct pollfd *fds, size_t n, int cancel_fd, uint64_t deadline_ns,
                             unsigned int flags);
/* 1 when cancel_fd (-1: none) is readable now, without waiting. */
DLOCK_API int dlock_fd_cancelled(int cancel_fd);

/* The CLOCK_MONOTONIC instant by which the core needs the method running on
 * the calling thread to return; DLOCK_POLL_FOREVER when it set none. The
 * core sets one around keep() (the loss margin before the lock's lease
 * end: an answer after it cannot keep the lock, whose loss is reported
 * then) and around release()
 * of a lock its keeper reported lost (DLOCK_LOST_RELEASE_MS from the call:
 * the store may be what made it lost). A backend bounds such a call by the
 * earlier of this and its own bound, and gives up there as at its own
 * (what a release could not delete is left to the lease or session). */
DLOCK_API uint64_t dlock_call_deadline(void);

/* A backend vtable's first field, as libgit2's *_INIT initialisers do: a
 * backend states only what it implements, and what it leaves out is NULL:
 *   const dlock_backend my_backend = {DLOCK_BACKEND_INIT, .name = "my", ...};
 */
#define DLOCK_BACKEND_INIT .version = DLOCK_BACKEND_VERSION

/* An election observer's watch (watch_open()): embed as the first member of
 * the backend's own struct. */
typedef struct dlock_watch {
    dlock_conn *conn; /* set by the backend */
} dlock_watch;

struct dlock_backend {
    unsigned int version; /* DLOCK_BACKEND_VERSION the backend was built for */
    const char *name;     /* short name, e.g. "redis" */
    /* URI schemes served, NULL-terminated, lower case, e.g. {"redis", NULL}. */
    const char *const *schemes;
    unsigned int caps;    /* DLOCK_CAP_* */
    /* Query keys accepted, NULL-terminated. The core rejects any other key
     * before open() is called. */
    const char *const *options;

    /* Required. Connects; on failure records detail with dlock_seterr() and
     * returns its code, leaving *connp untouched. */
    int (*open)(dlock_client *client, const dlock_uri *uri, dlock_conn **connp);
    /* Required. Releases what the connection still holds and frees it. */
    void (*close)(dlock_conn *conn);
    /* Required. Returns 0 with *heldp set, or DLOCK_EBUSY (try),
     * DLOCK_ETIMEDOUT (deadline passed), or another error. A waiter that
     * gives up must leave nothing behind in the store. */
    int (*acquire)(dlock_conn *conn, const dlock_request *req,
                   dlock_held **heldp);
    /* Required. Releases if still ours (DLOCK_ELOST otherwise) and frees held
     * whatever the result. */
    int (*release)(dlock_conn *conn, dlock_held *held);
    /* Optional (NULL: DLOCK_ENOTSUP). Resets the lease to ttl_ms, or fails with
     * DLOCK_ELOST without re-creating an expired lock. */
    int (*renew)(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms);
    /* Optional. The store's own round trip (PING, SELECT 1...), for
     * benchmarks comparing lock latency with the store's floor. */
    int (*ping)(dlock_conn *conn);

    /* Version 2. */

    /* Optional (NULL: an acquire with .keep fails with DLOCK_ENOTSUP).
     * Called on the client's keeper thread to reset held's lease to ttl_ms
     * (as renew does), or on stores without leases to check that it is
     * still held. It runs while the application's thread may be inside any
     * other method on the same conn (acquire, ping, release or renew of
     * other locks); the core never runs it at the same time as release or
     * renew of the same held, nor during or after close. So it must use a
     * connection of its own, or only what it knows to be safe to share (a
     * lock's own session, state under the backend's mutex), and it must
     * return within a bound the backend documents. Errors recorded with
     * dlock_seterr() on this thread go to the keeper, never to the client.
     * Returns 0, DLOCK_ELOST (the lock is gone: reported at once),
     * DLOCK_EEXPIRED (must be assumed gone: reported at once), or another
     * code (transient: tried again while the lease lasts). */
    int (*keep)(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms);

    /* Version 3. */

    /* Optional (NULL: DLOCK_ENOTSUP). While held is still ours, makes every
     * later grant of held's name by this store carry a token greater than
     * floor: raises the name's counter to floor where it is below (never
     * lowers it), durably as the store keeps its counters. held's own token
     * is unchanged. floor < 2^63 (the core refuses larger); a store whose
     * tokens cannot reach floor returns DLOCK_EINVAL saying its limit.
     * Returns 0, DLOCK_ELOST (no longer ours: nothing raised), DLOCK_ENOTSUP
     * with a detail when the store cannot raise its tokens and later ones
     * may not be above floor (a backend without DLOCK_CAP_RAISE returns 0
     * only when its later tokens are above floor anyway, e.g. floor below
     * held's own token on a store whose tokens are global), or another
     * error. Called on the application's thread, like renew, never at the
     * same time as keep() of the same held. */
    int (*raise_token)(dlock_conn *conn, dlock_held *held, uint64_t floor);

    /* Version 4: store-wide tokens, for moving locks between stores
     * (dlock migrate OLD NEW) without knowing every name. */

    /* Optional (NULL: DLOCK_ENOTSUP). Sets *top to a value no smaller than
     * every token this store has granted so far, for any name, under this
     * URI's namespace (prefix, table, root, directory), and no smaller than
     * a floor set with raise_floor. A bound computed from the store's own
     * clock counts (Redis, file). Takes no lock and changes nothing a
     * holder or waiter can see. May take time proportional to the number
     * of names the store keeps (a scan); bounded by the backend's timeout
     * per round trip. Called on the application's thread. */
    int (*token_top)(dlock_conn *conn, uint64_t *top);
    /* Optional (NULL: DLOCK_ENOTSUP). Makes every grant this store starts
     * after the call returns, for any name under this URI's namespace,
     * carry a token greater than floor, durably as the store keeps its
     * counters; never lowers anything, so calling it again is harmless.
     * floor < 2^63 (the core refuses larger); DLOCK_EINVAL with the limit
     * when the store's tokens cannot reach floor. A backend whose tokens it
     * cannot set (ZooKeeper's transaction ids) checks instead: 0 when its
     * next tokens are above floor anyway, else DLOCK_ENOTSUP with a detail
     * naming both values. Safe while other clients hold and wait. Such a
     * backend whose counter moves with every write (a transaction id, a
     * revision) makes up to DLOCK_RAISE_STEPS_MAX of them with writes of
     * its own before it refuses (raise_token too): dlock migrate sets the
     * other store's floor to this one's top, so a list's other part can
     * come back with a token just above it while this store is quiet. */
    int (*raise_floor)(dlock_conn *conn, uint64_t floor);

    /* Version 5. */

    /* Optional (NULL: DLOCK_ENOTSUP). Fills info (zeroed by the core, its
     * version set) with what the store knows about the lock called name
     * (len bytes, checked like an acquire's, NUL-terminated): sets a
     * DLOCK_KNOWS_* bit in info->known for each field it fills, and leaves
     * the others zero (a field the store cannot tell is never guessed).
     * Must not take, wait for, renew or otherwise disturb the lock, nor
     * join its queue; bounded by the backend's timeout. Called on the
     * application's thread. The owner is the holder's owner_hex where the
     * store keeps it. */
    int (*inspect)(dlock_conn *conn, const char *name, size_t len, dlock_info *info);

    /* Version 8. */

    /* Optional (NULL: the core tells inspect()'s holder, as an exclusive
     * one, or DLOCK_ENOTSUP without inspect). Lists every holder of name
     * (as inspect: checked, NUL-terminated, disturbing nothing, bounded),
     * in grant order: fills holders[0 .. min(capacity, *count)) (zeroed by
     * the core; capacity may be 0) and sets *count to how many hold. A
     * backend that grants shared locks or semaphore permits implements it.
     * On such a name, inspect() reports held with the newest holder's
     * token, owner and lease. */
    int (*inspect_holders)(dlock_conn *conn, const char *name, size_t len,
                           dlock_holder *holders, size_t capacity, size_t *count);

    /* Version 9: leader election (dlock.h "Leader election"). A backend
     * that declares DLOCK_CAP_ELECTION implements publish(), leader() and
     * wake(); one that declares DLOCK_CAP_WATCH also the watch_*() methods.
     * Without a watch the core's observer reads leader() every
     * DLOCK_OBSERVE_POLL_MS. Values are at most DLOCK_VALUE_MAX bytes, any
     * bytes. */

    /* Stores value as the published value of held's grant (replacing what
     * it published before), only while held is still ours, atomically with
     * that check (DLOCK_ELOST otherwise, nothing written), and wakes the
     * name's watches. Called on the application's thread right after an
     * election's grant, and for each proclaim. One value per name is kept
     * (the last leader's); leader() tells it only while the grant that
     * published it holds, so a dead leader's value is never read as
     * another's, and a store may keep it until the next publish. */
    int (*publish)(dlock_conn *conn, dlock_held *held, const void *value, size_t len);
    /* As inspect() (held, token, owner, lease; the same checks and bounds),
     * plus the value the current holder published: copies it to value
     * (DLOCK_VALUE_MAX + 1 bytes of room) and sets *value_len, 0 when the
     * holder has published none (or the name is free). The value must be
     * the holder's own: read together with the holder, or checked against
     * it (its owner or token). */
    int (*leader)(dlock_conn *conn, const char *name, size_t len, dlock_info *info, char *value,
                  size_t *value_len);
    /* Wakes the name's watches without changing anything: called after an
     * election's release (dlock_resign()). A store whose watches see a
     * release by themselves may do nothing. */
    int (*wake)(dlock_conn *conn, const char *name, size_t len);
    /* Opens a watch on the name on conn (a connection of the observer's
     * own client, used from its thread only): from the moment it returns,
     * a grant, release, publish or wake of the name, and where the store
     * tells it the end of the holder (lease expiry, session end, death),
     * make watch_fd() readable. Spurious wake-ups are allowed (the core
     * reads leader() after each); a missed change is not. */
    int (*watch_open)(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp);
    /* The descriptor the core polls for POLLIN. */
    int (*watch_fd)(dlock_watch *watch);
    /* Consumes what made the descriptor readable, without blocking: 0 (the
     * core then reads leader()), or an error when the watch is broken (the
     * connection dropped): the core closes it, opens another, and reads. */
    int (*watch_read)(dlock_watch *watch);
    void (*watch_close)(dlock_watch *watch);
};

/* How often the core's observer reads an election on a backend without
 * DLOCK_CAP_WATCH, ms. */
#define DLOCK_OBSERVE_POLL_MS 100u

/*
 * Saving and restoring the detail around a cleanup whose own failure must
 * not replace the error being reported (e.g. leaving a wait queue after a
 * timeout). Both follow the keeper-thread redirection of dlock_seterr().
 */
typedef struct dlock_errsave {
    int err;
    char msg[DLOCK_ERRMSG_MAX];
} dlock_errsave;
DLOCK_API void dlock_err_save(dlock_client *client, dlock_errsave *save);
DLOCK_API void dlock_err_restore(dlock_client *client, const dlock_errsave *save);
/* Forgets the detail (after a failure the backend recovered from). */
DLOCK_API void dlock_err_clear(dlock_client *client);

/*
 * Runs around a write to a socket whose library may raise SIGPIPE (hiredis
 * writes with write(2)): blocks SIGPIPE in the calling thread, and on the way
 * out consumes a SIGPIPE that the write raised, restoring the thread's mask.
 * The process's disposition is never changed. Not needed for libraries that
 * send with MSG_NOSIGNAL (libpq, libmariadb).
 */
typedef struct dlock_sigpipe {
    int was_pending, was_blocked;
} dlock_sigpipe;
DLOCK_API void dlock_sigpipe_block(dlock_sigpipe *state);
DLOCK_API void dlock_sigpipe_restore(const dlock_sigpipe *state);

/* Counts a connection the backend opened again after one broke (the
 * client's reconnects metric). Any thread. */
DLOCK_API void dlock_count_reconnect(dlock_client *client);

/*
 * Adds a backend to the registry (the built-in ones are registered once, on
 * first use). Fails with DLOCK_EVERSION when backend->version is 0 or newer
 * than this library, DLOCK_EINVAL when a required field is missing, and
 * DLOCK_EEXIST when one of its schemes is already served. The backend struct
 * must outlive every client using it (normally a static).
 */
DLOCK_API int dlock_backend_register(const dlock_backend *backend);

/* The registered backend serving scheme (case-insensitive), or NULL. */
DLOCK_API const dlock_backend *dlock_backend_find(const char *scheme);

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_BACKEND_H */
