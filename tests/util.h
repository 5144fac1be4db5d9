/* Small helpers shared by the test programs. */
#ifndef DLOCK_TESTS_UTIL_H
#define DLOCK_TESTS_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock.h"

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* A loopback socket bound to a port the kernel picks, not listening: its
 * port, with the socket in *fd. */
static inline int bound_port(int *fd)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bind(*fd, (struct sockaddr *)&a, sizeof a);
    getsockname(*fd, (struct sockaddr *)&a, &alen);
    return ntohs(a.sin_port);
}

/* A loopback port free at this instant, for a server the test starts on
 * it (bound, then closed). */
static inline int free_port(void)
{
    int s, port = bound_port(&s);
    close(s);
    return port;
}

/* A loopback port with nothing listening: a socket bound to it and never
 * listening (a connect is refused), kept open for the rest of the process
 * so that no one else can take the port meanwhile. A port closed again at
 * once was seen taken by a proxy of a case running beside, which forwarded
 * the "closed" connection to a live store. */
static inline int closed_port(void)
{
    int s;
    return bound_port(&s); /* s stays open, on purpose */
}

/* Options waiting as told, up to wait_ms from now, with a lease of ttl_ms
 * (0: the default). */
static inline dlock_acquire_opts wait_opts(dlock_wait wait, uint64_t wait_ms, uint32_t ttl_ms)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = wait;
    o.deadline_ns = dlock_monotonic_ns() + wait_ms * 1000000u;
    if (ttl_ms)
        o.ttl_ms = ttl_ms;
    return o;
}

/* The value of an environment variable the test cannot run without: a
 * missing one ends the run as a failure (TAP "Bail out!"), never a skip. */
static inline const char *need_env(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        printf("Bail out! %s is not set: start the stores with scripts/stores/start.sh\n", name);
        exit(1);
    }
    return v;
}

/* uri with its password masked, for test output (credentials are never
 * printed, not even the test stores'). */
/* uri (or a list of URIs separated by whitespace) with passwords masked. */
static inline const char *shown_uri(const char *uri, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (const char *p = uri; *p && o < len;) {
        size_t n = strcspn(p, " \t\r\n\v\f");
        if (n) {
            char one[2048], err[256];
            dlock_uri *u = NULL;
            snprintf(one, sizeof one, "%.*s", (int)n, p);
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? " " : "",
                                  dlock_uri_parse(one, &u, err, sizeof err) == 0
                                      ? dlock_uri_redacted(u)
                                      : "(malformed URI)");
            dlock_uri_free(u);
            p += n;
        } else {
            p++;
        }
    }
    return buf;
}

/* Appends s to out at *o, percent-encoding every byte that is not
 * unreserved (nor in keep); -1 when it does not fit. */
static inline int uri_put_(char *out, size_t len, size_t *o, const char *s, const char *keep)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    strchr("-._~", c) || (keep && strchr(keep, c));
        if (*o + (plain ? 1 : 3) >= len)
            return -1;
        if (plain) {
            out[(*o)++] = (char)c;
        } else {
            out[(*o)++] = '%';
            out[(*o)++] = hex[c >> 4];
            out[(*o)++] = hex[c & 15];
        }
    }
    out[*o] = '\0';
    return 0;
}

/* Appends raw text; -1 when it does not fit. */
static inline int uri_raw_(char *out, size_t len, size_t *o, const char *s)
{
    size_t n = strlen(s);
    if (*o + n >= len)
        return -1;
    memcpy(out + *o, s, n + 1);
    *o += n;
    return 0;
}

/* Is key one of the "k=v&k2=v2" params? */
static inline int uri_has_param_(const char *params, const char *key)
{
    size_t kl = strlen(key);
    for (const char *s = params; s && *s;) {
        if (strncmp(s, key, kl) == 0 && s[kl] == '=')
            return 1;
        s = strchr(s, '&');
        s = s ? s + 1 : NULL;
    }
    return 0;
}

/*
 * Rebuilds the store URI src (parsed with dlock_uri_parse) into out, with
 * every host i replaced by 127.0.0.1:ports[i] when ports is given (nports
 * must then equal the host count), the password replaced when password is
 * given, and params ("k=v&k2=v2", plain text, NULL for none) added, each
 * replacing the URI's own parameter of that name. User, password, path and
 * parameters are percent-encoded again. Returns 0, or -1 when src does not
 * parse, has no hosts (file://) while ports are given, or out is too small.
 */
static inline int uri_rewrite(const char *src, const int *ports, int nports, const char *password,
                              const char *params, char *out, size_t len)
{
    dlock_uri *u = NULL;
    char err[256], num[16];
    size_t o = 0, nhosts;
    int bad = 0;
    if (len == 0 || dlock_uri_parse(src, &u, err, sizeof err) != 0)
        return -1;
    nhosts = dlock_uri_host_count(u);
    if (ports && (nhosts == 0 || (size_t)nports != nhosts)) {
        dlock_uri_free(u);
        return -1;
    }
    const char *user = dlock_uri_user(u), *pw = password ? password : dlock_uri_password(u);
    bad |= uri_raw_(out, len, &o, dlock_uri_scheme(u));
    bad |= uri_raw_(out, len, &o, "://");
    if (user || pw) {
        bad |= uri_put_(out, len, &o, user ? user : "", NULL);
        if (pw) {
            bad |= uri_raw_(out, len, &o, ":");
            bad |= uri_put_(out, len, &o, pw, NULL);
        }
        bad |= uri_raw_(out, len, &o, "@");
    }
    for (size_t i = 0; i < nhosts; i++) {
        const char *h = ports ? "127.0.0.1" : dlock_uri_host(u, i);
        unsigned port = ports ? (unsigned)ports[i] : dlock_uri_port(u, i);
        int v6 = strchr(h, ':') != NULL;
        if (i)
            bad |= uri_raw_(out, len, &o, ",");
        bad |= uri_raw_(out, len, &o, v6 ? "[" : "");
        bad |= uri_raw_(out, len, &o, h);
        bad |= uri_raw_(out, len, &o, v6 ? "]" : "");
        if (port) {
            snprintf(num, sizeof num, ":%u", port);
            bad |= uri_raw_(out, len, &o, num);
        }
    }
    bad |= uri_put_(out, len, &o, dlock_uri_path(u), "/");
    char sep = '?';
    for (size_t i = 0; i < dlock_uri_param_count(u); i++) {
        if (uri_has_param_(params, dlock_uri_param_key(u, i)))
            continue;
        bad |= uri_raw_(out, len, &o, sep == '?' ? "?" : "&");
        sep = '&';
        bad |= uri_put_(out, len, &o, dlock_uri_param_key(u, i), NULL);
        bad |= uri_raw_(out, len, &o, "=");
        bad |= uri_put_(out, len, &o, dlock_uri_param_value(u, i), NULL);
    }
    if (params && *params) {
        bad |= uri_raw_(out, len, &o, sep == '?' ? "?" : "&");
        bad |= uri_raw_(out, len, &o, params);
    }
    dlock_uri_free(u);
    return bad ? -1 : 0;
}

/*
 * src (one URI or a list) with every store moved to a namespace of its own
 * called ns ([a-z0-9_], no other client's locks, counters or floors there):
 * a subdirectory (file://) or child node (zookeeper://) named ns, the key
 * prefix "ns:" (redis://), the table ns (postgresql://, mysql://). For
 * cases that change store-wide state, which other suites sharing the store
 * must not see. Returns 0, or -1 when a URI does not parse or out is too
 * small.
 */
static inline int uri_namespace(const char *src, const char *ns, char *out, size_t len)
{
    char word[2048], one[2048], params[160];
    size_t o = 0;
    for (const char *p = src; *p;) {
        p += strspn(p, " \t\n");
        size_t w = strcspn(p, " \t\n");
        if (!w)
            break;
        if (w >= sizeof word)
            return -1;
        memcpy(word, p, w);
        word[w] = '\0';
        p += w;
        const char *q = strchr(word, '?');
        size_t base = q ? (size_t)(q - word) : w;
        if (strncmp(word, "file:", 5) == 0 || strncmp(word, "zookeeper:", 10) == 0 ||
            strncmp(word, "etcd:", 5) == 0) {
            while (base > 0 && word[base - 1] == '/')
                base--;
            if (snprintf(one, sizeof one, "%.*s/%s%s", (int)base, word, ns, q ? q : "") >=
                (int)sizeof one)
                return -1;
        } else {
            snprintf(params, sizeof params,
                     strncmp(word, "redis", 5) == 0 ? "prefix=%s:" : "table=%s", ns);
            if (uri_rewrite(word, NULL, 0, NULL, params, one, sizeof one) != 0)
                return -1;
        }
        int n = snprintf(out + o, len - o, "%s%s", o ? " " : "", one);
        if (n < 0 || (size_t)n >= len - o)
            return -1;
        o += (size_t)n;
    }
    return o ? 0 : -1;
}

/* The token of one grant of name on c (waiting up to 10 s), released at
 * once; 0 when it was not granted (the reason on stderr, as a TAP note). */
static inline uint64_t grant_token(dlock_client *c, const char *name)
{
    dlock_lock *l = NULL;
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_DEADLINE;
    o.deadline_ns = dlock_monotonic_ns() + 10000000000ull;
    if (dlock_acquire(c, name, &o, &l) != 0) {
        fprintf(stderr, "# acquire %s: %s\n", name, dlock_errmsg(c));
        return 0;
    }
    uint64_t t = dlock_lock_token(l);
    dlock_release(l);
    return t;
}

/* A client for uri, or the end of the run. */
static inline dlock_client *open_ok(const char *uri)
{
    dlock_client *c = NULL;
    char shown[1024];
    if (dlock_client_open(uri, &c) != 0) {
        printf("Bail out! cannot open %s: %s\n", shown_uri(uri, shown, sizeof shown),
               dlock_errmsg(c));
        exit(1);
    }
    return c;
}

#endif
