/*
 * URI parsing: scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&...]
 *
 * Parsed once, strictly, into a dlock_uri that backends read through
 * getters. Error messages name the part that is wrong and never quote the
 * password (nor the raw URI, which may contain it).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config.h"
#include "core/internal.h"
#include "core/uri.h"

#define URI_HOSTS_MAX 64
#define URI_PARAMS_MAX 64
/* The longest password a file may give (its first line). */
#define DLOCK_SECRET_MAX 4096

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

/* Whether the raw query key [k, k+n) names a secret once decoded. */
static int secret_raw_key(const char *k, size_t n)
{
    int bad, yes;
    char *d = decode(k, n, &bad);
    if (!d)
        return 0;
    yes = secret_key(d);
    free(d);
    return yes;
}

/*
 * One URI (s, len bytes) appended at r + *o with its secrets hidden as
 * dlock_uri_hide() says: never longer than len + 3 + 2 * len (one "***" for
 * the password, and one for each parameter, each at least "&k").
 */
static void hide_one(char *r, size_t *o, const char *s, size_t len, int mode)
{
    size_t i = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.");
    const char *auth = NULL, *at = NULL, *colon = NULL, *query = NULL;
    size_t alen = 0, upto;
    int need_q = 0, masked;
    if (i > 0 && i + 3 <= len && memcmp(s + i, "://", 3) == 0) {
        auth = s + i + 3;
        while (auth + alen < s + len && !strchr("/?#", auth[alen]))
            alen++;
        for (const char *p = auth; p < auth + alen; p++)
            if (*p == '@')
                at = p;
        if (at)
            colon = memchr(auth, ':', (size_t)(at - auth));
        query = memchr(auth + alen, '?', len - (size_t)(auth + alen - s));
    }
    upto = query ? (size_t)(query - s) : len;
    for (i = 0; i < upto;) {
        if (colon && s + i == colon) { /* once: an empty password is hidden too */
            if (mode == DLOCK_URI_DROP) /* an empty user name goes too, with its '@' */
                i = (size_t)(at - s) + (colon == auth);
            else
                memcpy(r + *o, ":***", 4), *o += 4, i = (size_t)(at - s);
            colon = NULL;
            continue;
        }
        r[(*o)++] = s[i++];
    }
    for (i = upto; i < len;) {
        /* One "?k=v" or "&k=v". */
        size_t start = i + 1, end = start;
        const char *eq;
        while (end < len && s[end] != '&')
            end++;
        eq = memchr(s + start, '=', end - start);
        masked = eq && secret_raw_key(s + start, (size_t)(eq - (s + start)));
        if (masked && mode == DLOCK_URI_DROP) { /* the parameter goes, '?' to the next */
            need_q |= s[i] == '?';
            i = end;
            continue;
        }
        r[(*o)++] = need_q ? '?' : s[i];
        need_q = 0;
        if (masked) {
            size_t kl = (size_t)(eq - (s + start)) + 1;
            memcpy(r + *o, s + start, kl), *o += kl;
            memcpy(r + *o, "***", 3), *o += 3;
        } else {
            memcpy(r + *o, s + start, end - start), *o += end - start;
        }
        i = end;
    }
}

char *dlock_uri_hide(const char *list, int mode)
{
    size_t len = strlen(list), o = 0;
    char *r = malloc(len + 3 + 2 * len + 1);
    if (!r)
        return NULL;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, " \t\r\n\v\f");
        if (n) {
            if (o)
                r[o++] = ' ';
            hide_one(r, &o, p, n, mode);
            p += n;
        } else {
            p++;
        }
    }
    r[o] = '\0';
    return r;
}

static int parse(dlock_uri *u, const char *s, char *err, size_t errlen)
{
    size_t len = strnlen(s, DLOCK_URI_MAX + 1), i;
    const char *auth, *auth_end, *at = NULL, *path, *query;
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
    return (u->redacted = dlock_uri_hide(s, DLOCK_URI_MASK)) ? 0 : DLOCK_ENOMEM;
}

/* Wipes a string that holds a secret, and frees it. NULL is fine. */
static void wipe_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

int dlock_uri_read_secret(const char *key, const char *path, char **out, char *err,
                          size_t errlen)
{
    /* Read into a buffer of ours, wiped after, not through stdio's. */
    char buf[DLOCK_SECRET_MAX + 2], *nl = NULL;
    size_t n = 0, len;
    int fd, e = 0;
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (!*path)
        return fail(err, errlen, "%s: no file name given", key);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)) < 0)
        return e = errno, fail(err, errlen, "%s: cannot open '%.200s': %s", key, path,
                               strerror(e));
    while (n < sizeof buf && !memchr(buf, '\n', n)) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            e = errno;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    nl = memchr(buf, '\n', n);
    len = nl ? (size_t)(nl - buf) : n;
    if (len > 0 && buf[len - 1] == '\r')
        len--;
    int rc = e ? fail(err, errlen, "%s: cannot read '%.200s': %s", key, path, strerror(e))
             : len > DLOCK_SECRET_MAX
                 ? fail(err, errlen, "%s: the first line of '%.200s' is longer than %d bytes",
                        key, path, DLOCK_SECRET_MAX)
             : len == 0 ? fail(err, errlen, "%s: the file '%.200s' is empty or has an empty "
                               "first line (the password is that line)", key, path)
             : memchr(buf, '\0', len)
                 ? fail(err, errlen, "%s: the file '%.200s' has a NUL byte in its first line",
                        key, path)
             : (*out = malloc(len + 1)) == NULL ? DLOCK_ENOMEM : 0;
    if (rc == 0) {
        memcpy(*out, buf, len);
        (*out)[len] = '\0';
    }
    explicit_bzero(buf, sizeof buf);
    return rc;
}

/*
 * "password_file=FILE" gives the URI's password, "<x>_password_file=FILE"
 * the option <x>_password (sentinel_password): read here, once for every
 * backend, which then see the password as if the URI held it. The _file
 * option itself is consumed (backends never see it); giving the secret in
 * the URI as well is an error.
 */
static int resolve_secret_files(dlock_uri *u, char *err, size_t errlen)
{
    static const char suffix[] = "_file";
    size_t sl = sizeof suffix - 1;
    for (size_t i = 0; i < u->nparams; i++) {
        struct uri_param *p = &u->params[i];
        size_t kl = strlen(p->key);
        char *secret, *target;
        int rc;
        if (kl <= sl || strcmp(p->key + kl - sl, suffix) != 0)
            continue;
        if (!(target = strndup(p->key, kl - sl)))
            return DLOCK_ENOMEM;
        if (!secret_key(target)) {
            free(target);
            continue;
        }
        int is_pw = strcmp(target, "password") == 0;
        for (size_t j = 0; j < u->nparams; j++) {
            if (j == i || (strcmp(u->params[j].key, p->key) != 0 &&
                           strcmp(u->params[j].key, target) != 0))
                continue;
            rc = strcmp(u->params[j].key, p->key) == 0
                     ? fail(err, errlen, "option %s is given twice", p->key)
                     : fail(err, errlen, "options %s and %s are both given: give one",
                            p->key, target);
            free(target);
            return rc;
        }
        if (is_pw && u->password) {
            free(target);
            return fail(err, errlen, "option %s: the URI has a password already: "
                        "give it in one place only", p->key);
        }
        char what[80];
        snprintf(what, sizeof what, "option %.64s", p->key);
        rc = dlock_uri_read_secret(what, p->value, &secret, err, errlen);
        if (rc) {
            free(target);
            return rc;
        }
        if (is_pw) {
            free(target);
            u->password = secret;
            free(p->key);
            free(p->value);
            memmove(p, p + 1, (u->nparams - i - 1) * sizeof *p);
            u->nparams--;
            i--;
        } else {
            free(p->key);
            free(p->value);
            p->key = target;
            p->value = secret;
        }
    }
    return 0;
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
    if (rc == 0)
        rc = resolve_secret_files(u, err, errlen);
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
    /* Don't leave a secret lying in freed memory. */
    for (size_t i = 0; i < u->nparams; i++) {
        if (secret_key(u->params[i].key))
            wipe_free(u->params[i].value);
        else
            free(u->params[i].value);
        free(u->params[i].key);
    }
    free(u->scheme);
    free(u->user);
    wipe_free(u->password);
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
