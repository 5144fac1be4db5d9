/*
 * Elections on the file store (docs/file.md "Elections"). The leader is the
 * holder of the name's lock file; its value lives in the value file
 * ".<lock file>.leader" (a leading '.': token_top skips it), replaced whole
 * (the next value, written in ".<lock file>.leader.new", is exchanged with
 * it) so that a reader sees one value or the next, never a torn one. Its first line names the grant that wrote it:
 *     owner=<32 hex> grant=<20 digits> pid=<pid> len=<bytes>\n<value>
 * and leader() counts the value only while the lock file's holder is that
 * grant (same owner id and token): a dead or resigned leader's value is
 * never read as its successor's.
 *
 * The watch is one epoll descriptor over three:
 * - inotify on the lock file itself: a grant writes its record (IN_MODIFY),
 *   a release or a death closes a descriptor opened for writing
 *   (IN_CLOSE_WRITE), a publish or a wake touches its times (IN_ATTRIB), a
 *   removal or replacement changes its links (IN_ATTRIB, IN_MOVE_SELF);
 *   while the file does not exist, on the directory for its creation only
 *   (so an idle observer is not woken by other names);
 * - a pidfd of the holder's process (the pid= of the lock file's record):
 *   readable once it has exited, when the kernel has dropped its locks. A
 *   dying process's descriptors are closed (IN_CLOSE_WRITE) a moment before
 *   its locks go, and an OFD lock vanishes without a word of its own;
 * - a timerfd: one more look CLOSE_LOOK_MS after each close, for a holder
 *   whose pid the pidfd cannot follow (another pid namespace, a descriptor
 *   shared with a child).
 * Called by backends/file.c's vtable; calls backends/file_look.c and the
 * core.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "backends/file.h"
#include "backends/file_int.h"
#include "core/sha256.h"

#define VALUE_SUFFIX ".leader"
#define VALUE_NAME_MAX (DLOCK_FILE_ENCODED_MAX + 96)
/* "owner=" 32 " grant=" 20 " pid=" up to 10 " len=" up to 4 "\n" */
#define HEADER_MAX 96
#define CLOSE_LOOK_MS 20
#define FILE_EVENTS (IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF)
#define DIR_EVENTS (IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)

static int value_name(dlock_client *c, const char *name, size_t len, char *fname, size_t fsz,
                      char *vname, size_t vsz)
{
    int rc = dlock_file_encode_name(name, len, fname, fsz);
    if (rc == 0 && (size_t)snprintf(vname, vsz, ".%s" VALUE_SUFFIX, fname) >= vsz)
        rc = DLOCK_EINVAL;
    return rc ? dlock_seterr(c, rc, "cannot encode the lock name") : 0;
}

/* Puts the new value file tname at vname, leaving the old one at tname
 * (none when there was none, or with fsync=1).
 * An exchange, where it can: ext4 writes a file renamed over another out
 * at once (its auto_da_alloc), which costs a rename ten times as much. */
static int replace(struct file_conn *fc, const char *tname, const char *vname)
{
    if (!fc->fsync && renameat2(fc->dirfd, tname, fc->dirfd, vname, RENAME_EXCHANGE) == 0)
        return 0;
    /* No value file yet (ENOENT), no exchange on this file system
     * (EINVAL), or durable writes wanted: a rename. */
    if (renameat(fc->dirfd, tname, fc->dirfd, vname) == 0)
        return 0;
    return dlock_seterr(fc->base.client, DLOCK_EIO, "cannot rename the leader's value file in "
                        "'%.150s': %s", fc->dir, strerror(errno));
}

/* The next value, ".<lock file>.leader.new": one per name, kept (each
 * exchange leaves the old value there, to be written over next time:
 * creating a file costs a publish more than all the rest). A writer takes
 * its write lock, without waiting, and checks that it is still the file
 * at the name (an exchange moves the locked one away). Busy (another
 * thread's proclaim, or a deposed leader's): -1, and the caller writes a
 * file of its own. */
static int open_next(struct file_conn *fc, const char *tname)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    for (int tries = 0; tries < 3; tries++) {
        int fd = openat(fc->dirfd, tname, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
            return -1;
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0 && dlock_file_still_linked(fc->dirfd, tname, fd))
            return fd;
        close(fd);
    }
    return -1;
}

static int write_value(dlock_client *c, int fd, const char *buf, size_t total, int sync)
{
    size_t done = 0;
    while (done < total) {
        ssize_t w = pwrite(fd, buf + done, total - done, (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return dlock_seterr(c, DLOCK_EIO, "cannot write the leader's value file: %s",
                                w < 0 ? strerror(errno) : "short write");
        done += (size_t)w;
    }
    /* Never truncated to 0 first: ext4 writes such a file out at its close. */
    if (ftruncate(fd, (off_t)total) < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot write the leader's value file: %s",
                            strerror(errno));
    if (sync && fdatasync(fd) < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot sync the leader's value file: %s",
                            strerror(errno));
    return 0;
}

int dlock_file_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len)
{
    struct file_conn *fc = (struct file_conn *)conn;
    struct file_held *h = (struct file_held *)held;
    dlock_client *c = conn->client;
    char fname[DLOCK_FILE_ENCODED_MAX + 80], vname[VALUE_NAME_MAX], tname[VALUE_NAME_MAX + 40];
    char owner[33], buf[HEADER_MAX + DLOCK_VALUE_MAX];
    int rc, own = 0;

    if (len > DLOCK_VALUE_MAX)
        return dlock_seterr(c, DLOCK_EINVAL, "a leader's value is at most %d bytes",
                            DLOCK_VALUE_MAX);
    if ((rc = dlock_file_check_held(conn, h)) != 0)
        return rc;
    if ((rc = value_name(c, h->name, h->name_len, fname, sizeof fname, vname, sizeof vname)) != 0)
        return rc;
    dlock_hex(h->owner, sizeof h->owner, owner);
    int n = snprintf(buf, HEADER_MAX, "owner=%s grant=%020" PRIu64 " pid=%ld len=%zu\n", owner,
                     h->base.token, (long)getpid(), len);
    if (len)
        memcpy(buf + n, value, len);
    snprintf(tname, sizeof tname, "%s.new", vname);
    int fd = open_next(fc, tname);
    if (fd < 0) {
        /* Unique to this grant and thread, removed after. */
        snprintf(tname, sizeof tname, "%s.%.16s.%ld.new", vname, owner, (long)gettid());
        own = 1;
        fd = openat(fc->dirfd, tname, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
            return dlock_seterr(c, DLOCK_EIO, "cannot create the leader's value file in "
                                "'%.150s': %s", fc->dir, strerror(errno));
    }
    rc = write_value(c, fd, buf, (size_t)n + len, fc->fsync);
    /* Still ours: nobody else publishes for this name while we hold it. A
     * replacement of the lock file in between (the only way to lose it)
     * leaves a value whose owner the new holder's record does not match. */
    if (rc == 0)
        rc = dlock_file_check_held(conn, h);
    if (rc == 0)
        rc = replace(fc, tname, vname);
    close(fd); /* after the exchange: the next writer finds the old value */
    if (own)
        unlinkat(fc->dirfd, tname, 0);
    if (rc)
        return rc;
    if (fc->fsync && fsync(fc->dirfd) < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot sync the lock directory: %s", strerror(errno));
    /* The watches look at the lock file: its times changing wakes them. */
    if (futimens(h->fd, NULL) < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot touch the lock file: %s", strerror(errno));
    return 0;
}

/* The value file's header: 0 with the grant's owner, token and the value's
 * length and offset, or 1 when it is not one. */
static int parse_header(const char *buf, size_t n, char *owner, uint64_t *grant, size_t *len,
                        size_t *off)
{
    const char *nl = memchr(buf, '\n', n < HEADER_MAX ? n : HEADER_MAX);
    unsigned long long g;
    long pid;
    size_t l;
    char o[33], line[HEADER_MAX + 1];
    int used = 0;
    if (!nl)
        return 1;
    memcpy(line, buf, (size_t)(nl - buf));
    line[nl - buf] = '\0';
    if (sscanf(line, "owner=%32[0-9a-f] grant=%20llu pid=%ld len=%zu%n", o, &g, &pid, &l,
               &used) != 4 ||
        used != nl - buf || strlen(o) != 32 || l > DLOCK_VALUE_MAX)
        return 1;
    memcpy(owner, o, sizeof o);
    *grant = g;
    *len = l;
    *off = (size_t)(nl - buf) + 1;
    return *off + l <= n ? 0 : 1;
}

int dlock_file_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                      char *value, size_t *value_len)
{
    struct file_conn *fc = (struct file_conn *)conn;
    dlock_client *c = conn->client;
    char fname[DLOCK_FILE_ENCODED_MAX + 80], vname[VALUE_NAME_MAX];
    char buf[HEADER_MAX + DLOCK_VALUE_MAX + 1], owner[33];
    struct dlock_file_look lk;
    uint64_t grant;
    size_t vlen, off;
    int rc;

    *value_len = 0;
    if ((rc = value_name(c, name, len, fname, sizeof fname, vname, sizeof vname)) != 0 ||
        (rc = dlock_file_info(fc, name, len, info, &lk)) != 0)
        return rc;
    if (lk.state != F_WRLCK || !lk.parsed || !lk.owner[0])
        return 0; /* no leader, a plain holder's first instants, or readers */
    int fd = openat(fc->dirfd, vname, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? 0
                               : dlock_seterr(c, DLOCK_EIO, "cannot open the leader's value "
                                              "file in '%.150s': %s", fc->dir, strerror(errno));
    /* Replaced whole, never rewritten: one read sees one value. */
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    int e = errno;
    close(fd);
    if (n < 0)
        return dlock_seterr(c, DLOCK_EIO, "cannot read the leader's value file: %s", strerror(e));
    if (parse_header(buf, (size_t)n, owner, &grant, &vlen, &off) != 0)
        return 0; /* not a value file: no value */
    if (grant == lk.token && strcmp(owner, lk.owner) == 0) {
        memcpy(value, buf + off, vlen);
        *value_len = vlen;
    }
    return 0;
}

/* A release closes the lock file (IN_CLOSE_WRITE) unless a child shares
 * its descriptor: touching it tells the watches either way. */
int dlock_file_wake(dlock_conn *conn, const char *name, size_t len)
{
    struct file_conn *fc = (struct file_conn *)conn;
    char fname[DLOCK_FILE_ENCODED_MAX + 80];
    int rc = dlock_file_encode_name(name, len, fname, sizeof fname);
    if (rc)
        return dlock_seterr(conn->client, rc, "cannot encode the lock name");
    if (utimensat(fc->dirfd, fname, NULL, AT_SYMLINK_NOFOLLOW) < 0 && errno != ENOENT)
        return dlock_seterr(conn->client, DLOCK_EIO, "cannot touch the lock file: %s",
                            strerror(errno));
    return 0;
}

struct file_watch {
    dlock_watch base;
    struct file_conn *fc;
    int ep, ifd, tfd, pidfd;
    int wd_file, wd_dir;
    long pid;  /* the holder the pidfd follows */
    long gone; /* a pid seen exited: not followed again */
    char fname[DLOCK_FILE_ENCODED_MAX + 80];
    char path[PATH_MAX];
};

static int watch_error(struct file_watch *w, const char *what)
{
    return dlock_seterr(w->fc->base.client, DLOCK_EIO, "cannot %s the election's watch in "
                        "'%.150s': %s", what, w->fc->dir, strerror(errno));
}

static void drop_pidfd(struct file_watch *w)
{
    if (w->pidfd >= 0) {
        epoll_ctl(w->ep, EPOLL_CTL_DEL, w->pidfd, NULL);
        close(w->pidfd);
    }
    w->pidfd = -1;
    w->pid = 0;
}

static int add_fd(struct file_watch *w, int fd)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    return epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev);
}

/* Follows the lock file at the path (a new one after a replacement), or
 * the directory while there is none; then the holder's process. */
static int arm(struct file_watch *w)
{
    struct dlock_file_look lk;
    int wd = inotify_add_watch(w->ifd, w->path, FILE_EVENTS);
    if (wd < 0 && errno == ENOENT) {
        if (w->wd_dir < 0 && (w->wd_dir = inotify_add_watch(w->ifd, w->fc->dir, DIR_EVENTS)) < 0)
            return watch_error(w, "watch the directory of");
        wd = inotify_add_watch(w->ifd, w->path, FILE_EVENTS); /* created meanwhile? */
    }
    if (wd < 0 && errno != ENOENT)
        return watch_error(w, "watch the lock file of");
    if (w->wd_file >= 0 && w->wd_file != wd)
        inotify_rm_watch(w->ifd, w->wd_file); /* a file no longer at the path */
    w->wd_file = wd;
    if (wd >= 0 && w->wd_dir >= 0) {
        inotify_rm_watch(w->ifd, w->wd_dir);
        w->wd_dir = -1;
    }
    int rc = dlock_file_look(w->fc, w->fname, &lk);
    if (rc)
        return rc;
    long pid = lk.state != F_UNLCK && lk.parsed ? lk.pid : 0;
    if (pid == w->pid)
        return 0;
    drop_pidfd(w);
    if (pid <= 0 || pid == w->gone)
        return 0;
#ifdef SYS_pidfd_open
    int pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pfd < 0) {
        if (errno == ESRCH)
            w->gone = pid; /* exited: its close told */
        return 0;          /* ENOSYS, EPERM...: the close's look alone */
    }
    fcntl(pfd, F_SETFD, FD_CLOEXEC);
    if (add_fd(w, pfd) < 0) {
        close(pfd);
        return watch_error(w, "poll the holder's process for");
    }
    w->pidfd = pfd;
    w->pid = pid;
#endif
    return 0;
}

void dlock_file_watch_close(dlock_watch *watch)
{
    struct file_watch *w = (struct file_watch *)watch;
    if (!w)
        return;
    drop_pidfd(w);
    if (w->ifd >= 0)
        close(w->ifd);
    if (w->tfd >= 0)
        close(w->tfd);
    if (w->ep >= 0)
        close(w->ep);
    free(w);
}

int dlock_file_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp)
{
    struct file_conn *fc = (struct file_conn *)conn;
    struct file_watch *w = calloc(1, sizeof *w);
    int rc;
    if (!w)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    w->base.conn = conn;
    w->fc = fc;
    w->pidfd = w->wd_file = w->wd_dir = -1;
    if ((rc = dlock_file_encode_name(name, len, w->fname, sizeof w->fname)) != 0) {
        free(w);
        return dlock_seterr(conn->client, rc, "cannot encode the lock name");
    }
    if ((size_t)snprintf(w->path, sizeof w->path, "%s/%s", fc->dir, w->fname) >= sizeof w->path) {
        free(w);
        return dlock_seterr(conn->client, DLOCK_EINVAL, "the lock file's path is too long");
    }
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    w->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (w->ep < 0 || w->ifd < 0 || w->tfd < 0 || add_fd(w, w->ifd) < 0 || add_fd(w, w->tfd) < 0)
        rc = watch_error(w, "open");
    else
        rc = arm(w);
    if (rc) {
        dlock_file_watch_close(&w->base);
        return rc;
    }
    *watchp = &w->base;
    return 0;
}

int dlock_file_watch_fd(dlock_watch *watch)
{
    return ((struct file_watch *)watch)->ep;
}

int dlock_file_watch_read(dlock_watch *watch)
{
    struct file_watch *w = (struct file_watch *)watch;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int closed = 0;
    ssize_t n;
    while ((n = read(w->ifd, buf, sizeof buf)) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            closed |= (ev->mask & IN_CLOSE_WRITE) != 0;
            p += sizeof *ev + ev->len;
        }
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR)
        return watch_error(w, "read");
    uint64_t ticks;
    if (read(w->tfd, &ticks, sizeof ticks) < 0) {
        /* not due */
    }
    if (closed) {
        struct itimerspec its = {.it_value = {0, CLOSE_LOOK_MS * 1000000L}};
        if (timerfd_settime(w->tfd, 0, &its, NULL) < 0)
            return watch_error(w, "time");
    }
    if (w->pidfd >= 0) {
        if (dlock_fd_cancelled(w->pidfd)) { /* readable: exited */
            w->gone = w->pid;
            drop_pidfd(w);
        }
    }
    return arm(w);
}
