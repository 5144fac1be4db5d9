/*
 * etcd's shared locks and semaphores, where the conformance suite cannot
 * see them (docs/etcd.md, "Shared locks and semaphores"):
 *
 * - the kinds of keys (etcd_key_kind()): today's exclusive key (a lease
 *   id in hex), a reader's ("r<lease id>"), a permit's ("s<limit>-...");
 * - no herd: a release wakes only the waiters it admits, counted in the
 *   watches each client saw end by an event (dlock_etcd_watch_events(),
 *   test-only). A writer's release wakes the readers behind it and nobody
 *   behind the next writer; a permit's release wakes the first waiter
 *   (admitted) and the one behind it (told by the grant's put: it becomes
 *   the first waiter), and nobody further back;
 * - a permit waiter that gives up does not hold back the one behind it;
 * - the previous release's layout: its exclusive key (made here by raw
 *   HTTP calls the way it made it) excludes readers and refuses permits,
 *   and by its rule (every key created before ours must be gone) a
 *   reader's key is ahead of an old key made after it.
 *
 * Environment: DLOCK_ETCD_URI (scripts/stores/start.sh prints it), of the
 * form etcd://[user:password@]host:port/prefix; a missing variable fails.
 */
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/etcd_json.h"
#include "backends/etcd_reply.h"
#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/mode_waiters.h"

/* Test-only (backends/etcd.c): watches of a client's waits ended by an event. */
uint64_t dlock_etcd_watch_events(dlock_client *c);

static char prefix[64];
static const char *uri;

/* ---- the kinds of keys, no server ----------------------------------------- */

static void test_kinds(void)
{
    uint32_t limit = 9;
    is_int(etcd_key_kind("0123456789abcdef", 16, &limit), ETCD_WRITER,
           "today's key (a lease id in hex) is a writer");
    is_int(limit, 0, "of no limit");
    is_int(etcd_key_kind("r0123456789abcdef", 17, &limit), ETCD_READER, "a reader's key");
    is_int(etcd_key_kind("s7-0123456789abcdef", 19, &limit), ETCD_PERMIT, "a permit's key");
    is_int(limit, 7, "of limit 7");
    is_int(etcd_key_kind("s65535-0123456789abcdef", 23, &limit), ETCD_PERMIT, "limit 65535");
    is_int(etcd_key_kind("s65536-0123456789abcdef", 23, &limit), ETCD_WRITER, "not 65536");
    is_int(etcd_key_kind("s0-0123456789abcdef", 19, &limit), ETCD_WRITER, "nor 0");
    is_int(etcd_key_kind("s-0123456789abcdef", 18, &limit), ETCD_WRITER, "nor no limit");
    is_int(etcd_key_kind("s12", 3, &limit), ETCD_WRITER, "nor a limit without its '-'");
}

/* ---- raw calls, as the previous release made them -------------------------- */

static char endpoint[256], user[64], password[128], token[512];

static size_t on_body(char *data, size_t size, size_t n, void *user_)
{
    char **buf = user_;
    size_t len = *buf ? strlen(*buf) : 0, add = size * n;
    char *b = realloc(*buf, len + add + 1);
    if (!b)
        return 0;
    memcpy(b + len, data, add);
    b[len + add] = '\0';
    *buf = b;
    return add;
}

/* POSTs req (put) to path: the reply's JSON (NULL on failure). */
static json_object *raw_call(const char *path, json_object *req)
{
    char url[400], auth[600], *body = NULL;
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = NULL;
    snprintf(url, sizeof url, "http://%s%s", endpoint, path);
    if (token[0]) {
        snprintf(auth, sizeof auth, "Authorization: %s", token);
        hdr = curl_slist_append(hdr, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS,
                     json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    json_object_put(req);
    json_object *root = rc == CURLE_OK && body ? json_tokener_parse(body) : NULL;
    free(body);
    return root;
}

/* The endpoint and credentials of DLOCK_ETCD_URI (no escapes in them). */
static int raw_open(void)
{
    const char *p = strstr(uri, "://"), *at, *slash;
    if (!p)
        return -1;
    p += 3;
    slash = strchr(p, '/');
    at = strchr(p, '@');
    if (at && (!slash || at < slash)) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        snprintf(user, sizeof user, "%.*s", (int)((colon ? colon : at) - p), p);
        if (colon)
            snprintf(password, sizeof password, "%.*s", (int)(at - colon - 1), colon + 1);
        p = at + 1;
    }
    snprintf(endpoint, sizeof endpoint, "%.*s", (int)(slash ? (size_t)(slash - p) : strlen(p)), p);
    if (!user[0])
        return 0;
    json_object *req = json_object_new_object();
    json_object_object_add(req, "name", json_object_new_string(user));
    json_object_object_add(req, "password", json_object_new_string(password));
    json_object *root = raw_call("/v3/auth/authenticate", req);
    json_object *t = etcd_get(root, "token");
    if (t)
        snprintf(token, sizeof token, "%s", json_object_get_string(t));
    json_object_put(root);
    return token[0] ? 0 : -1;
}

static int64_t raw_lease(void)
{
    json_object *req = json_object_new_object();
    json_object_object_add(req, "TTL", etcd_new_int(30));
    json_object *root = raw_call("/v3/lease/grant", req);
    int64_t id = etcd_int(root, "ID");
    json_object_put(root);
    return id;
}

static void raw_revoke(int64_t id)
{
    json_object *req = json_object_new_object();
    json_object_object_add(req, "ID", etcd_new_int(id));
    json_object_put(raw_call("/v3/lease/revoke", req));
}

/* The previous release's key of name: "<prefix>/<name>/<lease id>" with
 * the owner id as its value, on that lease. Its create revision. */
static int64_t raw_key(const char *name, int64_t lease, char *key, size_t klen)
{
    snprintf(key, klen, "/dlock/%s/%016" PRIx64, name, (uint64_t)lease);
    json_object *req = json_object_new_object();
    json_object_object_add(req, "key", etcd_new_bytes(key, strlen(key)));
    json_object_object_add(req, "value", etcd_new_bytes("0123456789abcdef0123456789abcdef", 32));
    json_object_object_add(req, "lease", etcd_new_int(lease));
    json_object *root = raw_call("/v3/kv/put", req);
    int64_t rev = etcd_int(etcd_get(root, "header"), "revision");
    json_object_put(root);
    return rev;
}

/* The previous release's grant rule (its claim): every key of the name
 * created at or after ours. 1: it would hold, 0: it waits, -1: no reply. */
static int raw_old_rule(const char *name, int64_t create)
{
    char dir[256], end[256];
    snprintf(dir, sizeof dir, "/dlock/%s/", name);
    snprintf(end, sizeof end, "%s", dir);
    end[strlen(end) - 1]++;
    json_object *req = json_object_new_object(), *cmps = json_object_new_array();
    json_object *c = json_object_new_object();
    json_object_object_add(c, "key", etcd_new_bytes(dir, strlen(dir)));
    json_object_object_add(c, "range_end", etcd_new_bytes(end, strlen(end)));
    json_object_object_add(c, "target", json_object_new_string("CREATE"));
    json_object_object_add(c, "result", json_object_new_string("GREATER"));
    json_object_object_add(c, "create_revision", etcd_new_int(create - 1));
    json_object_array_add(cmps, c);
    json_object_object_add(req, "compare", cmps);
    json_object *root = raw_call("/v3/kv/txn", req);
    int r = !root || !etcd_get(root, "header") ? -1
            : json_object_get_boolean(etcd_get(root, "succeeded"));
    json_object_put(root);
    return r;
}

/* ---- waiters in threads ------------------------------------------------------ */

/* How many keys name has (holders and waiters), as inspect reads them. */
static int keys_of(dlock_client *c, const char *name)
{
    dlock_info info;
    dlock_holder h[8];
    size_t n = 0;
    if (dlock_inspect(c, name, &info) != 0 || dlock_inspect_holders(c, name, h, 8, &n) != 0)
        return -1;
    return (int)n + (int)info.waiters;
}

/* Starts w and waits until name has `keys` keys (its own the newest). */
static void queue(struct waiter *w, dlock_client *look, const char *name, dlock_mode mode,
                  uint32_t limit, unsigned wait_ms, int keys)
{
    waiter_start(w, uri, name, mode, limit, wait_ms);
    int n = -1;
    for (int i = 0; i < 1000 && (n = keys_of(look, name)) < keys; i++)
        sleep_ms(5);
    if (n != keys)
        diag("%s: %d keys, not %d", name, n, keys);
}

/*
 * W1 holds; R1, R2 read behind it; W2 writes behind them; R3, R4 read
 * behind W2. W1's release wakes R1 and R2 (granted together), and nobody
 * else: W2 watches R2 for its deletion only, R3 and R4 watch W2.
 */
static void test_rw_no_herd(void)
{
    char name[128];
    snprintf(name, sizeof name, "%srw-herd", prefix);
    dlock_client *h = open_ok(uri);
    dlock_lock *w1 = take(h, name, DLOCK_MODE_EXCLUSIVE, 0);
    ok(w1 != NULL, "W1 writes");
    struct waiter q[5];
    static const dlock_mode modes[5] = {DLOCK_MODE_SHARED, DLOCK_MODE_SHARED,
                                        DLOCK_MODE_EXCLUSIVE, DLOCK_MODE_SHARED,
                                        DLOCK_MODE_SHARED};
    static const char *const who[5] = {"R1", "R2", "W2", "R3", "R4"};
    for (int i = 0; i < 5; i++)
        queue(&q[i], h, name, modes[i], 0, 20000, i + 2);
    sleep_ms(SETTLE_MS);
    uint64_t before[5];
    for (int i = 0; i < 5; i++)
        before[i] = dlock_etcd_watch_events(q[i].c);
    is_int(dlock_release(w1), 0, "W1 releases");
    ok(returns_within(&q[0], 5000) && returns_within(&q[1], 5000) && held_now(&q[0]) &&
           held_now(&q[1]),
       "R1 and R2 are granted together");
    sleep_ms(SETTLE_MS);
    for (int i = 0; i < 5; i++) {
        uint64_t woke = dlock_etcd_watch_events(q[i].c) - before[i];
        if (i < 2)
            ok(woke == 1, "%s was woken by the release (%llu events)", who[i],
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
    ok(!held_now(&q[3]) && !held_now(&q[4]), "R3 and R4 wait behind W2");
    dlock_release(q[2].l);
    q[2].l = NULL;
    ok(returns_within(&q[3], 5000) && returns_within(&q[4], 5000) && held_now(&q[3]) &&
           held_now(&q[4]),
       "then R3 and R4 together");
    for (int i = 0; i < 5; i++)
        finish(&q[i]);
    dlock_client_close(h);
}

/*
 * A semaphore of 2: H1, H2 hold; P1..P4 wait. H1's release admits P1 (the
 * first waiter, which watches the keys ahead); P2 is woken by P1's grant
 * (a put of its key: P2 becomes the first waiter); P3 and P4 hear nothing.
 * Then H2's release admits P2, and so on, in arrival order.
 */
static void test_sem_no_herd(void)
{
    enum { N = 2, WAITERS = 4 };
    char name[128];
    snprintf(name, sizeof name, "%ssem-herd", prefix);
    dlock_client *h1 = open_ok(uri), *h2 = open_ok(uri);
    dlock_lock *l1 = take(h1, name, DLOCK_MODE_EXCLUSIVE, N);
    dlock_lock *l2 = take(h2, name, DLOCK_MODE_EXCLUSIVE, N);
    ok(l1 && l2, "two permits of a semaphore of 2 held");
    struct waiter q[WAITERS];
    for (int i = 0; i < WAITERS; i++)
        queue(&q[i], h1, name, DLOCK_MODE_EXCLUSIVE, N, 20000, N + i + 1);
    sleep_ms(SETTLE_MS);
    uint64_t before[WAITERS], woke[WAITERS], total = 0;
    for (int i = 0; i < WAITERS; i++)
        before[i] = dlock_etcd_watch_events(q[i].c);
    is_int(dlock_release(l1), 0, "H1 releases");
    ok(returns_within(&q[0], 5000) && held_now(&q[0]), "P1 (the first waiter) is granted");
    sleep_ms(SETTLE_MS);
    for (int i = 0; i < WAITERS; i++)
        total += woke[i] = dlock_etcd_watch_events(q[i].c) - before[i];
    ok(woke[0] == 1, "P1 was woken (%llu events)", (unsigned long long)woke[0]);
    ok(woke[1] == 1, "P2 was woken once, to watch the holders (%llu events)",
       (unsigned long long)woke[1]);
    ok(woke[2] == 0 && woke[3] == 0, "P3 and P4 heard nothing (%llu, %llu events)",
       (unsigned long long)woke[2], (unsigned long long)woke[3]);
    ok(total <= 2, "one release, %llu wake-ups in all", (unsigned long long)total);
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
}

/* A semaphore of 1: H holds, P1 waits first and gives up, P2 behind it
 * (watching P1) takes over and is granted at H's release. */
static void test_sem_waiter_gives_up(void)
{
    char name[128];
    snprintf(name, sizeof name, "%ssem-gives-up", prefix);
    dlock_client *h = open_ok(uri);
    dlock_lock *l = take(h, name, DLOCK_MODE_EXCLUSIVE, 1);
    ok(l != NULL, "H holds the permit of a semaphore of 1");
    struct waiter p1, p2;
    queue(&p1, h, name, DLOCK_MODE_EXCLUSIVE, 1, 800, 2);
    queue(&p2, h, name, DLOCK_MODE_EXCLUSIVE, 1, 20000, 3);
    ok(returns_within(&p1, 5000) && p1.rc == DLOCK_ETIMEDOUT, "P1 gives up at its deadline");
    is_int(keys_of(h, name), 2, "its key is gone");
    sleep_ms(SETTLE_MS);
    ok(!held_now(&p2), "P2 still waits");
    is_int(dlock_release(l), 0, "H releases");
    ok(returns_within(&p2, 5000) && held_now(&p2), "P2 is granted");
    finish(&p1);
    finish(&p2);
    dlock_client_close(h);
}

/*
 * The previous release's exclusive key, made by raw calls the way it made
 * it: a reader is excluded by it, a permit refused (the name is a
 * read-write lock), inspect lists it. And by the previous release's grant
 * rule, a reader's key is ahead of an old key made after it.
 */
static void test_old_layout(void)
{
    char name[128], key[300];
    snprintf(name, sizeof name, "%sold-layout", prefix);
    ok(raw_open() == 0, "raw calls to %s", endpoint);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    int64_t lease = raw_lease();
    int64_t create = raw_key(name, lease, key, sizeof key);
    ok(lease > 0 && create > 0, "an old client's exclusive key %s", key);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    o.mode = DLOCK_MODE_SHARED;
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EBUSY, "a reader is excluded by it");
    o.mode = DLOCK_MODE_EXCLUSIVE;
    o.limit = 2;
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EMODE, "a permit is refused");
    ok(strstr(dlock_errmsg(c), "read-write lock") != NULL, "says why: %s", dlock_errmsg(c));
    dlock_holder hs[4];
    size_t n = 0;
    is_int(dlock_inspect_holders(c, name, hs, 4, &n), 0, "inspect_holders");
    ok(n == 1 && hs[0].mode == DLOCK_MODE_EXCLUSIVE && hs[0].limit == 0 &&
           hs[0].token == (uint64_t)create &&
           strcmp(hs[0].owner, "0123456789abcdef0123456789abcdef") == 0,
       "lists the old client as the one exclusive holder");
    raw_revoke(lease);

    l = take(c, name, DLOCK_MODE_SHARED, 0);
    ok(l != NULL, "a reader holds");
    lease = raw_lease();
    create = raw_key(name, lease, key, sizeof key);
    is_int(raw_old_rule(name, create), 0, "by the old rule an old client queued after it waits");
    dlock_release(l);
    is_int(raw_old_rule(name, create), 1, "and holds once the reader left (the control)");
    raw_revoke(lease);
    dlock_client_close(c);
}

int main(void)
{
    uri = need_env("DLOCK_ETCD_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(prefix, sizeof prefix, "etcd-modes-%d-", (int)getpid());
    test_kinds();
    test_rw_no_herd();
    test_sem_no_herd();
    test_sem_waiter_gives_up();
    test_old_layout();
    curl_global_cleanup();
    return done_testing();
}
