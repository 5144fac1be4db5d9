/* The file backend's files share this: backends/file.c (lock files,
 * tokens, inspect) calls backends/file_side.c (the side file of shared
 * locks and semaphores), never the other way. */
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

#endif
