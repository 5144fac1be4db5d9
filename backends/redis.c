/*
 * redis://[user:password@]host[:port][/db][?options]: one Redis.
 * redis://h1:p1,h2:p2,h3:p3[/db]: Redlock over independent instances
 * (backends/redlock.c).
 * redis+cluster://seeds: Redis Cluster, each lock on the shard of its
 * slot (backends/redis_cluster.c); redis+sentinel://sentinels/SERVICE: the
 * primary the sentinels name (backends/redis_sentinel.c). Both run this
 * file's single-instance operations on the node they pick; wait_replicas=N
 * makes each grant wait for N replicas (confirm_grant()).
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
 * Store-wide tokens (token_top, raise_floor): the floor lives in one key
 * per prefix, "<prefix>floor" (a plain integer string, no expiry: durable
 * as the fence counters are, by the server's persistence; missing means
 * 0). raise_floor is one script call (floor = max(floor, value)); every
 * grant reads the key in its own script call, as its fourth key, so its
 * token is > the floor with no extra round trip, only one more GET inside
 * the script. token_top is max(every "<prefix>*:fence" counter, the floor,
 * TIME in µs): a SCAN (COUNT 1000, the prefix's glob characters escaped)
 * and an MGET per page, then GET and TIME, each round trip bounded by
 * `timeout`: O(keys in the database) in all, an admin operation. Another
 * prefix that starts with this one ("dlock:" and "dlock:x:") is counted
 * too, which only raises the top. Redis Cluster: a floor key per slot,
 * "<prefix>{T}floor" in the slot of tag T, and every key of a name carries
 * its slot's tag (redis_cluster.c); raise_floor raises all 16384, pipelined
 * to their owners (cluster_raise_floor()).
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
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <hiredis/sds.h>

/* hiredis 1.0 renamed its sds functions hi_sds* (Debian's 0.14 has sds*). */
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
#define obuf_len hi_sdslen
#define obuf_clear hi_sdsclear
#else
#define obuf_len sdslen
#define obuf_clear sdsclear
#endif

#include "config.h"
#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "backends/redis_script.h"
#include "core/internal.h"
#include "core/sha256.h"

#define DEFAULT_PORT 6379
#define DEFAULT_CONNECT_MS 2000
#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_NODE_TIMEOUT_MS 100
#define MS 1000000ull
/* A waiter whose connection was reset (server restarted, CLIENT KILL)
 * tries to connect again every RECONNECT_PAUSE_NS, for up to `timeout`. */
#define RECONNECT_PAUSE_NS (50 * MS)
/* TCP keepalive on every connection: a peer that went silent (host down,
 * network cut) is noticed by an idle connection, such as a waiter's
 * subscriber, within IDLE + CNT * INTVL = 8 s. hiredis's own
 * redisEnableKeepAlive() would take 15 + 3 * 5 = 30 s. */
#define KEEPALIVE_IDLE_S 5
#define KEEPALIVE_INTVL_S 1
#define KEEPALIVE_CNT 3

static const char *const redis_schemes[] = {"redis", "redis+cluster", "redis+sentinel", NULL};
static const char *const redis_options[] = {
    "connect_timeout", "timeout", "prefix", "node_timeout", "allow_eviction", "wait_replicas",
    "sentinel_user", "sentinel_password", NULL,
};

static void ms_to_tv(uint64_t ms, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)(ms % 1000) * 1000;
}

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
}

uint64_t dlock_redis_tv_ns(const struct timeval *tv)
{
    return (uint64_t)tv->tv_sec * 1000000000u + (uint64_t)tv->tv_usec * 1000u;
}
#define tv_ns dlock_redis_tv_ns

static void ns_to_tv(uint64_t ns, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ns / 1000000000u);
    tv->tv_usec = (suseconds_t)(ns % 1000000000u / 1000u);
}

uint64_t dlock_redis_limit(struct redis_conn *rc, uint64_t until_ns)
{
    uint64_t saved = rc->deadline_ns;
    if (!saved || until_ns < saved)
        rc->deadline_ns = until_ns;
    return saved;
}

void dlock_redis_unlimit(struct redis_conn *rc, uint64_t saved)
{
    rc->deadline_ns = saved;
}

/* What is left of the connection's bound, capped at cap_ns; at least
 * 1 ms (0 would mean no limit to hiredis). cap_ns when there is none. */
uint64_t dlock_redis_time_left(struct redis_conn *rc, uint64_t cap_ns)
{
    uint64_t now = dlock_monotonic_ns(), left;
    if (!rc->deadline_ns)
        return cap_ns;
    left = rc->deadline_ns > now ? rc->deadline_ns - now : 0;
    if (left > cap_ns)
        left = cap_ns;
    return left < MS ? MS : left;
}

/* A socket timeout already set that is longer than a call's bound by at
 * most this much is kept: the call may overrun its bound by that. */
#define ARM_SLACK_NS MS

/* Where the timeouts last set on ctx are remembered; NULL if not known. */
static uint64_t *armed_slot(struct redis_conn *rc, const redisContext *ctx)
{
    for (size_t i = 0; i < rc->nnodes; i++) {
        if (rc->nodes[i].cmd == ctx)
            return &rc->nodes[i].armed[0];
        if (rc->nodes[i].sub == ctx)
            return &rc->nodes[i].armed[1];
    }
    return NULL;
}

/* Bounds the next reply (and write) by `timeout` and the call's bound. */
static void arm(struct redis_conn *rc, redisContext *ctx)
{
    struct timeval tv;
    uint64_t want = dlock_redis_time_left(rc, tv_ns(&rc->cmd_tv)), *armed = armed_slot(rc, ctx);
    if (armed && *armed >= want && *armed - want <= ARM_SLACK_NS)
        return;
    ns_to_tv(want, &tv);
    redisSetTimeout(ctx, tv);
    if (armed)
        *armed = want;
}

/*
 * Writes what hiredis buffered for ctx with send(MSG_NOSIGNAL), not
 * hiredis's write(2): a peer that closed gives EPIPE, never SIGPIPE, so
 * no signal mask changes around each command (four system calls each).
 * The socket's SO_SNDTIMEO bounds each send, as it bounds hiredis's.
 * Reading never raises SIGPIPE. Plain sockets only: hiredis's TLS (not
 * used by dlock) would need its own write path.
 */
static int send_buffered(redisContext *ctx)
{
    size_t len = obuf_len(ctx->obuf), off = 0;
    while (off < len) {
        ssize_t n = send(ctx->fd, ctx->obuf + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            ctx->err = REDIS_ERR_IO;
            snprintf(ctx->errstr, sizeof ctx->errstr, "%s", strerror(errno));
            return REDIS_ERR;
        }
        off += (size_t)n;
    }
    obuf_clear(ctx->obuf);
    return REDIS_OK;
}

redisReply *dlock_redis_call(struct redis_conn *rc, redisContext *ctx, size_t argc,
                             const char **argv, const size_t *argvlen)
{
    void *reply = NULL;
    if (dlock_redis_send(rc, ctx, argc, argv, argvlen) != REDIS_OK ||
        redisGetReply(ctx, &reply) != REDIS_OK)
        return NULL;
    return reply;
}

int dlock_redis_send(struct redis_conn *rc, redisContext *ctx, size_t argc, const char **argv,
                     const size_t *argvlen)
{
    if (redisAppendCommandArgv(ctx, (int)argc, argv, argvlen) != REDIS_OK)
        return REDIS_ERR;
    arm(rc, ctx);
    return send_buffered(ctx);
}

int dlock_redis_get_reply(struct redis_conn *rc, redisContext *ctx, void **reply)
{
    arm(rc, ctx);
    /* redisGetReply would write anything still buffered with write(2). */
    if (obuf_len(ctx->obuf) > 0 && send_buffered(ctx) != REDIS_OK)
        return REDIS_ERR;
    return redisGetReply(ctx, reply);
}

/* Errors are ignored: keepalive only shortens how long a dead peer goes
 * unnoticed; calls are bounded by their timeouts without it. */
static void keepalive(redisContext *ctx)
{
    int on = 1;
    setsockopt(ctx->fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
    int idle = KEEPALIVE_IDLE_S, intvl = KEEPALIVE_INTVL_S, cnt = KEEPALIVE_CNT;
    setsockopt(ctx->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(ctx->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(ctx->fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
#endif
}

int dlock_redis_keys(struct redis_conn *rc, const char *name, size_t len,
                     struct redis_keys *keys)
{
    /* The floor key has no name in it: "<prefix>floor". */
    static const char *const suffix[REDIS_NKEYS_ALL] = {":lock", ":fence", ":queue", "floor",
                                                        ":raised"};
    /* Cluster: "{T}" after the prefix, T the tag of the name's slot (so
     * the floor key too is in it). */
    char tag[8] = "";
    size_t plen = strlen(rc->prefix), tlen = 0, total = 0;
    char *p;
    keys->slot = 0;
    if (rc->mode == REDIS_CLUSTER) {
        keys->slot = dlock_redis_slot(name, len);
        tlen = (size_t)snprintf(tag, sizeof tag, "{%s}", dlock_redis_slot_tag(keys->slot));
    }
    for (int i = 0; i < REDIS_NKEYS_ALL; i++)
        total += plen + tlen + len + strlen(suffix[i]) + 1;
    p = keys->buf = total <= sizeof keys->small ? keys->small : malloc(total);
    if (!p)
        return DLOCK_ENOMEM;
    for (int i = 0; i < REDIS_NKEYS_ALL; i++) {
        size_t slen = strlen(suffix[i]), nlen = i == 3 ? 0 : len;
        keys->k[i] = p;
        memcpy(p, rc->prefix, plen);
        memcpy(p + plen, tag, tlen);
        memcpy(p + plen + tlen, name, nlen);
        memcpy(p + plen + tlen + nlen, suffix[i], slen + 1);
        keys->len[i] = plen + tlen + nlen + slen;
        p += keys->len[i] + 1;
    }
    return 0;
}

void dlock_redis_keys_free(struct redis_keys *keys)
{
    if (keys->buf != keys->small)
        free(keys->buf);
    keys->buf = NULL;
}

int dlock_redis_held_keys(struct redis_conn *rc, const struct redis_held *h,
                          struct redis_keys *keys)
{
    if (dlock_redis_keys(rc, h->name, h->name_len, keys) != 0)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    return 0;
}

int dlock_redis_ctx_error(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                          const char *what)
{
    redisContext *ctx = *ctxp;
    int code = DLOCK_ECONNECT;
    const char *why = "not connected";
    if (ctx && ctx->err == REDIS_ERR_PROTOCOL)
        code = DLOCK_EPROTO;
    else if (ctx && ctx->err == REDIS_ERR_OOM)
        code = DLOCK_ENOMEM;
    if (ctx) {
        why = ctx->errstr[0] ? ctx->errstr : "connection lost";
        /* hiredis reports its socket timeouts as EAGAIN. */
        if (ctx->err == REDIS_ERR_IO && (strstr(why, "temporarily unavailable") ||
                                         strstr(why, "would block")))
            why = "no reply in time (timeout)";
    }
    dlock_seterr(cl(rc), code, "redis %s:%d: %s: %s", n->host, n->port, what, why);
    if (ctx)
        redisFree(ctx);
    *ctxp = NULL;
    return code;
}

/* Maps an error reply; authentication failures get their own code. */
static int reply_error(struct redis_conn *rc, struct redis_node *n, redisReply *r,
                       const char *what)
{
    int code = dlock_redis_reply_error_kind(r) == DLOCK_REDIS_ERR_AUTH ? DLOCK_EAUTH : DLOCK_ESTORE;
    return dlock_seterr(cl(rc), code, "redis %s:%d: %s: %.120s", n->host, n->port, what, r->str);
}

int dlock_redis_command(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                        redisReply **out, size_t argc, const char **argv, const size_t *argvlen,
                        const char *what)
{
    redisReply *r = dlock_redis_call(rc, *ctxp, argc, argv, argvlen);
    if (!r)
        return dlock_redis_ctx_error(rc, n, ctxp, what);
    if (r->type == REDIS_REPLY_ERROR) {
        int code = reply_error(rc, n, r, what);
        freeReplyObject(r);
        return code;
    }
    if (out)
        *out = r;
    else
        freeReplyObject(r);
    return 0;
}

/* The INFO memory reply: refuses a maxmemory-policy that can evict dlock's
 * keys unless the URI allows it. A server that does not say (INFO denied
 * by an ACL or renamed, no such field) is accepted: dlock cannot tell. */
static int check_eviction(struct redis_conn *rc, struct redis_node *n, const redisReply *r)
{
    char policy[64];
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS)
        return 0;
    if (!dlock_redis_info_field(r->str, r->len, "maxmemory_policy", policy, sizeof policy) ||
        !dlock_redis_policy_evicts(policy))
        return 0;
    return dlock_seterr(cl(rc), DLOCK_ESTORE,
                        "redis %s:%d: maxmemory-policy is %s: the server may evict lock and "
                        "fence keys (a lock granted twice); set it to noeviction, or add "
                        "allow_eviction=1 to the URI to accept that",
                        n->host, n->port, policy);
}

/*
 * Connects and sets up a connection in one round trip: AUTH (or PING,
 * which reports NOAUTH on a server that wants a password), SELECT, and on a
 * command connection SCRIPT LOAD and INFO memory (in a cluster also COMMAND
 * INFO SSUBSCRIBE: sharded pub/sub needs Redis 7), pipelined. The TCP
 * connect and every reply share one bound, budget_ns from now (and rc's
 * bound): a server that accepts and never answers costs budget_ns, not a
 * `timeout` per command.
 */
int dlock_redis_connect_ctx(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                            uint64_t budget_ns, int cmd)
{
    struct timeval tv;
    const char *argv[6][3];
    size_t lens[6][3], argc[6], nc = 0;
    const char *what[6];
    char db[16];
    uint64_t until = dlock_monotonic_ns() + dlock_redis_time_left(rc, budget_ns);
    uint64_t saved = dlock_redis_limit(rc, until);
    int err = 0;

    /* Sentinel: where the primary is now, asked on every new connection. */
    if (rc->mode == REDIS_SENTINEL &&
        (err = dlock_redis_sentinel_resolve(rc, n, until - dlock_monotonic_ns())) != 0) {
        dlock_redis_unlimit(rc, saved);
        return err;
    }
    uint64_t now = dlock_monotonic_ns();
    ns_to_tv(until > now + MS ? until - now : MS, &tv);
    redisContext *ctx = redisConnectWithTimeout(n->host, n->port, tv);
    if (!ctx) {
        dlock_redis_unlimit(rc, saved);
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    }
    *ctxp = ctx;
    n->armed[ctxp == &n->sub] = 0; /* a new socket: nothing set on it yet */
    if (ctx->err) {
        err = dlock_redis_ctx_error(rc, n, ctxp, "cannot connect");
        goto out;
    }
    keepalive(ctx);
    argc[nc] = 0, what[nc] = rc->password ? "AUTH" : "PING";
    if (rc->password) {
        argv[nc][argc[nc]] = "AUTH", lens[nc][argc[nc]++] = 4;
        if (rc->user && rc->user[0]) /* Redis 6 ACL user */
            argv[nc][argc[nc]] = rc->user, lens[nc][argc[nc]++] = strlen(rc->user);
        argv[nc][argc[nc]] = rc->password, lens[nc][argc[nc]++] = strlen(rc->password);
    } else {
        argv[nc][argc[nc]] = "PING", lens[nc][argc[nc]++] = 4;
    }
    nc++;
    if (rc->db != 0) {
        snprintf(db, sizeof db, "%d", rc->db);
        argv[nc][0] = "SELECT", lens[nc][0] = 6;
        argv[nc][1] = db, lens[nc][1] = strlen(db);
        argc[nc] = 2, what[nc++] = "SELECT";
    }
    if (rc->mode == REDIS_SENTINEL) { /* the sentinels may lag a failover */
        argv[nc][0] = "ROLE", lens[nc][0] = 4;
        argc[nc] = 1, what[nc++] = "ROLE";
    }
    if (cmd) {
        argv[nc][0] = "SCRIPT", lens[nc][0] = 6;
        argv[nc][1] = "LOAD", lens[nc][1] = 4;
        argv[nc][2] = rc->lua, lens[nc][2] = rc->lua_len;
        argc[nc] = 3, what[nc++] = "SCRIPT LOAD";
        if (!rc->allow_eviction) {
            argv[nc][0] = "INFO", lens[nc][0] = 4;
            argv[nc][1] = "memory", lens[nc][1] = 6;
            argc[nc] = 2, what[nc++] = "INFO";
        }
        if (rc->mode == REDIS_CLUSTER) { /* sharded pub/sub: Redis 7.0 */
            argv[nc][0] = "COMMAND", lens[nc][0] = 7;
            argv[nc][1] = "INFO", lens[nc][1] = 4;
            argv[nc][2] = "SSUBSCRIBE", lens[nc][2] = 10;
            argc[nc] = 3, what[nc++] = "COMMAND INFO";
        }
    }
    for (size_t i = 0; i < nc; i++)
        if (redisAppendCommandArgv(ctx, (int)argc[i], argv[i], lens[i]) != REDIS_OK) {
            err = dlock_redis_ctx_error(rc, n, ctxp, what[i]);
            goto out;
        }
    for (size_t i = 0; i < nc && !err; i++) {
        void *v = NULL;
        if (dlock_redis_get_reply(rc, ctx, &v) != REDIS_OK || !v) {
            err = dlock_redis_ctx_error(rc, n, ctxp, what[i]);
            goto out;
        }
        redisReply *r = v;
        if (strcmp(what[i], "INFO") == 0)
            err = check_eviction(rc, n, r); /* an error reply: the server does not say */
        else if (strcmp(what[i], "ROLE") == 0 && r->type == REDIS_REPLY_ERROR)
            ; /* ROLE denied (it is @admin and @dangerous in ACLs): cannot
               * tell here; a replica still refuses writes with READONLY */
        else if (strcmp(what[i], "COMMAND INFO") == 0) {
            /* A server that does not say (COMMAND denied): the first wait
             * would fail on SSUBSCRIBE, naming it. */
            if (dlock_redis_reply_command_known(r) == 0)
                err = dlock_seterr(cl(rc), DLOCK_ENOTSUP,
                                   "redis %s:%d: redis+cluster:// needs Redis 7.0 or later "
                                   "(sharded pub/sub: SSUBSCRIBE, SPUBLISH), and this node "
                                   "does not know SSUBSCRIBE",
                                   n->host, n->port);
        }
        else if (r->type == REDIS_REPLY_ERROR)
            err = reply_error(rc, n, r, what[i]);
        else if (strcmp(what[i], "ROLE") == 0 && !dlock_redis_reply_is_primary(r))
            err = dlock_seterr(cl(rc), DLOCK_ECONNECT,
                               "redis %s:%d is not the primary the sentinels named (a failover "
                               "in progress?)",
                               n->host, n->port);
        else if (strcmp(what[i], "SCRIPT LOAD") == 0 && dlock_redis_reply_sha(r, rc->sha) != 0)
            err = dlock_seterr(cl(rc), DLOCK_EPROTO, "redis %s:%d: unexpected SCRIPT LOAD reply",
                               n->host, n->port);
        freeReplyObject(r);
    }
out:
    dlock_redis_unlimit(rc, saved);
    if (err && *ctxp) {
        redisFree(*ctxp);
        *ctxp = NULL;
    }
    return err;
}

int dlock_redis_node_connect(struct redis_conn *rc, struct redis_node *n, uint64_t budget_ns)
{
    if (n->cmd)
        return 0;
    n->stale = 0;
    int err = dlock_redis_connect_ctx(rc, n, &n->cmd, budget_ns, 1);
    if (err == 0 && n->connected++)
        dlock_count_reconnect(cl(rc));
    return err;
}

void dlock_redis_drop_sub(struct redis_node *n)
{
    if (n->sub)
        redisFree(n->sub);
    n->sub = NULL;
    n->subscribed = 0;
}

int dlock_redis_subscribe_send(struct redis_conn *rc, struct redis_node *n, const char *chan,
                               size_t len, uint64_t connect_ns)
{
    int err;
    n->subscribed = 0;
    if (!n->sub && (err = dlock_redis_connect_ctx(rc, n, &n->sub, connect_ns, 0)) != 0)
        return err;
    int sharded = rc->mode == REDIS_CLUSTER;
    if (dlock_redis_send(rc, n->sub, 2,
                         (const char *[]){sharded ? "SSUBSCRIBE" : "SUBSCRIBE", chan},
                         (size_t[]){sharded ? 10 : 9, len}) != REDIS_OK) {
        err = dlock_redis_ctx_error(rc, n, &n->sub, "SUBSCRIBE");
        dlock_redis_drop_sub(n);
        return err;
    }
    return 0;
}

int dlock_redis_subscribe_confirm(struct redis_conn *rc, struct redis_node *n, const char *chan,
                                  size_t len)
{
    /* Replies to earlier calls (unsubscribe confirmations, pongs, stale
     * messages) come first: skipped, within the call's bound. */
    for (unsigned skipped = 0; n->sub; skipped++) {
        void *v = NULL;
        if (dlock_redis_get_reply(rc, n->sub, &v) != REDIS_OK || !v) {
            int err = dlock_redis_ctx_error(rc, n, &n->sub, "SUBSCRIBE");
            dlock_redis_drop_sub(n);
            return err;
        }
        redisReply *r = v;
        int confirmed = dlock_redis_reply_subscribed(r, chan, len);
        int error = r->type == REDIS_REPLY_ERROR;
        struct redis_redirect d;
        if (error && rc->mode == REDIS_CLUSTER &&
            dlock_redis_reply_redirect(r, &d) != REDIS_REDIR_NONE) {
            /* Not this node's slot (any more): the map is stale. */
            freeReplyObject(r);
            if (d.kind == REDIS_REDIR_MOVED)
                dlock_redis_cluster_moved(rc, &d, n);
            else
                dlock_redis_cluster_stale(rc);
            return dlock_seterr(cl(rc), DLOCK_ECONNECT,
                                "redis %s:%d: SSUBSCRIBE: the slot is not served there (%s)",
                                n->host, n->port,
                                d.kind == REDIS_REDIR_MOVED ? "MOVED" : "being migrated");
        }
        if (error)
            reply_error(rc, n, r, "SUBSCRIBE");
        freeReplyObject(r);
        if (confirmed) {
            n->subscribed = 1;
            return 0;
        }
        if (error || skipped > 10000 ||
            (rc->deadline_ns && dlock_monotonic_ns() >= rc->deadline_ns)) {
            if (!error)
                dlock_seterr(cl(rc), DLOCK_EPROTO, "redis %s:%d: no SUBSCRIBE confirmation",
                             n->host, n->port);
            dlock_redis_drop_sub(n);
            return error ? DLOCK_ESTORE : DLOCK_EPROTO;
        }
    }
    return dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: not connected", n->host, n->port);
}

void dlock_redis_unsubscribe(struct redis_conn *rc, struct redis_node *n, const char *chan,
                             size_t len)
{
    if (!n->sub || !n->subscribed)
        return;
    n->subscribed = 0;
    int sharded = rc->mode == REDIS_CLUSTER;
    if (dlock_redis_send(rc, n->sub, 2,
                         (const char *[]){sharded ? "SUNSUBSCRIBE" : "UNSUBSCRIBE", chan},
                         (size_t[]){sharded ? 12 : 11, len}) != REDIS_OK)
        dlock_redis_drop_sub(n);
}

size_t dlock_redis_script_argv(struct redis_conn *rc, const struct redis_keys *keys,
                               size_t nkeys, const char **extra, const size_t *extra_len,
                               size_t n, const char **argv, size_t *argvlen)
{
    size_t i = 0;
    argv[i] = "EVALSHA", argvlen[i++] = 7;
    argv[i] = rc->sha, argvlen[i++] = 40;
    argv[i] = nkeys == REDIS_NKEYS_ALL ? "5" : "4", argvlen[i++] = 1;
    for (size_t k = 0; k < (nkeys == REDIS_NKEYS_ALL ? nkeys : REDIS_NKEYS); k++)
        argv[i] = keys->k[k], argvlen[i++] = keys->len[k];
    for (size_t k = 0; k < n; k++)
        argv[i] = extra[k], argvlen[i++] = extra_len[k];
    return i;
}

/* One call on n's command connection, after ASKING when asking (both
 * sent at once); the call's reply, or NULL on an I/O error. */
static redisReply *call_asking(struct redis_conn *rc, struct redis_node *n, int asking,
                               size_t argc, const char **argv, const size_t *argvlen)
{
    void *v = NULL;
    if (!asking)
        return dlock_redis_call(rc, n->cmd, argc, argv, argvlen);
    if (redisAppendCommandArgv(n->cmd, 1, (const char *[]){"ASKING"}, (size_t[]){6}) !=
            REDIS_OK ||
        dlock_redis_send(rc, n->cmd, argc, argv, argvlen) != REDIS_OK ||
        dlock_redis_get_reply(rc, n->cmd, &v) != REDIS_OK)
        return NULL;
    freeReplyObject(v); /* +OK */
    v = NULL;
    if (dlock_redis_get_reply(rc, n->cmd, &v) != REDIS_OK)
        return NULL;
    return v;
}

int dlock_redis_script_asking(struct redis_conn *rc, struct redis_node *n, int asking,
                              size_t argc, const char **argv, const size_t *argvlen,
                              redisReply **out, struct redis_redirect *redir)
{
    const char *av[16];
    size_t al[16];
    int err;
    if ((err = dlock_redis_node_connect(rc, n, tv_ns(rc->mode == REDIS_REDLOCK ? &rc->cmd_tv
                                                                               : &rc->connect_tv))) != 0)
        return err;
    redisReply *r = call_asking(rc, n, asking, argc, argv, argvlen);
    if (!r)
        return dlock_redis_ctx_error(rc, n, &n->cmd, "script call");
    if (dlock_redis_reply_error_kind(r) == DLOCK_REDIS_ERR_NOSCRIPT) {
        /* The server lost its script cache (restart, SCRIPT FLUSH). */
        freeReplyObject(r);
        memcpy(av, argv, argc * sizeof *av);
        memcpy(al, argvlen, argc * sizeof *al);
        av[0] = "EVAL", al[0] = 4;
        av[1] = rc->lua, al[1] = rc->lua_len;
        r = call_asking(rc, n, asking, argc, av, al);
        if (!r)
            return dlock_redis_ctx_error(rc, n, &n->cmd, "script call");
    }
    if (redir && dlock_redis_reply_redirect(r, redir) != REDIS_REDIR_NONE) {
        freeReplyObject(r);
        return REDIS_REDIRECTED;
    }
    if (rc->mode == REDIS_SENTINEL &&
        dlock_redis_reply_error_kind(r) == DLOCK_REDIS_ERR_READONLY) {
        /* A primary demoted by a failover: ask the sentinels again. */
        err = dlock_seterr(cl(rc), DLOCK_ECONNECT,
                           "redis %s:%d is a replica now (READONLY): the primary changed",
                           n->host, n->port);
        freeReplyObject(r);
        redisFree(n->cmd);
        n->cmd = NULL;
        n->stale = 0;
        dlock_redis_drop_sub(n);
        return err;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        err = reply_error(rc, n, r, "script");
        freeReplyObject(r);
        return err;
    }
    rc->last_node = n;
    *out = r;
    return 0;
}

int dlock_redis_script(struct redis_conn *rc, struct redis_node *n, size_t argc,
                       const char **argv, const size_t *argvlen, redisReply **out)
{
    return dlock_redis_script_asking(rc, n, 0, argc, argv, argvlen, out, NULL);
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void free_sockets(struct redis_conn *rc)
{
    for (size_t i = 0; rc->nodes && i < rc->nnodes; i++) {
        if (rc->nodes[i].cmd)
            redisFree(rc->nodes[i].cmd);
        if (rc->nodes[i].sub)
            redisFree(rc->nodes[i].sub);
    }
}

static void set_mode(struct redis_conn *rc, enum redis_mode mode)
{
    rc->mode = mode;
    rc->lua = mode == REDIS_CLUSTER ? dlock_redis_lua_sharded : dlock_redis_lua;
    rc->lua_len = mode == REDIS_CLUSTER ? sizeof dlock_redis_lua_sharded - 1
                                        : sizeof dlock_redis_lua - 1;
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
    kc->parent = rc;
    kc->user = rc->user;
    kc->password = rc->password;
    kc->prefix = rc->prefix;
    kc->db = rc->db;
    kc->allow_eviction = rc->allow_eviction;
    kc->connect_tv = rc->connect_tv;
    kc->cmd_tv = rc->cmd_tv;
    kc->wait_replicas = rc->wait_replicas;
    kc->sentinel = rc->sentinel;
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
    int err;
    if ((err = dlock_uri_param_uint(c, uri, "connect_timeout", 1, 3600000, &connect_ms)) ||
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
    rc->prefix = strdup(prefix ? prefix : "dlock:");
    return rc->prefix ? 0 : DLOCK_ENOMEM;
}

static int redis_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    struct redis_conn *rc;
    const char *scheme = dlock_uri_scheme(uri);
    size_t n = dlock_uri_host_count(uri);
    enum redis_mode mode = strcmp(scheme, "redis+cluster") == 0    ? REDIS_CLUSTER
                           : strcmp(scheme, "redis+sentinel") == 0 ? REDIS_SENTINEL
                           : n > 1                                 ? REDIS_REDLOCK
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
    set_mode(rc, mode);
    rc->user = dup_or_null(dlock_uri_user(uri));
    rc->password = dup_or_null(dlock_uri_password(uri));
    if ((err = parse_options(c, uri, rc)) != 0)
        goto fail;
    if (mode == REDIS_SENTINEL) {
        rc->nnodes = rc->nseeds = 1;
        if ((err = dlock_redis_sentinel_open(rc, uri)) != 0)
            goto fail;
        rc->base.caps = 0; /* the backend's caps */
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
        rc->base.caps = 0; /* the backend's caps */
        /* connect_timeout bounds the connect and the handshake together. */
        if ((err = dlock_redis_node_connect(rc, &rc->nodes[0], tv_ns(&rc->connect_tv))) != 0)
            goto fail;
    } else {
        /* Redlock: nodes are contacted per operation; open needs a quorum. */
        size_t up = 0, need = n / 2 + 1;
        dlock_errsave first = {0, ""};
        rc->base.caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING |
                        DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_RAISE |
                        DLOCK_CAP_CANCEL;
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
 * is also noticed by TCP keepalive (see keepalive()).
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
        /* A negative fd is ignored by poll: no flag, nothing to watch. */
        struct pollfd pfd[2] = {{.fd = n->sub->fd, .events = POLLIN},
                                {.fd = cancel_fd, .events = POLLIN}};
        struct timespec ts;
        dlock_ns_to_timespec(wake > now ? wake - now : 0, &ts);
        int pr = ppoll(pfd, 2, &ts, NULL);
        if (pr < 0 && errno == EINTR)
            return dlock_seterr(cl(rc), DLOCK_EINTR, "a signal interrupted the wait");
        if (pr > 0 && pfd[0].revents) {
            /* Read first: a handoff that came with the cancel is taken (the
             * flag stays raised, so the next poll still sees it). */
            if (redisBufferRead(n->sub) != REDIS_OK)
                return sub_error(rc, n, "reading the wake-up channel");
            *read_ns = heard = dlock_monotonic_ns();
            ping_by = 0;
        } else if (pr > 0 && (pfd[1].revents & POLLIN)) {
            return WAIT_CANCELLED;
        }
    }
}

static int run_op(struct redis_conn *rc, const struct redis_keys *keys, size_t nkeys,
                  const char **args, const size_t *lens, size_t nargs, redisReply **out)
{
    const char *argv[16];
    size_t argvlen[16];
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
        err = call_keys(rc, &keys, REDIS_NKEYS, args, lens, nargs, until_ns, out);
    dlock_redis_keys_free(&keys);
    return err;
}

/* `timeout` from now: the bound of a call without a deadline. */
static uint64_t call_until(struct redis_conn *rc)
{
    return dlock_monotonic_ns() + tv_ns(&rc->cmd_tv);
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
    snprintf(ttl, sizeof ttl, "%" PRIu32, h->ttl_ms);
    const char *chan = w->len ? w->name : "-";
    const char *args[] = {"acquire", h->owner, ttl, chan, mode};
    const size_t lens[] = {7, 32, strlen(ttl), strlen(chan), strlen(mode)};
    /* A grant's lease starts on the server after this instant, even when
     * the reply that says so is the retry's. */
    uint64_t sent = dlock_monotonic_ns();
    if ((err = call_op(rc, h, args, lens, 5, until_ns, &r)) != 0)
        return err;
    err = dlock_redis_reply_pair(r, &granted, &value);
    freeReplyObject(r);
    if (err)
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected reply from the lock script");
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
    int err = simple_op(rc, h, "cancel", entry, &res, dlock_monotonic_ns() + bound);
    if (n && err)
        dlock_redis_drop_sub(n);
    else if (n)
        dlock_redis_unsubscribe(rc, n, w->name, w->len);
    dlock_err_restore(cl(rc), &saved); /* report the original failure, not the cleanup */
}

/*
 * WAIT for rc->wait_replicas replicas on node n's command connection,
 * within rc's bound: 0 when that many acknowledged every write this
 * connection made, else the error (what names the write). WAIT's own
 * timeout ends well before the socket's: the server answers a timed-out
 * WAIT some milliseconds late.
 */
static int replicas_ack(struct redis_conn *rc, struct redis_node *n, const char *what)
{
    char num[16], ms[24];
    redisReply *r = NULL;
    long long got = 0;
    int err;
    if (!n->cmd)
        return dlock_seterr(cl(rc), DLOCK_ECONNECT, "redis %s:%d: WAIT: not connected",
                            n->host, n->port);
    uint64_t left = dlock_redis_time_left(rc, tv_ns(&rc->cmd_tv)) / MS;
    snprintf(num, sizeof num, "%u", rc->wait_replicas);
    snprintf(ms, sizeof ms, "%" PRIu64, left > 40 ? left - left / 4 - 10 : 1);
    if ((err = dlock_redis_command(rc, n, &n->cmd, &r, 3, (const char *[]){"WAIT", num, ms},
                                   (size_t[]){4, strlen(num), strlen(ms)}, "WAIT")) != 0)
        return err;
    if (dlock_redis_reply_int(r, &got) != 0 || got < (long long)rc->wait_replicas)
        err = dlock_seterr(cl(rc), DLOCK_ESTORE,
                           "redis %s:%d: only %lld of the %u replicas wait_replicas asks for "
                           "acknowledged %s within %s ms",
                           n->host, n->port, r->type == REDIS_REPLY_INTEGER ? r->integer : 0,
                           rc->wait_replicas, what, ms);
    freeReplyObject(r);
    return err;
}

/* wait_replicas: WAIT after a write that is not a grant (a raised counter
 * or floor), on node n (NULL: the one node), bounded by `timeout`. */
static int ack_after(struct redis_conn *rc, struct redis_node *n, const char *what)
{
    if (!rc->wait_replicas)
        return 0;
    uint64_t saved = dlock_redis_limit(rc, call_until(rc));
    int err = replicas_ack(rc, n ? n : &rc->nodes[0], what);
    dlock_redis_unlimit(rc, saved);
    return err;
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
    if ((err = simple_op(rc, h, "renew", ttl, &res, until_ns)) == 0 && res != 1)
        err = dlock_seterr(cl(rc), DLOCK_ESTORE,
                           "the lock granted to us was gone before the replicas acknowledged "
                           "it (its lease ran out, or the store lost it)");
    if (!err && sent + (uint64_t)h->ttl_ms * MS > h->base.lease_end_ns)
        h->base.lease_end_ns = sent + (uint64_t)h->ttl_ms * MS;
    if (!err)
        err = replicas_ack(rc, rc->last_node ? rc->last_node : &rc->nodes[0], "the grant");
    dlock_redis_unlimit(rc, saved);
    if (err) {
        /* Whatever failed, the grant may stand: give it back (the script
         * releases only our own). */
        dlock_errsave why;
        uint64_t bound = tv_ns(&rc->cmd_tv) < DLOCK_REDIS_CLEANUP_NS ? tv_ns(&rc->cmd_tv)
                                                                     : DLOCK_REDIS_CLEANUP_NS;
        dlock_err_save(cl(rc), &why);
        res = 0;
        int rel = simple_op(rc, h, "release", NULL, &res, dlock_monotonic_ns() + bound);
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

static struct redis_held *held_new(const dlock_request *req)
{
    struct redis_held *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    memcpy(h->owner, req->owner_hex, sizeof h->owner);
    h->ttl_ms = req->ttl_ms;
    h->name_len = (uint32_t)req->name_len;
    h->name = req->name;
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
    err = rc->mode == REDIS_REDLOCK ? dlock_redlock_acquire(rc, req, h) : acquire_single(rc, req, h);
    if (err) {
        held_free(h);
        return err;
    }
    *heldp = &h->base;
    return 0;
}

#define LOST_WHY "the lease had expired or another owner holds the lock (or the server lost " \
                 "it: a restart without persistence, a failover, an eviction)"

static int redis_release(dlock_conn *conn, dlock_held *held)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_held *h = (struct redis_held *)held;
    long long res = 0;
    int err;
    if (rc->mode == REDIS_REDLOCK)
        err = dlock_redlock_release(rc, h);
    else if ((err = simple_op(rc, h, "release", NULL, &res, call_until(rc))) == 0 && res != 1)
        err = dlock_seterr(conn->client, DLOCK_ELOST, "%s%s", LOST_WHY,
                           rc->retried ? "; or a release whose reply was lost had done it"
                                       : "");
    held_free(h);
    return err;
}

static int redis_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_held *h = (struct redis_held *)held;
    char ttl[16];
    long long res = 0;
    int err;
    if (rc->mode == REDIS_REDLOCK)
        return dlock_redlock_renew(rc, h, ttl_ms);
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    if ((err = simple_op(rc, h, "renew", ttl, &res, call_until(rc))) != 0)
        return err;
    if (res != 1)
        return dlock_seterr(conn->client, DLOCK_ELOST, "%s", LOST_WHY);
    h->ttl_ms = ttl_ms;
    return 0;
}

/*
 * The keeper's renewal: the renew script on the keeper's own connection,
 * made here at the first call and never shared with the application's
 * thread. One Redis: bounded as a whole by the `timeout` option (a
 * reconnection included). Redlock: see dlock_redlock_keep().
 */
static int redis_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct redis_conn *rc = (struct redis_conn *)conn, *kc;
    struct redis_held *h = (struct redis_held *)held;
    char ttl[16];
    long long res = 0;
    int err;
    if (!rc->keeper && !(rc->keeper = keeper_conn_new(rc)))
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    kc = rc->keeper;
    if (rc->mode == REDIS_REDLOCK)
        return dlock_redlock_keep(kc, h, ttl_ms);
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    if ((err = simple_op(kc, h, "renew", ttl, &res, call_until(kc))) != 0)
        return err;
    if (res != 1)
        return dlock_seterr(conn->client, DLOCK_ELOST,
                            "the keeper's renewal was refused: " LOST_WHY);
    return 0;
}

int dlock_redis_floor_ok(struct redis_conn *rc, uint64_t floor)
{
    if (floor < DLOCK_REDIS_TOKEN_MAX)
        return 0;
    return dlock_seterr(cl(rc), DLOCK_EINVAL,
                        "a Redis token floor must be below 2^53 - 1 = %" PRIu64
                        " (the lock script's numbers are doubles, exact up to 2^53 - 1, "
                        "and the next token is floor + 1); %" PRIu64 " is too large",
                        DLOCK_REDIS_TOKEN_MAX, floor);
}

/*
 * The script's "fence" while the lock is ours: the name's counter becomes
 * max(counter, floor), in the same script call as the ownership check, so
 * every later grant (max(counter + 1, TIME in µs)) is above floor. Durable
 * as the counter is (the server's persistence). One Redis: one call,
 * bounded by `timeout` (a reconnection and one retry after a lost reply
 * included: the raise is safe to repeat). Redlock: dlock_redlock_raise().
 */
static int redis_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_held *h = (struct redis_held *)held;
    char arg[24];
    long long res = 0;
    int err;
    if ((err = dlock_redis_floor_ok(rc, floor)) != 0)
        return err;
    if (rc->mode == REDIS_REDLOCK)
        return dlock_redlock_raise(rc, h, floor);
    snprintf(arg, sizeof arg, "%" PRIu64, floor);
    /* Marked (KEYS[5]): inspect then still tells the last token granted. */
    const char *args[4] = {"fence", h->owner, arg, "mark"};
    const size_t lens[4] = {5, 32, strlen(arg), 4};
    redisReply *r = NULL;
    struct redis_keys keys;
    if ((err = dlock_redis_held_keys(rc, h, &keys)) == 0)
        err = call_keys(rc, &keys, REDIS_NKEYS_ALL, args, lens, 4, call_until(rc), &r);
    dlock_redis_keys_free(&keys);
    if (err)
        return err;
    err = dlock_redis_reply_int(r, &res);
    freeReplyObject(r);
    if (err)
        return dlock_seterr(conn->client, DLOCK_EPROTO, "unexpected reply from the lock script");
    if (res != 1)
        return dlock_seterr(conn->client, DLOCK_ELOST, "not raised: %s%s", LOST_WHY,
                            rc->retried ? "; a first call whose reply was lost may have "
                                          "raised the counter before that"
                                        : "");
    return ack_after(rc, rc->last_node, "the raised counter");
}

/* ---- store-wide: token_top, raise_floor ---------------------------------- */

/* Keys per SCAN page: one SCAN and one MGET of what it found per page. */
#define SCAN_COUNT "1000"

char *dlock_redis_floor_key(struct redis_conn *rc, size_t *len)
{
    size_t plen = strlen(rc->prefix);
    char *k = malloc(plen + sizeof "floor");
    if (!k)
        return NULL;
    memcpy(k, rc->prefix, plen);
    memcpy(k + plen, "floor", sizeof "floor");
    *len = plen + sizeof "floor" - 1;
    return k;
}

size_t dlock_redis_floor_argv(struct redis_conn *rc, const char *key, size_t key_len,
                              const char *value, const char **argv, size_t *argvlen)
{
    size_t i = 0;
    argv[i] = "EVALSHA", argvlen[i++] = 7;
    argv[i] = rc->sha, argvlen[i++] = 40;
    argv[i] = "1", argvlen[i++] = 1;
    argv[i] = key, argvlen[i++] = key_len;
    argv[i] = "floor", argvlen[i++] = 5;
    argv[i] = value, argvlen[i++] = strlen(value);
    return i;
}

/* A decimal integer string (a counter, the floor): raises *top to it.
 * Anything else (nil for a key of another type, garbage) is no token. */
static void top_of(const redisReply *r, uint64_t *top)
{
    char buf[24], *end;
    if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_INTEGER))
        return;
    if (r->type == REDIS_REPLY_INTEGER) {
        if (r->integer > 0 && (uint64_t)r->integer > *top)
            *top = (uint64_t)r->integer;
        return;
    }
    if (r->len == 0 || r->len >= sizeof buf)
        return;
    memcpy(buf, r->str, r->len);
    buf[r->len] = '\0';
    if (buf[0] < '0' || buf[0] > '9')
        return;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (!errno && !*end && v > *top)
        *top = v;
}

/* "<prefix>*:fence" with the prefix's glob characters escaped. */
static char *fence_pattern(struct redis_conn *rc, size_t *len)
{
    size_t plen = strlen(rc->prefix), o = 0;
    char *p = malloc(2 * plen + sizeof "{*}floor"); /* room for either */
    if (!p)
        return NULL;
    for (size_t i = 0; i < plen; i++) {
        if (strchr("*?[]\\", rc->prefix[i]))
            p[o++] = '\\';
        p[o++] = rc->prefix[i];
    }
    memcpy(p + o, "*:fence", sizeof "*:fence");
    *len = o + sizeof "*:fence" - 1;
    return p;
}

static int top_proto(struct redis_conn *rc, struct redis_node *n, const char *what)
{
    return dlock_seterr(cl(rc), DLOCK_EPROTO, "redis %s:%d: token top: unexpected %s reply",
                        n->host, n->port, what);
}

/* One SCAN page and the MGET of its keys; *cursor becomes the next cursor
 * ("0": done). */
static int top_page(struct redis_conn *rc, struct redis_node *n, const char *pat, size_t pat_len,
                    char *cursor, size_t cursor_cap, uint64_t *top)
{
    redisReply *r = NULL, *m = NULL;
    int err = dlock_redis_command(rc, n, &n->cmd, &r, 6,
                      (const char *[]){"SCAN", cursor, "MATCH", pat, "COUNT", SCAN_COUNT},
                      (size_t[]){4, strlen(cursor), 5, pat_len, 5, strlen(SCAN_COUNT)}, "SCAN");
    if (err)
        return err;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= cursor_cap ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return top_proto(rc, n, "SCAN");
    }
    memcpy(cursor, r->element[0]->str, r->element[0]->len);
    cursor[r->element[0]->len] = '\0';
    redisReply *keys = r->element[1];
    size_t nk = keys->elements;
    if (nk > 0 && rc->mode == REDIS_CLUSTER) {
        /* The keys of a page are in many slots: one GET each, pipelined. */
        for (size_t i = 0; i < nk; i++) {
            const redisReply *k = keys->element[i];
            const char *kv = k->type == REDIS_REPLY_STRING ? k->str : "";
            size_t kl = k->type == REDIS_REPLY_STRING ? k->len : 0;
            if (redisAppendCommandArgv(n->cmd, 2, (const char *[]){"GET", kv},
                                       (size_t[]){3, kl}) != REDIS_OK) {
                freeReplyObject(r);
                return dlock_redis_ctx_error(rc, n, &n->cmd, "GET");
            }
        }
        for (size_t i = 0; i < nk && !err; i++) {
            void *v = NULL;
            if (dlock_redis_get_reply(rc, n->cmd, &v) != REDIS_OK || !v)
                err = dlock_redis_ctx_error(rc, n, &n->cmd, "GET");
            else
                top_of(v, top);
            if (v)
                freeReplyObject(v);
        }
    } else if (nk > 0) {
        const char **argv = malloc((nk + 1) * sizeof *argv);
        size_t *lens = malloc((nk + 1) * sizeof *lens);
        if (!argv || !lens) {
            free(argv), free(lens), freeReplyObject(r);
            return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
        }
        argv[0] = "MGET", lens[0] = 4;
        for (size_t i = 0; i < nk; i++) {
            const redisReply *k = keys->element[i];
            argv[i + 1] = k->type == REDIS_REPLY_STRING ? k->str : "";
            lens[i + 1] = k->type == REDIS_REPLY_STRING ? k->len : 0;
        }
        err = dlock_redis_command(rc, n, &n->cmd, &m, nk + 1, argv, lens, "MGET");
        free(argv);
        free(lens);
        if (!err && m->type != REDIS_REPLY_ARRAY)
            err = top_proto(rc, n, "MGET");
        for (size_t i = 0; !err && i < m->elements; i++)
            top_of(m->element[i], top);
        if (m)
            freeReplyObject(m);
    }
    freeReplyObject(r);
    return err;
}

int dlock_redis_node_top(struct redis_conn *rc, struct redis_node *n, uint64_t *top)
{
    char cursor[32] = "0";
    size_t pat_len = 0, key_len = 0;
    char *pat = NULL, *key = NULL;
    redisReply *r = NULL;
    uint64_t best = 0;
    int err;
    if (n->stale && n->cmd) { /* owes replies to abandoned calls: start afresh */
        redisFree(n->cmd);
        n->cmd = NULL;
        n->stale = 0;
    }
    if ((err = dlock_redis_node_connect(rc, n, tv_ns(rc->mode == REDIS_REDLOCK ? &rc->cmd_tv
                                                                     : &rc->connect_tv))) != 0)
        return err;
    if (!(pat = fence_pattern(rc, &pat_len)) || !(key = dlock_redis_floor_key(rc, &key_len))) {
        err = dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    /* Every counter (the tokens of every name), a page per round trip. */
    do {
        if ((err = top_page(rc, n, pat, pat_len, cursor, sizeof cursor, &best)) != 0)
            goto out;
    } while (strcmp(cursor, "0") != 0);
    if (rc->mode == REDIS_CLUSTER) {
        /* A floor per slot, "<prefix>{T}floor": those of this node's. */
        memcpy(pat + pat_len - strlen("*:fence"), "{*}floor", sizeof "{*}floor");
        pat_len = strlen(pat);
        do {
            if ((err = top_page(rc, n, pat, pat_len, cursor, sizeof cursor, &best)) != 0)
                goto out;
        } while (strcmp(cursor, "0") != 0);
    } else {
        /* The floor. */
        if ((err = dlock_redis_command(rc, n, &n->cmd, &r, 2, (const char *[]){"GET", key},
                                       (size_t[]){3, key_len}, "GET")) != 0)
            goto out;
        top_of(r, &best);
        freeReplyObject(r);
    }
    /* The clock: the next grant takes at least TIME in µs. */
    if ((err = dlock_redis_command(rc, n, &n->cmd, &r, 1, (const char *[]){"TIME"}, (size_t[]){4}, "TIME")) !=
        0)
        goto out;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        err = top_proto(rc, n, "TIME");
        goto out;
    }
    uint64_t now = strtoull(r->element[0]->str, NULL, 10) * 1000000u +
                   strtoull(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    *top = now > best ? now : best;
out:
    free(pat);
    free(key);
    return err;
}

/*
 * token_top on one Redis: the largest fence counter under the prefix (a
 * SCAN of "<prefix>*:fence"), the floor key and TIME in µs. A connection
 * found reset (a server restart since the last call) is made again once.
 */
/* A cluster's top: the largest over its primaries (each one's counters,
 * floors and TIME), each bounded by `timeout`; the map is read first. */
static int cluster_top(struct redis_conn *rc, uint64_t *top)
{
    struct redis_node *prim[REDIS_CLUSTER_MAX_NODES];
    uint64_t best = 0;
    uint64_t saved = dlock_redis_limit(rc, call_until(rc));
    int np = dlock_redis_cluster_primaries(rc, prim);
    dlock_redis_unlimit(rc, saved);
    if (np < 0)
        return np;
    for (int i = 0; i < np; i++) {
        uint64_t t = 0;
        int err = dlock_redis_node_top(rc, prim[i], &t);
        if (err) {
            dlock_redis_cluster_stale(rc);
            return err;
        }
        if (t > best)
            best = t;
    }
    *top = best;
    return 0;
}

/*
 * One floor script call, raising key to value (idempotent, so tried again
 * once after a lost reply), bounded by `timeout`: on node n, or (n NULL)
 * on the cluster node that owns slot, following its directions. 0 once
 * the script said so.
 */
static int floor_call(struct redis_conn *rc, struct redis_node *n, unsigned slot, const char *key,
                      size_t key_len, const char *value)
{
    const char *argv[8];
    size_t argvlen[8];
    redisReply *r = NULL;
    long long res = 0;
    int err, again = 0;
    size_t argc = dlock_redis_floor_argv(rc, key, key_len, value, argv, argvlen);
    uint64_t saved = dlock_redis_limit(rc, call_until(rc));
    for (;;) {
        err = n ? dlock_redis_script(rc, n, argc, argv, argvlen, &r)
                : dlock_redis_cluster_script(rc, slot, argc, argv, argvlen, &r);
        if (err != DLOCK_ECONNECT || again++ || dlock_monotonic_ns() + MS >= rc->deadline_ns)
            break;
    }
    if (err == 0 && again)
        dlock_clearerr(cl(rc));
    dlock_redis_unlimit(rc, saved);
    if (err)
        return err;
    err = dlock_redis_reply_int(r, &res);
    freeReplyObject(r);
    if (err || res != 1)
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected reply from the floor script");
    return 0;
}

/* Slots whose floor calls go out together, before any reply is read. */
#define FLOOR_BATCH 1024

/*
 * One batch of a cluster's floor raise, slots [first, first + count): each
 * call sent to the slot's owner as the map says, pipelined (one write per
 * node), then the replies read in order, all within `timeout`. done[i] is
 * set for each slot the script raised. The others (a direction: MOVED, ASK,
 * TRYAGAIN; NOSCRIPT; a node that could not be reached or stopped
 * answering) are left to floor_call(), which knows what to do with each.
 */
static void floor_batch(struct redis_conn *rc, char *key, size_t plen, const char *value,
                        unsigned first, unsigned count, unsigned char *done)
{
    struct redis_node *to[FLOOR_BATCH];
    unsigned char down[REDIS_CLUSTER_MAX_NODES] = {0}; /* no more calls there */
    uint64_t saved = dlock_redis_limit(rc, call_until(rc));
    for (unsigned i = 0; i < count; i++) {
        const char *argv[8];
        size_t argvlen[8];
        struct redis_node *n = dlock_redis_cluster_peek(rc, first + i);
        to[i] = NULL;
        if (!n || down[n - rc->nodes])
            continue;
        if (n->stale && n->cmd) { /* owes replies to abandoned calls: start afresh */
            redisFree(n->cmd);
            n->cmd = NULL;
        }
        int kl = snprintf(key + plen, 16, "{%s}floor", dlock_redis_slot_tag(first + i));
        size_t argc = dlock_redis_floor_argv(rc, key, plen + (size_t)kl, value, argv, argvlen);
        if (dlock_redis_node_connect(rc, n, tv_ns(&rc->connect_tv)) != 0 ||
            redisAppendCommandArgv(n->cmd, (int)argc, argv, argvlen) != REDIS_OK) {
            if (n->cmd) { /* calls already buffered there: never sent */
                redisFree(n->cmd);
                n->cmd = NULL;
            }
            down[n - rc->nodes] = 1;
            continue;
        }
        to[i] = n;
    }
    for (size_t k = 0; k < rc->nnodes; k++) {
        struct redis_node *n = &rc->nodes[k];
        if (n->cmd && !down[k] && obuf_len(n->cmd->obuf) > 0) {
            arm(rc, n->cmd);
            if (send_buffered(n->cmd) != REDIS_OK) {
                dlock_redis_ctx_error(rc, n, &n->cmd, "floor calls");
                down[k] = 1;
            }
        }
    }
    for (unsigned i = 0; i < count; i++) {
        struct redis_node *n = to[i];
        void *v = NULL;
        if (!n || down[n - rc->nodes])
            continue;
        if (dlock_redis_get_reply(rc, n->cmd, &v) != REDIS_OK) {
            dlock_redis_ctx_error(rc, n, &n->cmd, "floor calls");
            dlock_redis_cluster_failed(rc, n);
            down[n - rc->nodes] = 1;
            continue;
        }
        redisReply *r = v;
        done[i] = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
    }
    dlock_redis_unlimit(rc, saved);
}

/*
 * A cluster's floor: one key per slot ("<prefix>{T}floor", read by the
 * grants of that slot's names), each raised by a script call on the slot's
 * owner. The calls go out FLOOR_BATCH slots at a time, pipelined to the
 * owners (16 round trips in all on a stable cluster, not 16384); a slot
 * whose pipelined call did not raise its floor is then done alone,
 * following the cluster's directions (a live reshard, a failover), before
 * the next batch. Each batch and each lone call bounded by `timeout`.
 */
static int cluster_raise_floor(struct redis_conn *rc, const char *value)
{
    size_t plen = strlen(rc->prefix);
    char *key = malloc(plen + 16);
    int err = 0;
    if (!key)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    memcpy(key, rc->prefix, plen);
    for (unsigned first = 0; first < REDIS_SLOTS && !err; first += FLOOR_BATCH) {
        unsigned char done[FLOOR_BATCH] = {0};
        uint64_t saved = dlock_redis_limit(rc, call_until(rc));
        /* A map known stale (a MOVED, a failed node) is read again first. */
        if (!dlock_redis_cluster_node(rc, first, &err))
            err = 0; /* that slot's call will say why, if it still fails */
        dlock_redis_unlimit(rc, saved);
        floor_batch(rc, key, plen, value, first, FLOOR_BATCH, done);
        for (unsigned i = 0; i < FLOOR_BATCH && !err; i++) {
            if (done[i])
                continue;
            int kl = snprintf(key + plen, 16, "{%s}floor", dlock_redis_slot_tag(first + i));
            err = floor_call(rc, NULL, first + i, key, plen + (size_t)kl, value);
        }
    }
    free(key);
    if (!err)
        dlock_clearerr(cl(rc)); /* a pipelined call's failure, made good */
    if (!err && rc->wait_replicas) { /* each primary: its slots' floors */
        struct redis_node *prim[REDIS_CLUSTER_MAX_NODES];
        uint64_t saved = dlock_redis_limit(rc, call_until(rc));
        int np = dlock_redis_cluster_primaries(rc, prim);
        dlock_redis_unlimit(rc, saved);
        err = np < 0 ? np : 0;
        for (int i = 0; i < np && !err; i++)
            err = ack_after(rc, prim[i], "the raised floors");
    }
    return err;
}

static int redis_token_top(dlock_conn *conn, uint64_t *top)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_node *n = &rc->nodes[0];
    if (rc->mode == REDIS_REDLOCK)
        return dlock_redlock_top(rc, top);
    if (rc->mode == REDIS_CLUSTER)
        return cluster_top(rc, top);
    int had = n->cmd != NULL;
    int err = dlock_redis_node_top(rc, n, top);
    if (err == DLOCK_ECONNECT && had && (err = dlock_redis_node_top(rc, n, top)) == 0)
        dlock_clearerr(conn->client);
    return err;
}

/*
 * raise_floor on one Redis: the script's "floor" (floor key = max(floor
 * key, floor)), one call bounded by `timeout`, repeated once after a lost
 * reply (it is idempotent). The key never expires: durable as the
 * counters are (the server's persistence).
 */
static int redis_raise_floor(dlock_conn *conn, uint64_t floor)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    size_t key_len = 0;
    char value[24], *key;
    int err;
    if ((err = dlock_redis_floor_ok(rc, floor)) != 0)
        return err;
    if (rc->mode == REDIS_REDLOCK)
        return dlock_redlock_raise_floor(rc, floor);
    snprintf(value, sizeof value, "%" PRIu64, floor);
    if (rc->mode == REDIS_CLUSTER)
        return cluster_raise_floor(rc, value);
    if (!(key = dlock_redis_floor_key(rc, &key_len)))
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    err = floor_call(rc, &rc->nodes[0], 0, key, key_len, value);
    free(key);
    if (err)
        return err;
    return ack_after(rc, rc->last_node, "the raised floor");
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
    uint64_t saved = dlock_redis_limit(rc, call_until(rc));
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

_Static_assert(DLOCK_REDIS_LISTED == DLOCK_INFO_LISTED, "waiters listed");

/*
 * inspect on one Redis: the script's "inspect" (see the top of this file),
 * one call that only reads, atomic like every script call; bounded by
 * `timeout`, repeated once after a lost reply. Redlock:
 * dlock_redlock_inspect().
 */
static int redis_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_keys keys;
    struct redis_seen seen;
    redisReply *r = NULL;
    char listed[8];
    int err;
    if (dlock_redis_keys(rc, name, len, &keys) != 0)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    if (rc->mode == REDIS_REDLOCK) {
        err = dlock_redlock_inspect(rc, &keys, info);
        dlock_redis_keys_free(&keys);
        return err;
    }
    snprintf(listed, sizeof listed, "%d", DLOCK_REDIS_LISTED);
    const char *args[2] = {"inspect", listed};
    const size_t lens[2] = {7, strlen(listed)};
    err = call_keys(rc, &keys, REDIS_NKEYS_ALL, args, lens, 2, call_until(rc), &r);
    dlock_redis_keys_free(&keys);
    if (err)
        return err;
    err = dlock_redis_reply_inspect(r, &seen);
    freeReplyObject(r);
    if (err)
        return dlock_seterr(conn->client, DLOCK_EPROTO,
                            "unexpected reply from the lock script's inspect (a key of \"%.*s\" "
                            "not written by dlock?)",
                            (int)(len > 64 ? 64 : len), name);
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

const dlock_backend dlock_redis_backend = {
    DLOCK_BACKEND_INIT,
    .name = "redis",
    .schemes = redis_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_RAISE | DLOCK_CAP_CANCEL,
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
};
