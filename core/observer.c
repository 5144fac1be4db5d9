/*
 * Election observers (dlock.h "Observers"). An observer is a thread with a
 * client of its own (the URI opened again) that waits on the backend's
 * watch (watch_open(): pub/sub, LISTEN, a ZooKeeper or etcd watch, inotify)
 * and reads leader() after each wake-up, reporting a state that differs
 * from the last one reported. Where the backend has no watch it reads every
 * DLOCK_OBSERVE_POLL_MS instead.
 *
 * Two timers besides the watch:
 * - the lease: a leader read with a lease is read again when that lease
 *   would end (plus LEASE_SLACK_MS), so a leader that died without a word
 *   on a store that does not announce expiries is reported gone by then.
 *   A live leader renews, so an idle observer reads once per lease at most;
 * - the publish grace: a new leader read before its value is published (a
 *   campaign publishes one round trip after its grant) is reported once the
 *   publish wakes the watch, or after PUBLISH_GRACE_MS (a plain holder of
 *   the name publishes nothing).
 * A watch that breaks is opened again, then the election read (nothing is
 * missed: the watch is always open before the read it guards).
 *
 * Terms never go back: a leader whose term has ended (no leader, or a
 * higher term, was reported after it) never leads again. A read that shows
 * such a term caught a store between a grant and its record of it (the
 * file store: a new holder's lock before its token is written); it is not
 * reported, and the election is read again STALE_RETRY_MS later (for at
 * most STALE_MAX_MS: then the store is taken at its word).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/internal.h"

#define LEASE_SLACK_MS 20u
#define PUBLISH_GRACE_MS 500u
#define RETRY_MIN_MS 50u
#define RETRY_MAX_MS 1000u
#define STALE_RETRY_MS 5u
#define STALE_MAX_MS 1000u /* then the store is taken at its word */

struct dlock_observer {
    dlock_client *c; /* the observer's own */
    char *name;
    size_t len;
    dlock_observe_fn callback;
    void *user;
    pthread_t thread;
    int started;
    int stop_fd;  /* eventfd: close asks the thread to stop */
    int ready_fd; /* eventfd: readable while changes are queued */
    dlock_watch *watch;
    _Atomic uint64_t reads;
    dlock_leader_info last; /* the last state reported */
    int reported;
    uint64_t ended;         /* the highest term known to have ended */
    uint64_t stale_since;   /* reads of an ended term since (0: none) */
    uint64_t retry_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t head, count;
    dlock_leader_info queue[DLOCK_OBSERVE_QUEUE];
};

static int has_watch(const dlock_observer *o)
{
    return (dlock_client_caps(o->c) & DLOCK_CAP_WATCH) && dlock_method(o->c->backend, watch_open) &&
           !o->c->hooks.observe_poll;
}

static void watch_drop(dlock_observer *o)
{
    if (o->watch)
        o->c->backend->watch_close(o->watch);
    o->watch = NULL;
}

static int watch_open(dlock_observer *o)
{
    if (o->watch || !has_watch(o))
        return 0;
    return dlock_finish(o->c, o->c->backend->watch_open(o->c->conn, o->name, o->len, &o->watch));
}

static int same(const dlock_leader_info *a, const dlock_leader_info *b)
{
    if (a->err || b->err)
        return a->err == b->err;
    return a->held == b->held && a->term == b->term && a->value_len == b->value_len &&
           memcmp(a->value, b->value, a->value_len) == 0;
}

/* Queues st and calls the callback. */
static void report(dlock_observer *o, const dlock_leader_info *st)
{
    if (o->reported && !o->last.err && o->last.held && (!st->held || st->term != o->last.term) &&
        o->last.term > o->ended)
        o->ended = o->last.term;
    o->last = *st;
    o->reported = 1;
    pthread_mutex_lock(&o->mu);
    if (o->count == DLOCK_OBSERVE_QUEUE) { /* the oldest goes */
        o->head = (o->head + 1) % DLOCK_OBSERVE_QUEUE;
        o->count--;
    }
    o->queue[(o->head + o->count) % DLOCK_OBSERVE_QUEUE] = *st;
    if (o->count++ == 0) {
        uint64_t one = 1;
        if (write(o->ready_fd, &one, sizeof one) < 0) {
            /* an eventfd far from overflow cannot fail */
        }
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (o->callback)
        o->callback(o, st, o->user);
}

/* One read; what to report, if anything; when to look again at the latest
 * (DLOCK_POLL_FOREVER: only when woken). */
static uint64_t look(dlock_observer *o, uint64_t *pending_until)
{
    dlock_leader_info st;
    uint64_t now = dlock_monotonic_ns(), next = DLOCK_POLL_FOREVER;
    atomic_fetch_add_explicit(&o->reads, 1, memory_order_relaxed);
    int rc = dlock_leader_read(o->c, o->name, o->len, &st);
    if (rc) {
        st = o->last;
        st.err = rc;
        snprintf(st.value, sizeof st.value, "%s", dlock_errmsg(o->c));
        st.value_len = strlen(st.value);
        if (!o->reported || !same(&st, &o->last))
            report(o, &st);
        o->retry_ms = o->retry_ms ? o->retry_ms * 2 : RETRY_MIN_MS;
        if (o->retry_ms > RETRY_MAX_MS)
            o->retry_ms = RETRY_MAX_MS;
        return now + o->retry_ms * 1000000ull;
    }
    o->retry_ms = 0;
    if (st.held && st.term && st.term <= o->ended) {
        if (!o->stale_since)
            o->stale_since = now;
        if (now - o->stale_since < STALE_MAX_MS * 1000000ull)
            return now + STALE_RETRY_MS * 1000000ull; /* a grant not yet recorded */
    }
    o->stale_since = 0;
    int fresh = st.held && st.value_len == 0 && (!o->reported || o->last.err ||
                                                 !o->last.held || o->last.term != st.term);
    if (fresh && !*pending_until)
        *pending_until = now + PUBLISH_GRACE_MS * 1000000ull;
    if (!fresh || now >= *pending_until) {
        *pending_until = 0;
        if (!o->reported || !same(&st, &o->last))
            report(o, &st);
    } else {
        next = *pending_until;
    }
    if (st.held && (st.known & DLOCK_KNOWS_LEASE)) {
        uint64_t end = now + (st.lease_ms + LEASE_SLACK_MS) * 1000000ull;
        if (end < next)
            next = end;
    }
    if (!o->watch) {
        uint64_t poll = now + (has_watch(o) ? RETRY_MIN_MS : DLOCK_OBSERVE_POLL_MS) * 1000000ull;
        if (poll < next)
            next = poll;
    }
    return next;
}

static void *observe_thread(void *arg)
{
    dlock_observer *o = arg;
    uint64_t pending = 0, next = dlock_monotonic_ns();
    for (;;) {
        struct pollfd fds[2] = {{o->stop_fd, POLLIN, 0}, {-1, POLLIN, 0}};
        if (o->watch)
            fds[1].fd = o->c->backend->watch_fd(o->watch);
        int r = dlock_poll_until(fds, 2, -1, next, 0);
        if (r == DLOCK_POLL_ERROR)
            r = 0; /* treated as the timer: a read follows */
        if (fds[0].revents)
            break;
        if (fds[1].fd >= 0 && fds[1].revents && o->c->backend->watch_read(o->watch) != 0)
            watch_drop(o);
        if (!o->watch && watch_open(o) != 0) {
            /* the read below reports the store's error */
        }
        next = look(o, &pending);
    }
    return NULL;
}

int dlock_observe(dlock_client *c, const char *name, dlock_observe_fn callback, void *user,
                  dlock_observer **observerp)
{
    dlock_observer *o;
    int rc;
    if (!c || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    if ((rc = dlock_check_usable(c)) != 0)
        return rc;
    if (!observerp)
        return dlock_seterr(c, DLOCK_EINVAL, "no place to store the observer");
    *observerp = NULL;
    size_t len = name ? strnlen(name, DLOCK_NAME_MAX + 1) : 0;
    dlock_leader_info first;
    if ((rc = dlock_leader_read(c, name, len, &first)) != 0)
        return rc;
    if (!(o = calloc(1, sizeof *o)) || !(o->name = malloc(len + 1))) {
        free(o);
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    }
    memcpy(o->name, name, len + 1);
    o->len = len;
    o->callback = callback;
    o->user = user;
    o->stop_fd = o->ready_fd = -1;
    pthread_mutex_init(&o->mu, NULL);
    dlock_cond_init_mono(&o->cv);
    if ((o->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        (o->ready_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        rc = dlock_seterr(c, DLOCK_EIO, "cannot make an observer's descriptors: %s",
                          strerror(errno));
        goto fail;
    }
    if ((rc = dlock_client_open(c->uri_text, &o->c)) != 0) {
        rc = dlock_seterr(c, rc, "%s", dlock_errmsg(o->c));
        goto fail;
    }
    if ((rc = watch_open(o)) != 0) {
        rc = dlock_seterr(c, rc, "%s", dlock_errmsg(o->c));
        goto fail;
    }
    if ((rc = dlock_thread_start(&o->thread, 0, observe_thread, o)) != 0) {
        rc = dlock_seterr(c, DLOCK_EIO, "cannot start an observer's thread: %s", strerror(rc));
        goto fail;
    }
    o->started = 1;
    *observerp = o;
    return 0;
fail:
    dlock_observer_close(o);
    return rc;
}

int dlock_observer_fd(dlock_observer *o)
{
    return o ? o->ready_fd : DLOCK_EINVAL;
}

int dlock_observer_next(dlock_observer *o, dlock_leader_info *info, uint32_t wait_ms)
{
    if (!o || !info)
        return DLOCK_EINVAL;
    pthread_mutex_lock(&o->mu);
    if (o->count == 0 && wait_ms) {
        struct timespec ts;
        uint64_t until = wait_ms == DLOCK_WAIT_FOREVER_MS
                             ? UINT64_MAX
                             : dlock_monotonic_ns() + wait_ms * 1000000ull;
        while (o->count == 0 && dlock_monotonic_ns() < until) {
            if (until == UINT64_MAX) {
                pthread_cond_wait(&o->cv, &o->mu);
            } else {
                dlock_ns_to_timespec(until, &ts);
                pthread_cond_timedwait(&o->cv, &o->mu, &ts);
            }
        }
    }
    int rc = DLOCK_EBUSY;
    if (o->count) {
        *info = o->queue[o->head];
        o->head = (o->head + 1) % DLOCK_OBSERVE_QUEUE;
        if (--o->count == 0) {
            uint64_t n;
            if (read(o->ready_fd, &n, sizeof n) < 0) {
                /* already zero */
            }
        }
        rc = 0;
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

uint64_t dlock_observer_reads(const dlock_observer *o)
{
    return o ? atomic_load_explicit(&o->reads, memory_order_relaxed) : 0;
}

void dlock_observer_close(dlock_observer *o)
{
    if (!o)
        return;
    if (o->started) {
        uint64_t one = 1;
        if (write(o->stop_fd, &one, sizeof one) < 0) {
            /* cannot fail on a fresh eventfd */
        }
        pthread_join(o->thread, NULL);
    }
    watch_drop(o);
    dlock_client_close(o->c);
    if (o->stop_fd >= 0)
        close(o->stop_fd);
    if (o->ready_fd >= 0)
        close(o->ready_fd);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o->name);
    free(o);
}
