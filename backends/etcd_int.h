/*
 * What the etcd backend's files share (private to the backend): the
 * connection, a lock or a wait's key, the requests every file builds. The
 * files depend downward, never on each other both ways:
 *
 *   etcd.c           the recipe: leases, acquire and its wait (the watch),
 *                    release, renew, tokens, open
 *     etcd_elect.c   elections: the leader's value, leader(), the
 *                    observers' watch
 *     etcd_queue.c   the name's queue by kind of key: what a reader or a
 *                    permit waits for, its key and grant; inspect
 *     etcd_single.c  layout=etcd3: one key per name (python-etcd3's Lock),
 *                    its create-if-absent and inspect
 *       etcd_ops.c   keys, requests and calls both use
 *         etcd_http.c, etcd_reply.c, etcd_json.c   the gateway, replies, JSON
 */
#ifndef DLOCK_ETCD_INT_H
#define DLOCK_ETCD_INT_H

#include <stdint.h>

#include "backends/etcd_http.h"
#include "backends/etcd_json.h"
#include "backends/etcd_reply.h"
#include "core/internal.h"

#define MS UINT64_C(1000000)

/* The layout option: dlock's own queue of keys under <prefix>/<name>/
 * (etcd's concurrency.Mutex, etcdctl lock), or python-etcd3's single key
 * <prefix>/<name>. */
enum etcd_layout { ETCD_LAYOUT_DLOCK, ETCD_LAYOUT_ETCD3 };
#define RANGE_DESCEND "DESCEND"

/* Leases a client keeps ahead of need (at most). */
#define ETCD_POOL_MAX 4

struct etcd_conn {
    dlock_conn base;
    struct etcd_site site;
    struct etcd_http app;    /* the application's thread */
    struct etcd_http keeper; /* the keeper's thread */
    CURL *watch;             /* the application's watch stream */
    CURLM *multi;
    int64_t wait_lease;      /* the waiters' short lease (0: none yet) */
    uint64_t wait_kept;      /* when it was last granted or kept alive */
    int64_t stale_lease;     /* a waiters' lease given up with a key maybe left on it */
    int lost_place;          /* this wait's key is gone (set by place_lost) */
    uint64_t cap;            /* during a deadline wait: no call past this (0: none) */
    uint64_t watch_events;   /* watches ended by an event (atomic; tests read it) */
    /* Leases granted ahead of need (etcd.c, "the lease pool"): each holds
     * no key, counts from kept (when its grant or last keep-alive was
     * sent); an acquire of the same TTL in whole seconds takes one. */
    struct etcd_pooled {
        int64_t lease, ttl_s;
        uint64_t kept;
    } pool[ETCD_POOL_MAX];
    int npool;
    uint64_t pool_taken;     /* acquires that took a pooled lease (atomic; tests read it) */
    int pool_unchecked;      /* a negative control's: no freshness check */
    char *prefix;
    enum etcd_layout layout;
    char where[512];
};

struct etcd_held {
    dlock_held base;
    /* <prefix>/<escaped name>/<lease id, 16 hex digits>; a reader's with
     * "r", a permit's with "s<limit>-" before the lease id */
    char *key;
    size_t klen;
    size_t dir;      /* the name's key prefix: key[0, dir) ends with '/' */
    int64_t lease;
    int64_t ttl_s;   /* the lease's TTL as asked */
    uint32_t ttl_ms;
    uint64_t end_ns; /* the client's lease end */
    uint64_t kept;   /* when the lease's grant or last keep-alive was sent */
    int published;   /* an election value may be on the lease (etcd_elect.c) */
    int waiting;     /* the key is on the waiters' lease */
    int queued;      /* a wait: the key may be on the waiters' lease */
    enum etcd_kind kind; /* exclusive (today's layout), reader or permit */
    uint32_t limit;  /* a permit's: the semaphore's limit */
    int how;         /* how the wait watches pred (WATCH_*) */
    int64_t since;   /* WATCH_CHANGE: the revision pred was read at */
};

/* What a waiter watches: its key's deletion; its deletion or a put (a
 * permit waiter's predecessor, which a waited grant touches); any key
 * created before ours deleted (the first permit waiter). */
enum { WATCH_DELETE, WATCH_CHANGE, WATCH_AHEAD };

static inline dlock_client *cl(struct etcd_conn *ec)
{
    return ec->base.client;
}

static inline int oom(struct etcd_conn *ec)
{
    return dlock_seterr(cl(ec), DLOCK_ENOMEM, "out of memory");
}

/* A call's bound: `timeout`, or less within a deadline wait (cap). */
static inline uint64_t call_until(struct etcd_conn *ec)
{
    uint64_t t = dlock_monotonic_ns() + ec->site.timeout_ms * MS;
    return ec->cap && ec->cap < t ? ec->cap : t;
}

/* Test-only (etcd.c): the watches a client's waits saw end by an event
 * (tests/backends/test_etcd_modes.c counts wake-ups with it). */
uint64_t dlock_etcd_watch_events(dlock_client *c);
/* Test-only (etcd.c): acquires that took a pooled lease; and a negative
 * control's switch: pooled leases taken however old (no keep-alive). */
uint64_t dlock_etcd_pool_taken(dlock_client *c);
void dlock_etcd_pool_unchecked(dlock_client *c);

/* etcd_ops.c */
char *etcd_name_dir(struct etcd_conn *ec, const char *name, size_t len, size_t *dlen);
json_object *etcd_range_end(const char *dir, size_t dlen);
json_object *etcd_range_req(const char *dir, size_t dlen, const char *order, int64_t limit,
                            int64_t max_create);
json_object *etcd_wrap(const char *what, json_object *op);
json_object *etcd_kvs_of(json_object *range);
/* A call whose reply must carry no error: 0 with *root (the caller puts
 * it), else the error recorded. */
int etcd_call_ok(struct etcd_conn *ec, struct etcd_http *h, const char *path, json_object *req,
                 uint64_t until, int late, const char *what, json_object **root);
json_object *etcd_create_cmp(const char *key, size_t klen, const char *result, int64_t rev);
json_object *etcd_put_lease(const char *key, size_t klen, int64_t lease);
int etcd_place_lost(struct etcd_conn *ec);
/* Our key's put: the owner id as its value, on lease, asking for the key's
 * previous version (a repeat after a lost reply finds our key there). */
json_object *etcd_put_key(const struct etcd_held *held, const char *owner_hex, int64_t lease);
/* The transaction that creates a key: if the name has no key at all (a
 * compare over its range: every key's create revision is 0 only when
 * there is none), the ops ok, else ko (both taken). 0 with *root (the
 * caller puts it); 1 when the waiters' lease had expired (not on a try:
 * a new one, and again); else an error. */
int etcd_create_txn(struct etcd_conn *ec, const struct etcd_held *held, json_object *ok,
                    json_object *ko, int try, json_object **root);
/* A transaction (req, taken): 0 with *root (the caller puts it); gone
 * when a lease it puts a key on is gone (0: that is an error too: what
 * failed); else an error. */
int etcd_txn(struct etcd_conn *ec, json_object *req, const char *what, int gone,
             json_object **root);

/* Whether a key's value (len bytes) is a dlock owner id (32 lower-case
 * hex digits): a dlock holder's, whose key's create revision is its
 * token; anything else is a foreign holder's (etcdctl's value is empty,
 * python-etcd3's a uuid of 16 bytes), which has no token. */
int etcd_owner_id(const void *value, size_t len);
/* The lease time left of lease (0: unknown; *err set on a failed call). */
uint64_t etcd_lease_left_ms(struct etcd_conn *ec, int64_t lease, uint64_t until, int *err);

/* etcd_single.c (layout=etcd3) */
/* The name's key: <prefix>/<name>, the name as it is (python-etcd3's
 * "/locks/" + name); malloc'd, NULL when out of memory. */
char *etcd_single_key(struct etcd_conn *ec, const char *name, size_t len, size_t *klen);
/* One transaction: our key on the lock's lease if the key is absent
 * (held: 0, *holder zeroed, the token set), else the holder's kv in
 * *holder (to watch; the caller frees its key). 1 when the key went
 * between compare and read (again), 2 when the lock's lease is gone, else
 * an error. */
int etcd_single_claim(struct etcd_conn *ec, struct etcd_held *held, const dlock_request *req,
                      struct etcd_kv *holder);
int etcd_single_inspect(struct etcd_conn *ec, const char *name, size_t len, dlock_info *info);
int etcd_single_inspect_holders(struct etcd_conn *ec, const char *name, size_t len,
                                dlock_holder *holders, size_t capacity, size_t *count);

/* etcd_elect.c: the backend's election methods (dlock_backend.h) */
int etcd_publish(dlock_conn *conn, dlock_held *h, const void *value, size_t len);
int etcd_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info, char *value,
                size_t *value_len);
/* The op of a transaction that moves the name's election value (if any)
 * to lease, with the holder's key (renew with another TTL). */
json_object *etcd_value_move(const struct etcd_held *held, int64_t lease);
int etcd_wake(dlock_conn *conn, const char *name, size_t len);
int etcd_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp);
int etcd_watch_fd(dlock_watch *w);
int etcd_watch_read(dlock_watch *w);
void etcd_watch_close(dlock_watch *w);

/* etcd_queue.c */
/* DLOCK_EMODE when the name's oldest key (its kv; a range reply's first)
 * is of another kind than held's (a semaphore of another limit, or of a
 * read-write lock where the other is asked): refused at once. */
int etcd_kind_check(struct etcd_conn *ec, const struct etcd_held *held, const dlock_request *req,
                    const struct etcd_kv *oldest);
int etcd_kind_check_range(struct etcd_conn *ec, const struct etcd_held *held,
                          const dlock_request *req, json_object *range);
int etcd_count_before(struct etcd_conn *ec, struct etcd_held *held, int64_t *n);
int etcd_claim_mode(struct etcd_conn *ec, struct etcd_held *held, struct etcd_kv *pred);
int etcd_grant_mode(struct etcd_conn *ec, struct etcd_held *held);
int etcd_create_mode_key(struct etcd_conn *ec, struct etcd_held *held, const dlock_request *req,
                         int try, struct etcd_kv *pred);
/* Fills info (as inspect) from a range reply of the name's keys in create
 * order (dlen: the name's key prefix's length); *lease: the holder's (0:
 * none). 0, or DLOCK_EPROTO recorded. */
int etcd_inspect_range(struct etcd_conn *ec, json_object *range, size_t dlen, dlock_info *info,
                       int64_t *lease);
int etcd_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info);
int etcd_inspect_holders(dlock_conn *conn, const char *name, size_t len, dlock_holder *holders,
                         size_t capacity, size_t *count);

#endif
