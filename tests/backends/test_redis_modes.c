/*
 * Redis-only cases of shared locks and semaphores, against the one Redis
 * of the test stores, which the conformance suite cannot see:
 *  - the previous release's exclusive lock (its script, kept in
 *    redis_script_prev.h, run directly) and today's readers and permits
 *    exclude each other, both ways, and hand over to each other through
 *    the one queue;
 *  - the lock key mirrors the holders (the newest one's owner and token,
 *    the longest lease) and nothing is left behind after the last release;
 *  - a release grants exactly the waiters it admits: the readers at the
 *    head of the queue, not a writer behind them nor a reader behind that;
 *  - Redlock: readers granted in another order on each node (so that no
 *    one of them is the newest on a quorum) are still inspected as held.
 *
 * Environment (scripts/stores/start.sh prints it): DLOCK_REDIS_URI,
 * DLOCK_REDLOCK_URI. A missing variable fails the run.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/redis_test.h"
#include "backends/redis_script.h"
#include "tests/backends/redis_script_prev.h"

static char prefix[64];

/* The previous release's owners: any 32 hex digits. */
#define PREV_A "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0"
#define PREV_B "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"

struct keys {
    char lock[192], fence[192], queue[192], holders[192], modes[192];
};

static void keys_of(struct keys *k, const char *name)
{
    snprintf(k->lock, sizeof k->lock, "dlock:%s:lock", name);
    snprintf(k->fence, sizeof k->fence, "dlock:%s:fence", name);
    snprintf(k->queue, sizeof k->queue, "dlock:%s:queue", name);
    snprintf(k->holders, sizeof k->holders, "dlock:%s:holders", name);
    snprintf(k->modes, sizeof k->modes, "dlock:%s:modes", name);
}

/* One call of the previous release's script: op owner [a3 [a4 [a5]]]. */
static redisReply *prev_call(redisContext *ctx, const struct keys *k, const char *op,
                             const char *owner, const char *a3, const char *a4, const char *a5)
{
    const char *argv[12] = {"EVAL", dlock_redis_lua_prev, "4", k->lock, k->fence, k->queue,
                            "dlock:floor", op, owner, a3, a4, a5};
    int argc = 9 + (a3 != NULL) + (a4 != NULL) + (a5 != NULL);
    return redisCommandArgv(ctx, argc, argv, NULL);
}

/* {a, b} of an acquire; a = -1 when the reply is not that. */
static void prev_pair(redisReply *r, long long *a, long long *b)
{
    *a = *b = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_INTEGER) {
        *a = r->element[0]->integer;
        *b = r->element[1]->integer;
    } else if (r && r->type == REDIS_REPLY_ERROR) {
        diag("script: %s", r->str);
    }
    if (r)
        freeReplyObject(r);
}

static long long prev_int(redisReply *r)
{
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return v;
}

static long long cmd_int(redisContext *ctx, const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(ctx, fmt, arg);
    return prev_int(r);
}

static void cmd_str(redisContext *ctx, const char *fmt, const char *arg, char *out, size_t len)
{
    redisReply *r = redisCommand(ctx, fmt, arg);
    snprintf(out, len, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "");
    if (r)
        freeReplyObject(r);
}

static dlock_acquire_opts mode_opts(dlock_mode mode, uint32_t limit, dlock_wait wait,
                                    uint64_t wait_ms, uint32_t ttl_ms)
{
    dlock_acquire_opts o = wait_opts(wait, wait_ms, ttl_ms);
    o.mode = mode;
    o.limit = limit;
    return o;
}

/* A wait on a thread of its own. */
struct bg {
    dlock_client *c;
    const char *name;
    dlock_mode mode;
    uint32_t limit;
    unsigned wait_ms; /* 0: 10 s */
    pthread_t th;
    int rc;
    _Atomic int done;
    dlock_lock *l;
};

static void *bg_run(void *arg)
{
    struct bg *b = arg;
    dlock_acquire_opts o = mode_opts(b->mode, b->limit, DLOCK_WAIT_DEADLINE,
                                     b->wait_ms ? b->wait_ms : 10000, 30000);
    b->rc = dlock_acquire(b->c, b->name, &o, &b->l);
    b->done = 1;
    return NULL;
}

/* Starts b and waits until its entry is in the queue (queued entries go
 * from `before` to before + 1); 1 when seen. */
static int bg_start_queued(struct bg *b, redisContext *ctx, const struct keys *k,
                           long long before)
{
    b->done = 0;
    b->l = NULL;
    pthread_create(&b->th, NULL, bg_run, b);
    for (int i = 0; i < 300; i++) {
        if (cmd_int(ctx, "LLEN %s", k->queue) >= before + 1)
            return 1;
        sleep_ms(10);
    }
    return 0;
}

static int bg_done_within(struct bg *b, unsigned ms)
{
    for (unsigned i = 0; i < ms / 5 && !b->done; i++)
        sleep_ms(5);
    return b->done;
}

static void bg_finish(struct bg *b)
{
    pthread_join(b->th, NULL);
    if (b->l)
        dlock_release(b->l);
    b->l = NULL;
}

static int nothing_left(redisContext *ctx, const struct keys *k)
{
    redisReply *r = redisCommand(ctx, "EXISTS %s %s %s %s", k->lock, k->queue, k->holders,
                                 k->modes);
    return prev_int(r) == 0;
}

/* Readers of today and an exclusive holder of the previous release. */
static void test_prev_exclusive(const char *uri)
{
    dlock_client *a = open_ok(uri), *b = open_ok(uri), *w = open_ok(uri);
    redisContext *ctx = raw(uri, 0);
    dlock_lock *r1 = NULL, *r2 = NULL, *l = NULL;
    char name[128];
    struct keys k;
    long long g, v;
    snprintf(name, sizeof name, "%sprev-exclusive", prefix);
    keys_of(&k, name);
    dlock_acquire_opts s = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(a, name, &s, &r1), 0, "prev: a reader");
    is_int(dlock_acquire(b, name, &s, &r2), 0, "prev: a second reader");
    prev_pair(prev_call(ctx, &k, "acquire", PREV_A, "5000", "-", "try"), &g, &v);
    ok(g == 0 && v > 5000, "prev: an exclusive try of the previous release finds the name held "
                           "(%lld, lease left %lld ms)", g, v);
    uint64_t top = r2 ? dlock_lock_token(r2) : 0;
    if (r1)
        dlock_release(r1);
    if (r2)
        dlock_release(r2);
    /* The control: once the readers are gone, the same try is granted. */
    prev_pair(prev_call(ctx, &k, "acquire", PREV_A, "5000", "-", "try"), &g, &v);
    ok(g == 1 && (uint64_t)v > top, "prev: granted once the readers left, token %lld above the "
                                    "readers' %llu", v, (unsigned long long)top);
    dlock_acquire_opts e = mode_opts(DLOCK_MODE_EXCLUSIVE, 0, DLOCK_WAIT_TRY, 0, 10000);
    dlock_acquire_opts p = mode_opts(DLOCK_MODE_EXCLUSIVE, 2, DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(w, name, &s, &l), DLOCK_EBUSY, "prev: its lock excludes a reader");
    is_int(dlock_acquire(w, name, &e, &l), DLOCK_EBUSY, "prev: and a writer");
    is_int(dlock_acquire(w, name, &p, &l), DLOCK_EMODE,
           "prev: a permit is refused: the name is a read-write lock (%s)", dlock_errmsg(w));
    /* Its release hands the lock to a reader that waits (as an exclusive
     * grant: it knows no other), which releases it as such. */
    struct bg rb = {.c = w, .name = name, .mode = DLOCK_MODE_SHARED};
    ok(bg_start_queued(&rb, ctx, &k, 0), "prev: a reader waits in the queue");
    uint64_t t0 = dlock_monotonic_ns();
    is_int(prev_int(prev_call(ctx, &k, "release", PREV_A, NULL, NULL, NULL)), 1,
           "prev: the previous release's holder releases");
    int done = bg_done_within(&rb, 2000);
    ok(done && rb.rc == 0, "prev: its handoff reached the reader (%.1f ms%s%s)", since_ms(t0),
       done ? "" : ", still waiting", done && rb.rc ? dlock_errmsg(w) : "");
    if (rb.l)
        is_int(dlock_release(rb.l), 0, "prev: the reader releases what it was handed");
    rb.l = NULL;
    bg_finish(&rb);
    ok(nothing_left(ctx, &k), "prev: nothing left behind");

    /* A waiter of the previous release behind readers is served by the
     * last reader's release. */
    is_int(dlock_acquire(a, name, &s, &r1), 0, "prev: a reader again");
    redisContext *sub = raw(uri, 0);
    char chan[96], lock[128] = "";
    snprintf(chan, sizeof chan, "dlock:w:%s", PREV_B);
    redisReply *r = redisCommand(sub, "SUBSCRIBE %s", chan);
    if (r)
        freeReplyObject(r);
    prev_pair(prev_call(ctx, &k, "acquire", PREV_B, "5000", chan, "wait"), &g, &v);
    is_int(g, 0, "prev: an exclusive waiter of the previous release queues behind the reader");
    if (r1)
        dlock_release(r1);
    struct timeval tv = {2, 0};
    redisSetTimeout(sub, tv);
    void *msg = NULL;
    int got = redisGetReply(sub, &msg) == REDIS_OK && msg &&
              ((redisReply *)msg)->type == REDIS_REPLY_ARRAY &&
              ((redisReply *)msg)->elements == 3 &&
              ((redisReply *)msg)->element[2]->type == REDIS_REPLY_STRING &&
              strncmp(((redisReply *)msg)->element[2]->str, PREV_B ":", 33) == 0;
    if (msg)
        freeReplyObject(msg);
    ok(got, "prev: the reader's release handed it the lock, with its message");
    cmd_str(ctx, "GET %s", k.lock, lock, sizeof lock);
    ok(strncmp(lock, PREV_B ":", 33) == 0, "prev: the lock key names it (%s)", lock);
    is_int(dlock_acquire(w, name, &s, &l), DLOCK_EBUSY, "prev: it excludes a reader");
    is_int(prev_int(prev_call(ctx, &k, "release", PREV_B, NULL, NULL, NULL)), 1,
           "prev: and releases");
    ok(nothing_left(ctx, &k), "prev: nothing left behind");
    redisFree(sub);
    redisFree(ctx);
    dlock_client_close(w);
    dlock_client_close(b);
    dlock_client_close(a);
}

/* The lock key while readers hold: the newest reader, the longest lease. */
static void test_mirror(const char *uri)
{
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    redisContext *ctx = raw(uri, 0);
    dlock_lock *r1 = NULL, *r2 = NULL;
    char name[128], lock[128], want[128];
    struct keys k;
    snprintf(name, sizeof name, "%smirror", prefix);
    keys_of(&k, name);
    dlock_acquire_opts s8 = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_TRY, 0, 8000);
    dlock_acquire_opts s3 = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_TRY, 0, 3000);
    is_int(dlock_acquire(a, name, &s8, &r1), 0, "mirror: a reader with an 8 s lease");
    is_int(dlock_acquire(b, name, &s3, &r2), 0, "mirror: a reader with a 3 s lease");
    if (!r1 || !r2)
        return;
    snprintf(want, sizeof want, "%s:%llu", dlock_lock_owner(r2),
             (unsigned long long)dlock_lock_token(r2));
    cmd_str(ctx, "GET %s", k.lock, lock, sizeof lock);
    is_str(lock, want, "mirror: the lock key names the newest reader");
    long long pttl = cmd_int(ctx, "PTTL %s", k.lock);
    ok(pttl > 7000, "mirror: with the longest lease (%lld ms)", pttl);
    dlock_release(r2);
    snprintf(want, sizeof want, "%s:%llu", dlock_lock_owner(r1),
             (unsigned long long)dlock_lock_token(r1));
    cmd_str(ctx, "GET %s", k.lock, lock, sizeof lock);
    is_str(lock, want, "mirror: after its release, the other reader");
    dlock_release(r1);
    ok(nothing_left(ctx, &k), "mirror: nothing left after the last release");
    redisFree(ctx);
    dlock_client_close(b);
    dlock_client_close(a);
}

/* A release admits the readers at the head, and only them. */
static void test_admits_head(const char *uri)
{
    dlock_client *h = open_ok(uri);
    dlock_client *c[4] = {open_ok(uri), open_ok(uri), open_ok(uri), open_ok(uri)};
    redisContext *ctx = raw(uri, 0);
    dlock_lock *wl = NULL;
    char name[128];
    struct keys k;
    snprintf(name, sizeof name, "%sadmits", prefix);
    keys_of(&k, name);
    dlock_acquire_opts e = mode_opts(DLOCK_MODE_EXCLUSIVE, 0, DLOCK_WAIT_TRY, 0, 30000);
    is_int(dlock_acquire(h, name, &e, &wl), 0, "admits: a writer holds");
    /* Queued in this order: reader, reader, writer, reader. */
    static const dlock_mode order[4] = {DLOCK_MODE_SHARED, DLOCK_MODE_SHARED,
                                        DLOCK_MODE_EXCLUSIVE, DLOCK_MODE_SHARED};
    struct bg b[4];
    int queued = 1;
    for (int i = 0; i < 4; i++) {
        b[i] = (struct bg){.c = c[i], .name = name, .mode = order[i]};
        queued &= bg_start_queued(&b[i], ctx, &k, i);
    }
    ok(queued, "admits: reader, reader, writer, reader queued in order");
    if (wl)
        dlock_release(wl);
    int both = bg_done_within(&b[0], 2000) && bg_done_within(&b[1], 2000);
    ok(both && b[0].rc == 0 && b[1].rc == 0, "admits: the writer's release grants both readers");
    sleep_ms(300);
    ok(!b[2].done && !b[3].done, "admits: not the writer behind them, nor the reader behind it");
    is_int(cmd_int(ctx, "LLEN %s", k.queue), 2, "admits: those two still queued");
    dlock_holder hs[4];
    size_t n = 0;
    is_int(dlock_inspect_holders(h, name, hs, 4, &n), 0, "admits: holders listed");
    is_int((int)n, 2, "admits: two readers hold");
    dlock_release(b[0].l);
    b[0].l = NULL;
    sleep_ms(200);
    ok(!b[2].done, "admits: one reader's release does not admit the writer");
    dlock_release(b[1].l);
    b[1].l = NULL;
    ok(bg_done_within(&b[2], 2000) && b[2].rc == 0, "admits: the last reader's release does");
    sleep_ms(200);
    ok(!b[3].done, "admits: the reader behind it still waits");
    dlock_release(b[2].l);
    b[2].l = NULL;
    ok(bg_done_within(&b[3], 2000) && b[3].rc == 0, "admits: then it is granted");
    for (int i = 0; i < 4; i++)
        bg_finish(&b[i]);
    ok(nothing_left(ctx, &k), "admits: nothing left behind");
    redisFree(ctx);
    for (int i = 0; i < 4; i++)
        dlock_client_close(c[i]);
    dlock_client_close(h);
}

/* A writer queued between readers gives up: the reader behind it is
 * granted then, beside the reader that holds, not at that one's lease end. */
static void test_writer_gives_up(const char *uri)
{
    dlock_client *a = open_ok(uri), *w = open_ok(uri), *b = open_ok(uri);
    redisContext *ctx = raw(uri, 0);
    dlock_lock *r1 = NULL;
    char name[128];
    struct keys k;
    snprintf(name, sizeof name, "%sgives-up", prefix);
    keys_of(&k, name);
    dlock_acquire_opts s = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_TRY, 0, 30000);
    is_int(dlock_acquire(a, name, &s, &r1), 0, "gives up: a reader holds (30 s lease)");
    struct bg wb = {.c = w, .name = name, .mode = DLOCK_MODE_EXCLUSIVE, .wait_ms = 800};
    struct bg rb = {.c = b, .name = name, .mode = DLOCK_MODE_SHARED};
    ok(bg_start_queued(&wb, ctx, &k, 0), "gives up: a writer waits behind it (800 ms deadline)");
    ok(bg_start_queued(&rb, ctx, &k, 1), "gives up: a second reader waits behind the writer");
    sleep_ms(200);
    ok(!rb.done, "gives up: the second reader waits (the writer is ahead)");
    pthread_join(wb.th, NULL);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(wb.rc, DLOCK_ETIMEDOUT, "gives up: the writer's deadline passes");
    int done = bg_done_within(&rb, 2000);
    double ms = since_ms(t0);
    ok(done && rb.rc == 0,
       "gives up: the reader behind it is granted beside the first (%.0f ms after)", ms);
    bg_finish(&rb);
    if (r1)
        dlock_release(r1);
    ok(nothing_left(ctx, &k), "gives up: nothing left behind");
    redisFree(ctx);
    dlock_client_close(b);
    dlock_client_close(w);
    dlock_client_close(a);
}

/* One call of today's script on one node: op owner ttl (Redlock's grab). */
static long long grab(redisContext *ctx, const char *name, const char *op, const char *owner)
{
    char k[7][192];
    static const char *const suffix[7] = {":lock", ":fence", ":queue", "", ":raised", ":holders",
                                          ":modes"};
    for (int i = 0; i < 7; i++)
        snprintf(k[i], sizeof k[i], i == 3 ? "dlock:floor" : "dlock:%s%s", name, suffix[i]);
    const char *argv[13] = {"EVAL", dlock_redis_lua, "7", k[0], k[1], k[2], k[3], k[4], k[5],
                            k[6], op, owner, "30000"};
    long long a, b;
    prev_pair(redisCommandArgv(ctx, 13, argv, NULL), &a, &b);
    return a;
}

static void test_redlock_order(const char *uri)
{
    static const char *const owner[3] = {"a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1",
                                         "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2",
                                         "c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3"};
    /* On each node, the order of the grants: the newest is A on two
     * nodes, B on two, C on one: none on a quorum of the five. */
    static const int order[5][3] = {{1, 2, 0}, {2, 1, 0}, {0, 2, 1}, {2, 0, 1}, {0, 1, 2}};
    dlock_client *c = open_ok(uri);
    char name[128];
    int granted = 1;
    snprintf(name, sizeof name, "%sredlock-order", prefix);
    for (int i = 0; i < 5; i++) {
        redisContext *ctx = raw(uri, (size_t)i);
        for (int j = 0; j < 3; j++)
            granted &= grab(ctx, name, "sgrab", owner[order[i][j]]) == 1;
        redisFree(ctx);
    }
    ok(granted, "redlock order: three readers on five nodes, in another order on each");
    dlock_info info;
    int rc = dlock_inspect(c, name, &info);
    is_int(rc, 0, "redlock order: inspect answers (%s)", rc ? dlock_errmsg(c) : "");
    ok(rc == 0 && info.held == 1, "redlock order: held, though no reader is the newest on a "
                                  "quorum");
    dlock_holder hs[4];
    size_t n = 0;
    is_int(dlock_inspect_holders(c, name, hs, 4, &n), 0, "redlock order: holders listed");
    is_int((int)n, 3, "redlock order: three");
    ok(n == 3 && hs[0].mode == DLOCK_MODE_SHARED && hs[0].token < hs[1].token &&
           hs[1].token < hs[2].token,
       "redlock order: shared, by token");
    for (int i = 0; i < 5; i++) {
        redisContext *ctx = raw(uri, (size_t)i);
        for (int j = 0; j < 3; j++) {
            grab(ctx, name, "srelease", owner[j]);
        }
        redisFree(ctx);
    }
    is_int(dlock_inspect(c, name, &info), 0, "redlock order: inspect after the releases");
    is_int(info.held, 0, "redlock order: free");
    dlock_client_close(c);
}

/* Counters out of step: node 0's far ahead (at `ahead`), so a grant of
 * mode is written back to the others; every node then records its token,
 * which inspect_holders tells. */
static void writeback_case(dlock_client *c, const char *uri, const char *name, dlock_mode mode,
                           const char *ahead, const char *what)
{
    char fence[192];
    dlock_lock *l = NULL;
    dlock_holder h[2];
    size_t n = 0;
    snprintf(fence, sizeof fence, "dlock:%s:fence", name);
    redisContext *ctx = raw(uri, 0);
    redisReply *r = redisCommand(ctx, "SET %s %s", fence, ahead);
    if (r)
        freeReplyObject(r);
    redisFree(ctx);
    dlock_acquire_opts o = mode_opts(mode, 0, DLOCK_WAIT_TRY, 0, 30000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "redlock write-back: a %s", what);
    is_int(dlock_inspect_holders(c, name, h, 2, &n), 0, "redlock write-back: holders listed");
    ok(l && n == 1 && h[0].token == dlock_lock_token(l),
       "redlock write-back: the %s's token is its grant's (%llu, listed %llu)", what,
       (unsigned long long)(l ? dlock_lock_token(l) : 0), (unsigned long long)h[0].token);
    if (l)
        dlock_release(l);
}

static void test_redlock_writeback(const char *uri)
{
    dlock_client *c = open_ok(uri);
    char name[128];
    snprintf(name, sizeof name, "%sredlock-writeback", prefix);
    writeback_case(c, uri, name, DLOCK_MODE_SHARED, "5000000000000000", "reader");
    writeback_case(c, uri, name, DLOCK_MODE_EXCLUSIVE, "6000000000000000", "writer");
    dlock_client_close(c);
}

int main(void)
{
    const char *single = need_env("DLOCK_REDIS_URI");
    const char *redlock = need_env("DLOCK_REDLOCK_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "redis-modes-%d-%llu/", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() % 1000000007ull));
    test_prev_exclusive(single);
    test_mirror(single);
    test_admits_head(single);
    test_writer_gives_up(single);
    test_redlock_order(redlock);
    test_redlock_writeback(redlock);
    return done_testing();
}
