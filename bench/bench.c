/* `dlock bench URI...`: options, then every measurement on every store. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"
#include "bench_int.h"
#include "dlock_backend.h" /* DLOCK_CAP_SHARED, DLOCK_CAP_SEMAPHORE */

static const char usage_text[] =
    "usage: dlock bench [options] URI [URI...]\n"
    "\n"
    "Measures, for each store: its round trip (ping), uncontended\n"
    "acquire+release, the release-to-next-holder handoff (two clients in\n"
    "ping-pong, then queues of waiters), throughput with many contenders, and\n"
    "checks mutual exclusion throughout. Where the backend has them, also\n"
    "shared acquire+release uncontended and the semaphore handoff (the last\n"
    "permit of a semaphore of 2 in ping-pong, the other permit held).\n"
    "Latencies are in microseconds.\n"
    "\n"
    "With --scale, measures instead what holding many locks costs one client:\n"
    "for each N it takes N locks (10 min lease), reports the acquire rate\n"
    "while filling and the memory per held lock, times acquire+release of one\n"
    "more name and renewals with all N held, then releases everything.\n"
    "\n"
    "options:\n"
    "  --iterations N    uncontended, ping and --scale samples (default 2000)\n"
    "  --handoffs N      ping-pong handoffs (default 500); each waiter run\n"
    "                    takes min(N, 300)\n"
    "  --contenders N    throughput threads, one client each (default 8)\n"
    "  --seconds S       duration of each throughput run (default 1)\n"
    "  --waiters LIST    waiter counts for queued handoffs (default 2,20,200)\n"
    "  --wait MODE       how contended acquires wait: deadline (default; each\n"
    "                    gives up after 10 s) or forever\n"
    "  --scale LIST      only the held-locks measurement, for each count N in\n"
    "                    LIST (up to 8, comma-separated, each 1 to 10000000,\n"
    "                    e.g. 10,1000,100000); --iterations sets its samples\n"
    "  --client-cpu LIST run the bench on these CPUs (as taskset -c: 0, 0,1,\n"
    "                    0-1), before any client opens\n"
    "  --store-cpu LIST  move every thread of the server processes listening\n"
    "                    on each URI's loopback ports to these CPUs (refused\n"
    "                    when a URI's server is not found on this machine)\n"
    "  --json            print one JSON object instead of the table\n"
    "  --chart FILE      also draw the run (latency percentiles, handoff\n"
    "                    against waiters, throughput) into FILE, SVG or\n"
    "                    .png, with plot.py (python3-matplotlib)\n"
    "  -h, --help        show this help\n"
    "\n"
    "A URI's password is best given as password_file=FILE (its first line),\n"
    "out of the process list; reports mask every password.\n"
    "\n"
    "exit status: 0 ok, 1 mutual-exclusion violation, 64 usage or bad URI,\n"
    "70 other error (with --scale: some N could not be held; the others are\n"
    "still measured and reported).\n";

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "dlock bench: %s%s\n(see dlock bench --help)\n", what, arg);
    return BENCH_EXIT_USAGE;
}

static int parse_size(const char *s, size_t min, size_t max, size_t *out)
{
    char *end;
    unsigned long long v;

    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0.01 && v <= 3600))
        return -1;
    *out = v;
    return 0;
}

static int parse_waiters(const char *s, bench_opts *o)
{
    char buf[128], *save, *tok;

    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    o->n_waiters = 0;
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->n_waiters == BENCH_MAX_WAITER_SETS ||
            parse_size(tok, 2, BENCH_MAX_THREADS, &o->waiters[o->n_waiters]))
            return -1;
        o->n_waiters++;
    }
    return o->n_waiters ? 0 : -1;
}

/* "10,1000,100000": every item a count, no empty item, at most 8. */
static int parse_scale(const char *s, bench_opts *o)
{
    char buf[128], *item, *comma;

    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    o->n_scale = 0;
    for (item = buf;; item = comma + 1) {
        comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        if (o->n_scale == BENCH_MAX_SCALE_SETS ||
            parse_size(item, 1, BENCH_SCALE_MAX, &o->scale[o->n_scale]))
            return -1;
        o->n_scale++;
        if (!comma)
            return 0;
    }
}

/* The value of --opt=V or --opt V; NULL when missing. */
static const char *opt_value(const char *arg, size_t len, int argc,
                             char **argv, int *i)
{
    if (arg[len] == '=')
        return arg + len + 1;
    return *i + 1 < argc ? argv[++*i] : NULL;
}

static int option_is(const char *arg, const char *name)
{
    size_t len = strlen(name);

    return strncmp(arg, name, len) == 0 && (arg[len] == '\0' || arg[len] == '=');
}

/* Reads one option at argv[*i]. Returns 0, an exit status, or -1 for help. */
static int parse_option(int argc, char **argv, int *i, bench_opts *o)
{
    static const struct {
        const char *name;
        size_t min, max;
        size_t offset;
    } counts[] = {
        { "--iterations", 1, 10000000, offsetof(bench_opts, iterations) },
        { "--handoffs", 1, 1000000, offsetof(bench_opts, handoffs) },
        { "--contenders", 1, BENCH_MAX_THREADS, offsetof(bench_opts, contenders) },
    };
    const char *arg = argv[*i], *val;

    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0)
        return -1;
    if (strcmp(arg, "--json") == 0) {
        o->json = 1;
        return 0;
    }
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        if (!option_is(arg, counts[k].name))
            continue;
        val = opt_value(arg, strlen(counts[k].name), argc, argv, i);
        if (!val || parse_size(val, counts[k].min, counts[k].max,
                               (size_t *)((char *)o + counts[k].offset)))
            return usage_error("bad or missing number for ", counts[k].name);
        return 0;
    }
    if (option_is(arg, "--seconds")) {
        val = opt_value(arg, strlen("--seconds"), argc, argv, i);
        if (!val || parse_seconds(val, &o->seconds))
            return usage_error("--seconds wants a number between 0.01 and 3600",
                               "");
        return 0;
    }
    if (option_is(arg, "--chart")) {
        o->chart = opt_value(arg, strlen("--chart"), argc, argv, i);
        if (!o->chart || !*o->chart)
            return usage_error("--chart wants a file name", "");
        return 0;
    }
    if (option_is(arg, "--wait")) {
        val = opt_value(arg, strlen("--wait"), argc, argv, i);
        if (val && strcmp(val, "deadline") == 0)
            o->wait = DLOCK_WAIT_DEADLINE;
        else if (val && strcmp(val, "forever") == 0)
            o->wait = DLOCK_WAIT_FOREVER;
        else
            return usage_error("--wait wants deadline or forever", "");
        return 0;
    }
    if (option_is(arg, "--waiters")) {
        val = opt_value(arg, strlen("--waiters"), argc, argv, i);
        if (!val || parse_waiters(val, o))
            return usage_error("--waiters wants up to 8 comma-separated "
                               "counts, each 2 to 1000", "");
        return 0;
    }
    if (option_is(arg, "--client-cpu") || option_is(arg, "--store-cpu")) {
        int client = option_is(arg, "--client-cpu");
        size_t len = strlen(client ? "--client-cpu" : "--store-cpu");

        val = opt_value(arg, len, argc, argv, i);
        if (!val || bench_cpulist_parse(val, client ? &o->client_cpus : &o->store_cpus))
            return usage_error(client ? "--client-cpu" : "--store-cpu",
                               " wants CPUs of this machine as a list such as "
                               "0, 0,1 or 0-1");
        *(client ? &o->pin_client : &o->pin_store) = 1;
        return 0;
    }
    if (option_is(arg, "--scale")) {
        val = opt_value(arg, strlen("--scale"), argc, argv, i);
        if (!val || parse_scale(val, o))
            return usage_error("--scale wants up to 8 comma-separated counts, "
                               "each 1 to 10000000", "");
        return 0;
    }
    return usage_error("unknown option ", arg);
}

/* --scale measures one client on its own: the options of the contended runs
 * would be silently ignored, so they are refused. */
static int check_scale(int argc, char **argv, const bench_opts *o)
{
    static const char *const crowd[] = { "--handoffs", "--contenders",
                                         "--seconds", "--waiters", "--wait",
                                         "--chart" };

    if (!o->n_scale)
        return 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        for (size_t k = 0; k < sizeof crowd / sizeof crowd[0]; k++)
            if (option_is(argv[i], crowd[k]))
                return usage_error(crowd[k], " does not apply to --scale");
    return 0;
}

/* Fills o and collects the URIs into *urisp. Returns 0, -1 after printing
 * the help, or an exit status. */
static int parse_args(int argc, char **argv, bench_opts *o, char ***urisp,
                      size_t *n_uris)
{
    char **uris = calloc((size_t)argc + 1, sizeof *uris);
    int only_uris = 0;

    *o = (bench_opts){ .iterations = 2000, .handoffs = 500, .contenders = 8,
                       .seconds = 1, .waiters = { 2, 20, 200 }, .n_waiters = 3,
                       .wait = DLOCK_WAIT_DEADLINE };
    *urisp = uris;
    *n_uris = 0;
    if (!uris) {
        fprintf(stderr, "dlock bench: out of memory\n");
        return BENCH_EXIT_ERROR;
    }
    for (int i = 1; i < argc; i++) {
        int rc;

        if (only_uris || argv[i][0] != '-' || argv[i][1] == '\0') {
            uris[(*n_uris)++] = argv[i];
        } else if (strcmp(argv[i], "--") == 0) {
            only_uris = 1;
        } else if ((rc = parse_option(argc, argv, &i, o)) != 0) {
            if (rc < 0)
                fputs(usage_text, stdout);
            return rc;
        }
    }
    if (*n_uris == 0)
        return usage_error("no URI given", "");
    return check_scale(argc, argv, o);
}

/* "bench-<pid>-<random>": no two runs share a lock name. */
static void make_prefix(char *buf, size_t len)
{
    uint32_t r;

    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        r = (uint32_t)dlock_monotonic_ns();
    snprintf(buf, len, "bench-%ld-%08x", (long)getpid(), (unsigned int)r);
}

static int open_status(int rc)
{
    return rc == DLOCK_EBADURI || rc == DLOCK_ESCHEME ||
                   rc == DLOCK_ENOBACKEND || rc == DLOCK_EINVAL
               ? BENCH_EXIT_USAGE
               : BENCH_EXIT_ERROR;
}

/* --client-cpu (before any client starts a thread, so that every thread
 * inherits it), --store-cpu, then what each URI's placement is. */
static int place_all(char **uris, size_t n, const bench_opts *o,
                     bench_result *rs)
{
    char msg[160];

    if (o->pin_client && sched_setaffinity(0, sizeof o->client_cpus, &o->client_cpus) != 0) {
        fprintf(stderr, "dlock bench: --client-cpu: %s\n", strerror(errno));
        return BENCH_EXIT_ERROR;
    }
    for (size_t i = 0; i < n; i++) {
        bench_place_find(uris[i], &rs[i].place);
        if (!o->pin_store)
            continue;
        if (rs[i].place.where != BENCH_WHERE_LOOPBACK)
            return usage_error("--store-cpu: no server process on this machine "
                               "found for ", rs[i].uri_shown);
        if (bench_place_pin(&rs[i].place, &o->store_cpus, msg, sizeof msg) != 0) {
            fprintf(stderr, "dlock bench: --store-cpu: %s: %s\n", rs[i].uri_shown, msg);
            return BENCH_EXIT_ERROR;
        }
    }
    for (size_t i = 0; i < n; i++)
        bench_place_read(&rs[i].place);
    return 0;
}

/* Opens a client per URI up front, so that a typo fails before any run. */
static int open_all(char **uris, size_t n, const bench_opts *o,
                    dlock_client **clients, bench_result *rs)
{
    int prc;

    for (size_t i = 0; i < n; i++) {
        rs[i].uri_shown = bench_uri_mask(uris[i]);
        if (!rs[i].uri_shown) {
            fprintf(stderr, "dlock bench: out of memory\n");
            return BENCH_EXIT_ERROR;
        }
    }
    if ((prc = place_all(uris, n, o, rs)) != 0)
        return prc;
    for (size_t i = 0; i < n; i++) {
        int rc;

        rc = dlock_client_open(uris[i], &clients[i]);
        if (rc != 0) {
            fprintf(stderr, "dlock bench: %s: %s: %s\n", rs[i].uri_shown,
                    dlock_err_name(rc), dlock_errmsg(clients[i]));
            return open_status(rc);
        }
        snprintf(rs[i].backend, sizeof rs[i].backend, "%s",
                 dlock_client_backend(clients[i]));
        rs[i].caps = dlock_client_caps(clients[i]);
        if (strcmp(rs[i].backend, "file") != 0)
            bench_store_version(uris[i], rs[i].backend, rs[i].store_version,
                                sizeof rs[i].store_version);
    }
    return 0;
}

/* Per phase: clear the stop flag and give the watchdog a budget. A phase
 * stops itself within BENCH_PHASE_CAP_NS plus a few BENCH_WAIT_NS waits. */
static void phase(bench_watchdog *wd, const bench_result *r, const char *what,
                  double extra_s, bench_ctx *ctx)
{
    atomic_store(&ctx->stop, 0);
    bench_watchdog_arm(wd, r->uri_shown, what,
                       BENCH_PHASE_CAP_NS + 4 * BENCH_WAIT_NS +
                           (uint64_t)(extra_s * 1e9));
}

/* Every measurement on one store, stopping at the first error. */
static int run_uri(const char *uri, dlock_client *c, const char *prefix,
                   const bench_opts *o, bench_result *r, bench_ctx *ctx,
                   bench_watchdog *wd)
{
    char name[96];
    int rc;

    phase(wd, r, "ping", 0, ctx);
    if ((rc = bench_run_ping(c, o, r, ctx)) != 0)
        return rc;
    phase(wd, r, "uncontended acquire+release", 0, ctx);
    snprintf(name, sizeof name, "%s-solo", prefix);
    if ((rc = bench_run_uncontended(c, name, DLOCK_MODE_EXCLUSIVE, o, &r->uncontended,
                                    ctx)) != 0)
        return rc;
    phase(wd, r, "ping-pong handoff", 0, ctx);
    snprintf(name, sizeof name, "%s-pingpong", prefix);
    if ((rc = bench_run_pingpong(uri, name, 0, 0, o, &r->handoff, r, ctx)) != 0)
        return rc;
    if (r->caps & DLOCK_CAP_ELECTION) {
        phase(wd, r, "election handoff", 0, ctx);
        snprintf(name, sizeof name, "%s-elect", prefix);
        if ((rc = bench_run_pingpong(uri, name, 0, 1, o, &r->elect_handoff, r, ctx)) != 0)
            return rc;
        phase(wd, r, "observer notice", 0, ctx);
        snprintf(name, sizeof name, "%s-observe", prefix);
        if ((rc = bench_run_observe(uri, name, o, &r->observe_notice, ctx)) != 0)
            return rc;
    }
    if (r->caps & DLOCK_CAP_SHARED) {
        phase(wd, r, "shared acquire+release, uncontended", 0, ctx);
        snprintf(name, sizeof name, "%s-shared", prefix);
        if ((rc = bench_run_uncontended(c, name, DLOCK_MODE_SHARED, o,
                                        &r->shared_uncontended, ctx)) != 0)
            return rc;
    }
    if (r->caps & DLOCK_CAP_SEMAPHORE) {
        phase(wd, r, "semaphore handoff", 0, ctx);
        snprintf(name, sizeof name, "%s-semaphore", prefix);
        if ((rc = bench_run_pingpong(uri, name, BENCH_SEM_LIMIT, 0, o, &r->sem_handoff, r,
                                     ctx)) != 0)
            return rc;
    }
    phase(wd, r, "throughput on one name", o->seconds, ctx);
    snprintf(name, sizeof name, "%s-crowd", prefix);
    if ((rc = bench_run_throughput(uri, name, 0, o, r, ctx)) != 0)
        return rc;
    phase(wd, r, "throughput on own names", o->seconds, ctx);
    snprintf(name, sizeof name, "%s-own", prefix);
    if ((rc = bench_run_throughput(uri, name, 1, o, r, ctx)) != 0)
        return rc;
    for (size_t i = 0; i < o->n_waiters; i++) {
        phase(wd, r, "handoff with waiters", 0, ctx);
        snprintf(name, sizeof name, "%s-queue%zu", prefix, o->waiters[i]);
        rc = bench_run_waiters(uri, name, o->waiters[i], o, &r->waiters[i], r,
                               ctx);
        if (rc != 0)
            return rc;
        r->n_waiters = i + 1;
    }
    return 0;
}

/* --scale: each N on a client of its own. An N the store cannot hold is
 * reported and the next one still runs; returns how many failed. */
static size_t run_uri_scale(const char *uri, const char *prefix,
                            const bench_opts *o, bench_result *r,
                            bench_ctx *ctx, bench_watchdog *wd)
{
    char name[96];
    size_t failed = 0;

    for (size_t i = 0; i < o->n_scale; i++) {
        /* Filling and releasing are capped apart from the two sample sets. */
        phase(wd, r, "held locks at scale",
              (2.0 * BENCH_SCALE_CAP_NS + BENCH_PHASE_CAP_NS) / 1e9, ctx);
        snprintf(name, sizeof name, "%s-scale%zu", prefix, o->scale[i]);
        if (bench_run_scale(uri, name, o->scale[i], o, &r->scale[i]) != 0) {
            fprintf(stderr, "dlock bench: %s: %zu locks: %s\n", r->uri_shown,
                    o->scale[i], r->scale[i].msg);
            failed++;
        }
        r->n_scale = i + 1;
    }
    return failed;
}

static int run_all(char **uris, size_t n, dlock_client **clients,
                   const bench_opts *o, bench_result *rs)
{
    size_t scale_failed = 0;
    char prefix[32], uprefix[64];
    uint64_t violations = 0;
    bench_watchdog wd;
    int status = BENCH_EXIT_OK;

    if (bench_watchdog_start(&wd) != 0) {
        fprintf(stderr, "dlock bench: cannot start the watchdog thread\n");
        return BENCH_EXIT_ERROR;
    }
    make_prefix(prefix, sizeof prefix);
    if (!o->json)
        bench_print_header(o);
    for (size_t i = 0; i < n; i++) {
        bench_ctx ctx;
        int rc;

        snprintf(uprefix, sizeof uprefix, "%s-%zu", prefix, i);
        bench_ctx_init(&ctx);
        if (o->n_scale) {
            scale_failed += run_uri_scale(uris[i], uprefix, o, &rs[i], &ctx, &wd);
            rc = 0;
        } else {
            rc = run_uri(uris[i], clients[i], uprefix, o, &rs[i], &ctx, &wd);
        }
        bench_watchdog_arm(&wd, "", "", 0);
        violations += rs[i].violations;
        if (rc != 0)
            fprintf(stderr, "dlock bench: %s: %s\n", rs[i].uri_shown, ctx.msg);
        bench_ctx_destroy(&ctx);
        if (rc != 0) {
            status = BENCH_EXIT_ERROR;
            break;
        }
        if (!o->json)
            bench_print_table(o, &rs[i]);
        fflush(stdout);
    }
    bench_watchdog_stop(&wd);
    if (status == BENCH_EXIT_OK && o->json)
        bench_print_json(stdout, o, rs, n);
    /* A chart of a run that broke exclusion still shows the figures. */
    if (status == BENCH_EXIT_OK && o->chart &&
        bench_render_chart(o, rs, n) != BENCH_EXIT_OK && !violations)
        status = BENCH_EXIT_ERROR;
    if (status == BENCH_EXIT_OK && scale_failed)
        status = BENCH_EXIT_ERROR;
    if (violations) {
        fprintf(stderr, "dlock bench: mutual exclusion was violated %llu "
                "times\n", (unsigned long long)violations);
        status = BENCH_EXIT_VIOLATION;
    }
    return status;
}

/* A thousand waiters are a thousand clients, each with a socket or two (and
 * a wake-up pipe on ZooKeeper): more than the usual soft limit of 1024
 * descriptors, well under the usual hard one. */
static void raise_fd_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int dlock_bench_main(int argc, char **argv)
{
    bench_opts o;
    char **uris;
    size_t n = 0;
    dlock_client **clients = NULL;
    bench_result *rs = NULL;
    int rc = parse_args(argc, argv, &o, &uris, &n);

    if (rc != 0) {
        free(uris);
        return rc < 0 ? BENCH_EXIT_OK : rc;
    }
    raise_fd_limit();
    clients = calloc(n, sizeof *clients);
    rs = calloc(n, sizeof *rs);
    if (!clients || !rs) {
        fprintf(stderr, "dlock bench: out of memory\n");
        rc = BENCH_EXIT_ERROR;
    } else if ((rc = open_all(uris, n, &o, clients, rs)) == 0) {
        rc = run_all(uris, n, clients, &o, rs);
    }
    for (size_t i = 0; clients && rs && i < n; i++) {
        dlock_client_close(clients[i]);
        free(rs[i].uri_shown);
    }
    free(rs);
    free(clients);
    free(uris);
    return rc;
}
