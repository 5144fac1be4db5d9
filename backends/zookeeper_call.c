/*
 * Requests bounded by a deadline and a cancel, over the ZooKeeper C
 * client's asynchronous calls (why: zookeeper.c's top; the calls:
 * zookeeper_int.h). A request's completion runs on the client's completion
 * thread; the application's thread waits for it on zk_conn.cv, or, during
 * an acquire with a cancel fd, in the core's dlock_poll_until() on
 * {wake_fd, cancel_fd}, which zk_wake() writes while a waiter is in there.
 * What a request given up on may have left is queued for cleanup by its
 * completion (zookeeper_orphans.c). Every completion a server answered
 * moves the session's heard_ns on (the lease of its kept locks), and so
 * does the liveness probe, which nobody waits for (zk_alive_probe()).
 */
#include "backends/zookeeper_int.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

/*
 * One asynchronous request. The waiter and the completion each hold a
 * reference; a waiter that gives up marks it abandoned, and the completion
 * then queues the cleanup of what the request may have left (a lock node's
 * create or delete).
 */
enum { LEAVES_NOTHING, LEAVES_CREATED, LEAVES_UNDELETED };

struct zk_call {
    struct zk_conn *zc;
    unsigned gen;  /* the session it was sent on */
    uint64_t sent_ns; /* taken before the send: a lower bound of it */
    int leaves;    /* what it may leave if given up on */
    int refs, done, abandoned; /* under zc->mu */
    int rc;
    struct Stat st;
    char *created;        /* a create's new node */
    struct zk_kids kids;  /* a listing's lock children */
    struct zk_probe *probe; /* token_top's transaction */
    char data[ZK_DATA_MAX]; /* a getData's first bytes */
    char *value;          /* a whole getData's (zk_get_value()), or NULL */
    int value_len;
    zoo_op_t *ops;        /* a publish's transaction (zk_publish_set()) */
    zoo_op_result_t *results;
    char path[];
};

/* The probe's multi transaction (create, set, delete of one node): its
 * operations, results and stat live until the completion has run. */
struct zk_probe {
    zoo_op_t ops[3];
    zoo_op_result_t results[3];
    struct Stat st;
    char created[16];
};

static struct zk_call *call_new(struct zk_conn *zc, const char *path, int leaves)
{
    size_t len = strlen(path) + 1;
    struct zk_call *c = calloc(1, sizeof *c + len);
    if (!c)
        return NULL;
    c->zc = zc;
    c->gen = zc->gen;
    c->sent_ns = dlock_monotonic_ns();
    c->leaves = leaves;
    c->refs = 2;
    memcpy(c->path, path, len);
    return c;
}

static void call_free(struct zk_call *c)
{
    free(c->created);
    zk_kids_free(&c->kids);
    free(c->probe);
    free(c->value);
    free(c->ops);
    free(c->results);
    free(c);
}

/* Tells the waiter, under mu, that something changed. */
void zk_wake(struct zk_conn *zc)
{
    pthread_cond_broadcast(&zc->cv);
    if (zc->polling) {
        uint64_t one = 1;
        /* Cannot fail: the counter is drained by every poll, far below
         * its limit, and the client's threads block every signal. */
        while (write(zc->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
            ;
    }
}

/* What one wait on cv ended with. */
enum { WOKEN, TIMED_OUT, CANCEL_FIRED };

/*
 * Waits, mu held, for the next zk_wake() or until `until` (ts: the same,
 * for pthread_cond_timedwait; NEVER: no bound); spurious wakeups are the
 * caller's loop's to see. During an acquire with a cancel fd: waits on
 * {wake_fd, cancel_fd} in the core's wait with mu released, and
 * CANCEL_FIRED once the fd is readable, so that every later wait of the
 * acquire ends at once too.
 */
static int cv_wait(struct zk_conn *zc, uint64_t until, const struct timespec *ts)
{
    if (zc->cancel_fd < 0 || zc->wake_fd < 0) {
        if (until == NEVER)
            return pthread_cond_wait(&zc->cv, &zc->mu), WOKEN;
        return pthread_cond_timedwait(&zc->cv, &zc->mu, ts) == ETIMEDOUT ? TIMED_OUT : WOKEN;
    }
    struct pollfd p = {.fd = zc->wake_fd, .events = POLLIN};
    int cancel_fd = zc->cancel_fd;
    /* A zk_wake() after the caller's look at its condition, made under mu,
     * finds polling set and leaves wake_fd readable for this wait. */
    zc->polling = 1;
    pthread_mutex_unlock(&zc->mu);
    /* A signal (DLOCK_POLL_SIGNAL), or a failed poll: a spurious wakeup. */
    int r = dlock_poll_until(&p, 1, cancel_fd, until == NEVER ? DLOCK_POLL_FOREVER : until,
                             DLOCK_POLL_INTR);
    uint64_t drained;
    if (r > 0 && (p.revents & POLLIN))
        while (read(zc->wake_fd, &drained, sizeof drained) < 0 && errno == EINTR)
            ;
    pthread_mutex_lock(&zc->mu);
    zc->polling = 0;
    if (r > 0 && (r & DLOCK_POLL_CANCEL)) {
        zc->cancelled = 1;
        return CANCEL_FIRED;
    }
    return r == 0 ? TIMED_OUT : WOKEN;
}

/* The code of a reply a server sent (about the request's node), not one
 * the C client made up for a request without an answer. */
static int server_answered(int rc)
{
    return rc == ZOK || rc == ZNONODE || rc == ZNODEEXISTS || rc == ZNOTEMPTY ||
           rc == ZBADVERSION || rc == ZNOAUTH || rc == ZNOCHILDRENFOREPHEMERALS;
}

/* A server of session gen answered a request sent at sent_ns: it cannot
 * expire the session before sent_ns + its timeout. mu held. */
static void heard_at(struct zk_conn *zc, unsigned gen, uint64_t sent_ns)
{
    if (gen == zc->gen && sent_ns > zc->heard_ns)
        zc->heard_ns = sent_ns;
}

static void call_complete(struct zk_call *c, int rc)
{
    struct zk_conn *zc = c->zc;
    struct zk_orphan *o = NULL;
    pthread_mutex_lock(&zc->mu);
    c->rc = rc;
    c->done = 1;
    if (server_answered(rc))
        heard_at(zc, c->gen, c->sent_ns);
    if (rc == ZOK) {
        uint64_t z[3] = {(uint64_t)c->st.czxid, (uint64_t)c->st.mzxid, (uint64_t)c->st.pzxid};
        for (int i = 0; i < 3; i++)
            if (z[i] > zc->seen_zxid && z[i] < (1ull << 63))
                zc->seen_zxid = z[i];
    }
    int cleanup = c->abandoned && c->gen == zc->gen;
    zk_wake(zc);
    pthread_mutex_unlock(&zc->mu);
    if (cleanup && c->leaves == LEAVES_CREATED && rc == ZOK)
        o = zk_orphan_node(zc, c->created, c->gen);
    else if (cleanup && c->leaves == LEAVES_CREATED && maybe_done(rc))
        o = zk_orphan_search(zc, c->path, c->gen);
    else if (cleanup && c->leaves == LEAVES_UNDELETED && maybe_done(rc))
        o = zk_orphan_node(zc, c->path, c->gen);
    zk_orphan_queue(zc, o);
    pthread_mutex_lock(&zc->mu);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&zc->mu);
    if (last)
        call_free(c);
}

static void on_void(int rc, const void *data)
{
    call_complete((struct zk_call *)data, rc);
}

static void on_stat(int rc, const struct Stat *st, const void *data)
{
    struct zk_call *c = (struct zk_call *)data;
    if (rc == ZOK && st)
        c->st = *st;
    call_complete(c, rc);
}

static void on_data(int rc, const char *value, int len, const struct Stat *st, const void *data)
{
    struct zk_call *c = (struct zk_call *)data;
    if (rc == ZOK && value && len > 0) {
        size_t n = (size_t)len < ZK_DATA_MAX - 1 ? (size_t)len : ZK_DATA_MAX - 1;
        memcpy(c->data, value, n);
        c->data[n] = '\0';
    }
    if (rc == ZOK && c->value) {
        c->value_len = value && len > 0 ? len : 0;
        if (c->value_len > ZK_ELECTION_DATA_MAX)
            c->value_len = ZK_ELECTION_DATA_MAX;
        if (c->value_len)
            memcpy(c->value, value, (size_t)c->value_len);
    }
    on_stat(rc, st, data);
}

static void on_created(int rc, const char *path, const struct Stat *st, const void *data)
{
    struct zk_call *c = (struct zk_call *)data;
    if (rc == ZOK) {
        if (st)
            c->st = *st;
        /* Without the name, the node can only be found as a lost reply's. */
        if (!path || !(c->created = strdup(path)))
            rc = ZCONNECTIONLOSS;
    }
    call_complete(c, rc);
}

static void on_probed(int rc, const void *data)
{
    struct zk_call *c = (struct zk_call *)data;
    if (rc == ZOK)
        c->st = c->probe->st;
    call_complete(c, rc);
}

static void on_listed(int rc, const struct String_vector *sv, const void *data)
{
    struct zk_call *c = (struct zk_call *)data;
    if (rc == ZOK && zk_kids_parse_layout(sv ? (const char *const *)sv->data : NULL,
                                          sv && sv->count > 0 ? (size_t)sv->count : 0,
                                          c->zc->layout, &c->kids) != 0)
        rc = NOMEM;
    call_complete(c, rc);
}

/* The request was handed to the client (rc ZOK), or not: then its
 * completion never runs. Returns rc. */
static int call_sent(struct zk_call *c, int rc)
{
    if (rc == ZOK)
        return rc;
    pthread_mutex_lock(&c->zc->mu);
    c->rc = rc;
    c->done = 1;
    /* The client may have registered the completion before failing to
     * marshal: keep its reference then (a leak at worst). */
    if (rc != ZMARSHALLINGERROR)
        c->refs--;
    pthread_mutex_unlock(&c->zc->mu);
    return rc;
}

/* The reply's code, or NOREPLY if it has not come by until (NEVER: the C
 * client's own timeout bounds the wait, 2/3 of the session timeout into a
 * silent network), or CANCELLED if the acquire's cancel fd fired first. */
static int call_wait(struct zk_call *c, uint64_t until)
{
    struct zk_conn *zc = c->zc;
    struct timespec ts;
    int why = WOKEN;
    if (until != NEVER)
        dlock_ns_to_timespec(until, &ts);
    pthread_mutex_lock(&zc->mu);
    while (!c->done && (why = cv_wait(zc, until, &ts)) == WOKEN)
        ;
    /* Given up in the same critical section as the last look at done: a
     * reply that comes after it is the completion's to clean up. */
    if (!c->done)
        c->abandoned = 1;
    int rc = c->done ? c->rc : why == CANCEL_FIRED ? CANCELLED : NOREPLY;
    pthread_mutex_unlock(&zc->mu);
    return rc;
}

/* The waiter lets go of c (call_wait marked it abandoned if it had no
 * reply). */
static void call_put(struct zk_call *c)
{
    if (!c)
        return;
    struct zk_conn *zc = c->zc;
    pthread_mutex_lock(&zc->mu);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&zc->mu);
    if (last)
        call_free(c);
}

/* The synchronous forms: the reply's code, NOREPLY, or NOMEM. */
int zk_delete(struct zk_conn *zc, const char *path, uint64_t until)
{
    struct zk_call *c = call_new(zc, path, LEAVES_UNDELETED);
    if (!c)
        return NOMEM;
    call_sent(c, zoo_adelete(zc->zh, path, -1, on_void, c));
    int rc = call_wait(c, until);
    call_put(c);
    return rc;
}

int zk_exists(struct zk_conn *zc, const char *path, struct Stat *st, uint64_t until)
{
    struct zk_call *c = call_new(zc, path, LEAVES_NOTHING);
    if (!c)
        return NOMEM;
    call_sent(c, zoo_aexists(zc->zh, path, 0, on_stat, c));
    int rc = call_wait(c, until);
    if (rc == ZOK)
        *st = c->st;
    call_put(c);
    return rc;
}

/* getData, with a watch if asked (delivered to the session's watcher). */
int zk_get(struct zk_conn *zc, const char *path, int watch, uint64_t until)
{
    struct zk_call *c = call_new(zc, path, LEAVES_NOTHING);
    if (!c)
        return NOMEM;
    call_sent(c, zoo_aget(zc->zh, path, watch, on_data, c));
    int rc = call_wait(c, until);
    call_put(c);
    return rc;
}

/* Sends getData (watch set, or none with data) or exists (none) of each of
 * paths[0..n) and waits for every reply: ZOK, ZNONODE when one is gone,
 * else the first other code; the stats in st[] and data in data[] (if
 * given). */
static int pipelined(struct zk_conn *zc, char *const *paths, size_t n, int watch,
                     struct Stat *st, char (*data)[ZK_DATA_MAX], int *written, uint64_t until)
{
    struct zk_call **c = calloc(n ? n : 1, sizeof *c);
    int rc = ZOK;
    if (!c)
        return NOMEM;
    for (size_t i = 0; i < n && rc == ZOK; i++) {
        if (!(c[i] = call_new(zc, paths[i], LEAVES_NOTHING)))
            rc = NOMEM;
        else if (watch || data)
            call_sent(c[i], zoo_aget(zc->zh, paths[i], watch, on_data, c[i]));
        else
            call_sent(c[i], zoo_aexists(zc->zh, paths[i], 0, on_stat, c[i]));
    }
    /* Every request sent is waited for (replies come in order). */
    for (size_t i = 0; i < n && c[i]; i++) {
        int r = call_wait(c[i], until);
        if (r == ZOK && st)
            st[i] = c[i]->st;
        if (r == ZOK && data)
            memcpy(data[i], c[i]->data, ZK_DATA_MAX);
        if (r == ZOK && written && c[i]->st.version > 0)
            *written = 1;
        if (r != ZOK && (rc == ZOK || (rc == ZNONODE && r != ZNONODE)))
            rc = r;
        call_put(c[i]);
    }
    free(c);
    return rc;
}

int zk_watch_all(struct zk_conn *zc, char *const *paths, size_t n, int *written,
                 uint64_t until)
{
    *written = 0;
    return pipelined(zc, paths, n, 1, NULL, NULL, written, until);
}

int zk_exists_all(struct zk_conn *zc, char *const *paths, size_t n, struct Stat *st,
                  char (*data)[ZK_DATA_MAX], uint64_t until)
{
    return pipelined(zc, paths, n, 0, st, data, NULL, until);
}

int zk_set(struct zk_conn *zc, const char *path, uint64_t until)
{
    static const char data[] = "held";
    struct zk_call *c = call_new(zc, path, LEAVES_NOTHING);
    if (!c)
        return NOMEM;
    call_sent(c, zoo_aset(zc->zh, path, data, (int)sizeof data - 1, -1, on_stat, c));
    int rc = call_wait(c, until);
    call_put(c);
    return rc;
}

/* A node that nobody has to clean up: root, parents, the ping's. */
int zk_create(struct zk_conn *zc, const char *path, int flags, uint64_t until)
{
    struct zk_call *c = call_new(zc, path, LEAVES_NOTHING);
    if (!c)
        return NOMEM;
    call_sent(c, zoo_acreate2(zc->zh, path, NULL, -1, zc->acl, flags, on_created, c));
    int rc = call_wait(c, until);
    call_put(c);
    return rc;
}

/* The probe (see zookeeper.c's top): *zxid is its transaction's, above
 * every czxid before it. Leaves nothing whatever happens to the reply. */
int zk_probe(struct zk_conn *zc, const char *path, uint64_t *zxid, uint64_t until)
{
    static const char data[] = "top";
    struct zk_call *c = call_new(zc, path, LEAVES_NOTHING);
    if (c && !(c->probe = calloc(1, sizeof *c->probe))) {
        free(c);
        c = NULL;
    }
    if (!c)
        return NOMEM;
    struct zk_probe *p = c->probe;
    zoo_create_op_init(&p->ops[0], c->path, NULL, -1, zc->acl, ZOO_EPHEMERAL, p->created,
                       sizeof p->created);
    zoo_set_op_init(&p->ops[1], c->path, data, (int)sizeof data - 1, -1, &p->st);
    zoo_delete_op_init(&p->ops[2], c->path, -1);
    call_sent(c, zoo_amulti(zc->zh, 3, p->ops, p->results, on_probed, c));
    int rc = call_wait(c, until);
    if (rc == ZOK)
        *zxid = (uint64_t)c->st.mzxid;
    call_put(c);
    return rc;
}

static void on_published(int rc, const void *data)
{
    struct zk_call *c = (struct zk_call *)data;
    if (rc == ZOK)
        c->st = c->probe->st;
    call_complete(c, rc);
}

/* One transaction: setData of node to value if its version is still
 * version, and setData of parent to pdata (plen bytes). Nothing is written
 * unless both are. ZOK and the node's new stat in *st, or the code of the
 * failed step (ZNONODE, ZBADVERSION for the node's). */
int zk_publish_set(struct zk_conn *zc, const char *node, int version, const void *value,
                   size_t len, const char *parent, const char *pdata, size_t plen,
                   struct Stat *st, uint64_t until)
{
    struct zk_call *c = call_new(zc, node, LEAVES_NOTHING);
    if (c) {
        c->probe = calloc(1, sizeof *c->probe);
        c->value = malloc(len + plen + 1);
        c->ops = calloc(2, sizeof *c->ops);
        c->results = calloc(2, sizeof *c->results);
        if (!c->probe || !c->value || !c->ops || !c->results) {
            call_free(c);
            c = NULL;
        }
    }
    if (!c)
        return NOMEM;
    /* The client marshals the ops at the send: the buffers need not live on. */
    memcpy(c->value, value, len);
    memcpy(c->value + len, pdata, plen);
    zoo_set_op_init(&c->ops[0], node, c->value, (int)len, version, &c->probe->st);
    zoo_set_op_init(&c->ops[1], parent, c->value + len, (int)plen, -1, NULL);
    call_sent(c, zoo_amulti(zc->zh, 2, c->ops, c->results, on_published, c));
    int rc = call_wait(c, until);
    if (rc == ZOK)
        *st = c->st;
    else if (rc != NOREPLY && rc != NOMEM && c->results[0].err != ZOK &&
             c->results[0].err != ZRUNTIMEINCONSISTENCY)
        rc = c->results[0].err; /* the node's step failed: its own code */
    call_put(c);
    return rc;
}

int zk_list(struct zk_conn *zc, const char *path, struct zk_kids *k, uint64_t until)
{
    struct zk_call *c = call_new(zc, path, LEAVES_NOTHING);
    if (!c)
        return NOMEM;
    call_sent(c, zoo_aget_children(zc->zh, path, 0, on_listed, c));
    int rc = call_wait(c, until);
    if (rc == ZOK) {
        *k = c->kids;
        c->kids = (struct zk_kids){NULL, 0};
    }
    call_put(c);
    return rc;
}

static void on_synced(int rc, const char *value, const void *data)
{
    (void)value;
    call_complete((struct zk_call *)data, rc);
}

/* A sync and a listing of path, pipelined (one round trip): the servers
 * run a session's requests in order, so the listing is served once the
 * server we talk to has caught up with the leader as of the sync: what any
 * other session's write committed before it is in the list, even on a
 * follower that was behind. The reply's code, NOREPLY or NOMEM. */
static int sync_list(struct zk_conn *zc, const char *path, int sync, struct zk_kids *k,
                     char *data, size_t *len, uint64_t until)
{
    struct zk_call *sc = sync ? call_new(zc, zc->root, LEAVES_NOTHING) : NULL;
    struct zk_call *lc = call_new(zc, path, LEAVES_NOTHING);
    struct zk_call *dc = data ? call_new(zc, path, LEAVES_NOTHING) : NULL;
    if (dc && !(dc->value = malloc(ZK_ELECTION_DATA_MAX)))
        call_free(dc), dc = NULL;
    if ((sync && !sc) || !lc || (data && !dc)) {
        free(sc), free(lc), free(dc);
        return NOMEM;
    }
    int rc = sc ? call_sent(sc, zoo_async(zc->zh, zc->root, on_synced, sc)) : ZOK;
    if (rc == ZOK)
        call_sent(lc, zoo_aget_children(zc->zh, path, 0, on_listed, lc));
    else
        call_sent(lc, ZINVALIDSTATE); /* not sent */
    if (dc)
        call_sent(dc, rc == ZOK ? zoo_aget(zc->zh, path, 0, on_data, dc) : ZINVALIDSTATE);
    /* Replies come in order: the sync's first. */
    int drc = dc ? call_wait(dc, until) : ZOK;
    int lrc = call_wait(lc, until);
    rc = sc ? call_wait(sc, until) : ZOK;
    if (rc == ZOK && lrc == ZOK) {
        *k = lc->kids;
        lc->kids = (struct zk_kids){NULL, 0};
    }
    if (dc && rc == ZOK && lrc == ZOK && drc == ZOK) {
        memcpy(data, dc->value, (size_t)dc->value_len);
        *len = (size_t)dc->value_len;
    }
    call_put(sc);
    call_put(lc);
    call_put(dc);
    return rc != ZOK ? rc : lrc != ZOK ? lrc : drc;
}

int zk_sync_list(struct zk_conn *zc, const char *path, struct zk_kids *k, uint64_t until)
{
    return sync_list(zc, path, 1, k, NULL, NULL, until);
}

int zk_list_data(struct zk_conn *zc, const char *path, int sync, struct zk_kids *k, char *data,
                 size_t *len, uint64_t until)
{
    return sync_list(zc, path, sync, k, data, len, until);
}

/* The acquire's pipelined create + list (zookeeper.c's create_and_list()).
 * A create given up on (no reply by the bound) is cleaned up by its
 * completion: the node deleted if it says it made one, looked for by our
 * owner id if its reply is lost too. */
void zk_create_list(struct zk_conn *zc, const char *prefix, const char *data,
                    const char *parent, uint64_t until, struct zk_made *m)
{
    struct zk_call *cc = call_new(zc, prefix, LEAVES_CREATED);
    struct zk_call *lc = call_new(zc, parent, LEAVES_NOTHING);
    memset(m, 0, sizeof *m);
    if (!cc || !lc) {
        free(cc), free(lc);
        m->rc = m->lrc = NOMEM;
        return;
    }
    int rc = call_sent(cc, zoo_acreate2(zc->zh, prefix, data, data ? (int)strlen(data) : -1,
                                        zc->acl, ZOO_EPHEMERAL_SEQUENTIAL, on_created, cc));
    if (rc == ZOK)
        call_sent(lc, zoo_aget_children(zc->zh, parent, 0, on_listed, lc));
    else
        call_sent(lc, ZINVALIDSTATE); /* not sent */
    m->lrc = call_wait(lc, until); /* replies come in order: the create's first */
    m->gen = cc->gen;
    m->rc = call_wait(cc, until);
    if (m->rc == ZOK) {
        m->created = cc->created;
        cc->created = NULL;
        m->czxid = (uint64_t)cc->st.czxid;
        if (m->lrc == ZOK) {
            m->kids = lc->kids;
            lc->kids = (struct zk_kids){NULL, 0};
        }
    }
    call_put(cc);
    call_put(lc);
}

/* ---- the session's liveness ------------------------------------------- */

struct zk_alive {
    struct zk_conn *zc;
    unsigned gen;
    uint64_t sent_ns;
};

/* Runs on the completion thread (with ZCLOSING when the session closes,
 * before zookeeper_close() returns, so zc is still there). */
static void on_alive(int rc, const struct Stat *st, const void *data)
{
    struct zk_alive *a = (struct zk_alive *)data;
    struct zk_conn *zc = a->zc;
    (void)st;
    pthread_mutex_lock(&zc->mu);
    if (a->gen == zc->gen) {
        zc->probe_busy = 0;
        zc->probe_failed = !server_answered(rc);
        if (!zc->probe_failed)
            heard_at(zc, a->gen, a->sent_ns);
    }
    pthread_mutex_unlock(&zc->mu);
    free(a);
}

void zk_alive_probe(struct zk_conn *zc, uint64_t now, uint64_t period_ns)
{
    uint64_t wait = zc->probe_failed ? PROBE_RETRY_MS * MS : period_ns;
    if (zc->probe_busy || (zc->probe_sent_ns && now - zc->probe_sent_ns < wait))
        return;
    struct zk_alive *a = malloc(sizeof *a);
    if (!a)
        return; /* tried again at the next keep() */
    *a = (struct zk_alive){zc, zc->gen, now};
    zc->probe_sent_ns = now;
    zc->probes++;
    /* Queued while the connection is down, sent once it is back (the send
     * time kept is earlier: conservative); its completion always runs, if
     * only with a connection loss or ZCLOSING. */
    int rc = zoo_aexists(zc->zh, zc->root, 0, on_alive, a);
    if (rc == ZOK) {
        zc->probe_busy = 1;
    } else {
        zc->probe_failed = 1;
        if (rc != ZMARSHALLINGERROR) /* then the completion may own it */
            free(a);
    }
}

/* ---- events ----------------------------------------------------------- */

uint64_t zk_events_now(struct zk_conn *zc)
{
    pthread_mutex_lock(&zc->mu);
    uint64_t e = zc->events;
    pthread_mutex_unlock(&zc->mu);
    return e;
}

int zk_wait_event(struct zk_conn *zc, uint64_t seen, uint64_t until)
{
    struct timespec ts;
    int got, why = WOKEN;
    if (until != NEVER)
        dlock_ns_to_timespec(until, &ts);
    pthread_mutex_lock(&zc->mu);
    while (zc->events == seen && (why = cv_wait(zc, until, &ts)) == WOKEN)
        ;
    got = zc->events != seen ? 1 : why == CANCEL_FIRED ? -1 : 0;
    pthread_mutex_unlock(&zc->mu);
    return got;
}

int zk_watch_cancel(struct zk_conn *zc, const dlock_request *req)
{
    if (req->cancel_fd < 0)
        return 0;
    if (zc->wake_fd < 0) {
        int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0)
            return dlock_seterr(cl(zc), errno == ENOMEM ? DLOCK_ENOMEM : DLOCK_EIO,
                                "cannot make an eventfd to watch the cancel flag: %s",
                                strerror(errno));
        pthread_mutex_lock(&zc->mu);
        zc->wake_fd = fd;
        pthread_mutex_unlock(&zc->mu);
    }
    zc->cancel_fd = req->cancel_fd;
    return 0;
}
