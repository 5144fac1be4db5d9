/*
 * zookeeper://[user:password@]host[:port][,host[:port]...][/root][?options]
 * through the multithreaded ZooKeeper C client (libzookeeper_mt).
 *
 * The lock recipe is Curator's InterProcessMutex: each acquire creates an
 * EPHEMERAL_SEQUENTIAL child "<owner>-lock-<seq>" of <root>/<encoded name>
 * (a container node, which the server removes once it is empty again). The
 * child with the lowest sequence number holds the lock; every other one
 * watches only its immediate predecessor (no herd) and looks again when that
 * one goes. The create and the listing are pipelined: ZooKeeper runs one
 * session's requests in order, so the listing sent right behind the create
 * already contains the new child, and an uncontended acquire costs one
 * round trip.
 *
 * Shared locks and semaphores are the same queue, the node's mode written
 * in its name before "-lock-" (zookeeper_names.h: "-__READ__", "-__SEM<N>__";
 * none for an exclusive request, so today's layout is unchanged and an old
 * client sees every node as a writer's). zk_turn() says what a node does:
 * a writer holds when first, a reader when no writer is ahead (it watches
 * the nearest writer ahead), a permit among the first N (the first waiter
 * watches every holder, a later one the node just before it; a permit
 * granted after waiting sets its node's data once, which wakes the node
 * behind it to take over as the first waiter: signal_next()). A node of
 * another kind ahead is DLOCK_EMODE at once. Tokens stay the czxid: no
 * node is granted before one ahead of it, so they follow grant order.
 *
 * layout=kazoo (zookeeper_names.h, enum zk_layout): the nodes are kazoo's
 * Lock / WriteLock / ReadLock nodes, "<owner>__lock__<seq>" for an
 * exclusive request and "<owner>__rlock__<seq>" for a shared one, the owner
 * id as their data, under a persistent parent (kazoo's ensure_path()); the
 * listing counts kazoo's nodes and the dlock layout's alike, one queue by
 * sequence number, and zk_turn() is unchanged: kazoo's WriteLock waits for
 * every node ahead, its ReadLock for the writers ahead, as ours do. No
 * semaphores (the caps of such a connection drop SEMAPHORE).
 *
 * The session is the lease: a holder's nodes live exactly as long as its
 * session, one per client, whose timeout is the URI's session_timeout (the
 * per-acquire TTL is not used). Fencing tokens are the lock node's czxid.
 * A kept lock's lease is its session's, as the client can know it: the
 * servers cannot expire the session before the send of the last request
 * they answered + the session timeout, and keep() reports that, kept fresh
 * by one liveness probe per session (see zk_keep()).
 *
 * Store-wide tokens (dlock migrate): czxids are the ensemble's transaction
 * ids, one sequence for every write to any node, and dlock cannot set them.
 * token_top is the current zxid, from a probe: one multi transaction that
 * creates an ephemeral "!top-<session>" under the root ('!' never occurs in
 * encoded names), sets its data and deletes it, whose setData stat carries
 * the transaction's zxid. Every earlier grant's node was created by an
 * earlier transaction, so its czxid is below. One round trip and one write
 * in the log, and nothing is left behind even if the reply is lost (the
 * three steps commit together or not at all). No read can do it: a node's
 * stat only has the zxids of its own changes (the root's pzxid moves with
 * its children, not with the lock nodes a level below), and the C client
 * does not expose the zxid of its replies' headers. raise_floor stores
 * nothing, it checks: 0 when floor is at most a zxid this connection has
 * seen committed (any stat it received), else at most a new probe's zxid,
 * since every later czxid is above both (a floor up to
 * DLOCK_RAISE_STEPS_MAX above it is reached with more probes, one per
 * zxid); else DLOCK_ENOTSUP. raise_token
 * checks the same way, so that a multi-name lock's part accepts the
 * largest czxid of its siblings.
 *
 * Inspect (dlock_inspect, dlock_inspect_holders) writes nothing and joins
 * no queue: a sync pipelined with a getChildren of <root>/<encoded name>
 * (so that a follower that was behind answers as of the leader's state),
 * then an exists (no watch) of the holders it reports, pipelined, for their
 * czxids. The first nodes hold (zk_holders()): the newest one's czxid is
 * the token (and the last token granted: every earlier holder's node was
 * created before it), the owner id before its tag and "-lock-" is the
 * owner; the others are the waiters, counted and listed in the order they
 * will be served. No parent node, or no child: free, no waiter. A
 * holder's or waiter's node whose session expired has gone with it. Not
 * known: a lease (the session's, known to the servers only: a dead holder
 * counts until its session expires), the last token of a free name (the
 * nodes are gone), and whether a waiter whose delete has not reached the
 * servers yet has given up. See zk_inspect().
 *
 * Every request is asynchronous and the application's thread waits for its
 * reply only as long as the call's bound (its deadline, connect_timeout, a
 * part of the session timeout): the C client's synchronous calls would wait
 * for its own timeout, 2/3 of the session timeout into a silent network
 * (backends/zookeeper_call.c). A request given up on still completes on
 * the client's completion thread, and what it may have left on the servers
 * (a lock node created after the acquire gave up, a delete lost with the
 * connection) is cleaned up there: the node is deleted, or looked for by
 * our owner id under its parent, as soon as the session is connected
 * again, whatever the application does (backends/zookeeper_orphans.c).
 *
 * Cancel (request.cancel_fd): every wait of an acquire (for a reply, an
 * event on the predecessor's watch, the session's return) blocks on the
 * condition variable the client's threads broadcast, which cannot also
 * watch a descriptor. With a cancel fd, the wait blocks in the core's
 * wait on {wake_fd, cancel_fd} instead: an eventfd of the connection that
 * the callbacks write while a waiter waits on it (zk_conn.polling), so
 * nothing wakes on a timer. Once the fd fires, every wait of the acquire
 * returns at once and it gives up as at a deadline: our node is deleted (a
 * request left unanswered is cleaned up by its completion) and the answer
 * is DLOCK_ECANCELED.
 *
 * See docs/zookeeper.md for what this guarantees and where it is weaker,
 * and zookeeper_int.h for how the backend's files depend on each other.
 */
#include "backends/zookeeper_int.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "backends/file.h"
#include "core/internal.h"

#define DEFAULT_PORT 2181
#define DEFAULT_ROOT "/dlock"
#define DEFAULT_SESSION_MS 4000
#define DEFAULT_CONNECT_MS 5000
/* Longest wait slice while disconnected: how late a session that has been
 * suspended for its whole timeout is noticed as dead. */
#define SUSPENDED_SLICE_MS 100
/* After a call failed with a connection loss the event thread may not have
 * reported the new state yet: wait this long for it before trying again. */
#define RETRY_PAUSE_MS 20
/* An acquire's last reply may be in flight at its deadline: it is waited
 * for this much longer (a deadline already past still makes one attempt). */
#define REPLY_GRACE_MS 100
/* How long a waiter that gave up waits for its node's delete to be
 * answered before returning; past that it completes in the background. */
#define CLEANUP_WAIT_MS 100
/* The session's liveness probe goes every session timeout / PROBE_DIV while
 * locks are kept. Its answer is seen by the next keep() (within
 * DLOCK_KEEP_CHECK_MAX_MS), so the lease it proves runs at least
 * timeout * (1 - 1/PROBE_DIV) - 2 x 500 ms ahead before the next: more
 * than the loss margin (DLOCK_LOSS_MARGIN_DIV) even on the 2 s sessions
 * the servers grant at the least with tickTime=1000 (250 ms to spare). */
#define PROBE_DIV 4

static const char *const zk_schemes[] = {"zookeeper", NULL};
static const char *const zk_options[] = {"session_timeout", "connect_timeout", "layout", NULL};
/* The layout option's values, in enum zk_layout's order. */
static const char *const zk_layouts[] = {"dlock", "kazoo", NULL};

enum session_status { SESSION_UP, SESSION_SUSPENDED, SESSION_DEAD };

struct zk_held {
    dlock_held base;
    unsigned gen;
    struct zk_held *next; /* on zc->watched, under mu */
    int deleted;          /* our node was deleted (not by us), under mu */
    int version;          /* our node's data version as known (-1: look it up) */
    char path[];          /* our lock node */
};

/* One acquire in progress. */
struct zk_acq {
    struct zk_conn *zc;
    const dlock_request *req;
    char *parent;      /* <root>/<encoded name> */
    char *prefix;      /* <parent>/<owner>-lock- */
    char *node;        /* our lock node, NULL while we have none */
    unsigned gen;      /* the session node belongs to */
    int create_lost;   /* a create's reply was lost: look for our node */
    unsigned lost_gen; /* the session that create was sent on */
    uint64_t czxid;    /* node's; 0 until known */
    uint64_t until;    /* how long connection waits may last */
    int waited;        /* a permit that waited: it signals once it holds */
};

static int oom(struct zk_conn *zc)
{
    return dlock_seterr(cl(zc), DLOCK_ENOMEM, "out of memory");
}

static uint64_t after_ms(uint64_t from, uint64_t ms)
{
    return from == NEVER ? NEVER : from + ms * MS;
}

/* The session timeout in force: the one granted, else the one asked. */
static int timeout_ms(struct zk_conn *zc)
{
    pthread_mutex_lock(&zc->mu);
    int t = zc->negotiated_ms > 0 ? zc->negotiated_ms : zc->session_ms;
    pthread_mutex_unlock(&zc->mu);
    return t;
}

static int is_connection_error(int rc)
{
    return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONEXPIRED ||
           rc == ZSESSIONMOVED || rc == ZINVALIDSTATE || rc == ZCLOSING;
}

/* ---- session state -------------------------------------------------- */

static void silent_log(const char *message)
{
    (void)message; /* the client's chatter must not reach the application's stderr */
}

/* Runs on the client's completion thread. */
static void on_event(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_conn *zc = ctx;
    int flush = 0;
    unsigned gen;
    pthread_mutex_lock(&zc->mu);
    if (type == ZOO_DELETED_EVENT && path) {
        /* Our release takes a lock off the list before deleting its node:
         * a held lock still listed lost its node to someone else. */
        for (struct zk_held *h = zc->watched; h; h = h->next)
            if (strcmp(h->path, path) == 0)
                h->deleted = 1;
    }
    if (type == ZOO_SESSION_EVENT) {
        zc->state = state;
        if (state == ZOO_CONNECTED_STATE) {
            if (zc->suspended_since)
                dlock_count_reconnect(zc->base.client);
            zc->suspended_since = 0;
            zc->ever_connected = 1;
            zc->negotiated_ms = zoo_recv_timeout(zh);
            /* heard_ns stays: a server heard the reconnection, but when it
             * was sent is not known here (this runs after the fact, on the
             * completion thread); the next probe's answer moves it on. */
            flush = zc->orphans != NULL && zh == zc->zh;
        } else if (zc->ever_connected && !zc->suspended_since) {
            zc->suspended_since = dlock_monotonic_ns();
        }
    }
    gen = zc->gen;
    zc->events++;
    if (type != ZOO_SESSION_EVENT)
        zc->node_events++;
    zk_wake(zc);
    pthread_mutex_unlock(&zc->mu);
    /* Connected again: what given-up requests left goes now, whether or not
     * the application ever calls again. */
    if (flush)
        zk_orphans_flush(zc, gen);
}

/*
 * Up, suspended (disconnected, the session may live on), or dead. Like
 * Curator, a session disconnected for its whole timeout counts as dead even
 * before a server says so: by then the ensemble has expired it (or will, as
 * soon as it has a quorum again), so its nodes cannot be relied on.
 */
static enum session_status session_status(struct zk_conn *zc)
{
    enum session_status st;
    if (!zc->zh)
        return SESSION_DEAD;
    pthread_mutex_lock(&zc->mu);
    int timeout = zc->negotiated_ms > 0 ? zc->negotiated_ms : zc->session_ms;
    if (zc->state == ZOO_CONNECTED_STATE)
        st = SESSION_UP;
    else if (zc->state == ZOO_EXPIRED_SESSION_STATE || zc->state == ZOO_AUTH_FAILED_STATE)
        st = SESSION_DEAD;
    else if (zc->suspended_since &&
             dlock_monotonic_ns() - zc->suspended_since >= (uint64_t)timeout * MS)
        st = SESSION_DEAD;
    else
        st = SESSION_SUSPENDED;
    pthread_mutex_unlock(&zc->mu);
    return st;
}

/* Ends the session: its nodes go with it (at once if the server hears the
 * close, else when it expires the session), and so do the cleanups queued
 * for them. */
static void session_end(struct zk_conn *zc)
{
    zhandle_t *zh = zc->zh;
    /* The keeper reads gen under mu: a lock of the old session reads as
     * lost from here on; so do the completions, which then leave the old
     * session's cleanups alone. The close runs unlocked: it joins the
     * client's threads, whose callbacks take mu. */
    pthread_mutex_lock(&zc->mu);
    zc->zh = NULL;
    zc->gen++;
    pthread_mutex_unlock(&zc->mu);
    zk_elect_session_ended(zc);
    if (zh)
        zookeeper_close(zh);
    pthread_mutex_lock(&zc->mu);
    struct zk_orphan *o = zc->orphans;
    zc->orphans = NULL;
    pthread_mutex_unlock(&zc->mu);
    zk_orphans_free(o);
}

static void auth_done(int rc, const void *data)
{
    (void)rc, (void)data; /* digest credentials are checked against ACLs, not here */
}

static int session_start(struct zk_conn *zc)
{
    pthread_mutex_lock(&zc->mu);
    zc->state = 0;
    zc->ever_connected = 0;
    zc->suspended_since = 0;
    zc->negotiated_ms = 0;
    /* Before the connect goes: once the session is up, a server heard a
     * connect sent after this, and the session's timeout started no
     * earlier (a lower bound, so safe; every answered request of the
     * session then moves it on). */
    zc->heard_ns = dlock_monotonic_ns();
    zc->probe_sent_ns = 0;
    zc->probe_busy = 0;
    zc->probe_failed = 0;
    pthread_mutex_unlock(&zc->mu);
    /* The client's I/O and completion threads start here and inherit a
     * mask blocking every signal: the application's signals reach its own
     * threads (a wait's EINTR stays theirs), and a SIGPIPE could never
     * kill the process from there (the client sends with MSG_NOSIGNAL
     * anyway). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    zhandle_t *zh = zookeeper_init2(zc->hosts, on_event, zc->session_ms, NULL, zc, 0, silent_log);
    int saved_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* The host list is ours, well formed: what the client refuses is a
     * name that does not resolve (ENOENT, or EINVAL for a resolver
     * failure), so the servers are unreachable, as for any backend. */
    if (!zh && saved_errno == ENOMEM)
        return oom(zc);
    if (!zh)
        return dlock_seterr(cl(zc), DLOCK_ECONNECT,
                            "zookeeper %s: cannot resolve the host names (%s)", zc->hosts,
                            saved_errno == ENOENT ? "no such host" : strerror(saved_errno));
    pthread_mutex_lock(&zc->mu);
    zc->zh = zh;
    pthread_mutex_unlock(&zc->mu);
    /* By default the client's I/O thread resolves the host names at every
     * poll. Besides the DNS traffic, a process that forks while that thread
     * is inside getaddrinfo() leaves the child with glibc's resolver lock
     * taken: its first getaddrinfo() (opening a client) hangs. Resolve only
     * when (re)connecting. */
    zoo_set_servers_resolution_delay(zc->zh, -1);
    /* Queued ahead of every request, and re-sent by the client on every
     * reconnection. */
    if (zc->auth && zoo_add_auth(zc->zh, "digest", zc->auth, (int)strlen(zc->auth), auth_done,
                                 NULL) != ZOK) {
        session_end(zc);
        return oom(zc);
    }
    return 0;
}

/* Waits while the session is suspended, at most until `until`. */
static enum session_status wait_connected(struct zk_conn *zc, uint64_t until)
{
    for (;;) {
        uint64_t seen = zk_events_now(zc);
        enum session_status st = session_status(zc);
        uint64_t now = dlock_monotonic_ns();
        if (st != SESSION_SUSPENDED || now >= until)
            return st;
        uint64_t slice = now + SUSPENDED_SLICE_MS * MS;
        if (zk_wait_event(zc, seen, slice < until ? slice : until) < 0)
            return st; /* cancelled: the caller sees zc->cancelled */
    }
}

/*
 * A session that is up, starting a new one if the last one died; bounded by
 * until. DLOCK_ECONNECT (detail naming the hosts) when none is up by then.
 */
static int session_connect(struct zk_conn *zc, uint64_t until)
{
    for (;;) {
        enum session_status st = wait_connected(zc, until);
        if (st == SESSION_UP) {
            /* The completion thread sends them on connection; this
             * catches any requeued since. */
            zk_orphans_flush(zc, zc->gen);
            return 0;
        }
        if (st == SESSION_DEAD) {
            if (zc->zh && zoo_state(zc->zh) == ZOO_AUTH_FAILED_STATE)
                return dlock_seterr(cl(zc), DLOCK_EAUTH,
                                    "zookeeper %s: the servers refused the credentials", zc->hosts);
            session_end(zc);
            int err = session_start(zc);
            if (err)
                return err;
            continue;
        }
        if (zc->cancelled)
            return dlock_cancelled(cl(zc));
        return dlock_seterr(cl(zc), DLOCK_ECONNECT,
                            "zookeeper %s: no session with any server (connect_timeout or "
                            "deadline reached)", zc->hosts);
    }
}

/* ---- errors ----------------------------------------------------------- */

static int zk_error(struct zk_conn *zc, int rc, const char *what, const char *path)
{
    int code = DLOCK_ESTORE;
    if (rc == NOMEM)
        return oom(zc);
    if (rc == CANCELLED)
        return dlock_cancelled(cl(zc));
    if (rc == NOREPLY)
        return dlock_seterr(cl(zc), DLOCK_ECONNECT, "zookeeper %s: %s %.80s: no reply in time",
                            zc->hosts, what, path);
    if (is_connection_error(rc))
        code = DLOCK_ECONNECT;
    else if (rc == ZNOAUTH || rc == ZAUTHFAILED)
        code = DLOCK_EAUTH;
    else if (rc == ZMARSHALLINGERROR)
        code = DLOCK_ENOMEM;
    else if (rc == ZBADARGUMENTS)
        code = DLOCK_EINVAL;
    else if (rc == ZSYSTEMERROR)
        code = DLOCK_EIO;
    return dlock_seterr(cl(zc), code, "zookeeper %s: %s %.80s: %s", zc->hosts, what, path,
                        zerror(rc));
}

/* A connection error was seen: give the event thread a moment to report
 * the state, so that the caller's next session_connect() waits on it. */
static void retry_pause(struct zk_conn *zc, uint64_t seen)
{
    zk_wait_event(zc, seen, dlock_monotonic_ns() + RETRY_PAUSE_MS * MS);
}

/* ---- nodes ------------------------------------------------------------- */

/* Creates path and its missing ancestors, the last one with `flags`.
 * 0, or the failed request's code (NOREPLY when until passed). */
static int create_path(struct zk_conn *zc, const char *path, int flags, uint64_t until)
{
    int rc = zk_create(zc, path, flags, until);
    if (rc == ZNONODE) {
        char *up = strdup(path);
        if (!up)
            return NOMEM;
        char *slash = strrchr(up, '/');
        if (slash && slash != up) {
            *slash = '\0';
            rc = create_path(zc, up, ZOO_PERSISTENT, until);
            free(up);
            if (rc != ZOK)
                return rc;
        } else {
            free(up);
        }
        rc = zk_create(zc, path, flags, until);
    }
    return rc == ZNODEEXISTS ? ZOK : rc;
}

/* The root exists and we may read it: with digest credentials, this is
 * where a wrong password shows (ZooKeeper accepts any digest at login and
 * only ACL checks tell). */
static int check_root(struct zk_conn *zc, uint64_t until)
{
    int rc;
    /* A member that stalls past the session's ping bound (a loaded JVM)
     * fails the call with a connection error while the client moves to
     * another member: look again on the new connection, within until. */
    for (;;) {
        uint64_t seen = zk_events_now(zc);
        rc = zk_get(zc, zc->root, 0, until);
        if (!is_connection_error(rc) || dlock_monotonic_ns() >= until)
            break;
        retry_pause(zc, seen);
        int err = session_connect(zc, until);
        if (err)
            return err;
    }
    if (rc == ZNONODE) {
        rc = create_path(zc, zc->root, ZOO_PERSISTENT, until);
        return rc == ZOK ? 0 : zk_error(zc, rc, "cannot create", zc->root);
    }
    if (rc == ZNOAUTH)
        return dlock_seterr(cl(zc), DLOCK_EAUTH,
                            "zookeeper %s: %s may not read %s (wrong password, or its ACL "
                            "is for other credentials)",
                            zc->hosts, zc->auth ? "this digest user" : "an unauthenticated client",
                            zc->root);
    if (rc != ZOK)
        return zk_error(zc, rc, "cannot read", zc->root);
    return 0;
}

static const char *basename_of(const char *path)
{
    return strrchr(path, '/') + 1;
}

/* ---- acquire ----------------------------------------------------------- */

/* Positive results of an acquire step: go round again, at once (AGAIN) or
 * once the connection is back (RETRY: a call failed with a connection
 * error). */
enum { AGAIN = 1, RETRY = 2 };

/* How long an acquire waits for one reply. */
static uint64_t reply_until(const struct zk_acq *a)
{
    return after_ms(a->until, REPLY_GRACE_MS);
}

/* No reply by the acquire's bound: it gives up. */
static int no_reply(struct zk_acq *a)
{
    if (a->req->wait == DLOCK_WAIT_DEADLINE)
        return dlock_seterr(cl(a->zc), DLOCK_ETIMEDOUT,
                            "zookeeper %s: the deadline passed waiting for the servers' reply",
                            a->zc->hosts);
    return dlock_seterr(cl(a->zc), DLOCK_ECONNECT,
                        "zookeeper %s: no reply from the servers within connect_timeout (%d ms)",
                        a->zc->hosts, a->zc->connect_ms);
}

/* An acquire step's request failed with rc: its result for the turn. */
static int step_error(struct zk_acq *a, int rc, const char *what, const char *path)
{
    if (rc == CANCELLED)
        return dlock_cancelled(cl(a->zc));
    if (rc == NOREPLY)
        return no_reply(a);
    if (is_connection_error(rc))
        return RETRY;
    return zk_error(a->zc, rc, what, path);
}

static int list_kids(struct zk_acq *a, struct zk_kids *k)
{
    int rc = zk_list(a->zc, a->parent, k, reply_until(a));
    if (rc == ZNONODE) {
        k->v = NULL, k->n = 0; /* the container went with its last child */
        return 0;
    }
    return rc == ZOK ? 0 : step_error(a, rc, "cannot list", a->parent);
}

/*
 * Protected create: a create whose reply was lost may still have made our
 * node. Our owner id in its name finds it, rather than making a second one
 * and leaving the first as an orphan that would block everyone behind it
 * until our session ends.
 */
static int find_lost_create(struct zk_acq *a, struct zk_kids *k)
{
    int err = list_kids(a, k);
    if (err)
        return err; /* still lost: looked for again, or by drop_node() */
    a->create_lost = 0;
    long i = zk_kids_find(k, basename_of(a->prefix));
    if (i < 0)
        return 0; /* it never reached the server: create again */
    if (!(a->node = join3(a->parent, "/", k->v[i].name)))
        return oom(a->zc);
    a->gen = a->zc->gen;
    a->czxid = 0; /* read by the turn */
    return 0;
}

/* The pipelined create + list (zk_create_list()). */
static int create_and_list(struct zk_acq *a, struct zk_kids *k)
{
    struct zk_conn *zc = a->zc;
    struct zk_made m;
    uint64_t until = reply_until(a);
    /* kazoo writes its identifier as the node's data (its contenders()
     * lists them): ours is the owner id. */
    zk_create_list(zc, a->prefix, zc->layout == ZK_LAYOUT_KAZOO ? a->req->owner_hex : NULL,
                   a->parent, until, &m);
    int rc = m.rc, lrc = m.lrc;
    if (rc == ZOK) {
        a->node = join3(a->parent, "/", basename_of(m.created));
        if (!a->node) /* made, but we cannot name it: it must not stay */
            zk_orphan_queue(zc, zk_orphan_node(zc, m.created, m.gen));
        free(m.created);
        a->gen = m.gen;
        a->czxid = m.czxid;
        if (lrc == ZOK)
            *k = m.kids;
        if (!a->node)
            return oom(zc);
        if (lrc == ZOK)
            return 0;
        if (lrc == NOREPLY || lrc == CANCELLED) /* our node is deleted by drop_node() */
            return step_error(a, lrc, "cannot list", a->parent);
        return list_kids(a, k);
    }
    if (rc == ZNONODE) { /* no parent yet, or its container was just removed */
        /* kazoo's parents are persistent: a kazoo Lock checks its parent
         * once, and a container removed under it fails its next create. */
        rc = create_path(zc, a->parent,
                         zc->layout == ZK_LAYOUT_KAZOO ? ZOO_PERSISTENT : ZOO_CONTAINER, until);
        return rc == ZOK ? AGAIN : step_error(a, rc, "cannot create", a->parent);
    }
    if (maybe_done(rc)) {
        a->create_lost = 1;
        a->lost_gen = m.gen;
        return RETRY;
    }
    return step_error(a, rc, "cannot create a lock node under", a->parent);
}

/* Makes our node (or finds the one a lost reply made) and lists the
 * parent's lock children. */
static int make_node(struct zk_acq *a, struct zk_kids *k)
{
    if (a->create_lost) {
        int err = find_lost_create(a, k);
        if (err || a->node)
            return err;
        zk_kids_free(k);
    }
    return create_and_list(a, k);
}

/* Watches the nodes a turn waits for (zk_turn()) and waits until one
 * changes, or the session does, or the deadline passes (DLOCK_ETIMEDOUT).
 * A node already gone, or a permit's predecessor that already signalled,
 * means looking again at once. */
static int wait_nodes(struct zk_acq *a, const struct zk_kids *k, const struct zk_turn *t)
{
    struct zk_conn *zc = a->zc;
    char **paths = calloc(t->count, sizeof *paths);
    int rc = paths ? ZOK : NOMEM, written = 0;
    for (size_t j = 0; j < t->count && rc == ZOK; j++)
        if (!(paths[j] = join3(a->parent, "/", k->v[t->first + j].name)))
            rc = NOMEM;
    uint64_t seen = zk_events_now(zc);
    /* getData rather than exists: on a node already gone it leaves no
     * watch behind. */
    if (rc == ZOK)
        rc = zk_watch_all(zc, paths, t->count, &written, reply_until(a));
    for (size_t j = 0; paths && j < t->count; j++)
        free(paths[j]);
    free(paths);
    if (rc == ZNONODE || (rc == ZOK && t->signal && written))
        return 0;
    if (rc != ZOK)
        return step_error(a, rc, t->count > 1 ? "cannot watch the nodes before ours under"
                                              : "cannot watch the node before ours under",
                          a->parent);
    uint64_t until = a->req->wait == DLOCK_WAIT_DEADLINE ? a->req->deadline_ns : NEVER;
    int got = zk_wait_event(zc, seen, until);
    if (got < 0)
        return dlock_cancelled(cl(zc));
    if (!got)
        return dlock_seterr(cl(zc), DLOCK_ETIMEDOUT,
                            "the deadline passed with the lock still held elsewhere");
    return 0;
}

/* A request of another kind than a node before ours: refused at once. */
static int mismatch(struct zk_acq *a, const struct zk_kid *other)
{
    const dlock_request *r = a->req;
    int nl = r->name_len > 80 ? 80 : (int)r->name_len;
    if (other->kind == ZK_PERMIT)
        return dlock_seterr(cl(a->zc), DLOCK_EMODE,
                            "%.*s is held as a semaphore of limit %u (asked: %s)", nl, r->name,
                            other->limit, r->limit ? "another limit" : "a read-write lock");
    return dlock_seterr(cl(a->zc), DLOCK_EMODE,
                        "%.*s is held as a read-write lock (asked: a semaphore of limit %u)",
                        nl, r->name, r->limit);
}

/* A permit that held after waiting writes its node's data once, which the
 * node behind it watches (zk_turn()): that one becomes the first waiter.
 * Nobody watches a node granted at its first look, nor the last one. */
static int signal_next(struct zk_acq *a, const struct zk_kids *k, size_t i)
{
    if (!a->waited || !a->req->limit || i + 1 >= k->n)
        return 0;
    int rc = zk_set(a->zc, a->node, reply_until(a));
    if (rc == ZNONODE) { /* deleted under us: queue again */
        free(a->node);
        a->node = NULL;
        return AGAIN;
    }
    if (rc != ZOK)
        return step_error(a, rc, "cannot write", a->node);
    a->waited = 0;
    return 0;
}

static int no_session(struct zk_acq *a)
{
    if (a->req->wait == DLOCK_WAIT_DEADLINE)
        return dlock_seterr(cl(a->zc), DLOCK_ETIMEDOUT,
                            "zookeeper %s: the deadline passed while no server could be reached",
                            a->zc->hosts);
    return DLOCK_ECONNECT;
}

/* One turn: our node, the children, and whether we are first. 0 when the
 * lock is ours, AGAIN or RETRY to go round again, or an error. */
static int acquire_turn(struct zk_acq *a, struct zk_kids *k)
{
    struct zk_conn *zc = a->zc;
    if (session_connect(zc, a->until) != 0)
        return zc->cancelled ? dlock_cancelled(cl(zc)) : no_session(a);
    if (a->node && a->gen != zc->gen) { /* its session died: the node went with it */
        free(a->node);
        a->node = NULL;
    }
    if (a->create_lost && a->lost_gen != zc->gen)
        a->create_lost = 0;
    int err = a->node ? list_kids(a, k) : make_node(a, k);
    if (err)
        return err;
    if (!a->czxid) { /* a node found after a lost reply: its token */
        struct Stat st;
        int rc = zk_exists(zc, a->node, &st, reply_until(a));
        if (rc == ZOK)
            a->czxid = (uint64_t)st.czxid;
        else if (rc != ZNONODE)
            return step_error(a, rc, "cannot read", a->node);
    }
    long i = zk_kids_find(k, basename_of(a->node));
    if (i < 0 || !a->czxid) { /* deleted under us (an administrator?): queue again */
        free(a->node);
        a->node = NULL;
        return AGAIN;
    }
    struct zk_turn t;
    zk_turn(k, (size_t)i, &t);
    if (t.verdict == ZK_MISMATCH)
        return mismatch(a, &k->v[t.first]);
    if (t.verdict == ZK_GRANTED)
        return signal_next(a, k, (size_t)i);
    if (a->req->wait == DLOCK_WAIT_TRY)
        return dlock_seterr(cl(zc), DLOCK_EBUSY, "the lock is held by another owner");
    a->waited = 1;
    int err2 = wait_nodes(a, k, &t);
    return err2 ? err2 : AGAIN;
}

/*
 * Deletes what an acquire that gives up may have left: its node, or the one
 * a create whose reply was lost may have made. The delete's reply is waited
 * for CLEANUP_WAIT_MS at most; whatever cannot be done now (the connection
 * is down or silent) is done by the client's completion thread when the
 * session is connected again. Nothing to do when the session has ended.
 */
static void drop_node(struct zk_acq *a)
{
    struct zk_conn *zc = a->zc;
    if (a->node && a->gen == zc->gen) {
        if (session_status(zc) == SESSION_UP) {
            int rc = zk_delete(zc, a->node, dlock_monotonic_ns() + CLEANUP_WAIT_MS * MS);
            /* NOREPLY: given up on, its completion requeues it if lost. */
            if (!maybe_done(rc) && rc != ZINVALIDSTATE && rc != NOMEM)
                return;
        }
        zk_orphan_queue(zc, zk_orphan_node(zc, a->node, a->gen));
    } else if (!a->node && a->create_lost && a->lost_gen == zc->gen) {
        zk_orphan_queue(zc, zk_orphan_search(zc, a->prefix, a->lost_gen));
    }
}

/* *parentp: <root>/<encoded name>, the name's node (malloc'd). */
static int name_parent(struct zk_conn *zc, const char *name, size_t len, char **parentp)
{
    char enc[DLOCK_FILE_ENCODED_MAX + 80];
    if (dlock_file_encode_name(name, len, enc, sizeof enc) != 0)
        return dlock_seterr(cl(zc), DLOCK_EINVAL, "cannot encode the lock name");
    enc[strlen(enc) - strlen(".lock")] = '\0'; /* one znode per name: no suffix needed */
    *parentp = join3(zc->root, "/", enc);
    return *parentp ? 0 : oom(zc);
}

static int acquire_paths(struct zk_acq *a)
{
    int err = name_parent(a->zc, a->req->name, a->req->name_len, &a->parent);
    if (err)
        return err;
    char mark[MARK_MAX], tail[ZK_MARK_MAX];
    zk_mark(a->zc->layout, a->req->mode == DLOCK_MODE_SHARED, a->req->limit, tail);
    snprintf(mark, sizeof mark, "%s%s", a->req->owner_hex, tail);
    a->prefix = join3(a->parent, "/", mark);
    return a->prefix ? 0 : oom(a->zc);
}

/* A watch on a held lock's node, so that keep() learns of its deletion
 * by someone else without asking the server. */
struct zk_watch_req {
    struct zk_conn *zc;
    char path[];
};

static void on_watch_set(int rc, const struct Stat *st, const void *data)
{
    struct zk_watch_req *w = (struct zk_watch_req *)data;
    (void)st;
    if (rc == ZNONODE) { /* gone before the watch reached the server */
        pthread_mutex_lock(&w->zc->mu);
        for (struct zk_held *h = w->zc->watched; h; h = h->next)
            if (strcmp(h->path, w->path) == 0)
                h->deleted = 1;
        pthread_mutex_unlock(&w->zc->mu);
    }
    free(w);
}

/* Lists h and sets the watch: asynchronous, no round trip added to the
 * acquire. The client sets its watches again after a reconnection. Best
 * effort: if the request itself fails (the connection dropped before the
 * server had it), there is no watch; release and renew still ask the
 * server. */
static void watch_held(struct zk_conn *zc, struct zk_held *h)
{
    size_t len = strlen(h->path) + 1;
    struct zk_watch_req *w = malloc(sizeof *w + len);
    pthread_mutex_lock(&zc->mu);
    h->next = zc->watched;
    zc->watched = h;
    pthread_mutex_unlock(&zc->mu);
    if (!w)
        return;
    w->zc = zc;
    memcpy(w->path, h->path, len);
    /* Every queued request's completion runs, if only with ZCLOSING when
     * the session is closed: that frees w. */
    if (zoo_aexists(zc->zh, h->path, 1, on_watch_set, w) != ZOK)
        free(w);
}

static void unwatch_held(struct zk_conn *zc, struct zk_held *h)
{
    pthread_mutex_lock(&zc->mu);
    for (struct zk_held **pp = &zc->watched; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    pthread_mutex_unlock(&zc->mu);
}

static int zk_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_acq a = {.zc = zc, .req = req};
    struct zk_kids k = {NULL, 0};
    int err;
    if (req->limit && zc->layout == ZK_LAYOUT_KAZOO) /* the core refuses it first (caps) */
        return dlock_seterr(cl(zc), DLOCK_ENOTSUP,
                            "zookeeper layout=kazoo has no semaphores (kazoo's Semaphore is "
                            "another recipe): use layout=dlock");
    if (req->wait == DLOCK_WAIT_TRY)
        a.until = dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS;
    else
        a.until = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns : NEVER;
    if ((err = acquire_paths(&a)) == 0 && (err = zk_watch_cancel(zc, req)) == 0) {
        do {
            uint64_t seen = zk_events_now(zc);
            zk_kids_free(&k);
            err = zc->cancelled ? dlock_cancelled(cl(zc)) : acquire_turn(&a, &k);
            if (err == RETRY && session_status(zc) == SESSION_UP)
                retry_pause(zc, seen);
        } while (err == AGAIN || err == RETRY);
    }
    zk_kids_free(&k);
    /* The cleanup's delete is waited for as at a deadline, not cut short. */
    zc->cancel_fd = -1;
    zc->cancelled = 0;
    if (err == 0) {
        size_t len = strlen(a.node) + 1;
        struct zk_held *h = malloc(sizeof *h + len);
        if (h) {
            memset(h, 0, sizeof *h);
            h->base.token = a.czxid;
            h->gen = a.gen;
            memcpy(h->path, a.node, len);
            watch_held(zc, h);
            *heldp = &h->base;
        } else {
            err = oom(zc);
        }
    }
    if (err)
        drop_node(&a);
    free(a.node);
    free(a.parent);
    free(a.prefix);
    return err;
}

/* ---- release, renew, ping -------------------------------------------- */

static int lost(struct zk_conn *zc, const char *why)
{
    return dlock_seterr(cl(zc), DLOCK_ELOST, "zookeeper %s: %s", zc->hosts, why);
}

/*
 * Bounded by the session timeout: waits for a suspended connection to come
 * back or for the session to count as dead. Past the bound, the node's
 * delete is left to the client's completion thread (sent when the session
 * is connected again; else the node goes with the session) and the answer
 * is DLOCK_ECONNECT.
 */
static int release_node(struct zk_conn *zc, struct zk_held *h)
{
    uint64_t until = dlock_monotonic_ns() + (uint64_t)timeout_ms(zc) * MS;
    if (dlock_call_deadline() < until) /* a lost lock's release: the core's bound */
        until = dlock_call_deadline();
    int retried = 0;
    for (;;) {
        if (h->gen != zc->gen)
            return lost(zc, "the session that held the lock has ended");
        enum session_status st = wait_connected(zc, until);
        if (st == SESSION_DEAD) {
            session_end(zc);
            return lost(zc, "the session expired, or was disconnected for its whole timeout: "
                            "the lock was lost (its node goes with the session)");
        }
        uint64_t seen = zk_events_now(zc);
        int sent = st == SESSION_UP;
        int rc = sent ? zk_delete(zc, h->path, until) : NOREPLY;
        if (rc == ZOK)
            return 0;
        if (rc == ZNONODE) /* after a lost reply, our own delete did it */
            return retried ? 0 : lost(zc, "the lock node is gone: the session expired or the "
                                          "node was deleted");
        if (rc == NOREPLY || dlock_monotonic_ns() >= until) {
            /* A delete given up on requeues itself if its reply is lost. */
            if (!sent || rc != NOREPLY)
                zk_orphan_queue(zc, zk_orphan_node(zc, h->path, h->gen));
            return dlock_seterr(cl(zc), DLOCK_ECONNECT,
                                "zookeeper %s: no answer within the session timeout (%d ms): "
                                "the lock node is deleted when the connection returns, or goes "
                                "with the session when it expires",
                                zc->hosts, timeout_ms(zc));
        }
        if (!is_connection_error(rc))
            return zk_error(zc, rc, "cannot delete", h->path);
        retried = 1;
        retry_pause(zc, seen);
    }
}

static int zk_release(dlock_conn *conn, dlock_held *held)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_held *h = (struct zk_held *)held;
    unwatch_held(zc, h);
    int err = release_node(zc, h);
    free(h);
    return err;
}

/*
 * No lease to extend (the session is the lease): checks that the lock is
 * still ours, within 2/3 of the session timeout (the C client's own bound
 * for a request). While the connection is down the answer is unknown:
 * DLOCK_ECONNECT, until it comes back (then 0) or the session times out
 * (then DLOCK_ELOST).
 */
static int zk_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_held *h = (struct zk_held *)held;
    struct Stat st;
    (void)ttl_ms;
    if (h->gen != zc->gen)
        return lost(zc, "the session that held the lock has ended");
    enum session_status s = session_status(zc);
    if (s == SESSION_DEAD) {
        session_end(zc);
        return lost(zc, "the session expired: the lock was lost");
    }
    if (s == SESSION_SUSPENDED)
        return dlock_seterr(cl(zc), DLOCK_ECONNECT,
                            "zookeeper %s: disconnected; the lock is still ours only if the "
                            "connection returns within the session timeout (%d ms)",
                            zc->hosts, timeout_ms(zc));
    uint64_t until = dlock_monotonic_ns() + (uint64_t)timeout_ms(zc) * 2 / 3 * MS;
    int rc = zk_exists(zc, h->path, &st, until);
    if (rc == ZNONODE)
        return lost(zc, "the lock node is gone: the session expired or the node was deleted");
    if (rc != ZOK)
        return zk_error(zc, rc, "cannot read", h->path);
    const clientid_t *id = zoo_client_id(zc->zh);
    if (id && st.ephemeralOwner != id->client_id)
        return lost(zc, "the lock node belongs to another session");
    return 0;
}

/*
 * The keeper's check: no waiting, only what the client's threads recorded,
 * read under mu, so it may run while the application's thread is inside
 * any other call (even one that replaces the session). A few microseconds.
 * DLOCK_ELOST: the lock's session ended or expired, or its node was deleted
 * by someone else. DLOCK_EEXPIRED: disconnected for a third of the session
 * timeout or longer (Curator's advice): the servers may have expired the
 * session already without the client hearing of it.
 *
 * Otherwise the lock's lease is the session's: it sets held->lease_end_ns
 * to the earliest moment a server can expire the session (heard_ns + the
 * negotiated timeout) and held->lease_ms to that timeout, and the keeper
 * reports the loss its margin before that, however long the C client takes
 * to notice a silent network. To keep heard_ns fresh, it sends the
 * session's liveness probe when one is due (zk_alive_probe(): one per
 * session, not per lock, never waited for here).
 */
static int zk_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_held *h = (struct zk_held *)held;
    const char *why = NULL;
    int err = 0, timeout;
    uint64_t down_ns = 0, heard = 0, now = dlock_monotonic_ns();
    (void)ttl_ms;
    pthread_mutex_lock(&zc->mu);
    timeout = zc->negotiated_ms > 0 ? zc->negotiated_ms : zc->session_ms;
    if (zc->suspended_since)
        down_ns = now - zc->suspended_since;
    if (h->gen != zc->gen)
        err = DLOCK_ELOST, why = "the session that held the lock has ended";
    else if (zc->state == ZOO_EXPIRED_SESSION_STATE)
        err = DLOCK_ELOST, why = "the session expired: the lock was lost";
    else if (zc->state == ZOO_AUTH_FAILED_STATE)
        err = DLOCK_ELOST, why = "the servers refused the credentials: the session is closed";
    else if (h->deleted)
        err = DLOCK_ELOST, why = "the lock node was deleted by someone else";
    else if (down_ns >= (uint64_t)timeout * MS / 3)
        err = DLOCK_EEXPIRED;
    else if (zc->zh) {
        heard = zc->heard_ns;
        zk_alive_probe(zc, now, (uint64_t)timeout * MS / PROBE_DIV);
    }
    pthread_mutex_unlock(&zc->mu);
    if (heard) {
        held->lease_end_ns = heard + (uint64_t)timeout * MS;
        held->lease_ms = (uint32_t)timeout;
    }
    if (err == DLOCK_EEXPIRED)
        return dlock_seterr(cl(zc), err,
                            "zookeeper %s: disconnected for %" PRIu64 " ms, a third of the "
                            "session timeout (%d ms) or more: the session may have expired on "
                            "the servers",
                            zc->hosts, (uint64_t)(down_ns / MS), timeout);
    return err ? lost(zc, why) : 0;
}

uint64_t dlock_zk_watch_events(dlock_client *c)
{
    struct zk_conn *zc = (struct zk_conn *)c->conn;
    pthread_mutex_lock(&zc->mu);
    uint64_t n = zc->node_events;
    pthread_mutex_unlock(&zc->mu);
    return n;
}

uint64_t dlock_zk_probes_sent(dlock_client *c)
{
    struct zk_conn *zc = (struct zk_conn *)c->conn;
    pthread_mutex_lock(&zc->mu);
    uint64_t n = zc->probes;
    pthread_mutex_unlock(&zc->mu);
    return n;
}

/* The floor for an acquire + release: a create and a delete of a scratch
 * ephemeral node, one round trip each, within connect_timeout. '!' never
 * occurs in encoded names. */
static int zk_ping(dlock_conn *conn)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    char leaf[40];
    uint64_t until = dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS;
    int err = session_connect(zc, until);
    if (err)
        return err;
    const clientid_t *id = zoo_client_id(zc->zh);
    snprintf(leaf, sizeof leaf, "!ping-%016" PRIx64, id ? (uint64_t)id->client_id : 0);
    char *path = join3(zc->root, "/", leaf);
    if (!path)
        return oom(zc);
    int rc = zk_create(zc, path, ZOO_EPHEMERAL, until);
    if (rc == ZOK || rc == ZNODEEXISTS)
        rc = zk_delete(zc, path, until);
    err = rc == ZOK ? 0 : zk_error(zc, rc, "ping (create + delete)", path);
    free(path);
    return err;
}

/* ---- inspect ------------------------------------------------------- */

/*
 * The name's lock children, read with a sync ahead (zk_sync_list), how
 * many of its first nodes hold (*nh, zk_holders()), and the stats of want
 * of the holders (an exists each, no watch, pipelined; in layout=kazoo a
 * getData, whose data tells a kazoo client's node: zk_node_foreign()): the
 * newest ones (newest set) or the first. A holder that lets go between the
 * listing and the exists means looking again. No node is created, no watch
 * is left, nothing is written: the parent missing (never taken, or its
 * container reaped) is free. Within connect_timeout, like ping. *st holds
 * min(want, *nh) stats and *foreign as many flags (the caller frees them
 * and k).
 */
static int read_queue(struct zk_conn *zc, const char *name, size_t len, size_t want,
                      int newest, struct zk_kids *k, size_t *nh, struct Stat **st,
                      unsigned char **foreign)
{
    char(*data)[ZK_DATA_MAX] = NULL;
    uint64_t until = dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS;
    char *parent = NULL, **paths = NULL;
    int err = name_parent(zc, name, len, &parent);
    while (err == 0) {
        size_t n = 0, from = 0;
        if ((err = session_connect(zc, until)) != 0)
            break;
        uint64_t seen = zk_events_now(zc);
        const char *what = "cannot list";
        int rc = zk_sync_list(zc, parent, k, until);
        if (rc == ZNONODE)
            rc = ZOK; /* no parent: no child either */
        if (rc == ZOK) {
            *nh = zk_holders(k);
            n = want < *nh ? want : *nh;
            from = newest ? *nh - n : 0;
            *st = calloc(n ? n : 1, sizeof **st);
            *foreign = calloc(n ? n : 1, 1);
            paths = calloc(n ? n : 1, sizeof *paths);
            if (zc->layout == ZK_LAYOUT_KAZOO)
                data = calloc(n ? n : 1, sizeof *data);
            for (size_t j = 0; *st && paths && j < n; j++)
                if (!(paths[j] = join3(parent, "/", k->v[from + j].name)))
                    break;
            if (!*st || !*foreign || !paths || (n && !paths[n - 1]) ||
                (zc->layout == ZK_LAYOUT_KAZOO && !data))
                rc = NOMEM;
            else if (n)
                rc = zk_exists_all(zc, paths, n, *st, data, until);
            for (size_t j = 0; rc == ZOK && data && j < n; j++)
                (*foreign)[j] = (unsigned char)zk_node_foreign(k->v[from + j].name, data[j]);
            free(data);
            data = NULL;
            what = "cannot read the holders under";
        }
        for (size_t j = 0; paths && j < n; j++)
            free(paths[j]);
        free(paths);
        paths = NULL;
        if (rc == ZOK)
            break;
        zk_kids_free(k);
        free(*st);
        *st = NULL;
        free(*foreign);
        *foreign = NULL;
        /* ZNONODE: a holder let go between the listing and the read. A
         * connection error: session_connect() waits for the connection to
         * return, or starts a new session if this one died. */
        int again = rc == ZNONODE || is_connection_error(rc);
        if (!again || dlock_monotonic_ns() >= until) {
            if (rc == ZNONODE)
                err = dlock_seterr(cl(zc), DLOCK_ETIMEDOUT,
                                   "zookeeper %s: the holder of %.80s changed at every look "
                                   "for connect_timeout (%d ms)", zc->hosts, parent,
                                   zc->connect_ms);
            else
                err = zk_error(zc, rc, what, parent);
            break;
        }
        if (rc != ZNONODE)
            retry_pause(zc, seen);
    }
    free(parent);
    return err;
}

/*
 * The holders are the first nodes of the queue (zk_holders()): one writer,
 * the readers before the first writer, or a semaphore's first permits up
 * to its limit. The newest holder's czxid is the token (and the last token
 * granted: every earlier holder's node was created before it), the owner
 * id in its node's name the owner; the others are the waiters, counted and
 * listed in the order they will be served. No parent node, or no child:
 * free, no waiter. A holder's or waiter's node whose session expired has
 * gone with it.
 *
 * What it cannot know: a lease (the holder's node lives as long as its
 * session, whose timeout and last heartbeat only the servers know; a dead
 * holder's node is there until its session expires, and counts as held
 * until then); the last token once the name is free (the nodes and their
 * czxids went with their sessions or deletes); a waiter that gave up but
 * whose delete has not reached the servers yet (its connection down) is
 * counted until its delete lands or its session expires, and so is a try
 * acquire's node in the instant before it deletes it.
 */
static void fill_info(dlock_info *info, const struct zk_kids *k, size_t nh, uint64_t czxid,
                      int foreign)
{
    info->known = DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_ORDER;
    info->held = nh > 0;
    if (info->held && !foreign) { /* a kazoo client's holder has no token */
        info->known |= DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_LAST_TOKEN;
        info->token = info->last_token = czxid;
    }
    if (info->held) {
        zk_node_owner(k->v[nh - 1].name, info->owner, sizeof info->owner);
        if (info->owner[0])
            info->known |= DLOCK_KNOWS_OWNER;
        info->waiters = k->n - nh;
        for (size_t i = nh; i < k->n && info->listed < DLOCK_INFO_LISTED; i++)
            zk_node_owner(k->v[i].name, info->waiter[info->listed++], DLOCK_HOLDER_MAX);
    }
}

static int zk_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_kids k = {NULL, 0};
    struct Stat *st = NULL;
    unsigned char *foreign = NULL;
    size_t nh = 0;
    int err = read_queue(zc, name, len, 1, 1, &k, &nh, &st, &foreign);
    if (err)
        return err;
    fill_info(info, &k, nh, nh ? (uint64_t)st[0].czxid : 0, nh && foreign[0]);
    zk_kids_free(&k);
    free(st);
    free(foreign);
    return 0;
}

/* Every holder, in grant order (sequence, so czxid, ascending): mode,
 * limit, token (czxid) and owner id; no lease (see zk_inspect()). */
static int zk_inspect_holders(dlock_conn *conn, const char *name, size_t len,
                              dlock_holder *holders, size_t capacity, size_t *count)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_kids k = {NULL, 0};
    struct Stat *st = NULL;
    unsigned char *foreign = NULL;
    size_t nh = 0;
    int err = read_queue(zc, name, len, capacity, 0, &k, &nh, &st, &foreign);
    if (err)
        return err;
    *count = nh;
    for (size_t i = 0; i < nh && i < capacity; i++) {
        dlock_holder *h = &holders[i];
        h->known = DLOCK_KNOWS_MODE | (foreign[i] ? 0 : DLOCK_KNOWS_TOKEN);
        h->mode = k.v[i].kind == ZK_READER ? DLOCK_MODE_SHARED : DLOCK_MODE_EXCLUSIVE;
        h->limit = k.v[i].limit;
        h->token = (uint64_t)st[i].czxid;
        zk_node_owner(k.v[i].name, h->owner, sizeof h->owner);
        if (h->owner[0])
            h->known |= DLOCK_KNOWS_OWNER;
    }
    zk_kids_free(&k);
    free(st);
    free(foreign);
    return 0;
}

/* ---- elections (zookeeper_elect.c; none in layout=kazoo: the caps) ---- */

/* Our election lock's node gets the value, while the session holds it. */
static int zk_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_held *h = (struct zk_held *)held;
    if (h->gen != zc->gen)
        return lost(zc, "the session that held the lock has ended: nothing published");
    pthread_mutex_lock(&zc->mu);
    int deleted = h->deleted;
    pthread_mutex_unlock(&zc->mu);
    enum session_status s = session_status(zc);
    if (s == SESSION_DEAD)
        session_end(zc);
    if (deleted || s == SESSION_DEAD)
        return lost(zc, "the lock node is gone (session expired or node deleted): nothing "
                        "published");
    if (s == SESSION_SUSPENDED)
        return dlock_seterr(cl(zc), DLOCK_ECONNECT, "zookeeper %s: disconnected: nothing "
                            "published", zc->hosts);
    uint64_t until = dlock_monotonic_ns() + (uint64_t)timeout_ms(zc) * 2 / 3 * MS;
    int rc = zk_elect_publish(zc, h->path, h->base.token, &h->version, value, len, until);
    if (rc == ZNONODE || rc == ZBADVERSION)
        return lost(zc, "the lock node is gone or not ours: nothing published");
    return rc == ZOK ? 0 : zk_error(zc, rc, "cannot publish on", h->path);
}

/* inspect() plus the holder's value, read from its own node. */
static int zk_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                     char *value, size_t *value_len)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_kids k = {NULL, 0};
    uint64_t czxid = 0;
    size_t nh = 0;
    char *parent = NULL;
    uint64_t until = dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS;
    int err = name_parent(zc, name, len, &parent);
    while (err == 0 && (err = session_connect(zc, until)) == 0) {
        uint64_t seen = zk_events_now(zc);
        int rc = zk_elect_read(zc, parent, &k, &nh, &czxid, value, value_len, until);
        if (rc == ZOK) {
            fill_info(info, &k, nh, czxid, 0);
            break;
        }
        /* ZNONODE: the holder let go between the listing and the read. */
        if ((rc != ZNONODE && !is_connection_error(rc)) || dlock_monotonic_ns() >= until) {
            err = zk_error(zc, rc, "cannot read the election under", parent);
            break;
        }
        if (rc != ZNONODE)
            retry_pause(zc, seen);
    }
    zk_kids_free(&k);
    free(parent);
    return err;
}

/* Nothing to do: a release deletes the holder's node, which the observers'
 * child watch sees. */
static int zk_wake_observers(dlock_conn *conn, const char *name, size_t len)
{
    (void)conn, (void)name, (void)len;
    return 0;
}

static int zk_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    char *parent = NULL;
    int err = name_parent(zc, name, len, &parent);
    if (!err)
        err = session_connect(zc, dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS);
    if (!err)
        err = zk_elect_watch_open(zc, parent, watchp);
    free(parent);
    return err;
}

/* ---- open and close -------------------------------------------------- */

static void zk_close(dlock_conn *conn)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    session_end(zc);
    if (zc->auth)
        explicit_bzero(zc->auth, strlen(zc->auth));
    free(zc->auth);
    free(zc->hosts);
    free(zc->root);
    if (zc->wake_fd >= 0)
        close(zc->wake_fd);
    pthread_cond_destroy(&zc->cv);
    pthread_mutex_destroy(&zc->mu);
    free(zc);
}

/* "h1:p1,h2:p2", IPv6 hosts in brackets, 2181 when a port is missing. */
static int build_hosts(struct zk_conn *zc, const dlock_uri *uri)
{
    size_t n = dlock_uri_host_count(uri), len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(dlock_uri_host(uri, i)) + 10;
    if (!(zc->hosts = malloc(len)))
        return oom(zc);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *h = dlock_uri_host(uri, i);
        unsigned port = dlock_uri_port(uri, i) ? dlock_uri_port(uri, i) : DEFAULT_PORT;
        int v6 = strchr(h, ':') != NULL;
        o += (size_t)snprintf(zc->hosts + o, len - o, "%s%s%s%s:%u", i ? "," : "",
                              v6 ? "[" : "", h, v6 ? "]" : "", port);
    }
    return 0;
}

/* The root (zk_root_check()): "/" alone is refused because /zookeeper is
 * the server's own, and so is anything inside /zookeeper. */
static int parse_root(struct zk_conn *zc, const dlock_uri *uri)
{
    const char *path = dlock_uri_path(uri);
    size_t len;
    if (!path[0])
        path = DEFAULT_ROOT;
    int check = zk_root_check(path, &len);
    if (check == ZK_ROOT_RESERVED)
        return dlock_seterr(cl(zc), DLOCK_EINVAL,
                            "the lock root %.*s is inside /zookeeper, the tree reserved by "
                            "the ZooKeeper servers for themselves (quotas, configuration): "
                            "choose another root, as in /dlock",
                            (int)(len > 200 ? 200 : len), path);
    if (check != ZK_ROOT_OK)
        return dlock_seterr(cl(zc), DLOCK_EBADURI,
                            "the path of a zookeeper:// URI is the root node of the locks, as "
                            "in /dlock (not /, no empty, . or .. component)");
    if (!(zc->root = strndup(path, len)))
        return oom(zc);
    return 0;
}

static int parse_uri(struct zk_conn *zc, const dlock_uri *uri)
{
    uint64_t session_ms = DEFAULT_SESSION_MS, connect_ms = DEFAULT_CONNECT_MS;
    const char *user = dlock_uri_user(uri), *password = dlock_uri_password(uri);
    int err, layout = ZK_LAYOUT_DLOCK;
    if (dlock_uri_host_count(uri) == 0)
        return dlock_seterr(cl(zc), DLOCK_EBADURI,
                            "a zookeeper:// URI needs hosts, as in zookeeper://127.0.0.1:2181/dlock");
    if ((err = dlock_uri_param_uint(cl(zc), uri, "session_timeout", 1, 3600000, &session_ms)) ||
        (err = dlock_uri_param_uint(cl(zc), uri, "connect_timeout", 1, 3600000, &connect_ms)) ||
        (err = dlock_uri_param_choice(cl(zc), uri, "layout", zk_layouts, &layout)))
        return err;
    zc->layout = (enum zk_layout)layout;
    /* kazoo's names have no semaphore, nor election (kazoo's Election recipe
     * names its nodes otherwise): the core refuses them. */
    if (zc->layout == ZK_LAYOUT_KAZOO)
        zc->base.caps = dlock_zookeeper_backend.caps &
                        ~(DLOCK_CAP_SEMAPHORE | DLOCK_CAP_ELECTION | DLOCK_CAP_WATCH);
    zc->session_ms = (int)session_ms;
    zc->connect_ms = (int)connect_ms;
    if ((user && strchr(user, ':')) || (password && (!user || !user[0])))
        return dlock_seterr(cl(zc), DLOCK_EBADURI,
                            "zookeeper digest credentials are user:password, with a user "
                            "name that has no ':'");
    zc->acl = &ZOO_OPEN_ACL_UNSAFE;
    if (user && user[0]) {
        /* Nodes we create are readable and writable by these credentials only. */
        if (!(zc->auth = join3(user, ":", password ? password : "")))
            return oom(zc);
        zc->acl = &ZOO_CREATOR_ALL_ACL;
    }
    if ((err = build_hosts(zc, uri)) != 0)
        return err;
    return parse_root(zc, uri);
}

static int zk_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    struct zk_conn *zc = calloc(1, sizeof *zc);
    int err;
    if (!zc)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    zc->base.client = c;
    zc->cancel_fd = zc->wake_fd = -1;
    pthread_mutex_init(&zc->mu, NULL);
    dlock_cond_init_mono(&zc->cv);
    if ((err = parse_uri(zc, uri)) != 0 || (err = session_start(zc)) != 0)
        goto fail;
    uint64_t until = dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS;
    if ((err = session_connect(zc, until)) != 0) {
        if (err == DLOCK_ECONNECT)
            dlock_seterr(c, err, "zookeeper %s: no session within %d ms (connect_timeout): "
                         "servers down, not serving, or unreachable", zc->hosts, zc->connect_ms);
        goto fail;
    }
    if ((err = check_root(zc, until)) != 0)
        goto fail;
    *connp = &zc->base;
    return 0;
fail:
    zk_close(&zc->base);
    return err;
}

/* The current zxid (see the top): the probe's, within connect_timeout. */
static int zk_token_top(dlock_conn *conn, uint64_t *top)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    char leaf[40];
    uint64_t until = dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS, zxid = 0;
    int err = session_connect(zc, until);
    if (err)
        return err;
    const clientid_t *id = zoo_client_id(zc->zh);
    snprintf(leaf, sizeof leaf, "!top-%016" PRIx64, id ? (uint64_t)id->client_id : 0);
    char *path = join3(zc->root, "/", leaf);
    if (!path)
        return oom(zc);
    int rc = zk_probe(zc, path, &zxid, until);
    err = rc == ZOK ? 0 : zk_error(zc, rc, "cannot read the current transaction id (a "
                                   "create, set and delete in one transaction)", path);
    free(path);
    if (err == 0)
        *top = zxid;
    return err;
}

/* 0 when every later czxid is above floor: floor is at most a zxid seen
 * committed, or at most the current one (a probe: a write). A floor up to
 * DLOCK_RAISE_STEPS_MAX above the current zxid is reached with one more
 * probe per missing zxid: dlock migrate sets the other store's floor to
 * ZooKeeper's top, so a list's other part can come back with that + 1 (or
 * + the number of lists granting at once) while the ensemble is quiet.
 * Else *zxid is the current one and the answer DLOCK_ENOTSUP, for the
 * caller to explain. */
static int zxid_covers(struct zk_conn *zc, uint64_t floor, uint64_t *zxid)
{
    pthread_mutex_lock(&zc->mu);
    uint64_t seen = zc->seen_zxid;
    pthread_mutex_unlock(&zc->mu);
    if (floor <= seen)
        return 0;
    for (int i = 0; i <= DLOCK_RAISE_STEPS_MAX; i++) {
        int err = zk_token_top(&zc->base, zxid);
        if (err)
            return err;
        if (floor <= *zxid)
            return 0;
        if (floor - *zxid > DLOCK_RAISE_STEPS_MAX)
            break;
    }
    return DLOCK_ENOTSUP;
}

static int zk_raise_floor(dlock_conn *conn, uint64_t floor)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    uint64_t zxid = 0;
    int err = zxid_covers(zc, floor, &zxid);
    if (err != DLOCK_ENOTSUP)
        return err;
    return dlock_seterr(conn->client, err,
                        "zookeeper %s: ZooKeeper's tokens are its transaction ids (czxids), "
                        "which cannot be set: the floor %" PRIu64 " is above the current "
                        "transaction id %" PRIu64 " by more than the %d writes dlock makes "
                        "to move it up, so the next tokens may not be above it",
                        zc->hosts, floor, zxid, DLOCK_RAISE_STEPS_MAX);
}

/* Tokens are the lock nodes' czxids: transaction ids the ensemble hands
 * out in order for every write, which dlock cannot raise. Later grants are
 * above every zxid already committed: this lock's own czxid, any other
 * this connection has seen (a sibling part's of a multi-name lock), and
 * the current one. Any higher floor may be above the next czxids. */
static int zk_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    uint64_t zxid = 0;
    if (floor <= held->token)
        return 0;
    int err = zxid_covers(zc, floor, &zxid);
    if (err != DLOCK_ENOTSUP)
        return err;
    return dlock_seterr(conn->client, err,
                        "ZooKeeper's tokens are its transaction ids and cannot be raised: "
                        "%" PRIu64 " is above this lock's token %" PRIu64 " and the current "
                        "transaction id %" PRIu64 " (by more than the %d writes dlock makes to "
                        "move it up)",
                        floor, held->token, zxid, DLOCK_RAISE_STEPS_MAX);
}

const dlock_backend dlock_zookeeper_backend = {
    DLOCK_BACKEND_INIT,
    .name = "zookeeper",
    .schemes = zk_schemes,
    /* No LEASE or RENEW: the lease is the session, which a live holder
     * keeps alive by itself; the TTL is not used. No HOLDER_DEATH: a dead
     * holder's lock is freed when its session times out, not at once. */
    .caps = DLOCK_CAP_FENCING | DLOCK_CAP_FIFO | DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE |
            DLOCK_CAP_CANCEL | DLOCK_CAP_SHARED | DLOCK_CAP_SEMAPHORE | DLOCK_CAP_ELECTION |
            DLOCK_CAP_WATCH,
    .options = zk_options,
    .open = zk_open,
    .close = zk_close,
    .acquire = zk_acquire,
    .release = zk_release,
    .renew = zk_renew,
    .ping = zk_ping,
    .keep = zk_keep,
    .raise_token = zk_raise_token,
    .token_top = zk_token_top,
    .raise_floor = zk_raise_floor,
    .inspect = zk_inspect,
    .inspect_holders = zk_inspect_holders,
    .publish = zk_publish,
    .leader = zk_leader,
    .wake = zk_wake_observers,
    .watch_open = zk_watch_open,
    .watch_fd = zk_elect_watch_fd,
    .watch_read = zk_elect_watch_read,
    .watch_close = zk_elect_watch_close,
};
