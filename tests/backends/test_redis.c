/*
 * Redis-only cases, against real servers: the script cache lost, a killed
 * waiter in the queue, a server that never answers, authentication, and
 * Redlock's partial grants, validity, expiry and unreachable nodes.
 *
 * Environment (scripts/stores/start.sh prints it):
 *   DLOCK_REDIS_URI, DLOCK_REDLOCK_URI, DLOCK_REDIS_AUTH_URI
 * A missing variable fails the run: these cases never skip silently.
 */
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock_backend.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull

static char prefix[64];




/* Direct connection to host i of uri, for looking behind the library. */
static redisContext *raw(const char *uri, size_t i)
{
    dlock_uri *u = NULL;
    char err[256];
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0)
        exit(1);
    redisContext *ctx = redisConnect(dlock_uri_host(u, i), (int)dlock_uri_port(u, i));
    if (dlock_uri_password(u)) {
        redisReply *r = redisCommand(ctx, "AUTH %s", dlock_uri_password(u));
        freeReplyObject(r);
    }
    dlock_uri_free(u);
    return ctx;
}

static long long raw_int(redisContext *ctx, const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(ctx, fmt, arg);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return v;
}


static void test_noscript(const char *uri)
{
    dlock_client *c = open_ok(uri);
    redisContext *ctx = raw(uri, 0);
    dlock_lock *l = NULL;
    char name[128];
    snprintf(name, sizeof name, "%snoscript", prefix);
    is_int(dlock_acquire(c, name, NULL, &l), 0, "acquire");
    freeReplyObject(redisCommand(ctx, "SCRIPT FLUSH"));
    is_int(dlock_release(l), 0, "release after SCRIPT FLUSH falls back to EVAL");
    is_int(dlock_acquire(c, name, NULL, &l), 0, "and acquire works again");
    dlock_release(l);
    redisFree(ctx);
    dlock_client_close(c);
}

/* A waiter killed while queued must not hold up the ones behind it. */
static void test_dead_waiter(const char *uri)
{
    char name[128];
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    volatile uint64_t *released = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    snprintf(name, sizeof name, "%sdead-waiter", prefix);
    is_int(dlock_acquire(c, name, NULL, &l), 0, "holder acquires (30 s lease)");
    pid_t doomed = fork();
    if (doomed == 0) {
        dlock_client *w = open_ok(uri);
        dlock_lock *wl = NULL;
        dlock_acquire(w, name, NULL, &wl); /* queues; killed before it is served */
        _exit(0);
    }
    sleep_ms(200);
    pid_t next = fork();
    if (next == 0) {
        dlock_client *w = open_ok(uri);
        dlock_lock *wl = NULL;
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 15000, 30000);
        if (dlock_acquire(w, name, &o, &wl) != 0)
            _exit(2);
        uint64_t waited = dlock_monotonic_ns() - *released;
        dlock_release(wl);
        _exit(waited < 1000 * MS ? 0 : 3);
    }
    sleep_ms(200);
    kill(doomed, SIGKILL);
    waitpid(doomed, NULL, 0);
    sleep_ms(100);
    *released = dlock_monotonic_ns();
    is_int(dlock_release(l), 0, "holder releases");
    int st;
    waitpid(next, &st, 0);
    is_int(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0,
           "the live waiter behind a killed one gets the lock within 1 s, not the lease");
    dlock_client_close(c);
}

/* A port that accepts connections (kernel backlog) and never answers. */
static void test_silent_server(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    char uri[128];
    dlock_client *c = NULL;
    bind(s, (struct sockaddr *)&a, sizeof a);
    listen(s, 16);
    getsockname(s, (struct sockaddr *)&a, &alen);
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d/0?connect_timeout=300&timeout=300",
             ntohs(a.sin_port));
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_client_open(uri, &c), DLOCK_ECONNECT, "a server that never answers → ECONNECT");
    uint64_t el = dlock_monotonic_ns() - t0;
    ok(el < 3000 * MS, "reported within the timeout (%.0f ms for 300 ms)", el / 1e6);
    ok(strstr(dlock_errmsg(c), "127.0.0.1") != NULL, "message names the host: %s", dlock_errmsg(c));
    dlock_client_close(c);
    close(s);
}

static void test_auth(const char *auth_uri)
{
    dlock_client *c = NULL;
    char nopw[256];
    const char *at = strchr(auth_uri, '@');
    snprintf(nopw, sizeof nopw, "redis://%s", at + 1);
    is_int(dlock_client_open(auth_uri, &c), 0, "the right password opens");
    dlock_lock *l = NULL;
    is_int(dlock_acquire(c, "auth-ok", NULL, &l), 0, "and locks");
    dlock_release(l);
    dlock_client_close(c);
    c = NULL;
    is_int(dlock_client_open(nopw, &c), DLOCK_EAUTH, "no password on a server that wants one → EAUTH");
    dlock_client_close(c);
    c = NULL;
    char bad[256];
    snprintf(bad, sizeof bad, "redis://:not-the-password@%s", at + 1);
    is_int(dlock_client_open(bad, &c), DLOCK_EAUTH, "wrong password → EAUTH");
    ok(!strstr(dlock_errmsg(c), "not-the-password"), "no password in: %s", dlock_errmsg(c));
    dlock_client_close(c);
}


static void lock_key(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "dlock:%s:lock", name);
}

static void test_redlock(const char *uri)
{
    enum { N = 5 };
    redisContext *node[N];
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    char name[128], key[192];
    dlock_acquire_opts o;

    for (int i = 0; i < N; i++)
        node[i] = raw(uri, (size_t)i);

    /* Another owner on 3 of 5 nodes: no quorum, and our grants on the
     * other 2 are undone. */
    snprintf(name, sizeof name, "%spartial", prefix);
    lock_key(key, sizeof key, name);
    for (int i = 0; i < 3; i++)
        freeReplyObject(redisCommand(node[i], "SET %s %s PX 20000", key,
                                     "ffffffffffffffffffffffffffffffff:1"));
    o = wait_opts(DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EBUSY, "3 of 5 held elsewhere → EBUSY");
    /* The undo is sent before acquire returns; give it a moment to land. */
    long long left3 = 1;
    for (int i = 0; i < 100 && left3; i++, sleep_ms(i ? 10 : 0))
        left3 = raw_int(node[3], "EXISTS %s", key) + raw_int(node[4], "EXISTS %s", key);
    is_int(left3, 0, "our grants on the 2 free nodes were released");
    freeReplyObject(redisCommand(node[2], "DEL %s", key));
    is_int(dlock_acquire(c, name, &o, &l), 0, "2 of 5 held elsewhere: quorum of 3 → granted");
    uint64_t t1 = dlock_lock_token(l);
    is_int(dlock_release(l), 0, "release with a quorum");
    freeReplyObject(redisCommand(node[0], "DEL %s", key));
    freeReplyObject(redisCommand(node[1], "DEL %s", key));

    /* Tokens increase across quorums that differ: node 4's counter runs
     * far ahead and nodes 0-1 are busy, so the quorum is nodes 2-4; then
     * a quorum without node 4 (nodes 0-2) must still go higher. */
    snprintf(name, sizeof name, "%sfence", prefix);
    char fence[192];
    snprintf(fence, sizeof fence, "dlock:%s:fence", name);
    lock_key(key, sizeof key, name);
    freeReplyObject(redisCommand(node[4], "SET %s 1000", fence));
    for (int i = 0; i < 2; i++)
        freeReplyObject(redisCommand(node[i], "SET %s %s PX 20000", key,
                                     "ffffffffffffffffffffffffffffffff:1"));
    is_int(dlock_acquire(c, name, &o, &l), 0, "acquire on nodes 2-4, node 4 ahead");
    uint64_t ta = dlock_lock_token(l);
    ok(ta > 1000, "token is the quorum's maximum (%llu)", (unsigned long long)ta);
    dlock_release(l);
    for (int i = 0; i < 2; i++)
        freeReplyObject(redisCommand(node[i], "DEL %s", key));
    freeReplyObject(redisCommand(node[4], "SET %s %s PX 20000", key,
                                 "ffffffffffffffffffffffffffffffff:1"));
    freeReplyObject(redisCommand(node[3], "SET %s %s PX 20000", key,
                                 "ffffffffffffffffffffffffffffffff:1"));
    is_int(dlock_acquire(c, name, &o, &l), 0, "acquire on nodes 0-2 only");
    ok(dlock_lock_token(l) > ta, "token still increases (%llu > %llu): it was written back",
       (unsigned long long)dlock_lock_token(l), (unsigned long long)ta);
    dlock_release(l);
    freeReplyObject(redisCommand(node[3], "DEL %s", key));
    freeReplyObject(redisCommand(node[4], "DEL %s", key));
    (void)t1;

    /* A lease shorter than the clock drift allowance: validity <= 0. */
    snprintf(name, sizeof name, "%svalidity", prefix);
    lock_key(key, sizeof key, name);
    o = wait_opts(DLOCK_WAIT_TRY, 0, 1);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EBUSY, "validity <= 0 (1 ms lease) fails");
    ok(strstr(dlock_errmsg(c), "validity") != NULL, "and says why: %s", dlock_errmsg(c));
    long long left = 1;
    for (int k = 0; k < 100 && left; k++, sleep_ms(10)) {
        left = 0;
        for (int i = 0; i < N; i++)
            left += raw_int(node[i], "EXISTS %s", key);
    }
    is_int(left, 0, "and left no key behind");

    /* Release of an expired lock: at once, reported lost. */
    snprintf(name, sizeof name, "%sexpired", prefix);
    o = wait_opts(DLOCK_WAIT_TRY, 0, 200);
    is_int(dlock_acquire(c, name, &o, &l), 0, "acquire with a 200 ms lease");
    sleep_ms(400);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_release(l), DLOCK_ELOST, "release after expiry → ELOST");
    ok(dlock_monotonic_ns() - t0 < 1000 * MS, "returned at once");

    for (int i = 0; i < N; i++)
        redisFree(node[i]);
    dlock_client_close(c);
}

/* Two of five nodes down still make a quorum; three do not. */
static void test_redlock_nodes_down(const char *uri)
{
    dlock_uri *u = NULL;
    char err[256], two[512], three[512];
    dlock_uri_parse(uri, &u, err, sizeof err);
    snprintf(two, sizeof two, "redis://%s:%u,%s:%u,%s:%u,127.0.0.1:%d,127.0.0.1:%d/0",
             dlock_uri_host(u, 0), dlock_uri_port(u, 0), dlock_uri_host(u, 1),
             dlock_uri_port(u, 1), dlock_uri_host(u, 2), dlock_uri_port(u, 2), closed_port(),
             closed_port());
    snprintf(three, sizeof three, "redis://%s:%u,%s:%u,127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/0",
             dlock_uri_host(u, 0), dlock_uri_port(u, 0), dlock_uri_host(u, 1),
             dlock_uri_port(u, 1), closed_port(), closed_port(), closed_port());
    dlock_uri_free(u);

    dlock_client *c = open_ok(two);
    dlock_lock *l = NULL;
    char name[128];
    snprintf(name, sizeof name, "%sdown", prefix);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 5000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "2 of 5 nodes down: still granted");
    is_int(dlock_release(l), 0, "and released");
    dlock_client_close(c);

    /* Two nodes that accept connections and never answer (a stopped or
     * half-dead server): the three live ones must still make a quorum,
     * promptly, call after call. */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int silent[2], sport[2];
    for (int i = 0; i < 2; i++) {
        socklen_t alen = sizeof a;
        a.sin_port = 0;
        silent[i] = socket(AF_INET, SOCK_STREAM, 0);
        bind(silent[i], (struct sockaddr *)&a, sizeof a);
        listen(silent[i], 64);
        getsockname(silent[i], (struct sockaddr *)&a, &alen);
        sport[i] = ntohs(a.sin_port);
    }
    char mute[512];
    dlock_uri_parse(uri, &u, err, sizeof err);
    snprintf(mute, sizeof mute, "redis://127.0.0.1:%d,%s:%u,%s:%u,127.0.0.1:%d,%s:%u/0", sport[0],
             dlock_uri_host(u, 0), dlock_uri_port(u, 0), dlock_uri_host(u, 1), dlock_uri_port(u, 1),
             sport[1], dlock_uri_host(u, 2), dlock_uri_port(u, 2));
    dlock_uri_free(u);
    c = open_ok(mute);
    int good = 0;
    uint64_t t0 = dlock_monotonic_ns();
    for (int i = 0; i < 10; i++) {
        o = wait_opts(DLOCK_WAIT_DEADLINE, 2000, 5000);
        if (dlock_acquire(c, name, &o, &l) == 0 && dlock_release(l) == 0)
            good++;
        else
            diag("round %d: %s", i, dlock_errmsg(c));
    }
    is_int(good, 10, "2 of 5 nodes silent: every acquire and release still succeeds");
    ok(dlock_monotonic_ns() - t0 < 5000 * MS, "10 rounds in %.0f ms (bound 5 s)",
       (dlock_monotonic_ns() - t0) / 1e6);
    dlock_client_close(c);
    close(silent[0]);
    close(silent[1]);

    c = NULL;
    is_int(dlock_client_open(three, &c), DLOCK_ECONNECT, "3 of 5 nodes down: open fails");
    ok(strstr(dlock_errmsg(c), "127.0.0.1") != NULL, "naming a node: %s", dlock_errmsg(c));
    dlock_client_close(c);
}

int main(void)
{
    const char *single = need_env("DLOCK_REDIS_URI");
    const char *redlock = need_env("DLOCK_REDLOCK_URI");
    const char *auth = need_env("DLOCK_REDIS_AUTH_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "redis-test-%d-%llu/", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() % 1000000007ull));
    test_noscript(single);
    test_dead_waiter(single);
    test_silent_server();
    test_auth(auth);
    test_redlock(redlock);
    test_redlock_nodes_down(redlock);
    return done_testing();
}
