/* What only the file backend's shared locks and semaphores have: the gate
 * that holds readers behind a waiting writer (which the kernel alone does
 * not), permits in arrival order, a permit's waiter woken by the release
 * (not by its 50 ms look), the previous release's whole-file write lock
 * still excluding and excluded, and a dead holder's record never listed. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/file.h"
#include "dlock.h"
#include "tests/tap.h"

static char dir[64], uri[128];

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static dlock_client *client(void)
{
    dlock_client *c = NULL;
    if (dlock_client_open(uri, &c) != 0) {
        diag("open %s: %s", uri, dlock_errmsg(c));
        abort();
    }
    return c;
}

static dlock_acquire_opts opts(dlock_mode mode, uint32_t limit, dlock_wait wait, uint64_t ms)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.mode = mode;
    o.limit = limit;
    o.wait = wait;
    if (wait == DLOCK_WAIT_DEADLINE)
        o.deadline_ns = dlock_monotonic_ns() + ms * 1000000u;
    return o;
}

static dlock_acquire_opts try_opts(dlock_mode mode, uint32_t limit)
{
    return opts(mode, limit, DLOCK_WAIT_TRY, 0);
}

/* Who came in, in order, and when (for the handoff's delay). */
static struct {
    pthread_mutex_t mu;
    char order[16];
    int n;
    uint64_t at_ns;
} board = {PTHREAD_MUTEX_INITIALIZER, "", 0, 0};

static void board_reset(void)
{
    pthread_mutex_lock(&board.mu);
    memset(board.order, 0, sizeof board.order);
    board.n = 0;
    pthread_mutex_unlock(&board.mu);
}

static int board_n(void)
{
    pthread_mutex_lock(&board.mu);
    int n = board.n;
    pthread_mutex_unlock(&board.mu);
    return n;
}

static int board_reaches(int n, unsigned ms)
{
    for (unsigned i = 0; i < ms; i++) {
        if (board_n() >= n)
            return 1;
        sleep_ms(1);
    }
    return board_n() >= n;
}

/* A client on its own thread: waits for name in mode/limit, signs the
 * board with tag, holds until released (release_now), then releases. */
struct worker {
    pthread_t th;
    const char *name;
    dlock_mode mode;
    uint32_t limit;
    char tag;
    unsigned hold_ms; /* 0: until go is set */
    int go, rc;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    dlock_client *c = client();
    dlock_lock *l = NULL;
    dlock_acquire_opts o = opts(w->mode, w->limit, DLOCK_WAIT_DEADLINE, 20000);
    w->rc = dlock_acquire(c, w->name, &o, &l);
    if (w->rc == 0) {
        pthread_mutex_lock(&board.mu);
        board.at_ns = dlock_monotonic_ns();
        board.order[board.n++] = w->tag;
        pthread_mutex_unlock(&board.mu);
        if (w->hold_ms)
            sleep_ms(w->hold_ms);
        else
            while (!__atomic_load_n(&w->go, __ATOMIC_SEQ_CST))
                sleep_ms(1);
        w->rc = dlock_release(l);
    } else {
        diag("worker %c: %s", w->tag, dlock_errmsg(c));
    }
    dlock_client_close(c);
    return NULL;
}

static void worker_start(struct worker *w, const char *name, dlock_mode mode, uint32_t limit,
                         char tag, unsigned hold_ms)
{
    memset(w, 0, sizeof *w);
    w->name = name;
    w->mode = mode;
    w->limit = limit;
    w->tag = tag;
    w->hold_ms = hold_ms;
    if (pthread_create(&w->th, NULL, worker_main, w) != 0)
        abort();
}

static int worker_end(struct worker *w)
{
    __atomic_store_n(&w->go, 1, __ATOMIC_SEQ_CST);
    pthread_join(w->th, NULL);
    return w->rc;
}

static char path_buf[600];

static const char *lock_path(const char *name)
{
    char fname[DLOCK_FILE_ENCODED_MAX + 80];
    dlock_file_encode_name(name, strlen(name), fname, sizeof fname);
    snprintf(path_buf, sizeof path_buf, "%s/%s", dir, fname);
    return path_buf;
}

static char side_buf[700];

/* The name's side file (readers' and permits' slots and records). */
static const char *side_path(const char *name)
{
    char fname[DLOCK_FILE_ENCODED_MAX + 80];
    dlock_file_encode_name(name, strlen(name), fname, sizeof fname);
    snprintf(side_buf, sizeof side_buf, "%s/.%s.modes", dir, fname);
    return side_buf;
}

/* The previous release's lock: the lock file whole, write-locked. */
static int old_lock(int fd, int cmd)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    return fcntl(fd, cmd, &fl);
}

struct blocked {
    int fd;
    short type;
};

static void *block_on(void *arg)
{
    struct blocked *b = arg;
    struct flock fl = {.l_type = b->type, .l_whence = SEEK_SET};
    if (fcntl(b->fd, F_OFD_SETLKW, &fl) < 0)
        diag("F_OFD_SETLKW: %s", strerror(errno));
    return NULL;
}

/* The control: with fcntl() alone, Linux grants a read lock while a write
 * lock waits, so a reader arriving after a waiting writer would pass it. */
static void kernel_lets_readers_pass(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/raw-control", dir);
    int r1 = open(path, O_RDWR | O_CREAT, 0600), w = open(path, O_RDWR), r2 = open(path, O_RDWR);
    struct flock rd = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
    ok(fcntl(r1, F_OFD_SETLK, &rd) == 0, "control: a raw reader holds");
    struct blocked b = {w, F_WRLCK};
    pthread_t th;
    pthread_create(&th, NULL, block_on, &b);
    sleep_ms(100);
    rd.l_type = F_RDLCK;
    if (fcntl(r2, F_OFD_SETLK, &rd) == 0)
        ok(1, "control: the kernel grants a later reader past the waiting writer (what the "
              "gate prevents)");
    else
        skip("this kernel holds a later reader behind a waiting writer itself",
             "control: the kernel grants a later reader past the waiting writer");
    close(r2);
    rd.l_type = F_UNLCK;
    fcntl(r1, F_OFD_SETLK, &rd);
    pthread_join(th, NULL);
    close(r1);
    close(w);
}

static void writer_holds_back_readers(void)
{
    const char *name = "gate";
    dlock_client *c = client(), *x = client();
    dlock_lock *r0 = NULL, *l = NULL;
    dlock_acquire_opts s = try_opts(DLOCK_MODE_SHARED, 0);
    struct worker w, r;
    board_reset();
    is_int(dlock_acquire(c, name, &s, &r0), 0, "a reader holds");
    worker_start(&w, name, DLOCK_MODE_EXCLUSIVE, 0, 'W', 0);
    sleep_ms(100);
    is_int(dlock_acquire(x, name, &s, &l), DLOCK_EBUSY,
           "a reader's try behind the waiting writer: busy");
    if (l)
        dlock_release(l);
    worker_start(&r, name, DLOCK_MODE_SHARED, 0, 'r', 0);
    sleep_ms(100);
    is_int(board_n(), 0, "the later reader waits too");
    dlock_release(r0);
    ok(board_reaches(1, 5000), "the reader's release admits someone");
    sleep_ms(100);
    ok(board_n() == 1 && board.order[0] == 'W', "the writer, alone (came in: %s)", board.order);
    is_int(worker_end(&w), 0, "the writer releases");
    ok(board_reaches(2, 5000) && board.order[1] == 'r', "then the reader (came in: %s)",
       board.order);
    is_int(worker_end(&r), 0, "which releases");
    dlock_client_close(c);
    dlock_client_close(x);
}

static void permits_in_arrival_order(void)
{
    const char *name = "sem-order";
    dlock_client *c = client();
    dlock_lock *p = NULL;
    dlock_acquire_opts o = try_opts(DLOCK_MODE_EXCLUSIVE, 1);
    struct worker q[4];
    board_reset();
    is_int(dlock_acquire(c, name, &o, &p), 0, "the one permit held");
    for (int i = 0; i < 4; i++) {
        worker_start(&q[i], name, DLOCK_MODE_EXCLUSIVE, 1, (char)('1' + i), 20);
        sleep_ms(50);
    }
    dlock_release(p);
    ok(board_reaches(4, 10000), "each waiter in turn");
    for (int i = 0; i < 4; i++)
        worker_end(&q[i]);
    is_str(board.order, "1234", "permits granted in arrival order");
    dlock_client_close(c);
}

/* Handoffs of a permit with the waiter's own look every 5 s
 * (DLOCK_TEST_FILE_LOOK_MS): each well under that, so the release's close
 * of the side file woke the waiter (inotify), not its look. */
static void permit_handoff_is_notified(void)
{
    const char *name = "sem-handoff";
    dlock_client *c = client();
    int fast = 0;
    double worst = 0;
    setenv("DLOCK_TEST_FILE_LOOK_MS", "5000", 1);
    for (int i = 0; i < 5; i++) {
        dlock_lock *p = NULL;
        dlock_acquire_opts o = try_opts(DLOCK_MODE_EXCLUSIVE, 1);
        struct worker w;
        board_reset();
        if (dlock_acquire(c, name, &o, &p) != 0) {
            diag("permit: %s", dlock_errmsg(c));
            break;
        }
        worker_start(&w, name, DLOCK_MODE_EXCLUSIVE, 1, 'w', 0);
        sleep_ms(80); /* past the waiter's first looks: it waits */
        uint64_t t0 = dlock_monotonic_ns();
        dlock_release(p);
        if (board_reaches(1, 10000)) {
            double ms = (double)(board.at_ns - t0) / 1e6;
            fast += ms < 1000;
            worst = ms > worst ? ms : worst;
        }
        worker_end(&w);
    }
    unsetenv("DLOCK_TEST_FILE_LOOK_MS");
    ok(fast == 5, "a release wakes the permit's waiter: %d of 5 handoffs under 1 s of its 5 s "
                  "look (slowest %.1f ms)", fast, worst);
    dlock_client_close(c);
}

/* The previous release takes the lock file whole with a write lock: it
 * still excludes readers and permits, and is excluded by them. */
static void previous_release(void)
{
    const char *name = "old-layout";
    dlock_client *c = client();
    dlock_lock *l = NULL;
    dlock_acquire_opts s = try_opts(DLOCK_MODE_SHARED, 0), p = try_opts(DLOCK_MODE_EXCLUSIVE, 2),
                       x = try_opts(DLOCK_MODE_EXCLUSIVE, 0);
    is_int(dlock_acquire(c, name, &s, &l), 0, "a reader holds");
    int fd = open(lock_path(name), O_RDWR);
    ok(fd >= 0 && old_lock(fd, F_OFD_SETLK) < 0 && (errno == EAGAIN || errno == EACCES),
       "the previous release's lock is refused while a reader holds");
    dlock_release(l);
    l = NULL;
    is_int(dlock_acquire(c, name, &p, &l), 0, "a permit holds");
    ok(old_lock(fd, F_OFD_SETLK) < 0 && (errno == EAGAIN || errno == EACCES),
       "the previous release's lock is refused while a permit is held");
    dlock_release(l);
    l = NULL;
    ok(old_lock(fd, F_OFD_SETLK) == 0, "the previous release's lock, once they are gone");
    is_int(dlock_acquire(c, name, &s, &l), DLOCK_EBUSY, "excludes a reader");
    is_int(dlock_acquire(c, name, &x, &l), DLOCK_EBUSY, "and a writer");
    is_int(dlock_acquire(c, name, &p, &l), DLOCK_EMODE, "a semaphore on it: DLOCK_EMODE (%s)",
           dlock_errmsg(c));
    dlock_acquire_opts d = opts(DLOCK_MODE_SHARED, 0, DLOCK_WAIT_DEADLINE, 200);
    is_int(dlock_acquire(c, name, &d, &l), DLOCK_ETIMEDOUT, "a reader waits for it");
    close(fd);
    is_int(dlock_acquire(c, name, &s, &l), 0, "and gets in once it is released");
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

/* A child that takes a permit of name (limit) and holds it until killed:
 * its pid; *got 'y' once it holds. */
static pid_t child_holds_permit(const char *name, uint32_t limit, char *got)
{
    int p[2];
    if (pipe(p) < 0)
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        dlock_client *k = client();
        dlock_lock *l = NULL;
        dlock_acquire_opts o = try_opts(DLOCK_MODE_EXCLUSIVE, limit);
        char ok_ = dlock_acquire(k, name, &o, &l) == 0 ? 'y' : 'n';
        if (write(p[1], &ok_, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    close(p[1]);
    if (read(p[0], got, 1) != 1)
        *got = 0;
    close(p[0]);
    return pid;
}

/* A permit's holder SIGKILLed leaves its record; inspect lists only
 * holders whose slot is held, so the dead one is not listed. */
static void dead_record_not_listed(void)
{
    const char *name = "dead-record";
    dlock_client *c = client();
    dlock_holder h[4];
    size_t count = 9;
    char got = 0;
    pid_t pid = child_holds_permit(name, 2, &got);
    is_int(got, 'y', "a child holds a permit");
    is_int(dlock_inspect_holders(c, name, h, 4, &count), 0, "inspect_holders");
    ok(count == 1 && h[0].mode == DLOCK_MODE_EXCLUSIVE && h[0].limit == 2,
       "lists it: one permit of limit 2 (%zu)", count);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    char rec[64] = {0};
    int fd = open(side_path(name), O_RDONLY);
    ok(fd >= 0 && pread(fd, rec, sizeof rec, 0) == (ssize_t)sizeof rec && rec[0] != '\0',
       "its record is still in the side file");
    if (fd >= 0)
        close(fd);
    count = 9;
    is_int(dlock_inspect_holders(c, name, h, 4, &count), 0, "inspect_holders after its death");
    is_int((int)count, 0, "lists no holder: the dead one's slot is free");
    dlock_info info;
    if (dlock_inspect(c, name, &info) == 0)
        ok((info.known & DLOCK_KNOWS_HELD) && !info.held, "dlock_inspect: free");
    dlock_client_close(c);
}

/* A waiter for the one permit of a semaphore whose holder is SIGKILLed:
 * the kernel frees the slot with the holder's descriptors, and the waiter
 * sees it at the close's notice or its next look (50 ms). */
static void killed_holder_frees_permit(void)
{
    const char *name = "sem-killed";
    char got = 0;
    pid_t pid = child_holds_permit(name, 1, &got);
    is_int(got, 'y', "a child holds the one permit");
    struct worker w;
    board_reset();
    worker_start(&w, name, DLOCK_MODE_EXCLUSIVE, 1, 'w', 0);
    sleep_ms(100);
    is_int(board_n(), 0, "a waiter waits");
    uint64_t t0 = dlock_monotonic_ns();
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int in = board_reaches(1, 5000);
    double ms = in ? (double)(board.at_ns - t0) / 1e6 : -1;
    ok(in && ms < 500, "the waiter has the permit %.1f ms after the kill (its look: 50 ms)", ms);
    is_int(worker_end(&w), 0, "and releases it");
}

/* A reader that came in after a wait still marks its kind: a semaphore
 * beside it is refused at once, and so is another limit beside a
 * semaphore. */
static void kinds_refused(void)
{
    const char *name = "marks";
    dlock_client *c = client(), *y = client();
    dlock_lock *x = NULL, *l = NULL;
    dlock_acquire_opts e = try_opts(DLOCK_MODE_EXCLUSIVE, 0), p = try_opts(DLOCK_MODE_EXCLUSIVE, 3);
    struct worker w;
    board_reset();
    is_int(dlock_acquire(c, name, &e, &x), 0, "a writer holds");
    worker_start(&w, name, DLOCK_MODE_SHARED, 0, 'r', 0);
    sleep_ms(100);
    dlock_release(x);
    ok(board_reaches(1, 5000), "the waiting reader comes in");
    is_int(dlock_acquire(y, name, &p, &l), DLOCK_EMODE, "a semaphore beside it: DLOCK_EMODE (%s)",
           dlock_errmsg(y));
    ok(strstr(dlock_errmsg(y), "read-write lock") != NULL, "saying why");
    worker_end(&w);
    is_int(dlock_acquire(y, name, &p, &l), 0, "a semaphore once the name is free");
    dlock_acquire_opts q = try_opts(DLOCK_MODE_EXCLUSIVE, 4);
    is_int(dlock_acquire(c, name, &q, &x), DLOCK_EMODE, "limit 4 beside limit 3: DLOCK_EMODE");
    ok(strstr(dlock_errmsg(c), "limit 3") != NULL, "naming limit 3: %s", dlock_errmsg(c));
    if (l)
        dlock_release(l);
    /* The largest limit: its mark is the last, just below nothing else. */
    dlock_lock *m[2] = {NULL, NULL};
    dlock_acquire_opts big = try_opts(DLOCK_MODE_EXCLUSIVE, DLOCK_LIMIT_MAX);
    is_int(dlock_acquire(c, "limit-max", &big, &m[0]), 0, "a permit of limit %u",
           DLOCK_LIMIT_MAX);
    is_int(dlock_acquire(y, "limit-max", &big, &m[1]), 0, "a second one beside it (%s)",
           dlock_errmsg(y));
    dlock_client *z = client();
    dlock_acquire_opts two = try_opts(DLOCK_MODE_EXCLUSIVE, 2);
    l = NULL;
    is_int(dlock_acquire(z, "limit-max", &two, &l), DLOCK_EMODE, "limit 2 beside it: DLOCK_EMODE");
    ok(strstr(dlock_errmsg(z), "limit 65535") != NULL, "naming limit 65535: %s", dlock_errmsg(z));
    dlock_client_close(z);
    for (int i = 0; i < 2; i++)
        if (m[i])
            dlock_release(m[i]);
    dlock_client_close(c);
    dlock_client_close(y);
}

/* A reader whose side file is removed (its slot and mark no longer count)
 * is told, as a holder whose lock file is removed is. */
static void side_file_removed(void)
{
    const char *name = "side-removed";
    dlock_client *c = client();
    dlock_lock *l = NULL;
    dlock_acquire_opts s = try_opts(DLOCK_MODE_SHARED, 0);
    is_int(dlock_acquire(c, name, &s, &l), 0, "a reader holds");
    is_int(dlock_renew(l, 1000), 0, "renew: still held");
    ok(unlink(side_path(name)) == 0, "its side file removed");
    is_int(dlock_renew(l, 1000), DLOCK_ELOST, "renew: DLOCK_ELOST (%s)", dlock_errmsg(c));
    is_int(dlock_release(l), DLOCK_ELOST, "release: DLOCK_ELOST");
    l = NULL;
    is_int(dlock_acquire(c, name, &s, &l), 0, "a new reader, on a new side file");
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dlock-test-file-modes-%d", (int)getpid());
    snprintf(uri, sizeof uri, "file://%s", dir);
    mkdir(dir, 0700);
    kernel_lets_readers_pass();
    writer_holds_back_readers();
    permits_in_arrival_order();
    permit_handoff_is_notified();
    previous_release();
    dead_record_not_listed();
    killed_holder_frees_permit();
    kinds_refused();
    side_file_removed();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    return done_testing();
}
