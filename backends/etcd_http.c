/*
 * etcd's v3 JSON gateway (grpc-gateway, /v3/...) over libcurl.
 *
 * Why the gateway and not gRPC: etcd serves it on its client port in every
 * 3.x release, Debian packages libcurl and json-c for C, and a C program
 * then needs no C++ runtime, no protobuf code generation and no gRPC
 * library (Debian has no C binding of gRPC). A request is a POST of JSON;
 * int64s travel as strings, bytes (keys, values) as base64. Streams (the
 * watch) are one JSON object per line of a chunked reply.
 *
 * Each thread that talks to etcd has its own libcurl handle (struct
 * etcd_http), whose connection is kept alive between calls: the
 * application's thread, the keeper's thread, and the application's watch
 * stream. What they share (endpoints, credentials, the auth token) is an
 * etcd_site, the token under its mutex.
 *
 * Endpoints: a call goes to the endpoint that answered last. One that
 * cannot be reached, or that answers "unavailable" (no leader, leader
 * changed, a follower cut off from the leader), passes the call to the
 * next; once every endpoint failed in a row (refused, reset, silent past
 * its share of the bound, a TLS handshake refused), the call fails with
 * DLOCK_ECONNECT (a store that is down is reported, not waited for), while
 * "unavailable" is asked again 50 ms later within the call's bound (an
 * election takes about a second). Every
 * call is bounded by an absolute time: libcurl's timeouts are set from
 * it, in milliseconds, before each attempt.
 *
 * Auth: with a user in the URI, /v3/auth/authenticate gives a token sent
 * as the Authorization header of every request; when the server says it
 * is no longer valid (it expires, 5 minutes by default, and is forgotten
 * by a restarted or another member with simple tokens) the call
 * authenticates again once and repeats. A server with auth disabled
 * accepts any request; the credentials are then not used.
 */
#include "backends/etcd_http.h"
#include "backends/etcd_json.h"
#include "backends/etcd_reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define UNAVAILABLE_PAUSE_MS 50

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int etcd_global_init(void)
{
    pthread_once(&global_once, global_init);
    return global_rc == CURLE_OK ? 0 : -1;
}

static size_t on_body(char *data, size_t size, size_t n, void *user)
{
    struct etcd_http *h = user;
    size_t len = size * n;
    return etcd_append(&h->buf, &h->len, &h->cap, data, len) == 0 ? len : 0;
}

int etcd_http_init(struct etcd_site *s, struct etcd_http *h)
{
    memset(h, 0, sizeof *h);
    h->cancel_fd = -1;
    if (etcd_global_init() != 0 || !(h->h = curl_easy_init()))
        return dlock_seterr(s->client, DLOCK_ENOMEM, "etcd: cannot start libcurl");
    return 0;
}

void etcd_http_free(struct etcd_http *h)
{
    if (h->h)
        curl_easy_cleanup(h->h);
    if (h->multi)
        curl_multi_cleanup(h->multi);
    free(h->buf);
    memset(h, 0, sizeof *h);
    h->cancel_fd = -1;
}

int etcd_prepare(struct etcd_site *s, CURL *h, size_t ep, const char *path, const char *body,
                 int with_token, struct curl_slist **hdr)
{
    char url[512], auth[1200];
    struct curl_slist *l = curl_slist_append(NULL, "Content-Type: application/json");
    pthread_mutex_lock(&s->mu);
    int has = with_token && s->token != NULL &&
              snprintf(auth, sizeof auth, "Authorization: %s", s->token) < (int)sizeof auth;
    pthread_mutex_unlock(&s->mu);
    if (l && has)
        l = curl_slist_append(l, auth) ? l : (curl_slist_free_all(l), NULL);
    *hdr = l;
    if (!l)
        return dlock_seterr(s->client, DLOCK_ENOMEM, "out of memory");
    snprintf(url, sizeof url, "%s%s", s->urls[ep], path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROXY, ""); /* loopback and cluster hosts: never an env proxy */
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 1L);
    if (s->tls) {
        if (s->cacert)
            curl_easy_setopt(h, CURLOPT_CAINFO, s->cacert);
        if (s->cert)
            curl_easy_setopt(h, CURLOPT_SSLCERT, s->cert);
        if (s->key)
            curl_easy_setopt(h, CURLOPT_SSLKEY, s->key);
    }
    return 0;
}

static const char *reply_message(json_object *root)
{
    json_object *m = etcd_get(root, "message");
    if (!m)
        m = etcd_get(root, "error");
    return m && json_object_is_type(m, json_type_string) ? json_object_get_string(m) : "";
}

int etcd_error(struct etcd_site *s, const struct etcd_res *r, const char *what)
{
    const char *m = reply_message(r->root);
    int code = DLOCK_ESTORE;
    if (r->code == ETCD_UNAUTHENTICATED || r->code == ETCD_PERMISSION_DENIED ||
        strstr(m, "user name is empty") || strstr(m, "invalid auth token") ||
        strstr(m, "authentication failed") || strstr(m, "permission denied"))
        code = DLOCK_EAUTH;
    else if (r->code == ETCD_UNAVAILABLE)
        code = DLOCK_ECONNECT;
    return dlock_seterr(s->client, code, "etcd %s: %s: %s (gRPC code %d)", s->where, what,
                        m[0] ? m : "no message", r->code);
}

static size_t endpoint_now(struct etcd_site *s)
{
    pthread_mutex_lock(&s->mu);
    size_t ep = s->cur;
    pthread_mutex_unlock(&s->mu);
    return ep;
}

static void endpoint_set(struct etcd_site *s, size_t ep)
{
    pthread_mutex_lock(&s->mu);
    s->cur = ep;
    pthread_mutex_unlock(&s->mu);
}

/* A pause between attempts, cut short by h's cancel (the next call then
 * returns DLOCK_ECANCELED before sending anything). */
static void pause_until(const struct etcd_http *h, uint64_t t)
{
    while (dlock_pause_until(t, h->cancel_fd) == DLOCK_EINTR) {
    }
}

/* One transfer on h's own multi handle (one connection cache whether a
 * cancel is watched or not), ended when h->cancel_fd turns readable
 * (CURLE_ABORTED_BY_CALLBACK, before anything is sent if it already has).
 * The transfer's own timeouts bound it; an abandoned transfer closes its
 * connection. */
static CURLcode perform(struct etcd_http *h)
{
    if (dlock_fd_cancelled(h->cancel_fd))
        return CURLE_ABORTED_BY_CALLBACK;
    if (!h->multi && !(h->multi = curl_multi_init()))
        return CURLE_OUT_OF_MEMORY;
    if (curl_multi_add_handle(h->multi, h->h) != CURLM_OK)
        return CURLE_FAILED_INIT;
    CURLcode rc = CURLE_OK;
    for (;;) {
        int running = 0, left = 0;
        if (curl_multi_perform(h->multi, &running) != CURLM_OK) {
            rc = CURLE_FAILED_INIT;
            break;
        }
        if (!running) {
            CURLMsg *m = curl_multi_info_read(h->multi, &left);
            rc = m && m->msg == CURLMSG_DONE ? m->data.result : CURLE_FAILED_INIT;
            break;
        }
        struct curl_waitfd cancel = {h->cancel_fd, CURL_WAIT_POLLIN, 0};
        if (curl_multi_poll(h->multi, &cancel, h->cancel_fd >= 0, 1000, NULL) != CURLM_OK) {
            rc = CURLE_FAILED_INIT;
            break;
        }
        if (cancel.revents) {
            rc = CURLE_ABORTED_BY_CALLBACK;
            break;
        }
    }
    curl_multi_remove_handle(h->multi, h->h);
    return rc;
}

/* One POST on endpoint ep, bounded by until: 0 with the reply parsed into
 * *root, or the curl error (its text in h->err). */
static CURLcode post(struct etcd_site *s, struct etcd_http *h, size_t ep, const char *path,
                     const char *body, int with_token, uint64_t until, json_object **root,
                     long *status)
{
    struct curl_slist *hdr = NULL;
    uint64_t now = dlock_monotonic_ns();
    /* libcurl's timeouts count whole milliseconds: rounded down, so that
     * a transfer never runs past until (it may end up to 1 ms before). */
    long left = until > now + 1000000 ? (long)((until - now) / 1000000) : 1;
    h->len = 0;
    h->err[0] = '\0';
    h->fresh = 0;
    if (etcd_prepare(s, h->h, ep, path, body, with_token, &hdr) != 0)
        return CURLE_OUT_OF_MEMORY;
    curl_easy_setopt(h->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h->h, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(h->h, CURLOPT_ERRORBUFFER, h->err);
    curl_easy_setopt(h->h, CURLOPT_TIMEOUT_MS, left);
    curl_easy_setopt(h->h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)s->connect_ms < left ? (long)s->connect_ms : left);
    CURLcode rc = perform(h);
    curl_slist_free_all(hdr);
    curl_easy_setopt(h->h, CURLOPT_HTTPHEADER, NULL);
    *root = NULL;
    if (rc != CURLE_OK)
        return rc;
    /* A new connection where one was open before (the member closed it,
     * died, or the call moved to another endpoint): a reconnection. */
    long fresh = 0;
    curl_easy_getinfo(h->h, CURLINFO_NUM_CONNECTS, &fresh);
    if (fresh > 0 && h->connected) {
        dlock_count_reconnect(s->client);
        h->fresh = 1;
    }
    h->connected = 1;
    curl_easy_getinfo(h->h, CURLINFO_RESPONSE_CODE, status);
    *root = h->len ? json_tokener_parse(h->buf) : NULL;
    return CURLE_OK;
}

static int auth_reply(struct etcd_site *s, json_object *root, long status)
{
    json_object *t = etcd_get(root, "token");
    int code = (int)etcd_int(root, "code");
    const char *m = reply_message(root);
    if (t && json_object_is_type(t, json_type_string)) {
        char *tok = strdup(json_object_get_string(t));
        if (!tok)
            return dlock_seterr(s->client, DLOCK_ENOMEM, "out of memory");
        pthread_mutex_lock(&s->mu);
        free(s->token);
        s->token = tok;
        s->gen++;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    if (code == ETCD_FAILED_PRECONDITION && strstr(m, "not enabled")) {
        pthread_mutex_lock(&s->mu);
        s->gen++; /* auth is off: every request is accepted without a token */
        s->auth_off = 1;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    if (code == ETCD_INVALID_ARGUMENT || code == ETCD_UNAUTHENTICATED ||
        code == ETCD_PERMISSION_DENIED || strstr(m, "authentication failed"))
        return dlock_seterr(s->client, DLOCK_EAUTH, "etcd %s: authentication failed for user"
                            " '%s': %s", s->where, s->user, m[0] ? m : "refused");
    return dlock_seterr(s->client, code == ETCD_UNAVAILABLE ? DLOCK_ECONNECT : DLOCK_EPROTO,
                        "etcd %s: authenticate: HTTP %ld: %s", s->where, status,
                        m[0] ? m : "no token in the reply");
}

static int late_error(struct etcd_site *s, int late, const char *what, const char *why)
{
    return dlock_seterr(s->client, late, "etcd %s: %s: %s", s->where, what,
                        late == DLOCK_ETIMEDOUT ? "the deadline passed before a reply"
                        : why[0]                ? why
                                                : "no reply in time (timeout)");
}

/* Connection failures and server failures before a reply: the next
 * endpoint. Refused connections never reached a server. */
static int reached(CURLcode rc)
{
    return rc != CURLE_COULDNT_CONNECT && rc != CURLE_COULDNT_RESOLVE_HOST &&
           rc != CURLE_SSL_CONNECT_ERROR;
}

/* What a reset TLS connection without a client certificate usually
 * means (with TLS 1.3 the server's refusal arrives as a reset). */
static const char *tls_hint(const struct etcd_site *s, CURLcode rc)
{
    if (s->tls && !s->cert &&
        (rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR || rc == CURLE_SSL_CONNECT_ERROR))
        return " (does the server require a client certificate? cert= and key=)";
    return "";
}

int etcd_authenticate(struct etcd_site *s, struct etcd_http *h, uint64_t until, int late)
{
    json_object *req = json_object_new_object();
    if (!req)
        return dlock_seterr(s->client, DLOCK_ENOMEM, "out of memory");
    json_object_object_add(req, "name", json_object_new_string(s->user));
    json_object_object_add(req, "password", json_object_new_string(s->password ? s->password : ""));
    char why[CURL_ERROR_SIZE + 64] = "";
    const char *body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    size_t ep = endpoint_now(s), failed = 0;
    int err;
    for (;;) {
        if (dlock_monotonic_ns() >= until) {
            err = late_error(s, late, "authenticate", why);
            break;
        }
        json_object *root = NULL;
        long status = 0;
        /* The old token (if any) stays for the other thread's calls until
         * the new one replaces it, and does not go out with this one. */
        CURLcode rc = post(s, h, ep, "/v3/auth/authenticate", body, 0, until, &root, &status);
        if (rc == CURLE_ABORTED_BY_CALLBACK) {
            err = dlock_cancelled(s->client);
            break;
        }
        if (rc == CURLE_OK && root && (int)etcd_int(root, "code") != ETCD_UNAVAILABLE) {
            err = auth_reply(s, root, status);
            json_object_put(root);
            if (err == 0)
                endpoint_set(s, ep);
            break;
        }
        if (rc != CURLE_OK)
            snprintf(why, sizeof why, "%s: %s", s->urls[ep], h->err[0] ? h->err : curl_easy_strerror(rc));
        else
            snprintf(why, sizeof why, "%s: %s", s->urls[ep], root ? reply_message(root) : "no JSON");
        json_object_put(root);
        failed = rc != CURLE_OK ? failed + 1 : 0;
        ep = (ep + 1) % s->n;
        if (failed >= s->n) {
            err = dlock_seterr(s->client, DLOCK_ECONNECT, "etcd %s: cannot connect: %s%s", s->where,
                               why, tls_hint(s, rc));
            break;
        }
        if (rc == CURLE_OK) {
            uint64_t t = dlock_monotonic_ns() + UNAVAILABLE_PAUSE_MS * 1000000ull;
            pause_until(h, t < until ? t : until);
        }
    }
    json_object_put(req);
    return err;
}

int etcd_call(struct etcd_site *s, struct etcd_http *h, const char *path, json_object *req,
              uint64_t until, int late, struct etcd_res *r)
{
    const char *body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    char why[CURL_ERROR_SIZE + 64] = "";
    size_t ep = endpoint_now(s), failed = 0;
    int reauth = 0, err;
    memset(r, 0, sizeof *r);
    /* A builder that ran out of memory leaves a null where a value should
     * be (json-c adds NULL as null): never send such a request (a compare
     * without its range_end would test one key, not the range). No request
     * of dlock's has a null, and base64, hex and words hold no ':' ',' '['. */
    if (!etcd_body_ok(body))
        return dlock_seterr(s->client, DLOCK_ENOMEM, "out of memory building a request");
    /* No token: never had one, or the last authentication failed (a
     * member restarting forgets its tokens, and may not answer the next
     * authentication in time). */
    pthread_mutex_lock(&s->mu);
    int need = s->user && !s->token && !s->auth_off;
    pthread_mutex_unlock(&s->mu);
    if (need && (err = etcd_authenticate(s, h, until, late)) != 0)
        return err;
    for (;;) {
        if (dlock_monotonic_ns() >= until)
            return late_error(s, late, path, why);
        json_object *root = NULL;
        long status = 0;
        /* With other endpoints left, a silent one gets half of what is
         * left, so that the next still has time to answer. */
        uint64_t now = dlock_monotonic_ns(), a_until = s->n > 1 ? now + (until - now) / 2 : until;
        pthread_mutex_lock(&s->mu);
        unsigned gen = s->gen;
        pthread_mutex_unlock(&s->mu);
        CURLcode rc = post(s, h, ep, path, body, 1, a_until, &root, &status);
        if (h->fresh)
            r->again = 1;
        if (rc == CURLE_ABORTED_BY_CALLBACK) {
            r->again = 1; /* it may have reached the member */
            return dlock_cancelled(s->client);
        }
        if (rc == CURLE_OK && !root)
            return dlock_seterr(s->client, DLOCK_EPROTO, "etcd %s: %s: HTTP %ld with no JSON"
                                " reply (is this etcd's client port?)", s->urls[ep], path, status);
        if (rc == CURLE_OK) {
            int code = etcd_get(root, "error") ? (int)etcd_int(root, "code") : 0;
            const char *m = reply_message(root);
            if (code == ETCD_UNAVAILABLE) {
                snprintf(why, sizeof why, "%s: %s", s->urls[ep], m);
                /* "leader changed" and "request timed out" may follow an
                 * applied write; "no leader" applied nothing. */
                if (strstr(m, "leader changed") || strstr(m, "timed out"))
                    r->again = 1;
                json_object_put(root);
                failed = 0; /* a member answered: this is an election, not an outage */
                ep = (ep + 1) % s->n;
                uint64_t t = dlock_monotonic_ns() + UNAVAILABLE_PAUSE_MS * 1000000ull;
                pause_until(h, t < until ? t : until);
                continue;
            }
            if (s->user && !reauth &&
                (code == ETCD_UNAUTHENTICATED || strstr(m, "invalid auth token") ||
                 strstr(m, "user name is empty"))) {
                json_object_put(root);
                pthread_mutex_lock(&s->mu);
                int renewed = s->gen != gen; /* the other thread got a new token meanwhile */
                pthread_mutex_unlock(&s->mu);
                if (renewed)
                    continue;
                reauth = 1;
                if ((err = etcd_authenticate(s, h, until, late)) != 0)
                    return err;
                continue;
            }
            endpoint_set(s, ep);
            r->root = root;
            r->code = code;
            return 0;
        }
        snprintf(why, sizeof why, "%s: %s", s->urls[ep], h->err[0] ? h->err : curl_easy_strerror(rc));
        if (reached(rc))
            r->again = 1;
        if (rc == CURLE_OPERATION_TIMEDOUT && dlock_monotonic_ns() + 1000000 > until)
            return late_error(s, late, path, why); /* at its bound, to the millisecond */
        /* Every endpoint failed once in a row: the store is out of reach
         * (or a TLS handshake is refused), said now rather than tried in
         * a loop. */
        ep = (ep + 1) % s->n;
        if (++failed >= s->n)
            return dlock_seterr(s->client, DLOCK_ECONNECT, "etcd %s: cannot connect: %s%s",
                                s->where, why, tls_hint(s, rc));
    }
}
