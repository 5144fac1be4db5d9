/*
 * Elections on etcd (dlock.h "Leader election"; docs/etcd.md, Elections):
 * the leader's value, who leads, and the observers' watch.
 *
 * The value lives in a key beside the name's queue: <prefix>/<name>0
 * (the escaped name as in its keys' <prefix>/<name>/, the '/' replaced by
 * '0'). No name's key is of that form (every queue key has a '/' after
 * the name, and escaped names hold no '/'), it is outside the queue's
 * range (etcdctl lock and concurrency.Mutex see no extra contender), and
 * it is the key just after that range, so one watch range covers both
 * and nothing else. Its value: the holder's token (its key's create
 * revision) in 16 hex digits, then the value's bytes; it is put on the
 * holder's lease (it goes when the grant ends: release, expiry) by a
 * transaction that compares the holder's key's create revision with the
 * token (nothing written, DLOCK_ELOST, when the grant is gone).
 *
 * leader(): one transaction reading the queue (as inspect) and the value
 * key; the value is told only when its token is the holder's. The lease
 * left takes one call more (as inspect).
 *
 * The watch: a watch stream of its own (a libcurl handle on a multi of
 * its own) over the queue and the value key, from the member's current
 * revision; watch_open returns once the member confirmed it. Every put
 * and delete there (a grant, a release, a publish, a lease's expiry
 * deleting the keys) is an event; the stream's socket is the descriptor
 * the core polls. An idle watch sends nothing (etcd sends no progress
 * notifications unless asked). The stream carries gRPC's "hasleader"
 * metadata, so a member that loses its leader ends it; an ended stream
 * is an error of watch_read (the core opens another).
 *
 * layout=etcd3 (python-etcd3's single key) has no elections: the
 * connection's caps leave them out (the core says so, naming the layout).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/etcd_int.h"

#define TOKEN_HEX 16

struct etcd_watch {
    dlock_watch base;
    CURL *h;
    CURLM *multi;
    struct curl_slist *hdr;
    json_object *req; /* the body's JSON (libcurl reads the body from it) */
    struct etcd_stream s;
    int fd;
    curl_socket_t socks[4]; /* the sockets libcurl opened and has not closed */
};

/* held's name's value key (held->dir bytes, malloc'd; NULL: no memory):
 * its key prefix with the last '/' made a '0'. */
static char *value_key_of(const struct etcd_held *held)
{
    char *k = malloc(held->dir);
    if (k) {
        memcpy(k, held->key, held->dir);
        k[held->dir - 1] = '0';
    }
    return k;
}

static int refuse(struct etcd_conn *ec)
{
    return dlock_seterr(cl(ec), DLOCK_ENOTSUP, "the etcd backend has no elections in"
                        " layout=etcd3");
}

int etcd_publish(dlock_conn *conn, dlock_held *h, const void *value, size_t len)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    struct etcd_held *held = (struct etcd_held *)h;
    if (ec->layout != ETCD_LAYOUT_DLOCK)
        return refuse(ec);
    /* The value key goes on the leader's lease: its release revokes that
     * lease (taking the value too) rather than deleting the key alone. */
    held->published = 1;
    char *data = malloc(TOKEN_HEX + 1 + len), *vkey = value_key_of(held);
    json_object *txn = json_object_new_object(), *cmps = json_object_new_array();
    json_object *ok = json_object_new_array(), *put = json_object_new_object(), *root;
    if (!data || !vkey || !txn || !cmps || !ok || !put) {
        free(data), free(vkey);
        json_object_put(txn), json_object_put(cmps), json_object_put(ok), json_object_put(put);
        return oom(ec);
    }
    snprintf(data, TOKEN_HEX + 1, "%016" PRIx64, held->base.token);
    if (len)
        memcpy(data + TOKEN_HEX, value, len);
    json_object_array_add(cmps, etcd_create_cmp(held->key, held->klen, "EQUAL",
                                                (int64_t)held->base.token));
    json_object_object_add(put, "key", etcd_new_bytes(vkey, held->dir));
    json_object_object_add(put, "value", etcd_new_bytes(data, TOKEN_HEX + len));
    json_object_object_add(put, "lease", etcd_new_int(held->lease));
    json_object_array_add(ok, etcd_wrap("request_put", put));
    json_object_object_add(txn, "compare", cmps);
    json_object_object_add(txn, "success", ok);
    free(data);
    free(vkey);
    int err = etcd_txn(ec, txn, "publishing the leader's value", DLOCK_ELOST, &root);
    if (err == DLOCK_ELOST)
        return dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the leader's lease is gone",
                            ec->where);
    if (err)
        return err;
    int done = json_object_get_boolean(etcd_get(root, "succeeded"));
    json_object_put(root);
    if (!done)
        return dlock_seterr(cl(ec), DLOCK_ELOST, "etcd %s: the leader's key is gone", ec->where);
    return 0;
}

json_object *etcd_value_move(const struct etcd_held *held, int64_t lease)
{
    json_object *txn = json_object_new_object(), *cmps = json_object_new_array();
    json_object *cmp = json_object_new_object(), *ok = json_object_new_array();
    char *vkey = value_key_of(held);
    if (!txn || !cmps || !cmp || !ok || !vkey) {
        json_object_put(txn), json_object_put(cmps), json_object_put(cmp), json_object_put(ok);
        free(vkey);
        return NULL; /* a null: the request is refused as out of memory */
    }
    json_object_object_add(cmp, "key", etcd_new_bytes(vkey, held->dir));
    json_object_object_add(cmp, "target", json_object_new_string("VERSION"));
    json_object_object_add(cmp, "result", json_object_new_string("GREATER"));
    json_object_object_add(cmp, "version", etcd_new_int(0));
    json_object_array_add(cmps, cmp);
    json_object_array_add(ok, etcd_put_lease(vkey, held->dir, lease));
    free(vkey);
    json_object_object_add(txn, "compare", cmps);
    json_object_object_add(txn, "success", ok);
    return etcd_wrap("request_txn", txn);
}

/* The i-th response of a transaction's reply, a range's. */
static json_object *range_of(json_object *root, size_t i)
{
    json_object *rs = etcd_get(root, "responses");
    if (!rs || !json_object_is_type(rs, json_type_array) || json_object_array_length(rs) <= i)
        return NULL;
    return etcd_get(json_object_array_get_idx(rs, i), "response_range");
}

/* Copies the value of the value key's kv (vkv) to value when its token is
 * the holder's (info). */
static void take_value(json_object *vkv, const dlock_info *info, char *value,
                       size_t *value_len)
{
    unsigned char buf[TOKEN_HEX + DLOCK_VALUE_MAX];
    size_t n = sizeof buf;
    char hex[TOKEN_HEX + 1];
    json_object *v = etcd_get(vkv, "value"); /* absent: an empty value */
    *value_len = 0;
    /* Longer than dlock writes, or not base64: not a leader's. */
    if (!v || !(info->known & DLOCK_KNOWS_TOKEN) || etcd_bytes(v, buf, &n) != 0 ||
        n < TOKEN_HEX)
        return;
    snprintf(hex, sizeof hex, "%016" PRIx64, info->token);
    if (memcmp(buf, hex, TOKEN_HEX) != 0)
        return; /* an earlier leader's */
    *value_len = n - TOKEN_HEX;
    memcpy(value, buf + TOKEN_HEX, *value_len);
}

int etcd_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info, char *value,
                  size_t *value_len)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    size_t dlen;
    *value_len = 0;
    if (ec->layout != ETCD_LAYOUT_DLOCK)
        return refuse(ec);
    char *dir = etcd_name_dir(ec, name, len, &dlen);
    json_object *txn = json_object_new_object(), *ok = json_object_new_array();
    json_object *vr = json_object_new_object(), *root;
    if (!dir || !txn || !ok || !vr) {
        free(dir);
        json_object_put(txn), json_object_put(ok), json_object_put(vr);
        return oom(ec);
    }
    json_object_array_add(ok, etcd_wrap("request_range",
                                        etcd_range_req(dir, dlen, "ASCEND",
                                                       DLOCK_INFO_LISTED + 1, 0)));
    dir[dlen - 1] = '0';
    json_object_object_add(vr, "key", etcd_new_bytes(dir, dlen));
    json_object_array_add(ok, etcd_wrap("request_range", vr));
    json_object_object_add(txn, "success", ok);
    free(dir);
    uint64_t until = call_until(ec);
    int err = etcd_call_ok(ec, &ec->app, "/v3/kv/txn", txn, until, DLOCK_ECONNECT,
                           "reading the leader", &root);
    if (err)
        return err;
    json_object *queue = range_of(root, 0), *vals = etcd_kvs_of(range_of(root, 1));
    int64_t lease = 0;
    err = etcd_inspect_range(ec, queue, dlen, info, &lease);
    if (err == 0)
        take_value(vals && json_object_array_length(vals) ? json_object_array_get_idx(vals, 0)
                                                          : NULL,
                   info, value, value_len);
    json_object_put(root);
    if (err == 0 && lease && (info->lease_ms = etcd_lease_left_ms(ec, lease, until, &err)) != 0)
        info->known |= DLOCK_KNOWS_LEASE;
    return err;
}

/* A release's revoke deletes the keys: the watches see it. */
int etcd_wake(dlock_conn *conn, const char *name, size_t len)
{
    (void)conn, (void)name, (void)len;
    return 0;
}

/* ---- the watch ------------------------------------------------------------ */

static size_t on_event(char *data, size_t size, size_t n, void *user)
{
    struct etcd_watch *w = user;
    size_t len = size * n;
    if (etcd_stream_feed(&w->s, data, len) != len)
        return 0;
    while (w->s.done == 1) { /* an event (the descriptor told it): read on */
        w->s.done = 0;
        etcd_stream_feed(&w->s, "", 0);
    }
    return w->s.done ? 0 : len; /* 0 ends the transfer */
}

void etcd_watch_close(dlock_watch *dw)
{
    struct etcd_watch *w = (struct etcd_watch *)dw;
    if (!w)
        return;
    if (w->multi && w->h)
        curl_multi_remove_handle(w->multi, w->h);
    if (w->h)
        curl_easy_cleanup(w->h);
    if (w->multi)
        curl_multi_cleanup(w->multi);
    curl_slist_free_all(w->hdr);
    json_object_put(w->req);
    etcd_stream_free(&w->s);
    free(w);
}

/* The stream's socket: libcurl opens and closes it through these (it may
 * try more than one address), so the one left open is the stream's. */
static curl_socket_t open_socket(void *user, curlsocktype purpose, struct curl_sockaddr *a)
{
    struct etcd_watch *w = user;
    (void)purpose;
    curl_socket_t s = socket(a->family, a->socktype, a->protocol);
    for (size_t i = 0; s != CURL_SOCKET_BAD && i < sizeof w->socks / sizeof w->socks[0]; i++)
        if (w->socks[i] == CURL_SOCKET_BAD) {
            w->socks[i] = s;
            break;
        }
    return s;
}

static int close_socket(void *user, curl_socket_t s)
{
    struct etcd_watch *w = user;
    for (size_t i = 0; i < sizeof w->socks / sizeof w->socks[0]; i++)
        if (w->socks[i] == s)
            w->socks[i] = CURL_SOCKET_BAD;
    return close(s);
}

/* Drives the stream without blocking: 0 while it runs, else an error. */
static int pump(struct etcd_watch *w)
{
    struct etcd_conn *ec = (struct etcd_conn *)w->base.conn;
    int running = 0;
    /* Until nothing is left to read (libcurl may hold bytes read past a
     * call's share, which the socket no longer tells). */
    for (int i = 0; i < 16; i++) {
        int fds = 0;
        curl_multi_perform(w->multi, &running);
        if (!running || w->s.done)
            break;
        if (curl_multi_poll(w->multi, NULL, 0, 0, &fds) != CURLM_OK || fds == 0)
            break;
    }
    if (w->s.done == 2)
        return dlock_seterr(cl(ec), DLOCK_ECONNECT, "etcd %s: the election's watch ended: %s",
                            ec->where, w->s.why);
    if (!running)
        return dlock_seterr(cl(ec), DLOCK_ECONNECT, "etcd %s: the election's watch stream"
                            " closed", ec->where);
    return 0;
}

int etcd_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp)
{
    struct etcd_conn *ec = (struct etcd_conn *)conn;
    struct etcd_watch *w;
    size_t klen;
    int err;
    if (ec->layout != ETCD_LAYOUT_DLOCK)
        return refuse(ec);
    if (!(w = calloc(1, sizeof *w)))
        return oom(ec);
    w->base.conn = conn;
    w->fd = -1;
    w->s.any = 1;
    for (size_t i = 0; i < sizeof w->socks / sizeof w->socks[0]; i++)
        w->socks[i] = CURL_SOCKET_BAD;
    char *k = etcd_name_dir(ec, name, len, &klen), *end = k ? malloc(klen + 1) : NULL;
    json_object *cr = json_object_new_object();
    w->req = etcd_wrap("create_request", cr);
    w->h = curl_easy_init();
    w->multi = curl_multi_init();
    if (!k || !end || !cr || !w->req || !w->h || !w->multi) {
        free(k), free(end);
        if (!w->req)
            json_object_put(cr);
        etcd_watch_close(&w->base);
        return oom(ec);
    }
    /* [<name>/, <name>0 + NUL): the queue and the value key. */
    memcpy(end, k, klen);
    end[klen - 1] = '0';
    end[klen] = '\0';
    json_object_object_add(cr, "key", etcd_new_bytes(k, klen));
    json_object_object_add(cr, "range_end", etcd_new_bytes(end, klen + 1));
    free(k);
    free(end);
    pthread_mutex_lock(&ec->site.mu);
    size_t ep = ec->site.cur;
    pthread_mutex_unlock(&ec->site.mu);
    const char *body = json_object_to_json_string_ext(w->req, JSON_C_TO_STRING_PLAIN);
    struct curl_slist *more;
    if (!etcd_body_ok(body)) {
        etcd_watch_close(&w->base);
        return oom(ec);
    }
    if ((err = etcd_prepare(&ec->site, w->h, ep, "/v3/watch", body, 1, &w->hdr)) != 0) {
        etcd_watch_close(&w->base);
        return err;
    }
    if (!(more = curl_slist_append(w->hdr, "Grpc-Metadata-hasleader: true"))) {
        etcd_watch_close(&w->base);
        return oom(ec);
    }
    w->hdr = more;
    curl_easy_setopt(w->h, CURLOPT_HTTPHEADER, w->hdr);
    curl_easy_setopt(w->h, CURLOPT_WRITEFUNCTION, on_event);
    curl_easy_setopt(w->h, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(w->h, CURLOPT_CONNECTTIMEOUT_MS, (long)ec->site.connect_ms);
    curl_easy_setopt(w->h, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(w->h, CURLOPT_OPENSOCKETDATA, w);
    curl_easy_setopt(w->h, CURLOPT_CLOSESOCKETFUNCTION, close_socket);
    curl_easy_setopt(w->h, CURLOPT_CLOSESOCKETDATA, w);
    curl_multi_add_handle(w->multi, w->h);
    /* Until the member confirms the watch: every later change is told. */
    uint64_t until = call_until(ec);
    while (!w->s.created) {
        if ((err = pump(w)) != 0) {
            etcd_watch_close(&w->base);
            return err;
        }
        if (w->s.created)
            break;
        uint64_t now = dlock_monotonic_ns();
        if (now >= until) {
            etcd_watch_close(&w->base);
            return dlock_seterr(cl(ec), DLOCK_ETIMEDOUT, "etcd %s: the election's watch was"
                                " not confirmed within %" PRIu64 " ms", ec->where,
                                ec->site.timeout_ms);
        }
        int ms = (int)((until - now + MS - 1) / MS);
        curl_multi_poll(w->multi, NULL, 0, ms > 0 ? ms : 1, NULL);
    }
    curl_socket_t fd = CURL_SOCKET_BAD;
    for (size_t i = 0; fd == CURL_SOCKET_BAD && i < sizeof w->socks / sizeof w->socks[0]; i++)
        fd = w->socks[i];
    if (fd == CURL_SOCKET_BAD) {
        etcd_watch_close(&w->base);
        return dlock_seterr(cl(ec), DLOCK_ECONNECT, "etcd %s: the election's watch has no"
                            " socket", ec->where);
    }
    w->fd = (int)fd;
    *watchp = &w->base;
    return 0;
}

int etcd_watch_fd(dlock_watch *dw)
{
    return ((struct etcd_watch *)dw)->fd;
}

int etcd_watch_read(dlock_watch *dw)
{
    return pump((struct etcd_watch *)dw);
}
