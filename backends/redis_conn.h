/*
 * The Redis backend's internal header: the types and constants its files
 * share, and each file's functions, bottom layer first. Calls run one way,
 * down this list:
 *   redis.c (front: the method table, open and close)
 *   redis_lock.c (single instance), redlock.c (Redlock): the recipes,
 *     struct redis_recipe, one picked at open
 *   redis_elect.c: an election's watch (subscriber connections)
 *   redis_floor.c: store-wide token_top and raise_floor
 *   redis_plain.c: layout=plain's wake-up channel (keyspace notifications
 *     or dlock's release channel), for redlock.c
 *   redis_cluster.c, redis_sentinel.c: the topologies, which plug into the
 *     connection layer through struct redis_topology (set at open)
 *   redis_conn.c: connections, send/receive, bounds, subscriptions
 *   redis_io.c: the transport (TCP, TLS for rediss://, bytes in and out)
 *   redis_keys.c (names, slots), redis_reply.c (replies): pure
 */
#ifndef DLOCK_BACKENDS_REDIS_CONN_H
#define DLOCK_BACKENDS_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include "dlock_backend.h"
#include "backends/redis_reply.h"

struct redis_node {
    char *host;
    int port;
    redisContext *cmd; /* NULL until connected, and again after an I/O error */
    redisContext *sub; /* subscriber connection, opened on the first wait */
    unsigned stale;    /* replies still to come for calls we stopped waiting for */
    uint64_t retry_at; /* after a failed connect, not before (CLOCK_MONOTONIC ns) */
    int subscribed;    /* sub is subscribed to the current wait's channel */
    int connected;     /* cmd was connected once (a new one is a reconnect) */
    /* The socket timeouts last set on cmd [0] and sub [1] (ns; 0: not
     * known), so that a call whose bound is the same need not set them
     * again: two system calls saved per command (redis_conn.c's arm()). */
    uint64_t armed[2];
};

/* What a URI's scheme and host list make of a connection. */
enum redis_mode {
    REDIS_SINGLE,   /* redis://host: one Redis */
    REDIS_REDLOCK,  /* redis://h1,h2,h3: independent instances, a quorum */
    REDIS_CLUSTER,  /* redis+cluster://seeds: Redis Cluster (redis_cluster.c) */
    REDIS_SENTINEL, /* redis+sentinel://sentinels/service: the primary the
                       sentinels name (redis_sentinel.c) */
};

/* Redis Cluster has 16384 hash slots. */
#define REDIS_SLOTS 16384u
/* Nodes one cluster connection may know (a node is never forgotten, so
 * pointers to them stay valid while the connection lives). */
#define REDIS_CLUSTER_MAX_NODES 256
struct redis_cluster;  /* the slot map (redis_cluster.c) */
struct redis_sentinel; /* the sentinels and the service (redis_sentinel.c) */
struct redis_conn;
struct redis_held;
struct redis_keys;

/* What a topology adds to the connection layer, which calls it and
 * nothing else above it. Set at open (dlock_redis_cluster_open(),
 * dlock_redis_sentinel_open()); NULL (one Redis, Redlock): none. A hook
 * left NULL is not called. */
struct redis_topology {
    /* Before every new connection to node n: point n at the primary now
     * (Sentinel), within budget_ns and rc's bound; 0 or the error. */
    int (*resolve)(struct redis_conn *rc, struct redis_node *n, uint64_t budget_ns);
    /* Node asked refused a subscription with a MOVED (Cluster): the map is
     * stale, and the slot's owner is the node d names. */
    void (*redirected)(struct redis_conn *rc, const struct redis_redirect *d,
                       struct redis_node *asked);
    /* The map is out of date (Cluster: a subscription refused with ASK). */
    void (*stale)(struct redis_conn *rc);
};

/* A recipe: the lock operations over the topology's node(s), picked at
 * open (dlock_redis_single_recipe: one Redis, a Cluster, a Sentinel's
 * primary; dlock_redlock_recipe: independent instances). The front
 * (redis.c) has made h, checked a floor (dlock_redis_floor_ok()) and, for
 * keep, made the keeper's connection kc. */
struct redis_recipe {
    int (*acquire)(struct redis_conn *rc, const dlock_request *req, struct redis_held *h);
    int (*release)(struct redis_conn *rc, struct redis_held *h);
    int (*renew)(struct redis_conn *rc, struct redis_held *h, uint32_t ttl_ms);
    /* The keeper's renewal: 0, DLOCK_ELOST when the store says the lock
     * is not ours, else a transient error. */
    int (*keep)(struct redis_conn *kc, struct redis_held *h, uint32_t ttl_ms);
    int (*raise)(struct redis_conn *rc, struct redis_held *h, uint64_t floor);
    int (*top)(struct redis_conn *rc, uint64_t *top);
    int (*raise_floor)(struct redis_conn *rc, uint64_t floor);
    int (*inspect)(struct redis_conn *rc, const char *name, size_t len, dlock_info *info);
    int (*holders)(struct redis_conn *rc, const char *name, size_t len, dlock_holder *out,
                   size_t capacity, size_t *count);
    /* Elections (dlock_backend.h's publish, leader, wake), on the value
     * key ":leader" beside the lock's keys, which is also the channel the
     * watch subscribes to (backends/redis_elect.c). */
    int (*publish)(struct redis_conn *rc, struct redis_held *h, const void *value, size_t len);
    int (*leader)(struct redis_conn *rc, const char *name, size_t len, dlock_info *info,
                  char *value, size_t *value_len);
    int (*wake)(struct redis_conn *rc, const char *name, size_t len);
};

/* A deadline wait's calls may run this far past the deadline (so that a
 * deadline already past still makes one attempt)... */
#define DLOCK_REDIS_FLOOR_NS 50000000ull
/* ...and leaving the queue (or undoing a partial Redlock grant) after
 * giving up, this much more: 200 ms past the deadline in all. Cleanup that
 * does not finish in time is abandoned safely (redis_lock.c's
 * cancel_wait()). */
#define DLOCK_REDIS_CLEANUP_NS 150000000ull

struct redis_tls; /* rediss://: TLS settings (redis_io.c) */

struct redis_conn {
    dlock_conn base;
    /* rediss://: every connection speaks TLS with these settings (NULL:
     * plain TCP); a keeper connection borrows its parent's. */
    struct redis_tls *tls;
    char *user, *password; /* copies; the password is wiped on close */
    char *prefix;
    int db;
    struct timeval connect_tv, cmd_tv;
    enum redis_mode mode;
    const struct redis_topology *topo; /* NULL: none (see above) */
    const struct redis_recipe *recipe;
    /* Single and Sentinel: 1 (Sentinel: the primary, found on connect).
     * Redlock: the instances. Cluster: the nodes known so far, the seeds
     * first (nseeds of them); room for REDIS_CLUSTER_MAX_NODES. */
    size_t nnodes, nseeds;
    struct redis_node *nodes;
    struct redis_cluster *cluster;   /* Cluster only; owned */
    struct redis_sentinel *sentinel; /* Sentinel only; a keeper connection
                                        borrows its parent's, read only */
    size_t sentinel_next; /* the sentinel this connection asks first */
    /* The node that ran the last script call (WAIT goes there). */
    struct redis_node *last_node;
    /* wait_replicas=N (not Redlock): a grant is reported only once N
     * replicas acknowledged it (WAIT), or the acquire fails. */
    unsigned wait_replicas;
    /* The script: plain (PUBLISH, PUBSUB NUMSUB) or, for a cluster,
     * sharded (SPUBLISH, PUBSUB SHARDNUMSUB), and its length. */
    const char *lua;
    size_t lua_len;
    char sha[41];       /* SHA1 of the script, as SCRIPT LOAD returned it */
    int allow_eviction; /* URI option: accept a maxmemory-policy that evicts */
    /* layout=plain: the lock is the peers' plain key "<prefix><name>"
     * (SET NX PX, compare-and-delete), dlock's own keys beside it under
     * DLOCK_REDIS_PLAIN_SIDE; run by the Redlock recipe over the node(s)
     * (one Redis, a Sentinel's primary, or Redlock's instances). */
    int plain;
    /* layout=plain: the acquire's cancel_fd while it runs (-1: none), which
     * also ends a round of grab calls (one Redis answers within `timeout`,
     * not node_timeout: a cancel must not wait for it). */
    int cancel_fd;
    int retried;        /* the last call was sent again after a lost reply */
    /* The keeper's own connection(s), made on the keeper's thread at its
     * first keep() and freed by close: same nodes, credentials and prefix,
     * none of this struct's sockets. NULL until then. */
    struct redis_conn *keeper;
    struct redis_conn *parent; /* set on a keeper connection: it borrows the
                                  parent's strings */
    /* CLOCK_MONOTONIC ns; when set, every step (connect, handshake, each
     * reply) waits at most what is left of it: the bound of the whole
     * call (dlock_redis_limit()). 0: each reply waits `timeout`. */
    uint64_t deadline_ns;
};

/* Keys of one lock name: "<prefix><name>:lock", ":fence", ":queue", the
 * store-wide floor "<prefix>floor" (no name's key: theirs all end in one
 * of the suffixes), ":raised" (the mark of raise_token), ":holders" and
 * ":modes" (shared holders and permits, see redis_script.h), and
 * ":leader", an election's published value (also the name of its
 * channel). The floor script call gets the floor key alone; the lock
 * operations get REDIS_NKEYS_ALL (the first REDIS_NKEYS are what the
 * script of the previous release took), the election ones all
 * REDIS_NKEYS_ELECT. */
enum { REDIS_NKEYS = 4, REDIS_KEY_RAISED = 4, REDIS_NKEYS_ALL = 7, REDIS_KEY_LEADER = 7,
       REDIS_NKEYS_ELECT = 8 };
struct redis_keys {
    unsigned slot; /* Cluster: the hash slot of every key (and channel) */
    const char *k[REDIS_NKEYS_ELECT];
    size_t len[REDIS_NKEYS_ELECT];
    char *buf;        /* small, or malloc'ed for long names */
    char small[896];  /* so that a call on a short name needs no malloc
                         (names up to about 100 bytes, as with 7 keys
                         before the election value key)
                         (and a release cannot fail for want of memory);
                         never copy a struct redis_keys */
};

/* layout=plain: what dlock keeps beside the peers' key "<prefix><name>":
 * the keys layout=dlock would use with prefix "dlock:<prefix>" (the
 * counter "dlock:<prefix><name>:fence", the floor "dlock:<prefix>floor",
 * the release channel "dlock:<prefix><name>:released"). */
#define DLOCK_REDIS_PLAIN_SIDE "dlock:"
/* layout=plain without keyspace notifications: a waiter behind a peer's
 * holder tries again this often (dlock's own releases wake it at once). */
#define DLOCK_REDIS_PLAIN_POLL_NS 25000000ull

/* Small on purpose (a client may hold 100 000): 80 bytes. */
struct redis_held {
    dlock_held base;
    char owner[32];     /* the owner id's hex digits, not NUL-terminated */
    uint32_t ttl_ms;
    uint32_t name_len : 13; /* <= DLOCK_NAME_MAX (4096) */
    uint32_t shared : 1;    /* a reader */
    uint32_t limit : 16;    /* a permit of a semaphore of limit (0: none) */
    /* Redlock: the end of the last confirmed validity (CLOCK_MONOTONIC ns).
     * base.lease_end_ns is zeroed by the core before each renewal; this is
     * not, so a raise between renewals still knows the lock is valid. */
    uint64_t valid_until;
    /* The request's name, which the core keeps until the release (see
     * dlock_request); nothing derived from it is kept (keys, channels):
     * each call builds what it needs. */
    const char *name;
};

/* Tokens stay below 2^53 (the script's numbers are doubles): a floor must
 * be below 2^53 - 1, the largest token, so that floor + 1 fits. */
#define DLOCK_REDIS_TOKEN_MAX UINT64_C(9007199254740991)

/* Script call replies that are not errors of the call but a direction:
 * filled by dlock_redis_script_asking() when asked to, which then returns
 * REDIS_REDIRECTED. */
#define REDIS_REDIRECTED 1

/* ---- redis_keys.c: names (pure) ------------------------------------------ */

/* The slot of a lock name: CRC16 (XMODEM) of the name, mod 16384. */
unsigned dlock_redis_slot(const char *name, size_t len);
/* A short string (at most 4 characters) whose own slot is slot: the hash
 * tag that puts every key and channel of the names of that slot in it. */
const char *dlock_redis_slot_tag(unsigned slot);
int dlock_redis_keys(struct redis_conn *rc, const char *name, size_t len,
                     struct redis_keys *keys);
void dlock_redis_keys_free(struct redis_keys *keys);
/* The channel a release of name publishes on (the script's "drop"):
 * "<prefix><name>:released" (layout=plain: DLOCK_REDIS_PLAIN_SIDE before
 * it), malloc'ed, *len its length; NULL: out of memory. */
char *dlock_redis_release_channel(struct redis_conn *rc, const char *name, size_t len,
                                  size_t *chan_len);
/* An election publish's sequence number: 16 hex digits and a NUL (the
 * publisher's CLOCK_MONOTONIC ns: one holder's publishes in order). */
void dlock_redis_pub_seq(char seq[17]);
/* h's keys, malloc'ed (free with dlock_redis_keys_free); DLOCK_ENOMEM with
 * detail when out of memory. */
int dlock_redis_held_keys(struct redis_conn *rc, const struct redis_held *h,
                          struct redis_keys *keys);
/* The detail of a request refused because the name is held as another
 * kind (the script's {2, limit}: 0 a read-write lock, N a semaphore of N):
 * DLOCK_EMODE. */
int dlock_redis_emode(struct redis_conn *rc, const struct redis_held *h, long long held_limit);
/* h's kind as the script names it: 0 an exclusive lock, 's' a reader, 'p'
 * a permit (see redis_script.h). */
#define DLOCK_REDIS_KIND(h) ((h)->shared ? 's' : (h)->limit ? 'p' : 0)
/* The script's operation on h in h's kind: an exclusive lock's name, or
 * the shared one's ("s" before it: "srelease", "srenew", ...). */
#define DLOCK_REDIS_OP(h, name) (DLOCK_REDIS_KIND(h) ? "s" name : name)
/* Builds EVALSHA argv: sha, the first nkeys keys (REDIS_NKEYS, or
 * REDIS_NKEYS_ALL), then the n extra args. */
size_t dlock_redis_script_argv(struct redis_conn *rc, const struct redis_keys *keys,
                               size_t nkeys, const char **extra, const size_t *extra_len,
                               size_t n, const char **argv, size_t *argvlen);

/* ---- redis_io.c: the transport -------------------------------------------- */

/* ctx->err of a TLS connection whose peer's certificate was not accepted,
 * or which refused ours (beyond hiredis's REDIS_ERR_* codes): DLOCK_EAUTH. */
#define DLOCK_REDIS_ERR_TLS_AUTH 64
/* The TLS settings of a rediss:// URI (tls set: cacert, cert, key,
 * tls_verify), *out; a redis:// URI (tls 0) with any of them is refused.
 * 0, or DLOCK_EBADURI (a file that cannot be used, named) or ENOMEM. */
int dlock_redis_tls_open(dlock_client *c, const dlock_uri *uri, int tls, struct redis_tls **out);
void dlock_redis_tls_free(struct redis_tls *t);
/* A connection to host:port, TCP connect and (tls not NULL) the TLS
 * handshake within budget_ns, each wait for the server in the handshake
 * also within reply_ns (as a reply is), with keepalive on; NULL only when
 * out of memory; ctx->err set when it failed (free it with
 * dlock_redis_io_free). */
redisContext *dlock_redis_io_connect(const struct redis_tls *tls, const char *host, int port,
                                     uint64_t budget_ns, uint64_t reply_ns);
void dlock_redis_io_free(redisContext *ctx);
/* The bytes formatted and not written yet. */
size_t dlock_redis_io_buffered(const redisContext *ctx);
/* Writes everything ctx->obuf holds (never raising SIGPIPE); each write
 * bounded by the socket's timeout. REDIS_OK or REDIS_ERR (ctx->err). */
int dlock_redis_io_write(redisContext *ctx);
/* Reads what the connection has (waiting up to the socket's timeout when
 * it has nothing) into ctx's reader; REDIS_OK also when a TLS record
 * carried no data. Use it where hiredis would redisBufferRead(). */
int dlock_redis_io_read(redisContext *ctx);
/* redisGetReply over this transport: a reply the reader holds, else what
 * is buffered written and replies read until one is whole. */
int dlock_redis_io_get_reply(redisContext *ctx, void **reply);

/* ---- redis_conn.c: the connection layer ---------------------------------- */

uint64_t dlock_redis_tv_ns(const struct timeval *tv);
/* Narrows rc's bound to until_ns (CLOCK_MONOTONIC) if that is earlier;
 * returns the bound to give back to dlock_redis_unlimit(). */
uint64_t dlock_redis_limit(struct redis_conn *rc, uint64_t until_ns);
void dlock_redis_unlimit(struct redis_conn *rc, uint64_t saved);
/* What is left of rc's bound, capped at cap_ns (at least 1 ms). */
uint64_t dlock_redis_time_left(struct redis_conn *rc, uint64_t cap_ns);
/* `timeout` from now: the bound of a call without a deadline. */
uint64_t dlock_redis_call_until(struct redis_conn *rc);
/* Connects *ctxp to node n and authenticates (AUTH or PING, SELECT), all
 * within budget_ns and rc's bound; a command connection (cmd) also loads
 * the script and checks the server's maxmemory-policy, in the same
 * pipelined round trip. Asks the topology's resolve hook first. */
int dlock_redis_connect_ctx(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                            uint64_t budget_ns, int cmd);
/* Connects node n's command connection if needed, within budget_ns. */
int dlock_redis_node_connect(struct redis_conn *rc, struct redis_node *n, uint64_t budget_ns);
/* SUBSCRIBE chan on node n's subscriber connection (made within
 * connect_ns if there is none), without waiting; then the confirmation,
 * skipping older replies, within rc's bound. 0 once subscribed (n->subscribed
 * set); on failure the subscriber connection is dropped. A refusal that is
 * a redirect goes to the topology's hooks. */
int dlock_redis_subscribe_send(struct redis_conn *rc, struct redis_node *n, const char *chan,
                               size_t len, uint64_t connect_ns);
int dlock_redis_subscribe_confirm(struct redis_conn *rc, struct redis_node *n, const char *chan,
                                  size_t len);
/* UNSUBSCRIBE chan if subscribed, without waiting for the confirmation. */
void dlock_redis_unsubscribe(struct redis_conn *rc, struct redis_node *n, const char *chan,
                             size_t len);
void dlock_redis_drop_sub(struct redis_node *n);
/* Drops a connection after an I/O error, recording why; returns the code. */
int dlock_redis_ctx_error(struct redis_conn *rc, struct redis_node *n,
                          redisContext **ctxp, const char *what);
/*
 * Every hiredis call that may write to a socket goes through these four:
 * they write with send(MSG_NOSIGNAL) themselves (hiredis would write(2),
 * and a closed peer would raise SIGPIPE), and bound the write and the reply
 * by the call's bound (a keeper connection's deadline included).
 */
/* redisCommandArgv: NULL on an I/O error (ctx->err says which). */
redisReply *dlock_redis_call(struct redis_conn *rc, redisContext *ctx, size_t argc,
                             const char **argv, const size_t *argvlen);
/* redisAppendCommandArgv and a write of the whole buffer; REDIS_OK or
 * REDIS_ERR (ctx->err says which). */
int dlock_redis_send(struct redis_conn *rc, redisContext *ctx, size_t argc, const char **argv,
                     const size_t *argvlen);
/* A write of what is buffered (redisAppendCommandArgv'ed), if anything. */
int dlock_redis_flush(struct redis_conn *rc, redisContext *ctx);
/* redisGetReply (which first writes what is still buffered). */
int dlock_redis_get_reply(struct redis_conn *rc, redisContext *ctx, void **reply);
/* A command on *ctxp (node n's): 0 with *out (NULL: freed), or the error
 * (an error reply: DLOCK_ESTORE, DLOCK_EAUTH; an I/O error drops *ctxp). */
int dlock_redis_command(struct redis_conn *rc, struct redis_node *n, redisContext **ctxp,
                        redisReply **out, size_t argc, const char **argv, const size_t *argvlen,
                        const char *what);
/* Runs the script on node n synchronously (EVAL fallback on NOSCRIPT). */
int dlock_redis_script(struct redis_conn *rc, struct redis_node *n, size_t argc,
                       const char **argv, const size_t *argvlen, redisReply **out);
/* The same after ASKING when asking; with redir, a MOVED, ASK, TRYAGAIN
 * or CLUSTERDOWN reply is not an error: *redir, REDIS_REDIRECTED. */
int dlock_redis_script_asking(struct redis_conn *rc, struct redis_node *n, int asking,
                              size_t argc, const char **argv, const size_t *argvlen,
                              redisReply **out, struct redis_redirect *redir);
/* WAIT for rc->wait_replicas replicas on node n's command connection,
 * within rc's bound: 0, or the error (what names the write). */
int dlock_redis_replicas_ack(struct redis_conn *rc, struct redis_node *n, const char *what);
/* The same after a write that is not a grant, when wait_replicas asks for
 * it, on node n (NULL: the one node), bounded by `timeout`. */
int dlock_redis_ack_after(struct redis_conn *rc, struct redis_node *n, const char *what);

/* ---- redis_cluster.c, redis_sentinel.c: the topologies ------------------- */

/* Cluster: the slot map, empty and stale; sets rc->topo. */
int dlock_redis_cluster_open(struct redis_conn *rc);
void dlock_redis_cluster_free(struct redis_cluster *c);
/* The node that owns slot (the map is read again first when it is stale);
 * NULL with the error set when no node can say. */
struct redis_node *dlock_redis_cluster_node(struct redis_conn *rc, unsigned slot, int *errp);
/* The slot's owner as the map says now (no reading it again); NULL when
 * not known. */
struct redis_node *dlock_redis_cluster_peek(struct redis_conn *rc, unsigned slot);
/* Node n did not answer: asked for the map last for a while. */
void dlock_redis_cluster_failed(struct redis_conn *rc, struct redis_node *n);
/* The map is out of date: read it again before the next use. */
void dlock_redis_cluster_stale(struct redis_conn *rc);
/* Runs a script call on the node owning slot, following MOVED, ASK,
 * TRYAGAIN and CLUSTERDOWN within rc's bound. */
int dlock_redis_cluster_script(struct redis_conn *rc, unsigned slot, size_t argc,
                               const char **argv, const size_t *argvlen, redisReply **out);
/* The primaries that own slots now (refreshing a stale map), into out
 * (room for REDIS_CLUSTER_MAX_NODES); their count, or a negative error. */
int dlock_redis_cluster_primaries(struct redis_conn *rc, struct redis_node **out);

/* Sentinel: the sentinels and the service from the URI; sets rc->topo. */
int dlock_redis_sentinel_open(struct redis_conn *rc, const dlock_uri *uri);
void dlock_redis_sentinel_free(struct redis_sentinel *s);

/* ---- redis_elect.c: an election's watch ----------------------------------- */

/* dlock_backend.h's watch_open() ... watch_close() on rc (the observer's
 * client): subscribed to the election channel (the value key's name) on
 * the node(s) that hear its publishes. */
int dlock_redis_watch_open(struct redis_conn *rc, const char *name, size_t len,
                           dlock_watch **watchp);
int dlock_redis_watch_fd(dlock_watch *watch);
int dlock_redis_watch_read(dlock_watch *watch);
void dlock_redis_watch_close(dlock_watch *watch);

/* ---- redis_plain.c: layout=plain's wake-up -------------------------------- */

/* The channel a layout=plain waiter on name listens to, malloc'ed (*len):
 * "__keyspace@<db>__:<prefix><name>" when every node has keyspace
 * notifications on for generic commands and expiries (CONFIG GET
 * notify-keyspace-events: K and A, or K, g and x), *notified set; else
 * dlock's release channel (dlock_redis_release_channel()), *notified 0
 * (the waiter then polls every DLOCK_REDIS_PLAIN_POLL_NS). A node that
 * refuses CONFIG (managed Redis) counts as off. NULL: out of memory. */
char *dlock_redis_plain_channel(struct redis_conn *rc, const char *name, size_t len,
                                size_t *chan_len, int *notified);

/* ---- redis_floor.c: store-wide tokens ------------------------------------ */

/* 0, or DLOCK_EINVAL naming the limit. */
int dlock_redis_floor_ok(struct redis_conn *rc, uint64_t floor);
/* The floor key "<prefix>floor", malloc'ed (NULL: out of memory). */
char *dlock_redis_floor_key(struct redis_conn *rc, size_t *len);
/* The floor script call's argv (EVALSHA sha 1 <floor key> floor value),
 * pointing into key and value. */
size_t dlock_redis_floor_argv(struct redis_conn *rc, const char *key, size_t key_len,
                              const char *value, const char **argv, size_t *argvlen);
/* Node n's top: the largest of its "<prefix>*:fence" counters (SCAN, one
 * page of SCAN_COUNT keys and their MGET per round trip), the floor key
 * and its TIME in µs. Each round trip bounded by `timeout` (node_timeout
 * under Redlock); connects n if needed. */
int dlock_redis_node_top(struct redis_conn *rc, struct redis_node *n, uint64_t *top);
/* token_top and raise_floor on one Redis (a Sentinel's primary) or a
 * Cluster: the single-instance recipe's. */
int dlock_redis_floor_top(struct redis_conn *rc, uint64_t *top);
int dlock_redis_floor_raise(struct redis_conn *rc, uint64_t floor);

/* ---- the recipes --------------------------------------------------------- */

extern const struct redis_recipe dlock_redis_single_recipe; /* redis_lock.c */
extern const struct redis_recipe dlock_redlock_recipe;      /* redlock.c */

#endif
