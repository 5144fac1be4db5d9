/*
 * dlock-floor: a store's floor, measured in C as `dlock bench` measures, for
 * bench/peers/run.py's "× the store's round trip" column.
 *
 *   dlock-floor redis-handoff HOST PORT N   bare PUBLISH handoff, N samples
 *   dlock-floor redis-solo HOST PORT N      SET NX PX + compare-and-delete
 *   dlock-floor etcd-put URL USER PASSWORD N  a put on the JSON gateway
 *
 * Prints the p50 in microseconds on one line ("p50 <us> n <count>").
 *
 * redis-handoff: the least a Redis lock with notification can do. Two
 * threads, each with its own connections, pass a key in ping-pong: the
 * waiter has SUBSCRIBEd to the key's channel (confirmed), says it is about
 * to acquire, tries SET NX PX and, refused, reads the next message and
 * tries again; the holder sleeps 1 ms, stamps t0 and runs a Lua
 * compare-and-delete that PUBLISHes; the waiter stamps t1 when its SET
 * succeeds. Sample = t1 - t0 (CLOCK_MONOTONIC), as dlock bench's handoff.
 * etcd-put: one keep-alive HTTP connection, an authenticated client's
 * POST /v3/kv/put of a small value: one raft write and its round trip.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef FLOOR_ETCD
#include <curl/curl.h>
#endif

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void report(uint64_t *ns, size_t n)
{
    qsort(ns, n, sizeof *ns, cmp_u64);
    printf("p50 %.1f n %zu\n", n ? ns[(n - 1) / 2] / 1000.0 : 0.0, n);
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "dlock-floor: %s: %s\n", what, why);
    exit(70);
}

/* ---- Redis ---------------------------------------------------------- */

static const char *host;
static int port;
static const char DEL[] = "if redis.call('get', KEYS[1]) == ARGV[1] then "
                          "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '1');"
                          " return 1 end return 0";

typedef struct side {
    redisContext *cmd, *sub;
    char me[32];
} side;

static redisContext *connect_redis(void)
{
    redisContext *c = redisConnect(host, port);
    if (!c || c->err)
        die("connect", c ? c->errstr : "out of memory");
    return c;
}

static redisReply *call(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r)
        die("command", c->errstr);
    return r;
}

static int try_set(side *s, const char *key)
{
    redisReply *r = call(s->cmd, "SET %s %s PX 30000 NX", key, s->me);
    int ok = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    return ok;
}

static void release(side *s, const char *key, const char *chan)
{
    freeReplyObject(call(s->cmd, "EVAL %s 2 %s %s %s", DEL, key, chan, s->me));
}

static void side_open(side *s, int i, const char *chan)
{
    s->cmd = connect_redis();
    s->sub = connect_redis();
    snprintf(s->me, sizeof s->me, "%d-%llu", i, (unsigned long long)now_ns());
    freeReplyObject(call(s->sub, "SUBSCRIBE %s", chan));  /* the confirmation */
}

/* Blocks until the waiter has the key: tries, then a message, then again. */
static void wait_for(side *s, const char *key)
{
    while (!try_set(s, key)) {
        void *msg;
        if (redisGetReply(s->sub, &msg) != REDIS_OK)
            die("subscriber", s->sub->errstr);
        freeReplyObject(msg);
    }
}

/* Round r: thread r % 2 waits, the other side holds (side 0 first). */
typedef struct pingpong {
    side *s;
    const char *key;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t about;  /* the waiter of this round is about to acquire */
    size_t done;   /* the waiter of this round holds */
    uint64_t t1;
    size_t rounds;
} pingpong;

static pingpong pp = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void set_and_wake(size_t *field, size_t v)
{
    pthread_mutex_lock(&pp.mu);
    *field = v;
    pthread_cond_broadcast(&pp.cv);
    pthread_mutex_unlock(&pp.mu);
}

static void wait_until(const size_t *field, size_t v)
{
    pthread_mutex_lock(&pp.mu);
    while (*field != v)
        pthread_cond_wait(&pp.cv, &pp.mu);
    pthread_mutex_unlock(&pp.mu);
}

static void *waiter(void *arg)
{
    size_t i = (size_t)(intptr_t)arg;
    for (size_t r = 1; r <= pp.rounds; r++) {
        if (r % 2 != i)
            continue;
        wait_until(&pp.done, r - 1);
        set_and_wake(&pp.about, r);
        wait_for(&pp.s[i], pp.key);
        pp.t1 = now_ns();
        set_and_wake(&pp.done, r);
    }
    return NULL;
}

static void redis_handoff(size_t n)
{
    side s[2];
    pthread_t t[2];
    uint64_t *ns = calloc(n, sizeof *ns);
    char key[64], chan[80];
    struct timespec ms1 = { 0, 1000000 };

    snprintf(key, sizeof key, "floor:%llu", (unsigned long long)now_ns());
    snprintf(chan, sizeof chan, "%s:released", key);
    side_open(&s[0], 0, chan);
    side_open(&s[1], 1, chan);
    if (!ns || !try_set(&s[0], key))
        die("first hold", "refused");
    pp.s = s;
    pp.key = key;
    pp.rounds = n;
    pthread_create(&t[0], NULL, waiter, (void *)0);
    pthread_create(&t[1], NULL, waiter, (void *)1);
    for (size_t r = 1; r <= n; r++) {
        side *holder = &s[1 - r % 2];
        wait_until(&pp.about, r);
        nanosleep(&ms1, NULL); /* the waiter is in its SET NX or its read */
        uint64_t t0 = now_ns();
        release(holder, key, chan);
        wait_until(&pp.done, r);
        ns[r - 1] = pp.t1 - t0;
    }
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    release(&s[n % 2], key, chan);
    report(ns, n);
}

static void redis_solo(size_t n)
{
    side s;
    uint64_t *ns = calloc(n, sizeof *ns);
    char key[64], chan[80];
    size_t warm = n / 10 < 5 ? 5 : n / 10;

    snprintf(key, sizeof key, "floor:%llu", (unsigned long long)now_ns());
    snprintf(chan, sizeof chan, "%s:released", key);
    s.cmd = connect_redis();
    snprintf(s.me, sizeof s.me, "solo-%llu", (unsigned long long)now_ns());
    for (size_t i = 0; i < warm + n; i++) {
        uint64_t t = now_ns();
        if (!try_set(&s, key))
            die("uncontended SET NX", "refused");
        release(&s, key, chan);
        if (i >= warm)
            ns[i - warm] = now_ns() - t;
    }
    report(ns, n);
}

/* ---- etcd ----------------------------------------------------------- */

#ifdef FLOOR_ETCD
static size_t collect(char *p, size_t sz, size_t nm, void *buf)
{
    size_t len = strlen(buf), add = sz * nm;
    if (len + add >= 4096)
        add = 4095 - len;
    memcpy((char *)buf + len, p, add);
    ((char *)buf)[len + add] = '\0';
    return sz * nm;
}

static void post(CURL *c, const char *url, const char *path, const char *body, char *out)
{
    char full[512];
    snprintf(full, sizeof full, "%s%s", url, path);
    out[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK)
        die(path, curl_easy_strerror(rc));
}

static void etcd_put(const char *url, const char *user, const char *pw, size_t n)
{
    CURL *c = curl_easy_init();
    char out[4096], body[512], auth[600];
    struct curl_slist *h = NULL;
    uint64_t *ns = calloc(n, sizeof *ns);
    size_t warm = n / 10 < 5 ? 5 : n / 10;

    if (!c || !ns)
        die("init", "out of memory");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    if (user[0]) {
        snprintf(body, sizeof body, "{\"name\":\"%s\",\"password\":\"%s\"}", user, pw);
        post(c, url, "/v3/auth/authenticate", body, out);
        const char *tok = strstr(out, "\"token\":\"");
        if (!tok)
            die("authenticate", out);
        tok += 9;
        snprintf(auth, sizeof auth, "Authorization: %.*s", (int)strcspn(tok, "\""), tok);
        h = curl_slist_append(h, auth);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    /* key "floor-put", value "x" (base64) */
    for (size_t i = 0; i < warm + n; i++) {
        uint64_t t = now_ns();
        post(c, url, "/v3/kv/put", "{\"key\":\"Zmxvb3ItcHV0\",\"value\":\"eA==\"}", out);
        if (!strstr(out, "\"header\""))
            die("put", out);
        if (i >= warm)
            ns[i - warm] = now_ns() - t;
    }
    report(ns, n);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}
#endif

int main(int argc, char **argv)
{
    if (argc == 5 && strncmp(argv[1], "redis-", 6) == 0) {
        host = argv[2];
        port = atoi(argv[3]);
        size_t n = strtoul(argv[4], NULL, 10);
        if (n < 1)
            die("N", "at least 1");
        if (strcmp(argv[1], "redis-handoff") == 0)
            redis_handoff(n);
        else
            redis_solo(n);
        return 0;
    }
#ifdef FLOOR_ETCD
    if (argc == 6 && strcmp(argv[1], "etcd-put") == 0) {
        size_t n = strtoul(argv[5], NULL, 10);
        if (n < 1)
            die("N", "at least 1");
        curl_global_init(CURL_GLOBAL_DEFAULT);
        etcd_put(argv[2], argv[3], argv[4], n);
        return 0;
    }
#endif
    fprintf(stderr, "usage: dlock-floor redis-handoff|redis-solo HOST PORT N\n"
                    "       dlock-floor etcd-put URL USER PASSWORD N\n");
    return 64;
}
