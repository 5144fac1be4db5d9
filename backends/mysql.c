/*
 * mysql://[user[:password]@]host[:port]/database[?options] (also mariadb://):
 * locks in MariaDB (10.3 or later) or MySQL (8.0 or later), through
 * MariaDB Connector/C's non-blocking API (libmariadb).
 *
 * The front: parses the URI and picks one struct mysql_mode at open, from
 * options lock and token (mysql_int.h lists the files under it):
 *
 *   lock=row, token=table (default)  mc_row_table_mode   mysql_row.c
 *   lock=row, token=sequence         mc_row_seq_mode     mysql_row.c
 *   lock=named (token=sequence)      mc_named_mode       mysql_named.c
 *   layout=plain (lock=named on the plain name, as tooz and GET_LOCK
 *                 callers take it)  mc_named_mode       mysql_named.c
 *
 * Every method goes through that table; no recipe asks which mode it is
 * in. Every client of a store must use the same lock and token options.
 * How each mode works, its sessions, bounds, deadlines, cancels,
 * restarts, tokens and inspect: docs/mysql.md, "How the backend works".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "backends/mysql_int.h"

static const char *const mysql_schemes[] = {"mysql", "mariadb", NULL};
static const char *const mysql_options_list[] = {
    "connect_timeout", "timeout", "table", "socket", "tls", "tls_ca", "tls_cert", "tls_key", "token",
    "lock", "layout", NULL,
};

/* ---- open, close -------------------------------------------------------- */

static void be_close(dlock_conn *conn)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    mc_pool_drain(mc);
    if (mc->mode && mc->mode->close)
        mc->mode->close(mc);
    mc_session_close(mc->ctl);
    if (mc->password)
        explicit_bzero(mc->password, strlen(mc->password));
    for (int i = 0; i < N_STMTS; i++)
        free(mc->sql[i]);
    free(mc->host);
    free(mc->user);
    free(mc->password);
    free(mc->database);
    free(mc->socket);
    free(mc->table);
    free(mc->tls_ca);
    free(mc->tls_cert);
    free(mc->tls_key);
    free(mc);
}

static char *dup_param(const dlock_uri *uri, const char *key)
{
    const char *v = dlock_uri_param(uri, key);
    return v ? strdup(v) : NULL;
}

static int check_table(dlock_client *c, const char *t)
{
    size_t n = strlen(t);
    if (n == 0 || n > TABLE_NAME_MAX || strspn(t, "abcdefghijklmnopqrstuvwxyz"
                                                  "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != n)
        return dlock_seterr(c, DLOCK_EBADURI,
                            "option table: 1 to %d letters, digits or '_'", TABLE_NAME_MAX);
    return 0;
}

static int parse_tls(dlock_client *c, const dlock_uri *uri, struct mysql_conn *mc)
{
    const char *v = dlock_uri_param(uri, "tls");
    if (!v || strcmp(v, "off") == 0)
        mc->tls = 0;
    else if (strcmp(v, "on") == 0)
        mc->tls = 1;
    else if (strcmp(v, "verify") == 0)
        mc->tls = 2;
    else
        return dlock_seterr(c, DLOCK_EBADURI, "option tls: off, on or verify");
    if (!mc->tls && (dlock_uri_param(uri, "tls_ca") || dlock_uri_param(uri, "tls_cert") ||
                     dlock_uri_param(uri, "tls_key")))
        return dlock_seterr(c, DLOCK_EBADURI, "options tls_ca, tls_cert, tls_key need tls=on or tls=verify");
    mc->tls_ca = dup_param(uri, "tls_ca");
    mc->tls_cert = dup_param(uri, "tls_cert");
    mc->tls_key = dup_param(uri, "tls_key");
    return 0;
}

static int parse_uri(dlock_client *c, const dlock_uri *uri, struct mysql_conn *mc)
{
    size_t nhosts = dlock_uri_host_count(uri);
    const char *path = dlock_uri_path(uri), *table = dlock_uri_param(uri, "table");
    int err;
    mc->connect_ms = DEFAULT_CONNECT_MS;
    mc->timeout_ms = DEFAULT_TIMEOUT_MS;
    if ((err = dlock_uri_param_uint(c, uri, "connect_timeout", 1, 3600000, &mc->connect_ms)) ||
        (err = dlock_uri_param_uint(c, uri, "timeout", 1, 3600000, &mc->timeout_ms)) ||
        (err = parse_tls(c, uri, mc)) || (err = check_table(c, table ? table : DEFAULT_TABLE)))
        return err;
    mc->socket = dup_param(uri, "socket");
    const char *tok = dlock_uri_param(uri, "token");
    if (tok && strcmp(tok, "table") != 0 && strcmp(tok, "sequence") != 0)
        return dlock_seterr(c, DLOCK_EBADURI, "option token: table or sequence");
    mc->token_opt = !tok ? 0 : strcmp(tok, "table") == 0 ? 1 : 2;
    const char *lk = dlock_uri_param(uri, "lock");
    if (lk && strcmp(lk, "row") != 0 && strcmp(lk, "named") != 0)
        return dlock_seterr(c, DLOCK_EBADURI, "option lock: row or named");
    mc->lock_named = lk && strcmp(lk, "named") == 0;
    int layout = 0;
    if ((err = dlock_uri_param_choice(c, uri, "layout", (const char *[]){"dlock", "plain", NULL},
                                      &layout)) != 0)
        return err;
    mc->layout_plain = layout == 1;
    if (mc->layout_plain && lk && !mc->lock_named)
        return dlock_seterr(c, DLOCK_EBADURI, "option layout=plain takes user locks (GET_LOCK) on"
                                              " the plain name: it implies lock=named, not"
                                              " lock=row");
    if (mc->layout_plain && mc->token_opt == 1)
        return dlock_seterr(c, DLOCK_EBADURI, "option layout=plain takes its tokens from a"
                                              " sequence, as lock=named does: it needs"
                                              " token=sequence (its default), not token=table");
    if (mc->layout_plain)
        mc->lock_named = 1;
    if (mc->lock_named && mc->token_opt == 1)
        return dlock_seterr(c, DLOCK_EBADURI, "option lock=named takes its tokens from a"
                                              " sequence: it needs token=sequence (the default"
                                              " with lock=named), not token=table");
    if (nhosts > 1)
        return dlock_seterr(c, DLOCK_EBADURI, "a mysql:// URI names one server");
    if (nhosts == 0 && !mc->socket)
        return dlock_seterr(c, DLOCK_EBADURI, "a mysql:// URI needs a host, as in "
                                              "mysql://user:password@127.0.0.1:3306/database");
    if (mc->socket && nhosts && strcmp(dlock_uri_host(uri, 0), "localhost") != 0)
        return dlock_seterr(c, DLOCK_EBADURI, "with option socket the host must be localhost or empty");
    if (!path[0] || !path[1] || strchr(path + 1, '/'))
        return dlock_seterr(c, DLOCK_EBADURI, "the path of a mysql:// URI is the database, as in /dlock");
    mc->database = strdup(path + 1);
    mc->host = strdup(nhosts ? dlock_uri_host(uri, 0) : "localhost");
    mc->port = nhosts && dlock_uri_port(uri, 0) ? dlock_uri_port(uri, 0) : DEFAULT_PORT;
    mc->table = strdup(table ? table : DEFAULT_TABLE);
    if (dlock_uri_user(uri))
        mc->user = strdup(dlock_uri_user(uri));
    if (dlock_uri_password(uri))
        mc->password = strdup(dlock_uri_password(uri));
    if (mc->socket)
        snprintf(mc->where, sizeof mc->where, "%.120s", mc->socket);
    else
        snprintf(mc->where, sizeof mc->where, "%.100s:%u", mc->host ? mc->host : "", mc->port);
    if (!mc->database || !mc->host || !mc->table)
        return DLOCK_ENOMEM;
    if (mc->lock_named) { /* user locks are server-wide: the store's database and table */
        size_t dl = strlen(mc->database), tl = strlen(mc->table);
        char *salt = malloc(dl + 1 + tl);
        if (!salt)
            return DLOCK_ENOMEM;
        memcpy(salt, mc->database, dl);
        salt[dl] = '\0';
        memcpy(salt + dl + 1, mc->table, tl);
        dlock_sha256(salt, dl + 1 + tl, mc->salt);
        free(salt);
    }
    return 0;
}

static const char *mode_name(int mode)
{
    return mode == 2 ? "token=sequence" : "token=table";
}

/*
 * The token mode this client runs (*use: 1 table, 2 sequence) and whether
 * the store's table exists. The store's recorded mode wins over the URI's
 * option: without the option, the client follows it; with the other
 * option, it opens in that mode for dlock migrate only (token_top,
 * raise_floor, which moves the record), and refuses locks (mode_err). A
 * new store gets token=sequence where the server has sequences (MariaDB
 * 10.3+), else token=table; a store from before the record gets the
 * option, token=table without one, as before. DLOCK_TEST_MYSQL_IGNORE_MODE
 * (tests' negative control) skips the record, as an older dlock would.
 */
static int pick_mode(struct mysql_conn *mc, int *use, int *exists)
{
    int want = mc->lock_named ? 2 : mc->token_opt, err;
    if ((err = mc_store_mode(mc, exists)) != 0)
        return err;
    if (getenv("DLOCK_TEST_MYSQL_IGNORE_MODE"))
        mc->store_mode = 0, *exists = 1;
    if (mc->store_mode == 1 && mc->lock_named)
        return dlock_seterr(cl(mc), DLOCK_ENOTSUP,
                            "mysql %s: the store (table %s) records token=table, and %s takes its"
                            " tokens from a sequence: use lock=row, or stop every client and run"
                            " dlock migrate \"mysql://…?token=table\" \"mysql://…?token=sequence\""
                            " first", mc->where, mc->table,
                            mc->layout_plain ? "layout=plain" : "lock=named");
    if (mc->store_mode) {
        *use = want ? want : mc->store_mode;
        mc->mode_differs = *use != mc->store_mode;
    } else {
        *use = want ? want : *exists || !mc->mariadb ? 1 : 2;
    }
    return 0;
}

/* A client whose option names the other mode than the store's. */
static int mode_err(struct mysql_conn *mc)
{
    int mine = mc->store_mode == 2 ? 1 : 2;
    return dlock_seterr(cl(mc), DLOCK_ESTORE,
                        "mysql %s: the store (table %s) records %s, this URI asks for %s: drop"
                        " the option to follow the store, or stop every client and move the"
                        " store with dlock migrate \"mysql://…?%s\" \"mysql://…?%s\"",
                        mc->where, mc->table, mode_name(mc->store_mode), mode_name(mine),
                        mode_name(mc->store_mode), mode_name(mine));
}

static void library_init(void)
{
    mysql_library_init(0, NULL, NULL);
}

static int be_open(dlock_client *c, const dlock_uri *uri, dlock_conn **connp)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    struct mysql_conn *mc = calloc(1, sizeof *mc);
    int err;
    if (!mc)
        return dlock_seterr(c, DLOCK_ENOMEM, "out of memory");
    mc->base.client = c;
    if ((err = parse_uri(c, uri, mc)) != 0) {
        if (err == DLOCK_ENOMEM)
            dlock_seterr(c, err, "out of memory");
        goto fail;
    }
    /* mysql_init() would do this lazily, but not thread-safely. */
    pthread_once(&once, library_init);
    int use = 1, exists = 1;
    if ((err = pick_mode(mc, &use, &exists)) != 0)
        goto fail;
    mc->mode = mc->lock_named ? &mc_named_mode : use == 2 ? &mc_row_seq_mode : &mc_row_table_mode;
    if ((err = mc->mode->open(mc)) != 0)
        goto fail;
    /* A new store records the mode it was created with (a store from
     * before the record keeps none until a migrate moves it). */
    if (!exists && !getenv("DLOCK_TEST_MYSQL_IGNORE_MODE")) {
        if ((err = mc_store_mode_record(mc, use, 0)) != 0)
            goto fail;
        mc->mode_differs = mc->store_mode != use; /* another client created it first */
    }
    /* MySQL 8 schedules row-lock waiters by contention (CATS), not by
     * arrival: only MariaDB's queue is first-come first-served. */
    mc->base.caps = dlock_mysql_backend.caps & ~mc->mode->caps_off;
    /* layout=plain: peers' GET_LOCK(name) holders publish nothing, and
     * their terms are not known (docs/mysql.md, "Elections"). */
    if (mc->layout_plain)
        mc->base.caps &= ~(unsigned)DLOCK_CAP_ELECTION;
    if (!mc->mariadb) /* permits need SET STATEMENT too */
        mc->base.caps &= ~(unsigned)(DLOCK_CAP_FIFO | DLOCK_CAP_SEMAPHORE);
    /* token=sequence, lock=named: one counter for every name (a list with
     * ZooKeeper or etcd refuses it: core/composite.c). */
    if (mc->mode != &mc_row_table_mode)
        mc->base.caps |= DLOCK_CAP_TOKEN_SHARED;
    *connp = &mc->base;
    return 0;
fail:
    be_close(&mc->base);
    return err;
}

static int be_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    if (mc->mode_differs)
        return mode_err(mc);
    return mc->mode->acquire(mc, req, heldp);
}

static int be_release(dlock_conn *conn, dlock_held *held)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->release(mc, held);
}

static int be_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->renew(mc, held, ttl_ms);
}

static int be_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->keep(mc, held, ttl_ms);
}

static int be_ping(dlock_conn *conn)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->ping(mc);
}

static int be_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->raise_token(mc, held, floor);
}

static int be_token_top(dlock_conn *conn, uint64_t *top)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->token_top(mc, top);
}

static int be_raise_floor(dlock_conn *conn, uint64_t floor)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    int err = mc->mode->raise_floor(mc, floor);
    /* dlock migrate: the store now runs this client's mode. */
    if (err == 0 && !getenv("DLOCK_TEST_MYSQL_IGNORE_MODE") &&
        (err = mc_store_mode_record(mc, mc->mode == &mc_row_table_mode ? 1 : 2, 1)) == 0)
        mc->mode_differs = 0;
    return err;
}

static int be_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    if (mc->mode_differs)
        return mode_err(mc);
    return mc->mode->inspect(mc, name, len, info);
}

static int be_inspect_holders(dlock_conn *conn, const char *name, size_t len,
                              dlock_holder *holders, size_t capacity, size_t *count)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    dlock_info info;
    if (mc->mode_differs)
        return mode_err(mc);
    if (mc->mode->inspect_holders)
        return mc->mode->inspect_holders(mc, name, len, holders, capacity, count);
    memset(&info, 0, sizeof info);
    info.version = DLOCK_INFO_VERSION;
    int err = mc->mode->inspect(mc, name, len, &info);
    return err ? err : mc_one_holder(&info, holders, capacity, count);
}

static int be_publish(dlock_conn *conn, dlock_held *held, const void *value, size_t len)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->publish(mc, held, value, len);
}

static int be_leader(dlock_conn *conn, const char *name, size_t len, dlock_info *info,
                     char *value, size_t *value_len)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->leader(mc, name, len, info, value, value_len);
}

/* No watch: observers poll leader(). lock=row has nothing to do (the
 * release rolled the value back); lock=named drops the released value. */
static int be_wake(dlock_conn *conn, const char *name, size_t len)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    return mc->mode->wake ? mc->mode->wake(mc, name, len) : 0;
}

const dlock_backend dlock_mysql_backend = {
    DLOCK_BACKEND_INIT,
    .name = "mysql",
    .schemes = mysql_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_HOLDER_DEATH | DLOCK_CAP_RAISE |
            DLOCK_CAP_CANCEL | DLOCK_CAP_SHARED | DLOCK_CAP_SEMAPHORE | DLOCK_CAP_ELECTION,
    .options = mysql_options_list,
    .open = be_open,
    .close = be_close,
    .acquire = be_acquire,
    .release = be_release,
    .renew = be_renew,
    .ping = be_ping,
    .keep = be_keep,
    .raise_token = be_raise_token,
    .token_top = be_token_top,
    .raise_floor = be_raise_floor,
    .inspect = be_inspect,
    .inspect_holders = be_inspect_holders,
    .publish = be_publish,
    .leader = be_leader,
    .wake = be_wake,
};
