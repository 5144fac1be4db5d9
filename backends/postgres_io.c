/*
 * PostgreSQL's statement layer: libpq's non-blocking connect and
 * statements, each awaited in the core's one cancellable wait until a
 * CLOCK_MONOTONIC deadline (libpq has no statement timeout of its own), the
 * mapping of libpq's errors onto dlock's, and the cancel thread
 * (PQcancel() blocks, so it runs on a thread of its own). It knows no
 * lock: the recipe (postgres.c) builds the statements and calls down here.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/postgres_int.h"

/* libpq puts no password in its messages; they may span lines, and dlock's
 * detail is one line. */
static int pg_error(struct pg_conn *pc, int code, const char *what, const char *msg)
{
    char flat[DLOCK_ERRMSG_MAX];
    size_t o = 0;
    for (const char *p = msg; *p && o + 1 < sizeof flat; p++) {
        char ch = (*p == '\n' || *p == '\t') ? ' ' : *p;
        if (ch == ' ' && (o == 0 || flat[o - 1] == ' '))
            continue;
        flat[o++] = ch;
    }
    while (o && flat[o - 1] == ' ')
        o--;
    flat[o] = '\0';
    return dlock_seterr(cl(pc), code, "postgresql: %s: %s", what, flat);
}

static int conn_error(struct pg_conn *pc, PGconn *pg, const char *what)
{
    const char *msg = PQerrorMessage(pg);
    int code = DLOCK_ECONNECT;
    if (strstr(msg, "password authentication failed") || strstr(msg, "no password supplied") ||
        strstr(msg, "authentication failed") || PQconnectionNeedsPassword(pg))
        code = DLOCK_EAUTH;
    else if (strstr(msg, "does not exist")) /* database or role; sslrootcert's file */
        code = DLOCK_EAUTH;
    /* TLS: the server's certificate refused (chain, host name, CRL) or ours
     * unusable (sslcert, sslkey) as on every store; a server without TLS
     * under sslmode=require ("does not support SSL") stays DLOCK_ECONNECT. */
    else if (strstr(msg, "certificate") || strstr(msg, "private key"))
        code = DLOCK_EAUTH;
    return pg_error(pc, code, what, msg);
}

/* Maps a failed result by SQLSTATE; a dead session is a connection error. */
static int result_error(struct pg_conn *pc, PGconn *pg, PGresult *r, const char *what)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = r ? PQresultErrorMessage(r) : PQerrorMessage(pg);
    int code = DLOCK_ESTORE;
    if (PQstatus(pg) != CONNECTION_OK)
        code = DLOCK_ECONNECT;
    else if (state && strcmp(state, "55P03") == 0)
        code = DLOCK_ETIMEDOUT;
    else if (state && strcmp(state, "40P01") == 0)
        code = DLOCK_EDEADLK;
    else if (state && strncmp(state, "28", 2) == 0)
        code = DLOCK_EAUTH;
    return pg_error(pc, code, what, msg && *msg ? msg : "no result");
}

/* Notices are not shown (e.g. "you don't own a lock": reported by the
 * result). An error the server sends outside a statement comes here too:
 * FATAL is its last word before it closes the session (terminated, shutting
 * down, idle_session_timeout). */
static void session_notice(void *arg, const PGresult *r)
{
    struct pg_session *s = arg;
    const char *sev = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    if (sev && (strcmp(sev, "FATAL") == 0 || strcmp(sev, "PANIC") == 0))
        s->ended = 1;
}

/* wait_socket()'s answer when the cancel fd fired: outside poll's bits. */
#define WAIT_CANCELLED 0x10000

/* Waits for events on pg's socket until until_ns (0: no limit), and for
 * cancel_fd (-1: none) to turn readable, in the core's cancellable wait.
 * Returns the events seen (the socket's first: a reply that came with the
 * cancel is read), WAIT_CANCELLED, 0 when until_ns passed first, -1 on a
 * poll error. Signals do not end the wait: libpq's own blocking calls
 * retried too. */
static int wait_socket(PGconn *pg, short events, uint64_t until_ns, int cancel_fd)
{
    struct pollfd pfd = {.fd = PQsocket(pg), .events = events};
    if (pfd.fd < 0)
        return -1;
    if (until_ns && dlock_monotonic_ns() >= until_ns)
        return 0;
    int n = dlock_poll_until(&pfd, 1, cancel_fd, until_ns ? until_ns : DLOCK_POLL_FOREVER, 0);
    if (n < 0)
        return -1;
    if (n & DLOCK_POLL_READY)
        return pfd.revents;
    return n & DLOCK_POLL_CANCEL ? WAIT_CANCELLED : 0;
}

/* No reply in time: the session is unusable (a statement is still
 * outstanding), so it is closed, which ends whatever it held or waited for
 * on the server once the server notices (at the latest when its
 * idle_session_timeout runs out). The struct stays: its locks report the
 * loss. */
static int timed_out(struct pg_conn *pc, struct pg_session *s, const char *what, uint64_t start)
{
    uint64_t ms = (dlock_monotonic_ns() - start + MS / 2) / MS;
    PQfinish(s->pg);
    s->pg = NULL;
    s->base.silent_ms = ms ? ms : 1;
    return dlock_seterr(cl(pc), DLOCK_ECONNECT,
                        "postgresql: %s: no reply from the server within %" PRIu64
                        " ms; the session was closed", what, s->base.silent_ms);
}

/* libpq's non-blocking connect to host i alone, driven until until_ns. */
static int connect_host(struct pg_conn *pc, size_t i, uint64_t until_ns, PGconn **out)
{
    const char *values[16];
    memcpy(values, pc->values, sizeof values);
    values[0] = pc->hostv[i];
    values[1] = pc->portv[i];
    uint64_t start = dlock_monotonic_ns();
    PGconn *pg = PQconnectStartParams(pc->keys, values, 0);
    if (!pg)
        return dlock_seterr(cl(pc), DLOCK_ENOMEM, "out of memory");
    PostgresPollingStatusType st =
        PQstatus(pg) == CONNECTION_BAD ? PGRES_POLLING_FAILED : PGRES_POLLING_WRITING;
    while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
        int ev = wait_socket(pg, st == PGRES_POLLING_READING ? POLLIN : POLLOUT, until_ns, -1);
        if (ev == 0) {
            PQfinish(pg);
            return dlock_seterr(cl(pc), DLOCK_ECONNECT,
                                "postgresql: cannot connect to %s port %s:"
                                " no answer within %" PRIu64 " ms",
                                pc->hostv[i], pc->portv[i],
                                (uint64_t)((dlock_monotonic_ns() - start + MS / 2) / MS));
        }
        if (ev < 0)
            break;
        st = PQconnectPoll(pg);
    }
    if (st != PGRES_POLLING_OK) {
        int err = conn_error(pc, pg, "cannot connect");
        PQfinish(pg);
        return err;
    }
    *out = pg;
    return 0;
}

/* A new session on s, on the first host that accepts a read-write session,
 * starting with the pinned one; each host gets connect_timeout, all of them
 * together until until_ns (0: no limit). Landing on another host than the
 * pinned one moves the pin, and closes idle sessions left on other hosts. */
int dlock_pg_session_open(struct pg_conn *pc, struct pg_session *s, uint64_t until_ns)
{
    int err = DLOCK_ECONNECT;
    s->pg = NULL;
    for (size_t k = 0; k < pc->nhosts; k++) {
        size_t i = (pc->pinned + k) % pc->nhosts;
        uint64_t now = dlock_monotonic_ns(), end = now + pc->connect_ms * MS;
        if (k > 0 && until_ns && now >= until_ns)
            break;
        if (until_ns && until_ns < end)
            end = until_ns;
        if (k > 0)
            dlock_clearerr(cl(pc)); /* report the last host's failure */
        if ((err = connect_host(pc, i, end, &s->pg)) == 0) {
            s->host = i;
            break;
        }
        if (err == DLOCK_ENOMEM)
            return err;
    }
    if (err)
        return err;
    if (s->host != pc->pinned) {
        pc->pinned = s->host;
        for (size_t j = 0; j < pc->pool.n; j++) {
            struct pg_session *o = (struct pg_session *)pc->pool.v[j];
            if (o != s && dlock_sql_free(&o->base) && o->pg && o->host != s->host)
                dlock_pg_session_close(o);
        }
    }
    s->ended = 0;
    pc->server_version = PQserverVersion(s->pg);
    PQsetNoticeReceiver(s->pg, session_notice, s);
    /* Statements are sent without blocking and waited for (wait_socket()),
     * so every wait has a client-side bound. */
    if (PQsetnonblocking(s->pg, 1) != 0) {
        int e = conn_error(pc, s->pg, "cannot make the connection non-blocking");
        PQfinish(s->pg);
        s->pg = NULL;
        return e;
    }
    s->base.lease = 0;
    s->base.silent_ms = 0;
    s->sqlstate[0] = '\0';
    return 0;
}

void dlock_pg_session_close(struct pg_session *s)
{
    if (s->pg)
        PQfinish(s->pg);
    s->pg = NULL;
}

/* Cancel requests left running (on servers that accept and never close)
 * at most, process-wide; past that a cancel closes the session at once. */
#define CANCEL_THREADS_MAX 16
static int cancel_threads; /* atomic */

/* One PQcancel() on a thread of its own, shared with the waiter that
 * started it until one of them lets go (the last one frees it). */
struct cancel_req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    PGcancel *pcl;
    int done, sent, abandoned;
};

static void cancel_req_free(struct cancel_req *c)
{
    PQfreeCancel(c->pcl);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void *cancel_main(void *p)
{
    struct cancel_req *c = p;
    char why[256];
    int sent = PQcancel(c->pcl, why, (int)sizeof why);
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    c->sent = sent;
    int abandoned = c->abandoned;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (abandoned)
        cancel_req_free(c);
    __atomic_sub_fetch(&cancel_threads, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/*
 * The application cancelled a lock wait (cancel_fd fired): asks the server
 * to cancel the statement, as lock_timeout would have ended it, so that
 * the session stays usable and leaves the lock's queue at once. libpq 15
 * has only the blocking PQcancel(): a connect to the session's server, one
 * packet, then a read until the server closes that connection, which a
 * server that accepts and never answers would hold indefinitely. So it
 * runs on a thread of its own, and is waited for until until_ns: 0 when
 * sent in time (the statement's reply, an error unless the grant won the
 * race, follows on the session); else the session is closed, the only
 * other way to end the wait (a server the close reaches drops the waiter
 * within a second, client_connection_check_interval; else when its
 * keepalives give up or the lock reaches the waiter), and the
 * thread is left to end by itself, holding nothing but its own connection:
 * when that server closes it or a dead peer fails its keepalives; a peer
 * that accepts and never closes (a hung proxy) keeps it, so at most
 * CANCEL_THREADS_MAX are left running at once.
 */
static int cancel_statement(struct pg_session *s, uint64_t until_ns)
{
    struct cancel_req *c = NULL;
    int sent = 0;
    if (__atomic_add_fetch(&cancel_threads, 1, __ATOMIC_SEQ_CST) <= CANCEL_THREADS_MAX)
        c = calloc(1, sizeof *c);
    if (c && (c->pcl = PQgetCancel(s->pg)) != NULL) {
        pthread_mutex_init(&c->mu, NULL);
        dlock_cond_init_mono(&c->cv);
        if (dlock_thread_start(NULL, 1, cancel_main, c) != 0) {
            cancel_req_free(c);
            c = NULL;
            __atomic_sub_fetch(&cancel_threads, 1, __ATOMIC_SEQ_CST);
        }
    } else {
        __atomic_sub_fetch(&cancel_threads, 1, __ATOMIC_SEQ_CST);
        free(c);
        c = NULL;
    }
    if (c) {
        struct timespec ts;
        dlock_ns_to_timespec(until_ns, &ts);
        pthread_mutex_lock(&c->mu);
        while (!c->done && pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT) {
        }
        int done = c->done;
        sent = done && c->sent;
        c->abandoned = !done;
        pthread_mutex_unlock(&c->mu);
        if (done)
            cancel_req_free(c);
    }
    if (sent)
        return 0;
    PQfinish(s->pg);
    s->pg = NULL;
    return -1;
}

/* See postgres_int.h. */
int dlock_pg_run(struct pg_conn *pc, struct pg_session *s, const char *sql, int want,
                 PGresult **out, const char *what, uint64_t until_ns)
{
    return dlock_pg_run_cancellable(pc, s, sql, want, out, what, until_ns, -1, NULL);
}

/* See postgres_int.h. The cancel gets CANCEL_MS, then the statement's
 * end CANCEL_MS more: past either, the session is closed. */
int dlock_pg_run_cancellable(struct pg_conn *pc, struct pg_session *s, const char *sql, int want,
                             PGresult **out, const char *what, uint64_t until_ns, int cancel_fd,
                             int *cancelled)
{
    PGresult *r, *keep = NULL, *bad = NULL;
    uint64_t start = dlock_monotonic_ns();
    int i = 0, err = 0, f, ev;
    if (!s->pg)
        return dlock_seterr(cl(pc), DLOCK_ECONNECT, "postgresql: %s: the session was closed", what);
    s->sqlstate[0] = '\0';
    /* Notifications (a semaphore's waiter listens) that came before this
     * statement are stale: its reply is what counts now. */
    for (PGnotify *n; (n = PQnotifies(s->pg)) != NULL;)
        PQfreemem(n);
    if (!PQsendQuery(s->pg, sql))
        return result_error(pc, s->pg, NULL, what);
    while ((f = PQflush(s->pg)) == 1) {
        if ((ev = wait_socket(s->pg, POLLIN | POLLOUT, until_ns, -1)) == 0)
            return timed_out(pc, s, what, start);
        if (ev < 0 || ((ev & POLLIN) && !PQconsumeInput(s->pg)))
            break;
    }
    if (f != 0 && PQstatus(s->pg) == CONNECTION_OK) {
        err = pg_error(pc, DLOCK_ECONNECT, what, PQerrorMessage(s->pg));
        PQfinish(s->pg); /* part of a statement sent: unusable */
        s->pg = NULL;
        return err;
    }
    for (;;) {
        /* A broken connection makes PQgetResult() return at once. */
        while (PQisBusy(s->pg) && PQstatus(s->pg) == CONNECTION_OK) {
            if ((ev = wait_socket(s->pg, POLLIN, until_ns, cancel_fd)) == 0) {
                PQclear(keep);
                PQclear(bad);
                return timed_out(pc, s, what, start);
            }
            if (ev == WAIT_CANCELLED) {
                /* The cancel gets CANCEL_MS, then the statement's end
                 * CANCEL_MS more: past either, the session is closed. */
                *cancelled = 1;
                cancel_fd = -1;
                if (cancel_statement(s, dlock_monotonic_ns() + CANCEL_MS * MS) != 0) {
                    PQclear(keep);
                    PQclear(bad);
                    return dlock_cancelled(cl(pc));
                }
                start = dlock_monotonic_ns();
                until_ns = start + CANCEL_MS * MS;
                continue;
            }
            if (ev < 0 || !PQconsumeInput(s->pg))
                break;
        }
        if (PQisBusy(s->pg) && PQstatus(s->pg) == CONNECTION_OK) {
            PQclear(keep);
            PQclear(bad);
            PQfinish(s->pg);
            s->pg = NULL;
            return dlock_seterr(cl(pc), DLOCK_ECONNECT, "postgresql: %s: cannot read the reply",
                                what);
        }
        if ((r = PQgetResult(s->pg)) == NULL)
            break;
        ExecStatusType st = PQresultStatus(r);
        if ((st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR) && !bad) {
            bad = r;
            continue;
        }
        if (i++ == want && !keep)
            keep = r;
        else
            PQclear(r);
    }
    if (bad) {
        const char *state = PQresultErrorField(bad, PG_DIAG_SQLSTATE);
        snprintf(s->sqlstate, sizeof s->sqlstate, "%s", state ? state : "");
        err = result_error(pc, s->pg, bad, what);
        PQclear(bad);
        PQclear(keep);
        return err;
    }
    if (!keep)
        return result_error(pc, s->pg, NULL, what);
    *out = keep;
    return 0;
}


/* A raise transaction's settings, as the acquire's: every lock wait, and
 * the whole statement, end after ms on the server. */
void dlock_pg_tx_settings(char *buf, size_t len, uint64_t ms)
{
    snprintf(buf, len,
             "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = on; "
             "SET LOCAL lock_timeout = %" PRIu64 "; SET LOCAL statement_timeout = %" PRIu64 "; ",
             ms, ms);
}

/* One transaction of its own (sql: dlock_pg_tx_settings() then statements) on an
 * idle pooled session, as ping: a pooled session that died while idle is
 * replaced once. Holds no lock, so a failure on a live session leaves
 * nothing behind. Bounded by `timeout` on the server and a little longer on
 * the client. The result of statement `want` in *out. */
int dlock_pg_run_pooled(struct pg_conn *pc, const char *sql, int want, PGresult **out,
                        const char *what, char state[6], uint64_t bound_ms)
{
    struct pg_session *s = NULL;
    int err, opened = 0;
    state[0] = '\0';
    for (;;) {
        struct dlock_sql_session *b = NULL;
        uint64_t until = 0;
        if ((err = dlock_sql_take(&pc->pool, &until, &b, &opened)) != 0)
            return err;
        s = (struct pg_session *)b;
        if ((err = dlock_pg_run(pc, s, sql, want, out, what,
                                dlock_monotonic_ns() + bound_ms * MS)) == 0)
            return 0;
        memcpy(state, s->sqlstate, 6);
        if (s->pg && PQstatus(s->pg) == CONNECTION_OK)
            return err;
        /* Died while pooled: the next one, then a new one. */
        int stop = opened || s->base.silent_ms;
        dlock_pg_session_close(s);
        if (stop)
            return err;
        dlock_clearerr(cl(pc));
    }
}

int dlock_pg_run_idle(struct pg_conn *pc, const char *sql, int want, PGresult **out,
                      const char *what, char state[6])
{
    uint64_t margin = pc->timeout_ms < DEADLINE_MARGIN_MS ? pc->timeout_ms : DEADLINE_MARGIN_MS;
    return dlock_pg_run_pooled(pc, sql, want, out, what, state, pc->timeout_ms + margin);
}

/* A failed store-wide statement: one that ran out of `timeout` on the
 * server (lock_timeout, statement_timeout) says what it waited for. */
int dlock_pg_store_failed(struct pg_conn *pc, int err, const char *state, const char *what)
{
    char why[DLOCK_ERRMSG_MAX];
    if (strcmp(state, "55P03") != 0 && strcmp(state, "57014") != 0)
        return err;
    snprintf(why, sizeof why, "%s", cl(pc)->errmsg);
    return dlock_seterr(cl(pc), DLOCK_ETIMEDOUT,
                        "postgresql: %s: the fencing %s %s%s stayed locked by another"
                        " transaction, or the statement ran, for the timeout (%" PRIu64
                        " ms); nothing was changed: %s",
                        what, pc->use_sequence ? "sequence" : "table", pc->table,
                        pc->use_sequence ? "_seq" : "", pc->timeout_ms, why);
}

