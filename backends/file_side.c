/*
 * The file store's side file, ".<lock file>.modes": the gate, the token
 * byte, the kind marks, and the holder slots and records of shared locks
 * and semaphores (docs/file.md, and backends/file.c's top). Called by
 * backends/file.c; calls only the core.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/file.h"
#include "backends/file_int.h"

/* Above the gate and the token byte (file_int.h): */
#define SIDE_SUFFIX ".modes"
#define MARK_OFF (GATE_OFF + 16)  /* + limit: the kind of every request */
#define SLOT_OFF ((off_t)1 << 41) /* + i: holder i, its record at i * REC_SIZE */
/* A holder's record: "<20-digit token> <32 hex owner> <s|x> <5-digit limit>\n". */
#define REC_SIZE 64
#define REC_LEN (TOKEN_DIGITS + 1 + 32 + 1 + 1 + 1 + 5 + 1)
/* A permit's waiter looks at the slots again at least this often, whether
 * or not a close of the side file woke it (inotify): 50 ms. */
#define SLOT_POLL_NS 50000000u

static void byte_range(struct flock *fl, short type, off_t start, off_t len)
{
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = start;
    fl->l_len = len;
}

static int set_range(int fd, int cmd, short type, off_t start, off_t len)
{
    struct flock fl;
    byte_range(&fl, type, start, len);
    return fcntl(fd, cmd, &fl);
}

/* The type of a lock another open file description holds in [start,
 * start + len) that a write lock there would meet (F_UNLCK: none), and
 * where it starts; -1 (errno). */
static int probe_range(int fd, off_t start, off_t len, off_t *at)
{
    struct flock fl;
    byte_range(&fl, F_WRLCK, start, len);
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
        return -1;
    *at = fl.l_start;
    return fl.l_type;
}

int dlock_file_side_name(const char *fname, char *out, size_t outsz)
{
    int n = snprintf(out, outsz, ".%s" SIDE_SUFFIX, fname);
    return n > 0 && (size_t)n < outsz ? 0 : DLOCK_EINVAL;
}

static int side_error(dlock_client *c, const char *what)
{
    return dlock_seterr(c, DLOCK_EIO, "cannot %s the lock's side file: %s", what,
                        strerror(errno));
}

/* Drops every lock fd holds (a child forked meanwhile shares the open file
 * description: close() alone would leave them) and closes it. */
void dlock_file_side_close(int fd)
{
    if (fd < 0)
        return;
    set_range(fd, F_OFD_SETLK, F_UNLCK, 0, 0);
    close(fd);
}

static int mismatch(dlock_client *c, const dlock_request *req, off_t held_limit)
{
    int nl = req->name_len > 80 ? 80 : (int)req->name_len;
    if (held_limit)
        return dlock_seterr(c, DLOCK_EMODE, "%.*s is held as a semaphore of limit %u (asked: %s)",
                            nl, req->name, (unsigned)held_limit,
                            req->limit ? "another limit" : "a read-write lock");
    return dlock_seterr(c, DLOCK_EMODE,
                        "%.*s is held as a read-write lock (asked: a semaphore of limit %u)", nl,
                        req->name, req->limit);
}

/* Marks the request's kind (a read lock on MARK_OFF + limit, kept while it
 * waits and holds), then looks for another kind's mark: marking first, the
 * later of two requests of different kinds always sees the earlier. A
 * semaphore also looks for a holder of the lock file whole (an exclusive
 * holder keeps no mark: the lock file's write lock tells it). */
int dlock_file_mark_kind(dlock_client *c, int side, int fd, const dlock_request *req)
{
    off_t lim = req->limit, at = 0;
    int t;
    if (set_range(side, F_OFD_SETLK, F_RDLCK, MARK_OFF + lim, 1) < 0)
        return side_error(c, "lock");
    if (lim && (t = probe_range(side, MARK_OFF, lim, &at)) != F_UNLCK)
        return t < 0 ? side_error(c, "inspect") : mismatch(c, req, at - MARK_OFF);
    /* (a length of 0 would reach to the end of the file: the slots) */
    t = lim < DLOCK_LIMIT_MAX
            ? probe_range(side, MARK_OFF + lim + 1, (off_t)DLOCK_LIMIT_MAX - lim, &at)
            : F_UNLCK;
    if (t != F_UNLCK)
        return t < 0 ? side_error(c, "inspect") : mismatch(c, req, at - MARK_OFF);
    if (lim) {
        struct flock fl;
        byte_range(&fl, F_RDLCK, 0, 0);
        if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
            return side_error(c, "inspect");
        if (fl.l_type == F_WRLCK)
            return mismatch(c, req, 0);
    }
    return 0;
}

/* The first free slot below max, taken: 0, DLOCK_EBUSY (all held), or an
 * error. */
int dlock_file_take_slot(dlock_client *c, int side, off_t max, off_t *slot)
{
    for (off_t i = 0; i < max; i++) {
        if (set_range(side, F_OFD_SETLK, F_WRLCK, SLOT_OFF + i, 1) == 0) {
            *slot = i;
            return 0;
        }
        if (errno != EAGAIN && errno != EACCES)
            return side_error(c, "lock");
    }
    return DLOCK_EBUSY;
}

/* SLOT_POLL_NS, or for the tests DLOCK_TEST_FILE_LOOK_MS (a long look
 * shows that the release's notice woke the waiter, not its look). */
static uint64_t look_ns(void)
{
    const char *v = getenv("DLOCK_TEST_FILE_LOOK_MS");
    unsigned long ms = v ? strtoul(v, NULL, 10) : 0;
    return ms > 0 && ms <= 60000 ? (uint64_t)ms * 1000000u : SLOT_POLL_NS;
}

static void drain(int fd)
{
    char buf[4096];
    while (read(fd, buf, sizeof buf) > 0)
        ;
}

/* A permit, for the holder of the gate: the first free slot of limit. The
 * kernel cannot wait for one of N locks, so the waiter watches the side
 * file with inotify (a holder's release closes it) and looks again on each
 * close, and at least every SLOT_POLL_NS (a holder that died: its close
 * may be reported before its locks are gone). */
int dlock_file_wait_permit(struct file_conn *fc, int side, const char *sname,
                           const dlock_request *req, off_t *slot)
{
    dlock_client *c = fc->base.client;
    uint64_t deadline = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns : DLOCK_POLL_FOREVER;
    uint64_t look = look_ns();
    int rc = dlock_file_take_slot(c, side, req->limit, slot);
    if (rc != DLOCK_EBUSY)
        return rc;
    if (req->wait == DLOCK_WAIT_TRY)
        return dlock_seterr(c, DLOCK_EBUSY, "every permit of the semaphore is held (limit %u)",
                            req->limit);
    char path[PATH_MAX];
    int ifd = -1, own = 0, wd = -1;
    pthread_mutex_lock(&fc->mu);
    if (!fc->ifd_busy) {
        if (fc->ifd < 0)
            fc->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        ifd = fc->ifd;
        fc->ifd_busy = ifd >= 0;
    }
    pthread_mutex_unlock(&fc->mu);
    if (ifd < 0 && (ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) >= 0)
        own = 1;
    if (ifd >= 0) {
        drain(ifd); /* what an earlier wait left */
        if ((size_t)snprintf(path, sizeof path, "%s/%s", fc->dir, sname) < sizeof path)
            wd = inotify_add_watch(ifd, path, IN_CLOSE);
    }
    for (;;) {
        if ((rc = dlock_file_take_slot(c, side, req->limit, slot)) != DLOCK_EBUSY)
            break;
        uint64_t now = dlock_monotonic_ns();
        if (now >= deadline) {
            rc = dlock_seterr(c, DLOCK_ETIMEDOUT, "the deadline passed with every permit held");
            break;
        }
        struct pollfd p = {.fd = wd >= 0 ? ifd : -1, .events = POLLIN}; /* -1: the look alone */
        int n = dlock_poll_until(&p, 1, req->cancel_fd,
                                 deadline - now > look ? now + look : deadline,
                                 deadline == DLOCK_POLL_FOREVER ? DLOCK_POLL_INTR : 0);
        if (n == DLOCK_POLL_SIGNAL) {
            if (!dlock_fd_cancelled(req->cancel_fd)) {
                rc = dlock_seterr(c, DLOCK_EINTR, "a signal interrupted the wait");
                break;
            }
            n = DLOCK_POLL_CANCEL;
        }
        if (n == DLOCK_POLL_ERROR) {
            rc = dlock_seterr(c, DLOCK_EIO, "cannot wait for a permit: %s", strerror(errno));
            break;
        }
        if (n > 0 && (n & DLOCK_POLL_READY))
            drain(ifd);
        if (n > 0 && (n & DLOCK_POLL_CANCEL)) {
            /* A permit freed with the cancel may still be taken. */
            if ((rc = dlock_file_take_slot(c, side, req->limit, slot)) == DLOCK_EBUSY)
                rc = dlock_cancelled(c);
            break;
        }
    }
    if (wd >= 0)
        inotify_rm_watch(ifd, wd);
    if (own) {
        close(ifd);
    } else if (ifd >= 0) {
        pthread_mutex_lock(&fc->mu);
        fc->ifd_busy = 0;
        pthread_mutex_unlock(&fc->mu);
    }
    return rc;
}

/* Takes (F_WRLCK) or drops (F_UNLCK) the side file's token byte, held
 * around a token's read-modify-write by a holder that shares the lock file
 * (a grant, a raise): readers and permits hold the lock file together. A
 * grant, which holds the gate, takes the gate and the token byte as one
 * range (from = GATE_OFF), and drops both at once; a raise takes the token
 * byte alone (from = TOKEN_OFF). Never held while waiting for another. */
int dlock_file_token_lock(dlock_client *c, int side, short type, off_t from)
{
    int r;
    do
        r = set_range(side, type == F_UNLCK ? F_OFD_SETLK : F_OFD_SETLKW, type, from,
                      TOKEN_OFF + 1 - from);
    while (r < 0 && errno == EINTR);
    return r < 0 ? side_error(c, "lock") : 0;
}

int dlock_file_write_record(dlock_client *c, int side, off_t slot, const dlock_request *req,
                        uint64_t token)
{
    char rec[REC_SIZE];
    memset(rec, 0, sizeof rec);
    snprintf(rec, sizeof rec, "%020" PRIu64 " %s %c %05u\n", token, req->owner_hex,
             req->mode == DLOCK_MODE_SHARED ? 's' : 'x', req->limit);
    if (pwrite(side, rec, REC_SIZE, slot * REC_SIZE) != REC_SIZE)
        return side_error(c, "write");
    return 0;
}

int dlock_file_clear_record(dlock_client *c, int side, off_t slot)
{
    static const char zero[REC_SIZE];
    if (pwrite(side, zero, REC_SIZE, slot * REC_SIZE) != REC_SIZE)
        return side_error(c, "write");
    return 0;
}

void dlock_file_gate(struct flock *fl)
{
    byte_range(fl, F_WRLCK, GATE_OFF, 1);
}

static int by_token(const void *a, const void *b)
{
    const dlock_holder *x = a, *y = b;
    return (x->token > y->token) - (x->token < y->token);
}

/* A record of the side file, parsed: 0, or 1 when it is not one. */
static int parse_record(const char *rec, dlock_holder *h)
{
    uint64_t token = 0;
    unsigned limit = 0;
    int i;
    for (i = 0; i < TOKEN_DIGITS && rec[i] >= '0' && rec[i] <= '9'; i++)
        token = token * 10 + (uint64_t)(rec[i] - '0');
    const char *o = rec + TOKEN_DIGITS + 1, *m = o + 33;
    if (i != TOKEN_DIGITS || rec[TOKEN_DIGITS] != ' ' || o[32] != ' ' ||
        (m[0] != 's' && m[0] != 'x') || m[1] != ' ' || rec[REC_LEN - 1] != '\n')
        return 1;
    for (i = 0; i < 32; i++)
        if (!((o[i] >= '0' && o[i] <= '9') || (o[i] >= 'a' && o[i] <= 'f')))
            return 1;
    for (i = 2; i < 7; i++) {
        if (m[i] < '0' || m[i] > '9')
            return 1;
        limit = limit * 10 + (unsigned)(m[i] - '0');
    }
    memset(h, 0, sizeof *h);
    h->known = DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER | DLOCK_KNOWS_MODE;
    h->mode = m[0] == 's' ? DLOCK_MODE_SHARED : DLOCK_MODE_EXCLUSIVE;
    h->limit = limit;
    h->token = token;
    memcpy(h->owner, o, 32);
    h->owner[32] = '\0';
    return 0;
}

/* The readers or permits of a name, from the side file's records whose
 * slot is held (a holder that died left its record, and its slot went with
 * it), in token order: *outp (malloc'd), *np. */
int dlock_file_read_records(struct file_conn *fc, const char *fname, dlock_holder **outp,
                            size_t *np)
{
    dlock_client *c = fc->base.client;
    char sname[DLOCK_FILE_ENCODED_MAX + 96], rec[REC_SIZE], again[REC_SIZE];
    dlock_holder *out = NULL;
    size_t n = 0, cap = 0;
    struct stat st;
    int rc = 0;
    *outp = NULL;
    *np = 0;
    if (dlock_file_side_name(fname, sname, sizeof sname) != 0)
        return 0;
    int side = openat(fc->dirfd, sname, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (side < 0)
        return errno == ENOENT ? 0 : side_error(c, "open");
    if (fstat(side, &st) < 0) {
        rc = side_error(c, "inspect");
        goto out;
    }
    for (off_t i = 0; i < st.st_size / REC_SIZE && i < SLOT_MAX; i++) {
        off_t at;
        dlock_holder h;
        int t;
        if (pread(side, rec, REC_SIZE, i * REC_SIZE) != REC_SIZE ||
            (t = probe_range(side, SLOT_OFF + i, 1, &at)) < 0 ||
            pread(side, again, REC_SIZE, i * REC_SIZE) != REC_SIZE) {
            rc = side_error(c, "read");
            goto out;
        }
        if (t == F_UNLCK || memcmp(rec, again, REC_SIZE) != 0 || parse_record(rec, &h) != 0)
            continue; /* free, or changing hands now: not a holder's as it stands */
        if (n == cap) {
            dlock_holder *more = realloc(out, (cap = cap ? 2 * cap : 8) * sizeof *out);
            if (!more) {
                rc = dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
                goto out;
            }
            out = more;
        }
        out[n++] = h;
    }
    qsort(out, n, sizeof *out, by_token);
out:
    close(side);
    if (rc) {
        free(out);
        return rc;
    }
    *outp = out;
    *np = n;
    return 0;
}
