/*
 * The supervisor of `dlock run` (tools/supervise.h): runs the command in a
 * process group of its own, passes signals on to the group, follows its
 * job-control stops on a terminal, reaps orphaned descendants as a child
 * subreaper, and when the lock is lost stops the whole group (SIGTERM,
 * SIGKILL after the grace period) and waits for it to be gone. No store
 * call runs here: the keeper's loss callback only makes wake_fd readable.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/supervise.h"

/* How long to wait for a SIGKILLed group to be gone before exiting anyway. */
#define REAP_AFTER_KILL_NS 1000000000ull
/* How often to look whether a stopping group is empty (its members are not
 * all dlock's children, so SIGCHLD alone cannot tell). */
#define GROUP_POLL_NS 20000000ull

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

/* Signal state dlock was started with: the command gets exactly this back. */
static struct sigaction startup_action[NSIG];
static sigset_t startup_mask;

/* The command's process group (its pid), read by the forwarding handler;
 * only changed while the handler is blocked. */
static volatile sig_atomic_t child_pid;

void supervise_save_signals(void)
{
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, NULL, &startup_action[sig]);
    sigprocmask(SIG_SETMASK, NULL, &startup_mask);
}

/* Errors ignored: SIGKILL, SIGSTOP and libc's own signals cannot be set. */
static void restore_signal_state(void)
{
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &startup_action[sig], NULL);
    sigprocmask(SIG_SETMASK, &startup_mask, NULL);
}

int supervise_ignored_at_start(int sig)
{
    return startup_action[sig].sa_handler == SIG_IGN;
}

/* Signals sent to dlock go to the command's whole group: dlock is not in it. */
static void forward_signal(int sig)
{
    int saved = errno;

    if (child_pid > 0)
        kill(-child_pid, sig);
    errno = saved;
}

/* A handler, not SIG_DFL, so that SIGCHLD (and SIGCONT) interrupt the wait
 * in ppoll(). */
static void note_signal(int sig)
{
    (void)sig;
}

/*
 * Blocks the forwarded signals and SIGCHLD (they are taken only inside
 * ppoll(), so child_pid never changes under a handler) and installs the
 * handlers. With follow_stops, SIGCHLD reports the command's stops too and
 * SIGCONT wakes the wait (dlock may have been brought to the foreground).
 * SIGTTOU stays blocked: dlock may write its messages and move the
 * terminal's foreground while the command has it. *waitmask is the mask to
 * wait with. Signals dlock was started ignoring (nohup) stay ignored.
 */
static void install_handlers(int follow_stops, sigset_t *waitmask)
{
    struct sigaction fwd = {.sa_handler = forward_signal};
    struct sigaction chld = {.sa_handler = note_signal,
                             .sa_flags = follow_stops ? 0 : SA_NOCLDSTOP};
    struct sigaction cont = {.sa_handler = note_signal};
    sigset_t block;

    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGTTOU);
    if (follow_stops)
        sigaddset(&block, SIGCONT);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaddset(&block, forwarded[i]);
    sigprocmask(SIG_BLOCK, &block, NULL);
    sigemptyset(&fwd.sa_mask);
    sigemptyset(&chld.sa_mask);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        if (startup_action[forwarded[i]].sa_handler != SIG_IGN)
            sigaction(forwarded[i], &fwd, NULL);
    sigemptyset(&cont.sa_mask);
    sigaction(SIGCHLD, &chld, NULL);
    if (follow_stops)
        sigaction(SIGCONT, &cont, NULL);
    sigprocmask(SIG_SETMASK, NULL, waitmask);
    sigdelset(waitmask, SIGCHLD);
    sigdelset(waitmask, SIGCONT);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        if (!sigismember(&startup_mask, forwarded[i]))
            sigdelset(waitmask, forwarded[i]);
}

/* Why the child could not run the command, sent over a close-on-exec pipe
 * (EOF: it ran). */
enum { STAGE_PGRP = 1, STAGE_PDEATHSIG, STAGE_EXEC };
struct child_error {
    int stage;
    int err;
};

/* dlock's controlling terminal if it is on stdin: then dlock follows the
 * command's job-control stops and hands it the terminal's foreground. */
static int find_tty(void)
{
    return isatty(STDIN_FILENO) && tcgetsid(STDIN_FILENO) == getsid(0) ? STDIN_FILENO : -1;
}

/* In the child: only async-signal-safe calls, the library has threads. */
static _Noreturn void exec_command(const struct supervised *job, pid_t parent, int handover,
                                   int errfd)
{
    struct child_error ce = {STAGE_PGRP, 0};
    ssize_t n;

    /* A group of its own, so that a loss stops its children too; the
     * terminal's foreground if dlock had it (SIGTTOU is still blocked).
     * dlock does both too: whichever runs first wins the race. */
    if (setpgid(0, 0) != 0)
        goto fail;
    if (handover)
        tcsetpgrp(job->tty, getpid());
    restore_signal_state();
    /* Once dlock is gone so is the lock: the command must not outlive it
     * unprotected, nor start if dlock died already. */
    ce.stage = STAGE_PDEATHSIG;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        goto fail;
    if (getppid() != parent)
        _exit(EX_SOFTWARE);
    ce.stage = STAGE_EXEC;
    execvpe(job->argv[0], job->argv, job->envp);
fail:
    ce.err = errno;
    n = write(errfd, &ce, sizeof ce);
    (void)n;
    _exit(ce.stage != STAGE_EXEC ? EX_SOFTWARE : ce.err == ENOENT ? 127 : 126);
}

static void report_exec_error(const struct supervised *job, int fd)
{
    struct child_error ce;
    ssize_t n;

    do
        n = read(fd, &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof ce)
        return;
    if (ce.stage == STAGE_EXEC)
        dlock_say("cannot run '%s': %s", job->cmd, strerror(ce.err));
    else if (ce.stage == STAGE_PGRP)
        dlock_say("cannot give '%s' a process group of its own: %s", job->cmd, strerror(ce.err));
    else
        dlock_say("cannot tie '%s' to dlock's life (PR_SET_PDEATHSIG): %s", job->cmd,
            strerror(ce.err));
}

/* Gives the terminal's foreground to group to if group from has it. */
static void move_foreground(int tty, pid_t from, pid_t to)
{
    if (tty >= 0 && tcgetpgrp(tty) == from)
        tcsetpgrp(tty, to);
}

/*
 * The command stopped with signal sig. If it only wanted the terminal
 * (SIGTTIN, SIGTTOU) and dlock has the foreground to give, it gets it and
 * goes on. Otherwise (the suspend character reached its group, or it reads
 * the terminal from the background) stop as its job would have: take the
 * terminal back and stop dlock's own group, so the shell sees the job
 * stopped. Once continued (fg, bg), hand the terminal on if dlock is in the
 * foreground again and continue the command; not if the lease ran out
 * meanwhile (nothing renews it while dlock is stopped): the loss, known at
 * once, stops the group instead.
 */
static void follow_stop(struct supervised *job, pid_t pid, int sig)
{
    pid_t self = getpgrp();

    move_foreground(job->tty, self, pid);
    if ((sig == SIGTTIN || sig == SIGTTOU) && tcgetpgrp(job->tty) == pid) {
        kill(-pid, SIGCONT);
        return;
    }
    move_foreground(job->tty, pid, self);
    if (startup_action[SIGTSTP].sa_handler == SIG_DFL && !sigismember(&startup_mask, SIGTSTP))
        kill(0, SIGTSTP); /* returns once continued */
    else
        kill(getpid(), SIGSTOP);
    move_foreground(job->tty, self, pid);
    if (!job->lost && dlock_lock_expires_ns(job->lock) > dlock_monotonic_ns())
        kill(-pid, SIGCONT);
}

/* The lock is gone: nothing the command's group does is protected any
 * more, so the whole group is stopped: SIGTERM (and SIGCONT, so that
 * stopped members act on it), SIGKILL after the grace period. */
static void stop_group(struct supervised *job, pid_t pg)
{
    const char *why = dlock_lock_lost_detail(job->lock);

    job->lost = 1;
    if (!*why)
        why = dlock_strerror(dlock_lock_lost(job->lock));
    if (job->grace_ns == 0) {
        dlock_say("%s '%s' was lost while '%s' ran: %s; killing its process group",
            job->what ? job->what : "lock", job->name, job->cmd, why);
        kill(-pg, SIGKILL);
        job->give_up_at = dlock_after_ns(REAP_AFTER_KILL_NS);
        return;
    }
    dlock_say("%s '%s' was lost while '%s' ran: %s; stopping its process group "
        "(SIGTERM, SIGKILL after %g s)", job->what ? job->what : "lock", job->name, job->cmd, why,
        job->grace_s);
    kill(-pg, SIGTERM);
    kill(-pg, SIGCONT);
    job->kill_at = dlock_after_ns(job->grace_ns);
}

/* Reaps what has ended: the command (*statusp, *exited), and descendants
 * orphaned into dlock (a child subreaper). Returns the signal that stopped
 * the command, if it stopped (reported only when following stops), else 0. */
static int reap(const struct supervised *job, pid_t pid, int *statusp, int *exited)
{
    int stopped = 0, status;
    pid_t r;

    while ((r = waitpid(-1, &status, WNOHANG | (job->tty >= 0 ? WUNTRACED : 0))) > 0) {
        if (r != pid)
            continue;
        if (WIFSTOPPED(status)) {
            stopped = WSTOPSIG(status);
        } else {
            *statusp = status;
            *exited = 1;
        }
    }
    return *exited ? 0 : stopped;
}

/*
 * Waits for the command, passing signals on and following its stops; if the
 * lock is lost, stops its whole group and waits for the group to be gone
 * (or for the grace period, then SIGKILL). Returns its wait status, or -1.
 */
static int wait_command(struct supervised *job, pid_t pid, const sigset_t *waitmask)
{
    struct pollfd pfd = {.fd = job->wake_fd, .events = POLLIN};
    int status = 0, exited = 0;

    for (;;) {
        uint64_t now, until;
        struct timespec ts;
        int stopsig = reap(job, pid, &status, &exited);

        if (stopsig) {
            follow_stop(job, pid, stopsig);
            continue;
        }
        /* Brought to the foreground (fg after a start in the background):
         * the terminal is the command's. */
        if (!exited)
            move_foreground(job->tty, getpgrp(), pid);
        if (!job->lost && dlock_lock_lost(job->lock))
            stop_group(job, pid);
        /* Without a loss the command's end is the job's end; after one,
         * the group's (its pgid stays valid while any member lives). */
        if (exited && (!job->lost || kill(-pid, 0) != 0))
            break;
        now = dlock_monotonic_ns();
        if (job->kill_at && job->kill_at != UINT64_MAX && now >= job->kill_at) {
            dlock_say("'%s' and its process group did not stop within %g s of SIGTERM: "
                "sending SIGKILL", job->cmd, job->grace_s);
            kill(-pid, SIGKILL);
            job->kill_at = 0;
            job->give_up_at = dlock_after_ns(REAP_AFTER_KILL_NS);
        }
        if (exited && job->give_up_at && now >= job->give_up_at)
            break; /* killed; stuck in the kernel at worst */
        until = job->kill_at ? job->kill_at : UINT64_MAX;
        if (exited || job->give_up_at) {
            uint64_t poll_at = now + GROUP_POLL_NS;

            if (poll_at < until)
                until = poll_at;
        }
        if (until != UINT64_MAX) {
            until = until > now ? until - now : 0;
            ts.tv_sec = (time_t)(until / 1000000000u);
            ts.tv_nsec = (long)(until % 1000000000u);
        }
        /* Signals are taken only here: SIGCHLD ends the wait with EINTR.
         * After a loss the wake-up pipe has served (and stays readable). */
        if (ppoll(&pfd, job->lost ? 0 : 1, until != UINT64_MAX ? &ts : NULL, waitmask) < 0 &&
            errno != EINTR) {
            dlock_say("cannot wait for '%s': %s", job->cmd, strerror(errno));
            return -1;
        }
    }
    return status;
}

int supervise_run(struct supervised *job)
{
    pid_t parent = getpid(), pid;
    sigset_t waitmask;
    int status, handover, errpipe[2];

    if (pipe2(errpipe, O_CLOEXEC) != 0) {
        dlock_say("cannot create a pipe: %s", strerror(errno));
        return EX_SOFTWARE;
    }
    /* Orphaned descendants come to dlock, which reaps them: a stopping
     * group is then known to be gone once its last member has ended. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    job->tty = find_tty();
    install_handlers(job->tty >= 0, &waitmask);
    handover = job->tty >= 0 && tcgetpgrp(job->tty) == getpgrp();
    fflush(NULL);
    pid = fork();
    if (pid == 0)
        exec_command(job, parent, handover, errpipe[1]);
    close(errpipe[1]);
    if (pid < 0) {
        dlock_say("cannot fork: %s", strerror(errno));
        close(errpipe[0]);
        return EX_SOFTWARE;
    }
    /* EACCES once it has run exec: it did this itself. */
    setpgid(pid, pid);
    child_pid = pid;
    if (handover)
        move_foreground(job->tty, getpgrp(), pid);
    report_exec_error(job, errpipe[0]);
    close(errpipe[0]);
    status = wait_command(job, pid, &waitmask);
    move_foreground(job->tty, pid, getpgrp());
    child_pid = 0;
    if (status < 0)
        return EX_SOFTWARE;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
