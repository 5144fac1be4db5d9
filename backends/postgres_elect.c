/*
 * PostgreSQL's elections (dlock.h "Leader election"): an election is the
 * name's advisory lock, its leader the holder; this file writes the
 * leader's value and wakes observers. leader() is inspect's statement with
 * the value read beside the holder (postgres_inspect.c). It calls only the
 * statement layer (postgres_io.c) and the session layer below it.
 *
 * Values: the table <table>_ldr (PG_VALUES_SUFFIX, created with the
 * fencing table), one row per name's key: the value (bytea, any bytes),
 * the owner id and token of the grant that published it, and the session
 * that holds it (pg_backend_pid() and its backend_start). publish() writes
 * it on the lock's own session, under the session's mutex, as renew()
 * proves ownership: the handle is not gone and the statement runs on its
 * session, which holds the lock until this client unlocks it (its release
 * or dlock_sql_expire(), which mark the handle gone, never while this
 * runs) or the session ends, and a session that ends aborts the write. So
 * a write that commits was made while the lock was ours (DLOCK_ELOST,
 * nothing written, otherwise). (A pg_locks check in the statement would
 * cost a scan of the server's lock table, as much as the rest of the
 * write, and prove nothing more.) leader() shows the
 * value only while the session that wrote it holds the lock (same pid and
 * start), and where it knows them, with the holder's token and owner id:
 * a dead leader's value is never shown as its successor's, nor as a plain
 * holder's. The row stays until the next publish of the name.
 *
 * Wake-ups: NOTIFY on the channel dlock_elect_<key in hex> (an identifier
 * of 28 bytes, whatever the name's length; names whose keys collide share
 * a channel: a spurious wake-up). publish() notifies in its transaction
 * (delivered at its commit: an observer woken reads the new value); wake()
 * after an election's release sends one NOTIFY of its own.
 *
 * A leader's end. A session's end (killed, its idle_session_timeout, a cut
 * network) frees its advisory locks without a notification, and no trigger
 * runs then. So the leader's session also holds the name's leader lock
 * (dlock_pg_leader_args(): a two-int lock, taken by its first publish,
 * unlocked with the name's lock by its release, or gone with the session),
 * and a watch waits for it: a watch is two connections of its own, one
 * that LISTENs on the channel (a session inside a statement gets no
 * notifications until it ends), one that waits for the leader lock in
 * shared mode, in the lock's queue, holding nothing, and lets go in the
 * same statement when granted; the core polls an epoll descriptor of both
 * sockets. The wait ends when the leader resigns or its session ends (at
 * once: no poll), or at once when no leader holds the lock; a notification
 * (the next leader's publish) arms it again. An idle watch sends nothing
 * (TCP keepalives only). A new leader's publish may wait a moment for
 * watches holding the lock shared in the instant they are granted. A
 * plain lock's grant and release on the name notify nothing, and a plain
 * holder has no leader lock: observers learn of those at the lease end
 * leader() read (the core's lease timer), or by the core's publish grace.
 * A watch whose connections end returns an error, and the core opens
 * another.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "backends/postgres_int.h"
#include "core/sha256.h"

/* "dlock_elect_" and the key's 16 hex digits. */
#define CHANNEL_MAX 32

static void channel(int64_t key, char buf[CHANNEL_MAX])
{
    snprintf(buf, CHANNEL_MAX, "dlock_elect_%016" PRIx64, (uint64_t)key);
}

/* A failed publish on h's session, as renew reports it. */
static int publish_failed(struct pg_conn *pc, struct pg_held *h, int err)
{
    struct pg_session *s = hs(h);
    if (s->base.silent_ms)
        return dlock_seterr(cl(pc), DLOCK_ECONNECT,
                            "postgresql: publish: no reply from the server within %" PRIu64
                            " ms; the session was closed, and the lock is lost with it",
                            s->base.silent_ms);
    if (!s->pg || PQstatus(s->pg) != CONNECTION_OK) {
        err = dlock_seterr(cl(pc), DLOCK_ELOST, "%s", dlock_sql_lost_why(&pc->pool, &h->sh));
        dlock_pg_session_close(s);
    }
    return err;
}

/* The write, on h's session (s->mu held): tagged as the lock's other
 * statements, in a transaction bounded by `timeout` on the server (as the
 * acquire's) and that and the margin on the client. synchronous_commit
 * off: a value lost with a server crash belonged to a session that ended
 * with it (advisory locks do not outlive the server), which leader() never
 * shows; the NOTIFY still goes out only at the commit. */
static int publish_on(struct pg_conn *pc, struct pg_held *h, const void *value, size_t len)
{
    struct pg_session *s = hs(h);
    char tg[128], settings[256], chan[CHANNEL_MAX];
    char *sql = NULL, *hex = NULL;
    PGresult *r = NULL;
    if (h->sh.gone || !s->pg) {
        int err = dlock_seterr(cl(pc), DLOCK_ELOST, "%s", dlock_sql_lost_why(&pc->pool, &h->sh));
        if (!h->sh.gone)
            dlock_pg_session_close(s);
        return err;
    }
    dlock_sql_expire(&pc->pool, &s->base, &h->sh);
    size_t room = 1700 + 2 * len;
    if (!(sql = malloc(room)) || !(hex = malloc(2 * len + 1))) {
        free(sql);
        return dlock_seterr(cl(pc), DLOCK_ENOMEM, "out of memory");
    }
    dlock_hex(value, len, hex);
    hex[2 * len] = '\0';
    dlock_pg_tag(tg, sizeof tg, h->owner_hex, s->base.lease, h->base.token, h->key);
    snprintf(settings, sizeof settings,
             "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off;"
             " SET LOCAL lock_timeout = %" PRIu64 "; SET LOCAL statement_timeout = %" PRIu64 "; ",
             pc->timeout_ms, pc->timeout_ms);
    channel(h->key, chan);
    /* The leader lock, once per grant (advisory locks count): it may wait
     * a moment for watches that hold it shared in the instant they wake. A
     * session lock outlives a failed transaction, so it counts as taken
     * from here on (unlocking one not held only warns). */
    char la[40], lead[80] = "";
    int stmt = 4;
    if (!h->leading) {
        dlock_pg_leader_args(h->key, la, sizeof la);
        snprintf(lead, sizeof lead, "SELECT pg_advisory_lock(%s); ", la);
        h->leading = 1;
        stmt++;
    }
    snprintf(sql, room,
             "%s%s%sWITH w AS (INSERT INTO %s" PG_VALUES_SUFFIX " (key, owner, token, pid, since,"
             " value) SELECT %" PRId64 ", '%s', %" PRIu64 ", pg_backend_pid(), backend_start,"
             " '\\x%s'::bytea FROM pg_stat_get_activity(pg_backend_pid())"
             " ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token,"
             " pid = EXCLUDED.pid, since = EXCLUDED.since, value = EXCLUDED.value RETURNING 1) "
             "SELECT (SELECT count(*) FROM w), pg_notify('%s', '')",
             tg, settings, lead, pc->table, h->key, h->owner_hex, h->base.token, hex, chan);
    free(hex);
    uint64_t margin = pc->timeout_ms < DEADLINE_MARGIN_MS ? pc->timeout_ms : DEADLINE_MARGIN_MS;
    int err = dlock_pg_run(pc, s, sql, stmt, &r, "publish",
                           dlock_monotonic_ns() + (pc->timeout_ms + margin) * MS);
    free(sql);
    if (err)
        return publish_failed(pc, h, err);
    int written = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "1") == 0;
    PQclear(r);
    if (!written) /* its own row in pg_stat_get_activity: always there */
        return dlock_seterr(cl(pc), DLOCK_EPROTO, "postgresql: publish: nothing was written");
    return 0;
}

int dlock_pg_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    struct pg_held *h = (struct pg_held *)held;
    pthread_mutex_lock(&hs(h)->base.mu);
    int err = publish_on(pc, h, value, len);
    pthread_mutex_unlock(&hs(h)->base.mu);
    return err;
}

/* One NOTIFY on an idle pooled session, bounded by `timeout` (and the
 * margin), and by the core's bound on the call: after the release of a
 * lock reported lost the store may be silent, and the observers learn at
 * the lease end anyway. A session found dead is closed; no retry. */
int dlock_pg_wake(dlock_conn *conn, const char *name, size_t len)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    char sql[96], chan[CHANNEL_MAX];
    PGresult *r = NULL;
    int64_t key = 0;
    int opened = 0, err = dlock_pg_layout_key(pc, name, len, &key);
    if (err)
        return err;
    uint64_t now = dlock_monotonic_ns();
    uint64_t margin = pc->timeout_ms < DEADLINE_MARGIN_MS ? pc->timeout_ms : DEADLINE_MARGIN_MS;
    uint64_t until = now + (pc->timeout_ms + margin) * MS;
    if (dlock_call_deadline() < until)
        until = dlock_call_deadline();
    if (until <= now)
        return dlock_seterr(cl(pc), DLOCK_ETIMEDOUT,
                            "postgresql: no time left to wake the election's observers");
    channel(key, chan);
    snprintf(sql, sizeof sql, "SELECT pg_notify('%s', '')", chan);
    struct dlock_sql_session *b = NULL;
    uint64_t open_until = until;
    if ((err = dlock_sql_take(&pc->pool, &open_until, &b, &opened)) != 0)
        return err;
    struct pg_session *s = (struct pg_session *)b;
    if ((err = dlock_pg_run(pc, s, sql, 0, &r, "waking the election's observers", until)) != 0) {
        if (!s->pg || PQstatus(s->pg) != CONNECTION_OK)
            dlock_pg_session_close(s);
        return err;
    }
    PQclear(r);
    return 0;
}

struct pg_watch {
    dlock_watch base;
    struct pg_conn *pc;
    struct pg_session s; /* LISTENs on the channel; outside the pool */
    struct pg_session d; /* waits for the leader lock; outside the pool */
    int ep;              /* epoll of both sockets: the fd the core polls */
    int armed;           /* d runs its wait */
    char wait_sql[400];
};

/* d's wait for the leader's session to let go of its leader lock (its
 * release, or its end): at once "f" when no one holds it (no leader, or
 * one that has not published yet: its publish notifies), else waiting in
 * the lock's queue, holding nothing, until it is let go ("t"). Sent
 * without waiting for the answer. */
static int arm(struct pg_watch *w)
{
    if (!PQsendQuery(w->d.pg, w->wait_sql))
        return -1;
    for (int i = 0; PQflush(w->d.pg) == 1; i++)
        if (i > 1000)
            return -1; /* a few hundred bytes into an empty socket buffer */
    w->armed = 1;
    return 0;
}

static int watch_failed(struct pg_watch *w, struct pg_session *s, const char *which)
{
    char why[256];
    snprintf(why, sizeof why, "%s", s->pg ? PQerrorMessage(s->pg) : "");
    why[strcspn(why, "\n")] = '\0';
    dlock_pg_session_close(&w->s);
    dlock_pg_session_close(&w->d);
    return dlock_seterr(cl(w->pc), DLOCK_ECONNECT,
                        "postgresql: the election's watch (%s) ended%s%s", which,
                        why[0] ? ": " : "", why);
}

/* Two connections of its own (connect_timeout per host each), with no idle
 * timer (a server's default would end an idle watch) and no lock or
 * statement timeout: one LISTENs on the name's channel from the moment
 * LISTEN commits, before the core's first read; the other waits for the
 * leader lock. */
int dlock_pg_watch_open(dlock_conn *conn, const char *name, size_t len, dlock_watch **watchp)
{
    struct pg_conn *pc = (struct pg_conn *)conn;
    char sql[160], chan[CHANNEL_MAX], la[40];
    PGresult *r = NULL;
    int64_t key = 0;
    int err = dlock_pg_layout_key(pc, name, len, &key);
    if (err)
        return err;
    struct pg_watch *w = calloc(1, sizeof *w);
    if (!w || dlock_sql_session_init(&w->s.base) != 0) {
        free(w);
        return dlock_seterr(cl(pc), DLOCK_ENOMEM, "out of memory");
    }
    if (dlock_sql_session_init(&w->d.base) != 0) {
        dlock_sql_session_fini(&w->s.base);
        free(w);
        return dlock_seterr(cl(pc), DLOCK_ENOMEM, "out of memory");
    }
    w->base.conn = conn;
    w->pc = pc;
    w->ep = -1;
    channel(key, chan);
    dlock_pg_leader_args(key, la, sizeof la);
    snprintf(w->wait_sql, sizeof w->wait_sql,
             "SELECT CASE WHEN pg_try_advisory_lock_shared(%s) THEN NOT"
             " pg_advisory_unlock_shared(%s) ELSE (SELECT true FROM pg_advisory_lock_shared(%s))"
             " AND pg_advisory_unlock_shared(%s) END",
             la, la, la, la);
    snprintf(sql, sizeof sql, "SET idle_session_timeout = 0; LISTEN %s", chan);
    static const char quiet[] = "SET idle_session_timeout = 0; SET lock_timeout = 0;"
                                " SET statement_timeout = 0";
    if ((err = dlock_pg_session_open(pc, &w->s, 0)) != 0 ||
        (err = dlock_pg_run(pc, &w->s, sql, 1, &r, "listening for the election",
                            after_timeout(pc))) != 0)
        goto fail;
    PQclear(r);
    r = NULL;
    if ((err = dlock_pg_session_open(pc, &w->d, 0)) != 0 ||
        (err = dlock_pg_run(pc, &w->d, quiet, 2, &r, "watching the election's leader",
                            after_timeout(pc))) != 0)
        goto fail;
    PQclear(r);
    struct epoll_event ev = {.events = EPOLLIN};
    if ((w->ep = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        epoll_ctl(w->ep, EPOLL_CTL_ADD, PQsocket(w->s.pg), &ev) != 0 ||
        epoll_ctl(w->ep, EPOLL_CTL_ADD, PQsocket(w->d.pg), &ev) != 0) {
        err = dlock_seterr(cl(pc), DLOCK_EIO, "cannot make an election watch's descriptor: %s",
                           strerror(errno));
        goto fail;
    }
    if (arm(w) != 0) {
        err = watch_failed(w, &w->d, "leader lock");
        goto fail;
    }
    *watchp = &w->base;
    return 0;
fail:
    dlock_pg_watch_close(&w->base);
    return err;
}

int dlock_pg_watch_fd(dlock_watch *watch)
{
    return ((struct pg_watch *)watch)->ep;
}

/*
 * Reads what both sockets have (non-blocking connections): the wait's
 * answer (the leader lock let go, or none held) disarms it; a notification
 * (a publish, a wake) arms it again if it is not waiting, so that it waits
 * for the leader that published. The core reads the election next.
 */
int dlock_pg_watch_read(dlock_watch *watch)
{
    struct pg_watch *w = (struct pg_watch *)watch;
    if (!w->s.pg || !w->d.pg)
        return watch_failed(w, &w->s, "closed");
    if (!PQconsumeInput(w->d.pg) || w->d.ended || PQstatus(w->d.pg) != CONNECTION_OK)
        return watch_failed(w, &w->d, "leader lock");
    while (w->armed && !PQisBusy(w->d.pg)) {
        PGresult *r = PQgetResult(w->d.pg);
        if (!r) {
            w->armed = 0;
            break;
        }
        int bad = PQresultStatus(r) != PGRES_TUPLES_OK;
        PQclear(r);
        if (bad)
            return watch_failed(w, &w->d, "leader lock");
    }
    int told = 0;
    int ok = PQconsumeInput(w->s.pg);
    for (PGnotify *n; (n = PQnotifies(w->s.pg)) != NULL; told = 1)
        PQfreemem(n);
    if (!ok || w->s.ended || PQstatus(w->s.pg) != CONNECTION_OK)
        return watch_failed(w, &w->s, "LISTEN");
    if (told && !w->armed && arm(w) != 0)
        return watch_failed(w, &w->d, "leader lock");
    return 0;
}

void dlock_pg_watch_close(dlock_watch *watch)
{
    struct pg_watch *w = (struct pg_watch *)watch;
    if (!w)
        return;
    if (w->ep >= 0)
        close(w->ep);
    dlock_pg_session_close(&w->s);
    dlock_pg_session_close(&w->d);
    dlock_sql_session_fini(&w->s.base);
    dlock_sql_session_fini(&w->d.base);
    free(w);
}
