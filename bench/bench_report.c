/* Output: the human table and the JSON record, and what they say about the
 * machine. Figures are microseconds with one decimal. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench_int.h"
#include "core/uri.h"
#include "tools/cli.h"
#include "dlock_backend.h"

static const struct {
    unsigned int bit;
    const char *name;
} cap_names[] = {
    { DLOCK_CAP_LEASE, "lease" },       { DLOCK_CAP_RENEW, "renew" },
    { DLOCK_CAP_FENCING, "fencing" },   { DLOCK_CAP_FIFO, "fifo" },
    { DLOCK_CAP_BLOCKING, "blocking" }, { DLOCK_CAP_SHARED, "shared" },
    { DLOCK_CAP_DEADLINE, "deadline" }, { DLOCK_CAP_HOLDER_DEATH, "holder-death" },
    { DLOCK_CAP_RAISE, "raise" },       { DLOCK_CAP_CANCEL, "cancel" },
    { DLOCK_CAP_SEMAPHORE, "semaphore" }, { DLOCK_CAP_ELECTION, "election" },
    { DLOCK_CAP_WATCH, "watch" },       { DLOCK_CAP_TOKEN_SHARED, "shared-tokens" },
};
#define N_CAPS (sizeof cap_names / sizeof cap_names[0])

/* Copy of uri with its secrets masked (dlock_uri_hide()), for display
 * only. NULL when out of memory. */
char *bench_uri_mask(const char *uri)
{
    return dlock_uri_hide(uri, DLOCK_URI_MASK);
}

/* Like `nproc`: the CPUs this process may run on. */
static long cpu_count(void)
{
    cpu_set_t set;

    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    return sysconf(_SC_NPROCESSORS_ONLN);
}

/* Like `uname -srm`. */
static void machine_name(char *buf, size_t len)
{
    struct utsname u;

    if (uname(&u) != 0)
        snprintf(buf, len, "unknown");
    else
        snprintf(buf, len, "%s %s %s", u.sysname, u.release, u.machine);
}

static void print_caps(FILE *f, unsigned int caps, const char *sep,
                       const char *quote)
{
    const char *s = "";

    if (!caps && !*quote)
        fprintf(f, "none");
    for (size_t i = 0; i < N_CAPS; i++) {
        if (caps & cap_names[i].bit) {
            fprintf(f, "%s%s%s%s", s, quote, cap_names[i].name, quote);
            s = sep;
        }
    }
}

static void print_waiter_list(FILE *f, const bench_opts *o)
{
    for (size_t i = 0; i < o->n_waiters; i++)
        fprintf(f, "%s%zu", i ? "," : "", o->waiters[i]);
}

static void print_scale_list(FILE *f, const bench_opts *o)
{
    for (size_t i = 0; i < o->n_scale; i++)
        fprintf(f, "%s%zu", i ? "," : "", o->scale[i]);
}

static const char *wait_name(const bench_opts *o)
{
    return o->wait == DLOCK_WAIT_FOREVER ? "forever" : "deadline";
}

void bench_print_header(const bench_opts *o)
{
    char machine[256];

    machine_name(machine, sizeof machine);
    printf("dlock bench: libdlock %s, %s, %ld CPUs\n", dlock_version(),
           machine, cpu_count());
    if (o->n_scale) {
        printf("options: --iterations %zu --scale ", o->iterations);
        print_scale_list(stdout, o);
        printf("\n");
        return;
    }
    printf("options: --iterations %zu --handoffs %zu --contenders %zu "
           "--seconds %g --wait %s --waiters ",
           o->iterations, o->handoffs, o->contenders, o->seconds, wait_name(o));
    print_waiter_list(stdout, o);
    printf("\n");
}

static void row(const char *label, const bench_stats *s, const char *note)
{
    printf("  %-32s %7zu %9.1f %9.1f %9.1f %9.1f%s\n", label, s->n, s->p50,
           s->p99, s->mean, s->max, note);
}

/* A mode's row, its p50 against the exclusive one's (the targets: shared
 * within 1.2x, the semaphore handoff within 1.5x), or n/a. */
static void mode_row(const char *label, unsigned int has, const bench_stats *s,
                     const bench_stats *exclusive, const char *none)
{
    char note[64] = "";

    if (!has) {
        printf("  %-32s %7s  (%s)\n", label, "n/a", none);
        return;
    }
    if (exclusive->p50 > 0)
        snprintf(note, sizeof note, "  (p50 %.2fx the exclusive)", s->p50 / exclusive->p50);
    row(label, s, note);
}

static void tput_row(size_t contenders, const char *what, const bench_tput *t)
{
    printf("  %zu contenders, %-18s %12.1f %14llu", contenders, what, t->rate,
           (unsigned long long)t->acquisitions);
    if (t->timeouts)
        printf("  (%llu acquires timed out)", (unsigned long long)t->timeouts);
    printf("\n");
}

/* --scale: the fill, memory and release figures per N, then the latencies
 * measured with all N held (only for the N actually reached). */
static void print_scale(const bench_result *r)
{
    char heap[32], label[64];

    printf("  %-32s %12s %11s %11s %12s\n", "one client holding N locks",
           "fill acq/s", "heap B/lock", "RSS B/lock", "release/s");
    for (size_t i = 0; i < r->n_scale; i++) {
        const bench_scale_result *s = &r->scale[i];

        if (s->heap_known)
            snprintf(heap, sizeof heap, "%.1f", s->heap_per_lock);
        else
            snprintf(heap, sizeof heap, "n/a");
        snprintf(label, sizeof label, "N = %zu", s->want);
        printf("  %-32s %12.1f %11s %11.1f %12.1f\n", label, s->fill_rate,
               heap, s->rss_per_lock, s->release_rate);
        if (s->err)
            printf("    %zu held, then: %s\n", s->held, s->msg);
        if (s->released < s->held)
            printf("    %zu released in %llu s, the rest by closing the "
                   "client\n", s->released,
                   (unsigned long long)(BENCH_SCALE_CAP_NS / 1000000000u));
    }
    printf("  %-32s %7s %9s %9s %9s %9s\n", "latency with H held, us", "n",
           "p50", "p99", "mean", "max");
    for (size_t i = 0; i < r->n_scale; i++) {
        const bench_scale_result *s = &r->scale[i];

        if (!s->extra.n && !s->renew.n)
            continue;
        snprintf(label, sizeof label, "H = %zu, acq+rel 1 more", s->held);
        row(label, &s->extra, "");
        snprintf(label, sizeof label, "H = %zu, renew a held one", s->held);
        if (s->renew_supported)
            row(label, &s->renew, "");
        else
            printf("  %-32s %7s  (the backend cannot renew)\n", label, "n/a");
    }
}

/* "placement: client CPUs 0; server pid 812 on CPUs 1: different CPUs" */
static void print_placement(const bench_placement *p)
{
    char cpus[256];

    bench_cpulist_format(&p->client_cpus, cpus, sizeof cpus, ",");
    printf("  placement: client CPUs %s", cpus);
    if (p->n_servers) {
        printf("; server pid%s", p->n_servers > 1 ? "s" : "");
        for (size_t i = 0; i < p->n_servers; i++)
            printf("%s%ld", i ? "," : " ", (long)p->servers[i]);
        bench_cpulist_format(&p->server_cpus, cpus, sizeof cpus, ",");
        printf(" on CPUs %s", cpus);
    }
    printf(": %s\n", p->summary ? p->summary : "unknown");
}

static void json_placement(FILE *f, const bench_placement *p)
{
    char cpus[256];

    bench_cpulist_format(&p->client_cpus, cpus, sizeof cpus, ",");
    fprintf(f, "\"placement\":{\"client_cpus\":[%s],\"server_pids\":[", cpus);
    for (size_t i = 0; i < p->n_servers; i++)
        fprintf(f, "%s%ld", i ? "," : "", (long)p->servers[i]);
    bench_cpulist_format(&p->server_cpus, cpus, sizeof cpus, ",");
    fprintf(f, "],\"server_cpus\":[%s],\"summary\":", cpus);
    dlock_json_string(f, p->summary ? p->summary : "unknown");
    fprintf(f, "},");
}

void bench_print_table(const bench_opts *o, const bench_result *r)
{
    char label[64], note[96];

    printf("\n%s  (backend %s; caps ", r->uri_shown, r->backend);
    print_caps(stdout, r->caps, ",", "");
    printf(")\n");
    print_placement(&r->place);
    if (o->n_scale) {
        print_scale(r);
        return;
    }
    printf("  %-32s %7s %9s %9s %9s %9s\n", "latency, us", "n", "p50",
           "p99", "mean", "max");
    if (r->ping_supported)
        row("store round trip (ping)", &r->ping, "");
    else
        printf("  %-32s %7s  (the backend has no ping)\n",
               "store round trip (ping)", "n/a");
    row("acquire+release, uncontended", &r->uncontended, "");
    row("handoff, ping-pong", &r->handoff, "");
    mode_row("shared acquire+release", r->caps & DLOCK_CAP_SHARED, &r->shared_uncontended,
             &r->uncontended, "the backend has no shared locks");
    mode_row("semaphore handoff, ping-pong", r->caps & DLOCK_CAP_SEMAPHORE, &r->sem_handoff,
             &r->handoff, "the backend has no semaphores");
    mode_row("election handoff, ping-pong", r->caps & DLOCK_CAP_ELECTION, &r->elect_handoff,
             &r->handoff, "the backend has no elections");
    if (!(r->caps & DLOCK_CAP_ELECTION)) {
        printf("  %-32s %7s  (the backend has no elections)\n", "observer notice of a proclaim",
               "n/a");
    } else {
        note[0] = '\0';
        if (r->ping_supported && r->ping.p50 > 0)
            snprintf(note, sizeof note, "  (p50 %.2fx the round trip%s)",
                     r->observe_notice.p50 / r->ping.p50,
                     r->caps & DLOCK_CAP_WATCH ? "" : "; polled every 100 ms");
        row("observer notice of a proclaim", &r->observe_notice, note);
    }
    for (size_t i = 0; i < r->n_waiters; i++) {
        const bench_waiter_result *w = &r->waiters[i];

        snprintf(label, sizeof label, "handoff, %zu waiters", w->waiters);
        note[0] = '\0';
        if (w->self || w->timeouts)
            snprintf(note, sizeof note, "  (%llu re-grants to the releaser, "
                     "%llu timeouts)", (unsigned long long)w->self,
                     (unsigned long long)w->timeouts);
        row(label, &w->handoff, note);
    }
    printf("  %-32s %12s %14s\n", "throughput", "acq/s", "acquisitions");
    tput_row(o->contenders, "one name", &r->tput_one);
    tput_row(o->contenders, "own names", &r->tput_own);
    printf("  mutual exclusion: %llu violations\n",
           (unsigned long long)r->violations);
}

static void json_stats(FILE *f, const char *key, const bench_stats *s)
{
    fprintf(f, "\"%s\":{\"n\":%zu,\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,"
               "\"mean\":%.1f,\"max\":%.1f}",
            key, s->n, s->p50, s->p90, s->p99, s->mean, s->max);
}

static void json_tput(FILE *f, const char *key, const bench_tput *t)
{
    fprintf(f, "\"%s\":{\"per_second\":%.1f,\"acquisitions\":%llu,"
               "\"timeouts\":%llu}",
            key, t->rate, (unsigned long long)t->acquisitions,
            (unsigned long long)t->timeouts);
}

static void json_scale(FILE *f, const bench_result *r)
{
    fprintf(f, "\"scale\":[");
    for (size_t i = 0; i < r->n_scale; i++) {
        const bench_scale_result *s = &r->scale[i];

        fprintf(f, "%s{\"locks\":%zu,\"held\":%zu,\"error\":", i ? "," : "",
                s->want, s->held);
        if (s->err)
            dlock_json_string(f, s->msg);
        else
            fprintf(f, "null");
        fprintf(f, ",\"fill_per_second\":%.1f,\"heap_bytes_per_lock\":",
                s->fill_rate);
        if (!s->heap_known)
            fprintf(f, "null");
        else
            fprintf(f, "%.1f", s->heap_per_lock);
        fprintf(f, ",\"rss_bytes_per_lock\":%.1f,\"released\":%zu,"
                   "\"release_per_second\":%.1f,",
                s->rss_per_lock, s->released, s->release_rate);
        json_stats(f, "acquire_release_us", &s->extra);
        fprintf(f, ",");
        if (s->renew_supported)
            json_stats(f, "renew_us", &s->renew);
        else
            fprintf(f, "\"renew_us\":null");
        fprintf(f, "}");
    }
    fprintf(f, "]");
}

static void json_result(FILE *f, const bench_opts *o, const bench_result *r)
{
    fprintf(f, "{\"uri\":");
    dlock_json_string(f, r->uri_shown);
    fprintf(f, ",\"backend\":");
    dlock_json_string(f, r->backend);
    fprintf(f, ",\"store_version\":");
    if (r->store_version[0])
        dlock_json_string(f, r->store_version);
    else
        fprintf(f, "null");
    fprintf(f, ",\"caps\":[");
    print_caps(f, r->caps, ",", "\"");
    fprintf(f, "],");
    json_placement(f, &r->place);
    if (o->n_scale) {
        json_scale(f, r);
        fprintf(f, "}");
        return;
    }
    if (r->ping_supported)
        json_stats(f, "ping_us", &r->ping);
    else
        fprintf(f, "\"ping_us\":null");
    fprintf(f, ",");
    json_stats(f, "uncontended_us", &r->uncontended);
    fprintf(f, ",");
    json_stats(f, "handoff_pingpong_us", &r->handoff);
    fprintf(f, ",");
    if (r->caps & DLOCK_CAP_SHARED)
        json_stats(f, "shared_uncontended_us", &r->shared_uncontended);
    else
        fprintf(f, "\"shared_uncontended_us\":null");
    fprintf(f, ",\"semaphore_limit\":%u,", BENCH_SEM_LIMIT);
    if (r->caps & DLOCK_CAP_SEMAPHORE)
        json_stats(f, "semaphore_handoff_pingpong_us", &r->sem_handoff);
    else
        fprintf(f, "\"semaphore_handoff_pingpong_us\":null");
    fprintf(f, ",");
    if (r->caps & DLOCK_CAP_ELECTION) {
        json_stats(f, "election_handoff_pingpong_us", &r->elect_handoff);
        fprintf(f, ",");
        json_stats(f, "observer_notice_us", &r->observe_notice);
    } else {
        fprintf(f, "\"election_handoff_pingpong_us\":null,\"observer_notice_us\":null");
    }
    fprintf(f, ",\"handoff_waiters\":[");
    for (size_t i = 0; i < r->n_waiters; i++) {
        const bench_waiter_result *w = &r->waiters[i];

        fprintf(f, "%s{\"waiters\":%zu,", i ? "," : "", w->waiters);
        json_stats(f, "handoff_us", &w->handoff);
        fprintf(f, ",\"regrants_to_releaser\":%llu,\"timeouts\":%llu}",
                (unsigned long long)w->self, (unsigned long long)w->timeouts);
    }
    fprintf(f, "],\"throughput\":{\"contenders\":%zu,\"seconds\":%g,",
            o->contenders, o->seconds);
    json_tput(f, "one_name", &r->tput_one);
    fprintf(f, ",");
    json_tput(f, "own_names", &r->tput_own);
    fprintf(f, "},\"violations\":%llu}", (unsigned long long)r->violations);
}

/* The "model name" of /proc/cpuinfo (x86), or its "Model"/"cpu" line
 * elsewhere; "unknown" when there is none. */
static void cpu_model(char *buf, size_t len)
{
    static const char *const keys[] = { "model name", "Model", "cpu model",
                                        "cpu" };
    char line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");

    snprintf(buf, len, "unknown");
    if (!f)
        return;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        rewind(f);
        while (fgets(line, sizeof line, f)) {
            size_t kl = strlen(keys[k]);
            char *v;

            if (strncmp(line, keys[k], kl) != 0 ||
                (line[kl] != '\t' && line[kl] != ' ' && line[kl] != ':') ||
                !(v = strchr(line + kl, ':')))
                continue;
            v += 1 + strspn(v + 1, " \t");
            v[strcspn(v, "\n")] = '\0';
            if (*v) {
                snprintf(buf, len, "%s", v);
                fclose(f);
                return;
            }
        }
    }
    fclose(f);
}

void bench_print_json(FILE *f, const bench_opts *o, const bench_result *rs,
                      size_t n)
{
    char machine[256], cpu[256];
    struct utsname u;

    machine_name(machine, sizeof machine);
    cpu_model(cpu, sizeof cpu);
    fprintf(f, "{\"tool\":\"dlock bench\",\"units\":\"us\",\"machine\":{\"uname\":");
    dlock_json_string(f, machine);
    fprintf(f, ",\"kernel\":");
    dlock_json_string(f, uname(&u) == 0 ? u.release : "unknown");
    fprintf(f, ",\"cpu_model\":");
    dlock_json_string(f, cpu);
    fprintf(f, ",\"nproc\":%ld,\"dlock_version\":", cpu_count());
    dlock_json_string(f, dlock_version());
    fprintf(f, "},\"options\":{\"iterations\":%zu,\"handoffs\":%zu,"
               "\"contenders\":%zu,\"seconds\":%g,\"wait\":\"%s\",\"waiters\":[",
            o->iterations, o->handoffs, o->contenders, o->seconds, wait_name(o));
    print_waiter_list(f, o);
    fprintf(f, "],\"scale\":[");
    print_scale_list(f, o);
    fprintf(f, "]},\"results\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            fprintf(f, ",");
        json_result(f, o, &rs[i]);
    }
    fprintf(f, "]}\n");
}
