/* What only the file backend has: its URI rules, its directory, the token
 * kept in the lock file, OFD-lock details (fork, removed files), the
 * directory's token floor file, and what inspect reads from the lock file. */
#include <fcntl.h>
#include <inttypes.h>
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

static dlock_client *open_ok(const char *u)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(u, &c);
    ok(rc == 0, "open %s", u);
    if (rc)
        diag("%s", dlock_errmsg(c));
    return c;
}

static void bad_uri(const char *u, int want, const char *text)
{
    dlock_client *c = NULL;
    is_int(dlock_client_open(u, &c), want, "rejects %s", u);
    ok(strstr(dlock_errmsg(c), text) != NULL, "message says '%s': %s", text, dlock_errmsg(c));
    dlock_client_close(c);
}

static void test_uris(void)
{
    char u[256];
    bad_uri("file://", DLOCK_EBADURI, "absolute");
    bad_uri("file:///", DLOCK_EBADURI, "absolute");
    bad_uri("file://otherhost/tmp/x", DLOCK_EBADURI, "local directory");
    bad_uri("file://localhost:5/tmp/x", DLOCK_EBADURI, "local directory");
    bad_uri("file://user:pa55word@/tmp/x", DLOCK_EBADURI, "no user");
    bad_uri("file:///tmp/x?fsync=maybe", DLOCK_EBADURI, "fsync");
    bad_uri("file:///tmp/x?ttl=5", DLOCK_EBADURI, "'ttl'");
    bad_uri("file:///tmp/x?layout=plain", DLOCK_EBADURI, "dlock");
    bad_uri("file:///tmp/x?layout=", DLOCK_EBADURI, "layout");
    bad_uri("file:///tmp/x?layout=DLOCK", DLOCK_EBADURI, "layout");
    bad_uri("file:///proc/self/status/x", DLOCK_EIO, "cannot create");
    snprintf(u, sizeof u, "file://%s/plainfile", dir);
    close(open(u + 7, O_CREAT | O_WRONLY, 0600));
    bad_uri(u, DLOCK_EBADURI, "plainfile");
    dlock_client *c = NULL;
    dlock_client_open("file://u:hunter2hunter2@/tmp/x", &c);
    ok(strstr(dlock_errmsg(c), "hunter2hunter2") == NULL, "no password in the message");
    dlock_client_close(c);

    snprintf(u, sizeof u, "file://%s/layout?layout=dlock", dir);
    dlock_client_close(open_ok(u));

    snprintf(u, sizeof u, "file://localhost%s/a/b/c?fsync=1", dir);
    c = open_ok(u);
    struct stat st;
    snprintf(u, sizeof u, "%s/a/b/c", dir);
    ok(stat(u, &st) == 0 && S_ISDIR(st.st_mode), "nested directory created");
    is_int(st.st_mode & 0777, 0700, "created with mode 0700");
    dlock_lock *l = NULL;
    is_int(dlock_acquire(c, "synced", NULL, &l), 0, "acquire with fsync=1");
    dlock_release(l);
    dlock_client_close(c);
}

static void test_token_file(void)
{
    char path[512], fname[DLOCK_FILE_ENCODED_MAX + 80], buf[128];
    dlock_client *c = open_ok(uri);
    dlock_lock *l = NULL;
    uint64_t t1, t2;
    dlock_acquire(c, "tok/en", NULL, &l);
    t1 = dlock_lock_token(l);
    dlock_release(l);
    dlock_client_close(c);
    c = open_ok(uri); /* a "restart": a new client, the same files */
    dlock_acquire(c, "tok/en", NULL, &l);
    t2 = dlock_lock_token(l);
    ok(t2 == t1 + 1, "token continues across clients (%llu then %llu)",
       (unsigned long long)t1, (unsigned long long)t2);
    dlock_release(l);

    dlock_file_encode_name("tok/en", 6, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    FILE *f = fopen(path, "r");
    ok(f && fgets(buf, sizeof buf, f) && strtoull(buf, NULL, 10) == t2,
       "lock file starts with the token in decimal");
    if (f)
        fclose(f);

    /* A lock file emptied (an OS crash before its data reached the disk, or
     * the directory recreated): tokens go on above the ones handed out. */
    f = fopen(path, "w");
    fclose(f);
    uint64_t t3 = 0;
    is_int(dlock_acquire(c, "tok/en", NULL, &l), 0, "acquire after the file was emptied");
    t3 = dlock_lock_token(l);
    ok(t3 > t2, "token after the file was emptied is above the last one (%llu > %llu)",
       (unsigned long long)t3, (unsigned long long)t2);
    ok(t1 > 1000000000000000ull, "a new name's first token comes from the clock (%llu)",
       (unsigned long long)t1);
    dlock_release(l);

    f = fopen(path, "w"); /* corrupt it */
    fputs("garbage\n", f);
    fclose(f);
    is_int(dlock_acquire(c, "tok/en", NULL, &l), DLOCK_EPROTO, "malformed token → DLOCK_EPROTO");
    dlock_lock *l2 = NULL;
    dlock_client *c2 = open_ok(uri);
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_TRY;
    is_int(dlock_acquire(c2, "tok/en", &o, &l2), DLOCK_EPROTO,
           "the failed acquire did not keep the lock (error again, not busy)");
    dlock_client_close(c2);

    f = fopen(path, "w");
    fputs("18446744073709551615\n", f); /* UINT64_MAX */
    fclose(f);
    is_int(dlock_acquire(c, "tok/en", NULL, &l), DLOCK_EPROTO, "exhausted token refused");
    dlock_client_close(c);
}

static void test_fork_and_removal(void)
{
    char fname[DLOCK_FILE_ENCODED_MAX + 80], path[512];
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *l = NULL, *lb = NULL;
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_TRY;
    int p[2];

    is_int(dlock_acquire(a, "forked", NULL, &l), 0, "acquire");
    if (pipe(p) < 0)
        abort();
    pid_t pid = fork();
    if (pid == 0) { /* keeps the inherited descriptor open until told */
        char ch;
        close(p[1]);
        _exit(read(p[0], &ch, 1) < 0);
    }
    close(p[0]);
    is_int(dlock_release(l), 0, "release while a forked child still has the file open");
    is_int(dlock_acquire(b, "forked", &o, &lb), 0, "the lock is free despite the child's copy");
    dlock_release(lb);
    close(p[1]);
    waitpid(pid, NULL, 0);

    is_int(dlock_acquire(a, "removed", NULL, &l), 0, "acquire 'removed'");
    dlock_file_encode_name("removed", 7, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    unlink(path);
    is_int(dlock_renew(l, 1000), DLOCK_ELOST, "renew sees the lock file removed");
    is_int(dlock_release(l), DLOCK_ELOST, "release reports the lock lost");
    is_int(dlock_acquire(b, "removed", &o, &lb), 0, "a new file is created and locked");
    dlock_release(lb);

    char moved[600];
    is_int(dlock_acquire(a, "renamed", NULL, &l), 0, "acquire 'renamed'");
    dlock_file_encode_name("renamed", 7, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    snprintf(moved, sizeof moved, "%s.moved", path);
    if (rename(path, moved) != 0)
        diag("rename failed");
    is_int(dlock_renew(l, 1000), DLOCK_ELOST, "renew sees the lock file renamed away");
    is_int(dlock_release(l), DLOCK_ELOST, "release reports it lost");
    dlock_client_close(a);
    dlock_client_close(b);
}

/* The floor file's value (0: absent or empty), -1 when malformed. */
static int64_t floor_in(const char *d)
{
    char path[512], buf[64];
    snprintf(path, sizeof path, "%s/.dlock-floor", d);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n == 0)
        return 0;
    if (n != 21 || buf[20] != '\n')
        return -1;
    return (int64_t)strtoull(buf, NULL, 10);
}

static uint64_t grant(dlock_client *c, const char *name)
{
    dlock_lock *l = NULL;
    uint64_t t = 0;
    if (dlock_acquire(c, name, NULL, &l) == 0) {
        t = dlock_lock_token(l);
        dlock_release(l);
    } else {
        diag("acquire %s: %s", name, dlock_errmsg(c));
    }
    return t;
}

static void test_store_floor(void)
{
    char fdir[128], furi[160], path[512];
    snprintf(fdir, sizeof fdir, "%s/floor", dir);
    snprintf(furi, sizeof furi, "file://%s?fsync=1", fdir);
    dlock_client *c = open_ok(furi);
    dlock_lock *l = NULL;
    uint64_t top = 0, t;

    uint64_t t0 = grant(c, "used");
    is_int(dlock_client_token_top(c, &top), 0, "token top of a directory without a floor");
    ok(top >= t0, "it bounds the last grant (%" PRIu64 " >= %" PRIu64 ")", top, t0);
    is_int((int)floor_in(fdir), 0, "token_top wrote no floor file");

    /* A lock file's token far above the clock (raised from another store). */
    uint64_t big = 4000000000000000000ull;
    is_int(dlock_acquire(c, "raised", NULL, &l), 0, "acquire 'raised'");
    is_int(dlock_lock_raise_token(l, big), 0, "raise its token to 4e18");
    dlock_release(l);
    is_int(dlock_client_token_top(c, &top), 0, "token top again");
    ok(top >= big, "the top bounds every lock file's token (%" PRIu64 ")", top);
    ok(grant(c, "used") < big, "another name's tokens are not raised by it");

    /* The floor: in the directory's .dlock-floor, read by every grant. */
    uint64_t floor = big + 1000000;
    is_int(dlock_client_raise_floor(c, floor), 0, "raise the floor (%s)", dlock_errmsg(c));
    ok(floor_in(fdir) == (int64_t)floor, "the floor is in .dlock-floor as 20 digits");
    dlock_client *d = open_ok(furi); /* a new client: only the file tells */
    t = grant(d, "fresh");
    ok(t == floor + 1, "a new name starts above the floor (%" PRIu64 ")", t);
    t = grant(d, "used");
    ok(t == floor + 1, "a used name too (%" PRIu64 ")", t);
    t = grant(d, "used");
    ok(t == floor + 2, "then counts on from there (%" PRIu64 ")", t);
    t = grant(d, "raised");
    ok(t == floor + 1, "a raised name's own counter below the floor: "
       "the floor wins (%" PRIu64 ")", t);
    is_int(dlock_client_raise_floor(d, 5), 0, "a lower floor → 0");
    ok(floor_in(fdir) == (int64_t)floor, "and the floor file is unchanged");
    is_int(dlock_client_token_top(d, &top), 0, "token top with a floor");
    ok(top >= floor + 2, "it bounds the floor and the grants (%" PRIu64 ")", top);

    /* A lock named like the floor file cannot be it: names never encode to
     * a leading '.'. */
    t = grant(d, ".dlock-floor");
    ok(t == floor + 1,
       "a lock named .dlock-floor has its own file (%" PRIu64 ")", t);
    ok(floor_in(fdir) == (int64_t)floor, "and leaves the floor alone");

    /* A lock file's token above the floor keeps counting from itself. */
    is_int(dlock_acquire(d, "raised", NULL, &l), 0, "acquire 'raised' again");
    is_int(dlock_lock_raise_token(l, floor + 500), 0, "raise it above the floor");
    dlock_release(l);
    t = grant(c, "raised");
    ok(t == floor + 501, "its next token is above its own counter "
       "(%" PRIu64 ")", t);

    /* Concurrent raises never lower it: children race with shuffled values.
     * Each reports its success on a pipe, not in its exit status, which
     * valgrind may set for the parent's memory a child exits with. */
    enum { KIDS = 8, EACH = 40 };
    pid_t pids[KIDS];
    int okp[2];
    if (pipe(okp) != 0)
        exit(1);
    for (int k = 0; k < KIDS; k++) {
        if ((pids[k] = fork()) == 0) {
            dlock_client *e = NULL;
            close(okp[0]);
            if (dlock_client_open(furi, &e) != 0) {
                fprintf(stderr, "# child %d: open: %s\n", k, dlock_errmsg(e));
                _exit(2);
            }
            for (int i = 0; i < EACH; i++) {
                uint64_t v = floor + 1 + (uint64_t)((i * 7 + k * 13) % (KIDS * EACH));
                if (dlock_client_raise_floor(e, v) != 0) {
                    fprintf(stderr, "# child %d: raise_floor: %s\n", k, dlock_errmsg(e));
                    _exit(3);
                }
            }
            dlock_client_close(e);
            _exit(write(okp[1], "k", 1) == 1 ? 0 : 4);
        }
    }
    close(okp[1]);
    for (int k = 0; k < KIDS; k++)
        waitpid(pids[k], NULL, 0);
    char oks[KIDS + 1];
    ssize_t got = 0, r;
    while ((r = read(okp[0], oks + got, sizeof oks - (size_t)got)) > 0)
        got += r;
    close(okp[0]);
    int failed = KIDS - (int)got;
    is_int(failed, 0, "%d processes raising the floor at once all succeed", KIDS);
    int64_t want = 0;
    for (int k = 0; k < KIDS; k++)
        for (int i = 0; i < EACH; i++) {
            int64_t v = (int64_t)floor + 1 + (i * 7 + k * 13) % (KIDS * EACH);
            want = v > want ? v : want;
        }
    ok(floor_in(fdir) == want, "the floor is the largest of them (%" PRId64 ", want %" PRId64 ")",
       floor_in(fdir), want);

    /* Existing directories: an empty floor file (crash before its write)
     * is floor 0; a malformed one fails grants, never lowers tokens. */
    snprintf(path, sizeof path, "%s/.dlock-floor", fdir);
    FILE *f = fopen(path, "w");
    fputs("garbage\n", f);
    fclose(f);
    is_int(dlock_acquire(c, "used", NULL, &l), DLOCK_EPROTO, "a malformed floor → DLOCK_EPROTO");
    ok(strstr(dlock_errmsg(c), ".dlock-floor") != NULL, "naming the file: %s", dlock_errmsg(c));
    is_int(dlock_client_raise_floor(c, floor), DLOCK_EPROTO, "raise_floor does not overwrite it");
    f = fopen(path, "w");
    fclose(f);
    t = grant(c, "used");
    ok(t == floor + 3, "an empty floor file is no floor: the used name counts on (%" PRIu64 ")", t);
    t = grant(c, "fresh2");
    ok(t < floor, "and a new name starts from the clock (%" PRIu64 ")", t);
    is_int(dlock_client_raise_floor(c, floor), 0, "raise_floor fills an empty file");
    ok(floor_in(fdir) == (int64_t)floor, "with the floor");
    unlink(path);
    ok(grant(c, "fresh3") < floor, "no floor file: no floor");
    dlock_client_close(c);
    dlock_client_close(d);
}

static int inspected(dlock_client *c, const char *name, dlock_info *i)
{
    int rc = dlock_inspect(c, name, i);
    if (rc)
        diag("inspect %s: %s", name, dlock_errmsg(c));
    return rc == 0;
}

static int lock_file_exists(const char *d, const char *name)
{
    char fname[DLOCK_FILE_ENCODED_MAX + 80], path[512];
    struct stat st;
    dlock_file_encode_name(name, strlen(name), fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", d, fname);
    return lstat(path, &st) == 0;
}

/* Writes `text` as name's lock file (a crash's or someone else's file). */
static void put_lock_file(const char *name, const char *text)
{
    char fname[DLOCK_FILE_ENCODED_MAX + 80], path[512];
    dlock_file_encode_name(name, strlen(name), fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    FILE *f = fopen(path, "w");
    if (!f)
        abort();
    fputs(text, f);
    fclose(f);
}

/* A child that takes name (wait: forever) and reports the token on `out`,
 * then holds until killed. */
static pid_t child_acquire(const char *name, int out)
{
    pid_t pid = fork();
    if (pid == 0) {
        dlock_client *c = NULL;
        dlock_lock *l = NULL;
        uint64_t t = 0;
        if (dlock_client_open(uri, &c) == 0 && dlock_acquire(c, name, NULL, &l) == 0)
            t = dlock_lock_token(l);
        if (write(out, &t, sizeof t) != sizeof t)
            _exit(1);
        pause();
        _exit(0);
    }
    return pid;
}

/* Inspect reads the lock file without creating or locking anything: the
 * OFD lock state (this process's other descriptions included), the token
 * and owner a grant wrote; no waiters, no lease. */
static void test_inspect(void)
{
    dlock_client *a = open_ok(uri), *b = open_ok(uri);
    dlock_lock *l = NULL, *x = NULL;
    dlock_info i;
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = DLOCK_WAIT_TRY;

    ok(inspected(b, "insp/never", &i) && !i.held, "a name never taken: free");
    is_int(i.known, DLOCK_KNOWS_HELD | DLOCK_KNOWS_LAST_TOKEN, "held and last token known");
    ok(i.last_token == 0, "no token granted yet");
    ok(!lock_file_exists(dir, "insp/never"), "and inspecting created no lock file");
    char sub[128], suburi[160];
    snprintf(sub, sizeof sub, "%s/inspect-only", dir);
    snprintf(suburi, sizeof suburi, "file://%s", sub);
    dlock_client *s = open_ok(suburi);
    ok(inspected(s, "x", &i) && !i.held, "in an empty directory too");
    ok(!lock_file_exists(sub, "x"), "which stays empty");
    dlock_client_close(s);

    /* Held by another client of this very process: OFD locks see it. */
    is_int(dlock_acquire(a, "insp/held", NULL, &l), 0, "held by another client here");
    ok(inspected(b, "insp/held", &i) && i.held, "held");
    is_int(i.known, DLOCK_KNOWS_HELD | DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER |
           DLOCK_KNOWS_LAST_TOKEN, "token, owner and last token; no lease, no waiters");
    ok(i.token == dlock_lock_token(l) && i.last_token == i.token, "the holder's token");
    is_str(i.owner, dlock_lock_owner(l), "the holder's owner id, from the file");
    ok(inspected(a, "insp/held", &i) && i.held, "the holder's own client sees it held too");

    /* A waiter blocked in the kernel is not seen, nor disturbed. */
    int fds[2];
    if (pipe(fds) < 0)
        abort();
    pid_t w = child_acquire("insp/held", fds[1]);
    nanosleep(&(struct timespec){0, 200000000L}, NULL); /* it blocks in the kernel */
    ok(inspected(b, "insp/held", &i) && !(i.known & DLOCK_KNOWS_WAITERS) && i.waiters == 0 &&
       i.listed == 0, "a blocked waiter: waiters unknown, none made up");
    uint64_t t1 = dlock_lock_token(l), t2 = 0;
    char first[33];
    snprintf(first, sizeof first, "%s", dlock_lock_owner(l));
    is_int(dlock_release(l), 0, "release");
    if (read(fds[0], &t2, sizeof t2) != sizeof t2)
        diag("no token from the waiter");
    ok(t2 == t1 + 1, "the waiter got it next (%" PRIu64 ")", t2);
    ok(inspected(b, "insp/held", &i) && i.held && i.token == t2, "held by the waiter now");
    ok(strlen(i.owner) == 32 && strcmp(i.owner, first) != 0, "its owner: %s (not %s)", i.owner,
       first);
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    ok(inspected(b, "insp/held", &i) && !i.held, "its process killed: free at once");
    is_int(i.known, DLOCK_KNOWS_HELD | DLOCK_KNOWS_LAST_TOKEN, "free: held and last token only");
    ok(i.last_token == t2 && i.token == 0 && !i.owner[0], "the last token is the dead holder's");
    is_int(dlock_acquire(a, "insp/held", &o, &x), 0, "nothing inspected got in the way");
    ok(dlock_lock_token(x) == t2 + 1, "and tokens count on");
    dlock_release(x);
    close(fds[0]);
    close(fds[1]);

    /* Raised: the first line holds the raised value, which granted nothing:
     * inspect reports the grant's token (grant= on the owner line). */
    is_int(dlock_acquire(a, "insp/raised", NULL, &l), 0, "acquire 'insp/raised'");
    uint64_t granted = l ? dlock_lock_token(l) : 0, big = granted + 1000;
    is_int(l ? dlock_lock_raise_token(l, big) : -1, 0, "raise it by 1000");
    int seen = inspected(b, "insp/raised", &i);
    ok(seen && i.held && i.token == granted && i.last_token == granted,
       "after a raise, still the grant's token (%" PRIu64 ", granted %" PRIu64 ")", i.token,
       granted);
    is_str(i.owner, l ? dlock_lock_owner(l) : "", "the owner line stays");
    dlock_release(l);
    ok(inspected(b, "insp/raised", &i) && !i.held && i.last_token == granted,
       "free: the last token granted is the grant's, not the raise");
    is_int(dlock_acquire(a, "insp/raised", NULL, &l), 0, "acquire it again");
    ok(l && dlock_lock_token(l) == big + 1, "its token is above the raise (%" PRIu64 ")",
       l ? dlock_lock_token(l) : 0);
    ok(inspected(b, "insp/raised", &i) && i.token == big + 1, "and inspect says so");
    dlock_release(l);
    put_lock_file("insp/old", "00000000000000000042\nowner=0123456789abcdef0123456789abcdef pid=        12\n");
    ok(inspected(b, "insp/old", &i) && i.last_token == 42,
       "a file written before grant= was recorded: the first line");

    /* Files dlock did not finish or did not write. */
    put_lock_file("insp/empty", "");
    ok(inspected(b, "insp/empty", &i) && !i.held, "an empty lock file (a crash): free");
    is_int(i.known, DLOCK_KNOWS_HELD, "no token, so no last token either");
    put_lock_file("insp/foreign", "hello\n");
    ok(inspected(b, "insp/foreign", &i) && !i.held, "a file that is not dlock's: free");
    is_int(i.known, DLOCK_KNOWS_HELD, "and nothing else told");
    put_lock_file("insp/old", "00000000000000000042\n");
    ok(inspected(b, "insp/old", &i) && i.known == (DLOCK_KNOWS_HELD | DLOCK_KNOWS_LAST_TOKEN) &&
       i.last_token == 42, "a token line without an owner line: its token");
    char fname[DLOCK_FILE_ENCODED_MAX + 80], path[512];
    dlock_file_encode_name("insp/fifo", 9, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    if (mkfifo(path, 0600) < 0)
        diag("mkfifo failed");
    is_int(dlock_inspect(b, "insp/fifo", &i), DLOCK_EPROTO,
           "a FIFO in the lock file's place → DLOCK_EPROTO, without hanging");
    ok(strstr(dlock_errmsg(b), "regular file") != NULL, "saying why: %s", dlock_errmsg(b));
    dlock_client_close(a);
    dlock_client_close(b);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dlock-test-file-%d", (int)getpid());
    snprintf(uri, sizeof uri, "file://%s", dir);
    mkdir(dir, 0700);
    test_uris();
    test_token_file();
    test_fork_and_removal();
    test_store_floor();
    test_inspect();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    return done_testing();
}
