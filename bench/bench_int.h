/* Private to bench/: options, samples, results and the measurement runs. */
#ifndef DLOCK_BENCH_INT_H
#define DLOCK_BENCH_INT_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "dlock.h"

#define BENCH_EXIT_OK 0
#define BENCH_EXIT_VIOLATION 1
#define BENCH_EXIT_USAGE 64
#define BENCH_EXIT_ERROR 70

#define BENCH_MAX_WAITER_SETS 8
#define BENCH_MAX_THREADS 1000
/* Every loop stops by itself: by count, and by these time bounds. */
#define BENCH_PHASE_CAP_NS (20ull * 1000000000ull)  /* one measurement */
#define BENCH_WAIT_NS (10ull * 1000000000ull)       /* one acquire, one peer */
#define BENCH_WAITER_HANDOFFS 300  /* most samples per waiter set */
/* The semaphore handoff: a semaphore of this limit, all its permits but one
 * held throughout by clients of their own, the last one passed in
 * ping-pong. */
#define BENCH_SEM_LIMIT 2
/* --scale: up to 8 sizes of at most 10 million locks, each held on a 10 min
 * lease so that none expires during the run; filling, and releasing, one
 * size is cut after BENCH_SCALE_CAP_NS. */
#define BENCH_MAX_SCALE_SETS 8
#define BENCH_SCALE_MAX 10000000u
#define BENCH_SCALE_TTL_MS 600000u
#define BENCH_SCALE_CAP_NS (120ull * 1000000000ull)

typedef struct bench_opts {
    size_t iterations;
    size_t handoffs;
    size_t contenders;
    double seconds;
    size_t waiters[BENCH_MAX_WAITER_SETS];
    size_t n_waiters;
    size_t scale[BENCH_MAX_SCALE_SETS];  /* --scale: only that measurement */
    size_t n_scale;
    dlock_wait wait;  /* DLOCK_WAIT_DEADLINE (bounded) or DLOCK_WAIT_FOREVER */
    int json;
    const char *chart;  /* --chart FILE: render the JSON with plot.py */
    int pin_client, pin_store;  /* --client-cpu, --store-cpu given */
    cpu_set_t client_cpus, store_cpus;
} bench_opts;

/* Where the bench and a store's server ran; see bench_place.c. */
#define BENCH_MAX_SERVERS 16
enum { BENCH_WHERE_UNKNOWN, BENCH_WHERE_IN_PROCESS, BENCH_WHERE_LOOPBACK };
typedef struct bench_placement {
    int where;                        /* BENCH_WHERE_* */
    pid_t servers[BENCH_MAX_SERVERS]; /* listening on the URI's ports */
    size_t n_servers;
    cpu_set_t client_cpus, server_cpus;  /* server_cpus: all their threads' */
    const char *summary;  /* "same CPU", "different CPUs", "overlapping CPUs",
                             "unpinned", "in process", "unknown" */
} bench_placement;

/* Ends the process with status 70 when a phase overruns its time budget:
 * the last resort against a wait that never returns. */
typedef struct bench_watchdog {
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    uint64_t deadline_ns;  /* 0: disarmed */
    const char *uri, *what;
} bench_watchdog;

/* Durations in ns, filled by one thread or by many through an atomic slot. */
typedef struct bench_samples {
    uint64_t *ns;
    size_t cap;
    atomic_size_t n;
} bench_samples;

/* Summary of a sample set, in microseconds. */
typedef struct bench_stats {
    size_t n;
    double p50, p90, p99, mean, max;
} bench_stats;

/* Shared state a holder checks: see bench_crit_enter(). */
typedef struct bench_crit {
    atomic_int inside;
    atomic_uint_fast64_t counter;
    atomic_uint_fast64_t violations;
} bench_crit;

/* One measurement's stop flag and its first error. */
typedef struct bench_ctx {
    atomic_int stop;
    pthread_mutex_t mu;
    int err;
    char msg[DLOCK_ERRMSG_MAX + 128];
} bench_ctx;

typedef struct bench_waiter_result {
    size_t waiters;
    bench_stats handoff;
    uint64_t self;     /* grants that went back to the thread that released */
    uint64_t timeouts;
} bench_waiter_result;

typedef struct bench_tput {
    double rate;           /* acquisitions per second */
    uint64_t acquisitions;
    uint64_t timeouts;     /* acquires that gave up after BENCH_WAIT_NS */
} bench_tput;

/* One client holding `want` locks at once; see bench_scale.c. */
typedef struct bench_scale_result {
    size_t want;           /* N asked for */
    size_t held;           /* locks actually taken */
    double fill_rate;      /* acquisitions per second while filling */
    double release_rate;   /* releases per second, oldest first */
    size_t released;       /* within BENCH_SCALE_CAP_NS; close did the rest */
    double heap_per_lock;  /* bytes, malloc heap in use (mallinfo2) */
    int heap_known;        /* 0: the C library cannot tell */
    double rss_per_lock;   /* bytes, resident set (/proc/self/statm) */
    bench_stats extra;     /* acquire+release of one more name */
    bench_stats renew;     /* renew of a held lock */
    int renew_supported;
    int err;               /* the error that ended this N early, 0: none */
    char msg[DLOCK_ERRMSG_MAX + 128];
} bench_scale_result;

typedef struct bench_result {
    char *uri_shown;   /* password masked */
    char backend[32];
    char store_version[96];  /* "Redis 7.0.15", "unknown"; "" for file */
    unsigned int caps;
    int ping_supported;  /* 0: the backend has no ping */
    bench_stats ping;
    bench_stats uncontended;
    bench_stats handoff;
    /* Shared locks and semaphores, where the backend has them (caps). */
    bench_stats shared_uncontended;  /* try-mode shared acquire+release */
    bench_stats sem_handoff;         /* ping-pong of a semaphore's last permit */
    /* Elections, where the backend has them (DLOCK_CAP_ELECTION). */
    bench_stats elect_handoff;       /* resign -> the next leader's campaign returns */
    bench_stats observe_notice;      /* proclaim -> an observer's callback */
    bench_tput tput_one;  /* all contenders on one name */
    bench_tput tput_own;  /* each contender on its own name */
    bench_waiter_result waiters[BENCH_MAX_WAITER_SETS];
    size_t n_waiters;
    bench_scale_result scale[BENCH_MAX_SCALE_SETS];
    size_t n_scale;
    uint64_t violations;
    bench_placement place;
} bench_result;

/* bench_place.c: find the loopback servers of uri; move them to set (-1
 * with msg on an error); read both sides' CPUs and the summary; parse a
 * CPU list ("0", "0,1", "0-1": 0, or -1) and print one with sep. */
void bench_place_find(const char *uri, bench_placement *p);
int bench_place_pin(const bench_placement *p, const cpu_set_t *set,
                    char *msg, size_t len);
void bench_place_read(bench_placement *p);
int bench_cpulist_parse(const char *s, cpu_set_t *set);
void bench_cpulist_format(const cpu_set_t *set, char *buf, size_t len,
                          const char *sep);

/* bench_util.c */
uint64_t bench_now(void);
void bench_sleep_ns(uint64_t ns);
int bench_samples_init(bench_samples *s, size_t cap);
void bench_samples_free(bench_samples *s);
int bench_samples_add(bench_samples *s, uint64_t ns);
void bench_samples_stats(bench_samples *s, bench_stats *out);
void bench_crit_init(bench_crit *c);
void bench_crit_enter(bench_crit *c);
void bench_crit_leave(bench_crit *c);
void bench_ctx_init(bench_ctx *ctx);
void bench_ctx_destroy(bench_ctx *ctx);
int bench_stopped(bench_ctx *ctx);
void bench_ctx_fail(bench_ctx *ctx, int err, const dlock_client *client,
                    const char *what);
int bench_wait_value(bench_ctx *ctx, atomic_size_t *v, size_t want,
                     const char *what);
int bench_open_clients(const char *uri, dlock_client **clients, size_t n,
                       bench_ctx *ctx);
void bench_close_clients(dlock_client **clients, size_t n);
size_t bench_spawn(pthread_t *tids, size_t n, void *(*fn)(void *),
                   void *args, size_t arg_size, bench_ctx *ctx);
void bench_join(pthread_t *tids, size_t n);
/* An exclusive acquire (a permit of a semaphore of limit, when limit > 0)
 * giving up after BENCH_WAIT_NS. */
int bench_acquire(dlock_client *c, const char *name, dlock_wait wait,
                  uint32_t limit, dlock_lock **lockp);
int bench_watchdog_start(bench_watchdog *wd);
void bench_watchdog_arm(bench_watchdog *wd, const char *uri, const char *what,
                        uint64_t budget_ns);
void bench_watchdog_stop(bench_watchdog *wd);

/* bench_solo.c: one client, then two in strict ping-pong. The
 * uncontended run takes the name in mode; the ping-pong passes a lock, or
 * with limit > 0 the last permit of a semaphore of limit (the others held
 * throughout). */
int bench_run_ping(dlock_client *c, const bench_opts *o, bench_result *r,
                   bench_ctx *ctx);
int bench_run_uncontended(dlock_client *c, const char *name, dlock_mode mode,
                          const bench_opts *o, bench_stats *out, bench_ctx *ctx);
int bench_run_pingpong(const char *uri, const char *name, uint32_t limit, int elect,
                       const bench_opts *o, bench_stats *out, bench_result *r,
                       bench_ctx *ctx);
/* bench_elect.c: a leader's proclaim to an observer's callback, one
 * proclaim at a time. */
int bench_run_observe(const char *uri, const char *name, const bench_opts *o, bench_stats *out,
                      bench_ctx *ctx);

/* bench_crowd.c: many clients at once. */
int bench_run_throughput(const char *uri, const char *prefix, int own_names,
                         const bench_opts *o, bench_result *r, bench_ctx *ctx);
int bench_run_waiters(const char *uri, const char *name, size_t waiters,
                      const bench_opts *o, bench_waiter_result *wr,
                      bench_result *r, bench_ctx *ctx);

/* bench_scale.c: one client holding many locks. */
int bench_run_scale(const char *uri, const char *prefix, size_t want,
                    const bench_opts *o, bench_scale_result *sr);

/* bench_report.c */
char *bench_uri_mask(const char *uri);
void bench_print_header(const bench_opts *o);
void bench_print_table(const bench_opts *o, const bench_result *r);
void bench_print_json(FILE *f, const bench_opts *o, const bench_result *rs,
                      size_t n);

/* bench_version.c */
void bench_store_version(const char *uri, const char *backend, char *out,
                         size_t cap);

/* bench_chart.c */
int bench_render_chart(const bench_opts *o, const bench_result *rs, size_t n);

#endif
