/*
 * What dlock reads in Redis replies, as pure functions: no I/O, no state,
 * any redisReply hiredis can build (any type, any depth, strings with NUL
 * bytes) is accepted without a crash. The fuzz target
 * tests/fuzz/fuzz_redis.c feeds arbitrary bytes through hiredis's reader
 * and hands every reply to each of these.
 */
#ifndef DLOCK_BACKENDS_REDIS_REPLY_H
#define DLOCK_BACKENDS_REDIS_REPLY_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "dlock.h"

/* The script's {a, b} replies (acquire, grab): 0 with *a and *b set, or -1
 * when the reply is not an array of two integers. */
int dlock_redis_reply_pair(const redisReply *r, long long *a, long long *b);

/* An integer reply: 0 with *v set, else -1. */
int dlock_redis_reply_int(const redisReply *r, long long *v);

/* "Yes" from the script: integer 1, or an {1, token} pair. */
int dlock_redis_reply_yes(const redisReply *r);

/* The SCRIPT LOAD reply: a 40-character hex SHA1, copied NUL-terminated to
 * sha; 0, or -1 when the reply is anything else. */
int dlock_redis_reply_sha(const redisReply *r, char sha[41]);

/* A pub/sub message, {"message", channel, payload} (or "smessage", a
 * sharded one); when chan is not NULL,
 * only one on that channel (chan_len bytes). 1 or 0. */
int dlock_redis_reply_message(const redisReply *r, const char *chan, size_t chan_len);

/* A handoff for owner (32 hex digits): a message whose payload is
 * "<owner>:<token>" with a decimal token in 1 .. 2^63 - 1. 1 with *token
 * set, else 0 (someone else's handoff, a confirmation, a pong...). */
int dlock_redis_reply_handoff(const redisReply *r, const char *owner, uint64_t *token);

/* The confirmation of SUBSCRIBE chan: {"subscribe", chan, count}, or of
 * SSUBSCRIBE: {"ssubscribe", ...}. 1 or 0. */
int dlock_redis_reply_subscribed(const redisReply *r, const char *chan, size_t chan_len);

/* The unsolicited notice that a subscription on chan ended:
 * {"sunsubscribe", chan, count} (a cluster node that lost the channel's
 * slot sends it) or {"unsubscribe", chan, count}. 1 or 0. */
int dlock_redis_reply_unsubscribed(const redisReply *r, const char *chan, size_t chan_len);

/* What an error reply means to dlock. */
enum {
    DLOCK_REDIS_ERR_OTHER = 0, /* anything else: the store's error */
    DLOCK_REDIS_ERR_AUTH,      /* WRONGPASS, NOAUTH, invalid password */
    DLOCK_REDIS_ERR_NOSCRIPT,  /* the script cache was lost */
    DLOCK_REDIS_ERR_READONLY,  /* a replica: the primary changed */
};

/* A cluster's redirection: "-MOVED slot host:port", "-ASK slot host:port",
 * "-TRYAGAIN ...", "-CLUSTERDOWN ...". */
enum { REDIS_REDIR_NONE, REDIS_REDIR_MOVED, REDIS_REDIR_ASK, REDIS_REDIR_TRYAGAIN,
       REDIS_REDIR_DOWN };
struct redis_redirect {
    int kind;
    unsigned slot;
    char host[256]; /* MOVED, ASK: NUL-terminated; "" for the node asked */
    int port;
};
/* Fills *d from an error reply; its kind (REDIS_REDIR_NONE for any other
 * reply, or a MOVED/ASK whose slot, host or port does not parse). */
int dlock_redis_reply_redirect(const redisReply *r, struct redis_redirect *d);

/* One range of a CLUSTER SLOTS reply: slots first..last owned by the
 * primary host:port (host "" when the node did not say: the node asked). */
typedef int (*dlock_redis_slots_fn)(void *arg, unsigned first, unsigned last,
                                    const char *host, size_t host_len, int port);
/* Calls fn for each well-formed range of a CLUSTER SLOTS reply; 0, -1 when
 * the reply is not an array or fn returned non-zero. Ranges that do not
 * parse are skipped. */
int dlock_redis_reply_slots(const redisReply *r, dlock_redis_slots_fn fn, void *arg);

/* The primary's address in a SENTINEL get-master-addr-by-name reply
 * ({host, port}): 0 with host (NUL-terminated, cap bytes) and *port set;
 * -1 for anything else (nil: the sentinel does not know the service). */
int dlock_redis_reply_addr(const redisReply *r, char *host, size_t cap, int *port);

/* ROLE's reply names a primary: {"master", offset, replicas}. 1 or 0. */
int dlock_redis_reply_is_primary(const redisReply *r);

/* A COMMAND INFO reply about one command: 1 if the server knows it, 0 if
 * not (a nil entry: a server older than the command), -1 if the reply does
 * not say (an error: COMMAND denied by an ACL or renamed). */
int dlock_redis_reply_command_known(const redisReply *r);
/* Classifies an error reply; DLOCK_REDIS_ERR_OTHER for anything that is
 * not an error reply. */
int dlock_redis_reply_error_kind(const redisReply *r);

/*
 * The value of field key in INFO text ("key:value" lines ending in \r\n or
 * \n, "# Section" headers), copied NUL-terminated (truncated to out_len -
 * 1 bytes). 1 when found, 0 when the text has no such field.
 */
int dlock_redis_info_field(const char *text, size_t len, const char *key, char *out,
                           size_t out_len);

/* Whether a maxmemory-policy can evict dlock's keys: 0 for "noeviction",
 * 1 for anything else (allkeys-* evicts every key, volatile-* the lock
 * keys, which have a TTL; a policy this code does not know is assumed to
 * evict). */
int dlock_redis_policy_evicts(const char *policy);

/* What one server's "inspect" script call read (redis_script.h), parsed by
 * dlock_redis_reply_inspect() (backends/redis_reply.c). */
#define DLOCK_REDIS_LISTED 16 /* = DLOCK_INFO_LISTED */
struct redis_seen {
    int held;            /* the lock key exists */
    int has_owner;       /* its value is dlock's "<owner>:<token>" */
    char owner[33];
    /* A value dlock did not write (a peer's, layout=plain), when it is
     * printable and fits: "" otherwise. */
    char value[DLOCK_HOLDER_MAX];
    uint64_t token;
    long long pttl;      /* PTTL: -1 no expiry */
    uint64_t last;       /* the last token granted (0: none) */
    uint64_t counter;    /* the counter as a grant left it: last, or the
                            raised counter's previous value (Redlock's merge) */
    unsigned long long live; /* queued waiters the handoff would serve */
    size_t listed;           /* the first of them, in queue order */
    char waiter[DLOCK_REDIS_LISTED][33];
    long long numsub;        /* subscribers of the channel asked about; -1 */
    /* Elections (the "inspect" with the value key): the value key held
     * "<owner><seq><value>" (redis_script.h's "publish"); pub points into
     * the reply (valid while it lives): the owner's 32 hex digits, the
     * value at pub + DLOCK_REDIS_PUB_HEAD, pub_len bytes long. */
    int has_pub;
    const char *pub;
    size_t pub_len;
    uint64_t pub_seq;
};
/* The value key's head: the owner id, then the publisher's sequence
 * number (16 hex digits: its CLOCK_MONOTONIC ns, so that Redlock's reader
 * can tell the newest of one holder's publishes). */
#define DLOCK_REDIS_PUB_HEAD 48
/* 0 with *s filled, or -1 when the reply is not what the script returns. */
int dlock_redis_reply_inspect(const redisReply *r, struct redis_seen *s);

/* The script's "holders" reply ({count, limit, {{owner, kind, token,
 * lease ms}, ...}}, redis_script.h): fills out[0 .. min(capacity, what the
 * reply lists)) (zeroed by the caller) and *count (how many hold) and
 * *limit; 0, or -1 when the reply is anything else. */
int dlock_redis_reply_holders(const redisReply *r, dlock_holder *out, size_t capacity,
                              size_t *count, uint32_t *limit);

#endif
