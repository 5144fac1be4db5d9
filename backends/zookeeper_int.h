/*
 * What the ZooKeeper backend's files share (private to the backend): the
 * connection, what a given-up request left, the results of a bounded
 * wait. The files depend downward on this header, never on each other
 * both ways:
 *
 *   zookeeper.c          the recipe: sessions, acquire, release, inspect
 *     zookeeper_elect.c  elections: the value on the holder's node, the
 *                        read of the leader, the observers' watch
 *     zookeeper_call.c   requests bounded by a deadline and a cancel, and
 *                        the session's liveness probe
 *       zookeeper_orphans.c  cleanup of what given-up requests left
 *   zookeeper_names.c    pure parsing of lock-node names and the root
 */
#ifndef DLOCK_ZOOKEEPER_INT_H
#define DLOCK_ZOOKEEPER_INT_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The synchronous calls are declared only for the multithreaded client. */
#define THREADED 1
#include <zookeeper/zookeeper.h>

#include "dlock_backend.h"
#include "backends/zookeeper_names.h"

#define MS 1000000ull
#define NEVER UINT64_MAX

/* Results of our own waits, never ZooKeeper codes (those are <= 0). */
#define NOREPLY 1000 /* no reply by the end of the wait */
#define NOMEM 1001   /* no memory for the request */
#define CANCELLED 1002 /* the acquire's wait was cancelled first */

/* "<owner hex><tag>-lock-", or "<owner hex>__lock__" (zk_mark()) */
#define MARK_MAX (sizeof ((dlock_request *)0)->owner_hex + ZK_MARK_MAX)

/*
 * What a session may have left behind on the servers, and that nobody will
 * delete otherwise: a node of ours whose delete could not be sent or was
 * lost with the connection (path is the node), or the node a create whose
 * reply was lost may have made (search: path is its parent, mark our
 * "<owner><tag>-lock-" prefix). Queued on zc->orphans and sent as soon as the
 * session is connected, by the client's completion thread
 * (zookeeper_orphans.c).
 */
struct zk_conn;
struct zk_orphan {
    struct zk_orphan *next;
    struct zk_conn *zc;
    unsigned gen; /* the session: the nodes go with it anyway */
    int search;
    char mark[MARK_MAX];
    char path[];
};

struct zk_held;
struct zk_ewatch;

struct zk_conn {
    dlock_conn base;
    char *hosts;      /* "h1:p1,h2:p2" as the C client wants it */
    char *root;       /* "/dlock": no trailing slash */
    char *auth;       /* "user:password" for the digest scheme, or NULL */
    struct ACL_vector *acl;
    int session_ms, connect_ms;
    enum zk_layout layout; /* the names written and read; set at open */
    /* Both written by the application's thread only, under mu (the
     * keeper reads gen under mu, and never uses zh; the completion thread
     * uses zh only while gen is its session's, see zk_orphans_flush()). */
    zhandle_t *zh;    /* NULL between a dead session and the next call */
    unsigned gen;     /* counts sessions: a held lock belongs to one */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC: events, replies */
    /* The acquire's cancel fd (-1: none), and whether a wait saw it fire;
     * the application's thread only. */
    int cancel_fd;
    int cancelled;
    /* With a cancel fd, waits poll wake_fd (an eventfd made at the first
     * such wait, -1 before) instead of waiting on cv; the callbacks write
     * it while polling is set. Both under mu. */
    int wake_fd;
    int polling;
    /* Written by the client's event thread, under mu. */
    int state;                /* last session state reported */
    int ever_connected;       /* this session was established once */
    uint64_t events;          /* counts every watch and session event */
    uint64_t node_events;     /* the watch events alone (read by the tests) */
    uint64_t suspended_since; /* when the connection dropped; 0 while up */
    int negotiated_ms;        /* the timeout the server granted */
    struct zk_held *watched;  /* held locks whose node is watched, under mu */
    struct zk_orphan *orphans; /* cleanups waiting for a connection, under mu */
    struct zk_ewatch *ewatches; /* the elections' watches open (zookeeper_elect.c), under mu */
    /* Written by the completion thread, under mu: the highest zxid seen in
     * any reply's stat, so committed: every later czxid is above it. */
    uint64_t seen_zxid;
    /*
     * The session's liveness, the lease of its locks (zk_keep()). heard_ns:
     * the CLOCK_MONOTONIC time a request of this session that a server
     * answered was sent at the latest (set before its send, so earlier
     * than the server heard it); for a new session, the moment before its
     * connect was sent, which a server heard once the session is up. A
     * server can expire the session no earlier than heard_ns + the
     * negotiated timeout: it heard the client after that. The completion
     * thread advances it (zookeeper_call.c), session_start() sets it; the
     * liveness probe (zk_alive_probe()) keeps it fresh while locks are
     * kept. All under mu.
     */
    uint64_t heard_ns;
    uint64_t probe_sent_ns; /* the last probe's send time, 0: none yet */
    int probe_busy;         /* a probe is in flight */
    int probe_failed;       /* the last one had no answer: retry soon */
    uint64_t probes;        /* probes sent (read by the tests) */
};

static inline dlock_client *cl(struct zk_conn *zc)
{
    return zc->base.client;
}

static inline char *join3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

/* The request may have been carried out, its reply lost with the
 * connection; the session lives on. */
static inline int maybe_done(int rc)
{
    return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
}

/* ---- zookeeper_orphans.c: cleanup of what a given-up request left ----- */

/* The node at path, of session gen (NULL: out of memory). */
struct zk_orphan *zk_orphan_node(struct zk_conn *zc, const char *path, unsigned gen);
/* Whatever node "<prefix><seq>" a create of prefix ("<parent>/<owner>-lock-")
 * may have made. */
struct zk_orphan *zk_orphan_search(struct zk_conn *zc, const char *prefix, unsigned gen);
/* Queues o (NULL: out of memory, the node goes with the session) and sends
 * it at once if the session is connected. */
void zk_orphan_queue(struct zk_conn *zc, struct zk_orphan *o);
/* Sends every queued cleanup, if gen is still the session (any thread). */
void zk_orphans_flush(struct zk_conn *zc, unsigned gen);
/* Frees a list of cleanups (their session ended: the nodes went with it). */
void zk_orphans_free(struct zk_orphan *o);

/* ---- zookeeper_call.c: requests with a bounded wait ------------------- */

/*
 * Each request is sent asynchronously and waited for until `until`
 * (absolute CLOCK_MONOTONIC; NEVER: the C client's own timeout bounds the
 * wait, 2/3 of the session timeout into a silent network), or until the
 * acquire's cancel fd fires. Returns the reply's code, NOREPLY (no reply
 * in time), CANCELLED or NOMEM. A request given up on completes in the
 * background, and a delete's or create's leftovers are queued for cleanup.
 */
int zk_delete(struct zk_conn *zc, const char *path, uint64_t until);
int zk_exists(struct zk_conn *zc, const char *path, struct Stat *st, uint64_t until);
/* getData, with a watch if asked (delivered to the session's watcher). */
int zk_get(struct zk_conn *zc, const char *path, int watch, uint64_t until);
/* getData with a watch on each of paths[0..n), pipelined (one round trip):
 * ZOK when every node is there (*written: one's data was set since its
 * create), ZNONODE when one is gone (it leaves no watch), else the first
 * other code. */
int zk_watch_all(struct zk_conn *zc, char *const *paths, size_t n, int *written,
                 uint64_t until);
/* setData of a node (a permit's signal to the node behind it). */
int zk_set(struct zk_conn *zc, const char *path, uint64_t until);
/* exists (no watch) of each of paths[0..n), pipelined: ZOK when every
 * node is there (their stats in st[]), ZNONODE when one is gone, else the
 * first other code. With data, a getData (no watch) instead, each node's
 * first ZK_DATA_MAX - 1 bytes of data in data[], NUL-terminated. */
#define ZK_DATA_MAX 40
int zk_exists_all(struct zk_conn *zc, char *const *paths, size_t n, struct Stat *st,
                  char (*data)[ZK_DATA_MAX], uint64_t until);
/* A node that nobody has to clean up: root, parents, the ping's. */
int zk_create(struct zk_conn *zc, const char *path, int flags, uint64_t until);
/* token_top's probe: *zxid is its transaction's, above every czxid before
 * it. Leaves nothing whatever happens to the reply. */
int zk_probe(struct zk_conn *zc, const char *path, uint64_t *zxid, uint64_t until);
int zk_list(struct zk_conn *zc, const char *path, struct zk_kids *k, uint64_t until);
/* A sync pipelined with a listing of path: see zookeeper_call.c. */
int zk_sync_list(struct zk_conn *zc, const char *path, struct zk_kids *k, uint64_t until);

/* An acquire's pipelined create of an EPHEMERAL_SEQUENTIAL node under
 * prefix (with data, NUL-terminated; NULL: none) and listing of parent: both
 * codes, and what the create made. */
struct zk_made {
    int rc;          /* the create's */
    int lrc;         /* the listing's */
    unsigned gen;    /* the session the create was sent on */
    char *created;   /* rc ZOK: the new node's path (the caller frees it) */
    uint64_t czxid;  /* rc ZOK: its czxid */
    struct zk_kids kids; /* rc and lrc ZOK: the lock children (the caller's) */
};
void zk_create_list(struct zk_conn *zc, const char *prefix, const char *data,
                    const char *parent, uint64_t until, struct zk_made *m);

/*
 * The session's liveness probe: an exists of the root, which the connected
 * server answers itself, sent without waiting for it when none is in
 * flight and the last one went period_ns ago (PROBE_RETRY_MS after one
 * that had no answer); its answer (ZOK or ZNONODE) advances heard_ns to
 * its send time. One per session, however many locks are kept. mu held
 * and zc->zh set: the handle cannot be closed meanwhile (session_end()
 * takes mu first).
 */
#define PROBE_RETRY_MS 50
void zk_alive_probe(struct zk_conn *zc, uint64_t now, uint64_t period_ns);
/* The liveness probes the client has sent, all its sessions (tests). */
uint64_t dlock_zk_probes_sent(dlock_client *c);
/* The watch events the client has received, all its sessions (tests: a
 * release wakes only the waiters it admits). */
uint64_t dlock_zk_watch_events(dlock_client *c);

/* A listing of path with a getData of it pipelined (one round trip), a sync
 * ahead if asked (as zk_sync_list()): its first ZK_ELECTION_DATA_MAX bytes
 * of data in data (that much room), *len. The listing's code first, then
 * the getData's. */
#define ZK_ELECTION_DATA_MAX (DLOCK_VALUE_MAX + 256)
int zk_list_data(struct zk_conn *zc, const char *path, int sync, struct zk_kids *k, char *data,
                 size_t *len, uint64_t until);
/* An election's publish: one transaction setting node's data to value if
 * its version is still version (-1: any) and parent's to pdata (plen
 * bytes). ZOK and node's new stat, else the failed step's code (ZNONODE,
 * ZBADVERSION: the node's). */
int zk_publish_set(struct zk_conn *zc, const char *node, int version, const void *value,
                   size_t len, const char *parent, const char *pdata, size_t plen,
                   struct Stat *st, uint64_t until);

/* Wakes every waiter of zc, mu held (the client's threads). */
void zk_wake(struct zk_conn *zc);
/* The watch and session events counted so far. */
uint64_t zk_events_now(struct zk_conn *zc);
/* Waits until an event after `seen` or until `until`; 1 on an event, 0
 * at `until`, -1 when the acquire's cancel fd fired first. */
int zk_wait_event(struct zk_conn *zc, uint64_t seen, uint64_t until);
/* The acquire's waits watch req's cancel fd (if any), through wake_fd,
 * made at the first such acquire: 0 or an error recorded. */
int zk_watch_cancel(struct zk_conn *zc, const dlock_request *req);

/* ---- zookeeper_elect.c: elections (called by zookeeper.c) ------------ */

/* Publishes value on node, the election lock's own node (of session gen,
 * whose token is token): *version is the node's data version as last known
 * (-1: unknown, looked up). ZOK, ZNONODE or ZBADVERSION (the node is not
 * ours any more: nothing written), or another code. */
int zk_elect_publish(struct zk_conn *zc, const char *node, uint64_t token, int *version,
                     const void *value, size_t len, uint64_t until);
/* The election of parent, read: its lock children in *k (the caller frees
 * them), *nh holders (zk_holders()), the newest holder's czxid in *czxid
 * and, if that holder published one, its value (DLOCK_VALUE_MAX + 1 bytes
 * of room). ZNONODE: the holder let go in between, look again. */
int zk_elect_read(struct zk_conn *zc, const char *parent, struct zk_kids *k, size_t *nh,
                  uint64_t *czxid, char *value, size_t *value_len, uint64_t until);
/* The observers' watch on parent: child and data watches of its own,
 * re-armed after each event; zc's session is up. 0 or an error recorded. */
int zk_elect_watch_open(struct zk_conn *zc, const char *parent, dlock_watch **watchp);
int zk_elect_watch_fd(dlock_watch *watch);
int zk_elect_watch_read(dlock_watch *watch);
void zk_elect_watch_close(dlock_watch *watch);
/* The session ended (its watches with it): the election watches of zc
 * break, woken; the core opens them again. */
void zk_elect_session_ended(struct zk_conn *zc);

#endif
