/*
 * Store-wide tokens of one Redis and of a Cluster (token_top, raise_floor;
 * Redlock's quorum of them is redlock.c's, on this file's node_top()).
 *
 * The floor lives in one key per prefix, "<prefix>floor" (a plain integer
 * string, no expiry: durable as the fence counters are, by the server's
 * persistence; missing means 0). raise_floor is one script call (floor =
 * max(floor, value)); every grant reads the key in its own script call, as
 * its fourth key, so its token is > the floor with no extra round trip,
 * only one more GET inside the script. token_top is max(every
 * "<prefix>*:fence" counter, the floor, TIME in µs): a SCAN (COUNT 1000,
 * the prefix's glob characters escaped) and an MGET per page, then GET and
 * TIME, each round trip bounded by `timeout`: O(keys in the database) in
 * all, an admin operation. Another prefix that starts with this one
 * ("dlock:" and "dlock:x:") is counted too, which only raises the top.
 * Redis Cluster: a floor key per slot, "<prefix>{T}floor" in the slot of
 * tag T, and every key of a name carries its slot's tag (redis_keys.c);
 * raise_floor raises all 16384, pipelined to their owners
 * (cluster_raise_floor()).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "core/internal.h"

#define MS 1000000ull
#define tv_ns dlock_redis_tv_ns

static dlock_client *cl(struct redis_conn *rc)
{
    return rc->base.client;
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

/* Keys per SCAN page: one SCAN and one MGET of what it found per page. */
#define SCAN_COUNT "1000"

char *dlock_redis_floor_key(struct redis_conn *rc, size_t *len)
{
    /* layout=plain: beside the peers' keys, "dlock:<prefix>floor". */
    const char *side = rc->plain ? DLOCK_REDIS_PLAIN_SIDE : "";
    size_t slen = strlen(side), plen = strlen(rc->prefix);
    char *k = malloc(slen + plen + sizeof "floor");
    if (!k)
        return NULL;
    memcpy(k, side, slen);
    memcpy(k + slen, rc->prefix, plen);
    memcpy(k + slen + plen, "floor", sizeof "floor");
    *len = slen + plen + sizeof "floor" - 1;
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
    /* layout=plain: "dlock:<prefix>*:fence" (no glob character in it). */
    const char *side = rc->plain ? DLOCK_REDIS_PLAIN_SIDE : "";
    size_t plen = strlen(rc->prefix), o = strlen(side);
    char *p = malloc(o + 2 * plen + sizeof "{*}floor"); /* room for either */
    if (!p)
        return NULL;
    memcpy(p, side, o);
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
        dlock_redis_io_free(n->cmd);
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

/* A cluster's top: the largest over its primaries (each one's counters,
 * floors and TIME), each bounded by `timeout`; the map is read first. */
static int cluster_top(struct redis_conn *rc, uint64_t *top)
{
    struct redis_node *prim[REDIS_CLUSTER_MAX_NODES];
    uint64_t best = 0;
    uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
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
    uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
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
    uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
    for (unsigned i = 0; i < count; i++) {
        const char *argv[8];
        size_t argvlen[8];
        struct redis_node *n = dlock_redis_cluster_peek(rc, first + i);
        to[i] = NULL;
        if (!n || down[n - rc->nodes])
            continue;
        if (n->stale && n->cmd) { /* owes replies to abandoned calls: start afresh */
            dlock_redis_io_free(n->cmd);
            n->cmd = NULL;
        }
        int kl = snprintf(key + plen, 16, "{%s}floor", dlock_redis_slot_tag(first + i));
        size_t argc = dlock_redis_floor_argv(rc, key, plen + (size_t)kl, value, argv, argvlen);
        if (dlock_redis_node_connect(rc, n, tv_ns(&rc->connect_tv)) != 0 ||
            redisAppendCommandArgv(n->cmd, (int)argc, argv, argvlen) != REDIS_OK) {
            if (n->cmd) { /* calls already buffered there: never sent */
                dlock_redis_io_free(n->cmd);
                n->cmd = NULL;
            }
            down[n - rc->nodes] = 1;
            continue;
        }
        to[i] = n;
    }
    for (size_t k = 0; k < rc->nnodes; k++) {
        struct redis_node *n = &rc->nodes[k];
        if (n->cmd && !down[k]) {
            if (dlock_redis_flush(rc, n->cmd) != REDIS_OK) {
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
        uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
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
        uint64_t saved = dlock_redis_limit(rc, dlock_redis_call_until(rc));
        int np = dlock_redis_cluster_primaries(rc, prim);
        dlock_redis_unlimit(rc, saved);
        err = np < 0 ? np : 0;
        for (int i = 0; i < np && !err; i++)
            err = dlock_redis_ack_after(rc, prim[i], "the raised floors");
    }
    return err;
}

/*
 * token_top on one Redis (a Cluster: cluster_top()): the largest fence
 * counter under the prefix (a SCAN of "<prefix>*:fence"), the floor key and
 * TIME in µs. A connection found reset (a server restart since the last
 * call) is made again once.
 */
int dlock_redis_floor_top(struct redis_conn *rc, uint64_t *top)
{
    struct redis_node *n = &rc->nodes[0];
    if (rc->mode == REDIS_CLUSTER)
        return cluster_top(rc, top);
    int had = n->cmd != NULL;
    int err = dlock_redis_node_top(rc, n, top);
    if (err == DLOCK_ECONNECT && had && (err = dlock_redis_node_top(rc, n, top)) == 0)
        dlock_clearerr(cl(rc));
    return err;
}

/*
 * raise_floor on one Redis: the script's "floor" (floor key = max(floor
 * key, floor)), one call bounded by `timeout`, repeated once after a lost
 * reply (it is idempotent). The key never expires: durable as the
 * counters are (the server's persistence).
 */
int dlock_redis_floor_raise(struct redis_conn *rc, uint64_t floor)
{
    size_t key_len = 0;
    char value[24], *key;
    int err;
    snprintf(value, sizeof value, "%" PRIu64, floor);
    if (rc->mode == REDIS_CLUSTER)
        return cluster_raise_floor(rc, value);
    if (!(key = dlock_redis_floor_key(rc, &key_len)))
        return dlock_seterr(cl(rc), DLOCK_ENOMEM, "out of memory");
    err = floor_call(rc, &rc->nodes[0], 0, key, key_len, value);
    free(key);
    if (err)
        return err;
    return dlock_redis_ack_after(rc, rc->last_node, "the raised floor");
}

