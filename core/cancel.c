/*
 * Cancel flags (dlock_cancel): an atomic flag and an eventfd that turns
 * readable when the flag is raised, so that a backend's wait, whatever it
 * blocks on (a socket, a libcurl multi handle, a condition variable fed by
 * a pipe), can watch it in the same poll. Raising it is one atomic exchange
 * and one write(2): async-signal-safe. The eventfd is never read, so it
 * stays readable for every wait that uses it.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/internal.h"

struct dlock_cancel {
    atomic_int fired;
    int fd;
};

int dlock_cancel_new(dlock_cancel **cancelp)
{
    if (!cancelp)
        return DLOCK_EINVAL;
    *cancelp = NULL;
    dlock_cancel *k = malloc(sizeof *k);
    if (!k)
        return DLOCK_ENOMEM;
    if ((k->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        free(k);
        return errno == ENOMEM ? DLOCK_ENOMEM : DLOCK_EIO;
    }
    atomic_init(&k->fired, 0);
    *cancelp = k;
    return 0;
}

void dlock_cancel_fire(dlock_cancel *k)
{
    if (!k || atomic_exchange(&k->fired, 1))
        return;
    uint64_t one = 1;
    int saved = errno; /* a signal handler must leave errno alone */
    /* Cannot fail short of a counter overflow, which one write never reaches. */
    while (write(k->fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
    errno = saved;
}

int dlock_cancel_fired(const dlock_cancel *k)
{
    return k && atomic_load(&k->fired);
}

void dlock_cancel_free(dlock_cancel *k)
{
    if (!k)
        return;
    close(k->fd);
    free(k);
}

int dlock_cancel_fd(const dlock_cancel *k)
{
    return k ? k->fd : -1;
}

int dlock_request_cancelled(const dlock_request *req)
{
    return req ? dlock_fd_cancelled(req->cancel_fd) : 0;
}

int dlock_cancelled(dlock_client *c)
{
    return dlock_seterr(c, DLOCK_ECANCELED, "the wait was cancelled");
}
