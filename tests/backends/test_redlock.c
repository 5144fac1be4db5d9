/*
 * Redlock-only cases (issue 10): leases too short to ever be granted, the
 * message when a quorum is lost, every node killed and restarted while one
 * client holds and another waits (tokens, loss, recovery), fence counters
 * lost, a wait whose nodes all go silent (deadlines are deadlines), and
 * cancelled waits (issue 16: in the pauses while too few nodes answer, and
 * racing a release). The older Redlock cases live in test_redis.c.
 *
 * Environment: DLOCK_REDLOCK_URI (scripts/stores/start.sh prints it). The
 * restart cases run redis-server processes of their own on free ports.
 */
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock_backend.h"
#include "tests/proxy.h"
#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/redis_test.h"

#define MS 1000000ull
#define N 5

static char prefix[64];


static void srv_uri(const struct srv *s, char *uri, size_t len, const char *params)
{
    size_t o = (size_t)snprintf(uri, len, "redis://");
    for (int i = 0; i < N; i++)
        o += (size_t)snprintf(uri + o, len - o, "%s127.0.0.1:%d", i ? "," : "", s[i].port);
    snprintf(uri + o, len - o, "/0%s%s", params ? "?" : "", params ? params : "");
}

/* ---- leases too short (item 7) ------------------------------------------- */

/*
 * A lease of 1 or 2 ms can never be granted (validity = ttl - elapsed -
 * ttl/100 - 2 <= 0): refused with DLOCK_EINVAL, also when waiting forever.
 * Before, such a wait never ended (the child is killed after 5 s).
 */
static void test_tiny_ttl(const char *uri)
{
    char name[128];
    snprintf(name, sizeof name, "%stiny", prefix);
    for (uint32_t ttl = 1; ttl <= 2; ttl++) {
        int p[2];
        char msg[256] = "";
        if (pipe(p) != 0)
            exit(1);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            dlock_client *c = open_ok(uri);
            dlock_lock *l = NULL;
            dlock_acquire_opts o = wait_opts(DLOCK_WAIT_FOREVER, 0, ttl);
            int rc = dlock_acquire(c, name, &o, &l);
            if (write(p[1], dlock_errmsg(c), strlen(dlock_errmsg(c)) + 1) < 0)
                _exit(99);
            _exit(-rc);
        }
        close(p[1]);
        int st = -1;
        uint64_t t0 = dlock_monotonic_ns();
        for (int i = 0; i < 500 && waitpid(pid, &st, WNOHANG) == 0; i++, st = -1)
            sleep_ms(10);
        if (st == -1) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        if (read(p[0], msg, sizeof msg - 1) < 0)
            msg[0] = '\0';
        close(p[0]);
        is_int(st != -1 && WIFEXITED(st) ? -WEXITSTATUS(st) : 0, DLOCK_EINVAL,
               "a %u ms lease waiting forever → EINVAL after %.0f ms%s", ttl, since_ms(t0),
               st == -1 ? " (hung: killed after 5 s)" : "");
        ok(strstr(msg, "at least 3 ms") != NULL, "stating the minimum: %s", msg);
    }
    /* renew to a lease that short: refused without touching the lock */
    dlock_client *c = open_ok(uri), *other = open_ok(uri);
    dlock_lock *l = NULL, *l2 = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 5000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "a 5 s lease is granted");
    is_int(l ? dlock_renew(l, 2) : -1, DLOCK_EINVAL, "renew to 2 ms → EINVAL");
    is_int(dlock_acquire(other, name, &o, &l2), DLOCK_EBUSY, "and the lock is still held");
    is_int(l ? dlock_release(l) : -1, 0, "and still released normally");
    dlock_client_close(other);
    dlock_client_close(c);
}

/* ---- a lost quorum (item 7) ----------------------------------------------- */

/* Three of five nodes killed after open: the error names the lost quorum
 * with the true count of nodes that answered. Before: "only 0 of 5 Redlock
 * nodes answered (quorum 3)" while 2 answered. */
static void test_quorum_lost(void)
{
    struct srv s[N];
    char uri[256], name[128];
    for (int i = 0; i < N; i++)
        srv_start(&s[i], 0, NULL);
    srv_uri(s, uri, sizeof uri, NULL);
    snprintf(name, sizeof name, "%squorum-lost", prefix);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 5000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "quorum: granted with 5 of 5 up");
    if (l)
        dlock_release(l);
    for (int i = 2; i < N; i++)
        srv_kill(&s[i]);
    for (int round = 0; round < 2; round++) {
        uint64_t t0 = dlock_monotonic_ns();
        int rc = dlock_acquire(c, name, &o, &l);
        double el = since_ms(t0);
        is_int(rc, DLOCK_ECONNECT, "quorum: 3 of 5 down, attempt %d → ECONNECT in %.0f ms",
               round + 1, el);
        ok(strstr(dlock_errmsg(c), "2 of 5") && strstr(dlock_errmsg(c), "3 needed for a quorum"),
           "quorum: the message names the lost quorum: %s", dlock_errmsg(c));
    }
    dlock_client_close(c);
    for (int i = 0; i < 2; i++)
        srv_kill(&s[i]);
}

/* ---- every node restarted (items 2 and 3) --------------------------------- */


struct report {
    int rc;
    uint64_t token, granted_ns;
    char msg[200];
};

/*
 * All five nodes SIGKILLed and started again, empty, while one client holds
 * a kept lock and another waits: the waiter is granted without reopening,
 * with a token above every token before (each node's counter starts again
 * from its clock); the holder's keeper reports DLOCK_ELOST and its release
 * says so. Before: token 1 after 4.
 */
static void test_restart_all(void)
{
    struct srv s[N];
    char uri[256], name[128];
    int p[2];
    struct lost_seen seen = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
    for (int i = 0; i < N; i++)
        srv_start(&s[i], 0, NULL);
    /* A waiter goes on trying for connect_timeout without a quorum. */
    srv_uri(s, uri, sizeof uri, "connect_timeout=4000");
    snprintf(name, sizeof name, "%srestart-all", prefix);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    uint64_t before = 0;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 5000);
    for (int i = 0; i < 3; i++)
        if (dlock_acquire(c, name, &o, &l) == 0)
            before = dlock_lock_token(l), dlock_release(l);
    o = wait_opts(DLOCK_WAIT_TRY, 0, 1500);
    o.keep = 1;
    o.on_lost = on_lost_cb;
    o.on_lost_user = &seen;
    is_int(dlock_acquire(c, name, &o, &l), 0, "restart all: a client holds (kept, 1.5 s lease)");
    if (l)
        before = dlock_lock_token(l);
    if (pipe(p) != 0)
        exit(1);
    fflush(stdout);
    pid_t w = fork();
    if (w == 0) {
        struct report rep = {0};
        dlock_client *wc = open_ok(uri);
        dlock_lock *wl = NULL;
        dlock_acquire_opts wo = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 30000);
        rep.rc = dlock_acquire(wc, name, &wo, &wl);
        rep.granted_ns = dlock_monotonic_ns();
        rep.token = wl ? dlock_lock_token(wl) : 0;
        snprintf(rep.msg, sizeof rep.msg, "%s", dlock_errmsg(wc));
        if (write(p[1], &rep, sizeof rep) != sizeof rep)
            _exit(3);
        if (wl)
            dlock_release(wl);
        dlock_client_close(wc);
        _exit(0);
    }
    sleep_ms(500);
    for (int i = 0; i < N; i++)
        srv_kill(&s[i]);
    sleep_ms(300);
    for (int i = 0; i < N; i++)
        srv_start(&s[i], s[i].port, NULL);
    uint64_t back = dlock_monotonic_ns();
    struct report r = {1, 0, 0, ""};
    struct pollfd pfd = {.fd = p[0], .events = POLLIN};
    if (poll(&pfd, 1, 10000) <= 0 || read(p[0], &r, sizeof r) != sizeof r)
        r.rc = 1;
    is_int(r.rc, 0, "restart all: the waiter is granted without reopening (%s)", r.msg);
    double ms = r.granted_ns > back ? (r.granted_ns - back) / 1e6 : 0;
    ok(r.rc == 0 && ms < 3000, "restart all: %.0f ms after the nodes were back (bound 3 s: a node "
       "that failed to connect is tried again after 1 s)", ms);
    ok(r.token > before, "restart all: its token is higher than every token before (%llu > %llu)",
       (unsigned long long)r.token, (unsigned long long)before);
    uint64_t t0 = dlock_monotonic_ns();
    while (l && !dlock_lock_lost(l) && dlock_monotonic_ns() - t0 < 3000 * MS)
        sleep_ms(10);
    int lost = l ? dlock_lock_lost(l) : 0;
    ok(lost == DLOCK_ELOST || lost == DLOCK_EEXPIRED,
       "restart all: the holder's keeper reports the loss (%s: %s)", dlock_err_name(lost),
       l ? dlock_lock_lost_detail(l) : "");
    pthread_mutex_lock(&seen.mu);
    is_int(seen.calls, 1, "restart all: on_lost called once");
    pthread_mutex_unlock(&seen.mu);
    if (l)
        is_int(dlock_release(l), DLOCK_ELOST, "restart all: the holder's release says ELOST");
    waitpid(w, NULL, 0);
    close(p[0]);
    close(p[1]);
    dlock_client_close(c);
    for (int i = 0; i < N; i++)
        srv_kill(&s[i]);
}

/* The fence counter deleted on every node (as a restart without
 * persistence loses it): the next token is still higher. */
static void test_counter_lost(const char *uri)
{
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    char name[128], fence[192];
    uint64_t last = 0;
    snprintf(name, sizeof name, "%scounter-lost", prefix);
    snprintf(fence, sizeof fence, "dlock:%s:fence", name);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 5000);
    for (int i = 0; i < 3; i++)
        if (dlock_acquire(c, name, &o, &l) == 0)
            last = dlock_lock_token(l), dlock_release(l);
    for (size_t i = 0; i < N; i++) {
        redisContext *ctx = raw(uri, i);
        freeReplyObject(redisCommand(ctx, "DEL %s", fence));
        redisFree(ctx);
    }
    is_int(dlock_acquire(c, name, &o, &l), 0, "counters deleted on all nodes: acquire");
    ok(l && dlock_lock_token(l) > last, "the token is still higher (%llu > %llu)",
       (unsigned long long)(l ? dlock_lock_token(l) : 0), (unsigned long long)last);
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

/* ---- raise_token (issue 11) ------------------------------------------------ */

static uint64_t raw_counter(redisContext *ctx, const char *fence)
{
    redisReply *r = redisCommand(ctx, "GET %s", fence);
    uint64_t v = r && r->type == REDIS_REPLY_STRING ? strtoull(r->str, NULL, 10) : 0;
    if (r)
        freeReplyObject(r);
    return v;
}

#define FOREIGN "ffffffffffffffffffffffffffffffff:1"

/*
 * dlock_lock_raise_token over five nodes: the floor reaches every node that
 * still holds our key, and a later quorum of other nodes goes above it;
 * another owner on 2 of 5 nodes still leaves a quorum of 3 (raised); on 3 of
 * 5 it is DLOCK_ELOST with those nodes' counters untouched; an expired
 * lease is DLOCK_ELOST; the limit is DLOCK_EINVAL before any node is asked.
 */
static void test_raise(const char *uri)
{
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    redisContext *node[N];
    char name[128], fence[192], key[192];
    uint64_t before[N];
    snprintf(name, sizeof name, "%sraise", prefix);
    snprintf(fence, sizeof fence, "dlock:%s:fence", name);
    snprintf(key, sizeof key, "dlock:%s:lock", name);
    for (int i = 0; i < N; i++)
        node[i] = raw(uri, (size_t)i);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 10000);

    ok(dlock_client_caps(c) & DLOCK_CAP_RAISE, "raise: DLOCK_CAP_RAISE is set");
    is_int(dlock_acquire(c, name, &o, &l), 0, "raise: acquire");
    uint64_t t0 = l ? dlock_lock_token(l) : 0, floor = t0 + 1000000;
    is_int(l ? dlock_lock_raise_token(l, floor) : -1, 0, "raise: to token + 1e6 → 0");
    int all = 1;
    for (int i = 0; i < N; i++)
        all &= raw_counter(node[i], fence) >= floor;
    ok(all, "raise: every node's counter is at least the floor");
    if (l)
        dlock_release(l);
    is_int(dlock_acquire(c, name, &o, &l), 0, "raise: acquire again");
    ok(l && dlock_lock_token(l) > floor, "raise: the next token is above the floor (%llu > %llu)",
       (unsigned long long)(l ? dlock_lock_token(l) : 0), (unsigned long long)floor);

    /* Another owner on nodes 0-1: the 3 others confirm, a quorum. */
    uint64_t high = (l ? dlock_lock_token(l) : 0) + 1000000000000ull;
    for (int i = 0; i < 2; i++)
        freeReplyObject(redisCommand(node[i], "SET %s %s PX 20000", key, FOREIGN));
    is_int(l ? dlock_lock_raise_token(l, high) : -1, 0,
           "raise: held elsewhere on 2 of 5 nodes → 0 (quorum of 3)");
    ok(raw_counter(node[0], fence) < high && raw_counter(node[1], fence) < high,
       "raise: the 2 nodes not ours were not raised");
    ok(raw_counter(node[2], fence) >= high && raw_counter(node[4], fence) >= high,
       "raise: the 3 that are ours were");
    if (l)
        dlock_release(l);
    /* A later quorum of nodes 0, 1 and 2 (3 and 4 held elsewhere): it
     * shares node 2 with the raised quorum. */
    for (int i = 0; i < N; i++)
        freeReplyObject(redisCommand(node[i], i >= 3 ? "SET %s %s PX 20000" : "DEL %s", key,
                                     FOREIGN));
    is_int(dlock_acquire(c, name, &o, &l), 0, "raise: acquire on nodes 0-2");
    ok(l && dlock_lock_token(l) > high, "raise: its token is above the floor (%llu > %llu)",
       (unsigned long long)(l ? dlock_lock_token(l) : 0), (unsigned long long)high);
    for (int i = 3; i < N; i++)
        freeReplyObject(redisCommand(node[i], "DEL %s", key));

    /* Another owner on nodes 0-2: no quorum can be ours. */
    for (int i = 0; i < 3; i++)
        freeReplyObject(redisCommand(node[i], "SET %s %s PX 20000", key, FOREIGN));
    for (int i = 0; i < N; i++)
        before[i] = raw_counter(node[i], fence);
    is_int(l ? dlock_lock_raise_token(l, high + 1000000000000ull) : -1, DLOCK_ELOST,
           "raise: held elsewhere on 3 of 5 → DLOCK_ELOST");
    ok(strstr(dlock_errmsg(c), "no longer ours on 5 of 5") != NULL, "raise: detail: %s",
       dlock_errmsg(c));
    int same = 1;
    for (int i = 0; i < 3; i++)
        same &= raw_counter(node[i], fence) == before[i];
    ok(same, "raise: their counters unchanged");
    if (l)
        dlock_release(l);
    for (int i = 0; i < N; i++)
        freeReplyObject(redisCommand(node[i], "DEL %s", key));

    /* Expired on every node. */
    o = wait_opts(DLOCK_WAIT_TRY, 0, 200);
    is_int(dlock_acquire(c, name, &o, &l), 0, "raise: acquire with a 200 ms lease");
    sleep_ms(400);
    for (int i = 0; i < N; i++)
        before[i] = raw_counter(node[i], fence);
    is_int(l ? dlock_lock_raise_token(l, before[0] + 1000000000000ull) : -1, DLOCK_ELOST,
           "raise: after expiry → DLOCK_ELOST");
    same = 1;
    for (int i = 0; i < N; i++)
        same &= raw_counter(node[i], fence) == before[i];
    ok(same, "raise: no counter changed");
    if (l)
        dlock_release(l);

    /* The limit, refused before any node is asked. */
    o = wait_opts(DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "raise: acquire (limit)");
    is_int(l ? dlock_lock_raise_token(l, (1ull << 53) - 1) : -1, DLOCK_EINVAL,
           "raise: floor 2^53 - 1 → DLOCK_EINVAL");
    ok(strstr(dlock_errmsg(c), "2^53") != NULL, "raise: naming the limit: %s", dlock_errmsg(c));
    if (l)
        dlock_release(l);

    for (int i = 0; i < N; i++) {
        freeReplyObject(redisCommand(node[i], "DEL %s %s", fence, key));
        redisFree(node[i]);
    }
    dlock_client_close(c);
}

/* Nodes down while the lock is held: 2 of 5 still raise on a quorum; with
 * 3 down nothing proves the loss: a connection error, within the bound. */
static void test_raise_nodes_down(void)
{
    struct srv s[N];
    char uri[256], name[128];
    for (int i = 0; i < N; i++)
        srv_start(&s[i], 0, NULL);
    srv_uri(s, uri, sizeof uri, NULL);
    snprintf(name, sizeof name, "%sraise-down", prefix);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "raise-down: granted with 5 of 5 up");
    uint64_t t = l ? dlock_lock_token(l) : 0;
    srv_kill(&s[3]);
    srv_kill(&s[4]);
    is_int(l ? dlock_lock_raise_token(l, t + 1000) : -1, 0, "raise-down: 2 of 5 down → 0");
    srv_kill(&s[2]);
    uint64_t t0 = dlock_monotonic_ns();
    int rc = l ? dlock_lock_raise_token(l, t + 2000) : -1;
    double el = since_ms(t0);
    is_int(rc, DLOCK_ECONNECT, "raise-down: 3 of 5 down → DLOCK_ECONNECT (not a proven loss)");
    ok(el < 1000, "raise-down: within the bound: %.0f ms", el);
    ok(strstr(dlock_errmsg(c), "2 of 5") != NULL, "raise-down: detail: %s", dlock_errmsg(c));
    if (l)
        dlock_release(l);
    dlock_client_close(c);
    for (int i = 0; i < 2; i++)
        srv_kill(&s[i]);
}

/* ---- store-wide floor and top (issue 11) ----------------------------------- */

/*
 * raise_floor over five nodes, under a prefix of their own: the floor key
 * on every node; a later grant whose quorum has only one node with the
 * floor (2 nodes lost it, 2 others held elsewhere) still goes above it,
 * since its token is the largest of its quorum's; the top is the largest
 * over the nodes. Nodes down (servers of our own): 2 of 5 still answer a
 * quorum, 3 of 5 is DLOCK_ECONNECT, within the bound.
 */
static void test_store_floor(const char *uri)
{
    const uint64_t F = 7000000000000000ull, Z = 8000000000000000ull;
    char u[512], pfx[128], floorkey[192], key[256], lockkey[256];
    redisContext *node[N];
    uint64_t top = 0;
    snprintf(pfx, sizeof pfx, "%sfloor/", prefix);
    snprintf(u, sizeof u, "%s?prefix=%s", uri, pfx);
    snprintf(floorkey, sizeof floorkey, "%sfloor", pfx);
    for (int i = 0; i < N; i++)
        node[i] = raw(uri, (size_t)i);
    dlock_client *c = open_ok(u);

    is_int(dlock_client_raise_floor(c, F), 0, "floor: raise to 7e15: %s", dlock_errmsg(c));
    int all = 1;
    for (int i = 0; i < N; i++)
        all &= raw_counter(node[i], floorkey) == F;
    ok(all, "floor: %s is 7e15 on every node", floorkey);
    is_int((long long)grant_token(c, "a"), (long long)(F + 1), "floor: a new name gets floor + 1");

    /* Nodes 0-1 lost the floor, 3-4 are held elsewhere: the quorum is
     * 0, 1, 2, and node 2 still has it. */
    snprintf(lockkey, sizeof lockkey, "%sb:lock", pfx);
    for (int i = 0; i < N; i++)
        freeReplyObject(i < 2 ? redisCommand(node[i], "DEL %s", floorkey)
                              : i >= 3 ? redisCommand(node[i], "SET %s %s PX 20000", lockkey,
                                                      FOREIGN)
                                       : redisCommand(node[i], "PING"));
    uint64_t t = grant_token(c, "b");
    ok(t > F, "floor: a quorum with one node that has the floor grants above it (%llu)",
       (unsigned long long)t);
    for (int i = 3; i < N; i++)
        freeReplyObject(redisCommand(node[i], "DEL %s", lockkey));

    is_int(dlock_client_token_top(c, &top), 0, "floor: top: %s", dlock_errmsg(c));
    ok(top >= t && top >= F, "floor: top bounds the grants and the floor (%llu)",
       (unsigned long long)top);
    snprintf(key, sizeof key, "%sz:fence", pfx);
    freeReplyObject(redisCommand(node[4], "SET %s %llu", key, (unsigned long long)Z));
    is_int(dlock_client_token_top(c, &top), 0, "floor: top with a high counter on node 4");
    is_int((long long)top, (long long)Z, "floor: top is the largest over the nodes");
    is_int(dlock_client_raise_floor(c, (1ull << 53) - 1), DLOCK_EINVAL,
           "floor: 2^53 - 1 → DLOCK_EINVAL");
    ok(strstr(dlock_errmsg(c), "2^53") != NULL, "floor: naming the limit: %s", dlock_errmsg(c));
    dlock_client_close(c);
    for (int i = 0; i < N; i++) {
        freeReplyObject(redisCommand(node[i], "DEL %s %s %sa:fence %sb:fence", floorkey, key,
                                     pfx, pfx));
        redisFree(node[i]);
    }

    /* Nodes down. */
    struct srv s[N];
    char su[256];
    for (int i = 0; i < N; i++)
        srv_start(&s[i], 0, NULL);
    srv_uri(s, su, sizeof su, NULL);
    c = open_ok(su);
    srv_kill(&s[3]);
    srv_kill(&s[4]);
    is_int(dlock_client_raise_floor(c, F), 0, "floor-down: 2 of 5 down, raised: %s",
           dlock_errmsg(c));
    is_int(dlock_client_token_top(c, &top), 0, "floor-down: 2 of 5 down, top: %s", dlock_errmsg(c));
    ok(top >= F, "floor-down: top bounds the floor (%llu)", (unsigned long long)top);
    srv_kill(&s[2]);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_client_raise_floor(c, F + 1), DLOCK_ECONNECT,
           "floor-down: 3 of 5 down → DLOCK_ECONNECT");
    ok(strstr(dlock_errmsg(c), "2 of 5") != NULL, "floor-down: detail: %s", dlock_errmsg(c));
    is_int(dlock_client_token_top(c, &top), DLOCK_ECONNECT,
           "floor-down: top with 3 of 5 down → DLOCK_ECONNECT");
    ok(strstr(dlock_errmsg(c), "2 of 5") != NULL, "floor-down: detail: %s", dlock_errmsg(c));
    ok(since_ms(t0) < 2000, "floor-down: both within the bound: %.0f ms", since_ms(t0));
    dlock_client_close(c);
    for (int i = 0; i < 2; i++)
        srv_kill(&s[i]);
}

/* ---- deadlines are deadlines (item 5) ------------------------------------- */

struct bg {
    dlock_client *c;
    const char *name;
    int rc;
    uint64_t done_ns;
};

static void *bg_wait(void *arg)
{
    struct bg *b = arg;
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 3000, 30000);
    b->rc = dlock_acquire(b->c, b->name, &o, &l);
    b->done_ns = dlock_monotonic_ns();
    if (l)
        dlock_release(l);
    return NULL;
}

/* All nodes go silent while a client waits 3 s. Before: 5.1 s (the release
 * on every node after the deadline waited connect_timeout). Now the last
 * round and its undo end within 200 ms of the deadline (asserted with 400). */
static void test_silent_nodes(const char *uri)
{
    struct proxy px;
    char puri[1024], name[128];
    pthread_t th;
    proxy_for_uri(&px, uri);
    proxy_uri(&px, uri, NULL, puri, sizeof puri);
    snprintf(name, sizeof name, "%ssilent", prefix);
    dlock_client *h = open_ok(uri), *w = open_ok(puri);
    dlock_lock *hl = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 30000);
    is_int(dlock_acquire(h, name, &o, &hl), 0, "silent: another client holds the lock");
    struct bg b = {w, name, 0, 0};
    uint64_t t0 = dlock_monotonic_ns();
    pthread_create(&th, NULL, bg_wait, &b);
    sleep_ms(500);
    proxy_set(&px, PROXY_BLACKHOLE);
    pthread_join(th, NULL);
    double el = (b.done_ns - t0) / 1e6;
    ok(b.rc == DLOCK_ETIMEDOUT || b.rc == DLOCK_ECONNECT, "silent: the wait fails with %s (%s)",
       dlock_err_name(b.rc), dlock_errmsg(w));
    ok(el < 3400, "silent: after %.0f ms for a 3000 ms deadline (bound 3200)", el);
    proxy_set(&px, PROXY_DOWN);
    proxy_stop(&px);
    dlock_release(hl);
    dlock_client_close(w);
    dlock_client_close(h);
}

/* ---- inspect (issue 12) -------------------------------------------------- */

static int inspect_ok(dlock_client *c, const char *name, dlock_info *i)
{
    int rc = dlock_inspect(c, name, i);
    if (rc)
        diag("inspect %s: %s", name, dlock_errmsg(c));
    return rc == 0;
}

static void raw_cmd(redisContext *ctx, const char *fmt, const char *a, const char *b)
{
    redisReply *r = redisCommand(ctx, fmt, a, b);
    if (r)
        freeReplyObject(r);
}

struct bg_in {
    dlock_client *c;
    const char *name;
    int rc;
};

static void *bg_in_wait(void *arg)
{
    struct bg_in *b = arg;
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 1500, 30000);
    b->rc = dlock_acquire(b->c, b->name, &o, &l);
    if (l)
        dlock_release(l);
    return NULL;
}

/*
 * inspect on Redlock reports what a quorum agrees on. The nodes' counters
 * are set out of step first, so each node keeps a token of its own in its
 * lock key and the grant writes the largest back: the token reported is
 * the grant's, also once the node that drew it has lost the key. Held on
 * 5, 4 and 3 of 5 nodes; free on 2 of 5, and with two owners on 2 nodes
 * each; a waiter counted (the release channel's subscribers), then not
 * once it gave up; never listed (no FIFO); no last token while free.
 */
static void test_inspect(const char *uri)
{
    dlock_client *h = open_ok(uri), *d = open_ok(uri), *wc = open_ok(uri);
    redisContext *ctx[N];
    dlock_lock *l = NULL;
    dlock_info i;
    int in;
    char name[128], key[192], fence[192], v[64];
    pthread_t th;
    const unsigned held_all = DLOCK_KNOWS_HELD | DLOCK_KNOWS_OWNER | DLOCK_KNOWS_TOKEN |
                              DLOCK_KNOWS_LEASE | DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_LAST_TOKEN;
    snprintf(name, sizeof name, "%sinspect", prefix);
    snprintf(key, sizeof key, "dlock:%s:lock", name);
    snprintf(fence, sizeof fence, "dlock:%s:fence", name);
    for (int k = 0; k < N; k++)
        ctx[k] = raw(uri, (size_t)k);
    in = inspect_ok(d, name, &i);
    ok(in && !i.held && i.waiters == 0 &&
           i.known == (DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS),
       "inspect: never taken: free, no waiters, no last token (known 0x%x)", i.known);
    /* Node k's counter: 5e15 + 1000 k (above any clock, below 2^53). */
    for (int k = 0; k < N; k++) {
        snprintf(v, sizeof v, "%llu", 5000000000000000ull + 1000ull * (unsigned)k);
        raw_cmd(ctx[k], "SET %s %s", fence, v);
    }
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(h, name, &o, &l), 0, "inspect: granted on out-of-step counters");
    uint64_t token = l ? dlock_lock_token(l) : 0;
    /* The largest among the quorum that answered first: any 3 of the 5. */
    ok(token >= 5000000000000000ull + 1000ull * (N / 2) + 1 &&
           token <= 5000000000000000ull + 1000ull * (N - 1) + 1 && token % 1000 == 1,
       "inspect: the token, the largest of the quorum's (%llu)", (unsigned long long)token);
    in = inspect_ok(d, name, &i);
    ok(in && i.held && i.known == held_all,
       "inspect: held, every field but the order known (0x%x)", i.known);
    ok(l && strcmp(i.owner, dlock_lock_owner(l)) == 0, "inspect: the holder's owner id %s",
       i.owner);
    ok(i.token == token && i.last_token == token, "inspect: the grant's token %llu",
       (unsigned long long)i.token);
    ok(i.lease_ms > 8500 && i.lease_ms <= 10000, "inspect: lease left %llu ms of 10000",
       (unsigned long long)i.lease_ms);
    ok(i.waiters == 0 && i.listed == 0, "inspect: no waiters");

    struct bg_in b = {wc, name, 0};
    pthread_create(&th, NULL, bg_in_wait, &b);
    int seen = 0;
    for (int k = 0; k < 100 && !seen; k++) {
        sleep_ms(10);
        seen = inspect_ok(d, name, &i) && (i.known & DLOCK_KNOWS_WAITERS) && i.waiters == 1;
    }
    ok(seen, "inspect: a waiter counted on every node (%llu)", (unsigned long long)i.waiters);
    ok(!(i.known & DLOCK_KNOWS_ORDER) && i.listed == 0, "inspect: and not listed (no FIFO)");
    pthread_join(th, NULL);
    is_int(b.rc, DLOCK_ETIMEDOUT, "inspect: the waiter gives up");
    in = inspect_ok(d, name, &i);
    ok(in && i.waiters == 0, "inspect: then it is not counted (%llu)",
       (unsigned long long)i.waiters);

    /* The key gone on the node that drew the token, then on one more. */
    for (int k = N - 1; k >= 3; k--) {
        raw_cmd(ctx[k], "DEL %s", key, NULL);
        in = inspect_ok(d, name, &i);
        ok(in && i.held && i.token == token && l &&
               strcmp(i.owner, dlock_lock_owner(l)) == 0,
           "inspect: held on %d of %d nodes, the grant's token still (%llu)", k, N,
           (unsigned long long)i.token);
    }
    raw_cmd(ctx[2], "DEL %s", key, NULL);
    in = inspect_ok(d, name, &i);
    ok(in && !i.held && i.known == (DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS),
       "inspect: held on 2 of 5 only: free, nothing else known (0x%x)", i.known);
    for (int k = 2; k < 4; k++)
        raw_cmd(ctx[k], "SET %s %s PX 10000", key,
                "0123456789abcdef0123456789abcdef:5000000000009999");
    in = inspect_ok(d, name, &i);
    ok(in && !i.held, "inspect: two owners on 2 nodes each: free");
    raw_cmd(ctx[4], "SET %s %s PX 10000", key, "0123456789abcdef0123456789abcdef:5000000000009999");
    in = inspect_ok(d, name, &i);
    ok(in && i.held && i.token == 5000000000009999ull &&
           strcmp(i.owner, "0123456789abcdef0123456789abcdef") == 0,
       "inspect: the other owner on 3 of 5: held by it (%s)", i.owner);
    if (l)
        dlock_release(l); /* no longer ours on a quorum: DLOCK_ELOST */
    for (int k = 0; k < N; k++) {
        raw_cmd(ctx[k], "DEL %s %s", key, fence);
        redisFree(ctx[k]);
    }
    dlock_client_close(wc);
    dlock_client_close(d);
    dlock_client_close(h);
}

/*
 * Nodes down: with 3 of 5 answering and all holding, held; with one of them
 * free, the owner's 2 nodes and the 2 silent ones could make a quorum:
 * DLOCK_ECONNECT, saying it cannot tell; fewer than a quorum answering:
 * DLOCK_ECONNECT naming the count. Never a guess.
 */
static void test_inspect_nodes_down(void)
{
    struct srv s[N];
    char uri[256], name[128], key[192];
    dlock_info i;
    int in;
    for (int k = 0; k < N; k++)
        srv_start(&s[k], 0, NULL);
    /* A node's reply may be slow on a loaded machine: it must not count
     * as silent here. */
    srv_uri(s, uri, sizeof uri, "node_timeout=2000");
    snprintf(name, sizeof name, "%sinspect-down", prefix);
    snprintf(key, sizeof key, "dlock:%s:lock", name);
    dlock_client *c = open_ok(uri), *d = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 30000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "inspect down: granted on 5 of 5");
    srv_kill(&s[3]);
    srv_kill(&s[4]);
    in = inspect_ok(d, name, &i);
    /* The token: the grant's, or unknown when the 2 silent nodes' counters
     * could change the merge (never another value). */
    ok(in && i.held && l && (!(i.known & DLOCK_KNOWS_TOKEN) || i.token == dlock_lock_token(l)),
       "inspect down: 2 of 5 down, 3 hold it: held, token %llu (%s)", (unsigned long long)i.token,
       in ? "answered" : dlock_errmsg(d));
    char one[256];
    snprintf(one, sizeof one, "redis://127.0.0.1:%d/0", s[0].port);
    redisContext *ctx = raw(one, 0);
    raw_cmd(ctx, "DEL %s", key, NULL);
    redisFree(ctx);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_inspect(d, name, &i), DLOCK_ECONNECT, "inspect down: held on 2, 1 free, 2 silent: "
                                                       "cannot tell → ECONNECT");
    ok(strstr(dlock_errmsg(d), "cannot tell") != NULL, "inspect down: saying so: %s",
       dlock_errmsg(d));
    ok(i.known == 0 && !i.held, "inspect down: nothing reported");
    ok(since_ms(t0) < 1000, "inspect down: in %.0f ms", since_ms(t0));
    srv_kill(&s[2]);
    is_int(dlock_inspect(d, name, &i), DLOCK_ECONNECT, "inspect down: 2 of 5 answering → ECONNECT");
    ok(strstr(dlock_errmsg(d), "only 2 of 5") != NULL, "inspect down: %s", dlock_errmsg(d));
    if (l)
        dlock_release(l);
    dlock_client_close(d);
    dlock_client_close(c);
    for (int k = 0; k < 2; k++)
        srv_kill(&s[k]);
}

/* ---- cancelled waits (issue 16) ------------------------------------------- */

/*
 * Three of five nodes killed while a client waits behind a holder: too few
 * answer, and the waiter tries again every 100 ms for up to connect_timeout
 * (3 s here). A cancel during those pauses ends the wait at once with
 * DLOCK_ECANCELED (bound 1 s). With pauses that do not watch the cancel
 * descriptor, the wait went on to DLOCK_ECONNECT 2.6 s after the cancel.
 */
static void test_cancel_no_quorum(void)
{
    struct srv s[N];
    char uri[256], name[128];
    struct cwait w;
    for (int i = 0; i < N; i++)
        srv_start(&s[i], 0, NULL);
    srv_uri(s, uri, sizeof uri, "connect_timeout=3000");
    snprintf(name, sizeof name, "%scancel-no-quorum", prefix);
    dlock_client *h = open_ok(uri), *c = open_ok(uri);
    dlock_lock *hl = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 30000);
    is_int(dlock_acquire(h, name, &o, &hl), 0, "cancel no quorum: a holder");
    cwait_start(&w, c, name, 8000);
    sleep_ms(300); /* waiting for a release */
    for (int i = 0; i < 3; i++)
        srv_kill(&s[i]);
    cwait_cancel_ends(&w, "cancel no quorum", "3 of 5 nodes were killed", 1000,
                      "connect_timeout is 3 s");
    dlock_client_close(c);
    dlock_client_close(h);
    for (int i = 3; i < N; i++)
        srv_kill(&s[i]);
}

/* A cancel racing the holder's release, 50 rounds (see cancel_race()). */
static void test_cancel_race(const char *uri)
{
    char name[128];
    struct race_seen r;
    snprintf(name, sizeof name, "%scancel-race", prefix);
    uint64_t t0 = dlock_monotonic_ns();
    cancel_race(uri, name, 50, &r);
    is_int(r.bad, 0, "cancel race: 50 rounds, each a grant released or ECANCELED with the lock "
           "free%s%s", r.bad ? ": " : "", r.first_bad);
    diag("cancel race: %d granted, %d cancelled, in %.0f ms", r.granted, r.cancelled,
         since_ms(t0));
}

int main(void)
{
    const char *uri = need_env("DLOCK_REDLOCK_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "redlock-test-%d-%llu/", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() % 1000000007ull));
    test_tiny_ttl(uri);
    test_quorum_lost();
    test_counter_lost(uri);
    test_restart_all();
    test_silent_nodes(uri);
    test_raise(uri);
    test_raise_nodes_down();
    test_store_floor(uri);
    test_inspect(uri);
    test_inspect_nodes_down();
    test_cancel_no_quorum();
    test_cancel_race(uri);
    return done_testing();
}
