/*
 * The supervisor of `dlock run` (tools/supervise.c): the command in a
 * process group of its own, signals passed on to it, its job-control stops
 * followed on a terminal, orphaned descendants reaped (a child subreaper),
 * and the whole group stopped when the lock is lost.
 */
#ifndef DLOCK_TOOLS_SUPERVISE_H
#define DLOCK_TOOLS_SUPERVISE_H

#include <stdint.h>

#include "dlock.h"

/* The command as it runs under the lock. */
struct supervised {
    char **argv;        /* the command, NULL-terminated; argv[0] found in PATH */
    char **envp;        /* its environment */
    dlock_lock *lock;   /* held with .keep: its loss stops the command's group */
    int wake_fd;        /* readable once the keeper reported the loss */
    uint64_t grace_ns;  /* after a loss, SIGKILL this long after SIGTERM
                           (0: SIGKILL at once; UINT64_MAX: never) */
    double grace_s;     /* the same, for messages */
    const char *name;   /* the lock's names, printable, for messages */
    const char *what;   /* "lock" (NULL too) or "leadership of", for messages */
    const char *cmd;    /* the command's name, printable, for messages */
    int lost;           /* the loss was reported and the group told to stop */
    /* The supervisor's own. */
    int tty;            /* dlock's terminal (job control followed), or -1 */
    uint64_t kill_at;   /* SIGKILL the group then (0: none due; UINT64_MAX: never) */
    uint64_t give_up_at; /* after SIGKILL: stop waiting for the group then */
};

/* Saves the signal state dlock was started with, before anything changes
 * it (the library may start threads): the command gets it back. */
void supervise_save_signals(void);

/* Whether sig was ignored when dlock started (nohup): it stays ignored. */
int supervise_ignored_at_start(int sig);

/* Runs the command under the held lock until it (and, after a loss, its
 * whole group) is gone; returns dlock's exit status: the command's, 128+N
 * if signal N killed it, 126/127 when it cannot be run, 70 (EX_SOFTWARE)
 * when dlock cannot run it. */
int supervise_run(struct supervised *job);

#endif
