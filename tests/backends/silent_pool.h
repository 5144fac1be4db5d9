/*
 * The silent-network case shared by the backends that keep a pool of SQL
 * sessions (PostgreSQL, MySQL): through a proxy that goes silent (keeps the
 * connections open and forwards nothing), every call returns within its
 * bound. A try waits one `timeout` and is not retried on another session;
 * renew and release of held locks fail within the timeout; a ping on the
 * silent pooled session, then on a new one, and an open fail within their
 * bounds; close returns at once. Each role's locks have a TTL of their own,
 * so that a backend that shares sessions between locks of one lease
 * (PostgreSQL) still gives each role a session; with a2, a lock on A's
 * session, which A's renew closes: A2 is lost with it. Include after
 * tests/proxy.h, tests/tap.h and tests/util.h.
 */
#ifndef DLOCK_TESTS_SILENT_POOL_H
#define DLOCK_TESTS_SILENT_POOL_H

static inline double ms_since(uint64_t t0)
{
    return (double)(dlock_monotonic_ns() - t0) / 1e6;
}

/* Runs the case on uri (timeout 1000 ms, connect_timeout connect_ms) with
 * lock names under prefix; afterwards a and b (and a2 unless NULL; room for
 * 128 bytes each) hold the names of the locks left to the server, for the
 * caller to check that the server freed them once the proxy closed the
 * sessions. a2: the backend shares a session between locks of one TTL. */
static inline void silent_pool_case(const char *uri, const char *prefix, uint64_t connect_ms,
                                    char *a, char *b, char *a2)
{
    struct proxy p;
    char pu[1024], params[96], y1[128], y2[128], z[128];
    dlock_lock *la = NULL, *la2 = NULL, *lb = NULL, *l1 = NULL, *l2 = NULL, *lz = NULL;
    const uint64_t timeout = 1000, slack = 3000;
    snprintf(params, sizeof params, "timeout=%llu&connect_timeout=%llu",
             (unsigned long long)timeout, (unsigned long long)connect_ms);
    proxy_for_uri(&p, uri);
    proxy_uri(&p, uri, params, pu, sizeof pu);
    snprintf(a, 128, "%ssilent-a", prefix);
    snprintf(b, 128, "%ssilent-b", prefix);
    if (a2)
        snprintf(a2, 128, "%ssilent-a2", prefix);
    snprintf(y1, sizeof y1, "%ssilent-y1", prefix);
    snprintf(y2, sizeof y2, "%ssilent-y2", prefix);
    snprintf(z, sizeof z, "%ssilent-z", prefix);
    dlock_client *c = open_ok(pu);
    dlock_acquire_opts o = wait_opts(DLOCK_WAIT_TRY, 0, 3000);
    is_int(dlock_acquire(c, a, &o, &la), 0, "through the proxy: acquire A (TTL 3 s)");
    if (a2)
        is_int(dlock_acquire(c, a2, &o, &la2), 0, "and A2, on A's session");
    o.ttl_ms = 3100;
    is_int(dlock_acquire(c, b, &o, &lb), 0, "and B (another TTL: another session)");
    /* Two idle sessions in the pool, for the try and the ping below. */
    o.ttl_ms = 3200;
    is_int(dlock_acquire(c, y1, &o, &l1), 0, "and two more, released: two pooled sessions");
    o.ttl_ms = 3300;
    is_int(dlock_acquire(c, y2, &o, &l2), 0, "(the second)");
    dlock_release(l1);
    dlock_release(l2);

    proxy_set(&p, PROXY_BLACKHOLE);
    uint64_t t0 = dlock_monotonic_ns();
    o.ttl_ms = 3400;
    is_int(dlock_acquire(c, z, &o, &lz), DLOCK_ECONNECT, "silent network: a try → ECONNECT");
    double el = ms_since(t0);
    /* Neither retried on a new session nor followed by anything else that
     * waits on the silent network (MySQL: no KILL QUERY for a try). */
    ok(el >= timeout - 50 && el < 2 * timeout - 100,
       "after the timeout, not retried (%.0f ms; timeout %llu ms): %s", el,
       (unsigned long long)timeout, dlock_errmsg(c));
    ok(strstr(dlock_errmsg(c), "no reply") != NULL, "the message says the server did not answer");
    t0 = dlock_monotonic_ns();
    is_int(dlock_renew(la, 3000), DLOCK_ECONNECT, "renew → ECONNECT");
    el = ms_since(t0);
    ok(el < timeout + slack, "within the timeout (%.0f ms): %s", el, dlock_errmsg(c));
    ok(strstr(dlock_errmsg(c), "lost") != NULL, "saying the lock is lost with its session");
    if (a2) {
        t0 = dlock_monotonic_ns();
        is_int(dlock_renew(la2, 3000), DLOCK_ELOST, "A2, on the session A's renew closed: ELOST");
        ok(ms_since(t0) < 100, "at once (%.0f ms): %s", ms_since(t0), dlock_errmsg(c));
    }
    t0 = dlock_monotonic_ns();
    int rc = dlock_release(lb);
    el = ms_since(t0);
    ok(rc == DLOCK_ECONNECT, "release → ECONNECT (%s)", dlock_err_name(rc));
    ok(el < timeout + slack, "within the timeout (%.0f ms): %s", el, dlock_errmsg(c));
    t0 = dlock_monotonic_ns();
    is_int(dlock_client_ping(c), DLOCK_ECONNECT, "ping → ECONNECT");
    el = ms_since(t0);
    ok(el < 2 * timeout - 100, "within the timeout, not retried (%.0f ms): %s", el,
       dlock_errmsg(c));
    t0 = dlock_monotonic_ns();
    is_int(dlock_client_ping(c), DLOCK_ECONNECT, "ping on a new session → ECONNECT");
    el = ms_since(t0);
    ok(el < connect_ms + slack, "within connect_timeout (%.0f ms): %s", el, dlock_errmsg(c));
    t0 = dlock_monotonic_ns();
    dlock_client *d = NULL;
    is_int(dlock_client_open(pu, &d), DLOCK_ECONNECT, "open through the silent network → ECONNECT");
    el = ms_since(t0);
    ok(el < connect_ms + slack, "within connect_timeout (%.0f ms): %s", el, dlock_errmsg(d));
    dlock_client_close(d);
    is_int(dlock_release(la), DLOCK_ELOST, "A, whose renew closed its session: release → ELOST");
    if (a2)
        is_int(dlock_release(la2), DLOCK_ELOST, "A2 too");
    t0 = dlock_monotonic_ns();
    dlock_client_close(c);
    ok(ms_since(t0) < 1000, "close returns at once (%.0f ms)", ms_since(t0));
    proxy_stop(&p);
}

#endif
