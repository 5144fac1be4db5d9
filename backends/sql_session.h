/*
 * Held-lock sessions of the SQL backends (PostgreSQL's advisory locks,
 * MariaDB's lock=named user locks), written once.
 *
 * The model. A session (a server connection) holds any number of locks and
 * unlocks each alone, and the session is the lease: its idle timer
 * (idle_session_timeout, wait_timeout) ends it, and every lock on it, when
 * its holder stops talking. So held locks share sessions:
 *   - a try runs on a "holder session" whose lease is the same (in the
 *     driver's unit), with fewer than DLOCK_SQL_LOCKS_MAX locks and not
 *     holding the key already (a second grant there would exclude
 *     nothing), and the grant stays there;
 *   - a blocking wait cannot run on a holder session (its locks' renewals
 *     and releases would queue behind it): it first tries on a holder
 *     session (dlock_sql_holder_for_wait()), and only if the lock is taken
 *     waits on a session that holds nothing, which becomes a holder
 *     session once granted;
 *   - a lock never moves: a session stays while any of its locks is held;
 *   - at most DLOCK_SQL_IDLE_KEEP sessions that hold nothing stay open for
 *     reuse (dlock_sql_trim());
 *   - any statement restarts a session's idle timer, so renewing one lock
 *     prolongs its mates on the server: every use of a session first
 *     unlocks its other locks whose client-side lease has ended
 *     (dlock_sql_expire(), DLOCK_SQL_EXPIRE_BATCH at most per use), and
 *     marks them gone (their handles then report DLOCK_ELOST);
 *   - a statement for one lock sets the session's lease to the longest its
 *     live locks need (dlock_sql_lease()): no mate's lease is cut short.
 *
 * Threads. The keeper calls a backend's keep() while the application's
 * thread may be in any other method, and a holder session is shared, so
 * keep() of one lock and the application's try, renew or release of
 * another may meet on one session. The rules, for the drivers and this
 * layer alike:
 *   - each session's mutex (mu) is held around one exchange on it (a
 *     statement and its reply, bounded by the driver's `timeout`) and
 *     around every change to what keep() reads: the connection, the lease,
 *     the list of handles and their state. A use of a shared session holds
 *     it for a few exchanges at most, never across a connect;
 *   - a blocking wait runs on a session that holds nothing (waiting set),
 *     which keep() never touches, so no one waits behind it;
 *   - the pool (which sessions exist, dlock_sql_pool) belongs to the
 *     application's thread: only it calls dlock_sql_take(),
 *     dlock_sql_session_for(), dlock_sql_holder(), dlock_sql_trim() and
 *     dlock_sql_pool_add(), and only it touches a session that holds
 *     nothing, without its mutex;
 *   - a session struct lives while a handle points to it (closed sessions
 *     stay, unused, until their handles are released), so keep() can
 *     always reach its lock's session;
 *   - one mutex at a time.
 *
 * How a driver plugs in. It embeds struct dlock_sql_session FIRST in its
 * session struct, and struct dlock_sql_held anywhere in its handle (the
 * hooks get it back with DLOCK_SQL_OF()); it fills a struct dlock_sql_ops
 * (static const) and keeps a struct dlock_sql_pool in its connection
 * (dlock_sql_pool_init(), dlock_sql_pool_close() at its close()). The
 * driver's unit of a lease (milliseconds for PostgreSQL's
 * idle_session_timeout, whole seconds for MariaDB's wait_timeout) is
 * converted at the edge: the layer only compares and takes maxima of
 * `lease` values, and counts client-side leases in CLOCK_MONOTONIC ns.
 * The driver keeps up to date: s->lease whenever a statement sets the
 * session's lease; s->pending while it has unlocked s->mu in the middle of
 * a grant not linked yet; s->silent_ms when it closes a session for want
 * of a reply; a handle's lease and lease_end_ns before dlock_sql_link() and
 * after each renewal. The layer sets gone (dlock_sql_expire()); a driver
 * that unlocks a lock past its lease on its own (a renew too late) may too.
 * A session struct the layer finds closed and holding nothing (in
 * dlock_sql_take(), dlock_sql_trim()) is destroyed: a driver keeps no
 * pointer to a free session across those calls.
 */
#ifndef DLOCK_BACKENDS_SQL_SESSION_H
#define DLOCK_BACKENDS_SQL_SESSION_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dlock_backend.h"

/* Locks that share one holder session at most: a session that ends takes
 * all of its locks with it, and every use of it scans its list. */
#define DLOCK_SQL_LOCKS_MAX 256
/* Sessions holding nothing kept open for the next wait or try; more are
 * closed as they fall free (after a burst of waits). */
#define DLOCK_SQL_IDLE_KEEP 4
/* Stale locks one use of a session unlocks at most (one statement, so the
 * mutex is held for one exchange more; the rest go at the next uses). */
#define DLOCK_SQL_EXPIRE_BATCH 64

/* The driver's struct that holds member `m` (a struct dlock_sql_held or
 * dlock_sql_session) at p. */
#define DLOCK_SQL_OF(p, type, m) ((type *)(void *)((char *)(p) - offsetof(type, m)))

struct dlock_sql_held;

/* The first member of a driver's session struct. */
struct dlock_sql_session {
    pthread_mutex_t mu;            /* see "Threads" above */
    int waiting;                   /* a blocking wait runs on it: not shared */
    size_t nheld;                  /* handles pointing to it (held, lost or let go) */
    struct dlock_sql_held *held;   /* those handles */
    uint32_t lease;                /* the lease currently set, driver's unit (0: none) */
    uint32_t pending;              /* the lease of a grant on it not yet linked (the
                                      driver unlocked mu meanwhile): dlock_sql_lease()
                                      never goes below it; 0: none */
    uint64_t silent_ms;            /* closed after no reply for this long; 0: no */
};

/* A member of a driver's lock handle. */
struct dlock_sql_held {
    struct dlock_sql_session *s;   /* set by dlock_sql_link(), never changed */
    uint64_t lease_end_ns;         /* the lease as the client sees it */
    uint32_t lease;                /* the lease this lock needs, driver's unit */
    int gone;                      /* its lease ended and it was unlocked while
                                      mates kept s alive (dlock_sql_expire()) */
    struct dlock_sql_held *prev, *next; /* s's list */
};

/* What differs between the drivers. conn is dlock_sql_pool.conn, the
 * driver's connection (its dlock_conn first: cast it back). */
struct dlock_sql_ops {
    /* Has a connection that is usable as far as the client knows (not
     * closed, not known dead). No I/O. */
    int (*alive)(const struct dlock_sql_session *s);
    /* A new session, connected: allocates the driver's struct (its
     * dlock_sql_session set up with dlock_sql_session_init()) and connects
     * it; arg is what the caller passed to dlock_sql_take() (a bound, a
     * deadline). On failure records the error (dlock_seterr) and returns
     * its code, *out untouched. Application's thread. */
    int (*open)(dlock_conn *conn, void *arg, struct dlock_sql_session **out);
    /* Closes the connection at once (never waits for the server); the
     * struct stays, with alive() false. Safe on a closed session. */
    void (*close)(struct dlock_sql_session *s);
    /* Frees a closed session's struct (dlock_sql_session_fini() included). */
    void (*destroy)(struct dlock_sql_session *s);
    /* Unlocks the n locks in batch (all on s, none gone) in one statement,
     * bounded by a whole `timeout`; s->mu held. The error it records is
     * not the caller's: it saves and restores the client's error detail.
     * 0 when every one was unlocked (they are then marked gone); else they
     * stay, to be tried at the next use (a session that turns out dead is
     * closed by the hook, taking them all). */
    int (*unlock)(dlock_conn *conn, struct dlock_sql_session *s,
                  struct dlock_sql_held *const *batch, size_t n);
    /* Is h the lock of key (the driver's key: PostgreSQL's int64_t, the
     * user lock's name)? */
    int (*is_key)(const struct dlock_sql_held *h, const void *key);
    /* Why a held lock is gone, for messages (dlock_sql_lost_why()): it was
     * let go among mates (gone); its session was closed for want of a
     * reply (silent_ms); its session ended otherwise. */
    const char *why_gone, *why_silent, *why_ended;
};

/* Every session of a connection, holding or free. Application's thread. */
struct dlock_sql_pool {
    const struct dlock_sql_ops *ops;
    dlock_conn *conn;              /* the driver's connection, given to the hooks */
    struct dlock_sql_session **v;
    size_t n, cap;
};

/* A session struct's base: zeroed, its mutex made. 0 or DLOCK_ENOMEM. */
int dlock_sql_session_init(struct dlock_sql_session *s);
void dlock_sql_session_fini(struct dlock_sql_session *s);

void dlock_sql_pool_init(struct dlock_sql_pool *p, const struct dlock_sql_ops *ops,
                         dlock_conn *conn);
/* Adds an open session (e.g. the one a driver opened at its open()).
 * 0, or DLOCK_ENOMEM (s not added: the caller closes it); no detail. */
int dlock_sql_pool_add(struct dlock_sql_pool *p, struct dlock_sql_session *s);
/* Closes and frees every session and the pool (the backend's close()). */
void dlock_sql_pool_close(struct dlock_sql_pool *p);

/* Holds no lock and waits for none: only the application's thread uses it. */
static inline int dlock_sql_free(const struct dlock_sql_session *s)
{
    return s->nheld == 0 && !s->waiting;
}

/*
 * A session that holds nothing, alive, else a new one (ops->open(arg));
 * *opened says which. Free sessions found dead are closed, and closed free
 * structs freed, on the way. Not locked. A pooled session may still turn
 * out dead on its next statement (its idle timer ran out while pooled, the
 * server restarted).
 */
int dlock_sql_take(struct dlock_sql_pool *p, void *arg, struct dlock_sql_session **out,
                   int *opened);
/* A live holder session of this lease, with room, not holding key, its
 * mutex locked; NULL if none. */
struct dlock_sql_session *dlock_sql_holder(struct dlock_sql_pool *p, uint32_t lease,
                                           const void *key);
/*
 * The session for one attempt, its mutex locked: for a try, a holder
 * session of its lease (dlock_sql_holder()), else a free one; for a wait, a
 * free one with waiting set (the driver clears it after the attempt).
 * *opened: a new one. Tries pack onto few sessions; only waits need
 * sessions of their own.
 */
int dlock_sql_session_for(struct dlock_sql_pool *p, int for_try, uint32_t lease,
                          const void *key, void *arg, struct dlock_sql_session **out, int *opened);
/*
 * A wait's first attempt runs as a try on a holder session of its lease
 * (most waits need not wait, and so share a session too), locked; NULL for
 * a try, when there is none, or when the deadline is nearer than
 * timeout_ms (each statement on a shared session gets a whole `timeout`:
 * a bound that ran out would close it and lose its mates' locks).
 */
struct dlock_sql_session *dlock_sql_holder_for_wait(struct dlock_sql_pool *p,
                                                    const dlock_request *req,
                                                    uint64_t timeout_ms, uint32_t lease,
                                                    const void *key);
/* Closes sessions that hold nothing beyond DLOCK_SQL_IDLE_KEEP live ones,
 * and frees the structs of closed ones no handle points to (s pointers to
 * free sessions are stale afterwards). */
void dlock_sql_trim(struct dlock_sql_pool *p);

/* Another live lock of ours (or a grant being made) is on s besides self
 * (NULL: any): a statement there must not be cut short, or its mates'
 * locks are lost with the session. s->mu held. */
int dlock_sql_mates(const struct dlock_sql_session *s, const struct dlock_sql_held *self);
/* The lease a statement for self (NULL for an acquire) sets on s: the
 * largest of lease, the pending grant's and each live mate's. Each mate
 * was promised its own from its latest statement; shortening it could end
 * its lease before its holder expects, lengthening it only keeps it on the
 * store longer than its holder counts on. s->mu held. */
uint32_t dlock_sql_lease(const struct dlock_sql_session *s, const struct dlock_sql_held *self,
                         uint32_t lease);
/*
 * Locks on s, other than self, whose lease as their holder counts it has
 * ended: unlocked (ops->unlock, one statement, DLOCK_SQL_EXPIRE_BATCH at
 * most) and marked gone. Alone on its session such a lock goes with the
 * session when its idle timer runs out; among mates that keep renewing it
 * would stay held. (A lock past its lease but still held is safe to
 * renew: no one else had it; so self is never unlocked here.) s->mu held;
 * one round trip, only when there is something to do.
 */
void dlock_sql_expire(struct dlock_sql_pool *p, struct dlock_sql_session *s,
                      const struct dlock_sql_held *self);
/* Links a granted lock to its session; s->mu held. */
void dlock_sql_link(struct dlock_sql_session *s, struct dlock_sql_held *h);
/* Unlinks h from its session; h->s->mu held. 1 when the session now holds
 * nothing (the caller trims once it has unlocked the mutex). */
int dlock_sql_unlink(struct dlock_sql_held *h);
/* Why h is gone (ops' why_*), for messages. */
const char *dlock_sql_lost_why(const struct dlock_sql_pool *p, const struct dlock_sql_held *h);

#endif
