/*
 * PostgreSQL-only cases, against a real server: the documented key formula
 * (checked against the server's own sha256()), the lock_timeout grant race,
 * a terminated session reported as lost, no stacking, deadlocks, options;
 * client-side bounds (a listener that never answers, a network that goes
 * silent behind a proxy); the keeper renewing on the lock's own session
 * while the client waits for another lock, and a grant after a wait longer
 * than the TTL.
 *
 * Environment: DLOCK_POSTGRES_URI (scripts/stores/start.sh prints it); a
 * missing variable fails the run.
 */
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock_backend.h"
#include "tests/proxy.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull

int64_t dlock_pg_key(const char *ns, const char *name, size_t len);

static const char *uri;
static char prefix[64];
static PGconn *raw; /* a plain libpq session, to look behind the library */



static PGconn *raw_connect(void)
{
    dlock_uri *u = NULL;
    char err[256], conninfo[512];
    dlock_uri_parse(uri, &u, err, sizeof err);
    snprintf(conninfo, sizeof conninfo, "host=%s port=%u dbname=%s user=%s", dlock_uri_host(u, 0),
             dlock_uri_port(u, 0), dlock_uri_path(u) + 1, dlock_uri_user(u));
    dlock_uri_free(u);
    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK) {
        printf("Bail out! raw connection: %s\n", PQerrorMessage(pg));
        exit(1);
    }
    PQclear(PQexec(pg, "SET client_min_messages = warning"));
    return pg;
}

/* First column of the first row of sql, as a new string ("" on error). */
static char *q1(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    char *v = strdup(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0
                         ? PQgetvalue(r, 0, 0)
                         : "");
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
        diag("sql failed: %s", PQresultErrorMessage(r));
    PQclear(r);
    return v;
}

static int key_free(int64_t key)
{
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%lld)", (long long)key);
    char *v = q1(raw, sql);
    int free_ = v[0] == 't';
    free(v);
    if (free_) {
        snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%lld)", (long long)key);
        free(q1(raw, sql));
    }
    return free_;
}


static void test_key_formula(void)
{
    char sql[256];
    int64_t k = dlock_pg_key(NULL, "job", 3);
    snprintf(sql, sizeof sql,
             "SELECT ('x' || substr(encode(sha256('job'::bytea), 'hex'), 1, 16))::bit(64)::bigint");
    char *v = q1(raw, sql);
    is_int(strtoll(v, NULL, 10), k, "key = first 8 bytes of SHA-256(name), as the server computes it");
    free(v);
    k = dlock_pg_key("ns", "job", 3);
    snprintf(sql, sizeof sql,
             "SELECT ('x' || substr(encode(sha256('ns'::bytea || '\\x00'::bytea || 'job'::bytea),"
             " 'hex'), 1, 16))::bit(64)::bigint");
    v = q1(raw, sql);
    is_int(strtoll(v, NULL, 10), k, "with a namespace: SHA-256(namespace || 0x00 || name)");
    free(v);
    ok(dlock_pg_key("a", "b", 1) != dlock_pg_key(NULL, "b", 1), "the namespace changes the key");

    /* And it is the key dlock actually locks. */
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    char name[128];
    snprintf(name, sizeof name, "%skey", prefix);
    int64_t key = dlock_pg_key(NULL, name, strlen(name));
    is_int(dlock_acquire(c, name, NULL, &l), 0, "acquire");
    ok(!key_free(key), "the advisory lock on that key is held");
    dlock_release(l);
    ok(key_free(key), "and free after release");
    dlock_client_close(c);
}

/* The counter row is locked elsewhere, so the advisory lock is granted and
 * then lock_timeout fires within the same statement: the session would keep
 * the lock unless the backend notices and unlocks it. */
static void test_grant_timeout_race(void)
{
    char name[128], sql[256];
    snprintf(name, sizeof name, "%srace", prefix);
    int64_t key = dlock_pg_key(NULL, name, strlen(name));
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    is_int(dlock_acquire(c, name, NULL, &l), 0, "first acquire creates the counter row");
    dlock_release(l);

    PGconn *blocker = raw_connect();
    free(q1(blocker, "BEGIN"));
    snprintf(sql, sizeof sql, "SELECT token FROM dlock_fence WHERE key = %lld FOR UPDATE",
             (long long)key);
    free(q1(blocker, sql));
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 300, 0);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_ETIMEDOUT,
           "lock granted, then lock_timeout fires in the same statement → ETIMEDOUT");
    ok(key_free(key), "and the late grant was undone: the advisory lock is free");
    free(q1(blocker, "ROLLBACK"));
    PQfinish(blocker);
    o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    is_int(dlock_acquire(c, name, &o, &l), 0, "the same client acquires normally afterwards");
    dlock_release(l);
    dlock_client_close(c);
}

static void test_terminated_session(void)
{
    char name[128], sql[320];
    snprintf(name, sizeof name, "%sterminated", prefix);
    int64_t key = dlock_pg_key(NULL, name, strlen(name));
    uint64_t u = (uint64_t)key;
    dlock_client *c = open_ok(uri), *other = open_ok(uri);
    dlock_lock *l = NULL, *l2 = NULL;
    is_int(dlock_acquire(c, name, NULL, &l), 0, "acquire");
    snprintf(sql, sizeof sql,
             "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
             " AND classid = %llu AND objid = %llu AND objsubid = 1 AND granted",
             (unsigned long long)(u >> 32), (unsigned long long)(u & 0xffffffffu));
    char *v = q1(raw, sql);
    is_str(v, "t", "the holder's backend is terminated");
    free(v);
    sleep_ms(100);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 3000, 0);
    is_int(dlock_acquire(other, name, &o, &l2), 0, "another client gets the lock");
    is_int(dlock_renew(l, 5000), DLOCK_ELOST, "the old holder's renew → DLOCK_ELOST");
    ok(strstr(dlock_errmsg(c), "session") != NULL, "saying why: %s", dlock_errmsg(c));
    is_int(dlock_release(l), DLOCK_ELOST, "its release → DLOCK_ELOST");
    is_int(dlock_release(l2), 0, "the new holder releases normally");
    o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    is_int(dlock_acquire(c, name, &o, &l), 0, "the first client recovers with a new session");
    dlock_release(l);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* A lost lock's handle must let go of its pool slot: renewing or releasing
 * it later must not touch the lock that now uses the slot. */
static void test_lost_handle_detached(void)
{
    char a[128], b[128], sql[320];
    snprintf(a, sizeof a, "%sdetach-a", prefix);
    snprintf(b, sizeof b, "%sdetach-b", prefix);
    uint64_t u = (uint64_t)dlock_pg_key(NULL, a, strlen(a));
    dlock_client *c = open_ok(uri);
    dlock_lock *la = NULL, *lb = NULL;
    is_int(dlock_acquire(c, a, NULL, &la), 0, "acquire A");
    snprintf(sql, sizeof sql,
             "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
             " AND classid = %llu AND objid = %llu AND objsubid = 1 AND granted",
             (unsigned long long)(u >> 32), (unsigned long long)(u & 0xffffffffu));
    free(q1(raw, sql));
    sleep_ms(100);
    is_int(dlock_renew(la, 300), DLOCK_ELOST, "A's session was ended: renew → ELOST");
    is_int(dlock_acquire(c, b, NULL, &lb), 0, "acquire B (reusing the freed pool slot)");
    is_int(dlock_renew(la, 300), DLOCK_ELOST, "renewing A again still says lost");
    is_int(dlock_release(la), DLOCK_ELOST, "and releasing A too");
    sleep_ms(700); /* had A's renew set B's session's lease to 300 ms, B would be gone */
    is_int(dlock_renew(lb, 5000), 0, "B's lock and lease were not touched");
    ok(!key_free(dlock_pg_key(NULL, b, strlen(b))), "B is still held on the server");
    dlock_release(lb);
    dlock_client_close(c);
}

/* The lock is granted, then the token bump fails (here a CHECK constraint):
 * the session would keep the lock after the failed statement. */
static void test_error_after_grant(void)
{
    char u[512], name[128];
    free(q1(raw, "CREATE TABLE IF NOT EXISTS dlock_fence_chk (key bigint PRIMARY KEY,"
                 " token bigint NOT NULL CHECK (token < 0))"));
    snprintf(u, sizeof u, "%s%stable=dlock_fence_chk", uri, strchr(uri, '?') ? "&" : "?");
    snprintf(name, sizeof name, "%safter-grant", prefix);
    dlock_client *c = open_ok(u);
    dlock_lock *l = NULL;
    is_int(dlock_acquire(c, name, NULL, &l), DLOCK_ESTORE, "token bump fails after the grant → ESTORE");
    ok(key_free(dlock_pg_key(NULL, name, strlen(name))), "and the advisory lock is not left held");
    dlock_client_close(c);
}

static void test_no_stacking(void)
{
    char name[128], sql[320];
    snprintf(name, sizeof name, "%sstack", prefix);
    uint64_t u = (uint64_t)dlock_pg_key(NULL, name, strlen(name));
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL, *again = NULL;
    is_int(dlock_acquire(c, name, NULL, &l), 0, "acquire");
    is_int(dlock_acquire(c, name, NULL, &again), DLOCK_EALREADY, "again on the same client → EALREADY");
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %llu"
             " AND objid = %llu AND objsubid = 1 AND granted",
             (unsigned long long)(u >> 32), (unsigned long long)(u & 0xffffffffu));
    char *v = q1(raw, sql);
    is_str(v, "1", "the server shows one lock, not a stack");
    free(v);
    dlock_release(l);
    v = q1(raw, sql);
    is_str(v, "0", "one release frees it");
    free(v);
    dlock_client_close(c);
}

/* A holds x and wants y while B holds y and wants x. Each dlock lock has a
 * session of its own, so the sessions that wait are not the ones that hold
 * and the server sees no cycle: the deadline is what breaks it. A gives up
 * at 1 s and releases x; B, waiting up to 10 s, then gets it. */
static void test_cycle_broken_by_deadline(void)
{
    char x[128], y[128];
    int p[2], q[2];
    snprintf(x, sizeof x, "%sdl-x", prefix);
    snprintf(y, sizeof y, "%sdl-y", prefix);
    if (pipe(p) < 0 || pipe(q) < 0)
        abort();
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            dlock_client *c = open_ok(uri);
            dlock_lock *first = NULL, *second = NULL;
            char ch = 0;
            dlock_acquire(c, i ? y : x, NULL, &first);
            if (write(i ? q[1] : p[1], "1", 1) != 1 || read(i ? p[0] : q[0], &ch, 1) != 1)
                _exit(9);
            dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, i ? 10000 : 1000, 0);
            int rc = dlock_acquire(c, i ? x : y, &o, &second);
            if (rc == 0)
                dlock_release(second);
            dlock_release(first); /* lets the other one through */
            dlock_client_close(c);
            _exit(rc == DLOCK_ETIMEDOUT ? 1 : rc == 0 ? 0 : 2);
        }
    }
    int st;
    waitpid(kids[0], &st, 0);
    is_int(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 1, "the side with the 1 s deadline times out");
    waitpid(kids[1], &st, 0);
    is_int(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0, "and the other side then gets its lock");
}

/* The idle timer stays set on pooled sessions; one that died of it while
 * pooled must not fail the next acquire. */
static void test_pooled_session_expired(void)
{
    char name[128];
    snprintf(name, sizeof name, "%spooled", prefix);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    o.ttl_ms = 300;
    is_int(dlock_acquire(c, name, &o, &l), 0, "acquire with a 300 ms lease");
    is_int(dlock_release(l), 0, "release: the session goes back to the pool");
    sleep_ms(800); /* the pooled session's idle_session_timeout ends it */
    o.ttl_ms = 5000;
    is_int(dlock_acquire(c, name, &o, &l), 0, "the next acquire survives the dead pooled session");
    is_str(dlock_errmsg(c), "", "with no error left behind");
    is_int(dlock_client_ping(c), 0, "ping works too");
    dlock_release(l);
    dlock_client_close(c);
}

static void test_sequence_tokens(void)
{
    char u[512], name[128];
    snprintf(u, sizeof u, "%s%stoken=sequence", uri, strchr(uri, '?') ? "&" : "?");
    snprintf(name, sizeof name, "%sseq", prefix);
    dlock_client *a = open_ok(u), *b = open_ok(u);
    dlock_lock *l = NULL;
    uint64_t last = 0;
    int increasing = 1;
    for (int i = 0; i < 10; i++) {
        dlock_client *c = i % 2 ? a : b;
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 3000, 0);
        if (dlock_acquire(c, name, &o, &l) != 0) {
            increasing = 0;
            break;
        }
        increasing &= dlock_lock_token(l) > last;
        last = dlock_lock_token(l);
        dlock_release(l);
    }
    ok(increasing, "token=sequence: tokens strictly increase across two clients");
    char *v = q1(raw, "SELECT last_value FROM dlock_fence_seq");
    ok(strtoull(v, NULL, 10) >= last, "and come from the sequence dlock_fence_seq (%s)", v);
    free(v);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client *c = NULL;
    snprintf(u, sizeof u, "%s%stoken=counter", uri, strchr(uri, '?') ? "&" : "?");
    is_int(dlock_client_open(u, &c), DLOCK_EBADURI, "token=counter → EBADURI");
    dlock_client_close(c);
}

static void test_options(void)
{
    char u[512];
    dlock_client *c = NULL, *d = NULL;
    dlock_lock *l = NULL, *l2 = NULL;
    const char *q = strchr(uri, '?') ? "&" : "?";
    snprintf(u, sizeof u, "%s%stable=Bad-Name", uri, q);
    is_int(dlock_client_open(u, &c), DLOCK_EBADURI, "bad table name → EBADURI");
    ok(strstr(dlock_errmsg(c), "table") != NULL, "naming the option");
    dlock_client_close(c);
    snprintf(u, sizeof u, "%s%stable=dlock_fence_alt&application_name=dlock-test", uri, q);
    c = open_ok(u);
    char name[128];
    snprintf(name, sizeof name, "%salt", prefix);
    is_int(dlock_acquire(c, name, NULL, &l), 0, "a custom fencing table works");
    char *v = q1(raw, "SELECT count(*) > 0 FROM dlock_fence_alt");
    is_str(v, "t", "and the counter lives there");
    free(v);
    v = q1(raw, "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'dlock-test'");
    is_str(v, "t", "application_name reaches the server");
    free(v);
    dlock_release(l);
    dlock_client_close(c);

    char ua[512], ub[512];
    snprintf(ua, sizeof ua, "%s%snamespace=alpha", uri, q);
    snprintf(ub, sizeof ub, "%s%snamespace=beta", uri, q);
    c = open_ok(ua);
    d = open_ok(ub);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    is_int(dlock_acquire(c, name, &o, &l), 0, "namespace alpha");
    is_int(dlock_acquire(d, name, &o, &l2), 0, "the same name in namespace beta is another lock");
    dlock_release(l);
    dlock_release(l2);
    dlock_client_close(c);
    dlock_client_close(d);

    c = NULL;
    snprintf(u, sizeof u, "postgresql://dlock@127.0.0.1:1/dlock?connect_timeout=notanumber");
    is_int(dlock_client_open(u, &c), DLOCK_EBADURI, "malformed connect_timeout → EBADURI");
    dlock_client_close(c);
    c = NULL;
    snprintf(u, sizeof u, "postgresql://dlock@127.0.0.1:1/dlock?timeout=0");
    is_int(dlock_client_open(u, &c), DLOCK_EBADURI, "timeout=0 → EBADURI");
    ok(strstr(dlock_errmsg(c), "timeout") != NULL, "naming the option: %s", dlock_errmsg(c));
    dlock_client_close(c);
    c = NULL;
    is_int(dlock_client_open("postgresql:///dlock", &c), DLOCK_EBADURI, "no host → EBADURI");
    dlock_client_close(c);
}

static double ms_since(uint64_t t0)
{
    return (double)(dlock_monotonic_ns() - t0) / 1e6;
}

/* A loopback listener that completes TCP handshakes (the kernel does, from
 * its backlog) and never says a word: a server that accepts and hangs. */
static int silent_listener(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) < 0) {
        printf("Bail out! cannot start a silent listener\n");
        exit(1);
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* libpq counts connect_timeout in whole seconds, at least 2. */
static void test_silent_server_connect(void)
{
    int port, fd = silent_listener(&port);
    char u[256];
    dlock_client *c = NULL;
    snprintf(u, sizeof u, "postgresql://dlock@127.0.0.1:%d/dlock?connect_timeout=2000", port);
    uint64_t t0 = dlock_monotonic_ns();
    int rc = dlock_client_open(u, &c);
    double el = ms_since(t0);
    is_int(rc, DLOCK_ECONNECT, "a server that accepts and never answers: open → ECONNECT");
    ok(el >= 1500 && el < 2000 + 3000, "within connect_timeout=2000 (%.0f ms): %s", el,
       dlock_errmsg(c));
    dlock_client_close(c);
    close(fd);
}

/* Every call through a network that goes silent (the proxy keeps the
 * connections open and forwards nothing) returns within its bound. */
static void test_silent_network(void)
{
    struct proxy p;
    char pu[1024], a[128], b[128], y1[128], y2[128], z[128];
    dlock_lock *la = NULL, *lb = NULL, *l1 = NULL, *l2 = NULL, *lz = NULL;
    const uint64_t timeout = 1000, connect = 2000, slack = 3000;
    proxy_for_uri(&p, uri);
    proxy_uri(&p, uri, "timeout=1000&connect_timeout=2000", pu, sizeof pu);
    snprintf(a, sizeof a, "%ssilent-a", prefix);
    snprintf(b, sizeof b, "%ssilent-b", prefix);
    snprintf(y1, sizeof y1, "%ssilent-y1", prefix);
    snprintf(y2, sizeof y2, "%ssilent-y2", prefix);
    snprintf(z, sizeof z, "%ssilent-z", prefix);
    dlock_client *c = open_ok(pu);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 3000);
    is_int(dlock_acquire(c, a, &o, &la), 0, "through the proxy: acquire A");
    is_int(dlock_acquire(c, b, &o, &lb), 0, "and B");
    /* Two idle sessions in the pool, for the try and the ping below. */
    is_int(dlock_acquire(c, y1, &o, &l1), 0, "and two more, released: two pooled sessions");
    is_int(dlock_acquire(c, y2, &o, &l2), 0, "(the second)");
    dlock_release(l1);
    dlock_release(l2);

    proxy_set(&p, PROXY_BLACKHOLE);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, z, &o, &lz), DLOCK_ECONNECT, "silent network: a try → ECONNECT");
    double el = ms_since(t0);
    /* Not retried on a new session: that would wait as long again. */
    ok(el >= timeout - 50 && el < 2 * timeout - 100,
       "after the timeout, not retried (%.0f ms; timeout %llu ms): %s", el,
       (unsigned long long)timeout, dlock_errmsg(c));
    ok(strstr(dlock_errmsg(c), "no reply") != NULL, "the message says the server did not answer");
    t0 = dlock_monotonic_ns();
    is_int(dlock_renew(la, 3000), DLOCK_ECONNECT, "renew → ECONNECT");
    el = ms_since(t0);
    ok(el < timeout + slack, "within the timeout (%.0f ms): %s", el, dlock_errmsg(c));
    ok(strstr(dlock_errmsg(c), "lost") != NULL, "saying the lock is lost with its session");
    t0 = dlock_monotonic_ns();
    int rc = dlock_release(lb);
    el = ms_since(t0);
    ok(rc == DLOCK_ECONNECT, "release → ECONNECT (%s)", dlock_err_name(rc));
    ok(el < timeout + slack, "within the timeout (%.0f ms): %s", el, dlock_errmsg(c));
    t0 = dlock_monotonic_ns();
    is_int(dlock_client_ping(c), DLOCK_ECONNECT, "ping → ECONNECT");
    el = ms_since(t0);
    ok(el < 2 * timeout - 100, "within the timeout, not retried (%.0f ms): %s", el,
       dlock_errmsg(c));
    t0 = dlock_monotonic_ns();
    is_int(dlock_client_ping(c), DLOCK_ECONNECT, "ping with no pooled session left → ECONNECT");
    el = ms_since(t0);
    ok(el < connect + slack, "within connect_timeout (%.0f ms): %s", el, dlock_errmsg(c));
    t0 = dlock_monotonic_ns();
    dlock_client *d = NULL;
    is_int(dlock_client_open(pu, &d), DLOCK_ECONNECT, "open through the silent network → ECONNECT");
    el = ms_since(t0);
    ok(el < connect + slack, "within connect_timeout (%.0f ms): %s", el, dlock_errmsg(d));
    dlock_client_close(d);
    is_int(dlock_release(la), DLOCK_ELOST, "A, whose renew closed its session: release → ELOST");
    t0 = dlock_monotonic_ns();
    dlock_client_close(c);
    ok(ms_since(t0) < 1000, "close returns at once (%.0f ms)", ms_since(t0));
    proxy_stop(&p);
    /* The server ends the sessions once the proxy closes them. */
    int64_t ka = dlock_pg_key(NULL, a, strlen(a)), kb = dlock_pg_key(NULL, b, strlen(b));
    int freed = 0;
    for (int i = 0; i < 50 && !freed; i++) {
        freed = key_free(ka) && key_free(kb);
        if (!freed)
            sleep_ms(100);
    }
    ok(freed, "A and B are free on the server afterwards");
}

static int lost_calls;

static void count_lost(dlock_lock *lock, int err, void *user)
{
    (void)lock, (void)err, (void)user;
    __atomic_add_fetch(&lost_calls, 1, __ATOMIC_SEQ_CST);
}

/* The keeper renews A on A's own session while the same client waits for
 * B on another: a 1 s lease lives through a 5 s wait. */
static void test_keep_while_waiting(void)
{
    char a[128], b[128];
    snprintf(a, sizeof a, "%skeep-a", prefix);
    snprintf(b, sizeof b, "%skeep-b", prefix);
    dlock_client *c = open_ok(uri), *other = open_ok(uri);
    dlock_lock *la = NULL, *lb = NULL, *ob = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    is_int(dlock_acquire(other, b, &o, &ob), 0, "another client holds B");
    lost_calls = 0;
    o = wait_opts(DLOCK_WAIT_TRY, 0, 1000);
    o.keep = 1;
    o.on_lost = count_lost;
    is_int(dlock_acquire(c, a, &o, &la), 0, "A acquired with keep, TTL 1000 ms");
    uint64_t t0 = dlock_monotonic_ns();
    o = wait_opts(DLOCK_WAIT_DEADLINE, 5000, 0);
    is_int(dlock_acquire(c, b, &o, &lb), DLOCK_ETIMEDOUT, "the same client waits 5 s for B");
    ok(ms_since(t0) >= 4900, "(%.0f ms)", ms_since(t0));
    is_int(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 0, "A was not reported lost");
    is_int(dlock_lock_lost(la), 0, "dlock_lock_lost(A) = 0");
    ok(!key_free(dlock_pg_key(NULL, a, strlen(a))), "A is still held on the server");
    is_int(dlock_renew(la, 1000), 0, "and renews");
    is_int(dlock_release(la), 0, "and releases");
    dlock_release(ob);
    dlock_client_close(c);
    dlock_client_close(other);
}

struct later {
    dlock_lock *lock;
    unsigned ms;
};

static void *release_later(void *arg)
{
    struct later *l = arg;
    sleep_ms(l->ms);
    dlock_release(l->lock);
    return NULL;
}

/* The grant comes 3 TTLs after the acquire started: its lease counts from
 * the grant, not from the start, so the keeper does not report it lost. */
static void test_keep_after_long_wait(void)
{
    char name[128];
    snprintf(name, sizeof name, "%skeep-wait", prefix);
    dlock_client *c = open_ok(uri), *other = open_ok(uri);
    dlock_lock *l = NULL, *ol = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    is_int(dlock_acquire(other, name, &o, &ol), 0, "another client holds the lock");
    struct later rel = {ol, 3000};
    pthread_t th;
    pthread_create(&th, NULL, release_later, &rel);
    lost_calls = 0;
    o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 1000);
    o.keep = 1;
    o.on_lost = count_lost;
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, name, &o, &l), 0, "kept acquire with TTL 1000 ms waits for it");
    double el = ms_since(t0);
    ok(el >= 2900, "granted after %.0f ms, about 3 TTLs", el);
    pthread_join(th, NULL);
    ok(l && dlock_lock_expires_ns(l) > dlock_monotonic_ns() + 500 * MS,
       "its lease counts from the grant");
    sleep_ms(1000);
    is_int(dlock_lock_lost(l), 0, "a TTL later it is not lost");
    is_int(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 0, "and on_lost was not called");
    is_int(dlock_release(l), 0, "release");
    dlock_client_close(c);
    dlock_client_close(other);
}

int main(void)
{
    uri = need_env("DLOCK_POSTGRES_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "pg-test-%d-%llu/", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() % 1000000007ull));
    raw = raw_connect();
    test_key_formula();
    test_grant_timeout_race();
    test_terminated_session();
    test_lost_handle_detached();
    test_error_after_grant();
    test_no_stacking();
    test_cycle_broken_by_deadline();
    test_pooled_session_expired();
    test_sequence_tokens();
    test_options();
    test_silent_server_connect();
    test_silent_network();
    test_keep_while_waiting();
    test_keep_after_long_wait();
    PQfinish(raw);
    return done_testing();
}
