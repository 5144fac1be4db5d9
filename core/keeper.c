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
 * Each thread finds its next kept lock in a binary heap of its own (the
 * renewer's by next renewal, the watchdog's by lease end), and losses wait
 * for their callback in a FIFO: a renewal, a loss and adding or removing a
 * kept lock cost O(log kept locks), so a client keeping 100 000 locks does
 * not spend its CPU looking for the next one.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "config.h"
#include "core/internal.h"

#define MS 1000000ull
#define NEVER UINT64_MAX

/* A binary min-heap of kept locks; each lock knows its place in it. */
struct kheap {
    struct dlock_kept **a;
    size_t n, cap;
    int watch; /* keyed by the lease end (watch_at), else by next_at */
};
#define NOT_IN SIZE_MAX

struct dlock_kept {
    dlock_lock *lock;
    size_t ix[2];       /* place in the renewer's [0] and watchdog's [1] heap */
    uint64_t watch_at;  /* lock->expires_ns as last put in the watchdog's heap */
    struct dlock_kept *pend_prev, *pend_next; /* waiting for its callback */
    int in_pend;
    dlock_lost_fn on_lost;
    void *user;
    uint64_t interval_ns, retry_ns;
    uint64_t margin_ns; /* the loss is reported this long before the lease end */
    uint64_t next_at;   /* when the renewer calls keep() next */
    int busy;           /* the renewer is inside keep() for it */
    int held;           /* the application is renewing it */
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
    /* due: kept locks the renewer may renew (not lost, not busy, not held
     * by the application); ends: kept locks not lost. */
    struct kheap due, ends;
    struct dlock_kept *pend_head, *pend_tail; /* lost, callback not yet run */
    int stop;
    pthread_t renewer, watchdog;
};

static _Thread_local int on_keeper_thread;

int dlock_keeper_on_thread(void)
{
    return on_keeper_thread;
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

static uint64_t key(const struct kheap *h, const struct dlock_kept *k)
{
    return h->watch ? k->watch_at : k->next_at;
}

static void put(struct kheap *h, size_t i, struct dlock_kept *k)
{
    h->a[i] = k;
    k->ix[h->watch] = i;
}

static void sift_up(struct kheap *h, size_t i)
{
    struct dlock_kept *k = h->a[i];
    while (i > 0 && key(h, h->a[(i - 1) / 2]) > key(h, k)) {
        put(h, i, h->a[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    put(h, i, k);
}

static void sift_down(struct kheap *h, size_t i)
{
    struct dlock_kept *k = h->a[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && key(h, h->a[c + 1]) < key(h, h->a[c]))
            c++;
        if (key(h, h->a[c]) >= key(h, k))
            break;
        put(h, i, h->a[c]);
        i = c;
    }
    put(h, i, k);
}

/* Room for one more, reserved when the lock is added: pushes never fail. */
static int heap_reserve(struct kheap *h, size_t want)
{
    if (want <= h->cap)
        return 0;
    size_t cap = h->cap ? h->cap * 2 : 16;
    while (cap < want)
        cap *= 2;
    struct dlock_kept **a = realloc(h->a, cap * sizeof *a);
    if (!a)
        return DLOCK_ENOMEM;
    h->a = a;
    h->cap = cap;
    return 0;
}

static void heap_push(struct kheap *h, struct dlock_kept *k)
{
    if (k->ix[h->watch] != NOT_IN)
        return;
    put(h, h->n++, k);
    sift_up(h, h->n - 1);
}

static void heap_remove(struct kheap *h, struct dlock_kept *k)
{
    size_t i = k->ix[h->watch];
    if (i == NOT_IN)
        return;
    k->ix[h->watch] = NOT_IN;
    if (i == --h->n)
        return;
    struct dlock_kept *moved = h->a[h->n];
    put(h, i, moved);
    sift_down(h, i);
    sift_up(h, moved->ix[h->watch]);
}

/* After k's key changed. */
static void heap_fix(struct kheap *h, struct dlock_kept *k)
{
    size_t i = k->ix[h->watch];
    if (i == NOT_IN)
        return;
    sift_down(h, i);
    sift_up(h, k->ix[h->watch]);
}

static struct dlock_kept *heap_top(const struct kheap *h)
{
    return h->n ? h->a[0] : NULL;
}

/* The loss margin of a lease lease_ms long (DLOCK_LOSS_MARGIN_DIV in
 * dlock.h): max(L/10, 50 ms) + L/100 + 2 ms, at most L/2. */
uint64_t dlock_loss_margin_ns(uint32_t lease_ms)
{
    uint64_t l = (uint64_t)lease_ms * MS;
    uint64_t m = l / DLOCK_LOSS_MARGIN_DIV;
    if (m < DLOCK_LOSS_MARGIN_MIN_MS * MS)
        m = DLOCK_LOSS_MARGIN_MIN_MS * MS;
    m += l / DLOCK_CLOCK_RATE_DIV + DLOCK_CLOCK_SLACK_MS * MS;
    return m < l / 2 ? m : l / 2;
}

/* When the watchdog reports a lock whose lease ends at end: the margin
 * before it (the test hook's margin may be negative: a late keeper). */
static uint64_t report_at(const struct dlock_keeper *kp, const struct dlock_kept *k,
                          uint64_t end)
{
    if (end == NEVER || end == 0)
        return end;
    if (kp->client->hooks.margin_set) {
        int64_t m = kp->client->hooks.margin_ns;
        if (m >= 0)
            return end > (uint64_t)m ? end - (uint64_t)m : 1;
        return end + (uint64_t)-m < end ? NEVER - 1 : end + (uint64_t)-m;
    }
    return end > k->margin_ns ? end - k->margin_ns : 1;
}

/* The lease end, and the report the watchdog waits for; under mu. */
static void set_end(struct dlock_keeper *kp, struct dlock_kept *k, uint64_t end)
{
    atomic_store(&k->lock->expires_ns, end);
    k->watch_at = report_at(kp, k, end);
    heap_fix(&kp->ends, k);
}

static void pend_push(struct dlock_keeper *kp, struct dlock_kept *k)
{
    if (k->in_pend)
        return;
    k->in_pend = 1;
    k->pend_next = NULL;
    k->pend_prev = kp->pend_tail;
    if (kp->pend_tail)
        kp->pend_tail->pend_next = k;
    else
        kp->pend_head = k;
    kp->pend_tail = k;
}

static void pend_remove(struct dlock_keeper *kp, struct dlock_kept *k)
{
    if (!k->in_pend)
        return;
    k->in_pend = 0;
    if (k->pend_prev)
        k->pend_prev->pend_next = k->pend_next;
    else
        kp->pend_head = k->pend_next;
    if (k->pend_next)
        k->pend_next->pend_prev = k->pend_prev;
    else
        kp->pend_tail = k->pend_prev;
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
    heap_remove(&kp->due, k);
    heap_remove(&kp->ends, k);
    if (k->on_lost)
        pend_push(kp, k);
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
        struct dlock_kept *due = heap_top(&kp->due);
        uint64_t now = dlock_monotonic_ns();
        if (!due || due->next_at > now) {
            wait_until(&kp->renew_cv, &kp->mu, due ? due->next_at : NEVER);
            continue;
        }
        dlock_lock *lock = due->lock;
        uint32_t ttl = lock->ttl_ms;
        /* The call ends by the lease end: an answer after it cannot keep
         * the lock (the watchdog reports the loss then), and a release of
         * the lost lock must not wait for it. UINT64_MAX without a lease. */
        uint64_t bound = c->hooks.unbounded_loss ? DLOCK_POLL_FOREVER : due->watch_at;
        due->busy = 1;
        heap_remove(&kp->due, due);
        pthread_mutex_unlock(&kp->mu);

        uint64_t sent = dlock_monotonic_ns();
        lock->held->lease_end_ns = 0;
        if (dlock_abi_has(c->backend, lease_ms))
            lock->held->lease_ms = 0;
        sink.err = 0;
        sink.msg[0] = '\0';
        dlock_call_deadline_set(bound);
        int rc = dlock_lock_ops(lock)->keep(c->conn, lock->held, ttl);
        dlock_call_deadline_set(DLOCK_POLL_FOREVER);
        if (dlock_client_expires(c))
            dlock_metrics_renewal(c, rc);
        uint64_t end = rc == 0 ? dlock_lease_end(c, lock->held, sent, ttl) : 0;
        uint32_t lease_ms = dlock_abi_has(c->backend, lease_ms) && lock->held->lease_ms
                                ? lock->held->lease_ms
                                : ttl;

        pthread_mutex_lock(&kp->mu);
        due->busy = 0;
        pthread_cond_broadcast(&kp->idle_cv);
        if (rc == 0) {
            if (!atomic_load(&lock->lost)) {
                due->margin_ns = dlock_loss_margin_ns(lease_ms);
                set_end(kp, due, end);
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
        if (!atomic_load(&lock->lost))
            heap_push(&kp->due, due);
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
        uint64_t now = dlock_monotonic_ns();
        struct dlock_kept *k;
        while ((k = heap_top(&kp->ends)) != NULL && k->watch_at <= now) {
            char why[DLOCK_ERRMSG_MAX];
            uint64_t end = atomic_load(&k->lock->expires_ns);
            int early = end > now;
            snprintf(why, sizeof why,
                     "the lease ran out without a confirmed renewal (reported %.0f ms %s its "
                     "end%s)%s%.150s",
                     (double)(early ? end - now : now - end) / 1e6, early ? "before" : "after",
                     early ? ", the loss margin" : "", k->detail[0] ? ": " : "", k->detail);
            mark_lost(kp, k, DLOCK_EEXPIRED, why); /* takes it out of ends */
        }
        struct dlock_kept *fire = kp->pend_head;
        if (!fire) {
            wait_until(&kp->watch_cv, &kp->mu, k ? k->watch_at : NEVER);
            continue;
        }
        pend_remove(kp, fire);
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
    int r;
    if (!kp)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    kp->client = c;
    kp->ends.watch = 1;
    pthread_mutex_init(&kp->mu, NULL);
    dlock_cond_init_mono(&kp->renew_cv);
    dlock_cond_init_mono(&kp->watch_cv);
    pthread_cond_init(&kp->idle_cv, NULL);
    /* Threads that take no signal: signals meant for the application
     * reach its own threads. */
    r = dlock_thread_start(&kp->renewer, 0, renewer_main, kp);
    if (r == 0 && (r = dlock_thread_start(&kp->watchdog, 0, watchdog_main, kp)) != 0) {
        pthread_mutex_lock(&kp->mu);
        kp->stop = 1;
        pthread_cond_broadcast(&kp->renew_cv);
        pthread_mutex_unlock(&kp->mu);
        pthread_join(kp->renewer, NULL);
    }
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
    k->margin_ns = dlock_loss_margin_ns(k->lock->ttl_ms);
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
    k->ix[0] = k->ix[1] = NOT_IN;
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
    struct dlock_keeper *kp = c->keeper;
    pthread_mutex_lock(&kp->mu);
    /* Both heaps have room for every kept lock, so no push can fail. */
    if (heap_reserve(&kp->due, kp->ends.n + 1) != 0 ||
        heap_reserve(&kp->ends, kp->ends.n + 1) != 0) {
        pthread_mutex_unlock(&kp->mu);
        free(k);
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    }
    lock->kept = k;
    k->watch_at = report_at(kp, k, atomic_load(&lock->expires_ns));
    heap_push(&kp->due, k);
    heap_push(&kp->ends, k);
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
    heap_remove(&kp->due, k);
    heap_remove(&kp->ends, k);
    pend_remove(kp, k);
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
    heap_remove(&kp->due, k); /* the renewer leaves it to the application */
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
    set_intervals(k); /* the renew may have changed the TTL */
    /* Under mu: a loss marked meanwhile keeps expires_ns at 0. */
    if (rc == 0 && !atomic_load(&lock->lost))
        set_end(kp, k, end);
    k->held = 0;
    if (rc == 0)
        k->next_at = dlock_monotonic_ns() + k->interval_ns;
    else if (rc == DLOCK_ELOST)
        mark_lost(kp, k, rc, lock->client->errmsg);
    if (!atomic_load(&lock->lost))
        heap_push(&kp->due, k);
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
    if (!atomic_load(&lock->lost))
        heap_push(&kp->due, k);
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
    free(kp->due.a);
    free(kp->ends.a);
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
