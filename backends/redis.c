/*
 * redis://[user:password@]host[:port][/db][?options]: one Redis.
 * redis://h1:p1,h2:p2,h3:p3[/db]: Redlock over independent instances
 * (backends/redlock.c).
 *
 * Every operation is one call of one Lua script (redis_script.h). A waiter
 * first subscribes to its own channel (and waits for the confirmation),
 * then queues itself through the script; a release hands the lock to the
 * queue's first live waiter inside the script and publishes one message to
 * that waiter. Subscribing before queueing means no release can slip in
 * between unseen. The lock's PTTL bounds each wait, so a holder that died
 * is noticed when its lease runs out.
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

#include "config.h"
#include "backends/redis_conn.h"
#include "backends/redis_script.h"
#include "core/internal.h"
#include "core/sha256.h"

#define DEFAULT_PORT 6379
#define DEFAULT_CONNECT_MS 2000
#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_NODE_TIMEOUT_MS 100
#define MS 1000000ull
/* TCP keepalive on every connection: a peer that went silent (host down,
 * network cut) is noticed by an idle connection, such as a waiter's
 * subscriber, within IDLE + CNT * INTVL = 8 s. hiredis's own
 * redisEnableKeepAlive() would take 15 + 3 * 5 = 30 s. */
#define KEEPALIVE_IDLE_S 5
#define KEEPALIVE_INTVL_S 1
#define KEEPALIVE_CNT 3

static const char *const redis_schemes[] = {"redis", NULL};
static const char *const redis_options[] = {
    "connect_timeout", "timeout", "prefix", "node_timeout", NULL,
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

static uint64_t tv_ns(const struct timeval *tv)
{
    return (uint64_t)tv->tv_sec * 1000000000u + (uint64_t)tv->tv_usec * 1000u;
}

static void ns_to_tv(uint64_t ns, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ns / 1000000000u);
    tv->tv_usec = (suseconds_t)(ns % 1000000000u / 1000u);
}

/* What is left of the connection's deadline, capped at cap_ns; at least
 * 1 ms (0 would mean no limit to hiredis). cap_ns when there is none. */
static uint64_t time_left(struct redis_conn *rc, uint64_t cap_ns)
{
    uint64_t now = dlock_monotonic_ns(), left;
    if (!rc->deadline_ns)
        return cap_ns;
    left = rc->deadline_ns > now ? rc->deadline_ns - now : 0;
    if (left > cap_ns)
        left = cap_ns;
    return left < MS ? MS : left;
}

/* Bounds the next reply by the deadline, if the connection has one. */
static void arm(struct redis_conn *rc, redisContext *ctx)
{
    struct timeval tv;
    if (!rc->deadline_ns)
        return;
    ns_to_tv(time_left(rc, tv_ns(&rc->cmd_tv)), &tv);
    redisSetTimeout(ctx, tv);
}

redisReply *dlock_redis_call(struct redis_conn *rc, redisContext *ctx, size_t argc,
                             const char **argv, const size_t *argvlen)
{
    dlock_sigpipe sp;
    arm(rc, ctx);
    dlock_sigpipe_block(&sp);
    redisReply *r = redisCommandArgv(ctx, (int)argc, argv, argvlen);
    dlock_sigpipe_restore(&sp);
    return r;
}

int dlock_redis_send(struct redis_conn *rc, redisContext *ctx, size_t argc, const char **argv,
                     const size_t *argvlen)
{
    dlock_sigpipe sp;
    int done = 0, ok;
    (void)rc;
    if (redisAppendCommandArgv(ctx, (int)argc, argv, argvlen) != REDIS_OK)
        return REDIS_ERR;
    dlock_sigpipe_block(&sp);
    while ((ok = redisBufferWrite(ctx, &done)) == REDIS_OK && !done)
        ;
    dlock_sigpipe_restore(&sp);
    return ok == REDIS_OK && done ? REDIS_OK : REDIS_ERR;
}

int dlock_redis_get_reply(struct redis_conn *rc, redisContext *ctx, void **reply)
{
    dlock_sigpipe sp;
    arm(rc, ctx);
    dlock_sigpipe_block(&sp);
    int ok = redisGetReply(ctx, reply);
    dlock_sigpipe_restore(&sp);
    return ok;
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
    static const char *const suffix[3] = {":lock", ":fence", ":queue"};
    size_t plen = strlen(rc->prefix), total = 0;
    char *p;
    for (int i = 0; i < 3; i++)
        total += plen + len + strlen(suffix[i]) + 1;
    p = keys->buf = malloc(total);
    if (!p)
        return DLOCK_ENOMEM;
    for (int i = 0; i < 3; i++) {
        size_t slen = strlen(suffix[i]);
        keys->k[i] = p;
        memcpy(p, rc->prefix, plen);
        memcpy(p + plen, name, len);
        memcpy(p + plen + len, suffix[i], slen + 1);
        keys->len[i] = plen + len + slen;
        p += keys->len[i] + 1;
    }
    return 0;
}

void dlock_redis_keys_free(struct redis_keys *keys)
{
    free(keys->buf);
    keys->buf = NULL;
}

int dlock_redis_ctx_error(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                          const char *what)
{
    redisContext *ctx = *ctxp;
    int code = DLOCK_ECONNECT;
    if (ctx && ctx->err == REDIS_ERR_PROTOCOL)
        code = DLOCK_EPROTO;
    else if (ctx && ctx->err == REDIS_ERR_OOM)
        code = DLOCK_ENOMEM;
    dlock_seterr(cl(rc), code, "redis %s:%d: %s: %s", n->host, n->port, what,
                 ctx ? (ctx->errstr[0] ? ctx->errstr : "connection lost") : "not connected");
    if (ctx)
        redisFree(ctx);
    *ctxp = NULL;
    return code;
}

/* Maps an error reply; authentication failures get their own code. */
static int reply_error(struct redis_conn *rc, struct redis_node *n, redisReply *r,
                       const char *what)
{
    int code = DLOCK_ESTORE;
    if (strncmp(r->str, "WRONGPASS", 9) == 0 || strncmp(r->str, "NOAUTH", 6) == 0 ||
        strstr(r->str, "invalid password") || strstr(r->str, "invalid username-password"))
        code = DLOCK_EAUTH;
    return dlock_seterr(cl(rc), code, "redis %s:%d: %s: %.120s", n->host, n->port, what, r->str);
}

static int command(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
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

/* AUTH (or PING, which reports NOAUTH on a server that wants a password)
 * and SELECT: what every new connection to a node needs. */
static int handshake(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp)
{
    const char *argv[3];
    size_t lens[3], argc = 0;
    char db[16];
    int err;
    if (rc->password) {
        argv[argc] = "AUTH", lens[argc++] = 4;
        if (rc->user && rc->user[0]) /* Redis 6 ACL user */
            argv[argc] = rc->user, lens[argc] = strlen(rc->user), argc++;
        argv[argc] = rc->password, lens[argc] = strlen(rc->password), argc++;
    } else {
        argv[argc] = "PING", lens[argc++] = 4;
    }
    err = command(rc, n, ctxp, NULL, argc, argv, lens, argv[0]);
    if (err || rc->db == 0)
        return err;
    snprintf(db, sizeof db, "%d", rc->db);
    argv[0] = "SELECT", lens[0] = 6;
    argv[1] = db, lens[1] = strlen(db);
    return command(rc, n, ctxp, NULL, 2, argv, lens, "SELECT");
}

int dlock_redis_connect_ctx(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                            const struct timeval *tv)
{
    struct timeval bound;
    ns_to_tv(time_left(rc, tv_ns(tv)), &bound);
    redisContext *ctx = redisConnectWithTimeout(n->host, n->port, bound);
    if (!ctx)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    *ctxp = ctx;
    if (ctx->err)
        return dlock_redis_ctx_error(rc, n, ctxp, "cannot connect");
    keepalive(ctx);
    /* Command replies are bounded too: a server that accepts and never
     * answers must not hang the caller. */
    if (redisSetTimeout(ctx, rc->cmd_tv) != REDIS_OK)
        return dlock_redis_ctx_error(rc, n, ctxp, "cannot set the reply timeout");
    int err = handshake(rc, n, ctxp);
    if (err && *ctxp) {
        redisFree(*ctxp);
        *ctxp = NULL;
    }
    return err;
}

static int node_connect(struct redis_conn *rc, struct redis_node *n, const struct timeval *tv);

int dlock_redis_node_connect(struct redis_conn *rc, struct redis_node *n,
                             const struct timeval *tv)
{
    if (n->cmd)
        return 0;
    if (!rc->parent)
        return node_connect(rc, n, tv);
    /* The keeper's: tv bounds the whole connect, handshake included, so
     * that a silent node costs one tv per keep call. */
    uint64_t saved = rc->deadline_ns, until = dlock_monotonic_ns() + tv_ns(tv);
    if (!saved || until < saved)
        rc->deadline_ns = until;
    int err = node_connect(rc, n, tv);
    rc->deadline_ns = saved;
    if (n->cmd)
        redisSetTimeout(n->cmd, rc->cmd_tv);
    return err;
}

static int node_connect(struct redis_conn *rc, struct redis_node *n, const struct timeval *tv)
{
    redisReply *r = NULL;
    int err;
    if ((err = dlock_redis_connect_ctx(rc, n, &n->cmd, tv)) != 0)
        return err;
    err = command(rc, n, &n->cmd, &r, 3, (const char *[]){"SCRIPT", "LOAD", dlock_redis_lua},
                  (size_t[]){6, 4, sizeof dlock_redis_lua - 1}, "SCRIPT LOAD");
    if (err)
        return err;
    if (r->type != REDIS_REPLY_STRING || r->len != 40) {
        freeReplyObject(r);
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "redis %s:%d: unexpected SCRIPT LOAD reply",
                            n->host, n->port);
    }
    memcpy(rc->sha, r->str, 41);
    freeReplyObject(r);
    return 0;
}

size_t dlock_redis_script_argv(struct redis_conn *rc, const struct redis_keys *keys,
                               const char **extra, const size_t *extra_len, size_t n,
                               const char **argv, size_t *argvlen)
{
    size_t i = 0;
    argv[i] = "EVALSHA", argvlen[i++] = 7;
    argv[i] = rc->sha, argvlen[i++] = 40;
    argv[i] = "3", argvlen[i++] = 1;
    for (int k = 0; k < 3; k++)
        argv[i] = keys->k[k], argvlen[i++] = keys->len[k];
    for (size_t k = 0; k < n; k++)
        argv[i] = extra[k], argvlen[i++] = extra_len[k];
    return i;
}

int dlock_redis_script(struct redis_conn *rc, struct redis_node *n, size_t argc,
                       const char **argv, const size_t *argvlen, redisReply **out)
{
    const char *av[16];
    size_t al[16];
    int err;
    if ((err = dlock_redis_node_connect(rc, n, rc->nnodes > 1 ? &rc->cmd_tv : &rc->connect_tv)) != 0)
        return err;
    redisReply *r = dlock_redis_call(rc, n->cmd, argc, argv, argvlen);
    if (!r)
        return dlock_redis_ctx_error(rc, n, &n->cmd, "script call");
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        /* The server lost its script cache (restart, SCRIPT FLUSH). */
        freeReplyObject(r);
        memcpy(av, argv, argc * sizeof *av);
        memcpy(al, argvlen, argc * sizeof *al);
        av[0] = "EVAL", al[0] = 4;
        av[1] = dlock_redis_lua, al[1] = sizeof dlock_redis_lua - 1;
        r = dlock_redis_call(rc, n->cmd, argc, av, al);
        if (!r)
            return dlock_redis_ctx_error(rc, n, &n->cmd, "script call");
    }
    if (r->type == REDIS_REPLY_ERROR) {
        err = reply_error(rc, n, r, "script");
        freeReplyObject(r);
        return err;
    }
    *out = r;
    return 0;
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

/* The keeper's connection: a copy of rc's settings with sockets of its
 * own, borrowing rc's strings. Nothing is connected until used. */
static struct redis_conn *keeper_conn_new(struct redis_conn *rc)
{
    struct redis_conn *kc = calloc(1, sizeof *kc);
    if (!kc || !(kc->nodes = calloc(rc->nnodes, sizeof *kc->nodes))) {
        free(kc);
        return NULL;
    }
    kc->base = rc->base;
    kc->parent = rc;
    kc->user = rc->user;
    kc->password = rc->password;
    kc->prefix = rc->prefix;
    kc->db = rc->db;
    kc->connect_tv = rc->connect_tv;
    kc->cmd_tv = rc->cmd_tv;
    kc->nnodes = rc->nnodes;
    for (size_t i = 0; i < rc->nnodes; i++) {
        kc->nodes[i].host = rc->nodes[i].host;
        kc->nodes[i].port = rc->nodes[i].port;
    }
    return kc;
}

static void redis_close(dlock_conn *conn)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    /* The core never runs keep() during or after close: the keeper's
     * thread is gone, and so is any use of rc->keeper. */
    if (rc->keeper) {
        free_sockets(rc->keeper);
        free(rc->keeper->nodes);
        free(rc->keeper);
    }
    free_sockets(rc);
    for (size_t i = 0; rc->nodes && i < rc->nnodes; i++)
        free(rc->nodes[i].host);
    if (rc->password)
        explicit_bzero(rc->password, strlen(rc->password));
    free(rc->nodes);
    free(rc->user);
    free(rc->password);
    free(rc->prefix);
    free(rc);
}

static int parse_options(dlock_client *c, const dlock_uri *uri, struct redis_conn *rc)
{
    uint64_t connect_ms = DEFAULT_CONNECT_MS, timeout_ms = DEFAULT_TIMEOUT_MS;
    uint64_t node_ms = DEFAULT_NODE_TIMEOUT_MS;
    const char *path = dlock_uri_path(uri), *prefix = dlock_uri_param(uri, "prefix");
    int err;
    if ((err = dlock_uri_param_uint(c, uri, "connect_timeout", 1, 3600000, &connect_ms)) ||
        (err = dlock_uri_param_uint(c, uri, "timeout", 1, 3600000, &timeout_ms)) ||
        (err = dlock_uri_param_uint(c, uri, "node_timeout", 1, 60000, &node_ms)))
        return err;
    if (path[0] && strcmp(path, "/") != 0) {
        char *end;
        long db = strtol(path + 1, &end, 10);
        if (*end || path[1] < '0' || path[1] > '9' || db < 0 || db > 65535)
            return dlock_seterr(c, DLOCK_EBADURI,
                                "the path of a redis:// URI is a database number, as in /0");
        rc->db = (int)db;
    }
    ms_to_tv(connect_ms, &rc->connect_tv);
    ms_to_tv(timeout_ms, &rc->cmd_tv);
    if (dlock_uri_host_count(uri) > 1) /* Redlock: short per-node timeouts */
        ms_to_tv(node_ms, &rc->cmd_tv);
    rc->prefix = strdup(prefix ? prefix : "dlock:");
    return rc->prefix ? 0 : DLOCK_ENOMEM;
}

static int redis_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    struct redis_conn *rc;
    size_t n = dlock_uri_host_count(uri);
    unsigned char rnd[16];
    char hex[33];
    int err;

    if (n == 0)
        return dlock_seterr(c, DLOCK_EBADURI, "a redis:// URI needs a host, as in redis://127.0.0.1:6379/0");
    rc = calloc(1, sizeof *rc);
    if (!rc || !(rc->nodes = calloc(n, sizeof *rc->nodes))) {
        free(rc);
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    }
    rc->base.client = c;
    rc->nnodes = n;
    rc->user = dup_or_null(dlock_uri_user(uri));
    rc->password = dup_or_null(dlock_uri_password(uri));
    if ((err = parse_options(c, uri, rc)) != 0)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        rc->nodes[i].host = strdup(dlock_uri_host(uri, i));
        rc->nodes[i].port = dlock_uri_port(uri, i) ? (int)dlock_uri_port(uri, i) : DEFAULT_PORT;
        if (!rc->nodes[i].host) {
            err = dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if ((err = dlock_random_bytes(rnd, sizeof rnd)) != 0)
        goto fail;
    dlock_hex(rnd, sizeof rnd, hex);
    rc->channel_len = (size_t)snprintf(rc->channel, sizeof rc->channel, "%.40sw:%s",
                                       rc->prefix, hex);
    if (n == 1) {
        rc->base.caps = 0; /* the backend's caps */
        if ((err = dlock_redis_node_connect(rc, &rc->nodes[0], &rc->connect_tv)) != 0)
            goto fail;
    } else {
        /* Redlock: nodes are contacted per operation; open needs a quorum. */
        size_t up = 0;
        int first_err = 0;
        rc->base.caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING |
                        DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE;
        for (size_t i = 0; i < n; i++) {
            err = dlock_redis_node_connect(rc, &rc->nodes[i], &rc->connect_tv);
            if (err == DLOCK_EAUTH)
                goto fail;
            if (err == 0)
                up++;
            else if (!first_err)
                first_err = err;
            if (err)
                rc->nodes[i].retry_at = dlock_monotonic_ns() + 1000000000ull;
        }
        if (up < n / 2 + 1) {
            err = first_err ? first_err : DLOCK_ECONNECT;
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

static int reply_pair(struct redis_conn *rc, redisReply *r, long long *a, long long *b)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER)
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected reply from the lock script");
    *a = r->element[0]->integer;
    *b = r->element[1]->integer;
    return 0;
}

/* The subscriber connection, subscribed to our channel and confirmed. */
static int ensure_subscribed(struct redis_conn *rc, struct redis_node *n)
{
    redisReply *r = NULL;
    int err;
    if (n->sub)
        return 0;
    if ((err = dlock_redis_connect_ctx(rc, n, &n->sub, &rc->connect_tv)) != 0)
        return err;
    err = command(rc, n, &n->sub, &r, 2, (const char *[]){"SUBSCRIBE", rc->channel},
                  (size_t[]){9, rc->channel_len}, "SUBSCRIBE");
    int okay = err == 0 && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
               r->element[0]->type == REDIS_REPLY_STRING &&
               strcmp(r->element[0]->str, "subscribe") == 0;
    if (r)
        freeReplyObject(r);
    if (okay)
        return 0;
    /* A connection that is not subscribed must not pass for one. */
    if (n->sub)
        redisFree(n->sub);
    n->sub = NULL;
    return err ? err : dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected SUBSCRIBE reply");
}

/* A handoff message is "<owner>:<token>"; others' (stale) ones are skipped. */
static int handoff_for(redisReply *r, const char *owner, uint64_t *token)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_STRING ||
        strcmp(r->element[0]->str, "message") != 0)
        return 0;
    const char *p = r->element[2]->str;
    if (r->element[2]->len < 34 || memcmp(p, owner, 32) != 0 || p[32] != ':')
        return 0;
    *token = strtoull(p + 33, NULL, 10);
    return *token > 0;
}

/*
 * Waits until a handoff for owner arrives (1, *token set, *read_ns when
 * its bytes were read) or until_ns passes (0). Negative: error, connection
 * dropped.
 *
 * The wait may last as long as the holder's lease. A subscriber that has
 * heard nothing for `timeout` sends a PING (allowed while subscribed), and
 * one that gets no answer within another `timeout` is dropped with
 * DLOCK_ECONNECT: a server that hangs (or a network that stops carrying
 * anything) ends the wait within 2 * timeout, not the lease. A dead peer
 * is also noticed by TCP keepalive (see keepalive()).
 */
static int wait_handoff(struct redis_conn *rc, struct redis_node *n, const char *owner,
                        uint64_t until_ns, uint64_t *token, uint64_t *read_ns)
{
    uint64_t quiet = tv_ns(&rc->cmd_tv), heard = dlock_monotonic_ns(), ping_by = 0;
    /* What the reader holds was read by an earlier call, no later than now. */
    *read_ns = heard;
    for (;;) {
        void *reply = NULL;
        if (redisGetReplyFromReader(n->sub, &reply) != REDIS_OK)
            return dlock_redis_ctx_error(rc, n, &n->sub, "reading the wake-up channel");
        if (reply) {
            int mine = handoff_for(reply, owner, token);
            freeReplyObject(reply);
            if (mine)
                return 1;
            continue;
        }
        uint64_t now = dlock_monotonic_ns();
        if (now >= until_ns)
            return 0;
        if (ping_by && now >= ping_by) {
            dlock_seterr(cl(rc), DLOCK_ECONNECT,
                         "redis %s:%d: the wake-up channel did not answer a PING within %" PRIu64
                         " ms (timeout)", n->host, n->port, (uint64_t)(quiet / MS));
            redisFree(n->sub);
            n->sub = NULL;
            return DLOCK_ECONNECT;
        }
        if (!ping_by && now - heard >= quiet) {
            if (dlock_redis_send(rc, n->sub, 1, (const char *[]){"PING"}, (size_t[]){4}) != REDIS_OK)
                return dlock_redis_ctx_error(rc, n, &n->sub, "writing to the wake-up channel");
            ping_by = now + quiet;
        }
        uint64_t wake = ping_by ? ping_by : heard + quiet;
        if (wake > until_ns)
            wake = until_ns;
        struct pollfd pfd = {.fd = n->sub->fd, .events = POLLIN};
        struct timespec ts;
        dlock_ns_to_timespec(wake > now ? wake - now : 0, &ts);
        int pr = ppoll(&pfd, 1, &ts, NULL);
        if (pr < 0 && errno == EINTR)
            return dlock_seterr(cl(rc), DLOCK_EINTR, "a signal interrupted the wait");
        if (pr > 0) {
            if (redisBufferRead(n->sub) != REDIS_OK)
                return dlock_redis_ctx_error(rc, n, &n->sub, "reading the wake-up channel");
            *read_ns = heard = dlock_monotonic_ns();
            ping_by = 0;
        }
    }
}

static int run_op(struct redis_conn *rc, struct redis_held *h, const char **args,
                  const size_t *lens, size_t nargs, redisReply **out)
{
    const char *argv[16];
    size_t argvlen[16];
    size_t argc = dlock_redis_script_argv(rc, &h->keys, args, lens, nargs, argv, argvlen);
    return dlock_redis_script(rc, &rc->nodes[0], argc, argv, argvlen, out);
}

/* One acquire call of the script; 1 granted, 0 held (*pttl), <0 error. */
static int try_acquire(struct redis_conn *rc, struct redis_held *h, const char *mode,
                       long long *pttl)
{
    char ttl[16];
    redisReply *r = NULL;
    long long granted = 0, value = 0;
    int err;
    snprintf(ttl, sizeof ttl, "%" PRIu32, h->ttl_ms);
    const char *args[] = {"acquire", h->owner, ttl, rc->channel, mode};
    const size_t lens[] = {7, 32, strlen(ttl), rc->channel_len, strlen(mode)};
    /* A grant's lease starts on the server after this instant, even when
     * the reply that says so is the retry's. */
    uint64_t sent = dlock_monotonic_ns();
    err = run_op(rc, h, args, lens, 5, &r);
    if (err == DLOCK_ECONNECT) /* a lost reply: the owner id makes a retry safe */
        err = run_op(rc, h, args, lens, 5, &r);
    if (err)
        return err;
    err = reply_pair(rc, r, &granted, &value);
    freeReplyObject(r);
    if (err)
        return err;
    if (granted) {
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
                     const char *arg3, long long *result)
{
    const char *args[3] = {op, h->owner, arg3};
    size_t lens[3] = {strlen(op), 32, arg3 ? strlen(arg3) : 0};
    redisReply *r = NULL;
    int err = run_op(rc, h, args, lens, arg3 ? 3 : 2, &r);
    rc->retried = err == DLOCK_ECONNECT;
    if (rc->retried)
        err = run_op(rc, h, args, lens, arg3 ? 3 : 2, &r);
    if (err)
        return err;
    if (r->type != REDIS_REPLY_INTEGER) {
        freeReplyObject(r);
        return dlock_seterr(cl(rc), DLOCK_EPROTO, "unexpected reply from the lock script");
    }
    *result = r->integer;
    freeReplyObject(r);
    return 0;
}

/* Leaves the queue after a timeout or error; a handoff that raced us is
 * passed on to the next waiter. */
static void cancel_wait(struct redis_conn *rc, struct redis_held *h)
{
    char entry[160];
    long long res;
    dlock_errsave saved;
    snprintf(entry, sizeof entry, "%s|%" PRIu32 "|%s", h->owner, h->ttl_ms, rc->channel);
    dlock_err_save(cl(rc), &saved);
    /* Cleanup after a failure must not multiply it: one `timeout` in all,
     * a reconnection included. */
    rc->deadline_ns = dlock_monotonic_ns() + tv_ns(&rc->cmd_tv);
    int err = simple_op(rc, h, "cancel", entry, &res);
    rc->deadline_ns = 0;
    if (rc->nodes[0].cmd)
        redisSetTimeout(rc->nodes[0].cmd, rc->cmd_tv);
    if (err != 0 && rc->nodes[0].sub) {
        /* Still queued: drop the subscription, so that the queue entry
         * reads as a dead waiter (PUBSUB NUMSUB 0) and is skipped. */
        redisFree(rc->nodes[0].sub);
        rc->nodes[0].sub = NULL;
    }
    dlock_err_restore(cl(rc), &saved); /* report the original failure, not the cleanup */
}

/* A deadline bounds each call too, not only the wait between calls. */
static void bound_replies(struct redis_conn *rc, struct redis_node *n, uint64_t deadline_ns)
{
    uint64_t now = dlock_monotonic_ns(), left = deadline_ns > now ? deadline_ns - now : 0;
    uint64_t cmd = (uint64_t)rc->cmd_tv.tv_sec * 1000000000u + (uint64_t)rc->cmd_tv.tv_usec * 1000u;
    struct timeval tv;
    if (!n->cmd || left >= cmd)
        return;
    left = left < 1000000u ? 1000000u : left; /* at least 1 ms: 0 means no limit */
    tv.tv_sec = (time_t)(left / 1000000000u);
    tv.tv_usec = (suseconds_t)(left % 1000000000u / 1000u);
    redisSetTimeout(n->cmd, tv);
}

static int acquire_single(struct redis_conn *rc, const dlock_request *req, struct redis_held *h)
{
    struct redis_node *n = &rc->nodes[0];
    long long pttl = 0;
    int err;
    if (req->wait == DLOCK_WAIT_TRY) {
        err = try_acquire(rc, h, "try", &pttl);
        if (err == 0)
            return dlock_seterr(cl(rc), DLOCK_EBUSY, "the lock is held by another owner");
        return err < 0 ? err : 0;
    }
    if ((err = ensure_subscribed(rc, n)) != 0)
        return err;
    for (;;) {
        if (req->wait == DLOCK_WAIT_DEADLINE)
            bound_replies(rc, n, req->deadline_ns);
        err = try_acquire(rc, h, "wait", &pttl);
        if (req->wait == DLOCK_WAIT_DEADLINE && n->cmd)
            redisSetTimeout(n->cmd, rc->cmd_tv);
        if (err == 1)
            return 0;
        if (err < 0)
            break;
        /* Wait for our handoff; at the latest when the lease runs out. */
        uint64_t now = dlock_monotonic_ns();
        uint64_t until = now + (uint64_t)(pttl > 0 ? pttl : 1) * 1000000u + 1000000u;
        if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < until)
            until = req->deadline_ns;
        uint64_t token = 0, read_ns = 0;
        err = wait_handoff(rc, n, h->owner, until, &token, &read_ns);
        if (err == 1) {
            /* The lease started when the releaser's script handed it
             * over, a one-way trip before we read the message; the call's
             * start may be far older. */
            h->base.token = token;
            h->base.lease_end_ns = read_ns + (uint64_t)h->ttl_ms * MS;
            return 0;
        }
        if (err < 0)
            break;
        if (req->wait == DLOCK_WAIT_DEADLINE && dlock_monotonic_ns() >= req->deadline_ns) {
            err = dlock_seterr(cl(rc), DLOCK_ETIMEDOUT,
                               "the deadline passed with the lock still held elsewhere");
            break;
        }
    }
    cancel_wait(rc, h);
    return err;
}

static struct redis_held *held_new(struct redis_conn *rc, const dlock_request *req)
{
    struct redis_held *h = calloc(1, sizeof *h + req->name_len + 1);
    if (!h)
        return NULL;
    memcpy(h->owner, req->owner_hex, 33);
    h->ttl_ms = req->ttl_ms;
    h->name_len = req->name_len;
    memcpy(h->name, req->name, req->name_len + 1);
    if (dlock_redis_keys(rc, req->name, req->name_len, &h->keys) != 0) {
        free(h);
        return NULL;
    }
    return h;
}

static void held_free(struct redis_held *h)
{
    dlock_redis_keys_free(&h->keys);
    free(h);
}

static int redis_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_held *h = held_new(rc, req);
    int err;
    if (!h)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    err = rc->nnodes > 1 ? dlock_redlock_acquire(rc, req, h) : acquire_single(rc, req, h);
    if (err) {
        held_free(h);
        return err;
    }
    *heldp = &h->base;
    return 0;
}

static int redis_release(dlock_conn *conn, dlock_held *held)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_held *h = (struct redis_held *)held;
    long long res = 0;
    int err;
    if (rc->nnodes > 1)
        err = dlock_redlock_release(rc, h);
    else if ((err = simple_op(rc, h, "release", NULL, &res)) == 0 && res != 1)
        err = dlock_seterr(conn->client, DLOCK_ELOST,
                           "the lease had expired or another owner holds the lock%s",
                           rc->retried ? " (or a release whose reply was lost had already done it)"
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
    if (rc->nnodes > 1)
        return dlock_redlock_renew(rc, h, ttl_ms);
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    if ((err = simple_op(rc, h, "renew", ttl, &res)) != 0)
        return err;
    if (res != 1)
        return dlock_seterr(conn->client, DLOCK_ELOST,
                            "the lease had expired or another owner holds the lock");
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
    if (rc->nnodes > 1)
        return dlock_redlock_keep(kc, h, ttl_ms);
    snprintf(ttl, sizeof ttl, "%" PRIu32, ttl_ms);
    kc->deadline_ns = dlock_monotonic_ns() + tv_ns(&kc->cmd_tv);
    err = simple_op(kc, h, "renew", ttl, &res);
    kc->deadline_ns = 0;
    if (err)
        return err;
    if (res != 1)
        return dlock_seterr(conn->client, DLOCK_ELOST,
                            "the keeper's renewal was refused: the lease had expired or "
                            "another owner holds the lock");
    return 0;
}

static int redis_ping(dlock_conn *conn)
{
    struct redis_conn *rc = (struct redis_conn *)conn;
    struct redis_node *n = &rc->nodes[0];
    /* Redlock: a node still owed abandoned replies would answer with one. */
    for (size_t i = 0; i < rc->nnodes && n->stale; i++)
        n = &rc->nodes[i];
    if (n->stale)
        return dlock_seterr(conn->client, DLOCK_ECONNECT, "no Redlock node is ready to ping");
    int err = dlock_redis_node_connect(rc, n, &rc->connect_tv);
    if (err)
        return err;
    return command(rc, n, &n->cmd, NULL, 1, (const char *[]){"PING"}, (size_t[]){4}, "PING");
}

const dlock_backend dlock_redis_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .name = "redis",
    .schemes = redis_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE,
    .options = redis_options,
    .open = redis_open,
    .close = redis_close,
    .acquire = redis_acquire,
    .release = redis_release,
    .renew = redis_renew,
    .ping = redis_ping,
    .keep = redis_keep,
};
