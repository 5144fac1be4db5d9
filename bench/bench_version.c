/*
 * The store's server version, for the report's caption. dlock's client API
 * does not expose it and the CLI links no store client library, so bench
 * asks the first host of the URI itself, over the store's own wire protocol,
 * with one short TCP exchange bounded by BENCH_PROBE_MS:
 *   redis      AUTH (when the URI has a password), INFO server: redis_version
 *   mysql      the server's greeting packet, sent before any authentication
 *   zookeeper  the `srvr` four-letter word: "Zookeeper version: ..."
 *   postgres   a startup message: the server_version parameter status, only
 *              when the server lets the user in without a password (trust);
 *              otherwise "unknown", as bench speaks no authentication
 * Anything else, or any failure, gives "unknown". The probe never takes a
 * lock and is not timed. The URI is read by the library's own parser
 * (core/uri.h), as the client that opened the store read it.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bench_int.h"
#include "core/uri.h"

#define BENCH_PROBE_MS 1000
#define PROBE_BUF 8192

typedef struct probe_target {
    char host[256];
    char port[8];
    char user[128];
    char pass[128];
    char db[128];
} probe_target;

/* s into out; -1 if it does not fit. */
static int copy_field(char *out, size_t cap, const char *s)
{
    int n = snprintf(out, cap, "%s", s ? s : "");

    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The first host of the URI, with its user, password and database (the
 * path after '/'), as the library's parser reads them. */
static int parse_target(const char *uri, const char *default_port,
                        probe_target *t)
{
    dlock_uri *u = NULL;
    const char *path;
    int rc = -1;

    memset(t, 0, sizeof *t);
    if (dlock_uri_parse(uri, &u, NULL, 0) != 0)
        return -1;
    path = dlock_uri_path(u);
    if (path[0] == '/')
        path++;
    if (dlock_uri_host_count(u) > 0 && dlock_uri_host(u, 0)[0] &&
        copy_field(t->host, sizeof t->host, dlock_uri_host(u, 0)) == 0 &&
        copy_field(t->user, sizeof t->user, dlock_uri_user(u)) == 0 &&
        copy_field(t->pass, sizeof t->pass, dlock_uri_password(u)) == 0 &&
        copy_field(t->db, sizeof t->db, path) == 0) {
        if (dlock_uri_port(u, 0))
            snprintf(t->port, sizeof t->port, "%u", dlock_uri_port(u, 0));
        else
            snprintf(t->port, sizeof t->port, "%s", default_port);
        rc = 0;
    }
    dlock_uri_free(u);
    if (rc != 0)
        explicit_bzero(t, sizeof *t);
    return rc;
}

static uint64_t probe_deadline;

static int remaining_ms(void)
{
    uint64_t now = bench_now();

    return now >= probe_deadline ? 0 : (int)((probe_deadline - now) / 1000000u);
}

/* Connects to the target within the probe's time; the fd, or -1. */
static int probe_connect(const probe_target *t)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
    int fd = -1;

    if (getaddrinfo(t->host, t->port, &hints, &res) != 0)
        return -1;
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        struct pollfd p;
        int err = 0;
        socklen_t elen = sizeof err;

        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            p = (struct pollfd){ .fd = fd, .events = POLLOUT };
            if (errno != EINPROGRESS || poll(&p, 1, remaining_ms()) != 1 ||
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err) {
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    return fd;
}

static int send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len) {
        struct pollfd pf = { .fd = fd, .events = POLLOUT };
        ssize_t n;

        if (poll(&pf, 1, remaining_ms()) != 1)
            return -1;
        n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        }
    }
    return 0;
}

/* Appends what arrives to buf (NUL-terminated); bytes read, 0 at EOF, -1. */
static ssize_t recv_some(int fd, char *buf, size_t *len, size_t cap)
{
    struct pollfd pf = { .fd = fd, .events = POLLIN };
    ssize_t n;

    if (*len + 1 >= cap || poll(&pf, 1, remaining_ms()) != 1)
        return -1;
    n = recv(fd, buf + *len, cap - *len - 1, 0);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? recv_some(fd, buf, len, cap) : -1;
    *len += (size_t)n;
    buf[*len] = '\0';
    return n;
}

/* Copies the text after key up to one of stops into out. */
static int take_field(const char *buf, const char *key, const char *stops,
                      const char *prefix, char *out, size_t cap)
{
    const char *p = strstr(buf, key);
    size_t n;

    if (!p)
        return -1;
    p += strlen(key);
    n = strcspn(p, stops);
    if (n == 0)
        return -1;
    snprintf(out, cap, "%s%.*s", prefix, (int)n, p);
    return 0;
}

static void resp_arg(char *cmd, size_t cap, const char *s)
{
    size_t used = strlen(cmd);

    snprintf(cmd + used, cap - used, "$%zu\r\n%s\r\n", strlen(s), s);
}

static int probe_redis(int fd, const probe_target *t, char *out, size_t cap)
{
    char cmd[512] = "", buf[PROBE_BUF];
    size_t len = 0;

    if (t->pass[0]) {
        snprintf(cmd, sizeof cmd, "*%d\r\n", t->user[0] ? 3 : 2);
        resp_arg(cmd, sizeof cmd, "AUTH");
        if (t->user[0])
            resp_arg(cmd, sizeof cmd, t->user);
        resp_arg(cmd, sizeof cmd, t->pass);
    }
    strcat(cmd, "*2\r\n");
    resp_arg(cmd, sizeof cmd, "INFO");
    resp_arg(cmd, sizeof cmd, "server");
    if (send_all(fd, cmd, strlen(cmd)))
        return -1;
    buf[0] = '\0';
    while (!strstr(buf, "-NOAUTH") && !strstr(buf, "-WRONGPASS")) {
        const char *v = strstr(buf, "redis_version:");

        if (v && strstr(v, "\r\n"))
            return take_field(buf, "redis_version:", "\r\n", "Redis ", out, cap);
        if (recv_some(fd, buf, &len, sizeof buf) <= 0)
            return -1;
    }
    return -1;
}

static int probe_mysql(int fd, char *out, size_t cap)
{
    char buf[PROBE_BUF];
    size_t len = 0;
    const char *v;

    buf[0] = '\0';
    while (len < 6 || !memchr(buf + 5, '\0', len - 5))
        if (recv_some(fd, buf, &len, sizeof buf) <= 0)
            return -1;
    if (buf[4] != 10)  /* protocol version 10 */
        return -1;
    v = buf + 5;
    if (strncmp(v, "5.5.5-", 6) == 0 && strstr(v, "MariaDB")) {
        v += 6;  /* MariaDB's prefix for old clients */
        snprintf(out, cap, "MariaDB %.*s", (int)strcspn(v, "-"), v);
    } else {
        snprintf(out, cap, "MySQL %s", v);
    }
    return 0;
}

static int probe_zookeeper(int fd, char *out, size_t cap)
{
    char buf[PROBE_BUF];
    size_t len = 0;

    buf[0] = '\0';
    if (send_all(fd, "srvr", 4))
        return -1;
    while (recv_some(fd, buf, &len, sizeof buf) > 0)
        ;
    return take_field(buf, "Zookeeper version: ", "-,\n", "ZooKeeper ", out, cap);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           p[3];
}

static int probe_postgres(int fd, const probe_target *t, char *out, size_t cap)
{
    unsigned char msg[600], buf[PROBE_BUF];
    size_t n = 8, len = 0;
    const char *db = t->db[0] ? t->db : t->user;

    if (!t->user[0])
        return -1;
    put_u32(msg + 4, 196608);  /* protocol 3.0 */
    n += (size_t)sprintf((char *)msg + n, "user") + 1;
    n += (size_t)sprintf((char *)msg + n, "%s", t->user) + 1;
    n += (size_t)sprintf((char *)msg + n, "database") + 1;
    n += (size_t)sprintf((char *)msg + n, "%s", db) + 1;
    msg[n++] = '\0';
    put_u32(msg, (uint32_t)n);
    if (send_all(fd, msg, n))
        return -1;
    for (;;) {
        uint32_t mlen;

        while (len < 5 || len < 1 + (size_t)get_u32(buf + 1)) {
            if (len >= 5 && 1 + (size_t)get_u32(buf + 1) >= sizeof buf)
                return -1;
            if (recv_some(fd, (char *)buf, &len, sizeof buf) <= 0)
                return -1;
        }
        mlen = get_u32(buf + 1);
        if (buf[0] == 'R' && (mlen < 8 || get_u32(buf + 5) != 0))
            return -1;  /* the server wants a password: bench has none */
        if (buf[0] == 'E')
            return -1;
        if (buf[0] == 'S' && mlen > 4 &&
            strcmp((char *)buf + 5, "server_version") == 0) {
            const char *v = (char *)buf + 5 + strlen("server_version") + 1;

            if ((const unsigned char *)v < buf + 1 + mlen &&
                memchr(v, '\0', (size_t)(buf + 1 + mlen - (const unsigned char *)v))) {
                snprintf(out, cap, "PostgreSQL %s", v);
                put_u32(msg + 1, 4);
                msg[0] = 'X';  /* Terminate */
                (void)send_all(fd, msg, 5);
                return 0;
            }
            return -1;
        }
        memmove(buf, buf + 1 + mlen, len - 1 - mlen);
        len -= 1 + mlen;
    }
}

void bench_store_version(const char *uri, const char *backend, char *out,
                         size_t cap)
{
    static const struct {
        const char *backend, *port;
    } ports[] = {
        { "redis", "6379" }, { "postgres", "5432" },
        { "mysql", "3306" }, { "zookeeper", "2181" },
    };
    const char *port = NULL;
    probe_target t;
    int fd, rc = -1;

    snprintf(out, cap, "unknown");
    for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++)
        if (strcmp(backend, ports[i].backend) == 0)
            port = ports[i].port;
    if (!port || parse_target(uri, port, &t) != 0)
        return;
    probe_deadline = bench_now() + (uint64_t)BENCH_PROBE_MS * 1000000u;
    if ((fd = probe_connect(&t)) < 0)
        return;
    if (strcmp(backend, "redis") == 0)
        rc = probe_redis(fd, &t, out, cap);
    else if (strcmp(backend, "mysql") == 0)
        rc = probe_mysql(fd, out, cap);
    else if (strcmp(backend, "zookeeper") == 0)
        rc = probe_zookeeper(fd, out, cap);
    else if (strcmp(backend, "postgres") == 0)
        rc = probe_postgres(fd, &t, out, cap);
    close(fd);
    if (rc != 0)
        snprintf(out, cap, "unknown");
    explicit_bzero(&t, sizeof t);
}
