/*
 * The conformance cases of leader election (dlock.h "Leader election"),
 * on every store and list of stores: a store that declares
 * DLOCK_CAP_ELECTION must elect one leader at a time with increasing
 * terms, publish and read its value, and tell observers each change, woken
 * by the store (DLOCK_CAP_WATCH: an idle observer reads nothing) or by the
 * core's poll; one that does not must refuse with DLOCK_ENOTSUP.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/conformance/conformance.h"

#define CANDIDATES 5
/* How soon an observer must report a change: the store's notification
 * (or the core's 100 ms poll) and one read, on a loaded CI machine. */
#define NOTICE_BOUND_MS 1500u

static int elects(void)
{
    return (caps & DLOCK_CAP_ELECTION) != 0;
}

/* Stores without elections refuse them, clearly. */
static int refused_without_elections(const char *name)
{
    if (elects())
        return 0;
    dlock_client *c = client();
    dlock_lock *l = NULL;
    dlock_observer *ob = NULL;
    dlock_leader_info li;
    is_int(dlock_campaign(c, name, "v", 1, NULL, &l), DLOCK_ENOTSUP,
           "%s: no elections: campaign is DLOCK_ENOTSUP (%s)", backend, dlock_errmsg(c));
    is_int(dlock_leader(c, name, &li), DLOCK_ENOTSUP, "%s: no elections: leader is DLOCK_ENOTSUP",
           backend);
    is_int(dlock_observe(c, name, NULL, NULL, &ob), DLOCK_ENOTSUP,
           "%s: no elections: observe is DLOCK_ENOTSUP", backend);
    dlock_client_close(c);
    return 1;
}

static dlock_acquire_opts campaign_opts(uint64_t wait_ms, uint32_t ttl_ms)
{
    dlock_acquire_opts o = wait_for(wait_ms);
    o.ttl_ms = ttl_ms;
    return o;
}

/* Campaign, leader, proclaim (bytes with a NUL inside), busy, resign. */
static void election_basics(void)
{
    char name[128], big[DLOCK_VALUE_MAX + 1];
    name_of(name, sizeof name, "elect-basics");
    dlock_client *c = client(), *d = client();
    dlock_lock *l = NULL, *m = NULL;
    dlock_leader_info li;
    dlock_acquire_opts o = campaign_opts(5000, 10000), t = try_once();
    t.ttl_ms = 10000;
    is_int(dlock_leader(c, name, &li), 0, "%s: leader of an election never run", backend);
    ok(li.held == 0 && li.term == 0 && li.value_len == 0, "... has no leader");
    int rc = dlock_campaign(c, name, "alpha", 5, &o, &l);
    is_int(rc, 0, "%s: campaign wins a free election%s%s", backend, rc ? ": " : "",
           rc ? dlock_errmsg(c) : "");
    if (!l) {
        dlock_client_close(c);
        dlock_client_close(d);
        return;
    }
    uint64_t t1 = dlock_lock_token(l);
    ok(dlock_lock_lost_fd(l) >= 0, "leadership is a kept lock (it has a loss descriptor)");
    is_int(dlock_leader(d, name, &li), 0, "another client reads the leader");
    ok(li.held == 1 && li.term == t1, "... held, its term the grant's token (%llu, %llu)",
       (unsigned long long)li.term, (unsigned long long)t1);
    ok(li.value_len == 5 && memcmp(li.value, "alpha", 5) == 0 && li.value[5] == '\0',
       "... with the published value ('%s')", li.value);
    if (li.known & DLOCK_KNOWS_OWNER)
        is_str(li.owner, dlock_lock_owner(l), "... and the leader's owner id");
    if (caps & DLOCK_CAP_LEASE)
        ok((li.known & DLOCK_KNOWS_LEASE) && li.lease_ms > 0 && li.lease_ms <= 10000,
           "... and its lease (%llu ms of 10000)", (unsigned long long)li.lease_ms);
    is_int(dlock_proclaim(l, "be\0ta", 5), 0, "proclaim a value with a NUL byte inside%s%s",
           dlock_errmsg(c)[0] ? ": " : "", dlock_errmsg(c));
    dlock_leader(d, name, &li);
    ok(li.held && li.term == t1 && li.value_len == 5 && memcmp(li.value, "be\0ta", 5) == 0,
       "the leader's value is the proclaimed one, byte for byte, same term");
    is_int(dlock_campaign(d, name, "gamma", 5, &t, &m), DLOCK_EBUSY,
           "a second candidate's try is DLOCK_EBUSY while one leads");
    memset(big, 'x', sizeof big);
    is_int(dlock_proclaim(l, big, sizeof big), DLOCK_EINVAL, "a value of %zu bytes is refused",
           sizeof big);
    is_int(dlock_campaign(d, name, NULL, 3, &t, &m), DLOCK_EINVAL,
           "no value for a length is refused");
    o.reentrant = 1;
    is_int(dlock_campaign(d, name, "g", 1, &o, &m), DLOCK_EINVAL,
           "a reentrant campaign is refused");
    o.reentrant = 0;
    is_int(dlock_resign(l), 0, "the leader resigns");
    dlock_leader(d, name, &li);
    ok(li.held == 0 && li.value_len == 0, "after the resign there is no leader");
    rc = dlock_campaign(d, name, "", 0, &o, &m);
    is_int(rc, 0, "the next candidate leads, with an empty value");
    if (m) {
        ok(dlock_lock_token(m) > t1, "with a higher term (%llu > %llu)",
           (unsigned long long)dlock_lock_token(m), (unsigned long long)t1);
        dlock_leader(c, name, &li);
        ok(li.held && li.term == dlock_lock_token(m) && li.value_len == 0,
           "read as the leader, with no value");
        dlock_acquire_opts p = wait_for(5000);
        dlock_lock *plain = NULL;
        is_int(dlock_acquire(c, name, &p, &plain) == 0 ? 0 : DLOCK_EBUSY, DLOCK_EBUSY,
               "a plain lock of the election's name waits while it is led");
        if (plain)
            dlock_release(plain);
        is_int(dlock_release(m), 0, "a leader released as a lock is gone too");
    }
    dlock_client_close(c);
    dlock_client_close(d);
}

/* --- 5 candidates, one observer --- */

struct seen {
    uint64_t at_ns;
    dlock_leader_info li;
};

struct race {
    char name[128];
    unsigned hold_ms;
    _Atomic int inside, overlaps, led;
    pthread_mutex_t mu;
    int nterms;
    uint64_t term[CANDIDATES];
    uint64_t started_ns[CANDIDATES];
    char value[CANDIDATES][16];
    int failed;
    char why[256];
    /* the observer's reports, from its callback */
    int nseen;
    struct seen seen[4 * CANDIDATES + 8];
};

struct candidate {
    struct race *r;
    int i;
};

static void on_change(dlock_observer *ob, const dlock_leader_info *li, void *user)
{
    (void)ob;
    struct race *r = user;
    pthread_mutex_lock(&r->mu);
    if (r->nseen < (int)(sizeof r->seen / sizeof r->seen[0])) {
        r->seen[r->nseen].at_ns = dlock_monotonic_ns();
        r->seen[r->nseen].li = *li;
        r->nseen++;
    }
    pthread_mutex_unlock(&r->mu);
}

static void *candidate_run(void *arg)
{
    struct candidate *cd = arg;
    struct race *r = cd->r;
    dlock_client *c = client();
    dlock_lock *l = NULL;
    char value[16];
    snprintf(value, sizeof value, "candidate-%d", cd->i);
    dlock_acquire_opts o = campaign_opts(60000, 20000);
    int rc;
    if (breaking("election")) {
        /* A broken candidate: it leads whenever its try fails too. */
        dlock_acquire_opts t = try_once();
        rc = dlock_campaign(c, r->name, value, strlen(value), &t, &l);
        if (rc == DLOCK_EBUSY)
            rc = 0;
    } else {
        rc = dlock_campaign(c, r->name, value, strlen(value), &o, &l);
    }
    if (rc) {
        pthread_mutex_lock(&r->mu);
        if (!r->failed++)
            snprintf(r->why, sizeof r->why, "candidate %d: %s", cd->i, dlock_errmsg(c));
        pthread_mutex_unlock(&r->mu);
        dlock_client_close(c);
        return NULL;
    }
    if (atomic_fetch_add(&r->inside, 1) != 0)
        atomic_fetch_add(&r->overlaps, 1);
    pthread_mutex_lock(&r->mu);
    int k = r->nterms++;
    r->term[k] = l ? dlock_lock_token(l) : 0;
    r->started_ns[k] = dlock_monotonic_ns();
    snprintf(r->value[k], sizeof r->value[k], "%s", value);
    pthread_mutex_unlock(&r->mu);
    sleep_ms(r->hold_ms);
    atomic_fetch_sub(&r->inside, 1);
    atomic_fetch_add(&r->led, 1);
    if (l)
        dlock_resign(l);
    dlock_client_close(c);
    return NULL;
}

static double ms_between(uint64_t a, uint64_t b)
{
    return b > a ? (double)(b - a) / 1e6 : 0.0;
}

/* Five candidates campaign at once, each leads for hold_ms and resigns: one
 * leader at a time, each leads once, terms increase in that order, and an
 * observer started first reports each leader (term and value) in order,
 * then no leader. */
static void race_run(struct race *r)
{
    pthread_t th[CANDIDATES];
    struct candidate cd[CANDIDATES];
    dlock_client *c = client();
    dlock_observer *ob = NULL;
    if (!breaking("election") && dlock_observe(c, r->name, on_change, r, &ob) != 0)
        ok(0, "%s: observe: %s", backend, dlock_errmsg(c));
    for (int waited = 0; ob && waited < 5000; waited += 5) { /* its first report */
        pthread_mutex_lock(&r->mu);
        int first = r->nseen;
        pthread_mutex_unlock(&r->mu);
        if (first)
            break;
        sleep_ms(5);
    }
    for (int i = 0; i < CANDIDATES; i++) {
        cd[i] = (struct candidate){r, i};
        pthread_create(&th[i], NULL, candidate_run, &cd[i]);
    }
    for (int i = 0; i < CANDIDATES; i++)
        pthread_join(th[i], NULL);
    is_int(atomic_load(&r->overlaps), 0, "%s: exactly one leader at a time (%d candidates)",
           backend, CANDIDATES);
    is_int(atomic_load(&r->led), CANDIDATES, "every candidate led once%s%s",
           r->failed ? ": " : "", r->why);
    int increasing = 1;
    for (int k = 1; k < r->nterms; k++)
        increasing &= r->term[k] > r->term[k - 1];
    ok(increasing && r->nterms == CANDIDATES, "terms strictly increase from leader to leader");
    if (!ob) {
        dlock_client_close(c);
        return;
    }
    /* The last resign's report may still be on its way. */
    for (int waited = 0; waited < (int)NOTICE_BOUND_MS; waited += 10) {
        pthread_mutex_lock(&r->mu);
        int done = r->nseen && !r->seen[r->nseen - 1].li.held;
        pthread_mutex_unlock(&r->mu);
        if (done && waited)
            break;
        sleep_ms(10);
    }
    dlock_observer_close(ob);
    /* Each leader, in order, within the bound of its start. */
    int k = 0, in_order = 1, values = 1, errors = 0, first_free;
    double worst = 0, late[CANDIDATES];
    first_free = r->nseen > 0 && !r->seen[0].li.held && !r->seen[0].li.err;
    for (int s = 1; s < r->nseen; s++) {
        const dlock_leader_info *li = &r->seen[s].li;
        errors += li->err != 0;
        if (!li->held || li->err)
            continue;
        while (k < r->nterms && r->term[k] < li->term)
            k++; /* a leader not seen: counted below */
        if (k >= r->nterms || r->term[k] != li->term) {
            in_order = 0;
            continue;
        }
        if (li->value_len != strlen(r->value[k]) || strcmp(li->value, r->value[k]) != 0)
            values = 0;
        double d = ms_between(r->started_ns[k], r->seen[s].at_ns);
        late[k] = d;
        if (d > worst)
            worst = d;
        k++;
    }
    int reported = 0;
    for (int s = 1; s < r->nseen; s++)
        reported += r->seen[s].li.held && !r->seen[s].li.err;
    ok(first_free, "%s: the observer first reports that no one leads", backend);
    if (!ok(in_order && reported == CANDIDATES,
            "the observer reports each of the %d leaders once, in term order (%d reports)",
            CANDIDATES, reported)) {
        for (int k2 = 0; k2 < r->nterms; k2++)
            diag("leader %d: term %llu, value %s", k2, (unsigned long long)r->term[k2],
                 r->value[k2]);
        for (int s2 = 0; s2 < r->nseen; s2++)
            diag("report %d: held %d, term %llu, value '%s', err %d", s2, r->seen[s2].li.held,
                 (unsigned long long)r->seen[s2].li.term, r->seen[s2].li.value,
                 r->seen[s2].li.err);
    }
    ok(values, "... each with the value it published");
    ok(r->nseen > 0 && !r->seen[r->nseen - 1].li.held, "... and no leader after the last resign");
    is_int(errors, 0, "... and no read error");
    ok(worst <= NOTICE_BOUND_MS, "each within %u ms of the leader's start (worst %.1f ms)",
       NOTICE_BOUND_MS, worst);
    if (reported == CANDIDATES)
        diag("observer notice after a leader's start (ms): %.2f %.2f %.2f %.2f %.2f", late[0],
             late[1], late[2], late[3], late[4]);
    dlock_client_close(c);
}

void test_election(void)
{
    char name[128];
    name_of(name, sizeof name, "elect");
    if (refused_without_elections(name))
        return;
    election_basics();
    struct race *r = calloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    name_of(r->name, sizeof r->name, "elect-race");
    /* Long enough for a polled store's observer to read each leader. */
    r->hold_ms = (caps & DLOCK_CAP_WATCH) ? 100 : 400;
    race_run(r);
    free(r);
}

/* --break election: the race alone, with candidates that lead on a busy
 * try (the exclusion check must catch them). */
void test_election_break(void)
{
    struct race *r = calloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    name_of(r->name, sizeof r->name, "elect-broken");
    r->hold_ms = 200;
    race_run(r);
    free(r);
}

/* An idle observer costs the store nothing where the store notifies (its
 * reads are counted), and still hears the next change at once. */
void test_election_idle(void)
{
    char name[128];
    name_of(name, sizeof name, "elect-idle");
    if (refused_without_elections(name))
        return;
    dlock_client *c = client(), *oc = client();
    dlock_lock *l = NULL;
    dlock_observer *ob = NULL;
    dlock_leader_info li;
    dlock_acquire_opts o = campaign_opts(5000, 20000);
    if (dlock_campaign(c, name, "idle", 4, &o, &l) != 0) {
        ok(0, "%s: campaign: %s", backend, dlock_errmsg(c));
        goto out;
    }
    if (dlock_observe(oc, name, NULL, NULL, &ob) != 0) {
        ok(0, "%s: observe: %s", backend, dlock_errmsg(oc));
        goto out;
    }
    is_int(dlock_observer_next(ob, &li, 5000), 0, "%s: the observer reports the leader", backend);
    ok(li.held && li.term == dlock_lock_token(l) && strcmp(li.value, "idle") == 0,
       "... with its term and value");
    uint64_t r0 = dlock_observer_reads(ob);
    sleep_ms(1500);
    uint64_t idle = dlock_observer_reads(ob) - r0;
    if (caps & DLOCK_CAP_WATCH)
        is_int((int)idle, 0, "%s: woken by the store, an idle observer read it 0 times in 1.5 s",
               backend);
    else
        ok(idle >= 5 && idle <= 1500 / DLOCK_OBSERVE_POLL_MS + 3,
           "%s: no notification: the observer reads every %u ms (%llu reads in 1.5 s)", backend,
           DLOCK_OBSERVE_POLL_MS, (unsigned long long)idle);
    uint64_t t0 = dlock_monotonic_ns();
    dlock_proclaim(l, "moved", 5);
    int rc = dlock_observer_next(ob, &li, NOTICE_BOUND_MS);
    double took = ms_between(t0, dlock_monotonic_ns());
    ok(rc == 0 && li.held && strcmp(li.value, "moved") == 0,
       "a proclaim after the quiet is reported within %u ms (%.1f ms)", NOTICE_BOUND_MS, took);
    t0 = dlock_monotonic_ns();
    dlock_resign(l);
    l = NULL;
    rc = dlock_observer_next(ob, &li, NOTICE_BOUND_MS);
    took = ms_between(t0, dlock_monotonic_ns());
    ok(rc == 0 && !li.held, "a resign is reported as no leader within %u ms (%.1f ms)",
       NOTICE_BOUND_MS, took);
out:
    dlock_observer_close(ob);
    if (l)
        dlock_resign(l);
    dlock_client_close(oc);
    dlock_client_close(c);
}

/* A leader SIGKILLed: the observer reports it gone when the store lets it
 * go (at once where a dead holder is freed at once, else by its lease or
 * session end), and the next leader's term is above the dead one's. */
void test_election_killed(void)
{
    char name[128];
    name_of(name, sizeof name, "elect-killed");
    if (refused_without_elections(name))
        return;
    int death = (caps & DLOCK_CAP_HOLDER_DEATH) != 0;
    uint32_t ttl = death ? HOLDER_DEATH_TTL_MS : 2000;
    int pfd[2];
    if (pipe(pfd) != 0) {
        ok(0, "pipe");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dlock_client *c = client();
        dlock_lock *l = NULL;
        dlock_acquire_opts o = campaign_opts(10000, ttl);
        uint64_t term = dlock_campaign(c, name, "doomed", 6, &o, &l) == 0 ? dlock_lock_token(l) : 0;
        if (write(pfd[1], &term, sizeof term) != sizeof term)
            _exit(1);
        for (;;)
            pause();
    }
    close(pfd[1]);
    uint64_t term = 0;
    if (read(pfd[0], &term, sizeof term) != sizeof term)
        term = 0;
    close(pfd[0]);
    ok(term > 0, "%s: a leader process won (term %llu, lease %u ms)", backend,
       (unsigned long long)term, ttl);
    dlock_client *c = client();
    dlock_observer *ob = NULL;
    dlock_leader_info li;
    memset(&li, 0, sizeof li);
    if (dlock_observe(c, name, NULL, NULL, &ob) == 0)
        dlock_observer_next(ob, &li, 5000);
    ok(li.held && li.term == term, "the observer reports it");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    uint64_t t0 = dlock_monotonic_ns();
    uint64_t bound = death ? HOLDER_DEATH_BOUND_MS + HOLDER_DEATH_SLACK_MS : ttl + 5000;
    int rc;
    do
        rc = dlock_observer_next(ob, &li, 100);
    while ((rc != 0 || li.held) && ms_between(t0, dlock_monotonic_ns()) < bound);
    double took = ms_between(t0, dlock_monotonic_ns());
    ok(rc == 0 && !li.held, "the observer reports the killed leader gone within %llu ms (%.0f ms)",
       (unsigned long long)bound, took);
    dlock_lock *l = NULL;
    dlock_acquire_opts o = campaign_opts(bound, 10000);
    rc = dlock_campaign(c, name, "next", 4, &o, &l);
    is_int(rc, 0, "the next candidate leads");
    if (l) {
        ok(dlock_lock_token(l) > term, "with a term above the killed leader's (%llu > %llu)",
           (unsigned long long)dlock_lock_token(l), (unsigned long long)term);
        dlock_resign(l);
    }
    dlock_observer_close(ob);
    dlock_client_close(c);
}
