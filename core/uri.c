/*
 * URI parsing: scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&...]
 *
 * Parsed once, strictly, into a dlock_uri that backends read through
 * getters. Error messages name the part that is wrong and never quote the
 * password (nor the raw URI, which may contain it).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "core/internal.h"
#include "core/uri.h"

#define URI_HOSTS_MAX 64
#define URI_PARAMS_MAX 64

struct uri_host {
    char *name;
    unsigned int port;
};

struct uri_param {
    char *key;
    char *value;
};

struct dlock_uri {
    char *scheme;
    char *user;
    char *password;
    char *path;
    char *redacted;
    size_t nhosts, nparams;
    struct uri_host hosts[URI_HOSTS_MAX];
    struct uri_param params[URI_PARAMS_MAX];
};

static int fail(char *err, size_t errlen, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return DLOCK_EBADURI;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * Percent-decodes [s, s+len) into a new string. Returns NULL with *bad set
 * on a malformed escape or an encoded NUL, NULL with *bad clear on ENOMEM.
 */
static char *decode(const char *s, size_t len, int *bad)
{
    char *out = malloc(len + 1), *o = out;
    *bad = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '%') {
            *o++ = s[i];
            continue;
        }
        if (len - i < 3 || hexval(s[i + 1]) < 0 || hexval(s[i + 2]) < 0) {
            *bad = 1;
            free(out);
            return NULL;
        }
        char c = (char)(hexval(s[i + 1]) << 4 | hexval(s[i + 2]));
        if (c == '\0') {
            *bad = 1;
            free(out);
            return NULL;
        }
        *o++ = c;
        i += 2;
    }
    *o = '\0';
    return out;
}

/* Decodes a component into *dst, reporting errors under the part's name. */
static int decode_part(const char *s, size_t len, char **dst, const char *what,
                       char *err, size_t errlen)
{
    int bad;
    *dst = decode(s, len, &bad);
    if (*dst)
        return 0;
    if (bad)
        return fail(err, errlen, "bad percent-encoding (or encoded NUL) in the %s", what);
    return DLOCK_ENOMEM;
}

static int is_scheme_char(int c, int first)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return 1;
    return !first && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.');
}

static int is_regname_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
}

static int parse_port(const char *s, size_t len, unsigned int *port, size_t hostno,
                      char *err, size_t errlen)
{
    unsigned long v = 0;
    if (len == 0)
        return fail(err, errlen, "empty port after ':' in host %zu", hostno + 1);
    if (len > 5)
        return fail(err, errlen, "port of host %zu is out of range (1-65535)", hostno + 1);
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return fail(err, errlen, "port of host %zu is not a number", hostno + 1);
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v == 0 || v > 65535)
        return fail(err, errlen, "port of host %zu is out of range (1-65535)", hostno + 1);
    *port = (unsigned int)v;
    return 0;
}

static int parse_host(dlock_uri *u, const char *s, size_t len, char *err, size_t errlen)
{
    size_t n = u->nhosts, hlen;
    const char *h = s, *rest;
    if (n == URI_HOSTS_MAX)
        return fail(err, errlen, "more than %d hosts", URI_HOSTS_MAX);
    if (len == 0)
        return fail(err, errlen, "empty host %zu in the host list", n + 1);
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        char buf[INET6_ADDRSTRLEN + 1];
        unsigned char addr[16];
        if (!close)
            return fail(err, errlen, "host %zu: '[' without a closing ']'", n + 1);
        h = s + 1;
        hlen = (size_t)(close - h);
        rest = close + 1;
        if (hlen == 0 || hlen >= sizeof buf)
            return fail(err, errlen, "host %zu: malformed IPv6 address", n + 1);
        memcpy(buf, h, hlen);
        buf[hlen] = '\0';
        if (inet_pton(AF_INET6, buf, addr) != 1)
            return fail(err, errlen, "host %zu: malformed IPv6 address", n + 1);
    } else {
        const char *colon = memchr(s, ':', len);
        hlen = colon ? (size_t)(colon - s) : len;
        rest = s + hlen;
        if (hlen == 0)
            return fail(err, errlen, "empty host %zu in the host list", n + 1);
        for (size_t i = 0; i < hlen; i++)
            if (!is_regname_char((unsigned char)s[i]))
                return fail(err, errlen, "host %zu contains a character not allowed in a host name", n + 1);
    }
    size_t rlen = len - (size_t)(rest - s);
    if (rlen > 0) {
        if (rest[0] != ':')
            return fail(err, errlen, "host %zu: unexpected text after the address", n + 1);
        int rc = parse_port(rest + 1, rlen - 1, &u->hosts[n].port, n, err, errlen);
        if (rc)
            return rc;
    }
    u->hosts[n].name = strndup(h, hlen);
    if (!u->hosts[n].name)
        return DLOCK_ENOMEM;
    u->nhosts++;
    return 0;
}

static int parse_hosts(dlock_uri *u, const char *s, size_t len, char *err, size_t errlen)
{
    const char *end = s + len;
    if (len == 0)
        return 0;
    while (s <= end) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *stop = comma ? comma : end;
        int rc = parse_host(u, s, (size_t)(stop - s), err, errlen);
        if (rc)
            return rc;
        if (!comma)
            break;
        s = comma + 1;
    }
    return 0;
}

static int parse_userinfo(dlock_uri *u, const char *s, size_t len, char *err, size_t errlen)
{
    const char *colon = memchr(s, ':', len);
    size_t ulen = colon ? (size_t)(colon - s) : len;
    int rc = decode_part(s, ulen, &u->user, "user name", err, errlen);
    if (rc == 0 && colon)
        rc = decode_part(colon + 1, len - ulen - 1, &u->password, "password", err, errlen);
    return rc;
}

static int parse_query(dlock_uri *u, const char *s, size_t len, char *err, size_t errlen)
{
    const char *end = s + len;
    while (s < end) {
        const char *amp = memchr(s, '&', (size_t)(end - s));
        const char *stop = amp ? amp : end;
        const char *eq = memchr(s, '=', (size_t)(stop - s));
        const char *kend = eq ? eq : stop;
        struct uri_param *p;
        int rc;
        if (kend == s)
            return fail(err, errlen, "empty option name in the query");
        if (u->nparams == URI_PARAMS_MAX)
            return fail(err, errlen, "more than %d options", URI_PARAMS_MAX);
        p = &u->params[u->nparams];
        rc = decode_part(s, (size_t)(kend - s), &p->key, "option names", err, errlen);
        if (rc)
            return rc;
        if (eq)
            rc = decode_part(eq + 1, (size_t)(stop - eq - 1), &p->value, "option values", err, errlen);
        else
            rc = (p->value = strdup("")) ? 0 : DLOCK_ENOMEM;
        if (rc) {
            free(p->key);
            return rc;
        }
        u->nparams++;
        s = amp ? amp + 1 : end;
    }
    return 0;
}

/* Whether a (decoded) query key names a secret: "password", or any key
 * ending in "_password" (redis+sentinel's sentinel_password). */
static int secret_key(const char *k)
{
    static const char suffix[] = "password";
    size_t n = strlen(k), sl = sizeof suffix - 1;
    return n >= sl && memcmp(k + n - sl, suffix, sl) == 0 && (n == sl || k[n - sl - 1] == '_');
}

/* The raw URI with the password bytes, and the value of every query
 * parameter whose name (decoded) names a secret, replaced by "***".
 * query: the '?' that starts the query in s, or NULL; the parameters are
 * already parsed, one per '&'-separated part, in order. */
static int make_redacted(dlock_uri *u, const char *s, const char *pw, size_t pwlen,
                         const char *query)
{
    size_t len = strlen(s), o = 0, upto = query ? (size_t)(query - s) : len;
    /* Never longer than the URI plus "***" for the password and for each
     * parameter (each at least "&k", 2 bytes). */
    char *r = u->redacted = malloc(len + 3 + 2 * len + 1);
    if (!r)
        return DLOCK_ENOMEM;
    for (size_t i = 0; i < upto;) {
        if (pw && s + i == pw) { /* once: an empty password is "***" too */
            memcpy(r + o, "***", 3), o += 3;
            i += pwlen;
            pw = NULL;
            continue;
        }
        r[o++] = s[i++];
    }
    for (size_t i = upto, k = 0; i < len; k++) {
        /* One "?k=v" or "&k=v", parameter k. */
        size_t start = i + 1, end = start;
        r[o++] = s[i];
        while (end < len && s[end] != '&')
            end++;
        const char *eq = memchr(s + start, '=', end - start);
        if (eq && k < u->nparams && secret_key(u->params[k].key)) {
            size_t kl = (size_t)(eq - (s + start)) + 1;
            memcpy(r + o, s + start, kl), o += kl;
            memcpy(r + o, "***", 3), o += 3;
        } else {
            memcpy(r + o, s + start, end - start), o += end - start;
        }
        i = end;
    }
    r[o] = '\0';
    return 0;
}

static int parse(dlock_uri *u, const char *s, char *err, size_t errlen)
{
    size_t len = strnlen(s, DLOCK_URI_MAX + 1), i;
    const char *auth, *auth_end, *at = NULL, *path, *query;
    const char *pw = NULL;
    size_t pwlen = 0;
    int rc;

    if (len == 0)
        return fail(err, errlen, "empty URI");
    if (len > DLOCK_URI_MAX)
        return fail(err, errlen, "URI longer than %d bytes", DLOCK_URI_MAX);
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f)
            return fail(err, errlen, "URI contains a space or control character at byte %zu", i + 1);
    }
    for (i = 0; i < len && s[i] != ':'; i++)
        if (!is_scheme_char((unsigned char)s[i], i == 0))
            break;
    if (i == 0 || i == len || s[i] != ':')
        return fail(err, errlen, "URI has no scheme (expected scheme://...)");
    if (strncmp(s + i, "://", 3) != 0)
        return fail(err, errlen, "'%.*s:' must be followed by '//'", (int)(i > 32 ? 32 : i), s);
    if (!(u->scheme = strndup(s, i)))
        return DLOCK_ENOMEM;
    for (char *p = u->scheme; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');

    auth = s + i + 3;
    auth_end = auth + strcspn(auth, "/?#");
    if (*auth_end == '#' || strchr(auth, '#'))
        return fail(err, errlen, "fragments ('#') are not allowed in a URI");
    /* The last '@' ends the userinfo, so an unencoded '@' in a password
     * still parses. */
    for (const char *p = auth; p < auth_end; p++)
        if (*p == '@')
            at = p;
    if (at) {
        const char *colon = memchr(auth, ':', (size_t)(at - auth));
        if (colon) {
            pw = colon + 1;
            pwlen = (size_t)(at - pw);
        }
        rc = parse_userinfo(u, auth, (size_t)(at - auth), err, errlen);
        if (rc)
            return rc;
        if (u->user[0] == '\0' && !u->password)
            return fail(err, errlen, "empty user name before '@'");
    }
    rc = parse_hosts(u, at ? at + 1 : auth, (size_t)(auth_end - (at ? at + 1 : auth)), err, errlen);
    if (rc)
        return rc;

    path = auth_end;
    query = strchr(path, '?');
    rc = decode_part(path, query ? (size_t)(query - path) : strlen(path), &u->path, "path", err, errlen);
    if (rc)
        return rc;
    if (query) {
        rc = parse_query(u, query + 1, strlen(query + 1), err, errlen);
        if (rc)
            return rc;
    }
    return make_redacted(u, s, pw, pwlen, query);
}

int dlock_uri_parse(const char *s, dlock_uri **urip, char *err, size_t errlen)
{
    dlock_uri *u;
    int rc;
    *urip = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (!s)
        return fail(err, errlen, "no URI given");
    u = calloc(1, sizeof *u);
    if (!u)
        return DLOCK_ENOMEM;
    rc = parse(u, s, err, errlen);
    if (rc) {
        if (rc == DLOCK_ENOMEM && err && errlen)
            snprintf(err, errlen, "out of memory parsing the URI");
        dlock_uri_free(u);
        return rc;
    }
    *urip = u;
    return 0;
}

void dlock_uri_free(dlock_uri *u)
{
    if (!u)
        return;
    for (size_t i = 0; i < u->nhosts; i++)
        free(u->hosts[i].name);
    for (size_t i = 0; i < u->nparams; i++) {
        free(u->params[i].key);
        free(u->params[i].value);
    }
    if (u->password) /* don't leave the secret lying in freed memory */
        explicit_bzero(u->password, strlen(u->password));
    free(u->scheme);
    free(u->user);
    free(u->password);
    free(u->path);
    free(u->redacted);
    free(u);
}

const char *dlock_uri_scheme(const dlock_uri *u) { return u->scheme; }
const char *dlock_uri_user(const dlock_uri *u) { return u->user; }
const char *dlock_uri_password(const dlock_uri *u) { return u->password; }
size_t dlock_uri_host_count(const dlock_uri *u) { return u->nhosts; }
const char *dlock_uri_path(const dlock_uri *u) { return u->path; }
size_t dlock_uri_param_count(const dlock_uri *u) { return u->nparams; }
const char *dlock_uri_redacted(const dlock_uri *u) { return u->redacted; }

const char *dlock_uri_host(const dlock_uri *u, size_t i)
{
    return i < u->nhosts ? u->hosts[i].name : NULL;
}

unsigned int dlock_uri_port(const dlock_uri *u, size_t i)
{
    return i < u->nhosts ? u->hosts[i].port : 0;
}

const char *dlock_uri_param_key(const dlock_uri *u, size_t i)
{
    return i < u->nparams ? u->params[i].key : NULL;
}

const char *dlock_uri_param_value(const dlock_uri *u, size_t i)
{
    return i < u->nparams ? u->params[i].value : NULL;
}

const char *dlock_uri_param(const dlock_uri *u, const char *key)
{
    for (size_t i = u->nparams; i-- > 0;)
        if (strcmp(u->params[i].key, key) == 0)
            return u->params[i].value;
    return NULL;
}

int dlock_uri_param_uint(dlock_client *client, const dlock_uri *u, const char *key,
                         uint64_t min, uint64_t max, uint64_t *out)
{
    const char *v = dlock_uri_param(u, key);
    char *end;
    unsigned long long n;
    if (!v)
        return 0;
    errno = 0;
    n = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end || errno == ERANGE || n < min || n > max)
        return dlock_seterr(client, DLOCK_EBADURI,
                            "option '%s' must be a whole number from %llu to %llu",
                            key, (unsigned long long)min, (unsigned long long)max);
    *out = n;
    return 0;
}

int dlock_uri_param_bool(dlock_client *client, const dlock_uri *u, const char *key, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    const char *v = dlock_uri_param(u, key);
    if (!v)
        return 0;
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return *out = 1, 0;
        if (strcasecmp(v, no[i]) == 0)
            return *out = 0, 0;
    }
    return dlock_seterr(client, DLOCK_EBADURI,
                        "option '%s' must be true or false (1/0, yes/no, on/off)", key);
}

int dlock_uri_param_choice(dlock_client *client, const dlock_uri *u, const char *key,
                           const char *const *choices, int *out)
{
    const char *v = dlock_uri_param(u, key);
    char list[256] = "";
    size_t n = 0, used = 0;
    if (!v)
        return 0;
    for (; choices[n]; n++)
        if (strcmp(v, choices[n]) == 0)
            return *out = (int)n, 0;
    for (size_t i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                 i == 0 ? "" : i + 1 == n ? " or " : ", ", choices[i]);
    return dlock_seterr(client, DLOCK_EBADURI, "option %s: %s (not '%.64s')", key, list, v);
}
