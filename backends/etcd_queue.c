/*
 * The queue of a name's keys by kind (etcd.c's top and docs/etcd.md):
 * today's exclusive keys (writers), readers ("r<lease id>") and permits of
 * a semaphore ("s<limit>-<lease id>"), in create order. What a reader or a
 * permit waits for, its key and its grant; who holds (inspect).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd_int.h"

/* DLOCK_EMODE when the name's oldest key (oldest: a range reply's first)
 * is of another kind than ours: a semaphore of another limit, a semaphore
 * where we ask a read-write lock, or the other way round. */
int etcd_kind_check(struct etcd_conn *ec, const struct etcd_held *held, const dlock_request *req,
                    const struct etcd_kv *oldest)
{
    uint32_t limit;
    int nl = req->name_len > 80 ? 80 : (int)req->name_len;
    if (!oldest->key || oldest->klen < held->dir)
        return 0;
    enum etcd_kind k = etcd_key_kind(oldest->key + held->dir, oldest->klen - held->dir, &limit);
    if (k == ETCD_PERMIT && (held->kind != ETCD_PERMIT || limit != held->limit)) {
        char asked[48] = "a read-write lock";
        if (held->limit)
            snprintf(asked, sizeof asked, "a semaphore of limit %u", held->limit);
        return dlock_seterr(cl(ec), DLOCK_EMODE, "%.*s is held as a semaphore of limit %u (asked:"
                            " %s)", nl, req->name, limit, asked);
    }
    if (k != ETCD_PERMIT && held->kind == ETCD_PERMIT)
        return dlock_seterr(cl(ec), DLOCK_EMODE, "%.*s is held as a read-write lock (asked: a"
                            " semaphore of limit %u)", nl, req->name, held->limit);
    return 0;
}

int etcd_kind_check_range(struct etcd_conn *ec, const struct etcd_held *held,
                          const dlock_request *req, json_object *range)
{
    json_object *kvs = etcd_kvs_of(range);
    struct etcd_kv old = {0};
    if (kvs && json_object_array_length(kvs) &&
        etcd_kv_read(json_object_array_get_idx(kvs, 0), &old) != 0)
        return oom(ec);
    int err = etcd_kind_check(ec, held, req, &old);
    free(old.key);
    return err;
}

/* The keys held's request waits for, newest first: a reader's, the
 * writers' (today's layout: keys named by a lease id in hex, "0".."f");
 * a permit's, every key. With before, only those created before ours. */
static json_object *ahead_req(const struct etcd_held *held, int64_t limit, int before)
{
    json_object *r = etcd_range_req(held->key, held->dir, RANGE_DESCEND, limit,
                                    before ? (int64_t)held->base.token - 1 : 0);
    if (r && held->kind == ETCD_READER) {
        char *k = malloc(held->dir + 1);
        if (!k) {
            json_object_put(r);
            return NULL;
        }
        memcpy(k, held->key, held->dir);
        k[held->dir] = '0';
        json_object_object_add(r, "key", etcd_new_bytes(k, held->dir + 1));
        k[held->dir] = 'g';
        json_object_object_add(r, "range_end", etcd_new_bytes(k, held->dir + 1));
        free(k);
    }
    return r;
}

/* What a reader or permit waits for, from n keys before ours (kvs from
 * skip on, newest first): 0 with pred->key NULL when admitted (a reader
 * with no writer before it, a permit with fewer keys than the limit
 * before it), else pred and held->how. */
static int mode_look(struct etcd_conn *ec, struct etcd_held *held, int64_t n, json_object *kvs,
                     size_t skip, struct etcd_kv *pred)
{
    memset(pred, 0, sizeof *pred);
    if (held->kind == ETCD_READER ? n <= 0 : n < (int64_t)held->limit)
        return 0;
    held->how = held->kind == ETCD_READER ? WATCH_DELETE
                : n == (int64_t)held->limit ? WATCH_AHEAD : WATCH_CHANGE;
    if (!kvs || json_object_array_length(kvs) <= skip ||
        etcd_kv_read(json_object_array_get_idx(kvs, skip), pred) != 0)
        return dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: reading the queue: a bad key",
                            ec->where);
    held->since = pred->mod > pred->create ? pred->mod : pred->create;
    return 0;
}

/* A txn of one compare (our key still there, with our create revision)
 * and the ops ok: 0 with *root when it succeeded, the place lost when not
 * (2: the lock's lease is gone), else an error. */
static int own_txn(struct etcd_conn *ec, struct etcd_held *held, json_object *ok,
                   json_object **root)
{
    json_object *req = json_object_new_object(), *cmps = json_object_new_array();
    *root = NULL;
    if (!req || !cmps || !ok) {
        json_object_put(req), json_object_put(cmps), json_object_put(ok);
        return oom(ec);
    }
    json_object_array_add(cmps, etcd_create_cmp(held->key, held->klen, "EQUAL",
                                                (int64_t)held->base.token));
    json_object_object_add(req, "compare", cmps);
    json_object_object_add(req, "success", ok);
    int err = etcd_txn(ec, req, "reading the queue", 2, root);
    if (err == 0 && !json_object_get_boolean(etcd_get(*root, "succeeded"))) {
        json_object_put(*root);
        *root = NULL;
        return etcd_place_lost(ec);
    }
    return err;
}

/* How many keys are before ours, up to the limit (a permit's). */
int etcd_count_before(struct etcd_conn *ec, struct etcd_held *held, int64_t *n)
{
    json_object *root;
    int err = etcd_call_ok(ec, &ec->app, "/v3/kv/range", ahead_req(held, held->limit, 1),
                           call_until(ec), DLOCK_ECONNECT, "reading the queue", &root);
    if (err == 0) {
        json_object *kvs = etcd_kvs_of(root);
        *n = kvs ? (int64_t)json_object_array_length(kvs) : 0;
        json_object_put(root);
    }
    return err;
}

/* A reader or permit looks again at what is before it (mode_look). */
int etcd_claim_mode(struct etcd_conn *ec, struct etcd_held *held, struct etcd_kv *pred)
{
    json_object *ok = json_object_new_array(), *root;
    int64_t limit = held->kind == ETCD_READER ? 1 : (int64_t)held->limit + 1;
    if (ok)
        json_object_array_add(ok, etcd_wrap("request_range", ahead_req(held, limit, 1)));
    memset(pred, 0, sizeof *pred);
    int err = own_txn(ec, held, ok, &root);
    if (err)
        return err;
    json_object *rs = etcd_get(root, "responses");
    json_object *kvs = etcd_kvs_of(etcd_get(json_object_array_get_idx(rs, 0), "response_range"));
    err = mode_look(ec, held, kvs ? (int64_t)json_object_array_length(kvs) : 0, kvs, 0, pred);
    json_object_put(root);
    return err;
}

/* An admitted reader or permit waiting on the waiters' lease: its key
 * moves to the lock's lease (a put, which a permit waiter behind it
 * watches: it becomes the first waiter). 2: the lock's lease is gone. */
int etcd_grant_mode(struct etcd_conn *ec, struct etcd_held *held)
{
    json_object *ok = json_object_new_array(), *root;
    if (ok)
        json_object_array_add(ok, etcd_put_lease(held->key, held->klen, held->lease));
    int err = own_txn(ec, held, ok, &root);
    json_object_put(root);
    if (err == 0)
        held->waiting = 0;
    return err;
}

/*
 * A reader's or permit's key, in one transaction: on the lock's lease
 * when the name has no key (held), else (try: on the lock's lease; wait:
 * on the waiters' lease) with the name's oldest key (its kind: a mismatch
 * is DLOCK_EMODE) and what is ahead of ours (ahead_req; ours is the
 * newest). 0 with pred->key NULL when admitted (held->waiting: its key is
 * still to move, grant_mode), else what to watch; 1: the waiters' lease
 * had expired.
 */
int etcd_create_mode_key(struct etcd_conn *ec, struct etcd_held *held, const dlock_request *req,
                         int try, struct etcd_kv *pred)
{
    json_object *ok = json_object_new_array(), *ko = json_object_new_array(), *root;
    memset(pred, 0, sizeof *pred);
    if (ok)
        json_object_array_add(ok, etcd_put_key(held, req->owner_hex, held->lease));
    if (ko) {
        json_object_array_add(ko, etcd_put_key(held, req->owner_hex,
                                               try ? held->lease : ec->wait_lease));
        json_object_array_add(ko, etcd_wrap("request_range", etcd_range_req(held->key, held->dir,
                                                                            "ASCEND", 1, 0)));
        json_object_array_add(ko, etcd_wrap("request_range",
                                            ahead_req(held, held->kind == ETCD_READER ? 1
                                                            : (int64_t)held->limit + 2, 0)));
    }
    int err = etcd_create_txn(ec, held, ok, ko, try, &root);
    if (err)
        return err;
    json_object *rs = etcd_get(root, "responses");
    json_object *put = etcd_get(json_object_array_get_idx(rs, 0), "response_put");
    held->base.token = (uint64_t)etcd_int(etcd_get(root, "header"), "revision");
    if (json_object_get_boolean(etcd_get(root, "succeeded")) || !put) {
        json_object_put(root);
        return put ? 0 : dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: creating the lock key: a"
                                      " reply without its parts", ec->where);
    }
    held->waiting = !try;
    json_object *ahead = etcd_get(json_object_array_get_idx(rs, 2), "response_range");
    err = etcd_kind_check_range(ec, held, req, etcd_get(json_object_array_get_idx(rs, 1),
                                                        "response_range"));
    if (!err && etcd_get(put, "prev_kv")) {
        /* A repeat after a lost reply found our key: what is before it. */
        held->base.token = (uint64_t)etcd_int(etcd_get(put, "prev_kv"), "create_revision");
        json_object_put(root);
        return etcd_claim_mode(ec, held, pred);
    }
    if (!err) {
        int mine = held->kind == ETCD_PERMIT; /* a permit's range has ours first */
        err = mode_look(ec, held, etcd_int(ahead, "count") - mine, etcd_kvs_of(ahead), (size_t)mine,
                        pred);
    }
    json_object_put(root);
    return err;
}

/* ---- inspect ----------------------------------------------------------- */

/* A name's keys in create order, as many as limit (0: all): *root (the
 * caller puts it), *kvs its array (NULL: none), *dlen its dir's length. */
static int read_name(struct etcd_conn *ec, const char *name, size_t len, int64_t limit,
                     uint64_t until, json_object **root, json_object **kvs, size_t *dlen)
{
    char *dir = etcd_name_dir(ec, name, len, dlen);
    if (!dir)
        return oom(ec);
    int err = etcd_call_ok(ec, &ec->app, "/v3/kv/range",
                           etcd_range_req(dir, *dlen, "ASCEND", limit, 0), until, DLOCK_ECONNECT,
                           "inspect", root);
    free(dir);
    *kvs = err ? NULL : etcd_kvs_of(*root);
    return err;
}

/* The kind of a key of kvs (a range reply's array), dlen: its name's dir. */
static enum etcd_kind kind_at(json_object *kvs, size_t i, size_t dlen, uint32_t *limit)
{
    struct etcd_kv kv;
    enum etcd_kind k = ETCD_WRITER;
    *limit = 0;
    if (etcd_kv_read(json_object_array_get_idx(kvs, i), &kv) == 0 && kv.klen > dlen)
        k = etcd_key_kind(kv.key + dlen, kv.klen - dlen, limit);
    free(kv.key);
    return k;
}

/* How many of a name's first keys (kvs, in create order) hold: the first
 * writer alone, else the readers before the first writer, or a
 * semaphore's first `limit` keys. *limit: the name's (0: a read-write
 * lock). Set *cut when the holders may go on past kvs. */
static size_t holders_of(json_object *kvs, size_t dlen, uint32_t *limit, int *cut)
{
    size_t n = kvs ? json_object_array_length(kvs) : 0, h = 0;
    uint32_t lim;
    *limit = 0;
    *cut = 0;
    for (; h < n; h++) {
        enum etcd_kind kind = kind_at(kvs, h, dlen, &lim);
        if (h == 0)
            *limit = lim;
        if (kind == ETCD_WRITER || (*limit == 0 && kind != ETCD_READER))
            return h ? h : 1;
        if (*limit && h >= *limit)
            return h;
    }
    *cut = n > 0;
    return h;
}

/* A name's keys, read again in full when its holders may go on past the
 * first read's (a semaphore's or readers' run). */
static int read_holders(struct etcd_conn *ec, const char *name, size_t len, int64_t limit,
                        uint64_t until, json_object **root, json_object **kvs, size_t *nh,
                        uint32_t *lim, size_t *dlenp)
{
    size_t dlen;
    int cut, err = read_name(ec, name, len, limit, until, root, kvs, &dlen);
    *dlenp = dlen;
    if (err)
        return err;
    *nh = holders_of(*kvs, dlen, lim, &cut);
    if (cut && limit && etcd_int(*root, "count") > (int64_t)*nh) {
        json_object_put(*root);
        if ((err = read_name(ec, name, len, 0, until, root, kvs, &dlen)) != 0)
            return err;
        *nh = holders_of(*kvs, dlen, lim, &cut);
    }
    return 0;
}

int etcd_inspect_range(struct etcd_conn *ec, json_object *range, size_t dlen, dlock_info *info,
                       int64_t *lease)
{
    json_object *kvs = etcd_kvs_of(range);
    uint32_t lim;
    int cut;
    size_t nh = holders_of(kvs, dlen, &lim, &cut);
    int64_t count = etcd_int(range, "count");
    *lease = 0;
    info->known |= DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_ORDER;
    info->held = count > 0;
    info->waiters = count > (int64_t)nh ? (uint64_t)(count - (int64_t)nh) : 0;
    /* The newest holder's token, owner and lease; the waiters after. */
    for (size_t i = nh ? nh - 1 : 0; kvs && i < json_object_array_length(kvs); i++) {
        struct etcd_kv kv;
        if (etcd_kv_read(json_object_array_get_idx(kvs, i), &kv) != 0)
            return dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: inspect: a bad key", ec->where);
        free(kv.key);
        if (i + 1 == nh) {
            /* A foreign holder's key (etcdctl lock's: an empty value) has
             * no token. */
            if (etcd_owner_id(kv.value, strlen(kv.value))) {
                info->token = (uint64_t)kv.create;
                info->known |= DLOCK_KNOWS_TOKEN;
            }
            snprintf(info->owner, sizeof info->owner, "%s", kv.value);
            info->known |= kv.value[0] ? DLOCK_KNOWS_OWNER : 0;
            *lease = kv.lease;
        } else if (info->listed < DLOCK_INFO_LISTED) {
            snprintf(info->waiter[info->listed++], DLOCK_HOLDER_MAX, "%s", kv.value);
        }
    }
    return 0;
}

int etcd_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    json_object *root = NULL, *kvs;
    uint64_t until = call_until(ec);
    size_t nh;
    uint32_t lim;
    size_t dlen;
    int64_t lease = 0;
    int err = read_holders(ec, name, len, DLOCK_INFO_LISTED + 1, until, &root, &kvs, &nh, &lim,
                           &dlen);
    if (err)
        return err;
    err = etcd_inspect_range(ec, root, dlen, info, &lease);
    json_object_put(root);
    if (err == 0 && lease && (info->lease_ms = etcd_lease_left_ms(ec, lease, until, &err)) != 0)
        info->known |= DLOCK_KNOWS_LEASE;
    return err;
}

/* Every holder (holders_of), with its lease left: one call each. */
int etcd_inspect_holders(dlock_conn *conn, const char *name, size_t len, dlock_holder *holders,
                         size_t capacity, size_t *count)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    json_object *root = NULL, *kvs;
    uint64_t until = call_until(ec);
    size_t nh;
    uint32_t lim;
    size_t dlen;
    int err = read_holders(ec, name, len, (int64_t)capacity + 1, until, &root, &kvs, &nh, &lim,
                           &dlen);
    if (err)
        return err;
    *count = nh;
    for (size_t i = 0; i < nh && i < capacity && err == 0; i++) {
        struct etcd_kv kv;
        dlock_holder *h = &holders[i];
        if (etcd_kv_read(json_object_array_get_idx(kvs, i), &kv) != 0) {
            err = dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: inspect: a bad key", ec->where);
            break;
        }
        free(kv.key);
        h->known = DLOCK_KNOWS_MODE | (kv.value[0] ? DLOCK_KNOWS_OWNER : 0) |
                   (etcd_owner_id(kv.value, strlen(kv.value)) ? DLOCK_KNOWS_TOKEN : 0);
        h->limit = lim;
        h->mode = kind_at(kvs, i, dlen, &lim) == ETCD_READER ? DLOCK_MODE_SHARED
                                                            : DLOCK_MODE_EXCLUSIVE;
        h->token = (uint64_t)kv.create;
        snprintf(h->owner, sizeof h->owner, "%s", kv.value);
        if (kv.lease && (h->lease_ms = etcd_lease_left_ms(ec, kv.lease, until, &err)) != 0)
            h->known |= DLOCK_KNOWS_LEASE;
    }
    json_object_put(root);
    return err;
}

