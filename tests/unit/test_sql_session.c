/*
 * The SQL backends' held-lock session layer (backends/sql_session.c)
 * against a fake driver that counts its hooks' calls: which session a try
 * and a wait go on, room and keys, the shared lease, the expiry batch,
 * trimming, and the lost reasons. No server.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/sql_session.h"
#include "core/internal.h"
#include "tests/tap.h"

struct fake_conn {
    dlock_conn base;
    int opens, closes, destroys, unlocks;
    size_t last_batch;
    int fail_unlock;
};

struct fake_session {
    struct dlock_sql_session base;
    int connected, dead;
};

struct fake_held {
    struct dlock_sql_held sh;
    int key;
};

static int f_alive(const struct dlock_sql_session *b)
{
    const struct fake_session *s = (const struct fake_session *)b;
    return s->connected && !s->dead;
}

static int f_open(dlock_conn *conn, void *arg, struct dlock_sql_session **out)
{
    struct fake_conn *fc = (struct fake_conn *)conn;
    struct fake_session *s = calloc(1, sizeof *s);
    (void)arg;
    if (!s || dlock_sql_session_init(&s->base) != 0) {
        free(s);
        return DLOCK_ENOMEM;
    }
    s->connected = 1;
    fc->opens++;
    *out = &s->base;
    return 0;
}

static struct fake_conn *the_conn;

static void f_close(struct dlock_sql_session *b)
{
    struct fake_session *s = (struct fake_session *)b;
    if (s->connected)
        the_conn->closes++;
    s->connected = 0;
}

static void f_destroy(struct dlock_sql_session *b)
{
    the_conn->destroys++;
    dlock_sql_session_fini(b);
    free(b);
}

static int f_unlock(dlock_conn *conn, struct dlock_sql_session *s,
                    struct dlock_sql_held *const *batch, size_t n)
{
    struct fake_conn *fc = (struct fake_conn *)conn;
    (void)s;
    (void)batch;
    fc->unlocks++;
    fc->last_batch = n;
    return fc->fail_unlock ? DLOCK_ECONNECT : 0;
}

static int f_is_key(const struct dlock_sql_held *h, const void *key)
{
    return DLOCK_SQL_OF(h, const struct fake_held, sh)->key == *(const int *)key;
}

static const struct dlock_sql_ops ops = {
    .alive = f_alive,
    .open = f_open,
    .close = f_close,
    .destroy = f_destroy,
    .unlock = f_unlock,
    .is_key = f_is_key,
    .why_gone = "gone",
    .why_silent = "silent",
    .why_ended = "ended",
};

static struct fake_held *grant(struct dlock_sql_session *s, int key, uint32_t lease,
                               uint64_t lease_end_ns)
{
    struct fake_held *h = calloc(1, sizeof *h);
    h->key = key;
    h->sh.lease = lease;
    h->sh.lease_end_ns = lease_end_ns;
    pthread_mutex_lock(&s->mu);
    dlock_sql_link(s, &h->sh);
    pthread_mutex_unlock(&s->mu);
    return h;
}

static void let_go(struct fake_held *h)
{
    dlock_sql_unlink(&h->sh);
    free(h);
}

static uint64_t later(void)
{
    return dlock_monotonic_ns() + 3600ull * 1000000000ull;
}

static void test_take_and_holder(void)
{
    struct fake_conn fc = {0};
    struct dlock_sql_pool p;
    struct dlock_sql_session *s = NULL, *t = NULL;
    int opened = -1, key;
    the_conn = &fc;
    dlock_sql_pool_init(&p, &ops, &fc.base);
    is_int(dlock_sql_take(&p, NULL, &s, &opened), 0, "take on an empty pool");
    ok(opened == 1 && fc.opens == 1, "opens a session");
    is_int(dlock_sql_take(&p, NULL, &t, &opened), 0, "take again");
    ok(t == s && opened == 0 && fc.opens == 1, "reuses the free one");

    struct fake_held *a = grant(s, 1, 1000, later());
    s->lease = 1000; /* as the driver's acquire statement set it */
    ok(!dlock_sql_free(s), "a session with a lock is not free");
    is_int(dlock_sql_take(&p, NULL, &t, &opened), 0, "take with the only session holding");
    ok(t != s && opened == 1 && fc.opens == 2, "opens another");

    key = 2;
    struct dlock_sql_session *h = dlock_sql_holder(&p, 1000, &key);
    ok(h == s, "a holder of the same lease, not holding the key");
    if (h)
        pthread_mutex_unlock(&h->mu);
    key = 1;
    ok(dlock_sql_holder(&p, 1000, &key) == NULL, "not one that holds the key");
    key = 2;
    ok(dlock_sql_holder(&p, 2000, &key) == NULL, "not one of another lease");
    a->sh.gone = 1;
    key = 1;
    h = dlock_sql_holder(&p, 1000, &key);
    ok(h == s, "a key let go (gone) no longer counts as held");
    if (h)
        pthread_mutex_unlock(&h->mu);
    a->sh.gone = 0;
    s->waiting = 1;
    key = 2;
    ok(dlock_sql_holder(&p, 1000, &key) == NULL, "not a session a wait runs on");
    s->waiting = 0;
    ((struct fake_session *)s)->dead = 1;
    ok(dlock_sql_holder(&p, 1000, &key) == NULL, "not a dead one");
    ((struct fake_session *)s)->dead = 0;

    /* Room: DLOCK_SQL_LOCKS_MAX locks at most. */
    struct fake_held *more[DLOCK_SQL_LOCKS_MAX];
    for (int i = 0; i < DLOCK_SQL_LOCKS_MAX - 1; i++)
        more[i] = grant(s, 100 + i, 1000, later());
    is_int((int)s->nheld, DLOCK_SQL_LOCKS_MAX, "the session is full");
    key = 2;
    ok(dlock_sql_holder(&p, 1000, &key) == NULL, "a full session is no holder");
    for (int i = 0; i < DLOCK_SQL_LOCKS_MAX - 1; i++)
        let_go(more[i]);

    /* A try goes on the holder, a wait on a free session, marked waiting. */
    struct dlock_sql_session *u = NULL;
    is_int(dlock_sql_session_for(&p, 1, 1000, &key, NULL, &u, &opened), 0, "session for a try");
    ok(u == s && opened == 0, "a try goes on the holder session");
    pthread_mutex_unlock(&u->mu);
    is_int(dlock_sql_session_for(&p, 0, 1000, &key, NULL, &u, &opened), 0, "session for a wait");
    ok(u == t && u->waiting && opened == 0, "a wait goes on a free session, marked waiting");
    u->waiting = 0;
    pthread_mutex_unlock(&u->mu);
    is_int(dlock_sql_session_for(&p, 1, 5000, &key, NULL, &u, &opened), 0, "try, other lease");
    ok(u == t && !u->waiting, "a try with no holder of its lease goes on a free session");
    pthread_mutex_unlock(&u->mu);

    /* A wait's first try on a holder: not for a try or a near deadline. */
    dlock_request req = {0};
    req.wait = DLOCK_WAIT_TRY;
    ok(dlock_sql_holder_for_wait(&p, &req, 5000, 1000, &key) == NULL, "no pre-try for a try");
    req.wait = DLOCK_WAIT_DEADLINE;
    req.deadline_ns = dlock_monotonic_ns() + 1000000000ull;
    ok(dlock_sql_holder_for_wait(&p, &req, 5000, 1000, &key) == NULL,
       "nor for a deadline nearer than the timeout");
    req.wait = DLOCK_WAIT_FOREVER;
    h = dlock_sql_holder_for_wait(&p, &req, 5000, 1000, &key);
    ok(h == s, "a wait without a deadline tries on the holder first");
    if (h)
        pthread_mutex_unlock(&h->mu);

    let_go(a);
    dlock_sql_pool_close(&p);
    is_int(fc.destroys, 2, "close destroys every session");
}

static void test_lease_and_mates(void)
{
    struct fake_conn fc = {0};
    struct dlock_sql_pool p;
    struct dlock_sql_session *s = NULL;
    int opened;
    the_conn = &fc;
    dlock_sql_pool_init(&p, &ops, &fc.base);
    dlock_sql_take(&p, NULL, &s, &opened);
    struct fake_held *a = grant(s, 1, 10, later());
    ok(!dlock_sql_mates(s, &a->sh), "alone: no mates");
    ok(dlock_sql_mates(s, NULL), "for an acquire, its locks are mates");
    is_int((int)dlock_sql_lease(s, &a->sh, 5), 5, "alone, a renewal sets its own lease");
    struct fake_held *b = grant(s, 2, 30, later());
    ok(dlock_sql_mates(s, &a->sh), "with b: a has a mate");
    is_int((int)dlock_sql_lease(s, &a->sh, 5), 30, "never below a live mate's lease");
    is_int((int)dlock_sql_lease(s, &a->sh, 40), 40, "longer when the lock needs more");
    is_int((int)dlock_sql_lease(s, &b->sh, 5), 10, "b's renewal: a's lease is the longest other");
    b->sh.gone = 1;
    ok(!dlock_sql_mates(s, &a->sh), "a gone lock is no mate");
    is_int((int)dlock_sql_lease(s, &a->sh, 5), 5, "nor keeps the lease up");
    s->pending = 20;
    ok(dlock_sql_mates(s, &a->sh), "a grant being made is a mate");
    is_int((int)dlock_sql_lease(s, &a->sh, 5), 20, "and keeps its lease");
    s->pending = 0;
    let_go(a);
    let_go(b);
    dlock_sql_pool_close(&p);
}

static void test_expire(void)
{
    struct fake_conn fc = {0};
    struct dlock_sql_pool p;
    struct dlock_sql_session *s = NULL;
    struct fake_held *h[70];
    int opened;
    the_conn = &fc;
    dlock_sql_pool_init(&p, &ops, &fc.base);
    dlock_sql_take(&p, NULL, &s, &opened);
    struct fake_held *self = grant(s, 0, 10, 1); /* its lease ended too */
    for (int i = 0; i < 70; i++)
        h[i] = grant(s, i + 1, 10, i < 68 ? 1 : later());
    pthread_mutex_lock(&s->mu);
    dlock_sql_expire(&p, s, &self->sh);
    is_int(fc.unlocks, 1, "one statement");
    is_int((int)fc.last_batch, DLOCK_SQL_EXPIRE_BATCH, "a batch of 64 at most");
    int gone = 0;
    for (int i = 0; i < 70; i++)
        gone += h[i]->sh.gone;
    is_int(gone, DLOCK_SQL_EXPIRE_BATCH, "those are marked gone");
    ok(!self->sh.gone, "never the lock the statement is for");
    fc.fail_unlock = 1;
    dlock_sql_expire(&p, s, &self->sh);
    is_int((int)fc.last_batch, 4, "the rest at the next use");
    gone = 0;
    for (int i = 0; i < 70; i++)
        gone += h[i]->sh.gone;
    is_int(gone, DLOCK_SQL_EXPIRE_BATCH, "a failed unlock marks none");
    fc.fail_unlock = 0;
    dlock_sql_expire(&p, s, &self->sh);
    gone = 0;
    for (int i = 0; i < 70; i++)
        gone += h[i]->sh.gone;
    is_int(gone, 68, "every expired lock is gone, the live ones stay");
    int before = fc.unlocks;
    dlock_sql_expire(&p, s, &self->sh);
    is_int(fc.unlocks, before, "nothing to do: no statement");
    pthread_mutex_unlock(&s->mu);

    is_str(dlock_sql_lost_why(&p, &h[0]->sh), "gone", "lost: let go among mates");
    is_str(dlock_sql_lost_why(&p, &h[69]->sh), "ended", "lost: the session ended");
    s->silent_ms = 5;
    is_str(dlock_sql_lost_why(&p, &h[69]->sh), "silent", "lost: closed for want of a reply");
    for (int i = 0; i < 70; i++)
        let_go(h[i]);
    ok(dlock_sql_unlink(&self->sh), "the last unlink says the session fell free");
    free(self);
    dlock_sql_pool_close(&p);
}

static void test_trim(void)
{
    struct fake_conn fc = {0};
    struct dlock_sql_pool p;
    struct dlock_sql_session *s[7];
    struct fake_held *h[7];
    int opened;
    the_conn = &fc;
    dlock_sql_pool_init(&p, &ops, &fc.base);
    for (int i = 0; i < 7; i++) {
        dlock_sql_take(&p, NULL, &s[i], &opened);
        h[i] = grant(s[i], i, 10, later());
    }
    is_int(fc.opens, 7, "seven holding sessions");
    ((struct fake_session *)s[6])->connected = 0; /* closed (lost) */
    int fell = 0;
    for (int i = 0; i < 7; i++) {
        fell += dlock_sql_unlink(&h[i]->sh);
        free(h[i]);
    }
    is_int(fell, 7, "each fell free");
    dlock_sql_trim(&p);
    is_int((int)p.n, DLOCK_SQL_IDLE_KEEP, "four free sessions stay");
    is_int(fc.closes, 2, "the others are closed");
    is_int(fc.destroys, 3, "and freed, with the closed one");
    struct dlock_sql_session *d = p.v[0], *t;
    ((struct fake_session *)d)->dead = 1;
    is_int(dlock_sql_take(&p, NULL, &t, &opened), 0, "take");
    ok(opened == 0 && t != d && (int)p.n == DLOCK_SQL_IDLE_KEEP - 1,
       "a dead free session is closed and dropped, a live one taken");
    dlock_sql_pool_close(&p);
    is_int(fc.destroys, 7, "every struct freed");
}

int main(void)
{
    test_take_and_holder();
    test_lease_and_mates();
    test_expire();
    test_trim();
    return done_testing();
}
