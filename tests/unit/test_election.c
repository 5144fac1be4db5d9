/*
 * Elections in the core (core/election.c, core/observer.c) against a fake
 * backend: campaign publishes after the grant and gives the grant back when
 * the publish fails; proclaim and resign; a release of an election wakes
 * the watches, a plain one does not; observers report each change in
 * order, through the callback, the queue and its descriptor; an idle
 * observer reads nothing with a watch and polls without one; a leader that
 * vanishes without a word is reported at its lease end; a holder with no
 * value is reported after the publish grace; a broken watch is opened
 * again; lists of stores publish in each and read the first.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "dlock_backend.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull
#define WATCHES 16

/* One fake store per scheme. */
struct store {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int held;
    uint64_t token, lease_ms;
    char owner[33];
    char value[DLOCK_VALUE_MAX + 1];
    size_t value_len;
    int valued;      /* value published by the holder */
    int watch_fd[WATCHES];
    atomic_int publishes, wakes, reads, watch_opens, releases;
    atomic_int fail_publish, break_watch;
};

static struct store stores[2];

struct fconn {
    dlock_conn base;
    struct store *s;
};

struct fheld {
    dlock_held base;
    char owner[33];
};

struct fwatch {
    dlock_watch base;
    int fd, slot;
};

static void notify(struct store *s)
{
    uint64_t one = 1;
    for (int i = 0; i < WATCHES; i++)
        if (s->watch_fd[i] >= 0 && write(s->watch_fd[i], &one, sizeof one) < 0)
            continue;
}

static int f_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    (void)c;
    struct fconn *fc = calloc(1, sizeof *fc);
    fc->s = &stores[strcmp(dlock_uri_scheme(uri), "efake2") == 0];
    *connp = &fc->base;
    return 0;
}

static void f_close(dlock_conn *conn)
{
    free(conn);
}

static struct store *st(dlock_conn *conn)
{
    return ((struct fconn *)conn)->s;
}

static int f_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct store *s = st(conn);
    pthread_mutex_lock(&s->mu);
    while (s->held) {
        if (req->wait == DLOCK_WAIT_TRY) {
            pthread_mutex_unlock(&s->mu);
            return DLOCK_EBUSY;
        }
        pthread_mutex_unlock(&s->mu);
        sleep_ms(2);
        pthread_mutex_lock(&s->mu);
        if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() > req->deadline_ns) {
            pthread_mutex_unlock(&s->mu);
            return DLOCK_ETIMEDOUT;
        }
    }
    struct fheld *h = calloc(1, sizeof *h);
    s->held = 1;
    s->valued = 0;
    h->base.token = ++s->token;
    memcpy(h->owner, req->owner_hex, 33);
    memcpy(s->owner, req->owner_hex, 33);
    notify(s); /* a store's watch sees grants */
    pthread_mutex_unlock(&s->mu);
    *heldp = &h->base;
    return 0;
}

static int f_release(dlock_conn *conn, dlock_held *held)
{
    struct store *s = st(conn);
    struct fheld *h = (struct fheld *)held;
    pthread_mutex_lock(&s->mu);
    int ours = s->held && strcmp(s->owner, h->owner) == 0;
    if (ours) {
        s->held = 0;
        notify(s); /* a store's watch sees releases */
    }
    s->releases++;
    pthread_mutex_unlock(&s->mu);
    free(h);
    return ours ? 0 : DLOCK_ELOST;
}

static int f_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    (void)conn, (void)held, (void)ttl_ms;
    return 0;
}

static int f_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    (void)held;
    struct store *s = st(conn);
    pthread_mutex_lock(&s->mu);
    if (s->token < floor)
        s->token = floor;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int f_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len)
{
    struct store *s = st(conn);
    struct fheld *h = (struct fheld *)held;
    s->publishes++;
    if (s->fail_publish)
        return dlock_seterr(conn->client, DLOCK_ESTORE, "fake store: publish refused");
    pthread_mutex_lock(&s->mu);
    int ours = s->held && strcmp(s->owner, h->owner) == 0;
    if (ours) {
        memcpy(s->value, value, len);
        s->value_len = len;
        s->valued = 1;
        notify(s);
    }
    pthread_mutex_unlock(&s->mu);
    return ours ? 0 : DLOCK_ELOST;
}

static int f_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                    char *value, size_t *value_len)
{
    (void)name, (void)len;
    struct store *s = st(conn);
    s->reads++;
    pthread_mutex_lock(&s->mu);
    info->known = DLOCK_KNOWS_HELD | DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER |
                  (s->lease_ms ? DLOCK_KNOWS_LEASE : 0);
    info->held = s->held;
    *value_len = 0;
    if (s->held) {
        info->token = s->token;
        info->lease_ms = s->lease_ms;
        memcpy(info->owner, s->owner, 33);
        if (s->valued) {
            memcpy(value, s->value, s->value_len);
            *value_len = s->value_len;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int f_wake(dlock_conn *conn, const char *name, size_t len)
{
    (void)name, (void)len;
    struct store *s = st(conn);
    s->wakes++;
    pthread_mutex_lock(&s->mu);
    notify(s);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int f_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **wp)
{
    (void)name, (void)len;
    struct store *s = st(conn);
    struct fwatch *w = calloc(1, sizeof *w);
    w->base.conn = conn;
    w->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_lock(&s->mu);
    for (w->slot = 0; w->slot < WATCHES && s->watch_fd[w->slot] >= 0; w->slot++)
        continue;
    s->watch_fd[w->slot] = w->fd;
    pthread_mutex_unlock(&s->mu);
    s->watch_opens++;
    *wp = &w->base;
    return 0;
}

static int f_watch_fd(dlock_watch *w)
{
    return ((struct fwatch *)w)->fd;
}

static int f_watch_read(dlock_watch *w)
{
    struct store *s = st(w->conn);
    uint64_t n;
    if (read(((struct fwatch *)w)->fd, &n, sizeof n) < 0)
        return 0;
    if (s->break_watch) {
        s->break_watch = 0;
        return dlock_seterr(w->conn->client, DLOCK_ECONNECT, "fake store: watch dropped");
    }
    return 0;
}

static void f_watch_close(dlock_watch *w)
{
    struct fwatch *fw = (struct fwatch *)w;
    struct store *s = st(w->conn);
    pthread_mutex_lock(&s->mu);
    s->watch_fd[fw->slot] = -1;
    pthread_mutex_unlock(&s->mu);
    close(fw->fd);
    free(fw);
}

static const char *const schemes1[] = {"efake", NULL};
static const char *const schemes2[] = {"efake2", NULL};
static const char *const schemes_poll[] = {"efake-poll", NULL};
static const char *const no_options[] = {NULL};

#define FAKE_METHODS                                                                          \
    .options = no_options, .open = f_open, .close = f_close, .acquire = f_acquire,           \
    .release = f_release, .keep = f_keep, .raise_token = f_raise_token, .publish = f_publish, .leader = f_leader,          \
    .wake = f_wake, .watch_open = f_watch_open, .watch_fd = f_watch_fd,                      \
    .watch_read = f_watch_read, .watch_close = f_watch_close

static const dlock_backend fake1 = {DLOCK_BACKEND_INIT, .name = "efake", .schemes = schemes1,
                                    .caps = DLOCK_CAP_ELECTION | DLOCK_CAP_WATCH | DLOCK_CAP_FENCING,
                                    FAKE_METHODS};
static const dlock_backend fake2 = {DLOCK_BACKEND_INIT, .name = "efake2", .schemes = schemes2,
                                    .caps = DLOCK_CAP_ELECTION | DLOCK_CAP_WATCH | DLOCK_CAP_FENCING,
                                    FAKE_METHODS};
/* No watch declared: the core polls (the store is efake's). */
static const dlock_backend fake_poll = {DLOCK_BACKEND_INIT, .name = "efake-poll",
                                        .schemes = schemes_poll,
                                        .caps = DLOCK_CAP_ELECTION | DLOCK_CAP_FENCING,
                                        FAKE_METHODS};

static dlock_client *open_c(const char *uri)
{
    dlock_client *c = NULL;
    if (dlock_client_open(uri, &c) != 0)
        { printf("Bail out! cannot open %s: %s\n", uri, dlock_errmsg(c)); exit(1); }
    return c;
}

struct log {
    pthread_mutex_t mu;
    int n;
    dlock_leader_info li[16];
    uint64_t at[16];
};

static void on_change(dlock_observer *o, const dlock_leader_info *li, void *user)
{
    (void)o;
    struct log *lg = user;
    pthread_mutex_lock(&lg->mu);
    if (lg->n < 16) {
        lg->at[lg->n] = dlock_monotonic_ns();
        lg->li[lg->n++] = *li;
    }
    pthread_mutex_unlock(&lg->mu);
}

static int readable(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
}

static void test_campaign(void)
{
    dlock_client *c = open_c("efake://"), *d = open_c("efake://");
    dlock_lock *l = NULL, *m = NULL;
    dlock_leader_info li;
    char big[DLOCK_VALUE_MAX + 1];
    is_int(dlock_campaign(c, "e", "v1", 2, NULL, &l), 0, "campaign wins");
    is_int(stores[0].publishes, 1, "... and publishes once, after the grant");
    is_int(dlock_leader(d, "e", &li), 0, "leader reads");
    ok(li.held && li.term == dlock_lock_token(l) && strcmp(li.value, "v1") == 0 &&
           li.value_len == 2 && strcmp(li.owner, dlock_lock_owner(l)) == 0,
       "... the term, the value and the owner");
    ok(dlock_lock_lost_fd(l) >= 0, "the leadership is kept");
    is_int(dlock_proclaim(l, "v2", 2), 0, "proclaim");
    dlock_leader(d, "e", &li);
    is_str(li.value, "v2", "... changes the value");
    memset(big, 'x', sizeof big);
    is_int(dlock_proclaim(l, big, sizeof big), DLOCK_EINVAL, "a value over 1024 bytes: EINVAL");
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.mode = DLOCK_MODE_SHARED;
    is_int(dlock_campaign(d, "e", "x", 1, &o, &m), DLOCK_EINVAL, "a shared campaign: EINVAL");
    o = (dlock_acquire_opts)DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_TRY;
    is_int(dlock_campaign(d, "e", "x", 1, &o, &m), DLOCK_EBUSY, "a try while led: EBUSY");
    int wakes = stores[0].wakes;
    is_int(dlock_resign(l), 0, "resign");
    is_int(stores[0].wakes, wakes + 1, "... wakes the watches");
    dlock_lock *plain = NULL;
    dlock_acquire(d, "e", NULL, &plain);
    is_int(dlock_proclaim(plain, "x", 1), DLOCK_EINVAL, "proclaim on a plain lock: EINVAL");
    wakes = stores[0].wakes;
    dlock_release(plain);
    is_int(stores[0].wakes, wakes, "a plain lock's release wakes nothing");
    stores[0].fail_publish = 1;
    int releases = stores[0].releases;
    is_int(dlock_campaign(c, "e", "v", 1, NULL, &l), DLOCK_ESTORE,
           "a refused publish fails the campaign (%s)", dlock_errmsg(c));
    ok(l == NULL && stores[0].releases == releases + 1 && !stores[0].held,
       "... and gives the grant back");
    stores[0].fail_publish = 0;
    dlock_client_close(c);
    dlock_client_close(d);
}

static int wait_log(struct log *lg, int n, unsigned ms)
{
    for (unsigned t = 0; t < ms; t += 2) {
        pthread_mutex_lock(&lg->mu);
        int got = lg->n;
        pthread_mutex_unlock(&lg->mu);
        if (got >= n)
            return 1;
        sleep_ms(2);
    }
    return 0;
}

static void test_observer(void)
{
    dlock_client *c = open_c("efake://");
    dlock_observer *ob = NULL;
    dlock_lock *l = NULL;
    dlock_leader_info li;
    struct log lg = {.mu = PTHREAD_MUTEX_INITIALIZER};
    is_int(dlock_observe(c, "e", on_change, &lg, &ob), 0, "observe");
    ok(wait_log(&lg, 1, 2000) && !lg.li[0].held, "first report: no leader");
    ok(readable(dlock_observer_fd(ob)), "the descriptor is readable while a change is queued");
    is_int(dlock_observer_next(ob, &li, 0), 0, "next takes it");
    ok(!readable(dlock_observer_fd(ob)), "... and the descriptor is quiet again");
    is_int(dlock_observer_next(ob, &li, 0), DLOCK_EBUSY, "nothing more: EBUSY");
    int reads = stores[0].reads;
    sleep_ms(300);
    is_int(stores[0].reads, reads, "an idle observer with a watch reads nothing");
    uint64_t t0 = dlock_monotonic_ns();
    dlock_campaign(c, "e", "one", 3, NULL, &l);
    is_int(dlock_observer_next(ob, &li, 2000), 0, "a campaign is reported");
    ok(li.held && li.term == dlock_lock_token(l) && strcmp(li.value, "one") == 0,
       "... with its term and value (no report before the publish)");
    ok(dlock_monotonic_ns() - t0 < 300 * MS, "... at once, not after the publish grace");
    dlock_proclaim(l, "two", 3);
    is_int(dlock_observer_next(ob, &li, 2000), 0, "a proclaim is reported");
    is_str(li.value, "two", "... with the new value");
    stores[0].break_watch = 1;
    int opens = stores[0].watch_opens;
    dlock_resign(l);
    is_int(dlock_observer_next(ob, &li, 2000), 0, "a resign is reported");
    ok(!li.held, "... as no leader");
    sleep_ms(100);
    ok(stores[0].watch_opens == opens + 1, "a broken watch is opened again");
    dlock_campaign(c, "e", "three", 5, NULL, &l);
    is_int(dlock_observer_next(ob, &li, 2000), 0, "changes after the reopen are reported");
    is_str(li.value, "three", "... in full");
    /* A leader that vanishes without a word: reported at its lease end. */
    pthread_mutex_lock(&stores[0].mu);
    stores[0].lease_ms = 200;
    notify(&stores[0]);
    pthread_mutex_unlock(&stores[0].mu);
    sleep_ms(50);
    pthread_mutex_lock(&stores[0].mu);
    stores[0].held = 0; /* no wake */
    pthread_mutex_unlock(&stores[0].mu);
    t0 = dlock_monotonic_ns();
    is_int(dlock_observer_next(ob, &li, 2000), 0, "a silent end is reported");
    double took = (double)(dlock_monotonic_ns() - t0) / 1e6;
    ok(!li.held && took < 600, "... by the lease end read before (%.0f ms, lease 200 ms)", took);
    stores[0].lease_ms = 0;
    dlock_release(l); /* ELOST: the fake store let it go */
    /* A holder that publishes nothing: reported after the grace. */
    dlock_lock *plain = NULL;
    t0 = dlock_monotonic_ns();
    dlock_acquire(c, "e", NULL, &plain);
    is_int(dlock_observer_next(ob, &li, 2000), 0, "a plain holder is reported");
    took = (double)(dlock_monotonic_ns() - t0) / 1e6;
    ok(li.held && li.value_len == 0 && took >= 400,
       "... with no value, after the publish grace (%.0f ms)", took);
    dlock_release(plain);
    is_int(dlock_observer_next(ob, &li, 2000), 0, "its release is reported");
    /* A read that shows an ended term (a store between a grant and its
     * record of it) is not a leader: terms never go back. */
    pthread_mutex_lock(&stores[0].mu);
    uint64_t ended = stores[0].token;
    stores[0].held = 1;
    stores[0].valued = 0;
    notify(&stores[0]);
    pthread_mutex_unlock(&stores[0].mu);
    is_int(dlock_observer_next(ob, &li, 300), DLOCK_EBUSY,
           "an ended term read again is not reported (term %llu)", (unsigned long long)ended);
    pthread_mutex_lock(&stores[0].mu);
    stores[0].token++;
    memcpy(stores[0].value, "next", 4);
    stores[0].value_len = 4;
    stores[0].valued = 1;
    notify(&stores[0]);
    pthread_mutex_unlock(&stores[0].mu);
    is_int(dlock_observer_next(ob, &li, 2000), 0, "the grant, once recorded, is");
    ok(li.held && li.term == ended + 1 && strcmp(li.value, "next") == 0, "... with its term");
    pthread_mutex_lock(&stores[0].mu);
    stores[0].held = 0;
    notify(&stores[0]);
    pthread_mutex_unlock(&stores[0].mu);
    dlock_observer_next(ob, &li, 2000);
    dlock_observer_close(ob);
    ok(lg.n >= 7, "the callback saw every report too (%d)", lg.n);
    dlock_client_close(c);
}

static void test_poll_and_queue(void)
{
    dlock_client *c = open_c("efake-poll://");
    dlock_observer *ob = NULL;
    dlock_leader_info li;
    dlock_lock *l = NULL;
    is_int(dlock_observe(c, "e", NULL, NULL, &ob), 0, "observe without a watch");
    dlock_observer_next(ob, &li, 2000);
    int reads = stores[0].reads;
    sleep_ms(500);
    int polled = stores[0].reads - reads;
    ok(polled >= 3 && polled <= 8, "... reads every %u ms (%d reads in 500 ms)",
       DLOCK_OBSERVE_POLL_MS, polled);
    /* Changes slower than the poll: each is reported, in order. */
    dlock_campaign(c, "e", "p0", 2, NULL, &l);
    sleep_ms(DLOCK_OBSERVE_POLL_MS + 30);
    for (int i = 1; i < 4; i++) {
        char v[16];
        snprintf(v, sizeof v, "p%d", i);
        dlock_proclaim(l, v, strlen(v));
        sleep_ms(DLOCK_OBSERVE_POLL_MS + 30);
    }
    int n = 0, in_order = 1;
    while (dlock_observer_next(ob, &li, 300) == 0) {
        char v[16];
        snprintf(v, sizeof v, "p%d", n);
        if (strcmp(li.value, v) != 0)
            diag("report %d: held %d, value '%s'", n, li.held, li.value);
        in_order &= strcmp(li.value, v) == 0;
        n++;
    }
    ok(n == 4 && in_order, "a poller reports each slow change, in order (%d)", n);
    dlock_resign(l);
    dlock_observer_close(ob);
    dlock_client_close(c);
}

static void test_list(void)
{
    dlock_client *c = open_c("efake:// efake2://"), *d = open_c("efake2://");
    dlock_lock *l = NULL;
    dlock_leader_info li;
    ok(dlock_client_caps(c) & DLOCK_CAP_ELECTION, "a list of electing stores elects");
    int p0 = stores[0].publishes, p1 = stores[1].publishes;
    is_int(dlock_campaign(c, "e", "both", 4, NULL, &l), 0, "a list campaigns");
    ok(stores[0].publishes == p0 + 1 && stores[1].publishes == p1 + 1,
       "... and publishes in each store");
    dlock_leader(d, "e", &li);
    is_str(li.value, "both", "the second store alone reads the value");
    int w0 = stores[0].wakes, w1 = stores[1].wakes;
    dlock_resign(l);
    ok(stores[0].wakes == w0 + 1 && stores[1].wakes == w1 + 1, "a resign wakes both stores");
    dlock_observer *ob = NULL;
    is_int(dlock_observe(c, "e", NULL, NULL, &ob), 0, "a list is observed (on its first store)");
    is_int(dlock_observer_next(ob, &li, 2000), 0, "... its first report");
    dlock_observer_close(ob);
    dlock_client_close(c);
    dlock_client_close(d);
}

static void test_bad_input(void)
{
    dlock_client *c = open_c("efake://");
    dlock_leader_info li;
    dlock_lock *l = NULL;
    is_int(dlock_leader(c, "e", NULL), DLOCK_EINVAL, "leader without a place: EINVAL");
    is_int(dlock_leader(c, "", &li), DLOCK_EINVAL, "an empty name: EINVAL");
    is_int(dlock_observe(c, "e", NULL, NULL, NULL), DLOCK_EINVAL, "observe without a place");
    is_int(dlock_campaign(c, "e", NULL, 1, NULL, &l), DLOCK_EINVAL, "a length with no value");
    is_int(dlock_observer_next(NULL, &li, 0), DLOCK_EINVAL, "next on NULL");
    dlock_observer_close(NULL);
    dlock_client_close(c);
}

int main(void)
{
    for (int k = 0; k < 2; k++) {
        pthread_mutex_init(&stores[k].mu, NULL);
        for (int i = 0; i < WATCHES; i++)
            stores[k].watch_fd[i] = -1;
    }
    if (dlock_backend_register(&fake1) || dlock_backend_register(&fake2) ||
        dlock_backend_register(&fake_poll))
        { printf("Bail out! cannot register the fake backends\n"); return 1; }
    test_campaign();
    test_observer();
    test_poll_and_queue();
    test_list();
    test_bad_input();
    return done_testing();
}
