/* Elections on the file store (docs/file.md "Elections"): the value file
 * (any bytes, counted only for the grant that wrote it), a plain holder
 * with no value, a publish refused once the lock file is replaced, and the
 * watch (inotify on the lock file, a pidfd of the holder): woken by a
 * grant, a publish, a release, a wake and a SIGKILLed holder, idle
 * otherwise, following a lock file created or replaced after it opened. */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/file.h"
#include "core/uri.h"
#include "dlock.h"
#include "dlock_backend.h"
#include "tests/tap.h"

static char dir[64], uri[128];

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void path_of(const char *name, const char *prefix, const char *suffix, char *out,
                    size_t outsz)
{
    char enc[DLOCK_FILE_ENCODED_MAX + 80];
    dlock_file_encode_name(name, strlen(name), enc, sizeof enc);
    snprintf(out, outsz, "%s/%s%s%s", dir, prefix, enc, suffix);
}

static int readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

static void test_values(void)
{
    static const char value[] = {'a', 0, 'b', 0, 'c'};
    char vpath[512], buf[256];
    dlock_client *c = NULL;
    dlock_lock *l = NULL, *p = NULL;
    dlock_leader_info li;
    ok(dlock_client_open(uri, &c) == 0, "open");
    is_int(dlock_campaign(c, "values", value, sizeof value, NULL, &l), 0, "campaign");
    is_int(dlock_leader(c, "values", &li), 0, "leader");
    ok(li.held && li.term == dlock_lock_token(l), "the leader's term is the grant's token");
    ok(li.value_len == sizeof value && memcmp(li.value, value, sizeof value) == 0,
       "a value with NUL bytes comes back whole (%zu bytes)", li.value_len);
    is_str(li.owner, dlock_lock_owner(l), "the leader's owner");
    path_of("values", ".", ".leader", vpath, sizeof vpath);
    int fd = open(vpath, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    buf[n > 0 ? n : 0] = '\0';
    char want[128];
    snprintf(want, sizeof want, "owner=%s grant=%020" PRIu64 " pid=%ld len=5\n",
             dlock_lock_owner(l), dlock_lock_token(l), (long)getpid());
    ok(n > 0 && strncmp(buf, want, strlen(want)) == 0, "the value file names its grant: %.80s",
       buf);
    is_int(dlock_proclaim(l, "second", 6), 0, "proclaim");
    is_int(dlock_leader(c, "values", &li), 0, "leader");
    is_str(li.value, "second", "the proclaimed value");
    is_int(dlock_resign(l), 0, "resign");
    is_int(dlock_leader(c, "values", &li), 0, "leader");
    ok(!li.held && li.value_len == 0, "no leader, no value");
    /* A plain holder publishes nothing: the last leader's value is not its. */
    is_int(dlock_acquire(c, "values", NULL, &p), 0, "a plain holder");
    is_int(dlock_leader(c, "values", &li), 0, "leader");
    ok(li.held && li.term == dlock_lock_token(p) && li.value_len == 0,
       "a plain holder leads with no value (the last leader's is not read as its own)");
    ok(access(vpath, F_OK) == 0, "the last value file is still there");
    dlock_release(p);
    /* Leftovers of a publish: the name's next-value file, kept. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -a %s | grep '\\.new$' | grep -qv '\\.leader\\.new$'", dir);
    ok(system(cmd) != 0, "no other value file is left behind");
    strcat(vpath, ".new");
    ok(access(vpath, F_OK) == 0, "the next-value file is kept");
    dlock_client_close(c);
}

static void test_replaced(void)
{
    char path[512], gone[600];
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    dlock_leader_info li;
    ok(dlock_client_open(uri, &c) == 0, "open");
    is_int(dlock_campaign(c, "replaced", "v1", 2, NULL, &l), 0, "campaign");
    path_of("replaced", "", "", path, sizeof path);
    snprintf(gone, sizeof gone, "%s.gone", path);
    ok(rename(path, gone) == 0, "the lock file moved away");
    is_int(dlock_proclaim(l, "v2", 2), DLOCK_ELOST, "a publish after the lock file was replaced");
    is_int(dlock_leader(c, "replaced", &li), 0, "leader");
    ok(!li.held, "no leader at the path");
    dlock_release(l);
    unlink(gone);
    dlock_client_close(c);
}

struct watch_env {
    dlock_client *c;
    dlock_uri *u;
    dlock_conn *conn;
    const dlock_backend *b;
};

static int env_open(struct watch_env *e)
{
    char err[256];
    memset(e, 0, sizeof *e);
    e->b = dlock_backend_find("file");
    if (!e->b || dlock_client_open(uri, &e->c) != 0 || dlock_uri_parse(uri, &e->u, err, sizeof err))
        return -1;
    if (e->b->open(e->c, e->u, &e->conn) != 0)
        return -1;
    e->conn->backend = e->b;
    e->conn->client = e->c;
    return 0;
}

static void env_close(struct watch_env *e)
{
    if (e->conn)
        e->b->close(e->conn);
    dlock_uri_free(e->u);
    dlock_client_close(e->c);
}

/* Readable within 1 s, consumed; then quiet for 100 ms. */
static void woken(struct watch_env *e, dlock_watch *w, const char *what)
{
    int fd = e->b->watch_fd(w);
    ok(readable(fd, 1000), "the watch is woken by %s", what);
    is_int(e->b->watch_read(w), 0, "watch_read after %s", what);
    while (readable(fd, 100) && e->b->watch_read(w) == 0)
        ; /* the events of one change may come in two reads */
    ok(!readable(fd, 100), "quiet after %s", what);
}

static void test_watch(void)
{
    struct watch_env e;
    dlock_watch *w = NULL;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    char path[512], gone[600];
    if (env_open(&e) != 0 || dlock_client_open(uri, &c) != 0) {
        ok(0, "cannot open the file backend");
        return;
    }
    is_int(e.b->watch_open(e.conn, "watched", 7, &w), 0, "a watch on a name never taken");
    ok(!readable(e.b->watch_fd(w), 200), "an idle watch is quiet");
    is_int(dlock_campaign(c, "watched", "v1", 2, NULL, &l), 0, "campaign");
    woken(&e, w, "the first grant (the lock file created)");
    is_int(dlock_proclaim(l, "v2", 2), 0, "proclaim");
    woken(&e, w, "a publish");
    is_int(dlock_resign(l), 0, "resign");
    woken(&e, w, "a resign");
    is_int(e.b->wake(e.conn, "watched", 7), 0, "wake");
    woken(&e, w, "a wake");
    is_int(dlock_acquire(c, "watched", NULL, &l), 0, "a plain grant");
    woken(&e, w, "a plain grant");
    /* The lock file replaced: the watch follows the one at the path. */
    path_of("watched", "", "", path, sizeof path);
    snprintf(gone, sizeof gone, "%s.gone", path);
    ok(rename(path, gone) == 0, "the lock file moved away");
    woken(&e, w, "the lock file moved away");
    dlock_lock *l2 = NULL;
    dlock_client *c2 = NULL;
    ok(dlock_client_open(uri, &c2) == 0, "open");
    is_int(dlock_acquire(c2, "watched", NULL, &l2), 0, "a grant of a new lock file");
    woken(&e, w, "a grant of a new lock file");
    dlock_release(l); /* the old file's: no longer watched */
    unlink(gone);
    while (readable(e.b->watch_fd(w), 100) && e.b->watch_read(w) == 0)
        ;
    dlock_release(l2);
    woken(&e, w, "a release of the new lock file");
    e.b->watch_close(w);
    dlock_client_close(c2);
    dlock_client_close(c);
    env_close(&e);
}

/* A leader SIGKILLed: its OFD lock goes without a word; the pidfd of its
 * process tells the watch, and an observer reports no leader. */
static void test_killed(void)
{
    struct watch_env e;
    dlock_watch *w = NULL;
    int ready[2];
    if (env_open(&e) != 0 || pipe(ready) != 0) {
        ok(0, "cannot open the file backend");
        return;
    }
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        if (pid == 0) {
            dlock_client *cc = NULL;
            dlock_lock *ll = NULL;
            if (dlock_client_open(uri, &cc) != 0 || dlock_campaign(cc, "killed", "k", 1, NULL, &ll))
                _exit(1);
            if (write(ready[1], "x", 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
        char x;
        ok(read(ready[0], &x, 1) == 1, "round %d: a leader in a child process", round);
        dlock_observer *o = NULL;
        dlock_leader_info li;
        is_int(dlock_observe(e.c, "killed", NULL, NULL, &o), 0, "observe");
        is_int(dlock_observer_next(o, &li, 2000), 0, "the first state");
        ok(li.held && li.value_len == 1 && li.value[0] == 'k', "the child leads with its value");
        if (round == 0) {
            uint64_t r0 = dlock_observer_reads(o);
            usleep(1000000);
            is_int((int)(dlock_observer_reads(o) - r0), 0, "an idle observer reads nothing in 1 s");
        }
        is_int(e.b->watch_open(e.conn, "killed", 6, &w), 0, "a watch");
        ok(!readable(e.b->watch_fd(w), 100), "quiet while the leader lives");
        uint64_t t0 = now_ms();
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        int got = 0;
        while (!got && now_ms() - t0 < 2000 && dlock_observer_next(o, &li, 2000) == 0)
            got = !li.held;
        ok(got, "round %d: the observer reports no leader %" PRIu64 " ms after the SIGKILL", round,
           now_ms() - t0);
        ok(readable(e.b->watch_fd(w), 1000), "the watch was woken by the death");
        e.b->watch_close(w);
        dlock_observer_close(o);
    }
    close(ready[0]);
    close(ready[1]);
    env_close(&e);
}

/* A leader whose process forked: the child shares its lock file's
 * description, so the lock outlives the leader's death (no pidfd follows
 * the child), and goes at the child's: the close, then the look after it,
 * tell the observer. */
static void test_shared_descriptor(void)
{
    int ready[2];
    dlock_client *c = NULL;
    if (pipe(ready) != 0 || dlock_client_open(uri, &c) != 0) {
        ok(0, "cannot start");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dlock_client *cc = NULL;
        dlock_lock *ll = NULL;
        if (dlock_client_open(uri, &cc) != 0 || dlock_campaign(cc, "forked", "f", 1, NULL, &ll))
            _exit(1);
        pid_t child = fork();
        if (child == 0) {
            pause();
            _exit(0);
        }
        if (write(ready[1], &child, sizeof child) != sizeof child)
            _exit(1);
        pause();
        _exit(0);
    }
    pid_t child = 0;
    ok(read(ready[0], &child, sizeof child) == sizeof child && child > 0,
       "a leader that forked a child");
    dlock_observer *o = NULL;
    dlock_leader_info li;
    is_int(dlock_observe(c, "forked", NULL, NULL, &o), 0, "observe");
    is_int(dlock_observer_next(o, &li, 2000), 0, "the first state");
    ok(li.held, "the leader leads");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int gone = 0;
    while (!gone && dlock_observer_next(o, &li, 300) == 0)
        gone = !li.held;
    ok(!gone, "the leader's death leaves the lock to the child that shares it");
    uint64_t t0 = now_ms();
    kill(child, SIGKILL);
    while (!gone && now_ms() - t0 < 2000 && dlock_observer_next(o, &li, 2000) == 0)
        gone = !li.held;
    ok(gone, "the child's death is reported %" PRIu64 " ms after its SIGKILL", now_ms() - t0);
    dlock_observer_close(o);
    close(ready[0]);
    close(ready[1]);
    dlock_client_close(c);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dlock-test-elect-%d", (int)getpid());
    snprintf(uri, sizeof uri, "file://%s", dir);
    mkdir(dir, 0700);
    test_values();
    test_replaced();
    test_watch();
    test_killed();
    test_shared_descriptor();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    return done_testing();
}
