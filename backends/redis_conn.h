/* Redis backend internals shared by the single-instance and Redlock paths. */
#ifndef DLOCK_BACKENDS_REDIS_CONN_H
#define DLOCK_BACKENDS_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include "dlock_backend.h"

struct redis_node {
    char *host;
    int port;
    redisContext *cmd; /* NULL until connected, and again after an I/O error */
    redisContext *sub; /* subscriber connection, opened on the first wait */
    unsigned stale;    /* replies still to come for calls we stopped waiting for */
    uint64_t retry_at; /* after a failed connect, not before (CLOCK_MONOTONIC ns) */
};

struct redis_conn {
    dlock_conn base;
    char *user, *password; /* copies; the password is wiped on close */
    char *prefix;
    int db;
    struct timeval connect_tv, cmd_tv;
    size_t nnodes; /* 1: single instance; more: Redlock */
    struct redis_node *nodes;
    char sha[41];       /* SHA1 of the script, as SCRIPT LOAD returned it */
    char channel[96];   /* this connection's wake-up channel (single) */
    size_t channel_len;
    int retried;        /* the last call was sent again after a lost reply */
};

/* Keys of one lock name: "<prefix><name>:lock", ":fence", ":queue". */
struct redis_keys {
    const char *k[3];
    size_t len[3];
    char *buf;
};

struct redis_held {
    dlock_held base;
    char owner[33];
    uint32_t ttl_ms;
    struct redis_keys keys;
    size_t name_len;
    char name[];
};

int dlock_redis_keys(struct redis_conn *rc, const char *name, size_t len,
                     struct redis_keys *keys);
void dlock_redis_keys_free(struct redis_keys *keys);
/* Connects *ctxp to node n within tv, with replies bounded by the command
 * (single) or node (Redlock) timeout, and authenticates. */
int dlock_redis_connect_ctx(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                            const struct timeval *tv);
/* Connects node n's command connection if needed (AUTH, SELECT, SCRIPT LOAD). */
int dlock_redis_node_connect(struct redis_conn *rc, struct redis_node *n,
                             const struct timeval *tv);
/* Drops a connection after an I/O error, recording why; returns the code. */
int dlock_redis_ctx_error(struct redis_conn *rc, struct redis_node *n,
                          redisContext **ctxp, const char *what);
/* Builds EVALSHA argv: sha, 3 keys, then the n extra args. */
size_t dlock_redis_script_argv(struct redis_conn *rc, const struct redis_keys *keys,
                               const char **extra, const size_t *extra_len, size_t n,
                               const char **argv, size_t *argvlen);
/* Runs the script on node n synchronously (EVAL fallback on NOSCRIPT). */
int dlock_redis_script(struct redis_conn *rc, struct redis_node *n, size_t argc,
                       const char **argv, const size_t *argvlen, redisReply **out);

/* Redlock (backends/redlock.c). */
int dlock_redlock_acquire(struct redis_conn *rc, const dlock_request *req,
                          struct redis_held *h);
int dlock_redlock_release(struct redis_conn *rc, struct redis_held *h);
int dlock_redlock_renew(struct redis_conn *rc, struct redis_held *h, uint32_t ttl_ms);

#endif
