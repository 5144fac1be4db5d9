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
    /* The keeper's own connection(s), made on the keeper's thread at its
     * first keep() and freed by close: same nodes, credentials and prefix,
     * none of this struct's sockets. NULL until then. */
    struct redis_conn *keeper;
    struct redis_conn *parent; /* set on a keeper connection: it borrows the
                                  parent's strings */
    /* CLOCK_MONOTONIC ns; when set, every synchronous step (connect, each
     * command) waits at most what is left of it: a keeper's call, or a
     * waiter's cleanup. 0: each step has its own timeout. */
    uint64_t deadline_ns;
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
/*
 * Every hiredis call that may write to a socket goes through these three:
 * hiredis writes with write(2), so each runs with SIGPIPE blocked in the
 * calling thread (dlock_sigpipe_block), and a keeper connection's deadline
 * bounds the reply.
 */
/* redisCommandArgv: NULL on an I/O error (ctx->err says which). */
redisReply *dlock_redis_call(struct redis_conn *rc, redisContext *ctx, size_t argc,
                             const char **argv, const size_t *argvlen);
/* redisAppendCommandArgv and a write of the whole buffer; REDIS_OK or
 * REDIS_ERR (ctx->err says which). */
int dlock_redis_send(struct redis_conn *rc, redisContext *ctx, size_t argc, const char **argv,
                     const size_t *argvlen);
/* redisGetReply (which first writes what is still buffered). */
int dlock_redis_get_reply(struct redis_conn *rc, redisContext *ctx, void **reply);

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
/* The keeper's renewal, on the keeper's connection kc: 0, DLOCK_ELOST when
 * the nodes that answered rule out a quorum, else a transient error. */
int dlock_redlock_keep(struct redis_conn *kc, struct redis_held *h, uint32_t ttl_ms);

#endif
