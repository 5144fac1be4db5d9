/*
 * dlock check URI...: a bounded black-box safety test of lock stores
 * (docs/check.md).
 *
 * For each URI, --procs worker processes loop taking one lock (a fresh name
 * per run) with .keep and a short TTL, and inside the critical section write
 * to a "fenced resource" kept in shared memory under a process-shared mutex:
 * it accepts a write whose token is above every token it accepted before
 * (or equal to it, from the grant that wrote it), and refuses the others, as
 * a resource guarded by fencing tokens does. An "inside" mark per worker,
 * set on entry and cleared on exit, shows overlapping holders. Meanwhile
 * this process injects faults into the current holder, in rounds: SIGSTOP
 * past its lease then SIGCONT, SIGKILL (a replacement is started), and with
 * --cut its connections closed by a loopback proxy (check_proxy.c) for as
 * long as a pause.
 *
 * The injector takes the resource's mutex before it signals a holder, so
 * that no worker is ever stopped or killed inside the resource: what the
 * resource records stays consistent, and a paused holder blocks nobody but
 * through the lock.
 *
 * Everything is bounded: the run of each URI ends after --duration (a hard
 * cap of DURATION_MAX_S), the faults after --rounds, every wait in a worker
 * after a second; workers are killed and reaped on the way out and die with
 * this process (PR_SET_PDEATHSIG).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/uri.h"
#include "tools/cli.h"
#include "dlock.h"

#define PROCS_DEFAULT 4
#define TTL_DEFAULT_MS 1000u
#define ROUNDS_DEFAULT 2
#define ROUNDS_MAX 100
#define DURATION_DEFAULT_S 10.0
#define DURATION_MAX_S 300.0
#define WRITES_PER_SECTION 5
/* Exit status when the check ran and safety did not hold. */
#define EX_UNSAFE 1

enum fault { F_PAUSE, F_KILL, F_CUT };

struct slot {
    pid_t pid;              /* 0: none running */
    uint64_t inside_grant;  /* the grant inside the critical section, 0: none */
    uint64_t inside_token;
    uint64_t faulted_grant; /* the grant last paused or cut in this slot */
};

/* The fenced resource and the counters, shared by all processes of a run. */
struct shared {
    pthread_mutex_t mu;
    /* The resource. */
    uint64_t highest;       /* highest token accepted */
    uint64_t last_grant;    /* the grant whose write set it */
    uint64_t newest_grant;  /* the grant that entered last */
    uint64_t newest_token;
    uint64_t max_entry_token;
    uint64_t grant_seq;
    int holder_slot;        /* the slot that entered last, -1: none yet */
    struct slot slot[CHECK_SLOTS_MAX];
    /* Counters (under mu). */
    uint64_t sections, writes, accepted, overlaps, overlaps_unexplained;
    uint64_t stale_refused, stale_accepted, out_of_order, current_refused;
    uint64_t kill_at;       /* a kill waiting for the next grant (ns), 0: none */
    uint64_t rec_n, rec_sum_ns, rec_max_ns;
    char first_problem[256];
    /* Counters bumped outside mu (atomics). */
    uint64_t losses, release_lost, acquire_errors, nokeep;
    char worker_error[DLOCK_ERRMSG_MAX];
    volatile int stop;
};

struct options {
    int procs;
    uint32_t ttl_ms;
    unsigned pause_ms;
    int rounds;
    double duration_s;
    int cut, json;
};

struct result {
    char *shown;            /* the URI list without passwords */
    char backend[32];
    int unreachable;        /* exit status when it could not be run, else 0 */
    char error[DLOCK_ERRMSG_MAX + 64];
    int cut_na;             /* --cut asked but the store has no host */
    unsigned faults[3];     /* injected, by enum fault */
    unsigned skipped;       /* faults with no holder in time */
    double elapsed_s;
    struct shared s;        /* a copy of the counters at the end */
    int exclusion_held, fencing_held, passed;
};

static volatile sig_atomic_t interrupted;

static void print_usage(FILE *f)
{
    fputs("Usage: dlock check [OPTIONS] URI...\n"
          "\n"
          "A bounded safety test of each store: worker processes take one lock in\n"
          "turn and write, with their fencing token, to a shared resource that\n"
          "refuses stale tokens; meanwhile the holder is paused past its lease\n"
          "(SIGSTOP), killed (SIGKILL) and, with --cut, cut off from the store.\n"
          "URI may be a list of stores in one argument (\"URI1 URI2\").\n"
          "\n"
          "Options:\n"
          "  -p, --procs N         worker processes (default 4, 2..16)\n"
          "      --ttl MS          lease of each grant (default 1000)\n"
          "      --pause MS        how long a holder is paused or cut (default 2 x TTL)\n"
          "  -r, --rounds N        fault rounds, each a pause, a kill and with --cut a\n"
          "                        cut (default 2, at most 100)\n"
          "  -d, --duration SECONDS\n"
          "                        time per URI (default 10, at most 300): the run\n"
          "                        stops then, whatever rounds are left\n"
          "      --cut             also cut the holder's connections through a\n"
          "                        loopback proxy (stores with network hosts)\n"
          "      --json            print a JSON array, one object per URI\n"
          "  -h, --help            show this help\n"
          "\n"
          "A URI's password is best given as password_file=FILE (its first\n"
          "line), out of the process list; no password is ever printed.\n"
          "\n"
          "Exit status: 0 if every store kept mutual exclusion, or where a holder\n"
          "paused or cut past its lease overlapped the next one, every stale write\n"
          "was refused by the token; and no grant's token was out of order;\n"
          "1 otherwise (the report says what failed); 64 usage or URI error;\n"
          "69 a store unreachable; 70 other error; 75 a store that timed out (or\n"
          "was busy) when first asked, as in dlock run. See docs/check.md.\n",
          f);
}

/* Printable, password-free copy of a URI list ("scheme://user:***@host",
 * "?sentinel_password=***"), cut at SHOWN_MAX with "...". */
static char *shown_uri(const char *list)
{
    char *masked = dlock_uri_hide(list, DLOCK_URI_MASK), *out = malloc(SHOWN_MAX + 4);

    if (masked && out)
        dlock_printable(out, masked);
    free(masked);
    if (!masked) {
        free(out);
        return NULL;
    }
    return out;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !interrupted)
        continue;
}

static void mu_lock(struct shared *s)
{
    if (pthread_mutex_lock(&s->mu) == EOWNERDEAD)
        pthread_mutex_consistent(&s->mu);
}

static void mu_unlock(struct shared *s)
{
    pthread_mutex_unlock(&s->mu);
}

static void note_problem(struct shared *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note_problem(struct shared *s, const char *fmt, ...)
{
    va_list ap;

    if (s->first_problem[0])
        return;
    va_start(ap, fmt);
    vsnprintf(s->first_problem, sizeof s->first_problem, fmt, ap);
    va_end(ap);
}

/* ---- the workers ---------------------------------------------------------- */

/* One write to the fenced resource, under mu. */
static void fenced_write(struct shared *s, uint64_t grant, uint64_t token)
{
    int superseded = s->newest_grant != grant;
    int accept = token > s->highest || (token == s->highest && s->last_grant == grant);

    s->writes++;
    if (accept) {
        s->highest = token;
        s->last_grant = grant;
        s->accepted++;
        if (superseded) {
            s->stale_accepted++;
            note_problem(s, "a stale holder's write (token %" PRIu64 ") was accepted after "
                            "a newer holder (token %" PRIu64 ") entered",
                         token, s->newest_token);
        }
    } else if (superseded) {
        s->stale_refused++;
    } else {
        s->current_refused++;
    }
}

/* Entry into the critical section, with its first write; returns the grant. */
static uint64_t enter(struct shared *s, int me, uint64_t token)
{
    uint64_t grant;

    mu_lock(s);
    grant = ++s->grant_seq;
    /* One overlap per entry that finds others inside; unexplained when one
     * of them was neither paused nor cut. */
    {
        const struct slot *other = NULL, *free_one = NULL;
        for (int i = 0; i < CHECK_SLOTS_MAX; i++) {
            const struct slot *o = &s->slot[i];
            if (i == me || !o->inside_grant)
                continue;
            other = o;
            if (o->inside_grant != o->faulted_grant)
                free_one = o;
        }
        if (other)
            s->overlaps++;
        if (free_one) {
            s->overlaps_unexplained++;
            note_problem(s, "two holders at once with no fault injected "
                            "(tokens %" PRIu64 " and %" PRIu64 ")",
                         free_one->inside_token, token);
        }
    }
    if (s->sections && token <= s->max_entry_token) {
        s->out_of_order++;
        note_problem(s, "token %" PRIu64 " granted after token %" PRIu64 ": tokens out of order",
                     token, s->max_entry_token);
    }
    if (token > s->max_entry_token)
        s->max_entry_token = token;
    s->sections++;
    s->newest_grant = grant;
    s->newest_token = token;
    s->holder_slot = me;
    s->slot[me].inside_grant = grant;
    s->slot[me].inside_token = token;
    if (s->kill_at) {
        uint64_t d = dlock_monotonic_ns() - s->kill_at;
        s->rec_n++;
        s->rec_sum_ns += d;
        if (d > s->rec_max_ns)
            s->rec_max_ns = d;
        s->kill_at = 0;
    }
    fenced_write(s, grant, token);
    mu_unlock(s);
    return grant;
}

static void write_again(struct shared *s, uint64_t grant, uint64_t token)
{
    mu_lock(s);
    fenced_write(s, grant, token);
    mu_unlock(s);
}

static void leave(struct shared *s, int me, uint64_t grant)
{
    mu_lock(s);
    if (s->slot[me].inside_grant == grant)
        s->slot[me].inside_grant = 0;
    mu_unlock(s);
}

static void on_lost(dlock_lock *lock, int err, void *user)
{
    struct shared *s = user;

    (void)lock;
    (void)err;
    __atomic_fetch_add(&s->losses, 1, __ATOMIC_RELAXED);
}

static void worker_error(struct shared *s, const char *what, const dlock_client *c, int err)
{
    __atomic_fetch_add(&s->acquire_errors, 1, __ATOMIC_RELAXED);
    if (!s->worker_error[0]) {
        const char *msg = c ? dlock_errmsg(c) : "";
        snprintf(s->worker_error, sizeof s->worker_error, "%s: %s", what,
                 msg && *msg ? msg : dlock_strerror(err));
    }
}

static _Noreturn void worker(struct shared *s, int me, const char *uri, const char *name,
                             const struct options *o, uint64_t end_ns, pid_t parent)
{
    uint64_t hold_ns = (uint64_t)(o->ttl_ms / 4 > 250 ? 250 : o->ttl_ms / 4 + 1) * 1000000u;
    dlock_client *c = NULL;
    int keep = 1, failures = 0;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(0);
    signal(SIGINT, SIG_IGN); /* a ^C reaches the group: the checker stops us */
    signal(SIGTERM, SIG_DFL);
    while (!s->stop && dlock_monotonic_ns() < end_ns) {
        dlock_acquire_opts acq;
        dlock_lock *lock = NULL;
        uint64_t token, grant, now = dlock_monotonic_ns();
        int rc;

        if (!c) {
            rc = dlock_client_open(uri, &c);
            if (rc != 0) {
                worker_error(s, "cannot open lock store", c, rc);
                dlock_client_close(c);
                c = NULL;
                sleep_ns(100000000u);
                continue;
            }
        }
        dlock_acquire_opts_init_version(&acq, DLOCK_ACQUIRE_OPTS_VERSION);
        acq.ttl_ms = o->ttl_ms;
        acq.wait = DLOCK_WAIT_DEADLINE;
        acq.deadline_ns = now + 1000000000u < end_ns ? now + 1000000000u : end_ns;
        acq.keep = keep;
        acq.on_lost = keep ? on_lost : NULL;
        acq.on_lost_user = s;
        rc = dlock_acquire(c, name, &acq, &lock);
        if (rc == DLOCK_ENOTSUP && keep) {
            /* A backend that cannot be kept: checked without the keeper. */
            keep = 0;
            __atomic_fetch_add(&s->nokeep, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (rc == DLOCK_ETIMEDOUT || rc == DLOCK_EBUSY || rc == DLOCK_EINTR)
            continue;
        if (rc != 0) {
            worker_error(s, "acquire", c, rc);
            /* A client that keeps failing starts over with a new one. */
            if (++failures >= 5) {
                dlock_client_close(c);
                c = NULL;
                failures = 0;
            }
            sleep_ns(50000000u);
            continue;
        }
        failures = 0;
        token = dlock_lock_token(lock);
        grant = enter(s, me, token);
        /* The writes go on whatever the keeper says: a stale holder's writes
         * are what the fencing token is there to refuse. */
        for (int i = 1; i < WRITES_PER_SECTION; i++) {
            sleep_ns(hold_ns / WRITES_PER_SECTION);
            write_again(s, grant, token);
        }
        leave(s, me, grant);
        rc = dlock_release(lock);
        if (rc == DLOCK_ELOST)
            __atomic_fetch_add(&s->release_lost, 1, __ATOMIC_RELAXED);
        else if (rc != 0)
            worker_error(s, "release", c, rc);
    }
    dlock_client_close(c);
    _exit(0);
}

/* ---- the checker ---------------------------------------------------------- */

struct run {
    struct shared *s;
    const struct options *o;
    struct check_proxy proxy;
    int proxied;
    const char *uri;
    char name[96];
    uint64_t end_ns, workers_end_ns;
};

static pid_t spawn(struct run *r, int slot)
{
    const char *uri = r->proxied ? r->proxy.uri[slot] : r->uri;
    pid_t parent = getpid(), pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0)
        worker(r->s, slot, uri, r->name, r->o, r->workers_end_ns, parent);
    if (pid > 0)
        r->s->slot[slot].pid = pid;
    return pid;
}

/* Reaps workers that exited by themselves (errors, end of time). */
static void reap_exited(struct run *r)
{
    for (int i = 0; i < r->o->procs; i++) {
        int st;
        pid_t pid = r->s->slot[i].pid;
        if (pid > 0 && waitpid(pid, &st, WNOHANG) == pid) {
            mu_lock(r->s);
            r->s->slot[i].pid = 0;
            r->s->slot[i].inside_grant = 0;
            mu_unlock(r->s);
        }
    }
}

static int time_left(const struct run *r, uint64_t need_ns)
{
    return !interrupted && dlock_monotonic_ns() + need_ns < r->end_ns;
}

/* Waits for a holder inside the section; returns its slot with mu held, or -1. */
static int wait_holder(struct run *r, uint64_t need_ns)
{
    while (time_left(r, need_ns)) {
        struct shared *s = r->s;
        int h;
        reap_exited(r);
        mu_lock(s);
        h = s->holder_slot;
        if (h >= 0 && s->slot[h].pid > 0 && s->slot[h].inside_grant &&
            s->slot[h].inside_grant == s->newest_grant)
            return h;
        mu_unlock(s);
        sleep_ns(2000000u);
    }
    return -1;
}

/* Waits (bounded) until `more` grants after `since` entered. */
static void wait_sections(struct run *r, uint64_t since, uint64_t more, uint64_t max_ns)
{
    uint64_t until = dlock_monotonic_ns() + max_ns;

    while (time_left(r, 0) && dlock_monotonic_ns() < until) {
        uint64_t n;
        reap_exited(r);
        mu_lock(r->s);
        n = r->s->sections;
        mu_unlock(r->s);
        if (n >= since + more)
            return;
        sleep_ns(5000000u);
    }
}

static void inject(struct run *r, enum fault f, struct result *res)
{
    struct shared *s = r->s;
    uint64_t pause_ns = (uint64_t)r->o->pause_ms * 1000000u;
    uint64_t need = f == F_KILL ? (uint64_t)r->o->ttl_ms * 1000000u : pause_ns;
    uint64_t before;
    int h = wait_holder(r, need), st;
    pid_t pid;

    if (h < 0) {
        res->skipped++;
        return;
    }
    /* mu is held: the holder is not inside the resource, and stays out. */
    pid = s->slot[h].pid;
    before = s->sections;
    switch (f) {
    case F_PAUSE:
        s->slot[h].faulted_grant = s->slot[h].inside_grant;
        kill(pid, SIGSTOP);
        if (waitpid(pid, &st, WUNTRACED) == pid && !WIFSTOPPED(st))
            s->slot[h].pid = 0, s->slot[h].inside_grant = 0;
        mu_unlock(s);
        sleep_ns(pause_ns);
        if (s->slot[h].pid)
            kill(pid, SIGCONT);
        break;
    case F_KILL:
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        s->slot[h].pid = 0;
        s->slot[h].inside_grant = 0;
        s->kill_at = dlock_monotonic_ns();
        mu_unlock(s);
        spawn(r, h);
        break;
    case F_CUT:
        s->slot[h].faulted_grant = s->slot[h].inside_grant;
        check_proxy_cut(&r->proxy, h, r->o->pause_ms);
        mu_unlock(s);
        sleep_ns(pause_ns);
        break;
    }
    res->faults[f]++;
    /* Settle: the next grants come. After a kill, for as long as the run
     * lasts, so that the recovery is measured even where the store frees a
     * dead holder's lock only after a session timeout (ZooKeeper). */
    wait_sections(r, before, 2,
                  f == F_KILL ? UINT64_MAX / 2 : (uint64_t)r->o->ttl_ms * 3000000u + 2000000000u);
}

static void stop_workers(struct run *r)
{
    uint64_t give_up = dlock_monotonic_ns() + (uint64_t)r->o->ttl_ms * 2000000u + 3000000000u;
    int left;

    r->s->stop = 1;
    for (int i = 0; i < r->o->procs; i++)
        if (r->s->slot[i].pid > 0)
            kill(r->s->slot[i].pid, SIGCONT);
    do {
        reap_exited(r);
        left = 0;
        for (int i = 0; i < r->o->procs; i++)
            left += r->s->slot[i].pid > 0;
        if (left)
            sleep_ns(10000000u);
    } while (left && dlock_monotonic_ns() < give_up && !interrupted);
    for (int i = 0; i < r->o->procs; i++) {
        pid_t pid = r->s->slot[i].pid;
        int st;
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            r->s->slot[i].pid = 0;
        }
    }
}

/* Opens and closes a client: the URI is valid and the store answers. */
static int probe(const char *uri, struct result *res)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(uri, &c);

    if (rc == 0) {
        snprintf(res->backend, sizeof res->backend, "%s", dlock_client_backend(c));
        dlock_client_close(c);
        return EX_OK;
    }
    snprintf(res->error, sizeof res->error, "cannot open lock store: %s", dlock_detail(c, rc));
    dlock_client_close(c);
    return dlock_exit_status(rc);
}

static void check_one(const char *uri, const struct options *o, struct result *res)
{
    struct run r = {.o = o, .uri = uri};
    pthread_mutexattr_t ma;
    uint64_t start = dlock_monotonic_ns(), dur = (uint64_t)(o->duration_s * 1e9);
    char err[256];
    unsigned rnd;
    FILE *ur;

    r.s = mmap(NULL, sizeof *r.s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (r.s == MAP_FAILED) {
        res->unreachable = EX_OSERR;
        snprintf(res->error, sizeof res->error, "cannot map shared memory: %s",
                 strerror(errno));
        return;
    }
    memset(r.s, 0, sizeof *r.s);
    r.s->holder_slot = -1;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&r.s->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    ur = fopen("/dev/urandom", "rb");
    if (!ur || fread(&rnd, sizeof rnd, 1, ur) != 1)
        rnd = (unsigned)(start ^ (uint64_t)getpid());
    if (ur)
        fclose(ur);
    snprintf(r.name, sizeof r.name, "dlock-check-%ld-%08x", (long)getpid(), rnd);
    if (o->cut) {
        int rc = check_proxy_start(&r.proxy, uri, o->procs, err, sizeof err);
        if (rc < 0) {
            res->unreachable = EX_SOFTWARE;
            snprintf(res->error, sizeof res->error, "%s", err);
            goto out;
        }
        r.proxied = rc == 0;
        res->cut_na = rc == 1;
    }
    r.end_ns = start + dur;
    r.workers_end_ns = r.end_ns + 2000000000u;
    for (int i = 0; i < o->procs; i++)
        if (spawn(&r, i) < 0) {
            res->unreachable = EX_OSERR;
            snprintf(res->error, sizeof res->error, "cannot fork: %s", strerror(errno));
            goto stop;
        }
    /* Let the workers get going before the first fault. */
    wait_sections(&r, 0, (uint64_t)o->procs, 3000000000u);
    for (int round = 0; round < o->rounds && time_left(&r, 0); round++) {
        inject(&r, F_PAUSE, res);
        inject(&r, F_KILL, res);
        if (r.proxied)
            inject(&r, F_CUT, res);
    }
    /* A little more undisturbed work, to see every holder through. */
    {
        uint64_t n;
        mu_lock(r.s);
        n = r.s->sections;
        mu_unlock(r.s);
        wait_sections(&r, n, 2, 1000000000u);
    }
stop:
    stop_workers(&r);
    if (r.proxied)
        check_proxy_stop(&r.proxy);
out:
    res->elapsed_s = (double)(dlock_monotonic_ns() - start) / 1e9;
    res->s = *r.s;
    pthread_mutex_destroy(&r.s->mu);
    munmap(r.s, sizeof *r.s);
}

static void judge(struct result *res)
{
    const struct shared *s = &res->s;

    res->exclusion_held = s->overlaps == 0;
    res->fencing_held = s->stale_accepted == 0 && s->out_of_order == 0 && s->current_refused == 0;
    res->passed = !res->unreachable && s->overlaps_unexplained == 0 && res->fencing_held &&
                  s->sections > 0;
}

static void verdict(const struct result *res, char *buf, size_t len)
{
    const struct shared *s = &res->s;
    size_t n = 0;

    if (res->unreachable) {
        snprintf(buf, len, "not run: %s", res->error);
        return;
    }
    if (res->passed) {
        if (res->exclusion_held)
            snprintf(buf, len, "passed: mutual exclusion held");
        else
            snprintf(buf, len, "passed: mutual exclusion broken only by a holder paused or cut "
                                "past its lease (%" PRIu64 " overlaps), and fencing held: "
                                "every stale write refused",
                     s->overlaps);
        return;
    }
    n += (size_t)snprintf(buf + n, len - n, "FAILED:");
#define ADD(cond, ...)                                                         \
    if ((cond) && n < len)                                                     \
    n += (size_t)snprintf(buf + n, len - n, __VA_ARGS__)
    ADD(s->sections == 0, " no critical section ran (%s);",
        s->worker_error[0] ? s->worker_error : "no grant");
    ADD(s->overlaps_unexplained, " %" PRIu64 " overlapping holders with no fault injected"
                                 " (mutual exclusion broken);", s->overlaps_unexplained);
    ADD(s->stale_accepted, " %" PRIu64 " stale writes accepted (fencing failed);",
        s->stale_accepted);
    ADD(s->out_of_order, " %" PRIu64 " grants with a token not above an earlier grant's"
                         " (tokens out of order);", s->out_of_order);
    ADD(s->current_refused, " %" PRIu64 " writes of the current holder refused;",
        s->current_refused);
    ADD(s->first_problem[0], " first: %s", s->first_problem);
#undef ADD
    if (n && n < len && buf[n - 1] == ';')
        buf[n - 1] = '\0';
}

static void ms(char *buf, size_t len, uint64_t ns)
{
    snprintf(buf, len, "%" PRIu64, (ns + 500000u) / 1000000u);
}

static void print_table(struct result *res, int n, const struct options *o)
{
    static const char *const rows[] = {
        "backend", "critical sections", "writes accepted", "overlapping holders",
        "  with no fault", "stale writes refused", "stale writes accepted",
        "tokens out of order", "faults (pause/kill/cut)", "recovery after kill (ms)",
        "losses seen by keeper", "releases found lost", "store errors", "time (s)"};
    printf("dlock check: %d worker%s, TTL %" PRIu32 " ms, pause %u ms, %d round%s%s\n",
           o->procs, o->procs == 1 ? "" : "s", o->ttl_ms, o->pause_ms, o->rounds,
           o->rounds == 1 ? "" : "s", o->cut ? ", --cut" : "");
    for (int i = 0; i < n; i++) {
        const struct result *r = &res[i];
        const struct shared *s = &r->s;
        char v[14][128], verd[1024];
        printf("\n%s\n", r->shown);
        if (r->unreachable) {
            verdict(r, verd, sizeof verd);
            printf("  %s\n", verd);
            continue;
        }
        snprintf(v[0], 96, "%s", r->backend);
        snprintf(v[1], 96, "%" PRIu64, s->sections);
        snprintf(v[2], 96, "%" PRIu64 " of %" PRIu64, s->accepted, s->writes);
        snprintf(v[3], 96, "%" PRIu64, s->overlaps);
        snprintf(v[4], 96, "%" PRIu64, s->overlaps_unexplained);
        snprintf(v[5], 96, "%" PRIu64, s->stale_refused);
        snprintf(v[6], 96, "%" PRIu64, s->stale_accepted);
        snprintf(v[7], 96, "%" PRIu64, s->out_of_order);
        snprintf(v[8], 96, "%u/%u/%s", r->faults[F_PAUSE], r->faults[F_KILL],
                 !o->cut ? "-" : r->cut_na ? "n/a (no host)" : "");
        if (o->cut && !r->cut_na)
            snprintf(v[8] + strlen(v[8]), 96 - strlen(v[8]), "%u", r->faults[F_CUT]);
        if (r->skipped)
            snprintf(v[8] + strlen(v[8]), 96 - strlen(v[8]), " (%u skipped: no holder in time)",
                     r->skipped);
        if (s->rec_n) {
            char mean[24], max[24];
            ms(mean, sizeof mean, s->rec_sum_ns / s->rec_n);
            ms(max, sizeof max, s->rec_max_ns);
            snprintf(v[9], 96, "mean %s, max %s (%" PRIu64 " kill%s)", mean, max, s->rec_n,
                     s->rec_n == 1 ? "" : "s");
        } else {
            snprintf(v[9], 96, "%s", r->faults[F_KILL] ? "no grant after the kill" : "-");
        }
        if (s->nokeep)
            snprintf(v[10], 96, "n/a (backend cannot keep)");
        else
            snprintf(v[10], 96, "%" PRIu64, s->losses);
        snprintf(v[11], 96, "%" PRIu64, s->release_lost);
        snprintf(v[12], 128, "%" PRIu64 "%s%.80s", s->acquire_errors,
                 s->worker_error[0] ? ", first: " : "", s->worker_error);
        snprintf(v[13], 96, "%.1f", r->elapsed_s);
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
            printf("  %-26s %s\n", rows[k], v[k]);
        verdict(r, verd, sizeof verd);
        printf("  %s\n", verd);
    }
}

static void print_json(struct result *res, int n, const struct options *o)
{
    putchar('[');
    for (int i = 0; i < n; i++) {
        const struct result *r = &res[i];
        const struct shared *s = &r->s;
        char verd[1024];
        verdict(r, verd, sizeof verd);
        printf("%s{\"uri\":", i ? ",\n " : "");
        dlock_json_string(stdout, r->shown);
        printf(",\"backend\":");
        dlock_json_string(stdout, r->backend);
        printf(",\"procs\":%d,\"ttl_ms\":%" PRIu32 ",\"pause_ms\":%u,\"rounds\":%d", o->procs,
               o->ttl_ms, o->pause_ms, o->rounds);
        printf(",\"ran\":%s,\"passed\":%s", r->unreachable ? "false" : "true",
               r->passed ? "true" : "false");
        if (!r->unreachable) {
            printf(",\"exclusion_held\":%s,\"fencing_held\":%s",
                   r->exclusion_held ? "true" : "false", r->fencing_held ? "true" : "false");
            printf(",\"sections\":%" PRIu64 ",\"writes\":%" PRIu64 ",\"writes_accepted\":%" PRIu64
                   ",\"overlaps\":%" PRIu64 ",\"overlaps_without_fault\":%" PRIu64
                   ",\"stale_refused\":%" PRIu64 ",\"stale_accepted\":%" PRIu64
                   ",\"tokens_out_of_order\":%" PRIu64 ",\"current_refused\":%" PRIu64,
                   s->sections, s->writes, s->accepted, s->overlaps, s->overlaps_unexplained,
                   s->stale_refused, s->stale_accepted, s->out_of_order, s->current_refused);
            printf(",\"pauses\":%u,\"kills\":%u,\"cuts\":", r->faults[F_PAUSE],
                   r->faults[F_KILL]);
            if (r->cut_na || !o->cut)
                printf("null");
            else
                printf("%u", r->faults[F_CUT]);
            printf(",\"faults_skipped\":%u", r->skipped);
            if (s->rec_n)
                printf(",\"recovery_ms\":{\"count\":%" PRIu64 ",\"mean\":%.1f,\"max\":%.1f}",
                       s->rec_n, (double)s->rec_sum_ns / (double)s->rec_n / 1e6,
                       (double)s->rec_max_ns / 1e6);
            else
                printf(",\"recovery_ms\":null");
            if (s->nokeep)
                printf(",\"losses\":null");
            else
                printf(",\"losses\":%" PRIu64, s->losses);
            printf(",\"releases_lost\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"seconds\":%.2f",
                   s->release_lost, s->acquire_errors, r->elapsed_s);
            if (s->worker_error[0]) {
                printf(",\"first_error\":");
                dlock_json_string(stdout, s->worker_error);
            }
        } else {
            printf(",\"error\":");
            dlock_json_string(stdout, r->error);
        }
        printf(",\"verdict\":");
        dlock_json_string(stdout, verd);
        putchar('}');
    }
    printf("]\n");
}

static void on_signal(int sig)
{
    interrupted = sig;
}

static int parse_options(int argc, char **argv, struct options *o)
{
    static const struct option longopts[] = {
        {"procs", required_argument, NULL, 'p'}, {"ttl", required_argument, NULL, 'T'},
        {"pause", required_argument, NULL, 'P'}, {"rounds", required_argument, NULL, 'r'},
        {"duration", required_argument, NULL, 'd'}, {"cut", no_argument, NULL, 'C'},
        {"json", no_argument, NULL, 'J'},        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    dlock_usage_cmd = "check";
    unsigned long v;
    char *end;
    int c;

    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":p:r:d:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (dlock_parse_count(optarg, 2, CHECK_SLOTS_MAX, &v) != 0)
                return dlock_usage_error("invalid --procs '%.40s': expected 2..%d", optarg,
                                   CHECK_SLOTS_MAX);
            o->procs = (int)v;
            break;
        case 'T':
            if (dlock_parse_count(optarg, 10, 60000, &v) != 0)
                return dlock_usage_error("invalid --ttl '%.40s': expected milliseconds 10..60000",
                                   optarg);
            o->ttl_ms = (uint32_t)v;
            break;
        case 'P':
            if (dlock_parse_count(optarg, 1, 300000, &v) != 0)
                return dlock_usage_error("invalid --pause '%.40s': expected milliseconds 1..300000",
                                   optarg);
            o->pause_ms = (unsigned)v;
            break;
        case 'r':
            if (dlock_parse_count(optarg, 0, ROUNDS_MAX, &v) != 0)
                return dlock_usage_error("invalid --rounds '%.40s': expected 0..%d", optarg,
                                   ROUNDS_MAX);
            o->rounds = (int)v;
            break;
        case 'd':
            errno = 0;
            o->duration_s = strtod(optarg, &end);
            if (end == optarg || *end || errno || !(o->duration_s > 0) ||
                o->duration_s > DURATION_MAX_S)
                return dlock_usage_error("invalid --duration '%.40s': expected seconds, more than 0 "
                                   "and at most %.0f", optarg, DURATION_MAX_S);
            break;
        case 'C':
            o->cut = 1;
            break;
        case 'J':
            o->json = 1;
            break;
        case 'h':
            print_usage(stdout);
            return fclose(stdout) == 0 ? EX_OK : EX_SOFTWARE;
        case ':':
            return dlock_usage_error("option '%s' needs an argument", argv[optind - 1]);
        default:
            return dlock_usage_error("invalid option '%s'", optopt && strncmp(argv[optind - 1], "--", 2)
                                                          ? (char[]){'-', (char)optopt, 0}
                                                          : argv[optind - 1]);
        }
    }
    if (!o->pause_ms)
        o->pause_ms = 2 * o->ttl_ms;
    if (optind == argc)
        return dlock_usage_error("missing URI: the store to check");
    return -1;
}

int dlock_check_main(int argc, char **argv)
{
    struct options o = {PROCS_DEFAULT, TTL_DEFAULT_MS, 0, ROUNDS_DEFAULT,
                        DURATION_DEFAULT_S, 0, 0};
    struct result *res;
    struct sigaction sa;
    int status = parse_options(argc, argv, &o), n, failed = 0, other = 0;

    if (status != -1)
        return status;
    signal(SIGPIPE, SIG_IGN);
    n = argc - optind;
    res = calloc((size_t)n, sizeof *res);
    if (!res) {
        dlock_say("out of memory");
        return EX_SOFTWARE;
    }
    /* Every URI is read (and its store asked) before anything runs: a typo
     * in the last one is a usage error, not a report after minutes. */
    for (int i = 0; i < n; i++) {
        res[i].shown = shown_uri(argv[optind + i]);
        if (!res[i].shown) {
            dlock_say("out of memory");
            return EX_SOFTWARE;
        }
        res[i].unreachable = probe(argv[optind + i], &res[i]);
        if (res[i].unreachable == EX_USAGE) {
            dlock_say("%s: %s", res[i].shown, res[i].error);
            return EX_USAGE;
        }
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* a ^C must not cut a waitpid() short: no zombie */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    for (int i = 0; i < n && !interrupted; i++) {
        if (!res[i].unreachable)
            check_one(argv[optind + i], &o, &res[i]);
        if (res[i].unreachable)
            dlock_say("%s: %s", res[i].shown, res[i].error);
        judge(&res[i]);
    }
    if (interrupted) {
        dlock_say("interrupted: no report");
        return 128 + interrupted;
    }
    if (o.json)
        print_json(res, n, &o);
    else
        print_table(res, n, &o);
    for (int i = 0; i < n; i++) {
        if (res[i].unreachable)
            other = other == EX_UNAVAILABLE ? other : res[i].unreachable;
        else if (!res[i].passed)
            failed = 1;
        free(res[i].shown);
    }
    free(res);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        dlock_say("cannot write to standard output: %s", strerror(errno));
        return EX_SOFTWARE;
    }
    return failed ? EX_UNSAFE : other ? other : EX_OK;
}
