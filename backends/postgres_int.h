/*
 * What the PostgreSQL backend's files share: the connection, session and
 * handle structs, and the statement layer's calls (postgres_io.c). The
 * recipe (postgres.c) calls down into postgres_io.c and the session layer
 * (sql_session.c); postgres_io.c calls nothing above it.
 */
#ifndef DLOCK_BACKENDS_POSTGRES_INT_H
#define DLOCK_BACKENDS_POSTGRES_INT_H

#include <inttypes.h>
#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backends/sql_session.h"
#include "core/internal.h"

#define MS 1000000ull

/* idle_session_timeout, the lease, is an int of milliseconds. */
#define TTL_MAX 2147483647u

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

/* layout=: how a name becomes its advisory lock (postgres.c, "Layouts"). */
enum pg_layout {
    PG_LAYOUT_DLOCK = 0, /* pg_advisory_lock(K), K from SHA-256 of the name */
    PG_LAYOUT_TOOZ = 1,  /* tooz's pg_advisory_lock(b0, b1): MD5(name)'s first two bytes */
    PG_LAYOUT_INT = 2    /* pg_advisory_lock(N) for a name that is the integer N */
};

struct pg_conn {
    dlock_conn base;
    /* libpq's connection keywords; values[0] and [1] (host, port) are
     * replaced by one host's for each connect. */
    const char *keys[24];
    const char *values[24];
    char user_timeout_ms[24];
    uint64_t connect_ms;  /* per host */
    uint64_t timeout_ms;  /* bound on every statement that is not a lock wait */
    size_t nhosts;
    char **hostv, **portv;
    size_t pinned;        /* host tried first: the one of the latest new session */
    char *namespace;
    char table[64];
    int use_sequence; /* token=sequence: one global sequence, not per-name rows */
    enum pg_layout layout;
    int server_version; /* PQserverVersion() of the latest new session */
    struct dlock_sql_pool pool; /* every session, holding or free */
};

struct pg_held {
    dlock_held base;
    struct dlock_sql_held sh; /* its session, lease (ms) and client-side lease end */
    int64_t key;
    char owner_hex[33]; /* the grant's owner id, tagged on its statements */
    dlock_mode mode;    /* exclusive or shared: how key is held */
    uint32_t limit;     /* a semaphore's limit (key held shared, and a slot); 0: none */
    uint32_t slot;      /* the semaphore's slot held, 0 .. limit - 1 */
    int leading;        /* holds the name's leader lock (postgres_elect.c) */
};

/* The tags of a name's two-int locks' first half (hi ^ tag): see
 * postgres_modes.c. */
#define T_GATE 0x67617465u  /* "gate" */
#define T_MUTEX 0x6d757478u /* "mutx" */
#define T_SLOT 0x736c6f74u  /* "slot" */
#define T_LIMIT 0x6c696d74u /* "limt" */
#define T_TOKEN 0x746f6b6eu /* "tokn" */
#define T_READ 0x72656164u  /* "read" */
#define T_LEADER 0x6c656164u /* "lead" */

/* The arguments ("a, b") of a name's leader lock, the two-int lock
 * (hi ^ T_LEADER, lo): held exclusive by the elected leader's session from
 * its first publish to its release, so that observers' watches, waiting
 * for it in shared mode, learn of the session's end (postgres_elect.c). */
static inline void dlock_pg_leader_args(int64_t key, char *buf, size_t len)
{
    uint64_t u = (uint64_t)key;
    snprintf(buf, len, "%" PRId32 ", %" PRId32, (int32_t)(uint32_t)((u >> 32) ^ T_LEADER),
             (int32_t)(uint32_t)u);
}

/* This database's advisory locks in pg_locks (as l). */
#define IN_DB "l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database" \
              " WHERE datname = current_database())"

/* What a name's locks are, beside its key (postgres_modes.c). */
struct pg_name {
    int64_t key;
    uint32_t hi, lo; /* the key's halves: pg_locks' classid and objid */
};

/* What an acquire statement found besides a token (dlock_pg_lock_sql()):
 * its result's columns. */
enum {
    PG_COL_TOKEN = 0, /* the grant's token; NULL: none */
    PG_COL_KIND = 1,  /* NULL, or the name's other kind: 0 a read-write lock, N a
                         semaphore of limit N */
    PG_COL_SLOT = 2,  /* a semaphore's slot taken; NULL: none */
    PG_COL_GATE = 3   /* a semaphore wait: the gate is still held (no slot yet) */
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

/* Sets client_connection_check_interval to 1 s for the transaction, where
 * the server can check (see acquire_on() in postgres.c). One statement. */
#define CHECK_CLIENT_SQL                                                                       \
    "DO $$BEGIN PERFORM set_config('client_connection_check_interval', '1000', true); "       \
    "EXCEPTION WHEN invalid_parameter_value THEN NULL; END$$; "

/* How long past its deadline a deadline wait waits for the server's reply
 * (lock_timeout ends the wait on the server at the deadline); the margin
 * of other statements' client-side bound over their server-side one. */
#define DEADLINE_MARGIN_MS 200u

/* A transaction's settings (4 statements), as the acquire's: READ
 * COMMITTED, synchronous_commit on, and every lock wait and the whole
 * statement end after ms on the server. */
void dlock_pg_tx_settings(char *buf, size_t len, uint64_t ms);
/* One transaction of its own (sql: dlock_pg_tx_settings() then
 * statements) on an idle pooled session, bounded by `timeout` on the server
 * and a little longer on the client; the result of statement `want` in
 * *out, the SQLSTATE of a failure in state. */
int dlock_pg_run_idle(struct pg_conn *pc, const char *sql, int want, PGresult **out,
                      const char *what, char state[6]);
/* The same, bounded by bound_ms on the client alone (ping: `timeout`). A
 * pooled session that died while idle is replaced once. */
int dlock_pg_run_pooled(struct pg_conn *pc, const char *sql, int want, PGresult **out,
                        const char *what, char state[6], uint64_t bound_ms);
/* A failed store-wide statement: one that ran out of `timeout` on the
 * server says what it waited for. */
int dlock_pg_store_failed(struct pg_conn *pc, int err, const char *state, const char *what);
/* The bigint key of a name in layout=dlock (postgres.c's header comment). */
int64_t dlock_pg_key(const char *ns, const char *name, size_t len);
/* The key of a name in pc's layout: dlock_pg_key()'s, tooz's (TOOZ_KEY's
 * tag and MD5(name)'s first two bytes), or the integer the name spells
 * (else DLOCK_EINVAL, reported). */
int dlock_pg_layout_key(struct pg_conn *pc, const char *name, size_t len, int64_t *key);
/* tooz's key as a bigint: "tooz" in the high half, tooz's two int4
 * arguments (0 .. 255 each) in the low 16 bits. It names the lock in the
 * statements' tag and its counter row, never an advisory lock. */
#define TOOZ_KEY(b0, b1) ((int64_t)(0x746f6f7aull << 32 | (uint64_t)(b0) << 8 | (uint64_t)(b1)))
/* The arguments of the advisory functions for the name's lock: "K" (a
 * bigint), or tooz's "b0, b1" (two int4). */
void dlock_pg_key_args(const struct pg_conn *pc, int64_t key, char *buf, size_t len);
/* The condition on pg_locks row <a>.* (a: "l." or "") that it is the
 * name's lock: objsubid 1 and the bigint's halves, or tooz's objsubid 2. */
void dlock_pg_key_match(const struct pg_conn *pc, int64_t key, const char *a, char *buf,
                        size_t len);
/* The backend's inspect() and inspect_holders() (postgres_inspect.c). */
int dlock_pg_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info);
/* leader(): inspect()'s statement, with the holder's published value. */
int dlock_pg_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                    char *value, size_t *value_len);
int dlock_pg_inspect_holders(dlock_conn *conn, const char *name, size_t len,
                             dlock_holder *holders, size_t capacity, size_t *count);

/* Elections (postgres_elect.c): the table of leaders' values is the
 * fencing table's name and this (59 + 4 bytes: an identifier), one row per
 * name's key: the value, and the grant and session that published it. */
#define PG_VALUES_SUFFIX "_ldr"
#define PG_VALUES_COLUMNS "(key bigint PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL," \
                          " pid int NOT NULL, since timestamptz, value bytea NOT NULL)"
int dlock_pg_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len);
int dlock_pg_wake(dlock_conn *conn, const char *name, size_t len);
int dlock_pg_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp);
int dlock_pg_watch_fd(dlock_watch *watch);
int dlock_pg_watch_read(dlock_watch *watch);
void dlock_pg_watch_close(dlock_watch *watch);

/* The tag that starts every statement on a holder session (tag()). */
#define TAG_HEAD "/*dlock owner="
void dlock_pg_tag(char *buf, size_t len, const char *owner_hex, uint32_t ttl_ms, uint64_t token,
                  int64_t key);

/* Shared locks and semaphores (postgres_modes.c): the statements of each
 * mode, and a semaphore's wait for a slot. */
void dlock_pg_name(int64_t key, struct pg_name *n);
/* The statement (after the transaction's settings) that takes the lock
 * req asks for on key and its token, in one round trip; its columns are
 * PG_COL_*. have_gate: a semaphore wait holding its gate already (1); it
 * keeps the gate when no slot is free (a wait) rather than letting go; 2:
 * a semaphore of 1, whose statement waits in the server for its slot. */
void dlock_pg_lock_sql(const struct pg_conn *pc, const dlock_request *req, int64_t key,
                       int have_gate, char *buf, size_t len);
/* "SELECT ..." that unlocks what this session holds of key's locks, in
 * whichever mode: undoes a grant a failed statement may have left, and
 * never touches another name's. */
void dlock_pg_unlock_if_held(const struct pg_conn *pc, char *sql, size_t len, int64_t key);
/* The expressions (comma-separated, for a SELECT) that release h's grant:
 * the first one is true when it was still held. */
void dlock_pg_unlock_exprs(const struct pg_conn *pc, const struct pg_held *h, char *buf,
                           size_t len);
/* The detail of DLOCK_EMODE for a name held as `kind` (PG_COL_KIND). */
int dlock_pg_mode_error(struct pg_conn *pc, const dlock_request *req, long long kind);
/* A semaphore wait on s (holding the name's gate, no slot free yet, s->mu
 * held): listens for releases, and looks again at each notification, and
 * at least every SEM_POLL_MS for a slot a dead holder's session freed (a
 * semaphore of 1 waits for its slot in the server's lock queue instead),
 * until a slot is taken (0, *token set) or the deadline or cancel (the
 * gate is let go: nothing is left behind). Each look is a transaction of
 * its own, with the acquire's settings and tag. */
int dlock_pg_sem_wait(struct pg_conn *pc, struct pg_session *s, const dlock_request *req,
                      int64_t key, uint64_t *token, uint32_t *slot, uint64_t *granted_ns);

#endif
