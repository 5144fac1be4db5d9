/*
 * PostgreSQL shared locks and semaphores, against a real server: what the
 * conformance suite cannot see from the library.
 *
 * - old_layout: an exclusive lock of the previous release (a plain
 *   pg_advisory_lock() on the name's key) still excludes and is excluded:
 *   a shared try is busy behind it, a semaphore is refused (DLOCK_EMODE);
 *   a shared holder and a permit holder keep it out.
 * - queued_writer: the server's queue is first-come first-served across
 *   modes: with an exclusive request of the previous release queued behind
 *   a shared holder, a shared request waits behind it (a try is busy, a
 *   deadline wait times out), and the writer gets the lock at the release.
 * - sem_notified: a semaphore's (of 2) waiter is woken by the holder's release
 *   (NOTIFY), not by its 50 ms re-look: the handoffs' median stays well
 *   under it (negative control: without the notification, about 25 ms).
 * - sem_dead_holder: a permit holder whose session is terminated frees its
 *   permit, that one only, with no NOTIFY: the waiter at the gate gets it
 *   within its re-look, the other holder keeps its own.
 * - sem_one_dead_holder: a semaphore of 1's waiter waits for the slot in
 *   the server's queue: its holder's session's end wakes it at once.
 * - sem_waiter_leaves: a waiter that gives up (deadline, cancel) leaves
 *   the gate: a later try gets the next free permit at once.
 *
 * Environment: DLOCK_POSTGRES_URI. Arguments: names of cases to run; none
 * runs all.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/pg_raw.h"

#define MS 1000000ull

int64_t dlock_pg_key(const char *ns, const char *name, size_t len);

static const char *uri;
static char prefix[64];

static int q1_is(PGconn *pg, const char *sql, const char *want)
{
    char *v = q1(pg, sql);
    int same = strcmp(v, want) == 0;
    free(v);
    return same;
}

static dlock_acquire_opts mode_opts(dlock_wait wait, uint64_t wait_ms, dlock_mode mode,
                                    uint32_t limit)
{
    dlock_acquire_opts o = wait_opts(wait, wait_ms, 10000);
    o.mode = mode;
    o.limit = limit;
    return o;
}

static void test_old_layout(void)
{
    char name[128], sql[256];
    snprintf(name, sizeof name, "%sold-layout", prefix);
    long long key = (long long)dlock_pg_key(NULL, name, strlen(name));
    PGconn *old = pg_raw_connect(uri);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%lld)", key);
    ok(q1_is(old, sql, "t"), "a client of the previous release takes the name's lock");
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_SHARED, 0);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EBUSY, "a shared try is busy behind it");
    o = mode_opts(DLOCK_WAIT_DEADLINE, 200, DLOCK_MODE_SHARED, 0);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_ETIMEDOUT, "a shared wait waits for it");
    o = mode_opts(DLOCK_WAIT_FOREVER, 0, DLOCK_MODE_EXCLUSIVE, 3);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EMODE,
           "a semaphore is refused at once: %s", dlock_errmsg(c));
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%lld)", key);
    ok(q1_is(old, sql, "t"), "the old client releases");

    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%lld)", key);
    o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_SHARED, 0);
    is_int(dlock_acquire(c, name, &o, &l), 0, "a shared holder");
    ok(q1_is(old, sql, "f"), "keeps the old client's exclusive lock out");
    is_int(dlock_release(l), 0, "released");
    o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_EXCLUSIVE, 2);
    is_int(dlock_acquire(c, name, &o, &l), 0, "a permit holder");
    ok(q1_is(old, sql, "f"), "keeps the old client's exclusive lock out");
    is_int(dlock_release(l), 0, "released");
    /* The control: with nothing held the old client gets it. */
    ok(q1_is(old, sql, "t"), "then the old client gets it");
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%lld)", key);
    free(q1(old, sql));
    dlock_client_close(c);
    PQfinish(old);
}

static void test_queued_writer(void)
{
    char name[128], sql[256];
    snprintf(name, sizeof name, "%squeued-writer", prefix);
    long long key = (long long)dlock_pg_key(NULL, name, strlen(name));
    PGconn *old = pg_raw_connect(uri);
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *la = NULL, *lb = NULL;
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_SHARED, 0);
    is_int(dlock_acquire(a, name, &o, &la), 0, "a reader holds");
    snprintf(sql, sizeof sql, "SELECT pg_advisory_lock(%lld)", key);
    ok(PQsendQuery(old, sql) == 1, "a writer of the previous release queues");
    sleep_ms(200);
    is_int(dlock_acquire(b, name, &o, &lb), DLOCK_EBUSY, "a later reader's try is busy");
    o = mode_opts(DLOCK_WAIT_DEADLINE, 300, DLOCK_MODE_SHARED, 0);
    is_int(dlock_acquire(b, name, &o, &lb), DLOCK_ETIMEDOUT,
           "a later reader's wait stays behind the writer");
    is_int(dlock_release(la), 0, "the reader releases");
    PGresult *r;
    int got = 0;
    while ((r = PQgetResult(old)) != NULL) {
        got |= PQresultStatus(r) == PGRES_TUPLES_OK;
        PQclear(r);
    }
    ok(got, "the writer gets the lock");
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%lld)", key);
    ok(q1_is(old, sql, "t"), "and releases it");
    o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_SHARED, 0);
    is_int(dlock_acquire(b, name, &o, &lb), 0, "then the reader gets it");
    dlock_release(lb);
    dlock_client_close(a);
    dlock_client_close(b);
    PQfinish(old);
}

struct waiter {
    dlock_client *c;
    const char *name;
    uint32_t limit;
    dlock_lock *l;
    int rc;
    uint64_t granted_ns;
    dlock_cancel *cancel; /* NULL: none */
};

static void *wait_main(void *p)
{
    struct waiter *w = p;
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 10000, DLOCK_MODE_EXCLUSIVE, w->limit);
    o.cancel = w->cancel;
    w->rc = dlock_acquire(w->c, w->name, &o, &w->l);
    w->granted_ns = dlock_monotonic_ns();
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void test_sem_notified(void)
{
    char name[128];
    snprintf(name, sizeof name, "%ssem-notified", prefix);
    dlock_client *h = open_ok(uri), *wc = open_ok(uri), *pc = open_ok(uri);
    uint64_t took[7];
    int all = 1;
    dlock_lock *l = NULL, *p = NULL;
    /* A semaphore of 2 (one of 1 waits in the server, as a lock), one
     * permit held throughout. */
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_EXCLUSIVE, 2);
    if (dlock_acquire(pc, name, &o, &p) != 0 || dlock_acquire(h, name, &o, &l) != 0)
        all = 0;
    for (int i = 0; i < 7 && all; i++) {
        struct waiter w = {wc, name, 2, NULL, -1, 0, NULL};
        pthread_t t;
        pthread_create(&t, NULL, wait_main, &w);
        sleep_ms(120); /* at the gate, past its first look */
        uint64_t start = dlock_monotonic_ns();
        all &= dlock_release(l) == 0;
        pthread_join(t, NULL);
        all &= w.rc == 0;
        took[i] = w.granted_ns - start;
        l = w.l;
        /* The holder is now the waiter's client: swap. */
        dlock_client *x = h;
        h = wc;
        wc = x;
    }
    ok(all, "seven handoffs of a permit of a semaphore of 2");
    if (l)
        dlock_release(l);
    if (p)
        dlock_release(p);
    qsort(took, 7, sizeof took[0], cmp_u64);
    diag("handoff: median %.2f ms, max %.2f ms", took[3] / 1e6, took[6] / 1e6);
    ok(all && took[3] < 15 * MS, "the waiter is woken by the release, not its 50 ms re-look"
                                 " (median %.2f ms)", took[3] / 1e6);
    dlock_client_close(h);
    dlock_client_close(wc);
    dlock_client_close(pc);
}

/* Starts w, terminates victim's session (its statements' tag names its
 * owner) while w waits, and returns the ms from the kill to w's grant (-1:
 * no grant). */
static double killed_while_waiting(PGconn *adm, dlock_lock *victim, struct waiter *w)
{
    char sql[512];
    pthread_t t;
    pthread_create(&t, NULL, wait_main, w);
    sleep_ms(200);
    snprintf(sql, sizeof sql,
             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE"
             " '/*dlock owner=%s %%'",
             dlock_lock_owner(victim));
    uint64_t start = dlock_monotonic_ns();
    ok(q1_is(adm, sql, "1"), "the holder's session is terminated");
    pthread_join(t, NULL);
    is_int(w->rc, 0, "the waiter gets the freed permit");
    return w->rc == 0 ? (w->granted_ns - start) / 1e6 : -1;
}

static void test_sem_dead_holder(void)
{
    char name[128];
    snprintf(name, sizeof name, "%ssem-dead", prefix);
    PGconn *adm = pg_raw_connect(uri);
    dlock_client *c1 = open_ok(uri), *c2 = open_ok(uri), *c3 = open_ok(uri);
    dlock_lock *l1 = NULL, *l2 = NULL;
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_EXCLUSIVE, 2);
    is_int(dlock_acquire(c1, name, &o, &l1), 0, "permit 1");
    is_int(dlock_acquire(c2, name, &o, &l2), 0, "permit 2");
    struct waiter w = {c3, name, 2, NULL, -1, 0, NULL};
    double ms = killed_while_waiting(adm, l1, &w);
    ok(ms >= 0 && ms < 1000, "within its re-look (%.1f ms)", ms);
    is_int(dlock_renew(l2, 10000), 0, "the other holder keeps its permit");
    is_int(dlock_renew(l1, 10000), DLOCK_ELOST, "the dead holder's handle reports the loss");
    dlock_release(l1);
    dlock_lock *l4 = NULL;
    is_int(dlock_acquire(c1, name, &o, &l4), DLOCK_EBUSY, "two permits held: a third is busy");
    dlock_release(l2);
    if (w.l)
        dlock_release(w.l);
    dlock_client_close(c1);
    dlock_client_close(c2);
    dlock_client_close(c3);
    PQfinish(adm);
}

/* A semaphore of 1's waiter waits in the server's queue for the slot: the
 * holder's session's end wakes it at once. */
static void test_sem_one_dead_holder(void)
{
    char name[128];
    snprintf(name, sizeof name, "%ssem-one-dead", prefix);
    PGconn *adm = pg_raw_connect(uri);
    dlock_client *c1 = open_ok(uri), *c2 = open_ok(uri);
    dlock_lock *l1 = NULL;
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_EXCLUSIVE, 1);
    is_int(dlock_acquire(c1, name, &o, &l1), 0, "the permit of a semaphore of 1");
    struct waiter w = {c2, name, 1, NULL, -1, 0, NULL};
    double ms = killed_while_waiting(adm, l1, &w);
    ok(ms >= 0 && ms < 500, "woken by the server (%.1f ms)", ms);
    dlock_release(l1);
    if (w.l)
        dlock_release(w.l);
    dlock_client_close(c1);
    dlock_client_close(c2);
    PQfinish(adm);
}

static void test_sem_waiter_leaves(void)
{
    char name[128];
    snprintf(name, sizeof name, "%ssem-leaves", prefix);
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *la = NULL, *lb = NULL;
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_EXCLUSIVE, 1);
    is_int(dlock_acquire(a, name, &o, &la), 0, "the permit is held");
    o = mode_opts(DLOCK_WAIT_DEADLINE, 300, DLOCK_MODE_EXCLUSIVE, 1);
    uint64_t start = dlock_monotonic_ns();
    is_int(dlock_acquire(b, name, &o, &lb), DLOCK_ETIMEDOUT, "a waiter gives up at its deadline");
    ok(dlock_monotonic_ns() - start < 600 * MS, "on time (%.1f ms)",
       (dlock_monotonic_ns() - start) / 1e6);
    dlock_cancel *cancel = NULL;
    dlock_cancel_new(&cancel);
    struct waiter w = {b, name, 1, NULL, -1, 0, cancel};
    pthread_t t;
    pthread_create(&t, NULL, wait_main, &w);
    sleep_ms(200); /* at the gate */
    start = dlock_monotonic_ns();
    dlock_cancel_fire(cancel);
    pthread_join(t, NULL);
    is_int(w.rc, DLOCK_ECANCELED, "a waiter at the gate is cancelled");
    ok(w.granted_ns - start < 300 * MS, "at once (%.1f ms)", (w.granted_ns - start) / 1e6);
    is_int(dlock_release(la), 0, "the permit is released");
    o = mode_opts(DLOCK_WAIT_TRY, 0, DLOCK_MODE_EXCLUSIVE, 1);
    is_int(dlock_acquire(b, name, &o, &lb), 0, "a try gets it at once: no one was left at the gate");
    dlock_release(lb);
    dlock_cancel_free(cancel);
    dlock_client_close(a);
    dlock_client_close(b);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"old_layout", test_old_layout},
    {"queued_writer", test_queued_writer},
    {"sem_notified", test_sem_notified},
    {"sem_dead_holder", test_sem_dead_holder},
    {"sem_one_dead_holder", test_sem_one_dead_holder},
    {"sem_waiter_leaves", test_sem_waiter_leaves},
};

int main(int argc, char **argv)
{
    uri = need_env("DLOCK_POSTGRES_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "pg-modes-%d-%llu/", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() % 1000000007ull));
    PG_RUN_CASES(cases, argc, argv);
    return done_testing();
}
