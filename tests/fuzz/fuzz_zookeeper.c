/*
 * libFuzzer target: the ZooKeeper backend's own parsing
 * (backends/zookeeper_names.c): a children list from the server (names that
 * anyone with write access to the lock's parent may have created), and the
 * lock root of a URI.
 *
 * The input is a children list, one name per line ('\n' or NUL ends a name:
 * ZooKeeper names hold neither); its first line doubles as a lock root and
 * as the prefix looked for. Pure functions: no connection, no file.
 * Checks, beyond the sanitizers: every name kept parses as a lock node's
 * with the sequence recorded, none is dropped that parses, the list is
 * sorted by sequence; a prefix found starts the name found, and one not
 * found starts none; an accepted root is absolute, not "/", within the
 * input, and outside /zookeeper. The queue's rules: a node's kind and limit
 * are its name's, its owner id a prefix of its name; exactly the first
 * zk_holders() nodes are granted, a node never waits for one at or behind
 * it, and a refusal names a node ahead of another kind.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/zookeeper_names.h"

#define require(cond)                                                        \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_zookeeper: %s:%d: broken: %s\n", __FILE__, \
                    __LINE__, #cond);                                        \
            abort();                                                         \
        }                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    size_t n = 1;
    for (size_t i = 0; i < size; i++)
        n += buf[i] == '\n' || buf[i] == '\0';
    char **names = malloc(n * sizeof *names);
    if (!names) {
        free(buf);
        return 0;
    }
    size_t j = 0;
    names[j++] = buf;
    for (size_t i = 0; i < size; i++)
        if (buf[i] == '\n' || buf[i] == '\0') {
            buf[i] = '\0';
            names[j++] = buf + i + 1;
        }

    struct zk_kids k;
    if (zk_kids_parse((const char *const *)names, n, &k) == 0) {
        size_t lock_names = 0;
        for (size_t i = 0; i < n; i++) {
            long long seq;
            lock_names += zk_lock_seq(names[i], &seq) == 0;
        }
        require(k.n == lock_names);
        for (size_t i = 0; i < k.n; i++) {
            long long seq;
            require(zk_lock_seq(k.v[i].name, &seq) == 0 && seq == k.v[i].seq);
            require(strstr(k.v[i].name, ZK_LOCK_MARK) != NULL);
            require(i == 0 || k.v[i - 1].seq <= k.v[i].seq);
        }
        size_t holders = zk_holders(&k);
        require(holders <= k.n && (k.n == 0 || holders > 0));
        for (size_t i = 0; i < k.n; i++) {
            unsigned limit;
            char owner[64];
            struct zk_turn t;
            require(zk_node_kind(k.v[i].name, &limit) == k.v[i].kind && limit == k.v[i].limit);
            require((k.v[i].kind == ZK_PERMIT) == (limit >= 1 && limit <= 65535));
            zk_node_owner(k.v[i].name, owner, sizeof owner);
            require(strncmp(k.v[i].name, owner, strlen(owner)) == 0);
            zk_turn(&k, i, &t);
            require((t.verdict == ZK_GRANTED) == (i < holders));
            if (t.verdict == ZK_WAIT)
                require(t.count >= 1 && t.first + t.count <= i);
            if (t.verdict == ZK_MISMATCH)
                require(t.first < i && ((k.v[t.first].kind == ZK_PERMIT) !=
                                            (k.v[i].kind == ZK_PERMIT) ||
                                        k.v[t.first].limit != k.v[i].limit));
        }
        long f = zk_kids_find(&k, names[0]);
        size_t pl = strlen(names[0]);
        if (f >= 0) {
            require((size_t)f < k.n && strncmp(k.v[f].name, names[0], pl) == 0);
        } else {
            for (size_t i = 0; i < k.n; i++)
                require(strncmp(k.v[i].name, names[0], pl) != 0);
        }
        zk_kids_free(&k);
        require(k.n == 0 && k.v == NULL);
    }

    /* layout=kazoo: the dlock layout's nodes and kazoo's, never a name of
     * both, in sequence order, each of the kind its pattern says. */
    if (zk_kids_parse_layout((const char *const *)names, n, ZK_LAYOUT_KAZOO, &k) == 0) {
        size_t want = 0;
        for (size_t i = 0; i < n; i++) {
            long long s1, s2;
            enum zk_kind kind;
            int d = zk_lock_seq(names[i], &s1) == 0, z = zk_kazoo_seq(names[i], &s2, &kind) == 0;
            require(!(d && z));
            want += d || z;
        }
        require(k.n == want);
        for (size_t i = 0; i < k.n; i++) {
            long long seq;
            enum zk_kind kind;
            unsigned limit;
            if (zk_kazoo_seq(k.v[i].name, &seq, &kind) == 0)
                require(kind == k.v[i].kind && kind != ZK_PERMIT);
            else
                require(zk_lock_seq(k.v[i].name, &seq) == 0);
            require(seq == k.v[i].seq && (i == 0 || k.v[i - 1].seq <= k.v[i].seq));
            require(zk_node_kind(k.v[i].name, &limit) == k.v[i].kind);
        }
        zk_kids_free(&k);
    }

    size_t len = 0;
    int r = zk_root_check(names[0], &len);
    require(r == ZK_ROOT_OK || r == ZK_ROOT_BAD || r == ZK_ROOT_RESERVED);
    require(len <= strlen(names[0]));
    if (r == ZK_ROOT_OK) {
        require(len > 1 && names[0][0] == '/' && names[0][len - 1] != '/');
        require(!(len >= 10 && memcmp(names[0], "/zookeeper", 10) == 0 &&
                  (len == 10 || names[0][10] == '/')));
        for (size_t i = 0; i < len; i++)
            require((unsigned char)names[0][i] >= 0x20 && names[0][i] != 0x7f);
    }
    free(names);
    free(buf);
    return 0;
}
