/*
 * Elections on ZooKeeper (dlock.h "Leader election"): an election is the
 * name's lock (zookeeper.c's recipe), and its value lives on the holder's
 * own EPHEMERAL_SEQUENTIAL node.
 *
 * publish: one transaction that sets the data of our lock node to the
 * value, if its data version is still the one we know, and the data of the
 * name's node (the parent) to our grant (our node's czxid and name) and the
 * value. Our node exists only while our session holds the lock, so its set
 * is the ownership check: a node gone (ZNONODE) or rewritten by someone
 * else (ZBADVERSION, checked against the node's session and czxid: a lost
 * reply of our own set also moves the version) is DLOCK_ELOST, and the
 * transaction writes nothing. The parent's set also wakes the observers
 * (its data watch): they need no watch on the holder's node.
 *
 * leader: a sync, the listing of the parent and its data, pipelined (one
 * round trip; no sync for an observer's read: its watch, set first on the
 * same server, tells of any change the read misses): the value is the holder's only if the data names the
 * holder's node (the first nodes hold, zk_holders()), whose czxid it also
 * carries (the term). A value left by an earlier leader names another node
 * (a node name is never reused while the parent exists; the container goes
 * with its data). A holder that has not published (a plain lock, a leader
 * between grant and publish): no value, and an exists of its node for the
 * czxid, one more round trip.
 *
 * The watch (observers, on their own connection): a child watch on the
 * parent (zoo_awget_children: grants come with a delete of the node ahead,
 * releases and session ends delete the holder's node) and an exists watch
 * on it (zoo_awexists: a data watch while it exists, woken by publish; a
 * creation watch while nobody has ever campaigned, or after the container
 * was reaped), both with a watcher of our own whose context is the
 * connection. The client calls it on its completion thread: it writes the
 * eventfd of every election watch open on the connection. watch_read drains
 * it and sends both requests again without waiting for their replies: the
 * servers run a session's requests in order, so the watches are set before
 * the leader() read that follows. An idle watch sends nothing. A session
 * that expires (its watches gone), a session ended by the connection (a
 * call found it dead: zk_elect_session_ended()), or a re-arm that failed
 * make watch_read fail: the core opens the watch again. wake() has
 * nothing to do: a release deletes the holder's node, which the child watch
 * sees.
 */
#include "backends/zookeeper_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/internal.h"

struct zk_ewatch {
    dlock_watch base;
    struct zk_ewatch *next; /* on zc->ewatches, under mu */
    struct zk_conn *zc;
    unsigned gen; /* the session the watches were set on */
    int fd;       /* eventfd, written by the watcher */
    int broken;   /* under mu: the session expired, or a re-arm failed */
    char parent[];
};

/* ---- publish and read ------------------------------------------------- */

/* The name node's data: "<czxid, 16 hex digits><holder's node name>\n"
 * then the value. */
#define GRANT_HEX 16

int zk_elect_publish(struct zk_conn *zc, const char *node, uint64_t token, int *version,
                     const void *value, size_t len, uint64_t until)
{
    const char *slash = strrchr(node, '/');
    size_t base = strlen(slash + 1);
    char *parent = strndup(node, (size_t)(slash - node));
    char *pdata = malloc(GRANT_HEX + base + 2 + len);
    struct Stat st;
    int rc = parent && pdata ? ZBADVERSION : NOMEM;
    if (pdata) {
        snprintf(pdata, GRANT_HEX + base + 2, "%016" PRIx64 "%s\n", token, slash + 1);
        memcpy(pdata + GRANT_HEX + base + 1, value, len);
    }
    for (int tries = 0; rc == ZBADVERSION && tries < 2; tries++) {
        if (*version < 0) {
            /* Ours only if created by this session with this czxid (the
             * path may be reused once the node and its parent are gone). */
            const clientid_t *id = zoo_client_id(zc->zh);
            rc = zk_exists(zc, node, &st, until);
            if (rc != ZOK)
                break;
            if (!id || st.ephemeralOwner != id->client_id || (uint64_t)st.czxid != token) {
                rc = ZBADVERSION;
                break;
            }
            *version = st.version;
        }
        rc = zk_publish_set(zc, node, *version, value, len, parent, pdata,
                            GRANT_HEX + base + 1 + len, &st, until);
        if (rc == ZOK)
            *version = st.version;
        else
            *version = -1; /* a lost reply may have moved it: look it up */
    }
    free(pdata);
    free(parent);
    return rc;
}

/* The value in the name node's data d (n bytes), if published by the grant
 * of the node called head: 1, *czxid and the value copied; else 0. */
static int published_by(const char *d, size_t n, const char *head, uint64_t *czxid,
                        char *value, size_t *value_len)
{
    size_t hl = strlen(head);
    char hex[GRANT_HEX + 1];
    if (n < GRANT_HEX + hl + 1 || memcmp(d + GRANT_HEX, head, hl) != 0 ||
        d[GRANT_HEX + hl] != '\n')
        return 0;
    memcpy(hex, d, GRANT_HEX);
    hex[GRANT_HEX] = '\0';
    char *end;
    *czxid = strtoull(hex, &end, 16);
    if (*end)
        return 0;
    *value_len = n - (GRANT_HEX + hl + 1);
    if (*value_len > DLOCK_VALUE_MAX)
        return 0;
    memcpy(value, d + GRANT_HEX + hl + 1, *value_len);
    return 1;
}

/* An unbroken watch of this session on parent is open on zc (an
 * observer's read). */
static int watched(struct zk_conn *zc, const char *parent)
{
    int yes = 0;
    pthread_mutex_lock(&zc->mu);
    for (struct zk_ewatch *w = zc->ewatches; w && !yes; w = w->next)
        yes = !w->broken && w->gen == zc->gen && strcmp(w->parent, parent) == 0;
    pthread_mutex_unlock(&zc->mu);
    return yes;
}

int zk_elect_read(struct zk_conn *zc, const char *parent, struct zk_kids *k, size_t *nh,
                  uint64_t *czxid, char *value, size_t *value_len, uint64_t until)
{
    char *d = malloc(ZK_ELECTION_DATA_MAX);
    size_t n = 0;
    *nh = 0;
    *value_len = 0;
    /* An observer's read needs no sync: its watches were set before it on
     * the same server, which tells of every later change it applies. */
    int rc = d ? zk_list_data(zc, parent, !watched(zc, parent), k, d, &n, until) : NOMEM;
    if (rc == ZNONODE)
        rc = ZOK; /* never taken, or its container reaped: free */
    if (rc == ZOK)
        *nh = zk_holders(k);
    /* A holder that has not published (a plain lock, or a leader between
     * its grant and its publish): its czxid from its node, one more
     * round trip. */
    if (rc == ZOK && *nh && !published_by(d, n, k->v[*nh - 1].name, czxid, value, value_len)) {
        char *path = join3(parent, "/", k->v[*nh - 1].name);
        struct Stat st;
        rc = path ? zk_exists(zc, path, &st, until) : NOMEM;
        if (rc == ZOK)
            *czxid = (uint64_t)st.czxid;
        free(path);
    }
    if (rc != ZOK)
        zk_kids_free(k);
    free(d);
    return rc;
}

/* ---- the watch --------------------------------------------------------- */

/* Wakes every election watch of zc, mu held; broken: they must reopen. */
static void wake_all(struct zk_conn *zc, int broken)
{
    uint64_t one = 1;
    for (struct zk_ewatch *w = zc->ewatches; w; w = w->next) {
        if (broken)
            w->broken = 1;
        /* Cannot fail: read drains it, and the client's threads block
         * every signal. */
        while (write(w->fd, &one, sizeof one) < 0 && errno == EINTR)
            ;
    }
}

/* The watcher of our watches, on the client's completion thread; ctx is
 * the connection, which outlives its session's threads. Session events
 * reach every watcher too. */
static void on_change(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_conn *zc = ctx;
    (void)zh, (void)path;
    pthread_mutex_lock(&zc->mu);
    wake_all(zc, type == ZOO_SESSION_EVENT &&
                     (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE));
    pthread_mutex_unlock(&zc->mu);
}

void zk_elect_session_ended(struct zk_conn *zc)
{
    pthread_mutex_lock(&zc->mu);
    wake_all(zc, 1);
    pthread_mutex_unlock(&zc->mu);
}

/* A re-arm's reply: a watch that could not be set breaks the watches. */
static void armed(int rc, void *ctx)
{
    struct zk_conn *zc = ctx;
    if (rc != ZOK && rc != ZNONODE) /* an exists of no node sets its watch */
        zk_elect_session_ended(zc);
}

static void on_armed_kids(int rc, const struct String_vector *sv, const void *data)
{
    (void)sv;
    armed(rc, (void *)data);
}

static void on_armed_stat(int rc, const struct Stat *st, const void *data)
{
    (void)st;
    armed(rc, (void *)data);
}

/* Sends the child and exists watches of w's parent, no wait: ZOK or the
 * client's refusal. */
static int arm(struct zk_ewatch *w)
{
    struct zk_conn *zc = w->zc;
    int rc = zoo_awget_children(zc->zh, w->parent, on_change, zc, on_armed_kids, zc);
    if (rc == ZOK)
        rc = zoo_awexists(zc->zh, w->parent, on_change, zc, on_armed_stat, zc);
    return rc;
}

int zk_elect_watch_open(struct zk_conn *zc, const char *parent, dlock_watch **watchp)
{
    size_t len = strlen(parent) + 1;
    struct zk_ewatch *w = calloc(1, sizeof *w + len);
    if (!w)
        return dlock_seterr(cl(zc), DLOCK_ENOMEM, "out of memory");
    w->base.conn = &zc->base;
    w->zc = zc;
    w->gen = zc->gen;
    memcpy(w->parent, parent, len);
    if ((w->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        int e = errno;
        free(w);
        return dlock_seterr(cl(zc), DLOCK_EIO, "eventfd: %s", strerror(e));
    }
    pthread_mutex_lock(&zc->mu);
    w->next = zc->ewatches;
    zc->ewatches = w;
    pthread_mutex_unlock(&zc->mu);
    int rc = arm(w);
    if (rc != ZOK) {
        zk_elect_watch_close(&w->base);
        return dlock_seterr(cl(zc), DLOCK_ECONNECT, "zookeeper %s: cannot watch %.80s: %s",
                            zc->hosts, parent, zerror(rc));
    }
    *watchp = &w->base;
    return 0;
}

int zk_elect_watch_fd(dlock_watch *watch)
{
    return ((struct zk_ewatch *)watch)->fd;
}

int zk_elect_watch_read(dlock_watch *watch)
{
    struct zk_ewatch *w = (struct zk_ewatch *)watch;
    struct zk_conn *zc = w->zc;
    uint64_t n;
    while (read(w->fd, &n, sizeof n) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&zc->mu);
    int broken = w->broken || w->gen != zc->gen || !zc->zh;
    int up = !broken && zc->state == ZOO_CONNECTED_STATE;
    pthread_mutex_unlock(&zc->mu);
    if (broken)
        return dlock_seterr(cl(zc), DLOCK_ECONNECT,
                            "zookeeper %s: the session of the election's watch ended", zc->hosts);
    /* Disconnected: the client sets the watches again when it reconnects,
     * and its connected event wakes us to arm what an event used up. */
    if (!up)
        return 0;
    int rc = arm(w);
    if (rc != ZOK)
        return dlock_seterr(cl(zc), DLOCK_ECONNECT, "zookeeper %s: cannot watch %.80s: %s",
                            zc->hosts, w->parent, zerror(rc));
    return 0;
}

void zk_elect_watch_close(dlock_watch *watch)
{
    struct zk_ewatch *w = (struct zk_ewatch *)watch;
    struct zk_conn *zc = w->zc;
    /* The watches stay set on the session (they fire once more at most,
     * waking no one): the watcher's context is the connection. */
    pthread_mutex_lock(&zc->mu);
    for (struct zk_ewatch **pp = &zc->ewatches; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    pthread_mutex_unlock(&zc->mu);
    close(w->fd);
    free(w);
}
