/*
 * The fault suite: stores killed and restarted, connections killed from the
 * server side, holders killed and paused, the ZooKeeper leader killed,
 * Redlock nodes down. `faults (URI | --env VAR) [--case NAME]`.
 *
 * Every case runs a holder and waiters in processes of their own (as in real
 * use: a fork never shares a client) against one store, injects one fault,
 * and checks, from the events the processes log into shared memory:
 *   - no overlap: the waiters increment a shared counter inside the lock,
 *     read-modify-write with a sleep in between, and flag any entry while
 *     another is inside; the counter must equal the grants. An overlap
 *     counts as a double grant unless the first waiter's release then says
 *     DLOCK_ELOST (the store dropped its lock under it: a loss for the
 *     token to cover, not a double grant);
 *   - tokens strictly increase in grant order across the whole case (the
 *     holder before the fault, everyone after it); store-restart also takes
 *     five grants right before the kill and one after, on the same client;
 *   - the holder is told when its lock is gone (on_lost, then renew and
 *     release say DLOCK_ELOST), and a holder that was not told was really
 *     still the only holder (nobody granted before its release);
 *   - waiters recover on the same client (no reopen): each gets the lock, or
 *     fails with a clear error (DLOCK_ECONNECT, DLOCK_ETIMEDOUT, ...) by its
 *     deadline, and tries again;
 *   - nothing hangs: every call returns within its bound, each case within
 *     a time limit (it is killed and fails after that).
 * Measured times go out as TAP comments ("# ...").
 *
 * Cases (--case NAME, default all that apply to the store):
 *   store-restart  a. the store SIGKILLed and started again (Redlock: all
 *                     five nodes; the ensemble: all three members)
 *   conn-kill      b. the clients' connections killed by the server (Redis
 *                     CLIENT KILL, pg_terminate_backend, MariaDB KILL);
 *                     ZooKeeper: the holder's connection cut past its
 *                     session timeout (tests/proxy.h), so the session expires
 *   holder-kill    c. the holder SIGKILLed: time until a waiter holds,
 *                     against the TTL or the session timeout
 *   holder-pause   d. the holder's process group SIGSTOPped past its lease
 *   leader-kill    e. the ZooKeeper ensemble's leader SIGKILLed
 *   quorum         f. Redlock with 2 of 5 nodes down, then 3 of 5
 *
 * Stores are controlled with scripts/stores/kill.sh under DLOCK_STORES_DIR
 * (required for every networked store; the instance of each URI host is
 * found by its port). After each case every instance of the URI is resumed
 * and started again, whatever the case did.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/proxy.h"
#include "tests/tap.h"
#include "tests/util.h"

#ifndef DLOCK_STORES_SCRIPTS
#define DLOCK_STORES_SCRIPTS "scripts/stores"
#endif

#define MS 1000000ull
#define SLACK_MS 1500u   /* on every stated bound: 2 busy cores */
#define CASE_LIMIT_S 120 /* a case still running then is killed and fails */
#define MAXW 8           /* waiters per case */

static const char *uri;
static const char *stores_dir;
static unsigned int caps;
static char backend[32]; /* file, redis, redlock, postgres, mysql, zookeeper */
static int nhosts, ensemble;
static char prefix[64];
static char inst[PROXY_MAX_UP][32]; /* the store instance of each URI host */
static int inst_port[PROXY_MAX_UP];
static char curi[DLOCK_URI_MAX]; /* uri with the suite's timeouts */

static int is(const char *b)
{
    return strcmp(backend, b) == 0;
}

static double ms_of(uint64_t from, uint64_t to)
{
    return to >= from ? (to - from) / 1e6 : -((from - to) / 1e6);
}

/* ---- what the processes of a case log -------------------------------------- */

enum { EV_READY = 1, EV_GRANT, EV_LOST, EV_RENEW, EV_REL, EV_ERR };

struct ev {
    int kind, who, rc;
    uint64_t t;     /* when it happened (the end of the call) */
    uint64_t t0;    /* when the call started */
    uint64_t token;
    char msg[200];
};

#define MAXEV 256
struct world {
    volatile int inside, overlaps, counter; /* inside: who is (0: nobody) */
    volatile int npairs, pair[16][2];       /* overlaps: (inside, entering) */
    volatile int release[MAXW + 2]; /* parent → holder who: renew and release now */
    volatile int nev;
    struct ev ev[MAXEV];
};

static struct world *W;
static int me; /* who this process is: 0 the holder, 1.. the waiters */

static void log_ev(int kind, int rc, uint64_t t0, uint64_t token, const char *msg)
{
    int i = __atomic_fetch_add(&W->nev, 1, __ATOMIC_SEQ_CST);
    if (i >= MAXEV)
        return;
    struct ev *e = &W->ev[i];
    e->who = me;
    e->rc = rc;
    e->t = dlock_monotonic_ns();
    e->t0 = t0;
    e->token = token;
    snprintf(e->msg, sizeof e->msg, "%s", msg ? msg : "");
    __atomic_store_n(&e->kind, kind, __ATOMIC_RELEASE);
}

static struct ev *find_ev(int who, int kind)
{
    int n = __atomic_load_n(&W->nev, __ATOMIC_SEQ_CST);
    for (int i = 0; i < n && i < MAXEV; i++)
        if (__atomic_load_n(&W->ev[i].kind, __ATOMIC_ACQUIRE) == kind && W->ev[i].who == who)
            return &W->ev[i];
    return NULL;
}

/* The event, waiting up to ms for it. */
static struct ev *wait_ev(int who, int kind, unsigned ms)
{
    uint64_t end = dlock_monotonic_ns() + ms * MS;
    struct ev *e;
    while (!(e = find_ev(who, kind)) && dlock_monotonic_ns() < end)
        sleep_ms(5);
    return e;
}

/* The first grant to a waiter (who >= 1) at or after t. */
static struct ev *first_waiter_grant(uint64_t t)
{
    struct ev *best = NULL;
    for (int i = 0; i < W->nev && i < MAXEV; i++) {
        struct ev *e = &W->ev[i];
        if (e->kind == EV_GRANT && e->who >= 1 && e->t >= t && (!best || e->t < best->t))
            best = e;
    }
    return best;
}

static void new_world(void)
{
    W = mmap(NULL, sizeof *W, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (W == MAP_FAILED) {
        printf("Bail out! mmap: %s\n", strerror(errno));
        exit(1);
    }
    memset(W, 0, sizeof *W);
}

/* ---- store control ------------------------------------------------------ */

/* Runs scripts/stores/kill.sh with args; its exit status. */
static int store_ctl(const char *fmt, ...)
{
    char args[1024], cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "bash '%s/kill.sh' --dir '%s' %s 1>&2", DLOCK_STORES_SCRIPTS,
             stores_dir, args);
    fflush(stdout);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void all_insts(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < nhosts; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? " " : "", inst[i]);
}

/* Every instance of the URI running and answering again. */
static int stores_restore(void)
{
    char all[512];
    if (!nhosts)
        return 0;
    all_insts(all, sizeof all);
    store_ctl("resume %s 2>/dev/null", all);
    return store_ctl("start %s", all);
}

/* SIGKILL of an instance's process group straight from here, with no
 * shell in between: the token probe wants the kill right after its last
 * grant. kill.sh then finds it gone (and reaps nothing more). */
static void kill_fast(const char *name)
{
    char path[PATH_MAX], comm[64] = "", want[64] = "";
    int pid = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/%s/pid", stores_dir, name);
    if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/%s/comm", stores_dir, name);
    if ((f = fopen(path, "r"))) {
        if (!fgets(want, sizeof want, f))
            want[0] = '\0';
        fclose(f);
    }
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    if (pid > 1 && (f = fopen(path, "r"))) {
        if (!fgets(comm, sizeof comm, f))
            comm[0] = '\0';
        fclose(f);
    }
    want[strcspn(want, "\n")] = comm[strcspn(comm, "\n")] = '\0';
    if (pid <= 1 || !want[0] || strcmp(comm, want) != 0)
        return; /* not running, or not ours: kill.sh says so */
    /* PostgreSQL's children each run in a session of their own: stop the
     * postmaster (it forks no more), kill its children, then it. */
    kill(pid, SIGSTOP);
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char stat[512];
        int ppid = 0;
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        if (fgets(stat, sizeof stat, f)) {
            char *rp = strrchr(stat, ')');
            if (rp && sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == pid)
                kill(atoi(de->d_name), SIGKILL);
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    if (getpgid(pid) == pid)
        kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
}

/* The instance serving 127.0.0.1:port, from DIR/<instance>/port. */
static int find_instance(int port, char *out, size_t len)
{
    DIR *d = opendir(stores_dir);
    struct dirent *de;
    int found = -1;
    if (!d)
        return -1;
    while (found < 0 && (de = readdir(d))) {
        char path[PATH_MAX];
        int p = 0;
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s/port", stores_dir, de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fscanf(f, "%d", &p) == 1 && p == port && strlen(de->d_name) < len) {
            memcpy(out, de->d_name, strlen(de->d_name) + 1);
            found = 0;
        }
        fclose(f);
    }
    closedir(d);
    return found;
}

/* The local ports of the TCP connections from the processes pids to
 * 127.0.0.1:server_port (read from /proc), for kill.sh conns. */
static int client_ports(const pid_t *pids, int npids, int server_port, char *out, size_t len)
{
    unsigned long inodes[512];
    int ninodes = 0, found = 0;
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < npids; i++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pids[i]);
        DIR *d = opendir(dir);
        struct dirent *de;
        if (!d)
            continue;
        while ((de = readdir(d)) && ninodes < 512) {
            char p[PATH_MAX], link[128];
            unsigned long ino;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            ssize_t n = readlink(p, link, sizeof link - 1);
            if (n <= 0)
                continue;
            link[n] = '\0';
            if (sscanf(link, "socket:[%lu]", &ino) == 1)
                inodes[ninodes++] = ino;
        }
        closedir(d);
    }
    static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        char line[512];
        if (!f)
            continue;
        while (fgets(line, sizeof line, f)) {
            char laddr[64], raddr[64];
            unsigned lport, rport, st;
            unsigned long ino;
            if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%x %63[0-9A-Fa-f]:%x %x %*s %*s %*s %*s %*s %lu",
                       laddr, &lport, raddr, &rport, &st, &ino) != 6)
                continue;
            if ((int)rport != server_port)
                continue;
            for (int k = 0; k < ninodes; k++)
                if (inodes[k] == ino) {
                    o += (size_t)snprintf(out + o, len - o, " %u", lport);
                    found++;
                    break;
                }
        }
        fclose(f);
    }
    return found;
}

/* ---- the processes of a case ---------------------------------------------- */

static uint32_t ttl_ms(void)
{
    return is("mysql") ? 2000 : 1500; /* MySQL's wait_timeout: whole seconds */
}

/* ZooKeeper: the session timeout the suite's URI asks for. */
#define ZK_SESSION_MS 3000u

/* The lease a holder keeps (or the session timeout on ZooKeeper). */
static uint32_t lease_ms(void)
{
    return is("zookeeper") ? ZK_SESSION_MS : ttl_ms();
}

static uint32_t keep_interval_ms(void)
{
    if (caps & DLOCK_CAP_LEASE)
        return ttl_ms() / DLOCK_KEEP_INTERVAL_DIV;
    return ttl_ms() / 3 < DLOCK_KEEP_CHECK_MAX_MS ? ttl_ms() / 3 : DLOCK_KEEP_CHECK_MAX_MS;
}

static void holder_lost(dlock_lock *l, int err, void *user)
{
    (void)user;
    log_ev(EV_LOST, err, 0, dlock_lock_token(l), dlock_lock_lost_detail(l));
}

static void child_setup(int own_group)
{
    if (own_group)
        setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/*
 * The holder (who 0, or another number): opens u, acquires name (waiting up
 * to 10 s) with keep (on_lost logs EV_LOST), logs EV_GRANT, then waits for
 * W->release[who], renews (EV_RENEW) and releases (EV_REL). In a process
 * group of its own, so that the group can be stopped.
 */
static pid_t spawn_holder(int who, const char *u, const char *name, uint32_t ttl, int keep)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0) {
        if (pid > 0)
            setpgid(pid, pid);
        return pid;
    }
    me = who;
    child_setup(1);
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    uint64_t t0 = dlock_monotonic_ns();
    int rc = dlock_client_open(u, &c);
    if (rc == 0) {
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, ttl);
        o.keep = keep;
        o.on_lost = keep ? holder_lost : NULL;
        rc = dlock_acquire(c, name, &o, &l);
    }
    if (rc) {
        log_ev(EV_ERR, rc, t0, 0, dlock_errmsg(c));
        _exit(1);
    }
    log_ev(EV_GRANT, 0, t0, dlock_lock_token(l), "");
    while (!W->release[who])
        sleep_ms(5);
    t0 = dlock_monotonic_ns();
    rc = dlock_renew(l, ttl);
    log_ev(EV_RENEW, rc, t0, 0, rc ? dlock_errmsg(c) : "");
    t0 = dlock_monotonic_ns();
    rc = dlock_release(l);
    log_ev(EV_REL, rc, t0, 0, rc ? dlock_errmsg(c) : "");
    dlock_client_close(c);
    _exit(0);
}

/*
 * A waiter (who 1..MAXW): opens u, logs EV_READY, then acquires name until
 * the absolute deadline, on the same client whatever fails (each failure an
 * EV_ERR); granted, it enters the critical section (shared counter, overlap
 * check), logs EV_GRANT, works work_ms, and releases (EV_REL).
 */
static pid_t spawn_waiter(int who, const char *u, const char *name, uint64_t deadline,
                          unsigned work_ms)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    me = who;
    child_setup(0);
    dlock_client *c = NULL;
    uint64_t t0 = dlock_monotonic_ns();
    int rc = dlock_client_open(u, &c);
    if (rc) {
        log_ev(EV_ERR, rc, t0, 0, dlock_errmsg(c));
        _exit(1);
    }
    log_ev(EV_READY, 0, t0, 0, "");
    for (;;) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 0, ttl_ms() * 4);
        o.deadline_ns = deadline;
        t0 = dlock_monotonic_ns();
        rc = dlock_acquire(c, name, &o, &l);
        if (rc == 0) {
            int was = __atomic_exchange_n(&W->inside, who, __ATOMIC_SEQ_CST);
            if (was) {
                int k = __atomic_fetch_add(&W->overlaps, 1, __ATOMIC_SEQ_CST);
                if (k < 16)
                    W->pair[k][0] = was, W->pair[k][1] = who;
            }
            log_ev(EV_GRANT, 0, t0, dlock_lock_token(l), "");
            int v = W->counter; /* deliberately not atomic */
            sleep_ms(work_ms);
            W->counter = v + 1;
            __atomic_compare_exchange_n(&W->inside, &who, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            t0 = dlock_monotonic_ns();
            rc = dlock_release(l);
            log_ev(EV_REL, rc, t0, 0, rc ? dlock_errmsg(c) : "");
            break;
        }
        log_ev(EV_ERR, rc, t0, 0, dlock_errmsg(c));
        if (rc == DLOCK_ETIMEDOUT || dlock_monotonic_ns() >= deadline)
            break;
        sleep_ms(100);
    }
    dlock_client_close(c);
    _exit(0);
}

static void kill_proc(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Waits for the processes until the absolute time end; kills the rest and
 * returns how many had to be killed. */
static int reap_all(pid_t *pids, int n, uint64_t end)
{
    int left = 0, killed = 0;
    for (int i = 0; i < n; i++)
        left += pids[i] > 0;
    while (left > 0 && dlock_monotonic_ns() < end) {
        for (int i = 0; i < n; i++)
            if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == pids[i]) {
                pids[i] = 0;
                left--;
            }
        if (left)
            sleep_ms(20);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill_proc(pids[i]);
            pids[i] = 0;
            killed++;
        }
    return killed;
}

/* Waits until every waiter 1..nw has logged EV_READY (or failed). */
static int waiters_ready(int nw, unsigned ms)
{
    int ready = 0;
    uint64_t end = dlock_monotonic_ns() + ms * MS;
    while (dlock_monotonic_ns() < end) {
        ready = 0;
        for (int i = 1; i <= nw; i++)
            ready += find_ev(i, EV_READY) != NULL;
        if (ready == nw)
            break;
        sleep_ms(10);
    }
    return ready == nw;
}

/* ---- checks ---------------------------------------------------------------- */

static int clear_error(int rc)
{
    return rc == DLOCK_ECONNECT || rc == DLOCK_ETIMEDOUT || rc == DLOCK_ESTORE ||
           rc == DLOCK_ELOST || rc == DLOCK_EEXPIRED;
}

static int cmp_grant_time(const void *a, const void *b)
{
    const struct ev *x = *(const struct ev *const *)a, *y = *(const struct ev *const *)b;
    return x->t < y->t ? -1 : x->t > y->t;
}

/*
 * The checks every case ends with: no overlap among the waiters, the
 * counter, tokens strictly increasing in grant order over the whole case,
 * every waiter 1..nw granted (when all_granted) without a reopen, errors
 * clear and returned by the deadline. t_fault: the fault's time, for the
 * comments.
 */
static void check_world(int nw, int all_granted, uint64_t deadline, uint64_t t_fault)
{
    struct ev *g[MAXEV];
    int ng = 0, waiter_grants = 0, bad_err = 0, late = 0, nerr[MAXW + 1] = {0};
    struct ev *first[MAXW + 1] = {0}, *last[MAXW + 1] = {0};
    double worst_ms = 0;
    char seq[1024] = "";
    size_t o = 0;
    for (int i = 0; i < W->nev && i < MAXEV; i++) {
        struct ev *e = &W->ev[i];
        if (e->kind == EV_GRANT) {
            g[ng++] = e;
            waiter_grants += e->who >= 1 && e->who <= MAXW;
        } else if (e->kind == EV_ERR && e->who >= 1 && e->who <= MAXW) {
            double over = ms_of(deadline, e->t);
            nerr[e->who]++;
            if (!first[e->who])
                first[e->who] = e;
            last[e->who] = e;
            if (!clear_error(e->rc) || !e->msg[0]) {
                bad_err++;
                diag("waiter %d: unclear error %s: '%s'", e->who, dlock_err_name(e->rc), e->msg);
            }
            if (over > 250 + SLACK_MS)
                late++;
            if (ms_of(e->t0, e->t) > worst_ms)
                worst_ms = ms_of(e->t0, e->t);
        }
    }
    for (int w = 1; w <= MAXW; w++) {
        struct ev *f = first[w], *l = last[w];
        if (!f)
            continue;
        diag("waiter %d: %d failed acquire%s, retried on the same client; first %s after %.0f ms "
             "(%+.0f ms from the fault): %s",
             w, nerr[w], nerr[w] > 1 ? "s" : "", dlock_err_name(f->rc), ms_of(f->t0, f->t),
             ms_of(t_fault, f->t), f->msg);
        if (l != f)
            diag("waiter %d: last %s after %.0f ms (%+.0f ms from the fault): %s", w,
                 dlock_err_name(l->rc), ms_of(l->t0, l->t), ms_of(t_fault, l->t), l->msg);
    }
    if (worst_ms > 0)
        diag("longest failed acquire: %.0f ms", worst_ms);
    qsort(g, (size_t)ng, sizeof g[0], cmp_grant_time);
    int increasing = 1;
    for (int i = 0; i < ng; i++) {
        if (i && g[i]->token <= g[i - 1]->token)
            increasing = 0;
        if (o < sizeof seq - 64)
            o += (size_t)snprintf(seq + o, sizeof seq - o, "%s%s%d:%llu@%+.0fms", i ? ", " : "",
                                  g[i]->who ? "w" : "h", g[i]->who,
                                  (unsigned long long)g[i]->token, ms_of(t_fault, g[i]->t));
    }
    diag("grants in order (who:token@time from the fault): %s", seq);
    /* An overlap is a double grant unless the first of the two was told at
     * its release that it had lost the lock meanwhile (DLOCK_ELOST: e.g. its
     * session was killed right after the grant): a loss the store caused,
     * which the token, not the lock, has to cover. */
    int double_grants = 0, explained = 0;
    for (int k = 0; k < W->overlaps && k < 16; k++) {
        struct ev *ra = find_ev(W->pair[k][0], EV_REL), *rb = find_ev(W->pair[k][1], EV_REL);
        int lost_a = ra && ra->rc == DLOCK_ELOST;
        diag("overlap: waiter %d entered while waiter %d was inside; their releases said %s and %s",
             W->pair[k][1], W->pair[k][0], ra ? dlock_err_name(ra->rc) : "-",
             rb ? dlock_err_name(rb->rc) : "-");
        if (lost_a)
            explained++;
        else
            double_grants++;
    }
    for (int i = 0; i < W->nev && i < MAXEV; i++)
        if (W->ev[i].kind == EV_REL && W->ev[i].who >= 1 && W->ev[i].who <= MAXW && W->ev[i].rc)
            diag("waiter %d: release %s: %s", W->ev[i].who, dlock_err_name(W->ev[i].rc),
                 W->ev[i].msg);
    if (explained)
        diag("%d overlap(s) with a waiter whose lock the store had dropped (its release said "
             "DLOCK_ELOST): not a double grant",
             explained);
    is_int(double_grants, 0, "no two waiters inside the lock at once (%d overlaps, %d explained by a "
           "loss)", W->overlaps, explained);
    ok(W->counter >= waiter_grants - explained && W->counter <= waiter_grants,
       "the shared counter counts every grant (%d of %d)", W->counter, waiter_grants);
    ok(increasing, "tokens strictly increase in grant order across the case (%d grants)", ng);
    is_int(bad_err, 0, "every waiter failure is a clear error with detail");
    is_int(late, 0, "no waiter call returned more than %u ms past its deadline", 250 + SLACK_MS);
    if (all_granted) {
        int got = 0;
        for (int i = 1; i <= nw; i++)
            got += find_ev(i, EV_GRANT) != NULL;
        is_int(got, nw, "every waiter got the lock on the client it opened before the fault");
    }
}

/*
 * The holder's side: must_lose 1 (the store let go: it must be told), 0
 * (the store kept the lock: it must not be), -1 (either, consistently).
 * Told: on_lost (when kept) within bound_ms of t_fault, renew and release
 * DLOCK_ELOST. Not told: release 0, and no waiter granted before it.
 */
static void check_holder(int must_lose, int kept, uint64_t t_fault, uint64_t bound_ms)
{
    struct ev *lost = find_ev(0, EV_LOST), *ren = find_ev(0, EV_RENEW), *rel = find_ev(0, EV_REL);
    struct ev *next = first_waiter_grant(t_fault);
    if (!rel) {
        ok(0, "the holder renewed and released (no EV_REL: it hung or died)");
        return;
    }
    diag("holder: on_lost %s, renew %s (%.0f ms), release %s (%.0f ms)%s%s",
         lost ? dlock_err_name(lost->rc) : "not called", ren ? dlock_err_name(ren->rc) : "-",
         ren ? ms_of(ren->t0, ren->t) : 0.0,
         dlock_err_name(rel->rc), ms_of(rel->t0, rel->t), rel->msg[0] ? ": " : "", rel->msg);
    if (lost)
        diag("holder told (on_lost %s) %.0f ms after the fault: %s", dlock_err_name(lost->rc),
             ms_of(t_fault, lost->t), lost->msg);
    int told = lost || rel->rc == DLOCK_ELOST;
    ok(rel->t - rel->t0 <= (3000 + SLACK_MS) * MS, "the holder's release returned in %.0f ms",
       ms_of(rel->t0, rel->t));
    if (must_lose == 1)
        ok(told, "the holder is told its lock is gone");
    else if (must_lose == 0)
        ok(!told, "the holder keeps its lock (the store still has it)");
    if (told) {
        if (kept) {
            ok(lost && (lost->rc == DLOCK_ELOST || lost->rc == DLOCK_EEXPIRED),
               "on_lost called with DLOCK_ELOST or DLOCK_EEXPIRED");
            ok(lost && lost->t - t_fault <= (bound_ms + SLACK_MS) * MS,
               "on_lost within %llu ms (+ %u ms slack) of the fault (%.0f ms)",
               (unsigned long long)bound_ms, SLACK_MS, lost ? ms_of(t_fault, lost->t) : -1.0);
        }
        is_int(rel->rc, DLOCK_ELOST, "the holder's release says DLOCK_ELOST");
        ok(ren && (ren->rc == DLOCK_ELOST), "the holder's renew says DLOCK_ELOST (%s)",
           ren ? dlock_err_name(ren->rc) : "none");
        if (next && lost)
            diag("the next holder was granted %.0f ms %s the old one was told",
                 ms_of(lost->t, next->t) >= 0 ? ms_of(lost->t, next->t) : -ms_of(lost->t, next->t),
                 next->t >= lost->t ? "after" : "BEFORE");
    } else {
        is_int(rel->rc, 0, "the holder's release succeeds: it held the lock throughout");
        ok(!next || next->t >= rel->t0,
           "no waiter was granted while the holder still held (first grant %.0f ms after its release)",
           next ? ms_of(rel->t0, next->t) : 0.0);
    }
}

/* ---- the cases -------------------------------------------------------------- */

static void name_of(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "%s%s", prefix, what);
}

/* Holder plus nw waiters on name: the holder granted, the waiters queued.
 * Returns 0, or -1 (reported) when that could not be set up. */
static int setup_contention(pid_t *pids, const char *hu, const char *wu, const char *name, int nw,
                            uint64_t deadline, unsigned work_ms, int keep)
{
    pids[0] = spawn_holder(0, hu, name, ttl_ms(), keep);
    struct ev *g = wait_ev(0, EV_GRANT, 15000);
    if (!g) {
        struct ev *e = find_ev(0, EV_ERR);
        ok(0, "holder acquires%s%s%s", e ? ": " : " within 15 s", e ? dlock_err_name(e->rc) : "",
           e ? e->msg : "");
        return -1;
    }
    ok(1, "holder acquires (token %llu%s)", (unsigned long long)g->token, keep ? ", kept" : "");
    for (int i = 1; i <= nw; i++)
        pids[i] = spawn_waiter(i, wu, name, deadline, work_ms);
    if (!waiters_ready(nw, 15000)) {
        ok(0, "%d waiters open their clients within 15 s", nw);
        return -1;
    }
    sleep_ms(400); /* queued */
    return 0;
}

/* a. The store SIGKILLed and started again while one holds and others wait. */
static void case_store_restart(void)
{
    enum { NW = 3 };
    char name[128], all[512];
    pid_t pids[NW + 1] = {0};
    name_of(name, sizeof name, "restart");
    uint64_t deadline = dlock_monotonic_ns() + 30000 * MS;
    if (setup_contention(pids, curi, curi, name, NW, deadline, 100, 1) != 0)
        goto out;
    all_insts(all, sizeof all);
    /* The token probe: grants of another name right up to the kill (the
     * last commit may not have reached the disk), then one after. The
     * client stays open across the restart. */
    char probe[128];
    name_of(probe, sizeof probe, "restart-probe");
    dlock_client *pc = open_ok(curi);
    uint64_t before[5] = {0};
    for (int i = 0; i < 5; i++) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 5000, ttl_ms());
        if (dlock_acquire(pc, probe, &o, &l) == 0) {
            before[i] = dlock_lock_token(l);
            dlock_release(l);
        }
    }
    uint64_t t_fault = dlock_monotonic_ns(); /* times below count from here */
    for (int i = 0; i < nhosts; i++)
        kill_fast(inst[i]);
    is_int(store_ctl("%s", all), 0, "store killed (SIGKILL: %s)", all);
    uint64_t t_dead = dlock_monotonic_ns();
    sleep_ms(300);
    is_int(store_ctl("start %s", all), 0, "store started again");
    uint64_t t_back = dlock_monotonic_ns();
    diag("kill.sh took %.0f ms, the store was down for %.0f ms, start.sh took %.0f ms",
         ms_of(t_fault, t_dead), ms_of(t_dead, t_back), ms_of(t_dead + 300 * MS, t_back));
    /* A store that kept its sessions (ZooKeeper persists them) may let the
     * holder keep its lock; every other store has forgotten it. */
    int must_lose = is("zookeeper") ? -1 : 1;
    uint64_t bound = lease_ms() + ms_of(t_fault, t_back);
    wait_ev(0, EV_LOST, (unsigned)bound + SLACK_MS);
    sleep_ms(200);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    int killed = reap_all(pids, NW + 1, deadline + 3000 * MS);
    is_int(killed, 0, "every process ended by itself (no hang)");
    check_holder(must_lose, 1, t_fault, bound);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("first grant after the fault: %.0f ms after the kill, %.0f ms after the store was back",
             ms_of(t_fault, next->t), ms_of(t_back, next->t));
    check_world(NW, 1, deadline, t_fault);
    {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, ttl_ms());
        int rc = dlock_acquire(pc, probe, &o, &l);
        is_int(rc, 0, "the probe client, open across the restart, acquires again%s%s",
               rc ? ": " : "", rc ? dlock_errmsg(pc) : "");
        uint64_t after = l ? dlock_lock_token(l) : 0;
        diag("token across the restart: %llu %llu %llu %llu %llu | restart | %llu",
             (unsigned long long)before[0], (unsigned long long)before[1],
             (unsigned long long)before[2], (unsigned long long)before[3],
             (unsigned long long)before[4], (unsigned long long)after);
        ok(before[4] && after > before[4],
           "the first token after the restart is above the last one before it (%llu > %llu)",
           (unsigned long long)after, (unsigned long long)before[4]);
        if (l)
            dlock_release(l);
        dlock_metrics m;
        dlock_client_metrics(pc, &m);
        ok(m.reconnects >= 1, "its metrics count the reconnection (%llu)",
           (unsigned long long)m.reconnects);
    }
    dlock_client_close(pc);
out:
    reap_all(pids, NW + 1, 0);
}

/* b. Connections killed by the server (ZooKeeper: a session expired by a
 * cut longer than its timeout). */
static void case_conn_kill(void)
{
    enum { NW = 3 };
    char name[128], puri[DLOCK_URI_MAX];
    pid_t pids[NW + 1] = {0};
    struct proxy px;
    int zk = is("zookeeper"), have_proxy = 0;
    const char *hu = curi;
    name_of(name, sizeof name, "conn-kill");
    if (zk) {
        proxy_for_uri(&px, curi);
        have_proxy = 1;
        if (proxy_uri(&px, curi, NULL, puri, sizeof puri) != 0) {
            ok(0, "cannot point the URI at the proxy");
            goto out;
        }
        hu = puri;
    }
    uint64_t deadline = dlock_monotonic_ns() + 30000 * MS;
    if (setup_contention(pids, hu, curi, name, NW, deadline, 100, 1) != 0)
        goto out;
    uint64_t t_fault;
    int must_lose;
    if (zk) {
        t_fault = dlock_monotonic_ns();
        proxy_set(&px, PROXY_DOWN);
        sleep_ms(ZK_SESSION_MS + 1500); /* the servers expire the session */
        proxy_set(&px, PROXY_PASS);
        diag("the holder's connection was cut for %.0f ms (session timeout %u ms)",
             ms_of(t_fault, dlock_monotonic_ns()), ZK_SESSION_MS);
        must_lose = 1;
    } else {
        int total = 0;
        t_fault = dlock_monotonic_ns();
        for (int h = 0; h < nhosts; h++) {
            char ports[2048];
            int n = client_ports(pids, NW + 1, inst_port[h], ports, sizeof ports);
            total += n;
            if (n)
                store_ctl("conns %s%s", inst[h], ports);
        }
        ok(total >= NW + 1, "killed %d client connections from the server side", total);
        /* Redis keeps the lock's key: only connections died. A SQL
         * session is the lock: killed, it is gone. */
        must_lose = is("redis") || is("redlock") ? 0 : 1;
    }
    uint64_t bound = lease_ms();
    if (must_lose) /* told by then, or not at all */
        wait_ev(0, EV_LOST, (unsigned)bound + SLACK_MS);
    else /* a lease of renewals after the fault */
        sleep_ms(lease_ms());
    sleep_ms(200);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(must_lose, 1, t_fault, zk ? ZK_SESSION_MS : bound);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("first grant after the fault: %.0f ms", ms_of(t_fault, next->t));
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 1, 0);
    if (have_proxy)
        proxy_stop(&px);
}

/* c. The holder SIGKILLed: how long until a waiter holds. */
static void case_holder_kill(void)
{
    enum { NW = 2 };
    char name[128];
    pid_t pids[NW + 1] = {0};
    name_of(name, sizeof name, "holder-kill");
    uint64_t deadline = dlock_monotonic_ns() + 30000 * MS;
    /* Not kept: the lease then starts at the grant, which the bound needs. */
    if (setup_contention(pids, curi, curi, name, NW, deadline, 50, 0) != 0)
        goto out;
    struct ev *hg = find_ev(0, EV_GRANT);
    uint64_t t_fault = dlock_monotonic_ns();
    kill_proc(pids[0]);
    pids[0] = 0;
    int death = (caps & DLOCK_CAP_HOLDER_DEATH) != 0;
    /* Freed at once where the store sees the death; at the lease end
     * (counted from the grant) or when the session expires otherwise. */
    uint64_t bound = death ? 1000 : is("zookeeper") ? ZK_SESSION_MS + 1000 : ttl_ms();
    struct ev *next = NULL;
    for (uint64_t end = t_fault + (bound + SLACK_MS + 5000) * MS;
         !(next = first_waiter_grant(0)) && dlock_monotonic_ns() < end;)
        sleep_ms(5);
    if (!next) {
        ok(0, "a waiter holds within %llu ms (+ slack) of the holder's death: none did",
           (unsigned long long)bound);
    } else {
        double after_kill = ms_of(t_fault, next->t), after_grant = ms_of(hg->t, next->t);
        diag("holder-kill: next holder %.0f ms after the SIGKILL, %.0f ms after the dead holder's "
             "grant (TTL %u ms%s)",
             after_kill, after_grant, ttl_ms(),
             is("zookeeper") ? ", session timeout 3000 ms" : "");
        ok(next->t - t_fault <= (bound + SLACK_MS) * MS,
           "a waiter holds %.0f ms after the holder's death (bound %llu ms + %u ms slack)",
           after_kill, (unsigned long long)bound, SLACK_MS);
        if (!death && (caps & DLOCK_CAP_LEASE))
            ok(after_grant >= ttl_ms() - 50,
               "not before the dead holder's lease ended (%.0f ms after its grant, TTL %u ms)",
               after_grant, ttl_ms());
    }
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 1, 0);
}

/* d. The holder's process group stopped past its lease, then resumed. */
static void case_holder_pause(void)
{
    enum { NW = 2 };
    char name[128];
    pid_t pids[NW + 1] = {0};
    name_of(name, sizeof name, "holder-pause");
    uint64_t deadline = dlock_monotonic_ns() + 30000 * MS;
    if (setup_contention(pids, curi, curi, name, NW, deadline, 100, 1) != 0)
        goto out;
    int st;
    kill(-pids[0], SIGSTOP);
    ok(waitpid(pids[0], &st, WUNTRACED) == pids[0] && WIFSTOPPED(st),
       "the holder's process group is stopped");
    uint64_t t_fault = dlock_monotonic_ns(), pause_ms = 3 * (uint64_t)lease_ms();
    struct ev *next = NULL;
    while (!(next = first_waiter_grant(0)) && dlock_monotonic_ns() < t_fault + pause_ms * MS)
        sleep_ms(5);
    if (next)
        diag("holder-pause: next holder %.0f ms after the stop (lease %u ms)",
             ms_of(t_fault, next->t), lease_ms());
    ok(next != NULL, "a waiter holds while the holder is stopped (within %llu ms)",
       (unsigned long long)pause_ms);
    uint64_t now = dlock_monotonic_ns();
    if (now < t_fault + pause_ms * MS)
        sleep_ms((unsigned)((t_fault + pause_ms * MS - now) / MS));
    uint64_t t_cont = dlock_monotonic_ns();
    kill(-pids[0], SIGCONT);
    diag("stopped for %.0f ms", ms_of(t_fault, t_cont));
    /* Lease stores: the watchdog's absolute timer fires at once. ZooKeeper:
     * the disconnected session is given up a third of its timeout later
     * (unless the servers say it expired first). */
    uint64_t bound = keep_interval_ms() + (is("zookeeper") ? ZK_SESSION_MS / 3 : 0);
    struct ev *lost = wait_ev(0, EV_LOST, (unsigned)bound + SLACK_MS);
    if (lost)
        diag("on_lost %s %.0f ms after the resume: %s", dlock_err_name(lost->rc),
             ms_of(t_cont, lost->t), lost->msg);
    ok(lost && lost->t >= t_cont && lost->t - t_cont <= (bound + SLACK_MS) * MS,
       "the resumed holder is told within %llu ms (+ %u ms slack) of the resume",
       (unsigned long long)bound, SLACK_MS);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(1, 1, t_fault, pause_ms + bound);
    check_world(NW, 1, deadline, t_fault);
out:
    if (pids[0] > 0)
        kill(-pids[0], SIGCONT);
    reap_all(pids, NW + 1, 0);
}

/* The ensemble member that leads, e.g. "zk-2"; "" when none. */
static void zk_leader(char *out, size_t len)
{
    char cmd[PATH_MAX + 128];
    out[0] = '\0';
    snprintf(cmd, sizeof cmd, "bash '%s/kill.sh' --dir '%s' leader 2>/dev/null",
             DLOCK_STORES_SCRIPTS, stores_dir);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    if (fgets(out, (int)len, p))
        out[strcspn(out, "\r\n")] = '\0';
    pclose(p);
}

/* e. The ZooKeeper ensemble's leader killed while a lock is held and waited on. */
static void case_leader_kill(void)
{
    enum { NW = 3 };
    char name[128], leader[32], after[32];
    pid_t pids[NW + 1] = {0};
    name_of(name, sizeof name, "leader-kill");
    zk_leader(leader, sizeof leader);
    if (!ok(leader[0], "the ensemble has a leader (%s)", leader[0] ? leader : "none"))
        return;
    uint64_t deadline = dlock_monotonic_ns() + 40000 * MS;
    if (setup_contention(pids, curi, curi, name, NW, deadline, 100, 1) != 0)
        goto out;
    is_int(store_ctl("%s", leader), 0, "the leader %s killed (SIGKILL)", leader);
    uint64_t t_fault = dlock_monotonic_ns();
    /* A new leader, from the survivors' srvr. */
    uint64_t t_elected = 0;
    for (uint64_t end = t_fault + 30000 * MS; dlock_monotonic_ns() < end; sleep_ms(100)) {
        zk_leader(after, sizeof after);
        if (after[0]) {
            t_elected = dlock_monotonic_ns();
            break;
        }
    }
    ok(t_elected, "a new leader (%s) within 30 s: %.0f ms after the kill", after,
       t_elected ? ms_of(t_fault, t_elected) : -1.0);
    sleep_ms(1000);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 20000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(-1, 1, t_fault, ZK_SESSION_MS);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("leader-kill: first waiter grant %.0f ms after the kill", ms_of(t_fault, next->t));
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 1, 0);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(store_ctl("start %s", leader), 0, "%s started again", leader);
    diag("%s back in %.0f ms", leader, ms_of(t0, dlock_monotonic_ns()));
}

/* f. Redlock with 2 of 5 nodes down (works), then 3 of 5 (fails cleanly). */
static void case_quorum(void)
{
    enum { NW = 2 };
    char name[128];
    pid_t pids[NW + 1] = {0};
    name_of(name, sizeof name, "quorum");
    if (nhosts != 5) {
        ok(0, "the Redlock URI has 5 nodes (it has %d)", nhosts);
        return;
    }
    uint64_t deadline = dlock_monotonic_ns() + 30000 * MS;
    if (setup_contention(pids, curi, curi, name, NW, deadline, 100, 1) != 0)
        goto out;
    /* Two down while it is held and waited on. */
    is_int(store_ctl("%s %s", inst[0], inst[2]), 0, "2 of 5 nodes killed (%s, %s)", inst[0],
           inst[2]);
    uint64_t t_fault = dlock_monotonic_ns();
    sleep_ms(2 * ttl_ms()); /* renewals go on with 3 of 5 */
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(0, 1, t_fault, ttl_ms());
    check_world(NW, 1, deadline, t_fault);

    /* Three down: a kept holder is told at its lease end, an acquire fails
     * with a clear error by its deadline, a try at once. */
    dlock_client *c = open_ok(curi); /* opened with 3 of 5 up */
    dlock_lock *l = NULL, *x = NULL;
    enum { H2 = MAXW + 1 };
    pids[0] = spawn_holder(H2, curi, name, ttl_ms(), 1);
    struct ev *g = wait_ev(H2, EV_GRANT, 15000);
    ok(g != NULL, "with 2 of 5 down, a new holder acquires with keep (token %llu)",
       g ? (unsigned long long)g->token : 0ull);
    is_int(store_ctl("%s", inst[3]), 0, "a third node killed (%s): 2 of 5 left", inst[3]);
    uint64_t t3 = dlock_monotonic_ns();
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_DEADLINE, 2000, ttl_ms());
    uint64_t dl = o.deadline_ns;
    int rc = dlock_acquire(c, name, &o, &x);
    uint64_t t = dlock_monotonic_ns();
    diag("quorum: acquire with 2 of 5 up: %s after %.0f ms (deadline 2000 ms): %s",
         dlock_err_name(rc), ms_of(t3, t), dlock_errmsg(c));
    ok(rc == DLOCK_ECONNECT || rc == DLOCK_ETIMEDOUT, "the acquire fails with DLOCK_ECONNECT or "
       "DLOCK_ETIMEDOUT (%s)", dlock_err_name(rc));
    ok(t <= dl + (250 + SLACK_MS) * MS, "by its deadline (+ %.0f ms)", ms_of(dl, t));
    /* Item 7 of issue 10: it must name the lost quorum and the two nodes
     * that still answer, not "0 of 5" nor a single node. */
    ok(strstr(dlock_errmsg(c), "quorum") &&
           (strstr(dlock_errmsg(c), "2 of 5") || strstr(dlock_errmsg(c), "3 of 5")),
       "the message names the lost quorum and the 2 of 5 nodes still up: %s", dlock_errmsg(c));
    if (rc == 0)
        dlock_release(x);
    o = wait_opts(DLOCK_WAIT_TRY, 0, ttl_ms());
    t = dlock_monotonic_ns();
    rc = dlock_acquire(c, name, &o, &x);
    diag("quorum: try with 2 of 5 up: %s after %.0f ms: %s", dlock_err_name(rc),
         ms_of(t, dlock_monotonic_ns()), dlock_errmsg(c));
    is_int(rc, DLOCK_ECONNECT, "a try fails with DLOCK_ECONNECT");
    ok(dlock_monotonic_ns() - t <= (1000 + SLACK_MS) * MS, "within 1 s (+ slack)");
    if (rc == 0)
        dlock_release(x);
    uint64_t left = t3 + (ttl_ms() + SLACK_MS) * MS;
    struct ev *lost = wait_ev(H2, EV_LOST,
                              left > dlock_monotonic_ns() ? (unsigned)((left - dlock_monotonic_ns()) / MS) : 0);
    ok(lost != NULL, "the kept holder is told at its lease end (%s %.0f ms after the third kill)",
       lost ? dlock_err_name(lost->rc) : "not told", lost ? ms_of(t3, lost->t) : -1.0);
    W->release[H2] = 1;
    reap_all(pids, 1, dlock_monotonic_ns() + 10000 * MS);

    /* All back: locks work again, tokens above every earlier one. */
    uint64_t t_start = dlock_monotonic_ns();
    is_int(store_ctl("start %s %s %s", inst[0], inst[2], inst[3]), 0, "the three nodes started again");
    o = wait_opts(DLOCK_WAIT_DEADLINE, 10000, ttl_ms());
    rc = dlock_acquire(c, name, &o, &l);
    is_int(rc, 0, "the same client acquires again %.0f ms after the restart began%s%s",
           ms_of(t_start, dlock_monotonic_ns()), rc ? ": " : "", rc ? dlock_errmsg(c) : "");
    uint64_t maxtok = 0;
    for (int i = 0; i < W->nev && i < MAXEV; i++)
        if (W->ev[i].kind == EV_GRANT && W->ev[i].token > maxtok)
            maxtok = W->ev[i].token;
    if (l) {
        diag("quorum: token after the restart %llu, highest before %llu",
             (unsigned long long)dlock_lock_token(l), (unsigned long long)maxtok);
        ok(dlock_lock_token(l) > maxtok, "its token is above every earlier one (%llu > %llu)",
           (unsigned long long)dlock_lock_token(l), (unsigned long long)maxtok);
        dlock_release(l);
    }
    dlock_client_close(c);
out:
    W->release[0] = W->release[MAXW + 1] = 1;
    reap_all(pids, NW + 1, 0);
}

/* ---- running ---------------------------------------------------------------- */

struct fcase {
    const char *name, *what;
    void (*fn)(void);
    const char *skip; /* why it does not apply to this store, or NULL */
};

/* Runs fn in a process of its own, output captured and renumbered into
 * ours; killed (and failed) after CASE_LIMIT_S. */
static void run_case(const struct fcase *fc)
{
    FILE *out = tmpfile();
    uint64_t t0 = dlock_monotonic_ns();
    if (!out) {
        printf("Bail out! tmpfile: %s\n", strerror(errno));
        exit(1);
    }
    diag("---- %s: %s", fc->name, fc->what);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        if (dup2(fileno(out), STDOUT_FILENO) < 0)
            _exit(98);
        tap_n_ = tap_failed_ = 0;
        new_world();
        fc->fn();
        fflush(stdout);
        _exit(tap_failed_ ? 1 : 0);
    }
    setpgid(pid, pid);
    int st = 0, done = 0;
    while (dlock_monotonic_ns() - t0 < (uint64_t)CASE_LIMIT_S * 1000 * MS)
        if (waitpid(pid, &st, WNOHANG) == pid) {
            done = 1;
            break;
        } else {
            sleep_ms(20);
        }
    if (!done) {
        kill(-pid, SIGCONT);
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    char line[4096];
    rewind(out);
    while (fgets(line, sizeof line, out)) {
        int num;
        if (strncmp(line, "ok ", 3) == 0 || strncmp(line, "not ok ", 7) == 0) {
            int bad = line[0] == 'n';
            char *rest = line + (bad ? 7 : 3);
            if (sscanf(rest, "%d", &num) == 1) {
                rest += strspn(rest, "0123456789");
                tap_n_++;
                tap_failed_ += bad;
                printf("%sok %d%s", bad ? "not " : "", tap_n_, rest);
                continue;
            }
        }
        fputs(line, stdout);
    }
    fclose(out);
    ok(done && WIFEXITED(st) && WEXITSTATUS(st) <= 1, "%s: ran to its end in %.1f s%s", fc->name,
       ms_of(t0, dlock_monotonic_ns()) / 1000, done ? "" : " (killed at the time limit)");
    int rc = stores_restore();
    ok(rc == 0, "%s: the store's instances run again after the case", fc->name);
}

static void usage(void)
{
    fprintf(stderr, "usage: faults (URI | --env VAR) [--case NAME] [--list]\n"
                    "cases: store-restart conn-kill holder-kill holder-pause leader-kill quorum\n");
    exit(64);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--env") == 0 && i + 1 < argc)
            uri = need_env(argv[++i]);
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--list") == 0)
            list = 1;
        else if (argv[i][0] != '-' && !uri)
            uri = argv[i];
        else
            usage();
    }
    if (!uri)
        usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    snprintf(prefix, sizeof prefix, "faults-%d-%08x/", (int)getpid(),
             (unsigned)(dlock_monotonic_ns() ^ (uint64_t)getpid()));
    {
        dlock_uri *u = NULL;
        char err[256];
        if (dlock_uri_parse(uri, &u, err, sizeof err) != 0) {
            printf("Bail out! bad URI: %s\n", err);
            return 1;
        }
        nhosts = (int)dlock_uri_host_count(u);
        if (nhosts > PROXY_MAX_UP) {
            printf("Bail out! at most %d hosts\n", PROXY_MAX_UP);
            return 1;
        }
        for (int i = 0; i < nhosts; i++)
            inst_port[i] = (int)(dlock_uri_port(u, (size_t)i)
                                     ? dlock_uri_port(u, (size_t)i)
                                     : scheme_default_port(dlock_uri_scheme(u)));
        dlock_uri_free(u);
    }
    dlock_client *c = open_ok(uri);
    caps = dlock_client_caps(c);
    snprintf(backend, sizeof backend, "%s", dlock_client_backend(c));
    dlock_client_close(c);
    if (is("redis") && nhosts > 1)
        snprintf(backend, sizeof backend, "redlock");
    ensemble = is("zookeeper") && nhosts > 1;
    const char *params = NULL;
    if (is("redis") || is("redlock") || is("mysql"))
        params = "connect_timeout=1000&timeout=1000";
    else if (is("postgres")) /* libpq counts whole seconds, at least 2 */
        params = "connect_timeout=2000&timeout=1000";
    else if (is("zookeeper"))
        params = "connect_timeout=2000&session_timeout=3000";
    if (uri_rewrite(uri, NULL, 0, NULL, params, curi, sizeof curi) != 0) {
        printf("Bail out! cannot add the suite's options to the URI\n");
        return 1;
    }
    char shown[1024];
    diag("faults: backend %s%s, caps 0x%x, uri %s", backend, ensemble ? " (ensemble)" : "", caps,
         shown_uri(curi, shown, sizeof shown));
    if (nhosts) {
        stores_dir = need_env("DLOCK_STORES_DIR");
        for (int i = 0; i < nhosts; i++)
            if (find_instance(inst_port[i], inst[i], sizeof inst[i]) != 0) {
                printf("Bail out! no store instance with port %d under DLOCK_STORES_DIR=%s\n",
                       inst_port[i], stores_dir);
                return 1;
            }
        char all[512];
        all_insts(all, sizeof all);
        diag("instances: %s (under %s)", all, stores_dir);
    }

    static const char *const no_store = "the file backend has no store process: the kernel holds its locks";
    const struct fcase cases[] = {
        {"store-restart", "the store SIGKILLed and started again while one holds and others wait",
         case_store_restart, nhosts ? NULL : no_store},
        {"conn-kill", "the clients' connections killed by the server (ZooKeeper: session expired)",
         case_conn_kill, nhosts ? NULL : no_store},
        {"holder-kill", "the holder SIGKILLed: time until a waiter holds", case_holder_kill, NULL},
        {"holder-pause", "the holder's process group stopped past its lease, then resumed",
         case_holder_pause,
         nhosts ? NULL : "a stopped holder keeps its kernel lock on the file backend: nothing is lost"},
        {"leader-kill", "the ensemble's leader SIGKILLed while a lock is held and waited on",
         case_leader_kill, ensemble ? NULL : "only the ZooKeeper ensemble has a leader to kill"},
        {"quorum", "Redlock with 2 of 5 nodes down, then 3 of 5", case_quorum,
         is("redlock") ? NULL : "only Redlock has a quorum of independent nodes"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]), ran = 0;
    if (list) {
        for (int i = 0; i < n; i++)
            printf("%s\t%s\n", cases[i].name, cases[i].skip ? cases[i].skip : cases[i].what);
        return 0;
    }
    if (nhosts && stores_restore() != 0) {
        printf("Bail out! the store's instances do not all run: start them with scripts/stores/start.sh\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        if (only && strcmp(only, cases[i].name) != 0)
            continue;
        ran++;
        if (cases[i].skip)
            skip(cases[i].skip, "%s", cases[i].name);
        else
            run_case(&cases[i]);
    }
    if (!ran) {
        printf("Bail out! no case called %s\n", only);
        return 1;
    }
    return done_testing();
}
