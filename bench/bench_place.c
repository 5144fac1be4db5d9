/*
 * Placement: which CPUs the bench and the store's server run on.
 *
 * On a machine with few CPUs a loopback round trip costs several times more
 * when client and server run on different CPUs than on one (a wake-up
 * across CPUs instead of a switch on one), so a figure means little without
 * its placement. The bench reports its own CPU set and, for a store on this
 * machine, the server processes listening on the URI's ports with theirs;
 * --client-cpu and --store-cpu pin them.
 *
 * The server is found by its listening socket: the LISTEN entry of the
 * URI's port in /proc/net/tcp and /proc/net/tcp6 gives the socket's inode,
 * and the process with a descriptor linked to "socket:[inode]" serves it.
 * This needs the right to read the server's /proc/<pid>/fd (its user, or
 * root); otherwise the server is "unknown".
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_int.h"
#include "core/uri.h"

/* The port a scheme's URIs use when they name none. */
static unsigned int default_port(const char *scheme)
{
    static const struct {
        const char *prefix;
        unsigned int port;
    } ports[] = {
        { "redis", 6379 }, { "postgres", 5432 }, { "mysql", 3306 },
        { "mariadb", 3306 }, { "zookeeper", 2181 }, { "etcd", 2379 },
    };

    for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++)
        if (strncmp(scheme, ports[i].prefix, strlen(ports[i].prefix)) == 0)
            return ports[i].port;
    return 0;
}

/* 1 when every address host resolves to is a loopback one. */
static int host_is_loopback(const char *host)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res, *a;
    int all = 1;

    if (!host[0] || host[0] == '/')
        return 0;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    for (a = res; a; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *s = (const void *)a->ai_addr;
            if ((ntohl(s->sin_addr.s_addr) >> 24) != 127)
                all = 0;
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *s = (const void *)a->ai_addr;
            if (!IN6_IS_ADDR_LOOPBACK(&s->sin6_addr))
                all = 0;
        } else {
            all = 0;
        }
    }
    freeaddrinfo(res);
    return all;
}

/* Adds the inodes of the sockets listening on port in one /proc/net file. */
static void listening_inodes(const char *file, unsigned int port,
                             unsigned long *inodes, size_t *n, size_t max)
{
    char line[512];
    FILE *f = fopen(file, "re");

    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char local[64];
        unsigned int st;
        unsigned long inode;
        const char *colon;

        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*s %63s %*s %x %*s %*s %*s %*s %*s %lu", local,
                   &st, &inode) != 3 || st != 0x0A /* LISTEN */)
            continue;
        if (!(colon = strrchr(local, ':')) ||
            strtoul(colon + 1, NULL, 16) != port || inode == 0)
            continue;
        if (*n < max)
            inodes[(*n)++] = inode;
    }
    fclose(f);
}

/* 1 when process pid has a descriptor on one of the inodes. */
static int pid_has_socket(const char *pid, const unsigned long *inodes,
                          size_t n)
{
    char dir[300], path[600], link[64];
    DIR *d;
    struct dirent *e;
    int found = 0;

    snprintf(dir, sizeof dir, "/proc/%s/fd", pid);
    if (!(d = opendir(dir)))
        return 0;
    while (!found && (e = readdir(d))) {
        ssize_t len;
        unsigned long inode;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        len = readlink(path, link, sizeof link - 1);
        if (len <= 0)
            continue;
        link[len] = '\0';
        if (sscanf(link, "socket:[%lu]", &inode) != 1)
            continue;
        for (size_t i = 0; i < n; i++)
            if (inodes[i] == inode)
                found = 1;
    }
    closedir(d);
    return found;
}

/* Adds the processes listening on port (and not already listed). */
static void find_listeners(unsigned int port, bench_placement *p)
{
    unsigned long inodes[16];
    size_t n = 0;
    DIR *d;
    struct dirent *e;
    pid_t self = getpid();

    listening_inodes("/proc/net/tcp", port, inodes, &n, 16);
    listening_inodes("/proc/net/tcp6", port, inodes, &n, 16);
    if (!n || !(d = opendir("/proc")))
        return;
    while ((e = readdir(d)) && p->n_servers < BENCH_MAX_SERVERS) {
        pid_t pid;
        int dup = 0;

        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid = (pid_t)atol(e->d_name);
        for (size_t i = 0; i < p->n_servers; i++)
            dup |= p->servers[i] == pid;
        if (pid != self && !dup && pid_has_socket(e->d_name, inodes, n))
            p->servers[p->n_servers++] = pid;
    }
    closedir(d);
}

void bench_place_find(const char *uri, bench_placement *p)
{
    dlock_uri *u = NULL;
    unsigned int defport;

    memset(p, 0, sizeof *p);
    CPU_ZERO(&p->server_cpus);
    if (dlock_uri_parse(uri, &u, NULL, 0) != 0) {
        p->where = BENCH_WHERE_UNKNOWN;  /* a list of stores, or bad */
        return;
    }
    if (strcmp(dlock_uri_scheme(u), "file") == 0) {
        p->where = BENCH_WHERE_IN_PROCESS;
        dlock_uri_free(u);
        return;
    }
    p->where = BENCH_WHERE_LOOPBACK;
    defport = default_port(dlock_uri_scheme(u));
    if (dlock_uri_host_count(u) == 0)
        p->where = BENCH_WHERE_UNKNOWN;
    for (size_t i = 0; i < dlock_uri_host_count(u); i++) {
        unsigned int port = dlock_uri_port(u, i) ? dlock_uri_port(u, i) : defport;

        if (!port || !host_is_loopback(dlock_uri_host(u, i))) {
            p->where = BENCH_WHERE_UNKNOWN;
            break;
        }
        find_listeners(port, p);
    }
    dlock_uri_free(u);
    if (p->where == BENCH_WHERE_LOOPBACK && p->n_servers == 0)
        p->where = BENCH_WHERE_UNKNOWN;
}

/* For every thread of pid: moves it to set (if given) and adds its CPUs to
 * out (if given). Returns the first error of a move. */
static int each_thread(pid_t pid, const cpu_set_t *set, cpu_set_t *out)
{
    char dir[64];
    DIR *d;
    struct dirent *e;
    int err = 0;

    snprintf(dir, sizeof dir, "/proc/%ld/task", (long)pid);
    if (!(d = opendir(dir)))
        return errno;
    while ((e = readdir(d))) {
        pid_t tid;
        cpu_set_t cur;

        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        tid = (pid_t)atol(e->d_name);
        if (set && sched_setaffinity(tid, sizeof *set, set) != 0 && !err &&
            errno != ESRCH)
            err = errno;
        if (out && sched_getaffinity(tid, sizeof cur, &cur) == 0)
            CPU_OR(out, out, &cur);
    }
    closedir(d);
    return err;
}

int bench_place_pin(const bench_placement *p, const cpu_set_t *set,
                    char *msg, size_t len)
{
    for (size_t i = 0; i < p->n_servers; i++) {
        int err = each_thread(p->servers[i], set, NULL);

        if (err) {
            snprintf(msg, len, "cannot move process %ld to the CPUs asked: %s",
                     (long)p->servers[i], strerror(err));
            return -1;
        }
    }
    return 0;
}

void bench_place_read(bench_placement *p)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int client_pinned, server_pinned;
    cpu_set_t both;

    CPU_ZERO(&p->client_cpus);
    sched_getaffinity(0, sizeof p->client_cpus, &p->client_cpus);
    CPU_ZERO(&p->server_cpus);
    for (size_t i = 0; i < p->n_servers; i++)
        each_thread(p->servers[i], NULL, &p->server_cpus);
    if (p->where == BENCH_WHERE_IN_PROCESS) {
        p->summary = "in process";
        return;
    }
    if (p->where != BENCH_WHERE_LOOPBACK || CPU_COUNT(&p->server_cpus) == 0) {
        p->summary = "unknown";
        return;
    }
    client_pinned = online <= 0 || CPU_COUNT(&p->client_cpus) < online;
    server_pinned = online <= 0 || CPU_COUNT(&p->server_cpus) < online;
    CPU_AND(&both, &p->client_cpus, &p->server_cpus);
    if (!client_pinned || !server_pinned)
        p->summary = "unpinned";
    else if (CPU_COUNT(&p->client_cpus) == 1 && CPU_EQUAL(&p->client_cpus, &p->server_cpus))
        p->summary = "same CPU";
    else if (CPU_COUNT(&both) == 0)
        p->summary = "different CPUs";
    else
        p->summary = "overlapping CPUs";
}

int bench_cpulist_parse(const char *s, cpu_set_t *set)
{
    long max = sysconf(_SC_NPROCESSORS_CONF);

    CPU_ZERO(set);
    if (!*s)
        return -1;
    while (*s) {
        char *end;
        unsigned long lo, hi;

        if (!isdigit((unsigned char)*s))
            return -1;
        lo = hi = strtoul(s, &end, 10);
        if (*end == '-') {
            if (!isdigit((unsigned char)end[1]))
                return -1;
            hi = strtoul(end + 1, &end, 10);
        }
        if (hi < lo || hi >= CPU_SETSIZE || (max > 0 && hi >= (unsigned long)max))
            return -1;
        for (unsigned long c = lo; c <= hi; c++)
            CPU_SET(c, set);
        if (*end == ',' && end[1])
            end++;
        else if (*end)
            return -1;
        s = end;
    }
    return 0;
}

void bench_cpulist_format(const cpu_set_t *set, char *buf, size_t len,
                          const char *sep)
{
    size_t used = 0;

    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE && used + 1 < len; c++) {
        int w;

        if (!CPU_ISSET(c, set))
            continue;
        w = snprintf(buf + used, len - used, "%s%d", used ? sep : "", c);
        if (w < 0 || (size_t)w >= len - used)
            break;
        used += (size_t)w;
    }
}
