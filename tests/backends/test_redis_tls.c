/*
 * rediss:// refusals (issue 31): each asserts its error code, a clear
 * message and the connect bound. An unknown CA, no CA given (the system
 * store does not know the test CA), a server certificate for another host
 * name or address, an expired one (served by a TLS listener of this test,
 * with the stores' certificates), a plain client against a TLS port and a
 * TLS client against a plain one, a wrong password, an ACL user missing a
 * right, a server that wants a client certificate and gets none, files
 * that cannot be used (a key under a passphrase: none is asked for),
 * options on a redis:// URI, a silent TLS peer. And
 * what must work: the stores' own URIs, tls_verify=none, a client
 * certificate.
 *
 * Environment (scripts/stores/start.sh prints it): DLOCK_REDIS_TLS_URI,
 * DLOCK_REDLOCK_TLS_URI, DLOCK_REDIS_URI (a plain port), DLOCK_TLS_DIR.
 * DLOCK_TEST_CONTROL_NOVERIFY=1 (the negative control) adds tls_verify=none
 * to the URIs of the certificate cases, as a client that skips the check
 * would: those cases must then fail.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock_backend.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull
/* What a refusal may take past its connect_timeout (a loaded CI host). */
#define SLACK_MS 1500

static const char *tls_dir, *good_uri, *redlock_uri, *plain_uri;
static char user[128], password[128];
static int tls_port, noverify;

/* ---- a TLS listener of the test's own ------------------------------------ */

struct tls_srv {
    int fd, port, stop, silent;
    SSL_CTX *ctx;
    pthread_t th;
};

/* Accepts until stopped: a handshake with its certificate (silent: none,
 * the connection is kept and never answered), then closes. */
static void *srv_main(void *arg)
{
    struct tls_srv *s = arg;
    int kept[16], nkept = 0;
    while (!s->stop) {
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(s->fd, NULL, NULL);
        if (c < 0)
            continue;
        if (s->silent) {
            if (nkept < 16)
                kept[nkept++] = c;
            else
                close(c);
            continue;
        }
        struct timeval tv = {2, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        SSL *ssl = SSL_new(s->ctx);
        if (ssl) {
            SSL_set_fd(ssl, c);
            SSL_accept(ssl); /* the client refuses our certificate */
            SSL_free(ssl);
        }
        close(c);
    }
    for (int i = 0; i < nkept; i++)
        close(kept[i]);
    return NULL;
}

/* A listener on 127.0.0.1 serving cert/key of tls_dir (NULL: silent). */
static int srv_start(struct tls_srv *s, const char *cert)
{
    char crt[1024], key[1024];
    memset(s, 0, sizeof *s);
    s->silent = cert == NULL;
    if (cert) {
        snprintf(crt, sizeof crt, "%s/%s.crt", tls_dir, cert);
        snprintf(key, sizeof key, "%s/%s.key", tls_dir, cert);
        s->ctx = SSL_CTX_new(TLS_server_method());
        if (!s->ctx || SSL_CTX_use_certificate_chain_file(s->ctx, crt) != 1 ||
            SSL_CTX_use_PrivateKey_file(s->ctx, key, SSL_FILETYPE_PEM) != 1) {
            printf("Bail out! cannot use %s (and its key)\n", crt);
            exit(1);
        }
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (bind(s->fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(s->fd, 16) != 0 ||
        getsockname(s->fd, (struct sockaddr *)&a, &alen) != 0) {
        printf("Bail out! cannot listen on loopback: %s\n", strerror(errno));
        exit(1);
    }
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->th, NULL, srv_main, s) == 0 ? 0 : -1;
}

static void srv_stop(struct tls_srv *s)
{
    s->stop = 1;
    pthread_join(s->th, NULL);
    close(s->fd);
    SSL_CTX_free(s->ctx);
}

/* ---- cases --------------------------------------------------------------- */

/* Opens uri and takes a lock: 0, or the error (message in msg). */
static int try_open(const char *uri, char *msg, size_t len, double *ms)
{
    dlock_client *c = NULL;
    uint64_t t0 = dlock_monotonic_ns();
    int err = dlock_client_open(uri, &c);
    if (err == 0) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 3000, 0);
        err = dlock_acquire(c, "tls-case", &o, &l);
        if (err == 0 && dlock_lock_token(l) == 0)
            err = DLOCK_EPROTO;
        if (l)
            dlock_release(l);
    }
    *ms = (double)(dlock_monotonic_ns() - t0) / 1e6;
    snprintf(msg, len, "%s", err ? dlock_errmsg(c) : "");
    dlock_client_close(c);
    return err;
}

/* uri must fail with want, within bound_ms + SLACK_MS, its message
 * containing each of the words (NULL-terminated). */
static void refused(const char *what, const char *uri, int want, unsigned bound_ms,
                    const char *const *words)
{
    char msg[1024];
    double ms;
    int err = try_open(uri, msg, sizeof msg, &ms);
    is_int(err, want, "%s: %s", what, err ? dlock_strerror(err) : "opened");
    int all = err != 0;
    for (size_t i = 0; all && words && words[i]; i++)
        all = strstr(msg, words[i]) != NULL;
    ok(all, "%s: the message says why: %s", what, msg[0] ? msg : "(none)");
    ok(ms <= bound_ms + SLACK_MS, "%s: within %u ms (+%u): %.0f ms", what, bound_ms, SLACK_MS,
       ms);
}

static void works(const char *what, const char *uri)
{
    char msg[1024];
    double ms;
    int err = try_open(uri, msg, sizeof msg, &ms);
    is_int(err, 0, "%s: a lock taken and released (%s)", what, err ? msg : "ok");
}

/* rediss://[user:password@]host:port?opts (a certificate case under the
 * control gets tls_verify=none). */
static void tls_uri(char *out, size_t len, const char *host, int port, const char *opts,
                    int cert_case)
{
    snprintf(out, len, "rediss://%s%s%s%s%s:%d/0?%s%s", user, password[0] ? ":" : "", password,
             user[0] || password[0] ? "@" : "", host, port, opts,
             cert_case && noverify ? "&tls_verify=none" : "");
}

int main(void)
{
    char uri[4096], ca[1024], other[1024], opt[3072];
    dlock_uri *u = NULL;
    char perr[256];

    setvbuf(stdout, NULL, _IOLBF, 0);
    good_uri = need_env("DLOCK_REDIS_TLS_URI");
    redlock_uri = need_env("DLOCK_REDLOCK_TLS_URI");
    plain_uri = need_env("DLOCK_REDIS_URI");
    tls_dir = need_env("DLOCK_TLS_DIR");
    const char *c = getenv("DLOCK_TEST_CONTROL_NOVERIFY");
    noverify = c && strcmp(c, "1") == 0;
    if (dlock_uri_parse(good_uri, &u, perr, sizeof perr) != 0) {
        printf("Bail out! DLOCK_REDIS_TLS_URI: %s\n", perr);
        return 1;
    }
    snprintf(user, sizeof user, "%s", dlock_uri_user(u) ? dlock_uri_user(u) : "");
    snprintf(password, sizeof password, "%s", dlock_uri_password(u) ? dlock_uri_password(u) : "");
    tls_port = (int)dlock_uri_port(u, 0);
    dlock_uri_free(u);
    snprintf(ca, sizeof ca, "cacert=%s/ca.crt", tls_dir);
    snprintf(other, sizeof other, "cacert=%s/other-ca.crt", tls_dir);

    /* What must work. */
    works("the TLS store's URI (verification on, the ACL user)", good_uri);
    tls_uri(uri, sizeof uri, "127.0.0.1", tls_port, ca, 0);
    works("by address (the certificate's IP:127.0.0.1)", uri);
    tls_uri(uri, sizeof uri, "127.0.0.1", tls_port, "tls_verify=none", 0);
    works("tls_verify=none, no CA", uri);
    works("Redlock over TLS with a client certificate", redlock_uri);

    /* The server's certificate. */
    tls_uri(uri, sizeof uri, "localhost", tls_port, other, 1);
    refused("an unknown CA", uri, DLOCK_EAUTH, 2000,
            (const char *[]){"certificate", "not accepted", NULL});
    tls_uri(uri, sizeof uri, "localhost", tls_port, "connect_timeout=2000", 1);
    refused("no cacert: the system's CAs do not know the test CA", uri, DLOCK_EAUTH, 2000,
            (const char *[]){"certificate", NULL});
    struct tls_srv s;
    srv_start(&s, "wrong-host");
    tls_uri(uri, sizeof uri, "localhost", s.port, ca, 1);
    refused("a certificate for another host name", uri, DLOCK_EAUTH, 2000,
            (const char *[]){"hostname mismatch", NULL});
    tls_uri(uri, sizeof uri, "127.0.0.1", s.port, ca, 1);
    refused("a certificate without our address", uri, DLOCK_EAUTH, 2000,
            (const char *[]){"IP address mismatch", NULL});
    srv_stop(&s);
    srv_start(&s, "expired");
    tls_uri(uri, sizeof uri, "localhost", s.port, ca, 1);
    refused("an expired certificate", uri, DLOCK_EAUTH, 2000,
            (const char *[]){"expired", NULL});
    srv_stop(&s);

    /* The wrong protocol on a port. */
    snprintf(uri, sizeof uri, "redis://%s%s%s%s127.0.0.1:%d/0?connect_timeout=1000", user,
             password[0] ? ":" : "", password, user[0] || password[0] ? "@" : "", tls_port);
    refused("a plain client against a TLS port", uri, DLOCK_ECONNECT, 1000,
            (const char *[]){"rediss://", NULL});
    if (dlock_uri_parse(plain_uri, &u, perr, sizeof perr) == 0) {
        snprintf(uri, sizeof uri, "rediss://127.0.0.1:%u/0?connect_timeout=500&%s",
                 dlock_uri_port(u, 0), ca);
        refused("a TLS client against a plain port", uri, DLOCK_ECONNECT, 500,
                (const char *[]){"TLS", NULL});
        dlock_uri_free(u);
    }
    srv_start(&s, NULL);
    snprintf(uri, sizeof uri, "rediss://127.0.0.1:%d/0?connect_timeout=300&%s", s.port, ca);
    refused("a silent TLS peer", uri, DLOCK_ECONNECT, 300, (const char *[]){"TLS", NULL});
    srv_stop(&s);

    /* Credentials and rights. */
    snprintf(uri, sizeof uri, "rediss://%s:wrong-%s@localhost:%d/0?%s", user, password, tls_port,
             ca);
    refused("a wrong password", uri, DLOCK_EAUTH, 2000, (const char *[]){"WRONGPASS", NULL});
    snprintf(uri, sizeof uri, "rediss://dlock-noscript:%s@localhost:%d/0?%s", password, tls_port,
             ca);
    refused("an ACL user without the right to load scripts", uri, DLOCK_EAUTH, 2000,
            (const char *[]){"NOPERM", NULL});
    /* A right the script's own calls need (RPUSH: a waiter queues). */
    {
        char msg[1024];
        dlock_client *h = NULL, *w = NULL;
        dlock_lock *held = NULL, *got = NULL;
        snprintf(uri, sizeof uri, "rediss://dlock-noqueue:%s@localhost:%d/0?%s", password,
                 tls_port, ca);
        int err = dlock_client_open(good_uri, &h);
        if (err == 0) {
            dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 3000, 0);
            err = dlock_acquire(h, "tls-noqueue", &o, &held);
        }
        if (err == 0 && (err = dlock_client_open(uri, &w)) == 0) {
            dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 1000, 0);
            err = dlock_acquire(w, "tls-noqueue", &o, &got);
        }
        snprintf(msg, sizeof msg, "%s", err ? dlock_errmsg(w ? w : h) : "");
        is_int(err, DLOCK_EAUTH, "an ACL user the script's RPUSH is refused to: %s",
               err ? dlock_strerror(err) : "granted");
        ok(strstr(msg, "can't run") != NULL, "and the message says why: %s", msg);
        if (got)
            dlock_release(got);
        if (held)
            dlock_release(held);
        dlock_client_close(w);
        dlock_client_close(h);
    }
    /* redlock_uri without its client certificate. */
    snprintf(opt, sizeof opt, "%s", redlock_uri);
    char *q = strstr(opt, "&cert=");
    if (q)
        *q = '\0';
    refused("a server that wants a client certificate, given none", opt, DLOCK_EAUTH, 2000,
            (const char *[]){"client certificate", NULL});

    /* Files and options. */
    tls_uri(uri, sizeof uri, "localhost", tls_port, "cacert=/nonexistent/ca.crt", 0);
    refused("a cacert that is not there", uri, DLOCK_EBADURI, 100,
            (const char *[]){"cacert=/nonexistent/ca.crt", "No such file", NULL});
    snprintf(opt, sizeof opt, "%s&cert=%s/client.crt&key=%s/server.key", ca, tls_dir, tls_dir);
    tls_uri(uri, sizeof uri, "localhost", tls_port, opt, 0);
    refused("a key that is not the certificate's", uri, DLOCK_EBADURI, 100,
            (const char *[]){"key=", "mismatch", NULL});
    snprintf(opt, sizeof opt, "%s&cert=%s/client.crt&key=%s/client-encrypted.key", ca, tls_dir,
             tls_dir);
    tls_uri(uri, sizeof uri, "localhost", tls_port, opt, 0);
    refused("a key under a passphrase (none is asked for)", uri, DLOCK_EBADURI, 100,
            (const char *[]){"client-encrypted.key", NULL});
    snprintf(opt, sizeof opt, "%s&key=%s/client.key", ca, tls_dir);
    tls_uri(uri, sizeof uri, "localhost", tls_port, opt, 0);
    refused("key= without cert=", uri, DLOCK_EBADURI, 100, (const char *[]){"cert=", NULL});
    tls_uri(uri, sizeof uri, "localhost", tls_port, "tls_verify=maybe", 0);
    refused("tls_verify=maybe", uri, DLOCK_EBADURI, 100, (const char *[]){"tls_verify", NULL});
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d/0?%s", tls_port, ca);
    refused("cacert on a redis:// URI", uri, DLOCK_EBADURI, 100,
            (const char *[]){"rediss://", NULL});
    return done_testing();
}
