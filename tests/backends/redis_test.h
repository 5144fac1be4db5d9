/*
 * What test_redis.c and test_redlock.c share: a direct connection to one
 * host of a URI, throwaway redis-server processes (killed and restarted by
 * the tests, gone with the test), a loss callback that records what it
 * was told, and a wait in a thread of its own that the test cancels.
 */
#ifndef DLOCK_TESTS_BACKENDS_REDIS_TEST_H
#define DLOCK_TESTS_BACKENDS_REDIS_TEST_H

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock.h"
#include "tests/util.h"

/* Direct connection to host i of uri (authenticated with its password). */
static redisContext *raw(const char *uri, size_t i)
{
    dlock_uri *u = NULL;
    char err[256];
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0)
        exit(1);
    redisContext *ctx = redisConnect(dlock_uri_host(u, i), (int)dlock_uri_port(u, i));
    if (ctx && !ctx->err && dlock_uri_password(u)) {
        redisReply *r = redisCommand(ctx, "AUTH %s", dlock_uri_password(u));
        if (r)
            freeReplyObject(r);
    }
    dlock_uri_free(u);
    return ctx;
}

static inline double since_ms(uint64_t t0)
{
    return (double)(dlock_monotonic_ns() - t0) / 1e6;
}

struct srv {
    pid_t pid;
    int port;
};

static inline int srv_answers(int port)
{
    struct timeval tv = {0, 200000};
    redisContext *ctx = redisConnectWithTimeout("127.0.0.1", port, tv);
    int up = 0;
    if (ctx && !ctx->err) {
        redisSetTimeout(ctx, tv);
        redisReply *r = redisCommand(ctx, "PING");
        up = r && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
    }
    if (ctx)
        redisFree(ctx);
    return up;
}

/* A redis-server of our own, without persistence like the test stores, on
 * port (0: a free one), with extra "--option value" arguments (NULL: none).
 * It dies with the test. */
static inline void srv_start(struct srv *s, int port, const char *const *extra)
{
    char ps[16];
    const char *argv[40] = {"redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--dir", "/tmp", "--protected-mode", "no"};
    size_t n = 13;
    s->port = port ? port : free_port();
    snprintf(ps, sizeof ps, "%d", s->port);
    for (size_t i = 0; extra && extra[i] && n < 38; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    fflush(stdout);
    s->pid = fork();
    if (s->pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        dup2(fd, 1);
        dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 250; i++) {
        if (srv_answers(s->port))
            return;
        sleep_ms(20);
    }
    printf("Bail out! cannot start redis-server on port %d\n", s->port);
    exit(1);
}

static inline void srv_kill(struct srv *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

/* What an on_lost callback was told. */
struct lost_seen {
    pthread_mutex_t mu;
    int calls, err;
};

static inline void on_lost_cb(dlock_lock *lock, int err, void *user)
{
    struct lost_seen *s = user;
    (void)lock;
    pthread_mutex_lock(&s->mu);
    s->calls++;
    s->err = err;
    pthread_mutex_unlock(&s->mu);
}

/* A wait for name on c in a thread of its own, with a cancel flag k that
 * the test raises. It waits up to wait_ms: the bound on a test whose
 * cancel goes unseen. */
struct cwait {
    dlock_client *c;
    const char *name;
    uint64_t wait_ms;
    dlock_cancel *k;
    pthread_t th;
    atomic_int done;
    int rc;
    uint64_t done_ns;
    dlock_lock *l;
    char why[256];
};

static inline void *cwait_run(void *arg)
{
    struct cwait *w = arg;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, w->wait_ms, 30000);
    o.cancel = w->k;
    w->rc = dlock_acquire(w->c, w->name, &o, &w->l);
    w->done_ns = dlock_monotonic_ns();
    snprintf(w->why, sizeof w->why, "%s", w->rc ? dlock_errmsg(w->c) : "granted");
    atomic_store(&w->done, 1);
    return NULL;
}

static inline void cwait_start(struct cwait *w, dlock_client *c, const char *name,
                               uint64_t wait_ms)
{
    w->c = c;
    w->name = name;
    w->wait_ms = wait_ms;
    w->l = NULL;
    w->rc = 1;
    w->why[0] = '\0';
    atomic_init(&w->done, 0);
    if (dlock_cancel_new(&w->k) != 0) {
        printf("Bail out! dlock_cancel_new failed\n");
        exit(1);
    }
    pthread_create(&w->th, NULL, cwait_run, w);
}

/* Joins the wait; the flag is freed, the lock (if granted) kept in w->l. */
static inline void cwait_join(struct cwait *w)
{
    pthread_join(w->th, NULL);
    dlock_cancel_free(w->k);
    w->k = NULL;
}

/*
 * A wait kept from ending by a store that is down (what: the case's name,
 * for the messages; fault: what happened to it): 300 ms on it must still
 * be waiting; then the cancel must end it with DLOCK_ECANCELED within
 * bound_ms (bound_why says what bound the wait would meet otherwise).
 */
static inline void cwait_cancel_ends(struct cwait *w, const char *what, const char *fault,
                                     double bound_ms, const char *bound_why)
{
    sleep_ms(300);
    int early = atomic_load(&w->done);
    ok(!early, "%s: 300 ms after %s the waiter still tries again%s%s", what, fault,
       early ? ", but it ended: " : "", early ? w->why : "");
    uint64_t t0 = dlock_monotonic_ns();
    dlock_cancel_fire(w->k);
    cwait_join(w);
    double ms = w->done_ns > t0 ? (w->done_ns - t0) / 1e6 : 0;
    is_int(w->rc, DLOCK_ECANCELED, "%s: the cancel ends the wait: %s (%s)", what,
           dlock_err_name(w->rc), w->why);
    ok(ms < bound_ms, "%s: %.1f ms after the cancel (bound %.0f ms; %s)", what, ms, bound_ms,
       bound_why);
}

/* What cancel_race() saw. */
struct race_seen {
    int granted, cancelled, bad;
    char first_bad[256];
};

static inline void race_bad(struct race_seen *r, int round, const char *what, dlock_client *c)
{
    if (!r->bad++)
        snprintf(r->first_bad, sizeof r->first_bad, "round %d: %s: %s", round, what,
                 c ? dlock_errmsg(c) : "");
}

/*
 * rounds times: a holder takes name, a waiter queues behind it, then the
 * holder's release and the waiter's cancel come close together: in turn
 * release first and cancel first, 0 to 1 ms apart, so that the cancel lands
 * before the release, as the waiter reads it, and while it takes the lock.
 * Every round must end as a grant whose release succeeds, or as
 * DLOCK_ECANCELED with nothing left held: a third client's try then gets
 * the lock.
 */
static inline void cancel_race(const char *uri, const char *name, int rounds,
                               struct race_seen *r)
{
    dlock_client *h = NULL, *wc = NULL, *third = NULL;
    memset(r, 0, sizeof *r);
    if (dlock_client_open(uri, &h) || dlock_client_open(uri, &wc) ||
        dlock_client_open(uri, &third)) {
        race_bad(r, 0, "open", NULL);
        goto out;
    }
    dlock_acquire_opts t = wait_opts(DLOCK_WAIT_TRY, 0, 30000);
    for (int i = 0; i < rounds; i++) {
        dlock_lock *hl = NULL, *tl = NULL;
        struct cwait w;
        if (dlock_acquire(h, name, &t, &hl) != 0) {
            race_bad(r, i, "the holder's try", h);
            break;
        }
        cwait_start(&w, wc, name, 5000);
        sleep_ms(20); /* waiting */
        struct timespec gap = {0, (i / 2 % 5) * 250000L};
        int rel = 0;
        if (i % 2)
            rel = dlock_release(hl);
        else
            dlock_cancel_fire(w.k);
        nanosleep(&gap, NULL);
        if (i % 2)
            dlock_cancel_fire(w.k);
        else
            rel = dlock_release(hl);
        cwait_join(&w);
        if (rel != 0)
            race_bad(r, i, "the holder's release", h);
        if (w.rc == 0) {
            r->granted++;
            if (dlock_release(w.l) != 0)
                race_bad(r, i, "the granted waiter's release", wc);
        } else if (w.rc == DLOCK_ECANCELED) {
            r->cancelled++;
            if (dlock_acquire(third, name, &t, &tl) != 0)
                race_bad(r, i, "cancelled, yet a third client's try failed", third);
            else if (dlock_release(tl) != 0)
                race_bad(r, i, "the third client's release", third);
        } else {
            race_bad(r, i, dlock_err_name(w.rc), NULL);
            snprintf(r->first_bad + strlen(r->first_bad),
                     sizeof r->first_bad - strlen(r->first_bad), "%s", w.why);
        }
        if (r->bad)
            break;
    }
out:
    dlock_client_close(third);
    dlock_client_close(wc);
    dlock_client_close(h);
}

#endif
