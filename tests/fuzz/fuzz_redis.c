/*
 * libFuzzer target for what dlock reads in Redis replies
 * (backends/redis_reply.c): the input is a byte stream from a server, fed
 * through hiredis's own reply reader (not dlock's code), and every reply it
 * yields is handed to each of dlock's pure reply functions. No connection,
 * no file. The first byte picks the channel name length the subscription
 * checks compare against, so that matching names are reachable too.
 */
#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backends/redis_reply.h"

static const char owner[] = "0123456789abcdef0123456789abcdef";
static const char chan[] = "dlock:w:0123456789abcdef0123456789abcdef";

/* Checks what the slot-range parser hands on. */
static int range_seen(void *arg, unsigned first, unsigned last, const char *host,
                      size_t host_len, int port)
{
    (void)arg;
    if (first > last || last >= 16384 || port <= 0 || port > 65535 ||
        memchr(host, '\0', host_len))
        __builtin_trap();
    return 0;
}

static void look(const redisReply *r, size_t chan_len, int depth)
{
    long long a, b;
    uint64_t token;
    char sha[41], field[64];
    dlock_redis_reply_pair(r, &a, &b);
    dlock_redis_reply_int(r, &a);
    dlock_redis_reply_yes(r);
    dlock_redis_reply_sha(r, sha);
    dlock_redis_reply_message(r, NULL, 0);
    dlock_redis_reply_message(r, chan, chan_len);
    dlock_redis_reply_handoff(r, owner, &token);
    dlock_redis_reply_subscribed(r, chan, chan_len);
    dlock_redis_reply_error_kind(r);
    dlock_redis_reply_unsubscribed(r, chan, chan_len);
    struct redis_redirect d;
    if (dlock_redis_reply_redirect(r, &d) != REDIS_REDIR_NONE &&
        (d.kind == REDIS_REDIR_MOVED || d.kind == REDIS_REDIR_ASK) &&
        (d.slot >= 16384 || d.port <= 0 || d.port > 65535 || strlen(d.host) >= sizeof d.host))
        __builtin_trap();
    dlock_redis_reply_slots(r, range_seen, NULL);
    char host[64];
    int port;
    if (dlock_redis_reply_addr(r, host, sizeof host, &port) == 0 &&
        (port <= 0 || port > 65535 || !host[0] || strlen(host) >= sizeof host))
        __builtin_trap();
    dlock_redis_reply_is_primary(r);
    struct redis_seen seen;
    dlock_redis_reply_inspect(r, &seen);
    dlock_holder hs[4];
    size_t count = 0;
    uint32_t limit = 0;
    memset(hs, 0, sizeof hs);
    if (dlock_redis_reply_holders(r, hs, 4, &count, &limit) == 0 && limit > DLOCK_LIMIT_MAX)
        __builtin_trap();
    for (size_t i = 0; i < 4; i++)
        if (memchr(hs[i].owner, '\0', sizeof hs[i].owner) == NULL)
            __builtin_trap();
    if ((r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
         r->type == REDIS_REPLY_ERROR) && r->str) {
        if (dlock_redis_info_field(r->str, r->len, "maxmemory_policy", field, sizeof field))
            dlock_redis_policy_evicts(field);
        dlock_redis_info_field(r->str, r->len, "x", field, 1);
    }
    if (r->type == REDIS_REPLY_ARRAY && depth < 4)
        for (size_t i = 0; i < r->elements; i++)
            if (r->element && r->element[i])
                look(r->element[i], chan_len, depth + 1);
}

/* hiredis 0.14 allocates an array's element pointers as soon as it reads
 * its header ("*300000000"): inputs declaring arrays of more than 1024
 * elements are skipped, or the fuzzer would only find that. */
static int huge_array(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        unsigned long n = 0;
        if (data[i] != '*')
            continue;
        for (size_t k = i + 1; k < size && data[k] >= '0' && data[k] <= '9' && n <= 1024; k++)
            n = n * 10 + (data[k] - '0');
        if (n > 1024)
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t chan_len = sizeof chan - 1;
    if (huge_array(data, size))
        return 0;
    if (size > 0) {
        chan_len = data[0] % (sizeof chan);
        data++, size--;
    }
    redisReader *rd = redisReaderCreate();
    if (!rd)
        return 0;
    if (redisReaderFeed(rd, (const char *)data, size) == REDIS_OK) {
        for (int i = 0; i < 1000; i++) {
            void *v = NULL;
            if (redisReaderGetReply(rd, &v) != REDIS_OK || !v)
                break;
            look(v, chan_len, 0);
            freeReplyObject(v);
        }
    }
    redisReaderFree(rd);
    return 0;
}
