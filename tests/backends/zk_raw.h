/*
 * The ZooKeeper tests' raw client, to look behind the library: the lock
 * nodes of a name, straight from the servers. Include after
 * <zookeeper/zookeeper.h>, core/uri.h, tests/util.h.
 */
#ifndef DLOCK_TESTS_ZK_RAW_H
#define DLOCK_TESTS_ZK_RAW_H

/* ---- looking behind the library: a raw client ---------------------------- */

/* "h1:p1,h2:p2" of a zookeeper:// URI. */
static inline void hosts_of(const char *uri, char *out, size_t len)
{
    dlock_uri *u = NULL;
    char err[256];
    size_t o = 0;
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0) {
        printf("Bail out! bad URI %s: %s\n", uri, err);
        exit(1);
    }
    out[0] = '\0';
    for (size_t i = 0; i < dlock_uri_host_count(u); i++)
        o += (size_t)snprintf(out + o, len - o, "%s%s:%u", i ? "," : "", dlock_uri_host(u, i),
                              dlock_uri_port(u, i) ? dlock_uri_port(u, i) : 2181);
    dlock_uri_free(u);
}

static inline void raw_watcher(zhandle_t *zh, int type, int state, const char *path,
                               void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static inline void raw_log(const char *msg)
{
    (void)msg;
}

static inline zhandle_t *raw_open(const char *uri)
{
    char hosts[512];
    hosts_of(uri, hosts, sizeof hosts);
    zhandle_t *zh = zookeeper_init2(hosts, raw_watcher, 10000, NULL, NULL, 0, raw_log);
    if (zh) /* no resolver calls on the I/O thread: the tests fork (see zookeeper.c) */
        zoo_set_servers_resolution_delay(zh, -1);
    for (int i = 0; zh && i < 100 && zoo_state(zh) != ZOO_CONNECTED_STATE; i++)
        sleep_ms(50);
    if (!zh || zoo_state(zh) != ZOO_CONNECTED_STATE) {
        printf("Bail out! raw ZooKeeper client cannot connect to %s\n", hosts);
        exit(1);
    }
    return zh;
}

/* Lock children of a name (the test's names need no encoding); a parent
 * that does not exist (yet, or any more) has none. */
static inline int count_nodes(zhandle_t *zh, const char *root, const char *name)
{
    char path[512];
    struct String_vector sv = {0, NULL};
    snprintf(path, sizeof path, "%s/%s", root, name);
    int rc = zoo_get_children(zh, path, 0, &sv);
    if (rc == ZNONODE)
        return 0;
    if (rc != ZOK)
        return -1;
    int n = sv.count;
    deallocate_String_vector(&sv);
    return n;
}

/* Polls until name has `want` lock nodes, at most ms; returns the last
 * count, and the time it took in *took_ms. The test makes no call on the
 * client under test meanwhile: whatever happens is the client's own threads'
 * doing. */
static inline int await_nodes(zhandle_t *zh, const char *name, int want, unsigned ms,
                              double *took_ms)
{
    uint64_t t0 = dlock_monotonic_ns();
    int n = count_nodes(zh, "/dlock", name);
    while (n != want && dlock_monotonic_ns() - t0 < ms * 1000000ull) {
        sleep_ms(20);
        n = count_nodes(zh, "/dlock", name);
    }
    *took_ms = (dlock_monotonic_ns() - t0) / 1e6;
    return n;
}

#endif
