/*
 * The fault suite: stores killed and restarted, connections killed from the
 * server side, holders killed and paused, the ZooKeeper or etcd leader
 * killed, etcd members killed and stopped, etcd's history compacted,
 * Redlock nodes down. `faults (URI | --env VAR) [--case NAME] [--mode M]`:
 * M "shared" makes the faulted holder a reader (the waiters stay writers),
 * "permit" makes every grant a permit of a semaphore of 1.
 *
 * Every case runs a holder and waiters in processes of their own (as in real
 * use: a fork never shares a client) against one store, injects one fault,
 * and checks, from the events the processes log into shared memory:
 *   - no overlap: the waiters increment a shared counter inside the lock,
 *     read-modify-write with a sleep in between, and flag any entry while
 *     another waiter, or the holder (inside from its grant until it is told
 *     or releases), is inside; the counter must equal the grants. An
 *     overlap counts as a double grant unless the case's documented outcome
 *     is a loss, the first one's release then says DLOCK_ELOST, and the
 *     token covers it: the later one's is higher and, for the holder, a
 *     fenced resource (in shared memory) refused its late write;
 *   - tokens strictly increase in grant order across the whole case (the
 *     holder before the fault, everyone after it); store-restart also takes
 *     five grants right before the kill and one after, on the same client;
 *   - the holder is told when its lock is gone (on_lost, then renew and
 *     release say DLOCK_ELOST), where the store lets go only at the lease
 *     end before any waiter is granted, and a holder that was not told was
 *     really still the only holder (nobody granted before its release);
 *   - waiters recover on the same client (no reopen): each gets the lock, or
 *     fails with a clear error (DLOCK_ECONNECT, DLOCK_ETIMEDOUT, ...) by its
 *     deadline, and tries again;
 *   - nothing hangs: every call returns within its bound, each case within
 *     a time limit (it is killed and fails after that).
 * Measured times go out as TAP comments ("# ...").
 *
 * Cases (--case NAME, default all that apply to the store):
 *   store-restart  a. the store SIGKILLed and started again (Redlock: all
 *                     five nodes; the ensemble and the etcd cluster: all
 *                     three members; Redis Cluster: all six nodes;
 *                     Sentinel: the data nodes). etcd keeps its keys and
 *                     leases on disk: a lock with a lease longer than the
 *                     outage must survive it
 *   conn-kill      b. the clients' connections killed by the server (Redis
 *                     CLIENT KILL, pg_terminate_backend, MariaDB KILL);
 *                     ZooKeeper: the holder's network silent past its
 *                     session timeout (tests/proxy.h), so the session
 *                     expires; etcd (no server-side kill) the same, past
 *                     the holder's lease
 *   holder-kill    c. the holder SIGKILLed: time until a waiter holds,
 *                     against the TTL or the session timeout
 *   holder-pause   d. the holder's process group SIGSTOPped past its lease
 *   leader-kill    e. the ZooKeeper ensemble's or the etcd cluster's leader
 *                     SIGKILLed (etcd: the holder, on a lease longer than
 *                     an election, must keep its lock)
 *   quorum         f. Redlock with 2 of 5 nodes down, then 3 of 5
 *   cluster-failover g. Redis Cluster: a manual CLUSTER FAILOVER of the
 *                     primary that owns the lock's slot (no write lost: the
 *                     holder keeps its lock, renewed on the new primary),
 *                     then back
 *   slot-migrate   h. Redis Cluster: the slot of three names moved to
 *                     another primary and back, ten keys per MIGRATE as
 *                     redis-cli --cluster reshard does, with pauses
 *                     (MIGRATING/IMPORTING: the calls wait out TRYAGAIN
 *                     and ASK), while six processes take and hand off
 *                     those locks in a loop
 *   primary-kill   i. Redis Sentinel: the primary SIGKILLed, the sentinels
 *                     fail over; with wait_replicas=1 (a grant acknowledged
 *                     by a replica) no two holders overlap
 *   node-pause     j. Redis Cluster and Sentinel: the data node serving the
 *                     lock SIGSTOPped past a failover, then resumed (the
 *                     silent network the conformance suite's proxy makes
 *                     for other stores); Sentinel with wait_replicas=1
 *   member-kill    k. the etcd cluster: the member the clients talk to (the
 *   member-pause      URI's first host) SIGKILLed, or SIGSTOPped (silent),
 *                     until every waiter has held: the clients move to the
 *                     other members, the holder keeps its lock
 *   compaction     l. etcd: the history compacted past the revisions the
 *                     waiters' watches started from; on the cluster their
 *                     member is then killed, so every watch starts again
 *                     after the compaction. A probe client (leader-kill,
 *                     member-*) measures when the store grants again.
 *
 * Redis Cluster and Sentinel: the URI's hosts are seed nodes or sentinels,
 * not the servers the client ends up talking to, so the store is every
 * instance of its set (rcluster-*, or rsentinel-data-* and rsentinel-*
 * under DLOCK_STORES_DIR): store-restart kills and restarts every node
 * that holds data, all six of a cluster, the three data nodes of Sentinel
 * (every node's data is lost at once: the client must find its way back
 * from the seeds or through the sentinels, which live on, as they do on
 * hosts of their own), conn-kill
 * kills the clients' connections on each of them (CLIENT KILL, with the
 * password). The suite finds slot owners, replicas and the primary itself
 * (CLUSTER NODES, SENTINEL get-master-addr-by-name, through redis-cli),
 * and before each case waits until the set is whole again (every slot
 * served, each primary with its replicas online; cases do not depend on
 * which node is primary).
 *
 * Stores are controlled with scripts/stores/kill.sh under DLOCK_STORES_DIR
 * (required for every networked store; the instance of each URI host is
 * found by its port). After each case every instance of the URI is resumed
 * and started again, whatever the case did.
 *
 * etcd: the leader is named by scripts/stores/etcd-node.sh leader (kill.sh
 * leader etcd-cluster would kill it at once, before the case could set up
 * its clients); the suite runs etcdctl itself (compaction) with the URI's
 * members and user in ETCDCTL_ENDPOINTS and ETCDCTL_USER, not in a process
 * list. Leases are whole seconds (at least 2 s with the stores' 1 s
 * election timeout), so the TTL is 2 s; a holder that must ride out an
 * election or a failover gets 5 s.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
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

/* --mode permit: every acquire of the run is a permit of a semaphore of 1
 * (at most one inside, as an exclusive lock, through the store's semaphore
 * recipe); --mode shared: the faulted holder holds a shared lock, the
 * waiters exclusive ones. Either way the checks below are unchanged. */
static uint32_t run_limit;
static dlock_mode holder_mode = DLOCK_MODE_EXCLUSIVE;

static dlock_acquire_opts mode_opts(dlock_wait wait, uint64_t wait_ms, uint32_t ttl_ms)
{
    dlock_acquire_opts o = wait_opts(wait, wait_ms, ttl_ms);
    o.limit = run_limit;
    return o;
}

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
static char backend[32]; /* file, redis, redlock, postgres, mysql, zookeeper, etcd */
static int nhosts, ensemble, etcd_cluster;
static int cluster, sentinel; /* redis+cluster://, redis+sentinel:// */
static char prefix[64];
#define MAXINST 16
/* The store's instances: the one of each URI host, or for Redis Cluster and
 * Sentinel every instance of the set (the URI names seeds or sentinels). */
static int ninst;
static char inst[MAXINST][32];
static int inst_port[MAXINST];
static int inst_sentinel[MAXINST]; /* a sentinel, not a data node */
static char data_pw[128], sentinel_pw[128], primary_name[64];
static char curi[DLOCK_URI_MAX]; /* uri with the suite's timeouts */

static int is(const char *b)
{
    return strcmp(backend, b) == 0;
}

/* A Redis of any scheme: its keys outlive the connections. */
static int is_redis(void)
{
    return is("redis") || is("redlock") || cluster || sentinel;
}

static double ms_of(uint64_t from, uint64_t to)
{
    return to >= from ? (to - from) / 1e6 : -((from - to) / 1e6);
}

/* ---- what the processes of a case log -------------------------------------- */

enum { EV_READY = 1, EV_GRANT, EV_LOST, EV_RENEW, EV_REL, EV_ERR, EV_PROBE, EV_WRITE };

struct ev {
    int kind, who, rc;
    int lock;       /* which of the case's names (slot-migrate), else 0 */
    uint64_t t;     /* when it happened (the end of the call) */
    uint64_t t0;    /* when the call started */
    uint64_t token;
    char msg[200];
};

#define MAXEV 4096 /* slot-migrate's loops log a few hundred grants each */
#define MAXLOCKS 4
struct world {
    volatile int inside, overlaps, counter; /* inside: who is (0: nobody) */
    int loss_expected; /* the case's documented outcome is a loss: check_world */
    int holder_loss_expected; /* the holder's loss is (holder-pause): check_world */
    volatile int holder_in; /* the holder inside: its who + 1 (0: nobody) */
    volatile uint64_t fence; /* the fenced resource: the highest token it took */
    volatile int npairs, pair[16][2]; /* overlaps: (inside, entering); a holder's who first */
    volatile int release[MAXW + 2]; /* parent → holder who: renew and release now */
    volatile int stop;              /* parent → loopers: no new acquire */
    volatile int go;                /* parent → probe: the fault is in, acquire now */
    volatile int inside_k[MAXLOCKS], counter_k[MAXLOCKS]; /* per name (loopers) */
    volatile int nev;
    struct ev ev[MAXEV];
};

static struct world *W;
static int me;      /* who this process is: 0 the holder, 1.. the waiters */
static int my_lock; /* the name a looper takes */

static void log_ev(int kind, int rc, uint64_t t0, uint64_t token, const char *msg)
{
    int i = __atomic_fetch_add(&W->nev, 1, __ATOMIC_SEQ_CST);
    if (i >= MAXEV)
        return;
    struct ev *e = &W->ev[i];
    e->who = me;
    e->lock = my_lock;
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

/* The processes that hold the case's lock before the fault: who 0, and
 * quorum's second holder; every other number is a waiter or a looper. */
static int is_holder(int who)
{
    return who == 0 || who > MAXW;
}

/*
 * A write to a fenced resource (one in shared memory): it takes the write
 * when the token is at least the highest it took, and refuses a lower one,
 * as a store that checks fencing tokens does. 1 taken, 0 refused.
 */
static int fenced_write(uint64_t token)
{
    uint64_t cur = __atomic_load_n(&W->fence, __ATOMIC_SEQ_CST);
    do {
        if (token < cur)
            return 0;
    } while (!__atomic_compare_exchange_n(&W->fence, &cur, token, 0, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    return 1;
}

static void note_overlap(int was, int who)
{
    int k = __atomic_fetch_add(&W->overlaps, 1, __ATOMIC_SEQ_CST);
    if (k < 16)
        W->pair[k][0] = was, W->pair[k][1] = who;
}

/* A waiter enters the critical section: an overlap with a waiter inside,
 * or with the holder, still inside until it is told or releases. */
static void enter_section(int who)
{
    int was = __atomic_exchange_n(&W->inside, who, __ATOMIC_SEQ_CST);
    if (was)
        note_overlap(was, who);
    int h = __atomic_load_n(&W->holder_in, __ATOMIC_SEQ_CST);
    if (h)
        note_overlap(h - 1, who);
}

/* The holder leaves (told of its loss, releasing, or killed). */
static void holder_leave(int who)
{
    int in = who + 1;
    __atomic_compare_exchange_n(&W->holder_in, &in, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
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
    for (int i = 0; i < ninst; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? " " : "", inst[i]);
}

/* The instances that hold data: all but Sentinel's sentinels. */
static void data_insts(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < ninst; i++)
        if (!inst_sentinel[i])
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? " " : "", inst[i]);
}

/* Every instance of the URI running and answering again. */
static int stores_restore(void)
{
    char all[512];
    if (!ninst)
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

static int cmp_inst(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* Redis Cluster and Sentinel: every instance under DIR whose name starts
 * with pfx (rcluster-, or rsentinel- for the data nodes and sentinels).
 * Returns 0, or -1 (Bail out! said) when there is none or too many. */
static int set_instances(const char *pfx)
{
    DIR *d = opendir(stores_dir);
    struct dirent *de;
    ninst = 0;
    while (d && (de = readdir(d))) {
        char path[PATH_MAX];
        if (strncmp(de->d_name, pfx, strlen(pfx)) != 0 || strlen(de->d_name) >= sizeof inst[0])
            continue;
        snprintf(path, sizeof path, "%s/%s/port", stores_dir, de->d_name);
        if (access(path, R_OK) != 0)
            continue;
        if (ninst == MAXINST) {
            printf("Bail out! more than %d instances %s* under %s\n", MAXINST, pfx, stores_dir);
            closedir(d);
            return -1;
        }
        memcpy(inst[ninst++], de->d_name, strlen(de->d_name) + 1);
    }
    if (d)
        closedir(d);
    if (!ninst) {
        printf("Bail out! no instance %s* under DLOCK_STORES_DIR=%s: start the store with "
               "scripts/stores/start.sh\n", pfx, stores_dir);
        return -1;
    }
    qsort(inst, (size_t)ninst, sizeof inst[0], cmp_inst);
    for (int i = 0; i < ninst; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/port", stores_dir, inst[i]);
        FILE *f = fopen(path, "r");
        if (!f || fscanf(f, "%d", &inst_port[i]) != 1) {
            printf("Bail out! no port in %s\n", path);
            if (f)
                fclose(f);
            return -1;
        }
        fclose(f);
        inst_sentinel[i] = strncmp(inst[i], "rsentinel-", 10) == 0 &&
                           strncmp(inst[i], "rsentinel-data-", 15) != 0;
    }
    return 0;
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

/* ---- Redis Cluster and Sentinel: what the set looks like ------------------- */

/*
 * One command on the Redis (or sentinel) at 127.0.0.1:port, through
 * redis-cli. The command goes on its stdin, so that no password shows in a
 * process list (MIGRATE takes one in its arguments); the connection's
 * password goes in REDISCLI_AUTH. out gets the reply, one element a line,
 * trailing blanks cut; an error reply is text there too ("ERR ...":
 * redis-cli exits 0 for those), and nothing when the server did not
 * answer. Returns 0, or -1 when redis-cli could not run or took over 5 s.
 */
static int rcli_v(int port, const char *auth, char *out, size_t len, const char *fmt, va_list ap)
{
    char cmd[4096];
    int in[2], rd[2];
    out[0] = '\0';
    int n = vsnprintf(cmd, sizeof cmd - 1, fmt, ap);
    if (n < 0 || (size_t)n >= sizeof cmd - 1)
        return -1;
    cmd[n++] = '\n';
    if (pipe(in) < 0)
        return -1;
    if (pipe(rd) < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char p[16];
        int null = open("/dev/null", O_WRONLY);
        dup2(in[0], STDIN_FILENO);
        dup2(rd[1], STDOUT_FILENO);
        if (null >= 0) {
            dup2(null, STDERR_FILENO);
            close(null);
        }
        close(in[0]);
        close(in[1]);
        close(rd[0]);
        close(rd[1]);
        if (auth && *auth)
            setenv("REDISCLI_AUTH", auth, 1);
        else
            unsetenv("REDISCLI_AUTH");
        snprintf(p, sizeof p, "%d", port);
        execlp("redis-cli", "redis-cli", "-h", "127.0.0.1", "-p", p, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(rd[1]);
    int failed = pid < 0;
    if (!failed && write(in[1], cmd, (size_t)n) != n)
        failed = 1;
    close(in[1]);
    size_t o = 0;
    uint64_t end = dlock_monotonic_ns() + 5000 * MS;
    while (!failed) {
        uint64_t now = dlock_monotonic_ns();
        struct pollfd pfd = {.fd = rd[0], .events = POLLIN};
        if (now >= end || poll(&pfd, 1, (int)((end - now) / MS) + 1) == 0) {
            failed = 1;
            break;
        }
        char buf[4096];
        ssize_t r = read(rd[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        size_t take = (size_t)r < len - 1 - o ? (size_t)r : len - 1 - o;
        memcpy(out + o, buf, take); /* the rest is read and dropped */
        o += take;
    }
    close(rd[0]);
    if (pid > 0) {
        int st = 0;
        if (failed)
            kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
            diag("redis-cli cannot be run (the suite needs it for Redis Cluster and Sentinel)");
            failed = 1;
        }
    }
    while (o > 0 && (out[o - 1] == '\n' || out[o - 1] == '\r' || out[o - 1] == ' '))
        o--;
    out[o] = '\0';
    return failed ? -1 : 0;
}

/* A command on a data node (the URI's password). */
static int dcli(int port, char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = rcli_v(port, data_pw, out, len, fmt, ap);
    va_end(ap);
    return rc;
}

/* A command on a sentinel (sentinel_password). */
static int scli(int port, char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = rcli_v(port, sentinel_pw, out, len, fmt, ap);
    va_end(ap);
    return rc;
}

/* The value of "key:" in an INFO or CLUSTER INFO reply, into v. */
static int info_field(const char *reply, const char *key, char *v, size_t len)
{
    size_t kl = strlen(key);
    for (const char *p = reply; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, key, kl) == 0 && p[kl] == ':') {
            size_t n = strcspn(p + kl + 1, "\r\n");
            snprintf(v, len, "%.*s", (int)n, p + kl + 1);
            return 0;
        }
    v[0] = '\0';
    return -1;
}

/* Redis Cluster's hash slot of a key: CRC16 (XMODEM) mod 16384, of the
 * part between the first '{' and the next '}' when that part is not empty. */
static int key_slot(const char *k)
{
    size_t n = strlen(k);
    const char *lb = strchr(k, '{');
    if (lb) {
        const char *rb = strchr(lb + 1, '}');
        if (rb && rb > lb + 1) {
            k = lb + 1;
            n = (size_t)(rb - k);
        }
    }
    unsigned crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (unsigned)(unsigned char)k[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
        crc &= 0xffff;
    }
    return (int)(crc & 16383);
}

/* One node as a CLUSTER NODES reply shows it. */
struct cnode {
    char id[48], of[48]; /* of: a replica's primary */
    int port, primary, failing, myself;
    int nr, lo[32], hi[32]; /* the slots it serves (a primary) */
};

/* The cluster as the node at port sees it; how many nodes (-1: no answer). */
static int cluster_view(int port, struct cnode *v, int max)
{
    static char reply[16384];
    int n = 0;
    if (dcli(port, reply, sizeof reply, "CLUSTER NODES") != 0 || !strchr(reply, '@'))
        return -1;
    for (char *line = strtok(reply, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        struct cnode *c = &v[n];
        char addr[128], flags[128], of[48];
        int used = 0;
        memset(c, 0, sizeof *c);
        if (sscanf(line, "%47s %127s %127s %47s %*s %*s %*s %*s%n", c->id, addr, flags, of, &used) < 4)
            continue;
        if (!used) /* no link state: not a line to read slots from */
            used = (int)strlen(line);
        addr[strcspn(addr, "@,")] = '\0'; /* ip:port@cport[,hostname] */
        char *colon = strrchr(addr, ':');
        c->port = colon ? atoi(colon + 1) : 0;
        c->primary = strstr(flags, "master") != NULL;
        c->myself = strstr(flags, "myself") != NULL;
        /* "fail" or "fail?": down (or suspected); noaddr, handshake: not yet known */
        c->failing = strstr(flags, "fail") || strstr(flags, "noaddr") || strstr(flags, "handshake");
        snprintf(c->of, sizeof c->of, "%s", strcmp(of, "-") ? of : "");
        for (char *t = line + used; *t && c->nr < 32;) {
            t += strspn(t, " ");
            size_t w = strcspn(t, " ");
            if (!w)
                break;
            if (*t != '[') { /* [slot->-id]: a migration in progress, not owned */
                int lo, hi;
                int k = sscanf(t, "%d-%d", &lo, &hi);
                if (k >= 1) {
                    c->lo[c->nr] = lo;
                    c->hi[c->nr++] = k == 2 ? hi : lo;
                }
            }
            t += w;
        }
        n++;
    }
    return n;
}

/* The primary serving slot in view v, or -1. */
static int slot_owner(const struct cnode *v, int n, int slot)
{
    for (int i = 0; i < n; i++)
        for (int r = 0; v[i].primary && r < v[i].nr; r++)
            if (slot >= v[i].lo[r] && slot <= v[i].hi[r])
                return i;
    return -1;
}

/* The view of the first node that answers. */
static int cluster_any_view(struct cnode *v, int max)
{
    for (int i = 0; i < ninst; i++) {
        int n = cluster_view(inst_port[i], v, max);
        if (n > 0)
            return n;
    }
    return -1;
}

/* A layout as a string (each primary's port and slots, in port order), to
 * compare what the nodes think. */
static void layout_of(const struct cnode *v, int n, char *out, size_t len)
{
    size_t o = 0;
    out[0] = '\0';
    for (int port = 0, next; ; port = next) {
        next = INT_MAX;
        for (int i = 0; i < n; i++)
            if (v[i].port > port && v[i].port < next)
                next = v[i].port;
        if (next == INT_MAX)
            break;
        for (int i = 0; i < n; i++) {
            if (v[i].port != next || !v[i].primary || !v[i].nr)
                continue;
            o += (size_t)snprintf(out + o, o < len ? len - o : 0, "%s%d:", o ? " " : "", v[i].port);
            for (int r = 0; r < v[i].nr && o < len; r++)
                o += (size_t)snprintf(out + o, len - o, "%s%d-%d", r ? "," : "", v[i].lo[r], v[i].hi[r]);
        }
        if (o >= len)
            break;
    }
}

/*
 * Is the cluster whole: every node answers with cluster_state:ok and all
 * 16384 slots served, all agree on who serves what, no node is failing,
 * each primary with slots has a replica, and its INFO replication shows
 * every replica online. why: what is not (yet).
 */
static int cluster_whole(char *why, size_t len)
{
    static char reply[8192];
    struct cnode v[16];
    char first[1024] = "", lay[1024], val[64];
    why[0] = '\0';
    for (int i = 0; i < ninst; i++) {
        if (dcli(inst_port[i], reply, sizeof reply, "CLUSTER INFO") != 0 ||
            info_field(reply, "cluster_state", val, sizeof val) != 0) {
            snprintf(why, len, "%s does not answer", inst[i]);
            return 0;
        }
        if (strcmp(val, "ok") != 0) {
            snprintf(why, len, "%s: cluster_state:%s", inst[i], val);
            return 0;
        }
        info_field(reply, "cluster_slots_ok", val, sizeof val);
        if (strcmp(val, "16384") != 0) {
            snprintf(why, len, "%s: cluster_slots_ok:%s", inst[i], val);
            return 0;
        }
        int n = cluster_view(inst_port[i], v, 16);
        if (n != ninst) {
            snprintf(why, len, "%s knows %d of the %d nodes", inst[i], n, ninst);
            return 0;
        }
        layout_of(v, n, lay, sizeof lay);
        if (!first[0]) {
            snprintf(first, sizeof first, "%s", lay);
        } else if (strcmp(first, lay) != 0) {
            snprintf(why, len, "%s sees %s, %s sees %s", inst[0], first, inst[i], lay);
            return 0;
        }
        for (int k = 0; k < n; k++) {
            if (v[k].failing) {
                snprintf(why, len, "%s sees port %d failing", inst[i], v[k].port);
                return 0;
            }
            if (!v[k].primary || !v[k].nr)
                continue;
            int reps = 0;
            for (int j = 0; j < n; j++)
                reps += !v[j].primary && strcmp(v[j].of, v[k].id) == 0;
            if (reps < 1) {
                snprintf(why, len, "%s: primary %d has no replica", inst[i], v[k].port);
                return 0;
            }
            if (v[k].myself) {
                char rep[16];
                if (dcli(v[k].port, reply, sizeof reply, "INFO replication") != 0)
                    return 0;
                info_field(reply, "connected_slaves", rep, sizeof rep);
                int online = 0;
                for (const char *p = reply; (p = strstr(p, "state=online")); p++)
                    online++;
                if (atoi(rep) != reps || online != reps) {
                    snprintf(why, len, "primary %d: %s of %d replicas connected, %d online",
                             v[k].port, rep, reps, online);
                    return 0;
                }
            }
        }
    }
    return 1;
}

/* The primary's port as sentinel sport names it, or 0. */
static int sentinel_primary(int sport)
{
    char reply[256];
    if (scli(sport, reply, sizeof reply, "SENTINEL get-master-addr-by-name %s", primary_name) != 0)
        return 0;
    char *nl = strchr(reply, '\n');
    return nl ? atoi(nl + 1) : 0;
}

/* How many entries of a SENTINEL replicas/sentinels reply have exactly
 * the flags want (nothing down or disconnected). */
static int sentinel_flags(const char *reply, const char *want)
{
    int n = 0;
    for (const char *p = reply; (p = strstr(p, "flags\n")); p += 6) {
        const char *v = p + 6;
        size_t w = strcspn(v, "\r\n");
        n += (p == reply || p[-1] == '\n') && w == strlen(want) && strncmp(v, want, w) == 0;
    }
    return n;
}

/*
 * Is the Sentinel set whole: every sentinel names the same primary, knows
 * the other sentinels and the other data nodes with nothing down; that
 * primary says role:master with every other data node connected and
 * online, and each of those says it replicates from it with its link up.
 * *primary: its port.
 */
static int sentinel_whole(int *primary, char *why, size_t len)
{
    static char reply[16384];
    int ndata = 0, nsent = 0, p = 0;
    char val[64];
    why[0] = '\0';
    for (int i = 0; i < ninst; i++)
        inst_sentinel[i] ? nsent++ : ndata++;
    for (int i = 0; i < ninst; i++) {
        if (!inst_sentinel[i])
            continue;
        int q = sentinel_primary(inst_port[i]);
        if (!q) {
            snprintf(why, len, "%s names no primary", inst[i]);
            return 0;
        }
        if (p && q != p) {
            snprintf(why, len, "the sentinels name %d and %d", p, q);
            return 0;
        }
        p = q;
        if (scli(inst_port[i], reply, sizeof reply, "SENTINEL replicas %s", primary_name) != 0 ||
            sentinel_flags(reply, "slave") != ndata - 1) {
            snprintf(why, len, "%s sees %d of %d replicas up", inst[i], sentinel_flags(reply, "slave"),
                     ndata - 1);
            return 0;
        }
        if (scli(inst_port[i], reply, sizeof reply, "SENTINEL sentinels %s", primary_name) != 0 ||
            sentinel_flags(reply, "sentinel") != nsent - 1) {
            snprintf(why, len, "%s sees %d of %d other sentinels up", inst[i],
                     sentinel_flags(reply, "sentinel"), nsent - 1);
            return 0;
        }
    }
    if (primary)
        *primary = p;
    if (dcli(p, reply, sizeof reply, "INFO replication") != 0 ||
        info_field(reply, "role", val, sizeof val) != 0 || strcmp(val, "master") != 0) {
        snprintf(why, len, "the primary %d says role:%s", p, val);
        return 0;
    }
    info_field(reply, "connected_slaves", val, sizeof val);
    int online = 0;
    for (const char *s = reply; (s = strstr(s, "state=online")); s++)
        online++;
    if (atoi(val) != ndata - 1 || online != ndata - 1) {
        snprintf(why, len, "the primary %d: %s replicas connected, %d online", p, val, online);
        return 0;
    }
    for (int i = 0; i < ninst; i++) {
        char mp[16], link[16];
        if (inst_sentinel[i] || inst_port[i] == p)
            continue;
        if (dcli(inst_port[i], reply, sizeof reply, "INFO replication") != 0 ||
            info_field(reply, "master_port", mp, sizeof mp) != 0 || atoi(mp) != p ||
            info_field(reply, "master_link_status", link, sizeof link) != 0 ||
            strcmp(link, "up") != 0) {
            snprintf(why, len, "%s does not replicate from %d with its link up", inst[i], p);
            return 0;
        }
    }
    return 1;
}

/* Waits up to ms until the Redis set is whole (a no-op for other stores);
 * says how long it took, or what is still wrong. */
static int set_whole(unsigned ms, const char *when)
{
    char why[512] = "";
    uint64_t t0 = dlock_monotonic_ns(), end = t0 + ms * MS;
    if (!cluster && !sentinel)
        return 1;
    for (;;) {
        if (cluster ? cluster_whole(why, sizeof why) : sentinel_whole(NULL, why, sizeof why)) {
            diag("the %s is whole %s (%.0f ms)", cluster ? "cluster" : "sentinel set", when,
                 ms_of(t0, dlock_monotonic_ns()));
            return 1;
        }
        if (dlock_monotonic_ns() >= end)
            break;
        sleep_ms(200);
    }
    diag("the %s is not whole %s after %u ms: %s", cluster ? "cluster" : "sentinel set", when, ms,
         why);
    return 0;
}

/* The store instance at port (in the set), or NULL. */
static const char *inst_at(int port)
{
    for (int i = 0; i < ninst; i++)
        if (inst_port[i] == port)
            return inst[i];
    return NULL;
}

/* ---- the processes of a case ---------------------------------------------- */

static uint32_t ttl_ms(void)
{
    /* MySQL's wait_timeout and etcd's leases count whole seconds (etcd's
     * least is 2 s with the stores' 1 s election timeout). */
    return is("mysql") || is("etcd") ? 2000 : 1500;
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
    holder_leave(me); /* told: it stops using the resource */
}

/* DLOCK_TEST_LOSS_MARGIN_MS as the suite was started with: set again in
 * the holders only (a late keeper), not in the waiters or the probes. */
static char holder_margin[32];

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
 * group of its own, so that the group can be stopped. It is inside the
 * overlap check (W->holder_in) from its grant until it is told of a loss
 * (on_lost) or releases; it writes its token to the fenced resource at its
 * grant and once more when told to release, before it leaves (EV_WRITE:
 * rc 0 taken, 1 refused): the write of a holder that may be late.
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
    if (holder_margin[0])
        setenv("DLOCK_TEST_LOSS_MARGIN_MS", holder_margin, 1);
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    uint64_t t0 = dlock_monotonic_ns();
    int rc = dlock_client_open(u, &c);
    if (rc == 0) {
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 10000, ttl);
        o.mode = holder_mode;
        o.keep = keep;
        o.on_lost = keep ? holder_lost : NULL;
        rc = dlock_acquire(c, name, &o, &l);
    }
    if (rc) {
        log_ev(EV_ERR, rc, t0, 0, dlock_errmsg(c));
        _exit(1);
    }
    __atomic_store_n(&W->holder_in, who + 1, __ATOMIC_SEQ_CST);
    fenced_write(dlock_lock_token(l));
    log_ev(EV_GRANT, 0, t0, dlock_lock_token(l), "");
    while (!W->release[who])
        sleep_ms(5);
    t0 = dlock_monotonic_ns();
    log_ev(EV_WRITE, fenced_write(dlock_lock_token(l)) ? 0 : 1, t0, dlock_lock_token(l), "");
    holder_leave(who);
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
/* In a child just forked as process who: its setup, then a client of its
 * own on u (EV_READY logged); the child exits if it cannot open one. */
static dlock_client *child_client(int who, const char *u)
{
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
    return c;
}

static pid_t spawn_waiter(int who, const char *u, const char *name, uint64_t deadline,
                          unsigned work_ms)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    dlock_client *c = child_client(who, u);
    uint64_t t0;
    int rc;
    for (;;) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 0, ttl_ms() * 4);
        o.deadline_ns = deadline;
        t0 = dlock_monotonic_ns();
        const char *brk = getenv("DLOCK_FAULTS_BREAK_OVERLAP");
        if (who == 2 && brk) {
            /* Negative control of the overlap check: this waiter skips the
             * lock and enters once another waiter is inside (=holder: at
             * once, beside the holder). */
            volatile int *other = strcmp(brk, "holder") == 0 ? &W->holder_in : &W->inside;
            while (!__atomic_load_n(other, __ATOMIC_SEQ_CST) && dlock_monotonic_ns() < deadline)
                sleep_ms(1);
            enter_section(who);
            log_ev(EV_GRANT, 0, t0, 0, "");
            sleep_ms(work_ms);
            __atomic_compare_exchange_n(&W->inside, &who, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            log_ev(EV_REL, 0, dlock_monotonic_ns(), 0, "");
            break;
        }
        rc = dlock_acquire(c, name, &o, &l);
        if (rc == 0) {
            enter_section(who);
            fenced_write(dlock_lock_token(l));
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
    int loss_expected = W->loss_expected;
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
    /* An overlap is a double grant unless the case's documented outcome is
     * a loss (loss_expected: a store restarted without persistence, a
     * session killed server-side, a node paused or cut off past the lease;
     * for the holder also holder_loss_expected: the holder paused past its
     * lease), the first of the two was told at its release that it had lost
     * the lock meanwhile (DLOCK_ELOST), and the later one's token is higher:
     * a fenced resource refuses the earlier holder. The holder, which writes
     * again before it leaves, must also have seen that late write refused by
     * the fenced resource. In every other case it fails. Where the holder
     * could be told in time (a cut, a failover), check_holder asserts it
     * was told before any waiter was granted. */
    int double_grants = 0, explained = 0, explained_holder = 0;
    for (int k = 0; k < W->overlaps && k < 16; k++) {
        int a = W->pair[k][0], hold = is_holder(a);
        struct ev *ra = find_ev(a, EV_REL), *rb = find_ev(W->pair[k][1], EV_REL);
        struct ev *ga = find_ev(a, EV_GRANT), *gb = find_ev(W->pair[k][1], EV_GRANT);
        struct ev *wa = hold ? find_ev(a, EV_WRITE) : NULL;
        int lost_a = ra && ra->rc == DLOCK_ELOST;
        int fenced = ga && gb && gb->token > ga->token && (!hold || (wa && wa->rc == 1));
        int expected = loss_expected || (hold && W->holder_loss_expected);
        diag("overlap: waiter %d entered while %s %d was inside; their releases said %s and %s; "
             "tokens %llu and %llu%s%s",
             W->pair[k][1], hold ? "the holder" : "waiter", a, ra ? dlock_err_name(ra->rc) : "-",
             rb ? dlock_err_name(rb->rc) : "-", gb ? (unsigned long long)gb->token : 0ULL,
             ga ? (unsigned long long)ga->token : 0ULL,
             hold ? "; the holder's late write to the fenced resource was " : "",
             !hold ? "" : !wa ? "not made" : wa->rc ? "refused" : "TAKEN");
        if (!expected)
            diag("overlap in a case where no loss is expected: a double grant");
        else if (lost_a && !fenced)
            diag("overlap after a loss, but the later holder's token is not higher%s: a double "
                 "grant", hold ? " or the fenced resource took the holder's late write" : "");
        if (expected && lost_a && fenced)
            hold ? explained_holder++ : explained++;
        else
            double_grants++;
    }
    for (int i = 0; i < W->nev && i < MAXEV; i++)
        if (W->ev[i].kind == EV_REL && W->ev[i].who >= 1 && W->ev[i].who <= MAXW && W->ev[i].rc)
            diag("waiter %d: release %s: %s", W->ev[i].who, dlock_err_name(W->ev[i].rc),
                 W->ev[i].msg);
    if (explained + explained_holder)
        diag("%d overlap(s) with a waiter, %d with the holder, whose lock the store had dropped "
             "(its release said DLOCK_ELOST; tokens fenced): not a double grant",
             explained, explained_holder);
    is_int(double_grants, 0, "no two inside the lock at once, the holder included (%d overlaps, %d "
           "explained by a loss)", W->overlaps, explained + explained_holder);
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
 * How the holder of a case can be told of a loss (check_holder's tell):
 *   TELL_LATE   the store lets go at once and says nothing (a restart
 *               without persistence) or the holder cannot run (paused): on
 *               its next renewal, within the case's bound + SLACK_MS;
 *   TELL_BOUND  a server-side kill of its session: at its next renewal
 *               (docs/keeper.md), within the bound, no slack;
 *   TELL_FIRST  the store lets go only when the lease (the ZooKeeper
 *               session) ends: a cut, a silent node, a failover. The keeper
 *               reports the loss margin before the lease end: within the
 *               bound, no slack, and before any waiter is granted (both
 *               times are CLOCK_MONOTONIC on this machine: no slack either).
 */
enum { TELL_LATE, TELL_BOUND, TELL_FIRST };

/*
 * The holder's side: must_lose 1 (the store let go: it must be told), 0
 * (the store kept the lock: it must not be), -1 (either, consistently).
 * Told: on_lost (when kept) within bound_ms of t_fault (see tell), renew
 * and release DLOCK_ELOST. Not told: release 0, and no waiter granted
 * before it.
 */
static void check_holder(int must_lose, int kept, uint64_t t_fault, uint64_t bound_ms, int tell)
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
            unsigned slack = tell == TELL_LATE ? SLACK_MS : 0;
            ok(lost && lost->t - t_fault <= (bound_ms + slack) * MS,
               "on_lost within %llu ms (+ %u ms slack) of the fault (%.0f ms)",
               (unsigned long long)bound_ms, slack, lost ? ms_of(t_fault, lost->t) : -1.0);
        }
        is_int(rel->rc, DLOCK_ELOST, "the holder's release says DLOCK_ELOST");
        ok(ren && (ren->rc == DLOCK_ELOST), "the holder's renew says DLOCK_ELOST (%s)",
           ren ? dlock_err_name(ren->rc) : "none");
        double gap = next && lost ? ms_of(lost->t, next->t) : 0.0;
        if (kept && tell == TELL_FIRST)
            ok(lost && (!next || lost->t <= next->t),
               "the holder is told (on_lost) before any waiter is granted (%s %.0f ms %s)",
               !lost ? "not told" : !next ? "no waiter granted" : "the first grant",
               gap >= 0 ? gap : -gap, gap >= 0 ? "after" : "BEFORE it");
        else if (next && lost)
            diag("the next holder was granted %.0f ms %s the old one was told (it could not be "
                 "told first here)", gap >= 0 ? gap : -gap, gap >= 0 ? "after" : "BEFORE");
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
static int setup_contention_ttl(pid_t *pids, const char *hu, const char *wu, const char *name,
                                int nw, uint64_t deadline, unsigned work_ms, int keep,
                                uint32_t holder_ttl)
{
    pids[0] = spawn_holder(0, hu, name, holder_ttl, keep);
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

static int setup_contention(pid_t *pids, const char *hu, const char *wu, const char *name, int nw,
                            uint64_t deadline, unsigned work_ms, int keep)
{
    return setup_contention_ttl(pids, hu, wu, name, nw, deadline, work_ms, keep, ttl_ms());
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
    /* Sentinel: the sentinels live on (as they do on hosts of their own);
     * the client must find the primary again through them. */
    data_insts(all, sizeof all);
    /* The token probe: grants of another name right up to the kill (the
     * last commit may not have reached the disk), then one after. The
     * client stays open across the restart. */
    char probe[128];
    name_of(probe, sizeof probe, "restart-probe");
    dlock_client *pc = open_ok(curi);
    /* etcd keeps its keys and leases on disk: a lock held with a lease
     * longer than the outage (not kept: nothing renews it meanwhile) is
     * still held after the restart. */
    dlock_lock *kept_lock = NULL;
    if (is("etcd")) {
        char kname[128];
        name_of(kname, sizeof kname, "restart-durable");
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 5000, 20000);
        is_int(dlock_acquire(pc, kname, &o, &kept_lock), 0,
               "a lock with a 20 s lease taken before the kill");
    }
    uint64_t before[5] = {0};
    for (int i = 0; i < 5; i++) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 5000, ttl_ms());
        if (dlock_acquire(pc, probe, &o, &l) == 0) {
            before[i] = dlock_lock_token(l);
            dlock_release(l);
        }
    }
    uint64_t t_fault = dlock_monotonic_ns(); /* times below count from here */
    for (int i = 0; i < ninst; i++)
        if (!inst_sentinel[i])
            kill_fast(inst[i]);
    is_int(store_ctl("%s", all), 0, "store killed (SIGKILL: %s)", all);
    uint64_t t_dead = dlock_monotonic_ns();
    sleep_ms(300);
    is_int(store_ctl("start %s", all), 0, "store started again");
    uint64_t t_back = dlock_monotonic_ns();
    diag("kill.sh took %.0f ms, the store was down for %.0f ms, start.sh took %.0f ms",
         ms_of(t_fault, t_dead), ms_of(t_dead, t_back), ms_of(t_dead + 300 * MS, t_back));
    if (kept_lock) { /* renewed at once: its 20 s must not depend on the rest of the case */
        uint64_t t0 = dlock_monotonic_ns();
        int rr = dlock_renew(kept_lock, 20000);
        is_int(rr, 0, "the lock taken before the kill survived the restart: renew 0 (%.0f ms)%s%s",
               ms_of(t0, dlock_monotonic_ns()), rr ? ": " : "", rr ? dlock_errmsg(pc) : "");
        int rl = dlock_release(kept_lock);
        is_int(rl, 0, "and is released%s%s", rl ? ": " : "", rl ? dlock_errmsg(pc) : "");
        kept_lock = NULL;
    }
    /* A store that kept its sessions (ZooKeeper persists them) or its
     * leases (etcd: on becoming leader again it gives every lease its whole
     * TTL) may let the holder keep its lock, unless the outage outlasted
     * the holder's own lease; every other store has forgotten it. */
    int must_lose = is("zookeeper") || is("etcd") ? -1 : 1;
    W->loss_expected = must_lose == 1; /* restarted without persistence */
    uint64_t bound = lease_ms() + ms_of(t_fault, t_back);
    wait_ev(0, EV_LOST, (unsigned)bound + SLACK_MS);
    sleep_ms(200);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    int killed = reap_all(pids, NW + 1, deadline + 3000 * MS);
    is_int(killed, 0, "every process ended by itself (no hang)");
    /* Without persistence the store lets go at the kill, and the holder can
     * only be told later; a store that keeps its sessions or leases lets go
     * no earlier than the lease end, which the keeper reports before. */
    check_holder(must_lose, 1, t_fault, bound, must_lose == 1 ? TELL_LATE : TELL_FIRST);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("first grant after the fault: %.0f ms after the kill, %.0f ms after the store was back",
             ms_of(t_fault, next->t), ms_of(t_back, next->t));
    check_world(NW, 1, deadline, t_fault);
    {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 10000, ttl_ms());
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
 * cut longer than its timeout; etcd, which cannot kill a client's
 * connections: the holder's lease expired the same way). */
static void case_conn_kill(void)
{
    enum { NW = 3 };
    char name[128], puri[DLOCK_URI_MAX];
    pid_t pids[NW + 1] = {0};
    struct proxy px;
    int zk = is("zookeeper"), cut = zk || is("etcd"), have_proxy = 0;
    const char *hu = curi;
    name_of(name, sizeof name, "conn-kill");
    if (cut) {
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
    if (cut) {
        /* A silent network (nothing closed): the keeper must report the
         * loss margin before the lease (the session) ends with its
         * keep-alive or ping hanging; a reset one would fail at once and
         * the next one, past the lease end, learn the lease had ended. */
        t_fault = dlock_monotonic_ns();
        proxy_set(&px, PROXY_BLACKHOLE);
        sleep_ms(lease_ms() + 1500); /* the servers expire the session or lease */
        proxy_set(&px, PROXY_DOWN); /* what was held back is dropped, not sent late */
        proxy_set(&px, PROXY_PASS);
        diag("the holder's connection%s silent for %.0f ms (%s %u ms)",
             nhosts > 1 ? "s were" : " was", ms_of(t_fault, dlock_monotonic_ns()),
             zk ? "session timeout" : "lease", lease_ms());
        must_lose = 1;
    } else {
        int total = 0;
        t_fault = dlock_monotonic_ns();
        for (int h = 0; h < ninst; h++) {
            char ports[2048];
            int n = client_ports(pids, NW + 1, inst_port[h], ports, sizeof ports);
            total += n;
            if (n)
                store_ctl("conns %s%s", inst[h], ports);
        }
        ok(total >= NW + 1, "killed %d client connections from the server side", total);
        /* Redis keeps the lock's key: only connections died. A SQL
         * session is the lock: killed, it is gone. */
        must_lose = is_redis() ? 0 : 1;
    }
    W->loss_expected = must_lose == 1; /* sessions killed server-side, or cut past the lease */
    /* docs/keeper.md: a cut is reported the loss margin before the lease
     * end, and the last renewal was sent before the cut: within the lease
     * of it, before any waiter can be granted. A session killed on the
     * server: at the next renewal (a keep interval and one call). */
    uint64_t bound = cut ? lease_ms() : keep_interval_ms() + 1000;
    diag("the bound on the holder's report: %llu ms (%s)", (unsigned long long)bound,
         cut ? "the lease: due the loss margin before its end" : "a keep interval + one call");
    if (must_lose) /* told by then, or not at all */
        wait_ev(0, EV_LOST, (unsigned)bound + SLACK_MS);
    else /* a lease of renewals after the fault */
        sleep_ms(lease_ms());
    sleep_ms(200);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(must_lose, 1, t_fault, bound, cut ? TELL_FIRST : TELL_BOUND);
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
    int death = (caps & DLOCK_CAP_HOLDER_DEATH) != 0;
    /* Not kept: the lease then starts at the grant, which the bound needs.
     * Where the store sees the death (HOLDER_DEATH: within 1 s, see
     * docs/backends.md), the holder's lease is 20 s, far above that bound
     * and its slack: a lock freed only by its lease fails. */
    if (setup_contention_ttl(pids, curi, curi, name, NW, deadline, 50, 0,
                             death ? 20000 : ttl_ms()) != 0)
        goto out;
    struct ev *hg = find_ev(0, EV_GRANT);
    uint64_t t_fault = dlock_monotonic_ns();
    /* Stopped first (it still holds, and writes nothing more), then out of
     * the overlap check, then killed: a waiter granted before the stop
     * finds it inside; one granted after its death cannot. */
    int st;
    kill(pids[0], SIGSTOP);
    waitpid(pids[0], &st, WUNTRACED);
    holder_leave(0);
    kill_proc(pids[0]);
    pids[0] = 0;
    /* Freed within 1 s where the store sees the death; at the lease end
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
             after_kill, after_grant, death ? 20000 : ttl_ms(),
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
    /* A holder paused past its lease cannot leave: a waiter is granted
     * while it is still inside, as docs/keeper.md says ("only the fencing
     * token protects the resource then"): its late write must be refused. */
    W->holder_loss_expected = 1;
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
    check_holder(1, 1, t_fault, pause_ms + bound, TELL_LATE);
    check_world(NW, 1, deadline, t_fault);
out:
    if (pids[0] > 0)
        kill(-pids[0], SIGCONT);
    reap_all(pids, NW + 1, 0);
}

/* The first line `script args` prints (script: kill.sh, etcd-node.sh in
 * scripts/stores): "" when none. */
static void script_line(const char *script, const char *args, char *out, size_t len)
{
    char cmd[PATH_MAX + 256];
    out[0] = '\0';
    snprintf(cmd, sizeof cmd, "bash '%s/%s' --dir '%s' %s 2>/dev/null", DLOCK_STORES_SCRIPTS,
             script, stores_dir, args);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    if (fgets(out, (int)len, p))
        out[strcspn(out, "\r\n")] = '\0';
    pclose(p);
}

static void store_line(const char *args, char *out, size_t len)
{
    script_line("kill.sh", args, out, len);
}

/* The member that leads, e.g. "zk-2" or "etcd-3"; "" when none. ZooKeeper:
 * kill.sh leader (srvr); etcd: etcd-node.sh leader (endpoint status, the
 * highest term), which prints the member's number (kill.sh leader
 * etcd-cluster would kill it at once). */
static void store_leader(char *out, size_t len)
{
    if (!is("etcd")) {
        script_line("kill.sh", "leader", out, len);
        return;
    }
    char n[16];
    script_line("etcd-node.sh", "leader", n, sizeof n);
    out[0] = '\0';
    if (n[0] >= '1' && n[0] <= '9' && strlen(n) < 4)
        snprintf(out, len, "etcd-%s", n);
}

/* Polls until a member other than old leads (at most ms); when it was
 * found (0: none), its name in out. */
static uint64_t new_leader(const char *old, char *out, size_t len, unsigned ms)
{
    for (uint64_t end = dlock_monotonic_ns() + ms * MS; dlock_monotonic_ns() < end; sleep_ms(100)) {
        store_leader(out, len);
        if (out[0] && strcmp(out, old) != 0)
            return dlock_monotonic_ns();
    }
    out[0] = '\0';
    return 0;
}

/*
 * A probe (who PROBE): a client opened now, before the fault; once W->go
 * is set it acquires name (a name nobody else uses) until it gets it or
 * deadline, on the same client, logging EV_PROBE at the grant (its own
 * kind: its token is not in the case's order) and EV_ERR at each failure.
 * What it measures: how soon after the fault the store grants again.
 */
enum { PROBE = MAXW + 1 };
static pid_t spawn_probe(const char *u, const char *name, uint64_t deadline)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    dlock_client *c = child_client(PROBE, u);
    while (!W->go)
        sleep_ms(1);
    for (;;) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 0, ttl_ms());
        o.deadline_ns = deadline;
        uint64_t t0 = dlock_monotonic_ns();
        int rc = dlock_acquire(c, name, &o, &l);
        if (rc == 0) {
            log_ev(EV_PROBE, 0, t0, dlock_lock_token(l), "");
            dlock_release(l);
            break;
        }
        log_ev(EV_ERR, rc, t0, 0, dlock_errmsg(c));
        if (dlock_monotonic_ns() >= deadline)
            break;
        sleep_ms(20);
    }
    dlock_client_close(c);
    _exit(0);
}

/* What the probe saw, counted from t_fault. */
static void probe_report(const char *what, uint64_t t_fault)
{
    struct ev *g = find_ev(PROBE, EV_PROBE);
    int nerr = 0;
    struct ev *first = NULL;
    for (int i = 0; i < W->nev && i < MAXEV; i++)
        if (W->ev[i].kind == EV_ERR && W->ev[i].who == PROBE && !nerr++)
            first = &W->ev[i];
    if (first)
        diag("%s: probe: %d failed acquire%s before its grant, the first %s after %.0f ms: %s", what,
             nerr, nerr > 1 ? "s" : "", dlock_err_name(first->rc), ms_of(first->t0, first->t),
             first->msg);
    ok(g != NULL, "%s: a new client call is granted after the fault (%.0f ms after it)", what,
       g ? ms_of(t_fault, g->t) : -1.0);
}

/* etcd: a holder's lease longer than an election (1–2 s with the stores'
 * 1 s election timeout) plus a keep interval, so that a holder whose
 * keep-alives move to another member keeps its lock: what the cluster
 * cases assert. */
#define ETCD_HOLDER_TTL_MS 5000u

/* e. The ensemble's (ZooKeeper) or cluster's (etcd) leader killed while a
 * lock is held and waited on. */
static void case_leader_kill(void)
{
    enum { NW = 3 };
    char name[128], pname[128], leader[32], after[32];
    pid_t pids[NW + 2] = {0};
    name_of(name, sizeof name, "leader-kill");
    name_of(pname, sizeof pname, "leader-kill-probe");
    store_leader(leader, sizeof leader);
    if (!ok(leader[0], "the %s has a leader (%s)", ensemble ? "ensemble" : "cluster",
            leader[0] ? leader : "none"))
        return;
    uint64_t deadline = dlock_monotonic_ns() + 40000 * MS;
    uint32_t httl = is("etcd") ? ETCD_HOLDER_TTL_MS : ttl_ms();
    if (setup_contention_ttl(pids, curi, curi, name, NW, deadline, 100, 1, httl) != 0)
        goto out;
    pids[NW + 1] = spawn_probe(curi, pname, deadline);
    if (!wait_ev(PROBE, EV_READY, 15000)) {
        ok(0, "the probe opens its client");
        goto out;
    }
    is_int(store_ctl("%s", leader), 0, "the leader %s killed (SIGKILL)", leader);
    uint64_t t_fault = dlock_monotonic_ns();
    W->go = 1;
    uint64_t t_elected = new_leader(leader, after, sizeof after, 30000);
    ok(t_elected, "a new leader (%s) within 30 s: %.0f ms after the kill", after,
       t_elected ? ms_of(t_fault, t_elected) : -1.0);
    /* etcd: past the holder's own lease after the kill, so that keeping
     * its lock took keep-alives on another member. */
    if (is("etcd")) {
        uint64_t until = t_fault + (httl + 500) * MS, now = dlock_monotonic_ns();
        if (until > now)
            sleep_ms((unsigned)((until - now) / MS));
    } else {
        sleep_ms(1000);
    }
    W->release[0] = 1;
    wait_ev(0, EV_REL, 20000);
    is_int(reap_all(pids, NW + 2, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    /* etcd's new leader gives every lease its whole TTL again and the
     * holder renews through the survivors: it must keep its lock. A
     * ZooKeeper session may or may not outlive the election. */
    check_holder(is("etcd") ? 0 : -1, 1, t_fault, is("etcd") ? httl : ZK_SESSION_MS, TELL_FIRST);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("leader-kill: first waiter grant %.0f ms after the kill", ms_of(t_fault, next->t));
    probe_report("leader-kill", t_fault);
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 2, 0);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(store_ctl("start %s", leader), 0, "%s started again", leader);
    diag("%s back in %.0f ms", leader, ms_of(t0, dlock_monotonic_ns()));
}

/*
 * etcd cluster: the member the clients talk to first (the URI's first
 * host) SIGKILLed, or SIGSTOPped (silent: its connections stay open and
 * nothing answers), while a kept lock is held and waited on; brought back
 * once every waiter has held. The clients must move to the other members:
 * the holder keeps its lock, the waiters are granted while the member is
 * still down, on their clients.
 */
static void member_fault(int pause)
{
    enum { NW = 3 };
    char name[128], pname[128], leader[32], after[32];
    const char *what = pause ? "member-pause" : "member-kill";
    const char *target = inst[0];
    pid_t pids[NW + 2] = {0};
    name_of(name, sizeof name, what);
    name_of(pname, sizeof pname, pause ? "member-pause-probe" : "member-kill-probe");
    store_leader(leader, sizeof leader);
    int was_leader = strcmp(leader, target) == 0;
    diag("%s: %s (the URI's first host) is %s; the leader is %s", what, target,
         was_leader ? "the leader" : "a follower", leader[0] ? leader : "unknown");
    uint64_t deadline = dlock_monotonic_ns() + 40000 * MS;
    if (setup_contention_ttl(pids, curi, curi, name, NW, deadline, 100, 1, ETCD_HOLDER_TTL_MS) != 0)
        goto out;
    pids[NW + 1] = spawn_probe(curi, pname, deadline);
    if (!wait_ev(PROBE, EV_READY, 15000)) {
        ok(0, "the probe opens its client");
        goto out;
    }
    is_int(store_ctl("%s%s", pause ? "pause " : "", target), 0, "%s %s", target,
           pause ? "stopped (SIGSTOP)" : "killed (SIGKILL)");
    uint64_t t_fault = dlock_monotonic_ns();
    W->go = 1;
    if (was_leader) {
        uint64_t t = new_leader(target, after, sizeof after, 30000);
        ok(t, "a new leader (%s) within 30 s: %.0f ms after the fault", after,
           t ? ms_of(t_fault, t) : -1.0);
    }
    /* Past the holder's lease: it kept the lock only through the others. */
    sleep_ms(ETCD_HOLDER_TTL_MS + 500);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 20000);
    /* Every waiter served while the member is still down. */
    for (uint64_t end = dlock_monotonic_ns() + 15000 * MS; dlock_monotonic_ns() < end; sleep_ms(20)) {
        int rel = 0;
        for (int i = 1; i <= NW; i++)
            rel += find_ev(i, EV_REL) != NULL;
        if (rel == NW)
            break;
    }
    int served = 0;
    for (int i = 1; i <= NW; i++)
        served += find_ev(i, EV_REL) != NULL;
    is_int(served, NW, "every waiter held and released while %s was still down", target);
    uint64_t t_back0 = dlock_monotonic_ns();
    if (pause)
        is_int(store_ctl("resume %s", target), 0, "%s resumed", target);
    else
        is_int(store_ctl("start %s", target), 0, "%s started again", target);
    diag("%s: %s down for %.0f ms, back in %.0f ms", what, target, ms_of(t_fault, t_back0),
         ms_of(t_back0, dlock_monotonic_ns()));
    is_int(reap_all(pids, NW + 2, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(0, 1, t_fault, ETCD_HOLDER_TTL_MS, TELL_FIRST);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("%s: first waiter grant %.0f ms after the fault", what, ms_of(t_fault, next->t));
    probe_report(what, t_fault);
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 2, 0);
    store_ctl("resume %s 2>/dev/null", target);
}

static void case_member_kill(void)
{
    member_fault(0);
}

static void case_member_pause(void)
{
    member_fault(1);
}

/* etcdctl (v3) against the URI's members, as its user (ETCDCTL_ENDPOINTS
 * and ETCDCTL_USER, set by main: no password in a process list); its
 * stdout's first line into out. Returns its exit status (-1: not run). */
static int etcdctl(char *out, size_t len, const char *fmt, ...)
{
    char args[512], cmd[1024], line[4096] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd,
             "ETCDCTL_API=3 timeout 15 etcdctl --dial-timeout=2s --command-timeout=5s %s 2>&1", args);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    if (!fgets(line, sizeof line, p))
        line[0] = '\0';
    while (fgetc(p) != EOF) {
    }
    int st = pclose(p);
    line[strcspn(line, "\r\n")] = '\0';
    if (out)
        snprintf(out, len, "%s", line);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The store's current revision (a read's header), or 0. */
static long long etcd_revision(void)
{
    char out[1024];
    if (etcdctl(out, sizeof out, "get dlock-faults-no-such-key -w json") != 0)
        return 0;
    const char *r = strstr(out, "\"revision\":");
    return r ? atoll(r + 11) : 0;
}

/*
 * etcd: the store's history compacted while waiters watch the key before
 * theirs. Their watches started at revisions now compacted: a watch that
 * runs on is not cancelled, one started again from such a revision would
 * be (and must then be started from a new read). On the cluster the
 * member the clients talk to is then killed, so every watch ends and is
 * started again after the compaction. The holder then releases: the
 * waiters are granted in queue order (tokens increase), none overlaps,
 * none had to give up its place.
 */
static void case_compaction(void)
{
    enum { NW = 3 };
    char name[128], other[128], out[1024], leader[32] = "";
    pid_t pids[NW + 1] = {0};
    name_of(name, sizeof name, "compaction");
    name_of(other, sizeof other, "compaction-other");
    uint64_t deadline = dlock_monotonic_ns() + 40000 * MS;
    uint32_t httl = etcd_cluster ? ETCD_HOLDER_TTL_MS : ttl_ms();
    if (etcd_cluster)
        store_leader(leader, sizeof leader);
    if (setup_contention_ttl(pids, curi, curi, name, NW, deadline, 100, 1, httl) != 0)
        goto out;
    long long from = etcd_revision();
    /* Writes after the waiters' reads, so that the compaction passes the
     * revisions their watches started from. */
    dlock_client *c = open_ok(curi);
    for (int i = 0; i < 5; i++) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 5000, ttl_ms());
        if (dlock_acquire(c, other, &o, &l) == 0)
            dlock_release(l);
    }
    dlock_client_close(c);
    long long rev = etcd_revision();
    ok(from > 0 && rev > from, "the store's revision moved on while they wait (%lld to %lld)", from,
       rev);
    uint64_t t_fault = dlock_monotonic_ns();
    int rc = etcdctl(out, sizeof out, "compact %lld", rev);
    is_int(rc, 0, "history compacted at revision %lld in %.0f ms: %s", rev,
           ms_of(t_fault, dlock_monotonic_ns()), out);
    rc = etcdctl(out, sizeof out, "get dlock-faults-no-such-key --rev=%lld", from);
    ok(rc != 0 && strstr(out, "compacted"), "a read at revision %lld is refused: %s", from, out);
    int killed_leader = 0;
    if (etcd_cluster) {
        killed_leader = strcmp(leader, inst[0]) == 0;
        is_int(store_ctl("%s", inst[0]), 0, "%s (the members' first, where the watches run%s) "
               "killed: the watches start again", inst[0], killed_leader ? ", the leader" : "");
    }
    sleep_ms(1500);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 20000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(0, 1, t_fault, httl, TELL_FIRST);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("compaction: first waiter grant %.0f ms after the compaction", ms_of(t_fault, next->t));
    int nerr = 0;
    for (int i = 0; i < W->nev && i < MAXEV; i++)
        nerr += W->ev[i].kind == EV_ERR && W->ev[i].who >= 1 && W->ev[i].who <= NW;
    if (killed_leader)
        diag("compaction: %d waiter failure(s) (the member killed led: an election)", nerr);
    else
        is_int(nerr, 0, "no waiter failed: each kept its place in the queue");
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 1, 0);
    if (etcd_cluster)
        store_ctl("start %s", inst[0]);
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
    check_holder(0, 1, t_fault, ttl_ms(), TELL_FIRST);
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
    dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 2000, ttl_ms());
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
    o = mode_opts(DLOCK_WAIT_TRY, 0, ttl_ms());
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
    o = mode_opts(DLOCK_WAIT_DEADLINE, 10000, ttl_ms());
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

/* ---- Redis Cluster and Sentinel cases ----------------------------------------- */

/* The keys of the lock name are all in slot, on the node at port that
 * serves it, and the slot is the one CLUSTER KEYSLOT gives for the name. */
static void check_keys_in_slot(int port, int slot, const char *name)
{
    static char reply[65536];
    char ks[32], list[1024] = "";
    size_t o = 0;
    int n = 0;
    dcli(port, ks, sizeof ks, "CLUSTER KEYSLOT \"%s\"", name);
    is_int(atoi(ks), slot, "the suite's slot of %s is the server's (CLUSTER KEYSLOT %s)", name, ks);
    dcli(port, reply, sizeof reply, "CLUSTER GETKEYSINSLOT %d 1000", slot);
    for (char *k = strtok(reply, "\n"); k; k = strtok(NULL, "\n"))
        if (strstr(k, name)) {
            n++;
            if (o < sizeof list - 200)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? " " : "", k);
        }
    ok(n >= 1, "the lock's keys are in the slot of its name (%d): %s", slot, n ? list : "none there");
}

/* Waits up to ms until every node sees the node id serve slot. */
static int slot_served_by(const char *id, int slot, unsigned ms)
{
    struct cnode v[16];
    uint64_t end = dlock_monotonic_ns() + ms * MS;
    for (;;) {
        int all = 1;
        for (int i = 0; i < ninst && all; i++) {
            int n = cluster_view(inst_port[i], v, 16), o = n > 0 ? slot_owner(v, n, slot) : -1;
            all = o >= 0 && strcmp(v[o].id, id) == 0;
        }
        if (all)
            return 1;
        if (dlock_monotonic_ns() >= end)
            return 0;
        sleep_ms(50);
    }
}

/* CLUSTER FAILOVER on the replica rep, until every node sees it serve slot:
 * the ms that took, or -1. Tried again while the replica refuses or the
 * failover times out (a replica still syncing cannot take over). */
static double manual_failover(const struct cnode *rep, int slot, unsigned ms)
{
    char reply[4096], link[16];
    uint64_t t0 = dlock_monotonic_ns(), end = t0 + ms * MS;
    while (dlock_monotonic_ns() < end) {
        dcli(rep->port, reply, sizeof reply, "INFO replication");
        info_field(reply, "master_link_status", link, sizeof link);
        if (strcmp(link, "up") == 0) {
            dcli(rep->port, reply, sizeof reply, "CLUSTER FAILOVER");
            if (strcmp(reply, "OK") != 0)
                diag("CLUSTER FAILOVER on port %d: %s", rep->port, reply);
            else if (slot_served_by(rep->id, slot, 6000))
                return ms_of(t0, dlock_monotonic_ns());
        }
        sleep_ms(200);
    }
    return -1;
}

/* g. Redis Cluster: a manual failover of the primary serving the lock. */
static void case_cluster_failover(void)
{
    enum { NW = 3 };
    char name[128];
    pid_t pids[NW + 1] = {0};
    struct cnode v[16], old, rep;
    double took = -1;
    name_of(name, sizeof name, "cluster-failover");
    int slot = key_slot(name), n = cluster_any_view(v, 16), o = n > 0 ? slot_owner(v, n, slot) : -1;
    int r = -1;
    for (int i = 0; o >= 0 && i < n; i++)
        if (!v[i].primary && !v[i].failing && strcmp(v[i].of, v[o].id) == 0)
            r = i;
    if (!ok(o >= 0 && r >= 0, "slot %d of the lock: served by %s, replica %s", slot,
            o >= 0 ? inst_at(v[o].port) : "nobody", r >= 0 ? inst_at(v[r].port) : "none"))
        return;
    old = v[o];
    rep = v[r];
    uint64_t deadline = dlock_monotonic_ns() + 40000 * MS;
    if (setup_contention(pids, curi, curi, name, NW, deadline, 100, 1) != 0)
        goto out;
    check_keys_in_slot(old.port, slot, name);
    uint64_t t_fault = dlock_monotonic_ns();
    took = manual_failover(&rep, slot, 15000);
    ok(took >= 0, "CLUSTER FAILOVER: %s serves slot %d for every node %.0f ms later",
       inst_at(rep.port), slot, took);
    sleep_ms(lease_ms()); /* a lease of renewals on the new primary */
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    /* A manual failover loses no write and takes a fraction of the lease
     * (the old primary holds its clients only until the replica has caught
     * up): the lock is there on the new primary, and the holder's renewals,
     * sent on with MOVED, keep it. */
    check_holder(0, 1, t_fault, (uint64_t)(took > 0 ? took : 15000) + lease_ms(), TELL_FIRST);
    struct ev *next = first_waiter_grant(t_fault);
    if (next)
        diag("cluster-failover: first waiter grant %.0f ms after the failover began",
             ms_of(t_fault, next->t));
    W->loss_expected = 1; /* a replica promoted may lack the lock: docs/backends.md, Failover */
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 1, 0);
    /* Back to the layout before: the next case (or run) should not find a
     * pair that has just failed over, nor drift further each run. */
    if (took >= 0) {
        double back = manual_failover(&old, slot, 20000);
        ok(back >= 0, "failed back: %s serves slot %d again (%.0f ms)", inst_at(old.port), slot, back);
    }
}

/*
 * A looper (who 1..MAXW) on name number k: acquires it (waiting up to 3 s)
 * and releases it, again and again on one client, until W->stop; logs each
 * grant (with its token), failure and release. Inside, the overlap check
 * and counter of its name.
 */
static pid_t spawn_looper(int who, const char *u, int k, const char *name, unsigned work_ms)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    my_lock = k;
    dlock_client *c = child_client(who, u);
    uint64_t t0;
    int rc;
    while (!W->stop) {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_DEADLINE, 3000, ttl_ms());
        t0 = dlock_monotonic_ns();
        rc = dlock_acquire(c, name, &o, &l);
        if (rc) {
            log_ev(EV_ERR, rc, t0, 0, dlock_errmsg(c));
            sleep_ms(50);
            continue;
        }
        int was = __atomic_exchange_n(&W->inside_k[k], who, __ATOMIC_SEQ_CST), mine = who;
        if (was)
            note_overlap(was, who);
        log_ev(EV_GRANT, 0, t0, dlock_lock_token(l), "");
        int v = W->counter_k[k]; /* deliberately not atomic */
        sleep_ms(work_ms);
        W->counter_k[k] = v + 1;
        __atomic_compare_exchange_n(&W->inside_k[k], &mine, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        t0 = dlock_monotonic_ns();
        rc = dlock_release(l);
        log_ev(EV_REL, rc, t0, 0, rc ? dlock_errmsg(c) : "");
    }
    dlock_client_close(c);
    _exit(0);
}

/*
 * Moves slot from src to dst as an operator would (CLUSTER SETSLOT
 * IMPORTING on dst, MIGRATING on src, MIGRATE of its keys, SETSLOT NODE on
 * every primary), ten keys per MIGRATE as `redis-cli --cluster reshard`
 * does, with a pause of 250 ms after each batch and once every key has
 * moved, before the slot is handed over: locks are used while it is half
 * moved. A dlock call names four keys, some of which do not exist (a free
 * lock, an empty queue), and Redis runs a multi-key command during a
 * migration only where all of its keys are: src answers ASK or TRYAGAIN,
 * dst (after ASKING) TRYAGAIN, so calls wait out the move, retried by the
 * client every 10 ms; the pauses keep the move well within the calls'
 * 1 s bound, as a reshard of a slot with few keys is in practice (ms).
 * Returns 0, or -1 (said why); *moved: keys moved.
 */
/* The start of a move: slot IMPORTING on dst, MIGRATING on src. */
static int move_slot_begin(int slot, const struct cnode *src, const struct cnode *dst)
{
    char reply[1024];
    dcli(dst->port, reply, sizeof reply, "CLUSTER SETSLOT %d IMPORTING %s", slot, src->id);
    if (strcmp(reply, "OK") != 0) {
        diag("SETSLOT %d IMPORTING on %d: %s", slot, dst->port, reply);
        return -1;
    }
    dcli(src->port, reply, sizeof reply, "CLUSTER SETSLOT %d MIGRATING %s", slot, dst->id);
    if (strcmp(reply, "OK") != 0) {
        diag("SETSLOT %d MIGRATING on %d: %s", slot, src->port, reply);
        return -1;
    }
    return 0;
}

/* The rest of a move begun: the keys, then the slot's new owner. */
static int move_slot_finish(int slot, const struct cnode *src, const struct cnode *dst,
                            const struct cnode *v, int n, int *moved)
{
    static char keys[65536];
    char reply[1024];
    *moved = 0;
    uint64_t end = dlock_monotonic_ns() + 20000 * MS;
    int errors = 0;
    for (;;) {
        static char quoted[65536 + 4096];
        if (dcli(src->port, keys, sizeof keys, "CLUSTER GETKEYSINSLOT %d 10", slot) != 0) {
            diag("CLUSTER GETKEYSINSLOT on %d: no answer", src->port);
            return -1;
        }
        if (!keys[0])
            break; /* and none comes back: src creates no key in a slot it migrates */
        if (strchr(keys, '"') || strchr(keys, '\\') || strchr(keys, ' ')) {
            diag("a key the suite cannot quote: %s", keys);
            return -1;
        }
        /* One line per key: each quoted, on one line. */
        size_t q = 0;
        int batch = 0;
        for (char *k = strtok(keys, "\r\n"); k; k = strtok(NULL, "\r\n"), batch++)
            q += (size_t)snprintf(quoted + q, sizeof quoted - q, "%s\"%s\"", q ? " " : "", k);
        /* The password goes on redis-cli's stdin, never in its arguments. */
        dcli(src->port, reply, sizeof reply, "MIGRATE 127.0.0.1 %d \"\" 0 5000 AUTH \"%s\" KEYS %s",
             dst->port, data_pw, quoted);
        if (strcmp(reply, "OK") == 0)
            *moved += batch;
        else if (strcmp(reply, "NOKEY") != 0 && ++errors > 5) {
            diag("MIGRATE of %s from %d to %d: %s", keys, src->port, dst->port, reply);
            return -1;
        }
        if (dlock_monotonic_ns() >= end) {
            diag("slot %d still has keys on %d after 20 s", slot, src->port);
            return -1;
        }
        sleep_ms(250);
    }
    /* The new owner first, then the old one, then the others (as the
     * Redis manual's order has it: no node points back at the old owner). */
    const struct cnode *order[16];
    int no = 0;
    order[no++] = dst;
    order[no++] = src;
    for (int i = 0; i < n && no < 16; i++)
        if (v[i].primary && v[i].nr && v[i].port != src->port && v[i].port != dst->port)
            order[no++] = &v[i];
    for (int i = 0; i < no; i++) {
        dcli(order[i]->port, reply, sizeof reply, "CLUSTER SETSLOT %d NODE %s", slot, dst->id);
        if (strcmp(reply, "OK") != 0) {
            diag("SETSLOT %d NODE on %d: %s", slot, order[i]->port, reply);
            return -1;
        }
    }
    return 0;
}

static int move_slot(int slot, const struct cnode *src, const struct cnode *dst,
                     const struct cnode *v, int n, int *moved)
{
    *moved = 0;
    return move_slot_begin(slot, src, dst) ? -1 : move_slot_finish(slot, src, dst, v, n, moved);
}

/* After a move that failed half way: no node left migrating or importing. */
static void slot_stable(int slot, const struct cnode *v, int n)
{
    char reply[256];
    for (int i = 0; i < n; i++)
        if (v[i].primary)
            dcli(v[i].port, reply, sizeof reply, "CLUSTER SETSLOT %d STABLE", slot);
}

/* Grants of looper who within [from, to). */
static int grants_of(int who, uint64_t from, uint64_t to)
{
    int n = 0;
    for (int i = 0; i < W->nev && i < MAXEV; i++)
        n += W->ev[i].kind == EV_GRANT && W->ev[i].who == who && W->ev[i].t >= from &&
             W->ev[i].t < to;
    return n;
}

static int keys_in(int port, int slot)
{
    char reply[64];
    if (dcli(port, reply, sizeof reply, "CLUSTER COUNTKEYSINSLOT %d", slot) != 0)
        return -1;
    return reply[0] >= '0' && reply[0] <= '9' ? atoi(reply) : -1;
}

/* h. Redis Cluster: the slot of three names moved away and back while
 * six processes take and hand off those locks in a loop. */
static void case_slot_migrate(void)
{
    enum { NN = 3, PER = 2, NW = NN * PER, WORK_MS = 20 };
    char names[NN][128];
    pid_t pids[NW + 1] = {0};
    struct cnode v[16], src, dst;
    int moved1 = 0, moved2 = 0, rc1 = -1, rc2 = -1;
    name_of(names[0], sizeof names[0], "slot-migrate-0");
    int slot = key_slot(names[0]);
    for (int k = 1, i = 1; k < NN; i++) {
        char t[128];
        snprintf(t, sizeof t, "%sslot-migrate-%d", prefix, i);
        if (key_slot(t) == slot)
            snprintf(names[k++], sizeof names[0], "%s", t);
    }
    int n = cluster_any_view(v, 16), o = n > 0 ? slot_owner(v, n, slot) : -1, d = -1;
    for (int i = 0; o >= 0 && i < n; i++)
        if (i != o && v[i].primary && v[i].nr && !v[i].failing && d < 0)
            d = i;
    if (!ok(o >= 0 && d >= 0, "slot %d (names %s, %s, %s): served by %s, to move to %s", slot,
            names[0], names[1], names[2], o >= 0 ? inst_at(v[o].port) : "nobody",
            d >= 0 ? inst_at(v[d].port) : "no other primary"))
        return;
    src = v[o];
    dst = v[d];
    for (int k = 0; k < NN; k++)
        for (int j = 0; j < PER; j++) {
            int who = 1 + k * PER + j;
            pids[who] = spawn_looper(who, curi, k, names[k], WORK_MS);
        }
    if (!waiters_ready(NW, 15000)) {
        ok(0, "%d processes open their clients within 15 s", NW);
        goto out;
    }
    sleep_ms(1000);
    check_keys_in_slot(src.port, slot, names[0]);
    uint64_t t1 = dlock_monotonic_ns();
    rc1 = move_slot(slot, &src, &dst, v, n, &moved1);
    uint64_t t1e = dlock_monotonic_ns();
    ok(rc1 == 0, "slot %d moved from %s to %s (%d keys, one at a time) in %.0f ms", slot,
       inst_at(src.port), inst_at(dst.port), moved1, ms_of(t1, t1e));
    if (rc1 != 0)
        goto out;
    ok(keys_in(src.port, slot) == 0 && keys_in(dst.port, slot) > 0,
       "its keys are all on %s now (%d there, %d left on %s)", inst_at(dst.port),
       keys_in(dst.port, slot), keys_in(src.port, slot), inst_at(src.port));
    sleep_ms(1500);
    uint64_t t2 = dlock_monotonic_ns();
    rc2 = move_slot(slot, &dst, &src, v, n, &moved2);
    uint64_t t2e = dlock_monotonic_ns();
    ok(rc2 == 0, "and moved back to %s (%d keys) in %.0f ms", inst_at(src.port), moved2,
       ms_of(t2, t2e));
    if (rc2 != 0)
        goto out;
    sleep_ms(1500);
    W->stop = 1;
    uint64_t t_stop = dlock_monotonic_ns();
    is_int(reap_all(pids, NW + 1, t_stop + 8000 * MS), 0, "every process ended by itself (no hang)");

    ok(W->nev <= MAXEV, "every event was logged (%d of at most %d)", W->nev, MAXEV);
    is_int(W->overlaps, 0, "no two processes inside one lock at once");
    for (int i = 0; i < W->overlaps && i < 16; i++)
        diag("overlap: %d entered while %d was inside", W->pair[i][1], W->pair[i][0]);
    int grants[NN] = {0}, increasing[NN], bad_err = 0, late = 0, bad_rel = 0, nerr = 0;
    int during = 0, err_during = 0, rcs[8] = {0}, nrc[8] = {0}, ndistinct = 0;
    uint64_t last[NN] = {0};
    int seen[NN] = {0};
    for (int k = 0; k < NN; k++)
        increasing[k] = 1;
    /* Events are logged in the order they happened within a name (a grant
     * is logged inside the lock), so their order in the log is the grant
     * order once sorted by time: walk them by time. */
    struct ev **by_t = calloc(MAXEV, sizeof *by_t);
    int ne = 0;
    for (int i = 0; i < W->nev && i < MAXEV && by_t; i++)
        by_t[ne++] = &W->ev[i];
    if (by_t)
        qsort(by_t, (size_t)ne, sizeof by_t[0], cmp_grant_time);
    for (int i = 0; i < ne; i++) {
        struct ev *e = by_t[i];
        int half = (e->t >= t1 && e->t < t1e) || (e->t >= t2 && e->t < t2e);
        if (e->kind == EV_GRANT) {
            int k = e->lock;
            if (seen[k] && e->token <= last[k]) {
                if (increasing[k])
                    diag("%s: token %llu (process %d) after %llu", names[k],
                         (unsigned long long)e->token, e->who, (unsigned long long)last[k]);
                increasing[k] = 0;
            }
            last[k] = e->token;
            seen[k] = 1;
            grants[k]++;
            during += half;
        } else if (e->kind == EV_ERR) {
            nerr++;
            err_during += half;
            int j = 0;
            while (j < ndistinct && rcs[j] != e->rc)
                j++;
            if (j == ndistinct && ndistinct < 8)
                rcs[ndistinct++] = e->rc;
            if (j < 8)
                nrc[j]++;
            if (!clear_error(e->rc) || !e->msg[0]) {
                if (bad_err++ < 5)
                    diag("process %d: unclear error %s: '%s'", e->who, dlock_err_name(e->rc), e->msg);
            }
            if (ms_of(e->t0, e->t) > 3000 + 250 + SLACK_MS && late++ < 5)
                diag("process %d: a 3 s wait returned after %.0f ms", e->who, ms_of(e->t0, e->t));
        } else if (e->kind == EV_REL && e->rc) {
            if (bad_rel++ < 5)
                diag("process %d: release %s: %s", e->who, dlock_err_name(e->rc), e->msg);
        }
    }
    free(by_t);
    for (int j = 0; j < ndistinct; j++)
        diag("failed acquires: %d x %s", nrc[j], dlock_err_name(rcs[j]));
    for (int i = 0, shown = 0; i < W->nev && i < MAXEV && shown < 3; i++)
        if (W->ev[i].kind == EV_ERR) {
            shown++;
            diag("failed acquire: process %d, %+.0f ms from the first move: %s: %s", W->ev[i].who,
                 ms_of(t1, W->ev[i].t), dlock_err_name(W->ev[i].rc), W->ev[i].msg);
        }
    diag("slot-migrate: %d grants (%d, %d, %d per name), %d while the slot was half moved; %d "
         "failed acquires (%d then)",
         grants[0] + grants[1] + grants[2], grants[0], grants[1], grants[2], during, nerr,
         err_during);
    for (int k = 0; k < NN; k++) {
        ok(increasing[k], "%s: tokens strictly increase in grant order (%d grants)", names[k],
           grants[k]);
        ok(W->counter_k[k] == grants[k], "%s: the shared counter counts every grant (%d of %d)",
           names[k], W->counter_k[k], grants[k]);
    }
    is_int(bad_err, 0, "every failed acquire is a clear error with detail");
    is_int(late, 0, "no acquire returned more than %u ms past its 3 s deadline", 250 + SLACK_MS);
    is_int(bad_rel, 0, "every release succeeded");
    int idle1 = 0, idle2 = 0;
    for (int w = 1; w <= NW; w++) {
        int a = grants_of(w, t1e, t2), b = grants_of(w, t2e, t_stop + 1);
        idle1 += a == 0;
        idle2 += b == 0;
        if (!a || !b)
            diag("process %d: %d grants on %s after the move, %d after the move back", w, a,
                 inst_at(dst.port), b);
    }
    is_int(idle1, 0, "every process got its lock again after the move, on the client it opened before");
    is_int(idle2, 0, "and again after the move back");
out:
    W->stop = 1;
    reap_all(pids, NW + 1, dlock_monotonic_ns() + 8000 * MS);
    if (o >= 0 && d >= 0 && (rc1 != 0 || rc2 != 0))
        slot_stable(slot, v, n);
}

/* Deletes the keys matching pattern on the data node at port (a script
 * may touch keys of several slots of its own node with this flag). */
static void keys_drop(int port, const char *pattern)
{
    char reply[64];
    dcli(port, reply, sizeof reply,
         "EVAL \"#!lua flags=allow-cross-slot-keys\\nlocal k = redis.call('KEYS', ARGV[1]) "
         "for i = 1, #k do redis.call('DEL', k[i]) end return #k\" 0 \"%s\"",
         pattern);
}

/* A move that failed half way: every node stable, and the slot back on
 * its owner before the move (the node it went to told first) unless keys
 * of it are left there (they would be lost): then it stays there, stable. */
static void slot_home(int slot, const struct cnode *home, const struct cnode *away,
                      const struct cnode *v, int n)
{
    char reply[256];
    slot_stable(slot, v, n);
    int left = keys_in(away->port, slot);
    if (left != 0) {
        diag("slot %d: %d keys on %s, so it stays there", slot, left, inst_at(away->port));
        return;
    }
    dcli(away->port, reply, sizeof reply, "CLUSTER SETSLOT %d NODE %s", slot, home->id);
    for (int i = 0; i < n; i++)
        if (v[i].primary && v[i].port != away->port)
            dcli(v[i].port, reply, sizeof reply, "CLUSTER SETSLOT %d NODE %s", slot, home->id);
}

/* How many keys matching pattern the data node at port holds (-1: no
 * answer). */
static int keys_matching(int port, const char *pattern)
{
    char reply[64];
    if (dcli(port, reply, sizeof reply, "EVAL \"return #redis.call('KEYS', ARGV[1])\" 0 \"%s\"",
             pattern) != 0)
        return -1;
    return reply[0] >= '0' && reply[0] <= '9' ? atoi(reply) : -1;
}

/* How many slots a primary serves, in a view. */
static int slots_of(const struct cnode *c)
{
    int k = 0;
    for (int r = 0; r < c->nr; r++)
        k += c->hi[r] - c->lo[r] + 1;
    return k;
}

/* i. Redis Cluster: the store-wide floor (dlock migrate's raise_floor)
 * raised while a slot is half moved. The floor is a key per slot, raised
 * by calls pipelined to the slots' owners; the half-moved slot's call is
 * answered ASK (its key is not on the old owner), so it is made again
 * alone on the importing node. Every slot must end with its floor, and a
 * grant in the moved slot (and in others) comes above it. */
static void case_floor_migrate(void)
{
    struct cnode v[16], src, dst;
    char name[128], ns[48], pattern[64];
    static char own[DLOCK_URI_MAX];
    int moved = 0, begun = 0;
    dlock_client *c = NULL;
    name_of(name, sizeof name, "floor-migrate");
    int slot = key_slot(name); /* no braces in it: its own slot */
    int n = cluster_any_view(v, 16), o = n > 0 ? slot_owner(v, n, slot) : -1, d = -1;
    for (int i = 0; o >= 0 && i < n; i++)
        if (i != o && v[i].primary && v[i].nr && !v[i].failing && d < 0)
            d = i;
    if (!ok(o >= 0 && d >= 0, "slot %d (name %s): served by %s, to move to %s", slot, name,
            o >= 0 ? inst_at(v[o].port) : "nobody", d >= 0 ? inst_at(v[d].port) : "no other primary"))
        return;
    src = v[o];
    dst = v[d];
    /* A namespace of its own, never used before (a pid may come again):
     * no floor key of it exists yet anywhere. Dropped at the end. */
    snprintf(ns, sizeof ns, "floormig%d-%llx", (int)getpid(),
             (unsigned long long)(dlock_monotonic_ns() & 0xffffffffffull));
    snprintf(pattern, sizeof pattern, "%s:{*}floor", ns);
    if (!ok(uri_namespace(curi, ns, own, sizeof own) == 0, "the URI in namespace %s", ns))
        return;
    c = open_ok(own);
    uint64_t top = 0;
    is_int(dlock_client_token_top(c, &top), 0, "token top: %s", dlock_errmsg(c));
    /* Far above any clock-derived token: a slot without its floor shows. */
    uint64_t floor = top + 1000000000000ull;
    begun = 1; /* from here on, a failure puts the slot back */
    if (!ok(move_slot_begin(slot, &src, &dst) == 0, "slot %d half moved: MIGRATING on %s, "
            "IMPORTING on %s", slot, inst_at(src.port), inst_at(dst.port)))
        goto out;
    uint64_t t0 = dlock_monotonic_ns();
    int rc = dlock_client_raise_floor(c, floor);
    is_int(rc, 0, "raise the floor to %llu while the slot is half moved (%.0f ms): %s",
           (unsigned long long)floor, ms_of(t0, dlock_monotonic_ns()), rc ? dlock_errmsg(c) : "ok");
    /* Each slot's floor on its owner; the half-moved one's on the
     * importing node (after ASK). */
    int ks = keys_matching(src.port, pattern), kd = keys_matching(dst.port, pattern);
    ok(ks == slots_of(&src) - 1 && kd == slots_of(&dst) + 1,
       "floors: %d on %s (serving %d slots, one of them half moved), %d on %s (serving %d)", ks,
       inst_at(src.port), slots_of(&src), kd, inst_at(dst.port), slots_of(&dst));
    int fin = move_slot_finish(slot, &src, &dst, v, n, &moved);
    ok(fin == 0, "the move finished (%d keys moved)", moved);
    if (fin != 0)
        goto out;
    int total = 0, answered = 1;
    for (int i = 0; i < n; i++)
        if (v[i].primary && v[i].nr) {
            int k = keys_matching(v[i].port, pattern);
            answered &= k >= 0;
            total += k > 0 ? k : 0;
        }
    ok(answered && total == 16384, "a floor key for every slot on the primaries: %d of 16384",
       total);
    uint64_t t = grant_token(c, name);
    ok(t > floor, "a grant in the moved slot comes above the floor (%llu > %llu)",
       (unsigned long long)t, (unsigned long long)floor);
    int above = 0;
    for (int i = 0; i < 32; i++) {
        char other[160];
        snprintf(other, sizeof other, "%s-%d", name, i);
        above += grant_token(c, other) > floor;
    }
    is_int(above, 32, "grants on 32 other names (other slots) all come above it");
    /* Back where it was, for the cases after this one. */
    if (ok(move_slot(slot, &dst, &src, v, n, &moved) == 0, "slot %d moved back to %s (%d keys)",
           slot, inst_at(src.port), moved))
        begun = 0;
out:
    if (begun)
        slot_home(slot, &src, &dst, v, n);
    snprintf(pattern, sizeof pattern, "%s:*", ns); /* floors and counters */
    for (int i = 0; i < n; i++)
        if (v[i].primary && v[i].nr)
            keys_drop(v[i].port, pattern);
    dlock_client_close(c);
}

/* i. Redis Sentinel: the primary SIGKILLed, the sentinels fail over. */
/* Promoted: every live sentinel names a node other than old, which says
 * it is a primary, within 30 s of from. When (0: not in time), and *now_p
 * its port. */
static uint64_t await_promotion(int old, uint64_t from, int *now_p)
{
    for (uint64_t end = from + 30000 * MS; dlock_monotonic_ns() < end; sleep_ms(100)) {
        int q = 0, agree = 1;
        for (int i = 0; i < ninst && agree; i++) {
            if (!inst_sentinel[i])
                continue;
            int x = sentinel_primary(inst_port[i]);
            agree = x && x != old && (!q || x == q);
            q = x;
        }
        char role[64];
        if (agree && q && dcli(q, role, sizeof role, "ROLE") == 0 && strncmp(role, "master", 6) == 0) {
            *now_p = q;
            return dlock_monotonic_ns();
        }
    }
    return 0;
}

static void case_primary_kill(void)
{
    enum { NW = 3 };
    char name[128], wuri[DLOCK_URI_MAX], victim[32] = "", why[512];
    pid_t pids[NW + 1] = {0};
    int old = 0, now_p = 0;
    name_of(name, sizeof name, "primary-kill");
    /* A grant is reported once a replica has it: what makes a failover
     * keep the lock (without it a promoted replica may lack the last
     * grants, and two holders may overlap: docs/redis.md). */
    if (uri_rewrite(curi, NULL, 0, NULL, "wait_replicas=1", wuri, sizeof wuri) != 0) {
        ok(0, "cannot add wait_replicas=1 to the URI");
        return;
    }
    store_line("primary redis-sentinel", victim, sizeof victim);
    for (int i = 0; i < ninst; i++)
        if (strcmp(inst[i], victim) == 0)
            old = inst_port[i];
    if (!ok(old && sentinel_whole(NULL, why, sizeof why),
            "the sentinels name %s (port %d) primary, with its replicas online%s%s",
            victim[0] ? victim : "none", old, why[0] ? ": " : "", why))
        return;
    uint64_t deadline = dlock_monotonic_ns() + 45000 * MS;
    if (setup_contention(pids, wuri, wuri, name, NW, deadline, 100, 1) != 0)
        goto out;
    uint64_t t_fault = dlock_monotonic_ns();
    kill_fast(victim);
    is_int(store_ctl("%s", victim), 0, "the primary %s killed (SIGKILL)", victim);
    uint64_t t_new = await_promotion(old, t_fault, &now_p);
    ok(t_new, "the sentinels promoted %s %.0f ms after the kill", now_p ? inst_at(now_p) : "nobody",
       t_new ? ms_of(t_fault, t_new) : -1.0);
    sleep_ms(1000);
    W->release[0] = 1;
    wait_ev(0, EV_REL, 20000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    /* The holder kept its lock (renewed on the new primary in time) or was
     * told; never both a waiter and it inside. */
    uint64_t failover_ms = t_new ? (uint64_t)ms_of(t_fault, t_new) : 30000;
    check_holder(-1, 1, t_fault, failover_ms + lease_ms(), TELL_FIRST);
    struct ev *next = first_waiter_grant(t_fault);
    ok(next && next->t - t_fault <= (15000 + SLACK_MS) * MS,
       "a waiter holds %.0f ms after the kill, on the client it opened before (bound 15 s + %u ms)",
       next ? ms_of(t_fault, next->t) : -1.0, SLACK_MS);
    W->loss_expected = 1; /* a replica promoted may lack the lock: docs/backends.md, Failover */
    check_world(NW, 1, deadline, t_fault);
out:
    reap_all(pids, NW + 1, 0);
    if (victim[0]) {
        uint64_t t0 = dlock_monotonic_ns();
        is_int(store_ctl("start %s", victim), 0, "%s started again", victim);
        int whole = set_whole(30000, "with the old primary back as a replica");
        ok(whole, "the set is whole again %.0f ms after the start", ms_of(t0, dlock_monotonic_ns()));
    }
}

/* A try of name on c: its token, or 0 with *rc set. */
static uint64_t try_token(dlock_client *c, const char *name, int *rc, dlock_lock **l)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_TRY;
    o.ttl_ms = 10000;
    o.limit = run_limit;
    *l = NULL;
    *rc = dlock_acquire(c, name, &o, l);
    return *rc ? 0 : dlock_lock_token(*l);
}

/*
 * m. Redis Sentinel: a partition. The primary is cut off from the
 * sentinels and its replicas, but not from one client: its default user
 * (the one the sentinels, the replicas and the other clients log in as)
 * loses every command but ACL and CLIENT KILL and its connections are
 * killed; an ACL user of the case's own, which that client logs in as,
 * keeps everything. The
 * sentinels promote a replica and cannot make the old primary its replica.
 * Then, as docs/backends.md says:
 *   - a client of the majority (the Sentinel URI) is granted the lock on
 *     the new primary, and one on the cut-off side is granted it too, on
 *     the old one (two holders: asserted, so that the docs stay true);
 *   - the later grant has the higher token (both come from the clock);
 *   - with wait_replicas=1 a grant on the cut-off side is refused.
 * Then the old primary's default user gets its commands back, and the
 * sentinels make it a replica of the new one.
 */
static void case_primary_cut(void)
{
    char name[128], fresh[128], reply[512], why[512], side_uri[DLOCK_URI_MAX],
        sidew_uri[DLOCK_URI_MAX];
    int old = 0, now_p = 0, cut = 0, rc1 = 0, rc2 = 0, rc3 = 0;
    dlock_client *major = NULL, *side = NULL, *sidew = NULL;
    dlock_lock *l1 = NULL, *l2 = NULL, *l3 = NULL;
    name_of(name, sizeof name, "primary-cut");
    name_of(fresh, sizeof fresh, "primary-cut-wait");
    int whole = sentinel_whole(&old, why, sizeof why);
    if (!ok(whole, "the sentinels name %s primary%s%s", old ? inst_at(old) : "none",
            why[0] ? ": " : "", why))
        return;
    dcli(old, reply, sizeof reply, "ACL SETUSER dlock-cut on >%s ~* &* +@all", data_pw);
    if (!ok(strcmp(reply, "OK") == 0, "an ACL user of the case's own on %s: %s", inst_at(old),
            reply))
        return;
    snprintf(side_uri, sizeof side_uri,
             "redis://dlock-cut:%s@127.0.0.1:%d/0?connect_timeout=1000&timeout=1000", data_pw, old);
    snprintf(sidew_uri, sizeof sidew_uri,
             "redis://dlock-cut:%s@127.0.0.1:%d/0?connect_timeout=1000&timeout=1000&wait_replicas=1",
             data_pw, old);
    major = open_ok(curi);
    side = open_ok(side_uri);
    sidew = open_ok(sidew_uri);

    uint64_t t_cut = dlock_monotonic_ns();
    cut = 1;
    dcli(old, reply, sizeof reply, "ACL SETUSER default -@all +acl +client|kill");
    ok(strcmp(reply, "OK") == 0, "cut: %s's default user keeps only ACL and CLIENT KILL: %s",
       inst_at(old), reply);
    /* Every link of the default user ends: the replicas', the sentinels',
     * and the majority client's (opened before the cut: in a partition
     * its connection to the old primary would go silent). */
    dcli(old, reply, sizeof reply, "CLIENT KILL USER default");
    diag("default user's connections killed on %s: %s", inst_at(old), reply);
    uint64_t t_new = await_promotion(old, t_cut, &now_p);
    if (!ok(t_new, "the sentinels promoted %s %.0f ms after the cut", now_p ? inst_at(now_p) : "nobody",
            t_new ? ms_of(t_cut, t_new) : -1.0))
        goto out;

    uint64_t t1 = try_token(major, name, &rc1, &l1);
    is_int(rc1, 0, "the majority's client (the Sentinel URI) is granted %s on %s (%s)", name,
           inst_at(now_p), rc1 ? dlock_errmsg(major) : "ok");
    uint64_t t2 = try_token(side, name, &rc2, &l2);
    is_int(rc2, 0, "the cut-off side's client is granted it too, on %s: two holders, as the docs "
           "say (%s)", inst_at(old), rc2 ? dlock_errmsg(side) : "ok");
    ok(!rc1 && !rc2 && t2 > t1, "the later grant has the higher token (%llu > %llu): a resource "
       "that checks them refuses the earlier holder", (unsigned long long)t2,
       (unsigned long long)t1);
    uint64_t t0 = dlock_monotonic_ns();
    try_token(sidew, fresh, &rc3, &l3);
    ok(rc3 == DLOCK_ESTORE && strstr(dlock_errmsg(sidew), "replicas"),
       "with wait_replicas=1 the cut-off side is refused, %.0f ms: %s: %s",
       ms_of(t0, dlock_monotonic_ns()), dlock_err_name(rc3), dlock_errmsg(sidew));
    if (l1)
        dlock_release(l1);
    if (l2)
        dlock_release(l2);
    if (l3)
        dlock_release(l3);
out:
    dlock_client_close(major);
    dlock_client_close(side);
    dlock_client_close(sidew);
    if (cut) {
        /* Healed: the sentinels make the old primary a replica. */
        dcli(old, reply, sizeof reply, "ACL SETUSER default +@all ~* &*");
        ok(strcmp(reply, "OK") == 0, "healed: %s's default user has every command again: %s",
           inst_at(old), reply);
        dcli(old, reply, sizeof reply, "ACL DELUSER dlock-cut");
        uint64_t h0 = dlock_monotonic_ns();
        whole = set_whole(30000, "with the old primary back as a replica");
        ok(whole, "the set is whole again %.0f ms after the heal", ms_of(h0, dlock_monotonic_ns()));
    }
}

/* The instance serving name now: the primary of its slot (Cluster), or the
 * one the sentinels name (Sentinel); "" when unknown. */
static void serving_node(const char *name, char *out, size_t len)
{
    struct cnode v[16];
    const char *at = NULL;
    out[0] = '\0';
    if (cluster) {
        int n = cluster_any_view(v, 16), o = n > 0 ? slot_owner(v, n, key_slot(name)) : -1;
        at = o >= 0 ? inst_at(v[o].port) : NULL;
    } else {
        for (int i = 0; i < ninst && !at; i++)
            if (inst_sentinel[i]) {
                int p = sentinel_primary(inst_port[i]);
                at = p ? inst_at(p) : NULL;
            }
    }
    snprintf(out, len, "%s", at ? at : "");
}

/*
 * j. Redis Cluster and Sentinel: the data node serving the lock stopped
 * (SIGSTOP: its connections go silent, nothing is closed) for a failover's
 * time, then resumed. What the conformance suite's proxy checks on other
 * stores, here where the client talks to nodes no proxy stands before:
 * calls return within their bound, the holder is told by its lease end
 * unless it renewed on the new primary in time; no overlap, even when the
 * stale primary wakes up with commands queued. Sentinel with
 * wait_replicas=1 (two replicas: one is left after the failover). A
 * cluster primary here has one replica, and once it is promoted none is
 * left to acknowledge, so wait_replicas=1 would refuse every grant (as it
 * must): the cluster runs without it, the holder's grant replicated long
 * before the stop (a waiter cannot be granted in between: the lock is
 * held).
 */
static void case_node_pause(void)
{
    enum { NW = 2 };
    char name[128], wuri[DLOCK_URI_MAX], victim[32];
    pid_t pids[NW + 1] = {0};
    dlock_client *pc = NULL;
    int paused = 0;
    name_of(name, sizeof name, "node-pause");
    if (uri_rewrite(curi, NULL, 0, NULL, cluster ? NULL : "wait_replicas=1", wuri, sizeof wuri) !=
        0) {
        ok(0, "cannot add wait_replicas=1 to the URI");
        return;
    }
    serving_node(name, victim, sizeof victim);
    if (!ok(victim[0], "the lock is served by %s", victim[0] ? victim : "no known node"))
        return;
    uint64_t deadline = dlock_monotonic_ns() + 40000 * MS;
    if (setup_contention(pids, wuri, wuri, name, NW, deadline, 100, 1) != 0)
        goto out;
    pc = open_ok(wuri);
    {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, ttl_ms());
        if (dlock_acquire(pc, name, &o, &l) == 0) /* held: a busy answer, and pc is connected */
            dlock_release(l);
    }
    is_int(store_ctl("pause %s", victim), 0, "%s stopped (SIGSTOP)", victim);
    paused = 1;
    uint64_t t_fault = dlock_monotonic_ns();
    {
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(DLOCK_WAIT_TRY, 0, ttl_ms());
        uint64_t t0 = dlock_monotonic_ns();
        int rc = dlock_acquire(pc, name, &o, &l);
        double took = ms_of(t0, dlock_monotonic_ns());
        diag("node-pause: a try on the silent node: %s after %.0f ms: %s", dlock_err_name(rc), took,
             dlock_errmsg(pc));
        ok(took <= 1000 + SLACK_MS, "a try while the node is silent returns in %.0f ms (timeout "
           "1000 ms + %u ms slack)", took, SLACK_MS);
        if (rc == 0)
            dlock_release(l);
    }
    /* Stopped until a waiter holds (the replica took over) and for at
     * least three leases, at most 15 s. */
    struct ev *next = NULL;
    uint64_t min_end = t_fault + 3ull * lease_ms() * MS, max_end = t_fault + 15000 * MS;
    while (dlock_monotonic_ns() < max_end &&
           (!(next = first_waiter_grant(t_fault)) || dlock_monotonic_ns() < min_end))
        sleep_ms(20);
    uint64_t t_resume = dlock_monotonic_ns();
    is_int(store_ctl("resume %s", victim), 0, "%s resumed after %.0f ms", victim,
           ms_of(t_fault, t_resume));
    paused = 0;
    /* The replica has taken over by then (node timeout or down-after
     * 1000 ms, then an election): a waiter must not need the stale node. */
    ok(next && next->t < t_resume && next->t - t_fault <= (10000 + SLACK_MS) * MS,
       "a waiter holds %.0f ms after the stop, while the old node is still stopped (bound 10 s + "
       "%u ms)", next ? ms_of(t_fault, next->t) : -1.0, SLACK_MS);
    sleep_ms(1000); /* the old primary wakes up with whatever was queued on it */
    W->release[0] = 1;
    wait_ev(0, EV_REL, 15000);
    is_int(reap_all(pids, NW + 1, deadline + 3000 * MS), 0, "every process ended by itself (no hang)");
    check_holder(-1, 1, t_fault, lease_ms(), TELL_FIRST);
    W->loss_expected = 1; /* a replica promoted may lack the lock: docs/backends.md, Failover */
    check_world(NW, 1, deadline, t_fault);
out:
    if (paused)
        store_ctl("resume %s", victim);
    reap_all(pids, NW + 1, 0);
    dlock_client_close(pc);
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
    if (cluster || sentinel) /* the next case starts from a whole set, whoever is primary */
        ok(set_whole(60000, "after the case"), "%s: the %s is whole again", fc->name,
           cluster ? "cluster" : "sentinel set");
}

static void usage(void)
{
    fprintf(stderr, "usage: faults (URI | --env VAR) [--case NAME] [--list]"
                    " [--mode exclusive|shared|permit]\n"
                    "cases: store-restart conn-kill holder-kill holder-pause leader-kill quorum\n"
                    "       cluster-failover slot-migrate floor-migrate primary-kill primary-cut node-pause\n"
                    "       member-kill member-pause compaction\n");
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
        else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
            const char *m = argv[++i];
            if (strcmp(m, "permit") == 0)
                run_limit = 1;
            else if (strcmp(m, "shared") == 0)
                holder_mode = DLOCK_MODE_SHARED;
            else if (strcmp(m, "exclusive") != 0)
                usage();
        }
        else if (argv[i][0] != '-' && !uri)
            uri = argv[i];
        else
            usage();
    }
    if (!uri)
        usage();
    /* A late keeper (the told-in-time check's negative control) in the
     * holders only: no other client of the run gets it. */
    const char *margin = getenv("DLOCK_TEST_LOSS_MARGIN_MS");
    if (margin) {
        snprintf(holder_margin, sizeof holder_margin, "%s", margin);
        unsetenv("DLOCK_TEST_LOSS_MARGIN_MS");
    }
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
        ninst = nhosts;
        cluster = strcmp(dlock_uri_scheme(u), "redis+cluster") == 0;
        sentinel = strcmp(dlock_uri_scheme(u), "redis+sentinel") == 0;
        if (cluster || sentinel) {
            /* The suite talks to the nodes itself (redis-cli), as the URI's
             * user would: with its passwords. */
            const char *pw = dlock_uri_password(u), *spw = dlock_uri_param(u, "sentinel_password");
            const char *path = dlock_uri_path(u);
            snprintf(data_pw, sizeof data_pw, "%s", pw ? pw : "");
            snprintf(sentinel_pw, sizeof sentinel_pw, "%s", spw ? spw : "");
            path += strspn(path, "/");
            snprintf(primary_name, sizeof primary_name, "%.*s", (int)strcspn(path, "/"), path);
        }
        if (strcmp(dlock_uri_scheme(u), "etcd") == 0) {
            /* For the etcdctl the suite runs (compaction): in its
             * environment, not in a process list. */
            char eps[512] = "", cred[256];
            size_t o = 0;
            for (int i = 0; i < nhosts && o < sizeof eps; i++)
                o += (size_t)snprintf(eps + o, sizeof eps - o, "%shttp://127.0.0.1:%d", i ? "," : "",
                                      inst_port[i]);
            setenv("ETCDCTL_ENDPOINTS", eps, 1);
            unsetenv("ETCDCTL_USER");
            unsetenv("ETCDCTL_PASSWORD");
            if (dlock_uri_user(u) && *dlock_uri_user(u)) {
                snprintf(cred, sizeof cred, "%s:%s", dlock_uri_user(u),
                         dlock_uri_password(u) ? dlock_uri_password(u) : "");
                setenv("ETCDCTL_USER", cred, 1);
            }
        }
        dlock_uri_free(u);
    }
    dlock_client *c = open_ok(uri);
    caps = dlock_client_caps(c);
    snprintf(backend, sizeof backend, "%s", dlock_client_backend(c));
    dlock_client_close(c);
    if (cluster || sentinel)
        snprintf(backend, sizeof backend, cluster ? "redis-cluster" : "redis-sentinel");
    else if (is("redis") && nhosts > 1)
        snprintf(backend, sizeof backend, "redlock");
    ensemble = is("zookeeper") && nhosts > 1;
    etcd_cluster = is("etcd") && nhosts > 1;
    const char *params = NULL;
    if (is_redis() || is("mysql") || is("etcd"))
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
    if (cluster || sentinel) {
        stores_dir = need_env("DLOCK_STORES_DIR");
        if (set_instances(cluster ? "rcluster-" : "rsentinel-") != 0)
            return 1;
    } else if (nhosts) {
        stores_dir = need_env("DLOCK_STORES_DIR");
        for (int i = 0; i < nhosts; i++)
            if (find_instance(inst_port[i], inst[i], sizeof inst[i]) != 0) {
                printf("Bail out! no store instance with port %d under DLOCK_STORES_DIR=%s\n",
                       inst_port[i], stores_dir);
                return 1;
            }
    }
    if (holder_margin[0])
        diag("the holders' keepers run with DLOCK_TEST_LOSS_MARGIN_MS=%s (a test hook)", holder_margin);
    if (ninst) {
        char all[512];
        all_insts(all, sizeof all);
        diag("instances: %s (under %s)", all, stores_dir);
    }

    static const char *const no_store = "the file backend has no store process: the kernel holds its locks";
    const struct fcase cases[] = {
        {"store-restart", "the store SIGKILLed and started again while one holds and others wait",
         case_store_restart, ninst ? NULL : no_store},
        {"conn-kill", "the clients' connections killed by the server (ZooKeeper, etcd: the holder's "
                      "connections cut past its session or lease)",
         case_conn_kill, ninst ? NULL : no_store},
        {"holder-kill", "the holder SIGKILLed: time until a waiter holds", case_holder_kill, NULL},
        {"holder-pause", "the holder's process group stopped past its lease, then resumed",
         case_holder_pause,
         ninst ? NULL : "a stopped holder keeps its kernel lock on the file backend: nothing is lost"},
        {"leader-kill", "the ensemble's or cluster's leader SIGKILLed while a lock is held and waited on",
         case_leader_kill,
         ensemble || etcd_cluster ? NULL
                                  : "only the ZooKeeper ensemble and the etcd cluster have a leader to kill"},
        {"quorum", "Redlock with 2 of 5 nodes down, then 3 of 5", case_quorum,
         is("redlock") ? NULL : "only Redlock has a quorum of independent nodes"},
        {"cluster-failover", "a manual failover of the cluster primary serving the lock, then back",
         case_cluster_failover, cluster ? NULL : "only Redis Cluster has slots and their primaries"},
        {"slot-migrate", "the locks' slot moved to another primary and back while they are used",
         case_slot_migrate, cluster ? NULL : "only Redis Cluster moves slots"},
        {"floor-migrate", "the store-wide floor raised while a slot is half moved",
         case_floor_migrate, cluster ? NULL : "only Redis Cluster moves slots"},
        {"primary-kill", "the Sentinel primary SIGKILLed: the sentinels fail over (wait_replicas=1)",
         case_primary_kill, sentinel ? NULL : "only Redis Sentinel fails a primary over by itself"},
        {"primary-cut", "the Sentinel primary cut off from the sentinels and replicas but not "
                        "from one client (a partition)",
         case_primary_cut, sentinel ? NULL : "only Redis Sentinel fails a primary over by itself"},
        {"node-pause", "the data node serving the lock stopped past a failover, then resumed",
         case_node_pause,
         cluster || sentinel ? NULL
                             : "the client talks to the URI's hosts: the conformance suite's proxy "
                               "cuts its network (network cut, silent store)"},
        {"member-kill", "the etcd member the clients talk to SIGKILLed, started again later",
         case_member_kill, etcd_cluster ? NULL : "only the etcd cluster has members to fail over to"},
        {"member-pause", "the etcd member the clients talk to SIGSTOPped (silent), resumed later",
         case_member_pause, etcd_cluster ? NULL : "only the etcd cluster has members to fail over to"},
        {"compaction", "etcd's history compacted while waiters watch (cluster: then their member "
                       "killed, so the watches start again)",
         case_compaction, is("etcd") ? NULL : "only etcd has a history to compact"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]), ran = 0;
    if (list) {
        for (int i = 0; i < n; i++)
            printf("%s\t%s\n", cases[i].name, cases[i].skip ? cases[i].skip : cases[i].what);
        return 0;
    }
    if (ninst && stores_restore() != 0) {
        printf("Bail out! the store's instances do not all run: start them with scripts/stores/start.sh\n");
        return 1;
    }
    if (!set_whole(60000, "before the first case")) {
        printf("Bail out! the Redis set is not whole: see scripts/stores/start.sh\n");
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
