/*
 * redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/db][?options]:
 * the primary that Redis Sentinel names for SERVICE. The hosts are the
 * sentinels; user and password are the data nodes' (options
 * sentinel_user, sentinel_password: the sentinels', when they want one).
 * The lock operations are the single instance's (redis_lock.c), on the
 * primary.
 *
 * Every new connection to the primary (the command connection, a waiter's
 * subscriber connection, the keeper's) first asks the sentinels, in turn
 * from the one that answered that connection last, `SENTINEL
 * get-master-addr-by-name SERVICE` (the connection layer's resolve hook,
 * resolve() below), then checks with ROLE, in the connection's pipelined
 * handshake (redis_conn.c), that the node it reached is a primary: during
 * a failover the sentinels may still name the old one (a
 * user whose ACL denies ROLE is not refused: the check is skipped, and a
 * replica still refuses writes with READONLY). A connection kept across a
 * failover meets it in one of three ways, each of which makes the next
 * call connect (and so ask) again: the old primary is gone (an I/O
 * error), it was turned into a replica (a write is refused with READONLY),
 * or the address the sentinels give has changed (the node's sockets are
 * dropped when a new connection resolves elsewhere). Nothing is
 * subscribed on the sentinels (+switch-master): a client learns of a
 * failover when it next uses the primary, which every waiter does at the
 * latest when the holder's lease ends, and every keeper at each renewal.
 *
 * The questions are bounded by connect_timeout and by the call's bound in
 * all; while other sentinels remain, one gets at most half of what is
 * left, and one that failed is asked last the next time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "core/internal.h"

#define DEFAULT_SENTINEL_PORT 26379
#define MS 1000000ull

struct redis_sentinel {
    size_t n;
    char **host;
    int *port;
    char *service;
    char *user, *password; /* the sentinels' own; NULL: none */
};

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
}

void dlock_redis_sentinel_free(struct redis_sentinel *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->host[i]);
    free(s->host);
    free(s->port);
    free(s->service);
    if (s->password)
        explicit_bzero(s->password, strlen(s->password));
    free(s->password);
    free(s->user);
    free(s);
}

static const struct redis_topology sentinel_topology;

int dlock_redis_sentinel_open(struct redis_conn *rc, const dlock_uri *uri)
{
    dlock_client *c = cl(rc);
    const char *path = dlock_uri_path(uri), *slash;
    const char *su = dlock_uri_param(uri, "sentinel_user");
    const char *sp = dlock_uri_param(uri, "sentinel_password");
    size_t n = dlock_uri_host_count(uri), len;
    struct redis_sentinel *s;

    if (path[0] == '/')
        path++;
    slash = strchr(path, '/');
    len = slash ? (size_t)(slash - path) : strlen(path);
    if (len == 0)
        return dlock_seterr(c, DLOCK_EBADURI,
                            "a redis+sentinel:// URI names the service after the sentinels, as "
                            "in redis+sentinel://127.0.0.1:26379/mymaster/0");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)path[i] <= ' ' || path[i] == 0x7f)
            return dlock_seterr(c, DLOCK_EBADURI,
                                "the service name of a redis+sentinel:// URI has a space or "
                                "control character");
    if (slash) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || slash[1] < '0' || slash[1] > '9' || db < 0 || db > 65535)
            return dlock_seterr(c, DLOCK_EBADURI,
                                "after the service, the path of a redis+sentinel:// URI is a "
                                "database number, as in /mymaster/0");
        rc->db = (int)db;
    }
    if (!(s = calloc(1, sizeof *s)) || !(s->host = calloc(n, sizeof *s->host)) ||
        !(s->port = calloc(n, sizeof *s->port)) || !(s->service = strndup(path, len)) ||
        (su && !(s->user = strdup(su))) || (sp && !(s->password = strdup(sp))))
        goto oom;
    for (size_t i = 0; i < n; i++, s->n++) {
        if (!(s->host[i] = strdup(dlock_uri_host(uri, i))))
            goto oom;
        s->port[i] = dlock_uri_port(uri, i) ? (int)dlock_uri_port(uri, i) : DEFAULT_SENTINEL_PORT;
    }
    rc->sentinel = s;
    rc->topo = &sentinel_topology;
    return 0;
oom:
    dlock_redis_sentinel_free(s);
    return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
}

/* Asks sentinel i; 0 with host and *port set, or the error. */
static int ask(struct redis_conn *rc, size_t i, uint64_t until, char *host, size_t cap,
               int *port)
{
    struct redis_sentinel *s = rc->sentinel;
    uint64_t now = dlock_monotonic_ns(), left = until > now + MS ? until - now : MS;
    const char *argv[3];
    size_t lens[3], argc = 0;
    void *v = NULL;
    int err = 0;

    /* rediss+sentinel://: TLS to the sentinels as to the primary. */
    redisContext *ctx = dlock_redis_io_connect(rc->tls, s->host[i], s->port[i], left,
                                               dlock_redis_tv_ns(&rc->cmd_tv));
    if (!ctx)
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    if (ctx->err) {
        err = dlock_seterr(cl(rc),
                           ctx->err == DLOCK_REDIS_ERR_TLS_AUTH ? DLOCK_EAUTH : DLOCK_ECONNECT,
                           "redis sentinel %s:%d: cannot connect: %s", s->host[i], s->port[i],
                           ctx->errstr);
        goto out;
    }
    if (s->password) {
        argv[argc] = "AUTH", lens[argc++] = 4;
        if (s->user && s->user[0])
            argv[argc] = s->user, lens[argc++] = strlen(s->user);
        argv[argc] = s->password, lens[argc++] = strlen(s->password);
        if (dlock_redis_send(rc, ctx, argc, argv, lens) != REDIS_OK)
            goto io;
    }
    if (dlock_redis_send(rc, ctx, 3,
                         (const char *[]){"SENTINEL", "get-master-addr-by-name", s->service},
                         (size_t[]){8, 23, strlen(s->service)}) != REDIS_OK)
        goto io;
    for (int k = s->password ? 0 : 1; k < 2; k++) {
        if (dlock_redis_get_reply(rc, ctx, &v) != REDIS_OK || !v)
            goto io;
        redisReply *r = v;
        if (r->type == REDIS_REPLY_ERROR) {
            int auth = dlock_redis_reply_error_kind(r) == DLOCK_REDIS_ERR_AUTH ||
                       strstr(r->str, "AUTH") != NULL;
            err = dlock_seterr(cl(rc), auth ? DLOCK_EAUTH : DLOCK_ESTORE,
                               "redis sentinel %s:%d: %s: %.120s%s", s->host[i], s->port[i],
                               k == 0 ? "AUTH" : "SENTINEL get-master-addr-by-name", r->str,
                               auth && !s->password ? " (give the sentinels' password with "
                                                      "the sentinel_password option)"
                                                    : "");
        } else if (k == 1 && dlock_redis_reply_addr(r, host, cap, port) != 0) {
            err = dlock_seterr(cl(rc), DLOCK_ESTORE,
                               "redis sentinel %s:%d does not know a primary for service "
                               "\"%.64s\"",
                               s->host[i], s->port[i], s->service);
        }
        freeReplyObject(r);
        if (err)
            goto out;
    }
    goto out;
io:
    err = dlock_seterr(cl(rc), ctx->err == DLOCK_REDIS_ERR_TLS_AUTH ? DLOCK_EAUTH : DLOCK_ECONNECT,
                       "redis sentinel %s:%d: %s", s->host[i],
                       s->port[i], ctx->errstr[0] ? ctx->errstr : "connection lost");
out:
    dlock_redis_io_free(ctx);
    return err;
}

/* Which failure says most: a refused password, then a sentinel that does
 * not know the service, then one that could not be reached. */
static int rank(int err)
{
    return err == DLOCK_EAUTH ? 3 : err == DLOCK_ESTORE ? 2 : err ? 1 : 0;
}

/* The connection layer's hook, before every new connection to the
 * primary: asks the sentinels, in turn, for the service's primary, and
 * points n at it; within budget_ns and rc's bound. A node that moved drops
 * its sockets. */
static int resolve(struct redis_conn *rc, struct redis_node *n, uint64_t budget_ns)
{
    struct redis_sentinel *s = rc->sentinel;
    uint64_t until = dlock_monotonic_ns() + dlock_redis_time_left(rc, budget_ns);
    dlock_errsave best = {0, ""};
    char host[256];
    int port = 0;
    /* Each connection (a keeper's too: it only reads s) starts with the
     * sentinel that answered it last, and a sentinel that failed is passed
     * over next time. While others remain, one gets at most half of what
     * is left, so that a silent one cannot use it all. */
    for (size_t k = 0; k < s->n; k++) {
        size_t i = (rc->sentinel_next + k) % s->n;
        uint64_t now = dlock_monotonic_ns(), left = until > now ? until - now : 0;
        uint64_t mine = now + (k + 1 < s->n ? left / 2 : left);
        uint64_t saved = dlock_redis_limit(rc, mine);
        int err = ask(rc, i, mine, host, sizeof host, &port);
        dlock_redis_unlimit(rc, saved);
        if (err == 0) {
            rc->sentinel_next = i;
            if (!n->host || strcmp(n->host, host) != 0 || n->port != port) {
                char *h = strdup(host);
                if (!h)
                    return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
                /* The primary moved: whatever is open goes to the old one. */
                if (n->cmd)
                    dlock_redis_io_free(n->cmd);
                dlock_redis_drop_sub(n);
                n->cmd = NULL;
                n->stale = 0;
                n->armed[0] = n->armed[1] = 0;
                free(n->host);
                n->host = h;
                n->port = port;
            }
            return 0;
        }
        if (err == DLOCK_ENOMEM)
            return err;
        if (rank(err) > rank(best.err))
            dlock_err_save(cl(rc), &best);
        if (k == 0)
            rc->sentinel_next = (i + 1) % s->n;
        if (dlock_monotonic_ns() >= until)
            break;
    }
    dlock_err_restore(cl(rc), &best);
    return best.err;
}

static const struct redis_topology sentinel_topology = {
    .resolve = resolve,
};
