/*
 * SIGPIPE without touching the application's disposition: block the signal
 * in this thread around a write, and consume one that the write raised.
 * The same technique libpq uses on platforms without MSG_NOSIGNAL.
 */
#include <signal.h>
#include <time.h>

#include "config.h"
#include "core/internal.h"

void dlock_sigpipe_block(dlock_sigpipe *st)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    st->was_blocked = sigismember(&old, SIGPIPE) == 1;
    /* A SIGPIPE already pending for the thread (or the process) is the
     * application's: leave it be. */
    sigpending(&pending);
    st->was_pending = sigismember(&pending, SIGPIPE) == 1;
}

void dlock_sigpipe_restore(const dlock_sigpipe *st)
{
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    if (!st->was_pending) {
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE) == 1) {
            static const struct timespec zero = {0, 0};
            sigtimedwait(&pipe_set, NULL, &zero); /* ours: swallow it */
        }
    }
    if (!st->was_blocked)
        pthread_sigmask(SIG_UNBLOCK, &pipe_set, NULL);
}
