/*
 * dlock(1): run a command while holding a distributed lock, in the spirit of
 * flock(1); `dlock migrate` prepares a store to take over locks from another
 * (docs/migration.md); `dlock bench` is dispatched to bench/.
 *
 * The lock is acquired with .keep: the library's keeper renews (or checks)
 * it on its own threads, and its loss callback wakes the main loop, which
 * does nothing but wait for the command, pass signals on and, on a loss,
 * stop the command's whole process group. No store call runs on the main
 * thread while the command runs, so a silent store never delays the stop.
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
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tools/cli.h"
#include "dlock.h"
#include "dlock_backend.h" /* DLOCK_CAP_* */
#ifdef DLOCK_HAVE_BENCH
#include "bench/bench.h"
#endif

/* parse_run_args() result meaning "carry on" rather than "exit with this". */
#define PROCEED (-1)
/* Longest name or command shown in a message; the rest becomes "...". */
#define SHOWN_MAX 200
/* After a loss the command's group gets SIGTERM, and SIGKILL this much later. */
#define GRACE_DEFAULT_S 5.0
/* How long to wait for a SIGKILLed group to be gone before exiting anyway. */
#define REAP_AFTER_KILL_NS 1000000000ull
/* How often to look whether a stopping group is empty (its members are not
 * all dlock's children, so SIGCHLD alone cannot tell). */
#define GROUP_POLL_NS 20000000ull

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
};

/* The command as it runs under the lock. */
struct job {
    const struct run_args *ra;
    dlock_lock *lock;
    int wake[2];        /* on_lost writes to wake[1]: the main loop wakes */
    int tty;            /* dlock's terminal (job control followed), or -1 */
    char **envp;        /* the command's environment */
    char *own_env[3];   /* its DLOCK_TOKEN, DLOCK_NAME and DLOCK_URI entries */
    int lost;           /* the loss was reported and the group told to stop */
    uint64_t kill_at;   /* SIGKILL the group then (0: none due; UINT64_MAX: never) */
    uint64_t give_up_at; /* after SIGKILL: stop waiting for the group then */
};

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

/* Signal state dlock was started with: the command gets exactly this back. */
static struct sigaction startup_action[NSIG];
static sigset_t startup_mask;

/* The command's process group (its pid), read by the forwarding handler;
 * only changed while the handler is blocked. */
static volatile sig_atomic_t child_pid;

/* Printable copies, so that every message stays on one line. */
static char shown_name[SHOWN_MAX + 4], shown_cmd[SHOWN_MAX + 4];

static void print_usage(FILE *f)
{
    fputs("Usage:\n"
          "  dlock run [-w SECONDS | -n] [--ttl MS] [-G SECONDS]\n"
          "            [--password-file FILE] [URI] NAME... -- COMMAND [ARGS...]\n"
          "  dlock migrate [-w SECONDS] OLD NEW [NAME...]\n"
          "  dlock inspect [--json] [URI] NAME...\n"
          "  dlock bench [OPTIONS...] URI [URI...]    (see 'dlock bench --help')\n"
          "  dlock check [OPTIONS...] URI [URI...]    (see 'dlock check --help')\n"
          "  dlock help | --help | --version\n"
          "\n"
          "Run COMMAND while holding the lock NAME of the store named by URI;\n"
          "with several NAMEs (URI then given first), one lock that is all of\n"
          "them, taken in byte order, all or nothing.\n"
          "\n"
          "Options of run:\n"
          "  -w, --wait SECONDS    give up after SECONDS (fractions allowed)\n"
          "  -n, --nonblock        give up at once if the lock is held\n"
          "      --ttl MS          lease on stores with leases (default 30000),\n"
          "                        renewed every MS/3 while COMMAND runs\n"
          "  -G, --grace SECONDS   if the lock is lost, SIGKILL COMMAND's process\n"
          "                        group this long after SIGTERM (default 5; 0:\n"
          "                        SIGKILL at once)\n"
          "      --password-file FILE\n"
          "                        the store's password is FILE's first line\n"
          "                        ($DLOCK_PASSWORD gives it too); none in URI\n"
          "  -h, --help            show this help\n"
          "\n"
          "Migrate: make NEW's later grants of every name carry tokens above all\n"
          "OLD granted (NEW's token floor raised to OLD's highest token: prints\n"
          "'* TOP ok'), then take each NAME given once on the list \"OLD NEW\"\n"
          "and release it, waiting for its holders ('NAME TOKEN ok', or\n"
          "'NAME - busy' or 'NAME - failed' and a message). Run it before\n"
          "processes move from OLD to \"OLD NEW\", and again once none uses OLD\n"
          "alone; safe to repeat. OLD and NEW are one URI each; their passwords\n"
          "go in the URIs (--password-file and DLOCK_PASSWORD are not used).\n"
          "See docs/migration.md.\n"
          "  -w, --wait SECONDS    wait this long for each NAME's holders\n"
          "                        (default 10)\n"
          "\n"
          "Inspect: what the store knows about each NAME, without taking it:\n"
          "held or free, the holder's owner, token and lease left, the waiters\n"
          "(count and order where the store can tell), the last token granted;\n"
          "what a store cannot tell is said. --json prints one object per NAME\n"
          "(per store of a list) per line. See docs/backends.md.\n"
          "\n"
          "URI defaults to $DLOCK_URI, else file://$XDG_RUNTIME_DIR/dlock,\n"
          "else file:///tmp/dlock-$UID. COMMAND runs in a process group of its\n"
          "own, with DLOCK_TOKEN, DLOCK_NAME and DLOCK_URI (its password removed).\n"
          "\n"
          "Exit status: COMMAND's (128+N if killed by signal N); 64 usage or URI\n"
          "error; 69 store unreachable (migrate: or NEW cannot raise its tokens\n"
          "above OLD's); 70 other error or lock lost; 75 lock not acquired\n"
          "(migrate: a NAME still held after -w); 126 COMMAND not executable;\n"
          "127 COMMAND not found.\n",
          f);
}

/* Help and version go to stdout: a full disk or closed pipe is an error. */
static int finish_stdout(void)
{
    if (fclose(stdout) == 0)
        return EX_OK;
    dlock_say("cannot write to standard output: %s", strerror(errno));
    return EX_SOFTWARE;
}

static void make_printable(char *dst, const char *src)
{
    size_t i;

    for (i = 0; src[i] && i < SHOWN_MAX; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    strcpy(dst + i, src[i] ? "..." : "");
}

static const char *shown_value(const char *arg);

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
    make_printable(shown_name, joined);
    if (used > SHOWN_MAX || i < n)
        strcpy(shown_name + (used < SHOWN_MAX ? used : SHOWN_MAX), "...");
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

/* Seconds as nanoseconds; UINT64_MAX ("never") when they overflow. */
static uint64_t seconds_ns(double seconds)
{
    double ns = seconds * 1e9;

    return ns >= 18e18 ? UINT64_MAX : (uint64_t)ns;
}

/* now + ns, or UINT64_MAX ("never") when that overflows the clock. */
static uint64_t after_ns(uint64_t ns)
{
    uint64_t now = dlock_monotonic_ns();

    return ns >= UINT64_MAX - now ? UINT64_MAX : now + ns;
}

/* An absolute deadline, or waiting forever when S seconds overflow the clock. */
static void set_deadline(dlock_acquire_opts *acq, double seconds)
{
    uint64_t at = after_ns(seconds_ns(seconds));

    if (at == UINT64_MAX) {
        acq->wait = DLOCK_WAIT_FOREVER;
        return;
    }
    acq->wait = DLOCK_WAIT_DEADLINE;
    acq->deadline_ns = at;
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
        {"grace", required_argument, NULL, 'G'},
        {"password-file", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int have_wait = 0, nonblock = 0, c;
    char buf[3];

    opterr = 0;
    optind = 1;
    /* "+": options end at the lock name, so COMMAND's own are never ours. */
    while ((c = getopt_long(argc, argv, "+:w:nG:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'w':
            if (parse_seconds(optarg, &ra->wait_s) != 0)
                return dlock_usage_error("invalid wait '%s': expected seconds >= 0",
                                   shown_value(optarg));
            have_wait = 1;
            break;
        case 'n':
            nonblock = 1;
            break;
        case 'T':
            if (parse_ttl(optarg, &ra->acq.ttl_ms) != 0)
                return dlock_usage_error("invalid TTL '%s': expected milliseconds "
                                   "1..%" PRIu32, shown_value(optarg), UINT32_MAX);
            break;
        case 'G':
            if (parse_seconds(optarg, &ra->grace_s) != 0)
                return dlock_usage_error("invalid grace period '%s': expected seconds >= 0",
                                   shown_value(optarg));
            break;
        case 'P':
            if (!*optarg)
                return dlock_usage_error("--password-file needs a file name");
            ra->password_file = optarg;
            break;
        case 'h':
            print_usage(stdout);
            return finish_stdout();
        case ':':
            return dlock_usage_error("option '%s' needs an argument", argv[optind - 1]);
        default:
            return dlock_usage_error("invalid option '%s'", bad_option(argv, buf));
        }
    }
    if (have_wait && nonblock)
        return dlock_usage_error("-w and -n cannot be used together");
    if (nonblock)
        ra->acq.wait = DLOCK_WAIT_TRY;
    else if (have_wait)
        set_deadline(&ra->acq, ra->wait_s);
    ra->grace_ns = seconds_ns(ra->grace_s);
    return PROCEED;
}

/* argv[0] is "run". */
static int parse_run_args(int argc, char **argv, struct run_args *ra)
{
    int status, sep, npos;

    memset(ra, 0, sizeof *ra);
    dlock_acquire_opts_init(&ra->acq);
    ra->grace_s = GRACE_DEFAULT_S;
    status = parse_run_options(argc, argv, ra);
    if (status != PROCEED)
        return status;
    for (sep = optind; sep < argc && strcmp(argv[sep], "--") != 0; sep++)
        continue;
    if (sep == argc)
        return dlock_usage_error("missing '--' before COMMAND");
    npos = sep - optind;
    if (npos == 0)
        return dlock_usage_error("missing lock NAME before '--'");
    if (npos - 1 > DLOCK_NAMES_MAX)
        return dlock_usage_error("too many arguments before '--': at most %d NAMEs",
                           DLOCK_NAMES_MAX);
    if (sep + 1 == argc)
        return dlock_usage_error("missing COMMAND after '--'");
    /* One argument is NAME; with more, the first is URI. */
    if (npos >= 2 && !strstr(argv[optind], "://"))
        return dlock_usage_error("with several arguments before '--' the first is the URI, and "
                           "'%s' is none: give the URI first (e.g. \"$DLOCK_URI\")",
                           shown_value(argv[optind]));
    ra->uri = npos >= 2 ? argv[optind] : NULL;
    ra->names = argv + sep - (npos >= 2 ? npos - 1 : 1);
    ra->nnames = npos >= 2 ? npos - 1 : 1;
    show_names(ra->names, ra->nnames);
    ra->command = argv + sep + 1;
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

/*
 * Passwords. The URI's userinfo is found as the library finds it: the
 * authority follows "scheme://" and ends at '/', '?' or '#'; its last '@'
 * ends the userinfo, whose first ':' starts the password.
 */
struct userinfo {
    const char *auth;  /* start of the authority (NULL: no "scheme://") */
    const char *at;    /* its last '@', NULL if none */
    const char *colon; /* the ':' before the password, NULL if none */
};

static struct userinfo find_userinfo(const char *uri)
{
    struct userinfo ui = {NULL, NULL, NULL};
    size_t i = strspn(uri, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "0123456789+-.");
    const char *end;

    if (i == 0 || strncmp(uri + i, "://", 3) != 0)
        return ui;
    ui.auth = uri + i + 3;
    end = ui.auth + strcspn(ui.auth, "/?#");
    for (const char *p = ui.auth; p < end; p++)
        if (*p == '@')
            ui.at = p;
    if (ui.at)
        ui.colon = memchr(ui.auth, ':', (size_t)(ui.at - ui.auth));
    return ui;
}

static const char uri_spaces[] = " \t\r\n\v\f";

/* A copy of uri without its password (redis://:pw@h -> redis://h,
 * mysql://u:pw@h -> mysql://u@h); NULL when out of memory. */
static char *one_uri_without_password(const char *uri)
{
    struct userinfo ui = find_userinfo(uri);
    const char *cut, *resume;
    char *out;

    if (!ui.colon)
        return strdup(uri);
    /* An empty user name goes too, with its '@'. */
    cut = ui.colon == ui.auth ? ui.auth : ui.colon;
    resume = ui.colon == ui.auth ? ui.at + 1 : ui.at;
    out = malloc(strlen(uri) + 1);
    if (!out)
        return NULL;
    memcpy(out, uri, (size_t)(cut - uri));
    strcpy(out + (cut - uri), resume);
    return out;
}

/* The same for a list of URIs (separated by whitespace): each one without
 * its password, separated by one space. */
static char *uri_without_password(const char *list)
{
    char *out = calloc(1, strlen(list) + 1);
    size_t o = 0;

    for (const char *p = list; out && *p;) {
        size_t n = strcspn(p, uri_spaces);
        if (n) {
            char *one = strndup(p, n), *clean = one ? one_uri_without_password(one) : NULL;
            free(one);
            if (!clean) {
                free(out);
                return NULL;
            }
            o += (size_t)sprintf(out + o, "%s%s", o ? " " : "", clean); /* never longer */
            free(clean);
            p += n;
        } else {
            p++;
        }
    }
    return out;
}

/* An option's bad value as it may be shown: printable, and without a
 * password when it is a URI given in the wrong place. Static storage. */
static const char *shown_value(const char *arg)
{
    static char shown[SHOWN_MAX + 4];
    char *clean = strstr(arg, "://") ? uri_without_password(arg) : strdup(arg);

    make_printable(shown, clean ? clean : "?");
    free(clean);
    return shown;
}

/* pw percent-encoded into uri's userinfo ("scheme://user:PW@..." or
 * "scheme://:PW@..."), in *out (malloc'd). PROCEED or an exit status. */
static int uri_with_password(const char *uri, const char *pw, const char *from,
                             char **out)
{
    static const char hex[] = "0123456789ABCDEF";
    struct userinfo ui = find_userinfo(uri);
    const char *split;
    size_t n;
    char *o;

    *out = NULL;
    if (uri[strcspn(uri, uri_spaces)]) {
        dlock_say("%s gives the password of one URI, not of a list of stores", from);
        return EX_USAGE;
    }
    if (ui.colon) {
        dlock_say("the URI has a password already, and another one comes from %s: "
            "give it in one place only", from);
        return EX_USAGE;
    }
    if (!ui.auth)
        split = uri; /* malformed: left for dlock_client_open() to report */
    else
        split = ui.at ? ui.at : ui.auth;
    *out = o = malloc(strlen(uri) + 3 * strlen(pw) + 3);
    if (!o) {
        dlock_say("out of memory");
        return EX_SOFTWARE;
    }
    n = (size_t)(split - uri);
    memcpy(o, uri, n);
    o += n;
    if (ui.auth) {
        *o++ = ':';
        for (const unsigned char *p = (const unsigned char *)pw; *p; p++) {
            if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                (*p >= '0' && *p <= '9') || strchr("-._~", *p)) {
                *o++ = (char)*p;
            } else {
                *o++ = '%';
                *o++ = hex[*p >> 4];
                *o++ = hex[*p & 15];
            }
        }
        if (!ui.at)
            *o++ = '@';
    }
    strcpy(o, split);
    return PROCEED;
}

static void wipe_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

/* The first line of the password file (without its line ending). */
static int read_password_file(const char *path, char **pwp)
{
    char shown[SHOWN_MAX + 4];
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    FILE *f;
    int err;

    make_printable(shown, path);
    f = fopen(path, "re");
    if (!f) {
        dlock_say("cannot open the password file '%s': %s", shown, strerror(errno));
        return EX_USAGE;
    }
    errno = 0;
    n = getline(&line, &cap, f);
    err = errno;
    if (n < 0 && ferror(f)) {
        fclose(f);
        free(line);
        dlock_say("cannot read the password file '%s': %s", shown, strerror(err));
        return EX_USAGE;
    }
    fclose(f);
    if (n < 0)
        n = 0;
    if (n > 0 && line[n - 1] == '\n')
        n--;
    if (n > 0 && line[n - 1] == '\r')
        n--;
    if (n == 0 || memchr(line, '\0', (size_t)n)) {
        if (line)
            explicit_bzero(line, cap);
        free(line);
        dlock_say("the password file '%s' %s", shown,
            n == 0 ? "has an empty first line (the password is that line)"
                   : "contains a NUL byte in its first line");
        return EX_USAGE;
    }
    line[n] = '\0';
    *pwp = line;
    return PROCEED;
}

/*
 * The URI to open: uri with the password of --password-file or, failing
 * that, of $DLOCK_PASSWORD, if either is given (*out NULL: use uri as is).
 */
static int add_password(const struct run_args *ra, const char *uri, char **out)
{
    const char *env = getenv("DLOCK_PASSWORD");
    char *pw = NULL;
    int status;

    *out = NULL;
    if (ra->password_file) {
        status = read_password_file(ra->password_file, &pw);
        if (status != PROCEED)
            return status;
        status = uri_with_password(uri, pw, "--password-file", out);
        wipe_free(pw);
        return status;
    }
    if (!env)
        return PROCEED;
    if (!*env) {
        dlock_say("DLOCK_PASSWORD is set but empty: unset it, or give the password");
        return EX_USAGE;
    }
    return uri_with_password(uri, env, "DLOCK_PASSWORD", out);
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

static int open_client(const char *uri, const struct run_args *ra, int with_password,
                       dlock_client **clientp)
{
    int err = dlock_client_open(uri, clientp);

    if (err == 0)
        return PROCEED;
    if (with_password && (err == DLOCK_EBADURI || err == DLOCK_EAUTH))
        dlock_say("cannot open lock store: %s (the password came from %s)",
            detail(*clientp, err), ra->password_file ? "--password-file" : "DLOCK_PASSWORD");
    else
        dlock_say("cannot open lock store: %s", detail(*clientp, err));
    return exit_status_for(err);
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
        if (startup_action[cancelling[i]].sa_handler != SIG_IGN)
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
        err = dlock_acquire_names(client, (const char *const *)ra->names, (size_t)ra->nnames,
                                  &acq, &job->lock);
    while (err == DLOCK_EINTR);
    if (acq.wait != DLOCK_WAIT_TRY)
        uncancel_on_signals(saved);
    if (cancel_signal) {
        /* Out of the queue (or a grant that beat the signal given back;
         * or the wait ended otherwise meanwhile): now end as the signal
         * would have ended us. */
        if (err == 0) {
            dlock_release(job->lock);
            job->lock = NULL;
        }
        signal(cancel_signal, SIG_DFL);
        raise(cancel_signal);
        return 128 + cancel_signal;
    }
    if (err == 0)
        return PROCEED;
    if (err == DLOCK_EBUSY)
        dlock_say("lock '%s' is held elsewhere", shown_name);
    else if (err == DLOCK_ETIMEDOUT)
        dlock_say("timed out after %.3g s waiting for lock '%s': %s",
            (double)(dlock_monotonic_ns() - t0) / 1e9, shown_name, detail(client, err));
    else
        dlock_say("cannot acquire lock '%s': %s", shown_name, detail(client, err));
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
 * and DLOCK_URI (the store's URI, its password removed). Built rather than
 * set with setenv(): the keeper's threads run.
 */
static int make_environment(struct job *job, const char *uri)
{
    static const char *const replaced[] = {"DLOCK_TOKEN", "DLOCK_NAME", "DLOCK_URI",
                                           "DLOCK_PASSWORD"};
    char *clean = uri_without_password(uri);
    size_t n = 0, k = 0;

    while (environ[n])
        n++;
    job->envp = calloc(n + 4, sizeof *job->envp);
    if (!clean || !job->envp ||
        asprintf(&job->own_env[0], "DLOCK_TOKEN=%" PRIu64, dlock_lock_token(job->lock)) < 0 ||
        !(job->own_env[1] = names_var(job->lock, "DLOCK_NAME=")) ||
        asprintf(&job->own_env[2], "DLOCK_URI=%s", clean) < 0) {
        free(clean);
        dlock_say("cannot build the command's environment: out of memory");
        return EX_SOFTWARE;
    }
    free(clean);
    for (size_t i = 0; i < n; i++) {
        int drop = 0;

        for (size_t j = 0; j < sizeof replaced / sizeof replaced[0]; j++)
            drop |= is_var(environ[i], replaced[j]);
        if (!drop)
            job->envp[k++] = environ[i];
    }
    for (size_t j = 0; j < 3; j++)
        job->envp[k++] = job->own_env[j];
    job->envp[k] = NULL;
    return PROCEED;
}

static void free_environment(struct job *job)
{
    for (size_t j = 0; j < 3; j++) {
        free(job->own_env[j]);
        job->own_env[j] = NULL;
    }
    free(job->envp);
    job->envp = NULL;
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
static _Noreturn void exec_command(const struct job *job, pid_t parent, int handover,
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
    execvpe(job->ra->command[0], job->ra->command, job->envp);
fail:
    ce.err = errno;
    n = write(errfd, &ce, sizeof ce);
    (void)n;
    _exit(ce.stage != STAGE_EXEC ? EX_SOFTWARE : ce.err == ENOENT ? 127 : 126);
}

static void report_exec_error(int fd)
{
    struct child_error ce;
    ssize_t n;

    do
        n = read(fd, &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof ce)
        return;
    if (ce.stage == STAGE_EXEC)
        dlock_say("cannot run '%s': %s", shown_cmd, strerror(ce.err));
    else if (ce.stage == STAGE_PGRP)
        dlock_say("cannot give '%s' a process group of its own: %s", shown_cmd, strerror(ce.err));
    else
        dlock_say("cannot tie '%s' to dlock's life (PR_SET_PDEATHSIG): %s", shown_cmd,
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
static void follow_stop(struct job *job, pid_t pid, int sig)
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
static void stop_group(struct job *job, pid_t pg)
{
    const char *why = dlock_lock_lost_detail(job->lock);

    job->lost = 1;
    if (!*why)
        why = dlock_strerror(dlock_lock_lost(job->lock));
    if (job->ra->grace_ns == 0) {
        dlock_say("lock '%s' was lost while '%s' ran: %s; killing its process group",
            shown_name, shown_cmd, why);
        kill(-pg, SIGKILL);
        job->give_up_at = after_ns(REAP_AFTER_KILL_NS);
        return;
    }
    dlock_say("lock '%s' was lost while '%s' ran: %s; stopping its process group "
        "(SIGTERM, SIGKILL after %g s)", shown_name, shown_cmd, why, job->ra->grace_s);
    kill(-pg, SIGTERM);
    kill(-pg, SIGCONT);
    job->kill_at = after_ns(job->ra->grace_ns);
}

/* Reaps what has ended: the command (*statusp, *exited), and descendants
 * orphaned into dlock (a child subreaper). Returns the signal that stopped
 * the command, if it stopped (reported only when following stops), else 0. */
static int reap(const struct job *job, pid_t pid, int *statusp, int *exited)
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
static int wait_command(struct job *job, pid_t pid, const sigset_t *waitmask)
{
    struct pollfd pfd = {.fd = job->wake[0], .events = POLLIN};
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
                "sending SIGKILL", shown_cmd, job->ra->grace_s);
            kill(-pid, SIGKILL);
            job->kill_at = 0;
            job->give_up_at = after_ns(REAP_AFTER_KILL_NS);
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
            dlock_say("cannot wait for '%s': %s", shown_cmd, strerror(errno));
            return -1;
        }
    }
    return status;
}

/* Runs the command under the held lock; returns dlock's exit status. */
static int run_command(struct job *job)
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
    report_exec_error(errpipe[0]);
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

/* A lock lost under a successful command turns its success into 70. */
static int release(struct job *job, int status)
{
    dlock_client *client = dlock_lock_client(job->lock);
    int lost = dlock_lock_lost(job->lock), err;

    if (lost && !job->lost) {
        dlock_say("lock '%s' was lost while '%s' ran: %s", shown_name, shown_cmd,
            *dlock_lock_lost_detail(job->lock) ? dlock_lock_lost_detail(job->lock)
                                                : dlock_strerror(lost));
        job->lost = 1;
    }
    err = dlock_release(job->lock);
    job->lock = NULL;
    if (err == DLOCK_ELOST && !job->lost) {
        dlock_say("lock '%s' was lost while '%s' ran: %s", shown_name, shown_cmd,
            detail(client, err));
        job->lost = 1;
    } else if (err != 0 && err != DLOCK_ELOST) {
        dlock_say("cannot release lock '%s': %s", shown_name, detail(client, err));
    }
    if (job->lost)
        return EX_SOFTWARE; /* the command was stopped: its status is ours */
    if (err != 0 && status == 0)
        return EX_SOFTWARE;
    return status;
}

static int cmd_run(int argc, char **argv)
{
    struct run_args ra;
    struct job job = {.ra = &ra, .wake = {-1, -1}, .tty = -1};
    char uribuf[DLOCK_URI_MAX];
    dlock_client *client = NULL;
    char *with_pw = NULL;
    const char *uri;
    int status;

    /* Before anything changes them (the library may start threads): the
     * command gets this state back. dlock itself must survive writing to a
     * closed pipe (its stderr): the write fails, dlock carries on. */
    save_signal_state();
    signal(SIGPIPE, SIG_IGN);
    status = parse_run_args(argc, argv, &ra);
    if (status != PROCEED)
        return status;
    uri = ra.uri ? ra.uri : default_uri(uribuf, sizeof uribuf);
    if (!uri)
        return dlock_usage_error("default lock directory path too long; set DLOCK_URI");
    status = add_password(&ra, uri, &with_pw);
    if (status != PROCEED)
        return status;
    if (pipe2(job.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        dlock_say("cannot create a pipe: %s", strerror(errno));
        wipe_free(with_pw);
        return EX_SOFTWARE;
    }
    status = open_client(with_pw ? with_pw : uri, &ra, with_pw != NULL, &client);
    wipe_free(with_pw);
    if (status == PROCEED)
        status = acquire(&ra, client, &job);
    if (status == PROCEED) {
        status = make_environment(&job, uri);
        if (status == PROCEED)
            status = run_command(&job);
        free_environment(&job);
        status = release(&job, status);
    }
    dlock_client_close(client);
    close(job.wake[0]);
    close(job.wake[1]);
    return status;
}

/*
 * dlock migrate OLD NEW [NAME...]: prepares NEW to take over locks from OLD.
 * First every name at once: NEW's token floor is raised to the highest
 * token OLD has granted (migrate_floor). Then each NAME given is acquired once on the list "OLD NEW" (in OLD, then in NEW,
 * waiting its turn behind the current holders) and released at once: the
 * list's grant raises NEW's counter for the name to the largest token
 * either store has granted, so that every later grant by NEW alone is above
 * everything OLD granted. Safe to repeat; a name nobody holds costs one
 * acquire and release in each store.
 */
#define MIGRATE_WAIT_DEFAULT_S 10.0

/* The name on standard output: whole, control characters shown as '?'. */
static void print_name(const char *name)
{
    for (const char *p = name; *p; p++)
        putchar((unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p);
}

/* Whether a and b are the same store as written, passwords aside. */
static int same_store(const char *a, const char *b)
{
    char *ca = one_uri_without_password(a), *cb = one_uri_without_password(b);
    int same = ca && cb ? strcmp(ca, cb) == 0 : strcmp(a, b) == 0;

    free(ca);
    free(cb);
    return same;
}

/* Opens one of the two stores alone, so that a message can say which. */
static int open_store(const char *uri, const char *which, dlock_client **cp)
{
    int err = dlock_client_open(uri, cp);

    if (err) {
        dlock_say("cannot open %s: %s", which, detail(*cp, err));
        dlock_client_close(*cp);
        *cp = NULL;
    }
    return err ? exit_status_for(err) : PROCEED;
}

/* A store that cannot do what migrating asks of it (tell its top, raise
 * its tokens that far): a property of the stores, which no retry helps. */
static int migrate_status(int err)
{
    return err == DLOCK_ENOTSUP || err == DLOCK_EINVAL ? EX_UNAVAILABLE : exit_status_for(err);
}

/* Every name at once: NEW's floor raised to OLD's top, so that a name
 * never taken on the list still gets tokens from NEW above all OLD
 * granted. Prints "* TOP ok" ('*': every name), or "* - failed". */
static int migrate_floor(dlock_client *old, dlock_client *new)
{
    uint64_t top = 0;
    int err = dlock_client_token_top(old, &top);

    if (err) {
        puts("* - failed");
        dlock_say("cannot read the highest token of OLD: %s", detail(old, err));
    } else if ((err = dlock_client_raise_floor(new, top)) != 0) {
        puts("* - failed");
        dlock_say("cannot raise NEW's tokens above %" PRIu64 " (OLD's highest): %s", top,
            detail(new, err));
    } else {
        printf("* %" PRIu64 " ok\n", top);
    }
    fflush(stdout);
    return err ? migrate_status(err) : EX_OK;
}

/* One name: EX_OK, or the exit status its failure calls for. */
static int migrate_one(dlock_client *client, const char *name, double wait_s)
{
    dlock_acquire_opts acq;
    dlock_lock *lock = NULL;
    uint64_t token;
    int err, status;

    make_printable(shown_name, name);
    dlock_acquire_opts_init(&acq);
    set_deadline(&acq, wait_s);
    do
        err = dlock_acquire(client, name, &acq, &lock);
    while (err == DLOCK_EINTR);
    if (err == 0) {
        token = dlock_lock_token(lock);
        err = dlock_release(lock);
        print_name(name);
        printf(" %" PRIu64 " ok\n", token);
        fflush(stdout);
        if (err == 0)
            return EX_OK;
        /* The raise was made (and checked) while the lock was held. */
        dlock_say("lock '%s' was migrated (token %" PRIu64 "), but releasing it failed: %s",
            shown_name, token, detail(client, err));
        return EX_SOFTWARE;
    }
    print_name(name);
    if (err == DLOCK_EBUSY || err == DLOCK_ETIMEDOUT) {
        fputs(" - busy\n", stdout);
        /* Mostly held elsewhere; a store that did not answer in time also
         * times out: the library's detail says which. */
        dlock_say("lock '%s' not migrated within %g s: %s", shown_name, wait_s,
            detail(client, err));
        status = EX_TEMPFAIL;
    } else {
        fputs(" - failed\n", stdout);
        dlock_say("cannot migrate lock '%s' (store 1 is OLD, store 2 is NEW): %s", shown_name,
            detail(client, err));
        status = migrate_status(err);
    }
    fflush(stdout);
    return status;
}

/* argv[0] is "migrate". */
static int cmd_migrate(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"wait", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    double wait_s = MIGRATE_WAIT_DEFAULT_S;
    const char *old_uri, *new_uri;
    dlock_client *client = NULL, *old = NULL, *new = NULL;
    char buf[3], *list;
    int c, err, status, busy = 0, failed = 0;

    dlock_usage_cmd = "migrate";
    opterr = 0;
    optind = 1;
    /* "+": options end at OLD, so a NAME may start with '-'. */
    while ((c = getopt_long(argc, argv, "+:w:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'w':
            if (parse_seconds(optarg, &wait_s) != 0)
                return dlock_usage_error("invalid wait '%s': expected seconds >= 0",
                                   shown_value(optarg));
            break;
        case 'h':
            print_usage(stdout);
            return finish_stdout();
        case ':':
            return dlock_usage_error("option '%s' needs an argument", argv[optind - 1]);
        default:
            return dlock_usage_error("invalid option '%s'", bad_option(argv, buf));
        }
    }
    if (argc - optind < 2)
        return dlock_usage_error("missing OLD and NEW: the stores to migrate from and to");
    old_uri = argv[optind];
    new_uri = argv[optind + 1];
    if (old_uri[strcspn(old_uri, uri_spaces)])
        return dlock_usage_error("OLD is a list of stores (it contains whitespace): "
                           "give one URI");
    if (new_uri[strcspn(new_uri, uri_spaces)])
        return dlock_usage_error("NEW is a list of stores (it contains whitespace): "
                           "give one URI");
    if (same_store(old_uri, new_uri))
        return dlock_usage_error("OLD and NEW are the same store");
    for (int i = optind + 2; i < argc; i++) {
        size_t len = strlen(argv[i]);

        if (len == 0)
            return dlock_usage_error("empty lock NAME (argument %d)", i - optind + 1);
        if (len > DLOCK_NAME_MAX) {
            make_printable(shown_name, argv[i]);
            return dlock_usage_error("lock NAME '%s' is longer than %d bytes", shown_name,
                               DLOCK_NAME_MAX);
        }
    }
    status = open_store(old_uri, "OLD", &old);
    if (status == PROCEED)
        status = open_store(new_uri, "NEW", &new);
    if (status == PROCEED) {
        failed = migrate_floor(old, new);
        status = failed ? failed : PROCEED;
    }
    dlock_client_close(old);
    dlock_client_close(new);
    if (status != PROCEED)
        return status;
    if (optind + 2 == argc)
        return finish_stdout();
    if (asprintf(&list, "%s %s", old_uri, new_uri) < 0) {
        dlock_say("out of memory");
        return EX_SOFTWARE;
    }
    err = dlock_client_open(list, &client);
    wipe_free(list);
    if (err) {
        dlock_say("cannot open the list \"OLD NEW\": %s", detail(client, err));
        dlock_client_close(client);
        return exit_status_for(err);
    }
    for (int i = optind + 2; i < argc; i++) {
        status = migrate_one(client, argv[i], wait_s);
        if (status == EX_TEMPFAIL)
            busy = 1;
        else if (status != EX_OK && !failed)
            failed = status;
    }
    dlock_client_close(client);
    status = finish_stdout();
    if (status != EX_OK)
        return status;
    return failed ? failed : busy ? EX_TEMPFAIL : EX_OK;
}

/*
 * dlock inspect [--json] [URI] NAME...: what the store knows about each
 * name (dlock_inspect()), without taking or disturbing anything. A list of
 * stores is inspected store by store. Human lines by default; --json prints
 * one object per name (and store) per line.
 */

static void print_inspect_json(const char *name, int store, int nstores, const dlock_info *i)
{
    unsigned k = i->known;

    fputs("{\"name\":", stdout);
    dlock_json_string(stdout, name);
    if (nstores > 1)
        printf(",\"store\":%d", store);
    printf(",\"held\":%s", !(k & DLOCK_KNOWS_HELD) ? "null" : i->held ? "true" : "false");
    if ((k & DLOCK_KNOWS_TOKEN) && i->held)
        printf(",\"token\":%" PRIu64, i->token);
    else
        fputs(",\"token\":null", stdout);
    fputs(",\"owner\":", stdout);
    if ((k & DLOCK_KNOWS_OWNER) && i->held)
        dlock_json_string(stdout, i->owner);
    else
        fputs("null", stdout);
    if ((k & DLOCK_KNOWS_LEASE) && i->held)
        printf(",\"lease_ms\":%" PRIu64, i->lease_ms);
    else
        fputs(",\"lease_ms\":null", stdout);
    if (k & DLOCK_KNOWS_WAITERS)
        printf(",\"waiters\":%" PRIu64, i->waiters);
    else
        fputs(",\"waiters\":null", stdout);
    fputs(",\"order\":", stdout);
    if (k & DLOCK_KNOWS_ORDER) {
        putchar('[');
        for (size_t w = 0; w < i->listed && w < DLOCK_INFO_LISTED; w++) {
            if (w)
                putchar(',');
            dlock_json_string(stdout, i->waiter[w]);
        }
        putchar(']');
    } else {
        fputs("null", stdout);
    }
    if (k & DLOCK_KNOWS_LAST_TOKEN)
        printf(",\"last_token\":%" PRIu64 "}\n", i->last_token);
    else
        fputs(",\"last_token\":null}\n", stdout);
}

/* leased: the store's locks have leases (DLOCK_CAP_LEASE). */
static void print_inspect_text(const char *name, const char *store, const dlock_info *i,
                               int leased)
{
    unsigned k = i->known;

    print_name(name);
    printf("%s: ", store);
    if (!(k & DLOCK_KNOWS_HELD))
        fputs("held or free: unknown", stdout);
    else if (!i->held)
        fputs("free", stdout);
    else {
        fputs("held", stdout);
        if (k & DLOCK_KNOWS_OWNER) {
            fputs(" by ", stdout);
            print_name(i->owner);
        }
        if (k & DLOCK_KNOWS_TOKEN)
            printf(", token %" PRIu64, i->token);
        if (k & DLOCK_KNOWS_LEASE)
            printf(", lease %.1f s left", (double)i->lease_ms / 1000);
        else
            fputs(leased ? ", lease left unknown" : ", no lease", stdout);
    }
    if (k & DLOCK_KNOWS_WAITERS)
        printf(", %" PRIu64 " waiting", i->waiters);
    else
        fputs(", waiters unknown", stdout);
    if ((k & DLOCK_KNOWS_ORDER) && i->listed) {
        fputs(" (next: ", stdout);
        for (size_t w = 0; w < i->listed && w < DLOCK_INFO_LISTED; w++) {
            if (w)
                fputs(", ", stdout);
            print_name(i->waiter[w]);
        }
        fputs(i->listed < i->waiters ? ", ...)" : ")", stdout);
    }
    if ((k & DLOCK_KNOWS_LAST_TOKEN) && i->last_token)
        printf(", last token %" PRIu64, i->last_token);
    else if (k & DLOCK_KNOWS_LAST_TOKEN)
        fputs(", no token granted yet", stdout);
    putchar('\n');
}

/* argv[0] is "inspect". */
static int cmd_inspect(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char buf[3], dflt[DLOCK_URI_MAX + 16], *words[16], *wbuf = NULL;
    const char *uri;
    int c, json = 0, npos, first, status = EX_OK;

    dlock_usage_cmd = "inspect";
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+:jh", longopts, NULL)) != -1) {
        switch (c) {
        case 'j':
            json = 1;
            break;
        case 'h':
            print_usage(stdout);
            return finish_stdout();
        case ':':
            return dlock_usage_error("option '%s' needs an argument", argv[optind - 1]);
        default:
            return dlock_usage_error("invalid option '%s'", bad_option(argv, buf));
        }
    }
    npos = argc - optind;
    if (npos == 0)
        return dlock_usage_error("missing lock NAME");
    if (npos >= 2 && !strstr(argv[optind], "://"))
        return dlock_usage_error("with several arguments the first is the URI, and '%s' is none: "
                           "give the URI first (e.g. \"$DLOCK_URI\")", shown_value(argv[optind]));
    uri = npos >= 2 ? argv[optind] : default_uri(dflt, sizeof dflt);
    if (!uri) {
        dlock_say("cannot build the default store's URI (set DLOCK_URI)");
        return EX_SOFTWARE;
    }
    first = npos >= 2 ? optind + 1 : optind;
    for (int a = first; a < argc; a++)
        if (!argv[a][0] || strlen(argv[a]) > DLOCK_NAME_MAX)
            return dlock_usage_error("lock NAME %d is empty or longer than %d bytes", a - first + 1,
                               DLOCK_NAME_MAX);
    /* A list of stores: each store alone, so that each says what it knows. */
    size_t nstores = 0;
    for (const char *p = uri; *p;) {
        p += strspn(p, uri_spaces);
        if (*p)
            nstores++;
        p += strcspn(p, uri_spaces);
    }
    if (nstores > sizeof words / sizeof words[0])
        return dlock_usage_error("more than %zu stores in the list", sizeof words / sizeof words[0]);
    if (!(wbuf = strdup(uri))) {
        dlock_say("out of memory");
        return EX_SOFTWARE;
    }
    nstores = 0;
    for (char *p = strtok(wbuf, uri_spaces); p; p = strtok(NULL, uri_spaces))
        words[nstores++] = p;
    for (size_t s = 0; s < nstores; s++) {
        dlock_client *client = NULL;
        char label[64] = "";
        int err = dlock_client_open(words[s], &client);

        if (err) {
            dlock_say("cannot open lock store%s: %s", nstores > 1 ? " (in the list)" : "",
                detail(client, err));
            dlock_client_close(client);
            status = exit_status_for(err);
            break;
        }
        if (nstores > 1)
            snprintf(label, sizeof label, " (store %zu of %zu, %s)", s + 1, nstores,
                     dlock_client_backend(client));
        for (int a = first; a < argc; a++) {
            dlock_info info;

            err = dlock_inspect(client, argv[a], &info);
            if (err) {
                make_printable(shown_name, argv[a]);
                dlock_say("cannot inspect lock '%s'%s: %s", shown_name, label, detail(client, err));
                if (status == EX_OK)
                    status = exit_status_for(err);
                continue;
            }
            if (json)
                print_inspect_json(argv[a], (int)s + 1, (int)nstores, &info);
            else
                print_inspect_text(argv[a], label, &info,
                                   (dlock_client_caps(client) & DLOCK_CAP_LEASE) != 0);
        }
        dlock_client_close(client);
    }
    wipe_free(wbuf);
    int out = finish_stdout();
    return status != EX_OK ? status : out;
}

static int cmd_bench(int argc, char **argv)
{
#ifdef DLOCK_HAVE_BENCH
    return dlock_bench_main(argc, argv);
#else
    (void)argc;
    (void)argv;
    dlock_say("this dlock was built without the benchmark (meson -Dbench=true)");
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
    /* A closed stdout is reported (finish_stdout()), not fatal. */
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
        strcmp(cmd, "-h") == 0) {
        print_usage(stdout);
        return finish_stdout();
    }
    if (strcmp(cmd, "migrate") == 0)
        return cmd_migrate(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return cmd_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "check") == 0)
        return dlock_check_main(argc - 1, argv + 1);
    if (strcmp(cmd, "--version") == 0) {
        printf("dlock %s\n", dlock_version());
        return finish_stdout();
    }
    dlock_say("unknown command '%s' (see 'dlock --help')", cmd);
    return EX_USAGE;
}
