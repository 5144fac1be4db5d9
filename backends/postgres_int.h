/*
 * What the PostgreSQL backend's files share: the connection, session and
 * handle structs, and the statement layer's calls (postgres_io.c). The
 * recipe (postgres.c) calls down into postgres_io.c and the session layer
 * (sql_session.c); postgres_io.c calls nothing above it.
 */
#ifndef DLOCK_BACKENDS_POSTGRES_INT_H
#define DLOCK_BACKENDS_POSTGRES_INT_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/sql_session.h"
#include "core/internal.h"

#define MS 1000000ull

/* How long a cancelled wait gives the server to take the cancel, then
 * again to end the statement: what a deadline's cleanup gets, each. */
#define CANCEL_MS 150
/*
 * Threads: as in backends/sql_session.h, which owns the sessions' sharing.
 * Each session's mutex is held around one exchange (a statement and its
 * reply, bounded by `timeout`) and around every change to what keep()
 * reads: the session's connection, lease, its list of locks, and their
 * handles.
 */
struct pg_session {
    struct dlock_sql_session base; /* mu, waiting, held locks, lease (ms), silent_ms */
    PGconn *pg;           /* NULL once closed (after a timeout, or its end) */
    size_t host;          /* index of the host it is connected to */
    char sqlstate[6];     /* of the last failed statement, "" if none */
    int ended;            /* the server said FATAL or PANIC: it is closing */
};

struct pg_conn {
    dlock_conn base;
    /* libpq's connection keywords; values[0] and [1] (host, port) are
     * replaced by one host's for each connect. */
    const char *keys[16];
    const char *values[16];
    char user_timeout_ms[24];
    uint64_t connect_ms;  /* per host */
    uint64_t timeout_ms;  /* bound on every statement that is not a lock wait */
    size_t nhosts;
    char **hostv, **portv;
    size_t pinned;        /* host tried first: the one of the latest new session */
    char *namespace;
    char table[64];
    int use_sequence; /* token=sequence: one global sequence, not per-name rows */
    int server_version; /* PQserverVersion() of the latest new session */
    struct dlock_sql_pool pool; /* every session, holding or free */
};

struct pg_held {
    dlock_held base;
    struct dlock_sql_held sh; /* its session, lease (ms) and client-side lease end */
    int64_t key;
    char owner_hex[33]; /* the grant's owner id, tagged on its statements */
};

/* h's session, set at the grant, never changed. */
static inline struct pg_session *hs(const struct pg_held *h)
{
    return (struct pg_session *)h->sh.s;
}

static inline dlock_client *cl(struct pg_conn *pc)
{
    return pc->base.client;
}

static inline uint64_t after_timeout(struct pg_conn *pc)
{
    return dlock_monotonic_ns() + pc->timeout_ms * MS;
}

/* Connects s (a new struct) to the first host that accepts a read-write
 * session, starting with the pinned one; each host gets connect_timeout,
 * all of them together until until_ns (0: no limit). Landing on another
 * host than the pinned one moves the pin, and closes idle sessions left on
 * other hosts. 0 or the error, recorded. */
int dlock_pg_session_open(struct pg_conn *pc, struct pg_session *s, uint64_t until_ns);
/* Closes s's connection at once (Terminate, no wait); the struct stays. */
void dlock_pg_session_close(struct pg_session *s);
/*
 * Sends sql (one or more statements) and returns the result of statement
 * `want` (0-based) in *out, or the first error. The caller clears *out.
 * No reply by until_ns (0: no limit) closes the session (s->pg = NULL,
 * s->base.silent_ms set) with DLOCK_ECONNECT.
 */
int dlock_pg_run(struct pg_conn *pc, struct pg_session *s, const char *sql, int want,
                 PGresult **out, const char *what, uint64_t until_ns);
/*
 * dlock_pg_run(), also watching cancel_fd (-1: none) while the reply is
 * awaited. When it fires, the statement is cancelled on the server (a
 * PQcancel() on a thread of its own) and *cancelled set; its reply then
 * gets CANCEL_MS more, and is returned as dlock_pg_run() does: a "canceling
 * statement" error (SQLSTATE 57014), or the result when the statement
 * ended first. A cancel that could not be sent closes the session
 * (DLOCK_ECANCELED, s->pg NULL).
 */
int dlock_pg_run_cancellable(struct pg_conn *pc, struct pg_session *s, const char *sql, int want,
                             PGresult **out, const char *what, uint64_t until_ns, int cancel_fd,
                             int *cancelled);

#endif
