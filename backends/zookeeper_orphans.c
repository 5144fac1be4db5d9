/*
 * Cleanup of what a given-up request left on the servers (see
 * zookeeper_int.h, struct zk_orphan): a lock node whose delete was lost,
 * or the node a create whose reply was lost may have made, looked for by
 * our owner id under its parent. Queued on the connection and sent as soon
 * as the session is connected, by whichever thread sees it first (the
 * client's completion thread on a reconnection, or the application's);
 * a cleanup whose session ended is dropped, its nodes went with it. Calls
 * nothing of the backend's but the C client.
 */
#include "backends/zookeeper_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static struct zk_orphan *orphan_new(struct zk_conn *zc, const char *path, size_t len,
                                    unsigned gen)
{
    struct zk_orphan *o = calloc(1, sizeof *o + len + 1);
    if (!o)
        return NULL;
    o->zc = zc;
    o->gen = gen;
    memcpy(o->path, path, len);
    return o;
}

struct zk_orphan *zk_orphan_node(struct zk_conn *zc, const char *path, unsigned gen)
{
    return orphan_new(zc, path, strlen(path), gen);
}

struct zk_orphan *zk_orphan_search(struct zk_conn *zc, const char *prefix, unsigned gen)
{
    const char *slash = strrchr(prefix, '/');
    if (!slash || strlen(slash + 1) >= MARK_MAX)
        return NULL;
    struct zk_orphan *o = orphan_new(zc, prefix, (size_t)(slash - prefix), gen);
    if (o) {
        o->search = 1;
        memcpy(o->mark, slash + 1, strlen(slash + 1) + 1);
    }
    return o;
}

void zk_orphans_free(struct zk_orphan *o)
{
    while (o) {
        struct zk_orphan *next = o->next;
        free(o);
        o = next;
    }
}

/* Puts o back on the queue if its session is still ours (it is then sent
 * at the next connection), else frees it: its nodes went with the session. */
static void orphan_requeue(struct zk_conn *zc, struct zk_orphan *o)
{
    pthread_mutex_lock(&zc->mu);
    if (o->gen == zc->gen) {
        o->next = zc->orphans;
        zc->orphans = o;
        o = NULL;
    }
    pthread_mutex_unlock(&zc->mu);
    free(o);
}

static void on_orphan_deleted(int rc, const void *data)
{
    struct zk_orphan *o = (struct zk_orphan *)data;
    if (maybe_done(rc))
        orphan_requeue(o->zc, o);
    else
        free(o); /* deleted, gone already, or gone with the session */
}

static void on_orphan_listed(int rc, const struct String_vector *sv, const void *data)
{
    struct zk_orphan *o = (struct zk_orphan *)data;
    struct zk_conn *zc = o->zc;
    if (maybe_done(rc)) {
        orphan_requeue(zc, o);
        return;
    }
    size_t ml = strlen(o->mark);
    for (int i = 0; rc == ZOK && sv && i < sv->count; i++) {
        if (strncmp(sv->data[i], o->mark, ml) != 0)
            continue;
        char *path = join3(o->path, "/", sv->data[i]);
        struct zk_orphan *n = path ? zk_orphan_node(zc, path, o->gen) : NULL;
        free(path);
        if (n)
            zk_orphan_queue(zc, n);
    }
    free(o); /* ZNONODE: no parent, so no node either */
}

/* Sends o's request on zh (the client's completion thread or the
 * application's). */
static void orphan_send(struct zk_conn *zc, zhandle_t *zh, struct zk_orphan *o)
{
    int rc;
    if (o->search)
        rc = zoo_aget_children(zh, o->path, 0, on_orphan_listed, o);
    else
        rc = zoo_adelete(zh, o->path, -1, on_orphan_deleted, o);
    if (rc == ZMARSHALLINGERROR)
        return; /* the completion may have been registered: it owns o */
    if (rc != ZOK)
        orphan_requeue(zc, o);
}

/*
 * Sends every queued cleanup, if gen is still the session. Safe on the
 * client's completion thread: zh is read under mu with gen, and only the
 * application's thread closes a handle, after bumping gen and then joining
 * that thread, so a handle read here lives until the send is done.
 */
void zk_orphans_flush(struct zk_conn *zc, unsigned gen)
{
    pthread_mutex_lock(&zc->mu);
    if (gen != zc->gen || !zc->zh || zc->state != ZOO_CONNECTED_STATE) {
        pthread_mutex_unlock(&zc->mu);
        return;
    }
    struct zk_orphan *list = zc->orphans;
    zhandle_t *zh = zc->zh;
    zc->orphans = NULL;
    pthread_mutex_unlock(&zc->mu);
    while (list) {
        struct zk_orphan *o = list;
        list = o->next;
        o->next = NULL;
        orphan_send(zc, zh, o);
    }
}

void zk_orphan_queue(struct zk_conn *zc, struct zk_orphan *o)
{
    if (!o)
        return;
    unsigned gen = o->gen;
    orphan_requeue(zc, o);
    zk_orphans_flush(zc, gen);
}

