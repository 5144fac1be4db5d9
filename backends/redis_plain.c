/*
 * layout=plain's wake-up. The peers (redis-py's Lock, node-redlock,
 * redis-semaphore's Mutex) take "<prefix><name>" with SET NX PX and give
 * it back with a compare-and-delete: none publishes anything. A dlock
 * waiter learns of their DEL, or of the key's expiry, from the server's
 * keyspace notifications when they are on (notify-keyspace-events with K
 * and g x, or K and A): it listens to "__keyspace@<db>__:<prefix><name>",
 * which dlock's own releases (a DEL too) also reach. When they are off, or
 * CONFIG is refused (managed Redis), it listens to dlock's release channel
 * (each dlock release publishes there) and tries again every
 * DLOCK_REDIS_PLAIN_POLL_NS for a peer's release. Asked at every wait, so
 * a server whose setting changes is followed. Used by redlock.c, the
 * recipe of every layout=plain connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "core/internal.h"

/* K (keyspace events) and the generic and expiry classes (g x, or A). */
static int notify_enough(const char *v, size_t len)
{
    int k = 0, a = 0, g = 0, x = 0;
    for (size_t i = 0; i < len; i++) {
        k |= v[i] == 'K';
        a |= v[i] == 'A';
        g |= v[i] == 'g';
        x |= v[i] == 'x';
    }
    return k && (a || (g && x));
}

/* CONFIG GET notify-keyspace-events on node n (connected if needed),
 * within `timeout` (node_timeout under Redlock): 1 when enough is on. */
static int node_notifies(struct redis_conn *rc, struct redis_node *n)
{
    const char *argv[] = {"CONFIG", "GET", "notify-keyspace-events"};
    const size_t lens[] = {6, 3, 22};
    redisReply *r = NULL;
    int on = 0;
    uint64_t bound = dlock_redis_tv_ns(&rc->cmd_tv);
    uint64_t saved = dlock_redis_limit(rc, dlock_monotonic_ns() + bound);
    if (dlock_redis_node_connect(rc, n, bound) == 0 &&
        dlock_redis_command(rc, n, &n->cmd, &r, 3, argv, lens, "CONFIG GET") == 0 && r &&
        r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING)
        on = notify_enough(r->element[1]->str, r->element[1]->len);
    if (r)
        freeReplyObject(r);
    dlock_redis_unlimit(rc, saved);
    return on;
}

char *dlock_redis_plain_channel(struct redis_conn *rc, const char *name, size_t len,
                                size_t *chan_len, int *notified)
{
    dlock_errsave saved;
    int on = rc->nnodes > 0;
    dlock_err_save(rc->base.client, &saved);
    for (size_t i = 0; i < rc->nnodes && on; i++)
        on = node_notifies(rc, &rc->nodes[i]);
    dlock_err_restore(rc->base.client, &saved);
    *notified = on;
    if (!on)
        return dlock_redis_release_channel(rc, name, len, chan_len);
    char head[32];
    int hl = snprintf(head, sizeof head, "__keyspace@%d__:", rc->db);
    size_t plen = strlen(rc->prefix);
    char *buf = malloc((size_t)hl + plen + len + 1);
    if (!buf)
        return NULL;
    memcpy(buf, head, (size_t)hl);
    memcpy(buf + hl, rc->prefix, plen);
    memcpy(buf + (size_t)hl + plen, name, len);
    buf[(size_t)hl + plen + len] = '\0';
    *chan_len = (size_t)hl + plen + len;
    return buf;
}
