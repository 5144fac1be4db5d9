/* Many clients at once: throughput, and handoffs through a queue of waiters. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_int.h"

/* Bounds on one thread's loop, besides the clock. */
#define BENCH_TPUT_MAX_PER_THREAD 100000000u
/* How long a waiter-run holder keeps the lock. */
#define BENCH_WAITER_HOLD_NS 500000u

typedef struct tput_thread {
    bench_ctx *ctx;
    atomic_size_t *go;
    dlock_client *client;
    bench_crit *crit;
    dlock_wait wait;
    char name[128];
    uint64_t count, timeouts, end_ns;
} tput_thread;

static void *tput_main(void *arg)
{
    tput_thread *t = arg;

    if (bench_wait_value(t->ctx, t->go, 1, "throughput: no start signal"))
        return NULL;
    while (!bench_stopped(t->ctx) && t->count < BENCH_TPUT_MAX_PER_THREAD) {
        dlock_lock *lock;
        int rc = bench_acquire(t->client, t->name, t->wait, 0, &lock);

        if (rc == DLOCK_ETIMEDOUT) {
            t->timeouts++;
            continue;
        }
        if (rc != 0) {
            bench_ctx_fail(t->ctx, rc, t->client, "throughput acquire");
            break;
        }
        bench_crit_enter(t->crit);
        bench_crit_leave(t->crit);
        if ((rc = dlock_release(lock)) != 0) {
            bench_ctx_fail(t->ctx, rc, t->client, "throughput release");
            break;
        }
        t->count++;
    }
    t->end_ns = bench_now();
    return NULL;
}

/* Lets the threads run for the configured time, then stops them. */
static uint64_t run_for(bench_ctx *ctx, atomic_size_t *go, double seconds)
{
    uint64_t start = bench_now();
    uint64_t end = start + (uint64_t)(seconds * 1e9);

    atomic_store(go, 1);
    while (!bench_stopped(ctx) && bench_now() < end)
        bench_sleep_ns(1000000);
    atomic_store(&ctx->stop, 1);
    return start;
}

/* Adds up the threads' counts and checks each name's counter against them. */
static void tput_collect(tput_thread *th, bench_crit *crits, size_t n,
                         int own_names, uint64_t start, bench_result *r)
{
    bench_tput *out = own_names ? &r->tput_own : &r->tput_one;
    uint64_t total = 0, timeouts = 0, end = start;

    for (size_t i = 0; i < n; i++) {
        uint64_t mine = th[i].count;

        total += mine;
        timeouts += th[i].timeouts;
        if (th[i].end_ns > end)
            end = th[i].end_ns;
        if (own_names && atomic_load(&crits[i].counter) != mine)
            r->violations++;
    }
    if (!own_names && atomic_load(&crits[0].counter) != total)
        r->violations++;
    for (size_t i = 0; i < (own_names ? n : 1); i++)
        r->violations += atomic_load(&crits[i].violations);
    out->rate = end > start ? (double)total * 1e9 / (double)(end - start) : 0;
    out->acquisitions = total;
    out->timeouts = timeouts;
}

int bench_run_throughput(const char *uri, const char *prefix, int own_names,
                         const bench_opts *o, bench_result *r, bench_ctx *ctx)
{
    size_t n = o->contenders, started;
    tput_thread *th = calloc(n, sizeof *th);
    bench_crit *crits = calloc(n, sizeof *crits);
    dlock_client **clients = calloc(n, sizeof *clients);
    pthread_t *tids = calloc(n, sizeof *tids);
    atomic_size_t go;
    uint64_t start;
    int rc;

    atomic_init(&go, 0);
    if (!th || !crits || !clients || !tids) {
        bench_ctx_fail(ctx, DLOCK_ENOMEM, NULL, "throughput setup");
        rc = DLOCK_ENOMEM;
        goto out;
    }
    if ((rc = bench_open_clients(uri, clients, n, ctx)) != 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        bench_crit_init(&crits[i]);
        th[i] = (tput_thread){ .ctx = ctx, .go = &go, .client = clients[i],
                               .crit = &crits[own_names ? i : 0],
                               .wait = o->wait };
        if (own_names)
            snprintf(th[i].name, sizeof th[i].name, "%s-%zu", prefix, i);
        else
            snprintf(th[i].name, sizeof th[i].name, "%s", prefix);
    }
    started = bench_spawn(tids, n, tput_main, th, sizeof th[0], ctx);
    start = run_for(ctx, &go, o->seconds);
    bench_join(tids, started);
    bench_close_clients(clients, n);
    if (ctx->err == 0)
        tput_collect(th, crits, n, own_names, start, r);
    rc = ctx->err;
out:
    free(tids);
    free(clients);
    free(crits);
    free(th);
    return rc;
}

/*
 * W threads queue on one name. Each grant is stamped against the t0 the
 * previous holder wrote right before its release; a grant back to the thread
 * that released (the store let it barge ahead of the queue) is counted, not
 * sampled.
 */
typedef struct waitq {
    bench_ctx *ctx;
    const char *name;
    dlock_wait wait;
    size_t waiters;
    size_t max_grants;
    uint64_t cap_ns;
    atomic_size_t go, queued, grants;
    atomic_size_t last;          /* id + 1 of the previous holder, 0: none */
    atomic_uint_fast64_t t0;
    atomic_uint_fast64_t self, timeouts;
    bench_samples samples;
    bench_crit crit;
} waitq;

typedef struct waitq_thread {
    waitq *q;
    dlock_client *client;
    size_t id;
} waitq_thread;

/* Bookkeeping of one grant; returns nonzero when the run should stop. */
static int waitq_granted(waitq_thread *t, uint64_t t1)
{
    waitq *q = t->q;
    size_t prev = atomic_load(&q->last);
    int full = 0;

    if (prev == 0) {
        /* First holder: let everyone else queue up behind it. */
        if (bench_wait_value(q->ctx, &q->queued, q->waiters,
                             "waiters: threads did not queue"))
            return 1;
        bench_sleep_ns(1000000u + 20000u * q->waiters);
    } else if (prev == t->id + 1) {
        atomic_fetch_add(&q->self, 1);
    } else {
        full = !bench_samples_add(&q->samples, t1 - atomic_load(&q->t0));
    }
    return full || bench_now() > q->cap_ns;
}

/* One turn: queue, get the lock, hold it a little, hand it on. */
static int waitq_turn(waitq_thread *t)
{
    waitq *q = t->q;
    dlock_lock *lock;
    uint64_t t1;
    int rc;

    atomic_fetch_add(&q->queued, 1);
    rc = bench_acquire(t->client, q->name, q->wait, 0, &lock);
    t1 = bench_now();
    if (rc == DLOCK_ETIMEDOUT) {
        /* A store that lets some waiter starve: count it, up to the cap. */
        atomic_fetch_add(&q->timeouts, 1);
        if (bench_now() > q->cap_ns)
            atomic_store(&q->ctx->stop, 1);
        return 0;
    }
    if (rc != 0) {
        bench_ctx_fail(q->ctx, rc, t->client, "waiters acquire");
        return rc;
    }
    bench_crit_enter(&q->crit);
    if (atomic_fetch_add(&q->grants, 1) + 1 >= q->max_grants)
        atomic_store(&q->ctx->stop, 1);
    if (!bench_stopped(q->ctx)) {
        if (waitq_granted(t, t1))
            atomic_store(&q->ctx->stop, 1);
        bench_sleep_ns(BENCH_WAITER_HOLD_NS);
    }
    bench_crit_leave(&q->crit);
    atomic_store(&q->last, t->id + 1);
    atomic_store(&q->t0, bench_now());
    if ((rc = dlock_release(lock)) != 0)
        bench_ctx_fail(q->ctx, rc, t->client, "waiters release");
    return rc;
}

static void *waitq_main(void *arg)
{
    waitq_thread *t = arg;

    if (bench_wait_value(t->q->ctx, &t->q->go, 1, "waiters: no start signal"))
        return NULL;
    while (!bench_stopped(t->q->ctx) && waitq_turn(t) == 0)
        ;
    return NULL;
}

static void waitq_collect(waitq *q, bench_waiter_result *wr, bench_result *r)
{
    bench_samples_stats(&q->samples, &wr->handoff);
    wr->waiters = q->waiters;
    wr->self = atomic_load(&q->self);
    wr->timeouts = atomic_load(&q->timeouts);
    r->violations += atomic_load(&q->crit.violations);
    if (atomic_load(&q->crit.counter) != atomic_load(&q->grants))
        r->violations++;
}

int bench_run_waiters(const char *uri, const char *name, size_t waiters,
                      const bench_opts *o, bench_waiter_result *wr,
                      bench_result *r, bench_ctx *ctx)
{
    size_t handoffs = o->handoffs < BENCH_WAITER_HANDOFFS ? o->handoffs
                                                          : BENCH_WAITER_HANDOFFS;
    waitq q = { .ctx = ctx, .name = name, .wait = o->wait, .waiters = waiters,
                .max_grants = 10 * handoffs + waiters };
    waitq_thread *th = calloc(waiters, sizeof *th);
    dlock_client **clients = calloc(waiters, sizeof *clients);
    pthread_t *tids = calloc(waiters, sizeof *tids);
    size_t started;
    int rc;

    atomic_init(&q.go, 0);
    atomic_init(&q.queued, 0);
    atomic_init(&q.grants, 0);
    atomic_init(&q.last, 0);
    atomic_init(&q.t0, 0);
    atomic_init(&q.self, 0);
    atomic_init(&q.timeouts, 0);
    bench_crit_init(&q.crit);
    rc = bench_samples_init(&q.samples, handoffs);
    if (rc != 0 || !th || !clients || !tids) {
        bench_ctx_fail(ctx, DLOCK_ENOMEM, NULL, "waiters setup");
        rc = DLOCK_ENOMEM;
        goto out;
    }
    if ((rc = bench_open_clients(uri, clients, waiters, ctx)) != 0)
        goto out;
    for (size_t i = 0; i < waiters; i++)
        th[i] = (waitq_thread){ &q, clients[i], i };
    started = bench_spawn(tids, waiters, waitq_main, th, sizeof th[0], ctx);
    q.cap_ns = bench_now() + BENCH_PHASE_CAP_NS;
    atomic_store(&q.go, 1);
    bench_join(tids, started);
    bench_close_clients(clients, waiters);
    waitq_collect(&q, wr, r);
    rc = ctx->err;
out:
    bench_samples_free(&q.samples);
    free(tids);
    free(clients);
    free(th);
    return rc;
}
