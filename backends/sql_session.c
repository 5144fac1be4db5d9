/*
 * Held-lock sessions of the SQL backends: which session a lock goes on,
 * sharing, expiry among mates and trimming, written once for PostgreSQL
 * and MariaDB (lock=named). The model and the thread rules are in
 * sql_session.h; the drivers' statements are in their own files, reached
 * through struct dlock_sql_ops only.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/sql_session.h"
#include "core/internal.h"

#define MS 1000000ull

int dlock_sql_session_init(struct dlock_sql_session *s)
{
    memset(s, 0, sizeof *s);
    return pthread_mutex_init(&s->mu, NULL) == 0 ? 0 : DLOCK_ENOMEM;
}

void dlock_sql_session_fini(struct dlock_sql_session *s)
{
    pthread_mutex_destroy(&s->mu);
}

void dlock_sql_pool_init(struct dlock_sql_pool *p, const struct dlock_sql_ops *ops,
                         dlock_conn *conn)
{
    memset(p, 0, sizeof *p);
    p->ops = ops;
    p->conn = conn;
}

int dlock_sql_pool_add(struct dlock_sql_pool *p, struct dlock_sql_session *s)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 8;
        struct dlock_sql_session **v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return DLOCK_ENOMEM;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = s;
    return 0;
}

void dlock_sql_pool_close(struct dlock_sql_pool *p)
{
    for (size_t i = 0; i < p->n; i++) {
        p->ops->close(p->v[i]);
        p->ops->destroy(p->v[i]);
    }
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

/* Drops v[i] (closed, holding nothing) from the pool and frees it. */
static void pool_drop(struct dlock_sql_pool *p, size_t i)
{
    p->ops->destroy(p->v[i]);
    p->v[i] = p->v[--p->n];
}

int dlock_sql_take(struct dlock_sql_pool *p, void *arg, struct dlock_sql_session **out,
                   int *opened)
{
    *opened = 0;
    for (size_t i = 0; i < p->n;) {
        struct dlock_sql_session *s = p->v[i];
        if (!dlock_sql_free(s)) {
            i++;
            continue;
        }
        if (p->ops->alive(s)) {
            *out = s;
            return 0;
        }
        p->ops->close(s); /* died while pooled, or closed: let go */
        pool_drop(p, i);
    }
    struct dlock_sql_session *fresh = NULL;
    int err = p->ops->open(p->conn, arg, &fresh);
    if (err)
        return err;
    if (dlock_sql_pool_add(p, fresh) != 0) {
        p->ops->close(fresh);
        p->ops->destroy(fresh);
        return dlock_seterr(p->conn->client, DLOCK_ENOMEM, "out of memory");
    }
    *out = fresh;
    *opened = 1;
    return 0;
}

static int holds_key(const struct dlock_sql_pool *p, const struct dlock_sql_session *s,
                     const void *key)
{
    for (const struct dlock_sql_held *h = s->held; h; h = h->next)
        if (!h->gone && p->ops->is_key(h, key))
            return 1;
    return 0;
}

struct dlock_sql_session *dlock_sql_holder(struct dlock_sql_pool *p, uint32_t lease,
                                           const void *key)
{
    for (size_t i = 0; i < p->n; i++) {
        struct dlock_sql_session *s = p->v[i];
        if (s->nheld == 0 || s->waiting || s->nheld >= DLOCK_SQL_LOCKS_MAX)
            continue;
        pthread_mutex_lock(&s->mu);
        if (p->ops->alive(s) && s->lease == lease && !holds_key(p, s, key))
            return s;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

int dlock_sql_session_for(struct dlock_sql_pool *p, int for_try, uint32_t lease,
                          const void *key, void *arg, struct dlock_sql_session **out, int *opened)
{
    *opened = 0;
    if (for_try && (*out = dlock_sql_holder(p, lease, key)) != NULL)
        return 0;
    int err = dlock_sql_take(p, arg, out, opened);
    if (err)
        return err;
    pthread_mutex_lock(&(*out)->mu);
    (*out)->waiting = !for_try;
    return 0;
}

struct dlock_sql_session *dlock_sql_holder_for_wait(struct dlock_sql_pool *p,
                                                    const dlock_request *req,
                                                    uint64_t timeout_ms, uint32_t lease,
                                                    const void *key)
{
    if (req->wait == DLOCK_WAIT_TRY ||
        (req->wait == DLOCK_WAIT_DEADLINE &&
         req->deadline_ns < dlock_monotonic_ns() + timeout_ms * MS))
        return NULL;
    return dlock_sql_holder(p, lease, key);
}

void dlock_sql_trim(struct dlock_sql_pool *p)
{
    size_t idle = 0;
    for (size_t i = 0; i < p->n;) {
        struct dlock_sql_session *s = p->v[i];
        if (dlock_sql_free(s)) {
            if (p->ops->alive(s) && idle < DLOCK_SQL_IDLE_KEEP) {
                idle++;
            } else {
                p->ops->close(s);
                pool_drop(p, i);
                continue;
            }
        }
        i++;
    }
}

int dlock_sql_mates(const struct dlock_sql_session *s, const struct dlock_sql_held *self)
{
    if (s->pending)
        return 1;
    for (const struct dlock_sql_held *h = s->held; h; h = h->next)
        if (h != self && !h->gone)
            return 1;
    return 0;
}

uint32_t dlock_sql_lease(const struct dlock_sql_session *s, const struct dlock_sql_held *self,
                         uint32_t lease)
{
    if (s->pending > lease)
        lease = s->pending;
    for (const struct dlock_sql_held *h = s->held; h; h = h->next)
        if (h != self && !h->gone && h->lease > lease)
            lease = h->lease;
    return lease;
}

void dlock_sql_expire(struct dlock_sql_pool *p, struct dlock_sql_session *s,
                      const struct dlock_sql_held *self)
{
    struct dlock_sql_held *batch[DLOCK_SQL_EXPIRE_BATCH];
    uint64_t now = dlock_monotonic_ns();
    size_t n = 0;
    for (struct dlock_sql_held *h = s->held; h && n < DLOCK_SQL_EXPIRE_BATCH; h = h->next)
        if (h != self && !h->gone && h->lease_end_ns <= now)
            batch[n++] = h;
    if (n == 0 || p->ops->unlock(p->conn, s, batch, n) != 0)
        return; /* a session gone takes them all; else tried at the next use */
    for (size_t i = 0; i < n; i++)
        batch[i]->gone = 1;
}

void dlock_sql_link(struct dlock_sql_session *s, struct dlock_sql_held *h)
{
    h->s = s;
    h->prev = NULL;
    h->next = s->held;
    if (s->held)
        s->held->prev = h;
    s->held = h;
    s->nheld++;
}

int dlock_sql_unlink(struct dlock_sql_held *h)
{
    struct dlock_sql_session *s = h->s;
    if (h->prev)
        h->prev->next = h->next;
    else
        s->held = h->next;
    if (h->next)
        h->next->prev = h->prev;
    return --s->nheld == 0;
}

const char *dlock_sql_lost_why(const struct dlock_sql_pool *p, const struct dlock_sql_held *h)
{
    if (h->gone)
        return p->ops->why_gone;
    if (h->s->silent_ms)
        return p->ops->why_silent;
    return p->ops->why_ended;
}
