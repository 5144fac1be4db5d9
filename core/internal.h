/* Private to the library: the client and lock structs and core helpers. */
#ifndef DLOCK_CORE_INTERNAL_H
#define DLOCK_CORE_INTERNAL_H

#include <time.h>

#include "dlock_backend.h"

struct dlock_client {
    const dlock_backend *backend;
    dlock_conn *conn;       /* NULL when open failed */
    dlock_uri *uri;         /* NULL when the URI did not parse */
    struct dlock_lock *locks; /* held locks, for close and for EALREADY */
    int err;
    char errmsg[DLOCK_ERRMSG_MAX];
};

struct dlock_lock {
    dlock_client *client;
    dlock_held *held;
    struct dlock_lock *next;
    size_t name_len;
    char name[]; /* NUL-terminated copy */
};

void dlock_ns_to_timespec(uint64_t ns, struct timespec *ts);
int dlock_random_bytes(void *buf, size_t len);
int dlock_owner_new(unsigned char owner[16], char hex[33]);
void dlock_clearerr(dlock_client *client);

/* The built-in backends, registered once on first use. */
extern const dlock_backend dlock_file_backend;
extern const dlock_backend dlock_redis_backend;
extern const dlock_backend dlock_postgres_backend;
extern const dlock_backend dlock_mysql_backend;
extern const dlock_backend dlock_zookeeper_backend;
void dlock_registry_init(void);

#endif
