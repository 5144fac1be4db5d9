/*
 * The ZooKeeper backend's pure parsing, kept apart from any I/O so that a
 * unit test and a fuzz target (tests/fuzz/fuzz_zookeeper.c) reach it: the
 * lock nodes' names in a children list, and the lock root of a URI.
 * Private to the backend.
 */
#ifndef DLOCK_ZOOKEEPER_NAMES_H
#define DLOCK_ZOOKEEPER_NAMES_H

#include <stddef.h>

/* A lock node is "<owner hex>-lock-<sequence>", the suffix made by the
 * server for an EPHEMERAL_SEQUENTIAL create ("%010d"). */
#define ZK_LOCK_MARK "-lock-"

/* A parent's lock children, sorted by sequence number. */
struct zk_kid {
    long long seq;
    char *name;
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

/* Keeps the names of names[0..n) that are lock nodes' (zk_lock_seq()),
 * copied, sorted by sequence (a stable order for equal ones). 0, or -1 when
 * out of memory (k is then empty). Free with zk_kids_free(). */
int zk_kids_parse(const char *const *names, size_t n, struct zk_kids *k);
void zk_kids_free(struct zk_kids *k);

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
