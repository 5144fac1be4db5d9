/* Lock-node names and the lock root: see zookeeper_names.h. No I/O. */
#include "backends/zookeeper_names.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

int zk_lock_seq(const char *name, long long *seq)
{
    const char *mark = NULL, *s = name;
    size_t ml = strlen(ZK_LOCK_MARK);
    /* The last mark: a foreign prefix (Curator's "_c_<uuid>") may hold one. */
    while ((s = strstr(s, ZK_LOCK_MARK)) != NULL)
        mark = s++;
    if (!mark)
        return -1;
    s = mark + ml;
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

int zk_kids_parse(const char *const *names, size_t n, struct zk_kids *k)
{
    k->n = 0;
    k->v = calloc(n > 0 ? n : 1, sizeof *k->v);
    if (!k->v)
        return -1;
    for (size_t i = 0; i < n; i++) {
        long long seq;
        if (!names[i] || zk_lock_seq(names[i], &seq) != 0)
            continue;
        if (!(k->v[k->n].name = strdup(names[i]))) {
            zk_kids_free(k);
            return -1;
        }
        k->v[k->n++].seq = seq;
    }
    qsort(k->v, k->n, sizeof *k->v, kid_cmp);
    return 0;
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
