/*
 * The ZooKeeper backend's pure parsing and queue rules, kept apart from any
 * I/O so that a unit test and a fuzz target (tests/fuzz/fuzz_zookeeper.c)
 * reach them: the lock nodes' names in a children list, their modes, what a
 * node in the queue waits for, and the lock root of a URI. Private to the
 * backend.
 */
#ifndef DLOCK_ZOOKEEPER_NAMES_H
#define DLOCK_ZOOKEEPER_NAMES_H

#include <stddef.h>

/* A lock node is "<owner hex><tag>-lock-<sequence>", the suffix made by
 * the server for an EPHEMERAL_SEQUENTIAL create ("%010d"). The tag is the
 * node's mode, in Curator's naming style: none for an exclusive request on
 * a read-write lock (today's nodes, and any other recipe's: a writer),
 * "-__READ__" for a shared one, "-__SEM<limit>__" for a permit of a
 * semaphore of that limit. A client that knows no tag sees every node as a
 * writer's: it waits for all of them and all of them wait for it. */
#define ZK_LOCK_MARK "-lock-"
#define ZK_READ_TAG "-__READ__"
#define ZK_SEM_TAG "-__SEM"
#define ZK_TAG_MAX sizeof "-__SEM65535__"

/* A node's mode. */
enum zk_kind { ZK_WRITER, ZK_READER, ZK_PERMIT };

/*
 * The names a client writes and reads (the URI's layout option). dlock:
 * the nodes above; nodes of any other recipe are ignored. kazoo: kazoo's
 * Lock, WriteLock and ReadLock nodes, "<uuid hex>__lock__<seq>" (a writer)
 * and "<uuid hex>__rlock__<seq>" (a reader), matched as kazoo matches them
 * (its pattern followed by exactly 10 digits, or '-' and 10, at the end of
 * the name), and the dlock layout's nodes as well: every one of them a
 * contender in one queue ordered by sequence number (the parent's one
 * counter numbers them all).
 */
enum zk_layout { ZK_LAYOUT_DLOCK, ZK_LAYOUT_KAZOO };
#define ZK_KAZOO_LOCK "__lock__"
#define ZK_KAZOO_RLOCK "__rlock__"

/* A parent's lock children, sorted by sequence number. */
struct zk_kid {
    long long seq;
    char *name;
    enum zk_kind kind;
    unsigned limit; /* ZK_PERMIT: the semaphore's limit, else 0 */
};
struct zk_kids {
    struct zk_kid *v;
    size_t n;
};

/* The sequence number of a lock node's name: the digits (an optional '-',
 * which the server writes once a parent's 32-bit counter has wrapped) after
 * the last "-lock-", which must end the name. 0, or -1 when name is not a
 * lock node's. */
int zk_lock_seq(const char *name, long long *seq);

/* A kazoo lock node's sequence number and kind (its pattern, as kazoo's
 * regex "(?:__lock__|__rlock__)(-?\d{10})$" finds it): 0, or -1 when name
 * is not one. */
int zk_kazoo_seq(const char *name, long long *seq, enum zk_kind *kind);

/* Keeps the names of names[0..n) that are lock nodes of the layout
 * (zk_lock_seq(), and zk_kazoo_seq() in the kazoo layout), copied, sorted by
 * sequence (a stable order for equal ones). 0, or -1 when out of memory (k
 * is then empty). Free with zk_kids_free(). zk_kids_parse(): the dlock
 * layout. */
int zk_kids_parse_layout(const char *const *names, size_t n, enum zk_layout layout,
                         struct zk_kids *k);
int zk_kids_parse(const char *const *names, size_t n, struct zk_kids *k);
void zk_kids_free(struct zk_kids *k);

/* The tag of a request's node (mode 0 exclusive, 1 shared; limit 0: a
 * read-write lock), in out[ZK_TAG_MAX]. */
void zk_tag(int shared, unsigned limit, char *out);
/* What a request's node name is made of after the owner id, up to the
 * sequence the server appends, in the layout: "<tag>-lock-", or kazoo's
 * "__lock__" / "__rlock__" (no limit there), in out[ZK_MARK_MAX]. */
#define ZK_MARK_MAX (ZK_TAG_MAX + sizeof ZK_LOCK_MARK)
void zk_mark(enum zk_layout layout, int shared, unsigned limit, char *out);
/* The mode of a lock node's name (its tag, or kazoo's pattern); *limit: a
 * permit's limit. A malformed tag is a writer's. */
enum zk_kind zk_node_kind(const char *name, unsigned *limit);
/* The owner id of a lock node's name: the part before its tag and last
 * "-lock-" (another recipe's prefix, as in Curator's "_c_<uuid>"), or
 * before kazoo's pattern (its uuid in hex), cut to fit out[outsz]. */
void zk_node_owner(const char *name, char *out, size_t outsz);
/* 1 when a lock node was made by a kazoo client, not by dlock: a node of
 * kazoo's pattern whose data (NUL-terminated) is not the owner id of its
 * name, which dlock's layout=kazoo writes there. Its czxid is no token a
 * holder uses. 0 for every other node. */
int zk_node_foreign(const char *name, const char *data);

/*
 * What the node at index i of k (the whole queue, sorted) does now: hold
 * (ZK_GRANTED), wait for a change of k[first .. first + count) (ZK_WAIT),
 * or give up because k[first] is of another kind (ZK_MISMATCH: a
 * read-write node and a permit, or permits of two limits).
 *   writer: holds when first; else waits for the node just before it.
 *   reader: holds when no writer is before it; else waits for the nearest.
 *   permit of limit N: holds among the first N; the first waiter (index N)
 *     waits for every holder; a later one for the node just before it,
 *     which deletes itself or, once it holds after waiting, writes its
 *     data (.signal: that write counts as the change).
 * Every node before i is compared: a node is never granted beside one of
 * another kind, since that one is before it in every listing it reads.
 */
enum { ZK_GRANTED, ZK_WAIT, ZK_MISMATCH };
struct zk_turn {
    int verdict;
    int signal;        /* ZK_WAIT on a permit's predecessor: its data counts */
    size_t first, count;
};
void zk_turn(const struct zk_kids *k, size_t i, struct zk_turn *t);
/* How many of k's first nodes hold now (0 when k is empty). */
size_t zk_holders(const struct zk_kids *k);

/* Index of the first child whose name starts with `start` (a whole name, or
 * an owner's "<owner>-lock-"), or -1. */
long zk_kids_find(const struct zk_kids *k, const char *start);

/* Checks the lock root given as a URI's path (NUL-terminated): absolute, no
 * empty, "." or ".." component, no control byte, not "/" alone, trailing
 * slashes dropped; and not /zookeeper or under it, the tree the servers
 * keep for themselves (quotas, the dynamic configuration). Sets *len to the
 * root's length without its trailing slashes. */
enum { ZK_ROOT_OK = 0, ZK_ROOT_BAD = 1, ZK_ROOT_RESERVED = 2 };
int zk_root_check(const char *path, size_t *len);

#endif
