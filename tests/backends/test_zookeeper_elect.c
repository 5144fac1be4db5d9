/*
 * ZooKeeper elections, what the conformance suite cannot reach: a value
 * with NUL bytes and of the largest size, byte for byte; a plain holder of
 * the name (no value, its term read from its node); a leader whose node was
 * deleted by someone else (its proclaim is DLOCK_ELOST and writes nothing);
 * an observer whose connection is cut (the client sets its watches again),
 * and whose session expires (the watch breaks and is opened again on a new
 * session); layout=kazoo refusing elections; and the timing of an
 * observer's notice against a bare create + exists-watch notification
 * (diagnostics only).
 *
 * Environment: DLOCK_ZK_URI (zookeeper://host:port/dlock), DLOCK_STORES_DIR.
 * `test_zookeeper_elect NAME` runs only the cases whose name contains NAME.
 */
#define THREADED 1
#include <zookeeper/zookeeper.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock.h"
#include "dlock_backend.h"
#include "tests/proxy.h"
#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/zk_raw.h"

#define MS 1000000ull

static char prefix[64];
static const char *uri, *only;

static int want(const char *name)
{
    return !only || strstr(name, only) != NULL;
}

/* Waits for the observer to report a state matching held and (if given)
 * value; 1 when it did within ms. */
static int await_report(dlock_observer *o, int held, const char *value, size_t len, unsigned ms,
                        dlock_leader_info *info)
{
    uint64_t end = dlock_monotonic_ns() + ms * MS;
    while (dlock_monotonic_ns() < end) {
        uint64_t left = (end - dlock_monotonic_ns()) / MS;
        if (dlock_observer_next(o, info, (uint32_t)(left ? left : 1)) != 0)
            continue;
        if (info->err == 0 && info->held == held &&
            (!value || (info->value_len == len && memcmp(info->value, value, len) == 0)))
            return 1;
    }
    return 0;
}

static void test_value_bytes(void)
{
    char name[128], big[DLOCK_VALUE_MAX];
    static const char nul[] = "ab\0cd\0";
    dlock_client *c = open_ok(uri), *r = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_leader_info info;
    snprintf(name, sizeof name, "%sbytes", prefix);
    is_int(dlock_campaign(c, name, nul, sizeof nul - 1, NULL, &l), 0, "campaign with NUL bytes");
    is_int(dlock_leader(r, name, &info), 0, "another client reads the leader");
    ok(info.held && info.value_len == sizeof nul - 1 &&
           memcmp(info.value, nul, sizeof nul - 1) == 0,
       "the value is read byte for byte, NULs included (%zu bytes)", info.value_len);
    is_int(info.term == dlock_lock_token(l), 1, "the term is the grant's token (czxid)");
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i % 7 == 0 ? 0 : i);
    is_int(dlock_proclaim(l, big, sizeof big), 0, "proclaim %d bytes", DLOCK_VALUE_MAX);
    is_int(dlock_leader(r, name, &info), 0, "read again");
    ok(info.value_len == sizeof big && memcmp(info.value, big, sizeof big) == 0,
       "the largest value whole (%zu bytes)", info.value_len);
    is_int(dlock_proclaim(l, "", 0), 0, "proclaim an empty value");
    is_int(dlock_leader(r, name, &info), 0, "read again");
    ok(info.held && info.value_len == 0, "held, with an empty value");
    is_int(dlock_resign(l), 0, "resign");
    is_int(dlock_leader(r, name, &info), 0, "read after the resign");
    ok(!info.held && info.value_len == 0, "no leader, no value left over");
    dlock_client_close(c);
    dlock_client_close(r);
}

/* A plain lock of the name, after a leader that published: no value (the
 * last one names the old leader's node), the holder's czxid as term. */
static void test_plain_holder(void)
{
    char name[128];
    dlock_client *c = open_ok(uri), *r = open_ok(uri);
    dlock_lock *l = NULL, *p = NULL;
    dlock_leader_info info;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    snprintf(name, sizeof name, "%splain", prefix);
    is_int(dlock_campaign(c, name, "old", 3, NULL, &l), 0, "a leader publishes");
    is_int(dlock_resign(l), 0, "and resigns");
    is_int(dlock_acquire(c, name, &o, &p), 0, "a plain lock of the name");
    is_int(dlock_leader(r, name, &info), 0, "read the leader");
    ok(info.held && info.value_len == 0, "held, no value (not the last leader's)");
    is_int(info.term == dlock_lock_token(p), 1, "the term is the plain holder's token");
    dlock_release(p);
    dlock_client_close(c);
    dlock_client_close(r);
}

/* Someone deletes the leader's node: its proclaim is refused, and the name
 * node's data (the last published grant and value) is left as it was. */
static void test_node_deleted(void)
{
    char name[128], path[512], data[2048];
    dlock_client *c = open_ok(uri);
    zhandle_t *zh = raw_open(uri);
    dlock_lock *l = NULL;
    struct String_vector sv = {0, NULL};
    snprintf(name, sizeof name, "%sdeleted", prefix);
    is_int(dlock_campaign(c, name, "first", 5, NULL, &l), 0, "campaign");
    snprintf(path, sizeof path, "/dlock/%s", name);
    is_int(zoo_get_children(zh, path, 0, &sv), ZOK, "list the name's node");
    is_int(sv.count, 1, "one node, the leader's");
    if (sv.count == 1) {
        char node[600];
        snprintf(node, sizeof node, "%s/%s", path, sv.data[0]);
        is_int(zoo_delete(zh, node, -1), ZOK, "delete the leader's node");
    }
    deallocate_String_vector(&sv);
    sleep_ms(200);
    int rc = dlock_proclaim(l, "second", 6);
    is_int(rc, DLOCK_ELOST, "the proclaim → DLOCK_ELOST");
    diag("%s", dlock_errmsg(c));
    int len = sizeof data;
    is_int(zoo_get(zh, path, 0, data, &len, NULL), ZOK, "read the name node's data");
    ok(len > 5 && memcmp(data + len - 5, "first", 5) == 0, "still the first value: nothing "
                                                           "written");
    dlock_release(l);
    zookeeper_close(zh);
    dlock_client_close(c);
}

/* The observer's connection cut while a leader starts: reported once the
 * connection is back, and so are the proclaim and resign after it. With
 * expire, the cut outlasts the observer's 2 s session: its watch breaks and
 * is opened again on a new session. */
static void test_watch_cut(struct proxy *p, int expire)
{
    char name[128], puri[512];
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_observer *o = NULL;
    dlock_leader_info info;
    const char *what = expire ? "the session expired" : "the connection cut";
    proxy_uri(p, uri, expire ? "session_timeout=2000" : "session_timeout=10000", puri,
              sizeof puri);
    dlock_client *oc = open_ok(puri);
    snprintf(name, sizeof name, "%scut-%d", prefix, expire);
    is_int(dlock_observe(oc, name, NULL, NULL, &o), 0, "%s: observe through the proxy", what);
    ok(await_report(o, 0, NULL, 0, 3000, &info), "first: no leader");
    proxy_set(p, PROXY_DOWN);
    sleep_ms(expire ? 4000 : 100);
    is_int(dlock_campaign(c, name, "during", 6, NULL, &l), 0, "a leader starts while cut");
    sleep_ms(300);
    proxy_set(p, PROXY_PASS);
    ok(await_report(o, 1, "during", 6, 8000, &info), "reported once the connection is back");
    is_int(dlock_proclaim(l, "after", 5), 0, "proclaim");
    ok(await_report(o, 1, "after", 5, 3000, &info), "the proclaim is reported (watch set again)");
    is_int(dlock_resign(l), 0, "resign");
    ok(await_report(o, 0, NULL, 0, 3000, &info), "the resign is reported");
    dlock_observer_close(o);
    dlock_client_close(oc);
    dlock_client_close(c);
}

static void test_kazoo_refused(void)
{
    char kuri[512], name[128];
    dlock_lock *l = NULL;
    dlock_observer *o = NULL;
    snprintf(kuri, sizeof kuri, "%s?layout=kazoo", uri);
    dlock_client *c = open_ok(kuri);
    snprintf(name, sizeof name, "%skazoo", prefix);
    is_int(dlock_campaign(c, name, "x", 1, NULL, &l), DLOCK_ENOTSUP,
           "layout=kazoo: campaign → DLOCK_ENOTSUP");
    ok(strstr(dlock_errmsg(c), "layout=kazoo") != NULL, "the message names the layout: %s",
       dlock_errmsg(c));
    is_int(dlock_observe(c, name, NULL, NULL, &o), DLOCK_ENOTSUP, "and observe too");
    dlock_client_close(c);
}

/* ---- timing (diagnostics) --------------------------------------------- */

static _Atomic uint64_t fired_ns;

static void raw_fired(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh, (void)state, (void)path, (void)ctx;
    if (type == ZOO_CREATED_EVENT)
        atomic_store(&fired_ns, dlock_monotonic_ns());
}

static void on_report(dlock_observer *o, const dlock_leader_info *info, void *user)
{
    (void)o, (void)info, (void)user;
    atomic_store(&fired_ns, dlock_monotonic_ns());
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#define ROUNDS 40

static uint64_t wait_fired(uint64_t t0)
{
    for (int i = 0; i < 4000 && atomic_load(&fired_ns) < t0; i++)
        usleep(50);
    return atomic_load(&fired_ns) >= t0 ? atomic_load(&fired_ns) - t0 : 0;
}

/* A bare create + exists-watch notification (another session's create to
 * our watcher) against a proclaim to the observer's callback: p50 of
 * ROUNDS each. */
static void test_timing(void)
{
    uint64_t bare[ROUNDS], obs[ROUNDS];
    char name[128], path[256];
    zhandle_t *a = raw_open(uri), *b = raw_open(uri);
    for (int i = 0; i < ROUNDS; i++) {
        struct Stat st;
        snprintf(path, sizeof path, "/dlock/%stiming-%d", prefix, i);
        zoo_wexists(a, path, raw_fired, NULL, &st);
        uint64_t t0 = dlock_monotonic_ns();
        zoo_create(b, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, NULL, 0);
        bare[i] = wait_fired(t0);
        zoo_delete(b, path, -1);
    }
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_observer *o = NULL;
    dlock_leader_info info;
    snprintf(name, sizeof name, "%stiming", prefix);
    is_int(dlock_campaign(c, name, "v", 1, NULL, &l), 0, "timing: a leader");
    is_int(dlock_observe(c, name, on_report, NULL, &o), 0, "timing: an observer");
    await_report(o, 1, "v", 1, 3000, &info);
    sleep_ms(100);
    for (int i = 0; i < ROUNDS; i++) {
        char v[32];
        int n = snprintf(v, sizeof v, "round-%d", i);
        uint64_t t0 = dlock_monotonic_ns();
        dlock_proclaim(l, v, (size_t)n);
        obs[i] = wait_fired(t0);
        await_report(o, 1, v, (size_t)n, 1000, &info);
    }
    qsort(bare, ROUNDS, sizeof *bare, cmp_u64);
    qsort(obs, ROUNDS, sizeof *obs, cmp_u64);
    diag("p50 over %d rounds: bare create -> exists watch %.0f us; proclaim -> observer "
         "callback %.0f us (%.2fx)", ROUNDS, bare[ROUNDS / 2] / 1e3, obs[ROUNDS / 2] / 1e3,
         (double)obs[ROUNDS / 2] / (double)(bare[ROUNDS / 2] ? bare[ROUNDS / 2] : 1));
    ok(obs[ROUNDS / 2] > 0, "every proclaim reached the callback (p50 %.0f us)",
       obs[ROUNDS / 2] / 1e3);
    dlock_observer_close(o);
    dlock_resign(l);
    dlock_client_close(c);
    zookeeper_close(a);
    zookeeper_close(b);
}

int main(int argc, char **argv)
{
    struct proxy p;
    only = argc > 1 ? argv[1] : NULL;
    uri = need_env("DLOCK_ZK_URI");
    need_env("DLOCK_STORES_DIR");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "zk-elect-%d-", (int)getpid());
    dlock_uri *u = NULL;
    char err[256];
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0 ||
        strcmp(dlock_uri_path(u), "/dlock") != 0) {
        printf("Bail out! DLOCK_ZK_URI must be zookeeper://host:port/dlock\n");
        exit(1);
    }
    proxy_start(&p, (int)dlock_uri_port(u, 0));
    dlock_uri_free(u);
    if (want("test_value_bytes"))
        test_value_bytes();
    if (want("test_plain_holder"))
        test_plain_holder();
    if (want("test_node_deleted"))
        test_node_deleted();
    if (want("test_watch_cut"))
        test_watch_cut(&p, 0);
    if (want("test_watch_expired"))
        test_watch_cut(&p, 1);
    if (want("test_kazoo_refused"))
        test_kazoo_refused();
    if (want("test_timing"))
        test_timing();
    proxy_stop(&p);
    return done_testing();
}
