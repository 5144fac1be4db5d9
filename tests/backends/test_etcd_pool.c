/*
 * etcd's lease pool (docs/etcd.md, "Leases"): leases granted ahead of need,
 * so that an uncontended acquire is one transaction.
 *
 * - an acquire + release on a pooled lease moves the store's revision by
 *   two (the create, the delete: from dlock_client_token_top(); other
 *   clients' writes only add to it, so the least of a few rounds counts)
 *   and takes a pooled lease, i.e. grants none: two raft writes, where it
 *   was three (a lease grant is a raft write that moves no revision);
 * - a try that finds the lock held leaves nothing behind, and its lease
 *   serves the next acquire;
 * - a pooled lease too old for the lock's TTL is kept alive before it
 *   carries a lock: the holder's lease time left (the server's, by
 *   inspect) covers nearly the whole TTL. `control` runs this case alone
 *   with the check switched off (dlock_etcd_pool_unchecked()): the lock
 *   then lands on a lease about to end, and the case must fail (a
 *   negative control, tests/backends/meson.build);
 * - two clients taking one name in turn, waiting: a key created again
 *   under the name just deleted (the same pooled lease) is not the one a
 *   waiter watched (it would wait forever);
 * - a client that dies holding a lock on a pooled lease: its key goes with
 *   the lease, by the lock's TTL.
 *
 * Environment: DLOCK_ETCD_URI (scripts/stores/start.sh prints it).
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"

/* Test-only (backends/etcd.c). */
uint64_t dlock_etcd_pool_taken(dlock_client *c);
void dlock_etcd_pool_unchecked(dlock_client *c);

static const char *uri;
static char name[96];

static dlock_lock *take(dlock_client *c, uint32_t ttl_ms)
{
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, ttl_ms);
    dlock_lock *l = NULL;
    if (dlock_acquire(c, name, &o, &l) != 0)
        diag("acquire %s: %s", name, dlock_errmsg(c));
    return l;
}

static void test_two_writes(void)
{
    dlock_client *c = open_ok(uri);
    snprintf(name, sizeof name, "etcd-pool-%d-writes", (int)getpid());
    dlock_release(take(c, 5000)); /* the first grants; its lease is pooled */
    uint64_t taken = dlock_etcd_pool_taken(c), least = UINT64_MAX;
    for (int i = 0; i < 50 && least > 2; i++) {
        uint64_t before = 0, after = 0;
        dlock_client_token_top(c, &before);
        dlock_lock *l = take(c, 5000);
        if (!l)
            break;
        uint64_t token = dlock_lock_token(l);
        int rel = dlock_release(l);
        dlock_client_token_top(c, &after);
        if (rel != 0 || token <= before)
            break;
        if (after - before < least)
            least = after - before;
    }
    is_int((int)least, 2, "acquire + release on a pooled lease: the store's revision moves by two"
           " (the create, the delete; least of up to 50 rounds)");
    ok(dlock_etcd_pool_taken(c) > taken, "the acquires took pooled leases: no lease grant");

    /* A try that finds the lock held writes nothing and keeps its lease. */
    dlock_client *other = open_ok(uri);
    dlock_lock *held = take(other, 5000);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 5000);
    dlock_lock *l = NULL;
    taken = dlock_etcd_pool_taken(c);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EBUSY, "a try on a held lock is busy");
    dlock_info info;
    memset(&info, 0, sizeof info);
    ok(dlock_inspect(other, name, &info) == 0 && info.held && info.waiters == 0,
       "it left no key behind");
    dlock_release(held);
    l = take(c, 5000);
    ok(l && dlock_etcd_pool_taken(c) == taken + 2, "its lease served the next acquire");
    dlock_release(l);
    dlock_client_close(other);
    dlock_client_close(c);
}

/* A pooled lease kept 1.3 s ago carries a lock of 2 s only once kept
 * alive: the server's lease left (etcd tells it in whole seconds, rounded
 * down: 1 s, where 0.7 s is 0) then covers most of the 2 s. */
static void test_too_old(int control)
{
    dlock_client *c = open_ok(uri);
    if (control)
        dlock_etcd_pool_unchecked(c);
    snprintf(name, sizeof name, "etcd-pool-%d-old", (int)getpid());
    dlock_release(take(c, 2000));
    sleep_ms(1300);
    uint64_t taken = dlock_etcd_pool_taken(c), t0 = dlock_monotonic_ns();
    dlock_lock *l = take(c, 2000);
    ok(l && dlock_etcd_pool_taken(c) == taken + 1, "the old pooled lease was taken");
    dlock_info info;
    memset(&info, 0, sizeof info);
    int err = dlock_inspect(c, name, &info);
    ok(err == 0 && (info.known & DLOCK_KNOWS_LEASE) && info.lease_ms >= 1000,
       "the lock's lease was kept alive first: %" PRIu64 " ms left on the server", info.lease_ms);
    ok(l && dlock_lock_expires_ns(l) >= t0 + 1750 * 1000000ull,
       "the client's lease end is at least 7/8 of the TTL away");
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

/* Two clients take one name in turn as fast as they can, each waiting:
 * a released lock's lease serves its client's next acquire, whose key has
 * the same name as the one just deleted. A waiter that read the key before
 * its own as "still there" when it was that new key (created after its
 * own, and waiting for it) would wait for it forever: both time out. */
struct turn {
    dlock_client *c;
    int fails;
};

static void *turns(void *arg)
{
    struct turn *t = arg;
    for (int i = 0; i < 40; i++) {
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 3000, 5000);
        dlock_lock *l = NULL;
        if (dlock_acquire(t->c, name, &o, &l) != 0) {
            diag("acquire: %s", dlock_errmsg(t->c));
            t->fails++;
            continue;
        }
        if (dlock_release(l) != 0)
            t->fails++;
    }
    return NULL;
}

static void test_turns(void)
{
    snprintf(name, sizeof name, "etcd-pool-%d-turns", (int)getpid());
    struct turn t[2] = {{open_ok(uri), 0}, {open_ok(uri), 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, turns, &t[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    is_int(t[0].fails + t[1].fails, 0, "two clients x 40 turns on one name: every acquire granted");
    ok(dlock_etcd_pool_taken(t[0].c) > 0 && dlock_etcd_pool_taken(t[1].c) > 0,
       "on pooled leases");
    dlock_client_close(t[0].c);
    dlock_client_close(t[1].c);
}

/* A client killed holding a lock on a pooled lease: the lock is free by
 * its TTL (2 s; etcd's lessor looks every 0.5 s; 0.5 s of slack). */
static void test_crash(void)
{
    snprintf(name, sizeof name, "etcd-pool-%d-crash", (int)getpid());
    int fds[2];
    if (pipe(fds) != 0) {
        printf("Bail out! pipe\n");
        exit(1);
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dlock_client *c = open_ok(uri);
        dlock_release(take(c, 2000));
        uint64_t taken = dlock_etcd_pool_taken(c);
        dlock_lock *l = take(c, 2000);
        char r = l && dlock_etcd_pool_taken(c) == taken + 1 ? 'p' : 'x';
        if (write(fds[1], &r, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    close(fds[1]);
    char r = 0;
    ok(read(fds[0], &r, 1) == 1 && r == 'p', "the child holds on a pooled lease");
    uint64_t killed = dlock_monotonic_ns();
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(fds[0]);
    dlock_client *c = open_ok(uri);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 4000, 2000);
    dlock_lock *l = NULL;
    int err = dlock_acquire(c, name, &o, &l);
    uint64_t ms = (dlock_monotonic_ns() - killed) / 1000000u;
    ok(err == 0 && ms <= 3000, "granted %" PRIu64 " ms after the holder was killed (TTL 2 s)", ms);
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

int main(int argc, char **argv)
{
    uri = need_env("DLOCK_ETCD_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "control") == 0) {
        test_too_old(1);
        return done_testing();
    }
    test_two_writes();
    test_too_old(0);
    test_turns();
    test_crash();
    return done_testing();
}
