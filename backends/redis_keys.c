/*
 * What the Redis backend calls its keys, and where they live: the keys of
 * a lock name ("<prefix><name>:lock", ":fence", ":queue", the floor
 * "<prefix>floor", ":raised", ":holders", ":modes", ":leader"; layout=plain: the
 * peers' "<prefix><name>" and the rest under "dlock:"), the release
 * channel, a Cluster's hash slot of a name and the
 * hash tag "{T}" that puts all of a name's keys and channels in that slot,
 * a script call's argv, and the detail of a request refused because the
 * name is held as another kind (DLOCK_EMODE). Pure: it calls nothing of the backend's (only
 * the core's error recording).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "core/internal.h"

/* CRC16-CCITT (XMODEM), as Redis Cluster hashes keys. */
static uint16_t crc16(const char *s, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)s[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

unsigned dlock_redis_slot(const char *name, size_t len)
{
    return crc16(name, len) & (REDIS_SLOTS - 1);
}

/* The tag of each slot: the first string in the order of
 * tag_enumerate() that hashes to it. Strings of up to 3 of 62 characters
 * cover nearly every slot, 4 the rest. Built once per process. */
static char slot_tags[REDIS_SLOTS][5];
static pthread_once_t tags_once = PTHREAD_ONCE_INIT;

static void build_tags(void)
{
    static const char alpha[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    const size_t na = sizeof alpha - 1;
    size_t left = REDIS_SLOTS;
    char s[5];
    for (size_t len = 1; len <= 4 && left > 0; len++) {
        size_t total = 1;
        for (size_t i = 0; i < len; i++)
            total *= na;
        for (size_t k = 0; k < total && left > 0; k++) {
            size_t v = k;
            for (size_t i = 0; i < len; i++, v /= na)
                s[len - 1 - i] = alpha[v % na];
            unsigned slot = crc16(s, len) & (REDIS_SLOTS - 1);
            if (!slot_tags[slot][0]) {
                memcpy(slot_tags[slot], s, len);
                slot_tags[slot][len] = '\0';
                left--;
            }
        }
    }
}

const char *dlock_redis_slot_tag(unsigned slot)
{
    pthread_once(&tags_once, build_tags);
    return slot_tags[slot & (REDIS_SLOTS - 1)];
}

int dlock_redis_keys(struct redis_conn *rc, const char *name, size_t len,
                     struct redis_keys *keys)
{
    /* The floor key has no name in it: "<prefix>floor". */
    static const char *const suffix[REDIS_NKEYS_ELECT] = {
        ":lock", ":fence", ":queue", "floor", ":raised", ":holders", ":modes", ":leader"};
    /* Cluster: "{T}" after the prefix, T the tag of the name's slot (so
     * the floor key too is in it). layout=plain: the lock key is the
     * peers' "<prefix><name>", the others have DLOCK_REDIS_PLAIN_SIDE
     * before the prefix. */
    char tag[8] = "";
    const char *side = rc->plain ? DLOCK_REDIS_PLAIN_SIDE : "";
    size_t plen = strlen(rc->prefix), slen0 = strlen(side), tlen = 0, total = 0;
    char *p;
    keys->slot = 0;
    if (rc->mode == REDIS_CLUSTER) {
        keys->slot = dlock_redis_slot(name, len);
        tlen = (size_t)snprintf(tag, sizeof tag, "{%s}", dlock_redis_slot_tag(keys->slot));
    }
    for (int i = 0; i < REDIS_NKEYS_ELECT; i++)
        total += slen0 + plen + tlen + len + strlen(suffix[i]) + 1;
    p = keys->buf = total <= sizeof keys->small ? keys->small : malloc(total);
    if (!p)
        return DLOCK_ENOMEM;
    for (int i = 0; i < REDIS_NKEYS_ELECT; i++) {
        int bare = rc->plain && i == 0; /* the peers' key */
        const char *sfx = bare ? "" : suffix[i];
        size_t slen = strlen(sfx), nlen = i == 3 ? 0 : len, s0 = bare ? 0 : slen0;
        keys->k[i] = p;
        memcpy(p, side, s0);
        memcpy(p + s0, rc->prefix, plen);
        memcpy(p + s0 + plen, tag, tlen);
        memcpy(p + s0 + plen + tlen, name, nlen);
        memcpy(p + s0 + plen + tlen + nlen, sfx, slen + 1);
        keys->len[i] = s0 + plen + tlen + nlen + slen;
        p += keys->len[i] + 1;
    }
    return 0;
}

char *dlock_redis_release_channel(struct redis_conn *rc, const char *name, size_t len,
                                  size_t *chan_len)
{
    const char *side = rc->plain ? DLOCK_REDIS_PLAIN_SIDE : "";
    size_t slen = strlen(side), plen = strlen(rc->prefix);
    char *buf = malloc(slen + plen + len + sizeof ":released");
    if (!buf)
        return NULL;
    memcpy(buf, side, slen);
    memcpy(buf + slen, rc->prefix, plen);
    memcpy(buf + slen + plen, name, len);
    memcpy(buf + slen + plen + len, ":released", sizeof ":released");
    *chan_len = slen + plen + len + sizeof ":released" - 1;
    return buf;
}

void dlock_redis_pub_seq(char seq[17])
{
    snprintf(seq, 17, "%016" PRIx64, dlock_monotonic_ns());
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
        return dlock_seterr(rc->base.client, DLOCK_ENOMEM, "out of memory");
    return 0;
}

int dlock_redis_emode(struct redis_conn *rc, const struct redis_held *h, long long held_limit)
{
    int n = h->name_len > 64 ? 64 : (int)h->name_len;
    char asked[48];
    if (DLOCK_REDIS_KIND(h) == 'p')
        snprintf(asked, sizeof asked, "a semaphore of limit %" PRIu32, (uint32_t)h->limit);
    else
        snprintf(asked, sizeof asked, "a %s lock", h->shared ? "shared" : "exclusive");
    if (held_limit > 0)
        return dlock_seterr(rc->base.client, DLOCK_EMODE,
                            "\"%.*s\" is held as a semaphore of limit %lld; asked for %s", n,
                            h->name, held_limit, asked);
    return dlock_seterr(rc->base.client, DLOCK_EMODE,
                        "\"%.*s\" is held as a read-write lock; asked for %s", n, h->name,
                        asked);
}

size_t dlock_redis_script_argv(struct redis_conn *rc, const struct redis_keys *keys,
                               size_t nkeys, const char **extra, const size_t *extra_len,
                               size_t n, const char **argv, size_t *argvlen)
{
    size_t i = 0;
    argv[i] = "EVALSHA", argvlen[i++] = 7;
    argv[i] = rc->sha, argvlen[i++] = 40;
    if (nkeys != REDIS_NKEYS_ALL && nkeys != REDIS_NKEYS_ELECT)
        nkeys = REDIS_NKEYS;
    argv[i] = nkeys == REDIS_NKEYS_ELECT ? "8" : nkeys == REDIS_NKEYS_ALL ? "7" : "4";
    argvlen[i++] = 1;
    for (size_t k = 0; k < nkeys; k++)
        argv[i] = keys->k[k], argvlen[i++] = keys->len[k];
    for (size_t k = 0; k < n; k++)
        argv[i] = extra[k], argvlen[i++] = extra_len[k];
    return i;
}
