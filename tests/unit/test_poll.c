/* core/poll.c: the one cancellable wait every backend blocks in. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/internal.h"
#include "tests/tap.h"

#define MS 1000000ull

static void on_alarm(int sig)
{
    (void)sig;
}

static void signal_soon(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: ppoll sees EINTR */
    sigaction(SIGALRM, &sa, NULL);
    ualarm(50000, 0);
}

int main(void)
{
    int fds[2];
    ok(pipe(fds) == 0, "a pipe");
    dlock_cancel *k = NULL;
    ok(dlock_cancel_new(&k) == 0, "a cancel flag");
    int cfd = dlock_cancel_fd(k);
    struct pollfd p = {.fd = fds[0], .events = POLLIN};

    uint64_t t0 = dlock_monotonic_ns();
    int r = dlock_poll_until(&p, 1, cfd, t0 + 100 * MS, 0);
    uint64_t took = dlock_monotonic_ns() - t0;
    is_int(r, 0, "nothing ready: the deadline passes (0)");
    ok(took >= 95 * MS && took < 2000 * MS, "it waited about 100 ms (%llu ms)",
       (unsigned long long)(took / MS));

    ok(write(fds[1], "x", 1) == 1, "data on the pipe");
    r = dlock_poll_until(&p, 1, cfd, DLOCK_POLL_FOREVER, 0);
    is_int(r, DLOCK_POLL_READY, "a ready descriptor: READY");
    ok(p.revents & POLLIN, "its revents are set");

    /* Past the deadline, the descriptors are still looked at once. */
    r = dlock_poll_until(&p, 1, cfd, dlock_monotonic_ns() - 1, 0);
    is_int(r, DLOCK_POLL_READY, "a deadline already past still sees what arrived");

    dlock_cancel_fire(k);
    r = dlock_poll_until(&p, 1, cfd, DLOCK_POLL_FOREVER, 0);
    is_int(r, DLOCK_POLL_READY | DLOCK_POLL_CANCEL, "data and cancel together: both bits");
    char c;
    ok(read(fds[0], &c, 1) == 1, "the data read");
    r = dlock_poll_until(&p, 1, cfd, DLOCK_POLL_FOREVER, 0);
    is_int(r, DLOCK_POLL_CANCEL, "cancel alone: CANCEL, revents clear");
    is_int(p.revents, 0, "no event on the pipe");
    ok(dlock_fd_cancelled(cfd), "dlock_fd_cancelled sees the raised flag");
    ok(!dlock_fd_cancelled(-1), "no flag: never cancelled");
    is_int(dlock_pause_until(DLOCK_POLL_FOREVER, cfd), DLOCK_ECANCELED,
           "a pause ends at once with the flag raised");

    /* A signal: DLOCK_POLL_INTR ends the wait, otherwise it goes on. */
    signal_soon();
    t0 = dlock_monotonic_ns();
    r = dlock_poll_until(&p, 1, -1, t0 + 5000 * MS, DLOCK_POLL_INTR);
    is_int(r, DLOCK_POLL_SIGNAL, "a signal with DLOCK_POLL_INTR: SIGNAL");
    ok(dlock_monotonic_ns() - t0 < 4000 * MS, "before the deadline");
    signal_soon();
    t0 = dlock_monotonic_ns();
    r = dlock_poll_until(&p, 1, -1, t0 + 300 * MS, 0);
    took = dlock_monotonic_ns() - t0;
    is_int(r, 0, "a signal without it: the wait goes on to the deadline");
    ok(took >= 295 * MS, "the whole 300 ms (%llu ms)", (unsigned long long)(took / MS));
    is_int(dlock_pause_until(dlock_monotonic_ns() + 10 * MS, -1), 0,
           "a pause without a flag ends at its instant");

    /* Linux may end a poll late by 0.1 % of its timeout (its timer slack:
     * 4 ms for 4 s, and it usually does on a quiet CPU): the wait looks
     * again instead, and ends within a fraction of a millisecond of its
     * deadline, never before it. */
    t0 = dlock_monotonic_ns();
    r = dlock_poll_until(&p, 1, -1, t0 + 4000 * MS, 0);
    took = dlock_monotonic_ns() - t0;
    is_int(r, 0, "a 4 s wait: the deadline passes");
    ok(took >= 4000 * MS && took < 4002 * MS,
       "it ends within 2 ms past its deadline, not the kernel's 4 ms of slack (%.3f ms past)",
       ((double)took - 4000.0 * MS) / 1e6);

    struct pollfd many[DLOCK_POLL_FDS_MAX + 1];
    errno = 0;
    is_int(dlock_poll_until(many, DLOCK_POLL_FDS_MAX + 1, -1, 0, 0), DLOCK_POLL_ERROR,
           "too many descriptors: ERROR");
    is_int(errno, EINVAL, "with EINVAL");

    dlock_cancel_free(k);
    close(fds[0]);
    close(fds[1]);
    return done_testing();
}
