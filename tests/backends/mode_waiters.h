/*
 * Waiters of the stores' tests of shared locks and semaphores (the
 * ZooKeeper and etcd no-herd cases): each a thread with a client of its
 * own, blocked in one acquire, whose result the test reads when it says
 * it is done.
 */
#ifndef DLOCK_TESTS_MODE_WAITERS_H
#define DLOCK_TESTS_MODE_WAITERS_H

#include <pthread.h>

#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"

struct waiter {
    dlock_client *c;
    const char *name;
    dlock_mode mode;
    uint32_t limit;
    unsigned wait_ms;
    dlock_lock *l;
    int rc;
    int done; /* atomic */
    pthread_t t;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, w->wait_ms, 0);
    o.mode = w->mode;
    o.limit = w->limit;
    w->rc = dlock_acquire(w->c, w->name, &o, &w->l);
    __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* w, on a new client of uri, starts waiting for name. */
static inline void waiter_start(struct waiter *w, const char *uri, const char *name,
                                dlock_mode mode, uint32_t limit, unsigned wait_ms)
{
    *w = (struct waiter){open_ok(uri), name, mode, limit, wait_ms, NULL, 0, 0, 0};
    pthread_create(&w->t, NULL, waiter_main, w);
}

static inline int held_now(struct waiter *w)
{
    return __atomic_load_n(&w->done, __ATOMIC_SEQ_CST) && w->rc == 0;
}

/* Waits until w returned, at most ms. */
static inline int returns_within(struct waiter *w, unsigned ms)
{
    for (unsigned i = 0; i < ms / 5 && !__atomic_load_n(&w->done, __ATOMIC_SEQ_CST); i++)
        sleep_ms(5);
    return __atomic_load_n(&w->done, __ATOMIC_SEQ_CST);
}

static inline void finish(struct waiter *w)
{
    pthread_join(w->t, NULL);
    if (w->l)
        dlock_release(w->l);
    dlock_client_close(w->c);
}

/* A try of name on c in mode and limit: the lock, or NULL (said why). */
static inline dlock_lock *take(dlock_client *c, const char *name, dlock_mode mode, uint32_t limit)
{
    dlock_lock *l = NULL;
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 0);
    o.mode = mode;
    o.limit = limit;
    if (dlock_acquire(c, name, &o, &l) != 0)
        diag("acquire %s: %s", name, dlock_errmsg(c));
    return l;
}

/* Events settle: what the clients' threads were doing is done. */
#define SETTLE_MS 300

#endif
