/* Private to the library: the client and lock structs and core helpers. */
#ifndef DLOCK_CORE_INTERNAL_H
#define DLOCK_CORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/held.h"
#include "dlock_backend.h"

struct dlock_keeper;
struct dlock_kept;

/* The client's metrics (core/metrics.c): relaxed atomic counters. */
struct dlock_hist {
    _Atomic uint64_t count, sum_ns, bucket[DLOCK_METRICS_BUCKETS];
};
struct dlock_counters {
    _Atomic uint64_t granted, busy, timed_out, failed, errors[DLOCK_METRICS_ERRORS];
    _Atomic uint64_t releases_ok, releases_lost, renewals, renewal_failures, losses, reconnects;
    struct dlock_hist wait, hold;
};

struct dlock_test_hooks {
    int unbounded_loss;
    int observe_poll;
    int margin_set;
    int64_t margin_ns;
};

struct dlock_client {
    const dlock_backend *backend;
    dlock_conn *conn;       /* NULL when open failed */
    dlock_uri *uri;         /* NULL when the URI did not parse */
    char *uri_text;         /* the URI (or list) it was opened with */
    struct dlock_held_names held; /* for close and for EALREADY */
    struct dlock_keeper *keeper; /* NULL until the first kept lock */
    struct dlock_counters metrics;
    /* Masked in every message (the URI's passwords); owned by uri. */
    const char *secret[2];
    struct dlock_test_hooks hooks; /* read once, at open */
    int err;
    char errmsg[DLOCK_ERRMSG_MAX];
};

/* Small on purpose: a client may hold 100 000 of them (issue: costs stay
 * flat). One allocation: the struct, an entry per name, the names. */
struct dlock_lock {
    dlock_client *client;
    dlock_held *held;
    struct dlock_kept *kept; /* NULL unless acquired with keep */
    char *lost_detail;       /* copied from the keeper when it lets go */
    uint64_t granted_ns;     /* when the grant returned (hold time) */
    /* Read from any thread: see dlock.h "Thread-safety". */
    _Atomic uint64_t expires_ns;
    _Atomic int lost;
    unsigned int holds;      /* > 1 only for reentrant acquires */
    uint32_t ttl_ms;
    uint32_t names;          /* 1 unless acquired with several names */
    uint16_t limit;          /* 0: a read-write lock; else a semaphore's limit */
    uint8_t mode;            /* dlock_mode */
    uint8_t elected;         /* an election's leadership (dlock_campaign()) */
    unsigned char owner[16]; /* the grant's owner id */
    /* Its hex digits, made at the first dlock_lock_owner(): 33 bytes a
     * lock does not need otherwise. */
    _Atomic(char *) owner_hex;
    /* The client's table entries, one per name; then the names, in byte
     * order, each NUL-terminated (dlock_lock_names()). */
    struct dlock_hent ent[];
};

/* The lock's names, NUL-separated; the first is ent[0].len bytes. */
static inline char *dlock_lock_names(const struct dlock_lock *lock)
{
    return (char *)(lock->ent + lock->names);
}

/* The methods a lock goes through, on client->conn: the client's backend,
 * or the composite backend's for a several-name lock (core/composite.c). */
extern const dlock_backend dlock_composite_backend;
static inline const dlock_backend *dlock_lock_ops(const struct dlock_lock *lock)
{
    return lock->names > 1 ? &dlock_composite_backend : lock->client->backend;
}

void dlock_ns_to_timespec(uint64_t ns, struct timespec *ts);
/* Sets dlock_call_deadline() for this thread; returns what it was. */
uint64_t dlock_call_deadline_set(uint64_t deadline_ns);
/* Test hooks, read from the environment once per client at open, never
 * set outside the tests (core/time.c):
 * DLOCK_TEST_UNBOUNDED_LOSS=1: no bound after a loss (keep() and release()
 * as before it existed), so a test can show its check of the bound fails
 * without it; DLOCK_TEST_LOSS_MARGIN_MS=N: the keeper's loss margin is N
 * ms instead of its own (negative: a keeper that reports after the lease
 * end), so a test can show its check of the margin fails;
 * DLOCK_TEST_OBSERVE_POLL=1: an observer leaves the store's watch aside and
 * reads every DLOCK_OBSERVE_POLL_MS, so the idle observer's check fails. */
void dlock_test_hooks_read(struct dlock_test_hooks *h);
/* core/thread.c: a thread that takes no signal (every one blocked), joinable
 * or detached (th may be NULL then); 0 or pthread_create()'s error. A
 * condition variable whose timed waits count on CLOCK_MONOTONIC. */
int dlock_thread_start(pthread_t *th, int detached, void *(*fn)(void *), void *arg);
void dlock_cond_init_mono(pthread_cond_t *cv);
int dlock_random_bytes(void *buf, size_t len);
int dlock_owner_new(unsigned char owner[16], char hex[33]);
/* The holders of a checked name as c's backend lists them, or as its
 * inspect() tells them (core/client.c; the composite asks its first store). */
int dlock_store_holders(dlock_client *c, const char *name, size_t len, dlock_holder *holders,
                        size_t capacity, size_t *count);
/* The checks and endings every call of the users' API shares
 * (core/client.c): detail for a code a backend left without one; a client
 * whose open failed; not on a keeper thread (0, or DLOCK_EINVAL with no
 * detail); a name's length and bytes; a grant the keeper reported lost. */
int dlock_finish(dlock_client *c, int rc);
int dlock_check_usable(dlock_client *c);
int dlock_not_on_keeper(void);
int dlock_check_name(dlock_client *c, const char *name, size_t len);
int dlock_report_lost(dlock_client *c, const char *detail);
/* One read of the election name (checked) into *out (core/election.c). */
int dlock_leader_read(dlock_client *c, const char *name, size_t len, dlock_leader_info *out);

/* The eventfd of a cancel flag, -1 for NULL (core/cancel.c). */
int dlock_cancel_fd(const dlock_cancel *cancel);
#define dlock_clearerr dlock_err_clear

/* The backend ABI's version gates, in order: the version that added each
 * method (or field), so the core reads only what the backend's struct has. */
enum {
    DLOCK_ABI_keep = 2,        /* and held->lease_end_ns */
    DLOCK_ABI_lease_end_ns = 2,
    DLOCK_ABI_raise_token = 3,
    DLOCK_ABI_token_top = 4,
    DLOCK_ABI_raise_floor = 4,
    DLOCK_ABI_inspect = 5,
    DLOCK_ABI_lease_ms = 6,
    DLOCK_ABI_mode = 7, /* request->mode and ->limit, and the caps that ask for them */
    DLOCK_ABI_inspect_holders = 8,
    DLOCK_ABI_publish = 9, /* and leader, wake, watch_* */
    DLOCK_ABI_leader = 9,
    DLOCK_ABI_wake = 9,
    DLOCK_ABI_watch_open = 9,
    DLOCK_ABI_watch_fd = 9,
    DLOCK_ABI_watch_read = 9,
    DLOCK_ABI_watch_close = 9,
};
/* 1 when b was built against an ABI with m (a method or held field). */
#define dlock_abi_has(b, m) ((b)->version >= DLOCK_ABI_##m)
/* b's method m, or NULL when its version predates m or it left m out. */
#define dlock_method(b, m) (dlock_abi_has(b, m) ? (b)->m : NULL)

/* The lease end a backend reported for held, or fallback. */
/* Its locks end for their holder when a lease runs out: DLOCK_CAP_LEASE,
 * or a list of stores with a leased one (core/composite.c). */
int dlock_client_expires(const dlock_client *c);
uint64_t dlock_lease_end(const dlock_client *c, const dlock_held *held, uint64_t sent_ns,
                         uint32_t ttl_ms);

/* Error detail redirection for the keeper's threads (core/client.c). */
void dlock_err_redirect(dlock_errsave *sink);

/* The keeper (core/keeper.c). */
/* The loss margin of a lease lease_ms long (DLOCK_LOSS_MARGIN_DIV). */
uint64_t dlock_loss_margin_ns(uint32_t lease_ms);
/* confirm: renew at once (the grant's lease end is an estimate). */
int dlock_keeper_add(dlock_client *c, dlock_lock *lock, dlock_lost_fn on_lost, void *user,
                     int confirm);
/* Stops watching lock, after any keep call or callback on it has returned. */
void dlock_keeper_remove(dlock_lock *lock);
/* Around an application renew: no keep call on it between; unhold sets
 * expires_ns to end after a successful renew (any lock, kept or not). */
void dlock_keeper_hold(dlock_lock *lock);
void dlock_keeper_unhold(dlock_lock *lock, int rc, uint64_t end);
/* As dlock_keeper_unhold, for a call that did not touch the lease. */
void dlock_keeper_unhold_call(dlock_lock *lock, int rc);
/* Joins the keeper's threads and frees it (every kept lock removed first). */
void dlock_keeper_stop(dlock_client *c);
int dlock_keeper_on_thread(void);
int dlock_keeper_lost_fd(dlock_lock *lock);
const char *dlock_keeper_lost_detail(const dlock_lock *lock);

/* Metrics (core/metrics.c). */
void dlock_metrics_acquire(dlock_client *c, int rc, uint64_t took_ns);
void dlock_metrics_release(dlock_client *c, int rc, uint64_t held_ns);
void dlock_metrics_renewal(dlock_client *c, int rc);
void dlock_metrics_loss(dlock_client *c);

/* The built-in backends, registered once on first use. */
extern const dlock_backend dlock_file_backend;
extern const dlock_backend dlock_redis_backend;
extern const dlock_backend dlock_postgres_backend;
extern const dlock_backend dlock_mysql_backend;
extern const dlock_backend dlock_zookeeper_backend;
extern const dlock_backend dlock_etcd_backend;
void dlock_registry_init(void);

#endif
