/*
 * A deliberately broken backend, for tests only: scheme broken://, every
 * acquire granted at once whoever holds the lock (no mutual exclusion), with
 * a token that repeats and goes back (1, 2, 3, 1, 2, 3, ...: no fencing).
 * Built as a shared module that registers itself from a constructor, so
 * that `LD_PRELOAD=broken_backend.so dlock check broken://x` reaches the
 * registry of the libdlock the CLI is linked with (dynamically). `dlock
 * check` must fail on it, with a report saying why (tests/check).
 * broken://timeout instead fails to open with DLOCK_ETIMEDOUT, as a store
 * that does not answer in time: the CLI's exit status for it (75) is the
 * same in `dlock run` and `dlock check`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock_backend.h"

static unsigned long grants;

static int broken_open(dlock_client *client, const dlock_uri *uri, dlock_conn **connp)
{
    dlock_conn *c;

    if (dlock_uri_host_count(uri) == 1 && strcmp(dlock_uri_host(uri, 0), "timeout") == 0)
        return dlock_seterr(client, DLOCK_ETIMEDOUT, "broken://timeout did not answer in time");
    c = calloc(1, sizeof *c);
    if (!c)
        return dlock_seterr(client, DLOCK_ENOMEM, "out of memory");
    *connp = c;
    return 0;
}

static void broken_close(dlock_conn *conn)
{
    free(conn);
}

static int broken_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    dlock_held *h = calloc(1, sizeof *h);

    (void)req;
    if (!h)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    /* Per process; the checker's workers are processes, so their tokens
     * collide across them too. */
    h->token = grants++ % 3 + 1;
    *heldp = h;
    return 0;
}

static int broken_release(dlock_conn *conn, dlock_held *held)
{
    (void)conn;
    free(held);
    return 0;
}

static int broken_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    (void)conn, (void)held, (void)ttl_ms;
    return 0;
}

static const char *const broken_schemes[] = {"broken", NULL};
static const char *const broken_options[] = {NULL};

static const dlock_backend broken_backend = {
    .version = 2,
    .name = "broken",
    .schemes = broken_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING,
    .options = broken_options,
    .open = broken_open,
    .close = broken_close,
    .acquire = broken_acquire,
    .release = broken_release,
    .renew = broken_renew,
    .keep = broken_renew,
};

__attribute__((constructor)) static void broken_register(void)
{
    int rc = dlock_backend_register(&broken_backend);

    if (rc != 0)
        fprintf(stderr, "broken_backend: cannot register broken://: %s\n", dlock_strerror(rc));
}
