/*
 * redis://[user:password@]host[:port][/db][?options]: one Redis.
 * redis://h1:p1,h2:p2,h3:p3[/db]: Redlock over independent instances
 * (backends/redlock.c).
 * redis+cluster://seeds: Redis Cluster, each lock on the shard of its
 * slot (backends/redis_cluster.c); redis+sentinel://sentinels/SERVICE: the
 * primary the sentinels name (backends/redis_sentinel.c). Both run the
 * single-instance recipe (backends/redis_lock.c) on the node they pick;
 * wait_replicas=N makes each grant wait for N replicas (its
 * confirm_grant()).
 * layout=plain (docs/redis.md, "Peer layout: plain"): the peers' plain key
 * "<prefix><name>" (redis-py, node-redlock, redis-semaphore), run by
 * Redlock's recipe over one Redis, a Sentinel's primary or Redlock's
 * instances; refused on a Cluster.
 *
 * This file is the front: the method table, and open and close, which
 * read the URI, pick the topology (its hooks into the connection layer,
 * set by dlock_redis_cluster_open() and dlock_redis_sentinel_open()) and
 * the recipe (struct redis_recipe: the single instance's or Redlock's),
 * and make the keeper's connection. The files, each calling only those
 * below it:
 *   redis.c            the front
 *   redis_lock.c       single-instance recipe   redlock.c  Redlock recipe
 *   redis_elect.c      an election's watch (subscriber connections)
 *   redis_floor.c      store-wide token_top, raise_floor (one Redis, Cluster)
 *   redis_plain.c      layout=plain's wake-up channel (for redlock.c)
 *   redis_cluster.c    slot map, redirects      redis_sentinel.c  the primary
 *   redis_conn.c       connections, send/receive, bounds, subscriptions
 *   redis_keys.c       key and channel names, slots     redis_reply.c  replies
 * and their shared types in redis_conn.h.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "backends/redis_script.h"
#include "core/internal.h"

#define DEFAULT_PORT 6379
#define DEFAULT_CONNECT_MS 2000
#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_NODE_TIMEOUT_MS 100
#define tv_ns dlock_redis_tv_ns
/* layout=plain: exclusive locks, not FIFO (the peers barge), no shared
 * mode or semaphore (the peers have none); raise_token, token_top and
 * raise_floor on dlock's counters and floor under "dlock:". */
#define PLAIN_CAPS (DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_BLOCKING | \
                    DLOCK_CAP_DEADLINE | DLOCK_CAP_CANCEL | DLOCK_CAP_RAISE)

/* rediss: the same over TLS (backends/redis_io.c). */
static const char *const redis_schemes[] = {"redis",  "redis+cluster",  "redis+sentinel",
                                            "rediss", "rediss+cluster", "rediss+sentinel",
                                            NULL};
static const char *const redis_options[] = {
    "connect_timeout", "timeout", "prefix", "node_timeout", "allow_eviction", "wait_replicas",
    "sentinel_user", "sentinel_password", "layout", "cacert", "cert", "key", "tls_verify", NULL,
};

static void ms_to_tv(uint64_t ms, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)(ms % 1000) * 1000;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void free_sockets(struct redis_conn *rc)
{
    for (size_t i = 0; rc->nodes && i < rc->nnodes; i++) {
        if (rc->nodes[i].cmd)
            dlock_redis_io_free(rc->nodes[i].cmd);
        if (rc->nodes[i].sub)
            dlock_redis_io_free(rc->nodes[i].sub);
    }
}

static void set_mode(struct redis_conn *rc, enum redis_mode mode)
{
    rc->mode = mode;
    rc->lua = mode == REDIS_CLUSTER ? dlock_redis_lua_sharded : dlock_redis_lua;
    rc->lua_len = mode == REDIS_CLUSTER ? sizeof dlock_redis_lua_sharded - 1
                                        : sizeof dlock_redis_lua - 1;
    /* layout=plain: no queue to hand over, as under Redlock (the peers
     * barge): Redlock's recipe, over one node or several. */
    rc->recipe = mode == REDIS_REDLOCK || rc->plain ? &dlock_redlock_recipe
                                                     : &dlock_redis_single_recipe;
}

/* Room for the nodes of a connection: a cluster's grows as nodes are
 * learnt, in place (pointers to nodes stay valid). */
static size_t nodes_cap(enum redis_mode mode, size_t n)
{
    return mode == REDIS_CLUSTER && n < REDIS_CLUSTER_MAX_NODES ? REDIS_CLUSTER_MAX_NODES : n;
}

/* The keeper's connection: a copy of rc's settings with sockets and node
 * addresses of its own (a cluster's keeper learns its own map from the
 * seeds; a Sentinel keeper asks the sentinels itself), borrowing rc's
 * other strings. Nothing is connected until used. */
static struct redis_conn *keeper_conn_new(struct redis_conn *rc)
{
    /* The parent's seeds never change; the nodes it learnt after them
     * are the parent thread's. */
    size_t n = rc->mode == REDIS_CLUSTER ? rc->nseeds : rc->nnodes;
    struct redis_conn *kc = calloc(1, sizeof *kc);
    if (!kc || !(kc->nodes = calloc(nodes_cap(rc->mode, n), sizeof *kc->nodes))) {
        free(kc);
        return NULL;
    }
    kc->base = rc->base;
    kc->cancel_fd = -1;
    kc->parent = rc;
    kc->user = rc->user;
    kc->password = rc->password;
    kc->prefix = rc->prefix;
    kc->db = rc->db;
    kc->allow_eviction = rc->allow_eviction;
    kc->connect_tv = rc->connect_tv;
    kc->cmd_tv = rc->cmd_tv;
    kc->wait_replicas = rc->wait_replicas;
    kc->plain = rc->plain;
    kc->sentinel = rc->sentinel;
    kc->tls = rc->tls;
    kc->topo = rc->topo; /* a cluster's: set again by its own map below */
    set_mode(kc, rc->mode);
    kc->nnodes = kc->nseeds = n;
    /* Sentinel: the primary is asked for again (the parent's address may
     * be changing on its own thread). */
    for (size_t i = 0; i < n && rc->mode != REDIS_SENTINEL; i++) {
        kc->nodes[i].port = rc->nodes[i].port;
        if (!(kc->nodes[i].host = strdup(rc->nodes[i].host)))
            goto fail;
    }
    if (rc->mode == REDIS_CLUSTER && dlock_redis_cluster_open(kc) != 0)
        goto fail;
    return kc;
fail:
    for (size_t i = 0; i < n; i++)
        free(kc->nodes[i].host);
    free(kc->nodes);
    free(kc);
    return NULL;
}

static void free_nodes(struct redis_conn *rc)
{
    free_sockets(rc);
    for (size_t i = 0; rc->nodes && i < rc->nnodes; i++)
        free(rc->nodes[i].host);
    free(rc->nodes);
    dlock_redis_cluster_free(rc->cluster);
}

static void redis_close(dlock_conn *conn)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    /* The core never runs keep() during or after close: the keeper's
     * thread is gone, and so is any use of rc->keeper. */
    if (rc->keeper) {
        free_nodes(rc->keeper);
        free(rc->keeper);
    }
    free_nodes(rc);
    dlock_redis_sentinel_free(rc->sentinel);
    dlock_redis_tls_free(rc->tls);
    if (rc->password)
        explicit_bzero(rc->password, strlen(rc->password));
    free(rc->user);
    free(rc->password);
    free(rc->prefix);
    free(rc);
}

static int parse_options(dlock_client *c, const dlock_uri *uri, struct redis_conn *rc)
{
    uint64_t connect_ms = DEFAULT_CONNECT_MS, timeout_ms = DEFAULT_TIMEOUT_MS;
    uint64_t node_ms = DEFAULT_NODE_TIMEOUT_MS, replicas = 0;
    const char *path = dlock_uri_path(uri), *prefix = dlock_uri_param(uri, "prefix");
    int err, layout = 0;
    if ((err = dlock_uri_param_choice(c, uri, "layout", (const char *[]){"dlock", "plain", NULL},
                                      &layout)) ||
        (err = dlock_uri_param_uint(c, uri, "connect_timeout", 1, 3600000, &connect_ms)) ||
        (err = dlock_uri_param_uint(c, uri, "timeout", 1, 3600000, &timeout_ms)) ||
        (err = dlock_uri_param_uint(c, uri, "node_timeout", 1, 60000, &node_ms)) ||
        (err = dlock_uri_param_uint(c, uri, "wait_replicas", 0, 1000, &replicas)) ||
        (err = dlock_uri_param_bool(c, uri, "allow_eviction", &rc->allow_eviction)))
        return err;
    if (rc->mode != REDIS_SENTINEL &&
        (dlock_uri_param(uri, "sentinel_user") || dlock_uri_param(uri, "sentinel_password")))
        return dlock_seterr(c, DLOCK_EBADURI,
                            "sentinel_user and sentinel_password are options of "
                            "redis+sentinel:// URIs");
    if (replicas && rc->mode == REDIS_REDLOCK)
        return dlock_seterr(c, DLOCK_EBADURI,
                            "wait_replicas is not an option of Redlock (several hosts in a "
                            "redis:// URI): its instances are independent, not replicated");
    rc->wait_replicas = (unsigned)replicas;
    if (layout == 1 && rc->mode == REDIS_CLUSTER)
        return dlock_seterr(c, DLOCK_ENOTSUP,
                            "layout=plain is not available on redis+cluster:// (dlock's keys "
                            "beside a peer's key need not share its slot); use redis:// on "
                            "one node, redis+sentinel://, or Redlock");
    if (layout == 1 && replicas)
        return dlock_seterr(c, DLOCK_EBADURI,
                            "wait_replicas is not an option of layout=plain");
    rc->plain = layout == 1;
    set_mode(rc, rc->mode); /* the recipe follows the layout */
    if (rc->mode != REDIS_SENTINEL && path[0] && strcmp(path, "/") != 0) {
        char *end;
        long db = strtol(path + 1, &end, 10);
        if (*end || path[1] < '0' || path[1] > '9' || db < 0 || db > 65535)
            return dlock_seterr(c, DLOCK_EBADURI,
                                "the path of a redis:// URI is a database number, as in /0");
        if (db != 0 && rc->mode == REDIS_CLUSTER)
            return dlock_seterr(c, DLOCK_EBADURI,
                                "Redis Cluster has database 0 only; the path of a "
                                "redis+cluster:// URI may be /0 or nothing");
        rc->db = (int)db;
    }
    if (prefix && rc->mode == REDIS_CLUSTER && strpbrk(prefix, "{}"))
        return dlock_seterr(c, DLOCK_EBADURI,
                            "a redis+cluster:// prefix may not contain '{' or '}': dlock puts "
                            "the hash tag of each lock's slot right after it");
    ms_to_tv(connect_ms, &rc->connect_tv);
    ms_to_tv(timeout_ms, &rc->cmd_tv);
    if (rc->mode == REDIS_REDLOCK) /* Redlock: short per-node timeouts */
        ms_to_tv(node_ms, &rc->cmd_tv);
    /* layout=plain: the peers' own key, "<prefix><name>" ("jobs", as
     * redis-py's r.lock("jobs") takes it; prefix=mutex: for
     * redis-semaphore's Mutex). */
    rc->prefix = strdup(prefix ? prefix : rc->plain ? "" : "dlock:");
    return rc->prefix ? 0 : DLOCK_ENOMEM;
}

static int redis_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    struct redis_conn *rc;
    const char *scheme = dlock_uri_scheme(uri);
    size_t n = dlock_uri_host_count(uri);
    int tls = strncmp(scheme, "rediss", 6) == 0;
    const char *topo = scheme + 5 + tls; /* "", "+cluster" or "+sentinel" */
    enum redis_mode mode = strcmp(topo, "+cluster") == 0    ? REDIS_CLUSTER
                           : strcmp(topo, "+sentinel") == 0 ? REDIS_SENTINEL
                           : n > 1                          ? REDIS_REDLOCK
                                                            : REDIS_SINGLE;
    int err;

    if (n == 0)
        return dlock_seterr(c, DLOCK_EBADURI,
                            mode == REDIS_CLUSTER
                                ? "a redis+cluster:// URI needs seed nodes, as in "
                                  "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
                            : mode == REDIS_SENTINEL
                                ? "a redis+sentinel:// URI needs sentinels, as in "
                                  "redis+sentinel://127.0.0.1:26379/mymaster/0"
                                : "a redis:// URI needs a host, as in redis://127.0.0.1:6379/0");
    rc = calloc(1, sizeof *rc);
    /* Sentinel: one node, the primary, whose address is asked for. */
    size_t nn = mode == REDIS_SENTINEL ? 1 : n;
    if (!rc || !(rc->nodes = calloc(nodes_cap(mode, nn), sizeof *rc->nodes))) {
        free(rc);
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    }
    rc->base.client = c;
    rc->cancel_fd = -1;
    set_mode(rc, mode);
    rc->user = dup_or_null(dlock_uri_user(uri));
    rc->password = dup_or_null(dlock_uri_password(uri));
    if ((err = parse_options(c, uri, rc)) != 0 ||
        (err = dlock_redis_tls_open(c, uri, tls, &rc->tls)) != 0)
        goto fail;
    if (mode == REDIS_SENTINEL) {
        rc->nnodes = rc->nseeds = 1;
        if ((err = dlock_redis_sentinel_open(rc, uri)) != 0)
            goto fail;
        rc->base.caps = rc->plain ? PLAIN_CAPS : 0; /* 0: the backend's caps */
        if ((err = dlock_redis_node_connect(rc, &rc->nodes[0], tv_ns(&rc->connect_tv))) != 0)
            goto fail;
        *connp = &rc->base;
        return 0;
    }
    if (n > REDIS_CLUSTER_MAX_NODES) {
        err = dlock_seterr(c, DLOCK_EBADURI, "more than %d hosts in a redis URI",
                           REDIS_CLUSTER_MAX_NODES);
        goto fail;
    }
    if (mode == REDIS_CLUSTER && (err = dlock_redis_cluster_open(rc)) != 0)
        goto fail;
    for (size_t i = 0; i < n; i++, rc->nnodes++) {
        rc->nodes[i].host = strdup(dlock_uri_host(uri, i));
        rc->nodes[i].port = dlock_uri_port(uri, i) ? (int)dlock_uri_port(uri, i) : DEFAULT_PORT;
        if (!rc->nodes[i].host) {
            err = dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
            goto fail;
        }
    }
    rc->nseeds = n;
    if (mode == REDIS_CLUSTER) {
        /* The map, from the first seed that answers (with connect_timeout
         * as the bound of the whole). */
        struct redis_node *prim[REDIS_CLUSTER_MAX_NODES];
        uint64_t saved = dlock_redis_limit(rc, dlock_monotonic_ns() + tv_ns(&rc->connect_tv));
        int np = dlock_redis_cluster_primaries(rc, prim);
        dlock_redis_unlimit(rc, saved);
        if (np < 0) {
            err = np;
            goto fail;
        }
        rc->base.caps = 0;
    } else if (n == 1) {
        rc->base.caps = rc->plain ? PLAIN_CAPS : 0; /* 0: the backend's caps */
        /* connect_timeout bounds the connect and the handshake together. */
        if ((err = dlock_redis_node_connect(rc, &rc->nodes[0], tv_ns(&rc->connect_tv))) != 0)
            goto fail;
    } else {
        /* Redlock: nodes are contacted per operation; open needs a quorum. */
        size_t up = 0, need = n / 2 + 1;
        dlock_errsave first = {0, ""};
        /* Shared locks over a quorum, as exclusive ones (a writer's quorum
         * and a reader's meet on a node); no semaphore: N + 1 holders may
         * each find room on a quorum (docs/redis.md). */
        rc->base.caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING |
                        DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_RAISE |
                        DLOCK_CAP_CANCEL | DLOCK_CAP_SHARED | DLOCK_CAP_ELECTION |
                        DLOCK_CAP_WATCH;
        if (rc->plain)
            rc->base.caps = PLAIN_CAPS;
        for (size_t i = 0; i < n; i++) {
            err = dlock_redis_node_connect(rc, &rc->nodes[i], tv_ns(&rc->connect_tv));
            if (err == DLOCK_EAUTH || err == DLOCK_ESTORE)
                goto fail; /* the same on every node: say it as it is */
            if (err == 0)
                up++;
            else if (!first.err)
                dlock_err_save(c, &first);
            if (err)
                rc->nodes[i].retry_at = dlock_monotonic_ns() + 1000000000ull;
        }
        if (up < need) {
            err = dlock_seterr(c, DLOCK_ECONNECT,
                               "only %zu of %zu Redlock nodes answered, %zu needed for a "
                               "quorum (%.150s)",
                               up, n, need, first.msg);
            goto fail;
        }
        dlock_clearerr(c);
    }
    *connp = &rc->base;
    return 0;
fail:
    redis_close(&rc->base);
    return err;
}

_Static_assert(DLOCK_NAME_MAX < (1u << 13) && DLOCK_LIMIT_MAX <= 0xffffu,
              "struct redis_held's bit fields hold a name's length and a limit");

static struct redis_held *held_new(const dlock_request *req)
{
    struct redis_held *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    memcpy(h->owner, req->owner_hex, sizeof h->owner);
    h->ttl_ms = req->ttl_ms;
    h->name_len = (uint32_t)req->name_len;
    h->name = req->name;
    h->shared = req->mode == DLOCK_MODE_SHARED;
    h->limit = req->limit & 0xffffu; /* <= DLOCK_LIMIT_MAX: the core checks */
    return h;
}

static void held_free(struct redis_held *h)
{
    free(h);
}

static int redis_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_held *h = held_new(req);
    int err;
    if (!h)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    err = rc->recipe->acquire(rc, req, h);
    if (err) {
        held_free(h);
        return err;
    }
    *heldp = &h->base;
    return 0;
}

/* recipe's call on rc within the core's bound for it (dlock_call_deadline():
 * a keep's lease end, a lost lock's release), when it set one. */
static uint64_t core_limit(struct redis_conn *rc)
{
    uint64_t until = dlock_call_deadline();
    return until == DLOCK_POLL_FOREVER ? rc->deadline_ns : dlock_redis_limit(rc, until ? until : 1);
}

static int redis_release(dlock_conn *conn, dlock_held *held)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_held *h = (struct redis_held *)held;
    uint64_t saved = core_limit(rc);
    int err = rc->recipe->release(rc, h);
    dlock_redis_unlimit(rc, saved);
    held_free(h);
    return err;
}

static int redis_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    return rc->recipe->renew(rc, (struct redis_held *)held, ttl_ms);
}

/*
 * The keeper's renewal, on the keeper's own connection(s), made here at
 * the first call and never shared with the application's thread (see
 * keeper_conn_new()).
 */
static int redis_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    if (!rc->keeper && !(rc->keeper = keeper_conn_new(rc)))
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    uint64_t saved = core_limit(rc->keeper);
    int err = rc->recipe->keep(rc->keeper, (struct redis_held *)held, ttl_ms);
    dlock_redis_unlimit(rc->keeper, saved);
    return err;
}

static int redis_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    int err;
    if ((err = dlock_redis_floor_ok(rc, floor)) != 0)
        return err;
    return rc->recipe->raise(rc, (struct redis_held *)held, floor);
}

static int redis_token_top(dlock_conn *conn, uint64_t *top)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    return rc->recipe->top(rc, top);
}

static int redis_raise_floor(dlock_conn *conn, uint64_t floor)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    int err;
    if ((err = dlock_redis_floor_ok(rc, floor)) != 0)
        return err;
    return rc->recipe->raise_floor(rc, floor);
}

static int redis_ping(dlock_conn *conn)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_node *n = &rc->nodes[0];
    int err = 0;
    /* Redlock: a node still owed abandoned replies would answer with one. */
    for (size_t i = 0; i < rc->nnodes && n->stale; i++)
        n = &rc->nodes[i];
    if (n->stale)
        return dlock_seterr(conn->client, DLOCK_ECONNECT, "no Redlock node is ready to ping");
    uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
    /* Cluster: the owner of slot 0 (the map read again only if stale). */
    if (rc->mode == REDIS_CLUSTER) {
        if (!(n = dlock_redis_cluster_node(rc, 0, &err))) {
            dlock_redis_unlimit(rc, saved);
            return err;
        }
    }
    err = dlock_redis_node_connect(rc, n, tv_ns(&rc->connect_tv));
    if (!err)
        err = dlock_redis_command(rc, n, &n->cmd, NULL, 1, (const char *[]){"PING"}, (size_t[]){4}, "PING");
    dlock_redis_unlimit(rc, saved);
    return err;
}

static int redis_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    return rc->recipe->inspect(rc, name, len, info);
}

static int redis_inspect_holders(dlock_conn *conn, const char *name, size_t len,
                                 dlock_holder *holders, size_t capacity, size_t *count)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    return rc->recipe->holders(rc, name, len, holders, capacity, count);
}

/* Elections: the recipe's publish, leader and wake, and the watch
 * (redis_elect.c). layout=plain has none (its caps leave them out). */
static int redis_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    return rc->recipe->publish(rc, (struct redis_held *)held, value, len);
}

static int redis_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                        char *value, size_t *value_len)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    return rc->recipe->leader(rc, name, len, info, value, value_len);
}

/* After a release, within the core's bound of it (a lost lock's release:
 * the store may be silent). */
static int redis_wake(dlock_conn *conn, const char *name, size_t len)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    uint64_t saved = core_limit(rc);
    int err = rc->recipe->wake(rc, name, len);
    dlock_redis_unlimit(rc, saved);
    return err;
}

static int redis_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp)
{
    return dlock_redis_watch_open((struct redis_conn *)conn, name, len, watchp);
}

const dlock_backend dlock_redis_backend = {
    DLOCK_BACKEND_INIT,
    .name = "redis",
    .schemes = redis_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_RAISE | DLOCK_CAP_CANCEL |
            DLOCK_CAP_SHARED | DLOCK_CAP_SEMAPHORE | DLOCK_CAP_ELECTION | DLOCK_CAP_WATCH,
    .options = redis_options,
    .open = redis_open,
    .close = redis_close,
    .acquire = redis_acquire,
    .release = redis_release,
    .renew = redis_renew,
    .ping = redis_ping,
    .keep = redis_keep,
    .raise_token = redis_raise_token,
    .token_top = redis_token_top,
    .raise_floor = redis_raise_floor,
    .inspect = redis_inspect,
    .inspect_holders = redis_inspect_holders,
    .publish = redis_publish,
    .leader = redis_leader,
    .wake = redis_wake,
    .watch_open = redis_watch_open,
    .watch_fd = dlock_redis_watch_fd,
    .watch_read = dlock_redis_watch_read,
    .watch_close = dlock_redis_watch_close,
};
