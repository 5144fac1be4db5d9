/*
 * Redis elections, the cases the conformance suite cannot reach: a value
 * with NUL bytes, a plain holder (no value) and an old leader's value not
 * shown for it, a publish refused once the lock key is gone (nothing
 * written), the watch's subscriber connection killed (the observer opens
 * another and is still told), an idle observer sending nothing, Redlock
 * with one instance's value key lost, and layout=plain refusing elections.
 *
 * Environment (scripts/stores/start.sh prints it): DLOCK_REDIS_URI,
 * DLOCK_REDLOCK_URI (a missing one fails the run); DLOCK_REDIS_CLUSTER_URI
 * and DLOCK_REDIS_SENTINEL_URI add their cases when set.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/redis_test.h"

static char prefix[64];

struct seen {
    pthread_mutex_t mu;
    char want[64];
    int hit;
};

static void on_change(dlock_observer *o, const dlock_leader_info *li, void *user)
{
    struct seen *s = user;
    (void)o;
    pthread_mutex_lock(&s->mu);
    if (li->held && li->value_len == strlen(s->want) && memcmp(li->value, s->want, li->value_len) == 0)
        s->hit = 1;
    pthread_mutex_unlock(&s->mu);
}

static void expect(struct seen *s, const char *v)
{
    pthread_mutex_lock(&s->mu);
    snprintf(s->want, sizeof s->want, "%s", v);
    s->hit = 0;
    pthread_mutex_unlock(&s->mu);
}

/* Whether the observer was told within ms. */
static int told(struct seen *s, unsigned ms)
{
    uint64_t until = dlock_monotonic_ns() + ms * 1000000ull;
    while (dlock_monotonic_ns() < until) {
        pthread_mutex_lock(&s->mu);
        int hit = s->hit;
        pthread_mutex_unlock(&s->mu);
        if (hit)
            return 1;
        sleep_ms(2);
    }
    return 0;
}

static void test_values(const char *what, const char *uri)
{
    char name[128];
    snprintf(name, sizeof name, "%svalues", prefix);
    dlock_client *c = open_ok(uri), *r = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_leader_info li;
    is_int(dlock_campaign(c, name, "a\0b\0", 4, NULL, &l), 0, "%s: campaign", what);
    is_int(dlock_leader(r, name, &li), 0, "%s: leader", what);
    ok(li.held && li.value_len == 4 && memcmp(li.value, "a\0b\0", 4) == 0 &&
           li.term == dlock_lock_token(l),
       "%s: the value with NUL bytes, and the term (%zu bytes)", what, li.value_len);
    is_int(dlock_proclaim(l, "", 0), 0, "%s: proclaim an empty value", what);
    is_int(dlock_leader(r, name, &li), 0, "%s: leader", what);
    ok(li.held && li.value_len == 0, "%s: the empty value", what);
    char big[DLOCK_VALUE_MAX];
    memset(big, 0xff, sizeof big);
    is_int(dlock_proclaim(l, big, sizeof big), 0, "%s: proclaim 1 KiB", what);
    is_int(dlock_leader(r, name, &li), 0, "%s: leader", what);
    ok(li.value_len == sizeof big && memcmp(li.value, big, sizeof big) == 0, "%s: 1 KiB back",
       what);
    is_int(dlock_resign(l), 0, "%s: resign", what);
    is_int(dlock_leader(r, name, &li), 0, "%s: leader after the resign", what);
    ok(!li.held && li.value_len == 0, "%s: no leader, no value", what);

    /* A plain holder of the name: held, no value (the old leader's is
     * not its own). */
    dlock_lock *p = NULL;
    is_int(dlock_acquire(c, name, NULL, &p), 0, "%s: a plain acquire of the name", what);
    is_int(dlock_leader(r, name, &li), 0, "%s: leader", what);
    ok(li.held && li.value_len == 0 && li.term == dlock_lock_token(p),
       "%s: a plain holder leads with no value (the last leader's is not shown)", what);
    is_int(dlock_release(p), 0, "%s: release", what);
    dlock_client_close(c);
    dlock_client_close(r);
}

/* The lock key deleted under the leader: the publish is refused, nothing
 * written. */
static void test_publish_lost(const char *uri)
{
    char name[128], key[192];
    snprintf(name, sizeof name, "%slost", prefix);
    snprintf(key, sizeof key, "dlock:%s:lock", name);
    dlock_client *c = open_ok(uri), *r = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_leader_info li;
    is_int(dlock_campaign(c, name, "first", 5, NULL, &l), 0, "lost: campaign");
    redisContext *ctx = raw(uri, 0);
    freeReplyObject(redisCommand(ctx, "DEL %s", key));
    is_int(dlock_proclaim(l, "second", 6), DLOCK_ELOST, "lost: proclaim refused (%s)",
           dlock_errmsg(c));
    snprintf(key, sizeof key, "dlock:%s:leader", name);
    redisReply *v = redisCommand(ctx, "GET %s", key);
    ok(v && v->type == REDIS_REPLY_STRING && v->len == 48 + 5 && memcmp(v->str + 48, "first", 5) == 0,
       "lost: the value key still holds the first value");
    if (v)
        freeReplyObject(v);
    is_int(dlock_leader(r, name, &li), 0, "lost: leader");
    ok(!li.held && li.value_len == 0, "lost: no leader");
    dlock_resign(l);
    redisFree(ctx);
    dlock_client_close(c);
    dlock_client_close(r);
}

/* CLIENT KILL TYPE pubsub on ctx's node (freed here), and on a Cluster on
 * every node it knows: the shard's primary may not be a node the URI
 * names (a failover, e.g. by the faults suite on the same Cluster). */
static long long kill_pubsub(redisContext *ctx, const char *uri)
{
    int cluster = strncmp(uri, "redis+cluster:", 14) == 0;
    dlock_uri *u = NULL;
    char err[256];
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0)
        return 0;
    long long killed = 0;
    redisReply *k = redisCommand(ctx, "CLIENT KILL TYPE pubsub");
    killed += k && k->type == REDIS_REPLY_INTEGER ? k->integer : 0;
    if (k)
        freeReplyObject(k);
    redisReply *n = cluster ? redisCommand(ctx, "CLUSTER NODES") : NULL;
    for (char *line = n && n->type == REDIS_REPLY_STRING ? n->str : NULL; line && *line;) {
        char host[64];
        int port;
        /* "<id> <ip>:<port>@<cport> <flags> ...": every node but myself */
        if (sscanf(line, "%*s %63[^:]:%d@", host, &port) == 2 && !strstr(line, "myself") &&
            !strstr(line, "fail")) {
            redisContext *o = redisConnect(host, port);
            if (o && !o->err && dlock_uri_password(u)) {
                redisReply *a = redisCommand(o, "AUTH %s", dlock_uri_password(u));
                if (a)
                    freeReplyObject(a);
            }
            redisReply *ko = o && !o->err ? redisCommand(o, "CLIENT KILL TYPE pubsub") : NULL;
            killed += ko && ko->type == REDIS_REPLY_INTEGER ? ko->integer : 0;
            if (ko)
                freeReplyObject(ko);
            if (o)
                redisFree(o);
        }
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    if (n)
        freeReplyObject(n);
    redisFree(ctx);
    dlock_uri_free(u);
    return killed;
}

/* The observer's subscriber connection killed: it is told of the next
 * change all the same (the watch is opened again); idle, it reads nothing. */
static void test_watch_cut(const char *what, const char *uri, size_t nodes)
{
    char name[128];
    snprintf(name, sizeof name, "%swatch-cut", prefix);
    dlock_client *c = open_ok(uri), *r = open_ok(uri);
    dlock_lock *l = NULL;
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    dlock_observer *o = NULL;
    is_int(dlock_campaign(c, name, "one", 3, NULL, &l), 0, "%s: campaign", what);
    expect(&s, "one");
    is_int(dlock_observe(r, name, on_change, &s, &o), 0, "%s: observe", what);
    ok(told(&s, 2000), "%s: the first leader told", what);
    sleep_ms(200);
    uint64_t reads = dlock_observer_reads(o);
    sleep_ms(1000);
    is_int((int)(dlock_observer_reads(o) - reads), 0, "%s: an idle observer reads nothing in 1 s",
           what);
    expect(&s, "two");
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_proclaim(l, "two", 3), 0, "%s: proclaim", what);
    ok(told(&s, 1000), "%s: told of the proclaim in %.1f ms", what, since_ms(t0));
    if (!nodes) /* no cut (Sentinel: the URI names the sentinels) */
        goto next;
    long long killed = 0;
    for (size_t i = 0; i < nodes; i++)
        killed += kill_pubsub(raw(uri, i), uri);
    ok(killed >= 1, "%s: %lld subscriber connections killed", what, killed);
    sleep_ms(300);
    expect(&s, "three");
    t0 = dlock_monotonic_ns();
    is_int(dlock_proclaim(l, "three", 5), 0, "%s: proclaim after the cut", what);
    ok(told(&s, 1000), "%s: told after the cut in %.1f ms", what, since_ms(t0));
next:
    expect(&s, "four");
    dlock_lock *l2 = NULL;
    is_int(dlock_resign(l), 0, "%s: resign", what);
    is_int(dlock_campaign(c, name, "four", 4, NULL, &l2), 0, "%s: campaign again", what);
    ok(told(&s, 1000), "%s: the next leader told", what);
    dlock_resign(l2);
    dlock_observer_close(o);
    dlock_client_close(c);
    dlock_client_close(r);
}

/* Redlock: one instance's value key lost; the others' agree. */
static void test_redlock_value(const char *uri)
{
    char name[128], key[192];
    snprintf(name, sizeof name, "%sredlock-value", prefix);
    snprintf(key, sizeof key, "dlock:%s:leader", name);
    dlock_client *c = open_ok(uri), *r = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_leader_info li;
    is_int(dlock_campaign(c, name, "v1", 2, NULL, &l), 0, "redlock: campaign");
    is_int(dlock_proclaim(l, "v2", 2), 0, "redlock: proclaim");
    redisContext *ctx = raw(uri, 0);
    freeReplyObject(redisCommand(ctx, "DEL %s", key));
    redisFree(ctx);
    is_int(dlock_leader(r, name, &li), 0, "redlock: leader");
    ok(li.held && li.value_len == 2 && memcmp(li.value, "v2", 2) == 0,
       "redlock: the newest value from the other instances");
    dlock_resign(l);
    dlock_client_close(c);
    dlock_client_close(r);
}

static void test_plain_refuses(const char *uri)
{
    char u[512], name[128];
    snprintf(u, sizeof u, "%s%slayout=plain", uri, strchr(uri, '?') ? "&" : "?");
    snprintf(name, sizeof name, "%splain", prefix);
    dlock_client *c = open_ok(u);
    dlock_lock *l = NULL;
    is_int(dlock_campaign(c, name, "x", 1, NULL, &l), DLOCK_ENOTSUP, "layout=plain: campaign refused");
    ok(strstr(dlock_errmsg(c), "layout=plain") != NULL, "layout=plain: the message names it (%s)",
       dlock_errmsg(c));
    dlock_client_close(c);
}

int main(void)
{
    const char *single = need_env("DLOCK_REDIS_URI");
    const char *redlock = need_env("DLOCK_REDLOCK_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "redis-elect-%d-%llu/", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() % 1000000007ull));
    test_values("redis", single);
    test_values("redlock", redlock);
    test_publish_lost(single);
    test_watch_cut("redis", single, 1);
    test_watch_cut("redlock", redlock, 5);
    test_redlock_value(redlock);
    test_plain_refuses(single);
    /* Cluster (SSUBSCRIBE on the slot's owner, the seeds' subscribers
     * killed) and Sentinel (the primary), when their stores run. */
    const char *cluster = getenv("DLOCK_REDIS_CLUSTER_URI");
    const char *sentinel = getenv("DLOCK_REDIS_SENTINEL_URI");
    if (cluster && *cluster) {
        test_values("cluster", cluster);
        test_watch_cut("cluster", cluster, 3);
    }
    if (sentinel && *sentinel) {
        test_values("sentinel", sentinel);
        test_watch_cut("sentinel", sentinel, 0);
    }
    return done_testing();
}
