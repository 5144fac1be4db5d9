/*
 * The one cancellable wait every backend blocks in: a few descriptors, the
 * cancel flag's eventfd, and an absolute CLOCK_MONOTONIC deadline. Backends
 * never write their own poll loop (tests/layering checks that); what they
 * differ in (which reply wins over a cancel that came with it, whether a
 * signal ends the wait) is the caller's reading of the result.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"

/* What makes a cancel: the flag raised, or its descriptor unusable (a
 * wait that cannot see the flag any more must not go on). */
#define CANCEL_EVENTS (POLLIN | POLLERR | POLLHUP | POLLNVAL)

/* Linux may end a poll late by up to 0.1 % of its timeout (0.5 % for a
 * niced process; at most 100 ms: the kernel's timer slack for poll), so a
 * 3 s wait could return 3 ms past its deadline. A long wait is asked to
 * end that much early and then looks again: it returns within about the
 * process's own timer slack (50 µs) of its deadline. */
#define SLACK_DIV 200u
#define SLACK_MAX_NS 100000000ull

int dlock_poll_until(struct pollfd *fds, size_t n, int cancel_fd, uint64_t deadline_ns,
                   unsigned int flags)
{
    struct pollfd p[DLOCK_POLL_FDS_MAX + 1];
    if (n > DLOCK_POLL_FDS_MAX) {
        errno = EINVAL;
        return DLOCK_POLL_ERROR;
    }
    if (n)
        memcpy(p, fds, n * sizeof *p);
    /* Last, and ignored by poll when negative. */
    p[n] = (struct pollfd){.fd = cancel_fd, .events = POLLIN};
    for (;;) {
        struct timespec ts, *tsp = NULL;
        uint64_t early = 0;
        if (deadline_ns != DLOCK_POLL_FOREVER) {
            /* Past the deadline, still one look at what already arrived. */
            uint64_t now = dlock_monotonic_ns(), left = deadline_ns > now ? deadline_ns - now : 0;
            early = left / SLACK_DIV < SLACK_MAX_NS ? left / SLACK_DIV : SLACK_MAX_NS;
            dlock_ns_to_timespec(left - early, &ts);
            tsp = &ts;
        }
        int r = ppoll(p, n + 1, tsp, NULL);
        if (r < 0 && errno == EINTR) {
            if (flags & DLOCK_POLL_INTR)
                return DLOCK_POLL_SIGNAL;
            continue;
        }
        if (r < 0)
            return DLOCK_POLL_ERROR;
        if (r == 0 && early)
            continue; /* woken early on purpose: the rest of the wait */
        int out = 0;
        for (size_t i = 0; i < n; i++) {
            fds[i].revents = p[i].revents;
            if (p[i].revents)
                out |= DLOCK_POLL_READY;
        }
        if (cancel_fd >= 0 && (p[n].revents & CANCEL_EVENTS))
            out |= DLOCK_POLL_CANCEL;
        return out; /* 0: the deadline passed */
    }
}

int dlock_pause_until(uint64_t until_ns, int cancel_fd)
{
    int r = dlock_poll_until(NULL, 0, cancel_fd, until_ns, DLOCK_POLL_INTR);
    if (r == DLOCK_POLL_SIGNAL)
        return DLOCK_EINTR;
    return r > 0 && (r & DLOCK_POLL_CANCEL) ? DLOCK_ECANCELED : 0;
}

int dlock_fd_cancelled(int cancel_fd)
{
    if (cancel_fd < 0)
        return 0;
    struct pollfd p = {.fd = cancel_fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0 && (p.revents & CANCEL_EVENTS);
}
