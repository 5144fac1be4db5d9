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

/*
 * Sends the same script call to every node, then collects the replies in
 * parallel until the node timeout; replies[i] is NULL for a node that
 * failed or did not answer (its connection is dropped and reopened later).
 */
static void all_nodes(struct redis_conn *rc, struct redis_held *h, const char **args,
                      const size_t *lens, size_t nargs, redisReply **replies)
{
    const char *argv[16];
    size_t argvlen[16];
    size_t argc = dlock_redis_script_argv(rc, &h->keys, args, lens, nargs, argv, argvlen);
    uint64_t until = dlock_monotonic_ns() + node_timeout_ns(rc);
    int pending[MAX_NODES] = {0};
    size_t npending = 0;

    for (size_t i = 0; i < rc->nnodes; i++) {
        struct redis_node *n = &rc->nodes[i];
        int done = 0;
        replies[i] = NULL;
        if (dlock_redis_node_connect(rc, n, &rc->cmd_tv) != 0)
            continue;
        if (redisAppendCommandArgv(n->cmd, (int)argc, argv, argvlen) != REDIS_OK)
            continue;
        while (!done)
            if (redisBufferWrite(n->cmd, &done) != REDIS_OK)
                break;
        if (!done) {
            dlock_redis_ctx_error(rc, n, &n->cmd, "sending");
            continue;
        }
        pending[i] = 1;
        npending++;
    }
    while (npending > 0) {
        struct pollfd pfd[MAX_NODES];
        size_t idx[MAX_NODES], np = 0;
        for (size_t i = 0; i < rc->nnodes; i++) {
            if (!pending[i])
                continue;
            void *r = NULL;
            if (redisGetReplyFromReader(rc->nodes[i].cmd, &r) != REDIS_OK) {
                dlock_redis_ctx_error(rc, &rc->nodes[i], &rc->nodes[i].cmd, "reading");
            } else if (r) {
                replies[i] = r;
            } else {
                pfd[np] = (struct pollfd){.fd = rc->nodes[i].cmd->fd, .events = POLLIN};
                idx[np++] = i;
                continue;
            }
            pending[i] = 0;
            npending--;
        }
        if (np == 0)
            break;
        uint64_t now = dlock_monotonic_ns();
        struct timespec ts;
        int pr = 0;
        if (now < until) {
            dlock_ns_to_timespec(until - now, &ts);
            pr = ppoll(pfd, np, &ts, NULL);
        }
        if (pr <= 0 && !(pr < 0 && errno == EINTR)) {
            for (size_t k = 0; k < np; k++) { /* no answer in time */
                struct redis_node *n = &rc->nodes[idx[k]];
                dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: no reply within node_timeout",
                             n->host, n->port);
                redisFree(n->cmd);
                n->cmd = NULL;
                pending[idx[k]] = 0;
                npending--;
            }
            break;
        }
        for (size_t k = 0; k < np; k++)
            if (pfd[k].revents && redisBufferRead(rc->nodes[idx[k]].cmd) != REDIS_OK) {
                dlock_redis_ctx_error(rc, &rc->nodes[idx[k]], &rc->nodes[idx[k]].cmd, "reading");
                pending[idx[k]] = 0;
                npending--;
            }
    }
    /* A node that lost its script cache answers NOSCRIPT: redo it there. */
    for (size_t i = 0; i < rc->nnodes; i++) {
        redisReply *r = replies[i];
        if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r);
            replies[i] = NULL;
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

/* Releases on every node and wakes waiters; returns how many were ours. */
static size_t drop_all(struct redis_conn *rc, struct redis_held *h)
{
    redisReply *replies[MAX_NODES];
    char *chan = NULL;
    size_t chan_len = 0, n;
    if (!release_channel(h, &chan_len, &chan))
        return 0;
    const char *args[3] = {"drop", h->owner, chan};
    const size_t lens[3] = {4, 32, chan_len};
    all_nodes(rc, h, args, lens, 3, replies);
    n = count_ones(rc, replies);
    free_replies(rc, replies);
    free(chan);
    return n;
}

static int64_t validity_ms(uint64_t start_ns, uint32_t ttl_ms)
{
    int64_t elapsed = (int64_t)((dlock_monotonic_ns() - start_ns) / 1000000u);
    int64_t drift = (int64_t)ttl_ms / 100 + 2;
    return (int64_t)ttl_ms - elapsed - drift;
}

/* One attempt: 1 won, 0 refused (*wait_ms: shortest PTTL seen), <0 error. */
static int attempt(struct redis_conn *rc, struct redis_held *h, int64_t *wait_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16], floor[24];
    size_t granted = 0, answered = 0;
    uint64_t max_token = 0, start = dlock_monotonic_ns();
    int64_t shortest = -1;

    dlock_clearerr(cl(rc));
    snprintf(ttl, sizeof ttl, "%" PRIu32, h->ttl_ms);
    const char *args[3] = {"grab", h->owner, ttl};
    const size_t lens[3] = {4, 32, strlen(ttl)};
    all_nodes(rc, h, args, lens, 3, replies);
    for (size_t i = 0; i < rc->nnodes; i++) {
        redisReply *r = replies[i];
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
            continue;
        answered++;
        if (r->element[0]->integer == 1) {
            granted++;
            if ((uint64_t)r->element[1]->integer > max_token)
                max_token = (uint64_t)r->element[1]->integer;
        } else if (shortest < 0 || r->element[1]->integer < shortest) {
            shortest = r->element[1]->integer;
        }
    }
    free_replies(rc, replies);
    *wait_ms = shortest;
    if (granted >= quorum(rc) && validity_ms(start, h->ttl_ms) > 0) {
        snprintf(floor, sizeof floor, "%" PRIu64, max_token);
        const char *fargs[3] = {"fence", h->owner, floor};
        const size_t flens[3] = {5, 32, strlen(floor)};
        all_nodes(rc, h, fargs, flens, 3, replies);
        size_t fenced = count_ones(rc, replies);
        free_replies(rc, replies);
        if (fenced >= quorum(rc) && validity_ms(start, h->ttl_ms) > 0) {
            h->base.token = max_token;
            dlock_clearerr(cl(rc));
            return 1;
        }
    }
    if (granted > 0)
        drop_all(rc, h);
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

/* SUBSCRIBE (or UNSUBSCRIBE) on every reachable node's subscriber connection. */
static void subscribe_all(struct redis_conn *rc, const char *cmd, const char *chan, size_t len)
{
    for (size_t i = 0; i < rc->nnodes; i++) {
        struct redis_node *n = &rc->nodes[i];
        if (!n->sub) {
            if (strcmp(cmd, "SUBSCRIBE") != 0)
                continue;
            n->sub = redisConnectWithTimeout(n->host, n->port, rc->connect_tv);
            if (!n->sub || n->sub->err) {
                if (n->sub)
                    redisFree(n->sub);
                n->sub = NULL;
                continue;
            }
            if (rc->password) {
                redisReply *r = rc->user && rc->user[0]
                                    ? redisCommand(n->sub, "AUTH %s %s", rc->user, rc->password)
                                    : redisCommand(n->sub, "AUTH %s", rc->password);
                int bad = !r || r->type == REDIS_REPLY_ERROR;
                if (r)
                    freeReplyObject(r);
                if (bad) {
                    redisFree(n->sub);
                    n->sub = NULL;
                    continue;
                }
            }
        }
        const char *argv[2] = {cmd, chan};
        const size_t lens[2] = {strlen(cmd), len};
        int done = 0;
        if (redisAppendCommandArgv(n->sub, 2, argv, lens) != REDIS_OK)
            continue;
        while (!done)
            if (redisBufferWrite(n->sub, &done) != REDIS_OK)
                break;
        if (!done) {
            redisFree(n->sub);
            n->sub = NULL;
        }
    }
}

/* Waits for a "released" message on any node, or until until_ns. Replies
 * that are only (un)subscribe confirmations are consumed on the way. */
static void wait_release(struct redis_conn *rc, uint64_t until_ns)
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
                    return;
            }
            pfd[np] = (struct pollfd){.fd = n->sub->fd, .events = POLLIN};
            idx[np++] = i;
        }
        uint64_t now = dlock_monotonic_ns();
        if (np == 0 || now >= until_ns) {
            if (np == 0 && now < until_ns) { /* no subscriber: wait out the bound */
                struct timespec ts;
                dlock_ns_to_timespec(until_ns - now, &ts);
                ppoll(NULL, 0, &ts, NULL);
            }
            return;
        }
        struct timespec ts;
        dlock_ns_to_timespec(until_ns - now, &ts);
        if (ppoll(pfd, np, &ts, NULL) <= 0)
            return;
        for (size_t k = 0; k < np; k++)
            if (pfd[k].revents && redisBufferRead(rc->nodes[idx[k]].sub) != REDIS_OK) {
                redisFree(rc->nodes[idx[k]].sub);
                rc->nodes[idx[k]].sub = NULL;
            }
    }
}

int dlock_redlock_acquire(struct redis_conn *rc, const dlock_request *req, struct redis_held *h)
{
    char *chan = NULL;
    size_t chan_len = 0;
    int64_t wait_ms = -1;
    int subscribed = 0, err;

    if (rc->nnodes > MAX_NODES)
        return dlock_seterr(cl(rc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    for (;;) {
        err = attempt(rc, h, &wait_ms);
        if (err != 0)
            break;
        if (req->wait == DLOCK_WAIT_TRY) {
            if (cl(rc)->err != DLOCK_EBUSY)
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
         * out; a little random spread keeps woken waiters from splitting
         * the vote in lockstep. */
        unsigned char jitter = 0;
        dlock_random_bytes(&jitter, 1);
        uint64_t bound = (uint64_t)(wait_ms > 0 ? wait_ms : 1) * 1000000u;
        uint64_t until = now + bound + (uint64_t)jitter * 4000u;
        if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < until)
            until = req->deadline_ns;
        wait_release(rc, until);
        if (jitter & 1) { /* half the woken waiters step back briefly */
            struct timespec ts = {0, (long)jitter * 4000};
            nanosleep(&ts, NULL);
        }
    }
    if (subscribed)
        subscribe_all(rc, "UNSUBSCRIBE", chan, chan_len);
    free(chan);
    return err == 1 ? 0 : err;
}

int dlock_redlock_release(struct redis_conn *rc, struct redis_held *h)
{
    size_t ours = drop_all(rc, h);
    if (ours >= quorum(rc))
        return 0;
    return dlock_seterr(cl(rc), DLOCK_ELOST,
                        "the lock was ours on only %zu of %zu Redlock nodes (quorum %zu)", ours,
                        rc->nnodes, quorum(rc));
}

int dlock_redlock_renew(struct redis_conn *rc, struct redis_held *h, uint32_t ttl_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16];
    uint64_t start = dlock_monotonic_ns();
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    const char *args[3] = {"renew", h->owner, ttl};
    const size_t lens[3] = {5, 32, strlen(ttl)};
    all_nodes(rc, h, args, lens, 3, replies);
    size_t ours = count_ones(rc, replies);
    free_replies(rc, replies);
    if (ours >= quorum(rc) && validity_ms(start, ttl_ms) > 0) {
        h->ttl_ms = ttl_ms;
        dlock_clearerr(cl(rc));
        return 0;
    }
    drop_all(rc, h); /* a minority is no lock: free it for others */
    return dlock_seterr(cl(rc), DLOCK_ELOST,
                        "renewed on only %zu of %zu Redlock nodes (quorum %zu)", ours,
                        rc->nnodes, quorum(rc));
}
