/*
 * dlock: distributed locks over several coordination stores.
 *
 * Users' API. Everything here is an opaque handle, a plain options struct
 * with an _INIT initialiser, or a function returning an int error code
 * (0 on success, a negative DLOCK_E* value on failure).
 *
 * Thread-safety
 *   A dlock_client, and every dlock_lock it handed out, may be used by one
 *   application thread at a time: calls on the same client (or on its locks)
 *   must be serialised by the caller. Different clients are independent and
 *   may be used from different threads in parallel.
 *
 *   A client that holds a lock acquired with .keep also runs two threads of
 *   its own, the keeper (see "Keeping leases" below), on a connection of its
 *   own: they renew and watch kept locks while the application's thread is
 *   blocked in any other call on the same client, such as waiting for
 *   another lock. The keeper never touches the client's error detail.
 *
 *   Safe from any thread at any time, also while another thread is inside a
 *   call on the same client: dlock_lock_lost(), dlock_lock_expires_ns(),
 *   dlock_lock_lost_fd() (of a lock that is not being released),
 *   dlock_lock_token(), dlock_lock_name(), dlock_strerror(),
 *   dlock_err_name(), dlock_version(), dlock_monotonic_ns(),
 *   dlock_cancel_fire() and dlock_cancel_fired().
 *
 *   A process that forks keeps its clients in the parent only: a child must
 *   open its own (the keeper's threads do not survive fork()).
 *
 * Signals
 *   No dlock call can kill the program with SIGPIPE: a write to a connection
 *   the peer has reset fails with DLOCK_ECONNECT, whatever the application's
 *   SIGPIPE disposition, which dlock never changes. The keeper's threads
 *   block every signal, so signals reach the application's own threads.
 *
 * Ownership
 *   Strings returned by this API belong to the library; none is ever to be
 *   freed by the caller. Their lifetimes are stated at each function.
 */
#ifndef DLOCK_H
#define DLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DLOCK_BUILDING) && defined(__GNUC__)
#define DLOCK_API __attribute__((visibility("default")))
#else
#define DLOCK_API
#endif

#define DLOCK_VERSION_MAJOR 0
#define DLOCK_VERSION_MINOR 1
#define DLOCK_VERSION_PATCH 0
#define DLOCK_VERSION_STRING "0.1.0"

/* Longest lock name accepted, in bytes. Names are arbitrary bytes except NUL. */
#define DLOCK_NAME_MAX 4096
/* Longest URI accepted, in bytes. */
#define DLOCK_URI_MAX 8192
/* Size of the per-client error detail buffer, terminating NUL included. */
#define DLOCK_ERRMSG_MAX 256

/*
 * The error table. Numbers are part of the ABI: they are never renumbered
 * and new codes are only appended.
 */
#define DLOCK_ERRNO_MAP(XX)                                                    \
    XX(EINVAL, -1, "invalid argument")                                         \
    XX(EBADURI, -2, "malformed URI")                                           \
    XX(ESCHEME, -3, "unknown URI scheme")                                      \
    XX(ENOBACKEND, -4, "backend not built into this library")                  \
    XX(ECONNECT, -5, "cannot connect to the store")                            \
    XX(EAUTH, -6, "authentication failed")                                     \
    XX(EBUSY, -7, "lock is held by another owner")                             \
    XX(ETIMEDOUT, -8, "timed out waiting for the lock")                        \
    XX(ELOST, -9, "lock was lost")                                             \
    XX(ENOTOWNER, -10, "not the owner of the lock")                            \
    XX(ENOTSUP, -11, "operation not supported by this backend")                \
    XX(EPROTO, -12, "protocol error")                                          \
    XX(ENOMEM, -13, "out of memory")                                           \
    XX(EIO, -14, "input/output error")                                         \
    XX(EALREADY, -15, "lock already held by this client")                      \
    XX(EDEADLK, -16, "deadlock detected")                                      \
    XX(EINTR, -17, "interrupted by a signal")                                  \
    XX(ESTORE, -18, "the store reported an error")                             \
    XX(EVERSION, -19, "incompatible ABI version")                              \
    XX(EEXIST, -20, "already registered")                                      \
    XX(EEXPIRED, -21, "lease ran out without a confirmed renewal")            \
    XX(ECANCELED, -22, "the wait was cancelled")                               \
    XX(EMODE, -23, "the name is held in another mode or with another limit")

typedef enum dlock_errno {
    DLOCK_OK = 0,
#define DLOCK_ERRNO_ENUM_(name, num, text) DLOCK_##name = (num),
    DLOCK_ERRNO_MAP(DLOCK_ERRNO_ENUM_)
#undef DLOCK_ERRNO_ENUM_
} dlock_errno;

/* Static text for an error code; never NULL ("unknown error" if unknown). */
DLOCK_API const char *dlock_strerror(int err);
/* Static name of an error code, e.g. "DLOCK_EBUSY"; never NULL. */
DLOCK_API const char *dlock_err_name(int err);

/* Version of the library actually linked, e.g. "0.1.0". Static string. */
DLOCK_API const char *dlock_version(void);

/* Now on CLOCK_MONOTONIC, in nanoseconds: the clock every deadline uses. */
DLOCK_API uint64_t dlock_monotonic_ns(void);

typedef struct dlock_client dlock_client;
typedef struct dlock_lock dlock_lock;

/*
 * Opens a client for the store named by uri, e.g. "file:///run/myapp/locks",
 * "redis://host:6379/0". The URI is parsed and checked strictly (an unknown
 * option is an error naming it) before anything is contacted.
 *
 * A list of URIs separated by whitespace ("redis://old:6379/0
 * postgresql://new/app") opens one client over all of them (at most 16): each
 * lock is then held in every store of the list, taken in the order listed
 * under the acquire's one deadline, all or nothing (a part that fails
 * releases the ones taken before the call returns). Its token is the
 * largest of the stores' tokens, and every store whose token was lower is
 * raised to it (dlock_lock_raise_token()) before the grant returns, so the
 * token is above everything any of the stores granted for the name, and
 * their later grants alone are above it: locks can move from one store to
 * another without a gap and without tokens going back. A store that cannot
 * raise its tokens that far fails the acquire with DLOCK_ENOTSUP. Losing
 * any part is losing the lock; capabilities are those every store has.
 * Whitespace never occurs in a URI, so one URI and a list cannot be
 * confused.
 *
 * On success, *clientp is a connected client. On failure, *clientp is set to
 * a client that carries the error detail for dlock_errmsg() (or to NULL when
 * even that could not be allocated); pass it to dlock_client_close() either
 * way.
 */
DLOCK_API int dlock_client_open(const char *uri, dlock_client **clientp);

/*
 * Closes a client. Locks it still holds are released and their handles freed:
 * they must not be used afterwards. NULL is accepted and ignored.
 */
DLOCK_API void dlock_client_close(dlock_client *client);

/*
 * Detail text of the client's last error, naming what went wrong (never a
 * password). Empty string if the last call succeeded. Owned by the client and
 * valid until its next call or close. dlock_errmsg(NULL) reports out of memory.
 */
DLOCK_API const char *dlock_errmsg(const dlock_client *client);

/* The backend's name, e.g. "file" or "redis". Owned by the library. */
DLOCK_API const char *dlock_client_backend(const dlock_client *client);

/* Capability bits (DLOCK_CAP_*, see dlock_backend.h) of the client's backend. */
DLOCK_API unsigned int dlock_client_caps(const dlock_client *client);

/*
 * One round trip to the store with its cheapest command (PING, SELECT 1...):
 * the floor that lock latencies are compared with. DLOCK_ENOTSUP when the
 * backend has no store to ask (file).
 */
DLOCK_API int dlock_client_ping(dlock_client *client);

/*
 * Shared locks and semaphores. Every name is either a read-write lock or a
 * counting semaphore of one limit, as its holders ask:
 * - a read-write lock (limit 0): an exclusive request is the classic lock;
 *   shared requests (DLOCK_MODE_SHARED) hold together, and exclude and are
 *   excluded by exclusive ones. Waiters are served in arrival order across
 *   modes: a reader that arrives after a waiting writer waits behind it,
 *   and consecutive readers at the head of the queue are granted together.
 * - a semaphore (limit N, 1..DLOCK_LIMIT_MAX): at most N holders at once,
 *   granted in arrival order; a dead holder's permit is freed as a dead
 *   holder's lock is (session end, lease), that permit only.
 * Every grant carries a fencing token that strictly increases in grant
 * order for the name, whatever the mode: an exclusive grant's token is
 * above every earlier grant's. A request whose mode or limit disagrees with
 * the name's current holders (a semaphore on a name held as a read-write
 * lock, limit 5 on a name held with limit 3) fails at once with
 * DLOCK_EMODE. A backend without the mode (DLOCK_CAP_SHARED,
 * DLOCK_CAP_SEMAPHORE) refuses it with DLOCK_ENOTSUP. Everything else a
 * held lock has works in every mode: release, renew, keep, cancel,
 * deadlines, lists of stores, several names (all in one mode).
 */
typedef enum dlock_mode {
    DLOCK_MODE_EXCLUSIVE = 0,
    DLOCK_MODE_SHARED = 1
} dlock_mode;
#define DLOCK_LIMIT_MAX 65535u

/*
 * What a store knows about one lock name, read without taking or disturbing
 * the lock (dlock_inspect()). A store tells what it can: .known has a
 * DLOCK_KNOWS_* bit for every field it filled; the others are zero and must
 * be shown as unknown, never guessed.
 */
#define DLOCK_INFO_VERSION 1
#define DLOCK_INFO_LISTED 16 /* waiters listed in order, at most */
#define DLOCK_HOLDER_MAX 64  /* bytes of an owner description, NUL included */

enum {
    DLOCK_KNOWS_HELD = 1u << 0,       /* .held */
    DLOCK_KNOWS_TOKEN = 1u << 1,      /* .token (while held) */
    DLOCK_KNOWS_OWNER = 1u << 2,      /* .owner (while held) */
    DLOCK_KNOWS_LEASE = 1u << 3,      /* .lease_ms (while held) */
    DLOCK_KNOWS_WAITERS = 1u << 4,    /* .waiters */
    DLOCK_KNOWS_ORDER = 1u << 5,      /* .listed and .waiter[]: the queue's head */
    DLOCK_KNOWS_LAST_TOKEN = 1u << 6, /* .last_token */
    DLOCK_KNOWS_MODE = 1u << 7,       /* dlock_holder .mode and .limit */
};

typedef struct dlock_info {
    unsigned int version; /* DLOCK_INFO_VERSION, set by dlock_inspect() */
    unsigned int known;   /* DLOCK_KNOWS_* */
    int held;             /* 1 held, 0 free */
    uint64_t token;       /* the holder's fencing token */
    /* The holder: the 32 hex digits of its dlock owner id (see
     * dlock_lock_owner()) where the store keeps it, else what the store
     * knows it by (e.g. "pid 4242 on 10.0.0.7"). */
    char owner[DLOCK_HOLDER_MAX];
    uint64_t lease_ms;    /* lease time left, ms */
    uint64_t waiters;     /* clients waiting for the lock */
    size_t listed;        /* the first .listed waiters, in the order they will be served */
    char waiter[DLOCK_INFO_LISTED][DLOCK_HOLDER_MAX];
    uint64_t last_token;  /* the last token granted for the name (0: none yet) */
    /* Room for what later versions add, so that the struct's size never
     * changes (a program built against this header stays safe). */
    uint64_t reserved[16];
} dlock_info;

/*
 * Fills *info with what the client's store knows about the lock called
 * name, without taking it, waiting for it or changing anything a holder or
 * waiter can see. On a list of stores, what the first store listed knows
 * (inspect each store with a client of its own for the others).
 * DLOCK_ENOTSUP when the backend cannot inspect; DLOCK_EINVAL for a bad
 * name; connection and store errors.
 */
DLOCK_API int dlock_inspect(dlock_client *client, const char *name, dlock_info *info);

/*
 * One holder of a name (dlock_inspect_holders()): a read-write lock has one
 * exclusive holder or any number of shared ones, a semaphore up to its
 * limit. Like dlock_info, .known says which fields the store filled. Its
 * size never changes (an array of them is laid out by the caller).
 */
typedef struct dlock_holder {
    unsigned int known; /* DLOCK_KNOWS_TOKEN, _OWNER, _LEASE, _MODE */
    dlock_mode mode;    /* this holder's mode */
    uint32_t limit;     /* the name's limit: 0 for a read-write lock */
    uint64_t token;     /* its fencing token */
    uint64_t lease_ms;  /* lease time left, ms */
    char owner[DLOCK_HOLDER_MAX]; /* as dlock_info's .owner */
    uint64_t reserved[4];
} dlock_holder;

/*
 * Every holder of the lock called name, in grant order (token ascending):
 * fills holders[0 .. min(capacity, *count)) and sets *count to how many
 * hold (0: free), which may be more than capacity (ask again with more
 * room). Reads like dlock_inspect(): takes, waits for and changes nothing.
 * A store that cannot list its holders but can inspect tells the one it
 * knows (an exclusive holder). On a list of stores, the first store's.
 * DLOCK_ENOTSUP when the backend cannot inspect; DLOCK_EINVAL for a bad
 * name, or no count, or no array with a capacity.
 */
DLOCK_API int dlock_inspect_holders(dlock_client *client, const char *name,
                                    dlock_holder *holders, size_t capacity, size_t *count);

/* The owner id of this grant as 32 lower-case hex digits (the holder an
 * inspection names, where the store keeps it). Owned by the lock; made at
 * the first call (NULL only when that runs out of memory). */
DLOCK_API const char *dlock_lock_owner(const dlock_lock *lock);

/*
 * Metrics: counters and histograms each client keeps of its own locks, from
 * dlock_client_open() on, for a service to serve from its own endpoint.
 * Kept with relaxed atomic additions on the client (no allocation, no lock
 * on the acquire path); readable from any thread.
 *
 * Histograms have DLOCK_METRICS_BUCKETS buckets: le[k] counts the
 * observations of at most 2^k microseconds (1 us, 2 us, ... 16.8 s),
 * cumulative as Prometheus has them; count is every observation, larger
 * ones included, and sum_ns their total.
 */
#define DLOCK_METRICS_VERSION 1
#define DLOCK_METRICS_BUCKETS 25
#define DLOCK_METRICS_ERRORS 32 /* errors[-code] for codes -1 .. -31 */

typedef struct dlock_histogram {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t le[DLOCK_METRICS_BUCKETS];
} dlock_histogram;

typedef struct dlock_metrics {
    unsigned int version;       /* DLOCK_METRICS_VERSION, set by dlock_client_metrics() */
    /* Acquires that reached the store, by result (a reentrant acquire, or
     * one refused before asking the store, is not counted). */
    uint64_t granted;
    uint64_t busy;              /* DLOCK_EBUSY: a try found the lock held */
    uint64_t timed_out;         /* DLOCK_ETIMEDOUT: the deadline passed */
    uint64_t failed;            /* any other error */
    uint64_t errors[DLOCK_METRICS_ERRORS]; /* failed, by -code */
    uint64_t releases;          /* locks released in the store (last hold) */
    uint64_t releases_lost;     /* ... that reported DLOCK_ELOST */
    uint64_t renewals;          /* renewals that succeeded: dlock_renew() and the keeper's */
    uint64_t renewal_failures;  /* renewals that failed, a loss or not */
    uint64_t losses;            /* kept locks the keeper reported lost */
    uint64_t reconnects;        /* connections the backend opened again after one broke */
    dlock_histogram wait;       /* how long each counted acquire took */
    dlock_histogram hold;       /* grant to release in the store */
    /* Room for what later versions add: the struct's size never changes. */
    uint64_t reserved[32];
} dlock_metrics;

/* Copies the client's metrics into *m (a lock-free snapshot: counters
 * bumped meanwhile may or may not be in it). */
DLOCK_API int dlock_client_metrics(const dlock_client *client, dlock_metrics *m);

/*
 * Writes m in the Prometheus text exposition format (version 0.0.4) to buf
 * (len bytes, NUL-terminated when len > 0), as snprintf() does: returns the
 * length of the whole text, which was cut if it is len or more; negative
 * (DLOCK_EINVAL) for a NULL m or labels that are not name="value" pairs
 * separated by commas. labels (NULL for none), e.g. "service=\"billing\"",
 * are added to every sample. Metric names start with dlock_.
 */
DLOCK_API int dlock_metrics_format(const dlock_metrics *m, const char *labels, char *buf,
                                   size_t len);

/* How an acquire waits when the lock is held by someone else. */
typedef enum dlock_wait {
    DLOCK_WAIT_TRY = 0,      /* one attempt; DLOCK_EBUSY if held */
    DLOCK_WAIT_DEADLINE = 1, /* wait until .deadline_ns; then DLOCK_ETIMEDOUT */
    DLOCK_WAIT_FOREVER = 2,  /* wait until granted */
} dlock_wait;

#define DLOCK_ACQUIRE_OPTS_VERSION 4
#define DLOCK_TTL_DEFAULT_MS 30000u


/*
 * Cancelling a wait. A dlock_cancel is a flag that any thread may raise
 * (dlock_cancel_fire()), also while another thread waits in dlock_acquire()
 * with it in .cancel: that wait then ends soon (as soon as the backend's
 * store call in flight returns, bounded by its timeout), leaving the
 * store's wait queue as a waiter past its deadline does, and the acquire
 * fails with DLOCK_ECANCELED. An acquire that starts with the flag already
 * raised fails at once without asking the store. A grant the store made
 * before the wait could be withdrawn (it reached the client first, or the
 * store granted it before the cancel reached the store) is kept: the acquire
 * succeeds (check dlock_cancel_fired() if a late grant is unwanted). After
 * DLOCK_ECANCELED the client holds nothing and the store keeps nothing of
 * the wait; if the store could not be reached to withdraw it, what is left
 * goes as a timed-out waiter's does (docs/backends.md, per backend). A
 * signal whose handler raised the flag makes the wait DLOCK_ECANCELED, not
 * DLOCK_EINTR.
 *
 * Once raised, the flag stays raised: one dlock_cancel may cancel several
 * acquires (of any clients) at once, and is made anew for the next wait.
 * dlock_cancel_fire() is async-signal-safe, so a signal handler may call it.
 * Every built-in backend can be cancelled (DLOCK_CAP_CANCEL); an acquire
 * that may wait with a .cancel on a backend that cannot fails with
 * DLOCK_ENOTSUP.
 */
typedef struct dlock_cancel dlock_cancel;

/* Makes a cancel flag, not raised. DLOCK_ENOMEM, or DLOCK_EIO when no
 * descriptor is left for it (it holds one eventfd). */
DLOCK_API int dlock_cancel_new(dlock_cancel **cancelp);
/* Raises the flag; harmless when raised already, and NULL is ignored. */
DLOCK_API void dlock_cancel_fire(dlock_cancel *cancel);
/* 1 once the flag is raised, else 0 (0 for NULL). */
DLOCK_API int dlock_cancel_fired(const dlock_cancel *cancel);
/* Frees the flag; no acquire may still be using it. NULL is ignored. */
DLOCK_API void dlock_cancel_free(dlock_cancel *cancel);

/*
 * Keeping leases. An acquire with .keep = 1 hands the lease to the client's
 * keeper, which renews it on its own threads and connection every
 * DLOCK_KEEP_INTERVAL_DIV-th of the TTL (10 s for the default 30 s TTL),
 * resetting the lease to the TTL (never adding to it, never re-creating an
 * expired lock) until dlock_release() or dlock_client_close(). A renewal that
 * fails without proof of loss (store unreachable, timed out) is retried
 * every DLOCK_KEEP_RETRY_DIV-th of the TTL while the lease lasts.
 *
 * On stores without leases (file, ZooKeeper) the keeper instead checks the
 * lock every min(TTL / 3, DLOCK_KEEP_CHECK_MAX_MS): lock file removed or
 * replaced; ZooKeeper session expired, or disconnected for longer than a
 * third of the session timeout (it may already have expired on the servers).
 *
 * The lock is lost, and on_lost is called once, from a keeper thread, as
 * soon as the keeper knows or must assume it: the store refused a renewal,
 * or the lease end is less than the loss margin away (see
 * DLOCK_LOSS_MARGIN_DIV) without a confirmed renewal. The lease end is
 * measured on CLOCK_MONOTONIC from the moment the last successful renewal
 * was *sent* (dlock_lock_expires_ns()), with an absolute timer: a process
 * resumed after a pause (SIGSTOP, a VM stall) reports the loss at once,
 * before anything else the keeper does.
 *
 * How fast: a refused renewal is reported at that renewal (at most TTL/3
 * after the store let go). A silent network or a dead store is reported
 * the loss margin before the lease end: between 2/3 of the TTL and the TTL,
 * less the margin, after the silence began (16.7 to 26.7 s with the default
 * TTL), so at least the margin before the store itself can free the lock
 * (for a grant handed over after a wait, until its first renewal confirms
 * it, less by one network delay: the handoff is timed from its arrival). A
 * paused process reports on resume, which may be after the lease end. ZooKeeper: an
 * expired session or a deleted lock node within 500 ms of the client
 * learning it; a reset connection session_timeout/3 + 0.5 s after it
 * dropped; a silent network the loss margin before the session can end at
 * the servers (its lease: the last answered request's send + the timeout).
 * Per backend: docs/keeper.md. `dlock run` stops its command's process
 * group on the report (SIGTERM, SIGKILL after --grace, 5 s by default).
 *
 * The callback must return quickly. It may call dlock_lock_token(),
 * dlock_lock_name(), dlock_lock_lost() and dlock_lock_expires_ns(), and
 * signal the application's own threads; it must not call dlock_release(),
 * dlock_renew(), dlock_acquire() or dlock_client_close() (they fail with
 * DLOCK_EINVAL from a keeper thread). The lock stays allocated until the
 * application releases it (dlock_release() then returns DLOCK_ELOST).
 *
 * The release of a lock reported lost still asks the store to delete what
 * may be left of it, but within DLOCK_LOST_RELEASE_MS, on every store,
 * whatever the store's state (a silent network, a store down; exceptions
 * and measurements per store: docs/keeper.md): the store
 * may be what made the lock lost, and its lease frees what the release
 * could not. A renewal the keeper has in flight when the loss is reported
 * is given up at the lease end (an answer after it could not keep the lock),
 * so dlock_release() does not wait for it either.
 */
#define DLOCK_LOST_RELEASE_MS 300u
/*
 * The loss margin. A kept lock whose renewals are not confirmed is reported
 * lost (DLOCK_EEXPIRED) a margin BEFORE its lease end, never at it, so that
 * the application (and `dlock run`, which stops its command's group) acts
 * before the store can hand the lock to someone else:
 *   margin = max(L / DLOCK_LOSS_MARGIN_DIV, DLOCK_LOSS_MARGIN_MIN_MS)
 *            + L / DLOCK_CLOCK_RATE_DIV + DLOCK_CLOCK_SLACK_MS,
 * at most L / 2, where L is the lease's length: the TTL, or ZooKeeper's
 * session timeout. The second line allows for the store's clock running up
 * to 1% faster than ours (Redlock's drift allowance). 1.5 s TTL: 167 ms;
 * 30 s: 3.302 s; 3 s ZooKeeper session: 332 ms; 100 ms TTL: 50 ms.
 * dlock_lock_expires_ns() still says the lease end; the report comes
 * margin earlier. A lock reported lost is never renewed or revived.
 */
#define DLOCK_LOSS_MARGIN_DIV 10
#define DLOCK_LOSS_MARGIN_MIN_MS 50u
#define DLOCK_CLOCK_RATE_DIV 100
#define DLOCK_CLOCK_SLACK_MS 2u
#define DLOCK_KEEP_INTERVAL_DIV 3
#define DLOCK_KEEP_RETRY_DIV 10
#define DLOCK_KEEP_CHECK_MAX_MS 500u

/* Called once per grant when the lock is known, or must be assumed, lost.
 * err is DLOCK_ELOST (the store said so: renewal refused, session expired,
 * lock file replaced) or DLOCK_EEXPIRED (the lease end passed without a
 * confirmed renewal, or a ZooKeeper connection stayed down too long: the
 * lock may be free in the store, so it must be treated as gone). */
typedef void (*dlock_lost_fn)(dlock_lock *lock, int err, void *user);

typedef struct dlock_acquire_opts {
    unsigned int version; /* DLOCK_ACQUIRE_OPTS_VERSION */
    /* Lease in milliseconds on backends with DLOCK_CAP_LEASE: a holder that
     * neither renews nor releases loses the lock after this long. Must be > 0.
     * Backends without leases ignore it (the keeper's check interval aside). */
    uint32_t ttl_ms;
    dlock_wait wait;
    /* Absolute CLOCK_MONOTONIC time in ns (see dlock_monotonic_ns()), read
     * only with DLOCK_WAIT_DEADLINE. A deadline already past means one attempt
     * that fails with DLOCK_ETIMEDOUT rather than DLOCK_EBUSY. */
    uint64_t deadline_ns;
    /* Version 2. */
    /* 1: the client's keeper renews (or checks) the lock until it is
     * released; see "Keeping leases" above. DLOCK_ENOTSUP on a backend that
     * cannot be kept. */
    int keep;
    /* Called once if a kept lock is lost (only with keep); NULL for none.
     * on_lost_user is passed to it unchanged. */
    dlock_lost_fn on_lost;
    void *on_lost_user;
    /* 1: acquiring a name this client already holds returns the same
     * handle, token and grant with its hold count raised by one, at once and
     * without asking the store; dlock_release() lowers the count and
     * releases in the store only at zero. 0 (the default): DLOCK_EALREADY. */
    int reentrant;
    /* Version 3. */
    /* A flag that cancels the wait when raised from another thread (see
     * "Cancelling a wait" above); NULL for none. */
    dlock_cancel *cancel;
    /* Version 4. Modes (see "Shared locks and semaphores" above). */
    /* DLOCK_MODE_EXCLUSIVE (the default: one holder) or DLOCK_MODE_SHARED
     * (many holders at once, excluded by an exclusive one). */
    dlock_mode mode;
    /* 0 (the default): the name is a read-write lock. 1 to DLOCK_LIMIT_MAX:
     * a counting semaphore, at most limit holders at once (exclusive mode
     * only: shared with a limit is DLOCK_EINVAL). */
    uint32_t limit;
} dlock_acquire_opts;

#define DLOCK_ACQUIRE_OPTS_INIT                                                \
    { DLOCK_ACQUIRE_OPTS_VERSION, DLOCK_TTL_DEFAULT_MS, DLOCK_WAIT_FOREVER, 0, \
      0, NULL, NULL, 0, NULL, DLOCK_MODE_EXCLUSIVE, 0 }

/* Fills *opts with the defaults of DLOCK_ACQUIRE_OPTS_INIT, as far as
 * version 3 of the struct (.cancel), the version it was written for: a
 * program built against an older dlock.h has no room for later fields.
 * Later fields: dlock_acquire_opts_init_version(). */
DLOCK_API void dlock_acquire_opts_init(dlock_acquire_opts *opts);
/* Fills the fields of version `version` of *opts (1 to
 * DLOCK_ACQUIRE_OPTS_VERSION) with their defaults and sets opts->version;
 * writes nothing past that version's last field. DLOCK_EINVAL for a NULL
 * opts or a version this library does not know. Bindings call it with the
 * version their own copy of the struct has. */
DLOCK_API int dlock_acquire_opts_init_version(dlock_acquire_opts *opts, unsigned int version);

/*
 * Acquires the lock called name (a NUL-terminated string of 1 to
 * DLOCK_NAME_MAX bytes). opts may be NULL for the defaults (wait forever,
 * DLOCK_TTL_DEFAULT_MS). On success *lockp is the held lock, owned by the
 * caller until dlock_release() or dlock_client_close().
 *
 * A client holds a given name at most once: acquiring a name it already
 * holds fails at once with DLOCK_EALREADY (locks never silently stack),
 * unless the acquire asks for .reentrant.
 *
 * Errors: DLOCK_EBUSY (try), DLOCK_ETIMEDOUT (deadline), DLOCK_EINTR (a signal
 * interrupted the wait), DLOCK_ECANCELED (.cancel was raised), DLOCK_EINVAL (bad name or options), connection and
 * store errors. Detail in dlock_errmsg(client).
 */
DLOCK_API int dlock_acquire(dlock_client *client, const char *name,
                            const dlock_acquire_opts *opts, dlock_lock **lockp);

/* As dlock_acquire(), with a counted name that must not contain NUL bytes. */
DLOCK_API int dlock_acquire_n(dlock_client *client, const char *name,
                              size_t name_len, const dlock_acquire_opts *opts,
                              dlock_lock **lockp);

/*
 * Several names at once: one lock that is all of names (count of them, 1 to
 * DLOCK_NAMES_MAX, each as for dlock_acquire(), no name twice). The names
 * are taken one by one in byte order (on a list of stores: store by store,
 * each store's names in byte order), so that clients asking for the same
 * names in any order never deadlock; all or nothing under one deadline: a
 * name that fails or times out releases those already taken before the
 * call returns. The token is above every token any of the names had on any
 * of the stores (the largest of them; the others are raised to it, so
 * count - 1 more round trips on stores that must be raised; on ZooKeeper
 * its tokens are global and nothing is raised). Release, renew, keep and
 * loss cover every name: losing one is losing the lock. A client holds a
 * name in at most one lock: DLOCK_EALREADY if it holds any of names
 * (.reentrant: only a lock of exactly these names is held again). One name
 * is the same as dlock_acquire(). On stores with leases, the names taken
 * first are renewed while a later one is awaited: a wait longer than two
 * thirds of the TTL is cut, the names held are renewed, and the wait starts
 * again behind those who came meanwhile. Each name counts towards what a
 * store allows one client (PostgreSQL: 64 locks held or awaited at once,
 * one session each).
 */
#define DLOCK_NAMES_MAX 256
DLOCK_API int dlock_acquire_names(dlock_client *client, const char *const *names,
                                  size_t count, const dlock_acquire_opts *opts,
                                  dlock_lock **lockp);

/*
 * Releases the lock and frees its handle, whatever the result. Ownership is
 * proven atomically by the store: if the lease expired or another owner took
 * the lock, nothing of theirs is touched and DLOCK_ELOST is returned.
 * A lock held more than once (.reentrant) only has its hold count lowered
 * (the handle stays valid; DLOCK_ELOST if the lock is known lost).
 * A kept lock reported lost is released within DLOCK_LOST_RELEASE_MS
 * (see "Keeping leases"). NULL is DLOCK_EINVAL.
 */
DLOCK_API int dlock_release(dlock_lock *lock);

/*
 * Resets the lease to ttl_ms from now (never adds to what is left, never
 * re-creates an expired lock). DLOCK_ELOST if the lock is no longer ours.
 * On backends without leases it only checks the lock is still held.
 */
DLOCK_API int dlock_renew(dlock_lock *lock, uint32_t ttl_ms);

/*
 * The fencing token of this grant: strictly greater than every token handed
 * out earlier for the same name on the same store. Pass it to the protected
 * resource so it can refuse a holder that was paused past its lease.
 */
DLOCK_API uint64_t dlock_lock_token(const dlock_lock *lock);

/* The mode and limit the lock was acquired with (DLOCK_MODE_EXCLUSIVE and 0
 * for a NULL lock). */
DLOCK_API dlock_mode dlock_lock_mode(const dlock_lock *lock);
DLOCK_API uint32_t dlock_lock_limit(const dlock_lock *lock);

/*
 * Makes every later grant of this lock's name by this client's store carry
 * a token greater than floor, while the lock is still held: the store's
 * counter for the name is raised to floor where it is below (never
 * lowered). The lock's own token is unchanged. This is how a token from
 * another store (the one locks are moving from) is carried over, so that
 * the tokens a protected resource sees never go back.
 * Returns 0; DLOCK_ELOST if the lock is no longer ours; DLOCK_EINVAL if
 * floor is 2^63 or more, or beyond what the store's tokens can reach (Redis:
 * 2^53 - 1); DLOCK_ENOTSUP when the store cannot raise its tokens (no
 * DLOCK_CAP_RAISE: ZooKeeper's tokens are its transaction ids) and later
 * ones may not be above floor. On a store without DLOCK_CAP_RAISE whose
 * tokens are global and only grow, a floor below this lock's own token
 * needs nothing and returns 0.
 */
DLOCK_API int dlock_lock_raise_token(dlock_lock *lock, uint64_t floor);

/*
 * Store-wide tokens, for moving locks from one store to another when not
 * every name is known (dlock migrate OLD NEW; docs/migration.md).
 *
 * dlock_client_token_top() sets *top to a value no smaller than every token
 * the client's store (each store of a list) has granted so far for any name
 * under the URI's namespace. It takes no lock; on some stores it scans
 * every name kept there.
 *
 * dlock_client_raise_floor() makes every grant the store (every store of a
 * list) starts after the call returns, for any name, carry a token above
 * floor. Never lowers anything; safe while others hold and wait; calling it
 * again is harmless. DLOCK_EINVAL for a floor of 2^63 or more, or beyond the
 * store's tokens; DLOCK_ENOTSUP when the store cannot set its tokens
 * (ZooKeeper) and its next ones would not be above floor: the detail names
 * both values. On a list, stores that can only check are checked first, so
 * a refusal raises nothing.
 */
DLOCK_API int dlock_client_token_top(dlock_client *client, uint64_t *top);
DLOCK_API int dlock_client_raise_floor(dlock_client *client, uint64_t floor);

/* The lock's name (NUL-terminated copy) and its length. Owned by the lock.
 * For a lock of several names, the first in byte order. */
DLOCK_API const char *dlock_lock_name(const dlock_lock *lock, size_t *lenp);
/* How many names the lock is (1 unless dlock_acquire_names()), and the i-th
 * of them in byte order (NULL past the end). Owned by the lock. */
DLOCK_API size_t dlock_lock_name_count(const dlock_lock *lock);
DLOCK_API const char *dlock_lock_name_at(const dlock_lock *lock, size_t i, size_t *lenp);

/* The client the lock belongs to. */
DLOCK_API dlock_client *dlock_lock_client(const dlock_lock *lock);

/*
 * The latest CLOCK_MONOTONIC instant (ns) until which the lock is
 * guaranteed to be still ours: the time the request that granted or last
 * renewed the lease was sent, plus its TTL (less the clock drift allowance
 * on Redlock). A grant handed over while waiting counts from the moment the
 * handoff reached the client. UINT64_MAX on stores without leases while no
 * loss is known (a kept ZooKeeper lock, from its first check on: the
 * earliest moment its session can end, docs/zookeeper.md); 0 once the lock
 * is known lost.
 */
DLOCK_API uint64_t dlock_lock_expires_ns(const dlock_lock *lock);

/*
 * 0 while the lock is not known to be lost; otherwise the error its loss
 * was reported with (DLOCK_ELOST or DLOCK_EEXPIRED, see dlock_lost_fn).
 * Only kept locks are watched: for the others, loss is learnt from
 * dlock_renew() and dlock_release().
 */
DLOCK_API int dlock_lock_lost(const dlock_lock *lock);

/*
 * A file descriptor that becomes readable when the kept lock is lost, for
 * event loops (poll, epoll, libuv): at once if it already is. Owned by the
 * lock and closed by dlock_release(); do not read or close it. Returns the
 * descriptor, or DLOCK_EINVAL if the lock was not acquired with .keep,
 * DLOCK_EIO if no descriptor could be made.
 */
DLOCK_API int dlock_lock_lost_fd(dlock_lock *lock);

/* Why the kept lock was lost, once dlock_lock_lost() is non-zero (the
 * store's detail, or the last renewal error before the lease ran out);
 * "" before. Owned by the lock; safe to read from the on_lost callback. */
DLOCK_API const char *dlock_lock_lost_detail(const dlock_lock *lock);

/* How many times this client holds the lock (1 unless .reentrant). */
DLOCK_API unsigned int dlock_lock_holds(const dlock_lock *lock);


/*
 * Leader election. An election is a name: its leader is the holder of the
 * exclusive lock of that name, kept by the client's keeper like any lock
 * acquired with .keep, and the leader's term is that grant's fencing
 * token, so terms strictly increase from leader to leader and a resource
 * that remembers the highest term it has seen refuses a deposed leader's
 * late writes. A leader publishes a value (its address or id, at most
 * DLOCK_VALUE_MAX bytes) that anyone may read without joining the race
 * (dlock_leader()) or be told of at each change (dlock_observe()).
 *
 * Losing leadership is losing the lock: on_lost is called, and
 * dlock_lock_lost_fd() turns readable, the loss margin before the lease
 * end (see "Keeping leases"), so a leader that cannot renew stops before
 * another can start. A plain dlock_acquire() of the same name holds it too
 * (a leader with no value). Backends without elections (no
 * DLOCK_CAP_ELECTION) refuse them with DLOCK_ENOTSUP. docs/election.md.
 */
#define DLOCK_VALUE_MAX 1024

/*
 * Campaigns for the election name: waits (as opts say: deadline, cancel,
 * try; opts may be NULL for the defaults) until this client leads, then
 * publishes value (len bytes, 0 to DLOCK_VALUE_MAX, any bytes) before
 * returning the leadership as a lock (*lockp): its token is the term. The
 * lock is always kept (opts->keep is taken as 1; on_lost as given). Other
 * fields must be their defaults (exclusive, no limit, not reentrant):
 * DLOCK_EINVAL otherwise. Errors as dlock_acquire(); a publish the store
 * refused releases the leadership and fails the call.
 */
DLOCK_API int dlock_campaign(dlock_client *client, const char *name, const void *value,
                             size_t len, const dlock_acquire_opts *opts, dlock_lock **lockp);

/* Replaces the value the leader publishes, while it still leads
 * (DLOCK_ELOST otherwise, nothing changed). Observers are told. */
DLOCK_API int dlock_proclaim(dlock_lock *lock, const void *value, size_t len);

/* Gives up leadership: releases the lock (as dlock_release(), whose result
 * it returns; the handle is freed) and tells observers, so the next
 * candidate leads at once. */
DLOCK_API int dlock_resign(dlock_lock *lock);

/* Who leads an election, as dlock_leader() reads it or an observer is told. */
#define DLOCK_LEADER_VERSION 1
typedef struct dlock_leader_info {
    unsigned int version; /* DLOCK_LEADER_VERSION, set by the library */
    unsigned int known;   /* DLOCK_KNOWS_* of dlock_info: what the store told */
    int held;             /* 1: a leader exists; 0: none */
    /* An observer that cannot read the store: the error (its detail in
     * .value), and the other fields are as last known. 0 otherwise. */
    int err;
    uint64_t term;        /* the leader's term (its grant's fencing token) */
    uint64_t lease_ms;    /* the leader's lease time left when read, ms */
    char owner[DLOCK_HOLDER_MAX]; /* as dlock_info's .owner */
    size_t value_len;     /* the published value's length (0: none) */
    char value[DLOCK_VALUE_MAX + 1]; /* the value, NUL-terminated */
    uint64_t reserved[8];
} dlock_leader_info;

/* Reads who leads the election name, without campaigning or disturbing it:
 * one read of the store (on a list of stores, of the first). A leader that
 * has not published yet (between its grant and its publish, or a plain
 * holder of the name) has an empty value. Errors as dlock_inspect(). */
DLOCK_API int dlock_leader(dlock_client *client, const char *name, dlock_leader_info *info);

/*
 * Observers: told each change of an election's leader (a new term, a new
 * value, or no leader), woken by the store (docs/election.md says how on
 * each store, and where it cannot notify, the bounded poll it does). An
 * observer has a thread and a connection of its own (the client's URI
 * opened again); it first reports the current state, then every change
 * it reads, in order. Changes that follow each other faster than one read
 * of the store may be seen as one (the latest). A leader that dies without
 * a word is reported gone when the store lets it go: at the next leader's
 * grant, at its session's end, or at the end of its lease at the latest.
 *
 * callback (may be NULL) is called from the observer's thread with each
 * change; it must return quickly and must not close the observer. Every
 * change is also queued (the last DLOCK_OBSERVE_QUEUE of them) for
 * dlock_observer_next(), and dlock_observer_fd() is readable while the
 * queue is not empty: an event loop polls it instead of taking callbacks.
 */
#define DLOCK_OBSERVE_QUEUE 64
typedef struct dlock_observer dlock_observer;
typedef void (*dlock_observe_fn)(dlock_observer *observer, const dlock_leader_info *leader,
                                 void *user);
/* Starts observing the election name. The client is only read (its URI);
 * the observer may outlive it. DLOCK_EINVAL for a bad name;
 * DLOCK_ENOTSUP without elections; errors of opening a client. */
DLOCK_API int dlock_observe(dlock_client *client, const char *name, dlock_observe_fn callback,
                            void *user, dlock_observer **observerp);
/* Readable (POLLIN) while changes are queued. Owned by the observer. */
DLOCK_API int dlock_observer_fd(dlock_observer *observer);
/* Takes the oldest queued change into *info: 0, or DLOCK_EBUSY when none
 * is queued (with wait_ms > 0: after waiting that long for one;
 * DLOCK_WAIT_FOREVER_MS: until one comes). */
#define DLOCK_WAIT_FOREVER_MS UINT32_MAX
DLOCK_API int dlock_observer_next(dlock_observer *observer, dlock_leader_info *info,
                                  uint32_t wait_ms);
/* How many times the observer read the store (its first read included):
 * what an idle observer costs the store. */
DLOCK_API uint64_t dlock_observer_reads(const dlock_observer *observer);
/* Stops the observer's thread and frees it. NULL is ignored. */
DLOCK_API void dlock_observer_close(dlock_observer *observer);

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_H */
