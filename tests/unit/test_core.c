/*
 * The core against a fake backend that counts calls, records what it was
 * asked, and fails on demand: registration, strict options, name and option
 * checks, stacking, deadlines, error detail and redaction, close.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock_backend.h"
#include "tests/tap.h"

static struct {
    int open, opened, close, acquire, release, renew, ping;
    int fail_open, fail_acquire, fail_release, silent_fail;
    int raise, fail_raise, fail_acquire_at; /* fail_acquire_at: the Nth acquire fails */
    uint64_t raised_to;
    int top, floor, fail_floor;
    uint64_t floor_to;
    dlock_request last;
    char last_name[DLOCK_NAME_MAX + 1];
    uint64_t next_token;
    const char *echo_in_error; /* put this text into the next error */
    dlock_cancel *fire_in_acquire; /* raised inside acquire, as a signal handler would */
} fake;

struct fake_conn {
    dlock_conn base;
    int held;
};

static int fake_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    struct fake_conn *fc;
    fake.open++;
    if (fake.fail_open)
        return dlock_seterr(c, fake.fail_open, "fake open failed for %s (password %s)",
                            dlock_uri_redacted(uri),
                            dlock_uri_password(uri) ? dlock_uri_password(uri) : "-");
    fc = calloc(1, sizeof *fc);
    if (dlock_uri_param(uri, "caps"))
        fc->base.caps = (unsigned)strtoul(dlock_uri_param(uri, "caps"), NULL, 10);
    fake.opened++;
    *connp = &fc->base;
    return 0;
}

static void fake_close(dlock_conn *conn)
{
    fake.close++;
    free(conn);
}

static int fake_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    dlock_held *h;
    fake.acquire++;
    fake.last = *req;
    memcpy(fake.last_name, req->name, req->name_len + 1);
    dlock_cancel_fire(fake.fire_in_acquire);
    if (fake.fail_acquire_at && fake.acquire == fake.fail_acquire_at)
        return dlock_seterr(conn->client, DLOCK_EBUSY, "fake acquire number %d refused",
                            fake.acquire);
    if (fake.fail_acquire) {
        if (fake.silent_fail)
            return fake.fail_acquire;
        return dlock_seterr(conn->client, fake.fail_acquire, "fake acquire failed: %s",
                            fake.echo_in_error ? fake.echo_in_error : "");
    }
    h = calloc(1, sizeof *h);
    h->token = ++fake.next_token;
    ((struct fake_conn *)conn)->held++;
    *heldp = h;
    return 0;
}

static int fake_release(dlock_conn *conn, dlock_held *held)
{
    fake.release++;
    ((struct fake_conn *)conn)->held--;
    free(held);
    return fake.fail_release;
}

static int fake_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    (void)conn, (void)held, (void)ttl_ms;
    fake.renew++;
    return 0;
}

static int fake_raise(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    (void)held;
    fake.raise++;
    if (fake.fail_raise)
        return dlock_seterr(conn->client, fake.fail_raise, "fake raise refused");
    fake.raised_to = floor;
    return 0;
}

static int fake_top(dlock_conn *conn, uint64_t *top)
{
    (void)conn;
    fake.top++;
    *top = fake.next_token;
    return 0;
}

static int fake_floor(dlock_conn *conn, uint64_t floor)
{
    fake.floor++;
    if (fake.fail_floor)
        return dlock_seterr(conn->client, fake.fail_floor, "fake floor refused");
    fake.floor_to = floor;
    return 0;
}

static int fake_ping(dlock_conn *conn)
{
    (void)conn;
    fake.ping++;
    return 0;
}

static const char *const fake_schemes[] = {"fake", "fake2", NULL};
/* caps=N: the connection's capabilities (a list's parts of different kinds). */
static const char *const fake_options[] = {"alpha", "beta", "caps", NULL};

static dlock_backend fake_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .name = "fake",
    .schemes = fake_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW,
    .options = fake_options,
    .open = fake_open,
    .close = fake_close,
    .acquire = fake_acquire,
    .release = fake_release,
    .renew = fake_renew,
    .ping = fake_ping,
    .raise_token = fake_raise,
    .token_top = fake_top,
    .raise_floor = fake_floor,
};

static void test_registry(void)
{
    dlock_backend b = fake_backend;
    is_int(dlock_backend_register(NULL), DLOCK_EINVAL, "register(NULL)");
    b.version = 0;
    is_int(dlock_backend_register(&b), DLOCK_EVERSION, "version 0 refused");
    b.version = DLOCK_BACKEND_VERSION + 1;
    is_int(dlock_backend_register(&b), DLOCK_EVERSION, "newer version refused");
    b = fake_backend;
    b.acquire = NULL;
    is_int(dlock_backend_register(&b), DLOCK_EINVAL, "missing required method refused");
    b = fake_backend;
    b.options = NULL;
    is_int(dlock_backend_register(&b), DLOCK_EINVAL, "missing option list refused");
    is_int(dlock_backend_register(&fake_backend), 0, "fake backend registers");
    is_int(dlock_backend_register(&fake_backend), DLOCK_EEXIST, "second registration refused");
    static const char *const file_again[] = {"FILE", NULL};
    b = fake_backend;
    b.schemes = file_again;
    is_int(dlock_backend_register(&b), DLOCK_EEXIST, "a built-in scheme cannot be taken over");
    ok(dlock_backend_find("FAKE2") == &fake_backend, "lookup is case-insensitive");
    ok(dlock_backend_find("file") != NULL, "the file backend is built in");
    ok(dlock_backend_find("nosuch") == NULL, "unknown scheme not found");
}

static void test_open_errors(void)
{
    dlock_client *c = NULL;
    int opens = fake.open;

    is_int(dlock_client_open("fake://h/?alpha=1&gamma=2", &c), DLOCK_EBADURI, "unknown option");
    ok(strstr(dlock_errmsg(c), "'gamma'") != NULL, "message names the option: %s", dlock_errmsg(c));
    is_int(fake.open, opens, "backend not called for a bad option");
    dlock_client_close(c);

    is_int(dlock_client_open("nosuch://h/", &c), DLOCK_ESCHEME, "unknown scheme");
    ok(strstr(dlock_errmsg(c), "nosuch") != NULL, "message names the scheme");
    dlock_client_close(c);

    /* A scheme dlock knows whose backend this build left out, if any. */
    static const char *const known[] = {"zookeeper", "mysql", "postgresql", "redis"};
    const char *missing = NULL;
    for (size_t i = 0; i < 4 && !missing; i++)
        if (!dlock_backend_find(known[i]))
            missing = known[i];
    if (missing) {
        char u[64];
        snprintf(u, sizeof u, "%s://h/", missing);
        c = NULL;
        is_int(dlock_client_open(u, &c), DLOCK_ENOBACKEND, "known scheme not built (%s)", missing);
        ok(strstr(dlock_errmsg(c), "not built") != NULL, "message says so: %s", dlock_errmsg(c));
        dlock_client_close(c);
    } else {
        skip("every backend dlock knows is built in", "known scheme not built → ENOBACKEND");
        skip("every backend dlock knows is built in", "message says so");
    }
    c = NULL;

    is_int(dlock_client_open("fake:/x", &c), DLOCK_EBADURI, "malformed URI");
    ok(dlock_errmsg(c)[0] != '\0', "malformed URI has a message");
    dlock_client_close(c);

    is_int(dlock_client_open(NULL, &c), DLOCK_EBADURI, "NULL URI");
    dlock_client_close(c);
    is_int(dlock_client_open("fake://h/", NULL), DLOCK_EINVAL, "NULL out pointer");

    fake.fail_open = DLOCK_EAUTH;
    is_int(dlock_client_open("fake://bob:sekrit-pass@h/", &c), DLOCK_EAUTH,
           "backend open error is passed through");
    ok(strstr(dlock_errmsg(c), "fake open failed") != NULL, "backend detail kept");
    ok(strstr(dlock_errmsg(c), "sekrit-pass") == NULL, "password masked in backend detail: %s",
       dlock_errmsg(c));
    is_int(dlock_acquire(c, "x", NULL, &(dlock_lock *){0}), DLOCK_EINVAL,
           "a failed client refuses acquire");
    dlock_client_close(c);
    fake.fail_open = 0;

    is_str(dlock_errmsg(NULL), "out of memory", "errmsg(NULL)");
    dlock_client_close(NULL);
    ok(1, "close(NULL) is harmless");
}

static void test_acquire_checks(dlock_client *c)
{
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    dlock_lock *l = (dlock_lock *)1;
    char big[DLOCK_NAME_MAX + 2];
    int calls = fake.acquire;

    is_int(dlock_acquire(c, "", NULL, &l), DLOCK_EINVAL, "empty name");
    ok(l == NULL, "*lockp cleared on failure");
    is_int(dlock_acquire(c, NULL, NULL, &l), DLOCK_EINVAL, "NULL name");
    is_int(dlock_acquire_n(c, "a\0b", 3, NULL, &l), DLOCK_EINVAL, "embedded NUL");
    ok(strstr(dlock_errmsg(c), "NUL") != NULL, "message says NUL");
    memset(big, 'n', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    is_int(dlock_acquire(c, big, NULL, &l), DLOCK_EINVAL, "name over DLOCK_NAME_MAX");
    big[DLOCK_NAME_MAX] = '\0';
    is_int(dlock_acquire(c, big, NULL, &l), 0, "name of exactly DLOCK_NAME_MAX bytes");
    is_int(fake.last.name_len, DLOCK_NAME_MAX, "backend sees the full length");
    dlock_release(l);
    calls = fake.acquire;

    o.ttl_ms = 0;
    is_int(dlock_acquire(c, "a", &o, &l), DLOCK_EINVAL, "ttl 0");
    o = (dlock_acquire_opts)DLOCK_ACQUIRE_OPTS_INIT;
    o.version = 99;
    is_int(dlock_acquire(c, "a", &o, &l), DLOCK_EINVAL, "unknown options version");
    o = (dlock_acquire_opts)DLOCK_ACQUIRE_OPTS_INIT;
    o.wait = (dlock_wait)7;
    is_int(dlock_acquire(c, "a", &o, &l), DLOCK_EINVAL, "unknown wait mode");
    is_int(fake.acquire, calls, "no invalid request reached the backend");
    is_int(dlock_acquire(c, "a", NULL, NULL), DLOCK_EINVAL, "NULL lockp");
}

/* Cancel flags: the core's part (the backends' waits are conformance cases). */
static void test_cancel(dlock_client *c)
{
    dlock_cancel *k = NULL;
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    dlock_lock *l = NULL, *again = NULL;
    int calls = fake.acquire;

    is_int(dlock_cancel_new(NULL), DLOCK_EINVAL, "dlock_cancel_new(NULL)");
    dlock_cancel_fire(NULL);
    is_int(dlock_cancel_fired(NULL), 0, "a NULL flag is never raised");
    dlock_cancel_free(NULL);
    if (dlock_cancel_new(&k) != 0 || !k) {
        ok(0, "dlock_cancel_new");
        return;
    }
    o.cancel = k;
    is_int(dlock_acquire(c, "cancel", &o, &l), DLOCK_ENOTSUP,
           "a wait with a flag on a backend without DLOCK_CAP_CANCEL");
    ok(strstr(dlock_errmsg(c), "cannot cancel") != NULL, "says so: %s", dlock_errmsg(c));
    is_int(fake.acquire, calls, "the backend was not asked");
    o.wait = DLOCK_WAIT_TRY;
    is_int(dlock_acquire(c, "cancel", &o, &l), 0, "a try needs no cancel support");
    is_int(fake.last.cancel_fd, -1, "... and the backend gets no descriptor for it");
    dlock_release(l);

    unsigned int caps = fake_backend.caps;
    fake_backend.caps |= DLOCK_CAP_CANCEL;
    o.wait = DLOCK_WAIT_DEADLINE;
    o.deadline_ns = 1; /* long past: one attempt */
    is_int(dlock_acquire(c, "cancel", &o, &l), 0, "a deadline already past, with a flag");
    is_int(fake.last.cancel_fd, -1, "... is a try: the backend gets no descriptor");
    dlock_release(l);
    dlock_cancel *in = NULL;
    if (dlock_cancel_new(&in) == 0) {
        o.wait = DLOCK_WAIT_FOREVER;
        o.cancel = in;
        fake.fire_in_acquire = in;
        fake.fail_acquire = DLOCK_EINTR;
        is_int(dlock_acquire(c, "cancel", &o, &l), DLOCK_ECANCELED,
               "a wait a signal interrupted, whose handler raised the flag: DLOCK_ECANCELED");
        fake.fail_acquire = 0;
        fake.fire_in_acquire = NULL;
        o.cancel = k;
        dlock_cancel_free(in);
    }
    o.wait = DLOCK_WAIT_FOREVER;
    is_int(dlock_acquire(c, "cancel", &o, &l), 0, "a wait with a flag on a backend with the cap");
    ok(fake.last.cancel_fd >= 0, "the backend gets the flag's descriptor");
    is_int(dlock_request_cancelled(&fake.last), 0, "not cancelled yet");
    dlock_request none = fake.last;
    none.cancel_fd = -1;
    is_int(dlock_request_cancelled(&none), 0, "a request without a descriptor is never cancelled");
    is_int(dlock_request_cancelled(NULL), 0, "nor is NULL");
    dlock_cancel_fire(k);
    dlock_cancel_fire(k);
    is_int(dlock_cancel_fired(k), 1, "raised (twice is harmless)");
    is_int(dlock_request_cancelled(&fake.last), 1, "the descriptor is readable once raised");
    /* The backends' shared pause: ends at its instant, or at once on a flag. */
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_pause_until(t0 + 30 * 1000000ull, -1), 0, "a pause without a flag");
    ok(dlock_monotonic_ns() - t0 >= 30 * 1000000ull, "... lasts until its instant");
    t0 = dlock_monotonic_ns();
    is_int(dlock_pause_until(t0 + 5000 * 1000000ull, fake.last.cancel_fd), DLOCK_ECANCELED,
           "a pause with a raised flag: DLOCK_ECANCELED");
    ok(dlock_monotonic_ns() - t0 < 1000 * 1000000ull, "... at once, not after its 5 s");
    is_int(dlock_pause_until(0, -1), 0, "an instant already past: no pause");
    dlock_release(l);

    dlock_metrics before, after;
    dlock_client_metrics(c, &before);
    calls = fake.acquire;
    is_int(dlock_acquire(c, "cancel", &o, &l), DLOCK_ECANCELED, "a raised flag: DLOCK_ECANCELED");
    is_str(dlock_errmsg(c), "the wait was cancelled", "detail");
    ok(l == NULL, "no lock");
    o.wait = DLOCK_WAIT_TRY;
    is_int(dlock_acquire(c, "cancel", &o, &l), DLOCK_ECANCELED, "also for a try");
    is_int(fake.acquire, calls, "the store was not asked");
    dlock_client_metrics(c, &after);
    is_int((int)(after.failed - before.failed), 0, "a refusal before the store is not counted");

    dlock_acquire_opts r = DLOCK_ACQUIRE_OPTS_INIT;
    r.reentrant = 1;
    is_int(dlock_acquire(c, "cancel-r", &r, &l), 0, "a reentrant hold");
    r.cancel = k;
    is_int(dlock_acquire(c, "cancel-r", &r, &again), DLOCK_ECANCELED,
           "a raised flag refuses even a hold of a lock already held");
    is_int((int)dlock_lock_holds(l), 1, "the hold count is unchanged");
    dlock_release(l);
    is_int(dlock_cancelled(c), DLOCK_ECANCELED, "dlock_cancelled() returns DLOCK_ECANCELED");
    is_str(dlock_err_name(DLOCK_ECANCELED), "DLOCK_ECANCELED", "the error's name");
    fake_backend.caps = caps;
    dlock_cancel_free(k);
}

static void test_acquire_flow(dlock_client *c)
{
    dlock_acquire_opts o;
    dlock_lock *a = NULL, *b = NULL, *again = NULL;
    char owner1[33];

    dlock_acquire_opts_init(&o);
    is_int(o.version, 3, "opts_init sets the version it fills (3)");
    is_int(o.wait, DLOCK_WAIT_FOREVER, "default wait is forever");
    is_int(o.ttl_ms, DLOCK_TTL_DEFAULT_MS, "default TTL");
    o.ttl_ms = 1234;
    is_int(dlock_acquire(c, "job/a", &o, &a), 0, "acquire");
    is_int(fake.last.ttl_ms, 1234, "TTL passed down");
    is_int(fake.last.wait, DLOCK_WAIT_FOREVER, "wait passed down");
    is_int(strlen(fake.last.owner_hex), 32, "owner id is 32 hex digits");
    strcpy(owner1, fake.last.owner_hex);
    is_str(dlock_errmsg(c), "", "errmsg empty after success");
    ok(dlock_lock_token(a) > 0, "token from backend");
    size_t len = 0;
    is_str(dlock_lock_name(a, &len), "job/a", "lock name");
    is_int(len, 5, "lock name length");
    ok(dlock_lock_client(a) == c, "lock's client");

    int calls = fake.acquire;
    is_int(dlock_acquire(c, "job/a", NULL, &again), DLOCK_EALREADY, "no stacking on one client");
    is_int(fake.acquire, calls, "stacking refused before the backend");

    is_int(dlock_acquire(c, "job/b", NULL, &b), 0, "second name");
    ok(strcmp(owner1, fake.last.owner_hex) != 0, "every acquire gets a fresh owner id");
    ok(dlock_lock_token(b) > dlock_lock_token(a), "tokens increase");

    int renews = fake.renew;
    is_int(dlock_renew(a, 500), 0, "renew");
    is_int(fake.renew, renews + 1, "renew reached the backend");
    is_int(dlock_renew(a, 0), DLOCK_EINVAL, "renew with ttl 0");
    is_int(dlock_renew(NULL, 10), DLOCK_EINVAL, "renew(NULL)");

    int rel = fake.release;
    is_int(dlock_release(a), 0, "release");
    is_int(fake.release, rel + 1, "release reached the backend");
    is_int(dlock_acquire(c, "job/a", NULL, &a), 0, "released name can be taken again");

    fake.fail_release = DLOCK_ELOST;
    is_int(dlock_release(a), DLOCK_ELOST, "release reports a lost lock");
    ok(dlock_errmsg(c)[0] != '\0', "lost release has detail even if the backend gave none");
    fake.fail_release = 0;
    is_int(dlock_release(NULL), DLOCK_EINVAL, "release(NULL)");

    /* Deadline already past: one try, reported as a timeout. */
    o.wait = DLOCK_WAIT_DEADLINE;
    o.deadline_ns = dlock_monotonic_ns() - 1;
    fake.fail_acquire = DLOCK_EBUSY;
    is_int(dlock_acquire(c, "job/c", &o, &a), DLOCK_ETIMEDOUT, "past deadline → ETIMEDOUT");
    is_int(fake.last.wait, DLOCK_WAIT_TRY, "past deadline reaches the backend as a try");
    o.deadline_ns = dlock_monotonic_ns() + 1000000000ull;
    fake.fail_acquire = DLOCK_ETIMEDOUT;
    is_int(dlock_acquire(c, "job/c", &o, &a), DLOCK_ETIMEDOUT, "future deadline passed through");
    is_int(fake.last.wait, DLOCK_WAIT_DEADLINE, "future deadline stays a deadline");
    fake.silent_fail = 1;
    fake.fail_acquire = DLOCK_ECONNECT;
    is_int(dlock_acquire(c, "job/c", NULL, &a), DLOCK_ECONNECT, "silent backend error");
    is_str(dlock_errmsg(c), dlock_strerror(DLOCK_ECONNECT), "core fills in a message");
    fake.silent_fail = 0;
    fake.fail_acquire = 0;

    int pings = fake.ping;
    is_int(dlock_client_ping(c), 0, "ping");
    is_int(fake.ping, pings + 1, "ping reached the backend");
    is_str(dlock_client_backend(c), "fake", "backend name");
    is_int(dlock_client_caps(c), DLOCK_CAP_LEASE | DLOCK_CAP_RENEW, "caps");
    (void)b; /* b stays held: close must release it */
}

static void test_close_releases(void)
{
    dlock_client *c = NULL;
    dlock_lock *l1, *l2;
    is_int(dlock_client_open("fake://h/", &c), 0, "open");
    dlock_acquire(c, "x", NULL, &l1);
    dlock_acquire(c, "y", NULL, &l2);
    int rel = fake.release, closes = fake.close;
    dlock_client_close(c);
    is_int(fake.release - rel, 2, "close releases every held lock");
    is_int(fake.close - closes, 1, "close closes the connection");
}

static void test_optional_methods(void)
{
    static dlock_backend minimal;
    static const char *const schemes[] = {"minimal", NULL};
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    minimal = fake_backend;
    minimal.schemes = schemes;
    minimal.renew = NULL;
    minimal.ping = NULL;
    is_int(dlock_backend_register(&minimal), 0, "backend without optional methods");
    is_int(dlock_client_open("minimal://h/", &c), 0, "open minimal");
    is_int(dlock_acquire(c, "x", NULL, &l), 0, "acquire on minimal");
    is_int(dlock_renew(l, 100), DLOCK_ENOTSUP, "renew NULL → ENOTSUP");
    is_int(dlock_client_ping(c), DLOCK_ENOTSUP, "ping NULL → ENOTSUP");
    dlock_release(l);
    dlock_client_close(c);
}

/* Modes and limits: checked by the core before any backend call, refused
 * where the backend lacks the capability, passed to it in the request, kept
 * on the lock; a reentrant acquire in another mode is DLOCK_EMODE. */
static void test_modes(dlock_client *plain)
{
    static dlock_backend modal, old;
    static const char *const schemes[] = {"modal", NULL}, *const old_schemes[] = {"modal6", NULL};
    dlock_client *c = NULL, *o6 = NULL;
    dlock_lock *l = NULL, *l2 = NULL;
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    is_int((int)o.mode, DLOCK_MODE_EXCLUSIVE, "the default mode is exclusive");
    is_int((int)o.limit, 0, "and no limit");
    /* An older caller's struct ends before mode: the init functions write
     * nothing past the version they are asked for. */
    memset(&o, 0x5a, sizeof o);
    dlock_acquire_opts_init(&o);
    ok(o.version == 3 && o.ttl_ms == DLOCK_TTL_DEFAULT_MS && o.cancel == NULL &&
           (unsigned)o.mode == 0x5a5a5a5au && o.limit == 0x5a5a5a5au,
       "dlock_acquire_opts_init() fills version 3 and no further");
    memset(&o, 0x5a, sizeof o);
    is_int(dlock_acquire_opts_init_version(&o, 2), 0, "init of version 2");
    ok(o.version == 2 && o.reentrant == 0 && *(unsigned char *)&o.cancel == 0x5a,
       "fills version 2 and no further");
    is_int(dlock_acquire_opts_init_version(&o, DLOCK_ACQUIRE_OPTS_VERSION), 0, "init of the latest");
    ok(o.mode == DLOCK_MODE_EXCLUSIVE && o.limit == 0 && o.cancel == NULL, "every field");
    is_int(dlock_acquire_opts_init_version(&o, DLOCK_ACQUIRE_OPTS_VERSION + 1), DLOCK_EINVAL,
           "a version this library does not know");
    is_int(dlock_acquire_opts_init_version(NULL, 1), DLOCK_EINVAL, "NULL");
    o = (dlock_acquire_opts)DLOCK_ACQUIRE_OPTS_INIT;
    modal = fake_backend;
    modal.schemes = schemes;
    modal.caps |= DLOCK_CAP_SHARED | DLOCK_CAP_SEMAPHORE;
    is_int(dlock_backend_register(&modal), 0, "a backend with shared locks and semaphores");
    old = modal;
    old.schemes = old_schemes;
    old.version = 6; /* built before request.mode existed */
    is_int(dlock_backend_register(&old), 0, "the same, built for ABI 6");
    is_int(dlock_client_open("modal://h/", &c), 0, "open modal");
    is_int(dlock_client_open("modal6://h/", &o6), 0, "open modal6");
    int calls = fake.acquire;
    o.mode = (dlock_mode)7;
    is_int(dlock_acquire(c, "m", &o, &l), DLOCK_EINVAL, "an unknown mode: EINVAL");
    o = (dlock_acquire_opts)DLOCK_ACQUIRE_OPTS_INIT;
    o.limit = DLOCK_LIMIT_MAX + 1;
    is_int(dlock_acquire(c, "m", &o, &l), DLOCK_EINVAL, "a limit above DLOCK_LIMIT_MAX: EINVAL");
    o.limit = 3;
    o.mode = DLOCK_MODE_SHARED;
    is_int(dlock_acquire(c, "m", &o, &l), DLOCK_EINVAL, "shared with a limit: EINVAL");
    ok(strstr(dlock_errmsg(c), "no limit") != NULL, "says why: %s", dlock_errmsg(c));
    is_int(dlock_acquire(plain, "m", &o, &l), DLOCK_EINVAL, "also where modes are unsupported");
    o.limit = 0;
    is_int(dlock_acquire(plain, "m", &o, &l), DLOCK_ENOTSUP, "shared without DLOCK_CAP_SHARED");
    ok(strstr(dlock_errmsg(plain), "no shared locks") != NULL, "says so: %s", dlock_errmsg(plain));
    is_int(dlock_acquire(o6, "m", &o, &l), DLOCK_ENOTSUP,
           "shared on a backend built before modes, whatever its caps say");
    o.mode = DLOCK_MODE_EXCLUSIVE;
    o.limit = 2;
    is_int(dlock_acquire(plain, "m", &o, &l), DLOCK_ENOTSUP, "a limit without DLOCK_CAP_SEMAPHORE");
    is_int(fake.acquire, calls, "no refused request reached a backend");

    o.limit = 0;
    o.mode = DLOCK_MODE_SHARED;
    o.reentrant = 1;
    is_int(dlock_acquire(c, "m", &o, &l), 0, "a shared acquire");
    is_int((int)fake.last.mode, DLOCK_MODE_SHARED, "the backend saw the mode");
    is_int((int)dlock_lock_mode(l), DLOCK_MODE_SHARED, "dlock_lock_mode() says shared");
    is_int(dlock_acquire(c, "m", &o, &l2), 0, "reentrant, shared again");
    ok(l2 == l, "the same handle");
    o.mode = DLOCK_MODE_EXCLUSIVE;
    is_int(dlock_acquire(c, "m", &o, &l2), DLOCK_EMODE, "reentrant in another mode: DLOCK_EMODE");
    o.limit = 4;
    is_int(dlock_acquire(c, "m", &o, &l2), DLOCK_EMODE, "or as a semaphore: DLOCK_EMODE");
    ok(strstr(dlock_errmsg(c), "shared") != NULL, "names the mode held: %s", dlock_errmsg(c));
    dlock_release(l);
    dlock_release(l);
    o.reentrant = 0;
    is_int(dlock_acquire(c, "s", &o, &l), 0, "a semaphore's permit");
    is_int((int)fake.last.limit, 4, "the backend saw the limit");
    is_int((int)dlock_lock_limit(l), 4, "dlock_lock_limit() says 4");
    is_int((int)dlock_lock_mode(l), DLOCK_MODE_EXCLUSIVE, "in exclusive mode");
    dlock_release(l);
    dlock_acquire_opts v3 = DLOCK_ACQUIRE_OPTS_INIT;
    v3.version = 3;
    v3.mode = DLOCK_MODE_SHARED; /* not read: a version 3 caller has no such field */
    is_int(dlock_acquire(plain, "v3", &v3, &l), 0, "options of version 3: exclusive");
    is_int((int)fake.last.mode, DLOCK_MODE_EXCLUSIVE, "the backend saw exclusive");
    is_int((int)dlock_lock_mode(l), DLOCK_MODE_EXCLUSIVE, "and so does the lock");
    dlock_release(l);
    is_int((int)dlock_lock_mode(NULL), DLOCK_MODE_EXCLUSIVE, "dlock_lock_mode(NULL)");
    is_int((int)dlock_lock_limit(NULL), 0, "dlock_lock_limit(NULL)");
    is_str(dlock_err_name(DLOCK_EMODE), "DLOCK_EMODE", "the error table knows DLOCK_EMODE");
    dlock_client_close(o6);
    dlock_client_close(c);
}

static int fake_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    (void)conn;
    (void)len;
    if (strcmp(name, "held") != 0)
        return 0;
    info->known = DLOCK_KNOWS_HELD | DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER;
    info->held = 1;
    info->token = 7;
    snprintf(info->owner, sizeof info->owner, "the-owner");
    return 0;
}

/* Three shared holders of every name, tokens 10, 11, 12. */
static int fake_holders(dlock_conn *conn, const char *name, size_t len, dlock_holder *h,
                        size_t capacity, size_t *count)
{
    (void)conn;
    (void)name;
    (void)len;
    for (size_t i = 0; i < 3 && i < capacity; i++) {
        h[i].known = DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_MODE;
        h[i].mode = DLOCK_MODE_SHARED;
        h[i].token = 10 + i;
    }
    *count = 3;
    return 0;
}

static void test_inspect_holders(void)
{
    static dlock_backend listing, telling, mute;
    static const char *const s1[] = {"listing", NULL}, *const s2[] = {"telling", NULL},
                             *const s3[] = {"mute", NULL};
    dlock_client *c1 = NULL, *c2 = NULL, *c3 = NULL;
    dlock_holder h[4];
    size_t n = 99;
    listing = fake_backend;
    listing.schemes = s1;
    listing.inspect_holders = fake_holders;
    telling = fake_backend;
    telling.schemes = s2;
    telling.inspect = fake_inspect;
    mute = fake_backend;
    mute.schemes = s3;
    mute.inspect = NULL;
    mute.inspect_holders = NULL;
    is_int(dlock_backend_register(&listing), 0, "a backend that lists holders");
    is_int(dlock_backend_register(&telling), 0, "one that inspects only");
    is_int(dlock_backend_register(&mute), 0, "one that cannot inspect");
    is_int(dlock_client_open("listing://h/", &c1), 0, "open listing");
    is_int(dlock_client_open("telling://h/", &c2), 0, "open telling");
    is_int(dlock_client_open("mute://h/", &c3), 0, "open mute");

    memset(h, 0x5a, sizeof h);
    is_int(dlock_inspect_holders(c1, "n", h, 2, &n), 0, "holders listed");
    ok(n == 3, "the count is every holder (%zu), more than the room", n);
    ok(h[0].token == 10 && h[1].token == 11 && h[0].mode == DLOCK_MODE_SHARED,
       "the first two filled in order");
    ok(h[2].known == 0x5a5a5a5au, "nothing written past the capacity");
    is_int(dlock_inspect_holders(c1, "n", NULL, 0, &n), 0, "a count alone");
    ok(n == 3, "still 3");

    memset(h, 0x5a, sizeof h);
    is_int(dlock_inspect_holders(c2, "held", h, 4, &n), 0, "from inspect()");
    ok(n == 1 && h[0].token == 7 && strcmp(h[0].owner, "the-owner") == 0 &&
           h[0].mode == DLOCK_MODE_EXCLUSIVE,
       "one exclusive holder, as inspect() tells it");
    ok(h[0].known == (DLOCK_KNOWS_TOKEN | DLOCK_KNOWS_OWNER | DLOCK_KNOWS_MODE),
       "known as inspect() knew, plus the mode");
    ok(h[1].known == 0 && h[1].token == 0, "the rest of the array zeroed");
    is_int(dlock_inspect_holders(c2, "free", h, 4, &n), 0, "a free name");
    ok(n == 0, "no holder");

    is_int(dlock_inspect_holders(c3, "n", h, 4, &n), DLOCK_ENOTSUP, "no inspect: ENOTSUP");
    is_int(dlock_inspect_holders(c1, "n", h, 4, NULL), DLOCK_EINVAL, "no count: EINVAL");
    is_int(dlock_inspect_holders(c1, "n", NULL, 4, &n), DLOCK_EINVAL,
           "a capacity without an array: EINVAL");
    is_int(dlock_inspect_holders(c1, "", h, 4, &n), DLOCK_EINVAL, "an empty name: EINVAL");
    is_int(dlock_inspect_holders(NULL, "n", h, 4, &n), DLOCK_EINVAL, "no client: EINVAL");
    dlock_client_close(c1);
    dlock_client_close(c2);
    dlock_client_close(c3);
}

static void test_redaction_in_backend_errors(void)
{
    dlock_client *c = NULL;
    dlock_lock *l;
    is_int(dlock_client_open("fake://bob:correct-horse@h/", &c), 0, "open with a password");
    fake.fail_acquire = DLOCK_ESTORE;
    fake.echo_in_error = "server said: bad auth correct-horse and correct-horse";
    dlock_acquire(c, "x", NULL, &l);
    ok(strstr(dlock_errmsg(c), "correct-horse") == NULL, "every copy masked: %s", dlock_errmsg(c));
    ok(strstr(dlock_errmsg(c), "bad auth ***") != NULL, "masked with ***");
    fake.fail_acquire = 0;
    fake.echo_in_error = NULL;
    dlock_client_close(c);
}

/* Lists of URIs: one lock held in every store, all or nothing, with the
 * largest token carried to the others. */
static void test_lists(void)
{
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    int closes = fake.close, releases = fake.release;

    is_int(dlock_client_open("fake://a fake://a", &c), DLOCK_EBADURI, "a store listed twice");
    ok(strstr(dlock_errmsg(c), "listed twice") != NULL, "says so: %s", dlock_errmsg(c));
    dlock_client_close(c);
    char many[17 * 16] = "";
    for (int i = 0; i < 17; i++)
        sprintf(many + strlen(many), "fake://h%d ", i);
    is_int(dlock_client_open(many, &c), DLOCK_EBADURI, "17 stores in one list");
    dlock_client_close(c);
    is_int(dlock_client_open("fake://a fake://b?nope=1", &c), DLOCK_EBADURI,
           "a bad URI in the list");
    ok(strstr(dlock_errmsg(c), "store 2 of 2") && strstr(dlock_errmsg(c), "nope"),
       "names the store and the option: %s", dlock_errmsg(c));
    dlock_client_close(c);
    is_int(fake.close - closes, 1, "the store opened before it was closed");

    /* A store that cannot raise its tokens, beside one whose tokens come
     * from one counter for every name: refused at open, either order. */
    char shared[256];
    unsigned fenced = DLOCK_CAP_FENCING, raising = DLOCK_CAP_FENCING | DLOCK_CAP_RAISE;
    closes = fake.close;
    snprintf(shared, sizeof shared, "fake://a?caps=%u fake://b?caps=%u", fenced,
             raising | DLOCK_CAP_TOKEN_SHARED);
    is_int(dlock_client_open(shared, &c), DLOCK_EBADURI,
           "a list: tokens that cannot be raised beside tokens shared by every name");
    ok(strstr(dlock_errmsg(c), "store 2 of 2") && strstr(dlock_errmsg(c), "cannot be raised"),
       "says which and why: %s", dlock_errmsg(c));
    dlock_client_close(c);
    is_int(fake.close - closes, 2, "both stores opened were closed");
    snprintf(shared, sizeof shared, "fake://b?caps=%u fake://a?caps=%u",
             raising | DLOCK_CAP_TOKEN_SHARED, fenced);
    is_int(dlock_client_open(shared, &c), DLOCK_EBADURI, "the other order too");
    dlock_client_close(c);
    snprintf(shared, sizeof shared, "fake://a?caps=%u fake://b?caps=%u", fenced, raising);
    is_int(dlock_client_open(shared, &c), 0, "per-name tokens beside it: opens");
    dlock_client_close(c);
    snprintf(shared, sizeof shared, "fake://a?caps=%u fake://b?caps=%u", raising,
             raising | DLOCK_CAP_TOKEN_SHARED);
    is_int(dlock_client_open(shared, &c), 0, "shared tokens beside raisable ones: opens");
    dlock_client_close(c);

    is_int(dlock_client_open("  fake://a\n", &c), 0, "one URI with whitespace around it");
    is_str(dlock_client_backend(c), "fake", "is that URI, not a list");
    dlock_client_close(c);
    is_int(dlock_client_open(" fake://a\tfake://b\n", &c), 0, "a list: tabs and newlines separate");
    is_str(dlock_client_backend(c), "composite", "backend composite");
    is_int((int)dlock_client_caps(c), DLOCK_CAP_LEASE | DLOCK_CAP_RENEW, "the stores' common caps");
    int acq = fake.acquire, raises = fake.raise;
    is_int(dlock_acquire(c, "both", NULL, &l), 0, "acquire on the list");
    is_int(fake.acquire - acq, 2, "one acquire per store");
    uint64_t t = l ? dlock_lock_token(l) : 0;
    is_int((int)(t == fake.next_token), 1, "the token is the larger of the two");
    is_int(fake.raise - raises, 1, "the store with the lower token was raised");
    ok(fake.raised_to == t, "to the list's token (%llu)", (unsigned long long)fake.raised_to);
    releases = fake.release;
    is_int(dlock_release(l), 0, "release");
    is_int(fake.release - releases, 2, "released in both stores");

    /* The second store refuses: the first part is released before the call returns. */
    fake.fail_acquire_at = fake.acquire + 2;
    releases = fake.release;
    l = NULL;
    is_int(dlock_acquire(c, "both", NULL, &l), DLOCK_EBUSY, "the second store refuses");
    ok(l == NULL, "no lock");
    is_int(fake.release - releases, 1, "the first store's part was released");
    ok(strstr(dlock_errmsg(c), "store 2 of 2 (fake)") != NULL, "names the store: %s",
       dlock_errmsg(c));
    fake.fail_acquire_at = 0;

    /* A store that cannot carry the token: nothing held. */
    fake.fail_raise = DLOCK_ENOTSUP;
    releases = fake.release;
    is_int(dlock_acquire(c, "both", NULL, &l), DLOCK_ENOTSUP, "a store that cannot be raised");
    is_int(fake.release - releases, 2, "both parts released");
    fake.fail_raise = 0;
    dlock_client_close(c);

    /* A store without a lease listed with a leased one: the list is not
     * freed for others at the TTL (no DLOCK_CAP_LEASE), but its holder's
     * lock ends with the leased part's lease. */
    char list[256];
    snprintf(list, sizeof list, "file://%s/dlock-test-core-%d fake://a", "/tmp", (int)getpid());
    is_int(dlock_client_open(list, &c), 0, "a list of file and a leased store");
    ok(!(dlock_client_caps(c) & DLOCK_CAP_LEASE), "declares no lease (the file part stays held)");
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.ttl_ms = 300;
    uint64_t t0 = dlock_monotonic_ns();
    is_int(dlock_acquire(c, "leased", &o, &l), 0, "acquire with a 300 ms lease");
    uint64_t end = l ? dlock_lock_expires_ns(l) : 0;
    ok(end > t0 && end <= dlock_monotonic_ns() + 300 * 1000000ull,
       "expires with the leased part, not never (%lld ms from the start)",
       (long long)(end - t0) / 1000000);
    if (l)
        dlock_release(l);
    o.keep = 1; /* the fake store cannot keep: renewals fail until the lease ends */
    is_int(dlock_acquire(c, "kept", &o, &l), 0, "a kept acquire");
    for (int i = 0; i < 300 && l && !dlock_lock_lost(l); i++)
        usleep(10000);
    ok(l && dlock_lock_lost(l), "the loss is reported when the leased part's lease ends");
    ok(strstr(dlock_lock_lost_detail(l), "store 2 of 2") != NULL, "naming the store: %s",
       dlock_lock_lost_detail(l));
    if (l)
        dlock_release(l);
    dlock_client_close(c);
}

/* Several names on one store: taken in byte order, all or nothing, the
 * token the largest with the others raised to it, released together. */
static void test_names(void)
{
    dlock_client *c = NULL;
    dlock_lock *l = NULL, *x = NULL;
    const char *cab[3] = {"c", "a", "b"};
    is_int(dlock_client_open("fake://names", &c), 0, "open");
    int acq = fake.acquire, raises = fake.raise, releases = fake.release, renews = fake.renew;
    is_int(dlock_acquire_names(c, cab, 3, NULL, &l), 0, "acquire {c, a, b}");
    is_int(fake.acquire - acq, 3, "one acquire per name");
    is_str(fake.last_name, "c", "in byte order: 'c' last");
    uint64_t t = l ? dlock_lock_token(l) : 0;
    ok(t == fake.next_token, "the token is the largest (%llu)", (unsigned long long)t);
    is_int(fake.raise - raises, 2, "the two names below it were raised");
    ok(fake.raised_to == t, "to the lock's token");
    is_int(dlock_renew(l, 1000), 0, "renew");
    is_int(fake.renew - renews, 3, "renews every name");
    is_int(dlock_acquire(c, "b", NULL, &x), DLOCK_EALREADY, "'b' alone → DLOCK_EALREADY");
    is_int(dlock_release(l), 0, "release");
    is_int(fake.release - releases, 3, "releases every name");

    /* The third name refused: the first two released before the return. */
    fake.fail_acquire_at = fake.acquire + 3;
    releases = fake.release;
    is_int(dlock_acquire_names(c, cab, 3, NULL, &l), DLOCK_EBUSY, "the third name refused");
    is_int(fake.release - releases, 2, "the two taken were released");
    ok(strstr(dlock_errmsg(c), "name 'c'") && strstr(dlock_errmsg(c), "number"),
       "names the name, keeps the store's detail: %s", dlock_errmsg(c));
    ok(strstr(dlock_errmsg(c), "store") == NULL, "no store number on a single store");
    fake.fail_acquire_at = 0;

    /* The last name's raise refused: nothing held. */
    fake.fail_raise = DLOCK_ENOTSUP;
    releases = fake.release;
    is_int(dlock_acquire_names(c, cab, 3, NULL, &l), DLOCK_ENOTSUP, "a name that cannot be raised");
    is_int(fake.release - releases, 3, "every name released");
    fake.fail_raise = 0;

    /* Close releases a several-name lock left held. */
    is_int(dlock_acquire_names(c, cab, 2, NULL, &l), 0, "acquire {c, a}");
    releases = fake.release;
    dlock_client_close(c);
    is_int(fake.release - releases, 2, "close released both names");

    /* On a list: store by store, each store's names in byte order. */
    is_int(dlock_client_open("fake://one fake://two", &c), 0, "open a list");
    acq = fake.acquire;
    is_int(dlock_acquire_names(c, cab, 2, NULL, &l), 0, "acquire {c, a} on the list");
    is_int(fake.acquire - acq, 4, "two names × two stores");
    is_str(fake.last_name, "c", "the second store's 'c' last");
    fake.fail_acquire_at = fake.acquire + 3;
    if (l)
        dlock_release(l);
    is_int(dlock_acquire_names(c, cab, 2, NULL, &l), DLOCK_EBUSY, "the second store's 'a' refused");
    ok(strstr(dlock_errmsg(c), "store 2 of 2 (fake), name 'a'") != NULL, "names both: %s",
       dlock_errmsg(c));
    fake.fail_acquire_at = 0;

    /* Store-wide tokens on a list. */
    uint64_t top = 0;
    int tops = fake.top, floors = fake.floor;
    is_int(dlock_client_token_top(c, &top), 0, "token top of a list");
    is_int(fake.top - tops, 2, "asks every store");
    ok(top == fake.next_token, "the largest (%llu)", (unsigned long long)top);
    is_int(dlock_client_raise_floor(c, 77), 0, "raise the floor of a list");
    is_int(fake.floor - floors, 2, "on every store");
    ok(fake.floor_to == 77, "to the floor given");
    fake.fail_floor = DLOCK_ENOTSUP;
    is_int(dlock_client_raise_floor(c, 78), DLOCK_ENOTSUP, "a store refusing");
    ok(strstr(dlock_errmsg(c), "store 1 of 2 (fake): fake floor refused") != NULL,
       "names the store: %s", dlock_errmsg(c));
    fake.fail_floor = 0;
    is_int(dlock_client_raise_floor(c, 1ull << 63), DLOCK_EINVAL, "a floor of 2^63");
    is_int(dlock_client_token_top(c, NULL), DLOCK_EINVAL, "top NULL");
    dlock_client_close(c);
}

/* Metrics: acquires by result and error code, releases, renewals, the
 * histograms, the text (its parse is tests/unit/test_metrics.py's). */
static void test_metrics(void)
{
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    dlock_metrics m;
    char text[16384];
    is_int(dlock_client_open("fake://metrics", &c), 0, "open");
    is_int(dlock_client_metrics(c, NULL), DLOCK_EINVAL, "no place → DLOCK_EINVAL");
    is_int(dlock_client_metrics(c, &m), 0, "metrics of a new client");
    ok(m.version == DLOCK_METRICS_VERSION && m.granted == 0 && m.wait.count == 0, "all zero");
    is_int(dlock_acquire(c, "m", NULL, &l), 0, "granted");
    is_int(dlock_renew(l, 1000), 0, "renewed");
    is_int(dlock_release(l), 0, "released");
    fake.fail_acquire = DLOCK_ECONNECT;
    is_int(dlock_acquire(c, "m", NULL, &l), DLOCK_ECONNECT, "failed: ECONNECT");
    fake.fail_acquire = DLOCK_EBUSY;
    is_int(dlock_acquire(c, "m", NULL, &l), DLOCK_EBUSY, "busy");
    fake.fail_acquire = 0;
    is_int(dlock_acquire(c, "", NULL, &l), DLOCK_EINVAL, "a bad name: not counted");
    dlock_client_metrics(c, &m);
    ok(m.granted == 1 && m.busy == 1 && m.failed == 1 && m.timed_out == 0,
       "by result: 1 granted, 1 busy, 1 failed (%llu %llu %llu)", (unsigned long long)m.granted,
       (unsigned long long)m.busy, (unsigned long long)m.failed);
    ok(m.errors[-DLOCK_ECONNECT] == 1, "the failure by code");
    ok(m.releases == 1 && m.renewals == 1 && m.hold.count == 1 && m.wait.count == 3,
       "1 release, 1 renewal, 1 hold and 3 waits observed");
    ok(m.wait.le[DLOCK_METRICS_BUCKETS - 1] == 3 && m.wait.le[0] <= m.wait.le[1],
       "buckets cumulative");
    int n = dlock_metrics_format(&m, "app=\"x\"", text, sizeof text);
    ok(n > 0 && (size_t)n < sizeof text, "formatted (%d bytes)", n);
    ok(strstr(text, "dlock_acquire_errors_total{app=\"x\",code=\"DLOCK_ECONNECT\"} 1\n") != NULL,
       "errors by code, with the labels");
    char small[64];
    is_int(dlock_metrics_format(&m, "app=\"x\"", small, sizeof small), n,
           "a short buffer: the full length, as snprintf");
    ok(strlen(small) == sizeof small - 1, "cut, NUL-terminated");
    is_int(dlock_metrics_format(&m, "app=x", text, sizeof text), DLOCK_EINVAL,
           "labels without quotes → DLOCK_EINVAL");
    is_int(dlock_metrics_format(&m, "le=\"1\"", text, sizeof text), DLOCK_EINVAL,
           "a label the text adds itself (le) → DLOCK_EINVAL");
    is_int(dlock_metrics_format(&m, "a=\"1\",b=\"x\\\",\",a=\"2\"", text, sizeof text),
           DLOCK_EINVAL, "a label name twice → DLOCK_EINVAL");
    is_int(dlock_metrics_format(&m, "__name__=\"x\"", text, sizeof text), DLOCK_EINVAL,
           "a reserved name (__*) → DLOCK_EINVAL");
    ok(dlock_metrics_format(&m, "a=\"1\",b=\"x\\\",a=\\\"\"", text, sizeof text) > 0,
       "a value that looks like another label is a value");
    is_int(dlock_metrics_format(NULL, NULL, text, sizeof text), DLOCK_EINVAL, "no metrics");
    dlock_client_close(c);
}

/* The held-name table (core/held.c) through the API: many locks, names
 * that share prefixes and lengths, several-name locks, removal and
 * shrinking, close. Each check would fail with a table that lost, mixed up
 * or kept a name. */
static void test_many_held(void)
{
    enum { N = 20000 };
    dlock_client *c = NULL;
    dlock_lock **locks = calloc(N, sizeof *locks), *l = NULL;
    char name[32];
    int good = 1, rel;
    is_int(dlock_client_open("fake://h/", &c), 0, "open for many locks");
    for (int i = 0; i < N && good; i++) {
        snprintf(name, sizeof name, "many-%d", i); /* many-1, many-10, many-100: prefixes */
        good = dlock_acquire(c, name, NULL, &locks[i]) == 0;
    }
    ok(good, "20000 distinct names are acquired");
    for (int i = 0; i < N && good; i += 7) {
        snprintf(name, sizeof name, "many-%d", i);
        good = dlock_acquire(c, name, NULL, &l) == DLOCK_EALREADY;
    }
    ok(good, "each held name is refused again (EALREADY)");
    is_int(dlock_acquire(c, "many-", NULL, &l), 0, "a prefix of held names is another name");
    is_int(dlock_release(l), 0, "and is released");
    const char *two[] = {"many-5", "other"};
    is_int(dlock_acquire_names(c, two, 2, NULL, &l), DLOCK_EALREADY,
           "a several-name lock with one held name is refused");
    for (int i = 0; i < N && good; i += 2) {
        good = dlock_release(locks[i]) == 0;
        locks[i] = NULL;
    }
    ok(good, "every other lock is released");
    for (int i = 0; i < N && good; i++) {
        snprintf(name, sizeof name, "many-%d", i);
        int rc = dlock_acquire(c, name, NULL, &l);
        good = i % 2 == 0 ? rc == 0 && dlock_release(l) == 0 : rc == DLOCK_EALREADY;
    }
    ok(good, "released names are free again, the others still held");
    for (int i = 1; i < N && good; i += 2) {
        good = dlock_release(locks[i]) == 0;
        locks[i] = NULL;
    }
    ok(good, "the rest are released (the table shrinks)");
    const char *three[] = {"c", "a", "b"};
    is_int(dlock_acquire_names(c, three, 3, NULL, &l), 0, "a three-name lock");
    is_int(dlock_acquire(c, "b", NULL, &locks[0]), DLOCK_EALREADY, "its middle name is held");
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    o.reentrant = 1;
    dlock_lock *again = NULL;
    const char *same[] = {"b", "c", "a"};
    is_int(dlock_acquire_names(c, same, 3, &o, &again), 0, "reentrant with the same names");
    ok(again == l, "finds the same lock");
    dlock_release(again);
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "left-%d", i);
        dlock_acquire(c, name, NULL, &locks[i]);
    }
    rel = fake.release;
    dlock_client_close(c);
    /* The three-name lock is still held once: one release per name. */
    is_int(fake.release - rel, 103, "close releases each of 101 locks once (3 + 100)");
    free(locks);
}

int main(void)
{
    dlock_client *c = NULL;
    test_registry();
    test_open_errors();
    is_int(dlock_client_open("fake://h/?alpha=1&beta=2&alpha=3", &c), 0, "open fake");
    test_acquire_checks(c);
    test_acquire_flow(c);
    test_cancel(c);
    test_modes(c);
    test_inspect_holders();
    int rel = fake.release;
    dlock_client_close(c);
    is_int(fake.release - rel, 1, "close released the lock left held");
    test_close_releases();
    test_optional_methods();
    test_redaction_in_backend_errors();
    test_lists();
    test_names();
    test_metrics();
    test_many_held();
    is_int(fake.opened, fake.close, "every opened connection was closed");
    return done_testing();
}
