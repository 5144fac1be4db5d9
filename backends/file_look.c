/*
 * Where a name's files are, and what the lock file tells without locking
 * it (backends/file.c's top: inspect): the encoded file name, whether a
 * held descriptor is still the file at the path, the grant's record (token,
 * owner, pid) and the lock's state. Called by backends/file.c and
 * backends/file_elect.c; calls backends/file_side.c (readers' records)
 * and the core.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/file.h"
#include "backends/file_int.h"
#include "core/sha256.h"

/* Encoded names longer than this are shortened with a hash. */
#define ENCODED_KEEP 120


static int keep_byte(unsigned char c, size_t pos)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_' || (c == '.' && pos > 0);
}

int dlock_file_encode_name(const char *name, size_t len, char *out, size_t outsz)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0, i, need = 0;
    for (i = 0; i < len; i++)
        need += keep_byte((unsigned char)name[i], i) ? 1 : 3;
    if (need <= DLOCK_FILE_ENCODED_MAX) {
        if (outsz < need + sizeof ".lock")
            return DLOCK_EINVAL;
        for (i = 0; i < len; i++) {
            unsigned char c = (unsigned char)name[i];
            if (keep_byte(c, i)) {
                out[o++] = (char)c;
            } else {
                out[o++] = '%';
                out[o++] = hex[c >> 4];
                out[o++] = hex[c & 15];
            }
        }
        memcpy(out + o, ".lock", sizeof ".lock");
        return 0;
    }
    /* Too long for one path component: a readable prefix, '~' (which short
     * encodings never contain), then SHA-256 of the whole name. */
    unsigned char digest[DLOCK_SHA256_LEN];
    if (outsz < ENCODED_KEEP + 1 + 2 * DLOCK_SHA256_LEN + sizeof ".lock")
        return DLOCK_EINVAL;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        size_t w = keep_byte(c, i) ? 1 : 3;
        if (o + w > ENCODED_KEEP)
            break;
        if (w == 1) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o++] = '~';
    dlock_sha256(name, len, digest);
    dlock_hex(digest, sizeof digest, out + o);
    o += 2 * DLOCK_SHA256_LEN;
    memcpy(out + o, ".lock", sizeof ".lock");
    return 0;
}

/* Still ours only while the file we locked is the one at the path. */
int dlock_file_still_linked(int dirfd, const char *fname, int fd)
{
    struct stat a, b;
    if (fstat(fd, &a) < 0 || fstatat(dirfd, fname, &b, AT_SYMLINK_NOFOLLOW) < 0)
        return 0;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Removed, renamed away or replaced: another process may have created and
 * locked a new file at the path, so ours no longer excludes anyone. */
int dlock_file_check_held(dlock_conn *conn, struct file_held *h)
{
    struct file_conn *fc = (struct file_conn *)conn;
    char fname[DLOCK_FILE_ENCODED_MAX + 80];
    /* It was encoded once already: it fits. */
    (void)dlock_file_encode_name(h->name, h->name_len, fname, sizeof fname);
    if (!dlock_file_still_linked(fc->dirfd, fname, h->fd))
        return dlock_seterr(conn->client, DLOCK_ELOST,
                            "the lock file was removed or replaced while the lock was held");
    /* A reader's or a permit's side file too: a new one's slots and marks
     * no longer count this holder. */
    char sname[DLOCK_FILE_ENCODED_MAX + 96];
    if (h->side >= 0 && (dlock_file_side_name(fname, sname, sizeof sname) != 0 ||
                         !dlock_file_still_linked(fc->dirfd, sname, h->side)))
        return dlock_seterr(conn->client, DLOCK_ELOST,
                            "the lock's side file was removed or replaced while the lock was held");
    return 0;
}

/* A grant's record: the 20-digit token line, then "owner=<32 hex> pid=<pid>
 * grant=<20 digits>" (grant= from this version on). */
#define CONTENTS_MAX (TOKEN_DIGITS + 1 + 128)

/* The lock file's contents, read twice in a row until two reads agree (a
 * holder may be rewriting it). *np: their length. -1 (errno) or 0. */
static int read_contents(int fd, char *buf, size_t *np)
{
    char other[CONTENTS_MAX];
    ssize_t a = pread(fd, buf, CONTENTS_MAX, 0), b;
    if (a < 0)
        return -1;
    for (int i = 0; i < 1000; i++) {
        if ((b = pread(fd, other, CONTENTS_MAX, 0)) < 0)
            return -1;
        if (a == b && memcmp(buf, other, (size_t)a) == 0) {
            *np = (size_t)a;
            return 0;
        }
        memcpy(buf, other, (size_t)b);
        a = b;
    }
    *np = 0; /* changing all along: nothing told */
    return 0;
}

/* What a grant wrote: its token, and its owner id and pid where the second
 * line holds them. 1 when buf starts with no token (new, emptied, not dlock's). */
static int parse_contents(const char *buf, size_t n, uint64_t *tokenp, char *owner,
                          size_t ownersz, long *pidp)
{
    static const char key[] = "owner=";
    uint64_t token = 0;
    size_t i, klen = sizeof key - 1;
    owner[0] = '\0';
    for (i = 0; i < TOKEN_DIGITS && i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
        token = token * 10 + (uint64_t)(buf[i] - '0');
    if (i != TOKEN_DIGITS || n <= TOKEN_DIGITS || buf[TOKEN_DIGITS] != '\n')
        return 1;
    *tokenp = token;
    const char *o = buf + TOKEN_DIGITS + 1;
    size_t left = n - TOKEN_DIGITS - 1, h = 0;
    if (left < klen + 32 || memcmp(o, key, klen) != 0)
        return 0;
    for (o += klen; h < 32 && ((o[h] >= '0' && o[h] <= '9') || (o[h] >= 'a' && o[h] <= 'f'));
         h++)
        ;
    if (h == 32 && (left == klen + 32 || o[32] == ' ' || o[32] == '\n') && ownersz > 32) {
        memcpy(owner, o, 32);
        owner[32] = '\0';
    }
    /* The grant's own token, where the line has it: the first line may have
     * been raised since (dlock_lock_raise_token()), which granted nothing. */
    static const char gkey[] = " grant=";
    const char *end = memchr(o, '\n', left - klen);
    const char *g = end ? memmem(o, (size_t)(end - o), gkey, sizeof gkey - 1) : NULL;
    if (g && (size_t)(end - g) == sizeof gkey - 1 + TOKEN_DIGITS) {
        uint64_t gt = 0;
        for (i = 0, g += sizeof gkey - 1; i < TOKEN_DIGITS && g[i] >= '0' && g[i] <= '9'; i++)
            gt = gt * 10 + (uint64_t)(g[i] - '0');
        if (i == TOKEN_DIGITS)
            *tokenp = gt;
    }
    static const char pkey[] = " pid=";
    const char *p = end ? memmem(o, (size_t)(end - o), pkey, sizeof pkey - 1) : NULL;
    if (p) {
        long pid = 0;
        for (p += sizeof pkey - 1; p < end && *p == ' '; p++)
            ;
        for (; p < end && *p >= '0' && *p <= '9' && pid < 1L << 30; p++)
            pid = pid * 10 + (*p - '0');
        *pidp = pid;
    }
    return 0;
}

/* The type of a lock another open file description holds on fd's file
 * (this process's too): F_UNLCK (none), F_RDLCK, F_WRLCK; -1 (errno). */
static int lock_state(int fd)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
        return -1;
    return fl.l_type;
}

int dlock_file_look(struct file_conn *fc, const char *fname, struct dlock_file_look *lk)
{
    dlock_client *c = fc->base.client;
    char buf[CONTENTS_MAX], again[CONTENTS_MAX];
    size_t n = 0, m = 0;
    struct stat st;
    int rc = 0;

    memset(lk, 0, sizeof *lk);
    lk->state = F_UNLCK;
    /* Read-only, no O_CREAT: inspecting leaves the directory as it was. */
    int fd = openat(fc->dirfd, fname, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno != ENOENT)
            return dlock_seterr(c, DLOCK_EIO, "cannot open the lock file %.120s in '%.150s': %s",
                                fname, fc->dir, strerror(errno));
        /* Never taken here (lock files are never deleted): free, no grant. */
        lk->parsed = 1;
        return 0;
    }
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return dlock_seterr(c, DLOCK_EIO, "cannot inspect the lock file %.120s in '%.150s': %s",
                            fname, fc->dir, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dlock_seterr(c, DLOCK_EPROTO, "the lock file %.120s in '%.150s' is not a "
                            "regular file", fname, fc->dir);
    }
    /* Contents, lock state, contents: the same contents on both sides
     * were there when the lock state was asked. */
    for (int tries = 0;; tries++) {
        if (read_contents(fd, buf, &n) < 0 || (lk->state = lock_state(fd)) < 0 ||
            read_contents(fd, again, &m) < 0) {
            rc = dlock_seterr(c, DLOCK_EIO, "cannot inspect the lock file %.120s in '%.150s': %s",
                              fname, fc->dir, strerror(errno));
            break;
        }
        if (n == m && memcmp(buf, again, n) == 0)
            break;
        if (tries == 100) {
            n = 0; /* rewritten at every look: the state alone */
            break;
        }
    }
    close(fd);
    /* No token yet (a first grant in progress, or a crash), or not dlock's:
     * not parsed. */
    if (rc == 0 && n > 0 &&
        parse_contents(buf, n, &lk->token, lk->owner, sizeof lk->owner, &lk->pid) == 0)
        lk->parsed = 1;
    return rc;
}

/* The holders of name as the lock file and its side file tell: an
 * exclusive one from the lock file, readers or permits from the side
 * file's records, in token order (*hsp malloc'd, *np of them); *lk what
 * the lock file says. */
int dlock_file_holders(struct file_conn *fc, const char *name, size_t len,
                       struct dlock_file_look *lk, dlock_holder **hsp, size_t *np)
{
    char fname[DLOCK_FILE_ENCODED_MAX + 80];
    int rc;
    *hsp = NULL;
    *np = 0;
    if ((rc = dlock_file_encode_name(name, len, fname, sizeof fname)) != 0)
        return dlock_seterr(fc->base.client, rc, "cannot encode the lock name");
    if ((rc = dlock_file_look(fc, fname, lk)) != 0)
        return rc;
    if (lk->state == F_RDLCK)
        return dlock_file_read_records(fc, fname, hsp, np);
    if (lk->state != F_WRLCK)
        return 0;
    dlock_holder *h = calloc(1, sizeof *h);
    if (!h)
        return dlock_seterr(fc->base.client, DLOCK_ENOMEM, "out of memory");
    h->known = DLOCK_KNOWS_MODE;
    h->mode = DLOCK_MODE_EXCLUSIVE;
    if (lk->parsed) {
        h->known |= DLOCK_KNOWS_TOKEN;
        h->token = lk->token;
    }
    if (lk->parsed && lk->owner[0]) {
        h->known |= DLOCK_KNOWS_OWNER;
        memcpy(h->owner, lk->owner, strlen(lk->owner) + 1);
    }
    *hsp = h;
    *np = 1;
    return 0;
}

int dlock_file_info(struct file_conn *fc, const char *name, size_t len, dlock_info *info,
                    struct dlock_file_look *lk)
{
    dlock_holder *hs;
    size_t n;
    int rc = dlock_file_holders(fc, name, len, lk, &hs, &n);
    if (rc)
        return rc;
    info->known = DLOCK_KNOWS_HELD;
    info->held = lk->state != F_UNLCK;
    if (lk->parsed) {
        info->known |= DLOCK_KNOWS_LAST_TOKEN;
        info->last_token = lk->token;
    }
    /* Readers or permits: the newest's token and owner. */
    const dlock_holder *h = n ? &hs[n - 1] : NULL;
    if (h && (h->known & DLOCK_KNOWS_TOKEN)) {
        info->known |= DLOCK_KNOWS_TOKEN;
        info->token = h->token;
    }
    if (h && (h->known & DLOCK_KNOWS_OWNER)) {
        info->known |= DLOCK_KNOWS_OWNER;
        memcpy(info->owner, h->owner, sizeof info->owner);
    }
    free(hs);
    return 0;
}
