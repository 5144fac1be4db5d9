/*
 * ZooKeeper-only cases, against real servers: the protected create (a
 * connection cut after the server made our node), a timed-out waiter
 * leaving no node (connected, and disconnected), what a holder sees while
 * its connection is suspended and after its session expired, digest
 * authentication, options, and the ensemble's leader killed while a lock
 * is held and waited on.
 *
 * Faults on the single node go through a small TCP proxy in this process
 * (cut a connection after a request, or refuse every connection); the
 * leader is killed with scripts/stores/zk-node.sh and always started again.
 *
 * Environment (scripts/stores/start.sh prints it):
 *   DLOCK_ZK_URI, DLOCK_ZK_ENSEMBLE_URI
 * A missing variable fails the run: these cases never skip silently.
 */
#define THREADED 1
#include <zookeeper/zookeeper.h>

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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
#include "tests/proxy.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull

static char prefix[64]; /* per-run name prefix */
static const char *single_uri, *ensemble_uri;





/* ---- looking behind the library: a raw client ---------------------------- */

/* "h1:p1,h2:p2" of a zookeeper:// URI. */
static void hosts_of(const char *uri, char *out, size_t len)
{
    dlock_uri *u = NULL;
    char err[256];
    size_t o = 0;
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0) {
        printf("Bail out! bad URI %s: %s\n", uri, err);
        exit(1);
    }
    out[0] = '\0';
    for (size_t i = 0; i < dlock_uri_host_count(u); i++)
        o += (size_t)snprintf(out + o, len - o, "%s%s:%u", i ? "," : "", dlock_uri_host(u, i),
                              dlock_uri_port(u, i) ? dlock_uri_port(u, i) : 2181);
    dlock_uri_free(u);
}

static void raw_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static void raw_log(const char *msg)
{
    (void)msg;
}

static zhandle_t *raw_open(const char *uri)
{
    char hosts[512];
    hosts_of(uri, hosts, sizeof hosts);
    zhandle_t *zh = zookeeper_init2(hosts, raw_watcher, 10000, NULL, NULL, 0, raw_log);
    if (zh) /* no resolver calls on the I/O thread: the tests fork (see zookeeper.c) */
        zoo_set_servers_resolution_delay(zh, -1);
    for (int i = 0; zh && i < 100 && zoo_state(zh) != ZOO_CONNECTED_STATE; i++)
        sleep_ms(50);
    if (!zh || zoo_state(zh) != ZOO_CONNECTED_STATE) {
        printf("Bail out! raw ZooKeeper client cannot connect to %s\n", hosts);
        exit(1);
    }
    return zh;
}

/* Lock children of a name (the test's names need no encoding); a parent
 * that does not exist (yet, or any more) has none. */
static int count_nodes(zhandle_t *zh, const char *root, const char *name)
{
    char path[512];
    struct String_vector sv = {0, NULL};
    snprintf(path, sizeof path, "%s/%s", root, name);
    int rc = zoo_get_children(zh, path, 0, &sv);
    if (rc == ZNONODE)
        return 0;
    if (rc != ZOK)
        return -1;
    int n = sv.count;
    deallocate_String_vector(&sv);
    return n;
}

/* ---- cases ------------------------------------------------------------- */

static void test_options(void)
{
    dlock_client *c = NULL;
    is_int(dlock_client_open("zookeeper://127.0.0.1:2181/dlock?chroot=/x", &c), DLOCK_EBADURI,
           "unknown option rejected");
    ok(strstr(dlock_errmsg(c), "chroot") != NULL, "the message names it: %s", dlock_errmsg(c));
    dlock_client_close(c);
    c = NULL;
    is_int(dlock_client_open("zookeeper://127.0.0.1:2181/dlock?session_timeout=soon", &c),
           DLOCK_EBADURI, "malformed session_timeout rejected");
    dlock_client_close(c);
    c = NULL;
    is_int(dlock_client_open("zookeeper://127.0.0.1:2181/", &c), DLOCK_EBADURI,
           "root / refused (the server's /zookeeper lives there)");
    dlock_client_close(c);
    c = NULL;
    is_int(dlock_client_open("zookeeper://127.0.0.1:2181/a/../b", &c), DLOCK_EBADURI,
           "a .. component in the root refused");
    dlock_client_close(c);
}

static void test_ping_and_token(const char *uri)
{
    dlock_client *c = open_ok(uri);
    zhandle_t *zh = raw_open(uri);
    dlock_lock *l = NULL;
    char name[128], path[256];
    struct Stat st;
    struct String_vector sv = {0, NULL};
    is_int(dlock_client_ping(c), 0, "ping (create + delete of a scratch node)");
    snprintf(name, sizeof name, "%stoken", prefix);
    is_int(dlock_acquire(c, name, NULL, &l), 0, "acquire");
    snprintf(path, sizeof path, "/dlock/%s", name);
    int rc = zoo_get_children(zh, path, 0, &sv);
    if (rc == ZOK && sv.count == 1) {
        ok(strstr(sv.data[0], "-lock-") != NULL, "the lock node is <owner>-lock-<seq>: %s",
           sv.data[0]);
        snprintf(path + strlen(path), sizeof path - strlen(path), "/%s", sv.data[0]);
        zoo_exists(zh, path, 0, &st);
        is_int(dlock_lock_token(l), st.czxid, "the token is the lock node's czxid");
        ok(st.ephemeralOwner != 0, "and the node is ephemeral");
    } else {
        ok(0, "exactly one lock node (rc %d, %d nodes)", rc, sv.count);
    }
    deallocate_String_vector(&sv);
    dlock_release(l);
    zookeeper_close(zh);
    dlock_client_close(c);
}

/* A waiter that gives up (deadline or try) deletes its node. */
static void test_timed_out_waiter(const char *uri)
{
    char name[128];
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    zhandle_t *zh = raw_open(uri);
    dlock_lock *la = NULL, *lb = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    snprintf(name, sizeof name, "%stimed-out", prefix);
    is_int(dlock_acquire(a, name, &o, &la), 0, "A acquires");
    o = wait_opts(DLOCK_WAIT_DEADLINE, 300, 0);
    is_int(dlock_acquire(b, name, &o, &lb), DLOCK_ETIMEDOUT, "B's 300 ms wait times out");
    is_int(count_nodes(zh, "/dlock", name), 1, "B's node is gone: only A's remains");
    o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    is_int(dlock_acquire(b, name, &o, &lb), DLOCK_EBUSY, "B's try is refused");
    is_int(count_nodes(zh, "/dlock", name), 1, "and leaves no node either");
    is_int(dlock_release(la), 0, "A releases");
    is_int(count_nodes(zh, "/dlock", name), 0, "no node left at all");
    zookeeper_close(zh);
    dlock_client_close(a);
    dlock_client_close(b);
}

static void proxied_uri(struct proxy *p, const char *options, char *out, size_t len)
{
    snprintf(out, len, "zookeeper://127.0.0.1:%d/dlock%s", p->port, options);
}

/* The connection is cut after the create reached the server and before its
 * reply came back: the client must find its node by its owner id instead
 * of making a second one (which would stay, an orphan, ahead of others). */
static void test_protected_create(const char *uri, struct proxy *p)
{
    char name[128], puri[256];
    proxied_uri(p, "", puri, sizeof puri);
    dlock_client *c = open_ok(puri), *other = open_ok(uri);
    zhandle_t *zh = raw_open(uri);
    dlock_lock *l = NULL, *lo = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 0);
    snprintf(name, sizeof name, "%sprotected", prefix);
    int cuts = proxy_cuts(p);
    proxy_set(p, PROXY_CUT_NEXT);
    is_int(dlock_acquire(c, name, &o, &l), 0, "acquire through a connection cut mid-create");
    is_int(proxy_cuts(p), cuts + 1, "the proxy did cut the create's reply");
    is_int(count_nodes(zh, "/dlock", name), 1, "exactly one lock node: ours was found, not re-made");
    o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    is_int(dlock_acquire(other, name, &o, &lo), DLOCK_EBUSY, "the lock is held against others");
    is_int(dlock_release(l), 0, "release");
    is_int(count_nodes(zh, "/dlock", name), 0, "no orphan left behind");
    is_int(dlock_acquire(other, name, &o, &lo), 0, "another client gets it at once");
    dlock_release(lo);

    /* The same cut on a waiter's create: it must queue once, not twice. */
    dlock_lock *lh = NULL;
    is_int(dlock_acquire(other, name, &o, &lh), 0, "another client holds");
    proxy_set(p, PROXY_CUT_NEXT);
    o = wait_opts(DLOCK_WAIT_DEADLINE, 1500, 0);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_ETIMEDOUT, "a waiter cut mid-create times out");
    is_int(count_nodes(zh, "/dlock", name), 1, "and leaves neither its node nor an orphan");
    dlock_release(lh);
    zookeeper_close(zh);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* Suspended: the connection is down but the session may live. renew says
 * DLOCK_ECONNECT, the lock stays held against others, and when the
 * connection returns within the session timeout, all is as before. */
static void test_suspended(const char *uri, struct proxy *p)
{
    char name[128], puri[256];
    proxied_uri(p, "?session_timeout=6000", puri, sizeof puri);
    dlock_client *c = open_ok(puri), *other = open_ok(uri);
    dlock_lock *l = NULL, *lo = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    snprintf(name, sizeof name, "%ssuspended", prefix);
    is_int(dlock_acquire(c, name, &o, &l), 0, "acquire through the proxy");
    proxy_set(p, PROXY_DOWN);
    sleep_ms(500);
    is_int(dlock_renew(l, 1000), DLOCK_ECONNECT, "suspended: renew → DLOCK_ECONNECT");
    diag("%s", dlock_errmsg(c));
    is_int(dlock_acquire(other, name, &o, &lo), DLOCK_EBUSY, "the lock stays held meanwhile");
    proxy_set(p, PROXY_PASS);
    int rc = DLOCK_ECONNECT;
    uint64_t t0 = dlock_monotonic_ns();
    while (rc == DLOCK_ECONNECT && dlock_monotonic_ns() - t0 < 5000 * MS) {
        sleep_ms(50);
        rc = dlock_renew(l, 1000);
    }
    is_int(rc, 0, "reconnected within the session timeout: renew → 0 (after %.0f ms)",
           (dlock_monotonic_ns() - t0) / 1e6);
    is_int(dlock_release(l), 0, "release works");
    is_int(dlock_acquire(other, name, &o, &lo), 0, "and frees the lock");
    dlock_release(lo);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* Suspended for longer than the session timeout: the lock is lost, the
 * ensemble frees it, and the old holder's renew and release say so. */
static void test_session_expiry(const char *uri, struct proxy *p)
{
    char name[128], puri[256];
    proxied_uri(p, "?session_timeout=2000", puri, sizeof puri);
    dlock_client *c = open_ok(puri), *other = open_ok(uri);
    dlock_lock *l = NULL, *lo = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    snprintf(name, sizeof name, "%sexpiry", prefix);
    is_int(dlock_acquire(c, name, &o, &l), 0, "acquire with a 2 s session");
    proxy_set(p, PROXY_DOWN);
    uint64_t t0 = dlock_monotonic_ns();
    int rc = 0, saw_suspended = 0;
    while (dlock_monotonic_ns() - t0 < 8000 * MS) {
        rc = dlock_renew(l, 1000);
        saw_suspended |= rc == DLOCK_ECONNECT;
        if (rc != 0 && rc != DLOCK_ECONNECT)
            break;
        sleep_ms(50);
    }
    ok(saw_suspended, "renew said DLOCK_ECONNECT while suspended");
    is_int(rc, DLOCK_ELOST, "then DLOCK_ELOST once the session timed out (after %.0f ms)",
           (dlock_monotonic_ns() - t0) / 1e6);
    o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 0);
    t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(other, name, &o, &lo), 0, "the ensemble expired the session: lock free");
    diag("another client got it %.0f ms later", (dlock_monotonic_ns() - t0) / 1e6);
    proxy_set(p, PROXY_PASS);
    is_int(dlock_release(l), DLOCK_ELOST, "the old holder's release → DLOCK_ELOST");
    dlock_release(lo);
    o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 0);
    is_int(dlock_acquire(c, name, &o, &l), 0, "the old holder's client works again (new session)");
    dlock_release(l);
    dlock_client_close(c);
    dlock_client_close(other);
}

struct later {
    struct proxy *p;
    unsigned ms;
    int mode;
};

static void *set_mode_later(void *arg)
{
    struct later *l = arg;
    sleep_ms(l->ms);
    proxy_set(l->p, l->mode);
    return NULL;
}

/* A waiter whose deadline passes while disconnected cannot delete its node
 * then; its client deletes it at its next call once reconnected. */
static void test_timeout_while_disconnected(const char *uri, struct proxy *p)
{
    char name[128], puri[256];
    proxied_uri(p, "?session_timeout=10000", puri, sizeof puri);
    dlock_client *c = open_ok(puri), *holder = open_ok(uri);
    zhandle_t *zh = raw_open(uri);
    dlock_lock *l = NULL, *lh = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    struct later down = {p, 400, PROXY_DOWN};
    pthread_t t;
    snprintf(name, sizeof name, "%sdisconnected-waiter", prefix);
    is_int(dlock_acquire(holder, name, &o, &lh), 0, "holder acquires");
    pthread_create(&t, NULL, set_mode_later, &down);
    o = wait_opts(DLOCK_WAIT_DEADLINE, 1200, 0);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_ETIMEDOUT,
           "a waiter disconnected 400 ms into its wait times out at 1200 ms");
    pthread_join(t, NULL);
    is_int(count_nodes(zh, "/dlock", name), 2, "its node is still there (no connection to delete it)");
    proxy_set(p, PROXY_PASS);
    int rc = DLOCK_ECONNECT;
    for (int i = 0; i < 100 && rc != 0; i++, sleep_ms(50))
        rc = dlock_client_ping(c);
    is_int(rc, 0, "reconnected: the client's next call succeeds");
    is_int(count_nodes(zh, "/dlock", name), 1, "and deleted the node first: only the holder's is left");
    dlock_release(lh);
    zookeeper_close(zh);
    dlock_client_close(c);
    dlock_client_close(holder);
}

/* Digest credentials: the nodes a client makes carry the creator's ACL; a
 * wrong password (accepted at login by ZooKeeper) shows as DLOCK_EAUTH at
 * open, when the root cannot be read. */
static void test_digest_auth(void)
{
    char root[64], good[256], bad[256], anon[256], name[128];
    snprintf(root, sizeof root, "/dlock-auth-%d", (int)getpid());
    snprintf(good, sizeof good, "zookeeper://alice:s3cret-pw@127.0.0.1:2181%s", root);
    snprintf(bad, sizeof bad, "zookeeper://alice:wrong-pw-x9@127.0.0.1:2181%s", root);
    snprintf(anon, sizeof anon, "zookeeper://127.0.0.1:2181%s", root);
    snprintf(name, sizeof name, "auth-lock");
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    is_int(dlock_client_open(good, &c), 0, "digest user opens (and creates the root)");
    is_int(dlock_acquire(c, name, NULL, &l), 0, "and locks");
    dlock_release(l);
    dlock_client_close(c);
    c = NULL;
    is_int(dlock_client_open(bad, &c), DLOCK_EAUTH, "wrong password → DLOCK_EAUTH");
    ok(!strstr(dlock_errmsg(c), "wrong-pw-x9") && !strstr(dlock_errmsg(c), "s3cret-pw"),
       "the message hides the password: %s", dlock_errmsg(c));
    dlock_client_close(c);
    c = NULL;
    is_int(dlock_client_open(anon, &c), DLOCK_EAUTH, "no credentials → DLOCK_EAUTH");
    dlock_client_close(c);

    /* Clean up as alice: the lock's container, then the root. */
    zhandle_t *zh = raw_open(anon);
    char path[256];
    zoo_add_auth(zh, "digest", "alice:s3cret-pw", 15, NULL, NULL);
    snprintf(path, sizeof path, "%s/%s", root, name);
    zoo_delete(zh, path, -1);
    is_int(zoo_delete(zh, root, -1), ZOK, "test root removed");
    zookeeper_close(zh);
}

/* ---- the leader killed --------------------------------------------------- */

static char zk_node_script[PATH_MAX];

/* scripts/stores/zk-node.sh, found from this file's path (relative to the
 * build directory, where meson runs the test). */
static void find_script(void)
{
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s", __FILE__);
    char *cut = strstr(src, "tests/backends/");
    if (cut)
        snprintf(cut, sizeof src - (size_t)(cut - src), "scripts/stores/zk-node.sh");
    if (!cut || !realpath(src, zk_node_script) || access(zk_node_script, R_OK) != 0) {
        printf("Bail out! cannot find scripts/stores/zk-node.sh from %s\n", __FILE__);
        exit(1);
    }
}

static int zk_node(const char *action, int n)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "bash '%s' %s %d >/dev/null 2>&1", zk_node_script, action, n);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Mode of the member at 127.0.0.1:port ("leader", "follower") via srvr. */
static void zk_mode(int port, char *out, size_t len)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[2048];
    size_t got = 0;
    ssize_t n;
    snprintf(out, len, "down");
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0 || write(s, "srvr", 4) != 4) {
        close(s);
        return;
    }
    while (got < sizeof buf - 1 && (n = read(s, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    close(s);
    buf[got] = '\0';
    char *m = strstr(buf, "Mode: ");
    if (m)
        snprintf(out, len, "%.*s", (int)strcspn(m + 6, "\r\n"), m + 6);
}

struct election {
    volatile int inside, overlaps, grants, holder_holds, early;
    uint64_t tokens[8];
};

static void leader_kill_waiter(const char *uri, const char *name, struct election *s)
{
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 60000, 0);
    if (dlock_acquire(c, name, &o, &l) != 0) {
        fprintf(stderr, "waiter: %s\n", dlock_errmsg(c));
        _exit(2);
    }
    if (__atomic_exchange_n(&s->inside, 1, __ATOMIC_SEQ_CST))
        __atomic_add_fetch(&s->overlaps, 1, __ATOMIC_SEQ_CST);
    if (s->holder_holds)
        __atomic_add_fetch(&s->early, 1, __ATOMIC_SEQ_CST);
    int i = __atomic_fetch_add(&s->grants, 1, __ATOMIC_SEQ_CST);
    s->tokens[i & 7] = dlock_lock_token(l);
    sleep_ms(50);
    __atomic_store_n(&s->inside, 0, __ATOMIC_SEQ_CST);
    int rc = dlock_release(l);
    dlock_client_close(c);
    _exit(rc == 0 ? 0 : 3);
}

static int find_leader(dlock_uri *u)
{
    char mode[32];
    for (size_t i = 0; i < dlock_uri_host_count(u); i++) {
        zk_mode((int)dlock_uri_port(u, i), mode, sizeof mode);
        if (strcmp(mode, "leader") == 0)
            return (int)i + 1;
    }
    return 0;
}

/* Waits for the children, at most 60 s; returns how many exited cleanly. */
static int reap(pid_t *pids, int n)
{
    int clean = 0, left = n;
    uint64_t t0 = dlock_monotonic_ns();
    while (left > 0 && dlock_monotonic_ns() - t0 < 60000 * MS) {
        for (int i = 0; i < n; i++) {
            int st;
            if (pids[i] > 0 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                clean += WIFEXITED(st) && WEXITSTATUS(st) == 0;
                pids[i] = 0;
                left--;
            }
        }
        sleep_ms(50);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
    return clean;
}

static void test_leader_killed(const char *uri)
{
    enum { W = 3 };
    char name[128], err[256];
    dlock_uri *u = NULL;
    dlock_uri_parse(uri, &u, err, sizeof err);
    int leader = find_leader(u);
    if (!leader) {
        printf("Bail out! the ensemble has no leader: start it with scripts/stores/start.sh zk-ensemble\n");
        exit(1);
    }
    struct election *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                              -1, 0);
    dlock_client *h = open_ok(uri);
    zhandle_t *zh = raw_open(uri);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 0);
    pid_t pids[W];
    snprintf(name, sizeof name, "%sleader-kill", prefix);
    is_int(dlock_acquire(h, name, &o, &l), 0, "holder acquires on the ensemble");
    uint64_t t_holder = l ? dlock_lock_token(l) : 0;
    s->holder_holds = 1;
    for (int i = 0; i < W; i++)
        if ((pids[i] = fork()) == 0)
            leader_kill_waiter(uri, name, s);
    int queued = 0;
    for (int i = 0; i < 100 && queued != W + 1; i++, sleep_ms(50))
        queued = count_nodes(zh, "/dlock", name);
    is_int(queued, W + 1, "%d waiters queued behind the holder", W);
    zookeeper_close(zh);

    is_int(zk_node("kill", leader), 0, "leader (member %d) killed", leader);
    uint64_t t0 = dlock_monotonic_ns();
    int rc = 0, saw = 0, first_err = 0;
    while (dlock_monotonic_ns() - t0 < 30000 * MS) {
        rc = dlock_renew(l, 1000);
        if (rc != 0 && !first_err)
            first_err = rc;
        saw |= rc != 0;
        if (rc == 0 && saw)
            break;
        if (rc != 0 && rc != DLOCK_ECONNECT)
            break;
        sleep_ms(50);
    }
    diag("holder's renew during the election: %s; back after %.0f ms",
         first_err ? dlock_err_name(first_err) : "always 0", (dlock_monotonic_ns() - t0) / 1e6);
    is_int(rc, 0, "the holder keeps the lock through the election");
    int new_leader = find_leader(u);
    ok(new_leader && new_leader != leader, "a new leader was elected (member %d)", new_leader);
    is_int(s->grants, 0, "no waiter was granted while the holder holds");
    s->holder_holds = 0;
    is_int(dlock_release(l), 0, "the holder releases after the election");
    is_int(reap(pids, W), W, "all %d waiters got the lock and released it", W);
    is_int(s->grants, W, "each waiter was granted once");
    is_int(s->overlaps + s->early, 0, "no double grant");
    int increasing = s->tokens[0] > t_holder;
    for (int i = 1; i < W; i++)
        increasing &= s->tokens[i] > s->tokens[i - 1];
    ok(increasing, "tokens strictly increase in grant order (holder %llu, last waiter %llu)",
       (unsigned long long)t_holder, (unsigned long long)s->tokens[W - 1]);
    o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 0);
    if (dlock_acquire(h, name, &o, &l) == 0) {
        uint64_t t = dlock_lock_token(l);
        ok(t > s->tokens[W - 1] && (t >> 32) > (t_holder >> 32),
           "a grant after the election is higher still, in a new epoch (%llu, epoch %llu → %llu)",
           (unsigned long long)t, (unsigned long long)(t_holder >> 32),
           (unsigned long long)(t >> 32));
        dlock_release(l);
    } else {
        ok(0, "acquire after the election: %s", dlock_errmsg(h));
    }

    is_int(zk_node("start", leader), 0, "member %d started again", leader);
    char mode[32];
    zk_mode((int)dlock_uri_port(u, (size_t)leader - 1), mode, sizeof mode);
    ok(strcmp(mode, "follower") == 0 || strcmp(mode, "leader") == 0, "and serves (%s)", mode);
    dlock_client_close(h);
    dlock_uri_free(u);
    munmap(s, sizeof *s);
}

int main(void)
{
    struct proxy p;
    single_uri = need_env("DLOCK_ZK_URI");
    ensemble_uri = need_env("DLOCK_ZK_ENSEMBLE_URI");
    find_script();
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "zk-test-%d-", (int)getpid());

    dlock_uri *u = NULL;
    char err[256];
    if (dlock_uri_parse(single_uri, &u, err, sizeof err) != 0 ||
        strcmp(dlock_uri_path(u), "/dlock") != 0) {
        printf("Bail out! DLOCK_ZK_URI must be zookeeper://host:port/dlock\n");
        exit(1);
    }
    proxy_start(&p, (int)dlock_uri_port(u, 0));
    dlock_uri_free(u);

    test_options();
    test_ping_and_token(single_uri);
    test_timed_out_waiter(single_uri);
    test_timed_out_waiter(ensemble_uri);
    test_protected_create(single_uri, &p);
    test_suspended(single_uri, &p);
    test_session_expiry(single_uri, &p);
    test_timeout_while_disconnected(single_uri, &p);
    test_digest_auth();
    test_leader_killed(ensemble_uri);
    proxy_stop(&p);
    return done_testing();
}
