/*
 * The names a client holds: chained hash table, power-of-two buckets,
 * grown at one entry per bucket on average and shrunk below one in eight,
 * so that lookups, adds and removes are O(1) expected and the table costs
 * 8 to 16 bytes per name after growing (up to 64 just before it shrinks). Entries live inside their lock (no allocation per
 * name); a several-name lock's entries are one array, so an entry finds its
 * lock from its index.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/held.h"
#include "core/internal.h"

#define MIN_BUCKETS 16u

/* SipHash-1-3 (Aumasson and Bernstein): keyed, so that collisions cannot
 * be chosen without the key. */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                           \
    do {                                                                                   \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                          \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                             \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                             \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                          \
    } while (0)

static uint64_t load64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t siphash13(const uint64_t key[2], const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t v0 = 0x736f6d6570736575ull ^ key[0], v1 = 0x646f72616e646f6dull ^ key[1];
    uint64_t v2 = 0x6c7967656e657261ull ^ key[0], v3 = 0x7465646279746573ull ^ key[1];
    uint64_t b = (uint64_t)len << 56;
    size_t i, whole = len & ~(size_t)7;
    for (i = 0; i < whole; i += 8) {
        uint64_t m = load64(p + i);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t k = 0; i + k < len; k++)
        b |= (uint64_t)p[i + k] << (8 * k);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    uint64_t h = v0 ^ v1 ^ v2 ^ v3;
    return (uint32_t)(h ^ (h >> 32));
}

int dlock_names_init(struct dlock_held_names *t)
{
    memset(t, 0, sizeof *t);
    return dlock_random_bytes(t->key, sizeof t->key);
}

void dlock_names_free(struct dlock_held_names *t)
{
    free(t->bucket);
    t->bucket = NULL;
    t->mask = t->entries = t->locks = t->cursor = 0;
}

static struct dlock_lock *ent_lock(const struct dlock_hent *e)
{
    return (struct dlock_lock *)((char *)(e - e->idx) - offsetof(struct dlock_lock, ent));
}

/* Name idx of lock (names are NUL-separated, at most DLOCK_NAMES_MAX). */
static const char *ent_name(const struct dlock_lock *lock, unsigned idx)
{
    const char *p = dlock_lock_names(lock);
    for (unsigned i = 0; i < idx; i++)
        p += lock->ent[i].len + 1;
    return p;
}

void dlock_names_prepare(const struct dlock_held_names *t, struct dlock_lock *lock)
{
    const char *p = dlock_lock_names(lock);
    for (uint32_t i = 0; i < lock->names; i++) {
        size_t len = strlen(p);
        lock->ent[i] = (struct dlock_hent){NULL, siphash13(t->key, p, len), (uint16_t)i,
                                           (uint16_t)len};
        p += len + 1;
    }
}

/* Moves every entry to a table of n buckets; on failure keeps the old. */
static int resize(struct dlock_held_names *t, size_t n)
{
    struct dlock_hent **nb = calloc(n, sizeof *nb);
    if (!nb)
        return DLOCK_ENOMEM;
    for (size_t i = 0; t->bucket && i <= t->mask; i++) {
        struct dlock_hent *e = t->bucket[i], *next;
        for (; e; e = next) {
            next = e->next;
            e->next = nb[e->hash & (n - 1)];
            nb[e->hash & (n - 1)] = e;
        }
    }
    free(t->bucket);
    t->bucket = nb;
    t->mask = n - 1;
    t->cursor = 0;
    return 0;
}

int dlock_names_add(struct dlock_held_names *t, struct dlock_lock *lock)
{
    if (!t->bucket && resize(t, MIN_BUCKETS) != 0)
        return DLOCK_ENOMEM;
    if (t->entries + lock->names > t->mask + 1 && t->mask < SIZE_MAX / 2 / sizeof *t->bucket) {
        size_t n = t->mask + 1;
        while (n < t->entries + lock->names)
            n *= 2;
        (void)resize(t, n); /* without memory to grow, chains get longer */
    }
    for (uint32_t i = 0; i < lock->names; i++) {
        struct dlock_hent *e = &lock->ent[i], **b = &t->bucket[e->hash & t->mask];
        e->next = *b;
        *b = e;
    }
    t->entries += lock->names;
    t->locks++;
    return 0;
}

void dlock_names_remove(struct dlock_held_names *t, struct dlock_lock *lock)
{
    for (uint32_t i = 0; i < lock->names; i++) {
        struct dlock_hent *e = &lock->ent[i], **pp = &t->bucket[e->hash & t->mask];
        while (*pp && *pp != e)
            pp = &(*pp)->next;
        if (*pp)
            *pp = e->next;
    }
    t->entries -= lock->names;
    t->locks--;
    /* Shrinking gives memory back after a burst; never below the start. */
    if (t->mask + 1 > MIN_BUCKETS && t->entries < (t->mask + 1) / 8)
        (void)resize(t, (t->mask + 1) / 2);
}

struct dlock_lock *dlock_names_find(const struct dlock_held_names *t, const char *name,
                                    size_t len)
{
    if (!t->bucket)
        return NULL;
    uint32_t h = siphash13(t->key, name, len);
    for (const struct dlock_hent *e = t->bucket[h & t->mask]; e; e = e->next) {
        if (e->hash != h || e->len != len)
            continue;
        struct dlock_lock *lock = ent_lock(e);
        if (memcmp(ent_name(lock, e->idx), name, len) == 0)
            return lock;
    }
    return NULL;
}

struct dlock_lock *dlock_names_any(struct dlock_held_names *t)
{
    if (!t->locks)
        return NULL;
    /* Every lock has an entry with idx 0; the cursor only moves forward
     * while locks are taken out, so emptying the table is O(buckets). */
    for (;; t->cursor = (t->cursor + 1) & t->mask)
        for (struct dlock_hent *e = t->bucket[t->cursor]; e; e = e->next)
            if (e->idx == 0)
                return ent_lock(e);
}

void dlock_names_each(const struct dlock_held_names *t, void (*fn)(struct dlock_lock *))
{
    for (size_t i = 0; t->bucket && i <= t->mask; i++)
        for (struct dlock_hent *e = t->bucket[i], *next; e; e = next) {
            next = e->next;
            if (e->idx == 0)
                fn(ent_lock(e));
        }
}
