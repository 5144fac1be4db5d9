/* The file backend's files share this: backends/file.c (lock files,
 * tokens, inspect) calls backends/file_side.c (the side file of shared
 * locks and semaphores) and backends/file_look.c (names, and what a lock
 * file tells without locking it); backends/file_elect.c (elections) calls
 * file_look.c; never the other way. */
#ifndef DLOCK_BACKENDS_FILE_INT_H
#define DLOCK_BACKENDS_FILE_INT_H

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/internal.h"

#define TOKEN_DIGITS 20

struct file_conn {
    dlock_conn base;
    int dirfd;
    int fsync;
    char *dir;
    /* The inotify instance a permit's waiter watches the side file with,
     * kept for the next wait (closing one takes milliseconds); in use by
     * one wait at a time (ifd_busy: another makes its own). */
    pthread_mutex_t mu;
    int ifd, ifd_busy;
};

/* The side file of a name: "." + the lock file's name + ".modes" (a
 * leading '.' never starts a lock file's name, and token_top skips it).
 * Its bytes far above its contents are locks: */
#define GATE_OFF ((off_t)1 << 40) /* the gate: one request at a time */
#define TOKEN_OFF (GATE_OFF + 4)  /* around a token's read-modify-write */
#define SLOT_MAX ((off_t)1 << 30) /* holder slots */

/* The side file's name for the lock file fname: 0 or DLOCK_EINVAL. */
int dlock_file_side_name(const char *fname, char *out, size_t outsz);
/* Drops every lock fd holds and closes it (-1: nothing). */
void dlock_file_side_close(int fd);
/* The gate's lock, for lock_fd(). */
void dlock_file_gate(struct flock *fl);
/* Marks req's kind on side, then refuses another kind's holders or
 * waiters (and, for a permit, a writer of the lock file fd) with
 * DLOCK_EMODE. */
int dlock_file_mark_kind(dlock_client *c, int side, int fd, const dlock_request *req);
/* The first free slot below max, taken: 0, DLOCK_EBUSY, or an error. */
int dlock_file_take_slot(dlock_client *c, int side, off_t max, off_t *slot);
/* A permit of req->limit, for the gate's holder, waiting as req says. */
int dlock_file_wait_permit(struct file_conn *fc, int side, const char *sname,
                           const dlock_request *req, off_t *slot);
/* Takes (F_WRLCK) or drops (F_UNLCK) [from, TOKEN_OFF]: from = GATE_OFF
 * for a grant (the gate and the token byte), TOKEN_OFF for a raise. */
int dlock_file_token_lock(dlock_client *c, int side, short type, off_t from);
/* A holder's record in its slot: written at its grant, cleared at its
 * release. */
int dlock_file_write_record(dlock_client *c, int side, off_t slot, const dlock_request *req,
                            uint64_t token);
int dlock_file_clear_record(dlock_client *c, int side, off_t slot);
/* The readers or permits of the lock file fname, from the records whose
 * slot is held, in token order: *outp (malloc'd, free it), *np. */
int dlock_file_read_records(struct file_conn *fc, const char *fname, dlock_holder **outp,
                            size_t *np);

/* A held lock (file.c grants it; file_look.c checks it; file_elect.c
 * publishes for it). */
struct file_held {
    dlock_held base;
    int fd;
    /* The request's name, kept by the core until the release (see
     * dlock_request): the file name is encoded again when needed, not
     * kept (a client may hold 100 000 locks). */
    const char *name;
    size_t name_len;
    /* A reader or a permit: the side file (its mark and its slot), the
     * slot; else -1. */
    int side;
    off_t slot;
    /* The grant's owner id (the lock file's owner=), as raw bytes. */
    unsigned char owner[16];
};

/* Whether the file we locked (fd) is still the one at fname in dirfd. */
int dlock_file_still_linked(int dirfd, const char *fname, int fd);
/* DLOCK_ELOST (recorded) when h's lock file, or its side file, was
 * removed or replaced while held: ours no longer excludes anyone. */
int dlock_file_check_held(dlock_conn *conn, struct file_held *h);

/* What the lock file fname tells, read without locking it: state F_UNLCK
 * (free, or never taken), F_WRLCK (an exclusive holder), F_RDLCK (readers
 * or permits); the last grant's token, owner (hex, "" when none) and pid
 * (0 when none) when parsed. */
struct dlock_file_look {
    int state, parsed;
    uint64_t token;
    long pid;
    char owner[DLOCK_HOLDER_MAX];
};
int dlock_file_look(struct file_conn *fc, const char *fname, struct dlock_file_look *lk);
/* The holders of name: an exclusive one from the lock file, readers or
 * permits from the side file's records, in token order (*hsp malloc'd, *np
 * of them); *lk what the lock file says. */
int dlock_file_holders(struct file_conn *fc, const char *name, size_t len,
                       struct dlock_file_look *lk, dlock_holder **hsp, size_t *np);
/* inspect(): info from the holders; *lk what the lock file says. */
int dlock_file_info(struct file_conn *fc, const char *name, size_t len, dlock_info *info,
                    struct dlock_file_look *lk);

/* Elections (backends/file_elect.c, docs/file.md "Elections"). */
int dlock_file_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len);
int dlock_file_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                      char *value, size_t *value_len);
int dlock_file_wake(dlock_conn *conn, const char *name, size_t len);
int dlock_file_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp);
int dlock_file_watch_fd(dlock_watch *watch);
int dlock_file_watch_read(dlock_watch *watch);
void dlock_file_watch_close(dlock_watch *watch);

#endif
