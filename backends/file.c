/*
 * file:///absolute/dir: local lock files, the embedded default.
 *
 * One file per lock name in the directory, locked whole with an
 * open-file-description lock (F_OFD_SETLK/F_OFD_SETLKW). The kernel
 * releases it when the holder closes the file or dies, and wakes the next
 * waiter itself: since Linux 5.0 blocked requests queue behind one another,
 * so a release wakes one waiter, in arrival order, however many wait. A
 * wait with a deadline or a cancel flag blocks in a helper thread, which
 * is cancelled (its request leaves the kernel's queue) to give up. The
 * woken waiter still has to take the lock, and a new arrival that asks in
 * that instant gets it first (barging): so no DLOCK_CAP_FIFO.
 *
 * The file holds the name's fencing token (20 decimal digits), bumped while
 * the lock is held, so it increases across processes and restarts. A file
 * with no token (new, or emptied by a crash without fsync=1) starts from
 * the wall clock in microseconds, so tokens stay above those handed out
 * before it was lost (unless the clock was set back meanwhile). Files
 * are never deleted: deleting a lock file races with a process that has
 * just opened it. A holder checks after locking that the file it locked is
 * still the one at the path.
 *
 * Store-wide tokens (dlock migrate): the directory's floor lives in the
 * file ".dlock-floor" (no lock file's name starts with '.'), 20 digits like
 * a lock file's token, and is only ever replaced whole (written to
 * ".dlock-floor.new", then renamed over it), so a reader sees the old floor
 * or the new one, never a torn one, and a crash mid-write leaves the old.
 * Every grant reads it while it holds the lock file's lock and takes
 * max(file's token or wall clock, floor) + 1: an openat() that fails while
 * no floor was ever set, three system calls once one is. raise_floor
 * read-modify-writes it under an exclusive lock of ".dlock-floor-writer"
 * (so concurrent calls never lower it), fdatasync'd (and the directory
 * fsync'd) with fsync=1, as the tokens are. token_top is max(wall clock,
 * every lock file's token, floor): it reads every *.lock file of the
 * directory without locking any, skipping those that hold no token.
 *
 * Inspect (dlock_inspect) creates nothing and takes no lock: it opens the
 * lock file read-only (no O_CREAT; a name never taken has no file, so it is
 * free and its last token 0), asks the kernel with F_OFD_GETLK whether a
 * write lock on the whole file would conflict (the answer covers locks of
 * this process too: OFD locks belong to their open file description), and
 * reads the file's contents without locking it: the 20-digit token and the
 * "owner=<32 hex> pid=<pid>" line the grant wrote. The contents are read
 * before and after the F_OFD_GETLK and must agree, so the token, owner and
 * lock state go together. Held: the token and owner are the file's, and
 * so is the last token (held or not). What it cannot know: waiters (the
 * kernel queues blocked F_OFD_SETLKW requests but fcntl() has no call that
 * counts or lists them); a lease (file locks have none: a holder holds
 * until it releases or dies); and for the few system calls between a new
 * holder's lock and its token write, the token and owner (the file then
 * still shows the previous grant's). The token and last token are the
 * grant= the grant wrote on its owner line (files written before it: the
 * first line). After dlock_lock_raise_token() the first line holds the
 * raised value, which inspect does not take for a grant (on a list of
 * stores, the file's own grant is reported, not the list's token).
 *
 * Shared locks and semaphores (docs/file.md): readers and permits hold the
 * lock file whole with a read lock (so a writer, and a client of the
 * previous release, excludes them and is excluded), and a side file
 * ".<lock file>.modes" whose high bytes are locks: a gate (a write lock
 * taken before the lock file and kept by a waiter until its grant: a
 * writer waiting for readers holds back the readers behind it, which the
 * kernel alone would not), a token byte (a grant or raise that shares the
 * lock file rewrites the token under it), one mark per kind (read-locked
 * by every request of a read-write lock, or of a semaphore of N, waiting
 * or holding: another kind's mark is DLOCK_EMODE at once), and a slot per
 * holder (a permit takes one of N; a reader any), whose record (token,
 * owner, mode, limit) inspect_holders lists while the slot is held. A
 * permit's waiter, holding the gate, looks at the slots again on every
 * close of the side file (inotify: a release closes it) and at least
 * every 50 ms. An exclusive request that finds the lock file free takes it
 * alone, as before. All of it is the holder's open file descriptions: a
 * dead holder's locks go at once.
 *
 * Names' files and what a lock file tells without locking it (inspect):
 * backends/file_look.c. Elections (the leader's value file beside the lock
 * file, the observers' watch: inotify, the holder's pidfd): backends/
 * file_elect.c, and docs/file.md "Elections".
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "backends/file.h"
#include "backends/file_int.h"

/* The directory's token floor: a leading '.' never starts an encoded name. */
#define FLOOR_FILE ".dlock-floor"
#define FLOOR_NEW ".dlock-floor.new"
#define FLOOR_WRITER ".dlock-floor-writer"


static const char *const file_schemes[] = {"file", NULL};
static const char *const file_options[] = {"fsync", "layout", NULL};
/* Lock files have one layout, dlock's own: the option is there so that a
 * URI naming it (as lists of stores across backends do) is accepted, and
 * any other value refused. */
static const char *const file_layouts[] = {"dlock", NULL};

/* mkdir -p with 0700 for every directory we create. */
static int make_dirs(dlock_client *c, const char *path)
{
    char *p = strdup(path);
    if (!p)
        return DLOCK_ENOMEM;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, 0700) < 0 && errno != EEXIST) {
            int e = errno;
            int rc = dlock_seterr(c, DLOCK_EIO, "cannot create directory '%.150s': %s", p,
                                  strerror(e));
            free(p);
            return rc;
        }
        *s = saved;
        if (saved == '\0')
            break;
    }
    free(p);
    return 0;
}

static int file_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    const char *path = dlock_uri_path(uri);
    struct file_conn *fc;
    int fsync_tokens = 0, layout = 0, rc;

    if (dlock_uri_user(uri) || dlock_uri_password(uri)) /* password_file= gives no user */
        return dlock_seterr(c, DLOCK_EBADURI, "file:// URIs take no user or password");
    if (dlock_uri_host_count(uri) > 1 ||
        (dlock_uri_host_count(uri) == 1 &&
         (strcmp(dlock_uri_host(uri, 0), "localhost") != 0 || dlock_uri_port(uri, 0))))
        return dlock_seterr(c, DLOCK_EBADURI,
                            "file:// URIs name a local directory: use file:///absolute/dir");
    if (path[0] != '/' || path[1] == '\0')
        return dlock_seterr(c, DLOCK_EBADURI,
                            "file:// URI needs an absolute directory, as in file:///run/myapp/locks");
    if ((rc = dlock_uri_param_bool(c, uri, "fsync", &fsync_tokens)) != 0 ||
        (rc = dlock_uri_param_choice(c, uri, "layout", file_layouts, &layout)) != 0)
        return rc;
    if ((rc = make_dirs(c, path)) != 0)
        return rc;
    fc = calloc(1, sizeof *fc);
    if (!fc || !(fc->dir = strdup(path))) {
        free(fc);
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    }
    fc->fsync = fsync_tokens;
    fc->ifd = -1;
    pthread_mutex_init(&fc->mu, NULL);
    fc->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fc->dirfd < 0) {
        int e = errno;
        free(fc->dir);
        free(fc);
        return dlock_seterr(c, e == ENOTDIR ? DLOCK_EBADURI : DLOCK_EIO,
                            "cannot open lock directory '%.150s': %s", path, strerror(e));
    }
    *connp = &fc->base;
    return 0;
}

static void file_close(dlock_conn *conn)
{
    struct file_conn *fc = (struct file_conn *)conn;
    close(fc->dirfd);
    if (fc->ifd >= 0)
        close(fc->ifd);
    pthread_mutex_destroy(&fc->mu);
    free(fc->dir);
    free(fc);
}

static void whole_file(struct flock *fl)
{
    memset(fl, 0, sizeof *fl);
    fl->l_type = F_WRLCK;
    fl->l_whence = SEEK_SET;
}

/* A blocked F_OFD_SETLKW has no timeout of its own and cannot watch a
 * descriptor, so a wait with a deadline or a cancel flag runs it in a
 * helper thread and cancels that thread (fcntl with a waiting command is a
 * cancellation point) when the deadline passes or the flag is raised. The
 * thread says it is done on an eventfd, polled beside the flag's. */
struct waiter {
    int fd, donefd;
    int done, err;
    struct flock fl; /* not on waiter_main's stack: see there */
    pthread_mutex_t mu;
};

static void *waiter_main(void *arg)
{
    /* No local of this function has its address taken: a thread cancelled
     * in fcntl() is unwound without AddressSanitizer unpoisoning its
     * frame's redzones, which it would then report at the thread's exit. */
    struct waiter *w = arg;
    int r;
    do
        r = fcntl(w->fd, F_OFD_SETLKW, &w->fl);
    while (r < 0 && errno == EINTR);
    int e = r < 0 ? errno : 0;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->err = e;
    pthread_mutex_unlock(&w->mu);
    static const uint64_t one = 1;
    if (write(w->donefd, &one, sizeof one) < 0)
        abort(); /* an eventfd written once cannot refuse */
    return NULL;
}

/* Returns 0 once locked, DLOCK_ETIMEDOUT (deadline_ns passed; UINT64_MAX:
 * none), DLOCK_ECANCELED (cancel_fd fired), DLOCK_EINTR (a signal, without
 * deadline), or an errno-derived failure in
 * *sys_errno (with DLOCK_EIO). On timeout or cancel the caller must close
 * fd: that drops a lock granted in the instant the thread was cancelled. */
static int wait_until(int fd, const struct flock *fl, uint64_t deadline_ns, int cancel_fd,
                      int *sys_errno)
{
    struct waiter w = {.fd = fd, .fl = *fl};
    pthread_t th;
    int done, err, r, cancelled = 0, perr = 0, interrupted = 0;

    if ((w.donefd = eventfd(0, EFD_CLOEXEC)) < 0) {
        *sys_errno = errno;
        return DLOCK_EIO;
    }
    pthread_mutex_init(&w.mu, NULL);
    /* The helper thread takes no signal, so that a signal to the process
     * reaches the waiting thread, whose ppoll() it interrupts, not the
     * helper, whose fcntl() would only retry. */
    r = dlock_thread_start(&th, 0, waiter_main, &w);
    if (r != 0) {
        pthread_mutex_destroy(&w.mu);
        close(w.donefd);
        *sys_errno = r;
        return DLOCK_EIO;
    }
    struct pollfd p = {.fd = w.donefd, .events = POLLIN};
    /* A signal ends a wait without deadline, as a plain F_OFD_SETLKW's
     * EINTR does; a deadline wait goes on (it always has). */
    int n = dlock_poll_until(&p, 1, cancel_fd, deadline_ns,
                             deadline_ns == UINT64_MAX ? DLOCK_POLL_INTR : 0);
    if (n == DLOCK_POLL_SIGNAL) {
        /* A handler that raised the flag makes it a cancel. */
        interrupted = 1;
        n = dlock_fd_cancelled(cancel_fd) ? DLOCK_POLL_CANCEL : 0;
    }
    /* done, cancelled, timed out, or poll failed */
    perr = n == DLOCK_POLL_ERROR ? errno : 0;
    cancelled = n > 0 && (n & DLOCK_POLL_CANCEL) && !(n & DLOCK_POLL_READY);
    pthread_mutex_lock(&w.mu);
    done = w.done;
    err = w.err;
    pthread_mutex_unlock(&w.mu);
    if (!done)
        pthread_cancel(th);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&w.mu);
    close(w.donefd);
    if (!done && perr) {
        *sys_errno = perr;
        return DLOCK_EIO;
    }
    if (!done)
        return cancelled ? DLOCK_ECANCELED : interrupted ? DLOCK_EINTR : DLOCK_ETIMEDOUT;
    *sys_errno = err;
    return err ? DLOCK_EIO : 0;
}

/* Takes the lock fl describes on fd (the lock file whole, or a byte of the
 * side file), waiting as req says. */
static int lock_fd(dlock_client *c, int fd, const dlock_request *req, struct flock *want)
{
    struct flock fl = *want;
    int e = 0, rc;
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
        return 0;
    if (errno != EAGAIN && errno != EACCES) {
        e = errno;
        goto syserr;
    }
    switch (req->wait) {
    case DLOCK_WAIT_TRY:
        return dlock_seterr(c, DLOCK_EBUSY, "the lock is held by another owner");
    case DLOCK_WAIT_FOREVER:
        if (req->cancel_fd >= 0)
            goto helper;
        if (fcntl(fd, F_OFD_SETLKW, &fl) == 0)
            return 0;
        e = errno;
        if (e == EINTR)
            return dlock_seterr(c, DLOCK_EINTR, "a signal interrupted the wait");
        goto syserr;
    case DLOCK_WAIT_DEADLINE:
    helper:
        rc = wait_until(fd, want, req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns : UINT64_MAX,
                        req->cancel_fd, &e);
        if (rc == DLOCK_ECANCELED)
            return dlock_cancelled(c);
        if (rc == DLOCK_EINTR)
            return dlock_seterr(c, DLOCK_EINTR, "a signal interrupted the wait");
        if (rc == DLOCK_ETIMEDOUT)
            return dlock_seterr(c, rc, "the deadline passed with the lock still held elsewhere");
        if (rc == 0)
            return 0;
        goto syserr;
    }
    return dlock_seterr(c, DLOCK_EINVAL, "unknown wait mode");
syserr:
    if (e == EDEADLK)
        return dlock_seterr(c, DLOCK_EDEADLK, "the kernel detected a deadlock");
    if (e == ENOLCK)
        return dlock_seterr(c, DLOCK_ENOMEM, "the kernel has no lock records left");
    return dlock_seterr(c, DLOCK_EIO, "fcntl lock on the lock file failed: %s", strerror(e));
}

/* The first token of a name: microseconds since the epoch. */
static uint64_t token_floor(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The token at the start of fd's file: 0, -1 when the read fails (errno),
 * 1 when the file does not start with one. *emptyp: the file is empty. */
static int pread_token(int fd, uint64_t *tokenp, int *emptyp)
{
    char buf[TOKEN_DIGITS + 2];
    uint64_t token = 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n < 0)
        return -1;
    if (n > 0) {
        int i;
        for (i = 0; i < TOKEN_DIGITS && i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
            token = token * 10 + (uint64_t)(buf[i] - '0');
        if (i != TOKEN_DIGITS || n <= TOKEN_DIGITS || buf[TOKEN_DIGITS] != '\n')
            return 1;
    }
    *tokenp = token;
    *emptyp = n == 0;
    return 0;
}

/* The lock file's token (*emptyp: the file holds none yet). */
static int read_token(dlock_client *c, int fd, uint64_t *tokenp, int *emptyp)
{
    int r = pread_token(fd, tokenp, emptyp);
    if (r < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot read the lock file: %s", strerror(errno));
    if (r > 0)
        return dlock_seterr(c, DLOCK_EPROTO, "the lock file does not start with a %d-digit token",
                            TOKEN_DIGITS);
    return 0;
}

/* Takes (type F_WRLCK) or drops (F_UNLCK) the floor writers' lock on fd,
 * waiting for it. Held only around a read-modify-write of the floor. */
static int floor_lock(dlock_client *c, int fd, short type)
{
    struct flock fl;
    int r;
    whole_file(&fl);
    fl.l_type = type;
    do
        r = fcntl(fd, type == F_UNLCK ? F_OFD_SETLK : F_OFD_SETLKW, &fl);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot lock " FLOOR_WRITER ": %s", strerror(errno));
    return 0;
}

/* pread_token()'s result r on the floor file, as a dlock code. */
static int floor_read_error(struct file_conn *fc, int r)
{
    if (r < 0)
        return dlock_seterr(fc->base.client, DLOCK_EIO, "cannot read the token floor file "
                            FLOOR_FILE " in '%.150s': %s", fc->dir, strerror(errno));
    if (r > 0)
        return dlock_seterr(fc->base.client, DLOCK_EPROTO, "the token floor file " FLOOR_FILE
                            " in '%.150s' does not start with a %d-digit token", fc->dir,
                            TOKEN_DIGITS);
    return 0;
}

/* The directory's token floor: 0 when none was ever set. The file is only
 * ever replaced whole, so no lock is needed. */
static int read_floor(struct file_conn *fc, uint64_t *floorp)
{
    dlock_client *c = fc->base.client;
    uint64_t floor = 0;
    int empty, rc;
    int fd = openat(fc->dirfd, FLOOR_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) {
            *floorp = 0;
            return 0;
        }
        return dlock_seterr(c, DLOCK_EIO, "cannot open the token floor file " FLOOR_FILE
                            " in '%.150s': %s", fc->dir, strerror(errno));
    }
    rc = floor_read_error(fc, pread_token(fd, &floor, &empty));
    close(fd);
    *floorp = floor;
    return rc;
}

static int bump_token(struct file_conn *fc, int fd, const dlock_request *req,
                      uint64_t *tokenp)
{
    dlock_client *c = fc->base.client;
    char buf[128];
    uint64_t token, floor;
    int empty, rc;
    if ((rc = read_token(c, fd, &token, &empty)) != 0 || (rc = read_floor(fc, &floor)) != 0)
        return rc;
    if (empty)
        token = token_floor();
    if (token < floor)
        token = floor;
    if (token == UINT64_MAX)
        return dlock_seterr(c, DLOCK_EPROTO, "the fencing token is exhausted");
    token++;
    /* The first line is the name's counter (a raise moves it); grant= keeps
     * what this grant was given, for inspect. */
    int len = snprintf(buf, sizeof buf, "%020" PRIu64 "\nowner=%s pid=%10ld grant=%020" PRIu64 "\n",
                       token, req->owner_hex, (long)getpid(), token);
    if (pwrite(fd, buf, (size_t)len, 0) != len)
        return dlock_seterr(c, DLOCK_EIO, "cannot write the fencing token: %s", strerror(errno));
    if (fc->fsync && fdatasync(fd) < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot sync the fencing token: %s", strerror(errno));
    *tokenp = token;
    return 0;
}

static int open_lock_file(struct file_conn *fc, const char *fname)
{
    int fd = openat(fc->dirfd, fname, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        dlock_seterr(fc->base.client, DLOCK_EIO, "cannot open lock file in '%.150s': %s", fc->dir,
                     strerror(errno));
    return fd;
}

/*
 * An exclusive request first tries the lock file alone, as the previous
 * release did: granted, it needs nothing else (its write lock tells its
 * kind, and a waiter that holds the gate waits for a holder, so the lock
 * file is not free then). Otherwise, and for readers and permits: the
 * kind's mark; the gate, which a waiter keeps until its grant, so that
 * requests pass in arrival order (a writer waiting for readers holds back
 * the readers behind it); a permit's slot, or a reader's; the lock file.
 */
static int file_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct file_conn *fc = (struct file_conn *)conn;
    dlock_client *c = conn->client;
    char fname[DLOCK_FILE_ENCODED_MAX + 80], sname[DLOCK_FILE_ENCODED_MAX + 96];
    struct file_held *h;
    struct flock fl;
    uint64_t token = 0;
    off_t slot = -1;
    int fd, side = -1, rc;
    int shares = req->mode == DLOCK_MODE_SHARED || req->limit;

    if ((rc = dlock_file_encode_name(req->name, req->name_len, fname, sizeof fname)) != 0 ||
        (rc = dlock_file_side_name(fname, sname, sizeof sname)) != 0)
        return dlock_seterr(c, rc, "cannot encode the lock name");
    if ((fd = open_lock_file(fc, fname)) < 0)
        return DLOCK_EIO;
    whole_file(&fl);
    if (!shares && fcntl(fd, F_OFD_SETLK, &fl) == 0) {
        if (dlock_file_still_linked(fc->dirfd, fname, fd))
            goto granted;
        close(fd); /* someone removed or replaced the file: lock the new one */
        if ((fd = open_lock_file(fc, fname)) < 0)
            return DLOCK_EIO;
    }
again:
    side = openat(fc->dirfd, sname, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (side < 0) {
        rc = dlock_seterr(c, DLOCK_EIO, "cannot open lock file in '%.150s': %s", fc->dir,
                          strerror(errno));
        goto fail;
    }
    if ((rc = dlock_file_mark_kind(c, side, fd, req)) != 0)
        goto fail;
    dlock_file_gate(&fl);
    if ((rc = lock_fd(c, side, req, &fl)) != 0)
        goto fail;
    if (!dlock_file_still_linked(fc->dirfd, sname, side)) {
        dlock_file_side_close(side); /* removed or replaced: the new one's gate */
        goto again;
    }
    if (req->limit)
        rc = dlock_file_wait_permit(fc, side, sname, req, &slot);
    else if (shares && (rc = dlock_file_take_slot(c, side, SLOT_MAX, &slot)) == DLOCK_EBUSY)
        rc = dlock_seterr(c, DLOCK_EIO, "no free holder slot in the lock's side file");
    if (rc)
        goto fail;
    whole_file(&fl);
    if (shares)
        fl.l_type = F_RDLCK;
    for (;;) {
        if ((rc = lock_fd(c, fd, req, &fl)) != 0)
            goto fail;
        if (dlock_file_still_linked(fc->dirfd, fname, fd))
            break;
        close(fd); /* someone removed or replaced the file: lock the new one */
        if ((fd = open_lock_file(fc, fname)) < 0) {
            rc = DLOCK_EIO;
            goto fail;
        }
    }
    /* Holders that share the lock file bump its token one at a time (the
     * gate orders grants; the token byte keeps a raise out). */
    if (shares && (rc = dlock_file_token_lock(c, side, F_WRLCK, GATE_OFF)) != 0)
        goto fail;
granted:
    rc = bump_token(fc, fd, req, &token);
    if (rc == 0 && shares)
        rc = dlock_file_write_record(c, side, slot, req, token);
    if (rc == 0 && !(h = calloc(1, sizeof *h)))
        rc = dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    if (rc)
        goto fail;
    if (shares) {
        dlock_file_token_lock(c, side, F_UNLCK, GATE_OFF); /* the gate and the token byte */
    } else {
        dlock_file_side_close(side); /* the lock file's write lock tells the kind */
        side = -1;
    }
    h->base.token = token;
    h->fd = fd;
    h->side = side;
    h->slot = slot;
    h->name = req->name;
    memcpy(h->owner, req->owner, sizeof h->owner);
    h->name_len = req->name_len;
    *heldp = &h->base;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    dlock_file_side_close(side);
    return rc;
}

static int file_release(dlock_conn *conn, dlock_held *held)
{
    struct file_held *h = (struct file_held *)held;
    struct flock fl;
    int rc = dlock_file_check_held(conn, h);
    /* Unlock explicitly: a child forked while we held the lock shares the
     * open file description, and close() alone would leave it locked. */
    whole_file(&fl);
    fl.l_type = F_UNLCK;
    if (fcntl(h->fd, F_OFD_SETLK, &fl) < 0 && rc == 0)
        rc = dlock_seterr(conn->client, DLOCK_EIO, "cannot unlock the lock file: %s",
                          strerror(errno));
    close(h->fd);
    if (h->side >= 0) {
        /* The record goes before the slot is free: only a holder that died
         * leaves one, and inspect counts only those whose slot is held. */
        int r = dlock_file_clear_record(conn->client, h->side, h->slot);
        if (rc == 0)
            rc = r;
        dlock_file_side_close(h->side);
    }
    free(h);
    return rc;
}

/* File locks have no lease: renew only confirms the lock is still held.
 * Two stat calls on descriptors nobody closes while the lock is held, so
 * the keeper may run it beside any other call (no shared state changes). */
static int file_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    (void)ttl_ms;
    return dlock_file_check_held(conn, (struct file_held *)held);
}

/* Raises the token in the file we hold: the next holder bumps it from
 * there. Only the digits are rewritten; the owner line stays. */
static int file_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    struct file_conn *fc = (struct file_conn *)conn;
    struct file_held *h = (struct file_held *)held;
    char digits[TOKEN_DIGITS + 2];
    uint64_t token;
    int empty, rc;
    if ((rc = dlock_file_check_held(conn, h)) != 0)
        return rc;
    /* A reader or a permit shares the lock file: one token change at a time. */
    if (h->side >= 0 &&
        (rc = dlock_file_token_lock(conn->client, h->side, F_WRLCK, TOKEN_OFF)) != 0)
        return rc;
    if ((rc = read_token(conn->client, h->fd, &token, &empty)) == 0 && token < floor) {
        snprintf(digits, sizeof digits, "%020" PRIu64 "\n", floor);
        if (pwrite(h->fd, digits, TOKEN_DIGITS + 1, 0) != TOKEN_DIGITS + 1)
            rc = dlock_seterr(conn->client, DLOCK_EIO, "cannot write the fencing token: %s",
                              strerror(errno));
        else if (fc->fsync && fdatasync(h->fd) < 0)
            rc = dlock_seterr(conn->client, DLOCK_EIO, "cannot sync the fencing token: %s",
                              strerror(errno));
    }
    if (h->side >= 0)
        dlock_file_token_lock(conn->client, h->side, F_UNLCK, TOKEN_OFF);
    return rc;
}

/* A lock file's token, read without locking it: a holder may be rewriting
 * it, so two reads in a row must agree (a torn read could be lower than
 * both the old and the new token, or malformed for an instant). *emptyp: no
 * token yet (a grant still in progress). 0, -1 (errno), or 1: malformed. */
static int peek_token(int fd, uint64_t *tokenp, int *emptyp)
{
    uint64_t a = 0, b = 0;
    int ea = 0, eb = 0, ra, rb;
    if ((ra = pread_token(fd, &a, &ea)) < 0)
        return -1;
    for (int i = 0; i < 1000; i++) {
        if ((rb = pread_token(fd, &b, &eb)) < 0)
            return -1;
        if (ra == 0 && rb == 0 && a == b && ea == eb) {
            *tokenp = a;
            *emptyp = ea;
            return 0;
        }
        a = b, ea = eb, ra = rb;
    }
    return 1; /* malformed or changing all along */
}

static int is_lock_file(const char *leaf)
{
    size_t n = strlen(leaf);
    return leaf[0] != '.' && n > sizeof ".lock" - 1 &&
           strcmp(leaf + n - (sizeof ".lock" - 1), ".lock") == 0;
}

/* max(wall clock, floor, every lock file's token): a new file's first token
 * is the wall clock + 1 at its grant, so the clock now bounds those. */
static int file_token_top(dlock_conn *conn, uint64_t *top)
{
    struct file_conn *fc = (struct file_conn *)conn;
    dlock_client *c = conn->client;
    uint64_t best = token_floor(), floor;
    int rc, dfd;
    DIR *d;
    if ((rc = read_floor(fc, &floor)) != 0)
        return rc;
    if (floor > best)
        best = floor;
    if ((dfd = openat(fc->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        !(d = fdopendir(dfd))) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        return dlock_seterr(c, DLOCK_EIO, "cannot list the lock directory '%.150s': %s",
                            fc->dir, strerror(e));
    }
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno)
                rc = dlock_seterr(c, DLOCK_EIO, "cannot list the lock directory '%.150s': %s",
                                  fc->dir, strerror(errno));
            break;
        }
        if (!is_lock_file(de->d_name))
            continue;
        int fd = openat(fc->dirfd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) {
            if (errno == ENOENT)
                continue; /* removed since the listing: its tokens went with it */
            rc = dlock_seterr(c, DLOCK_EIO, "cannot open the lock file %.120s in '%.150s': %s",
                              de->d_name, fc->dir, strerror(errno));
            break;
        }
        struct stat st;
        uint64_t token = 0;
        int empty = 1;
        int r = 0;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
            r = peek_token(fd, &token, &empty);
        /* A file that holds no token (not dlock's, or damaged: its own
         * grants fail) has granted nothing the top must cover. */
        if (r < 0)
            rc = dlock_seterr(c, DLOCK_EIO, "cannot read the lock file %.120s in '%.150s': %s",
                              de->d_name, fc->dir, strerror(errno));
        close(fd);
        if (rc)
            break;
        if (!empty && token > best)
            best = token;
    }
    closedir(d);
    if (rc == 0)
        *top = best;
    return rc;
}

/* Raises the directory's floor to floor where it is below, under the floor
 * writers' lock (concurrent calls never lower it), by replacing the floor
 * file whole. */
static int file_raise_floor(dlock_conn *conn, uint64_t floor)
{
    struct file_conn *fc = (struct file_conn *)conn;
    dlock_client *c = conn->client;
    char digits[TOKEN_DIGITS + 2];
    uint64_t cur = 0;
    int rc;
    int wfd = openat(fc->dirfd, FLOOR_WRITER, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (wfd < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot open " FLOOR_WRITER " in '%.150s': %s", fc->dir,
                            strerror(errno));
    if ((rc = floor_lock(c, wfd, F_WRLCK)) != 0) {
        close(wfd);
        return rc;
    }
    if ((rc = read_floor(fc, &cur)) == 0 && cur < floor) {
        int fd = openat(fc->dirfd, FLOOR_NEW, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                        0600);
        snprintf(digits, sizeof digits, "%020" PRIu64 "\n", floor);
        if (fd < 0 || write(fd, digits, TOKEN_DIGITS + 1) != TOKEN_DIGITS + 1)
            rc = dlock_seterr(c, DLOCK_EIO, "cannot write " FLOOR_NEW " in '%.150s': %s", fc->dir,
                              strerror(errno));
        else if (fc->fsync && fdatasync(fd) < 0)
            rc = dlock_seterr(c, DLOCK_EIO, "cannot sync the token floor: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        if (rc == 0 && renameat(fc->dirfd, FLOOR_NEW, fc->dirfd, FLOOR_FILE) < 0)
            rc = dlock_seterr(c, DLOCK_EIO, "cannot rename " FLOOR_NEW " to " FLOOR_FILE
                              " in '%.150s': %s", fc->dir, strerror(errno));
        else if (rc == 0 && fc->fsync && fsync(fc->dirfd) < 0)
            rc = dlock_seterr(c, DLOCK_EIO, "cannot sync the token floor: %s", strerror(errno));
    }
    floor_lock(c, wfd, F_UNLCK);
    close(wfd);
    return rc;
}

static int file_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct dlock_file_look lk;
    return dlock_file_info((struct file_conn *)conn, name, len, info, &lk);
}

static int file_inspect_holders(dlock_conn *conn, const char *name, size_t len,
                                dlock_holder *holders, size_t capacity, size_t *count)
{
    struct dlock_file_look lk;
    dlock_holder *hs;
    size_t n;
    int rc = dlock_file_holders((struct file_conn *)conn, name, len, &lk, &hs, &n);
    if (rc)
        return rc;
    if (n && capacity) /* holders may be NULL with capacity 0, hs with n 0 */
        memcpy(holders, hs, (n < capacity ? n : capacity) * sizeof *hs);
    *count = n;
    free(hs);
    return 0;
}

const dlock_backend dlock_file_backend = {
    DLOCK_BACKEND_INIT,
    .name = "file",
    .schemes = file_schemes,
    .caps = DLOCK_CAP_FENCING | DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_HOLDER_DEATH |
            DLOCK_CAP_RAISE | DLOCK_CAP_CANCEL | DLOCK_CAP_SHARED | DLOCK_CAP_SEMAPHORE |
            DLOCK_CAP_ELECTION | DLOCK_CAP_WATCH,
    .options = file_options,
    .open = file_open,
    .close = file_close,
    .acquire = file_acquire,
    .release = file_release,
    .renew = file_renew,
    .keep = file_renew,
    .raise_token = file_raise_token,
    .token_top = file_token_top,
    .raise_floor = file_raise_floor,
    .inspect = file_inspect,
    .inspect_holders = file_inspect_holders,
    .publish = dlock_file_publish,
    .leader = dlock_file_leader,
    .wake = dlock_file_wake,
    .watch_open = dlock_file_watch_open,
    .watch_fd = dlock_file_watch_fd,
    .watch_read = dlock_file_watch_read,
    .watch_close = dlock_file_watch_close,
};
