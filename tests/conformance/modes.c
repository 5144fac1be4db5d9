/*
 * The conformance cases of shared locks and counting semaphores
 * (include/dlock.h, "Shared locks and semaphores"), on every store whose
 * row of the suite's table has DLOCK_CAP_SHARED or DLOCK_CAP_SEMAPHORE;
 * elsewhere they are skips that say so, and the request is refused with
 * DLOCK_ENOTSUP (checked here too).
 *
 * Holders are processes (fork). What they see inside is kept on a board in
 * shared memory under a process-shared mutex: how many readers, writers
 * and permit holders are inside, the most seen together, the order they
 * came in, and the tokens of the grants, so that exclusion, overlap,
 * arrival order and token order are all checked from what really
 * happened.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/conformance/conformance.h"

#define SHARED_CAP(c) (((c) & DLOCK_CAP_SHARED) != 0)
#define SEM_CAP(c) (((c) & DLOCK_CAP_SEMAPHORE) != 0)

struct board {
    pthread_mutex_t mu;
    int readers, writers, inside;   /* inside now */
    int max_readers, max_inside;    /* the most seen together */
    int bad_rw, bad_ww, bad_limit;  /* exclusion broken: reader with writer, two writers,
                                       more permits than the limit */
    int bad_token;                  /* a grant's token not above those it must be above */
    uint64_t top_token;             /* the largest token that has come in */
    uint64_t writer_token;          /* the last writer's */
    int limit;                      /* the semaphore's, 0: a read-write lock */
    int n;                          /* order[0..n): who came in, by tag */
    char order[64];
    int together;                   /* the most tagged holders inside at once */
    int tagged_inside;
    int go;                         /* a start barrier for the workers */
};

static struct board *board_new(int limit)
{
    struct board *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                           -1, 0);
    if (b == MAP_FAILED)
        abort();
    memset(b, 0, sizeof *b);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&b->mu, &a);
    pthread_mutexattr_destroy(&a);
    b->limit = limit;
    return b;
}

static void board_free(struct board *b)
{
    pthread_mutex_destroy(&b->mu);
    munmap(b, sizeof *b);
}

/* A holder comes in: counted, checked against the others inside, and its
 * token against the grants before it. `writer` is what it believes it
 * holds (the --break shared control asks the store for less). */
static void board_enter(struct board *b, int writer, uint64_t token, char tag)
{
    pthread_mutex_lock(&b->mu);
    if (writer) {
        b->writers++;
        if (b->readers)
            b->bad_rw++;
        if (b->writers > 1)
            b->bad_ww++;
        /* Everything granted before a writer has come in already (it was
         * released before the writer's grant): the writer's is above. */
        if (token <= b->top_token)
            b->bad_token++;
        b->writer_token = token;
    } else if (b->limit) {
        if (b->inside + 1 > b->limit)
            b->bad_limit++;
    } else {
        b->readers++;
        if (b->writers)
            b->bad_rw++;
        if (token <= b->writer_token)
            b->bad_token++;
        if (b->readers > b->max_readers)
            b->max_readers = b->readers;
    }
    b->inside++;
    if (b->inside > b->max_inside)
        b->max_inside = b->inside;
    if (token > b->top_token)
        b->top_token = token;
    if (tag) {
        if (b->n < (int)sizeof b->order - 1)
            b->order[b->n++] = tag;
        if (++b->tagged_inside > b->together)
            b->together = b->tagged_inside;
    }
    pthread_mutex_unlock(&b->mu);
}

static void board_leave(struct board *b, int writer, char tag)
{
    pthread_mutex_lock(&b->mu);
    if (writer)
        b->writers--;
    else if (!b->limit)
        b->readers--;
    b->inside--;
    if (tag)
        b->tagged_inside--;
    pthread_mutex_unlock(&b->mu);
}

static dlock_acquire_opts mode_opts(dlock_mode mode, uint32_t limit, dlock_wait wait,
                                    uint64_t wait_ms)
{
    dlock_acquire_opts o = wait == DLOCK_WAIT_TRY ? try_once() : wait_for(wait_ms);
    o.wait = wait;
    o.mode = mode;
    o.limit = limit;
    return o;
}

/*
 * A holder in a process of its own: connects, says so on `ready` (when
 * >= 0), acquires name in mode/limit (waiting up to 60 s), comes in on the
 * board with tag, and stays inside hold_ms, or, with control >= 0, until
 * that pipe is written to or closed. Exits 0 when all went well.
 */
struct worker {
    pid_t pid;
    int control; /* write end, -1 when none */
};

static struct worker worker_start(const char *name, dlock_mode mode, uint32_t limit, int writer,
                                  struct board *b, char tag, unsigned hold_ms, int controlled,
                                  int ready, uint32_t ttl_ms)
{
    struct worker w = {-1, -1};
    int cp[2] = {-1, -1};
    if (controlled && pipe(cp) < 0)
        abort();
    fflush(stdout);
    w.pid = fork();
    if (w.pid == 0) {
        dlock_client *c = client();
        dlock_lock *l = NULL;
        dlock_acquire_opts o = mode_opts(mode, limit, DLOCK_WAIT_DEADLINE, 60000);
        if (ttl_ms)
            o.ttl_ms = ttl_ms;
        if (cp[1] >= 0)
            close(cp[1]);
        if (ready >= 0 && write(ready, "r", 1) != 1)
            _exit(3);
        if (dlock_acquire(c, name, &o, &l) != 0)
            _exit(2);
        board_enter(b, writer, dlock_lock_token(l), tag);
        if (cp[0] >= 0) {
            char x;
            if (read(cp[0], &x, 1) < 0)
                _exit(4);
        } else {
            sleep_ms(hold_ms);
        }
        board_leave(b, writer, tag);
        int rc = dlock_release(l);
        dlock_client_close(c);
        _exit(rc == 0 ? 0 : 5);
    }
    if (cp[0] >= 0)
        close(cp[0]);
    w.control = cp[1];
    return w;
}

/* Waits for the worker; its exit status (0: clean). */
static int worker_end(struct worker *w)
{
    int st = 0;
    if (w->control >= 0) {
        if (write(w->control, "x", 1) != 1)
            diag("worker %d: the control pipe is closed", (int)w->pid);
        close(w->control);
        w->control = -1;
    }
    if (waitpid(w->pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Starts a controlled worker and waits until it holds (the board counts
 * it inside) or, queued, until the store counts `queued` waiters (where
 * it can; else 300 ms after the worker connected). */
static struct worker worker_queued(const char *name, dlock_mode mode, uint32_t limit, int writer,
                                   struct board *b, char tag, dlock_client *watcher,
                                   uint64_t queued)
{
    int ready[2];
    if (pipe(ready) < 0)
        abort();
    struct worker w = worker_start(name, mode, limit, writer, b, tag, 0, 1, ready[1], 0);
    char r;
    struct pollfd p = {.fd = ready[0], .events = POLLIN};
    if (poll(&p, 1, 20000) != 1 || read(ready[0], &r, 1) != 1)
        diag("worker %c did not connect within 20 s", tag);
    else if (waiters_reach(watcher, name, queued, 10000, &(dlock_info){0}) <= 0)
        sleep_ms(300);
    close(ready[0]);
    close(ready[1]);
    return w;
}

/* Until the board has seen n holders come in (at most ms). */
static int board_reaches(struct board *b, int n, unsigned ms)
{
    uint64_t until = dlock_monotonic_ns() + (uint64_t)ms * MS;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int got = b->n;
        pthread_mutex_unlock(&b->mu);
        if (got >= n)
            return 1;
        if (dlock_monotonic_ns() >= until)
            return 0;
        sleep_ms(5);
    }
}

/* A store without the mode refuses it with DLOCK_ENOTSUP. */
static void refused_without(void)
{
    dlock_client *c = client();
    dlock_lock *l = NULL;
    char name[128];
    name_of(name, sizeof name, "modes-refused");
    if (!SHARED_CAP(caps)) {
        dlock_acquire_opts o = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_TRY, 0);
        is_int(dlock_acquire(c, name, &o, &l), DLOCK_ENOTSUP,
               "no DLOCK_CAP_SHARED: a shared request is DLOCK_ENOTSUP (%s)", dlock_errmsg(c));
    }
    if (!SEM_CAP(caps)) {
        dlock_acquire_opts o = mode_opts(DLOCK_MODE_EXCLUSIVE, 3, DLOCK_WAIT_TRY, 0);
        is_int(dlock_acquire(c, name, &o, &l), DLOCK_ENOTSUP,
               "no DLOCK_CAP_SEMAPHORE: a semaphore is DLOCK_ENOTSUP (%s)", dlock_errmsg(c));
    }
    dlock_client_close(c);
}

/* Every holder of name as the store lists them: count, modes, tokens. */
static void holders_are(dlock_client *c, const char *name, dlock_lock **held, size_t n,
                        dlock_mode mode, uint32_t limit, const char *what)
{
    dlock_holder h[8];
    size_t count = 99;
    int rc = dlock_inspect_holders(c, name, h, 8, &count);
    is_int(rc, 0, "%s: dlock_inspect_holders%s%s", what, rc ? ": " : "", rc ? dlock_errmsg(c) : "");
    if (rc)
        return;
    ok(count == n, "%s: %zu holders listed (%zu)", what, n, count);
    int modes = 1, tokens = 1, owners = 1;
    for (size_t i = 0; i < count && i < n && i < 8; i++) {
        if ((h[i].known & DLOCK_KNOWS_MODE) && (h[i].mode != mode || h[i].limit != limit))
            modes = 0;
        /* On a list, the first store's own grant: at most the list's
         * token (a raised part reports its grant, not the raise). */
        uint64_t want = dlock_lock_token(held[i]);
        if ((h[i].known & DLOCK_KNOWS_TOKEN) &&
            ((composite ? h[i].token == 0 || h[i].token > want : h[i].token != want) ||
             (i && h[i].token <= h[i - 1].token)))
            tokens = 0;
        if ((h[i].known & DLOCK_KNOWS_OWNER) &&
            !strstr(h[i].owner, dlock_lock_owner(held[i])))
            owners = 0;
    }
    ok(count && (h[0].known & DLOCK_KNOWS_MODE), "%s: the store tells each holder's mode", what);
    ok(modes, "%s: each in mode %s, limit %u", what,
       mode == DLOCK_MODE_SHARED ? "shared" : "exclusive", limit);
    ok(tokens, "%s: their tokens, in grant order", what);
    ok(owners, "%s: their owners, where the store keeps them", what);
}

/* Now and at once (a wait that is refused does not wait). */
static void refused_at_once(dlock_client *c, const char *name, dlock_mode mode, uint32_t limit,
                            const char *what)
{
    dlock_lock *l = NULL;
    dlock_acquire_opts o = mode_opts(mode, limit, DLOCK_WAIT_TRY, 0);
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EMODE, "%s, tried: DLOCK_EMODE", what);
    ok(dlock_errmsg(c)[0] != '\0', "says why: %s", dlock_errmsg(c));
    o = mode_opts(mode, limit, DLOCK_WAIT_DEADLINE, 5000);
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, name, &o, &l), DLOCK_EMODE, "%s, waited for: DLOCK_EMODE", what);
    double el = (dlock_monotonic_ns() - t0) / 1e6;
    ok(el < 2000, "at once (%.0f ms of a 5 s wait)", el);
}

static void *fire_later(void *k)
{
    sleep_ms(200);
    dlock_cancel_fire(k);
    return NULL;
}

/* Readers hold together and exclude a writer; tokens; holders listed;
 * a refused kind; deadline and cancel for a shared waiter. */
static void shared_basics(void)
{
    char name[128];
    dlock_client *a = client(), *b = client(), *x = client();
    dlock_lock *l[3] = {NULL, NULL, NULL}, *w = NULL;
    name_of(name, sizeof name, "rw-basics");
    dlock_acquire_opts s = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_TRY, 0),
                       e = mode_opts(DLOCK_MODE_EXCLUSIVE, 0, DLOCK_WAIT_TRY, 0);
    is_int(dlock_acquire(a, name, &s, &l[0]), 0, "a shared lock");
    is_int(dlock_acquire(b, name, &s, &l[1]), 0, "a second client shares it");
    is_int(dlock_acquire(x, name, &e, &w), DLOCK_EBUSY, "an exclusive try: busy");
    is_int(dlock_acquire(x, name, &s, &l[2]), 0, "a third reader");
    if (l[0] && l[1] && l[2]) {
        ok(dlock_lock_token(l[0]) < dlock_lock_token(l[1]) &&
               dlock_lock_token(l[1]) < dlock_lock_token(l[2]),
           "readers' tokens increase in grant order (%llu, %llu, %llu)",
           (unsigned long long)dlock_lock_token(l[0]), (unsigned long long)dlock_lock_token(l[1]),
           (unsigned long long)dlock_lock_token(l[2]));
        holders_are(x, name, l, 3, DLOCK_MODE_SHARED, 0, "three readers");
        dlock_info info;
        if (dlock_inspect(x, name, &info) == 0 && (info.known & DLOCK_KNOWS_HELD))
            ok(info.held == 1, "dlock_inspect says held");
        if (SEM_CAP(caps)) {
            /* A client that holds nothing: a holder's own second acquire
             * is DLOCK_EALREADY before it reaches the store. */
            dlock_client *y = client();
            refused_at_once(y, name, DLOCK_MODE_EXCLUSIVE, 3,
                            "a semaphore on a name held as a read-write lock");
            dlock_client_close(y);
        }
        if (caps & DLOCK_CAP_RENEW)
            is_int(dlock_renew(l[1], 5000), 0, "a reader renews its own lease");
    }
    uint64_t top = 0;
    for (int i = 0; i < 3; i++)
        if (l[i]) {
            if (dlock_lock_token(l[i]) > top)
                top = dlock_lock_token(l[i]);
            is_int(dlock_release(l[i]), 0, "reader %d releases", i + 1);
        }
    is_int(dlock_acquire(x, name, &e, &w), 0, "then the writer");
    if (w) {
        ok(dlock_lock_token(w) > top, "its token (%llu) is above every reader's (%llu)",
           (unsigned long long)dlock_lock_token(w), (unsigned long long)top);
        is_int(dlock_acquire(a, name, &s, &l[0]), DLOCK_EBUSY, "a reader's try: busy");
        /* A shared waiter gives up at its deadline, or when cancelled,
         * and leaves nothing behind. */
        dlock_acquire_opts d = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_DEADLINE, 300);
        uint64_t t0 = dlock_monotonic_ns();
        is_int(dlock_acquire(a, name, &d, &l[0]), DLOCK_ETIMEDOUT, "a reader's wait: ETIMEDOUT");
        double el = (dlock_monotonic_ns() - t0) / 1e6;
        ok(el >= 290 && el < 2300, "at its 300 ms deadline (%.0f ms)", el);
        if (caps & DLOCK_CAP_CANCEL) {
            dlock_cancel *k = NULL;
            is_int(dlock_cancel_new(&k), 0, "a cancel flag");
            d = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_FOREVER, 0);
            d.cancel = k;
            pthread_t t;
            int started = pthread_create(&t, NULL, fire_later, k) == 0;
            t0 = dlock_monotonic_ns();
            is_int(dlock_acquire(a, name, &d, &l[0]), DLOCK_ECANCELED,
                   "a reader's endless wait, cancelled: DLOCK_ECANCELED");
            el = (dlock_monotonic_ns() - t0) / 1e6;
            ok(el < 2200, "soon after the cancel 200 ms in (%.0f ms)", el);
            if (started)
                pthread_join(t, NULL);
            dlock_cancel_free(k);
        }
        is_int(dlock_release(w), 0, "the writer releases");
        is_int(dlock_acquire(b, name, &s, &l[1]), 0,
               "a reader gets it at once: the waiters that gave up left nothing behind");
        if (l[1])
            dlock_release(l[1]);
    }
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(x);
}

/* Permits up to the limit, tokens, holders listed, refused kinds,
 * deadline for a permit's waiter. */
static void semaphore_basics(void)
{
    char name[128];
    dlock_client *c[4];
    dlock_lock *l[4] = {NULL, NULL, NULL, NULL};
    name_of(name, sizeof name, "sem-basics");
    dlock_acquire_opts p = mode_opts(DLOCK_MODE_EXCLUSIVE, 3, DLOCK_WAIT_TRY, 0);
    for (int i = 0; i < 4; i++)
        c[i] = client();
    for (int i = 0; i < 3; i++)
        is_int(dlock_acquire(c[i], name, &p, &l[i]), 0, "permit %d of 3", i + 1);
    is_int(dlock_acquire(c[3], name, &p, &l[3]), DLOCK_EBUSY, "a fourth: busy");
    if (l[0] && l[1] && l[2]) {
        ok(dlock_lock_token(l[0]) < dlock_lock_token(l[1]) &&
               dlock_lock_token(l[1]) < dlock_lock_token(l[2]),
           "permits' tokens increase in grant order");
        is_int((int)dlock_lock_limit(l[0]), 3, "dlock_lock_limit says 3");
        holders_are(c[3], name, l, 3, DLOCK_MODE_EXCLUSIVE, 3, "three permits");
        refused_at_once(c[3], name, DLOCK_MODE_EXCLUSIVE, 5, "limit 5 on a name held with limit 3");
        refused_at_once(c[3], name, DLOCK_MODE_EXCLUSIVE, 0,
                        "a read-write lock on a name held as a semaphore");
        if (SHARED_CAP(caps))
            refused_at_once(c[3], name, DLOCK_MODE_SHARED, 0,
                            "a shared lock on a name held as a semaphore");
        dlock_acquire_opts d = mode_opts(DLOCK_MODE_EXCLUSIVE, 3, DLOCK_WAIT_DEADLINE, 300);
        uint64_t t0 = dlock_monotonic_ns();
        is_int(dlock_acquire(c[3], name, &d, &l[3]), DLOCK_ETIMEDOUT, "a permit's wait: ETIMEDOUT");
        double el = (dlock_monotonic_ns() - t0) / 1e6;
        ok(el >= 290 && el < 2300, "at its 300 ms deadline (%.0f ms)", el);
        if (caps & DLOCK_CAP_RENEW)
            is_int(dlock_renew(l[2], 5000), 0, "a permit renews its own lease");
        uint64_t before = dlock_lock_token(l[2]);
        is_int(dlock_release(l[1]), 0, "one permit released");
        l[1] = NULL;
        is_int(dlock_acquire(c[3], name, &p, &l[3]), 0,
               "the fourth gets it (the timed-out waiter left nothing behind)");
        if (l[3])
            ok(dlock_lock_token(l[3]) > before, "with a token above the earlier permits'");
    }
    for (int i = 0; i < 4; i++) {
        if (l[i])
            is_int(dlock_release(l[i]), 0, "permit holder %d releases", i + 1);
        dlock_client_close(c[i]);
    }
}

/*
 * nproc processes take name iters times each, all starting together, and
 * stay inside a little while: a permit of a semaphore of b->limit, or
 * (limit 0) a reader, or one time in three after the first a writer (the
 * first round all read, so readers overlap). 1 when every grant and
 * release went well.
 */
static int contend(struct board *b, const char *name, int nproc, int iters)
{
    pid_t pid[16];
    int broken = breaking("shared");
    fflush(stdout);
    for (int p = 0; p < nproc; p++) {
        pid[p] = fork();
        if (pid[p] == 0) {
            dlock_client *c = client();
            unsigned seed = (unsigned)getpid();
            int fails = 0;
            __atomic_add_fetch(&b->go, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&b->go, __ATOMIC_SEQ_CST) < nproc)
                sleep_ms(1);
            for (int i = 0; i < iters; i++) {
                int writer = !b->limit && i > 0 && rand_r(&seed) % 3 == 0;
                dlock_lock *l = NULL;
                /* --break shared: the wrong client asks for a shared lock
                 * where it writes. */
                dlock_mode mode = b->limit || (writer && !broken) ? DLOCK_MODE_EXCLUSIVE
                                                                   : DLOCK_MODE_SHARED;
                /* --break limit: the wrong client asks for one permit more
                 * than the semaphore the board counts has. */
                uint32_t limit = (uint32_t)b->limit + (b->limit && breaking("limit"));
                dlock_acquire_opts o = mode_opts(mode, limit, DLOCK_WAIT_DEADLINE, 60000);
                if (dlock_acquire(c, name, &o, &l) != 0) {
                    fails++;
                    continue;
                }
                board_enter(b, writer, dlock_lock_token(l), 0);
                sleep_ms(writer ? 2 : 10);
                board_leave(b, writer, 0);
                if (dlock_release(l) != 0)
                    fails++;
            }
            dlock_client_close(c);
            _exit(fails ? 1 : 0);
        }
    }
    int clean = 1;
    for (int p = 0; p < nproc; p++) {
        int st;
        waitpid(pid[p], &st, 0);
        clean &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    return clean;
}

/* Readers and writers: a shared counter never sees a reader with a writer
 * nor two writers, readers overlap (more than one inside at once), and
 * tokens keep grant order across modes. */
static void rw_exclusion(int nproc, int iters)
{
    char name[128];
    struct board *b = board_new(0);
    name_of(name, sizeof name, "rw-exclusion");
    ok(contend(b, name, nproc, iters),
       "%d processes x %d shared and exclusive grants, all granted and released", nproc, iters);
    ok(b->bad_rw == 0 && b->bad_ww == 0,
       "a writer was always alone (%d times with a reader, %d with a writer)", b->bad_rw,
       b->bad_ww);
    ok(b->max_readers > 1, "readers held together (at most %d inside at once)", b->max_readers);
    ok(b->bad_token == 0, "tokens kept grant order across modes (%d out of order)", b->bad_token);
    board_free(b);
}

/* A semaphore of 3: never more than 3 inside, and 3 at once at some point. */
static void semaphore_exclusion(int nproc, int iters)
{
    enum { LIMIT = 3 };
    char name[128];
    struct board *b = board_new(LIMIT);
    name_of(name, sizeof name, "sem-exclusion");
    ok(contend(b, name, nproc, iters),
       "%d processes x %d permits of a semaphore of %d, all granted and released", nproc, iters,
       LIMIT);
    ok(b->bad_limit == 0, "never more than %d inside (%d times more)", LIMIT, b->bad_limit);
    ok(b->max_inside == LIMIT, "%d inside at once at some point (%d)", LIMIT, b->max_inside);
    board_free(b);
}

/*
 * Arrival order across modes: a reader holds; a writer W queues, then
 * readers r and s, then a writer X. The reader's release admits W alone
 * (r and s arrived after it: no writer starvation); W's release admits r
 * and s together; theirs admits X. The order on the board is W, r and s
 * (either way), X.
 */
static void rw_fifo(void)
{
    char name[128];
    struct board *b = board_new(0);
    dlock_client *watcher = client(), *c = client();
    dlock_lock *r0 = NULL;
    name_of(name, sizeof name, "rw-fifo");
    dlock_acquire_opts s = mode_opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_TRY, 0);
    is_int(dlock_acquire(c, name, &s, &r0), 0, "a reader holds");
    struct worker w = worker_queued(name, DLOCK_MODE_EXCLUSIVE, 0, 1, b, 'W', watcher, 1);
    struct worker r = worker_queued(name, DLOCK_MODE_SHARED, 0, 0, b, 'r', watcher, 2);
    struct worker t = worker_queued(name, DLOCK_MODE_SHARED, 0, 0, b, 's', watcher, 3);
    struct worker x = worker_queued(name, DLOCK_MODE_EXCLUSIVE, 0, 1, b, 'X', watcher, 4);
    pthread_mutex_lock(&b->mu);
    int early = b->n;
    pthread_mutex_unlock(&b->mu);
    is_int(early, 0, "nobody queued came in while the first reader held");
    if (r0)
        dlock_release(r0);
    ok(board_reaches(b, 1, 10000), "the reader's release admits someone");
    sleep_ms(300); /* r or s would come in now if they could pass W */
    pthread_mutex_lock(&b->mu);
    int n1 = b->n;
    char first = b->order[0];
    pthread_mutex_unlock(&b->mu);
    ok(n1 == 1 && first == 'W', "the queued writer, alone (came in: %.*s)", n1, b->order);
    is_int(worker_end(&w), 0, "the writer releases");
    ok(board_reaches(b, 3, 10000), "both readers behind it come in");
    sleep_ms(200);
    pthread_mutex_lock(&b->mu);
    int together = b->together, n3 = b->n;
    pthread_mutex_unlock(&b->mu);
    ok(n3 == 3, "and not the writer behind them (came in: %.*s)", n3, b->order);
    ok(together >= 2, "the two readers held together (%d inside at once)", together);
    is_int(worker_end(&r), 0, "one reader releases");
    is_int(worker_end(&t), 0, "the other");
    ok(board_reaches(b, 4, 10000), "then the last writer");
    is_int(worker_end(&x), 0, "which releases");
    char want1[] = "WrsX", want2[] = "WsrX";
    ok(strncmp(b->order, want1, 4) == 0 || strncmp(b->order, want2, 4) == 0,
       "arrival order across modes: %.*s", b->n, b->order);
    ok(b->bad_rw == 0 && b->bad_ww == 0 && b->bad_token == 0,
       "exclusion and token order held throughout");
    dlock_client_close(watcher);
    dlock_client_close(c);
    board_free(b);
}

/*
 * A semaphore of 2, full, with 3 waiters queued one by one: exactly 2
 * inside while they wait; each release admits the next in arrival order.
 */
static void semaphore_fifo(void)
{
    char name[128];
    struct board *b = board_new(2);
    dlock_client *watcher = client();
    name_of(name, sizeof name, "sem-fifo");
    struct worker h1 = worker_queued(name, DLOCK_MODE_EXCLUSIVE, 2, 0, b, 'a', watcher, 0);
    struct worker h2 = worker_queued(name, DLOCK_MODE_EXCLUSIVE, 2, 0, b, 'b', watcher, 0);
    ok(board_reaches(b, 2, 10000), "two permits held");
    struct worker q[3];
    for (int i = 0; i < 3; i++)
        q[i] = worker_queued(name, DLOCK_MODE_EXCLUSIVE, 2, 0, b, (char)('1' + i), watcher,
                             (uint64_t)i + 1);
    sleep_ms(200);
    pthread_mutex_lock(&b->mu);
    int inside = b->inside;
    pthread_mutex_unlock(&b->mu);
    is_int(inside, 2, "exactly 2 inside while 3 wait");
    is_int(worker_end(&h1), 0, "a permit released");
    ok(board_reaches(b, 3, 10000), "admits one waiter");
    is_int(worker_end(&h2), 0, "the other");
    ok(board_reaches(b, 4, 10000), "admits the next");
    sleep_ms(200);
    pthread_mutex_lock(&b->mu);
    inside = b->inside;
    pthread_mutex_unlock(&b->mu);
    is_int(inside, 2, "2 inside, the third still waiting");
    is_int(worker_end(&q[0]), 0, "first waiter releases");
    ok(board_reaches(b, 5, 10000), "the third comes in");
    is_int(worker_end(&q[1]), 0, "second waiter releases");
    is_int(worker_end(&q[2]), 0, "third waiter releases");
    if (caps & DLOCK_CAP_FIFO)
        ok(strncmp(b->order + 2, "123", 3) == 0, "permits granted in arrival order: %.*s",
           b->n - 2, b->order + 2);
    else
        skip("the backend does not declare DLOCK_CAP_FIFO", "permits granted in arrival order");
    ok(b->bad_limit == 0 && b->max_inside <= 2, "never more than 2 inside (at most %d)",
       b->max_inside);
    dlock_client_close(watcher);
    board_free(b);
}

void test_modes(void)
{
    refused_without();
    if (SHARED_CAP(caps)) {
        shared_basics();
        rw_exclusion(6, 12);
        if (caps & DLOCK_CAP_FIFO)
            rw_fifo();
        else
            skip("the backend does not declare DLOCK_CAP_FIFO",
                 "readers and writers served in arrival order");
    } else {
        skip("the backend does not declare DLOCK_CAP_SHARED", "shared locks");
    }
    if (SEM_CAP(caps)) {
        semaphore_basics();
        semaphore_exclusion(6, 10);
        semaphore_fifo();
    } else {
        skip("the backend does not declare DLOCK_CAP_SEMAPHORE", "semaphores");
    }
}

void test_modes_break_shared(void)
{
    rw_exclusion(6, 12);
}

void test_modes_break_limit(void)
{
    semaphore_exclusion(6, 10);
}

/*
 * One permit's holder SIGKILLed: its permit is freed by the mechanism that
 * frees a dead holder's lock (within the holder-death bound where the store
 * declares it, else its lease), and the other permit's holder keeps its own.
 */
void test_modes_holder_killed(void)
{
    if (!SEM_CAP(caps)) {
        skip("the backend does not declare DLOCK_CAP_SEMAPHORE", "a killed permit holder");
        return;
    }
    char name[128];
    int death = (caps & DLOCK_CAP_HOLDER_DEATH) != 0;
    uint32_t ttl = death ? HOLDER_DEATH_TTL_MS : 2000;
    struct board *b = board_new(2);
    dlock_client *c = client();
    name_of(name, sizeof name, "sem-killed");
    struct worker doomed = worker_start(name, DLOCK_MODE_EXCLUSIVE, 2, 0, b, 'k', 0, 1, -1, ttl);
    ok(board_reaches(b, 1, 10000), "a permit holder (lease %u ms)", ttl);
    struct worker keeper = worker_start(name, DLOCK_MODE_EXCLUSIVE, 2, 0, b, 'p', 0, 1, -1, 30000);
    ok(board_reaches(b, 2, 10000), "another permit holder");
    kill(doomed.pid, SIGKILL);
    waitpid(doomed.pid, NULL, 0);
    close(doomed.control);
    uint64_t bound = death ? HOLDER_DEATH_BOUND_MS + HOLDER_DEATH_SLACK_MS : ttl + 5000;
    dlock_lock *l = NULL;
    dlock_acquire_opts o = mode_opts(DLOCK_MODE_EXCLUSIVE, 2, DLOCK_WAIT_DEADLINE, bound);
    uint64_t t0 = dlock_monotonic_ns();
    int rc = dlock_acquire(c, name, &o, &l);
    double el = (dlock_monotonic_ns() - t0) / 1e6;
    if (death)
        is_int(rc, 0, "a SIGKILLed permit holder's permit is free within %u ms (+ %u ms slack): "
                      "%.0f ms",
               HOLDER_DEATH_BOUND_MS, HOLDER_DEATH_SLACK_MS, el);
    else
        is_int(rc, 0, "a SIGKILLed permit holder's permit is free at its lease end (%u ms): "
                      "%.0f ms",
               ttl, el);
    dlock_lock *more = NULL;
    dlock_acquire_opts t = mode_opts(DLOCK_MODE_EXCLUSIVE, 2, DLOCK_WAIT_TRY, 0);
    dlock_client *other = client(); /* c holds: its own acquire is DLOCK_EALREADY */
    is_int(dlock_acquire(other, name, &t, &more), DLOCK_EBUSY,
           "one permit only: the living holder kept its own");
    if (more)
        dlock_release(more);
    dlock_client_close(other);
    is_int(worker_end(&keeper), 0, "the living holder releases its permit cleanly");
    if (l)
        dlock_release(l);
    dlock_client_close(c);
    board_free(b);
}

static void count_lost(dlock_lock *l, int err, void *user)
{
    (void)l;
    (void)err;
    __atomic_add_fetch((int *)user, 1, __ATOMIC_SEQ_CST);
}

/* A kept reader and a kept permit outlive 4 leases, not reported lost,
 * still held in the store; then release cleanly. */
static void kept_one(dlock_mode mode, uint32_t limit, const char *what)
{
    char name[128];
    static int calls;
    uint32_t ttl = keep_ttl();
    dlock_client *c = client(), *other = client();
    dlock_lock *l = NULL, *x = NULL;
    snprintf(name, sizeof name, "%skept-%s", prefix, mode == DLOCK_MODE_SHARED ? "shared" : "permit");
    dlock_acquire_opts o = mode_opts(mode, limit, DLOCK_WAIT_TRY, 0);
    o.ttl_ms = ttl;
    o.keep = 1;
    o.on_lost = count_lost;
    o.on_lost_user = &calls;
    is_int(dlock_acquire(c, name, &o, &l), 0, "a kept %s (lease %u ms)", what, ttl);
    sleep_ms(4 * ttl);
    is_int(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 0, "%s: not reported lost after 4 leases",
           what);
    dlock_acquire_opts e = mode_opts(DLOCK_MODE_EXCLUSIVE, limit ? limit : 0, DLOCK_WAIT_TRY, 0);
    if (limit) {
        /* a semaphore of 1: the kept permit still fills it */
        is_int(dlock_acquire(other, name, &e, &x), DLOCK_EBUSY, "%s: still held in the store",
               what);
    } else {
        is_int(dlock_acquire(other, name, &e, &x), DLOCK_EBUSY,
               "%s: still held in the store (a writer is refused)", what);
    }
    if (x)
        dlock_release(x);
    if (l)
        is_int(dlock_release(l), 0, "%s: released cleanly", what);
    dlock_client_close(c);
    dlock_client_close(other);
}

void test_modes_kept(void)
{
    if (SHARED_CAP(caps))
        kept_one(DLOCK_MODE_SHARED, 0, "reader");
    else
        skip("the backend does not declare DLOCK_CAP_SHARED", "a kept reader");
    if (SEM_CAP(caps))
        kept_one(DLOCK_MODE_EXCLUSIVE, 1, "permit");
    else
        skip("the backend does not declare DLOCK_CAP_SEMAPHORE", "a kept permit");
}
