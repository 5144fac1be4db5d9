/* Helpers shared by the measurements: clock, samples, threads, errors. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_int.h"

/* Small stacks: the waiter runs start up to BENCH_MAX_THREADS threads. */
#define BENCH_STACK_SIZE (256u * 1024u)

uint64_t bench_now(void)
{
    return dlock_monotonic_ns();
}

void bench_sleep_ns(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int bench_samples_init(bench_samples *s, size_t cap)
{
    s->ns = calloc(cap ? cap : 1, sizeof *s->ns);
    s->cap = cap;
    atomic_init(&s->n, 0);
    return s->ns ? 0 : DLOCK_ENOMEM;
}

void bench_samples_free(bench_samples *s)
{
    free(s->ns);
    s->ns = NULL;
    s->cap = 0;
}

/* Returns 1 while there is room left after this sample, 0 once full.
 * n may count past cap; readers clamp it. */
int bench_samples_add(bench_samples *s, uint64_t ns)
{
    /* ns wraps when two holders overlapped (t1 before t0): the violation is
     * counted elsewhere, keep the statistics readable. */
    if (ns > UINT64_MAX / 2)
        ns = 0;
    size_t i = atomic_fetch_add(&s->n, 1);

    if (i >= s->cap)
        return 0;
    s->ns[i] = ns;
    return i + 1 < s->cap;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

static double to_us(uint64_t ns)
{
    return (double)ns / 1000.0;
}

/* Percentile p (0..100) of sorted samples: index floor(p/100 * (n-1)). */
static uint64_t percentile(const uint64_t *v, size_t n, unsigned int p)
{
    return v[(n - 1) * p / 100];
}

void bench_samples_stats(bench_samples *s, bench_stats *out)
{
    size_t n = atomic_load(&s->n);
    long double sum = 0;

    memset(out, 0, sizeof *out);
    if (n > s->cap)
        n = s->cap;
    out->n = n;
    if (n == 0)
        return;
    qsort(s->ns, n, sizeof *s->ns, cmp_u64);
    for (size_t i = 0; i < n; i++)
        sum += s->ns[i];
    out->p50 = to_us(percentile(s->ns, n, 50));
    out->p90 = to_us(percentile(s->ns, n, 90));
    out->p99 = to_us(percentile(s->ns, n, 99));
    out->max = to_us(s->ns[n - 1]);
    out->mean = (double)(sum / n) / 1000.0;
}

void bench_crit_init(bench_crit *c)
{
    atomic_init(&c->inside, 0);
    atomic_init(&c->counter, 0);
    atomic_init(&c->violations, 0);
}

/*
 * Called right after a grant. Two holders at once are seen either here (the
 * flag is already set) or later as a lost update: the counter is bumped with
 * a separate load and store, so overlapping holders lose increments, and the
 * caller compares it with the number of grants.
 */
void bench_crit_enter(bench_crit *c)
{
    uint_fast64_t v;

    if (atomic_exchange(&c->inside, 1))
        atomic_fetch_add(&c->violations, 1);
    v = atomic_load_explicit(&c->counter, memory_order_relaxed);
    atomic_store_explicit(&c->counter, v + 1, memory_order_relaxed);
}

void bench_crit_leave(bench_crit *c)
{
    atomic_store(&c->inside, 0);
}

void bench_ctx_init(bench_ctx *ctx)
{
    atomic_init(&ctx->stop, 0);
    pthread_mutex_init(&ctx->mu, NULL);
    ctx->err = 0;
    ctx->msg[0] = '\0';
}

void bench_ctx_destroy(bench_ctx *ctx)
{
    pthread_mutex_destroy(&ctx->mu);
}

int bench_stopped(bench_ctx *ctx)
{
    return atomic_load(&ctx->stop);
}

/* Keeps the first error only, and stops every thread of the measurement. */
void bench_ctx_fail(bench_ctx *ctx, int err, const dlock_client *client,
                    const char *what)
{
    pthread_mutex_lock(&ctx->mu);
    if (ctx->err == 0) {
        const char *detail = client ? dlock_errmsg(client) : "";

        ctx->err = err;
        snprintf(ctx->msg, sizeof ctx->msg, "%s: %s%s%s", what,
                 dlock_err_name(err), *detail ? ": " : "", detail);
    }
    pthread_mutex_unlock(&ctx->mu);
    atomic_store(&ctx->stop, 1);
}

/*
 * Waits for a peer thread to move *v to want or beyond. Returns 0 when it
 * did, 1 when the measurement was stopped, and fails the measurement when the
 * peer stays silent for BENCH_WAIT_NS.
 */
int bench_wait_value(bench_ctx *ctx, atomic_size_t *v, size_t want,
                     const char *what)
{
    uint64_t deadline = bench_now() + BENCH_WAIT_NS;

    for (unsigned int spins = 0;; spins++) {
        if (atomic_load(v) >= want)
            return 0;
        if (bench_stopped(ctx))
            return 1;
        if (spins < 64) {
            sched_yield();
            continue;
        }
        if (bench_now() > deadline) {
            bench_ctx_fail(ctx, DLOCK_ETIMEDOUT, NULL, what);
            return 1;
        }
        bench_sleep_ns(10000);
    }
}

/* Opens n clients; on failure records the error and closes what was opened. */
int bench_open_clients(const char *uri, dlock_client **clients, size_t n,
                       bench_ctx *ctx)
{
    for (size_t i = 0; i < n; i++) {
        int rc = dlock_client_open(uri, &clients[i]);

        if (rc != 0) {
            char what[64];

            /* Which one: a store's connection limit shows as a round count. */
            snprintf(what, sizeof what, "opening client %zu of %zu", i + 1, n);
            bench_ctx_fail(ctx, rc, clients[i], what);
            bench_close_clients(clients, i + 1);
            return rc;
        }
    }
    return 0;
}

void bench_close_clients(dlock_client **clients, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dlock_client_close(clients[i]);
        clients[i] = NULL;
    }
}

/* Starts fn on each element of args; returns how many threads started. */
size_t bench_spawn(pthread_t *tids, size_t n, void *(*fn)(void *),
                   void *args, size_t arg_size, bench_ctx *ctx)
{
    pthread_attr_t attr;
    size_t i;

    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, BENCH_STACK_SIZE);
    for (i = 0; i < n; i++) {
        int e = pthread_create(&tids[i], &attr, fn, (char *)args + i * arg_size);

        if (e != 0) {
            char what[96];

            snprintf(what, sizeof what, "starting thread %zu of %zu: %s",
                     i + 1, n, strerror(e));
            bench_ctx_fail(ctx, DLOCK_ENOMEM, NULL, what);
            break;
        }
    }
    pthread_attr_destroy(&attr);
    return i;
}

void bench_join(pthread_t *tids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pthread_join(tids[i], NULL);
}

/* A blocking acquire; with DLOCK_WAIT_DEADLINE it gives up after
 * BENCH_WAIT_NS, with DLOCK_WAIT_FOREVER only the watchdog bounds it. */
int bench_acquire(dlock_client *c, const char *name, dlock_wait wait,
                  uint32_t limit, dlock_lock **lockp)
{
    dlock_acquire_opts opts = DLOCK_ACQUIRE_OPTS_INIT;

    opts.wait = wait;
    opts.limit = limit;
    opts.deadline_ns = bench_now() + BENCH_WAIT_NS;
    return dlock_acquire(c, name, &opts, lockp);
}

static void *watchdog_main(void *arg)
{
    bench_watchdog *wd = arg;

    pthread_mutex_lock(&wd->mu);
    while (!wd->quit) {
        uint64_t now = bench_now();
        struct timespec ts;
        uint64_t until = wd->deadline_ns ? wd->deadline_ns : now + BENCH_WAIT_NS;

        if (wd->deadline_ns && now >= wd->deadline_ns) {
            fprintf(stderr, "dlock bench: %s: %s overran its time budget; "
                    "giving up\n", wd->uri, wd->what);
            fflush(NULL);
            _exit(BENCH_EXIT_ERROR);
        }
        ts.tv_sec = (time_t)(until / 1000000000u);
        ts.tv_nsec = (long)(until % 1000000000u);
        pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

int bench_watchdog_start(bench_watchdog *wd)
{
    pthread_condattr_t ca;
    int e;

    wd->quit = 0;
    wd->deadline_ns = 0;
    wd->uri = wd->what = "";
    pthread_mutex_init(&wd->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((e = pthread_create(&wd->tid, NULL, watchdog_main, wd)) != 0) {
        pthread_cond_destroy(&wd->cv);
        pthread_mutex_destroy(&wd->mu);
    }
    return e;
}

/* Arms for budget_ns from now; 0 disarms. uri and what must outlive it. */
void bench_watchdog_arm(bench_watchdog *wd, const char *uri, const char *what,
                        uint64_t budget_ns)
{
    pthread_mutex_lock(&wd->mu);
    wd->uri = uri;
    wd->what = what;
    wd->deadline_ns = budget_ns ? bench_now() + budget_ns : 0;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
}

void bench_watchdog_stop(bench_watchdog *wd)
{
    pthread_mutex_lock(&wd->mu);
    wd->quit = 1;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->tid, NULL);
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
}
