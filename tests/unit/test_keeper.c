/*
 * The keeper against a fake backend whose keep() succeeds, refuses, fails
 * for a while, or blocks on demand: renewal cadence, loss reports
 * (callback, descriptor, detail, expiry), the watchdog firing while a
 * renewal is stuck, reentrant holds, and the calls the callback may not
 * make. Timing checks use generous slack: they catch a keeper that never
 * renews or never reports, not a slow machine.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h" /* dlock_loss_margin_ns() */
#include "dlock_backend.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull

enum keep_mode { KEEP_OK, KEEP_LOST, KEEP_FAIL, KEEP_BLOCK, KEEP_LATE_OK };

static struct {
    atomic_int keeps, releases, acquires, renews;
    atomic_int mode;
    atomic_int block_ms;
    atomic_int wrong_thread; /* keep() ran on the application's thread */
    atomic_int release_fails; /* release() says the store is unreachable */
    atomic_int lose_every;    /* keep() refuses grants whose token it divides */
    pthread_t main_thread;
    uint64_t lease_end; /* set on held by acquire when non-zero */
    atomic_int honour;  /* a blocked keep() ends at dlock_call_deadline() */
    /* dlock_call_deadline() as the last keep() and release() saw it. */
    _Atomic uint64_t keep_deadline, release_deadline;
} fake;

static int fake_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    (void)c, (void)uri;
    *connp = calloc(1, sizeof(dlock_conn));
    return 0;
}

static void fake_close(dlock_conn *conn)
{
    free(conn);
}

static int fake_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    static uint64_t token;
    (void)conn, (void)req;
    dlock_held *h = calloc(1, sizeof *h);
    h->token = ++token;
    h->lease_end_ns = fake.lease_end;
    fake.acquires++;
    *heldp = h;
    return 0;
}

static int fake_release(dlock_conn *conn, dlock_held *held)
{
    fake.release_deadline = dlock_call_deadline();
    fake.releases++;
    free(held);
    if (fake.release_fails)
        return dlock_seterr(conn->client, DLOCK_ECONNECT, "fake store: unreachable");
    return 0;
}

static int fake_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    (void)conn, (void)held, (void)ttl_ms;
    fake.renews++;
    return 0;
}

static int fake_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    (void)ttl_ms;
    fake.keeps++;
    fake.keep_deadline = dlock_call_deadline();
    if (pthread_equal(pthread_self(), fake.main_thread))
        fake.wrong_thread = 1;
    if (fake.lose_every && held->token % (uint64_t)fake.lose_every == 0)
        return dlock_seterr(conn->client, DLOCK_ELOST, "fake store: not the owner any more");
    switch (fake.mode) {
    case KEEP_LOST:
        return dlock_seterr(conn->client, DLOCK_ELOST, "fake store: not the owner any more");
    case KEEP_FAIL:
        return dlock_seterr(conn->client, DLOCK_ECONNECT, "fake store: unreachable");
    case KEEP_BLOCK:
        if (fake.honour) {
            uint64_t until = dlock_monotonic_ns() + (uint64_t)fake.block_ms * MS;
            if (fake.keep_deadline < until)
                until = fake.keep_deadline;
            while (dlock_monotonic_ns() < until)
                sleep_ms(1);
        } else {
            sleep_ms((unsigned)fake.block_ms);
        }
        return dlock_seterr(conn->client, DLOCK_ECONNECT, "fake store: no reply");
    case KEEP_LATE_OK: /* the store answers "renewed", after block_ms */
        sleep_ms((unsigned)fake.block_ms);
        return 0;
    }
    return 0;
}

static const char *const schemes[] = {"kfake", NULL};
static const char *const nolease_schemes[] = {"kfake-nolease", NULL};
static const char *const v1_schemes[] = {"kfake-v1", NULL};
static const char *const no_options[] = {NULL};

static dlock_backend fake_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .name = "kfake",
    .schemes = schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW,
    .options = no_options,
    .open = fake_open,
    .close = fake_close,
    .acquire = fake_acquire,
    .release = fake_release,
    .renew = fake_renew,
    .keep = fake_keep,
};

/* What the loss callback saw. */
static struct {
    atomic_int calls, err;
    atomic_uint_fast64_t at;
    atomic_int release_rc, acquire_rc, ping_rc, renew_rc;
    dlock_lock *lock;
    char detail[DLOCK_ERRMSG_MAX];
} seen;

static void on_lost(dlock_lock *lock, int err, void *user)
{
    seen.err = err;
    seen.at = dlock_monotonic_ns();
    seen.lock = lock;
    snprintf(seen.detail, sizeof seen.detail, "%s", dlock_lock_lost_detail(lock));
    if (user) { /* try what the callback must not do */
        dlock_lock *other = NULL;
        seen.release_rc = dlock_release(lock);
        seen.renew_rc = dlock_renew(lock, 100);
        seen.acquire_rc = dlock_acquire(dlock_lock_client(lock), "other", NULL, &other);
        seen.ping_rc = dlock_client_ping(dlock_lock_client(lock));
    }
    seen.calls++; /* last: the test reads the rest once it sees this */
}

static void reset(enum keep_mode mode)
{
    fake.honour = 0;
    fake.mode = mode;
    fake.keeps = 0;
    fake.block_ms = 0;
    fake.lease_end = 0;
    memset((void *)&seen, 0, sizeof seen);
}

static dlock_acquire_opts kept(uint32_t ttl_ms, void *user)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.ttl_ms = ttl_ms;
    o.keep = 1;
    o.on_lost = on_lost;
    o.on_lost_user = user;
    return o;
}

static void wait_calls(int n, unsigned max_ms)
{
    for (unsigned t = 0; t < max_ms && seen.calls < n; t += 5)
        sleep_ms(5);
}

static void test_renews(dlock_client *c)
{
    dlock_acquire_opts o = kept(300, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_FAIL); /* the first renewals fail (and record detail) */
    is_int(dlock_acquire(c, "renewed", &o, &l), 0, "kept acquire");
    uint64_t t0 = dlock_monotonic_ns();
    sleep_ms(150);
    fake.mode = KEEP_OK;
    sleep_ms(1200); /* four TTLs: a lease nobody renewed would be gone */
    ok(fake.keeps >= 4, "the keeper renewed on its own (%d renewals in 4 TTLs, ~12 expected)",
       (int)fake.keeps);
    ok(!fake.wrong_thread, "keep() never ran on the application's thread");
    is_int(seen.calls, 0, "no loss reported");
    is_int(dlock_lock_lost(l), 0, "dlock_lock_lost() is 0");
    ok(dlock_lock_expires_ns(l) > dlock_monotonic_ns(), "expires_ns is in the future");
    ok(dlock_lock_expires_ns(l) <= dlock_monotonic_ns() + 300 * MS,
       "expires_ns never past now + TTL");
    ok(dlock_lock_expires_ns(l) > t0, "expires_ns moved forward with the renewals");
    is_str(dlock_errmsg(c), "", "the keeper left the client's detail alone");
    int keeps = fake.keeps;
    is_int(dlock_release(l), 0, "release");
    sleep_ms(250);
    is_int(fake.keeps, keeps, "no renewal after release");
}

static void test_refused(dlock_client *c)
{
    dlock_acquire_opts o = kept(300, NULL);
    dlock_lock *l = NULL;
    struct pollfd pfd;
    reset(KEEP_OK);
    is_int(dlock_acquire(c, "refused", &o, &l), 0, "kept acquire");
    int fd = dlock_lock_lost_fd(l);
    ok(fd >= 0, "a loss descriptor");
    pfd = (struct pollfd){.fd = fd, .events = POLLIN};
    is_int(poll(&pfd, 1, 0), 0, "not readable while held");
    uint64_t t0 = dlock_monotonic_ns();
    fake.mode = KEEP_LOST;
    wait_calls(1, 2000);
    is_int(seen.calls, 1, "on_lost called");
    is_int(seen.err, DLOCK_ELOST, "with DLOCK_ELOST");
    ok(seen.at - t0 < 300 * MS, "at the first refused renewal (%llu ms)",
       (unsigned long long)((seen.at - t0) / MS));
    ok(strstr(seen.detail, "not the owner") != NULL, "detail is the store's: %s", seen.detail);
    ok(seen.lock == l, "callback gets the lock");
    is_int(poll(&pfd, 1, 1000), 1, "descriptor readable after the loss");
    is_int(dlock_lock_lost(l), DLOCK_ELOST, "dlock_lock_lost() reports it");
    is_int(dlock_lock_expires_ns(l), 0, "expires_ns is 0 once lost");
    is_str(dlock_errmsg(c), "", "the client's detail untouched by the keeper");
    int keeps = fake.keeps;
    sleep_ms(300);
    is_int(fake.keeps, keeps, "a lost lock is not renewed again");
    is_int(seen.calls, 1, "called once per grant");
    is_int(dlock_renew(l, 300), DLOCK_ELOST, "renew of a lock reported lost fails");
    is_int(dlock_release(l), DLOCK_ELOST, "release reports the loss");
    ok(strstr(dlock_errmsg(c), "not the owner") != NULL, "with the keeper's detail: %s",
       dlock_errmsg(c));
}

static void test_expired_while_failing(dlock_client *c)
{
    dlock_acquire_opts o = kept(400, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_FAIL);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, "failing", &o, &l), 0, "kept acquire");
    uint64_t end = dlock_lock_expires_ns(l), margin = dlock_loss_margin_ns(400);
    wait_calls(1, 3000);
    is_int(seen.calls, 1, "on_lost called when renewals keep failing");
    is_int(seen.err, DLOCK_EEXPIRED, "with DLOCK_EEXPIRED");
    uint64_t after = (seen.at - t0) / MS;
    /* The report is due the margin before the lease end (keep() is bounded
     * by it), and comes then, give or take the watchdog's wake-up. */
    ok(fake.keep_deadline + margin == end && seen.at >= fake.keep_deadline &&
           seen.at < fake.keep_deadline + 150 * MS,
       "the loss margin (56 ms) before the lease end (%llu ms after acquire, TTL 400)",
       (unsigned long long)after);
    ok(fake.keeps >= 3, "renewal was retried (%d tries)", (int)fake.keeps);
    ok(strstr(seen.detail, "unreachable") != NULL, "detail names the last failure: %s",
       seen.detail);
    fake.release_fails = 1; /* the store is still down when the application releases */
    is_int(dlock_release(l), DLOCK_ELOST, "release after the reported loss: DLOCK_ELOST, "
                                          "whatever the store answered");
    fake.release_fails = 0;
}

static void test_expired_while_blocked(dlock_client *c)
{
    dlock_acquire_opts o = kept(300, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_BLOCK);
    fake.block_ms = 1500;
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, "stuck", &o, &l), 0, "kept acquire");
    wait_calls(1, 3000);
    uint64_t after = (seen.at - t0) / MS;
    is_int(seen.err, DLOCK_EEXPIRED, "a renewal stuck past the lease end is a loss");
    ok(after < 300 + 250, "reported at the lease end, not when the stuck call returns (%llu ms)",
       (unsigned long long)after);
    uint64_t r0 = dlock_monotonic_ns();
    dlock_release(l); /* waits for the stuck keep() to return */
    ok(dlock_monotonic_ns() - r0 < 2000 * MS, "release waited for the renewal, bounded");
}

/*
 * The bounds the core sets for a call (dlock_call_deadline()): keep() gets
 * the lock's lease end; release() of a lock reported lost gets
 * DLOCK_LOST_RELEASE_MS from the call, so with a backend that honours them
 * the release neither waits for a renewal stuck on a silent store nor
 * for its own store timeout; any other release gets none. unbounded: the
 * test hook that sets none (DLOCK_TEST_UNBOUNDED_LOSS=1), the negative
 * control: the release then waits for the stuck renewal.
 */
static void lost_release_case(dlock_client *c, int unbounded)
{
    const char *how = unbounded ? "negative control, no bound after a loss: " : "";
    dlock_acquire_opts o = kept(300, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_BLOCK);
    fake.block_ms = 1500;
    fake.honour = 1;
    is_int(dlock_acquire(c, "bounded", &o, &l), 0, "%skept acquire", how);
    uint64_t end = dlock_lock_expires_ns(l);
    wait_calls(1, 3000);
    is_int(seen.err, DLOCK_EEXPIRED, "%sa renewal stuck past the lease end is a loss", how);
    if (unbounded)
        ok(fake.keep_deadline == DLOCK_POLL_FOREVER, "%skeep() had no bound", how);
    else
        ok(fake.keep_deadline == end - dlock_loss_margin_ns(300),
           "keep() ran bounded by the loss report, the margin before the lease end (%+.1f ms)",
           ((double)fake.keep_deadline - (double)end) / 1e6);
    uint64_t r0 = dlock_monotonic_ns();
    is_int(dlock_release(l), DLOCK_ELOST, "%srelease of the lost lock: DLOCK_ELOST", how);
    uint64_t r1 = dlock_monotonic_ns(), took = r1 - r0, limit = (DLOCK_LOST_RELEASE_MS + 200) * MS;
    uint64_t rd = fake.release_deadline, bound = DLOCK_LOST_RELEASE_MS * MS;
    if (unbounded) {
        ok(rd == DLOCK_POLL_FOREVER, "%srelease() had no bound", how);
        ok(took > limit, "%sthe release waited for the stuck renewal (%.0f ms, past %u ms): "
           "the check can fail", how, took / 1e6, DLOCK_LOST_RELEASE_MS + 200);
    } else {
        ok(rd >= r0 + bound && rd <= r1 + bound,
           "release() ran bounded by DLOCK_LOST_RELEASE_MS from the call (%.1f ms after it began)",
           rd > r0 ? (rd - r0) / 1e6 : -1.0);
        ok(took <= limit, "and returned within %u ms + 200 ms slack (%.0f ms)",
           DLOCK_LOST_RELEASE_MS, took / 1e6);
    }
}

static void test_lost_release_bounded(dlock_client *c)
{
    dlock_lock *l = NULL;
    is_int(dlock_acquire(c, "plain", NULL, &l), 0, "a lock not kept");
    is_int(dlock_release(l), 0, "released");
    ok(fake.release_deadline == DLOCK_POLL_FOREVER, "a release of a lock not lost has no bound");
    lost_release_case(c, 0);
    ok(dlock_call_deadline() == DLOCK_POLL_FOREVER, "no bound left on the application's thread");
}

/* A negative control: case(c, 1) on a client of its own, opened with the
 * test hook var=value (the hooks are read at open; no keeper thread runs
 * while the environment changes). */
static void with_hook(const char *var, const char *value, void (*fn)(dlock_client *, int))
{
    dlock_client *c = NULL;
    setenv(var, value, 1);
    is_int(dlock_client_open("kfake://h/", &c), 0, "open with %s=%s", var, value);
    fn(c, 1);
    dlock_client_close(c);
    unsetenv(var);
}

/*
 * The loss margin: renewals that fail without proof are reported lost the
 * margin before the lease end (dlock_loss_margin_ns(), DLOCK_LOSS_MARGIN_DIV
 * in dlock.h), never at it. late: the negative control, a client whose
 * keeper was started with the test hook DLOCK_TEST_LOSS_MARGIN_MS=-200 (a
 * keeper that reports after the lease end): the check must fire there.
 */
static void margin_case(dlock_client *c, int late)
{
    const char *how = late ? "negative control, a late keeper: " : "";
    dlock_acquire_opts o = kept(1500, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_FAIL);
    is_int(dlock_acquire(c, "margin", &o, &l), 0, "%skept acquire, TTL 1500", how);
    uint64_t end = dlock_lock_expires_ns(l), margin = dlock_loss_margin_ns(1500);
    wait_calls(1, 4000);
    is_int(seen.err, DLOCK_EEXPIRED, "%sreported DLOCK_EEXPIRED", how);
    /* When the report was due: keep() is bounded by it (and the renewals
     * go on failing until it comes). */
    uint64_t due = fake.keep_deadline;
    double before = ((double)end - (double)seen.at) / 1e6;
    int in_time = seen.calls == 1 && due + margin <= end && seen.at >= due;
    if (late) {
        ok(!in_time && due > end, "%sthe margin check fires: the report was due %.1f ms after "
           "the lease end", how, ((double)due - (double)end) / 1e6);
    } else {
        is_int((int)(margin / MS), 167, "the margin of a 1.5 s lease: 150 + 15 + 2 ms");
        ok(in_time && due + margin == end && seen.at < due + 150 * MS,
           "due the margin before the lease end, and told %.1f ms before it (the watchdog's "
           "wake-up aside)", before);
        ok(strstr(seen.detail, "before its end") != NULL, "the detail says so: %s", seen.detail);
    }
    is_int(dlock_release(l), DLOCK_ELOST, "%srelease: DLOCK_ELOST", how);
}

static void test_margin(dlock_client *c)
{
    is_int((int)(dlock_loss_margin_ns(30000) / MS), 3302, "margin of 30 s: 3000 + 300 + 2 ms");
    is_int((int)(dlock_loss_margin_ns(100) / MS), 50, "margin of 100 ms: at most half the lease");
    is_int((int)(dlock_loss_margin_ns(300) / MS), 55, "margin of 300 ms: the 50 ms floor + 5 ms");
    margin_case(c, 0);
}

/* A renewal that answers "renewed" after the loss was reported does not
 * revive the lock: it stays lost, is not renewed again, is told once. */
static void test_never_revived(dlock_client *c)
{
    dlock_acquire_opts o = kept(300, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_LATE_OK);
    fake.block_ms = 600;
    is_int(dlock_acquire(c, "late-ok", &o, &l), 0, "kept acquire, renewals answer late");
    wait_calls(1, 3000);
    is_int(seen.err, DLOCK_EEXPIRED, "reported lost while the renewal is still out");
    sleep_ms(900); /* the late "renewed" arrives, and a renewal would be due again */
    int keeps = fake.keeps;
    sleep_ms(300);
    is_int(dlock_lock_lost(l), DLOCK_EEXPIRED, "still lost after the late answer");
    ok(dlock_lock_expires_ns(l) == 0, "expires_ns stays 0");
    is_int(fake.keeps, keeps, "no renewal after the report");
    is_int(seen.calls, 1, "told once");
    is_int(dlock_release(l), DLOCK_ELOST, "release: DLOCK_ELOST");
}

static void test_backend_lease_end(dlock_client *c)
{
    dlock_acquire_opts o = kept(10000, NULL);
    dlock_lock *l = NULL;
    /* Renewals fail from the start: the keeper's confirming renewal (at
     * once, the grant's end being an estimate) must not replace the
     * backend's lease end before it is checked. */
    reset(KEEP_FAIL);
    fake.lease_end = dlock_monotonic_ns() + 2000 * MS; /* less the 1102 ms margin of a 10 s TTL */
    is_int(dlock_acquire(c, "short", &o, &l), 0, "kept acquire whose backend knows its lease end");
    ok(dlock_lock_expires_ns(l) == fake.lease_end, "expires_ns is the backend's lease end");
    wait_calls(1, 2000);
    is_int(seen.err, DLOCK_EEXPIRED, "the watchdog judged by the backend's lease end");
    dlock_release(l);
    fake.lease_end = 0;
}

static void test_callback_limits(dlock_client *c)
{
    dlock_acquire_opts o = kept(200, (void *)1);
    dlock_lock *l = NULL;
    reset(KEEP_LOST);
    is_int(dlock_acquire(c, "limits", &o, &l), 0, "kept acquire");
    wait_calls(1, 2000);
    is_int(seen.release_rc, DLOCK_EINVAL, "release from the callback refused");
    is_int(seen.renew_rc, DLOCK_EINVAL, "renew from the callback refused");
    is_int(seen.acquire_rc, DLOCK_EINVAL, "acquire from the callback refused");
    is_int(seen.ping_rc, DLOCK_EINVAL, "ping from the callback refused");
    is_str(dlock_errmsg(c), "", "the refusals left the client's detail alone");
    is_int(dlock_release(l), DLOCK_ELOST, "the application releases it afterwards");
}

static void test_app_renew(dlock_client *c)
{
    dlock_acquire_opts o = kept(300, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_OK);
    is_int(dlock_acquire(c, "app-renew", &o, &l), 0, "kept acquire");
    int renews = fake.renews;
    is_int(dlock_renew(l, 600), 0, "the application may renew a kept lock too");
    is_int(fake.renews, renews + 1, "its renew reached the backend");
    ok(dlock_lock_expires_ns(l) > dlock_monotonic_ns() + 400 * MS, "with the new TTL");
    sleep_ms(700);
    is_int(seen.calls, 0, "the keeper went on with the new TTL");
    dlock_release(l);
}

static void test_reentrant(dlock_client *c)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    dlock_lock *a = NULL, *b = NULL;
    int acq = fake.acquires, rel = fake.releases;
    o.reentrant = 1;
    is_int(dlock_acquire(c, "re", &o, &a), 0, "reentrant acquire");
    is_int(dlock_acquire(c, "re", &o, &b), 0, "again on the same client");
    ok(a == b, "same handle");
    is_int(dlock_lock_holds(a), 2, "hold count 2");
    is_int(fake.acquires, acq + 1, "the store was asked once");
    is_int(dlock_acquire(c, "re", NULL, &b), DLOCK_EALREADY,
           "a plain acquire of a held name is still DLOCK_EALREADY");
    is_int(dlock_release(a), 0, "first release");
    is_int(fake.releases, rel, "nothing released in the store yet");
    is_int(dlock_lock_holds(a), 1, "hold count 1");
    is_int(dlock_release(a), 0, "second release");
    is_int(fake.releases, rel + 1, "released in the store at zero");
}

static void test_reentrant_lost(dlock_client *c)
{
    dlock_acquire_opts o = kept(300, NULL), plain = DLOCK_ACQUIRE_OPTS_INIT;
    dlock_lock *l = NULL, *again = NULL;
    reset(KEEP_OK);
    o.reentrant = 1;
    is_int(dlock_acquire(c, "re-lost", &o, &l), 0, "kept reentrant acquire");
    fake.mode = KEEP_LOST;
    wait_calls(1, 2000);
    is_int(dlock_acquire(c, "re-lost", &o, &again), DLOCK_ELOST,
           "a reentrant acquire of a lock known lost fails");
    is_int(dlock_lock_holds(l), 1, "and does not count");
    dlock_release(l);
    plain.reentrant = 1;
    reset(KEEP_OK);
    is_int(dlock_acquire(c, "re-plain", &plain, &l), 0, "reentrant acquire without keep");
    is_int(dlock_acquire(c, "re-plain", &o, &again), DLOCK_EINVAL,
           "a reentrant acquire cannot start keeping a lock held without keep");
    dlock_release(l);
}

static void test_estimated_lease_confirmed(dlock_client *c)
{
    dlock_acquire_opts o = kept(3000, NULL);
    dlock_lock *l = NULL;
    reset(KEEP_LOST);
    /* A backend that timed the lease from a handoff's arrival: the keeper
     * confirms at once instead of a third of the TTL later. */
    fake.lease_end = dlock_monotonic_ns() + 3000 * MS;
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, "estimated", &o, &l), 0, "kept acquire with a reported lease end");
    wait_calls(1, 3000);
    is_int(seen.err, DLOCK_ELOST, "the confirming renewal found it gone");
    ok(seen.at - t0 < 500 * MS, "at once, not at TTL/3 (%llu ms)",
       (unsigned long long)((seen.at - t0) / MS));
    dlock_release(l);
    fake.lease_end = 0;
}

/* Many kept locks with different TTLs (the keeper's heaps): every one is
 * renewed, exactly the refused ones are reported, each once, and removing
 * locks in any order leaves the others kept. */
static void test_many_kept(dlock_client *c)
{
    enum { N = 1000, EVERY = 7 };
    dlock_lock **l = calloc(N, sizeof *l);
    char name[32];
    int got = 0, lost = 0, wrong = 0, expected = 0;
    reset(KEEP_OK);
    for (int i = 0; i < N; i++) {
        dlock_acquire_opts o = kept(600 + (uint32_t)(i % 5) * 100, NULL);
        snprintf(name, sizeof name, "kept-%d", i);
        got += dlock_acquire(c, name, &o, &l[i]) == 0;
    }
    is_int(got, N, "%d kept locks with five different TTLs", N);
    sleep_ms(1300); /* over two of the shortest TTLs */
    for (int i = 0; i < N; i++)
        lost += dlock_lock_lost(l[i]) != 0 || dlock_lock_expires_ns(l[i]) <= dlock_monotonic_ns();
    is_int(lost, 0, "every one is renewed in time (%d renewals)", (int)fake.keeps);
    ok(fake.keeps >= 2 * N, "each about every TTL / 3 (%d renewals in 1.3 s)", (int)fake.keeps);
    for (int i = 0; i < N; i++)
        expected += dlock_lock_token(l[i]) % EVERY == 0;
    fake.lose_every = EVERY;
    wait_calls(expected, 5000);
    is_int(seen.calls, expected, "exactly the %d refused locks are reported", expected);
    for (int i = 0; i < N; i++) {
        int should = dlock_lock_token(l[i]) % EVERY == 0;
        wrong += (dlock_lock_lost(l[i]) == DLOCK_ELOST) != should;
    }
    is_int(wrong, 0, "each lock's own state says lost or not");
    fake.lose_every = 0;
    for (int i = 0; i < N; i += 2) /* every other one, then the rest backwards */
        dlock_release(l[i]);
    int keeps = fake.keeps;
    sleep_ms(700);
    lost = 0;
    for (int i = 1; i < N; i += 2)
        lost += dlock_lock_token(l[i]) % EVERY != 0 &&
                (dlock_lock_lost(l[i]) != 0 || dlock_lock_expires_ns(l[i]) <= dlock_monotonic_ns());
    is_int(lost, 0, "the locks left are still renewed after half were released");
    ok(fake.keeps > keeps, "renewals go on (%d more)", (int)fake.keeps - keeps);
    for (int i = N - 1; i >= 1; i -= 2)
        dlock_release(l[i]);
    keeps = fake.keeps;
    sleep_ms(400);
    is_int(fake.keeps, keeps, "no renewal once all are released");
    is_int(seen.calls, expected, "and no further loss reported");
    free(l);
}

static void test_refusals(void)
{
    static dlock_backend v1, nolease;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    dlock_acquire_opts o = kept(1000, NULL);

    v1 = fake_backend;
    v1.version = 1;
    v1.schemes = v1_schemes;
    v1.keep = NULL;
    is_int(dlock_backend_register(&v1), 0, "a version 1 backend still registers");
    is_int(dlock_client_open("kfake-v1://h/", &c), 0, "open it");
    is_int(dlock_acquire(c, "x", &o, &l), DLOCK_ENOTSUP, "keep on a backend without keep()");
    ok(strstr(dlock_errmsg(c), "cannot keep") != NULL, "says so: %s", dlock_errmsg(c));
    o.keep = 0;
    is_int(dlock_acquire(c, "x", &o, &l), DLOCK_EINVAL, "on_lost without keep");
    o.on_lost = NULL;
    is_int(dlock_acquire(c, "x", &o, &l), 0, "plain acquire on the version 1 backend");
    is_int(dlock_lock_lost_fd(l), DLOCK_EINVAL, "no loss descriptor for a lock not kept");
    ok(dlock_lock_expires_ns(l) > dlock_monotonic_ns(), "expires_ns from the call and the TTL");
    dlock_release(l);
    dlock_client_close(c);

    /* Stores without leases: checked, never expired by the clock. */
    nolease = fake_backend;
    nolease.schemes = nolease_schemes;
    nolease.caps = DLOCK_CAP_RENEW;
    is_int(dlock_backend_register(&nolease), 0, "lease-less fake registers");
    is_int(dlock_client_open("kfake-nolease://h/", &c), 0, "open it");
    reset(KEEP_FAIL);
    o = kept(300, NULL);
    is_int(dlock_acquire(c, "y", &o, &l), 0, "kept acquire without a lease");
    is_int((long long)(dlock_lock_expires_ns(l) == UINT64_MAX), 1, "expires_ns is UINT64_MAX");
    sleep_ms(600);
    ok(fake.keeps >= 2, "checked (%d times)", (int)fake.keeps);
    is_int(seen.calls, 0, "failed checks without a lease are not a loss");
    fake.mode = KEEP_LOST;
    wait_calls(1, 2000);
    is_int(seen.err, DLOCK_ELOST, "a check that proves the loss is");
    dlock_release(l);
    dlock_client_close(c);
}

static void test_close_stops(void)
{
    dlock_client *c = NULL;
    dlock_lock *l1 = NULL, *l2 = NULL;
    dlock_acquire_opts o = kept(200, NULL);
    reset(KEEP_OK);
    is_int(dlock_client_open("kfake://h/", &c), 0, "open");
    is_int(dlock_acquire(c, "c1", &o, &l1), 0, "kept lock 1");
    is_int(dlock_acquire(c, "c2", &o, &l2), 0, "kept lock 2 on the same keeper");
    int rel = fake.releases;
    sleep_ms(300);
    dlock_client_close(c);
    is_int(fake.releases - rel, 2, "close released both");
    int keeps = fake.keeps;
    sleep_ms(300);
    is_int(fake.keeps, keeps, "no renewal after close");
}

int main(void)
{
    dlock_client *c = NULL;
    fake.main_thread = pthread_self();
    is_int(dlock_backend_register(&fake_backend), 0, "register the fake");
    is_int(dlock_client_open("kfake://h/", &c), 0, "open");
    test_renews(c);
    test_refused(c);
    test_expired_while_failing(c);
    test_expired_while_blocked(c);
    test_lost_release_bounded(c);
    test_backend_lease_end(c);
    test_margin(c);
    test_never_revived(c);
    test_callback_limits(c);
    test_app_renew(c);
    test_reentrant(c);
    test_reentrant_lost(c);
    test_estimated_lease_confirmed(c);
    test_many_kept(c);
    dlock_client_close(c);
    with_hook("DLOCK_TEST_UNBOUNDED_LOSS", "1", lost_release_case);
    with_hook("DLOCK_TEST_LOSS_MARGIN_MS", "-200", margin_case);
    test_refusals();
    test_close_stops();
    return done_testing();
}
