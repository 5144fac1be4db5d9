/*
 * layout=etcd3: python-etcd3's Lock, one key per name. python-etcd3 (0.12,
 * etcd3/locks.py) takes "/locks/<name>" with a transaction that puts it,
 * on a lease of its own, only if its create revision is 0 (absent), its
 * value a uuid of 16 bytes; it releases by a delete if the value is still
 * its uuid. dlock here does the same on <prefix>/<name> (prefix "/locks"
 * by default in this layout): the put, on the lock's lease, with the
 * holder's owner id (32 hex digits) as value, only if the key is absent.
 * The key's create revision, the revision of the transaction that made
 * it, is the token: every grant creates the key anew, so tokens strictly
 * increase in grant order. Release revokes the lock's lease, which
 * deletes the key only if it is still on that lease (ours); renew keeps
 * the lease alive and checks the key's create revision and lease, as in
 * dlock's own layout.
 *
 * A waiter writes nothing: it watches the key for its deletion (etcd.c's
 * watch, from the member's current revision, and one read once the watch
 * is confirmed) and tries again; there is no queue (python-etcd3 has
 * none), so the first try after a release wins: no FIFO.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd_int.h"
#include "core/sha256.h"

char *etcd_single_key(struct etcd_conn *ec, const char *name, size_t len, size_t *klen)
{
    size_t plen = strlen(ec->prefix);
    char *k = malloc(plen + 1 + len + 1);
    if (!k)
        return NULL;
    memcpy(k, ec->prefix, plen);
    k[plen] = '/';
    memcpy(k + plen + 1, name, len);
    k[plen + 1 + len] = '\0';
    *klen = plen + 1 + len;
    return k;
}

int etcd_single_claim(struct etcd_conn *ec, struct etcd_held *held, const dlock_request *req,
                      struct etcd_kv *holder)
{
    json_object *txn = json_object_new_object(), *cmps = json_object_new_array();
    json_object *ok = json_object_new_array(), *ko = json_object_new_array();
    json_object *absent = etcd_create_cmp(held->key, held->klen, "EQUAL", 0);
    json_object *read = json_object_new_object(), *root;
    memset(holder, 0, sizeof *holder);
    if (!txn || !cmps || !ok || !ko || !absent || !read) {
        json_object_put(txn), json_object_put(cmps), json_object_put(ok);
        json_object_put(ko), json_object_put(absent), json_object_put(read);
        return oom(ec);
    }
    json_object_array_add(cmps, absent);
    json_object_array_add(ok, etcd_put_key(held, req->owner_hex, held->lease));
    json_object_object_add(read, "key", etcd_new_bytes(held->key, held->klen));
    json_object_array_add(ko, etcd_wrap("request_range", read));
    json_object_object_add(txn, "compare", cmps);
    json_object_object_add(txn, "success", ok);
    json_object_object_add(txn, "failure", ko);
    int err = etcd_txn(ec, txn, "creating the lock key", 2, &root);
    if (err)
        return err;
    held->waiting = 0;
    if (json_object_get_boolean(etcd_get(root, "succeeded"))) {
        held->base.token = (uint64_t)etcd_int(etcd_get(root, "header"), "revision");
        json_object_put(root);
        return 0;
    }
    json_object *rs = etcd_get(root, "responses");
    json_object *range = etcd_get(json_object_array_get_idx(rs, 0), "response_range");
    json_object *kvs = etcd_kvs_of(range);
    if (!range) {
        err = dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: creating the lock key: a reply"
                           " without its read", ec->where);
    } else if (!kvs || json_object_array_length(kvs) == 0) {
        err = 1; /* it went between the compare and the read: again */
    } else if (etcd_kv_read(json_object_array_get_idx(kvs, 0), holder) != 0) {
        err = oom(ec);
    } else if (holder->lease == held->lease) {
        /* A repeat after a lost reply: the first attempt created it. */
        held->base.token = (uint64_t)holder->create;
        free(holder->key);
        memset(holder, 0, sizeof *holder);
    }
    json_object_put(root);
    return err;
}

/* The name's key (kv, its value's bytes in value, *vlen of them): 0 with
 * *found, or an error. */
static int read_single(struct etcd_conn *ec, const char *name, size_t len, uint64_t until,
                       struct etcd_kv *kv, unsigned char *value, size_t *vlen, int *found)
{
    size_t klen;
    char *key = etcd_single_key(ec, name, len, &klen);
    json_object *req = json_object_new_object(), *root;
    if (!key || !req) {
        free(key);
        json_object_put(req);
        return oom(ec);
    }
    json_object_object_add(req, "key", etcd_new_bytes(key, klen));
    free(key);
    int err = etcd_call_ok(ec, &ec->app, "/v3/kv/range", req, until, DLOCK_ECONNECT,
                           "inspect: reading the lock key", &root);
    if (err)
        return err;
    json_object *kvs = etcd_kvs_of(root);
    json_object *o = kvs && json_object_array_length(kvs) ? json_object_array_get_idx(kvs, 0)
                                                          : NULL;
    *found = 0;
    if (o && etcd_kv_read(o, kv) != 0) {
        json_object_put(root);
        return dlock_seterr(cl(ec), DLOCK_EPROTO, "etcd %s: inspect: a bad key", ec->where);
    }
    if (o) {
        free(kv->key);
        kv->key = NULL;
        *found = 1;
        json_object *v = etcd_get(o, "value");
        if (!v || etcd_bytes(v, value, vlen) != 0)
            *vlen = 0;
    }
    json_object_put(root);
    return 0;
}

/* What a holder is known by: a dlock holder's value is its owner id (32
 * lower-case hex digits; its token is the key's create revision); any
 * other value is a foreign holder's (python-etcd3's: a uuid of 16 bytes),
 * shown in hex, with no token. Returns DLOCK_KNOWS_* for the two. */
static unsigned describe(const struct etcd_kv *kv, const unsigned char *value, size_t vlen,
                         char *owner, size_t size, uint64_t *token)
{
    if (etcd_owner_id(value, vlen)) {
        snprintf(owner, size, "%.32s", (const char *)value);
        *token = (uint64_t)kv->create;
        return DLOCK_KNOWS_OWNER | DLOCK_KNOWS_TOKEN;
    }
    if (!vlen)
        return 0;
    size_t w = (size_t)snprintf(owner, size, "value ");
    if (w < size) /* as many bytes as fit, in hex */
        dlock_hex(value, vlen < (size - w - 1) / 2 ? vlen : (size - w - 1) / 2, owner + w);
    return DLOCK_KNOWS_OWNER;
}

/* The name's holder: 0 with *found and, when found, *known (DLOCK_KNOWS_*
 * of owner, token, lease) with what they are; or an error. */
static int single_holder(struct etcd_conn *ec, const char *name, size_t len, int *found,
                         unsigned *known, char *owner, size_t size, uint64_t *token,
                         uint64_t *lease_ms)
{
    struct etcd_kv kv;
    unsigned char value[DLOCK_HOLDER_MAX];
    size_t vlen = sizeof value;
    uint64_t until = call_until(ec);
    int err = read_single(ec, name, len, until, &kv, value, &vlen, found);
    *known = 0;
    if (err || !*found)
        return err;
    *known = describe(&kv, value, vlen, owner, size, token);
    if (kv.lease && (*lease_ms = etcd_lease_left_ms(ec, kv.lease, until, &err)) != 0)
        *known |= DLOCK_KNOWS_LEASE;
    return err;
}

int etcd_single_inspect(struct etcd_conn *ec, const char *name, size_t len, dlock_info *info)
{
    unsigned known;
    int found, err = single_holder(ec, name, len, &found, &known, info->owner,
                                   sizeof info->owner, &info->token, &info->lease_ms);
    if (err)
        return err;
    /* No queue: waiters write nothing, so they are not known. */
    info->known |= DLOCK_KNOWS_HELD | known;
    info->held = found;
    return 0;
}

int etcd_single_inspect_holders(struct etcd_conn *ec, const char *name, size_t len,
                                dlock_holder *holders, size_t capacity, size_t *count)
{
    dlock_holder one = {0};
    unsigned known;
    int found, err = single_holder(ec, name, len, &found, &known, one.owner, sizeof one.owner,
                                   &one.token, &one.lease_ms);
    if (err)
        return err;
    *count = (size_t)found;
    if (found && capacity) {
        one.known = DLOCK_KNOWS_MODE | known;
        one.mode = DLOCK_MODE_EXCLUSIVE;
        holders[0] = one;
    }
    return 0;
}
