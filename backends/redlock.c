/*
 * Redlock: one lock over N independent Redis instances (N = host count).
 *
 * An attempt runs the script's "grab" (SET NX PX + the node's fencing
 * counter) on every node at once, each bounded by node_timeout. It wins
 * with a quorum (N/2 + 1) of grants and a positive validity,
 * ttl - elapsed - drift (drift = ttl/100 + 2 ms), all on CLOCK_MONOTONIC;
 * so a TTL of 2 ms or less can never be granted and is refused
 * (REDLOCK_MIN_TTL_MS). Any failed attempt is undone on every node.
 *
 * The token: the largest counter among the granting nodes, M, is written
 * back ("fence": counter = max(counter, M)) to the nodes while the lock is
 * still ours, and the grant counts only if that too finishes on a quorum
 * within the validity. Any later quorum shares a node with this one whose
 * counter is already >= M, so its token is greater. A node that loses its
 * counter (a restart without persistence) starts it again from its clock
 * in microseconds (redis_script.h), above what it handed out before.
 *
 * Store-wide tokens: raise_floor raises "<prefix>floor" on every node at
 * once and succeeds when a quorum confirmed; token_top is the largest of
 * the nodes' tops (counters, floor, TIME in µs) and needs a quorum of
 * answers. A node that missed the floor cannot bring a later grant below
 * it: the grant needs a quorum, which shares a node with the raised one,
 * and takes the largest token of its quorum (see redlock_raise_floor()).
 *
 * Waiting: a waiter subscribes to the lock's release channel on every
 * node before it retries, and each release publishes there. Not FIFO, and
 * every waiter wakes on a release: that is the price of having no single
 * queue to trust. A node whose subscriber connection drops (a restart,
 * CLIENT KILL) is subscribed again before the next attempt. The wait, the
 * step back after a lost race and the pause while too few nodes answer
 * all poll the request's cancel_fd too (DLOCK_CAP_CANCEL): a cancelled
 * waiter unsubscribes, as one past its deadline, and fails with
 * DLOCK_ECANCELED; a waiter holds nothing in the stores between attempts
 * (a failed attempt is undone at once), so there is nothing else to undo.
 *
 * Inspect: the script's "inspect" (reads only) on every node at once,
 * merged into what a quorum agrees on (see redlock_inspect()): held
 * with the owner that holds a quorum of nodes, its token (the quorum-th
 * largest of its nodes' tokens and counters), the lease a quorum still has, waiters as
 * the release channel's subscribers when the nodes agree; no order (not
 * FIFO), and no last token while free. When the nodes that answered cannot
 * settle held or free: DLOCK_ECONNECT, never a guess.
 *
 * layout=plain (redis.c picks this recipe for it, over one node too): the
 * lock key is the peers' "<prefix><name>" (redis_keys.c); a waiter listens
 * to the key's keyspace notifications when every node has them on, else
 * to the release channel with an attempt every DLOCK_REDIS_PLAIN_POLL_NS
 * (redis_plain.c), and steps back only after a message; the grab round and
 * its undo also end at a cancel (one Redis answers within `timeout`, not
 * node_timeout); inspect names a peer's printable value.
 *
 * Bounds: a round (connects, then replies) never runs past the call's
 * bound; a deadline wait's last round may end DLOCK_REDIS_FLOOR_NS past the
 * deadline and its undo DLOCK_REDIS_CLEANUP_NS later still (nodes that did
 * not answer by then keep our key until its lease runs out).
 */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "core/internal.h"

#define MAX_NODES 64
#define RECONNECT_BACKOFF_NS 1000000000ull
/* Longest a waiter goes without an attempt, however long the holder's
 * lease: nodes that went silent are noticed by the attempts (see
 * redlock_acquire()), not only when the lease runs out. */
#define WAIT_SLICE_NS 5000000000ull
/* A waiter that lost its quorum of reachable nodes tries again this often
 * (see redlock_acquire()). */
#define RECOVER_PAUSE_NS 100000000ull
/* validity = ttl - elapsed - (ttl/100 + 2): at 2 ms or less it is never
 * positive. */
#define REDLOCK_MIN_TTL_MS 3u

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
}

static uint64_t node_timeout_ns(struct redis_conn *rc)
{
    return dlock_redis_tv_ns(&rc->cmd_tv);
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

static int ttl_ok(struct redis_conn *rc, uint32_t ttl_ms)
{
    if (ttl_ms >= REDLOCK_MIN_TTL_MS)
        return 0;
    return dlock_seterr(cl(rc), DLOCK_EINVAL,
                        "a Redlock lease must be at least %u ms: a grant is valid for the TTL "
                        "less the time to reach the nodes and a clock drift allowance of "
                        "TTL/100 + 2 ms, so %" PRIu32 " ms can never be granted",
                        REDLOCK_MIN_TTL_MS, ttl_ms);
}

/* Gives up waiting for node n's reply: it is skipped when it comes. A node
 * that owes too many is reconnected instead. */
static void abandon(struct redis_node *n)
{
    if (++n->stale > 8) {
        dlock_redis_io_free(n->cmd);
        n->cmd = NULL;
        n->stale = 0;
    }
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

/* What a round saw. */
struct round {
    size_t reached;  /* nodes connected when the round started */
    size_t answered; /* replies received (of any kind) */
    dlock_errsave first; /* the first node's failure, for the message */
};

enum {
    ROUND_QUORUM_FIRST = 1, /* send nothing unless a quorum is connected */
    ROUND_CANCEL = 2,       /* layout=plain: rc->cancel_fd ends the round too */
};

static void round_fail(struct redis_conn *rc, struct round *st)
{
    if (st && !st->first.err)
        dlock_err_save(cl(rc), &st->first);
}

/*
 * Sends the same script call to every node, then collects the replies in
 * parallel until timeout_ns, or as soon as `need` positive replies are in
 * (0: wait for all). A node whose connection turns out to be broken (reset
 * by a restart or CLIENT KILL since our last call: the write fails or the
 * read meets EOF) is sent the call once more on a new connection, in a
 * second pass: the owner id makes every operation safe to repeat.
 * replies[i] is NULL for a node that failed or was not waited for.
 * Connecting (nodes whose connection is gone) and the replies all stay
 * within rc's bound when it has one.
 */
static void all_nodes_argv(struct redis_conn *rc, size_t argc, const char **argv,
                           const size_t *argvlen, redisReply **replies, size_t need,
                           uint64_t timeout_ns, int flags, struct round *st)
{
    int todo[MAX_NODES], broken[MAX_NODES];
    size_t yes = 0;
    struct round local;

    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    for (size_t i = 0; i < rc->nnodes; i++)
        todo[i] = 1, replies[i] = NULL;
    for (int pass = 0; pass < 2; pass++) {
        int pending[MAX_NODES] = {0}, again = 0;
        size_t npending = 0;
        uint64_t until;
        for (size_t i = 0; i < rc->nnodes; i++) {
            struct redis_node *n = &rc->nodes[i];
            broken[i] = 0;
            if (!todo[i])
                continue;
            /* A node that just failed to connect is left alone for a
             * while, so one dead or silent node does not cost every call
             * a connect. */
            if (!n->cmd && dlock_monotonic_ns() < n->retry_at) {
                if (!st->first.err)
                    dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: unreachable a moment ago",
                                 n->host, n->port), round_fail(rc, st);
                continue;
            }
            if (dlock_redis_node_connect(rc, n, timeout_ns) != 0) {
                round_fail(rc, st);
                n->retry_at = dlock_monotonic_ns() + RECONNECT_BACKOFF_NS;
                continue;
            }
            if (pass == 0)
                st->reached++;
        }
        if (pass == 0 && (flags & ROUND_QUORUM_FIRST) && st->reached < need)
            return;
        for (size_t i = 0; i < rc->nnodes; i++) {
            struct redis_node *n = &rc->nodes[i];
            if (!todo[i] || !n->cmd)
                continue;
            /* A node restarted since our last call has reset the
             * connection: the write fails (EPIPE), and never kills us
             * with SIGPIPE. */
            if (dlock_redis_send(rc, n->cmd, argc, argv, argvlen) != REDIS_OK) {
                dlock_redis_ctx_error(rc, n, &n->cmd, "sending");
                round_fail(rc, st);
                n->stale = 0;
                broken[i] = 1;
                continue;
            }
            pending[i] = 1;
            npending++;
        }
        /* The reply clock starts once everything is sent. */
        until = dlock_monotonic_ns() + timeout_ns;
        if (rc->deadline_ns && rc->deadline_ns < until)
            until = rc->deadline_ns;
        while (npending > 0) {
            struct pollfd pfd[MAX_NODES];
            size_t idx[MAX_NODES], np = 0;
            for (size_t i = 0; i < rc->nnodes; i++) {
                if (!pending[i])
                    continue;
                int lost = 0;
                redisReply *r = next_reply(rc, &rc->nodes[i], &lost);
                if (!r && !lost) {
                    pfd[np] = (struct pollfd){.fd = rc->nodes[i].cmd->fd, .events = POLLIN};
                    idx[np++] = i;
                    continue;
                }
                if (lost)
                    round_fail(rc, st), broken[i] = 1;
                else
                    st->answered++;
                replies[i] = r;
                pending[i] = 0;
                npending--;
                if (dlock_redis_reply_yes(r))
                    yes++;
            }
            /* Granted: the rest are skipped when they answer. A quorum
             * that has become impossible still waits for the others
             * (within the bound): the count of nodes that answered is the
             * message. */
            if (need && yes >= need)
                break;
            if (np == 0)
                break;
            /* Past the clock, still one look at what already arrived; a
             * signal does not end the round; a failed poll is no answer. */
            int pr = dlock_poll_until(pfd, np, (flags & ROUND_CANCEL) ? rc->cancel_fd : -1,
                                      until, 0);
            if (pr > 0 && !(pr & DLOCK_POLL_READY))
                pr = 0; /* cancelled: as if no answer came in time */
            if (pr <= 0) {
                for (size_t k = 0; k < np; k++) { /* no answer in time */
                    struct redis_node *n = &rc->nodes[idx[k]];
                    dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: no reply in time", n->host,
                                 n->port);
                    round_fail(rc, st);
                    abandon(n);
                    pending[idx[k]] = 0;
                    npending--;
                }
                break;
            }
            for (size_t k = 0; k < np; k++)
                if (pfd[k].revents && dlock_redis_io_read(rc->nodes[idx[k]].cmd) != REDIS_OK) {
                    dlock_redis_ctx_error(rc, &rc->nodes[idx[k]], &rc->nodes[idx[k]].cmd,
                                          "reading");
                    round_fail(rc, st);
                    rc->nodes[idx[k]].stale = 0;
                    pending[idx[k]] = 0;
                    broken[idx[k]] = 1;
                    npending--;
                }
        }
        for (size_t i = 0; i < rc->nnodes; i++)
            if (pending[i])
                abandon(&rc->nodes[i]);
        if (need && yes >= need)
            break;
        for (size_t i = 0; i < rc->nnodes; i++) {
            todo[i] = broken[i];
            again |= broken[i];
        }
        if (!again || (rc->deadline_ns && dlock_monotonic_ns() >= rc->deadline_ns))
            break;
    }
    /* A node that lost its script cache answers NOSCRIPT: redo it there. */
    for (size_t i = 0; i < rc->nnodes; i++) {
        redisReply *r = replies[i];
        if (dlock_redis_reply_error_kind(r) == DLOCK_REDIS_ERR_NOSCRIPT) {
            freeReplyObject(r);
            replies[i] = NULL;
            if (rc->nodes[i].stale == 0) { /* a synchronous call must not meet a stale reply */
                uint64_t saved = dlock_redis_limit(rc, dlock_monotonic_ns() + timeout_ns);
                dlock_redis_script(rc, &rc->nodes[i], argc, argv, argvlen, &replies[i]);
                dlock_redis_unlimit(rc, saved);
            }
        }
    }
}

/* all_nodes_argv() of the script's operation args on the first nkeys keys. */
static void all_nodes_keys(struct redis_conn *rc, const struct redis_keys *keys, size_t nkeys,
                           const char **args, const size_t *lens, size_t nargs,
                           redisReply **replies, size_t need, uint64_t timeout_ns, int flags,
                           struct round *st)
{
    const char *argv[20];
    size_t argvlen[20];
    size_t argc = dlock_redis_script_argv(rc, keys, nkeys, args, lens, nargs, argv, argvlen);
    all_nodes_argv(rc, argc, argv, argvlen, replies, need, timeout_ns, flags, st);
}

/* all_nodes_keys() on h's keys, built for the call (not kept with the
 * lock); out of memory: no node asked, every reply NULL. */
static void held_nodes(struct redis_conn *rc, struct redis_held *h, size_t nkeys,
                       const char **args, const size_t *lens, size_t nargs,
                       redisReply **replies, size_t need, uint64_t timeout_ns, int flags,
                       struct round *st)
{
    struct redis_keys keys;
    if (dlock_redis_held_keys(rc, h, &keys) != 0) {
        for (size_t i = 0; i < rc->nnodes; i++)
            replies[i] = NULL;
        if (st)
            memset(st, 0, sizeof *st);
        return;
    }
    all_nodes_keys(rc, &keys, nkeys, args, lens, nargs, replies, need, timeout_ns, flags, st);
    dlock_redis_keys_free(&keys);
}

/* all_nodes_argv() of the script's operation args on h's keys. */
static void all_nodes(struct redis_conn *rc, struct redis_held *h, const char **args,
                      const size_t *lens, size_t nargs, redisReply **replies, size_t need,
                      uint64_t timeout_ns, int flags, struct round *st)
{
    held_nodes(rc, h, REDIS_NKEYS_ALL, args, lens, nargs, replies, need, timeout_ns, flags, st);
}

static void free_replies(struct redis_conn *rc, redisReply **replies)
{
    for (size_t i = 0; i < rc->nnodes; i++)
        if (replies[i])
            freeReplyObject(replies[i]);
}

/* Integer replies: how many said 1 (*ones) and how many something else. */
static void count_ints(struct redis_conn *rc, redisReply **replies, size_t *ones, size_t *others)
{
    *ones = 0;
    if (others)
        *others = 0;
    for (size_t i = 0; i < rc->nnodes; i++) {
        long long v;
        if (dlock_redis_reply_int(replies[i], &v) != 0)
            continue;
        if (v == 1)
            (*ones)++;
        else if (others)
            (*others)++;
    }
}

static const char *release_channel(struct redis_conn *rc, struct redis_held *h, size_t *len,
                                   char **buf)
{
    return *buf = dlock_redis_release_channel(rc, h->name, h->name_len, len);
}

/* Releases on every node and wakes waiters, waiting up to bound_ns for the
 * replies. *ours counts the nodes where it was still ours, *not_ours those
 * that said it was not (the rest did not answer in time: they keep our key
 * until its lease runs out). */
static void drop_all(struct redis_conn *rc, struct redis_held *h, size_t *ours, size_t *not_ours,
                     uint64_t bound_ns, int flags)
{
    redisReply *replies[MAX_NODES];
    char *chan = NULL;
    size_t chan_len = 0;
    dlock_errsave saved;
    *ours = *not_ours = 0;
    if (!release_channel(rc, h, &chan_len, &chan))
        return;
    dlock_err_save(cl(rc), &saved);
    const char *args[3] = {DLOCK_REDIS_OP(h, "drop"), h->owner, chan};
    const size_t lens[3] = {strlen(args[0]), 32, chan_len};
    all_nodes(rc, h, args, lens, 3, replies, quorum(rc), bound_ns, flags, NULL);
    count_ints(rc, replies, ours, not_ours);
    free_replies(rc, replies);
    free(chan);
    dlock_err_restore(cl(rc), &saved);
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

/* The undo of a failed attempt: node_timeout for the replies, within the
 * call's bound (a deadline wait's cleanup margin). */
static void undo(struct redis_conn *rc, struct redis_held *h)
{
    size_t ours, not_ours;
    /* layout=plain: a cancelled wait sends the undo and does not wait for
     * one Redis's `timeout` (nodes that do not answer keep our key until
     * its lease runs out, as at a deadline). */
    drop_all(rc, h, &ours, &not_ours, node_timeout_ns(rc), rc->plain ? ROUND_CANCEL : 0);
}

/* One attempt: 1 won, 0 refused (*wait_ms: shortest PTTL seen), <0 error. */
static int attempt(struct redis_conn *rc, struct redis_held *h, int64_t *wait_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16], floor[24];
    size_t granted = 0, answered = 0;
    uint64_t max_token = 0, min_token = 0, start = dlock_monotonic_ns();
    int64_t shortest = -1;
    struct round st;

    dlock_clearerr(cl(rc));
    snprintf(ttl, sizeof ttl, "%" PRIu32, h->ttl_ms);
    const char *args[3] = {DLOCK_REDIS_OP(h, "grab"), h->owner, ttl};
    const size_t lens[3] = {strlen(args[0]), 32, strlen(ttl)};
    all_nodes(rc, h, args, lens, 3, replies, quorum(rc), node_timeout_ns(rc),
              ROUND_QUORUM_FIRST | (rc->plain ? ROUND_CANCEL : 0), &st);
    for (size_t i = 0; i < rc->nnodes; i++) {
        long long a, b;
        if (dlock_redis_reply_pair(replies[i], &a, &b) != 0)
            continue;
        answered++;
        if (a == 1 && b > 0) {
            uint64_t t = (uint64_t)b;
            granted++;
            max_token = t > max_token ? t : max_token;
            min_token = !min_token || t < min_token ? t : min_token;
        } else if (a == 0 && (shortest < 0 || b < shortest)) {
            shortest = b;
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
            all_nodes(rc, h, fargs, flens, 3, replies, quorum(rc), node_timeout_ns(rc), 0, NULL);
            count_ints(rc, replies, &fenced, NULL);
            free_replies(rc, replies);
        }
        if (fenced >= quorum(rc) && validity_ms(start, h->ttl_ms) > 0) {
            h->base.token = max_token;
            h->base.lease_end_ns = h->valid_until = lease_end(start, h->ttl_ms);
            dlock_clearerr(cl(rc));
            return 1;
        }
    }
    /* Undo on every node unless all refused: a node we stopped waiting for
     * may have granted too. Nothing was sent when too few were reachable. */
    if (st.reached >= quorum(rc) && (granted > 0 || answered < rc->nnodes))
        undo(rc, h);
    if (granted >= quorum(rc)) {
        dlock_seterr(cl(rc), DLOCK_EBUSY,
                     "a quorum granted the lock but its validity ran out (lease %" PRIu32
                     " ms too short for the nodes' latency)",
                     h->ttl_ms);
        return 0;
    }
    if (st.reached < quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                            "only %zu of %zu Redlock nodes answered, %zu needed for a "
                            "quorum (%.150s)",
                            st.reached, rc->nnodes, quorum(rc), st.first.msg);
    if (answered < quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                            "only %zu of %zu Redlock nodes answered, %zu needed for a "
                            "quorum (%.150s)",
                            answered, rc->nnodes, quorum(rc), st.first.msg);
    return 0;
}

/* SUBSCRIBE (confirmed, so that no release published after we retry can be
 * missed) on every node that is not subscribed to chan yet: the first time,
 * and again for a node whose subscriber connection dropped. Nodes that fail
 * are left for the next round (after RECONNECT_BACKOFF_NS when they could
 * not be reached). Each confirmation waits node_timeout at most. */
static void subscribe_missing(struct redis_conn *rc, const char *chan, size_t len)
{
    int sent[MAX_NODES] = {0};
    dlock_errsave saved;
    dlock_err_save(cl(rc), &saved);
    for (size_t i = 0; i < rc->nnodes; i++) {
        struct redis_node *n = &rc->nodes[i];
        if (n->subscribed || (!n->sub && dlock_monotonic_ns() < n->retry_at))
            continue;
        int fresh = !n->sub;
        if (dlock_redis_subscribe_send(rc, n, chan, len, node_timeout_ns(rc)) == 0)
            sent[i] = 1;
        else if (fresh)
            n->retry_at = dlock_monotonic_ns() + RECONNECT_BACKOFF_NS;
    }
    for (size_t i = 0; i < rc->nnodes; i++)
        if (sent[i])
            dlock_redis_subscribe_confirm(rc, &rc->nodes[i], chan, len);
    dlock_err_restore(cl(rc), &saved);
}

static int all_subscribed(struct redis_conn *rc)
{
    for (size_t i = 0; i < rc->nnodes; i++)
        if (!rc->nodes[i].subscribed &&
            (rc->nodes[i].sub || dlock_monotonic_ns() >= rc->nodes[i].retry_at))
            return 0;
    return 1;
}

/* Waits for a "released" message on any node (1), or until until_ns (0);
 * DLOCK_ECANCELED (no detail set) once cancel_fd (-1: none) is readable,
 * DLOCK_EINTR on a signal. Replies that are only (un)subscribe
 * confirmations are consumed on the way. */
static int wait_release(struct redis_conn *rc, const char *chan, size_t len, uint64_t until_ns,
                        int cancel_fd)
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
                int msg = dlock_redis_reply_message(r, chan, len);
                freeReplyObject(r);
                r = NULL;
                if (msg)
                    return 1;
            }
            pfd[np] = (struct pollfd){.fd = n->sub->fd, .events = POLLIN};
            idx[np++] = i;
        }
        if (dlock_monotonic_ns() >= until_ns)
            return 0;
        /* With no subscriber left this just waits out the bound (or the
         * cancel). A failed poll ends the wait as the bound does. */
        int pr = dlock_poll_until(pfd, np, cancel_fd, until_ns, DLOCK_POLL_INTR);
        if (pr == DLOCK_POLL_SIGNAL)
            return DLOCK_EINTR;
        if (pr <= 0)
            return 0;
        /* A release that came with the cancel is not read: the cancel wins
         * (nothing is ours yet, there is nothing to give back). */
        if (pr & DLOCK_POLL_CANCEL)
            return DLOCK_ECANCELED;
        for (size_t k = 0; k < np; k++)
            if (pfd[k].revents && dlock_redis_io_read(rc->nodes[idx[k]].sub) != REDIS_OK) {
                dlock_redis_drop_sub(&rc->nodes[idx[k]]);
                /* A reset connection (the node restarted): resubscribe and
                 * try at once rather than wait out the bound. */
                return 0;
            }
    }
}

static int redlock_acquire(struct redis_conn *rc, const dlock_request *req, struct redis_held *h)
{
    char *chan = NULL;
    size_t chan_len = 0;
    int64_t wait_ms = -1;
    unsigned losses = 0;
    int subscribed = 0, notified = 0, slow = 0, err;
    uint64_t saved = rc->deadline_ns, lost_at = 0;

    if (rc->nnodes > MAX_NODES)
        return dlock_seterr(cl(rc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    if ((err = ttl_ok(rc, req->ttl_ms)) != 0)
        return err;
    for (;;) {
        if (req->wait == DLOCK_WAIT_DEADLINE) {
            /* This round and its undo: to the deadline (at least a short
             * round, so that a deadline already past makes one attempt),
             * plus the cleanup margin. */
            uint64_t now = dlock_monotonic_ns(), floor = now + DLOCK_REDIS_FLOOR_NS;
            rc->deadline_ns = (req->deadline_ns > floor ? req->deadline_ns : floor) +
                              DLOCK_REDIS_CLEANUP_NS;
        }
        if (subscribed && !all_subscribed(rc))
            subscribe_missing(rc, chan, chan_len);
        rc->cancel_fd = req->cancel_fd;
        err = attempt(rc, h, &wait_ms);
        rc->cancel_fd = -1;
        if (err != 1 && rc->plain && dlock_fd_cancelled(req->cancel_fd)) {
            err = dlock_cancelled(cl(rc));
            break;
        }
        /* Too few nodes reachable (restarting, connections reset): a wait
         * tries again every RECOVER_PAUSE_NS, every node at once, for up
         * to connect_timeout (and never past its deadline) before it
         * fails. */
        if (err == DLOCK_ECONNECT && req->wait != DLOCK_WAIT_TRY && connected(rc) < quorum(rc)) {
            uint64_t now = dlock_monotonic_ns(), end;
            if (!lost_at)
                lost_at = now;
            end = lost_at + dlock_redis_tv_ns(&rc->connect_tv);
            if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < end)
                end = req->deadline_ns;
            if (now + RECOVER_PAUSE_NS < end) {
                int pe = dlock_pause_until(now + RECOVER_PAUSE_NS, req->cancel_fd);
                if (pe == DLOCK_EINTR) {
                    err = dlock_seterr(cl(rc), DLOCK_EINTR, "a signal interrupted the wait");
                    break;
                }
                if (pe == DLOCK_ECANCELED) {
                    err = dlock_cancelled(cl(rc));
                    break;
                }
                for (size_t i = 0; i < rc->nnodes; i++)
                    rc->nodes[i].retry_at = 0;
                continue;
            }
            if (req->wait == DLOCK_WAIT_DEADLINE && end == req->deadline_ns) {
                dlock_errsave why;
                dlock_err_save(cl(rc), &why);
                err = dlock_seterr(cl(rc), DLOCK_ETIMEDOUT, "the deadline passed; %.200s",
                                   why.msg);
            }
            break;
        }
        if (err != DLOCK_ECONNECT)
            lost_at = 0;
        /* Nodes that are connected but slow to answer (overload, a herd of
         * waiters) do not end a wait: it goes on until its deadline. */
        if (err == DLOCK_ECONNECT && req->wait != DLOCK_WAIT_TRY && connected(rc) >= quorum(rc)) {
            if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() >= req->deadline_ns) {
                dlock_errsave why;
                dlock_err_save(cl(rc), &why);
                err = dlock_seterr(cl(rc), DLOCK_ETIMEDOUT, "the deadline passed; %.200s",
                                   why.msg);
                break;
            }
            wait_ms = (int64_t)(node_timeout_ns(rc) / 1000000u);
            err = 0;
            slow = 1;
        } else {
            slow = 0;
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
            /* layout=plain: the key's keyspace notifications when the
             * servers have them on, else dlock's release channel and a
             * poll (redis_plain.c). */
            if (rc->plain)
                chan = dlock_redis_plain_channel(rc, h->name, h->name_len, &chan_len, &notified);
            else
                release_channel(rc, h, &chan_len, &chan);
            if (!chan) {
                err = dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
                break;
            }
            for (size_t i = 0; i < rc->nnodes; i++)
                rc->nodes[i].subscribed = 0;
            subscribe_missing(rc, chan, chan_len);
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
        /* (Not after nodes were slow to answer: they get node_timeout.) */
        if (rc->plain && !notified && !slow && bound > DLOCK_REDIS_PLAIN_POLL_NS)
            bound = DLOCK_REDIS_PLAIN_POLL_NS; /* a peer's release is not told */
        uint64_t until = now + bound;
        if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < until)
            until = req->deadline_ns;
        int we = wait_release(rc, chan, chan_len, until, req->cancel_fd);
        if (we == DLOCK_EINTR) {
            err = dlock_seterr(cl(rc), DLOCK_EINTR, "a signal interrupted the wait");
            break;
        }
        if (we == DLOCK_ECANCELED) {
            err = dlock_cancelled(cl(rc));
            break;
        }
        /* layout=plain: a poll that found nothing steps back no further. */
        if (rc->plain && we == 0)
            continue;
        uint32_t rnd = 0;
        dlock_random_bytes(&rnd, sizeof rnd);
        uint64_t spread_ns = 1000000ull << (losses < 6 ? losses : 6);
        uint64_t backoff = rnd % spread_ns, woke = dlock_monotonic_ns();
        if (req->wait == DLOCK_WAIT_DEADLINE && woke + backoff > req->deadline_ns)
            backoff = woke < req->deadline_ns ? req->deadline_ns - woke : 0;
        /* A signal only shortens the step back (as it always did). */
        if (dlock_pause_until(woke + backoff, req->cancel_fd) == DLOCK_ECANCELED) {
            err = dlock_cancelled(cl(rc));
            break;
        }
        losses++;
    }
    if (subscribed)
        for (size_t i = 0; i < rc->nnodes; i++) /* confirmations skipped when they arrive */
            dlock_redis_unsubscribe(rc, &rc->nodes[i], chan, chan_len);
    rc->deadline_ns = saved;
    free(chan);
    return err == 1 ? 0 : err;
}

/* Bounded by connect_timeout in all (reconnections included): a release is
 * not latency-bound like a grant. */
/* A write on every node where the lock is ours (release, publish): done
 * on a quorum; lost only when the nodes that answered prove no quorum was
 * ours; else not known (what: "" or "publish: ", done: what the ones
 * said, "release confirmed"). */
static int quorum_write(struct redis_conn *rc, size_t ours, size_t not_ours, const char *what,
                        const char *done)
{
    if (ours >= quorum(rc)) {
        dlock_clearerr(cl(rc));
        return 0;
    }
    if (rc->nnodes - not_ours < quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ELOST,
                            "%sthe lock was no longer ours on %zu of %zu Redlock nodes (quorum %zu)",
                            what, not_ours, rc->nnodes, quorum(rc));
    return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                        "%s on %zu of %zu Redlock nodes, %zu refused, the others did not answer",
                        done, ours, rc->nnodes, not_ours);
}

static int redlock_release(struct redis_conn *rc, struct redis_held *h)
{
    size_t ours, not_ours;
    uint64_t bound = dlock_redis_tv_ns(&rc->connect_tv);
    uint64_t saved = dlock_redis_limit(rc, dlock_monotonic_ns() + bound);
    drop_all(rc, h, &ours, &not_ours, bound, 0);
    dlock_redis_unlimit(rc, saved);
    return quorum_write(rc, ours, not_ours, "", "release confirmed");
}

static int redlock_renew(struct redis_conn *rc, struct redis_held *h, uint32_t ttl_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16];
    size_t ours = 0, not_ours = 0;
    uint64_t start = dlock_monotonic_ns();
    int err;
    if ((err = ttl_ok(rc, ttl_ms)) != 0)
        return err;
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    const char *args[3] = {DLOCK_REDIS_OP(h, "renew"), h->owner, ttl};
    const size_t lens[3] = {strlen(args[0]), 32, strlen(ttl)};
    all_nodes(rc, h, args, lens, 3, replies, quorum(rc), node_timeout_ns(rc), 0, NULL);
    count_ints(rc, replies, &ours, &not_ours);
    free_replies(rc, replies);
    if (ours >= quorum(rc) && validity_ms(start, ttl_ms) > 0) {
        h->ttl_ms = ttl_ms;
        h->base.lease_end_ns = h->valid_until = lease_end(start, ttl_ms);
        dlock_clearerr(cl(rc));
        return 0;
    }
    size_t dropped, refused;
    drop_all(rc, h, &dropped, &refused, node_timeout_ns(rc), 0); /* a minority is no lock */
    return dlock_seterr(cl(rc), DLOCK_ELOST,
                        "renewed on only %zu of %zu Redlock nodes, %zu needed (%zu said it was "
                        "no longer ours, the others did not answer in time); released",
                        ours, rc->nnodes, quorum(rc), not_ours);
}

/*
 * The keeper's renewal on its own connections kc: the renew script on every
 * node at once, like redlock_renew(), but it never releases. A quorum
 * of renewals within the validity is a new lease (its end: start + TTL -
 * drift). Nodes that answered "not ours" in such numbers that no quorum
 * can be ours prove the loss: DLOCK_ELOST. Anything else (nodes silent,
 * down, slow) is not a proof: a transient error, tried again while the
 * lease lasts. Bounded by node_timeout for the replies, plus node_timeout
 * for each node whose connection has to be made again (a node that failed
 * to connect is tried at most once a second).
 */
static int redlock_keep(struct redis_conn *kc, struct redis_held *h, uint32_t ttl_ms)
{
    redisReply *replies[MAX_NODES];
    char ttl[16];
    size_t ours = 0, not_ours = 0;
    uint64_t start = dlock_monotonic_ns();
    if (kc->nnodes > MAX_NODES)
        return dlock_seterr(cl(kc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    const char *args[3] = {DLOCK_REDIS_OP(h, "renew"), h->owner, ttl};
    const size_t lens[3] = {strlen(args[0]), 32, strlen(ttl)};
    all_nodes(kc, h, args, lens, 3, replies, quorum(kc), node_timeout_ns(kc), 0, NULL);
    count_ints(kc, replies, &ours, &not_ours);
    free_replies(kc, replies);
    if (ours >= quorum(kc) && validity_ms(start, ttl_ms) > 0) {
        h->base.lease_end_ns = h->valid_until = lease_end(start, ttl_ms);
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

/*
 * raise_token: the script's "fence" (counter = max(counter, floor) while
 * the key is ours, checked in the same call) on every node at once, like
 * the token write-back of a grant. It counts only on a quorum of nodes
 * confirming within the lock's validity (its lease end, start + TTL -
 * drift): then every later quorum shares a node whose counter is >= floor,
 * so its token is greater. Otherwise DLOCK_ELOST when the nodes that
 * answered rule out a quorum still ours, DLOCK_ETIMEDOUT on a quorum
 * confirmed too late, else DLOCK_ECONNECT; the nodes that did raise keep
 * it (a raise is never undone: it does no harm). Bounded like renew:
 * node_timeout for the replies, plus node_timeout for each node whose
 * connection has to be made again.
 */
static int redlock_raise(struct redis_conn *rc, struct redis_held *h, uint64_t floor)
{
    redisReply *replies[MAX_NODES];
    char arg[24];
    size_t ours = 0, not_ours = 0;
    struct round st;
    snprintf(arg, sizeof arg, "%" PRIu64, floor);
    /* Marked, unlike a grant's write-back: inspect tells a raise apart. */
    const char *args[4] = {"fence", h->owner, arg, "mark"};
    const size_t lens[4] = {5, 32, strlen(arg), 4};
    held_nodes(rc, h, REDIS_NKEYS_ALL, args, lens, 4, replies, quorum(rc), node_timeout_ns(rc),
               0, &st);
    count_ints(rc, replies, &ours, &not_ours);
    free_replies(rc, replies);
    if (ours >= quorum(rc) && dlock_monotonic_ns() < h->valid_until) {
        dlock_clearerr(cl(rc));
        return 0;
    }
    if (rc->nnodes - not_ours < quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ELOST,
                            "not raised: the lock was no longer ours on %zu of %zu Redlock nodes "
                            "(quorum %zu): the lease had expired or another owner holds it",
                            not_ours, rc->nnodes, quorum(rc));
    if (ours >= quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                            "raised on a quorum of Redlock nodes, but after the lock's validity "
                            "had run out: later grants may not be above the floor");
    return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                        "raised on only %zu of %zu Redlock nodes (quorum %zu), %zu refused, the "
                        "others did not answer (%.150s)",
                        ours, rc->nnodes, quorum(rc), not_ours, st.first.msg);
}

/*
 * token_top: each node's top (dlock_redis_node_top(): its counters under
 * the prefix, its floor key, its TIME in µs), one node after another, the
 * largest of them. A quorum must answer: a token is the largest counter of
 * its granting quorum, written back to a quorum (and a floor is raised on
 * a quorum), and any two quorums share a node, so the nodes of any quorum
 * hold a counter (or floor, or clock) at least as large. Each round trip
 * is bounded by node_timeout; a node that failed to connect a moment ago
 * is not tried.
 */
static int redlock_top(struct redis_conn *rc, uint64_t *top)
{
    size_t answered = 0;
    uint64_t best = 0;
    dlock_errsave first = {0, ""};
    for (size_t i = 0; i < rc->nnodes; i++) {
        struct redis_node *n = &rc->nodes[i];
        uint64_t t = 0;
        int err;
        if (!n->cmd && dlock_monotonic_ns() < n->retry_at)
            err = dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: unreachable a moment ago",
                               n->host, n->port);
        else if ((err = dlock_redis_node_top(rc, n, &t)) != 0 && !n->cmd)
            n->retry_at = dlock_monotonic_ns() + RECONNECT_BACKOFF_NS;
        if (err) {
            if (!first.err)
                dlock_err_save(cl(rc), &first);
            continue;
        }
        answered++;
        best = t > best ? t : best;
    }
    if (answered < quorum(rc))
        return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                            "token top: only %zu of %zu Redlock nodes answered, %zu needed for a "
                            "quorum (%.150s)",
                            answered, rc->nnodes, quorum(rc), first.msg);
    dlock_clearerr(cl(rc));
    *top = best;
    return 0;
}

/*
 * raise_floor: the floor script (floor key = max(floor key, floor)) on
 * every node at once, waiting for all of them (node_timeout for the
 * replies). It counts on a quorum of confirmations: a later grant needs a
 * quorum of granting nodes, which shares a node with this one, whose token
 * is above the floor; the grant's token is the largest of its quorum's, so
 * it is above the floor too, whatever the nodes that missed the floor
 * answer. The nodes that did raise keep it whatever the outcome (a floor
 * does no harm); the call is idempotent, so it may simply be repeated.
 */
static int redlock_raise_floor(struct redis_conn *rc, uint64_t floor)
{
    redisReply *replies[MAX_NODES];
    const char *argv[8];
    size_t argvlen[8], key_len = 0, ones = 0, others = 0;
    char value[24], *key;
    struct round st;
    if (rc->nnodes > MAX_NODES)
        return dlock_seterr(cl(rc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    if (!(key = dlock_redis_floor_key(rc, &key_len)))
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    snprintf(value, sizeof value, "%" PRIu64, floor);
    size_t argc = dlock_redis_floor_argv(rc, key, key_len, value, argv, argvlen);
    all_nodes_argv(rc, argc, argv, argvlen, replies, 0, node_timeout_ns(rc), 0, &st);
    count_ints(rc, replies, &ones, &others);
    free_replies(rc, replies);
    free(key);
    if (ones >= quorum(rc)) {
        dlock_clearerr(cl(rc));
        return 0;
    }
    return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                        "floor raised on only %zu of %zu Redlock nodes, %zu needed for a quorum "
                        "(%.150s)",
                        ones, rc->nnodes, quorum(rc), st.first.msg);
}

/* An inspection that fewer than a quorum of the nodes answered. */
static int too_few(struct redis_conn *rc, size_t answered, const struct round *st)
{
    return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                        "inspect: only %zu of %zu Redlock nodes answered, %zu needed for a "
                        "quorum (%.150s)",
                        answered, rc->nnodes, quorum(rc), st->first.msg);
}

static int desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/*
 * inspect: the script's "inspect" (reads only) on every node at once, with
 * the lock's release channel, each reply bounded by node_timeout like every
 * round, and merged so as to say only what a quorum settles:
 *  - held: one owner holds the key on a quorum of the nodes; free: no owner
 *    can (the nodes it holds, and those that did not answer, make less than
 *    a quorum); otherwise DLOCK_ECONNECT (cannot tell), and so when fewer
 *    than a quorum answer.
 *  - owner: that owner id. Token: per node of the holder, the larger of the
 *    token in its key and its counter as grants left it (a raise_token mark
 *    undone); the quorum-th largest of these is the grant's token M: a
 *    quorum of the holder's nodes has M (each granting node that answered
 *    in time had M, or the write-back raised its counter to M), and only
 *    nodes that granted after the grant stopped waiting (fewer than a
 *    quorum) can have more. With nodes silent, reported only when no rank
 *    they could take changes it (else unknown, with the last token).
 *  - lease: the quorum-th longest PTTL among the holder's nodes that
 *    answered: how long a quorum still holds the key by the servers'
 *    clocks (exact when every node answered; with nodes silent, at least
 *    that long). The holder's own validity also allows for clock drift.
 *  - waiters: the release channel's subscribers (every waiter subscribes on
 *    every node, and unsubscribes or disconnects when it stops waiting),
 *    when all the nodes that answered count the same; else unknown. No
 *    order: Redlock is not FIFO.
 *  - last token: the holder's token while held; unknown while free (failed
 *    attempts draw tokens on some nodes, which were never grants).
 */
/* Two nodes' lock keys name the same holder: dlock's owner id, or the
 * same printable value of a peer (node-redlock writes one on every node). */
static int same_holder(const struct redis_seen *a, const struct redis_seen *b)
{
    if (a->has_owner || b->has_owner)
        return a->has_owner && b->has_owner && memcmp(a->owner, b->owner, 32) == 0;
    return a->value[0] && strcmp(a->value, b->value) == 0;
}

/* With value (an election's leader()), the value keys too: of the holder's
 * nodes whose value its owner published, the newest publish (the highest
 * sequence number) is told. */
static int inspect_keys(struct redis_conn *rc, const struct redis_keys *keys, const char *name,
                        size_t len, dlock_info *info, char *value, size_t *value_len)
{
    redisReply *replies[MAX_NODES];
    struct redis_seen *seen;
    int ok[MAX_NODES] = {0};
    long long pttl[MAX_NODES], tok[MAX_NODES];
    size_t n = rc->nnodes, q = quorum(rc), answered = 0, chan_len = 0;
    char listed[8], *chan = NULL;
    struct round st;
    int err = 0;

    if (n > MAX_NODES)
        return dlock_seterr(cl(rc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    if (!(seen = calloc(n, sizeof *seen)) ||
        !(chan = dlock_redis_release_channel(rc, name, len, &chan_len))) {
        free(seen);
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    }
    snprintf(listed, sizeof listed, "%d", DLOCK_REDIS_LISTED);
    const char *args[3] = {"inspect", listed, chan};
    const size_t lens[3] = {7, strlen(listed), chan_len};
    all_nodes_keys(rc, keys, value ? REDIS_NKEYS_ELECT : REDIS_NKEYS_ALL, args, lens, 3, replies,
                   0, node_timeout_ns(rc), 0, &st);
    if (value_len)
        *value_len = 0;
    for (size_t i = 0; i < n; i++) {
        if (!replies[i])
            continue;
        if (replies[i]->type == REDIS_REPLY_ERROR) {
            dlock_seterr(cl(rc), DLOCK_ESTORE, "redis %s:%d: inspect: %.120s", rc->nodes[i].host,
                         rc->nodes[i].port, replies[i]->str);
            round_fail(rc, &st);
        } else if (dlock_redis_reply_inspect(replies[i], &seen[i]) != 0) {
            dlock_seterr(cl(rc), DLOCK_EPROTO, "redis %s:%d: unexpected inspect reply",
                         rc->nodes[i].host, rc->nodes[i].port);
            round_fail(rc, &st);
        } else {
            if (!rc->plain) /* layout=dlock: a foreign value names no one */
                seen[i].value[0] = '\0';
            ok[i] = 1;
            answered++;
        }
    }
    if (answered < q) {
        err = too_few(rc, answered, &st);
        goto out;
    }
    /* The owner holding the most nodes that answered (a value that is not
     * dlock's holds its node alone). */
    size_t best = n, most = 0;
    for (size_t i = 0; i < n; i++) {
        size_t count = 0;
        if (!ok[i] || !seen[i].held)
            continue;
        for (size_t j = 0; j < n; j++)
            count += ok[j] && seen[j].held && (j == i || same_holder(&seen[i], &seen[j]));
        if (count > most)
            most = count, best = i;
    }
    info->known = DLOCK_KNOWS_HELD;
    if (most >= q && seen[best].has_owner) {
        size_t np = 0, nt = 0, silent = n - answered; /* silent < q: answered >= q */
        info->held = 1;
        info->known |= DLOCK_KNOWS_OWNER;
        memcpy(info->owner, seen[best].owner, sizeof seen[best].owner);
        for (size_t j = 0; j < n; j++) {
            if (!ok[j] || !seen[j].has_owner || memcmp(seen[j].owner, seen[best].owner, 32))
                continue;
            uint64_t t = seen[j].token > seen[j].counter ? seen[j].token : seen[j].counter;
            tok[nt++] = (long long)t;
            if (seen[j].pttl >= 0)
                pttl[np++] = seen[j].pttl;
        }
        /* The q-th largest over all the holder's nodes; a silent node may
         * rank anywhere: exact only when that cannot move it. */
        qsort(tok, nt, sizeof tok[0], desc);
        if (tok[q - 1] == tok[q - 1 - silent]) {
            info->known |= DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_LAST_TOKEN;
            info->token = info->last_token = (uint64_t)tok[q - 1];
        }
        if (np >= q) {
            qsort(pttl, np, sizeof pttl[0], desc);
            info->known |= DLOCK_KNOWS_LEASE;
            info->lease_ms = (uint64_t)pttl[q - 1];
        }
        const struct redis_seen *pub = NULL;
        for (size_t j = 0; value && j < n; j++)
            if (ok[j] && seen[j].has_pub && memcmp(seen[j].pub, seen[best].owner, 32) == 0 &&
                (!pub || seen[j].pub_seq > pub->pub_seq))
                pub = &seen[j];
        if (pub) {
            memcpy(value, pub->pub + DLOCK_REDIS_PUB_HEAD, pub->pub_len);
            *value_len = pub->pub_len;
        }
    } else if (most >= q) {
        /* By a value dlock did not write (a peer's, layout=plain): that
         * value as the owner when printable, the lease a quorum still
         * has; no token. */
        size_t np = 0;
        info->held = 1;
        if (seen[best].value[0]) {
            info->known |= DLOCK_KNOWS_OWNER;
            snprintf(info->owner, sizeof info->owner, "%s", seen[best].value);
        }
        for (size_t j = 0; j < n; j++)
            if (ok[j] && seen[j].held && same_holder(&seen[best], &seen[j]) && seen[j].pttl >= 0)
                pttl[np++] = seen[j].pttl;
        if (np >= q && seen[best].value[0]) {
            qsort(pttl, np, sizeof pttl[0], desc);
            info->known |= DLOCK_KNOWS_LEASE;
            info->lease_ms = (uint64_t)pttl[q - 1];
        }
    } else if (most + (n - answered) >= q) {
        err = dlock_seterr(cl(rc), DLOCK_ECONNECT,
                           "inspect: one owner holds %zu of %zu Redlock nodes and %zu did not "
                           "answer: cannot tell whether a quorum (%zu) holds it (%.150s)",
                           most, n, n - answered, q, st.first.msg);
        goto out;
    }
    /* Waiters: every node that answered must count the same. */
    long long subs = -1;
    int agree = 1;
    for (size_t i = 0; i < n; i++) {
        if (!ok[i])
            continue;
        if (seen[i].numsub < 0 || (subs >= 0 && seen[i].numsub != subs))
            agree = 0;
        subs = seen[i].numsub;
    }
    /* layout=plain: waiters may listen to keyspace notifications instead. */
    if (agree && subs >= 0 && !rc->plain) {
        info->known |= DLOCK_KNOWS_WAITERS;
        info->waiters = (uint64_t)subs;
    }
    dlock_clearerr(cl(rc));
out:
    free_replies(rc, replies);
    free(seen);
    free(chan);
    return err;
}

/*
 * inspect_holders: the script's "holders" (reads only) on every node at
 * once, each reply bounded by node_timeout: a holder is an owner listed on
 * a quorum of the nodes (what a grant needs); its token the quorum-th
 * largest of its nodes' (as inspect's), its lease the quorum-th longest.
 * Each node lists at most REDLOCK_HOLDERS_MAX (Redlock has readers only,
 * never a semaphore's thousands). Fewer than a quorum answering:
 * DLOCK_ECONNECT.
 */
#define REDLOCK_HOLDERS_MAX 256
static int holder_cmp(const void *a, const void *b)
{
    const dlock_holder *x = a, *y = b;
    return x->token < y->token ? -1 : x->token > y->token;
}

static int redlock_holders(struct redis_conn *rc, const char *name, size_t len, dlock_holder *out,
                           size_t capacity, size_t *count)
{
    redisReply *replies[MAX_NODES];
    struct redis_keys keys;
    struct round st;
    size_t n = rc->nnodes, q = quorum(rc), answered = 0, found = 0;
    dlock_holder *seen, *all = NULL;
    size_t listed[MAX_NODES] = {0};
    char cap[12];
    int err = 0;
    if (n > MAX_NODES)
        return dlock_seterr(cl(rc), DLOCK_EBADURI, "Redlock takes at most %d hosts", MAX_NODES);
    if (!(seen = calloc(n * REDLOCK_HOLDERS_MAX, sizeof *seen)) ||
        !(all = calloc(REDLOCK_HOLDERS_MAX, sizeof *all)) ||
        dlock_redis_keys(rc, name, len, &keys) != 0) {
        free(seen);
        free(all);
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    }
    snprintf(cap, sizeof cap, "%d", REDLOCK_HOLDERS_MAX);
    const char *args[2] = {"holders", cap};
    const size_t lens[2] = {7, strlen(cap)};
    all_nodes_keys(rc, &keys, REDIS_NKEYS_ALL, args, lens, 2, replies, 0, node_timeout_ns(rc), 0,
                   &st);
    dlock_redis_keys_free(&keys);
    for (size_t i = 0; i < n; i++) {
        size_t c = 0;
        uint32_t limit = 0;
        if (!replies[i])
            continue;
        if (dlock_redis_reply_holders(replies[i], &seen[i * REDLOCK_HOLDERS_MAX],
                                      REDLOCK_HOLDERS_MAX, &c, &limit) != 0) {
            dlock_seterr(cl(rc), DLOCK_EPROTO, "redis %s:%d: unexpected holders reply",
                         rc->nodes[i].host, rc->nodes[i].port);
            round_fail(rc, &st);
            continue;
        }
        listed[i] = c < REDLOCK_HOLDERS_MAX ? c : REDLOCK_HOLDERS_MAX;
        answered++;
    }
    if (answered < q) {
        err = too_few(rc, answered, &st);
        goto out;
    }
    /* Each owner once, at its first node that lists it. */
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < listed[i] && found < REDLOCK_HOLDERS_MAX; k++) {
            const dlock_holder *h = &seen[i * REDLOCK_HOLDERS_MAX + k];
            long long tok[MAX_NODES], lease[MAX_NODES];
            size_t on = 0, first = 1;
            if (!(h->known & DLOCK_KNOWS_OWNER))
                continue;
            for (size_t j = 0; j < n && first; j++)
                for (size_t m = 0; m < listed[j]; m++) {
                    const dlock_holder *o = &seen[j * REDLOCK_HOLDERS_MAX + m];
                    if (!(o->known & DLOCK_KNOWS_OWNER) || strcmp(o->owner, h->owner) != 0)
                        continue;
                    if (j < i)
                        first = 0;
                    tok[on] = (long long)o->token;
                    lease[on++] = (o->known & DLOCK_KNOWS_LEASE) ? (long long)o->lease_ms : 0;
                    break;
                }
            if (!first || on < q)
                continue;
            qsort(tok, on, sizeof tok[0], desc);
            qsort(lease, on, sizeof lease[0], desc);
            all[found] = *h;
            all[found].token = (uint64_t)tok[q - 1];
            all[found++].lease_ms = (uint64_t)lease[q - 1];
        }
    }
    qsort(all, found, sizeof *all, holder_cmp);
    if (capacity)
        memcpy(out, all, (found < capacity ? found : capacity) * sizeof *out);
    *count = found;
    dlock_clearerr(cl(rc));
out:
    free_replies(rc, replies);
    free(seen);
    free(all);
    return err;
}

/*
 * inspect: inspect_keys() above; readers may be granted in another order
 * on each node, so that no one owner is the newest on a quorum: when it
 * finds the name free or cannot tell, the holders are asked (as
 * inspect_holders), and the one with the highest token is told.
 */
static int inspect_read(struct redis_conn *rc, const char *name, size_t len, dlock_info *info,
                        char *value, size_t *value_len)
{
    struct redis_keys keys;
    dlock_holder *hs;
    size_t count = 0;
    int err;
    if (dlock_redis_keys(rc, name, len, &keys) != 0)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    err = inspect_keys(rc, &keys, name, len, info, value, value_len);
    dlock_redis_keys_free(&keys);
    if ((err && err != DLOCK_ECONNECT) || (!err && info->held))
        return err;
    if (!(hs = calloc(REDLOCK_HOLDERS_MAX, sizeof *hs)))
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    dlock_errsave why;
    dlock_err_save(cl(rc), &why);
    if (redlock_holders(rc, name, len, hs, REDLOCK_HOLDERS_MAX, &count) == 0 && count > 0) {
        const dlock_holder *top = &hs[(count < REDLOCK_HOLDERS_MAX ? count : REDLOCK_HOLDERS_MAX) - 1];
        if (err)
            info->known = DLOCK_KNOWS_HELD; /* the waiters were not told */
        info->held = 1;
        info->known |= top->known & (DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER | DLOCK_KNOWS_LEASE);
        info->token = top->token;
        info->lease_ms = top->lease_ms;
        memcpy(info->owner, top->owner, sizeof info->owner);
        err = 0;
    } else {
        dlock_err_restore(cl(rc), &why);
    }
    free(hs);
    return err;
}

static int redlock_inspect(struct redis_conn *rc, const char *name, size_t len, dlock_info *info)
{
    return inspect_read(rc, name, len, info, NULL, NULL);
}

/*
 * Elections. publish: the script's "publish" on every node, each writing
 * the value key and telling its channel only where the lock is still ours;
 * done when a quorum took it; lost when the nodes that refused leave no
 * quorum (as release). leader: inspect with the value keys (above). wake:
 * the script's "wake" on every node (a watch hears any one of them).
 */
static int redlock_publish(struct redis_conn *rc, struct redis_held *h, const void *value,
                           size_t len)
{
    redisReply *replies[MAX_NODES];
    size_t ours = 0, not_ours = 0;
    char seq[17];
    dlock_redis_pub_seq(seq);
    const char *args[4] = {"publish", h->owner, seq, len ? value : ""};
    const size_t lens[4] = {7, 32, 16, len};
    held_nodes(rc, h, REDIS_NKEYS_ELECT, args, lens, 4, replies, 0, node_timeout_ns(rc), 0, NULL);
    count_ints(rc, replies, &ours, &not_ours);
    free_replies(rc, replies);
    return quorum_write(rc, ours, not_ours, "publish: ", "publish: taken");
}

static int redlock_wake(struct redis_conn *rc, const char *name, size_t len)
{
    redisReply *replies[MAX_NODES];
    struct redis_keys keys;
    size_t ones = 0;
    if (dlock_redis_keys(rc, name, len, &keys) != 0)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    const char *args[1] = {"wake"};
    const size_t lens[1] = {4};
    all_nodes_keys(rc, &keys, REDIS_NKEYS_ELECT, args, lens, 1, replies, 0, node_timeout_ns(rc), 0,
                   NULL);
    dlock_redis_keys_free(&keys);
    count_ints(rc, replies, &ones, NULL);
    free_replies(rc, replies);
    if (ones == 0)
        return dlock_seterr(cl(rc), DLOCK_ECONNECT, "wake: no Redlock node answered");
    dlock_clearerr(cl(rc));
    return 0;
}

const struct redis_recipe dlock_redlock_recipe = {
    .acquire = redlock_acquire,
    .release = redlock_release,
    .renew = redlock_renew,
    .keep = redlock_keep,
    .raise = redlock_raise,
    .top = redlock_top,
    .raise_floor = redlock_raise_floor,
    .inspect = redlock_inspect,
    .holders = redlock_holders,
    .publish = redlock_publish,
    .leader = inspect_read,
    .wake = redlock_wake,
};
