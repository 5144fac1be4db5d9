/*
 * dlock(1): run a command while holding a distributed lock, in the spirit of
 * flock(1); `dlock bench` is dispatched to bench/.
 *
 * Exit statuses follow sysexits(3) for dlock's own failures and the shell's
 * conventions for the command's (its status, 128+N on signal N, 126/127 when
 * it cannot be run), so that scripts can tell "lock busy" (75) from "the job
 * failed".
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"
#include "dlock_backend.h" /* DLOCK_CAP_* for dlock_client_caps() */
#ifdef DLOCK_HAVE_BENCH
#include "bench/bench.h"
#endif

/* parse_run_args() result meaning "carry on" rather than "exit with this". */
#define PROCEED (-1)
/* Longest name or command shown in a message; the rest becomes "...". */
#define SHOWN_MAX 200

struct run_args {
    const char *uri;  /* NULL: the default store */
    const char *name;
    char **command;   /* NULL-terminated argv of the command */
    dlock_acquire_opts acq;
    double wait_s;    /* the -w value, for the timeout message */
};

/* What run_command() learnt about the lock while the command ran. */
struct job {
    const struct run_args *ra;
    dlock_lock *lock;
    int renew_failing; /* a renew failure was reported; do not repeat it */
    int lost;          /* the loss was reported and the command told to stop */
    uint64_t lease_end; /* when the lease runs out unless renewed */
    uint64_t kill_at;   /* SIGKILL the command then (0: not stopping it) */
    int no_checks;      /* the backend has no renew: nothing to check */
};

/* After a lost lock the command gets SIGTERM, and SIGKILL this much later. */
#define STOP_GRACE_NS (5 * 1000000000ull)

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

/* Signal state dlock was started with: the command gets exactly this back. */
static struct sigaction startup_action[NSIG];
static sigset_t startup_mask;

/* Read by the forwarding handler; only changed while the handler is blocked. */
static volatile sig_atomic_t child_pid;

/* Printable copies, so that every message stays on one line. */
static char shown_name[SHOWN_MAX + 4], shown_cmd[SHOWN_MAX + 4];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
    va_list ap;

    fputs("dlock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void print_usage(FILE *f)
{
    fputs("Usage:\n"
          "  dlock run [-w SECONDS | -n] [--ttl MS] [URI] NAME -- COMMAND [ARGS...]\n"
          "  dlock bench [OPTIONS...] URI [URI...]    (see 'dlock bench --help')\n"
          "  dlock help | --help | --version\n"
          "\n"
          "Run COMMAND while holding the lock NAME of the store named by URI.\n"
          "\n"
          "Options of run:\n"
          "  -w, --wait SECONDS  give up after SECONDS (fractions allowed)\n"
          "  -n, --nonblock      give up at once if the lock is held\n"
          "      --ttl MS        lease on stores with leases (default 30000),\n"
          "                      renewed while COMMAND runs\n"
          "  -h, --help          show this help\n"
          "\n"
          "URI defaults to $DLOCK_URI, else file://$XDG_RUNTIME_DIR/dlock,\n"
          "else file:///tmp/dlock-$UID. COMMAND gets DLOCK_TOKEN and DLOCK_NAME.\n"
          "\n"
          "Exit status: COMMAND's (128+N if killed by signal N); 64 usage or URI\n"
          "error; 69 store unreachable; 70 other error or lock lost; 75 lock not\n"
          "acquired; 126 COMMAND not executable; 127 COMMAND not found.\n",
          f);
}

/* Help and version go to stdout: a full disk or closed pipe is an error. */
static int finish_stdout(void)
{
    return fclose(stdout) == 0 ? EX_OK : EX_SOFTWARE;
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fputs("dlock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see 'dlock run --help')\n", stderr);
    return EX_USAGE;
}

static void make_printable(char *dst, const char *src)
{
    size_t i;

    for (i = 0; src[i] && i < SHOWN_MAX; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    strcpy(dst + i, src[i] ? "..." : "");
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v) || v < 0)
        return -1;
    *out = v;
    return 0;
}

static int parse_ttl(const char *s, uint32_t *out)
{
    char *end;
    unsigned long long v;

    /* strtoull() would quietly accept and negate "-1". */
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE || v < 1 || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* An absolute deadline, or waiting forever when S seconds overflow the clock. */
static void set_deadline(dlock_acquire_opts *acq, double seconds)
{
    uint64_t now = dlock_monotonic_ns();
    double ns = seconds * 1e9;

    if (ns >= (double)(UINT64_MAX - now)) {
        acq->wait = DLOCK_WAIT_FOREVER;
        return;
    }
    acq->wait = DLOCK_WAIT_DEADLINE;
    acq->deadline_ns = now + (uint64_t)ns;
}

/* Names the offending option, whether short, clustered or long. */
static const char *bad_option(char **argv, char *buf)
{
    const char *arg = argv[optind - 1];

    if (strncmp(arg, "--", 2) == 0 || optopt == 0)
        return arg;
    snprintf(buf, 3, "-%c", optopt);
    return buf;
}

static int parse_run_options(int argc, char **argv, struct run_args *ra)
{
    static const struct option longopts[] = {
        {"wait", required_argument, NULL, 'w'},
        {"nonblock", no_argument, NULL, 'n'},
        {"ttl", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int have_wait = 0, nonblock = 0, c;
    char buf[3];

    opterr = 0;
    optind = 1;
    /* "+": options end at the lock name, so COMMAND's own are never ours. */
    while ((c = getopt_long(argc, argv, "+:w:nh", longopts, NULL)) != -1) {
        switch (c) {
        case 'w':
            if (parse_seconds(optarg, &ra->wait_s) != 0)
                return usage_error("invalid wait '%s': expected seconds >= 0",
                                   optarg);
            have_wait = 1;
            break;
        case 'n':
            nonblock = 1;
            break;
        case 'T':
            if (parse_ttl(optarg, &ra->acq.ttl_ms) != 0)
                return usage_error("invalid TTL '%s': expected milliseconds "
                                   "1..%" PRIu32, optarg, UINT32_MAX);
            break;
        case 'h':
            print_usage(stdout);
            return finish_stdout();
        case ':':
            return usage_error("option '%s' needs an argument", argv[optind - 1]);
        default:
            return usage_error("invalid option '%s'", bad_option(argv, buf));
        }
    }
    if (have_wait && nonblock)
        return usage_error("-w and -n cannot be used together");
    if (nonblock)
        ra->acq.wait = DLOCK_WAIT_TRY;
    else if (have_wait)
        set_deadline(&ra->acq, ra->wait_s);
    return PROCEED;
}

/* argv[0] is "run". */
static int parse_run_args(int argc, char **argv, struct run_args *ra)
{
    int status, sep, npos;

    memset(ra, 0, sizeof *ra);
    dlock_acquire_opts_init(&ra->acq);
    status = parse_run_options(argc, argv, ra);
    if (status != PROCEED)
        return status;
    for (sep = optind; sep < argc && strcmp(argv[sep], "--") != 0; sep++)
        continue;
    if (sep == argc)
        return usage_error("missing '--' before COMMAND");
    npos = sep - optind;
    if (npos == 0)
        return usage_error("missing lock NAME before '--'");
    if (npos > 2)
        return usage_error("too many arguments before '--': expected [URI] NAME");
    if (sep + 1 == argc)
        return usage_error("missing COMMAND after '--'");
    ra->uri = npos == 2 ? argv[optind] : NULL;
    ra->name = argv[sep - 1];
    ra->command = argv + sep + 1;
    make_printable(shown_name, ra->name);
    make_printable(shown_cmd, ra->command[0]);
    return PROCEED;
}

/* "file://" + path, percent-encoded so that '%', '?' or '#' in it survive. */
static int file_uri(char *buf, size_t len, const char *path)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen("file://");

    memcpy(buf, "file://", n);
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (n + 4 > len)
            return -1;
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
            (*p >= '0' && *p <= '9') || strchr("-._~/", *p)) {
            buf[n++] = (char)*p;
        } else {
            buf[n++] = '%';
            buf[n++] = hex[*p >> 4];
            buf[n++] = hex[*p & 15];
        }
    }
    buf[n] = '\0';
    return 0;
}

static const char *default_uri(char *buf, size_t len)
{
    const char *env = getenv("DLOCK_URI");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    char dir[DLOCK_URI_MAX];
    struct stat st;
    int n;

    if (env && *env)
        return env;
    /* A relative or stale XDG_RUNTIME_DIR must not scatter locks around. */
    if (xdg && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode))
        n = snprintf(dir, sizeof dir, "%s/dlock", xdg);
    else
        n = snprintf(dir, sizeof dir, "/tmp/dlock-%lu", (unsigned long)getuid());
    if (n < 0 || (size_t)n >= sizeof dir || file_uri(buf, len, dir) != 0)
        return NULL;
    return buf;
}

static int exit_status_for(int err)
{
    switch (err) {
    case DLOCK_EBUSY:
    case DLOCK_ETIMEDOUT:
        return EX_TEMPFAIL;
    case DLOCK_EBADURI:
    case DLOCK_ESCHEME:
    case DLOCK_ENOBACKEND:
    case DLOCK_EINVAL:
        return EX_USAGE;
    case DLOCK_ECONNECT:
    case DLOCK_EAUTH:
        return EX_UNAVAILABLE;
    default:
        return EX_SOFTWARE;
    }
}

/* The client's detail if it has one (never a password), else the generic text. */
static const char *detail(const dlock_client *client, int err)
{
    const char *msg = dlock_errmsg(client);

    return msg && *msg ? msg : dlock_strerror(err);
}

static int open_client(const char *uri, dlock_client **clientp)
{
    int err = dlock_client_open(uri, clientp);

    if (err == 0)
        return PROCEED;
    say("cannot open lock store: %s", detail(*clientp, err));
    return exit_status_for(err);
}

static int acquire(const struct run_args *ra, dlock_client *client,
                   dlock_lock **lockp)
{
    int err;

    /* No handler runs while waiting, so an interruption is spurious (a
     * stop and continue); the deadline is absolute, so retrying is exact. */
    do
        err = dlock_acquire(client, ra->name, &ra->acq, lockp);
    while (err == DLOCK_EINTR);
    if (err == 0)
        return PROCEED;
    if (err == DLOCK_EBUSY)
        say("lock '%s' is held elsewhere", shown_name);
    else if (err == DLOCK_ETIMEDOUT)
        say("timed out after %g s waiting for lock '%s'", ra->wait_s, shown_name);
    else
        say("cannot acquire lock '%s': %s", shown_name, detail(client, err));
    return exit_status_for(err);
}

static void save_signal_state(void)
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

static void forward_signal(int sig, siginfo_t *info, void *uctx)
{
    int saved = errno;

    (void)uctx;
    /* SI_KERNEL: the terminal signalled the whole foreground process group,
     * so the command has this signal already. */
    if (info->si_code != SI_KERNEL && child_pid > 0)
        kill(child_pid, sig);
    errno = saved;
}

/* A handler, not SIG_DFL, so that SIGCHLD interrupts the wait in ppoll(). */
static void note_child(int sig)
{
    (void)sig;
}

/*
 * Blocks the forwarded signals and SIGCHLD (they are taken only inside
 * ppoll(), so child_pid never changes under a handler) and installs the
 * handlers. *waitmask is the mask to wait with. Signals dlock was started
 * ignoring (nohup) stay ignored.
 */
static void install_handlers(sigset_t *waitmask)
{
    struct sigaction fwd = {.sa_sigaction = forward_signal, .sa_flags = SA_SIGINFO};
    struct sigaction chld = {.sa_handler = note_child, .sa_flags = SA_NOCLDSTOP};
    sigset_t block;

    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaddset(&block, forwarded[i]);
    sigprocmask(SIG_BLOCK, &block, NULL);
    sigemptyset(&fwd.sa_mask);
    sigemptyset(&chld.sa_mask);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        if (startup_action[forwarded[i]].sa_handler != SIG_IGN)
            sigaction(forwarded[i], &fwd, NULL);
    sigaction(SIGCHLD, &chld, NULL);
    *waitmask = startup_mask;
    sigdelset(waitmask, SIGCHLD);
}

static int export_lock(const dlock_lock *lock, const char *name)
{
    char token[24];

    snprintf(token, sizeof token, "%" PRIu64, dlock_lock_token(lock));
    if (setenv("DLOCK_TOKEN", token, 1) != 0 || setenv("DLOCK_NAME", name, 1) != 0) {
        say("cannot set the environment: %s", strerror(errno));
        return EX_SOFTWARE;
    }
    return PROCEED;
}

/* In the child: only async-signal-safe calls, the library may have threads. */
static _Noreturn void exec_command(char **command, pid_t parent, int errfd)
{
    int err;
    ssize_t n;

    restore_signal_state();
    /* Once dlock is gone so is the lock: the command must not outlive it
     * unprotected, nor start if dlock died already. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(EX_SOFTWARE);
    execvp(command[0], command);
    err = errno;
    n = write(errfd, &err, sizeof err);
    (void)n;
    _exit(err == ENOENT ? 127 : 126);
}

/* Reports why exec failed, read from the close-on-exec pipe (EOF: it ran). */
static void report_exec_error(int fd)
{
    int err;
    ssize_t n;

    do
        n = read(fd, &err, sizeof err);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof err)
        say("cannot run '%s': %s", shown_cmd, strerror(err));
}

/* The lock is gone: the command no longer runs under it, so it is stopped
 * (SIGTERM now, SIGKILL after STOP_GRACE_NS) rather than left running. */
static void report_lost(struct job *job)
{
    if (job->lost)
        return;
    job->lost = 1;
    if (child_pid > 0) {
        say("lock '%s' was lost while '%s' ran: stopping it", shown_name, shown_cmd);
        kill(child_pid, SIGTERM);
        job->kill_at = dlock_monotonic_ns() + STOP_GRACE_NS;
    } else {
        say("lock '%s' was lost while '%s' ran", shown_name, shown_cmd);
    }
}

static void renew(struct job *job)
{
    uint64_t start = dlock_monotonic_ns();
    int err = dlock_renew(job->lock, job->ra->acq.ttl_ms);

    if (err == 0) {
        job->renew_failing = 0;
        job->lease_end = start + (uint64_t)job->ra->acq.ttl_ms * 1000000u;
    } else if (err == DLOCK_ENOTSUP) {
        job->no_checks = 1; /* a backend that cannot even check ownership */
    } else if (err == DLOCK_ELOST || dlock_monotonic_ns() >= job->lease_end) {
        /* Not renewed before the lease ran out: someone else may hold it. */
        report_lost(job);
    } else if (!job->renew_failing) {
        say("cannot renew lock '%s': %s", shown_name,
            detail(dlock_lock_client(job->lock), err));
        job->renew_failing = 1;
    }
}

/* Leases run out unless renewed (every third of the TTL). Locks without a
 * lease can still be lost (a ZooKeeper session expiring, a lock file
 * removed): renew then only checks ownership, once a second. */
#define CHECK_INTERVAL_NS 1000000000ull

static uint64_t renew_interval_ns(const struct job *job)
{
    unsigned int caps = dlock_client_caps(dlock_lock_client(job->lock));
    uint64_t third = (uint64_t)job->ra->acq.ttl_ms * 1000000u / 3;

    if ((caps & DLOCK_CAP_LEASE) && (caps & DLOCK_CAP_RENEW))
        return third;
    return third < CHECK_INTERVAL_NS ? third : CHECK_INTERVAL_NS;
}

/* Waits for the child, renewing the lease meanwhile; returns its wait status,
 * or -1 if it cannot be waited for. */
static int wait_child(pid_t pid, struct job *job, const sigset_t *waitmask)
{
    uint64_t interval = renew_interval_ns(job);
    uint64_t next = dlock_monotonic_ns() + interval;
    struct timespec ts;
    int status;
    pid_t r;

    while ((r = waitpid(pid, &status, WNOHANG)) == 0) {
        uint64_t now = dlock_monotonic_ns(), until = 0;

        if (job->no_checks)
            interval = 0;
        if (interval && !job->lost && now >= next) {
            renew(job);
            /* Retry a failed renewal sooner, while the lease still runs. */
            next = (now = dlock_monotonic_ns()) + (job->renew_failing ? interval / 4 : interval);
        }
        if (job->kill_at && now >= job->kill_at) {
            kill(pid, SIGKILL);
            job->kill_at = 0;
        }
        if (interval && !job->lost)
            until = next;
        if (job->kill_at && (!until || job->kill_at < until))
            until = job->kill_at;
        if (until) {
            ts.tv_sec = (time_t)((until - now) / 1000000000u);
            ts.tv_nsec = (long)((until - now) % 1000000000u);
        }
        /* Signals are taken only here: SIGCHLD ends the wait with EINTR. */
        ppoll(NULL, 0, until ? &ts : NULL, waitmask);
    }
    if (r < 0) {
        say("cannot wait for '%s': %s", shown_cmd, strerror(errno));
        return -1;
    }
    return status;
}

/* Runs the command under the held lock; returns dlock's exit status. */
static int run_command(struct job *job)
{
    pid_t parent = getpid(), pid;
    sigset_t waitmask;
    int status, errpipe[2];

    status = export_lock(job->lock, job->ra->name);
    if (status != PROCEED)
        return status;
    if (pipe2(errpipe, O_CLOEXEC) != 0) {
        say("cannot create a pipe: %s", strerror(errno));
        return EX_SOFTWARE;
    }
    install_handlers(&waitmask);
    fflush(NULL);
    pid = fork();
    if (pid == 0)
        exec_command(job->ra->command, parent, errpipe[1]);
    close(errpipe[1]);
    if (pid < 0) {
        say("cannot fork: %s", strerror(errno));
        close(errpipe[0]);
        return EX_SOFTWARE;
    }
    child_pid = pid;
    report_exec_error(errpipe[0]);
    close(errpipe[0]);
    status = wait_child(pid, job, &waitmask);
    child_pid = 0;
    if (status < 0)
        return EX_SOFTWARE;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* A lock lost under a successful command turns its success into 70. */
static int release(struct job *job, int status)
{
    dlock_client *client = dlock_lock_client(job->lock);
    int err = dlock_release(job->lock);

    job->lock = NULL;
    if (err == DLOCK_ELOST)
        report_lost(job);
    else if (err != 0)
        say("cannot release lock '%s': %s", shown_name, detail(client, err));
    if (job->lost)
        return EX_SOFTWARE; /* the command was stopped: its status is ours */
    if (err != 0 && status == 0)
        return EX_SOFTWARE;
    return status;
}

static int cmd_run(int argc, char **argv)
{
    struct run_args ra;
    struct job job = {.ra = &ra};
    char uribuf[DLOCK_URI_MAX];
    dlock_client *client = NULL;
    const char *uri;
    int status;

    status = parse_run_args(argc, argv, &ra);
    if (status != PROCEED)
        return status;
    /* Before the library runs: it may start threads or change dispositions. */
    save_signal_state();
    uri = ra.uri ? ra.uri : default_uri(uribuf, sizeof uribuf);
    if (!uri)
        return usage_error("default lock directory path too long; set DLOCK_URI");
    status = open_client(uri, &client);
    if (status == PROCEED) {
        status = acquire(&ra, client, &job.lock);
        /* The lease began at the grant, at most a reply's flight earlier. */
        job.lease_end = dlock_monotonic_ns() + (uint64_t)ra.acq.ttl_ms * 1000000u;
    }
    if (status == PROCEED)
        status = release(&job, run_command(&job));
    dlock_client_close(client);
    return status;
}

static int cmd_bench(int argc, char **argv)
{
#ifdef DLOCK_HAVE_BENCH
    return dlock_bench_main(argc, argv);
#else
    (void)argc;
    (void)argv;
    say("this dlock was built without the benchmark (meson -Dbench=true)");
    return EX_UNAVAILABLE;
#endif
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : NULL;

    if (!cmd) {
        print_usage(stderr);
        return EX_USAGE;
    }
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
        strcmp(cmd, "-h") == 0) {
        print_usage(stdout);
        return finish_stdout();
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("dlock %s\n", dlock_version());
        return finish_stdout();
    }
    say("unknown command '%s' (see 'dlock --help')", cmd);
    return EX_USAGE;
}
