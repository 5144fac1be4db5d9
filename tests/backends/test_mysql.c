/*
 * MySQL/MariaDB-only cases, against a real server: names the lock table
 * could confuse (longer than its column, differing only by case), a timed
 * out wait that must leave nothing behind, a holder whose session is
 * killed, the lease (wait_timeout), two locks on one client, a holder
 * process killed after its grant (tokens), the unix socket, URI
 * options; client-side bounds (a listener that never answers, a network
 * that goes silent behind a proxy); the keeper renewing on the lock's own
 * session while the client waits for another lock, and a grant after a
 * wait longer than the TTL.
 *
 * Environment (scripts/stores/start.sh prints it): DLOCK_MYSQL_URI. A
 * missing variable fails the run: these cases never skip silently.
 */
#include <mysql.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/sha256.h"
#include "core/uri.h"
#include "dlock_backend.h"
#include "tests/proxy.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull

static const char *uri;
static char prefix[64];
static MYSQL *raw; /* a session of our own, to look behind the library */



static double ms_since(uint64_t t0)
{
    return (double)(dlock_monotonic_ns() - t0) / 1e6;
}



static int try_lock(dlock_client *c, const char *name, dlock_lock **l)
{
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 30000);
    *l = NULL;
    return dlock_acquire(c, name, &o, l);
}

static void name_of(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "%s%s", prefix, what);
}

static void raw_connect(void)
{
    dlock_uri *u = NULL;
    char err[256];
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0) {
        printf("Bail out! %s\n", err);
        exit(1);
    }
    raw = mysql_init(NULL);
    if (!mysql_real_connect(raw, dlock_uri_host(u, 0), dlock_uri_user(u), dlock_uri_password(u),
                            dlock_uri_path(u) + 1, dlock_uri_port(u, 0), NULL, 0)) {
        printf("Bail out! raw connection: %s\n", mysql_error(raw));
        exit(1);
    }
    dlock_uri_free(u);
}

/* First column of the first row of sql as an integer; -1 if none. */
static long long raw_int(const char *sql)
{
    long long v = -1;
    if (mysql_query(raw, sql) != 0) {
        diag("raw query failed: %s", mysql_error(raw));
        return -1;
    }
    MYSQL_RES *r = mysql_store_result(raw);
    MYSQL_ROW row = r ? mysql_fetch_row(r) : NULL;
    if (row && row[0])
        v = strtoll(row[0], NULL, 10);
    mysql_free_result(r);
    return v;
}

/* "UNHEX('<sha-256 of name>')": the documented key, for raw queries. */
static void key_sql(const char *name, char out[80])
{
    unsigned char k[DLOCK_SHA256_LEN];
    char hex[2 * DLOCK_SHA256_LEN + 1];
    dlock_sha256(name, strlen(name), k);
    dlock_hex(k, sizeof k, hex);
    snprintf(out, 80, "UNHEX('%s')", hex);
}

/* Session holding name, from the grants table (-1 if none recorded). */
static long long holder_session(const char *name)
{
    char key[80], sql[256];
    key_sql(name, key);
    snprintf(sql, sizeof sql, "SELECT session_id FROM dlock_locks_grants WHERE k = %s", key);
    return raw_int(sql);
}

static void test_names(void)
{
    char a[600], b[600], upper[128], lower[128], key[80], sql[256];
    dlock_client *c1 = open_ok(uri), *c2 = open_ok(uri);
    dlock_lock *l1 = NULL, *l2 = NULL;

    /* 300 bytes: longer than the 255-byte name column, equal in its 255. */
    memset(a, 'n', 300);
    memcpy(a, prefix, strlen(prefix));
    a[300] = '\0';
    memcpy(b, a, 301);
    b[299] = 'm';
    is_int(try_lock(c1, a, &l1), 0, "a 300-byte name acquires");
    is_int(try_lock(c2, b, &l2), 0, "a name equal in its first 299 bytes is another lock");
    key_sql(a, key);
    snprintf(sql, sizeof sql, "SELECT LENGTH(name) FROM dlock_locks WHERE k = %s", key);
    is_int(raw_int(sql), 255, "the row is keyed by SHA-256 of the name; the name column keeps 255 bytes");
    dlock_release(l1);
    dlock_release(l2);

    name_of(upper, sizeof upper, "CaseLock");
    name_of(lower, sizeof lower, "caselock");
    is_int(try_lock(c1, upper, &l1), 0, "'CaseLock' acquires");
    is_int(try_lock(c2, lower, &l2), 0, "'caselock' is another lock (no case folding)");
    dlock_release(l1);
    dlock_release(l2);
    name_of(upper, sizeof upper, "trailing ");
    name_of(lower, sizeof lower, "trailing");
    is_int(try_lock(c1, upper, &l1), 0, "'trailing ' acquires");
    is_int(try_lock(c2, lower, &l2), 0, "'trailing' is another lock (no PAD SPACE)");
    dlock_release(l1);
    dlock_release(l2);
    dlock_client_close(c1);
    dlock_client_close(c2);
}

/* A wait that times out must leave no lock and no queued request behind:
 * the next release goes to a live client at once, and the waiter's
 * session can do other work. */
static void test_timeout_rollback(void)
{
    char name[128], other[128];
    dlock_client *holder = open_ok(uri), *waiter = open_ok(uri), *third = open_ok(uri);
    dlock_lock *hl = NULL, *wl = NULL, *tl = NULL;
    dlock_acquire_opts o;
    name_of(name, sizeof name, "timeout");
    name_of(other, sizeof other, "timeout-other");
    is_int(try_lock(holder, name, &hl), 0, "holder acquires");

    for (int round = 0; round < 2; round++) {
        uint64_t want = round ? 1500 : 200, t0 = dlock_monotonic_ns();
        o = wait_opts(DLOCK_WAIT_DEADLINE, want, 30000);
        is_int(dlock_acquire(waiter, name, &o, &wl), DLOCK_ETIMEDOUT,
               "a %llu ms wait times out", (unsigned long long)want);
        double el = ms_since(t0);
        ok(el >= want - 5 && el < want + 250,
           "at the exact deadline, not a whole second (%.1f ms for %llu ms)", el,
           (unsigned long long)want);
    }
    is_int(try_lock(waiter, other, &wl), 0, "the waiter's client then takes another lock");
    is_int(dlock_renew(wl, 5000), 0, "and renews it");
    is_int(dlock_release(hl), 0, "holder releases");
    is_int(try_lock(third, name, &tl), 0,
           "a third client gets the lock at once: no timed-out wait was left queued");
    if (tl)
        dlock_release(tl);
    is_int(dlock_release(wl), 0, "the waiter's other lock releases");
    is_int(try_lock(waiter, name, &wl), 0, "the waiter's client can take the lock now");
    if (wl)
        dlock_release(wl);
    dlock_client_close(holder);
    dlock_client_close(waiter);
    dlock_client_close(third);
}

static void test_killed_connection(void)
{
    char name[128], sql[64];
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *la = NULL, *lb = NULL;
    name_of(name, sizeof name, "killed");
    is_int(try_lock(a, name, &la), 0, "A acquires");
    long long sid = holder_session(name);
    ok(sid > 0, "the grants table names the holding session (%lld)", sid);
    snprintf(sql, sizeof sql, "KILL %lld", sid);
    ok(mysql_query(raw, sql) == 0, "the holding session is killed: %s", mysql_error(raw));
    sleep_ms(50);
    is_int(try_lock(b, name, &lb), 0, "the server rolled back: B gets the lock at once");
    is_int(dlock_renew(la, 5000), DLOCK_ELOST, "A's renew → DLOCK_ELOST");
    diag("%s", dlock_errmsg(a));
    is_int(dlock_release(la), DLOCK_ELOST, "A's release → DLOCK_ELOST");
    ok(lb && dlock_lock_token(lb) > 0, "B holds a token");
    is_int(dlock_renew(lb, 5000), 0, "B's lock was left alone");
    if (lb)
        dlock_release(lb);

    /* Kill without a renew first: the release itself reports it. */
    is_int(try_lock(a, name, &la), 0, "A acquires again (a fresh session)");
    snprintf(sql, sizeof sql, "KILL %lld", holder_session(name));
    mysql_query(raw, sql);
    is_int(dlock_release(la), DLOCK_ELOST, "release after a kill → DLOCK_ELOST");
    is_int(try_lock(a, name, &la), 0, "and A's client keeps working");
    if (la)
        dlock_release(la);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* The lease is the session's wait_timeout: a holder that stops talking
 * loses the lock about a TTL later; renewals keep it. */
static void test_lease(void)
{
    char name[128];
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *la = NULL, *lb = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 1000);
    name_of(name, sizeof name, "lease");
    is_int(dlock_acquire(a, name, &o, &la), 0, "A acquires with a 1000 ms lease");
    int held = 1;
    for (int i = 0; i < 6; i++) { /* 2.4 s of renewals */
        sleep_ms(400);
        if (dlock_renew(la, 1000) != 0)
            held = 0;
        if (try_lock(b, name, &lb) != DLOCK_EBUSY)
            held = 0;
    }
    ok(held, "renewing every 400 ms keeps a 1000 ms lease for 2.4 s");
    uint64_t t0 = dlock_monotonic_ns();
    o = wait_opts(DLOCK_WAIT_DEADLINE, 6000, 30000);
    is_int(dlock_acquire(b, name, &o, &lb), 0, "once A stops renewing, B gets the lock");
    double el = ms_since(t0);
    ok(el >= 900 && el < 2600, "about a TTL after the last renewal (%.0f ms; TTL 1000 ms)", el);
    is_int(dlock_renew(la, 1000), DLOCK_ELOST, "A's renew → DLOCK_ELOST");
    is_int(dlock_release(la), DLOCK_ELOST, "A's release → DLOCK_ELOST");
    if (lb)
        dlock_release(lb);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Each lock has its own transaction: releasing one keeps the other. */
static void test_two_locks(void)
{
    char x[128], y[128];
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *lx = NULL, *ly = NULL, *l = NULL;
    name_of(x, sizeof x, "two-x");
    name_of(y, sizeof y, "two-y");
    is_int(try_lock(a, x, &lx), 0, "A takes x");
    is_int(try_lock(a, y, &ly), 0, "A takes y too");
    is_int(dlock_release(lx), 0, "A releases x");
    is_int(try_lock(b, y, &l), DLOCK_EBUSY, "y is still held by A");
    is_int(try_lock(b, x, &l), 0, "x is free");
    if (l)
        dlock_release(l);
    is_int(dlock_release(ly), 0, "A releases y");
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A holder killed after its grant: its transaction rolls back, but its
 * token was committed, so the next holder's token is higher. */
static void test_token_after_death(void)
{
    char name[128];
    int p[2];
    uint64_t dead_token = 0;
    name_of(name, sizeof name, "token-death");
    if (pipe(p) != 0)
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        dlock_client *c = open_ok(uri);
        dlock_lock *l = NULL;
        uint64_t t = try_lock(c, name, &l) == 0 ? dlock_lock_token(l) : 0;
        if (write(p[1], &t, sizeof t) != sizeof t)
            _exit(1);
        pause();
        _exit(0);
    }
    close(p[1]);
    if (read(p[0], &dead_token, sizeof dead_token) != sizeof dead_token)
        dead_token = 0;
    close(p[0]);
    ok(dead_token > 0, "a holder process acquired (token %llu)", (unsigned long long)dead_token);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 5000, 30000);
    is_int(dlock_acquire(c, name, &o, &l), 0, "the killed holder's lock is free");
    ok(l && dlock_lock_token(l) > dead_token, "the next token is higher (%llu > %llu)",
       (unsigned long long)(l ? dlock_lock_token(l) : 0), (unsigned long long)dead_token);
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

/* The same URI with the query replaced by q (NULL: none), host kept. */
static void with_query(const char *q, char *out, size_t len)
{
    const char *mark = strchr(uri, '?');
    int base = mark ? (int)(mark - uri) : (int)strlen(uri);
    snprintf(out, len, "%.*s%s%s", base, uri, q ? "?" : "", q ? q : "");
}

static void expect_open(const char *u, int want, const char *what)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(u, &c);
    is_int(rc, want, "%s", what);
    if (rc != want)
        diag("%s", dlock_errmsg(c));
    dlock_client_close(c);
}

static void test_options(void)
{
    static const struct {
        const char *query;
        const char *why;
    } bad[] = {
        {"tls=maybe", "tls=maybe rejected"},
        {"tls_ca=/nonexistent", "tls_ca without tls rejected"},
        {"table=bad-name", "a table name with '-' rejected"},
        {"table=t123456789012345678901234567890123456789012345678901234567",
         "a table name over 57 characters rejected"},
        {"connect_timeout=0", "connect_timeout=0 rejected"},
        {"timeout=abc", "timeout=abc rejected"},
    };
    char u[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        with_query(bad[i].query, u, sizeof u);
        expect_open(u, DLOCK_EBADURI, bad[i].why);
    }
    expect_open("mysql://dlock:x@127.0.0.1:3310", DLOCK_EBADURI, "a URI without a database rejected");
    expect_open("mysql://dlock:x@127.0.0.1:3310,127.0.0.1:3311/dlock", DLOCK_EBADURI,
                "two hosts rejected");

    /* The server runs without TLS: requiring it must fail, not fall back. */
    with_query("tls=on", u, sizeof u);
    expect_open(u, DLOCK_ECONNECT, "tls=on against a server without TLS → DLOCK_ECONNECT");
    with_query("tls=verify", u, sizeof u);
    expect_open(u, DLOCK_ECONNECT, "tls=verify against a server without TLS → DLOCK_ECONNECT");

    const char *secret = "another-Secret-77";
    dlock_uri *pu = NULL;
    char err[256];
    dlock_uri_parse(uri, &pu, err, sizeof err);
    snprintf(u, sizeof u, "mariadb://%s:%s@%s:%u%s", dlock_uri_user(pu), secret,
             dlock_uri_host(pu, 0), dlock_uri_port(pu, 0), dlock_uri_path(pu));
    dlock_client *c = NULL;
    is_int(dlock_client_open(u, &c), DLOCK_EAUTH, "mariadb:// with a wrong password → DLOCK_EAUTH");
    ok(!strstr(dlock_errmsg(c), secret), "the message hides the password: %s", dlock_errmsg(c));
    dlock_client_close(c);

    /* A table of our own: created on first use, and used. */
    char table[64], q[160], name[128];
    snprintf(table, sizeof table, "dlock_test_%d", (int)getpid());
    snprintf(q, sizeof q, "table=%s&connect_timeout=3000&timeout=4000", table);
    with_query(q, u, sizeof u);
    c = NULL;
    is_int(dlock_client_open(u, &c), 0, "option table=%s opens (creating the tables)", table);
    dlock_lock *l = NULL;
    name_of(name, sizeof name, "own-table");
    is_int(try_lock(c, name, &l), 0, "and locks in it");
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT token FROM %s_grants", table);
    is_int(raw_int(sql), 1, "its grants table has the first token");
    is_int(dlock_client_ping(c), 0, "ping (SELECT 1)");
    dlock_client_close(c);
    snprintf(sql, sizeof sql, "DROP TABLE %s, %s_grants", table, table);
    mysql_query(raw, sql);
    dlock_uri_free(pu);
}

static void test_socket(void)
{
    const char *dir = getenv("DLOCK_STORES_DIR");
    char sock[512], u[1024], name[128];
    struct stat st;
    snprintf(sock, sizeof sock, "%s/mariadb/mysqld.sock", dir && *dir ? dir : "/tmp/dlock-stores");
    if (stat(sock, &st) != 0) {
        skip("no MariaDB socket at DLOCK_STORES_DIR/mariadb/mysqld.sock", "unix socket URI");
        return;
    }
    dlock_uri *pu = NULL;
    char err[256];
    dlock_uri_parse(uri, &pu, err, sizeof err);
    snprintf(u, sizeof u, "mysql://%s:%s@localhost%s?socket=%s", dlock_uri_user(pu),
             dlock_uri_password(pu), dlock_uri_path(pu), sock);
    dlock_client *c = NULL;
    is_int(dlock_client_open(u, &c), 0, "a unix socket URI opens (%s)", sock);
    dlock_lock *l = NULL;
    name_of(name, sizeof name, "socket");
    is_int(c ? try_lock(c, name, &l) : -1, 0, "and locks");
    if (l)
        dlock_release(l);
    dlock_client_close(c);
    snprintf(u, sizeof u, "mysql://%s:%s@127.0.0.1%s?socket=%s", dlock_uri_user(pu),
             dlock_uri_password(pu), dlock_uri_path(pu), sock);
    expect_open(u, DLOCK_EBADURI, "socket with a host other than localhost rejected");
    dlock_uri_free(pu);
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

static void test_silent_server_connect(void)
{
    int port, fd = silent_listener(&port);
    char u[256];
    dlock_client *c = NULL;
    snprintf(u, sizeof u, "mysql://dlock:x@127.0.0.1:%d/dlock?connect_timeout=1000&timeout=5000",
             port);
    uint64_t t0 = dlock_monotonic_ns();
    int rc = dlock_client_open(u, &c);
    double el = ms_since(t0);
    is_int(rc, DLOCK_ECONNECT, "a server that accepts and never answers: open → ECONNECT");
    ok(el >= 900 && el < 1000 + 3000, "within connect_timeout=1000, not timeout=5000 (%.0f ms): %s",
       el, dlock_errmsg(c));
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
    const uint64_t timeout = 1000, connect = 1000, slack = 3000;
    proxy_for_uri(&p, uri);
    proxy_uri(&p, uri, "timeout=1000&connect_timeout=1000", pu, sizeof pu);
    name_of(a, sizeof a, "silent-a");
    name_of(b, sizeof b, "silent-b");
    name_of(y1, sizeof y1, "silent-y1");
    name_of(y2, sizeof y2, "silent-y2");
    name_of(z, sizeof z, "silent-z");
    dlock_client *c = open_ok(pu);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 3000);
    is_int(dlock_acquire(c, a, &o, &la), 0, "through the proxy: acquire A");
    is_int(dlock_acquire(c, b, &o, &lb), 0, "and B");
    /* Two idle sessions in the pool, for the try below. */
    is_int(dlock_acquire(c, y1, &o, &l1), 0, "and two more, released: two pooled sessions");
    is_int(dlock_acquire(c, y2, &o, &l2), 0, "(the second)");
    dlock_release(l1);
    dlock_release(l2);

    proxy_set(&p, PROXY_BLACKHOLE);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, z, &o, &lz), DLOCK_ECONNECT, "silent network: a try → ECONNECT");
    double el = ms_since(t0);
    /* No KILL QUERY for a try, which would wait on the silent control
     * session as long again. */
    ok(el >= timeout - 50 && el < 2 * timeout - 100,
       "after the timeout, nothing else waited for (%.0f ms; timeout %llu ms): %s", el,
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
    ok(el < 2 * timeout - 100, "within the timeout, not retried on a new session (%.0f ms): %s", el,
       dlock_errmsg(c));
    t0 = dlock_monotonic_ns();
    is_int(dlock_client_ping(c), DLOCK_ECONNECT, "ping on a new control session → ECONNECT");
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
    /* The server rolls back once the proxy closes the sessions. */
    dlock_client *e = open_ok(uri);
    o = wait_opts(DLOCK_WAIT_DEADLINE, 5000, 0);
    is_int(dlock_acquire(e, a, &o, &la), 0, "A is free on the server afterwards");
    is_int(dlock_acquire(e, b, &o, &lb), 0, "and B");
    dlock_client_close(e);
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
    name_of(a, sizeof a, "keep-a");
    name_of(b, sizeof b, "keep-b");
    dlock_client *c = open_ok(uri), *other = open_ok(uri);
    dlock_lock *la = NULL, *lb = NULL, *ob = NULL, *oa = NULL;
    is_int(try_lock(other, b, &ob), 0, "another client holds B");
    lost_calls = 0;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 1000);
    o.keep = 1;
    o.on_lost = count_lost;
    is_int(dlock_acquire(c, a, &o, &la), 0, "A acquired with keep, TTL 1000 ms");
    uint64_t t0 = dlock_monotonic_ns();
    o = wait_opts(DLOCK_WAIT_DEADLINE, 5000, 0);
    is_int(dlock_acquire(c, b, &o, &lb), DLOCK_ETIMEDOUT, "the same client waits 5 s for B");
    ok(ms_since(t0) >= 4900, "(%.0f ms)", ms_since(t0));
    is_int(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 0, "A was not reported lost");
    is_int(dlock_lock_lost(la), 0, "dlock_lock_lost(A) = 0");
    is_int(try_lock(other, a, &oa), DLOCK_EBUSY, "A is still held on the server");
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
    name_of(name, sizeof name, "keep-wait");
    dlock_client *c = open_ok(uri), *other = open_ok(uri);
    dlock_lock *l = NULL, *ol = NULL;
    is_int(try_lock(other, name, &ol), 0, "another client holds the lock");
    struct later rel = {ol, 3000};
    pthread_t th;
    pthread_create(&th, NULL, release_later, &rel);
    lost_calls = 0;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, 1000);
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
    setvbuf(stdout, NULL, _IOLBF, 0);
    uri = need_env("DLOCK_MYSQL_URI");
    snprintf(prefix, sizeof prefix, "tm-%d-%08x/", (int)getpid(),
             (unsigned)(dlock_monotonic_ns() & 0xffffffffu));
    raw_connect();
    dlock_client_close(open_ok(uri)); /* creates the tables if needed */

    test_names();
    test_timeout_rollback();
    test_killed_connection();
    test_lease();
    test_two_locks();
    test_token_after_death();
    test_options();
    test_socket();
    test_silent_server_connect();
    test_silent_network();
    test_keep_while_waiting();
    test_keep_after_long_wait();

    mysql_close(raw);
    mysql_library_end();
    return done_testing();
}
