/*
 * Reading etcd's replies (backends/etcd_reply.c): a key of a range, and
 * the watch stream. Pure: no connection; what a server sends is checked,
 * never trusted (tests/fuzz/fuzz_etcd.c).
 */
#ifndef DLOCK_ETCD_REPLY_H
#define DLOCK_ETCD_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#include "dlock.h"

/* A key of a range reply. */
struct etcd_kv {
    char *key;      /* its bytes, NUL-terminated (the caller frees it) */
    size_t klen;
    int64_t create, mod, lease;
    char value[DLOCK_HOLDER_MAX]; /* the value, cut to fit; "" when none */
};

/* Reads one element of a range reply's "kvs": 0, or -1 (not a key, or no
 * memory) with nothing to free. */
int etcd_kv_read(json_object *o, struct etcd_kv *kv);

/* The kind of a name's key, from its tail (what follows the name's
 * "<prefix>/<name>/"): today's exclusive layout (the lock's lease id in 16
 * hex digits), a reader ("r" and the lease id) or a permit of a semaphore
 * ("s<limit>-" and the lease id, *limit set). Anything else is a writer:
 * it excludes everybody, as an older release's client would take it. */
enum etcd_kind { ETCD_WRITER, ETCD_READER, ETCD_PERMIT };
enum etcd_kind etcd_key_kind(const char *tail, size_t len, uint32_t *limit);

/* Appends len bytes to the growing, NUL-terminated buffer *buf (*len
 * used, *cap allocated): 0, or -1 with nothing changed when out of memory. */
int etcd_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n);

/* The watch stream: one JSON object per line. */
struct etcd_stream {
    char *buf;
    size_t len, cap;
    int done;        /* 1: an event that counts came; 2: the watch ended (read again) */
    int any;         /* set by the caller: every event counts (else a DELETE only) */
    int64_t before;  /* set by the caller: a DELETE counts only if its key's create
                      * revision (the event's prev_kv) is below this (0: every one) */
    int created;     /* the server confirmed the watch */
    int64_t compact; /* cancelled: the revision compacted past (0: not that) */
    char why[256];   /* why it ended */
};

/* Takes len more bytes of the stream: len, or 0 on no memory (which ends
 * the transfer). Once done is set, the rest is not read. */
size_t etcd_stream_feed(struct etcd_stream *w, const char *data, size_t len);
void etcd_stream_free(struct etcd_stream *w);

#endif
