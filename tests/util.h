/* Small helpers shared by the test programs. */
#ifndef DLOCK_TESTS_UTIL_H
#define DLOCK_TESTS_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/uri.h"
#include "dlock.h"

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* A loopback port with nothing listening (bound, then closed). */
static inline int closed_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    bind(s, (struct sockaddr *)&a, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &alen);
    close(s);
    return ntohs(a.sin_port);
}

/* Options waiting as told, up to wait_ms from now, with a lease of ttl_ms
 * (0: the default). */
static inline dlock_acquire_opts wait_opts(dlock_wait wait, uint64_t wait_ms, uint32_t ttl_ms)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = wait;
    o.deadline_ns = dlock_monotonic_ns() + wait_ms * 1000000u;
    if (ttl_ms)
        o.ttl_ms = ttl_ms;
    return o;
}

/* The value of an environment variable the test cannot run without: a
 * missing one ends the run as a failure (TAP "Bail out!"), never a skip. */
static inline const char *need_env(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        printf("Bail out! %s is not set: start the stores with scripts/stores/start.sh\n", name);
        exit(1);
    }
    return v;
}

/* uri with its password masked, for test output (credentials are never
 * printed, not even the test stores'). */
static inline const char *shown_uri(const char *uri, char *buf, size_t len)
{
    dlock_uri *u = NULL;
    char err[256];
    if (dlock_uri_parse(uri, &u, err, sizeof err) != 0)
        snprintf(buf, len, "(malformed URI)");
    else
        snprintf(buf, len, "%s", dlock_uri_redacted(u));
    dlock_uri_free(u);
    return buf;
}

/* A client for uri, or the end of the run. */
static inline dlock_client *open_ok(const char *uri)
{
    dlock_client *c = NULL;
    char shown[1024];
    if (dlock_client_open(uri, &c) != 0) {
        printf("Bail out! cannot open %s: %s\n", shown_uri(uri, shown, sizeof shown),
               dlock_errmsg(c));
        exit(1);
    }
    return c;
}

#endif
