/*
 * The Redis transport, under the connection layer: a connection's bytes,
 * plain or TLS, over one code path. hiredis 0.14 formats the commands
 * (redisAppendCommandArgv into ctx->obuf) and parses the replies (its
 * redisReader); everything that touches the socket is here: the TCP
 * connect (hiredis's, bounded), keepalive, the TLS handshake (rediss://),
 * writing what is buffered and reading into the reader.
 *
 * A TLS connection's session hangs off its reader's privdata (struct
 * redis_link; hiredis's default reply functions never use it), so that
 * every layer above keeps passing a redisContext and a plain connection
 * has none. Reads and writes on TLS go through a socket BIO of dlock's own
 * (send with MSG_NOSIGNAL, as the plain path: a closed peer never raises
 * SIGPIPE) which tells a socket timeout (SO_RCVTIMEO, set by the layer
 * above to the call's bound) from a record that carried no data.
 */
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <hiredis/sds.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

/* hiredis 1.0 renamed its sds functions hi_sds* (Debian's 0.14 has sds*). */
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
#define obuf_len hi_sdslen
#define obuf_clear hi_sdsclear
#else
#define obuf_len sdslen
#define obuf_clear sdsclear
#endif

#include "backends/redis_conn.h"
#include "core/internal.h"

#define MS 1000000ull
/* TCP keepalive on every connection: a peer that went silent (host down,
 * network cut) is noticed by an idle connection, such as a waiter's
 * subscriber, within IDLE + CNT * INTVL = 8 s. hiredis's own
 * redisEnableKeepAlive() would take 15 + 3 * 5 = 30 s. */
#define KEEPALIVE_IDLE_S 5
#define KEEPALIVE_INTVL_S 1
#define KEEPALIVE_CNT 3

struct redis_tls {
    SSL_CTX *ctx;
    int verify; /* tls_verify=full (1) or none (0) */
};

/* A TLS connection's state, at ctx->reader->privdata. */
struct redis_link {
    SSL *ssl;
    int fd;
    int timed_out; /* the last socket read or write hit the socket timeout */
    /* The server asked for a client certificate and we had none to give:
     * a connection it then closes at once refused us (a TLS 1.3 server
     * says so after the handshake, and its alert is lost when our first
     * command meets the closed socket). Cleared by the first data read. */
    int no_cert_asked;
    int fresh; /* no data read yet */
};

/* The index of the link in an SSL's ex_data, for the callback below. */
static int link_index = -1;

/* OpenSSL asks when the server wants a client certificate and none is
 * set: note it, and go on without one (the server decides). */
static int client_cert_cb(SSL *ssl, X509 **x509, EVP_PKEY **pkey)
{
    struct redis_link *l = SSL_get_ex_data(ssl, link_index);
    (void)x509, (void)pkey;
    if (l)
        l->no_cert_asked = 1;
    return 0;
}

static struct redis_link *link_of(const redisContext *ctx)
{
    return ctx->reader ? ctx->reader->privdata : NULL;
}

/* ---- the socket BIO ------------------------------------------------------ */

static int bio_write(BIO *b, const char *buf, int len)
{
    struct redis_link *l = BIO_get_data(b);
    ssize_t n;
    BIO_clear_retry_flags(b);
    do
        n = send(l->fd, buf, (size_t)len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        l->timed_out = 1;
        BIO_set_retry_write(b);
    }
    return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
    struct redis_link *l = BIO_get_data(b);
    ssize_t n;
    BIO_clear_retry_flags(b);
    do
        n = recv(l->fd, buf, (size_t)len, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        l->timed_out = 1;
        BIO_set_retry_read(b);
    }
    return (int)n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static BIO_METHOD *bio_method;
static void bio_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "dlock redis");
    if (m && BIO_meth_set_write(m, bio_write) && BIO_meth_set_read(m, bio_read) &&
        BIO_meth_set_ctrl(m, bio_ctrl))
        bio_method = m;
    else if (m)
        BIO_meth_free(m);
    link_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

/* ---- TLS settings (rediss://) -------------------------------------------- */

/* The first error OpenSSL queued, as a short reason. */
static const char *ssl_reason(unsigned long e)
{
    const char *r = NULL;
    if (e && ERR_SYSTEM_ERROR(e))
        return strerror(ERR_GET_REASON(e)); /* a file that is not there */
    r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown error";
}

/* An encrypted key file: no passphrase (OpenSSL's default would ask for
 * one on the terminal, inside a library call); the key is refused. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return 0;
}

int dlock_redis_tls_open(dlock_client *c, const dlock_uri *uri, int tls,
                         struct redis_tls **out)
{
    static const char *const opts[] = {"cacert", "cert", "key", "tls_verify", NULL};
    const char *cacert = dlock_uri_param(uri, "cacert"), *cert = dlock_uri_param(uri, "cert");
    const char *key = dlock_uri_param(uri, "key");
    int verify = 0, err;
    *out = NULL;
    if (!tls) {
        for (size_t i = 0; opts[i]; i++)
            if (dlock_uri_param(uri, opts[i]))
                return dlock_seterr(c, DLOCK_EBADURI,
                                    "%s is an option of TLS connections: use rediss:// "
                                    "(rediss+cluster://, rediss+sentinel://)",
                                    opts[i]);
        return 0;
    }
    if ((err = dlock_uri_param_choice(c, uri, "tls_verify", (const char *[]){"full", "none", NULL},
                                      &verify)) != 0)
        return err;
    if (key && !cert)
        return dlock_seterr(c, DLOCK_EBADURI, "key= needs cert= (the client certificate)");
    struct redis_tls *t = calloc(1, sizeof *t);
    if (!t)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    t->verify = verify == 0;
    ERR_clear_error();
    if (!(t->ctx = SSL_CTX_new(TLS_client_method()))) {
        free(t);
        return dlock_seterr(c, DLOCK_ENOMEM, "TLS: cannot make a context: %s",
                            ssl_reason(ERR_get_error()));
    }
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    /* A record that is not data (a TLS 1.3 session ticket) ends a read
     * with nothing read, so a poll loop above goes back to its poll. */
    SSL_CTX_clear_mode(t->ctx, SSL_MODE_AUTO_RETRY);
    SSL_CTX_set_verify(t->ctx, t->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    if (!cert)
        SSL_CTX_set_client_cert_cb(t->ctx, client_cert_cb);
    SSL_CTX_set_default_passwd_cb(t->ctx, no_passphrase);
    const char *what = NULL, *file = NULL;
    if (t->verify && cacert && SSL_CTX_load_verify_locations(t->ctx, cacert, NULL) != 1)
        what = "cacert", file = cacert;
    else if (t->verify && !cacert && SSL_CTX_set_default_verify_paths(t->ctx) != 1)
        what = "the system's CA certificates", file = "";
    else if (cert && SSL_CTX_use_certificate_chain_file(t->ctx, cert) != 1)
        what = "cert", file = cert;
    else if (cert && SSL_CTX_use_PrivateKey_file(t->ctx, key ? key : cert, SSL_FILETYPE_PEM) != 1)
        what = "key", file = key ? key : cert;
    else if (cert && SSL_CTX_check_private_key(t->ctx) != 1)
        what = "key", file = key ? key : cert;
    if (what) {
        unsigned long e = ERR_get_error();
        dlock_redis_tls_free(t);
        return dlock_seterr(c, DLOCK_EBADURI, "TLS: %s%s%s: cannot use it: %s", what,
                            file[0] ? "=" : "", file, e ? ssl_reason(e) : "not found");
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bio_method_init);
    if (!bio_method) {
        dlock_redis_tls_free(t);
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    }
    *out = t;
    return 0;
}

void dlock_redis_tls_free(struct redis_tls *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ctx);
    free(t);
}

/* ---- connecting ---------------------------------------------------------- */

/* Errors are ignored: keepalive only shortens how long a dead peer goes
 * unnoticed; calls are bounded by their timeouts without it. */
static void keepalive(redisContext *ctx)
{
    int on = 1;
    setsockopt(ctx->fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
    int idle = KEEPALIVE_IDLE_S, intvl = KEEPALIVE_INTVL_S, cnt = KEEPALIVE_CNT;
    setsockopt(ctx->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(ctx->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(ctx->fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
#endif
}

__attribute__((format(printf, 3, 4))) static void set_error(redisContext *ctx, int code,
                                                            const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx->err = code;
    vsnprintf(ctx->errstr, sizeof ctx->errstr, fmt, ap);
    va_end(ap);
}

static int is_ip(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* An alert by which the server refused our certificate (or its absence). */
static int refused_us(unsigned long e)
{
    switch (ERR_GET_REASON(e)) {
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        return 1;
    default:
        return 0;
    }
}

/* Records why a TLS call (SSL_connect, SSL_read, SSL_write: ret) failed,
 * in ctx->err and ctx->errstr; REDIS_ERR. */
static int tls_failed(redisContext *ctx, struct redis_link *l, int ret, const char *what)
{
    int e = SSL_get_error(l->ssl, ret);
    unsigned long q = ERR_peek_error();
    long v = SSL_get_verify_result(l->ssl);
    /* The peer closed: with a close_notify, without (OpenSSL 3 reports
     * that as an error), or reset. */
    int eof = e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && !q && ret == 0) ||
              ERR_GET_REASON(q) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
    int lost = eof || (e == SSL_ERROR_SYSCALL && !q);
    int handshaking = what[0] != '\0';
    if (lost && l->no_cert_asked)
        set_error(ctx, DLOCK_REDIS_ERR_TLS_AUTH,
                  "TLS: the server asked for a client certificate and closed the connection: "
                  "give one with cert=, key=");
    else if (lost && l->fresh && !handshaking && SSL_get_certificate(l->ssl))
        set_error(ctx, eof ? REDIS_ERR_EOF : REDIS_ERR_IO,
                  "TLS: the server closed the connection after the handshake (did it refuse "
                  "our client certificate?)");
    else if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && l->timed_out)
        /* The words the layer above knows as a socket timeout. */
        set_error(ctx, REDIS_ERR_IO, "%s%sResource temporarily unavailable", what,
                  handshaking ? ": " : "");
    else if (eof)
        set_error(ctx, REDIS_ERR_EOF, "%s%sServer closed the connection%s", what,
                  handshaking ? ": " : "", handshaking ? " (is the port a TLS port?)" : "");
    else if (lost)
        set_error(ctx, REDIS_ERR_IO, "%s%s%s", what, handshaking ? ": " : "", strerror(errno));
    else if (ERR_GET_REASON(q) == SSL_R_CERTIFICATE_VERIFY_FAILED && v != X509_V_OK)
        set_error(ctx, DLOCK_REDIS_ERR_TLS_AUTH, "%sserver certificate not accepted: %s",
                  handshaking ? "TLS handshake: " : "", X509_verify_cert_error_string(v));
    else if (refused_us(q))
        set_error(ctx, DLOCK_REDIS_ERR_TLS_AUTH, "TLS: %s: %s",
                  SSL_get_certificate(l->ssl)
                      ? "the server refused our client certificate"
                      : "the server wants a client certificate (give one with cert=, key=)",
                  ssl_reason(q));
    else if (ERR_GET_REASON(q) == SSL_R_WRONG_VERSION_NUMBER ||
             ERR_GET_REASON(q) == SSL_R_PACKET_LENGTH_TOO_LONG)
        set_error(ctx, REDIS_ERR_IO, "TLS: %s (is the port a TLS port? rediss:// speaks TLS)",
                  ssl_reason(q));
    else
        set_error(ctx, REDIS_ERR_IO, "TLS: %s", q ? ssl_reason(q) : "error");
    ERR_clear_error();
    return REDIS_ERR;
}

/* TLS over ctx's connected socket to host: the session, SNI and the name
 * (or address) the certificate must carry, then the handshake, within the
 * socket's timeouts. */
static int handshake(redisContext *ctx, const struct redis_tls *t, const char *host)
{
    struct redis_link *l = calloc(1, sizeof *l);
    BIO *bio = NULL;
    if (!l || !(l->ssl = SSL_new(t->ctx)) || !(bio = BIO_new(bio_method))) {
        if (l)
            SSL_free(l->ssl);
        free(l);
        set_error(ctx, REDIS_ERR_OOM, "Out of memory");
        return REDIS_ERR;
    }
    l->fd = ctx->fd;
    l->fresh = 1;
    BIO_set_data(bio, l);
    BIO_set_init(bio, 1);
    SSL_set_bio(l->ssl, bio, bio);
    SSL_set_ex_data(l->ssl, link_index, l);
    ctx->reader->privdata = l;
    if (is_ip(host)) {
        if (t->verify)
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(l->ssl), host);
    } else {
        SSL_set_tlsext_host_name(l->ssl, host);
        if (t->verify)
            SSL_set1_host(l->ssl, host);
    }
    ERR_clear_error();
    l->timed_out = 0;
    int r = SSL_connect(l->ssl);
    return r == 1 ? REDIS_OK : tls_failed(ctx, l, r, "TLS handshake");
}

redisContext *dlock_redis_io_connect(const struct redis_tls *tls, const char *host, int port,
                                     uint64_t budget_ns, uint64_t reply_ns)
{
    struct timeval tv;
    uint64_t until = dlock_monotonic_ns() + budget_ns;
    tv.tv_sec = (time_t)(budget_ns / 1000000000u);
    tv.tv_usec = (suseconds_t)(budget_ns % 1000000000u / 1000u);
    redisContext *ctx = redisConnectWithTimeout(host, port, tv);
    if (!ctx || ctx->err)
        return ctx;
    keepalive(ctx);
    if (tls) {
        /* The handshake waits for each message of the server as for a
         * reply (reply_ns), within what the connect left of the budget. */
        uint64_t now = dlock_monotonic_ns(), left = until > now + MS ? until - now : MS;
        if (left > reply_ns)
            left = reply_ns;
        tv.tv_sec = (time_t)(left / 1000000000u);
        tv.tv_usec = (suseconds_t)(left % 1000000000u / 1000u);
        redisSetTimeout(ctx, tv);
        handshake(ctx, tls, host);
    }
    return ctx;
}

void dlock_redis_io_free(redisContext *ctx)
{
    struct redis_link *l = link_of(ctx);
    if (l) {
        /* No close_notify: the peer sees the socket close, as on a plain
         * connection, and a dead peer cannot hold the close up. */
        SSL_free(l->ssl);
        free(l);
        ctx->reader->privdata = NULL;
    }
    redisFree(ctx);
}

/* ---- bytes --------------------------------------------------------------- */

size_t dlock_redis_io_buffered(const redisContext *ctx)
{
    return obuf_len(ctx->obuf);
}

int dlock_redis_io_write(redisContext *ctx)
{
    struct redis_link *l = link_of(ctx);
    size_t len = obuf_len(ctx->obuf), off = 0;
    while (off < len) {
        ssize_t n;
        if (l) {
            size_t chunk = len - off > INT32_MAX ? INT32_MAX : len - off;
            ERR_clear_error();
            l->timed_out = 0;
            int r = SSL_write(l->ssl, ctx->obuf + off, (int)chunk);
            if (r <= 0)
                return tls_failed(ctx, l, r, "");
            n = r;
        } else {
            n = send(ctx->fd, ctx->obuf + off, len - off, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                set_error(ctx, REDIS_ERR_IO, "%s", strerror(errno));
                return REDIS_ERR;
            }
        }
        off += (size_t)n;
    }
    obuf_clear(ctx->obuf);
    return REDIS_OK;
}

int dlock_redis_io_read(redisContext *ctx)
{
    struct redis_link *l = link_of(ctx);
    char buf[16 * 1024];
    for (;;) {
        ssize_t n;
        if (l) {
            ERR_clear_error();
            l->timed_out = 0;
            int r = SSL_read(l->ssl, buf, sizeof buf);
            if (r <= 0) {
                int e = SSL_get_error(l->ssl, r);
                if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && !l->timed_out)
                    return REDIS_OK; /* a record without data */
                return tls_failed(ctx, l, r, "");
            }
            l->no_cert_asked = l->fresh = 0; /* the server took us */
            n = r;
        } else {
            n = recv(ctx->fd, buf, sizeof buf, 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                set_error(ctx, REDIS_ERR_IO, "%s", strerror(errno));
                return REDIS_ERR;
            }
            if (n == 0) {
                set_error(ctx, REDIS_ERR_EOF, "Server closed the connection");
                return REDIS_ERR;
            }
        }
        if (redisReaderFeed(ctx->reader, buf, (size_t)n) != REDIS_OK) {
            set_error(ctx, ctx->reader->err, "%s", ctx->reader->errstr);
            return REDIS_ERR;
        }
        /* What the session decrypted and still holds goes to the reader
         * now: a poll above sees only what the socket holds. */
        if (!l || SSL_pending(l->ssl) == 0)
            return REDIS_OK;
    }
}

int dlock_redis_io_get_reply(redisContext *ctx, void **reply)
{
    void *r = NULL;
    if (redisGetReplyFromReader(ctx, &r) != REDIS_OK)
        return REDIS_ERR;
    if (!r && obuf_len(ctx->obuf) > 0 && dlock_redis_io_write(ctx) != REDIS_OK)
        return REDIS_ERR;
    while (!r) {
        if (dlock_redis_io_read(ctx) != REDIS_OK || redisGetReplyFromReader(ctx, &r) != REDIS_OK)
            return REDIS_ERR;
    }
    if (reply)
        *reply = r;
    else
        freeReplyObject(r);
    return REDIS_OK;
}
