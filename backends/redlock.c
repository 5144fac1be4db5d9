/*
 * Redlock: one lock over N independent Redis instances (N = host count).
 *
 * An attempt runs the script's "grab" (SET NX PX + INCR of the node's
 * fencing counter) on every node at once, each bounded by node_timeout. It
 * wins with a quorum (N/2 + 1) of grants and a positive validity,
 * ttl - elapsed - drift (drift = ttl/100 + 2 ms), all on CLOCK_MONOTONIC.
 * Any failed attempt is undone on every node.
 *
 * The token: the largest counter among the granting nodes, M, is written
 * back ("fence": counter = max(counter, M)) to the nodes while the lock is
 * still ours, and the grant counts only if that too finishes on a quorum
 * within the validity. Any later quorum shares a node with this one whose
 * counter is already >= M, so its token is greater, as long as no node
 * loses its counter (a restart without persistence can: see docs).
 *
 * Waiting: a waiter subscribes to the lock's release channel on every
 * node before it retries, and each release publishes there. Not FIFO, and
 * every waiter wakes on a release: that is the price of having no single
 * queue to trust.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "backends/redis_conn.h"
#include "core/internal.h"

#define MAX_NODES 64
#define RECONNECT_BACKOFF_NS 1000000000ull
/* Longest a waiter goes without an attempt, however long the holder's
 * lease: nodes that went silent are noticed by the attempts (see
 * dlock_redlock_acquire()), not only when the lease runs out. */
#define WAIT_SLICE_NS 5000000000ull

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
}

static uint64_t node_timeout_ns(struct redis_conn *rc)
{
    return (uint64_t)rc->cmd_tv.tv_sec * 1000000000u + (uint64_t)rc->cmd_tv.tv_usec * 1000u;
}

static size_t quorum(struct redis_conn *rc)
{
    return rc->nnodes / 2 + 1;
}

static size_t connected(struct redis_conn *rc)
{
    size_t n = 0;
    for (size_t i = 0; i < rc->nnodes; i++)
        n += rc->nodes[i].cmd != NULL;
    return n;
}

/* A reply that says "yes": integer 1, or {1, token}. */
static int positive(const redisReply *r)
{
    if (!r)
        return 0;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer == 1;
    return r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
           r->element[0]->type == REDIS_REPLY_INTEGER && r->element[0]->integer == 1;
}

/* Gives up waiting for node n's reply: it is skipped when it comes. A node
 * that owes too many is reconnected instead. */
static void abandon(struct redis_conn *rc, struct redis_node *n)
{
    if (++n->stale > 8) {
        redisFree(n->cmd);
        n->cmd = NULL;
        n->stale = 0;
    }
    (void)rc;
}

/* Next reply of node n that is not owed to an abandoned call; NULL if none
 * is buffered yet; sets *broken on a connection error. */
static redisReply *next_reply(struct redis_conn *rc, struct redis_node *n, int *broken)
{
    for (;;) {
        void *r = NULL;
        if (redisGetReplyFromReader(n->cmd, &r) != REDIS_OK) {
            dlock_redis_ctx_error(rc, n, &n->cmd, "reading");
            n->stale = 0;
            *broken = 1;
            return NULL;
        }
        if (!r || n->stale == 0)
            return r;
        freeReplyObject(r);
        n->stale--;
    }
}

/*
 * Sends the same script call to every node, then collects the replies in
 * parallel until timeout_ns, or as soon as `need` positive replies
 * are in (0: wait for all), or as soon as `need` can no longer be reached.
 * replies[i] is NULL for a node that failed or was not waited for.
 */
static void all_nodes(struct redis_conn *rc, struct redis_held *h, const char **args,
                      const size_t *lens, size_t nargs, redisReply **replies, size_t need,
                      uint64_t timeout_ns)
{
    const char *argv[16];
    size_t argvlen[16];
    size_t argc = dlock_redis_script_argv(rc, &h->keys, args, lens, nargs, argv, argvlen);
    uint64_t until;
    int pending[MAX_NODES] = {0};
    size_t npending = 0, yes = 0, no = 0;

    for (size_t i = 0; i < rc->nnodes; i++) {
        struct redis_node *n = &rc->nodes[i];
        replies[i] = NULL;
        /* A node that just failed to connect is left alone for a while, so
         * one dead or silent node does not cost every call a connect. */
        if (!n->cmd && dlock_monotonic_ns() < n->retry_at)
            continue;
        if (dlock_redis_node_connect(rc, n, &rc->cmd_tv) != 0) {
            n->retry_at = dlock_monotonic_ns() + RECONNECT_BACKOFF_NS;
            continue;
        }
        /* A node restarted since our last call has reset the connection:
         * the write fails (EPIPE), and never kills us with SIGPIPE. */
        if (dlock_redis_send(rc, n->cmd, argc, argv, argvlen) != REDIS_OK) {
            dlock_redis_ctx_error(rc, n, &n->cmd, "sending");
            n->stale = 0;
            continue;
        }
        pending[i] = 1;
        npending++;
    }
    /* The reply clock starts once everything is sent. */
    until = dlock_monotonic_ns() + timeout_ns;
    no = rc->nnodes - npending;
    while (npending > 0) {
        struct pollfd pfd[MAX_NODES];
        size_t idx[MAX_NODES], np = 0;
        for (size_t i = 0; i < rc->nnodes; i++) {
            if (!pending[i])
                continue;
            int broken = 0;
            redisReply *r = next_reply(rc, &rc->nodes[i], &broken);
            if (!r && !broken) {
                pfd[np] = (struct pollfd){.fd = rc->nodes[i].cmd->fd, .events = POLLIN};
                idx[np++] = i;
                continue;
            }
            replies[i] = r;
            pending[i] = 0;
            npending--;
            if (positive(r))
                yes++;
            else
                no++;
        }
        if (need && (yes >= need || rc->nnodes - no < need))
            break; /* decided: the rest are skipped when they answer */
        if (np == 0)
            break;
        uint64_t now = dlock_monotonic_ns();
        struct timespec ts = {0, 0};
        /* Past the clock, still one look at what already arrived. */
        if (now < until)
            dlock_ns_to_timespec(until - now, &ts);
        int pr = ppoll(pfd, np, &ts, NULL);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            for (size_t k = 0; k < np; k++) { /* no answer in time */
                struct redis_node *n = &rc->nodes[idx[k]];
                dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: no reply within node_timeout",
                             n->host, n->port);
                abandon(rc, n);
                pending[idx[k]] = 0;
                npending--;
            }
            break;
        }
        for (size_t k = 0; k < np; k++)
            if (pfd[k].revents && redisBufferRead(rc->nodes[idx[k]].cmd) != REDIS_OK) {
                dlock_redis_ctx_error(rc, &rc->nodes[idx[k]], &rc->nodes[idx[k]].cmd, "reading");
                rc->nodes[idx[k]].stale = 0;
                pending[idx[k]] = 0;
                npending--;
                no++;
            }
    }
    for (size_t i = 0; i < rc->nnodes; i++)
        if (pending[i])
            abandon(rc, &rc->nodes[i]);
    /* A node that lost its script cache answers NOSCRIPT: redo it there. */
    for (size_t i = 0; i < rc->nnodes; i++) {
        redisReply *r = replies[i];
        if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r);
            replies[i] = NULL;
            if (rc->nodes[i].stale == 0) /* a synchronous call must not meet a stale reply */
                dlock_redis_script(rc, &rc->nodes[i], argc, argv, argvlen, &replies[i]);
        }
    }
}

static void free_replies(struct redis_conn *rc, redisReply **replies)
{
    for (size_t i = 0; i < rc->nnodes; i++)
        if (replies[i])
            freeReplyObject(replies[i]);
}

static size_t count_ones(struct redis_conn *rc, redisReply **replies)
{
    size_t n = 0;
    for (size_t i = 0; i < rc->nnodes; i++)
        if (replies[i] && replies[i]->type == REDIS_REPLY_INTEGER && replies[i]->integer == 1)
            n++;
    return n;
}

static const char *release_channel(struct redis_held *h, size_t *len, char **buf)
{
    /* "<prefix><name>:released", next to the lock key "<prefix><name>:lock" */
    size_t base = h->keys.len[0] - strlen(":lock");
    *buf = malloc(base + sizeof ":released");
    if (!*buf)
        return NULL;
    memcpy(*buf, h->keys.k[0], base);
    memcpy(*buf + base, ":released", sizeof ":released");
    *len = base + sizeof ":released" - 1;
    return *buf;
}

/* Releases on every node and wakes waiters. *ours counts the nodes where
 * it was still ours, *not_ours those that said it was not (the rest did not
 * answer in time). A release is not latency-bound like a grant, so it waits
 * up to the connect timeout rather than node_timeout. */
static void drop_all(struct redis_conn *rc, struct redis_held *h, size_t *ours, size_t *not_ours)
{
    redisReply *replies[MAX_NODES];
    char *chan = NULL;
    size_t chan_len = 0;
    uint64_t bound = (uint64_t)rc->connect_tv.tv_sec * 1000000000u +
                     (uint64_t)rc->connect_tv.tv_usec * 1000u;
    *ours = *not_ours = 0;
    if (!release_channel(h, &chan_len, &chan))
        return;
    const char *args[3] = {"drop", h->owner, chan};
    const size_t lens[3] = {4, 32, chan_len};
    all_nodes(rc, h, args, lens, 3, replies, quorum(rc), bound);
    for (size_t i = 0; i < rc->nnodes; i++)
        if (replies[i] && replies[i]->type == REDIS_REPLY_INTEGER)
            replies[i]->integer == 1 ? (*ours)++ : (*not_ours)++;
    free_replies(rc, replies);
    free(chan);
}

static int64_t drift_ms(uint32_t ttl_ms)
{
    return (int64_t)ttl_ms / 100 + 2;
}

static int64_t validity_ms(uint64_t start_ns, uint32_t ttl_ms)
{
    int64_t elapsed = (int64_t)((dlock_monotonic_ns() - start_ns) / 1000000u);
    return (int64_t)ttl_ms - elapsed - drift_ms(ttl_ms);
}

/* Until when a grant or renewal sent at start_ns is ours: its validity
 * measured from the start (only called with a positive validity). */
static uint64_t lease_end(uint64_t start_ns, uint32_t ttl_ms)
{
    return start_ns + (uint64_t)((int64_t)ttl_ms - drift_ms(ttl_ms)) * 1000000u;
}

/* One attempt: 1 won, 0 refused (*wait_ms: shortest PTTL seen), <0 error. */
static int attempt(struct redis_conn *rc, struct redis_held *h, int64_t *wait_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16], floor[24];
    size_t granted = 0, answered = 0;
    uint64_t max_token = 0, min_token = 0, start = dlock_monotonic_ns();
    int64_t shortest = -1;

    dlock_clearerr(cl(rc));
    snprintf(ttl, sizeof ttl, "%" PRIu32, h->ttl_ms);
    const char *args[3] = {"grab", h->owner, ttl};
    const size_t lens[3] = {4, 32, strlen(ttl)};
    all_nodes(rc, h, args, lens, 3, replies, quorum(rc), node_timeout_ns(rc));
    for (size_t i = 0; i < rc->nnodes; i++) {
        redisReply *r = replies[i];
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
            continue;
        answered++;
        if (r->element[0]->integer == 1) {
            uint64_t t = (uint64_t)r->element[1]->integer;
            granted++;
            max_token = t > max_token ? t : max_token;
            min_token = !min_token || t < min_token ? t : min_token;
        } else if (shortest < 0 || r->element[1]->integer < shortest) {
            shortest = r->element[1]->integer;
        }
    }
    free_replies(rc, replies);
    *wait_ms = shortest;
    if (granted >= quorum(rc) && validity_ms(start, h->ttl_ms) > 0) {
        /* Counters in step (the usual case): the quorum already holds M. */
        size_t fenced = granted;
        if (min_token != max_token) {
            snprintf(floor, sizeof floor, "%" PRIu64, max_token);
            const char *fargs[3] = {"fence", h->owner, floor};
            const size_t flens[3] = {5, 32, strlen(floor)};
            all_nodes(rc, h, fargs, flens, 3, replies, quorum(rc), node_timeout_ns(rc));
            fenced = count_ones(rc, replies);
            free_replies(rc, replies);
        }
        if (fenced >= quorum(rc) && validity_ms(start, h->ttl_ms) > 0) {
            h->base.token = max_token;
            h->base.lease_end_ns = lease_end(start, h->ttl_ms);
            dlock_clearerr(cl(rc));
            return 1;
        }
    }
    /* Undo on every node unless all refused: a node we stopped waiting for
     * may have granted too. */
    size_t ours, not_ours;
    if (granted > 0 || answered < rc->nnodes)
        drop_all(rc, h, &ours, &not_ours);
    if (granted >= quorum(rc)) {
        dlock_seterr(cl(rc), DLOCK_EBUSY,
                     "a quorum granted the lock but its validity ran out (lease %" PRIu32
                     " ms too short for the nodes' latency)",
                     h->ttl_ms);
        return 0;
    }
    if (answered < quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                            "only %zu of %zu Redlock nodes answered (quorum %zu)", answered,
                            rc->nnodes, quorum(rc));
    return 0;
}

static void drop_sub(struct redis_node *n)
{
    if (n->sub)
        redisFree(n->sub);
    n->sub = NULL;
}

/* Reads node n's subscriber replies until the confirmation for chan (each
 * read bounded by node_timeout); 0 once subscribed. */
static int confirm_subscribed(struct redis_conn *rc, struct redis_node *n, const char *chan,
                              size_t len)
{
    for (;;) {
        void *v = NULL;
        if (dlock_redis_get_reply(rc, n->sub, &v) != REDIS_OK || !v)
            return -1;
        redisReply *r = v;
        int confirmed = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                        r->element[0]->type == REDIS_REPLY_STRING &&
                        strcmp(r->element[0]->str, "subscribe") == 0 &&
                        r->element[1]->type == REDIS_REPLY_STRING &&
                        r->element[1]->len == len && memcmp(r->element[1]->str, chan, len) == 0;
        int error = r->type == REDIS_REPLY_ERROR;
        freeReplyObject(r);
        if (confirmed)
            return 0;
        if (error)
            return -1;
        /* older "message" / "unsubscribe" replies: skip */
    }
}

/* SUBSCRIBE (confirmed, so that no release published after we retry can be
 * missed) or UNSUBSCRIBE on every reachable node's subscriber connection. */
static void subscribe_all(struct redis_conn *rc, const char *cmd, const char *chan, size_t len)
{
    int subscribing = strcmp(cmd, "SUBSCRIBE") == 0;
    int sent[MAX_NODES] = {0};
    for (size_t i = 0; i < rc->nnodes; i++) {
        struct redis_node *n = &rc->nodes[i];
        if (!n->sub) {
            if (!subscribing || dlock_monotonic_ns() < n->retry_at)
                continue;
            if (dlock_redis_connect_ctx(rc, n, &n->sub, &rc->cmd_tv) != 0) {
                n->retry_at = dlock_monotonic_ns() + RECONNECT_BACKOFF_NS;
                continue;
            }
        }
        const char *argv[2] = {cmd, chan};
        const size_t lens[2] = {strlen(cmd), len};
        if (dlock_redis_send(rc, n->sub, 2, argv, lens) != REDIS_OK)
            drop_sub(n);
        else
            sent[i] = 1;
    }
    if (!subscribing)
        return; /* confirmations are skipped when they arrive */
    for (size_t i = 0; i < rc->nnodes; i++)
        if (sent[i] && confirm_subscribed(rc, &rc->nodes[i], chan, len) != 0)
            drop_sub(&rc->nodes[i]);
    dlock_clearerr(cl(rc));
}

/* Waits for a "released" message on any node, or until until_ns. Replies
 * that are only (un)subscribe confirmations are consumed on the way. */
static int wait_release(struct redis_conn *rc, uint64_t until_ns)
{
    for (;;) {
        struct pollfd pfd[MAX_NODES];
        size_t idx[MAX_NODES], np = 0;
        for (size_t i = 0; i < rc->nnodes; i++) {
            struct redis_node *n = &rc->nodes[i];
            void *r = NULL;
            if (!n->sub)
                continue;
            while (redisGetReplyFromReader(n->sub, &r) == REDIS_OK && r) {
                redisReply *m = r;
                int msg = m->type == REDIS_REPLY_ARRAY && m->elements == 3 &&
                          m->element[0]->type == REDIS_REPLY_STRING &&
                          strcmp(m->element[0]->str, "message") == 0;
                freeReplyObject(r);
                r = NULL;
                if (msg)
                    return 0;
            }
            pfd[np] = (struct pollfd){.fd = n->sub->fd, .events = POLLIN};
            idx[np++] = i;
        }
        uint64_t now = dlock_monotonic_ns();
        if (now >= until_ns)
            return 0;
        struct timespec ts;
        dlock_ns_to_timespec(until_ns - now, &ts);
        /* With no subscriber left this just waits out the bound. */
        int pr = ppoll(np ? pfd : NULL, np, &ts, NULL);
        if (pr < 0 && errno == EINTR)
            return DLOCK_EINTR;
        if (pr <= 0)
            return 0;
        for (size_t k = 0; k < np; k++)
            if (pfd[k].revents && redisBufferRead(rc->nodes[idx[k]].sub) != REDIS_OK)
                drop_sub(&rc->nodes[idx[k]]);
    }
}

int dlock_redlock_acquire(struct redis_conn *rc, const dlock_request *req, struct redis_held *h)
{
    char *chan = NULL;
    size_t chan_len = 0;
    int64_t wait_ms = -1;
    unsigned losses = 0;
    int subscribed = 0, err;

    if (rc->nnodes > MAX_NODES)
        return dlock_seterr(cl(rc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    for (;;) {
        err = attempt(rc, h, &wait_ms);
        /* Nodes that are connected but slow to answer (overload, a herd of
         * waiters) do not end a wait: it goes on until its deadline. */
        if (err == DLOCK_ECONNECT && req->wait != DLOCK_WAIT_TRY && connected(rc) >= quorum(rc)) {
            if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() >= req->deadline_ns) {
                err = dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                                   "the deadline passed; too few Redlock nodes answered in time");
                break;
            }
            wait_ms = (int64_t)(node_timeout_ns(rc) / 1000000u);
            err = 0;
        }
        if (err != 0)
            break;
        if (req->wait == DLOCK_WAIT_TRY) {
            dlock_errsave why; /* keep attempt()'s detail when it said why */
            dlock_err_save(cl(rc), &why);
            if (why.err != DLOCK_EBUSY)
                dlock_seterr(cl(rc), DLOCK_EBUSY, "the lock is held by another owner");
            err = DLOCK_EBUSY;
            break;
        }
        uint64_t now = dlock_monotonic_ns();
        if (req->wait == DLOCK_WAIT_DEADLINE && now >= req->deadline_ns) {
            err = dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                               "the deadline passed with the lock still held elsewhere");
            break;
        }
        if (!subscribed) { /* subscribe, then retry at once: no release unseen */
            if (!release_channel(h, &chan_len, &chan)) {
                err = dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
                break;
            }
            subscribe_all(rc, "SUBSCRIBE", chan, chan_len);
            subscribed = 1;
            continue;
        }
        /* Until a release is published, or the shortest lease seen runs
         * out. Every waiter hears a release, so a waiter that keeps losing
         * the race then steps back by a random delay whose range doubles
         * with each loss (1 ms up to 64 ms): the herd spreads out instead
         * of splitting the vote in lockstep. */
        uint64_t bound = (uint64_t)(wait_ms > 0 ? wait_ms : 1) * 1000000u;
        if (bound > WAIT_SLICE_NS)
            bound = WAIT_SLICE_NS;
        uint64_t until = now + bound;
        if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < until)
            until = req->deadline_ns;
        if (wait_release(rc, until) == DLOCK_EINTR) {
            err = dlock_seterr(cl(rc), DLOCK_EINTR, "a signal interrupted the wait");
            break;
        }
        uint32_t rnd = 0;
        dlock_random_bytes(&rnd, sizeof rnd);
        uint64_t spread_ns = 1000000ull << (losses < 6 ? losses : 6);
        uint64_t backoff = rnd % spread_ns, woke = dlock_monotonic_ns();
        if (req->wait == DLOCK_WAIT_DEADLINE && woke + backoff > req->deadline_ns)
            backoff = woke < req->deadline_ns ? req->deadline_ns - woke : 0;
        struct timespec ts;
        dlock_ns_to_timespec(backoff, &ts);
        nanosleep(&ts, NULL);
        losses++;
    }
    if (subscribed)
        subscribe_all(rc, "UNSUBSCRIBE", chan, chan_len);
    free(chan);
    return err == 1 ? 0 : err;
}

int dlock_redlock_release(struct redis_conn *rc, struct redis_held *h)
{
    size_t ours, not_ours;
    drop_all(rc, h, &ours, &not_ours);
    if (ours >= quorum(rc)) {
        dlock_clearerr(cl(rc));
        return 0;
    }
    /* Lost only when the nodes that answered prove no quorum was ours. */
    if (rc->nnodes - not_ours < quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ELOST,
                            "the lock was no longer ours on %zu of %zu Redlock nodes (quorum %zu)",
                            not_ours, rc->nnodes, quorum(rc));
    return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                        "release confirmed on %zu of %zu Redlock nodes, the others did not answer",
                        ours, rc->nnodes);
}

int dlock_redlock_renew(struct redis_conn *rc, struct redis_held *h, uint32_t ttl_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16];
    uint64_t start = dlock_monotonic_ns();
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    const char *args[3] = {"renew", h->owner, ttl};
    const size_t lens[3] = {5, 32, strlen(ttl)};
    all_nodes(rc, h, args, lens, 3, replies, quorum(rc), node_timeout_ns(rc));
    size_t ours = count_ones(rc, replies);
    free_replies(rc, replies);
    if (ours >= quorum(rc) && validity_ms(start, ttl_ms) > 0) {
        h->ttl_ms = ttl_ms;
        h->base.lease_end_ns = lease_end(start, ttl_ms);
        dlock_clearerr(cl(rc));
        return 0;
    }
    size_t dropped, not_ours;
    drop_all(rc, h, &dropped, &not_ours); /* a minority is no lock: free it for others */
    return dlock_seterr(cl(rc), DLOCK_ELOST,
                        "renewed on only %zu of %zu Redlock nodes (quorum %zu)", ours,
                        rc->nnodes, quorum(rc));
}

/*
 * The keeper's renewal on its own connections kc: the renew script on every
 * node at once, like dlock_redlock_renew(), but it never releases. A quorum
 * of renewals within the validity is a new lease (its end: start + TTL -
 * drift). Nodes that answered "not ours" in such numbers that no quorum
 * can be ours prove the loss: DLOCK_ELOST. Anything else (nodes silent,
 * down, slow) is not a proof: a transient error, tried again while the
 * lease lasts. Bounded by node_timeout for the replies, plus node_timeout
 * for each node whose connection has to be made again (a node that failed
 * to connect is tried at most once a second).
 */
int dlock_redlock_keep(struct redis_conn *kc, struct redis_held *h, uint32_t ttl_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16];
    size_t ours = 0, not_ours = 0;
    uint64_t start = dlock_monotonic_ns();
    if (kc->nnodes > MAX_NODES)
        return dlock_seterr(cl(kc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    const char *args[3] = {"renew", h->owner, ttl};
    const size_t lens[3] = {5, 32, strlen(ttl)};
    all_nodes(kc, h, args, lens, 3, replies, quorum(kc), node_timeout_ns(kc));
    for (size_t i = 0; i < kc->nnodes; i++)
        if (replies[i] && replies[i]->type == REDIS_REPLY_INTEGER)
            replies[i]->integer == 1 ? ours++ : not_ours++;
    free_replies(kc, replies);
    if (ours >= quorum(kc) && validity_ms(start, ttl_ms) > 0) {
        h->base.lease_end_ns = lease_end(start, ttl_ms);
        return 0;
    }
    if (kc->nnodes - not_ours < quorum(kc))
        return dlock_seterr(cl(kc), DLOCK_ELOST,
                            "the keeper's renewal was refused on %zu of %zu Redlock nodes "
                            "(quorum %zu): the lease had expired or another owner holds it",
                            not_ours, kc->nnodes, quorum(kc));
    if (ours >= quorum(kc))
        return dlock_seterr(cl(kc), DLOCK_ETIMEDOUT,
                            "renewed on a quorum, but too late to count (validity spent)");
    return dlock_seterr(cl(kc), DLOCK_ECONNECT,
                        "renewed on only %zu of %zu Redlock nodes (quorum %zu), %zu refused, "
                        "the others did not answer in time",
                        ours, kc->nnodes, quorum(kc), not_ours);
}
