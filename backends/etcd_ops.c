/* Keys, requests and calls the etcd backend's files share (etcd_int.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd_int.h"

/* <prefix>/<name>/, with '%' and '/' in the name escaped (%25, %2F) so that
 * no name's keys start with another name's prefix. */
char *etcd_name_dir(struct etcd_conn *ec, const char *name, size_t len, size_t *dlen)
{
    size_t plen = strlen(ec->prefix), n = plen + 1 + 3 * len + 1 + 24 + 1;
    char *d = malloc(n), *o;
    if (!d)
        return NULL;
    memcpy(d, ec->prefix, plen);
    o = d + plen;
    *o++ = '/';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '%' || c == '/') {
            o += sprintf(o, "%%%02X", c);
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '/';
    *o = '\0';
    *dlen = (size_t)(o - d);
    return d;
}

/* The end of the range of keys starting with dir (its last byte + 1: dir
 * ends with '/', so no carry). */
json_object *etcd_range_end(const char *dir, size_t dlen)
{
    char *e = malloc(dlen);
    if (!e)
        return NULL;
    memcpy(e, dir, dlen);
    e[dlen - 1]++;
    json_object *j = etcd_new_bytes(e, dlen);
    free(e);
    return j;
}

json_object *etcd_range_req(const char *dir, size_t dlen, const char *order, int64_t limit,
                            int64_t max_create)
{
    json_object *r = json_object_new_object();
    if (!r)
        return NULL;
    json_object_object_add(r, "key", etcd_new_bytes(dir, dlen));
    json_object_object_add(r, "range_end", etcd_range_end(dir, dlen));
    json_object_object_add(r, "sort_target", json_object_new_string("CREATE"));
    json_object_object_add(r, "sort_order", json_object_new_string(order));
    if (limit)
        json_object_object_add(r, "limit", etcd_new_int(limit));
    if (max_create)
        json_object_object_add(r, "max_create_revision", etcd_new_int(max_create));
    return r;
}

json_object *etcd_wrap(const char *what, json_object *op)
{
    json_object *o = json_object_new_object();
    if (o)
        json_object_object_add(o, what, op);
    return o;
}

json_object *etcd_kvs_of(json_object *range)
{
    json_object *k = etcd_get(range, "kvs");
    return k && json_object_is_type(k, json_type_array) ? k : NULL;
}

/* ---- calls ----------------------------------------------------------------- */

/* A call whose reply must carry no error but "not found" (a lease gone)
 * where gone is not 0: 0 with *root (the caller puts it), gone, or the
 * error recorded. */
static int call_gone(struct etcd_conn *ec, struct etcd_http *h, const char *path,
                     json_object *req, uint64_t until, int late, const char *what, int gone,
                     json_object **root)
{
    struct etcd_res r;
    *root = NULL;
    if (!req)
        return oom(ec);
    int err = etcd_call(&ec->site, h, path, req, until, late, &r);
    json_object_put(req);
    if (err)
        return err;
    if (r.code == ETCD_NOT_FOUND && gone) {
        json_object_put(r.root);
        return gone;
    }
    if (r.code) {
        err = etcd_error(&ec->site, &r, what);
        json_object_put(r.root);
        return err;
    }
    *root = r.root;
    return 0;
}

int etcd_call_ok(struct etcd_conn *ec, struct etcd_http *h, const char *path, json_object *req,
                 uint64_t until, int late, const char *what, json_object **root)
{
    return call_gone(ec, h, path, req, until, late, what, 0, root);
}

json_object *etcd_create_cmp(const char *key, size_t klen, const char *result, int64_t rev)
{
    json_object *c = json_object_new_object();
    if (!c)
        return NULL;
    json_object_object_add(c, "key", etcd_new_bytes(key, klen));
    json_object_object_add(c, "target", json_object_new_string("CREATE"));
    json_object_object_add(c, "result", json_object_new_string(result));
    json_object_object_add(c, "create_revision", etcd_new_int(rev));
    return c;
}

json_object *etcd_put_lease(const char *key, size_t klen, int64_t lease)
{
    json_object *put = json_object_new_object();
    if (!put)
        return NULL;
    json_object_object_add(put, "key", etcd_new_bytes(key, klen));
    json_object_object_add(put, "ignore_value", json_object_new_boolean(1));
    json_object_object_add(put, "lease", etcd_new_int(lease));
    return etcd_wrap("request_put", put);
}

uint64_t etcd_lease_left_ms(struct etcd_conn *ec, int64_t lease, uint64_t until, int *err)
{
    json_object *req = json_object_new_object(), *root;
    if (req)
        json_object_object_add(req, "ID", etcd_new_int(lease));
    if ((*err = etcd_call_ok(ec, &ec->app, "/v3/lease/timetolive", req, until, DLOCK_ECONNECT,
                             "inspect: lease time to live", &root)) != 0)
        return 0;
    int64_t ttl = etcd_int(root, "TTL");
    json_object_put(root);
    return ttl > 0 ? (uint64_t)ttl * 1000 : 0;
}

int etcd_owner_id(const void *value, size_t len)
{
    const unsigned char *v = value;
    if (len != 32)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f')))
            return 0;
    return 1;
}

int etcd_place_lost(struct etcd_conn *ec)
{
    ec->lost_place = 1;
    return dlock_seterr(cl(ec), DLOCK_ECONNECT,
                        "etcd %s: the waiter's lease ran out (the store was out of reach or the"
                        " client paused longer than its TTL): its place in the queue is gone",
                        ec->where);
}


json_object *etcd_put_key(const struct etcd_held *held, const char *owner_hex, int64_t lease)
{
    json_object *put = json_object_new_object();
    if (!put)
        return NULL;
    json_object_object_add(put, "key", etcd_new_bytes(held->key, held->klen));
    json_object_object_add(put, "value", etcd_new_bytes(owner_hex, 32));
    json_object_object_add(put, "lease", etcd_new_int(lease));
    json_object_object_add(put, "prev_kv", json_object_new_boolean(1));
    return etcd_wrap("request_put", put);
}

int etcd_create_txn(struct etcd_conn *ec, const struct etcd_held *held, json_object *ok,
                    json_object *ko, int try, json_object **root)
{
    json_object *txn = json_object_new_object(), *cmps = json_object_new_array();
    json_object *empty = etcd_create_cmp(held->key, held->dir, "EQUAL", 0);
    *root = NULL;
    if (!txn || !cmps || !ok || !ko || !empty) {
        json_object_put(txn), json_object_put(cmps), json_object_put(ok);
        json_object_put(ko), json_object_put(empty);
        return oom(ec);
    }
    json_object_object_add(empty, "range_end", etcd_range_end(held->key, held->dir));
    json_object_array_add(cmps, empty);
    json_object_object_add(txn, "compare", cmps);
    json_object_object_add(txn, "success", ok);
    json_object_object_add(txn, "failure", ko);
    int err = etcd_txn(ec, txn, "creating the lock key", try ? 0 : 1, root);
    if (err == 1) /* The waiters' lease had expired: a new one, and again. */
        ec->wait_lease = 0;
    return err;
}

int etcd_txn(struct etcd_conn *ec, json_object *req, const char *what, int gone,
             json_object **root)
{
    return call_gone(ec, &ec->app, "/v3/kv/txn", req, call_until(ec), DLOCK_ECONNECT, what, gone,
                     root);
}
