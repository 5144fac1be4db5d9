/*
 * The keeper: a client's two threads that keep its kept locks.
 *
 * The renewer calls the backend's keep() for each kept lock when it falls
 * due (every TTL / DLOCK_KEEP_INTERVAL_DIV; lease-less stores every
 * min(TTL / 3, DLOCK_KEEP_CHECK_MAX_MS)), one lock at a time, so a client
 * keeping many locks still has two threads. The watchdog does no I/O: it
 * sleeps until the earliest lease end on an absolute CLOCK_MONOTONIC timer
 * and reports every lock whose lease end passed without a confirmed
 * renewal. Keeping the two apart means a renewal stuck on a silent store
 * can never delay a loss report past the lease end, and a process resumed
 * after a pause reports the loss as soon as the watchdog runs again: an
 * absolute futex timeout does not restart with the old relative time.
 *
 * Loss callbacks run on the watchdog thread only, so they never run
 * concurrently with each other.
 *
 * Every kept lock is on one list; the threads scan it for the next due
 * time, which costs O(kept locks) per renewal.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "config.h"
#include "core/internal.h"

#define MS 1000000ull
#define NEVER UINT64_MAX

struct dlock_kept {
    dlock_lock *lock;
    struct dlock_kept *next;
    dlock_lost_fn on_lost;
    void *user;
    uint64_t interval_ns, retry_ns;
    uint64_t next_at;   /* when the renewer calls keep() next */
    int busy;           /* the renewer is inside keep() for it */
    int held;           /* the application is renewing it */
    int pending;        /* lost, callback not yet run */
    int cb_running;
    int fd;             /* eventfd, -1 until asked for */
    char detail[DLOCK_ERRMSG_MAX];
};

struct dlock_keeper {
    dlock_client *client;
    pthread_mutex_t mu;
    pthread_cond_t renew_cv; /* on CLOCK_MONOTONIC */
    pthread_cond_t watch_cv; /* on CLOCK_MONOTONIC */
    pthread_cond_t idle_cv;  /* busy / cb_running dropped */
    struct dlock_kept *kept;
    int stop;
    pthread_t renewer, watchdog;
};

static _Thread_local int on_keeper_thread;

int dlock_keeper_on_thread(void)
{
    return on_keeper_thread;
}

static void cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* Waits on cv until woken or until the absolute CLOCK_MONOTONIC time at. */
static void wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t at)
{
    struct timespec ts;
    if (at == NEVER) {
        pthread_cond_wait(cv, mu);
        return;
    }
    dlock_ns_to_timespec(at, &ts);
    pthread_cond_timedwait(cv, mu, &ts);
}

static void signal_fd(int fd)
{
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is already non-zero, readable either way. */
    }
}

/* Marks k's lock lost with err (first report wins); under mu. */
static void mark_lost(struct dlock_keeper *kp, struct dlock_kept *k, int err,
                      const char *detail)
{
    /* Every writer holds mu, so test-then-set is enough; the detail is
     * written before `lost` and never after, for readers without mu. */
    if (atomic_load(&k->lock->lost))
        return;
    if (detail != k->detail)
        snprintf(k->detail, sizeof k->detail, "%s", detail);
    dlock_metrics_loss(k->lock->client);
    atomic_store(&k->lock->expires_ns, 0);
    atomic_store(&k->lock->lost, err);
    k->pending = 1;
    signal_fd(k->fd);
    pthread_cond_broadcast(&kp->watch_cv);
}

static void *renewer_main(void *arg)
{
    struct dlock_keeper *kp = arg;
    dlock_client *c = kp->client;
    dlock_errsave sink;
    on_keeper_thread = 1;
    dlock_err_redirect(&sink);
    pthread_mutex_lock(&kp->mu);
    while (!kp->stop) {
        struct dlock_kept *due = NULL;
        for (struct dlock_kept *k = kp->kept; k; k = k->next)
            if (!k->held && !atomic_load(&k->lock->lost) && (!due || k->next_at < due->next_at))
                due = k;
        uint64_t now = dlock_monotonic_ns();
        if (!due || due->next_at > now) {
            wait_until(&kp->renew_cv, &kp->mu, due ? due->next_at : NEVER);
            continue;
        }
        dlock_lock *lock = due->lock;
        uint32_t ttl = lock->ttl_ms;
        due->busy = 1;
        pthread_mutex_unlock(&kp->mu);

        uint64_t sent = dlock_monotonic_ns();
        lock->held->lease_end_ns = 0;
        sink.err = 0;
        sink.msg[0] = '\0';
        int rc = dlock_lock_ops(lock)->keep(c->conn, lock->held, ttl);
        if (dlock_client_expires(c))
            dlock_metrics_renewal(c, rc);
        uint64_t end = rc == 0 ? dlock_lease_end(c, lock->held, sent, ttl) : 0;

        pthread_mutex_lock(&kp->mu);
        due->busy = 0;
        pthread_cond_broadcast(&kp->idle_cv);
        if (rc == 0) {
            if (!atomic_load(&lock->lost)) {
                atomic_store(&lock->expires_ns, end);
                pthread_cond_broadcast(&kp->watch_cv);
            }
            due->next_at = sent + due->interval_ns;
        } else if (rc == DLOCK_ELOST || rc == DLOCK_EEXPIRED) {
            mark_lost(kp, due, rc, sink.msg[0] ? sink.msg : dlock_strerror(rc));
        } else {
            /* Not known lost: try again soon; the watchdog reports it if
             * the lease end comes first. Keep the reason for that report. */
            if (!atomic_load(&lock->lost))
                snprintf(due->detail, sizeof due->detail, "%s",
                         sink.msg[0] ? sink.msg : dlock_strerror(rc));
            due->next_at = dlock_monotonic_ns() + due->retry_ns;
        }
    }
    pthread_mutex_unlock(&kp->mu);
    return NULL;
}

static void *watchdog_main(void *arg)
{
    struct dlock_keeper *kp = arg;
    dlock_errsave sink; /* what a callback's refused calls record */
    on_keeper_thread = 1;
    dlock_err_redirect(&sink);
    pthread_mutex_lock(&kp->mu);
    while (!kp->stop) {
        uint64_t now = dlock_monotonic_ns(), next = NEVER;
        struct dlock_kept *fire = NULL;
        for (struct dlock_kept *k = kp->kept; k; k = k->next) {
            if (!atomic_load(&k->lock->lost)) {
                uint64_t end = atomic_load(&k->lock->expires_ns);
                if (end <= now) {
                    char why[DLOCK_ERRMSG_MAX];
                    snprintf(why, sizeof why, "the lease ran out without a confirmed renewal%s%.200s",
                             k->detail[0] ? ": " : "", k->detail);
                    mark_lost(kp, k, DLOCK_EEXPIRED, why);
                } else if (end < next) {
                    next = end;
                }
            }
            if (k->pending && !fire)
                fire = k;
        }
        if (!fire) {
            wait_until(&kp->watch_cv, &kp->mu, next);
            continue;
        }
        fire->pending = 0;
        if (!fire->on_lost)
            continue;
        fire->cb_running = 1;
        pthread_mutex_unlock(&kp->mu);
        fire->on_lost(fire->lock, atomic_load(&fire->lock->lost), fire->user);
        pthread_mutex_lock(&kp->mu);
        fire->cb_running = 0;
        pthread_cond_broadcast(&kp->idle_cv);
    }
    pthread_mutex_unlock(&kp->mu);
    return NULL;
}

static int keeper_start(dlock_client *c)
{
    struct dlock_keeper *kp = calloc(1, sizeof *kp);
    sigset_t all, old;
    int r;
    if (!kp)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    kp->client = c;
    pthread_mutex_init(&kp->mu, NULL);
    cond_init_mono(&kp->renew_cv);
    cond_init_mono(&kp->watch_cv);
    pthread_cond_init(&kp->idle_cv, NULL);
    /* The threads inherit a mask blocking every signal: signals meant for
     * the application reach its own threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&kp->renewer, NULL, renewer_main, kp);
    if (r == 0 && (r = pthread_create(&kp->watchdog, NULL, watchdog_main, kp)) != 0) {
        pthread_mutex_lock(&kp->mu);
        kp->stop = 1;
        pthread_cond_broadcast(&kp->renew_cv);
        pthread_mutex_unlock(&kp->mu);
        pthread_join(kp->renewer, NULL);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        pthread_mutex_destroy(&kp->mu);
        pthread_cond_destroy(&kp->renew_cv);
        pthread_cond_destroy(&kp->watch_cv);
        pthread_cond_destroy(&kp->idle_cv);
        free(kp);
        return dlock_seterr(c, DLOCK_ENOMEM, "cannot start the keeper's threads: %s",
                            strerror(r));
    }
    c->keeper = kp;
    return 0;
}

/* Renewal and retry periods from the lock's TTL (see dlock.h). */
static void set_intervals(struct dlock_kept *k)
{
    uint64_t ttl_ns = (uint64_t)k->lock->ttl_ms * MS;
    if (dlock_client_expires(k->lock->client)) {
        k->interval_ns = ttl_ns / DLOCK_KEEP_INTERVAL_DIV;
    } else {
        k->interval_ns = ttl_ns / 3;
        if (k->interval_ns > DLOCK_KEEP_CHECK_MAX_MS * MS)
            k->interval_ns = DLOCK_KEEP_CHECK_MAX_MS * MS;
    }
    k->retry_ns = ttl_ns / DLOCK_KEEP_RETRY_DIV;
    if (k->interval_ns < MS)
        k->interval_ns = MS;
    if (k->retry_ns < MS)
        k->retry_ns = MS;
}

int dlock_keeper_add(dlock_client *c, dlock_lock *lock, dlock_lost_fn on_lost, void *user,
                     int confirm)
{
    struct dlock_kept *k;
    int rc;
    if (!c->keeper && (rc = keeper_start(c)) != 0)
        return rc;
    if (!(k = calloc(1, sizeof *k)))
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    k->lock = lock;
    set_intervals(k);
    k->on_lost = on_lost;
    k->user = user;
    k->fd = -1;
    /* A lease end the backend reported for a grant is an estimate (a
     * handoff timed from its arrival): confirm it with a renewal at once,
     * so a waiter that was paused while the lock was handed to it learns
     * within a round trip that the lease already ran out. */
    k->next_at = dlock_monotonic_ns() + (confirm ? 0 : k->interval_ns);
    lock->kept = k;
    pthread_mutex_lock(&c->keeper->mu);
    k->next = c->keeper->kept;
    c->keeper->kept = k;
    pthread_cond_broadcast(&c->keeper->renew_cv);
    pthread_cond_broadcast(&c->keeper->watch_cv);
    pthread_mutex_unlock(&c->keeper->mu);
    return 0;
}

void dlock_keeper_remove(dlock_lock *lock)
{
    struct dlock_kept *k = lock->kept;
    struct dlock_keeper *kp = lock->client->keeper;
    if (!k)
        return;
    pthread_mutex_lock(&kp->mu);
    while (k->busy || k->cb_running)
        pthread_cond_wait(&kp->idle_cv, &kp->mu);
    for (struct dlock_kept **pp = &kp->kept; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    pthread_mutex_unlock(&kp->mu);
    if (k->fd >= 0)
        close(k->fd);
    /* The detail outlives the keeper's watch: the release reports it. */
    if (atomic_load(&lock->lost))
        lock->lost_detail = strdup(k->detail);
    free(k);
    lock->kept = NULL;
}

void dlock_keeper_hold(dlock_lock *lock)
{
    struct dlock_kept *k = lock->kept;
    struct dlock_keeper *kp = lock->client->keeper;
    if (!k)
        return;
    pthread_mutex_lock(&kp->mu);
    while (k->busy)
        pthread_cond_wait(&kp->idle_cv, &kp->mu);
    k->held = 1;
    pthread_mutex_unlock(&kp->mu);
}

void dlock_keeper_unhold(dlock_lock *lock, int rc, uint64_t end)
{
    struct dlock_kept *k = lock->kept;
    struct dlock_keeper *kp = lock->client->keeper;
    if (!k) {
        if (rc == 0)
            atomic_store(&lock->expires_ns, end);
        return;
    }
    pthread_mutex_lock(&kp->mu);
    /* Under mu: a loss marked meanwhile keeps expires_ns at 0. */
    if (rc == 0 && !atomic_load(&lock->lost))
        atomic_store(&lock->expires_ns, end);
    k->held = 0;
    set_intervals(k); /* the renew may have changed the TTL */
    if (rc == 0)
        k->next_at = dlock_monotonic_ns() + k->interval_ns;
    else if (rc == DLOCK_ELOST)
        mark_lost(kp, k, rc, lock->client->errmsg);
    pthread_cond_broadcast(&kp->renew_cv);
    pthread_cond_broadcast(&kp->watch_cv);
    pthread_mutex_unlock(&kp->mu);
}

void dlock_keeper_unhold_call(dlock_lock *lock, int rc)
{
    struct dlock_kept *k = lock->kept;
    struct dlock_keeper *kp = lock->client->keeper;
    if (!k)
        return;
    pthread_mutex_lock(&kp->mu);
    k->held = 0;
    if (rc == DLOCK_ELOST)
        mark_lost(kp, k, rc, lock->client->errmsg);
    pthread_cond_broadcast(&kp->renew_cv);
    pthread_cond_broadcast(&kp->watch_cv);
    pthread_mutex_unlock(&kp->mu);
}

void dlock_keeper_stop(dlock_client *c)
{
    struct dlock_keeper *kp = c->keeper;
    if (!kp)
        return;
    pthread_mutex_lock(&kp->mu);
    kp->stop = 1;
    pthread_cond_broadcast(&kp->renew_cv);
    pthread_cond_broadcast(&kp->watch_cv);
    pthread_mutex_unlock(&kp->mu);
    pthread_join(kp->renewer, NULL);
    pthread_join(kp->watchdog, NULL);
    dlock_names_each(&c->held, dlock_keeper_remove);
    pthread_mutex_destroy(&kp->mu);
    pthread_cond_destroy(&kp->renew_cv);
    pthread_cond_destroy(&kp->watch_cv);
    pthread_cond_destroy(&kp->idle_cv);
    free(kp);
    c->keeper = NULL;
}

int dlock_keeper_lost_fd(dlock_lock *lock)
{
    struct dlock_kept *k = lock->kept;
    struct dlock_keeper *kp = lock->client->keeper;
    int fd;
    if (!k)
        return DLOCK_EINVAL;
    pthread_mutex_lock(&kp->mu);
    if (k->fd < 0) {
        k->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (k->fd >= 0 && atomic_load(&lock->lost))
            signal_fd(k->fd);
    }
    fd = k->fd >= 0 ? k->fd : DLOCK_EIO;
    pthread_mutex_unlock(&kp->mu);
    return fd;
}

const char *dlock_keeper_lost_detail(const dlock_lock *lock)
{
    /* Written once, before `lost` is set, never again. */
    if (!atomic_load(&((dlock_lock *)lock)->lost))
        return "";
    if (lock->kept)
        return lock->kept->detail;
    return lock->lost_detail ? lock->lost_detail : "";
}
