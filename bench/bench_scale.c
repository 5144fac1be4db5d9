/*
 * --scale N,...: what holding many locks costs one client. For each N, a
 * fresh client takes N distinct names (try mode, BENCH_SCALE_TTL_MS lease, no
 * keeper: a long lease instead of renewals keeps the store's work out of the
 * figures), then, with all N held, times acquire+release of one more name and
 * renewals of held ones. That is where a client that looks its held names up
 * one by one shows it: the extra acquire checks the name is not already held.
 * A fill cut by its time cap is measured with the H locks it reached.
 *
 * Memory per lock is the growth across the fill divided by N, taken twice:
 * the malloc heap in use (glibc mallinfo2: arena bytes in use plus mmapped
 * chunks, every thread's arena), which is what the library and its backend
 * allocate per lock, and the resident set (/proc/self/statm), which also
 * counts allocator slack and pages touched for the first time. The lock
 * handles' array is allocated before the baseline so that only the library's
 * own allocations are counted.
 *
 * Everything is released (oldest first, timed) and the client closed, so the
 * store is left as it was; a store that refuses the k-th lock (a connection
 * or lock limit) ends that N with its error, and the next N still runs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
#include <malloc.h>
#define BENCH_HAVE_MALLINFO2 1
#endif

#include "bench_int.h"

/* The fill checks its time cap this often (acquisitions). */
#define BENCH_SCALE_CHECK_EVERY 64u
#define BENCH_SCALE_WARMUP 10u

/* Bytes of malloc heap in use; < 0 where the C library cannot tell. */
static double heap_in_use(void)
{
#ifdef BENCH_HAVE_MALLINFO2
    struct mallinfo2 mi = mallinfo2();

    return (double)(mi.uordblks + mi.hblkhd);
#else
    return -1;
#endif
}

/* Resident set in bytes; 0 when /proc is not there. */
static double resident(void)
{
    unsigned long long size, pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (!f)
        return 0;
    if (fscanf(f, "%llu %llu", &size, &pages) != 2)
        pages = 0;
    fclose(f);
    return (double)pages * (double)sysconf(_SC_PAGESIZE);
}

/* Records the first error of this N only. */
static void scale_fail(bench_scale_result *sr, int err, const dlock_client *c,
                       const char *fmt, ...)
{
    const char *detail = c ? dlock_errmsg(c) : "";
    char what[128];
    va_list ap;

    if (sr->err)
        return;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    sr->err = err;
    snprintf(sr->msg, sizeof sr->msg, "%s: %s%s%s", what, dlock_err_name(err),
             *detail ? ": " : "", detail);
}

static int try_acquire(dlock_client *c, const char *name, dlock_lock **lockp)
{
    dlock_acquire_opts opts = DLOCK_ACQUIRE_OPTS_INIT;

    opts.wait = DLOCK_WAIT_TRY;
    opts.ttl_ms = BENCH_SCALE_TTL_MS;
    return dlock_acquire(c, name, &opts, lockp);
}

/* One acquire+release of the name that is never among the held ones. */
static int extra_pair(dlock_client *c, const char *name,
                      bench_scale_result *sr)
{
    dlock_lock *lock;
    int rc = try_acquire(c, name, &lock);

    if (rc != 0) {
        scale_fail(sr, rc, c, "acquire of one more name with %zu held",
                   sr->held);
        return rc;
    }
    if ((rc = dlock_release(lock)) != 0)
        scale_fail(sr, rc, c, "release of one more name with %zu held",
                   sr->held);
    return rc;
}

static int fill(dlock_client *c, const char *prefix, dlock_lock **locks,
                bench_scale_result *sr)
{
    char name[128];
    uint64_t start = bench_now(), cap = start + BENCH_SCALE_CAP_NS, end;
    int rc = 0;

    for (size_t i = 0; i < sr->want; i++) {
        if (i % BENCH_SCALE_CHECK_EVERY == 0 && bench_now() > cap) {
            scale_fail(sr, DLOCK_ETIMEDOUT, NULL,
                       "only %zu of %zu locks taken in %llu s", i, sr->want,
                       (unsigned long long)(BENCH_SCALE_CAP_NS / 1000000000u));
            rc = DLOCK_ETIMEDOUT;
            break;
        }
        snprintf(name, sizeof name, "%s-%zu", prefix, i);
        if ((rc = try_acquire(c, name, &locks[i])) != 0) {
            locks[i] = NULL;
            scale_fail(sr, rc, c, "acquire of lock %zu of %zu", i + 1,
                       sr->want);
            break;
        }
        sr->held = i + 1;
    }
    end = bench_now();
    if (sr->held && end > start)
        sr->fill_rate = (double)sr->held * 1e9 / (double)(end - start);
    return rc;
}

static void sample_extra(dlock_client *c, const char *name, size_t iterations,
                         bench_scale_result *sr)
{
    bench_samples s;
    uint64_t cap;

    for (size_t i = 0; i < BENCH_SCALE_WARMUP; i++)
        if (extra_pair(c, name, sr) != 0)
            return;
    if (bench_samples_init(&s, iterations) != 0) {
        scale_fail(sr, DLOCK_ENOMEM, NULL, "samples");
        return;
    }
    cap = bench_now() + BENCH_PHASE_CAP_NS;
    for (size_t i = 0; i < iterations && bench_now() < cap; i++) {
        uint64_t t = bench_now();

        if (extra_pair(c, name, sr) != 0)
            break;
        bench_samples_add(&s, bench_now() - t);
    }
    bench_samples_stats(&s, &sr->extra);
    bench_samples_free(&s);
}

/* Renews held locks spread over the whole set (a multiplicative hash of the
 * sample number), not one lock again and again. */
static void sample_renew(dlock_client *c, dlock_lock **locks,
                         size_t iterations, bench_scale_result *sr)
{
    bench_samples s;
    uint64_t cap;
    int rc;

    rc = dlock_renew(locks[0], BENCH_SCALE_TTL_MS);
    if (rc == DLOCK_ENOTSUP)
        return;
    if (rc != 0) {
        scale_fail(sr, rc, c, "renew with %zu held", sr->held);
        return;
    }
    sr->renew_supported = 1;
    if (bench_samples_init(&s, iterations) != 0) {
        scale_fail(sr, DLOCK_ENOMEM, NULL, "samples");
        return;
    }
    cap = bench_now() + BENCH_PHASE_CAP_NS;
    for (size_t i = 0; i < iterations && bench_now() < cap; i++) {
        dlock_lock *lock = locks[(size_t)((i * 2654435761u) % sr->held)];
        uint64_t t = bench_now();

        if ((rc = dlock_renew(lock, BENCH_SCALE_TTL_MS)) != 0) {
            scale_fail(sr, rc, c, "renew with %zu held", sr->held);
            break;
        }
        bench_samples_add(&s, bench_now() - t);
    }
    bench_samples_stats(&s, &sr->renew);
    bench_samples_free(&s);
}

/* Oldest first, within the cap; dlock_client_close() releases the rest. */
static void release_all(dlock_client *c, dlock_lock **locks,
                        bench_scale_result *sr)
{
    uint64_t start = bench_now(), cap = start + BENCH_SCALE_CAP_NS, end;
    size_t i;

    for (i = 0; i < sr->held; i++) {
        int rc;

        if (i % BENCH_SCALE_CHECK_EVERY == 0 && bench_now() > cap)
            break;
        if ((rc = dlock_release(locks[i])) != 0)
            scale_fail(sr, rc, c, "release of lock %zu of %zu", i + 1,
                       sr->held);
        locks[i] = NULL;
    }
    end = bench_now();
    sr->released = i;
    if (i && end > start)
        sr->release_rate = (double)i * 1e9 / (double)(end - start);
}

int bench_run_scale(const char *uri, const char *prefix, size_t want,
                    const bench_opts *o, bench_scale_result *sr)
{
    dlock_lock **locks = calloc(want, sizeof *locks);
    dlock_client *c = NULL;
    char name[128];
    double heap0, rss0;
    int rc;

    *sr = (bench_scale_result){ .want = want };
    if (!locks) {
        scale_fail(sr, DLOCK_ENOMEM, NULL, "room for %zu lock handles", want);
        return sr->err;
    }
    if ((rc = dlock_client_open(uri, &c)) != 0) {
        scale_fail(sr, rc, c, "opening a client");
        goto out;
    }
    /* The first acquire sets up what every later one reuses (connection
     * buffers, loaded scripts): not per-lock memory. */
    snprintf(name, sizeof name, "%s-extra", prefix);
    if (extra_pair(c, name, sr) != 0)
        goto out;
    heap0 = heap_in_use();
    rss0 = resident();
    rc = fill(c, prefix, locks, sr);
    if (sr->held) {
        double heap1 = heap_in_use();

        sr->heap_known = heap0 >= 0 && heap1 >= 0;
        if (sr->heap_known)
            sr->heap_per_lock = (heap1 - heap0) / (double)sr->held;
        sr->rss_per_lock = (resident() - rss0) / (double)sr->held;
    }
    /* A fill cut by the time cap still says what its H held locks cost; a
     * store that refused one would refuse the extra name too. */
    if (rc == 0 || (rc == DLOCK_ETIMEDOUT && sr->held)) {
        sample_extra(c, name, o->iterations, sr);
        sample_renew(c, locks, o->iterations, sr);
    }
    release_all(c, locks, sr);
out:
    dlock_client_close(c);
    free(locks);
    return sr->err;
}
