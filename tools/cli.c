/* What the dlock tool's subcommands share: messages, exit statuses, JSON
 * output, option helpers and the tool's usage text (tools/cli.h). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "tools/cli.h"

const char *dlock_usage_cmd = "run";

void dlock_say(const char *fmt, ...)
{
    va_list ap;
    fputs("dlock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int dlock_usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("dlock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'dlock %s --help')\n", dlock_usage_cmd);
    return EX_USAGE;
}

int dlock_exit_status(int err)
{
    switch (err) {
    case DLOCK_EBUSY:
    case DLOCK_ETIMEDOUT:
    case DLOCK_EMODE: /* held in another mode or limit: not acquired, for now */
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

const char *dlock_detail(const dlock_client *client, int err)
{
    const char *msg = dlock_errmsg(client);

    return msg && *msg ? msg : dlock_strerror(err);
}

void dlock_printable(char *dst, const char *src)
{
    size_t i;

    for (i = 0; src[i] && i < SHOWN_MAX; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    strcpy(dst + i, src[i] ? "..." : "");
}

void dlock_print_name(const char *name)
{
    for (const char *p = name; *p; p++)
        putchar((unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p);
}

void dlock_json_string(FILE *f, const char *s)
{
    dlock_json_bytes(f, s, strlen(s));
}

void dlock_json_bytes(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; p < (const unsigned char *)s + len;
         p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

int dlock_parse_count(const char *s, unsigned long min, unsigned long max, unsigned long *out)
{
    char *end;
    unsigned long v;

    /* strtoul() would quietly accept and negate "-1". */
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (*end != '\0' || errno == ERANGE || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int dlock_parse_seconds(const char *s, double *out)
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

uint64_t dlock_seconds_ns(double seconds)
{
    double ns = seconds * 1e9;

    return ns >= 18e18 ? UINT64_MAX : (uint64_t)ns;
}

uint64_t dlock_after_ns(uint64_t ns)
{
    uint64_t now = dlock_monotonic_ns();

    return ns >= UINT64_MAX - now ? UINT64_MAX : now + ns;
}

void dlock_set_deadline(dlock_acquire_opts *acq, double seconds)
{
    uint64_t at = dlock_after_ns(dlock_seconds_ns(seconds));

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

int dlock_other_option(int c, char **argv)
{
    char buf[3];

    switch (c) {
    case 'h':
        dlock_print_usage(stdout);
        return dlock_finish_stdout();
    case ':':
        return dlock_usage_error("option '%s' needs an argument", argv[optind - 1]);
    default:
        return dlock_usage_error("invalid option '%s'", bad_option(argv, buf));
    }
}

void dlock_print_usage(FILE *f)
{
    fputs("Usage:\n"
          "  dlock run [-w SECONDS | -n] [--shared | --limit N] [--ttl MS]\n"
          "            [-G SECONDS] [--password-file FILE] [URI] NAME... -- COMMAND [ARGS...]\n"
          "  dlock migrate [-w SECONDS] OLD NEW [NAME...]\n"
          "  dlock inspect [--json] [--password-file FILE] [URI] NAME...\n"
          "  dlock elect [-w SECONDS | -n] [--ttl MS] [-G SECONDS] [--password-file FILE]\n"
          "              [--value V] [URI] NAME -- COMMAND [ARGS...]\n"
          "  dlock leader [--json] [--watch] [--password-file FILE] [URI] NAME\n"
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
          "      --shared          a shared (read) lock: held together with other\n"
          "                        shared holders, excluded by an exclusive one\n"
          "      --limit N         a permit of the semaphore NAME: at most N\n"
          "                        holders at once (1..65535; every holder of\n"
          "                        NAME must ask for the same N)\n"
          "      --ttl MS          lease on stores with leases (default 30000),\n"
          "                        renewed every MS/3 while COMMAND runs\n"
          "  -G, --grace SECONDS   if the lock is lost, SIGKILL COMMAND's process\n"
          "                        group this long after SIGTERM (default 5; 0:\n"
          "                        SIGKILL at once)\n"
          "      --password-file FILE\n"
          "                        the store's password is FILE's first line\n"
          "                        (also for inspect and leader; $DLOCK_PASSWORD\n"
          "                        gives it too); none in URI. Or the URI option\n"
          "                        password_file=FILE, on every subcommand\n"
          "  -h, --help            show this help\n"
          "\n"
          "Migrate: make NEW's later grants of every name carry tokens above all\n"
          "OLD granted (NEW's token floor raised to OLD's highest token: prints\n"
          "'* TOP ok'), then take each NAME given once on the list \"OLD NEW\"\n"
          "and release it, waiting for its holders ('NAME TOKEN ok', or\n"
          "'NAME - busy' or 'NAME - failed' and a message). Run it before\n"
          "processes move from OLD to \"OLD NEW\", and again once none uses OLD\n"
          "alone; safe to repeat. OLD and NEW are one URI each; their passwords\n"
          "go in the URIs, best as password_file=FILE (--password-file and\n"
          "DLOCK_PASSWORD are not used).\n"
          "See docs/migration.md.\n"
          "  -w, --wait SECONDS    wait this long for each NAME's holders\n"
          "                        (default 10)\n"
          "\n"
          "Inspect: what the store knows about each NAME, without taking it:\n"
          "held or free, the holder's owner, token and lease left, the waiters\n"
          "(count and order where the store can tell), the last token granted;\n"
          "what a store cannot tell is said. A NAME held shared or as a\n"
          "semaphore is followed by one line per holder (mode, token, lease,\n"
          "owner). --json prints one object per NAME (per store of a list) per\n"
          "line, its holders in \"holders\". See docs/backends.md.\n"
          "\n"
          "Elect: run COMMAND while this process leads the election NAME,\n"
          "publishing V (--value, at most 1024 bytes) for observers; COMMAND\n"
          "gets DLOCK_VALUE and the term as DLOCK_TOKEN, its group is stopped\n"
          "when leadership is lost, and its end resigns. Options as run's.\n"
          "\n"
          "Leader: who leads the election NAME (owner, term, lease left, value),\n"
          "without campaigning; --json prints an object per line (name, held,\n"
          "value, term, lease_ms, owner); --watch prints a line per change,\n"
          "woken by the store, until SIGINT or SIGTERM. See docs/election.md.\n"
          "\n"
          "URI defaults to $DLOCK_URI, else file://$XDG_RUNTIME_DIR/dlock,\n"
          "else file:///tmp/dlock-$UID. COMMAND runs in a process group of its\n"
          "own, with DLOCK_TOKEN, DLOCK_NAME and DLOCK_URI (its password removed).\n"
          "\n"
          "Exit status: COMMAND's (128+N if killed by signal N); 64 usage or URI\n"
          "error; 69 store unreachable (migrate: or NEW cannot raise its tokens\n"
          "above OLD's); 70 other error or lock lost; 75 lock not acquired\n"
          "(held, or held in another mode or with another limit; migrate: a\n"
          "NAME still held after -w); 126 COMMAND not executable;\n"
          "127 COMMAND not found.\n",
          f);
}

int dlock_finish_stdout(void)
{
    if (fclose(stdout) == 0)
        return EX_OK;
    dlock_say("cannot write to standard output: %s", strerror(errno));
    return EX_SOFTWARE;
}
