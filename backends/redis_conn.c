/*
 * The Redis connection layer, under every recipe and topology: connecting
 * and the pipelined handshake (connect_ctx()), writing and reading with a
 * bound (the call's, dlock_redis_limit(); `timeout` per reply), the error a
 * lost connection becomes, subscriptions, one script call on one node (the
 * EVAL fallback on NOSCRIPT, ASKING, a redirect handed back), and WAIT for
 * replicas. It calls nothing above it: what a topology adds (Sentinel asks
 * where the primary is before each new connection; a Cluster node that
 * refuses a subscription redirects it, or says the map is stale) comes in
 * through the hook table the topology set at open (struct redis_topology,
 * rc->topo).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "core/internal.h"

#define MS 1000000ull

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

redisReply *dlock_redis_call(struct redis_conn *rc, redisContext *ctx, size_t argc,
                             const char **argv, const size_t *argvlen)
{
    void *reply = NULL;
    if (dlock_redis_send(rc, ctx, argc, argv, argvlen) != REDIS_OK ||
        dlock_redis_io_get_reply(ctx, &reply) != REDIS_OK)
        return NULL;
    return reply;
}

int dlock_redis_send(struct redis_conn *rc, redisContext *ctx, size_t argc, const char **argv,
                     const size_t *argvlen)
{
    if (redisAppendCommandArgv(ctx, (int)argc, argv, argvlen) != REDIS_OK)
        return REDIS_ERR;
    arm(rc, ctx);
    return dlock_redis_io_write(ctx);
}

int dlock_redis_flush(struct redis_conn *rc, redisContext *ctx)
{
    if (dlock_redis_io_buffered(ctx) == 0)
        return REDIS_OK;
    arm(rc, ctx);
    return dlock_redis_io_write(ctx);
}

int dlock_redis_get_reply(struct redis_conn *rc, redisContext *ctx, void **reply)
{
    arm(rc, ctx);
    return dlock_redis_io_get_reply(ctx, reply);
}

int dlock_redis_ctx_error(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                          const char *what)
{
    redisContext *ctx = *ctxp;
    int code = DLOCK_ECONNECT;
    const char *why = "not connected";
    if (ctx && ctx->err == DLOCK_REDIS_ERR_TLS_AUTH)
        code = DLOCK_EAUTH;
    else if (ctx && ctx->err == REDIS_ERR_PROTOCOL)
        code = DLOCK_EPROTO;
    else if (ctx && ctx->err == REDIS_ERR_OOM)
        code = DLOCK_ENOMEM;
    if (ctx) {
        why = ctx->errstr[0] ? ctx->errstr : "connection lost";
        /* hiredis reports its socket timeouts as EAGAIN. */
        if (ctx->err == REDIS_ERR_IO && (strstr(why, "temporarily unavailable") ||
                                         strstr(why, "would block")))
            why = strncmp(why, "TLS handshake", 13) == 0
                      ? "TLS handshake: no reply in time (timeout; is the port a TLS port?)"
                      : "no reply in time (timeout)";
    }
    dlock_seterr(cl(rc), code, "redis %s:%d: %s: %s", n->host, n->port, what, why);
    if (ctx)
        dlock_redis_io_free(ctx);
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
    const char *argv[6][3];
    size_t lens[6][3], argc[6], nc = 0;
    const char *what[6];
    char db[16];
    uint64_t until = dlock_monotonic_ns() + dlock_redis_time_left(rc, budget_ns);
    uint64_t saved = dlock_redis_limit(rc, until);
    int err = 0;

    /* Sentinel: where the primary is now, asked on every new connection. */
    if (rc->topo && rc->topo->resolve &&
        (err = rc->topo->resolve(rc, n, until - dlock_monotonic_ns())) != 0) {
        dlock_redis_unlimit(rc, saved);
        return err;
    }
    uint64_t now = dlock_monotonic_ns();
    redisContext *ctx = dlock_redis_io_connect(rc->tls, n->host, n->port,
                                               until > now + MS ? until - now : MS,
                                               tv_ns(&rc->cmd_tv));
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
            /* A TLS port resets a plain client that spoke first. */
            int tls_port = i == 0 && !rc->tls &&
                           (ctx->err == REDIS_ERR_EOF || strstr(ctx->errstr, "reset"));
            err = dlock_redis_ctx_error(rc, n, ctxp, what[i]);
            if (tls_port) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", dlock_errmsg(cl(rc)));
                dlock_seterr(cl(rc), err, "%s (if the port speaks TLS, use rediss://)", msg);
            }
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
        dlock_redis_io_free(*ctxp);
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
        dlock_redis_io_free(n->sub);
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
        if (error && rc->topo && rc->topo->redirected &&
            dlock_redis_reply_redirect(r, &d) != REDIS_REDIR_NONE) {
            /* Not this node's slot (any more): the map is stale. */
            freeReplyObject(r);
            if (d.kind == REDIS_REDIR_MOVED)
                rc->topo->redirected(rc, &d, n);
            else if (rc->topo->stale)
                rc->topo->stale(rc);
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
        dlock_redis_io_free(n->cmd);
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

/* `timeout` from now: the bound of a call without a deadline. */
uint64_t dlock_redis_call_until(struct redis_conn *rc)
{
    return dlock_monotonic_ns() + tv_ns(&rc->cmd_tv);
}

/*
 * WAIT for rc->wait_replicas replicas on node n's command connection,
 * within rc's bound: 0 when that many acknowledged every write this
 * connection made, else the error (what names the write). WAIT's own
 * timeout ends well before the socket's: the server answers a timed-out
 * WAIT some milliseconds late.
 */
int dlock_redis_replicas_ack(struct redis_conn *rc, struct redis_node *n, const char *what)
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
int dlock_redis_ack_after(struct redis_conn *rc, struct redis_node *n, const char *what)
{
    if (!rc->wait_replicas)
        return 0;
    uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
    int err = dlock_redis_replicas_ack(rc, n ? n : &rc->nodes[0], what);
    dlock_redis_unlimit(rc, saved);
    return err;
}
