/*
 * An election's watch (dlock_backend.h's watch_open() ... watch_close()):
 * the subscriber connection(s) of the observer's own client, SUBSCRIBEd
 * to the election's channel, the name of its value key
 * "<prefix><name>:leader" (redis_keys.c), on which the script's "publish"
 * and "wake" PUBLISH (redis_script.h): one Redis and a Sentinel's primary
 * (the sentinels asked at connect), a Cluster's owner of the name's slot
 * (SSUBSCRIBE: the script's SPUBLISH stays on that shard; a slot that
 * moves ends the subscription, which breaks the watch: the core opens it
 * again on the new owner), and every Redlock instance that answers, at
 * least a quorum (a publish reaches a quorum, and any two quorums meet;
 * a wake reaches every instance).
 *
 * The watch's descriptor is an epoll descriptor over the subscriber
 * sockets, readable when any is. watch_read() reads what the ready
 * sockets hold and consumes every reply without blocking (hiredis's
 * reader); a connection closed or reset, an error reply or the end of the
 * subscription is an error: the watch is broken. An idle watch sends
 * nothing (TCP keepalive only, below Redis).
 *
 * The lock's own grants and releases publish nothing here: a campaign
 * publishes after its grant, and the core wakes after an election's
 * release; a leader whose lease runs out is read again by the core's lease
 * timer.
 */
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "backends/redis_conn.h"
#include "core/internal.h"

struct redis_watch {
    dlock_watch base;
    struct redis_conn *rc;
    int epfd;
    size_t n;                  /* nodes subscribed */
    struct redis_node **node;  /* each with its sub connection subscribed */
    char *chan;
    size_t chan_len;
};

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
}

void dlock_redis_watch_close(dlock_watch *watch)
{
    struct redis_watch *w = (struct redis_watch *)watch;
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        dlock_redis_drop_sub(w->node[i]); /* closing it ends the subscription */
    if (w->epfd >= 0)
        close(w->epfd);
    free(w->node);
    free(w->chan);
    free(w);
}

/* The nodes to subscribe on, into out (room for rc->nnodes); their count,
 * or a negative error. */
static int watch_nodes(struct redis_conn *rc, unsigned slot, struct redis_node **out)
{
    int err = 0;
    if (rc->mode == REDIS_REDLOCK) {
        for (size_t i = 0; i < rc->nnodes; i++)
            out[i] = &rc->nodes[i];
        return (int)rc->nnodes;
    }
    if (rc->mode == REDIS_CLUSTER) {
        if (!(out[0] = dlock_redis_cluster_node(rc, slot, &err)))
            return err ? err : DLOCK_ECONNECT;
        return 1;
    }
    out[0] = &rc->nodes[0];
    return 1;
}

int dlock_redis_watch_open(struct redis_conn *rc, const char *name, size_t len,
                           dlock_watch **watchp)
{
    struct redis_keys keys;
    struct redis_watch *w;
    int err = 0;
    *watchp = NULL;
    if (dlock_redis_keys(rc, name, len, &keys) != 0)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    w = calloc(1, sizeof *w);
    size_t room = rc->nnodes ? rc->nnodes : 1;
    struct redis_node **cand = calloc(room, sizeof *cand);
    int *sent = calloc(room, sizeof *sent);
    if (w) {
        w->node = calloc(rc->nnodes ? rc->nnodes : 1, sizeof *w->node);
        w->chan = malloc(keys.len[REDIS_KEY_LEADER] + 1);
    }
    if (!w || !cand || !sent || !w->node || !w->chan) {
        dlock_redis_keys_free(&keys);
        free(cand);
        free(sent);
        if (w) {
            free(w->node);
            free(w->chan);
            free(w);
        }
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    }
    memcpy(w->chan, keys.k[REDIS_KEY_LEADER], keys.len[REDIS_KEY_LEADER] + 1);
    w->chan_len = keys.len[REDIS_KEY_LEADER];
    w->base.conn = &rc->base;
    w->rc = rc;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    unsigned slot = keys.slot;
    dlock_redis_keys_free(&keys);
    if (w->epfd < 0) {
        err = dlock_seterr(cl(rc), DLOCK_EIO, "cannot make an election watch's descriptor");
        goto fail;
    }
    uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
    int nc = watch_nodes(rc, slot, cand);
    if (nc < 0) {
        dlock_redis_unlimit(rc, saved);
        err = nc;
        goto fail;
    }
    /* Sent to every node first, then each confirmation: one round trip. */
    for (int i = 0; i < nc; i++) {
        dlock_redis_drop_sub(cand[i]); /* a fresh connection: nothing stale on it */
        sent[i] = dlock_redis_subscribe_send(rc, cand[i], w->chan, w->chan_len,
                                             dlock_redis_tv_ns(&rc->connect_tv)) == 0;
    }
    dlock_errsave first = {0, ""};
    for (int i = 0; i < nc; i++) {
        if (sent[i] && dlock_redis_subscribe_confirm(rc, cand[i], w->chan, w->chan_len) == 0) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = cand[i]};
            if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, cand[i]->sub->fd, &ev) == 0) {
                w->node[w->n++] = cand[i];
                continue;
            }
            dlock_redis_drop_sub(cand[i]);
            dlock_seterr(cl(rc), DLOCK_EIO, "cannot watch a subscriber's socket");
        }
        if (!first.err)
            dlock_err_save(cl(rc), &first);
    }
    dlock_redis_unlimit(rc, saved);
    /* Redlock: a quorum of the instances (any publish's quorum meets it). */
    size_t need = rc->mode == REDIS_REDLOCK ? rc->nnodes / 2 + 1 : 1;
    if (w->n < need) {
        if (first.err)
            dlock_err_restore(cl(rc), &first);
        err = rc->mode == REDIS_REDLOCK
                  ? dlock_seterr(cl(rc), DLOCK_ECONNECT,
                                 "election watch: subscribed on %zu of %zu Redlock nodes, %zu "
                                 "needed (%.150s)",
                                 w->n, rc->nnodes, need, first.msg)
                  : (first.err ? first.err : DLOCK_ECONNECT);
        goto fail;
    }
    free(cand);
    free(sent);
    dlock_clearerr(cl(rc));
    *watchp = &w->base;
    return 0;
fail:
    free(cand);
    free(sent);
    dlock_redis_watch_close(&w->base);
    return err;
}

int dlock_redis_watch_fd(dlock_watch *watch)
{
    return ((struct redis_watch *)watch)->epfd;
}

static int broken(struct redis_watch *w, struct redis_node *n, const char *why)
{
    return dlock_seterr(cl(w->rc), DLOCK_ECONNECT, "redis %s:%d: election watch: %s", n->host,
                        n->port, why);
}

/* Consumes the replies node n's reader holds: 0, or the watch is broken. */
static int consume(struct redis_watch *w, struct redis_node *n)
{
    for (;;) {
        void *v = NULL;
        if (redisGetReplyFromReader(n->sub, &v) != REDIS_OK)
            return broken(w, n, n->sub->errstr[0] ? n->sub->errstr : "bad reply");
        if (!v)
            return 0;
        redisReply *r = v;
        int bad = r->type == REDIS_REPLY_ERROR;
        int ended = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element[0] &&
                    r->element[0]->type == REDIS_REPLY_STRING &&
                    (strcmp(r->element[0]->str, "sunsubscribe") == 0 ||
                     strcmp(r->element[0]->str, "unsubscribe") == 0);
        freeReplyObject(r);
        if (bad)
            return broken(w, n, "error reply on the subscription");
        if (ended)
            return broken(w, n, "the subscription ended (the slot moved?)");
    }
}

int dlock_redis_watch_read(dlock_watch *watch)
{
    struct redis_watch *w = (struct redis_watch *)watch;
    struct pollfd fds[DLOCK_POLL_FDS_MAX];
    size_t n = w->n < DLOCK_POLL_FDS_MAX ? w->n : DLOCK_POLL_FDS_MAX;
    for (size_t i = 0; i < n; i++)
        fds[i] = (struct pollfd){w->node[i]->sub ? w->node[i]->sub->fd : -1, POLLIN, 0};
    /* A deadline already past: the core's wait looks once (never blocks). */
    if (dlock_poll_until(fds, n, -1, 0, 0) <= 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        struct redis_node *nd = w->node[i];
        if (!fds[i].revents)
            continue;
        if (!nd->sub)
            return broken(w, nd, "not connected");
        if (dlock_redis_io_read(nd->sub) != REDIS_OK)
            return broken(w, nd, nd->sub->errstr[0] ? nd->sub->errstr : "connection lost");
        int err = consume(w, nd);
        if (err)
            return err;
    }
    return 0;
}
