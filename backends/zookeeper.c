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
 * The session is the lease: a holder's nodes live exactly as long as its
 * session, one per client, whose timeout is the URI's session_timeout (the
 * per-acquire TTL is not used). Fencing tokens are the lock node's czxid.
 * See docs/zookeeper.md for what this guarantees and where it is weaker.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The synchronous calls are declared only for the multithreaded client. */
#define THREADED 1
#include <zookeeper/zookeeper.h>

#include "config.h"
#include "backends/file.h"
#include "core/internal.h"

#define DEFAULT_PORT 2181
#define DEFAULT_ROOT "/dlock"
#define DEFAULT_SESSION_MS 4000
#define DEFAULT_CONNECT_MS 5000
#define LOCK_MARK "-lock-"
#define MS 1000000ull
#define NEVER UINT64_MAX
/* Longest wait slice while disconnected: how late a session that has been
 * suspended for its whole timeout is noticed as dead. */
#define SUSPENDED_SLICE_MS 100
/* After a call failed with a connection loss the event thread may not have
 * reported the new state yet: wait this long for it before trying again. */
#define RETRY_PAUSE_MS 20

static const char *const zk_schemes[] = {"zookeeper", NULL};
static const char *const zk_options[] = {"session_timeout", "connect_timeout", NULL};

/* A node of ours that could not be deleted (the connection was down when a
 * waiter gave up): deleted at the next call that finds the session up. */
struct zk_pending {
    struct zk_pending *next;
    char path[];
};

enum session_status { SESSION_UP, SESSION_SUSPENDED, SESSION_DEAD };

struct zk_held;

struct zk_conn {
    dlock_conn base;
    char *hosts;      /* "h1:p1,h2:p2" as the C client wants it */
    char *root;       /* "/dlock": no trailing slash */
    char *auth;       /* "user:password" for the digest scheme, or NULL */
    struct ACL_vector *acl;
    int session_ms, connect_ms;
    /* Both written by the application's thread only, under mu (the
     * keeper reads gen under mu, and never uses zh). */
    zhandle_t *zh;    /* NULL between a dead session and the next call */
    unsigned gen;     /* counts sessions: a held lock belongs to one */
    struct zk_pending *pending;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    /* Written by the client's event thread, under mu. */
    int state;                /* last session state reported */
    int ever_connected;       /* this session was established once */
    uint64_t events;          /* counts every watch and session event */
    uint64_t suspended_since; /* when the connection dropped; 0 while up */
    int negotiated_ms;        /* the timeout the server granted */
    struct zk_held *watched;  /* held locks whose node is watched, under mu */
};

struct zk_held {
    dlock_held base;
    unsigned gen;
    struct zk_held *next; /* on zc->watched, under mu */
    int deleted;          /* our node was deleted (not by us), under mu */
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
    uint64_t czxid;
    uint64_t until;    /* how long connection waits may last */
};

/* A parent's lock children, sorted by sequence number. */
struct zk_kid {
    long long seq;
    char *name;
};
struct zk_kids {
    struct zk_kid *v;
    size_t n;
};

static dlock_client *cl(struct zk_conn *zc)
{
    return zc->base.client;
}

static char *join3(const char *a, const char *b, const char *c)
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

static int oom(struct zk_conn *zc)
{
    return dlock_seterr(cl(zc), DLOCK_ENOMEM, "out of memory");
}

/* ---- session state -------------------------------------------------- */

static void silent_log(const char *message)
{
    (void)message; /* the client's chatter must not reach the application's stderr */
}

static void on_event(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_conn *zc = ctx;
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
            zc->suspended_since = 0;
            zc->ever_connected = 1;
            zc->negotiated_ms = zoo_recv_timeout(zh);
        } else if (zc->ever_connected && !zc->suspended_since) {
            zc->suspended_since = dlock_monotonic_ns();
        }
    }
    zc->events++;
    pthread_cond_broadcast(&zc->cv);
    pthread_mutex_unlock(&zc->mu);
}

static uint64_t events_now(struct zk_conn *zc)
{
    pthread_mutex_lock(&zc->mu);
    uint64_t e = zc->events;
    pthread_mutex_unlock(&zc->mu);
    return e;
}

/* Waits until an event after `seen` or until `until`; 1 on an event. */
static int wait_event(struct zk_conn *zc, uint64_t seen, uint64_t until)
{
    struct timespec ts;
    int got;
    if (until != NEVER) {
        ts.tv_sec = (time_t)(until / 1000000000u);
        ts.tv_nsec = (long)(until % 1000000000u);
    }
    pthread_mutex_lock(&zc->mu);
    while (zc->events == seen) {
        if (until == NEVER)
            pthread_cond_wait(&zc->cv, &zc->mu);
        else if (pthread_cond_timedwait(&zc->cv, &zc->mu, &ts) == ETIMEDOUT)
            break;
    }
    got = zc->events != seen;
    pthread_mutex_unlock(&zc->mu);
    return got;
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

static void pending_free(struct zk_conn *zc)
{
    while (zc->pending) {
        struct zk_pending *p = zc->pending;
        zc->pending = p->next;
        free(p);
    }
}

/* Ends the session: its nodes go with it (at once if the server hears the
 * close, else when it expires the session). */
static void session_end(struct zk_conn *zc)
{
    zhandle_t *zh = zc->zh;
    /* The keeper reads gen under mu: a lock of the old session reads as
     * lost from here on. The close runs unlocked: it joins the client's
     * threads, whose callbacks take mu. */
    pthread_mutex_lock(&zc->mu);
    zc->zh = NULL;
    zc->gen++;
    pthread_mutex_unlock(&zc->mu);
    if (zh)
        zookeeper_close(zh);
    pending_free(zc);
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
    if (!zh)
        return dlock_seterr(cl(zc), saved_errno == ENOMEM ? DLOCK_ENOMEM : DLOCK_EBADURI,
                            "zookeeper %s: the client refused the host list: %s", zc->hosts,
                            strerror(saved_errno));
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
        uint64_t seen = events_now(zc);
        enum session_status st = session_status(zc);
        uint64_t now = dlock_monotonic_ns();
        if (st != SESSION_SUSPENDED || now >= until)
            return st;
        uint64_t slice = now + SUSPENDED_SLICE_MS * MS;
        wait_event(zc, seen, slice < until ? slice : until);
    }
}

static void flush_pending(struct zk_conn *zc)
{
    while (zc->pending) {
        int rc = zoo_delete(zc->zh, zc->pending->path, -1);
        if (rc != ZOK && rc != ZNONODE)
            return; /* still down: the next call tries again */
        struct zk_pending *p = zc->pending;
        zc->pending = p->next;
        free(p);
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
            flush_pending(zc);
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
        return dlock_seterr(cl(zc), DLOCK_ECONNECT,
                            "zookeeper %s: no session with any server (connect_timeout or "
                            "deadline reached)", zc->hosts);
    }
}

/* ---- errors ----------------------------------------------------------- */

static int is_connection_error(int rc)
{
    return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONEXPIRED ||
           rc == ZSESSIONMOVED || rc == ZINVALIDSTATE || rc == ZCLOSING;
}

static int zk_error(struct zk_conn *zc, int rc, const char *what, const char *path)
{
    int code = DLOCK_ESTORE;
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
    wait_event(zc, seen, dlock_monotonic_ns() + RETRY_PAUSE_MS * MS);
}

/* ---- nodes ------------------------------------------------------------- */

/* Creates path and its missing ancestors, the last one with `flags`. */
static int create_path(struct zk_conn *zc, const char *path, int flags)
{
    int rc = zoo_create(zc->zh, path, NULL, -1, zc->acl, flags, NULL, 0);
    if (rc == ZNONODE) {
        char *up = strdup(path);
        if (!up)
            return oom(zc);
        char *slash = strrchr(up, '/');
        if (slash && slash != up) {
            *slash = '\0';
            int err = create_path(zc, up, ZOO_PERSISTENT);
            free(up);
            if (err)
                return err;
        } else {
            free(up);
        }
        rc = zoo_create(zc->zh, path, NULL, -1, zc->acl, flags, NULL, 0);
    }
    if (rc != ZOK && rc != ZNODEEXISTS)
        return zk_error(zc, rc, "cannot create", path);
    return 0;
}

/* The root exists and we may read it: with digest credentials, this is
 * where a wrong password shows (ZooKeeper accepts any digest at login and
 * only ACL checks tell). */
static int check_root(struct zk_conn *zc)
{
    char buf[1];
    int len = sizeof buf;
    struct Stat st;
    int rc = zoo_get(zc->zh, zc->root, 0, buf, &len, &st);
    if (rc == ZNONODE)
        return create_path(zc, zc->root, ZOO_PERSISTENT);
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

static void kids_free(struct zk_kids *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i].name);
    free(k->v);
    k->v = NULL;
    k->n = 0;
}

static int kid_cmp(const void *a, const void *b)
{
    const struct zk_kid *x = a, *y = b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Keeps the children that look like lock nodes, sorted by sequence. */
static int kids_from(const struct String_vector *sv, struct zk_kids *k)
{
    k->n = 0;
    k->v = calloc(sv->count > 0 ? (size_t)sv->count : 1, sizeof *k->v);
    if (!k->v)
        return DLOCK_ENOMEM;
    for (int i = 0; i < sv->count; i++) {
        const char *mark = strstr(sv->data[i], LOCK_MARK);
        char *end;
        if (!mark)
            continue;
        long long seq = strtoll(mark + sizeof LOCK_MARK - 1, &end, 10);
        if (*end || end == mark + sizeof LOCK_MARK - 1)
            continue;
        if (!(k->v[k->n].name = strdup(sv->data[i]))) {
            kids_free(k);
            return DLOCK_ENOMEM;
        }
        k->v[k->n++].seq = seq;
    }
    qsort(k->v, k->n, sizeof *k->v, kid_cmp);
    return 0;
}

/* Index of the child whose name starts with `start` (the whole name, or
 * our owner's prefix), or -1. */
static long kids_find(const struct zk_kids *k, const char *start)
{
    size_t len = strlen(start);
    for (size_t i = 0; i < k->n; i++)
        if (strncmp(k->v[i].name, start, len) == 0)
            return (long)i;
    return -1;
}

static const char *basename_of(const char *path)
{
    return strrchr(path, '/') + 1;
}

/* ---- acquire ----------------------------------------------------------- */

/* The pipelined create + list: the create's reply is filled in on the
 * client's completion thread. */
struct zk_pipe {
    struct zk_conn *zc;
    int pending;
    int create_rc, list_rc;
    char *created;
    int64_t czxid;
    struct zk_kids kids;
};

static void pipe_done(struct zk_pipe *p)
{
    pthread_mutex_lock(&p->zc->mu);
    p->pending--;
    pthread_cond_broadcast(&p->zc->cv);
    pthread_mutex_unlock(&p->zc->mu);
}

static void on_created(int rc, const char *path, const struct Stat *st, const void *data)
{
    struct zk_pipe *p = (struct zk_pipe *)data;
    p->create_rc = rc;
    if (rc == ZOK && !(p->created = strdup(path)))
        p->create_rc = ZMARSHALLINGERROR;
    if (rc == ZOK)
        p->czxid = st->czxid;
    pipe_done(p);
}

/*
 * Sends the create and the listing back to back. The create is
 * asynchronous (its reply comes through the completion thread); the
 * listing is synchronous, answered straight from the I/O thread, and
 * arrives after the create's reply: one round trip, one thread hop.
 */
static void create_and_list(struct zk_acq *a, struct zk_pipe *p)
{
    struct zk_conn *zc = a->zc;
    struct String_vector sv = {0, NULL};
    memset(p, 0, sizeof *p);
    p->zc = zc;
    p->pending = 1;
    /* The completion may run before zoo_acreate2() returns: only it writes
     * p->create_rc, unless the request was never queued. */
    int rc = zoo_acreate2(zc->zh, a->prefix, NULL, -1, zc->acl, ZOO_EPHEMERAL_SEQUENTIAL,
                          on_created, p);
    if (rc != ZOK) {
        pthread_mutex_lock(&zc->mu);
        p->create_rc = rc;
        p->pending = 0;
        pthread_mutex_unlock(&zc->mu);
        return;
    }
    p->list_rc = zoo_get_children(zc->zh, a->parent, 0, &sv);
    if (p->list_rc == ZOK) {
        if (kids_from(&sv, &p->kids) != 0)
            p->list_rc = ZMARSHALLINGERROR;
        deallocate_String_vector(&sv);
    }
    /* The client always answers, if only with ZCONNECTIONLOSS. */
    pthread_mutex_lock(&zc->mu);
    while (p->pending > 0)
        pthread_cond_wait(&zc->cv, &zc->mu);
    pthread_mutex_unlock(&zc->mu);
}

/* Positive results of an acquire step: go round again, at once (AGAIN) or
 * once the connection is back (RETRY: a call failed with a connection
 * error). */
enum { AGAIN = 1, RETRY = 2 };

static int list_kids(struct zk_acq *a, struct zk_kids *k)
{
    struct String_vector sv = {0, NULL};
    int rc = zoo_get_children(a->zc->zh, a->parent, 0, &sv);
    if (rc == ZNONODE) {
        k->v = NULL, k->n = 0; /* the container went with its last child */
        return 0;
    }
    if (is_connection_error(rc))
        return RETRY;
    if (rc != ZOK)
        return zk_error(a->zc, rc, "cannot list", a->parent);
    int err = kids_from(&sv, k);
    deallocate_String_vector(&sv);
    return err ? oom(a->zc) : 0;
}

/*
 * Protected create: a create whose reply was lost may still have made our
 * node. Our owner id in its name finds it, rather than making a second one
 * and leaving the first as an orphan that would block everyone behind it
 * until our session ends.
 */
static int find_lost_create(struct zk_acq *a, struct zk_kids *k)
{
    struct zk_conn *zc = a->zc;
    char start[sizeof a->req->owner_hex + sizeof LOCK_MARK];
    int err = list_kids(a, k);
    if (err)
        return err;
    snprintf(start, sizeof start, "%s%s", a->req->owner_hex, LOCK_MARK);
    long i = kids_find(k, start);
    if (i < 0)
        return 0; /* it never reached the server: create again */
    struct Stat st;
    char *node = join3(a->parent, "/", k->v[i].name);
    if (!node)
        return oom(zc);
    int rc = zoo_exists(zc->zh, node, 0, &st);
    if (rc != ZOK) {
        err = is_connection_error(rc) || rc == ZNONODE ? RETRY
                                                       : zk_error(zc, rc, "cannot read", node);
        free(node);
        return err;
    }
    a->node = node;
    a->gen = zc->gen;
    a->czxid = (uint64_t)st.czxid;
    return 0;
}

/* Makes our node (or finds the one a lost reply made) and lists the
 * parent's lock children. */
static int make_node(struct zk_acq *a, struct zk_kids *k)
{
    struct zk_conn *zc = a->zc;
    struct zk_pipe p;
    if (a->create_lost) {
        a->create_lost = 0;
        int err = find_lost_create(a, k);
        if (err || a->node)
            return err;
        kids_free(k);
    }
    create_and_list(a, &p);
    if (p.create_rc == ZOK) {
        a->node = join3(a->parent, "/", basename_of(p.created));
        free(p.created);
        a->gen = zc->gen;
        a->czxid = (uint64_t)p.czxid;
        if (!a->node) {
            kids_free(&p.kids);
            return oom(zc);
        }
        if (p.list_rc == ZOK) {
            *k = p.kids;
            return 0;
        }
        return list_kids(a, k);
    }
    kids_free(&p.kids);
    if (p.create_rc == ZNONODE) { /* no parent yet, or its container was just removed */
        int err = create_path(zc, a->parent, ZOO_CONTAINER);
        return err ? err : AGAIN;
    }
    if (p.create_rc == ZCONNECTIONLOSS || p.create_rc == ZOPERATIONTIMEOUT) {
        a->create_lost = 1;
        return RETRY;
    }
    if (is_connection_error(p.create_rc))
        return RETRY;
    return zk_error(zc, p.create_rc, "cannot create a lock node under", a->parent);
}

/* Watches the predecessor and waits until it changes, or the session does,
 * or the deadline passes (DLOCK_ETIMEDOUT). */
static int wait_predecessor(struct zk_acq *a, const char *pred)
{
    struct zk_conn *zc = a->zc;
    char buf[1];
    int len = sizeof buf;
    struct Stat st;
    char *path = join3(a->parent, "/", pred);
    if (!path)
        return oom(zc);
    uint64_t seen = events_now(zc);
    /* getData rather than exists: on a node already gone it leaves no
     * watch behind. */
    int rc = zoo_get(zc->zh, path, 1, buf, &len, &st);
    free(path);
    if (rc == ZNONODE)
        return 0;
    if (is_connection_error(rc))
        return RETRY;
    if (rc != ZOK)
        return zk_error(zc, rc, "cannot watch the node before ours under", a->parent);
    uint64_t until = a->req->wait == DLOCK_WAIT_DEADLINE ? a->req->deadline_ns : NEVER;
    if (!wait_event(zc, seen, until))
        return dlock_seterr(cl(zc), DLOCK_ETIMEDOUT,
                            "the deadline passed with the lock still held elsewhere");
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
        return no_session(a);
    if (a->node && a->gen != zc->gen) { /* its session died: the node went with it */
        free(a->node);
        a->node = NULL;
    }
    if (a->create_lost && a->gen != zc->gen)
        a->create_lost = 0;
    int err = a->node ? list_kids(a, k) : make_node(a, k);
    if (err)
        return err;
    long i = kids_find(k, basename_of(a->node));
    if (i < 0) { /* deleted under us (an administrator?): queue again */
        free(a->node);
        a->node = NULL;
        return AGAIN;
    }
    if (i == 0)
        return 0;
    if (a->req->wait == DLOCK_WAIT_TRY)
        return dlock_seterr(cl(zc), DLOCK_EBUSY, "the lock is held by another owner");
    int err2 = wait_predecessor(a, k->v[i - 1].name);
    return err2 ? err2 : AGAIN;
}

/* Deletes our node after giving up; if the connection is down, later. */
static void drop_node(struct zk_acq *a)
{
    struct zk_conn *zc = a->zc;
    if (!a->node || a->gen != zc->gen)
        return;
    if (session_status(zc) == SESSION_UP) {
        int rc = zoo_delete(zc->zh, a->node, -1);
        if (rc == ZOK || rc == ZNONODE)
            return;
    }
    size_t len = strlen(a->node) + 1;
    struct zk_pending *p = malloc(sizeof *p + len);
    if (!p)
        return; /* the node goes when the session ends */
    memcpy(p->path, a->node, len);
    p->next = zc->pending;
    zc->pending = p;
}

static int acquire_paths(struct zk_acq *a)
{
    char enc[DLOCK_FILE_ENCODED_MAX + 80];
    if (dlock_file_encode_name(a->req->name, a->req->name_len, enc, sizeof enc) != 0)
        return dlock_seterr(cl(a->zc), DLOCK_EINVAL, "cannot encode the lock name");
    enc[strlen(enc) - strlen(".lock")] = '\0'; /* one znode per name: no suffix needed */
    a->parent = join3(a->zc->root, "/", enc);
    if (!a->parent)
        return oom(a->zc);
    char mark[sizeof a->req->owner_hex + sizeof LOCK_MARK];
    snprintf(mark, sizeof mark, "%s%s", a->req->owner_hex, LOCK_MARK);
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
    if (req->wait == DLOCK_WAIT_TRY)
        a.until = dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS;
    else
        a.until = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns : NEVER;
    if ((err = acquire_paths(&a)) == 0) {
        do {
            uint64_t seen = events_now(zc);
            kids_free(&k);
            err = acquire_turn(&a, &k);
            if (err == RETRY && session_status(zc) == SESSION_UP)
                retry_pause(zc, seen);
        } while (err == AGAIN || err == RETRY);
    }
    kids_free(&k);
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

static int release_node(struct zk_conn *zc, struct zk_held *h)
{
    int retried = 0;
    for (;;) {
        if (h->gen != zc->gen)
            return lost(zc, "the session that held the lock has ended");
        /* Suspended: wait for the connection to come back, or for the
         * session to count as dead (at most its timeout). */
        if (wait_connected(zc, NEVER) == SESSION_DEAD) {
            session_end(zc);
            return lost(zc, "the session expired: the lock was lost and is already free");
        }
        uint64_t seen = events_now(zc);
        int rc = zoo_delete(zc->zh, h->path, -1);
        if (rc == ZOK)
            return 0;
        if (rc == ZNONODE) /* after a lost reply, our own delete did it */
            return retried ? 0 : lost(zc, "the lock node is gone: the session expired or the "
                                          "node was deleted");
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
 * still ours. While the connection is down the answer is unknown:
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
                            zc->hosts, zc->negotiated_ms);
    int rc = zoo_exists(zc->zh, h->path, 0, &st);
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
 * The keeper's check: no I/O, only what the client's event thread recorded,
 * read under mu, so it may run while the application's thread is inside
 * any other call (even one that replaces the session). A few microseconds.
 * DLOCK_ELOST: the lock's session ended or expired, or its node was deleted
 * by someone else. DLOCK_EEXPIRED: disconnected for a third of the session
 * timeout or longer (Curator's advice): the servers may have expired the
 * session already without the client hearing of it.
 */
static int zk_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    struct zk_held *h = (struct zk_held *)held;
    const char *why = NULL;
    int err = 0, timeout;
    uint64_t down_ns = 0;
    (void)ttl_ms;
    pthread_mutex_lock(&zc->mu);
    timeout = zc->negotiated_ms > 0 ? zc->negotiated_ms : zc->session_ms;
    if (zc->suspended_since)
        down_ns = dlock_monotonic_ns() - zc->suspended_since;
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
    pthread_mutex_unlock(&zc->mu);
    if (err == DLOCK_EEXPIRED)
        return dlock_seterr(cl(zc), err,
                            "zookeeper %s: disconnected for %" PRIu64 " ms, a third of the "
                            "session timeout (%d ms) or more: the session may have expired on "
                            "the servers",
                            zc->hosts, (uint64_t)(down_ns / MS), timeout);
    return err ? lost(zc, why) : 0;
}

/* The floor for an acquire + release: a create and a delete of a scratch
 * ephemeral node, one round trip each. '!' never occurs in encoded names. */
static int zk_ping(dlock_conn *conn)
{
    struct zk_conn *zc = (struct zk_conn *)conn;
    char leaf[40];
    int err = session_connect(zc, dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS);
    if (err)
        return err;
    const clientid_t *id = zoo_client_id(zc->zh);
    snprintf(leaf, sizeof leaf, "!ping-%016" PRIx64, id ? (uint64_t)id->client_id : 0);
    char *path = join3(zc->root, "/", leaf);
    if (!path)
        return oom(zc);
    int rc = zoo_create(zc->zh, path, NULL, -1, zc->acl, ZOO_EPHEMERAL, NULL, 0);
    if (rc == ZOK || rc == ZNODEEXISTS)
        rc = zoo_delete(zc->zh, path, -1);
    err = rc == ZOK ? 0 : zk_error(zc, rc, "ping (create + delete)", path);
    free(path);
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

/* The root: absolute, no empty, "." or ".." component, no control bytes
 * (ZooKeeper refuses them); "/" alone is refused because /zookeeper is the
 * server's own. */
static int parse_root(struct zk_conn *zc, const dlock_uri *uri)
{
    const char *path = dlock_uri_path(uri);
    size_t len = strlen(path);
    if (!path[0])
        path = DEFAULT_ROOT, len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    int bad = len <= 1;
    for (size_t i = 0; i < len && !bad; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c < 0x20 || c == 0x7f)
            bad = 1;
        if (c == '/') {
            size_t j = i + 1;
            while (j < len && path[j] != '/')
                j++;
            size_t clen = j - i - 1;
            bad = clen == 0 || (clen == 1 && path[i + 1] == '.') ||
                  (clen == 2 && path[i + 1] == '.' && path[i + 2] == '.');
        }
    }
    if (bad)
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
    int err;
    if (dlock_uri_host_count(uri) == 0)
        return dlock_seterr(cl(zc), DLOCK_EBADURI,
                            "a zookeeper:// URI needs hosts, as in zookeeper://127.0.0.1:2181/dlock");
    if ((err = dlock_uri_param_uint(cl(zc), uri, "session_timeout", 1, 3600000, &session_ms)) ||
        (err = dlock_uri_param_uint(cl(zc), uri, "connect_timeout", 1, 3600000, &connect_ms)))
        return err;
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
    pthread_condattr_t attr;
    int err;
    if (!zc)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    zc->base.client = c;
    pthread_mutex_init(&zc->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&zc->cv, &attr);
    pthread_condattr_destroy(&attr);
    if ((err = parse_uri(zc, uri)) != 0 || (err = session_start(zc)) != 0)
        goto fail;
    if ((err = session_connect(zc, dlock_monotonic_ns() + (uint64_t)zc->connect_ms * MS)) != 0) {
        if (err == DLOCK_ECONNECT)
            dlock_seterr(c, err, "zookeeper %s: no session within %d ms (connect_timeout): "
                         "servers down, not serving, or unreachable", zc->hosts, zc->connect_ms);
        goto fail;
    }
    if ((err = check_root(zc)) != 0)
        goto fail;
    *connp = &zc->base;
    return 0;
fail:
    zk_close(&zc->base);
    return err;
}

const dlock_backend dlock_zookeeper_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .name = "zookeeper",
    .schemes = zk_schemes,
    /* No LEASE or RENEW: the lease is the session, which a live holder
     * keeps alive by itself; the TTL is not used. No HOLDER_DEATH: a dead
     * holder's lock is freed when its session times out, not at once. */
    .caps = DLOCK_CAP_FENCING | DLOCK_CAP_FIFO | DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE,
    .options = zk_options,
    .open = zk_open,
    .close = zk_close,
    .acquire = zk_acquire,
    .release = zk_release,
    .renew = zk_renew,
    .ping = zk_ping,
    .keep = zk_keep,
};
