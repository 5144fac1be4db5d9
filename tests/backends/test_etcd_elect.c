/*
 * etcd's elections where the conformance suite cannot see them
 * (docs/etcd.md, "Elections"):
 *
 * - a value with NUL bytes comes back whole, and a proclaim replaces it;
 * - a renew with another TTL (a new lease) keeps the value;
 * - a plain holder of the name (no value) leads with none, and an earlier
 *   leader's value is not read as the next one's;
 * - the value key sits beside the queue: a waiter still counts as one
 *   waiter (the value key is no contender, for etcdctl lock either);
 * - the watch: an idle one is not readable; a publish, a release and a
 *   grant make it readable; a cut connection is an error of watch_read;
 * - layout=etcd3 refuses elections, naming the layout.
 *
 * Environment: DLOCK_ETCD_URI (scripts/stores/start.sh prints it).
 */
#include <curl/curl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"
#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"

static char prefix[64];
static const char *uri;

static void test_value(void)
{
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_leader_info li;
    char name[96];
    static const char v1[] = "addr\0with\0nul", v2[] = "\0";
    snprintf(name, sizeof name, "%svalue", prefix);
    is_int(dlock_campaign(a, name, v1, sizeof v1 - 1, NULL, &l), 0, "campaign");
    is_int(dlock_leader(b, name, &li), 0, "leader");
    ok(li.held && li.term == dlock_lock_token(l), "the leader and its term");
    ok(li.value_len == sizeof v1 - 1 && memcmp(li.value, v1, sizeof v1 - 1) == 0,
       "a value with NUL bytes comes back whole (%zu bytes)", li.value_len);
    ok(li.known & DLOCK_KNOWS_LEASE && li.lease_ms > 0, "with the lease left");
    is_int(dlock_proclaim(l, v2, 1), 0, "proclaim");
    is_int(dlock_leader(b, name, &li), 0, "leader again");
    ok(li.value_len == 1 && li.value[0] == '\0', "the new value (one NUL byte)");
    char big[DLOCK_VALUE_MAX];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(255 - i % 256);
    is_int(dlock_proclaim(l, big, sizeof big), 0, "proclaim the largest value");
    is_int(dlock_leader(b, name, &li), 0, "leader again");
    ok(li.value_len == sizeof big && memcmp(li.value, big, sizeof big) == 0,
       "%d bytes come back whole", DLOCK_VALUE_MAX);
    is_int(dlock_proclaim(l, "", 0), 0, "proclaim an empty value");
    is_int(dlock_leader(b, name, &li), 0, "leader again");
    ok(li.held && li.value_len == 0, "an empty value");
    /* A renew with another TTL moves the key to a new lease: the value
     * goes with it (the old lease is revoked). */
    is_int(dlock_proclaim(l, "kept", 4), 0, "proclaim");
    is_int(dlock_renew(l, 7000), 0, "renew with another TTL (a new lease)");
    is_int(dlock_leader(b, name, &li), 0, "leader after the renew");
    ok(li.held && li.value_len == 4 && memcmp(li.value, "kept", 4) == 0,
       "the value moved with the key (%zu bytes)", li.value_len);
    ok(li.lease_ms > 5000, "on the new lease (%llu ms left)", (unsigned long long)li.lease_ms);
    is_int(dlock_resign(l), 0, "resign");
    is_int(dlock_leader(b, name, &li), 0, "leader after resign");
    ok(!li.held && li.value_len == 0, "nobody leads, no value");

    /* A plain holder after a leader: the earlier value is not its. */
    is_int(dlock_campaign(a, name, "old", 3, NULL, &l), 0, "campaign again");
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 0);
    dlock_lock *p = NULL;
    dlock_release(l);
    is_int(dlock_acquire(b, name, &o, &p), 0, "a plain holder after the leader's release");
    is_int(dlock_leader(a, name, &li), 0, "leader");
    ok(li.held && li.term == dlock_lock_token(p) && li.value_len == 0,
       "the plain holder leads with no value (%zu bytes)", li.value_len);
    dlock_release(p);
    dlock_client_close(a);
    dlock_client_close(b);
}

static void test_beside_queue(void)
{
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_info in;
    char name[96];
    snprintf(name, sizeof name, "%sbeside", prefix);
    is_int(dlock_campaign(a, name, "v", 1, NULL, &l), 0, "campaign");
    memset(&in, 0, sizeof in);
    is_int(dlock_inspect(b, name, &in), 0, "inspect");
    ok(in.held && in.waiters == 0 && in.token == dlock_lock_token(l),
       "the value key is no key of the queue (waiters %llu)", (unsigned long long)in.waiters);
    dlock_resign(l);
    dlock_client_close(a);
    dlock_client_close(b);
}

static int readable(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, ms) == 1;
}

static void test_watch(void)
{
    dlock_client *a = open_ok(uri), *o = open_ok(uri);
    dlock_watch *w = NULL;
    dlock_lock *l = NULL;
    char name[96];
    snprintf(name, sizeof name, "%swatch", prefix);
    const dlock_backend *be = o->backend;
    is_int(be->watch_open(o->conn, name, strlen(name), &w), 0, "watch_open %s", dlock_errmsg(o));
    if (!w)
        return;
    int fd = be->watch_fd(w);
    ok(fd >= 0, "a descriptor");
    ok(!readable(fd, 300), "idle: not readable");
    is_int(dlock_campaign(a, name, "x", 1, NULL, &l), 0, "campaign (a grant and a publish)");
    ok(readable(fd, 2000), "readable after the grant");
    is_int(be->watch_read(w), 0, "watch_read");
    sleep_ms(100);
    if (readable(fd, 0))
        be->watch_read(w);
    ok(!readable(fd, 200), "not readable once read");
    is_int(dlock_proclaim(l, "y", 1), 0, "proclaim");
    ok(readable(fd, 2000), "readable after a publish");
    is_int(be->watch_read(w), 0, "watch_read");
    is_int(dlock_resign(l), 0, "resign");
    ok(readable(fd, 2000), "readable after the release");
    is_int(be->watch_read(w), 0, "watch_read");
    /* A cut connection: readable, and watch_read says broken. */
    shutdown(fd, SHUT_RDWR);
    ok(readable(fd, 2000), "a cut connection is readable");
    ok(be->watch_read(w) != 0, "and watch_read fails: %s", dlock_errmsg(o));
    be->watch_close(w);
    dlock_client_close(a);
    dlock_client_close(o);
}

static void test_etcd3(void)
{
    char u[1024];
    snprintf(u, sizeof u, "%s%slayout=etcd3", uri, strchr(uri, '?') ? "&" : "?");
    dlock_client *c = open_ok(u);
    dlock_lock *l = NULL;
    dlock_leader_info li;
    char name[96];
    snprintf(name, sizeof name, "%setcd3", prefix);
    is_int(dlock_campaign(c, name, "v", 1, NULL, &l), DLOCK_ENOTSUP, "layout=etcd3: ENOTSUP");
    ok(strstr(dlock_errmsg(c), "layout=etcd3") != NULL, "naming the layout: %s",
       dlock_errmsg(c));
    is_int(dlock_leader(c, name, &li), DLOCK_ENOTSUP, "leader() too");
    dlock_client_close(c);
}

int main(void)
{
    uri = need_env("DLOCK_ETCD_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(prefix, sizeof prefix, "etcd-elect-%d-", (int)getpid());
    test_value();
    test_beside_queue();
    test_watch();
    test_etcd3();
    curl_global_cleanup();
    return done_testing();
}
