/* Composite locks (core/composite.c): one lock in several stores, or
 * several names at once. */
#ifndef DLOCK_CORE_COMPOSITE_H
#define DLOCK_CORE_COMPOSITE_H

#include <stddef.h>

#include "dlock_backend.h"

/* The most stores one composite string may list. */
#define DLOCK_COMPOSITE_MAX 16

extern const dlock_backend dlock_composite_backend;

/* Splits s at runs of whitespace: returns the number of words. With out,
 * stores up to max of them, NUL-terminated, in *bufp (one allocation the
 * caller frees; 0 words and *bufp untouched when it fails). */
size_t dlock_composite_split(const char *s, char **out, size_t max, char **bufp);
/* Opens one client per URI (in acquisition order) under c, whose backend is
 * then dlock_composite_backend; on failure records detail on c. */
int dlock_composite_open(dlock_client *c, char *const *uris, size_t n, dlock_conn **connp);

/* A name of a several-name lock (no NUL inside; not NUL-terminated). */
typedef struct dlock_name {
    const char *name;
    size_t len;
} dlock_name;

/* Acquires every (store, name) pair of conn (a list's, or a single store's
 * own connection) for names (sorted, distinct; they must outlive the
 * held), all or nothing, under req's deadline, wait and owner; req's name
 * is not read. The held that results is released, renewed, kept and raised
 * through dlock_composite_backend's methods with the same conn. */
int dlock_composite_acquire(dlock_conn *conn, const dlock_request *req,
                            const dlock_name *names, size_t nnames, dlock_held **heldp);

/* Some store of a list has a lease, so the list's locks end for their
 * holder (see core/composite.c, Leases). 0 for any other connection. */
int dlock_composite_leased(const dlock_conn *conn);

#endif
