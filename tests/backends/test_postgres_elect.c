/*
 * PostgreSQL elections, against a real server: what the conformance suite
 * cannot see from the library.
 *
 * - value_bytes: a value with NUL bytes (and the longest one) reads back
 *   byte for byte, with the leader's term, from another client.
 * - foreign_holder: a plain lock of the name is a leader with no value,
 *   also on the session that published the last leader's value (a pooled
 *   session holding the name again for another grant), and for another
 *   client after a leader resigned.
 * - dead_leader: a leader whose session is terminated is gone at once for
 *   leader(); its proclaim is DLOCK_ELOST and writes nothing; the next
 *   candidate leads with its own value.
 * - watch_cut: an observer whose LISTEN connection is terminated opens
 *   another and still sees the next change (and the idle observer read
 *   nothing in between).
 * - peer_layout: layout=tooz and layout=int refuse elections, naming the
 *   layout.
 * - timing: p50 over 30 rounds of (a) a resign to the next candidate's
 *   campaign returning, against a release to the next waiter's grant, and
 *   (b) a proclaim to the observer's callback, against a bare NOTIFY to a
 *   LISTEN session (libpq). Prints the figures (diag), with a proclaim's
 *   call and one dlock_leader() alone; checks only that the medians are
 *   sane (under 100 ms): the ratios depend on the machine's load.
 *
 * Environment: DLOCK_POSTGRES_URI. Arguments: names of cases to run; none
 * runs all.
 */
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"
#include "tests/backends/pg_raw.h"

#define MS 1000000ull
#define ROUNDS 30

static const char *uri;
static char prefix[64];

static void name_of(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "%s%s", prefix, what);
}

static dlock_acquire_opts opts_wait(uint64_t ms)
{
    return wait_opts(DLOCK_WAIT_DEADLINE, ms, 10000);
}

static void test_value_bytes(void)
{
    char name[128];
    name_of(name, sizeof name, "bytes");
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    static const char v[] = "ab\0cd\0\0\xff";
    dlock_acquire_opts o = opts_wait(2000);
    dlock_lock *l = NULL;
    is_int(dlock_campaign(a, name, v, sizeof v - 1, &o, &l), 0, "campaign with NUL bytes");
    dlock_leader_info li;
    is_int(dlock_leader(b, name, &li), 0, "leader read by another client");
    ok(li.held && li.value_len == sizeof v - 1 && memcmp(li.value, v, sizeof v - 1) == 0,
       "the value reads back byte for byte (%zu bytes)", li.value_len);
    is_int((int)(li.term == dlock_lock_token(l)), 1, "the term is the grant's token");
    char big[DLOCK_VALUE_MAX];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i * 7);
    is_int(dlock_proclaim(l, big, sizeof big), 0, "proclaim the longest value");
    is_int(dlock_leader(b, name, &li), 0, "read again");
    ok(li.value_len == sizeof big && memcmp(li.value, big, sizeof big) == 0,
       "1024 bytes read back");
    is_int(dlock_proclaim(l, "", 0), 0, "proclaim an empty value");
    is_int(dlock_leader(b, name, &li), 0, "read again");
    ok(li.held && li.value_len == 0, "held, no value");
    is_int(dlock_resign(l), 0, "resign");
    is_int(dlock_leader(b, name, &li), 0, "read after the resign");
    is_int(li.held, 0, "no leader");
    dlock_client_close(a);
    dlock_client_close(b);
}

static void test_foreign_holder(void)
{
    char name[128];
    name_of(name, sizeof name, "foreign");
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_acquire_opts o = opts_wait(2000);
    dlock_lock *l = NULL, *p = NULL;
    dlock_leader_info li;
    is_int(dlock_acquire(a, name, &o, &p), 0, "a plain lock of the name");
    is_int(dlock_leader(b, name, &li), 0, "leader read");
    ok(li.held && li.value_len == 0, "a leader with no value");
    dlock_release(p);
    is_int(dlock_campaign(a, name, "first", 5, &o, &l), 0, "campaign");
    is_int(dlock_resign(l), 0, "resign");
    /* A try goes to a's pooled session: the one that published. */
    o = wait_opts(DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(a, name, &o, &p), 0, "a plain lock of the name by the same client");
    is_int(dlock_leader(b, name, &li), 0, "leader read");
    ok(li.held && li.value_len == 0 && li.term == dlock_lock_token(p),
       "held with no value: the last leader's is not shown (%zu bytes)", li.value_len);
    dlock_release(p);
    o = opts_wait(2000);
    is_int(dlock_campaign(a, name, "second", 6, &o, &l), 0, "campaign again");
    is_int(dlock_resign(l), 0, "resign");
    o = wait_opts(DLOCK_WAIT_TRY, 0, 10000);
    is_int(dlock_acquire(b, name, &o, &p), 0, "a plain lock by another client");
    is_int(dlock_leader(a, name, &li), 0, "leader read");
    ok(li.held && li.value_len == 0, "held with no value");
    dlock_release(p);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* The pid of the session whose latest statement was for the lock (its tag
 * names the owner id), or "". */
static char *holder_pid(PGconn *raw, const char *owner)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT pid FROM pg_stat_activity WHERE query LIKE '/*dlock owner=%s%%' LIMIT 1",
             owner);
    return q1(raw, sql);
}

static void test_dead_leader(void)
{
    char name[128], sql[256];
    name_of(name, sizeof name, "dead");
    dlock_client *a = open_ok(uri), *b = open_ok(uri), *c = open_ok(uri);
    PGconn *raw = pg_raw_connect(uri);
    dlock_acquire_opts o = opts_wait(2000);
    dlock_lock *l = NULL, *m = NULL;
    dlock_leader_info li;
    is_int(dlock_campaign(a, name, "doomed", 6, &o, &l), 0, "campaign");
    is_int(dlock_leader(c, name, &li), 0, "leader read");
    char *pid = holder_pid(raw, li.owner);
    ok(pid[0] != '\0', "the leader's session is found (%s)", pid);
    snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%s)", pid[0] ? pid : "0");
    free(q1(raw, sql));
    free(pid);
    sleep_ms(100);
    is_int(dlock_leader(c, name, &li), 0, "leader read after the session's end");
    is_int(li.held, 0, "no leader: the session's end freed the lock");
    is_int(dlock_proclaim(l, "late", 4), DLOCK_ELOST, "the dead leader's proclaim is lost");
    o = opts_wait(2000);
    is_int(dlock_campaign(b, name, "next", 4, &o, &m), 0, "the next candidate leads");
    is_int(dlock_leader(c, name, &li), 0, "leader read");
    ok(li.value_len == 4 && memcmp(li.value, "next", 4) == 0, "with its own value");
    dlock_release(l);
    dlock_resign(m);
    PQfinish(raw);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(c);
}

struct seen {
    pthread_mutex_t mu;
    char want[64];
    uint64_t at; /* when want was seen */
    int calls;
};

static void on_change(dlock_observer *obs, const dlock_leader_info *li, void *user)
{
    (void)obs;
    struct seen *s = user;
    pthread_mutex_lock(&s->mu);
    s->calls++;
    if (!s->at && li->held && li->value_len == strlen(s->want) &&
        memcmp(li->value, s->want, li->value_len) == 0)
        s->at = dlock_monotonic_ns();
    pthread_mutex_unlock(&s->mu);
}

static void expect(struct seen *s, const char *v)
{
    pthread_mutex_lock(&s->mu);
    snprintf(s->want, sizeof s->want, "%s", v);
    s->at = 0;
    pthread_mutex_unlock(&s->mu);
}

static uint64_t seen_at(struct seen *s, uint64_t wait_ms)
{
    uint64_t until = dlock_monotonic_ns() + wait_ms * MS, at = 0;
    while (!at && dlock_monotonic_ns() < until) {
        pthread_mutex_lock(&s->mu);
        at = s->at;
        pthread_mutex_unlock(&s->mu);
        if (!at)
            usleep(200);
    }
    return at;
}

static void test_watch_cut(void)
{
    char name[128];
    name_of(name, sizeof name, "cut");
    dlock_client *a = open_ok(uri);
    PGconn *raw = pg_raw_connect(uri);
    struct seen s = {PTHREAD_MUTEX_INITIALIZER, "one", 0, 0};
    dlock_acquire_opts o = opts_wait(2000);
    dlock_lock *l = NULL;
    dlock_observer *obs = NULL;
    is_int(dlock_campaign(a, name, "one", 3, &o, &l), 0, "campaign");
    is_int(dlock_observe(a, name, on_change, &s, &obs), 0, "observe");
    ok(seen_at(&s, 2000) != 0, "the observer reports the leader");
    uint64_t reads = dlock_observer_reads(obs);
    sleep_ms(1000);
    is_int((int)(dlock_observer_reads(obs) - reads), 0, "an idle observer reads nothing in 1 s");
    char *n = q1(raw, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                      " WHERE query LIKE 'SET idle_session_timeout = 0; LISTEN dlock_elect_%'"
                      " AND pid <> pg_backend_pid()");
    ok(strcmp(n, "1") == 0, "the watch's connection is terminated (%s)", n);
    free(n);
    sleep_ms(300);
    expect(&s, "two");
    is_int(dlock_proclaim(l, "two", 3), 0, "proclaim");
    ok(seen_at(&s, 2000) != 0, "the observer sees the change on its new watch");
    dlock_observer_close(obs);
    dlock_resign(l);
    PQfinish(raw);
    dlock_client_close(a);
}

static void test_peer_layout(void)
{
    static const char *const layouts[] = {"tooz", "int"};
    for (size_t i = 0; i < 2; i++) {
        char u[1024], name[128];
        snprintf(u, sizeof u, "%s%slayout=%s", uri, strchr(uri, '?') ? "&" : "?", layouts[i]);
        dlock_client *c = open_ok(u);
        snprintf(name, sizeof name, "%s", i ? "4242" : "pg-elect-tooz");
        dlock_lock *l = NULL;
        dlock_acquire_opts o = opts_wait(1000);
        ok(!(dlock_client_caps(c) & DLOCK_CAP_ELECTION), "layout=%s declares no elections",
           layouts[i]);
        is_int(dlock_campaign(c, name, "x", 1, &o, &l), DLOCK_ENOTSUP, "campaign is refused");
        ok(strstr(dlock_errmsg(c), layouts[i]) != NULL, "naming the layout: %s",
           dlock_errmsg(c));
        dlock_client_close(c);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double p50(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return v[n / 2] / 1e6;
}

struct next {
    dlock_client *c;
    const char *name;
    int elect;
    dlock_lock *l;
    uint64_t at;
    int rc;
};

static void *next_main(void *p)
{
    struct next *n = p;
    dlock_acquire_opts o = opts_wait(5000);
    n->rc = n->elect ? dlock_campaign(n->c, n->name, "b", 1, &o, &n->l)
                     : dlock_acquire(n->c, n->name, &o, &n->l);
    n->at = dlock_monotonic_ns();
    return NULL;
}

/* A release (or resign) to the waiting other client's return, once. */
static uint64_t handoff(dlock_client *a, dlock_client *b, const char *name, int elect)
{
    dlock_acquire_opts o = opts_wait(5000);
    dlock_lock *l = NULL;
    int rc = elect ? dlock_campaign(a, name, "a", 1, &o, &l) : dlock_acquire(a, name, &o, &l);
    if (rc)
        return 0;
    struct next n = {b, name, elect, NULL, 0, 0};
    pthread_t t;
    pthread_create(&t, NULL, next_main, &n);
    sleep_ms(30); /* queued */
    uint64_t start = dlock_monotonic_ns();
    if (elect)
        dlock_resign(l);
    else
        dlock_release(l);
    pthread_join(t, NULL);
    if (n.rc)
        return 0;
    dlock_release(n.l);
    return n.at - start;
}

/* A bare NOTIFY from one libpq session to another that LISTENs. */
static uint64_t notify_rtt(PGconn *tx, PGconn *rx)
{
    uint64_t start = dlock_monotonic_ns();
    PQclear(PQexec(tx, "NOTIFY dlock_test_rtt"));
    for (;;) {
        PQconsumeInput(rx);
        PGnotify *n = PQnotifies(rx);
        if (n) {
            PQfreemem(n);
            return dlock_monotonic_ns() - start;
        }
        struct pollfd p = {PQsocket(rx), POLLIN, 0};
        if (poll(&p, 1, 2000) <= 0)
            return 0;
    }
}

static void test_timing(void)
{
    char name[128], lname[128];
    name_of(name, sizeof name, "timing");
    name_of(lname, sizeof lname, "timing-lock");
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    uint64_t el[ROUNDS], lk[ROUNDS], ob[ROUNDS], nt[ROUNDS], pr[ROUNDS], rd[ROUNDS];
    int good = 1;
    for (int i = 0; i < ROUNDS; i++) {
        lk[i] = handoff(a, b, lname, 0);
        el[i] = handoff(a, b, name, 1);
        good &= lk[i] && el[i];
    }
    ok(good, "%d handoffs of each kind", ROUNDS);
    PGconn *tx = pg_raw_connect(uri), *rx = pg_raw_connect(uri);
    PQclear(PQexec(rx, "LISTEN dlock_test_rtt"));
    struct seen s = {PTHREAD_MUTEX_INITIALIZER, "v0", 0, 0};
    dlock_acquire_opts o = opts_wait(2000);
    dlock_lock *l = NULL;
    dlock_observer *obs = NULL;
    good = dlock_campaign(a, name, "v0", 2, &o, &l) == 0 &&
           dlock_observe(b, name, on_change, &s, &obs) == 0 && seen_at(&s, 2000);
    for (int i = 0; good && i < ROUNDS; i++) {
        char v[16];
        snprintf(v, sizeof v, "v%d", i + 1);
        nt[i] = notify_rtt(tx, rx);
        expect(&s, v);
        uint64_t start = dlock_monotonic_ns();
        good &= dlock_proclaim(l, v, strlen(v)) == 0;
        pr[i] = dlock_monotonic_ns() - start;
        uint64_t at = seen_at(&s, 2000);
        ob[i] = at > start ? at - start : 0;
        good &= ob[i] && nt[i];
        sleep_ms(5);
        dlock_leader_info li;
        start = dlock_monotonic_ns();
        good &= dlock_leader(a, name, &li) == 0;
        rd[i] = dlock_monotonic_ns() - start;
    }
    ok(good, "%d proclaims seen by the observer", ROUNDS);
    dlock_observer_close(obs);
    dlock_resign(l);
    if (good) {
        double pe = p50(el, ROUNDS), pl = p50(lk, ROUNDS), po = p50(ob, ROUNDS),
               pn = p50(nt, ROUNDS);
        diag("p50 over %d rounds: resign -> next leader %.3f ms; release -> next holder %.3f ms"
             " (%.2fx)", ROUNDS, pe, pl, pe / pl);
        diag("p50 over %d rounds: proclaim -> observer's callback %.3f ms; bare NOTIFY -> "
             "LISTEN %.3f ms (%.2fx)", ROUNDS, po, pn, po / pn);
        diag("p50 over %d rounds: a proclaim's call %.3f ms; a dlock_leader() %.3f ms", ROUNDS,
             p50(pr, ROUNDS), p50(rd, ROUNDS));
        /* The ratios depend on the machine's load: told, not checked. */
        ok(pe < 100 && po < 100, "both medians under 100 ms");
    }
    PQfinish(tx);
    PQfinish(rx);
    dlock_client_close(a);
    dlock_client_close(b);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"value_bytes", test_value_bytes},
    {"foreign_holder", test_foreign_holder},
    {"dead_leader", test_dead_leader},
    {"watch_cut", test_watch_cut},
    {"peer_layout", test_peer_layout},
    {"timing", test_timing},
};

int main(int argc, char **argv)
{
    uri = need_env("DLOCK_POSTGRES_URI");
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(prefix, sizeof prefix, "pg-elect-%d-%llu/", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() % 1000000007ull));
    PG_RUN_CASES(cases, argc, argv);
    return done_testing();
}
