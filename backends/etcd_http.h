/*
 * etcd's v3 JSON gateway over libcurl, for backends/etcd.c: endpoints
 * tried in turn, the auth token, bounded calls. See etcd_http.c. The
 * JSON and base64 helpers are etcd_json.h's.
 */
#ifndef DLOCK_ETCD_HTTP_H
#define DLOCK_ETCD_HTTP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <json-c/json.h>

#include "dlock_backend.h"

/* gRPC status codes the gateway reports in {"code": N}. */
enum {
    ETCD_OK = 0,
    ETCD_INVALID_ARGUMENT = 3,
    ETCD_NOT_FOUND = 5,
    ETCD_PERMISSION_DENIED = 7,
    ETCD_FAILED_PRECONDITION = 9,
    ETCD_UNAVAILABLE = 14,
    ETCD_UNAUTHENTICATED = 16,
};

/* What a connection's handles share: the endpoints, the credentials and
 * the auth token (the keeper's thread uses them too, under mu). */
struct etcd_site {
    dlock_client *client;
    char **urls; /* "http://host:port", one per endpoint */
    size_t n;
    size_t cur;  /* the endpoint that answered last (under mu) */
    char *user, *password;
    char *cacert, *cert, *key; /* TLS files, NULL when not given */
    int tls;
    uint64_t connect_ms, timeout_ms;
    const char *where; /* the endpoints, for messages */
    pthread_mutex_t mu;
    char *token;    /* under mu; NULL: none (no credentials, or auth off) */
    unsigned gen;   /* bumped at each authentication (0: none yet) */
    int auth_off;   /* the server said auth is not enabled (under mu) */
};

/* One thread's HTTP client: a libcurl handle (its connection is kept
 * alive between calls) and the reply buffer. */
struct etcd_http {
    CURL *h;
    char *buf;
    size_t len, cap;
    char err[CURL_ERROR_SIZE];
    int connected; /* a call got through before (reconnections are counted) */
    int fresh;     /* the last call needed a new connection: libcurl may have sent it twice */
    /* While >= 0, a call in flight (or about to be sent) ends when this
     * descriptor turns readable (a dlock_cancel's): DLOCK_ECANCELED. */
    int cancel_fd;
    CURLM *multi; /* every call runs on it (made at the first), polled with cancel_fd */
};

/* A reply: the parsed JSON (the caller puts it), the gRPC code the
 * gateway gave (0: none) and whether the request may have reached a
 * server before its reply was lost on an earlier attempt. */
struct etcd_res {
    json_object *root;
    int code;
    int again;
};

int etcd_global_init(void);
int etcd_http_init(struct etcd_site *s, struct etcd_http *h);
void etcd_http_free(struct etcd_http *h);

/*
 * POSTs req (JSON) to path ("/v3/kv/range"...) on the endpoint that
 * answered last, then on the others in turn when one cannot be reached or
 * has no leader, until `until` (absolute CLOCK_MONOTONIC; `late` is the
 * error then: DLOCK_ECONNECT or DLOCK_ETIMEDOUT). Authenticates first when
 * the site has credentials, and again once when the server says the token
 * is no longer valid. Returns 0 with *r filled (r->code may be a gRPC
 * error the caller maps: etcd_error()), or an error recorded on the site's
 * client.
 */
int etcd_call(struct etcd_site *s, struct etcd_http *h, const char *path, json_object *req,
              uint64_t until, int late, struct etcd_res *r);
/* Authenticates now (open): 0, DLOCK_EAUTH, or a connection error. */
int etcd_authenticate(struct etcd_site *s, struct etcd_http *h, uint64_t until, int late);
/* The curl options a request needs (URL, TLS, auth header), for the watch
 * stream, which is driven by the caller. hdr is the caller's to free. */
int etcd_prepare(struct etcd_site *s, CURL *h, size_t ep, const char *path, const char *body,
                 int with_token, struct curl_slist **hdr);
/* Records a reply's gRPC error as a dlock error (what: the operation). */
int etcd_error(struct etcd_site *s, const struct etcd_res *r, const char *what);

#endif
