/* Lock-node names, their modes and the queue's rules, and the lock root:
 * see zookeeper_names.h. No I/O. */
#include "backends/zookeeper_names.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The last "-lock-" of name, or NULL. */
static const char *last_mark(const char *name)
{
    const char *mark = NULL, *s = name;
    /* The last mark: a foreign prefix (Curator's "_c_<uuid>") may hold one. */
    while ((s = strstr(s, ZK_LOCK_MARK)) != NULL)
        mark = s++;
    return mark;
}

int zk_lock_seq(const char *name, long long *seq)
{
    const char *mark = last_mark(name), *s;
    if (!mark)
        return -1;
    s = mark + strlen(ZK_LOCK_MARK);
    int neg = *s == '-';
    s += neg;
    if (*s < '0' || *s > '9')
        return -1;
    long long v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        if (v > (LLONG_MAX - (*s - '0')) / 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    *seq = neg ? -v : v;
    return 0;
}

/* The length of kazoo's pattern and sequence that end name (0: none),
 * with the sequence and kind. */
static size_t kazoo_tail(const char *name, long long *seq, enum zk_kind *kind)
{
    static const struct {
        const char *pattern;
        enum zk_kind kind;
    } pats[] = {{ZK_KAZOO_LOCK, ZK_WRITER}, {ZK_KAZOO_RLOCK, ZK_READER}};
    size_t len = strlen(name);
    if (len < 10)
        return 0;
    long long v = 0;
    for (size_t i = len - 10; i < len; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        v = v * 10 + (name[i] - '0');
    }
    size_t end = len - 10;
    int neg = end > 0 && name[end - 1] == '-';
    for (int tries = neg; tries >= 0; tries--) {
        /* "-" is kazoo's optional sign, or the pattern's end: try both. */
        size_t e = end - (size_t)tries;
        for (size_t p = 0; p < sizeof pats / sizeof pats[0]; p++) {
            size_t pl = strlen(pats[p].pattern);
            if (e >= pl && memcmp(name + e - pl, pats[p].pattern, pl) == 0) {
                *seq = tries ? -v : v;
                *kind = pats[p].kind;
                return len - (e - pl);
            }
        }
    }
    return 0;
}

int zk_kazoo_seq(const char *name, long long *seq, enum zk_kind *kind)
{
    return kazoo_tail(name, seq, kind) ? 0 : -1;
}

void zk_kids_free(struct zk_kids *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i].name);
    free(k->v);
    k->v = NULL;
    k->n = 0;
}

static int kid_cmp(const void *a, const void *b)
{
    const struct zk_kid *x = a, *y = b;
    if (x->seq != y->seq)
        return (x->seq > y->seq) - (x->seq < y->seq);
    return strcmp(x->name, y->name); /* names are unique in a listing */
}

int zk_kids_parse_layout(const char *const *names, size_t n, enum zk_layout layout,
                         struct zk_kids *k)
{
    k->n = 0;
    k->v = calloc(n > 0 ? n : 1, sizeof *k->v);
    if (!k->v)
        return -1;
    for (size_t i = 0; i < n; i++) {
        long long seq;
        enum zk_kind kind;
        if (!names[i] || (zk_lock_seq(names[i], &seq) != 0 &&
                          (layout != ZK_LAYOUT_KAZOO || zk_kazoo_seq(names[i], &seq, &kind) != 0)))
            continue;
        if (!(k->v[k->n].name = strdup(names[i]))) {
            zk_kids_free(k);
            return -1;
        }
        k->v[k->n].kind = zk_node_kind(names[i], &k->v[k->n].limit);
        k->v[k->n++].seq = seq;
    }
    qsort(k->v, k->n, sizeof *k->v, kid_cmp);
    return 0;
}

int zk_kids_parse(const char *const *names, size_t n, struct zk_kids *k)
{
    return zk_kids_parse_layout(names, n, ZK_LAYOUT_DLOCK, k);
}

void zk_tag(int shared, unsigned limit, char *out)
{
    if (limit)
        snprintf(out, ZK_TAG_MAX, "%s%u__", ZK_SEM_TAG, limit & 0xffffu);
    else
        snprintf(out, ZK_TAG_MAX, "%s", shared ? ZK_READ_TAG : "");
}

void zk_mark(enum zk_layout layout, int shared, unsigned limit, char *out)
{
    char tag[ZK_TAG_MAX];
    if (layout == ZK_LAYOUT_KAZOO) {
        snprintf(out, ZK_MARK_MAX, "%s", shared ? ZK_KAZOO_RLOCK : ZK_KAZOO_LOCK);
        return;
    }
    zk_tag(shared, limit, tag);
    snprintf(out, ZK_MARK_MAX, "%s%s", tag, ZK_LOCK_MARK);
}

/* The length of the tag that ends name[0 .. end) (0: none), its kind and
 * limit. */
static size_t tag_before(const char *name, size_t end, enum zk_kind *kind, unsigned *limit)
{
    size_t rl = strlen(ZK_READ_TAG), sl = strlen(ZK_SEM_TAG);
    *kind = ZK_WRITER;
    *limit = 0;
    if (end >= rl && memcmp(name + end - rl, ZK_READ_TAG, rl) == 0) {
        *kind = ZK_READER;
        return rl;
    }
    /* "-__SEM<1..65535, no leading 0>__" */
    if (end < sl + 3 || memcmp(name + end - 2, "__", 2) != 0)
        return 0;
    size_t d = end - 2, digits = 0;
    while (d > 0 && digits < 6 && name[d - 1] >= '0' && name[d - 1] <= '9')
        d--, digits++;
    if (digits == 0 || digits > 5 || name[d] == '0' || d < sl ||
        memcmp(name + d - sl, ZK_SEM_TAG, sl) != 0)
        return 0;
    unsigned v = 0;
    for (size_t j = d; j < end - 2; j++)
        v = v * 10 + (unsigned)(name[j] - '0');
    if (v > 65535)
        return 0;
    *kind = ZK_PERMIT;
    *limit = v;
    return end - (d - sl);
}

enum zk_kind zk_node_kind(const char *name, unsigned *limit)
{
    const char *mark = last_mark(name);
    enum zk_kind kind = ZK_WRITER;
    long long seq;
    *limit = 0;
    if (kazoo_tail(name, &seq, &kind))
        return kind; /* never a dlock node's too: that one ends "-lock-<digits>" */
    if (mark)
        tag_before(name, (size_t)(mark - name), &kind, limit);
    return kind;
}

void zk_node_owner(const char *name, char *out, size_t outsz)
{
    const char *mark = last_mark(name);
    enum zk_kind kind;
    unsigned limit;
    long long seq;
    size_t n = mark ? (size_t)(mark - name) : 0, kazoo = kazoo_tail(name, &seq, &kind);
    if (kazoo)
        n = strlen(name) - kazoo;
    else
        n -= tag_before(name, n, &kind, &limit);
    if (n >= outsz)
        n = outsz - 1;
    memcpy(out, name, n);
    out[n] = '\0';
}

int zk_node_foreign(const char *name, const char *data)
{
    char owner[64];
    long long seq;
    enum zk_kind kind;
    if (!kazoo_tail(name, &seq, &kind))
        return 0;
    zk_node_owner(name, owner, sizeof owner);
    return strcmp(owner, data) != 0 || !owner[0];
}

/* Two nodes that may hold the same name together, or wait in one queue: a
 * read-write lock's, or permits of one limit. */
static int same_kind(const struct zk_kid *a, const struct zk_kid *b)
{
    if ((a->kind == ZK_PERMIT) != (b->kind == ZK_PERMIT))
        return 0;
    return a->kind != ZK_PERMIT || a->limit == b->limit;
}

void zk_turn(const struct zk_kids *k, size_t i, struct zk_turn *t)
{
    const struct zk_kid *me = &k->v[i];
    size_t writer = i; /* the nearest writer before i; i: none */
    *t = (struct zk_turn){ZK_GRANTED, 0, 0, 0};
    for (size_t j = 0; j < i; j++) {
        if (!same_kind(&k->v[j], me)) {
            *t = (struct zk_turn){ZK_MISMATCH, 0, j, 1};
            return;
        }
        if (k->v[j].kind == ZK_WRITER)
            writer = j;
    }
    if (me->kind == ZK_WRITER && i > 0)
        *t = (struct zk_turn){ZK_WAIT, 0, i - 1, 1};
    else if (me->kind == ZK_READER && writer < i)
        *t = (struct zk_turn){ZK_WAIT, 0, writer, 1};
    else if (me->kind == ZK_PERMIT && i == me->limit)
        *t = (struct zk_turn){ZK_WAIT, 0, 0, i};
    else if (me->kind == ZK_PERMIT && i > me->limit)
        *t = (struct zk_turn){ZK_WAIT, 1, i - 1, 1};
}

size_t zk_holders(const struct zk_kids *k)
{
    size_t n = 0;
    if (k->n == 0)
        return 0;
    if (k->v[0].kind == ZK_WRITER)
        return 1;
    while (n < k->n && same_kind(&k->v[n], &k->v[0]) && k->v[n].kind == k->v[0].kind &&
           (k->v[0].kind == ZK_READER || n < k->v[0].limit))
        n++;
    return n;
}

long zk_kids_find(const struct zk_kids *k, const char *start)
{
    size_t len = strlen(start);
    for (size_t i = 0; i < k->n; i++)
        if (strncmp(k->v[i].name, start, len) == 0)
            return (long)i;
    return -1;
}

int zk_root_check(const char *path, size_t *lenp)
{
    static const char reserved[] = "/zookeeper";
    size_t len = strlen(path), rl = sizeof reserved - 1;
    while (len > 1 && path[len - 1] == '/')
        len--;
    *lenp = len;
    if (len <= 1 || path[0] != '/')
        return ZK_ROOT_BAD;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c < 0x20 || c == 0x7f)
            return ZK_ROOT_BAD;
        if (c == '/') {
            size_t j = i + 1;
            while (j < len && path[j] != '/')
                j++;
            size_t clen = j - i - 1;
            if (clen == 0 || (clen == 1 && path[i + 1] == '.') ||
                (clen == 2 && path[i + 1] == '.' && path[i + 2] == '.'))
                return ZK_ROOT_BAD;
        }
    }
    if (len >= rl && memcmp(path, reserved, rl) == 0 && (len == rl || path[rl] == '/'))
        return ZK_ROOT_RESERVED;
    return ZK_ROOT_OK;
}
