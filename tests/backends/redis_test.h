/*
 * What test_redis.c and test_redlock.c share: a direct connection to one
 * host of a URI, throwaway redis-server processes (killed and restarted by
 * the tests, gone with the test), and a loss callback that records what it
 * was told.
 */
#ifndef DLOCK_TESTS_BACKENDS_REDIS_TEST_H
#define DLOCK_TESTS_BACKENDS_REDIS_TEST_H

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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
    s->port = port ? port : closed_port();
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

#endif
