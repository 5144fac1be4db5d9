/*
 * redis+cluster://[user:password@]host:port[,host:port...][/0][?options]:
 * Redis Cluster, from seed nodes (any of its nodes; one answering is
 * enough). The lock operations are the single instance's (redis_lock.c), run
 * on the primary that owns the lock's hash slot; this file keeps the slot map
 * and sends each call where it belongs.
 *
 * One slot per lock: every key of a name (":lock", ":fence", ":queue",
 * ":raised"), the floor key its grants read, and every wait's wake-up
 * channel carry the hash tag "{T}" right after the prefix, where T is a
 * short string whose own slot is the slot of the name, CRC16(name) mod
 * 16384 (dlock_redis_slot_tag()): "dlock:{T}orders:lock". So the whole
 * script of an operation runs on one shard, whatever bytes the name holds
 * (a name with braces in it cannot split its keys), and the store-wide
 * floor is one key per slot, "<prefix>{T}floor", read by each grant on its
 * own shard. Wake-ups are sharded pub/sub (SSUBSCRIBE, and SPUBLISH inside
 * the script, redis_script.h): a handoff's message stays on the shard that
 * owns the lock, never broadcast over the cluster bus.
 *
 * The map: CLUSTER SLOTS, read at open from the first seed that answers,
 * and again when it is known to be stale: a MOVED reply (the slot's new
 * owner is used at once, the rest of the map is read before the next
 * call), a node that cannot be reached (a failover may be under way), an
 * unsolicited SUNSUBSCRIBE (the node lost our channel's slot). ASK (a slot
 * being migrated, the key already moved) sends that one call to the
 * target, after ASKING, without touching the map; TRYAGAIN (a multi-key
 * call while the slot's keys are split between the two nodes) and
 * CLUSTERDOWN are tried again every REDIRECT_PAUSE_NS; at most MAX_HOPS
 * directions per call, all within the call's bound. Nodes are kept for the
 * connection's life (pointers to them stay valid), up to
 * REDIS_CLUSTER_MAX_NODES.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "core/internal.h"

#define MS 1000000ull
#define NO_NODE UINT16_MAX
/* Directions followed by one call: a slot moved twice while we asked is
 * possible, a loop between nodes that disagree is not worth more. */
#define MAX_HOPS 16
#define REDIRECT_PAUSE_NS (10 * MS)

struct redis_cluster {
    uint16_t owner[REDIS_SLOTS]; /* index into rc->nodes, or NO_NODE */
    int stale;                   /* read the map again before the next use */
    const uint16_t *filling;     /* the map being read, while it is */
    size_t ask_next;             /* the node to ask for the map first */
};

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
}

static const struct redis_topology cluster_topology;

int dlock_redis_cluster_open(struct redis_conn *rc)
{
    if (!(rc->cluster = calloc(1, sizeof *rc->cluster)))
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < REDIS_SLOTS; i++)
        rc->cluster->owner[i] = NO_NODE;
    rc->cluster->stale = 1;
    dlock_redis_slot_tag(0); /* the tags, built once per process */
    rc->topo = &cluster_topology;
    return 0;
}

void dlock_redis_cluster_free(struct redis_cluster *c)
{
    free(c);
}

void dlock_redis_cluster_stale(struct redis_conn *rc)
{
    if (rc->cluster)
        rc->cluster->stale = 1;
}

/* A node that may be forgotten to make room (a long-lived client of a
 * cluster whose nodes come and go at new addresses): not a seed, no socket
 * open, owning no slot in the map, not the last node used. SIZE_MAX if
 * none. Its entry is reused in place, so pointers to nodes stay valid. */
static size_t unused_node(struct redis_conn *rc)
{
    unsigned char owns[REDIS_CLUSTER_MAX_NODES] = {0};
    const uint16_t *fill = rc->cluster->filling;
    for (size_t s = 0; s < REDIS_SLOTS; s++) {
        if (rc->cluster->owner[s] != NO_NODE)
            owns[rc->cluster->owner[s]] = 1;
        if (fill && fill[s] != NO_NODE)
            owns[fill[s]] = 1;
    }
    for (size_t i = rc->nseeds; i < rc->nnodes; i++) {
        struct redis_node *n = &rc->nodes[i];
        if (!owns[i] && !n->cmd && !n->sub && n != rc->last_node)
            return i;
    }
    return SIZE_MAX;
}

/* The node host:port (host_len bytes), added if new; its index, or -1
 * (out of memory, or REDIS_CLUSTER_MAX_NODES known). */
static int node_index(struct redis_conn *rc, const char *host, size_t host_len, int port)
{
    for (size_t i = 0; i < rc->nnodes; i++)
        if (rc->nodes[i].port == port && strlen(rc->nodes[i].host) == host_len &&
            memcmp(rc->nodes[i].host, host, host_len) == 0)
            return (int)i;
    size_t i = rc->nnodes;
    if (i >= REDIS_CLUSTER_MAX_NODES && (i = unused_node(rc)) == SIZE_MAX) {
        dlock_seterr(cl(rc), DLOCK_ESTORE,
                     "redis cluster: more than %d nodes named, all of them in use",
                     REDIS_CLUSTER_MAX_NODES);
        return -1;
    }
    struct redis_node *n = &rc->nodes[i];
    char *h = strndup(host, host_len);
    if (!h) {
        dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
        return -1;
    }
    free(n->host); /* a node reused: no socket, no slot */
    memset(n, 0, sizeof *n);
    n->host = h;
    n->port = port;
    if (i == rc->nnodes)
        rc->nnodes++;
    return (int)i;
}

struct slots_fill {
    struct redis_conn *rc;
    struct redis_node *asked;
    uint16_t *owner;
    size_t ranges;
    int err; /* node_index() failed: its error */
};

static int fill_range(void *arg, unsigned first, unsigned last, const char *host,
                      size_t host_len, int port)
{
    struct slots_fill *f = arg;
    if (host_len == 0) { /* the node does not know its address: the one asked */
        host = f->asked->host;
        host_len = strlen(host);
    }
    int idx = node_index(f->rc, host, host_len, port);
    if (idx < 0) {
        dlock_errsave why;
        dlock_err_save(cl(f->rc), &why);
        f->err = why.err ? why.err : DLOCK_ESTORE;
        return -1;
    }
    for (unsigned s = first; s <= last; s++)
        f->owner[s] = (uint16_t)idx;
    f->ranges++;
    return 0;
}

/* CLUSTER SLOTS from node n, into the map. */
static int read_map(struct redis_conn *rc, struct redis_node *n)
{
    redisReply *r = NULL;
    int err = dlock_redis_node_connect(rc, n, dlock_redis_tv_ns(&rc->connect_tv));
    if (err)
        return err;
    err = dlock_redis_command(rc, n, &n->cmd, &r, 2, (const char *[]){"CLUSTER", "SLOTS"},
                              (size_t[]){7, 5}, "CLUSTER SLOTS");
    if (err) {
        dlock_errsave why;
        dlock_err_save(cl(rc), &why);
        if (err == DLOCK_ESTORE && strstr(why.msg, "cluster support disabled"))
            return dlock_seterr(cl(rc), DLOCK_ESTORE,
                                "redis %s:%d is not a cluster node (cluster support disabled): "
                                "use redis:// for a single Redis",
                                n->host, n->port);
        return err;
    }
    uint16_t *owner = malloc(sizeof rc->cluster->owner);
    if (!owner) {
        freeReplyObject(r);
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < REDIS_SLOTS; i++)
        owner[i] = NO_NODE;
    struct slots_fill f = {rc, n, owner, 0, 0};
    rc->cluster->filling = owner;
    int bad = dlock_redis_reply_slots(r, fill_range, &f);
    rc->cluster->filling = NULL;
    freeReplyObject(r);
    if (bad || f.ranges == 0) {
        free(owner);
        if (f.err)
            return f.err;
        return dlock_seterr(cl(rc), DLOCK_EPROTO,
                            "redis %s:%d: CLUSTER SLOTS names no slot owner (is the cluster "
                            "formed?)",
                            n->host, n->port);
    }
    memcpy(rc->cluster->owner, owner, sizeof rc->cluster->owner);
    free(owner);
    rc->cluster->stale = 0;
    return 0;
}

/* A node that failed (no answer, a reset) is asked for the map only
 * after the others, for this long. */
#define NODE_PENALTY_NS (1000 * MS)

void dlock_redis_cluster_failed(struct redis_conn *rc, struct redis_node *n)
{
    (void)rc;
    n->retry_at = dlock_monotonic_ns() + NODE_PENALTY_NS;
}

/* Reads the map from the first node that answers, starting with the one
 * that answered last time; nodes that failed lately go last. Each node
 * gets at most half of what is left of the call's bound while others
 * remain, so that one silent node (a paused primary) cannot use it all. */
static int refresh(struct redis_conn *rc)
{
    struct redis_cluster *c = rc->cluster;
    dlock_errsave first = {0, ""};
    size_t known = rc->nnodes, tried = 0;
    uint64_t now = dlock_monotonic_ns();
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < known; k++) {
            size_t i = (c->ask_next + k) % known;
            struct redis_node *n = &rc->nodes[i];
            if ((n->retry_at > now) != (pass == 1))
                continue;
            uint64_t saved = rc->deadline_ns;
            if (rc->deadline_ns) {
                uint64_t t = dlock_monotonic_ns();
                uint64_t left = rc->deadline_ns > t ? rc->deadline_ns - t : 0;
                dlock_redis_limit(rc, t + (++tried < known ? left / 2 : left));
            }
            int err = read_map(rc, n);
            dlock_redis_unlimit(rc, saved);
            if (err == 0) {
                c->ask_next = i;
                n->retry_at = 0;
                dlock_clearerr(cl(rc));
                return 0;
            }
            if (err == DLOCK_EAUTH || err == DLOCK_ENOMEM || err == DLOCK_ENOTSUP)
                return err;
            if (err != DLOCK_ESTORE)
                dlock_redis_cluster_failed(rc, n);
            if (!first.err)
                dlock_err_save(cl(rc), &first);
            if (rc->deadline_ns && dlock_monotonic_ns() >= rc->deadline_ns)
                goto out;
        }
    }
out:
    if (first.err)
        dlock_err_restore(cl(rc), &first);
    return first.err ? first.err
                     : dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis cluster: no node known");
}

struct redis_node *dlock_redis_cluster_node(struct redis_conn *rc, unsigned slot, int *errp)
{
    struct redis_cluster *c = rc->cluster;
    slot &= REDIS_SLOTS - 1;
    if (c->stale || c->owner[slot] == NO_NODE) {
        int err = refresh(rc);
        /* A map we could not read again is still the best guess. */
        if (err && c->owner[slot] == NO_NODE) {
            *errp = err;
            return NULL;
        }
        if (!err && c->owner[slot] == NO_NODE) {
            *errp = dlock_seterr(cl(rc), DLOCK_ESTORE,
                                 "redis cluster: no node serves hash slot %u (CLUSTERDOWN?)",
                                 slot);
            return NULL;
        }
    }
    return &rc->nodes[c->owner[slot]];
}

struct redis_node *dlock_redis_cluster_peek(struct redis_conn *rc, unsigned slot)
{
    uint16_t i = rc->cluster->owner[slot & (REDIS_SLOTS - 1)];
    return i == NO_NODE ? NULL : &rc->nodes[i];
}

/* Sleeps REDIRECT_PAUSE_NS if rc's bound leaves time for it and one more
 * try; 0, or -1 when it does not. */
static int pause_for_retry(struct redis_conn *rc)
{
    if (rc->deadline_ns && dlock_monotonic_ns() + REDIRECT_PAUSE_NS + MS >= rc->deadline_ns)
        return -1;
    struct timespec ts;
    dlock_ns_to_timespec(REDIRECT_PAUSE_NS, &ts);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    return 0;
}

/* A MOVED or ASK answer d from node asked: the node it names (added if
 * new); a MOVED also reads the map again and sets the slot's owner. NULL
 * with the error set when the node cannot be added. */
static struct redis_node *moved(struct redis_conn *rc, const struct redis_redirect *d,
                                struct redis_node *asked)
{
    const char *host = d->host[0] ? d->host : asked->host;
    int idx = node_index(rc, host, strlen(host), d->port);
    if (idx < 0)
        return NULL;
    if (d->kind == REDIS_REDIR_MOVED) {
        /* The rest of the map now (a MOVED seldom comes alone), and this
         * slot as the node that gave it up says, even if the node asked
         * for the map has not heard yet. */
        refresh(rc);
        dlock_clearerr(cl(rc));
        rc->cluster->owner[d->slot] = (uint16_t)idx;
    }
    return &rc->nodes[idx];
}

/* The connection layer's hooks: a subscription refused with MOVED or ASK
 * (the map stale, a MOVED's new owner learnt), or another sign that the
 * map is stale. */
static void redirected(struct redis_conn *rc, const struct redis_redirect *d,
                       struct redis_node *asked)
{
    moved(rc, d, asked);
}

static const struct redis_topology cluster_topology = {
    .redirected = redirected,
    .stale = dlock_redis_cluster_stale,
};

int dlock_redis_cluster_script(struct redis_conn *rc, unsigned slot, size_t argc,
                               const char **argv, const size_t *argvlen, redisReply **out)
{
    struct redis_redirect d;
    struct redis_node *ask = NULL;
    int hop = 0;
    slot &= REDIS_SLOTS - 1;
    for (;;) {
        struct redis_node *to = ask;
        int err = 0;
        if (!to && !(to = dlock_redis_cluster_node(rc, slot, &err)))
            return err;
        err = dlock_redis_script_asking(rc, to, ask != NULL, argc, argv, argvlen, out, &d);
        ask = NULL;
        if (err != REDIS_REDIRECTED) {
            if (err == 0) {
                rc->last_node = to;
            } else if (err == DLOCK_ECONNECT) {
                /* The node may be gone or silent: a failover. */
                rc->cluster->stale = 1;
                dlock_redis_cluster_failed(rc, to);
            }
            return err;
        }
        /* MOVED and ASK count; TRYAGAIN and CLUSTERDOWN are bounded by
         * the call's bound alone (a migration may take a while). */
        if ((d.kind == REDIS_REDIR_MOVED || d.kind == REDIS_REDIR_ASK) && ++hop > MAX_HOPS)
            return dlock_seterr(cl(rc), DLOCK_ESTORE,
                                "redis cluster: hash slot %u: redirected %d times (the cluster "
                                "is being reconfigured?)",
                                slot, hop);
        if (d.kind == REDIS_REDIR_MOVED || d.kind == REDIS_REDIR_ASK) {
            struct redis_node *m = moved(rc, &d, to);
            if (!m) {
                dlock_errsave why;
                dlock_err_save(cl(rc), &why);
                return why.err ? why.err : DLOCK_ESTORE;
            }
            if (d.kind == REDIS_REDIR_ASK)
                ask = m;
            continue;
        }
        /* TRYAGAIN (the slot's keys are split by a migration in progress)
         * or CLUSTERDOWN (no majority, or the slot unserved): a moment. */
        if (d.kind == REDIS_REDIR_DOWN)
            rc->cluster->stale = 1;
        hop = 0; /* progress here is bounded by time, not by hops */
        /* The store is there but cannot serve the slot now: a transient
         * failure like a lost connection (the acquire's deadline, if any,
         * is the caller's to report). */
        if (pause_for_retry(rc) != 0)
            return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                                "redis cluster: hash slot %u: %s until the call's bound passed",
                                slot,
                                d.kind == REDIS_REDIR_DOWN
                                    ? "the cluster was down (CLUSTERDOWN)"
                                    : "the slot was being migrated (TRYAGAIN)");
    }
}

int dlock_redis_cluster_primaries(struct redis_conn *rc, struct redis_node **out)
{
    struct redis_cluster *c = rc->cluster;
    unsigned char seen[REDIS_CLUSTER_MAX_NODES] = {0};
    int n = 0;
    if (c->stale) {
        int err = refresh(rc);
        if (err)
            return err;
    }
    for (size_t s = 0; s < REDIS_SLOTS; s++) {
        uint16_t i = c->owner[s];
        if (i != NO_NODE && !seen[i]) {
            seen[i] = 1;
            out[n++] = &rc->nodes[i];
        }
    }
    if (n == 0)
        return dlock_seterr(cl(rc), DLOCK_ESTORE, "redis cluster: no node serves any slot");
    return n;
}
