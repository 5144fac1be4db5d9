/* Store round trip, uncontended latency (exclusive or shared), and the
 * two-client ping-pong (of a lock, or of a semaphore's last permit). */
#include <stdlib.h>

#include "bench_int.h"

/* The ping-pong holder waits this long after the waiter said it is about to
 * block, so that the release finds it blocked in dlock_acquire(). */
#define BENCH_PINGPONG_HOLD_NS 1000000u

static size_t warmup_count(size_t iterations)
{
    size_t w = iterations / 10;

    return w < 10 ? 10 : w > 1000 ? 1000 : w;
}

static int ping_once(dlock_client *c, bench_ctx *ctx)
{
    int rc = dlock_client_ping(c);

    if (rc != 0)
        bench_ctx_fail(ctx, rc, c, "ping");
    return rc;
}

int bench_run_ping(dlock_client *c, const bench_opts *o, bench_result *r,
                   bench_ctx *ctx)
{
    bench_samples s;
    uint64_t cap;
    int rc;

    rc = dlock_client_ping(c);
    if (rc == DLOCK_ENOTSUP)
        return 0;
    r->ping_supported = 1;
    if (rc != 0) {
        bench_ctx_fail(ctx, rc, c, "ping");
        return rc;
    }
    for (size_t i = warmup_count(o->iterations); i > 0; i--)
        if ((rc = ping_once(c, ctx)) != 0)
            return rc;
    if ((rc = bench_samples_init(&s, o->iterations)) != 0) {
        bench_ctx_fail(ctx, rc, NULL, "ping samples");
        return rc;
    }
    cap = bench_now() + BENCH_PHASE_CAP_NS;
    for (size_t i = 0; i < o->iterations && bench_now() < cap; i++) {
        uint64_t t = bench_now();

        if ((rc = ping_once(c, ctx)) != 0)
            break;
        bench_samples_add(&s, bench_now() - t);
    }
    bench_samples_stats(&s, &r->ping);
    bench_samples_free(&s);
    return rc;
}

/* One try-mode acquire and its release on a name nobody else uses. */
static int try_pair(dlock_client *c, const char *name, dlock_mode mode,
                    bench_ctx *ctx)
{
    dlock_acquire_opts opts = DLOCK_ACQUIRE_OPTS_INIT;
    dlock_lock *lock;
    int rc;

    opts.wait = DLOCK_WAIT_TRY;
    opts.mode = mode;
    if ((rc = dlock_acquire(c, name, &opts, &lock)) != 0) {
        bench_ctx_fail(ctx, rc, c, "uncontended acquire");
        return rc;
    }
    if ((rc = dlock_release(lock)) != 0)
        bench_ctx_fail(ctx, rc, c, "uncontended release");
    return rc;
}

int bench_run_uncontended(dlock_client *c, const char *name, dlock_mode mode,
                          const bench_opts *o, bench_stats *out, bench_ctx *ctx)
{
    bench_samples s;
    uint64_t cap;
    int rc = 0;

    for (size_t i = warmup_count(o->iterations); i > 0; i--)
        if ((rc = try_pair(c, name, mode, ctx)) != 0)
            return rc;
    if ((rc = bench_samples_init(&s, o->iterations)) != 0) {
        bench_ctx_fail(ctx, rc, NULL, "uncontended samples");
        return rc;
    }
    cap = bench_now() + BENCH_PHASE_CAP_NS;
    for (size_t i = 0; i < o->iterations && bench_now() < cap; i++) {
        uint64_t t = bench_now();

        if ((rc = try_pair(c, name, mode, ctx)) != 0)
            break;
        bench_samples_add(&s, bench_now() - t);
    }
    bench_samples_stats(&s, out);
    bench_samples_free(&s);
    return rc;
}

/*
 * Strict ping-pong between two threads. Round k is held by thread k % 2 and
 * ends when it hands the lock to the other one. `holding` and `announced`
 * count rounds plus one, so that 0 means "not yet".
 */
typedef struct pingpong {
    bench_ctx *ctx;
    const char *name;
    dlock_wait wait;
    uint32_t limit;  /* 0: a lock; else the semaphore's */
    int elect;       /* leadership: campaign, and a release that resigns */
    size_t rounds;
    uint64_t cap_ns;
    atomic_size_t holding;   /* k + 1: the holder of round k holds the lock */
    atomic_size_t announced; /* k + 1: its waiter is about to block */
    atomic_uint_fast64_t t0; /* stamped by the holder right before release */
    atomic_size_t grants;
    bench_samples samples;
    bench_crit crit;
} pingpong;

typedef struct pingpong_thread {
    pingpong *pp;
    dlock_client *client;
    size_t id;
} pingpong_thread;

/* Holder of round k: waits for the waiter, then hands over. */
static int pingpong_hand_over(pingpong_thread *t, size_t k, dlock_lock **lockp)
{
    pingpong *pp = t->pp;
    int rc;

    if (bench_wait_value(pp->ctx, &pp->announced, k + 1,
                         "ping-pong: the waiter thread did not show up"))
        return 1;
    bench_sleep_ns(BENCH_PINGPONG_HOLD_NS);
    bench_crit_leave(&pp->crit);
    atomic_store(&pp->t0, bench_now());
    rc = dlock_release(*lockp);
    *lockp = NULL;
    if (rc != 0)
        bench_ctx_fail(pp->ctx, rc, t->client, "ping-pong release");
    return rc;
}

/* A lock, a permit, or leadership (published value "bench"). */
static int pingpong_acquire(const pingpong *pp, dlock_client *c, dlock_lock **lockp)
{
    if (!pp->elect)
        return bench_acquire(c, pp->name, pp->wait, 0 + pp->limit, lockp);
    dlock_acquire_opts opts = DLOCK_ACQUIRE_OPTS_INIT;

    opts.wait = pp->wait;
    opts.deadline_ns = bench_now() + BENCH_WAIT_NS;
    return dlock_campaign(c, pp->name, "bench", 5, &opts, lockp);
}

/* Waiter of round k: blocks until the holder hands over, stamps the handoff. */
static int pingpong_take(pingpong_thread *t, size_t k, dlock_lock **lockp)
{
    pingpong *pp = t->pp;
    uint64_t t1;
    int rc;

    /* Acquiring before the holder of round k holds would race it for the
     * lock that the previous round just released. */
    if (bench_wait_value(pp->ctx, &pp->holding, k + 1,
                         "ping-pong: the holder thread did not take the lock"))
        return 1;
    atomic_store(&pp->announced, k + 1);
    rc = pingpong_acquire(pp, t->client, lockp);
    t1 = bench_now();
    if (rc != 0) {
        bench_ctx_fail(pp->ctx, rc, t->client, "ping-pong acquire");
        return rc;
    }
    bench_crit_enter(&pp->crit);
    atomic_fetch_add(&pp->grants, 1);
    /* A stopped holder releases without waiting for us: not a sample. */
    if (!bench_stopped(pp->ctx))
        bench_samples_add(&pp->samples, t1 - atomic_load(&pp->t0));
    atomic_store(&pp->holding, k + 2);
    return 0;
}

static void *pingpong_main(void *arg)
{
    pingpong_thread *t = arg;
    pingpong *pp = t->pp;
    dlock_lock *lock = NULL;

    if (t->id == 0) {
        int rc = pingpong_acquire(pp, t->client, &lock);

        if (rc != 0) {
            bench_ctx_fail(pp->ctx, rc, t->client, "ping-pong first acquire");
            return NULL;
        }
        bench_crit_enter(&pp->crit);
        atomic_fetch_add(&pp->grants, 1);
        atomic_store(&pp->holding, 1);
    }
    for (size_t k = 0; k < pp->rounds; k++) {
        if (bench_now() > pp->cap_ns)
            atomic_store(&pp->ctx->stop, 1);
        if (k % 2 == t->id ? pingpong_hand_over(t, k, &lock)
                           : pingpong_take(t, k, &lock))
            break;
    }
    if (lock) {
        int rc;

        bench_crit_leave(&pp->crit);
        if ((rc = dlock_release(lock)) != 0)
            bench_ctx_fail(pp->ctx, rc, t->client, "ping-pong final release");
    }
    return NULL;
}

/* The permits of a semaphore of limit but the last, taken in try mode by
 * clients of their own (one client holds a name once) and held while the
 * ping-pong runs. */
static int hold_other_permits(const char *uri, const char *name, uint32_t limit,
                              dlock_client **clients, dlock_lock **locks,
                              bench_ctx *ctx)
{
    size_t n = limit ? limit - 1 : 0;
    int rc;

    if ((rc = bench_open_clients(uri, clients, n, ctx)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        dlock_acquire_opts opts = DLOCK_ACQUIRE_OPTS_INIT;

        opts.wait = DLOCK_WAIT_TRY;
        opts.limit = limit;
        if ((rc = dlock_acquire(clients[i], name, &opts, &locks[i])) != 0) {
            bench_ctx_fail(ctx, rc, clients[i], "semaphore: holding the other permits");
            return rc;
        }
    }
    return 0;
}

int bench_run_pingpong(const char *uri, const char *name, uint32_t limit, int elect,
                       const bench_opts *o, bench_stats *out, bench_result *r,
                       bench_ctx *ctx)
{
    pingpong pp = { .ctx = ctx, .name = name, .wait = o->wait, .limit = limit,
                    .elect = elect, .rounds = o->handoffs };
    pingpong_thread th[2];
    dlock_client *clients[2] = { NULL, NULL };
    dlock_client *others[BENCH_SEM_LIMIT] = { NULL };
    dlock_lock *permits[BENCH_SEM_LIMIT] = { NULL };
    size_t n_others = limit ? limit - 1 : 0;
    pthread_t tids[2];
    size_t started;
    int rc;

    if (n_others > sizeof others / sizeof others[0]) {
        bench_ctx_fail(ctx, DLOCK_EINVAL, NULL, "semaphore: limit too large");
        return DLOCK_EINVAL;
    }

    atomic_init(&pp.holding, 0);
    atomic_init(&pp.announced, 0);
    atomic_init(&pp.t0, 0);
    atomic_init(&pp.grants, 0);
    bench_crit_init(&pp.crit);
    if ((rc = bench_samples_init(&pp.samples, o->handoffs)) != 0) {
        bench_ctx_fail(ctx, rc, NULL, "ping-pong samples");
        return rc;
    }
    if ((rc = hold_other_permits(uri, name, limit, others, permits, ctx)) != 0 ||
        (rc = bench_open_clients(uri, clients, 2, ctx)) != 0) {
        bench_close_clients(others, n_others);
        bench_samples_free(&pp.samples);
        return rc;
    }
    for (size_t i = 0; i < 2; i++)
        th[i] = (pingpong_thread){ &pp, clients[i], i };
    pp.cap_ns = bench_now() + BENCH_PHASE_CAP_NS;
    started = bench_spawn(tids, 2, pingpong_main, th, sizeof th[0], ctx);
    bench_join(tids, started);
    bench_close_clients(clients, 2);
    for (size_t i = 0; i < n_others; i++)
        if (permits[i] && (rc = dlock_release(permits[i])) != 0)
            bench_ctx_fail(ctx, rc, others[i], "semaphore: releasing the other permits");
    bench_close_clients(others, n_others);
    bench_samples_stats(&pp.samples, out);
    bench_samples_free(&pp.samples);
    r->violations += atomic_load(&pp.crit.violations);
    if (atomic_load(&pp.crit.counter) != atomic_load(&pp.grants))
        r->violations++;
    return ctx->err;
}
