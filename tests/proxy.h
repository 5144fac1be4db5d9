/*
 * A loopback TCP proxy for fault tests: the test points a client at the
 * proxy's listeners (proxy_uri()) and decides what the network does.
 *
 *   PROXY_PASS       forward both ways
 *   PROXY_CUT_NEXT   forward, but after the next client request of 20 bytes
 *                    or more (ZooKeeper's pings are 12), drop everything on
 *                    that connection and close it 300 ms later: a reply
 *                    lost after the server carried the request out; then
 *                    back to PROXY_PASS by itself
 *   PROXY_DOWN       close every connection, and every new one at once
 *   PROXY_BLACKHOLE  a silent network: nothing is forwarded either way and
 *                    nothing is closed. Open connections stay open, new ones
 *                    are accepted (and connected upstream) but carry nothing,
 *                    a peer's close is not passed on. Bytes sent meanwhile
 *                    wait in the sockets' buffers, as TCP retransmits would:
 *                    back in PROXY_PASS they arrive late; PROXY_DOWN first
 *                    discards them.
 *
 * One listener per upstream (a Redlock's nodes, a ZooKeeper ensemble), all
 * under one mode. The proxy runs in a process of its own, so that children
 * the test forks never inherit its connections (a copy would keep a socket
 * open after the proxy closed it); it dies with the test. proxy_set()
 * returns once the proxy has switched. Upstreams are loopback only.
 */
#ifndef DLOCK_TESTS_PROXY_H
#define DLOCK_TESTS_PROXY_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock.h"
#include "tests/util.h"

#define PROXY_MAX_UP 8
#define PROXY_MAX_PAIRS 64

enum proxy_mode { PROXY_PASS, PROXY_CUT_NEXT, PROXY_DOWN, PROXY_BLACKHOLE };

/* Shared with the proxy process. */
struct proxy_ctl {
    volatile int mode, cuts, stop;
    volatile unsigned gen, seen; /* proxy_set() asked / the proxy applied */
};

struct proxy {
    int n;                      /* upstreams (listeners) */
    int port;                   /* the first listener's port */
    int ports[PROXY_MAX_UP];    /* listener i forwards to upstream[i] */
    int upstream[PROXY_MAX_UP];
    pid_t pid;
    struct proxy_ctl *ctl;
};

/* ---- the proxy process ---------------------------------------------------- */

struct proxy_pair_ {
    int c, s, up;
    uint64_t cut_at; /* replies dropped from then; closed 300 ms later */
};

struct proxy_run_ {
    struct proxy *p;
    int lfd[PROXY_MAX_UP];
    struct proxy_pair_ pair[PROXY_MAX_PAIRS];
    int npairs;
};

static inline void proxy_pair_close_(struct proxy_run_ *r, int i)
{
    close(r->pair[i].c);
    close(r->pair[i].s);
    r->pair[i] = r->pair[--r->npairs];
}

static inline int proxy_write_all_(int fd, const char *b, ssize_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, b, (size_t)n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        b += w, n -= w;
    }
    return 0;
}

static inline void proxy_accept_(struct proxy_run_ *r, int up)
{
    int c = accept(r->lfd[up], NULL, NULL);
    if (c < 0)
        return;
    if (r->p->ctl->mode == PROXY_DOWN || r->npairs == PROXY_MAX_PAIRS) {
        close(c);
        return;
    }
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)r->p->upstream[up]),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
        close(s), close(c);
        return;
    }
    r->pair[r->npairs++] = (struct proxy_pair_){c, s, up, 0};
}

/* Moves one chunk; 0 to keep the pair, -1 to close it. */
static inline int proxy_move_(struct proxy_run_ *r, int i, int from_client)
{
    static char buf[65536];
    struct proxy_ctl *ctl = r->p->ctl;
    int src = from_client ? r->pair[i].c : r->pair[i].s;
    int dst = from_client ? r->pair[i].s : r->pair[i].c;
    ssize_t n = read(src, buf, sizeof buf);
    if (n <= 0)
        return -1;
    if (r->pair[i].cut_at)
        return 0; /* cut: the server's replies (and anything more) are dropped */
    if (proxy_write_all_(dst, buf, n) < 0)
        return -1;
    if (from_client && ctl->mode == PROXY_CUT_NEXT && n >= 20) {
        r->pair[i].cut_at = dlock_monotonic_ns();
        ctl->mode = PROXY_PASS;
        ctl->cuts++;
    }
    return 0;
}

static inline void proxy_main_(struct proxy_run_ *r)
{
    struct proxy *p = r->p;
    struct proxy_ctl *ctl = p->ctl;
    pid_t parent = getppid();
    while (!ctl->stop && getppid() == parent) {
        struct pollfd fds[PROXY_MAX_UP + 2 * PROXY_MAX_PAIRS];
        unsigned gen = ctl->gen;
        int mode = ctl->mode, n = 0, np = r->npairs;
        /* Everything below runs in this mode: the switch is done. */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        ctl->seen = gen;
        for (int u = 0; u < p->n; u++)
            fds[n++] = (struct pollfd){.fd = r->lfd[u], .events = POLLIN};
        /* A black hole reads nothing (the bytes wait in the buffers) and
         * does not even look at its pairs: a peer that hung up would make
         * poll() return at once, forever. */
        for (int i = 0; i < np; i++) {
            int skip = mode == PROXY_BLACKHOLE;
            fds[n++] = (struct pollfd){.fd = skip ? -1 : r->pair[i].c, .events = POLLIN};
            fds[n++] = (struct pollfd){.fd = skip ? -1 : r->pair[i].s, .events = POLLIN};
        }
        if (poll(fds, (nfds_t)n, 20) < 0)
            continue;
        if (mode != PROXY_BLACKHOLE) {
            for (int i = np - 1; i >= 0; i--) {
                int drop = 0;
                /* Down discards what is buffered: nothing crosses. */
                if (mode != PROXY_DOWN && fds[p->n + 2 * i].revents)
                    drop |= proxy_move_(r, i, 1) < 0;
                if (mode != PROXY_DOWN && !drop && fds[p->n + 2 * i + 1].revents)
                    drop |= proxy_move_(r, i, 0) < 0;
                if (r->pair[i].cut_at && dlock_monotonic_ns() - r->pair[i].cut_at > 300000000ull)
                    drop = 1;
                if (drop || ctl->mode == PROXY_DOWN)
                    proxy_pair_close_(r, i);
            }
        }
        for (int u = 0; u < p->n; u++)
            if (fds[u].revents)
                proxy_accept_(r, u);
    }
    while (r->npairs)
        proxy_pair_close_(r, 0);
}

/* ---- the test's side ------------------------------------------------------ */

/* Starts a proxy with one listener per upstream loopback port. */
static inline void proxy_start_many(struct proxy *p, const int *upstreams, int n)
{
    static struct proxy_run_ run; /* the proxy process's own copy after fork */
    memset(p, 0, sizeof *p);
    memset(&run, 0, sizeof run);
    if (n < 1 || n > PROXY_MAX_UP) {
        printf("Bail out! the test proxy takes 1 to %d upstreams, not %d\n", PROXY_MAX_UP, n);
        exit(1);
    }
    p->n = n;
    p->ctl = mmap(NULL, sizeof *p->ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p->ctl == MAP_FAILED) {
        printf("Bail out! cannot map the test proxy's control block: %s\n", strerror(errno));
        exit(1);
    }
    memset((void *)p->ctl, 0, sizeof *p->ctl);
    for (int u = 0; u < n; u++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t alen = sizeof a;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 64) < 0 ||
            getsockname(fd, (struct sockaddr *)&a, &alen) < 0) {
            printf("Bail out! cannot start the test proxy: %s\n", strerror(errno));
            exit(1);
        }
        run.lfd[u] = fd;
        p->upstream[u] = upstreams[u];
        p->ports[u] = ntohs(a.sin_port);
    }
    p->port = p->ports[0];
    run.p = p;
    fflush(stdout);
    p->pid = fork();
    if (p->pid < 0) {
        printf("Bail out! cannot fork the test proxy: %s\n", strerror(errno));
        exit(1);
    }
    if (p->pid == 0) {
        /* Nothing of the test's (clients' sockets, pipes) stays open here. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (int fd = 3; fd < 4096; fd++) {
            int mine = 0;
            for (int u = 0; u < n; u++)
                mine |= fd == run.lfd[u];
            if (!mine)
                close(fd);
        }
        proxy_main_(&run);
        _exit(0);
    }
    for (int u = 0; u < n; u++)
        close(run.lfd[u]);
}

static inline void proxy_start(struct proxy *p, int upstream)
{
    proxy_start_many(p, &upstream, 1);
}

/* Default port of a scheme, for URI hosts given without one. */
static inline unsigned scheme_default_port(const char *scheme)
{
    if (strcmp(scheme, "redis") == 0)
        return 6379;
    if (strcmp(scheme, "postgresql") == 0 || strcmp(scheme, "postgres") == 0)
        return 5432;
    if (strcmp(scheme, "mysql") == 0 || strcmp(scheme, "mariadb") == 0)
        return 3306;
    if (strcmp(scheme, "zookeeper") == 0)
        return 2181;
    return 0;
}

/* A proxy with one listener per host of uri (loopback hosts only).
 * Returns -1 for a URI without hosts (file://). */
static inline int proxy_for_uri(struct proxy *p, const char *uri)
{
    dlock_uri *u = NULL;
    char err[256];
    int ports[PROXY_MAX_UP], n;
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0) {
        printf("Bail out! the test proxy cannot parse its URI: %s\n", err);
        exit(1);
    }
    n = (int)dlock_uri_host_count(u);
    if (n == 0) {
        dlock_uri_free(u);
        return -1;
    }
    if (n > PROXY_MAX_UP) {
        printf("Bail out! the test proxy takes at most %d hosts\n", PROXY_MAX_UP);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        const char *h = dlock_uri_host(u, (size_t)i);
        if (strcmp(h, "127.0.0.1") != 0 && strcmp(h, "localhost") != 0) {
            printf("Bail out! the test proxy forwards to 127.0.0.1 only, not to %s\n", h);
            exit(1);
        }
        ports[i] = (int)(dlock_uri_port(u, (size_t)i) ? dlock_uri_port(u, (size_t)i)
                                                       : scheme_default_port(dlock_uri_scheme(u)));
    }
    dlock_uri_free(u);
    proxy_start_many(p, ports, n);
    return 0;
}

/* uri with every host i replaced by the proxy's listener i, and params
 * ("k=v&k2=v2", NULL for none) added or replacing the URI's own. */
static inline int proxy_uri(const struct proxy *p, const char *uri, const char *params, char *out,
                     size_t len)
{
    return uri_rewrite(uri, p->ports, p->n, NULL, params, out, len);
}

/* Switches the mode; returns once the proxy runs in it (or bails out). */
static inline void proxy_set(struct proxy *p, int mode)
{
    unsigned gen;
    p->ctl->mode = mode;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    gen = ++p->ctl->gen;
    uint64_t t0 = dlock_monotonic_ns();
    while ((int)(p->ctl->seen - gen) < 0) {
        if (dlock_monotonic_ns() - t0 > 5000000000ull) {
            printf("Bail out! the test proxy did not switch mode within 5 s\n");
            exit(1);
        }
        sleep_ms(1);
    }
}

static inline int proxy_cuts(const struct proxy *p)
{
    return p->ctl->cuts;
}

static inline void proxy_stop(struct proxy *p)
{
    int st;
    p->ctl->stop = 1;
    for (int i = 0; i < 200 && waitpid(p->pid, &st, WNOHANG) == 0; i++)
        sleep_ms(10);
    if (waitpid(p->pid, &st, WNOHANG) == 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &st, 0);
    }
    munmap((void *)p->ctl, sizeof *p->ctl);
    p->ctl = NULL;
}

#endif
