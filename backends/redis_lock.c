/*
 * The single-instance recipe: one Redis, the primary a Sentinel names, or
 * the Cluster node that owns the lock's slot (redis_cluster.c picks it;
 * this file asks). Redlock's recipe is redlock.c; both sit on the
 * connection layer (redis_conn.c), and the front (redis.c) picks one at
 * open (struct redis_recipe).
 *
 * Every operation is one call of one Lua script (redis_script.h). A waiter
 * first subscribes to a channel of its own, fresh for every wait (and
 * waits for the confirmation), then queues itself through the script; a
 * release hands the lock to the queue's first live waiter inside the
 * script and publishes one message to that waiter. Subscribing before
 * queueing means no release can slip in between unseen. The lock's PTTL
 * bounds each wait, so a holder that died is noticed when its lease runs
 * out. Cancel (DLOCK_CAP_CANCEL): the wait polls the request's cancel_fd
 * beside the subscriber socket (and during the pause between reconnects);
 * when it fires the waiter leaves as at a deadline (cancel_wait(): its
 * queue entry removed, a handoff that raced it passed on to the next
 * waiter, in one script call) and fails with DLOCK_ECANCELED. A handoff
 * message read before the flag is noticed is a grant.
 *
 * Shared locks and permits (DLOCK_REDIS_KIND() 's', 'p'): the same flow with the
 * script's "sacquire", "srelease", "srenew", "scancel" (DLOCK_REDIS_OP());
 * the wait channel's tail tells the script the waiter's kind ("#s",
 * "#p<N>"), and a release publishes to each waiter it admits (all the
 * readers at the head, or permits up to the limit). A request on a name
 * held as another kind fails at once with DLOCK_EMODE. A waiter's bound is
 * the earliest holder's lease end (how a dead holder is noticed).
 *
 * Inspect (dlock_inspect()): one call of the script's "inspect", which
 * only reads, atomically (every script call is): GET and PTTL of
 * "<prefix><name>:lock" (the value "<owner_hex>:<token>"), GET of the
 * counter ":fence" and of ":raised" (raise_token's mark, see
 * redis_script.h), LLEN/LRANGE of the queue ":queue" and PUBSUB NUMSUB of
 * each entry's channel. Reported: held (the lock key exists), the holder's
 * owner id and token (from the value), the lease left (PTTL), the waiters
 * the handoff would serve, in its order (entries whose channel has a
 * subscriber: a wait that gave up has left the queue or, if it could not,
 * closed its subscriber connection, as a killed waiter's is closed; both
 * are skipped by the handoff and not counted), the first 16 of them by
 * owner id, and the last token granted (the holder's while held; else the
 * counter, or the value before raise_token moved it). Cannot know: a
 * waiter between its SUBSCRIBE and its first queued call (not queued yet),
 * nor a waiter's deadline; a lock key whose value dlock did not write is
 * held by no owner it can name; clients of dlock before this version drew
 * a token on a busy try, so the counter they leave may be above the last
 * grant. O(queue length) inside the script. Bounded like every call.
 *
 * Bounds: every call runs under one bound for all it does (a reconnection,
 * the handshake, one retry after a lost reply): `timeout` from its start,
 * or for a deadline wait the deadline (+ DLOCK_REDIS_FLOOR_NS for the last
 * call, + DLOCK_REDIS_CLEANUP_NS to leave the queue). Open: connect_timeout
 * for the TCP connect and the pipelined handshake together.
 */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "core/internal.h"

#define MS 1000000ull
/* A waiter whose connection was reset (server restart, CLIENT KILL)
 * tries to connect again every RECONNECT_PAUSE_NS, for up to `timeout`. */
#define RECONNECT_PAUSE_NS (50 * MS)
#define tv_ns dlock_redis_tv_ns

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
}

/* A wait's wake-up channel, "<prefix>w:<owner>": the owner id is fresh for
 * every acquire, so no two waits ever share a channel. Only the acquire
 * that waits needs it (not the held lock). */
struct wait_chan {
    char name[96];
    size_t len; /* 0: not waiting (yet) */
};

static void wait_channel(struct redis_conn *rc, struct redis_held *h, unsigned slot,
                         struct wait_chan *w)
{
    /* Cluster: in the lock's slot, for SSUBSCRIBE and the script's
     * SPUBLISH on the lock's shard. */
    int len = rc->mode == REDIS_CLUSTER
                  ? snprintf(w->name, sizeof w->name, "%.40s{%s}w:%.32s", rc->prefix,
                             dlock_redis_slot_tag(slot), h->owner)
                  : snprintf(w->name, sizeof w->name, "%.40sw:%.32s", rc->prefix, h->owner);
    /* The waiter's kind, which the script's handoff reads: "#s" shared,
     * "#p<N>" a permit of a semaphore of N, none exclusive. */
    if (DLOCK_REDIS_KIND(h) == 's')
        len += snprintf(w->name + len, sizeof w->name - (size_t)len, "#s");
    else if (DLOCK_REDIS_KIND(h) == 'p')
        len += snprintf(w->name + len, sizeof w->name - (size_t)len, "#p%" PRIu32,
                        (uint32_t)h->limit);
    w->len = (size_t)len;
}

static int sub_error(struct redis_conn *rc, struct redis_node *n, const char *what)
{
    int err = dlock_redis_ctx_error(rc, n, &n->sub, what);
    dlock_redis_drop_sub(n);
    return err;
}

/* wait_handoff(): the node ended the subscription (its slot moved). */
#define WAIT_MOVED 2
/* wait_handoff(): the request's cancel_fd fired first. */
#define WAIT_CANCELLED 3

/*
 * Waits until a handoff for owner arrives (1, *token set, *read_ns when
 * its bytes were read) or until_ns passes (0); WAIT_MOVED when a cluster
 * node ended the subscription; WAIT_CANCELLED when cancel_fd (-1: none)
 * turned readable with no handoff read. Negative: error, the
 * subscriber connection dropped; *silent tells a server that stopped
 * answering (no reply to a PING) from a connection that was reset.
 *
 * The wait may last as long as the holder's lease. A subscriber that has
 * heard nothing for `timeout` sends a PING (allowed while subscribed), and
 * one that gets no answer within another `timeout` is dropped with
 * DLOCK_ECONNECT: a server that hangs (or a network that stops carrying
 * anything) ends the wait within 2 * timeout, not the lease. A dead peer
 * is also noticed by TCP keepalive (see keepalive() in redis_io.c).
 */
static int wait_handoff(struct redis_conn *rc, struct redis_node *n, const struct wait_chan *w,
                        const char *owner, uint64_t until_ns, int cancel_fd, uint64_t *token,
                        uint64_t *read_ns, int *silent)
{
    uint64_t quiet = tv_ns(&rc->cmd_tv), heard = dlock_monotonic_ns(), ping_by = 0;
    /* What the reader holds was read by an earlier call, no later than now. */
    *read_ns = heard;
    *silent = 0;
    for (;;) {
        void *reply = NULL;
        if (!n->sub)
            return dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: not subscribed", n->host,
                                n->port);
        if (redisGetReplyFromReader(n->sub, &reply) != REDIS_OK)
            return sub_error(rc, n, "reading the wake-up channel");
        if (reply) {
            int mine = dlock_redis_reply_handoff(reply, owner, token);
            int gone = dlock_redis_reply_unsubscribed(reply, w->name, w->len);
            freeReplyObject(reply);
            if (mine)
                return 1;
            if (gone && n->subscribed) {
                /* Cluster: the node lost the slot (a migration, a
                 * failover) and ended our subscription itself. */
                n->subscribed = 0;
                return WAIT_MOVED;
            }
            continue;
        }
        uint64_t now = dlock_monotonic_ns();
        if (now >= until_ns)
            return 0;
        if (ping_by && now >= ping_by) {
            dlock_seterr(cl(rc), DLOCK_ECONNECT,
                         "redis %s:%d: the wake-up channel did not answer a PING within %" PRIu64
                         " ms (timeout)", n->host, n->port, (uint64_t)(quiet / MS));
            dlock_redis_drop_sub(n);
            *silent = 1;
            return DLOCK_ECONNECT;
        }
        if (!ping_by && now - heard >= quiet) {
            if (dlock_redis_send(rc, n->sub, 1, (const char *[]){"PING"}, (size_t[]){4}) != REDIS_OK)
                return sub_error(rc, n, "writing to the wake-up channel");
            ping_by = now + quiet;
        }
        uint64_t wake = ping_by ? ping_by : heard + quiet;
        if (wake > until_ns)
            wake = until_ns;
        /* A signal ends the wait; a failed poll (or wake passing) only
         * goes round again. */
        struct pollfd pfd = {.fd = n->sub->fd, .events = POLLIN};
        int pr = dlock_poll_until(&pfd, 1, cancel_fd, wake, DLOCK_POLL_INTR);
        if (pr == DLOCK_POLL_SIGNAL)
            return dlock_seterr(cl(rc), DLOCK_EINTR, "a signal interrupted the wait");
        if (pr > 0 && (pr & DLOCK_POLL_READY)) {
            /* Read first: a handoff that came with the cancel is taken (the
             * flag stays raised, so the next poll still sees it). */
            if (dlock_redis_io_read(n->sub) != REDIS_OK)
                return sub_error(rc, n, "reading the wake-up channel");
            *read_ns = heard = dlock_monotonic_ns();
            ping_by = 0;
        } else if (pr > 0 && (pr & DLOCK_POLL_CANCEL)) {
            return WAIT_CANCELLED;
        }
    }
}

static int run_op(struct redis_conn *rc, const struct redis_keys *keys, size_t nkeys,
                  const char **args, const size_t *lens, size_t nargs, redisReply **out)
{
    const char *argv[20];
    size_t argvlen[20];
    size_t argc = dlock_redis_script_argv(rc, keys, nkeys, args, lens, nargs, argv, argvlen);
    if (rc->mode == REDIS_CLUSTER)
        return dlock_redis_cluster_script(rc, keys->slot, argc, argv, argvlen, out);
    return dlock_redis_script(rc, &rc->nodes[0], argc, argv, argvlen, out);
}

/*
 * One script call, all of it (a reconnection, the handshake, the reply)
 * before until_ns, and repeated once on a new connection if the reply was
 * lost to a dropped connection and time is left: the owner id makes every
 * operation safe to repeat. A call that timed out has used up its time and
 * is not repeated.
 */
static int call_keys(struct redis_conn *rc, const struct redis_keys *keys, size_t nkeys,
                     const char **args, const size_t *lens, size_t nargs, uint64_t until_ns,
                     redisReply **out)
{
    uint64_t saved = dlock_redis_limit(rc, until_ns);
    int err = run_op(rc, keys, nkeys, args, lens, nargs, out);
    rc->retried = 0;
    if (err == DLOCK_ECONNECT && dlock_monotonic_ns() + MS < rc->deadline_ns) {
        rc->retried = 1;
        if ((err = run_op(rc, keys, nkeys, args, lens, nargs, out)) == 0)
            dlock_clearerr(cl(rc)); /* recovered: the lost reply is no news */
    }
    dlock_redis_unlimit(rc, saved);
    return err;
}

static int call_op(struct redis_conn *rc, struct redis_held *h, const char **args,
                   const size_t *lens, size_t nargs, uint64_t until_ns, redisReply **out)
{
    struct redis_keys keys;
    int err = dlock_redis_held_keys(rc, h, &keys);
    if (err == 0)
        err = call_keys(rc, &keys, REDIS_NKEYS_ALL, args, lens, nargs, until_ns, out);
    dlock_redis_keys_free(&keys);
    return err;
}

/* The bound of one call in an acquire: `timeout`, and for a deadline wait
 * the deadline too, though never less than DLOCK_REDIS_FLOOR_NS from now
 * (a deadline already past still makes one attempt). */
static uint64_t step_until(struct redis_conn *rc, const dlock_request *req)
{
    uint64_t now = dlock_monotonic_ns(), until = now + tv_ns(&rc->cmd_tv);
    if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t floor = now + DLOCK_REDIS_FLOOR_NS;
        uint64_t limit = req->deadline_ns > floor ? req->deadline_ns : floor;
        if (limit < until)
            until = limit;
    }
    return until;
}

/* One acquire call of the script; 1 granted, 0 held (*pttl), <0 error. */
static int try_acquire(struct redis_conn *rc, struct redis_held *h, const struct wait_chan *w,
                       const char *mode, long long *pttl, uint64_t until_ns)
{
    char ttl[16];
    redisReply *r = NULL;
    long long granted = 0, value = 0;
    int err;
    char kind[2] = {DLOCK_REDIS_KIND(h), '\0'}, limit[12];
    snprintf(ttl, sizeof ttl, "%" PRIu32, h->ttl_ms);
    snprintf(limit, sizeof limit, "%" PRIu32, (uint32_t)h->limit);
    const char *chan = w->len ? w->name : "-";
    const char *args[] = {kind[0] ? "sacquire" : "acquire", h->owner, ttl, chan, mode, kind, limit};
    const size_t lens[] = {strlen(args[0]), 32, strlen(ttl), strlen(chan), strlen(mode), 1,
                           strlen(limit)};
    /* A grant's lease starts on the server after this instant, even when
     * the reply that says so is the retry's. */
    uint64_t sent = dlock_monotonic_ns();
    if ((err = call_op(rc, h, args, lens, kind[0] ? 7 : 5, until_ns, &r)) != 0)
        return err;
    err = dlock_redis_reply_pair(r, &granted, &value);
    freeReplyObject(r);
    if (err)
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected reply from the lock script");
    if (granted == 2)
        return dlock_redis_emode(rc, h, value);
    if (granted) {
        if (value <= 0)
            return dlock_seterr(cl(rc), DLOCK_EPROTO, "the lock script granted token %lld", value);
        h->base.token = (uint64_t)value;
        /* Not the acquire call's start, which may be long before, after
         * waiting. */
        h->base.lease_end_ns = sent + (uint64_t)h->ttl_ms * MS;
        return 1;
    }
    *pttl = value;
    return 0;
}

static int simple_op(struct redis_conn *rc, struct redis_held *h, const char *op,
                     const char *arg3, long long *result, uint64_t until_ns)
{
    const char *args[3] = {op, h->owner, arg3};
    size_t lens[3] = {strlen(op), 32, arg3 ? strlen(arg3) : 0};
    redisReply *r = NULL;
    int err = call_op(rc, h, args, lens, arg3 ? 3 : 2, until_ns, &r);
    if (err)
        return err;
    err = dlock_redis_reply_int(r, result);
    freeReplyObject(r);
    if (err)
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected reply from the lock script");
    return 0;
}

/* Subscribes node n's subscriber connection to this wait's channel before
 * until_ns; a subscriber connection found dead (reset since the last wait)
 * is made again once. */
/* The node a lock's calls go to: its slot's owner in a cluster (the map
 * read again if stale), else the one node. NULL with *errp set. */
static struct redis_node *lock_node(struct redis_conn *rc, unsigned slot, int *errp)
{
    if (rc->mode == REDIS_CLUSTER)
        return dlock_redis_cluster_node(rc, slot, errp);
    return &rc->nodes[0];
}

/* Subscribes to this wait's channel before until_ns, on the node of the
 * lock's slot (*np becomes it; a subscription on another node is left);
 * a subscriber connection found dead (reset since the last wait) is made
 * again once; in a cluster, a node that no longer owns the slot (or is
 * gone) is left for the new owner, twice at most. */
static int subscribe_wait(struct redis_conn *rc, struct redis_node **np, unsigned slot,
                          const struct wait_chan *w, uint64_t until_ns)
{
    uint64_t saved = dlock_redis_limit(rc, until_ns);
    int cluster = rc->mode == REDIS_CLUSTER, err = 0;
    for (int attempt = 0;; attempt++) {
        struct redis_node *n = lock_node(rc, slot, &err);
        if (!n)
            break;
        if (*np && *np != n)
            dlock_redis_unsubscribe(rc, *np, w->name, w->len);
        *np = n;
        int fresh = n->sub == NULL;
        err = dlock_redis_subscribe_send(rc, n, w->name, w->len,
                                         tv_ns(&rc->connect_tv));
        if (!err)
            err = dlock_redis_subscribe_confirm(rc, n, w->name, w->len);
        if (err == DLOCK_ECONNECT && cluster)
            dlock_redis_cluster_stale(rc);
        if (err != DLOCK_ECONNECT || (fresh && !cluster) || attempt >= (cluster ? 2 : 1) ||
            dlock_monotonic_ns() + MS >= rc->deadline_ns)
            break;
    }
    dlock_redis_unlimit(rc, saved);
    return err;
}

/*
 * The subscriber connection was reset (a server restart, CLIENT KILL, a
 * proxy that closed it, a failover), or a cluster node ended the
 * subscription (the slot moved): connect and subscribe again (on the
 * slot's owner now), trying every RECONNECT_PAUSE_NS for up to `timeout`
 * and never past the deadline. The queue entry, if the server still has
 * it, is live again (same channel); if it is gone (a restarted server is
 * empty), the next acquire call queues us again. The lock key is not
 * touched.
 */
static int recover(struct redis_conn *rc, struct redis_node **np, unsigned slot,
                   const struct wait_chan *w, const dlock_request *req)
{
    uint64_t until = dlock_monotonic_ns() + tv_ns(&rc->cmd_tv);
    int deadline = req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < until;
    dlock_errsave why;
    int err;
    if (deadline)
        until = req->deadline_ns;
    for (;;) {
        err = subscribe_wait(rc, np, slot, w, until);
        if (err == 0)
            dlock_clearerr(cl(rc));
        if (err != DLOCK_ECONNECT)
            return err;
        uint64_t now = dlock_monotonic_ns();
        if (now + RECONNECT_PAUSE_NS >= until)
            break;
        /* The pause is part of the wait: the cancel flag ends it. */
        int pe = dlock_pause_until(now + RECONNECT_PAUSE_NS, req->cancel_fd);
        if (pe == DLOCK_EINTR)
            return dlock_seterr(cl(rc), DLOCK_EINTR, "a signal interrupted the wait");
        if (pe == DLOCK_ECANCELED)
            return dlock_cancelled(cl(rc));
    }
    dlock_err_save(cl(rc), &why);
    if (deadline)
        return dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                            "the deadline passed while connecting again after the connection "
                            "was lost (%.150s)", why.msg);
    return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                        "the connection was lost while waiting and could not be made again "
                        "within %" PRIu64 " ms (%.150s)",
                        (uint64_t)(tv_ns(&rc->cmd_tv) / MS), why.msg);
}

/*
 * Leaves the queue after a timeout or error, within DLOCK_REDIS_CLEANUP_NS
 * (or `timeout` if shorter); a handoff that raced us is passed on to the
 * next waiter. If the server cannot be reached that fast the cleanup is
 * abandoned, safely: the subscriber connection is closed, so the queue
 * entry reads as a dead waiter (PUBSUB NUMSUB 0 on a channel that is never
 * used again) and is skipped; a handoff already made to us is held by
 * nobody and expires with its lease (the TTL).
 */
static void cancel_wait(struct redis_conn *rc, struct redis_held *h, struct redis_node *n,
                        const struct wait_chan *w)
{
    char entry[192];
    long long res;
    dlock_errsave saved;
    uint64_t bound = tv_ns(&rc->cmd_tv) < DLOCK_REDIS_CLEANUP_NS ? tv_ns(&rc->cmd_tv)
                                                                 : DLOCK_REDIS_CLEANUP_NS;
    snprintf(entry, sizeof entry, "%.32s|%" PRIu32 "|%s", h->owner, h->ttl_ms, w->name);
    dlock_err_save(cl(rc), &saved);
    int err = simple_op(rc, h, DLOCK_REDIS_OP(h, "cancel"), entry, &res, dlock_monotonic_ns() + bound);
    if (n && err)
        dlock_redis_drop_sub(n);
    else if (n)
        dlock_redis_unsubscribe(rc, n, w->name, w->len);
    dlock_err_restore(cl(rc), &saved); /* report the original failure, not the cleanup */
}

/*
 * wait_replicas=N: a grant is not reported before N replicas have it.
 * WAIT counts the replicas that acknowledged this connection's own writes,
 * and the grant may not be one of them: a handoff was written by the
 * releaser's script, a grant found already ours (a retry after a lost
 * reply, a handoff whose message was missed) wrote nothing. So the new
 * holder first renews (a write of its own, which also proves the grant is
 * still ours), then waits, both within until_ns (the acquire's bound: its
 * deadline, or `timeout`). Fewer than N: the lock is released again
 * (within DLOCK_REDIS_CLEANUP_NS) and the acquire fails. This narrows, not
 * closes, the window in which a failover loses a grant: replication stays
 * asynchronous, and a replica that acknowledged may still not be the one
 * promoted.
 */
static int confirm_grant(struct redis_conn *rc, struct redis_held *h, uint64_t until_ns)
{
    char ttl[16];
    long long res = 0;
    int err;
    if (!rc->wait_replicas)
        return 0;
    uint64_t saved = dlock_redis_limit(rc, until_ns), sent = dlock_monotonic_ns();
    snprintf(ttl, sizeof ttl, "%" PRIu32, h->ttl_ms);
    if ((err = simple_op(rc, h, DLOCK_REDIS_OP(h, "renew"), ttl, &res, until_ns)) == 0 && res != 1)
        err = dlock_seterr(cl(rc), DLOCK_ESTORE,
                           "the lock granted to us was gone before the replicas acknowledged "
                           "it (its lease ran out, or the store lost it)");
    if (!err && sent + (uint64_t)h->ttl_ms * MS > h->base.lease_end_ns)
        h->base.lease_end_ns = sent + (uint64_t)h->ttl_ms * MS;
    if (!err)
        err = dlock_redis_replicas_ack(rc, rc->last_node ? rc->last_node : &rc->nodes[0], "the grant");
    dlock_redis_unlimit(rc, saved);
    if (err) {
        /* Whatever failed, the grant may stand: give it back (the script
         * releases only our own). */
        dlock_errsave why;
        uint64_t bound = tv_ns(&rc->cmd_tv) < DLOCK_REDIS_CLEANUP_NS ? tv_ns(&rc->cmd_tv)
                                                                     : DLOCK_REDIS_CLEANUP_NS;
        dlock_err_save(cl(rc), &why);
        res = 0;
        int rel = simple_op(rc, h, DLOCK_REDIS_OP(h, "release"), NULL, &res, dlock_monotonic_ns() + bound);
        dlock_err_restore(cl(rc), &why);
        if (rel == 0 && res == 1)
            dlock_seterr(cl(rc), why.err, "%s; the lock was released", why.msg);
    }
    return err;
}

static int acquire_single(struct redis_conn *rc, const dlock_request *req, struct redis_held *h)
{
    unsigned slot = rc->mode == REDIS_CLUSTER ? dlock_redis_slot(h->name, h->name_len) : 0;
    struct redis_node *n = NULL;
    long long pttl = 0;
    int err, silent = 0;

    /* First without queueing: an uncontended acquire is one script call,
     * with no subscription. */
    struct wait_chan w = {.len = 0};
    err = try_acquire(rc, h, &w, "try", &pttl, step_until(rc, req));
    if (err != 0)
        return err < 0 ? err : confirm_grant(rc, h, step_until(rc, req));
    if (req->wait == DLOCK_WAIT_TRY)
        return dlock_seterr(cl(rc), DLOCK_EBUSY, "the lock is held by another owner");
    if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() >= req->deadline_ns)
        return dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                            "the deadline passed with the lock still held elsewhere");
    wait_channel(rc, h, slot, &w);
    if ((err = subscribe_wait(rc, &n, slot, &w, step_until(rc, req))) != 0)
        return err; /* not queued yet: nothing to leave */
    for (;;) {
        err = try_acquire(rc, h, &w, "wait", &pttl, step_until(rc, req));
        if (err == 1) {
            dlock_redis_unsubscribe(rc, n, w.name, w.len);
            return confirm_grant(rc, h, step_until(rc, req));
        }
        if (err < 0)
            break;
        if (rc->mode == REDIS_CLUSTER) {
            /* The call found the slot elsewhere (MOVED): listen there,
             * then ask again, so that no handoff made before is missed. */
            struct redis_node *m = dlock_redis_cluster_peek(rc, slot);
            if (m && m != n) {
                if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() >= req->deadline_ns) {
                    err = dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                                       "the deadline passed with the lock still held elsewhere");
                    break;
                }
                if ((err = subscribe_wait(rc, &n, slot, &w, step_until(rc, req))) != 0)
                    break;
                continue;
            }
        }
        /* Wait for our handoff; at the latest when the lease runs out. */
        uint64_t now = dlock_monotonic_ns();
        uint64_t until = now + (uint64_t)(pttl > 0 ? pttl : 1) * MS + MS;
        if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < until)
            until = req->deadline_ns;
        uint64_t token = 0, read_ns = 0;
        err = wait_handoff(rc, n, &w, h->owner, until, req->cancel_fd, &token, &read_ns,
                           &silent);
        if (err == 1) {
            /* The lease started when the releaser's script handed it
             * over, a one-way trip before we read the message; the call's
             * start may be far older. */
            h->base.token = token;
            h->base.lease_end_ns = read_ns + (uint64_t)h->ttl_ms * MS;
            dlock_redis_unsubscribe(rc, n, w.name, w.len);
            return confirm_grant(rc, h, step_until(rc, req));
        }
        if (err == WAIT_CANCELLED) {
            err = dlock_cancelled(cl(rc)); /* cancel_wait() below, as at a deadline */
            break;
        }
        if (err == WAIT_MOVED) {
            dlock_redis_cluster_stale(rc);
            err = DLOCK_ECONNECT;
        }
        /* A silent server ends the wait on one Redis; in a cluster or
         * under Sentinel it is what a dead primary looks like before its
         * replica takes over: look for the new one (bounded by timeout). */
        if (err == DLOCK_ECONNECT && silent && rc->mode == REDIS_CLUSTER) {
            dlock_redis_cluster_failed(rc, n);
            dlock_redis_cluster_stale(rc);
        }
        if (err == DLOCK_ECONNECT && (!silent || rc->mode == REDIS_CLUSTER ||
                                      rc->mode == REDIS_SENTINEL) &&
            (err = recover(rc, &n, slot, &w, req)) == 0)
            continue;
        if (err < 0)
            break;
        if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() >= req->deadline_ns) {
            err = dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                               "the deadline passed with the lock still held elsewhere");
            break;
        }
    }
    cancel_wait(rc, h, n, &w);
    return err;
}

#define LOST_WHY "the lease had expired or another owner holds the lock (or the server lost " \
                 "it: a restart without persistence, a failover, an eviction)"

static int single_release(struct redis_conn *rc, struct redis_held *h)
{
    long long res = 0;
    int err;
    if ((err = simple_op(rc, h, DLOCK_REDIS_OP(h, "release"), NULL, &res, dlock_redis_call_until(rc))) == 0 &&
        res != 1)
        err = dlock_seterr(cl(rc), DLOCK_ELOST, "%s%s", LOST_WHY,
                           rc->retried ? "; or a release whose reply was lost had done it"
                                       : "");
    return err;
}

/* The renew script on h, bounded by `timeout` (a reconnection included):
 * 0, or DLOCK_ELOST (refused says who was refused) when not ours. */
static int renew_op(struct redis_conn *rc, struct redis_held *h, uint32_t ttl_ms,
                    const char *refused)
{
    char ttl[16];
    long long res = 0;
    int err;
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    if ((err = simple_op(rc, h, DLOCK_REDIS_OP(h, "renew"), ttl, &res, dlock_redis_call_until(rc))) != 0)
        return err;
    if (res != 1)
        return dlock_seterr(cl(rc), DLOCK_ELOST, "%s%s", refused, LOST_WHY);
    return 0;
}

static int single_renew(struct redis_conn *rc, struct redis_held *h, uint32_t ttl_ms)
{
    int err = renew_op(rc, h, ttl_ms, "");
    if (err == 0)
        h->ttl_ms = ttl_ms;
    return err;
}

/* The keeper's renewal, on the keeper's own connection kc (made by the
 * front at the first call, never shared with the application's thread). */
static int single_keep(struct redis_conn *kc, struct redis_held *h, uint32_t ttl_ms)
{
    return renew_op(kc, h, ttl_ms, "the keeper's renewal was refused: ");
}

/*
 * The script's "fence" while the lock is ours: the name's counter becomes
 * max(counter, floor), in the same script call as the ownership check, so
 * every later grant (max(counter + 1, TIME in µs)) is above floor. Durable
 * as the counter is (the server's persistence). One call, bounded by
 * `timeout` (a reconnection and one retry after a lost reply included: the
 * raise is safe to repeat).
 */
static int single_raise(struct redis_conn *rc, struct redis_held *h, uint64_t floor)
{
    char arg[24];
    long long res = 0;
    int err;
    snprintf(arg, sizeof arg, "%" PRIu64, floor);
    /* Marked (KEYS[5]): inspect then still tells the last token granted. */
    const char *args[4] = {"fence", h->owner, arg, "mark"};
    const size_t lens[4] = {5, 32, strlen(arg), 4};
    redisReply *r = NULL;
    struct redis_keys keys;
    if ((err = dlock_redis_held_keys(rc, h, &keys)) == 0)
        err = call_keys(rc, &keys, REDIS_NKEYS_ALL, args, lens, 4, dlock_redis_call_until(rc),
                        &r);
    dlock_redis_keys_free(&keys);
    if (err)
        return err;
    err = dlock_redis_reply_int(r, &res);
    freeReplyObject(r);
    if (err)
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected reply from the lock script");
    if (res != 1)
        return dlock_seterr(cl(rc), DLOCK_ELOST, "not raised: %s%s", LOST_WHY,
                            rc->retried ? "; a first call whose reply was lost may have "
                                          "raised the counter before that"
                                        : "");
    return dlock_redis_ack_after(rc, rc->last_node, "the raised counter");
}

_Static_assert(DLOCK_REDIS_LISTED == DLOCK_INFO_LISTED, "waiters listed");

/*
 * inspect: the script's "inspect" (see the top of this file), one call
 * that only reads, atomic like every script call; bounded by `timeout`,
 * repeated once after a lost reply.
 */
/* One call of a script operation that only reads name's keys (inspect,
 * holders): op and its one argument, bounded like every call. */
static int read_op(struct redis_conn *rc, const char *name, size_t len, size_t nkeys,
                   const char *op, const char *arg, redisReply **r)
{
    struct redis_keys keys;
    int err;
    if (dlock_redis_keys(rc, name, len, &keys) != 0)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    const char *args[2] = {op, arg};
    const size_t lens[2] = {strlen(op), strlen(arg)};
    err = call_keys(rc, &keys, nkeys, args, lens, 2, dlock_redis_call_until(rc), r);
    dlock_redis_keys_free(&keys);
    return err;
}

static int bad_read(struct redis_conn *rc, const char *op, const char *name, size_t len)
{
    return dlock_seterr(cl(rc), DLOCK_EPROTO,
                        "unexpected reply from the lock script's %s (a key of \"%.*s\" not "
                        "written by dlock?)",
                        op, (int)(len > 64 ? 64 : len), name);
}

/* inspect, and with value (an election's leader()) the value key too:
 * the holder's published value when the holder published it. */
static int inspect_read(struct redis_conn *rc, const char *name, size_t len, dlock_info *info,
                        char *value, size_t *value_len)
{
    struct redis_seen seen;
    redisReply *r = NULL;
    char listed[8];
    int err;
    snprintf(listed, sizeof listed, "%d", DLOCK_REDIS_LISTED);
    if ((err = read_op(rc, name, len, value ? REDIS_NKEYS_ELECT : REDIS_NKEYS_ALL, "inspect",
                       listed, &r)) != 0)
        return err;
    err = dlock_redis_reply_inspect(r, &seen);
    if (!err && value) {
        *value_len = 0;
        if (seen.has_owner && seen.has_pub && memcmp(seen.pub, seen.owner, 32) == 0) {
            memcpy(value, seen.pub + DLOCK_REDIS_PUB_HEAD, seen.pub_len);
            *value_len = seen.pub_len;
        }
    }
    freeReplyObject(r);
    if (err)
        return bad_read(rc, "inspect", name, len);
    info->known = DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_ORDER |
                  DLOCK_KNOWS_LAST_TOKEN;
    info->held = seen.held;
    /* While held, the holder's grant is the last one made. */
    info->last_token = seen.last;
    if (seen.has_owner) {
        info->known |= DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER;
        info->token = info->last_token = seen.token;
        memcpy(info->owner, seen.owner, sizeof seen.owner);
    }
    if (seen.held && seen.pttl >= 0) {
        info->known |= DLOCK_KNOWS_LEASE;
        info->lease_ms = (uint64_t)seen.pttl;
    }
    info->waiters = seen.live;
    info->listed = seen.listed;
    for (size_t i = 0; i < seen.listed; i++)
        memcpy(info->waiter[i], seen.waiter[i], sizeof seen.waiter[i]);
    return 0;
}

static int single_inspect(struct redis_conn *rc, const char *name, size_t len, dlock_info *info)
{
    return inspect_read(rc, name, len, info, NULL, NULL);
}

/*
 * Elections: publish (the script's "publish": the value key written and
 * its channel told while the lock is ours, one call), leader (inspect
 * with the value key, one call), wake (a PUBLISH on that channel from the
 * script, which runs on the lock's node: a Cluster's slot owner, whose
 * SPUBLISH stays on its shard).
 */
static int single_publish(struct redis_conn *rc, struct redis_held *h, const void *value,
                          size_t len)
{
    struct redis_keys keys;
    redisReply *r = NULL;
    char seq[17];
    long long v = 0;
    int err;
    if ((err = dlock_redis_held_keys(rc, h, &keys)) != 0)
        return err;
    dlock_redis_pub_seq(seq);
    const char *args[4] = {"publish", h->owner, seq, len ? value : ""};
    const size_t lens[4] = {7, 32, 16, len};
    err = call_keys(rc, &keys, REDIS_NKEYS_ELECT, args, lens, 4, dlock_redis_call_until(rc), &r);
    dlock_redis_keys_free(&keys);
    if (err)
        return err;
    err = dlock_redis_reply_int(r, &v);
    freeReplyObject(r);
    if (err)
        return bad_read(rc, "publish", h->name, h->name_len);
    if (v != 1)
        return dlock_seterr(cl(rc), DLOCK_ELOST,
                            "publish: \"%.*s\" is no longer held by this client: nothing written",
                            (int)(h->name_len > 64 ? 64 : h->name_len), h->name);
    return 0;
}

static int single_leader(struct redis_conn *rc, const char *name, size_t len, dlock_info *info,
                         char *value, size_t *value_len)
{
    return inspect_read(rc, name, len, info, value, value_len);
}

static int single_wake(struct redis_conn *rc, const char *name, size_t len)
{
    redisReply *r = NULL;
    int err = read_op(rc, name, len, REDIS_NKEYS_ELECT, "wake", "", &r);
    if (r)
        freeReplyObject(r);
    return err;
}

/*
 * inspect_holders: the script's "holders", reads only, one call like
 * inspect: the live holders (lease not ended) in token order, or the
 * exclusive holder of the lock key. At most capacity listed (the script
 * sorts them all: O(n log n) in the holders).
 */
static int single_holders(struct redis_conn *rc, const char *name, size_t len, dlock_holder *out,
                          size_t capacity, size_t *count)
{
    redisReply *r = NULL;
    char cap[24];
    uint32_t limit = 0;
    int err;
    /* A semaphore has no more holders than this; more readers are counted
     * and listed in part. */
    snprintf(cap, sizeof cap, "%zu", capacity > DLOCK_LIMIT_MAX ? (size_t)DLOCK_LIMIT_MAX : capacity);
    if ((err = read_op(rc, name, len, REDIS_NKEYS_ALL, "holders", cap, &r)) != 0)
        return err;
    err = dlock_redis_reply_holders(r, out, capacity, count, &limit);
    freeReplyObject(r);
    return err ? bad_read(rc, "holders", name, len) : 0;
}

const struct redis_recipe dlock_redis_single_recipe = {
    .acquire = acquire_single,
    .release = single_release,
    .renew = single_renew,
    .keep = single_keep,
    .raise = single_raise,
    .top = dlock_redis_floor_top,
    .raise_floor = dlock_redis_floor_raise,
    .inspect = single_inspect,
    .holders = single_holders,
    .publish = single_publish,
    .leader = single_leader,
    .wake = single_wake,
};
