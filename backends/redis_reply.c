/* Pure interpretation of Redis replies (see redis_reply.h). */
#include <stdint.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "backends/redis_reply.h"

/* A string-like reply (bulk string or status) equal to s. */
static int str_is(const redisReply *r, const char *s)
{
    size_t n = strlen(s);
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && r->str &&
           r->len == n && memcmp(r->str, s, n) == 0;
}

static int str_eq(const redisReply *r, const char *s, size_t n)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && r->str &&
           r->len == n && (n == 0 || memcmp(r->str, s, n) == 0);
}

/* An array of exactly n elements, none of them missing. */
static int array_of(const redisReply *r, size_t n)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != n || (n && !r->element))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!r->element[i])
            return 0;
    return 1;
}

int dlock_redis_reply_pair(const redisReply *r, long long *a, long long *b)
{
    if (!array_of(r, 2) || r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    *a = r->element[0]->integer;
    *b = r->element[1]->integer;
    return 0;
}

int dlock_redis_reply_int(const redisReply *r, long long *v)
{
    if (!r || r->type != REDIS_REPLY_INTEGER)
        return -1;
    *v = r->integer;
    return 0;
}

int dlock_redis_reply_yes(const redisReply *r)
{
    long long a, b;
    if (r && r->type == REDIS_REPLY_INTEGER)
        return r->integer == 1;
    return dlock_redis_reply_pair(r, &a, &b) == 0 && a == 1;
}

int dlock_redis_reply_sha(const redisReply *r, char sha[41])
{
    if (!r || r->type != REDIS_REPLY_STRING || !r->str || r->len != 40)
        return -1;
    for (size_t i = 0; i < 40; i++) {
        char c = r->str[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return -1;
    }
    memcpy(sha, r->str, 40);
    sha[40] = '\0';
    return 0;
}

int dlock_redis_reply_message(const redisReply *r, const char *chan, size_t chan_len)
{
    if (!array_of(r, 3) ||
        (!str_is(r->element[0], "message") && !str_is(r->element[0], "smessage")) ||
        r->element[1]->type != REDIS_REPLY_STRING || r->element[2]->type != REDIS_REPLY_STRING)
        return 0;
    return !chan || str_eq(r->element[1], chan, chan_len);
}

int dlock_redis_reply_handoff(const redisReply *r, const char *owner, uint64_t *token)
{
    uint64_t t = 0;
    if (!dlock_redis_reply_message(r, NULL, 0))
        return 0;
    const redisReply *m = r->element[2];
    const char *p = m->str;
    if (!p || m->len < 34 || memcmp(p, owner, 32) != 0 || p[32] != ':')
        return 0;
    for (size_t i = 33; i < m->len; i++) {
        unsigned d = (unsigned char)p[i] - '0';
        if (d > 9 || t > (UINT64_MAX / 2 - d) / 10) /* digits only, below 2^63 */
            return 0;
        t = t * 10 + d;
    }
    if (t == 0)
        return 0;
    *token = t;
    return 1;
}

int dlock_redis_reply_subscribed(const redisReply *r, const char *chan, size_t chan_len)
{
    return array_of(r, 3) &&
           (str_is(r->element[0], "subscribe") || str_is(r->element[0], "ssubscribe")) &&
           str_eq(r->element[1], chan, chan_len);
}

int dlock_redis_reply_unsubscribed(const redisReply *r, const char *chan, size_t chan_len)
{
    return array_of(r, 3) &&
           (str_is(r->element[0], "unsubscribe") || str_is(r->element[0], "sunsubscribe")) &&
           str_eq(r->element[1], chan, chan_len);
}

/* Does the error text (len bytes, maybe not NUL-terminated) contain s? */
static int has(const char *text, size_t len, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(text + i, s, n) == 0)
            return 1;
    return 0;
}

static int starts(const char *text, size_t len, const char *s)
{
    size_t n = strlen(s);
    return len >= n && memcmp(text, s, n) == 0;
}

int dlock_redis_reply_error_kind(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ERROR || !r->str)
        return DLOCK_REDIS_ERR_OTHER;
    if (starts(r->str, r->len, "NOSCRIPT"))
        return DLOCK_REDIS_ERR_NOSCRIPT;
    /* NOPERM: an ACL user without a right dlock needs (docs/security.md);
     * a right the script's own calls need is refused in other words. */
    if (starts(r->str, r->len, "WRONGPASS") || starts(r->str, r->len, "NOAUTH") ||
        starts(r->str, r->len, "NOPERM") ||
        has(r->str, r->len, "user executing the script can't run") ||
        has(r->str, r->len, "invalid password") ||
        has(r->str, r->len, "invalid username-password"))
        return DLOCK_REDIS_ERR_AUTH;
    if (starts(r->str, r->len, "READONLY"))
        return DLOCK_REDIS_ERR_READONLY;
    return DLOCK_REDIS_ERR_OTHER;
}

/* A decimal number of at most max (no sign), read from *p up to end;
 * advances *p. -1 when there is none or it is larger. */
static long long number(const char **p, const char *end, long long max)
{
    long long v = 0;
    const char *s = *p;
    if (s >= end || *s < '0' || *s > '9')
        return -1;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > max)
            return -1;
    }
    *p = s;
    return v;
}

int dlock_redis_reply_redirect(const redisReply *r, struct redis_redirect *d)
{
    d->kind = REDIS_REDIR_NONE;
    if (!r || r->type != REDIS_REPLY_ERROR || !r->str)
        return REDIS_REDIR_NONE;
    const char *p = r->str, *end = r->str + r->len;
    int kind;
    if (starts(p, r->len, "TRYAGAIN"))
        return d->kind = REDIS_REDIR_TRYAGAIN;
    if (starts(p, r->len, "CLUSTERDOWN"))
        return d->kind = REDIS_REDIR_DOWN;
    if (starts(p, r->len, "MOVED "))
        kind = REDIS_REDIR_MOVED, p += 6;
    else if (starts(p, r->len, "ASK "))
        kind = REDIS_REDIR_ASK, p += 4;
    else
        return REDIS_REDIR_NONE;
    long long slot = number(&p, end, REDIS_SLOTS - 1);
    if (slot < 0 || p >= end || *p++ != ' ')
        return REDIS_REDIR_NONE;
    /* host:port, the host maybe an IPv6 address (its last ':' ends it),
     * maybe empty (the node does not know its own address: the one asked) */
    const char *colon = NULL;
    for (const char *q = p; q < end; q++)
        if (*q == ':')
            colon = q;
    if (!colon || (size_t)(colon - p) >= sizeof d->host)
        return REDIS_REDIR_NONE;
    const char *q = colon + 1;
    long long port = number(&q, end, 65535);
    if (port <= 0 || q != end)
        return REDIS_REDIR_NONE;
    if (memchr(p, '\0', (size_t)(colon - p)))
        return REDIS_REDIR_NONE;
    memcpy(d->host, p, (size_t)(colon - p));
    d->host[colon - p] = '\0';
    d->slot = (unsigned)slot;
    d->port = (int)port;
    return d->kind = kind;
}

static int int_of(const redisReply *r, long long *v)
{
    if (!r)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER) {
        *v = r->integer;
        return 0;
    }
    if (r->type == REDIS_REPLY_STRING && r->str) {
        const char *p = r->str;
        long long n = number(&p, r->str + r->len, 1LL << 40);
        if (n < 0 || p != r->str + r->len)
            return -1;
        *v = n;
        return 0;
    }
    return -1;
}

int dlock_redis_reply_slots(const redisReply *r, dlock_redis_slots_fn fn, void *arg)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || (r->elements && !r->element))
        return -1;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i], *node;
        long long first, last, port;
        if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 3 || !e->element ||
            int_of(e->element[0], &first) != 0 || int_of(e->element[1], &last) != 0 ||
            first < 0 || last < first || last >= (long long)REDIS_SLOTS)
            continue;
        node = e->element[2];
        if (!node || node->type != REDIS_REPLY_ARRAY || node->elements < 2 || !node->element ||
            !node->element[0] || int_of(node->element[1], &port) != 0 || port <= 0 ||
            port > 65535)
            continue;
        /* nil (cluster-preferred-endpoint-type unknown-endpoint) or "":
         * the node does not know its address. */
        const redisReply *h = node->element[0];
        int unknown = h->type == REDIS_REPLY_NIL;
        if (!unknown && (h->type != REDIS_REPLY_STRING || !h->str || memchr(h->str, '\0', h->len)))
            continue;
        if (fn(arg, (unsigned)first, (unsigned)last, unknown ? "" : h->str,
               unknown ? 0 : h->len, (int)port) != 0)
            return -1;
    }
    return 0;
}

int dlock_redis_reply_addr(const redisReply *r, char *host, size_t cap, int *port)
{
    long long p;
    if (!array_of(r, 2) || r->element[0]->type != REDIS_REPLY_STRING || !r->element[0]->str ||
        r->element[0]->len == 0 || r->element[0]->len >= cap ||
        memchr(r->element[0]->str, '\0', r->element[0]->len) ||
        int_of(r->element[1], &p) != 0 || p <= 0 || p > 65535)
        return -1;
    memcpy(host, r->element[0]->str, r->element[0]->len);
    host[r->element[0]->len] = '\0';
    *port = (int)p;
    return 0;
}

int dlock_redis_reply_is_primary(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element &&
           str_is(r->element[0], "master");
}

int dlock_redis_info_field(const char *text, size_t len, const char *key, char *out,
                           size_t out_len)
{
    size_t klen = strlen(key), i = 0;
    if (!text || out_len == 0)
        return 0;
    while (i < len) {
        const char *line = text + i, *nl = memchr(line, '\n', len - i);
        size_t n = nl ? (size_t)(nl - line) : len - i;
        i += n + (nl ? 1 : 0);
        if (n > 0 && line[n - 1] == '\r')
            n--;
        if (n <= klen || line[klen] != ':' || memcmp(line, key, klen) != 0)
            continue;
        size_t v = n - klen - 1;
        if (v > out_len - 1)
            v = out_len - 1;
        memcpy(out, line + klen + 1, v);
        out[v] = '\0';
        return 1;
    }
    return 0;
}

int dlock_redis_policy_evicts(const char *policy)
{
    return strcmp(policy, "noeviction") != 0;
}

/* A decimal token, 1 .. 2^63 - 1, from n bytes; 0 when it is not one. */
static uint64_t dec(const char *p, size_t n)
{
    uint64_t v = 0;
    if (n == 0 || n > 19)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    return v <= INT64_MAX ? v : 0;
}

static int hex32(const char *p, size_t n)
{
    if (n != 32)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i])
            return 0;
    return 1;
}

static int is_str(const redisReply *r)
{
    return r->type == REDIS_REPLY_STRING && (r->str || r->len == 0);
}

/*
 * {lock value or "", PTTL, counter or "", mark or "", live, {owners},
 * numsub}. The value "<32 hex>:<token>" names the holder; anything else in
 * the lock key is held by nobody dlock knows. The last token granted: the
 * counter, unless the mark "<floor>:<previous>" says raise_token set it to
 * floor since (then previous).
 */
int dlock_redis_reply_inspect(const redisReply *r, struct redis_seen *s)
{
    memset(s, 0, sizeof *s);
    if (!array_of(r, 7) && !array_of(r, 8))
        return -1;
    redisReply *const *e = r->element;
    if (!is_str(e[0]) || e[1]->type != REDIS_REPLY_INTEGER || !is_str(e[2]) || !is_str(e[3]) ||
        e[4]->type != REDIS_REPLY_INTEGER || e[4]->integer < 0 ||
        (e[5]->type != REDIS_REPLY_ARRAY) || (e[5]->elements && !e[5]->element) ||
        e[6]->type != REDIS_REPLY_INTEGER)
        return -1;
    s->held = e[0]->len > 0;
    if (e[0]->len > 33 && e[0]->str[32] == ':' && hex32(e[0]->str, 32) &&
        (s->token = dec(e[0]->str + 33, e[0]->len - 33)) != 0) {
        s->has_owner = 1;
        memcpy(s->owner, e[0]->str, 32);
    } else if (s->held && e[0]->len < sizeof s->value) {
        int printable = 1;
        for (size_t i = 0; i < e[0]->len && printable; i++)
            printable = e[0]->str[i] >= 0x20 && e[0]->str[i] < 0x7f;
        if (printable)
            memcpy(s->value, e[0]->str, e[0]->len);
    }
    s->pttl = e[1]->integer;
    s->counter = e[2]->len ? dec(e[2]->str, e[2]->len) : 0;
    if (e[2]->len && !s->counter)
        return -1; /* a counter that is no number: not ours to read */
    if (e[3]->len) {
        const char *colon = memchr(e[3]->str, ':', e[3]->len);
        if (colon) {
            size_t fl = (size_t)(colon - e[3]->str);
            uint64_t floor = dec(e[3]->str, fl);
            size_t pl = e[3]->len - fl - 1;
            uint64_t prev = pl == 1 && colon[1] == '0' ? 0 : dec(colon + 1, pl);
            if (floor && floor == s->counter && (prev || (pl == 1 && colon[1] == '0')))
                s->counter = prev;
        }
    }
    s->last = s->counter;
    s->live = (unsigned long long)e[4]->integer;
    for (size_t i = 0; i < e[5]->elements && s->listed < DLOCK_REDIS_LISTED; i++) {
        const redisReply *w = e[5]->element[i];
        if (!w || !is_str(w) || !hex32(w->str, w->len))
            return -1;
        memcpy(s->waiter[s->listed], w->str, 32);
        s->waiter[s->listed++][32] = '\0';
    }
    if (s->listed > s->live)
        return -1;
    s->numsub = e[6]->integer;
    if (r->elements == 8) {
        const redisReply *p = e[7];
        if (!is_str(p))
            return -1;
        if (p->len >= DLOCK_REDIS_PUB_HEAD && p->len <= DLOCK_REDIS_PUB_HEAD + DLOCK_VALUE_MAX &&
            hex32(p->str, 32)) {
            uint64_t seq = 0;
            int ok = 1;
            for (size_t i = 32; i < DLOCK_REDIS_PUB_HEAD && ok; i++) {
                const char *d = strchr("0123456789abcdef", p->str[i]);
                ok = d && p->str[i];
                seq = seq << 4 | (uint64_t)(ok ? d - "0123456789abcdef" : 0);
            }
            if (ok) {
                s->has_pub = 1;
                s->pub = p->str;
                s->pub_len = p->len - DLOCK_REDIS_PUB_HEAD;
                s->pub_seq = seq;
            }
        }
    }
    return 0;
}

/* One holder: {owner, kind, token, lease}; an exclusive holder ('x')
 * comes as {lock value, 'x', '', PTTL}, the value "<owner>:<token>" when
 * dlock wrote it. */
static int holder_of(const redisReply *r, uint32_t limit, dlock_holder *h)
{
    if (!array_of(r, 4))
        return -1;
    redisReply *const *e = r->element;
    if (!is_str(e[0]) || !is_str(e[1]) || e[1]->len != 1 || !is_str(e[2]) ||
        e[3]->type != REDIS_REPLY_INTEGER)
        return -1;
    const char *owner = e[0]->str;
    uint64_t token = 0;
    char kind = e[1]->str[0];
    if (kind == 'x') {
        if (e[0]->len > 33 && e[0]->str[32] == ':' && hex32(e[0]->str, 32))
            token = dec(e[0]->str + 33, e[0]->len - 33);
    } else if ((kind == 's' || kind == 'p') && hex32(e[0]->str, e[0]->len)) {
        token = dec(e[2]->str, e[2]->len);
    } else {
        return -1;
    }
    h->known = DLOCK_KNOWS_MODE;
    h->mode = kind == 's' ? DLOCK_MODE_SHARED : DLOCK_MODE_EXCLUSIVE;
    h->limit = kind == 'p' ? limit : 0;
    if (token) {
        h->known |= DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER;
        h->token = token;
        memcpy(h->owner, owner, 32);
        h->owner[32] = '\0';
    }
    if (e[3]->integer >= 0) {
        h->known |= DLOCK_KNOWS_LEASE;
        h->lease_ms = (uint64_t)e[3]->integer;
    }
    return 0;
}

int dlock_redis_reply_holders(const redisReply *r, dlock_holder *out, size_t capacity,
                              size_t *count, uint32_t *limit)
{
    if (!array_of(r, 3) || r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->type != REDIS_REPLY_INTEGER || r->element[2]->type != REDIS_REPLY_ARRAY ||
        (r->element[2]->elements && !r->element[2]->element))
        return -1;
    long long n = r->element[0]->integer, lim = r->element[1]->integer;
    const redisReply *list = r->element[2];
    if (n < 0 || lim < 0 || lim > DLOCK_LIMIT_MAX || list->elements > (unsigned long long)n)
        return -1;
    *count = (size_t)n;
    *limit = (uint32_t)lim;
    for (size_t i = 0; i < list->elements && i < capacity; i++)
        if (holder_of(list->element[i], *limit, &out[i]) != 0)
            return -1;
    return 0;
}

int dlock_redis_reply_command_known(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 1 || !r->element[0])
        return -1;
    if (r->element[0]->type == REDIS_REPLY_NIL)
        return 0;
    return r->element[0]->type == REDIS_REPLY_ARRAY ? 1 : -1;
}
