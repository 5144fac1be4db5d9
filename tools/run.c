/*
 * dlock run: the command run while holding the lock, in the spirit of
 * flock(1). Options and the store's URI are read here, the lock acquired
 * with .keep (the library's keeper renews or checks it on its own threads,
 * and its loss callback only wakes the supervisor), the command's
 * environment built, and the command handed to the supervisor
 * (tools/supervise.c), which waits for it, passes signals on and, on a
 * loss, stops its whole process group. No store call runs on the main
 * thread while the command runs, so a silent store never delays the stop.
 *
 * Exit statuses follow sysexits(3) for dlock's own failures and the shell's
 * conventions for the command's (its status, 128+N on signal N, 126/127 when
 * it cannot be run), so that scripts can tell "lock busy" (75) from "the job
 * failed".
 *
 * dlock elect is the same with leadership for the lock: the command runs
 * while this process leads the election NAME (dlock_campaign(), which
 * publishes --value), with DLOCK_VALUE beside DLOCK_TOKEN (the term); the
 * command's end resigns (docs/election.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/store_uri.h"
#include "tools/supervise.h"
#include "dlock.h"
#include "dlock_backend.h" /* DLOCK_CAP_* */

/* After a loss the command's group gets SIGTERM, and SIGKILL this much later. */
#define GRACE_DEFAULT_S 5.0

struct run_args {
    const char *uri;  /* NULL: the default store */
    char **names;     /* the lock is all of them */
    int nnames;
    char **command;   /* NULL-terminated argv of the command */
    dlock_acquire_opts acq;
    double wait_s;    /* the -w value */
    double grace_s;   /* the -G value, for messages */
    uint64_t grace_ns; /* UINT64_MAX: never SIGKILL */
    const char *password_file;
    int elect;         /* dlock elect: campaign for the one NAME */
    const char *value; /* --value: what the leader publishes */
};

/* The command under the lock: what the supervisor runs, and what is built
 * for it here. */
struct job {
    struct supervised sv;
    int wake[2];        /* on_lost writes to wake[1]: the supervisor wakes */
    char *own_env[4];   /* the command's DLOCK_TOKEN, DLOCK_NAME, DLOCK_URI (and
                           DLOCK_VALUE) entries */
};

/* Printable copies, so that every message stays on one line. */
static char shown_name[SHOWN_MAX + 4], shown_cmd[SHOWN_MAX + 4];

/* shown_name for a lock of several names: "a', 'b" (so "lock '%s'" reads
 * "lock 'a', 'b'"). */
static void show_names(char *const *names, int n)
{
    char joined[SHOWN_MAX + 4] = "";
    size_t used = 0;
    int i;

    for (i = 0; i < n && used < SHOWN_MAX; i++) {
        int w = snprintf(joined + used, sizeof joined - used, "%s%s", i ? "', '" : "", names[i]);
        used = w < 0 ? used : used + (size_t)w;
    }
    dlock_printable(shown_name, joined);
    if (used > SHOWN_MAX || i < n)
        strcpy(shown_name + (used < SHOWN_MAX ? used : SHOWN_MAX), "...");
}

/* A count of lo..hi (TTL, limit) into a uint32_t option. */
static int parse_u32(const char *s, unsigned long lo, unsigned long hi, uint32_t *out)
{
    unsigned long v;

    if (dlock_parse_count(s, lo, hi, &v) != 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* --value V of dlock elect. */
static int take_value(struct run_args *ra, const char *v)
{
    if (!ra->elect)
        return dlock_usage_error("--value is an option of dlock elect");
    if (strlen(v) > DLOCK_VALUE_MAX)
        return dlock_usage_error("--value is %zu bytes: at most %d", strlen(v), DLOCK_VALUE_MAX);
    ra->value = v;
    return PROCEED;
}

/* dlock elect [options] [URI] NAME [--value V] -- COMMAND: a --value after
 * NAME is taken out of argv[from .. *sep), the rest moved down. */
static int value_after_name(int *argc, char **argv, int from, int *sep, struct run_args *ra)
{
    int w = from, status;

    for (int r = from; r < *sep; r++) {
        const char *v = NULL;

        if (strcmp(argv[r], "--value") == 0) {
            if (r + 1 >= *sep)
                return dlock_usage_error("option '--value' needs an argument");
            v = argv[++r];
        } else if (strncmp(argv[r], "--value=", 8) == 0) {
            v = argv[r] + 8;
        }
        if (!v) {
            argv[w++] = argv[r];
            continue;
        }
        if ((status = take_value(ra, v)) != PROCEED)
            return status;
    }
    if (w < *sep) {
        memmove(argv + w, argv + *sep, (size_t)(*argc - *sep) * sizeof *argv);
        *argc -= *sep - w;
        *sep = w;
    }
    return PROCEED;
}

static int parse_run_options(int argc, char **argv, struct run_args *ra)
{
    static const struct option longopts[] = {
        {"wait", required_argument, NULL, 'w'},
        {"nonblock", no_argument, NULL, 'n'},
        {"ttl", required_argument, NULL, 'T'},
        {"grace", required_argument, NULL, 'G'},
        {"password-file", required_argument, NULL, 'P'},
        {"shared", no_argument, NULL, 'S'},
        {"limit", required_argument, NULL, 'L'},
        {"value", required_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int have_wait = 0, nonblock = 0, c;

    opterr = 0;
    optind = 1;
    /* "+": options end at the lock name, so COMMAND's own are never ours. */
    while ((c = getopt_long(argc, argv, "+:w:nG:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'w':
            if (dlock_parse_seconds(optarg, &ra->wait_s) != 0)
                return dlock_usage_error("invalid wait '%s': expected seconds >= 0",
                                   store_uri_shown_value(optarg));
            have_wait = 1;
            break;
        case 'n':
            nonblock = 1;
            break;
        case 'T':
            if (parse_u32(optarg, 1, UINT32_MAX, &ra->acq.ttl_ms) != 0)
                return dlock_usage_error("invalid TTL '%s': expected milliseconds "
                                   "1..%" PRIu32, store_uri_shown_value(optarg), UINT32_MAX);
            break;
        case 'G':
            if (dlock_parse_seconds(optarg, &ra->grace_s) != 0)
                return dlock_usage_error("invalid grace period '%s': expected seconds >= 0",
                                   store_uri_shown_value(optarg));
            break;
        case 'P':
            if (!*optarg)
                return dlock_usage_error("--password-file needs a file name");
            ra->password_file = optarg;
            break;
        case 'S':
            ra->acq.mode = DLOCK_MODE_SHARED;
            break;
        case 'L':
            if (parse_u32(optarg, 1, DLOCK_LIMIT_MAX, &ra->acq.limit) != 0)
                return dlock_usage_error("invalid limit '%s': expected a count 1..%u",
                                   store_uri_shown_value(optarg), DLOCK_LIMIT_MAX);
            break;
        case 'V':
            if (take_value(ra, optarg) != PROCEED)
                return EX_USAGE;
            break;
        default:
            return dlock_other_option(c, argv);
        }
    }
    if (ra->elect && (ra->acq.mode == DLOCK_MODE_SHARED || ra->acq.limit))
        return dlock_usage_error("an election has one leader: --shared and --limit are "
                                 "options of dlock run");
    if (have_wait && nonblock)
        return dlock_usage_error("-w and -n cannot be used together");
    if (ra->acq.mode == DLOCK_MODE_SHARED && ra->acq.limit)
        return dlock_usage_error("--shared and --limit cannot be used together: a semaphore's "
                           "permits are taken in exclusive mode");
    if (nonblock)
        ra->acq.wait = DLOCK_WAIT_TRY;
    else if (have_wait)
        dlock_set_deadline(&ra->acq, ra->wait_s);
    ra->grace_ns = dlock_seconds_ns(ra->grace_s);
    return PROCEED;
}

/* argv[0] is "run" or "elect". */
static int parse_run_args(int argc, char **argv, struct run_args *ra)
{
    int status, sep, npos;

    memset(ra, 0, sizeof *ra);
    ra->elect = strcmp(argv[0], "elect") == 0;
    dlock_usage_cmd = ra->elect ? "elect" : "run";
    dlock_acquire_opts_init_version(&ra->acq, DLOCK_ACQUIRE_OPTS_VERSION);
    ra->grace_s = GRACE_DEFAULT_S;
    status = parse_run_options(argc, argv, ra);
    if (status != PROCEED)
        return status;
    for (sep = optind; sep < argc && strcmp(argv[sep], "--") != 0; sep++)
        continue;
    if (sep == argc)
        return dlock_usage_error("missing '--' before COMMAND");
    if (ra->elect && (status = value_after_name(&argc, argv, optind, &sep, ra)) != PROCEED)
        return status;
    npos = sep - optind;
    if (npos == 0)
        return dlock_usage_error("missing lock NAME before '--'");
    if (ra->elect && npos > 2)
        return dlock_usage_error("too many arguments before '--': dlock elect takes [URI] NAME");
    if (npos - 1 > DLOCK_NAMES_MAX)
        return dlock_usage_error("too many arguments before '--': at most %d NAMEs",
                           DLOCK_NAMES_MAX);
    if (sep + 1 == argc)
        return dlock_usage_error("missing COMMAND after '--'");
    /* One argument is NAME; with more, the first is URI. */
    if (npos >= 2 && !strstr(argv[optind], "://"))
        return dlock_usage_error("with several arguments before '--' the first is the URI, and "
                           "'%s' is none: give the URI first (e.g. \"$DLOCK_URI\")",
                           store_uri_shown_value(argv[optind]));
    ra->uri = npos >= 2 ? argv[optind] : NULL;
    ra->names = argv + sep - (npos >= 2 ? npos - 1 : 1);
    ra->nnames = npos >= 2 ? npos - 1 : 1;
    show_names(ra->names, ra->nnames);
    ra->command = argv + sep + 1;
    dlock_printable(shown_cmd, ra->command[0]);
    return PROCEED;
}

static int open_client(const char *uri, const struct run_args *ra, int with_password,
                       dlock_client **clientp)
{
    int err = dlock_client_open(uri, clientp);

    if (err == 0)
        return PROCEED;
    if (with_password && (err == DLOCK_EBADURI || err == DLOCK_EAUTH))
        dlock_say("cannot open lock store: %s (the password came from %s)",
            dlock_detail(*clientp, err), ra->password_file ? "--password-file" : "DLOCK_PASSWORD");
    else
        dlock_say("cannot open lock store: %s", dlock_detail(*clientp, err));
    return dlock_exit_status(err);
}

/* On a keeper thread, once: only wakes the main loop (async-signal-safe,
 * never blocks: the pipe is non-blocking and one byte is enough). */
static void on_lost(dlock_lock *lock, int err, void *user)
{
    const int *fd = user;
    char byte = 1;
    ssize_t n;

    (void)lock;
    (void)err;
    n = write(*fd, &byte, 1);
    (void)n;
}

/* While waiting: the signal that cancels the wait, and the flag it raises. */
static const int cancelling[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
static volatile sig_atomic_t cancel_signal;
static dlock_cancel *wait_cancel;

static void cancel_wait(int sig)
{
    if (cancel_signal) {
        /* A second signal while the first one's cleanup runs: die now. */
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        raise(sig);
        return;
    }
    cancel_signal = sig;
    dlock_cancel_fire(wait_cancel);
}

/*
 * A signal that would have killed dlock while it waits (Ctrl-C, a
 * service manager's SIGTERM) first takes it out of the store's queue:
 * without this, a waiter on ZooKeeper or etcd holds its place until its
 * session or lease runs out. The signal is then raised again with its
 * default action, so dlock ends as before. Signals ignored at startup stay
 * ignored; a backend that cannot cancel is left to die as before.
 */
static void cancel_on_signals(dlock_client *client, struct sigaction *saved)
{
    if (!(dlock_client_caps(client) & DLOCK_CAP_CANCEL) || dlock_cancel_new(&wait_cancel) != 0)
        return;
    struct sigaction act = {.sa_handler = cancel_wait};
    sigemptyset(&act.sa_mask);
    for (size_t i = 0; i < sizeof cancelling / sizeof cancelling[0]; i++)
        sigaddset(&act.sa_mask, cancelling[i]);
    for (size_t i = 0; i < sizeof cancelling / sizeof cancelling[0]; i++)
        if (!supervise_ignored_at_start(cancelling[i]))
            sigaction(cancelling[i], &act, &saved[i]);
        else
            saved[i].sa_handler = SIG_IGN;
}

static void uncancel_on_signals(const struct sigaction *saved)
{
    if (!wait_cancel)
        return;
    for (size_t i = 0; i < sizeof cancelling / sizeof cancelling[0]; i++)
        if (saved[i].sa_handler != SIG_IGN)
            sigaction(cancelling[i], &saved[i], NULL);
    dlock_cancel_free(wait_cancel);
    wait_cancel = NULL;
}

static int acquire(const struct run_args *ra, dlock_client *client, struct job *job)
{
    dlock_acquire_opts acq = ra->acq;
    struct sigaction saved[sizeof cancelling / sizeof cancelling[0]];
    int err;

    acq.keep = 1;
    acq.on_lost = on_lost;
    acq.on_lost_user = &job->wake[1];
    if (acq.wait != DLOCK_WAIT_TRY)
        cancel_on_signals(client, saved);
    acq.cancel = wait_cancel;
    uint64_t t0 = dlock_monotonic_ns();
    /* The deadline is absolute, so retrying after an interruption (a stop
     * and continue, or a cancelling signal's handler) is exact; a raised
     * flag then ends the retry at once. */
    do
        err = ra->elect ? dlock_campaign(client, ra->names[0], ra->value,
                                         ra->value ? strlen(ra->value) : 0, &acq, &job->sv.lock)
                        : dlock_acquire_names(client, (const char *const *)ra->names,
                                              (size_t)ra->nnames, &acq, &job->sv.lock);
    while (err == DLOCK_EINTR);
    if (acq.wait != DLOCK_WAIT_TRY)
        uncancel_on_signals(saved);
    if (cancel_signal) {
        /* Out of the queue (or a grant that beat the signal given back;
         * or the wait ended otherwise meanwhile): now end as the signal
         * would have ended us. */
        if (err == 0) {
            dlock_release(job->sv.lock);
            job->sv.lock = NULL;
        }
        signal(cancel_signal, SIG_DFL);
        raise(cancel_signal);
        return 128 + cancel_signal;
    }
    if (err == 0)
        return PROCEED;
    if (err == DLOCK_EBUSY && ra->elect)
        dlock_say("election '%s' is led elsewhere", shown_name);
    else if (err == DLOCK_EBUSY)
        dlock_say("lock '%s' is held elsewhere", shown_name);
    else if (err == DLOCK_ETIMEDOUT)
        dlock_say("timed out after %.3g s waiting for %s '%s': %s",
            (double)(dlock_monotonic_ns() - t0) / 1e9, ra->elect ? "leadership of" : "lock",
            shown_name, dlock_detail(client, err));
    else if (ra->elect)
        dlock_say("cannot campaign in election '%s': %s", shown_name, dlock_detail(client, err));
    else
        dlock_say("cannot acquire lock '%s': %s", shown_name, dlock_detail(client, err));
    return dlock_exit_status(err);
}

static int is_var(const char *entry, const char *name)
{
    size_t n = strlen(name);

    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

/* The lock's names in byte order, one per line (no newline after the
 * last), after prefix; NULL when out of memory. */
static char *names_var(const dlock_lock *lock, const char *prefix)
{
    size_t total = strlen(prefix) + 1, n = dlock_lock_name_count(lock), len;
    char *var, *p;

    for (size_t i = 0; i < n; i++) {
        dlock_lock_name_at(lock, i, &len);
        total += len + 1;
    }
    if (!(var = malloc(total)))
        return NULL;
    p = stpcpy(var, prefix);
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = '\n';
        p = stpcpy(p, dlock_lock_name_at(lock, i, NULL));
    }
    return var;
}

/*
 * The command's environment: dlock's, without DLOCK_PASSWORD, with
 * DLOCK_TOKEN, DLOCK_NAME (the lock's names in byte order, one per line)
 * and DLOCK_URI (the store's URI, its password removed); for an election,
 * DLOCK_VALUE (the published value) too. Built rather than set with
 * setenv(): the keeper's threads run.
 */
static int make_environment(struct job *job, const char *uri, const struct run_args *ra)
{
    static const char *const replaced[] = {"DLOCK_TOKEN", "DLOCK_NAME", "DLOCK_URI",
                                           "DLOCK_PASSWORD", "DLOCK_VALUE"};
    char *clean = dlock_uri_hide(uri, DLOCK_URI_DROP);
    size_t n = 0, k = 0, own = ra->elect ? 4 : 3;

    while (environ[n])
        n++;
    job->sv.envp = calloc(n + 5, sizeof *job->sv.envp);
    if (!clean || !job->sv.envp ||
        asprintf(&job->own_env[0], "DLOCK_TOKEN=%" PRIu64, dlock_lock_token(job->sv.lock)) < 0 ||
        !(job->own_env[1] = names_var(job->sv.lock, "DLOCK_NAME=")) ||
        asprintf(&job->own_env[2], "DLOCK_URI=%s", clean) < 0 ||
        (ra->elect &&
         asprintf(&job->own_env[3], "DLOCK_VALUE=%s", ra->value ? ra->value : "") < 0)) {
        free(clean);
        dlock_say("cannot build the command's environment: out of memory");
        return EX_SOFTWARE;
    }
    free(clean);
    for (size_t i = 0; i < n; i++) {
        int drop = 0;

        /* DLOCK_VALUE is passed down to a plain run's command. */
        for (size_t j = 0; j < sizeof replaced / sizeof replaced[0] - !ra->elect; j++)
            drop |= is_var(environ[i], replaced[j]);
        if (!drop)
            job->sv.envp[k++] = environ[i];
    }
    for (size_t j = 0; j < own; j++)
        job->sv.envp[k++] = job->own_env[j];
    job->sv.envp[k] = NULL;
    return PROCEED;
}

static void free_environment(struct job *job)
{
    for (size_t j = 0; j < 4; j++) {
        free(job->own_env[j]);
        job->own_env[j] = NULL;
    }
    free(job->sv.envp);
    job->sv.envp = NULL;
}

/* A lock lost under a successful command turns its success into 70. */
static int release(struct job *job, int status)
{
    dlock_client *client = dlock_lock_client(job->sv.lock);
    int lost = dlock_lock_lost(job->sv.lock), err;

    if (lost && !job->sv.lost) {
        dlock_say("%s '%s' was lost while '%s' ran: %s", job->sv.what, shown_name, shown_cmd,
            *dlock_lock_lost_detail(job->sv.lock) ? dlock_lock_lost_detail(job->sv.lock)
                                                : dlock_strerror(lost));
        job->sv.lost = 1;
    }
    err = dlock_release(job->sv.lock);
    job->sv.lock = NULL;
    if (err == DLOCK_ELOST && !job->sv.lost) {
        dlock_say("%s '%s' was lost while '%s' ran: %s", job->sv.what, shown_name, shown_cmd,
            dlock_detail(client, err));
        job->sv.lost = 1;
    } else if (err != 0 && err != DLOCK_ELOST) {
        dlock_say("cannot release lock '%s': %s", shown_name, dlock_detail(client, err));
    }
    if (job->sv.lost)
        return EX_SOFTWARE; /* the command was stopped: its status is ours */
    if (err != 0 && status == 0)
        return EX_SOFTWARE;
    return status;
}

int dlock_run_main(int argc, char **argv)
{
    struct run_args ra;
    struct job job = {.sv = {.tty = -1, .name = shown_name, .cmd = shown_cmd},
                      .wake = {-1, -1}};
    char uribuf[DLOCK_URI_MAX];
    dlock_client *client = NULL;
    char *with_pw = NULL;
    const char *uri;
    int status;

    /* Before anything changes them (the library may start threads): the
     * command gets this state back. dlock itself must survive writing to a
     * closed pipe (its stderr): the write fails, dlock carries on. */
    supervise_save_signals();
    signal(SIGPIPE, SIG_IGN);
    status = parse_run_args(argc, argv, &ra);
    if (status != PROCEED)
        return status;
    job.sv.what = ra.elect ? "leadership of" : "lock";
    uri = ra.uri ? ra.uri : store_uri_default(uribuf, sizeof uribuf);
    if (!uri)
        return dlock_usage_error("default lock directory path too long; set DLOCK_URI");
    status = store_uri_add_password(uri, ra.password_file, &with_pw);
    if (status != PROCEED)
        return status;
    if (pipe2(job.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        dlock_say("cannot create a pipe: %s", strerror(errno));
        store_uri_wipe_free(with_pw);
        return EX_SOFTWARE;
    }
    status = open_client(with_pw ? with_pw : uri, &ra, with_pw != NULL, &client);
    store_uri_wipe_free(with_pw);
    if (status == PROCEED)
        status = acquire(&ra, client, &job);
    if (status == PROCEED) {
        status = make_environment(&job, uri, &ra);
        if (status == PROCEED) {
            job.sv.argv = ra.command;
            job.sv.wake_fd = job.wake[0];
            job.sv.grace_ns = ra.grace_ns;
            job.sv.grace_s = ra.grace_s;
            status = supervise_run(&job.sv);
        }
        free_environment(&job);
        status = release(&job, status);
    }
    dlock_client_close(client);
    close(job.wake[0]);
    close(job.wake[1]);
    return status;
}
