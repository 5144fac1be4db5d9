/*
 * Threads the library starts, and the condition variables they wait on.
 *
 * A thread of dlock's takes no signal: it starts with every signal
 * blocked, so that a signal meant for the application (SIGINT, SIGTERM,
 * its own) reaches the application's threads, where an interrupted wait
 * is theirs to see, and never a helper's. Timed waits count on
 * CLOCK_MONOTONIC, as every deadline in dlock does.
 */
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "config.h"
#include "core/internal.h"

int dlock_thread_start(pthread_t *th, int detached, void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_t local;
    int r = pthread_attr_init(&attr);
    if (r != 0)
        return r;
    if (detached)
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(th ? th : &local, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return r;
}

void dlock_cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}
