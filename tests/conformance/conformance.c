/*
 * One conformance suite for every backend: `conformance URI`.
 *
 * The same cases run against every store. A case that needs a capability
 * the backend does not declare is reported as "# SKIP" with the reason, so
 * a missing behaviour is never a silent pass. Holders and waiters are
 * separate processes (fork), as in real use.
 *
 * Usage: conformance [--auth-env VAR] (URI | --env VAR)
 *   --env VAR       read the URI from the environment variable VAR (a
 *                   missing variable fails the run: no silent skip)
 *   --auth-env VAR  VAR holds a URI of the same store type with a correct
 *                   password: the suite checks it works and that a wrong
 *                   one is refused with DLOCK_EAUTH
 * For networked stores the suite also points the URI at a closed loopback
 * port and expects DLOCK_ECONNECT.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include "core/uri.h"
#include "dlock_backend.h"
#include "tests/tap.h"
#include "tests/util.h"

static const char *uri;
static const char *auth_uri;
static unsigned int caps;
static char prefix[64]; /* per-run name prefix: runs never collide */

#define MS 1000000ull

static void name_of(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "%s%s", prefix, what);
}

static dlock_client *client(void)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(uri, &c);
    if (rc) {
        char shown[1024];
        fprintf(stderr, "conformance: cannot open %s: %s (%s)\n",
                shown_uri(uri, shown, sizeof shown), dlock_errmsg(c),
                dlock_err_name(rc));
        exit(99);
    }
    return c;
}

static dlock_acquire_opts wait_for(uint64_t ms)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_DEADLINE;
    o.deadline_ns = dlock_monotonic_ns() + ms * MS;
    return o;
}

static dlock_acquire_opts try_once(void)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_TRY;
    return o;
}


/*
 * A holder in another process: acquires name (waiting up to 10 s), writes
 * its token to the report pipe, then holds until the parent writes a byte
 * to (or closes) the control pipe, and releases.
 */
struct holder {
    pid_t pid;
    int report, control;
};

static struct holder spawn_holder(const char *name, uint32_t ttl_ms)
{
    struct holder h = {-1, -1, -1};
    int rp[2], cp[2];
    if (pipe(rp) < 0 || pipe(cp) < 0)
        abort();
    h.pid = fork();
    if (h.pid == 0) {
        dlock_client *c = client();
        dlock_acquire_opts o = wait_for(10000);
        dlock_lock *l = NULL;
        uint64_t token = 0;
        char b;
        close(rp[0]);
        close(cp[1]);
        o.ttl_ms = ttl_ms;
        if (dlock_acquire(c, name, &o, &l) == 0)
            token = dlock_lock_token(l);
        if (write(rp[1], &token, sizeof token) != sizeof token)
            _exit(3);
        if (read(cp[0], &b, 1) < 0)
            _exit(4);
        int rc = l ? dlock_release(l) : -1;
        dlock_client_close(c);
        _exit(rc == 0 ? 0 : 2);
    }
    close(rp[1]);
    close(cp[0]);
    h.report = rp[0];
    h.control = cp[1];
    return h;
}

static uint64_t holder_token(struct holder *h)
{
    uint64_t token = 0;
    if (read(h->report, &token, sizeof token) != sizeof token)
        return 0;
    return token;
}

/* Tells the holder to release and returns its exit status (0 = clean). */
static int holder_finish(struct holder *h)
{
    int st = 0;
    if (write(h->control, "x", 1) != 1)
        return -1;
    close(h->control);
    close(h->report);
    waitpid(h->pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}


/*
 * Rewrites a networked URI: with port, every host becomes 127.0.0.1:port;
 * with password, the password is replaced. Keeps user, path and query.
 * Returns -1 for URIs without hosts (file://).
 */
static int derive_uri(const char *src, int port, const char *password, char *out, size_t len)
{
    dlock_uri *u = NULL;
    char err[256], hosts[512] = "";
    size_t o = 0;
    if (dlock_uri_parse(src, &u, err, sizeof err) != 0 || dlock_uri_host_count(u) == 0) {
        dlock_uri_free(u);
        return -1;
    }
    for (size_t i = 0; i < dlock_uri_host_count(u); i++) {
        const char *h = dlock_uri_host(u, i);
        unsigned p = dlock_uri_port(u, i);
        int v6 = strchr(h, ':') != NULL;
        if (port)
            o += (size_t)snprintf(hosts + o, sizeof hosts - o, "%s127.0.0.1:%d", i ? "," : "", port);
        else
            o += (size_t)snprintf(hosts + o, sizeof hosts - o, "%s%s%s%s", i ? "," : "",
                                  v6 ? "[" : "", h, v6 ? "]" : "");
        if (p && !port)
            o += (size_t)snprintf(hosts + o, sizeof hosts - o, ":%u", p);
    }
    const char *q = strchr(src, '?');
    const char *user = dlock_uri_user(u), *pw = password ? password : dlock_uri_password(u);
    snprintf(out, len, "%s://%s%s%s%s%s%s%s", dlock_uri_scheme(u), user ? user : "",
             pw ? ":" : "", pw ? pw : "", user || pw ? "@" : "", hosts, dlock_uri_path(u),
             q ? q : "");
    dlock_uri_free(u);
    return 0;
}

static void test_open_and_options(void)
{
    dlock_client *c = NULL;
    char bad[1024];
    snprintf(bad, sizeof bad, "%s%cdlock_no_such_option=1", uri, strchr(uri, '?') ? '&' : '?');
    is_int(dlock_client_open(bad, &c), DLOCK_EBADURI, "unknown URI option rejected");
    ok(strstr(dlock_errmsg(c), "dlock_no_such_option") != NULL, "message names the option");
    dlock_client_close(c);

    if (auth_uri) {
        c = NULL;
        is_int(dlock_client_open(auth_uri, &c), 0, "the right password opens");
        dlock_client_close(c);
        if (derive_uri(auth_uri, 0, "wrong-password-x9", bad, sizeof bad) != 0) {
            ok(0, "cannot derive a wrong-password URI from %s", auth_uri);
        } else {
            c = NULL;
            is_int(dlock_client_open(bad, &c), DLOCK_EAUTH, "wrong password → DLOCK_EAUTH");
            ok(!strstr(dlock_errmsg(c), "wrong-password-x9"), "auth error hides the password: %s",
               dlock_errmsg(c));
            dlock_client_close(c);
        }
    } else {
        skip("this store takes no credentials (no --auth-env)", "the right password opens");
        skip("this store takes no credentials (no --auth-env)", "wrong password → DLOCK_EAUTH");
    }
    char closed[1024];
    if (derive_uri(uri, closed_port(), NULL, closed, sizeof closed) == 0) {
        uint64_t t0 = dlock_monotonic_ns();
        c = NULL;
        is_int(dlock_client_open(closed, &c), DLOCK_ECONNECT, "closed port → DLOCK_ECONNECT");
        ok(dlock_monotonic_ns() - t0 < 10000 * MS, "connect failure reported within 10 s");
        ok(strstr(dlock_errmsg(c), "127.0.0.1") != NULL, "the message names the host: %s",
           dlock_errmsg(c));
        dlock_client_close(c);
    } else {
        skip("this store has no network endpoint", "closed port → DLOCK_ECONNECT");
    }
}

static void test_try_deadline_forever(void)
{
    char name[128];
    dlock_client *c = client();
    dlock_lock *l = NULL;
    dlock_acquire_opts o = try_once();
    struct holder h;
    uint64_t t0, el;

    name_of(name, sizeof name, "tdf");
    h = spawn_holder(name, 30000);
    ok(holder_token(&h) > 0, "holder process acquired");

    t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EBUSY, "try on a held lock → DLOCK_EBUSY");
    el = dlock_monotonic_ns() - t0;
    ok(el < 1000 * MS, "try returned at once (%.2f ms; bound 1 s)", el / 1e6);

    o = wait_for(300);
    t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_ETIMEDOUT, "deadline wait → DLOCK_ETIMEDOUT");
    el = dlock_monotonic_ns() - t0;
    ok(el >= 290 * MS && el < 3000 * MS, "timed out near the deadline (%.1f ms for 300 ms)",
       el / 1e6);

    o = wait_for(0);
    o.deadline_ns = dlock_monotonic_ns() - 1;
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_ETIMEDOUT, "deadline already past → ETIMEDOUT");

    /* Forever: the holder releases 200 ms after we start waiting. */
    pid_t releaser = fork();
    if (releaser == 0) {
        sleep_ms(200);
        _exit(write(h.control, "x", 1) == 1 ? 0 : 1);
    }
    o = (dlock_acquire_opts)DLOCK_ACQUIRE_OPTS_INIT; /* wait forever */
    alarm(30); /* a hang fails the test instead of the CI run */
    t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, name, &o, &l), 0, "forever wait gets the lock on release");
    el = dlock_monotonic_ns() - t0;
    alarm(0);
    ok(el >= 150 * MS, "it really waited for the release (%.1f ms)", el / 1e6);
    int st;
    waitpid(releaser, &st, 0);
    close(h.control);
    close(h.report);
    waitpid(h.pid, &st, 0);
    is_int(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0, "holder released cleanly");
    if (l)
        is_int(dlock_release(l), 0, "release after the wait");
    dlock_client_close(c);
}

static void test_same_process(void)
{
    char name[128];
    dlock_client *a = client(), *b = client();
    dlock_lock *la = NULL, *lb = NULL, *again = NULL;
    dlock_acquire_opts o = try_once();
    name_of(name, sizeof name, "same-process");
    is_int(dlock_acquire(a, name, &o, &la), 0, "client A acquires");
    is_int(dlock_acquire(b, name, &o, &lb), DLOCK_EBUSY, "client B in the same process is refused");
    is_int(dlock_acquire(a, name, &o, &again), DLOCK_EALREADY, "A again → DLOCK_EALREADY (no stacking)");
    is_int(dlock_renew(la, 5000), 0, "renew while held succeeds");
    dlock_client_close(a); /* closing releases what A holds */
    is_int(dlock_acquire(b, name, &o, &lb), 0, "closing A freed the lock for B");
    dlock_client_close(b);
}

static void test_tokens(void)
{
    char name[128];
    dlock_client *a = client(), *b = client();
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_for(5000);
    uint64_t last = 0;
    int increasing = 1;
    name_of(name, sizeof name, "tokens");
    for (int i = 0; i < 20; i++) {
        dlock_client *c = i % 2 ? a : b;
        o = wait_for(5000);
        if (dlock_acquire(c, name, &o, &l) != 0) {
            increasing = 0;
            break;
        }
        if (dlock_lock_token(l) <= last)
            increasing = 0;
        last = dlock_lock_token(l);
        dlock_release(l);
    }
    ok(increasing, "tokens strictly increase across 20 grants on two clients");
    /* and across processes */
    struct holder h = spawn_holder(name, 30000);
    uint64_t t = holder_token(&h);
    ok(t > last, "another process gets a higher token (%llu > %llu)", (unsigned long long)t,
       (unsigned long long)last);
    is_int(holder_finish(&h), 0, "holder released");
    o = wait_for(5000);
    if (dlock_acquire(a, name, &o, &l) == 0) {
        ok(dlock_lock_token(l) > t, "and the next grant is higher still");
        dlock_release(l);
    } else {
        ok(0, "reacquire after the holder process: %s", dlock_errmsg(a));
    }
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Mutual exclusion: N processes × M iterations on a counter that only the
 * lock protects; the counter must come out exact and the tokens seen
 * inside the lock must be strictly increasing. */
struct shared {
    volatile long counter;
    volatile int inside;
    volatile int overlaps;
    volatile long ntokens;
    uint64_t tokens[];
};

static void test_mutual_exclusion(int nproc, int iters)
{
    char name[128];
    size_t sz = sizeof(struct shared) + sizeof(uint64_t) * (size_t)(nproc * iters);
    struct shared *s = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pids[64];
    int failures = 0;
    name_of(name, sizeof name, "mutex");
    for (int p = 0; p < nproc; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            dlock_client *c = client();
            for (int i = 0; i < iters; i++) {
                dlock_lock *l = NULL;
                dlock_acquire_opts o = wait_for(30000);
                if (dlock_acquire(c, name, &o, &l) != 0)
                    _exit(2);
                if (__atomic_exchange_n(&s->inside, 1, __ATOMIC_SEQ_CST))
                    __atomic_add_fetch(&s->overlaps, 1, __ATOMIC_SEQ_CST);
                long v = s->counter; /* deliberately not atomic */
                if (i % 7 == 0)
                    sched_yield();
                s->counter = v + 1;
                s->tokens[s->ntokens] = dlock_lock_token(l);
                s->ntokens = s->ntokens + 1;
                __atomic_store_n(&s->inside, 0, __ATOMIC_SEQ_CST);
                if (dlock_release(l) != 0)
                    _exit(3);
            }
            dlock_client_close(c);
            _exit(0);
        }
    }
    for (int p = 0; p < nproc; p++) {
        int st;
        waitpid(pids[p], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failures++;
    }
    is_int(failures, 0, "%d processes all finished cleanly", nproc);
    is_int(s->counter, (long)nproc * iters, "shared counter exact after %d x %d locked increments",
           nproc, iters);
    is_int(s->overlaps, 0, "no two holders were ever inside together");
    int increasing = s->ntokens == (long)nproc * iters;
    for (long i = 1; i < s->ntokens; i++)
        if (s->tokens[i] <= s->tokens[i - 1])
            increasing = 0;
    ok(increasing, "tokens strictly increase in grant order (%ld grants)", s->ntokens);
    munmap(s, sz);
}

static void test_holder_killed(void)
{
    char name[128];
    dlock_client *c = client();
    dlock_lock *l = NULL;
    dlock_acquire_opts o;
    uint32_t ttl = 2000;
    name_of(name, sizeof name, "killed");
    struct holder h = spawn_holder(name, ttl);
    ok(holder_token(&h) > 0, "holder process acquired");
    kill(h.pid, SIGKILL);
    waitpid(h.pid, NULL, 0);
    close(h.control);
    close(h.report);
    /* Freed at once where the store sees the death, else within the TTL. */
    uint64_t bound = (caps & DLOCK_CAP_HOLDER_DEATH) ? 5000 : ttl + 5000;
    uint64_t t0 = dlock_monotonic_ns();
    o = wait_for(bound);
    is_int(dlock_acquire(c, name, &o, &l), 0, "a SIGKILLed holder's lock becomes free");
    diag("freed after %.1f ms", (dlock_monotonic_ns() - t0) / 1e6);
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

/* A waiter killed while queued must not hold up the one behind it: the
 * store frees its place at once or, at worst, when its session times out. */
static void test_dead_waiter(void)
{
    char name[128];
    name_of(name, sizeof name, "dead-waiter");
    struct holder h = spawn_holder(name, 30000);
    ok(holder_token(&h) > 0, "holder process acquired");
    pid_t doomed = fork();
    if (doomed == 0) {
        dlock_client *c = client();
        dlock_lock *l = NULL;
        dlock_acquire_opts o = wait_for(30000);
        dlock_acquire(c, name, &o, &l); /* queued, then killed */
        _exit(0);
    }
    sleep_ms(200);
    pid_t next = fork();
    if (next == 0) {
        dlock_client *c = client();
        dlock_lock *l = NULL;
        dlock_acquire_opts o = wait_for(15000);
        int rc = dlock_acquire(c, name, &o, &l);
        if (rc == 0)
            dlock_release(l);
        dlock_client_close(c);
        _exit(rc == 0 ? 0 : 1);
    }
    sleep_ms(200);
    kill(doomed, SIGKILL);
    waitpid(doomed, NULL, 0);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(holder_finish(&h), 0, "holder released");
    int st;
    waitpid(next, &st, 0);
    is_int(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0,
           "the waiter behind a killed waiter gets the lock (bound 15 s)");
    diag("after %.1f ms", (dlock_monotonic_ns() - t0) / 1e6);
}

/* Waiters queue one by one (each surely blocked before the next starts);
 * they must be served in that order. */
static void test_fifo(void)
{
    enum { N = 5 };
    char name[128], path[] = "/tmp/dlock-fifo-XXXXXX";
    if (!(caps & DLOCK_CAP_FIFO)) {
        skip("the backend does not declare DLOCK_CAP_FIFO", "waiters are served first-come first-served");
        return;
    }
    int fd = mkstemp(path);
    pid_t pids[N];
    name_of(name, sizeof name, "fifo");
    struct holder h = spawn_holder(name, 30000);
    ok(holder_token(&h) > 0, "holder process acquired");
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            dlock_client *c = client();
            dlock_lock *l = NULL;
            dlock_acquire_opts o = wait_for(20000);
            char ch = (char)('0' + i);
            if (dlock_acquire(c, name, &o, &l) != 0)
                _exit(2);
            if (write(fd, &ch, 1) != 1)
                _exit(3);
            sleep_ms(20);
            dlock_release(l);
            /* Straight back for more: with waiters still queued, first-come
             * first-served must refuse us (no barging). */
            dlock_acquire_opts t = try_once();
            if (i < N - 1 && dlock_acquire(c, name, &t, &l) == 0) {
                if (write(fd, "B", 1) != 1)
                    _exit(3);
                dlock_release(l);
            }
            dlock_client_close(c);
            _exit(0);
        }
        sleep_ms(150); /* let waiter i block before waiter i+1 arrives */
    }
    holder_finish(&h);
    int clean = 1;
    for (int i = 0; i < N; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        clean &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    char order[2 * N + 1] = "";
    ssize_t n = pread(fd, order, 2 * N, 0);
    order[n > 0 ? n : 0] = '\0';
    ok(clean, "all waiters got the lock");
    is_str(order, "01234", "waiters served in arrival order, none barging back in (B)");
    close(fd);
    unlink(path);
}

static void test_names(void)
{
    static const char *const odd[] = {
        "a/b", "a%2Fb", "../../etc/passwd", "..", ".", "it's \"quoted\"", "with space",
        "caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x94\x92", "tab\there", "Case", "case", "back\\slash",
        "semi;colon*?[]", "-dash", "~tilde",
    };
    size_t n = sizeof odd / sizeof odd[0];
    dlock_client *a = client(), *b = client();
    dlock_lock *held[32], *l = NULL;
    dlock_acquire_opts o = try_once();
    char name[DLOCK_NAME_MAX + 2];
    int all = 1, distinct = 1;
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, odd[i]);
        if (dlock_acquire(a, name, &o, &held[i]) != 0) {
            diag("acquire '%s': %s", odd[i], dlock_errmsg(a));
            all = 0;
            held[i] = NULL;
        }
    }
    ok(all, "names with /, .., quotes, spaces, unicode, case, tab all acquire together");
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, odd[i]);
        if (dlock_acquire(b, name, &o, &l) != DLOCK_EBUSY) {
            diag("'%s' was not held for client B", odd[i]);
            distinct = 0;
            if (l)
                dlock_release(l);
        }
    }
    ok(distinct, "each odd name is its own lock, held against another client");
    for (size_t i = 0; i < n; i++)
        if (held[i])
            dlock_release(held[i]);

    /* 1 KiB names, and two long names that differ only in the last byte. */
    dlock_lock *l1 = NULL, *l2 = NULL;
    memset(name, 'k', 1024);
    memcpy(name, prefix, strlen(prefix));
    name[1024] = '\0';
    is_int(dlock_acquire(a, name, &o, &l1), 0, "a 1 KiB name acquires");
    name[1023] = 'j';
    is_int(dlock_acquire(b, name, &o, &l2), 0, "a 1 KiB name differing in the last byte is another lock");
    dlock_release(l1);
    dlock_release(l2);
    memset(name, 'k', DLOCK_NAME_MAX);
    memcpy(name, prefix, strlen(prefix));
    name[DLOCK_NAME_MAX] = '\0';
    is_int(dlock_acquire(a, name, &o, &l1), 0, "a name of DLOCK_NAME_MAX bytes acquires");
    if (l1)
        dlock_release(l1);
    name[DLOCK_NAME_MAX] = 'k';
    name[DLOCK_NAME_MAX + 1] = '\0';
    is_int(dlock_acquire(a, name, &o, &l1), DLOCK_EINVAL, "one byte longer → DLOCK_EINVAL");
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Cases that only mean something on leased stores. */
static void test_leases(void)
{
    char name[128];
    if (!(caps & DLOCK_CAP_LEASE)) {
        skip("locks on this backend have no lease (DLOCK_CAP_LEASE)", "TTL expiry frees the lock");
        skip("locks on this backend have no lease (DLOCK_CAP_LEASE)",
             "stale holder's release and renew report lost, new holder untouched");
        skip("locks on this backend have no lease (DLOCK_CAP_LEASE)",
             "renew never re-creates an expired lock");
        return;
    }
    dlock_client *a = client(), *b = client();
    dlock_lock *la = NULL, *lb = NULL, *lc = NULL;
    dlock_acquire_opts o = try_once();
    name_of(name, sizeof name, "lease");
    o.ttl_ms = 300;
    is_int(dlock_acquire(a, name, &o, &la), 0, "A acquires with a 300 ms lease");
    uint64_t ta = dlock_lock_token(la);
    sleep_ms(700);
    o = wait_for(3000);
    is_int(dlock_acquire(b, name, &o, &lb), 0, "TTL expiry frees the lock");
    ok(lb && dlock_lock_token(lb) > ta, "the new holder's token is higher");
    is_int(dlock_renew(la, 5000), DLOCK_ELOST, "stale holder's renew → DLOCK_ELOST");
    is_int(dlock_release(la), DLOCK_ELOST, "stale holder's release → DLOCK_ELOST");
    o = try_once();
    is_int(dlock_acquire(a, name, &o, &lc), DLOCK_EBUSY, "the new holder's lock was left alone");
    if (lb)
        dlock_release(lb);

    o.ttl_ms = 300;
    is_int(dlock_acquire(a, name, &o, &la), 0, "acquire with a 300 ms lease");
    sleep_ms(150);
    is_int(dlock_renew(la, 1500), 0, "renew before expiry");
    sleep_ms(400);
    o = try_once();
    is_int(dlock_acquire(b, name, &o, &lb), DLOCK_EBUSY, "renew extended the lease past 300 ms");
    sleep_ms(1500);
    is_int(dlock_renew(la, 5000), DLOCK_ELOST, "renew after expiry → DLOCK_ELOST");
    is_int(dlock_acquire(b, name, &o, &lb), 0, "and did not re-create the lock");
    if (lb)
        dlock_release(lb);
    dlock_release(la);
    dlock_client_close(a);
    dlock_client_close(b);
}


int main(int argc, char **argv)
{
    dlock_client *c;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--env") == 0 && i + 1 < argc)
            uri = need_env(argv[++i]);
        else if (strcmp(argv[i], "--auth-env") == 0 && i + 1 < argc)
            auth_uri = need_env(argv[++i]);
        else if (argv[i][0] != '-' && !uri)
            uri = argv[i];
        else
            uri = NULL, i = argc;
    }
    if (!uri) {
        fprintf(stderr, "usage: conformance [--auth-env VAR] (URI | --env VAR)\n");
        return 64;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned int seed = (unsigned int)(dlock_monotonic_ns() ^ (uint64_t)getpid());
    snprintf(prefix, sizeof prefix, "conf-%d-%08x/", (int)getpid(), seed);
    c = client();
    caps = dlock_client_caps(c);
    char shown[1024];
    diag("backend %s, caps 0x%x, uri %s", dlock_client_backend(c), caps,
         shown_uri(uri, shown, sizeof shown));
    dlock_client_close(c);

    test_open_and_options();
    test_try_deadline_forever();
    test_same_process();
    test_tokens();
    test_mutual_exclusion(8, 150);
    test_holder_killed();
    test_fifo();
    test_dead_waiter();
    test_names();
    test_leases();
    return done_testing();
}
