/*
 * ZooKeeper's shared locks and semaphores, where the conformance suite
 * cannot see them (docs/zookeeper.md, "Shared locks and semaphores"):
 *
 * - the queue's rules on made-up children lists (zk_turn(), zk_holders(),
 *   the tags in node names), old nodes and other recipes' included;
 * - no herd: a release wakes only the waiters it admits, counted in watch
 *   events per client (dlock_zk_watch_events(), test-only). A writer's
 *   release wakes the readers behind it and no one behind the next writer;
 *   a permit's release wakes the admitted waiter and the one behind it,
 *   which takes over as the first waiter (the admitted one's setData), and
 *   nobody further back;
 * - a permit waiter that gives up does not hold back the one behind it;
 * - the previous release's layout: its exclusive node ("<owner>-lock-",
 *   made here by a raw client) excludes readers and refuses permits, and a
 *   reader's node ends in "-lock-<seq>", so an old client queues behind it.
 *
 * Environment: DLOCK_ZK_URI (scripts/stores/start.sh prints it); a missing
 * variable fails the run.
 */
#define THREADED 1
#include <zookeeper/zookeeper.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/zookeeper_names.h"
#include "core/uri.h"
#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/zk_raw.h"
#include "tests/backends/mode_waiters.h"

/* Test-only (backends/zookeeper.c): the watch events a client received. */
uint64_t dlock_zk_watch_events(dlock_client *c);

static char prefix[64];
static const char *uri;

/* ---- the rules, no server ------------------------------------------------ */

static void kids_of(struct zk_kids *k, const char *const *names, size_t n)
{
    if (zk_kids_parse(names, n, k) != 0 || k->n != n) {
        printf("Bail out! cannot parse a children list\n");
        exit(1);
    }
}

static void test_rules(void)
{
    static const char *const rw[] = {
        "aa-__READ__-lock-0000000001", "bb-__READ__-lock-0000000002", "cc-lock-0000000003",
        "dd-__READ__-lock-0000000004", "_c_0b1e28ba-2fa1-lock-0000000005",
        "ee-__READ__-lock-0000000006"};
    static const char *const sem[] = {
        "aa-__SEM2__-lock-0000000001", "bb-__SEM2__-lock-0000000002",
        "cc-__SEM2__-lock-0000000003", "dd-__SEM2__-lock-0000000004",
        "ee-__SEM3__-lock-0000000005", "ff-lock-0000000006"};
    struct zk_kids k;
    struct zk_turn t;
    unsigned limit = 9;
    char tag[ZK_TAG_MAX], owner[64];

    zk_tag(0, 0, tag);
    is_str(tag, "", "an exclusive request's node has no tag (today's layout)");
    zk_tag(1, 0, tag);
    is_str(tag, "-__READ__", "a reader's tag");
    zk_tag(0, 65535, tag);
    is_str(tag, "-__SEM65535__", "a permit's tag names the limit");
    is_int(zk_node_kind("ab-lock-0000000001", &limit), ZK_WRITER, "an old node is a writer");
    is_int(zk_node_kind("ab-__SEM7__-lock-0000000001", &limit), ZK_PERMIT, "a permit");
    is_int(limit, 7, "of limit 7");
    is_int(zk_node_kind("ab-__SEM0__-lock-1", &limit), ZK_WRITER, "limit 0: not a permit");
    is_int(zk_node_kind("ab-__SEM65536__-lock-1", &limit), ZK_WRITER, "nor 65536");
    is_int(zk_node_kind("ab-__SEM07__-lock-1", &limit), ZK_WRITER, "nor a leading 0");
    is_int(zk_node_kind("ab-__READ__x-lock-1", &limit), ZK_WRITER, "a tag ends at the mark");
    zk_node_owner("ab12-__READ__-lock-0000000001", owner, sizeof owner);
    is_str(owner, "ab12", "a reader's owner id, without its tag");
    zk_node_owner("ab12-__SEM3__-lock-0000000001", owner, sizeof owner);
    is_str(owner, "ab12", "a permit's owner id, without its tag");
    long long seq = 0;
    ok(zk_lock_seq("ab12-__READ__-lock-0000000042", &seq) == 0 && seq == 42,
       "a reader's node parses as a lock node by the previous release's rule");

    kids_of(&k, rw, 6);
    is_int(zk_holders(&k), 2, "two readers ahead of a writer hold");
    zk_turn(&k, 1, &t);
    is_int(t.verdict, ZK_GRANTED, "the second reader holds");
    zk_turn(&k, 2, &t);
    ok(t.verdict == ZK_WAIT && t.first == 1 && t.count == 1,
       "the writer waits for the node just before it");
    zk_turn(&k, 3, &t);
    ok(t.verdict == ZK_WAIT && t.first == 2 && t.count == 1,
       "a reader behind a writer waits for that writer only");
    zk_turn(&k, 5, &t);
    ok(t.verdict == ZK_WAIT && t.first == 4 && t.count == 1,
       "another recipe's node is a writer: the reader behind waits for it");
    zk_kids_free(&k);

    kids_of(&k, sem, 6);
    is_int(zk_holders(&k), 2, "a semaphore of 2: its first 2 permits hold");
    zk_turn(&k, 1, &t);
    is_int(t.verdict, ZK_GRANTED, "the second permit holds");
    zk_turn(&k, 2, &t);
    ok(t.verdict == ZK_WAIT && t.first == 0 && t.count == 2 && !t.signal,
       "the first waiter watches every holder");
    zk_turn(&k, 3, &t);
    ok(t.verdict == ZK_WAIT && t.first == 2 && t.count == 1 && t.signal,
       "a later waiter watches the node before it, whose write counts");
    zk_turn(&k, 4, &t);
    ok(t.verdict == ZK_MISMATCH && t.first == 0, "limit 3 behind limit 2: refused");
    zk_turn(&k, 5, &t);
    ok(t.verdict == ZK_MISMATCH && t.first == 0, "an old writer behind permits: refused");
    zk_kids_free(&k);
}

/* layout=kazoo: kazoo's names, matched as its regex
 * "(?:__lock__|__rlock__)(-?\d{10})$" does, beside the dlock layout's, in
 * one queue by sequence number; the dlock layout does not see them. */
static void test_kazoo_rules(void)
{
    static const char *const mixed[] = {
        "0f9e__rlock__0000000007", "aa-__READ__-lock-0000000002", "x__lock__0000000004",
        "cc-lock-0000000005", "ab__rlock__0000000003", "_c_0b1e28ba-2fa1-lock-0000000006",
        "y__lock__000000001",  /* 9 digits: not kazoo's */
        "z__lock__00000000011", /* 11 digits */
        "w__lockx0000000001",   /* no pattern */
        "v__lock__-0000000001", /* kazoo's optional '-' */
        "u-__READ____rlock__0000000009"};
    struct zk_kids k;
    struct zk_turn t;
    char mark[ZK_MARK_MAX], owner[64];
    long long seq = 0;
    enum zk_kind kind = ZK_PERMIT;
    unsigned limit = 9;

    zk_mark(ZK_LAYOUT_KAZOO, 0, 0, mark);
    is_str(mark, "__lock__", "kazoo layout: an exclusive node is kazoo's Lock/WriteLock node");
    zk_mark(ZK_LAYOUT_KAZOO, 1, 0, mark);
    is_str(mark, "__rlock__", "a shared one is kazoo's ReadLock node");
    zk_mark(ZK_LAYOUT_DLOCK, 1, 0, mark);
    is_str(mark, "-__READ__-lock-", "dlock layout: unchanged");
    ok(zk_kazoo_seq("ab__rlock__0000000042", &seq, &kind) == 0 && seq == 42 &&
           kind == ZK_READER, "a kazoo reader's node");
    ok(zk_kazoo_seq("ab__lock__-0000000042", &seq, &kind) == 0 && seq == -42 &&
           kind == ZK_WRITER, "kazoo's '-' is a sign");
    ok(zk_kazoo_seq("ab-lock-0000000042", &seq, &kind) != 0, "a dlock node is not kazoo's");
    is_int(zk_node_kind("ab__rlock__0000000001", &limit), ZK_READER, "kind: a kazoo reader");
    is_int(zk_node_kind("ab__lock__0000000001", &limit), ZK_WRITER, "kind: a kazoo writer");
    zk_node_owner("0123abcd__rlock__0000000001", owner, sizeof owner);
    is_str(owner, "0123abcd", "a kazoo node's owner is its uuid hex");
    is_int(zk_node_foreign("0123abcd__lock__0000000001", "0123abcd"), 0,
           "a kazoo-named node whose data is its owner id is dlock's");
    is_int(zk_node_foreign("0123abcd__lock__0000000001", "my-host"), 1,
           "one with other data is a kazoo client's");
    is_int(zk_node_foreign("0123abcd__lock__0000000001", ""), 1, "and one with none");
    is_int(zk_node_foreign("__lock__0000000001", ""), 1, "no owner id: a kazoo client's");
    is_int(zk_node_foreign("0123abcd-lock-0000000001", "x"), 0, "a dlock-layout node never");

    ok(zk_kids_parse(mixed, 11, &k) == 0 && k.n == 3, "the dlock layout sees its own 3 only");
    zk_kids_free(&k);
    ok(zk_kids_parse_layout(mixed, 11, ZK_LAYOUT_KAZOO, &k) == 0 && k.n == 8,
       "the kazoo layout sees kazoo's 5 and the dlock layout's 3");
    if (k.n == 8) {
        is_str(k.v[0].name, "v__lock__-0000000001", "ordered by sequence number");
        is_str(k.v[1].name, "aa-__READ__-lock-0000000002", "across both layouts");
        is_str(k.v[7].name, "u-__READ____rlock__0000000009", "kazoo's pattern wins at the end");
        is_int(k.v[7].kind, ZK_READER, "as a reader");
        zk_turn(&k, 2, &t);
        ok(t.verdict == ZK_WAIT && t.first == 0 && t.count == 1,
           "a kazoo reader waits for the nearest writer ahead (kazoo's -0000000001)");
        zk_turn(&k, 3, &t);
        ok(t.verdict == ZK_WAIT && t.first == 2 && t.count == 1,
           "a kazoo writer waits for the node just before it");
        zk_turn(&k, 4, &t);
        ok(t.verdict == ZK_WAIT && t.first == 3, "a dlock-layout writer queues behind a kazoo one");
    }
    zk_kids_free(&k);
}

/* ---- against the server -------------------------------------------------- */

/* An acquire on its own thread, with its own client. */
/* Starts w and waits until its node is the nodes-th of the name. */
static void queue(struct waiter *w, zhandle_t *zh, const char *name, dlock_mode mode,
                  uint32_t limit, unsigned wait_ms, int nodes)
{
    double took;
    waiter_start(w, uri, name, mode, limit, wait_ms);
    if (await_nodes(zh, name, nodes, 5000, &took) != nodes)
        diag("%s: still not %d nodes after %.0f ms", name, nodes, took);
}
/*
 * W1 holds; R1, R2 read behind it; W2 writes behind them; R3, R4 read
 * behind W2. W1's release wakes R1 and R2 (granted together), and nobody
 * else: W2 watches R2, R3 and R4 watch W2.
 */
static void test_rw_no_herd(void)
{
    char name[128];
    snprintf(name, sizeof name, "%srw-herd", prefix);
    zhandle_t *zh = raw_open(uri);
    dlock_client *h = open_ok(uri);
    dlock_lock *w1 = take(h, name, DLOCK_MODE_EXCLUSIVE, 0);
    ok(w1 != NULL, "W1 writes");
    struct waiter q[5];
    static const dlock_mode modes[5] = {DLOCK_MODE_SHARED, DLOCK_MODE_SHARED,
                                        DLOCK_MODE_EXCLUSIVE, DLOCK_MODE_SHARED,
                                        DLOCK_MODE_SHARED};
    static const char *const who[5] = {"R1", "R2", "W2", "R3", "R4"};
    for (int i = 0; i < 5; i++)
        queue(&q[i], zh, name, modes[i], 0, 20000, i + 2);
    sleep_ms(SETTLE_MS);
    uint64_t before[5];
    for (int i = 0; i < 5; i++)
        before[i] = dlock_zk_watch_events(q[i].c);
    is_int(dlock_release(w1), 0, "W1 releases");
    ok(returns_within(&q[0], 5000) && returns_within(&q[1], 5000) && held_now(&q[0]) &&
           held_now(&q[1]),
       "R1 and R2 are granted together");
    sleep_ms(SETTLE_MS);
    for (int i = 0; i < 5; i++) {
        uint64_t woke = dlock_zk_watch_events(q[i].c) - before[i];
        if (i < 2)
            ok(woke >= 1, "%s was woken by the release (%llu events)", who[i],
               (unsigned long long)woke);
        else
            ok(woke == 0, "%s was not woken (%llu events)", who[i], (unsigned long long)woke);
    }
    ok(!held_now(&q[2]) && !held_now(&q[3]) && !held_now(&q[4]), "W2, R3, R4 still wait");
    dlock_release(q[0].l);
    q[0].l = NULL;
    dlock_release(q[1].l);
    q[1].l = NULL;
    ok(returns_within(&q[2], 5000) && held_now(&q[2]), "W2 is granted once both readers left");
    dlock_release(q[2].l);
    q[2].l = NULL;
    ok(returns_within(&q[3], 5000) && returns_within(&q[4], 5000) && held_now(&q[3]) &&
           held_now(&q[4]),
       "then R3 and R4 together");
    for (int i = 0; i < 5; i++)
        finish(&q[i]);
    dlock_client_close(h);
    zookeeper_close(zh);
}

/*
 * A semaphore of 2: H1, H2 hold; P1..P4 wait. H1's release admits P1; P2
 * is woken by P1's signal (it becomes the first waiter); P3 and P4 hear
 * nothing. Then H2's release admits P2, and so on, in arrival order.
 */
static void test_sem_no_herd(void)
{
    enum { N = 2, WAITERS = 4 };
    char name[128];
    snprintf(name, sizeof name, "%ssem-herd", prefix);
    zhandle_t *zh = raw_open(uri);
    dlock_client *h1 = open_ok(uri), *h2 = open_ok(uri);
    dlock_lock *l1 = take(h1, name, DLOCK_MODE_EXCLUSIVE, N);
    dlock_lock *l2 = take(h2, name, DLOCK_MODE_EXCLUSIVE, N);
    ok(l1 && l2, "two permits of a semaphore of 2 held");
    struct waiter q[WAITERS];
    for (int i = 0; i < WAITERS; i++)
        queue(&q[i], zh, name, DLOCK_MODE_EXCLUSIVE, N, 20000, N + i + 1);
    sleep_ms(SETTLE_MS);
    uint64_t before[WAITERS], total = 0;
    for (int i = 0; i < WAITERS; i++)
        before[i] = dlock_zk_watch_events(q[i].c);
    is_int(dlock_release(l1), 0, "H1 releases");
    ok(returns_within(&q[0], 5000) && held_now(&q[0]), "P1 (the first waiter) is granted");
    sleep_ms(SETTLE_MS);
    uint64_t woke[WAITERS];
    for (int i = 0; i < WAITERS; i++)
        total += woke[i] = dlock_zk_watch_events(q[i].c) - before[i];
    ok(woke[0] >= 1, "P1 was woken (%llu events)", (unsigned long long)woke[0]);
    ok(woke[1] == 1, "P2 was woken once, to watch the holders (%llu events)",
       (unsigned long long)woke[1]);
    ok(woke[2] == 0 && woke[3] == 0, "P3 and P4 heard nothing (%llu, %llu events)",
       (unsigned long long)woke[2], (unsigned long long)woke[3]);
    ok(total <= 3, "one release, %llu wake-ups in all", (unsigned long long)total);
    ok(!held_now(&q[1]), "P2 still waits");
    is_int(dlock_release(l2), 0, "H2 releases");
    ok(returns_within(&q[1], 5000) && held_now(&q[1]) && !held_now(&q[2]),
       "P2 is granted, P3 still waits");
    dlock_release(q[0].l);
    q[0].l = NULL;
    ok(returns_within(&q[2], 5000) && held_now(&q[2]) && !held_now(&q[3]),
       "P3 is granted at P1's release, P4 still waits");
    dlock_release(q[1].l);
    q[1].l = NULL;
    ok(returns_within(&q[3], 5000) && held_now(&q[3]), "P4 at P2's");
    for (int i = 0; i < WAITERS; i++)
        finish(&q[i]);
    dlock_client_close(h1);
    dlock_client_close(h2);
    zookeeper_close(zh);
}

/* A semaphore of 1: H holds, P1 waits first and gives up, P2 behind it
 * (watching P1) takes over and is granted at H's release. */
static void test_sem_waiter_gives_up(void)
{
    char name[128];
    snprintf(name, sizeof name, "%ssem-gives-up", prefix);
    zhandle_t *zh = raw_open(uri);
    dlock_client *h = open_ok(uri);
    dlock_lock *l = take(h, name, DLOCK_MODE_EXCLUSIVE, 1);
    ok(l != NULL, "H holds the permit of a semaphore of 1");
    struct waiter p1, p2;
    queue(&p1, zh, name, DLOCK_MODE_EXCLUSIVE, 1, 500, 2);
    queue(&p2, zh, name, DLOCK_MODE_EXCLUSIVE, 1, 20000, 3);
    ok(returns_within(&p1, 5000) && p1.rc == DLOCK_ETIMEDOUT, "P1 gives up at its deadline");
    double took;
    is_int(await_nodes(zh, name, 2, 5000, &took), 2, "its node is gone");
    sleep_ms(SETTLE_MS);
    ok(!held_now(&p2), "P2 still waits");
    is_int(dlock_release(l), 0, "H releases");
    ok(returns_within(&p2, 5000) && held_now(&p2), "P2 is granted");
    finish(&p1);
    finish(&p2);
    dlock_client_close(h);
    zookeeper_close(zh);
}

/*
 * The previous release's exclusive node, made by a raw client the way it
 * made it: a reader waits behind it, a permit is refused (the name is a
 * read-write lock). And a reader's node, seen by the previous release's
 * rule (the lowest "-lock-<seq>" holds), is ahead of an old node made
 * after it.
 */
static void test_old_layout(void)
{
    char name[128], parent[256], node[300], made[300];
    snprintf(name, sizeof name, "%sold-layout", prefix);
    snprintf(parent, sizeof parent, "/dlock/%s", name);
    snprintf(node, sizeof node, "%s/0123456789abcdef0123456789abcdef-lock-", parent);
    zhandle_t *zh = raw_open(uri);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    zoo_create(zh, parent, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
    is_int(zoo_create(zh, node, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL, made,
                      sizeof made),
           ZOK, "an old client's exclusive node");
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    o.mode = DLOCK_MODE_SHARED;
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EBUSY, "a reader is excluded by it");
    o.mode = DLOCK_MODE_EXCLUSIVE;
    o.limit = 2;
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EMODE, "a permit is refused");
    ok(strstr(dlock_errmsg(c), "read-write lock") != NULL, "says why: %s", dlock_errmsg(c));
    is_int(zoo_delete(zh, made, -1), ZOK, "the old client releases");

    l = take(c, name, DLOCK_MODE_SHARED, 0);
    ok(l != NULL, "a reader holds");
    is_int(zoo_create(zh, node, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL, made,
                      sizeof made),
           ZOK, "an old client queues");
    struct String_vector sv = {0, NULL};
    int rc = zoo_get_children(zh, parent, 0, &sv);
    long long seq_old = -1, seq_first = -1;
    if (rc == ZOK && sv.count == 2) {
        /* The previous release's rule, kept as zk_lock_seq(): the lowest
         * "-lock-<seq>" holds. */
        for (int i = 0; i < 2; i++) {
            long long s;
            if (zk_lock_seq(sv.data[i], &s) != 0)
                continue;
            if (strstr(made, sv.data[i]))
                seq_old = s;
            else
                seq_first = s;
        }
    }
    ok(seq_first >= 0 && seq_old > seq_first,
       "by the old rule the reader's node holds and the old client waits (%lld < %lld)",
       seq_first, seq_old);
    deallocate_String_vector(&sv);
    dlock_release(l);
    zoo_delete(zh, made, -1);
    dlock_client_close(c);
    zookeeper_close(zh);
}

int main(void)
{
    uri = need_env("DLOCK_ZK_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "zk-modes-%d-", (int)getpid());
    test_rules();
    test_kazoo_rules();
    test_rw_no_herd();
    test_sem_no_herd();
    test_sem_waiter_gives_up();
    test_old_layout();
    return done_testing();
}
