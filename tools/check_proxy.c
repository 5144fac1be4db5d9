/*
 * The loopback proxy of `dlock check --cut`: each worker slot reaches the
 * stores through listeners of its own, so that the checker can cut the
 * connections of one holder (close them, and close new ones at once, for a
 * while) and leave the others' alone. One process of its own, forked before
 * the workers, dying with the checker (PR_SET_PDEATHSIG). The tests' proxy
 * (tests/proxy.h) works on the library's private URI parser; this one reads
 * URIs itself, as the CLI uses the public API only.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "dlock.h"

#define PAIRS_MAX 256

struct upstream {
    struct sockaddr_storage addr;
    socklen_t addrlen;
};

struct pair {
    int c, s, slot;
};

struct run {
    struct check_proxy *p;
    int lfd[CHECK_SLOTS_MAX][CHECK_UPSTREAMS_MAX];
    struct upstream up[CHECK_UPSTREAMS_MAX];
    struct pair pair[PAIRS_MAX];
    int npairs;
};

static unsigned default_port(const char *scheme, size_t len)
{
    static const struct {
        const char *scheme;
        unsigned port;
    } ports[] = {{"redis", 6379}, {"postgresql", 5432}, {"postgres", 5432},
                 {"mysql", 3306}, {"mariadb", 3306},   {"zookeeper", 2181},
                 {"etcd", 2379}};

    for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++)
        if (strlen(ports[i].scheme) == len && strncasecmp(ports[i].scheme, scheme, len) == 0)
            return ports[i].port;
    return 0;
}

static int resolve(struct upstream *u, const char *host, size_t hlen, unsigned port, char *err,
                   size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    char h[256], ps[16];
    int rc;

    if (hlen >= sizeof h) {
        snprintf(err, errlen, "host name too long for --cut");
        return -1;
    }
    memcpy(h, host, hlen);
    h[hlen] = '\0';
    snprintf(ps, sizeof ps, "%u", port);
    rc = getaddrinfo(h, ps, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "--cut cannot resolve host '%s': %s", h, gai_strerror(rc));
        return -1;
    }
    memcpy(&u->addr, res->ai_addr, res->ai_addrlen);
    u->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static int listener(int *portp)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) < 0) {
        close(fd);
        return -1;
    }
    *portp = ntohs(a.sin_port);
    return fd;
}

/*
 * Reads the hosts of every URI of the list into r->up (resolving them) and,
 * when out is not NULL, writes the list with each host replaced by
 * 127.0.0.1:ports[i] into out. Returns the number of hosts, or -1.
 */
static int rewrite(const char *list, struct run *r, const int *ports, char *out, size_t outlen,
                   char *err, size_t errlen)
{
    static const char spaces[] = " \t\r\n\v\f";
    size_t o = 0;
    int n = 0;

#define EMIT(s, len)                                                           \
    do {                                                                       \
        size_t l_ = (len);                                                     \
        if (out) {                                                             \
            if (o + l_ + 1 > outlen)                                           \
                goto too_long;                                                 \
            memcpy(out + o, (s), l_);                                          \
        }                                                                      \
        o += l_;                                                               \
    } while (0)

    for (const char *p = list; *p;) {
        size_t len = strcspn(p, spaces);
        const char *end = p + len, *sep, *auth, *aend, *h;
        if (!len) {
            EMIT(p, 1);
            p++;
            continue;
        }
        sep = strstr(p, "://");
        if (!sep || sep > end) {
            snprintf(err, errlen, "--cut cannot read the hosts of a URI without '://'");
            return -1;
        }
        auth = sep + 3;
        aend = auth + strcspn(auth, "/?#");
        if (aend > end)
            aend = end;
        for (const char *q = auth; q < aend; q++)
            if (*q == '@')
                auth = q + 1;
        EMIT(p, (size_t)(auth - p));
        for (h = auth; h < aend;) {
            const char *hend = memchr(h, ',', (size_t)(aend - h)), *colon = NULL;
            const char *name = h;
            size_t nlen;
            unsigned port;
            char buf[32];
            if (!hend)
                hend = aend;
            if (*h == '[') {
                const char *close = memchr(h, ']', (size_t)(hend - h));
                if (!close) {
                    snprintf(err, errlen, "--cut: malformed IPv6 host in a URI");
                    return -1;
                }
                name = h + 1;
                nlen = (size_t)(close - name);
                if (close + 1 < hend && close[1] == ':')
                    colon = close + 1;
            } else {
                colon = memchr(h, ':', (size_t)(hend - h));
                nlen = (size_t)((colon ? colon : hend) - h);
            }
            port = colon ? (unsigned)strtoul(colon + 1, NULL, 10)
                         : default_port(p, (size_t)(sep - p));
            if (!port || !nlen) {
                snprintf(err, errlen, "--cut: a host of a URI has no port and its scheme "
                                      "no default");
                return -1;
            }
            if (n == CHECK_UPSTREAMS_MAX) {
                snprintf(err, errlen, "--cut takes at most %d hosts", CHECK_UPSTREAMS_MAX);
                return -1;
            }
            if (!out && resolve(&r->up[n], name, nlen, port, err, errlen) != 0)
                return -1;
            if (out) {
                int w = snprintf(buf, sizeof buf, "%s127.0.0.1:%d", n && h != auth ? "," : "",
                                 ports[n]);
                EMIT(buf, (size_t)w);
            }
            n++;
            h = hend < aend ? hend + 1 : aend;
        }
        EMIT(aend, (size_t)(end - aend));
        p = end;
    }
    if (out)
        out[o] = '\0';
    return n;
too_long:
    snprintf(err, errlen, "--cut: rewritten URI too long");
    return -1;
#undef EMIT
}

static void pair_close(struct run *r, int i)
{
    close(r->pair[i].c);
    close(r->pair[i].s);
    r->pair[i] = r->pair[--r->npairs];
}

static uint64_t now_ns(void)
{
    return dlock_monotonic_ns();
}

static void accept_one(struct run *r, int slot, int u)
{
    int c = accept4(r->lfd[slot][u], NULL, NULL, SOCK_CLOEXEC), s;

    if (c < 0)
        return;
    if (now_ns() < r->p->ctl->cut_until[slot] || r->npairs == PAIRS_MAX) {
        close(c);
        return;
    }
    s = socket(r->up[u].addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&r->up[u].addr, r->up[u].addrlen) < 0) {
        if (s >= 0)
            close(s);
        close(c);
        return;
    }
    r->pair[r->npairs++] = (struct pair){c, s, slot};
}

static int move(int from, int to)
{
    static char buf[65536];
    ssize_t n = read(from, buf, sizeof buf);
    const char *b = buf;

    if (n <= 0)
        return -1;
    while (n > 0) {
        ssize_t w = send(to, b, (size_t)n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        b += w, n -= w;
    }
    return 0;
}

static void proxy_main(struct run *r)
{
    struct check_proxy *p = r->p;
    pid_t parent = getppid();
    static struct pollfd fds[CHECK_SLOTS_MAX * CHECK_UPSTREAMS_MAX + 2 * PAIRS_MAX];

    while (!p->ctl->stop && getppid() == parent) {
        int n = 0, nl = p->slots * p->nup, np = r->npairs;
        uint64_t now = now_ns();
        for (int s = 0; s < p->slots; s++)
            for (int u = 0; u < p->nup; u++)
                fds[n++] = (struct pollfd){.fd = r->lfd[s][u], .events = POLLIN};
        for (int i = 0; i < np; i++) {
            fds[n++] = (struct pollfd){.fd = r->pair[i].c, .events = POLLIN};
            fds[n++] = (struct pollfd){.fd = r->pair[i].s, .events = POLLIN};
        }
        if (poll(fds, (nfds_t)n, 20) < 0)
            continue;
        for (int i = np - 1; i >= 0; i--) {
            int drop = now < p->ctl->cut_until[r->pair[i].slot];
            if (drop)
                p->ctl->cuts[r->pair[i].slot]++;
            if (!drop && fds[nl + 2 * i].revents)
                drop = move(r->pair[i].c, r->pair[i].s) < 0;
            if (!drop && fds[nl + 2 * i + 1].revents)
                drop = move(r->pair[i].s, r->pair[i].c) < 0;
            if (drop)
                pair_close(r, i);
        }
        for (int s = 0; s < p->slots; s++)
            for (int u = 0; u < p->nup; u++)
                if (fds[s * p->nup + u].revents)
                    accept_one(r, s, u);
    }
    while (r->npairs)
        pair_close(r, 0);
}

int check_proxy_start(struct check_proxy *p, const char *uri, int slots, char *err,
                      size_t errlen)
{
    static struct run r; /* the proxy process's own copy after fork */
    int ports[CHECK_SLOTS_MAX][CHECK_UPSTREAMS_MAX];
    int nup;

    memset(p, 0, sizeof *p);
    memset(&r, 0, sizeof r);
    nup = rewrite(uri, &r, NULL, NULL, 0, err, errlen);
    if (nup < 0)
        return -1;
    if (nup == 0)
        return 1;
    p->slots = slots;
    p->nup = nup;
    r.p = p;
    for (int s = 0; s < slots; s++)
        for (int u = 0; u < nup; u++)
            r.lfd[s][u] = -1;
    p->ctl = mmap(NULL, sizeof *p->ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                  0);
    if (p->ctl == MAP_FAILED) {
        p->ctl = NULL;
        snprintf(err, errlen, "--cut: cannot map the proxy's control block: %s",
                 strerror(errno));
        goto fail;
    }
    memset((void *)p->ctl, 0, sizeof *p->ctl);
    for (int s = 0; s < slots; s++) {
        size_t len = strlen(uri) + (size_t)nup * 24 + 1;
        for (int u = 0; u < nup; u++) {
            r.lfd[s][u] = listener(&ports[s][u]);
            if (r.lfd[s][u] < 0) {
                snprintf(err, errlen, "--cut: cannot listen on loopback: %s", strerror(errno));
                goto fail;
            }
        }
        p->uri[s] = malloc(len);
        if (!p->uri[s] || rewrite(uri, &r, ports[s], p->uri[s], len, err, errlen) < 0) {
            if (!p->uri[s])
                snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    fflush(stdout);
    fflush(stderr);
    p->pid = fork();
    if (p->pid < 0) {
        snprintf(err, errlen, "--cut: cannot fork the proxy: %s", strerror(errno));
        goto fail;
    }
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_DFL);
        proxy_main(&r);
        _exit(0);
    }
    for (int s = 0; s < slots; s++)
        for (int u = 0; u < nup; u++)
            close(r.lfd[s][u]);
    return 0;
fail:
    for (int s = 0; s < slots; s++)
        for (int u = 0; u < nup; u++)
            if (r.lfd[s][u] >= 0)
                close(r.lfd[s][u]);
    p->pid = 0;
    check_proxy_stop(p);
    return -1;
}

void check_proxy_cut(struct check_proxy *p, int slot, unsigned ms)
{
    if (p->ctl && slot >= 0 && slot < p->slots)
        p->ctl->cut_until[slot] = now_ns() + (uint64_t)ms * 1000000u;
}

void check_proxy_stop(struct check_proxy *p)
{
    int st;

    if (p->pid > 0) {
        p->ctl->stop = 1;
        for (int i = 0; i < 100 && waitpid(p->pid, &st, WNOHANG) == 0; i++)
            nanosleep(&(struct timespec){0, 10000000}, NULL);
        if (waitpid(p->pid, &st, WNOHANG) == 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
        }
    }
    p->pid = 0;
    if (p->ctl)
        munmap((void *)p->ctl, sizeof *p->ctl);
    p->ctl = NULL;
    for (int s = 0; s < CHECK_SLOTS_MAX; s++) {
        free(p->uri[s]);
        p->uri[s] = NULL;
    }
}
