/*
 * The names a client holds (core/held.c): a hash table from each name of
 * every held lock to its lock, so that checking whether a name is already
 * held, adding a lock and removing one cost the same with 10 or 100 000
 * locks held. Keys are hashed with SipHash-1-3 under a random key of the
 * client's own, so names chosen to collide cannot turn lookups into scans.
 * Not thread-safe: the client's thread only (see dlock.h "Thread-safety").
 */
#ifndef DLOCK_CORE_HELD_H
#define DLOCK_CORE_HELD_H

#include <stddef.h>
#include <stdint.h>

struct dlock_lock;

/* One name of a held lock; a lock's entries are an array, ent[0..names). */
struct dlock_hent {
    struct dlock_hent *next; /* in its bucket */
    uint32_t hash;
    uint16_t idx; /* which of its lock's names */
    uint16_t len; /* the name's length (<= DLOCK_NAME_MAX) */
};

struct dlock_held_names {
    struct dlock_hent **bucket; /* NULL until the first lock */
    size_t mask;                /* buckets - 1 */
    size_t entries, locks;
    size_t cursor;              /* dlock_names_any()'s next bucket */
    uint64_t key[2];
};

/* Seeds the table's hash key from the kernel's random source. */
int dlock_names_init(struct dlock_held_names *t);
void dlock_names_free(struct dlock_held_names *t);
/* Fills lock's entries (hash, idx, len) from its names: before _add. */
void dlock_names_prepare(const struct dlock_held_names *t, struct dlock_lock *lock);
/* DLOCK_ENOMEM only when the table has no buckets at all and cannot get
 * them; a table that cannot grow keeps longer chains. */
int dlock_names_add(struct dlock_held_names *t, struct dlock_lock *lock);
void dlock_names_remove(struct dlock_held_names *t, struct dlock_lock *lock);
/* The held lock with the name, or NULL. */
struct dlock_lock *dlock_names_find(const struct dlock_held_names *t, const char *name,
                                    size_t len);
/* Some held lock (NULL when none): for taking them all out, one by one. */
struct dlock_lock *dlock_names_any(struct dlock_held_names *t);
/* Calls fn on every held lock once. fn must not add or remove locks. */
void dlock_names_each(const struct dlock_held_names *t, void (*fn)(struct dlock_lock *));

#endif
