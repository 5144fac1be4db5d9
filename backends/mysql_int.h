/*
 * The MariaDB/MySQL backend's shared types, constants and layers (how it
 * works, at length: docs/mysql.md, "How the backend works"). The files
 * depend downward only:
 *
 *   mysql.c        the front: URI, open/close, picks a struct mysql_mode
 *                  at open (row locks with token=table or token=sequence,
 *                  or lock=named) and dispatches every method through it
 *   mysql_row.c    the row-lock recipe, both token sources (a small
 *                  per-source table chosen with the mode)
 *   mysql_inspect.c  inspect of row locks (its own per-source table)
 *   mysql_named.c  the lock=named (GET_LOCK) recipe, its sessions on the
 *                  SQL backends' shared layer (sql_session.c); layout=plain
 *                  is that recipe on the plain name (peers' GET_LOCK(name))
 *   mysql_seq.c    the store's tables and its sequence (token=sequence,
 *                  lock=named): setup, the durable mark, floor and top
 *   mysql_elect.c  elections: the leaders' table, publish's statement,
 *                  lock=row's leader read
 *   mysql_conn.c   sessions, the non-blocking driver steps, the bounds,
 *                  the control session and the idle pool
 *
 * Every function shared between them is named mc_* and declared here.
 */
#ifndef DLOCK_BACKENDS_MYSQL_INT_H
#define DLOCK_BACKENDS_MYSQL_INT_H

#include <pthread.h>
#include <stdint.h>

#include <mysql.h>

#include "backends/sql_session.h"
#include "core/internal.h"
#include "core/sha256.h"

#ifndef LIBMARIADB
#error "the mysql backend needs MariaDB Connector/C (libmariadb) for its non-blocking API"
#endif

#define DEFAULT_PORT 3306
#define DEFAULT_CONNECT_MS 5000
#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_TABLE "dlock_locks"
#define TABLE_NAME_MAX 57      /* 64 (MySQL's identifier limit) - "_grants" */
#define NAME_COLUMN_MAX 255    /* bytes of the name kept for people to read */
#define LOCK_WAIT_MAX_S 1073741824u /* innodb_lock_wait_timeout's maximum */
#define IDLE_SESSIONS_MAX 4 /* row locks' pool (lock=named: sql_session.h's) */
#define MDL_WAIT_MAX_S 31536000u  /* lock_wait_timeout's maximum */
#define CLEANUP_MS 200u /* past a deadline: ending a wait, letting go after a failure */
#define MS 1000000ull

/* Server errors not in every client's headers. */
#define ERR_LOCK_NOWAIT 3572             /* MySQL 8: NOWAIT found the row locked */
#define ERR_CLIENT_INTERACTION_TIMEOUT 4031 /* MySQL 8.0.24+: wait_timeout closed us */
#define ERR_ACCESS_DENIED_NO_PASSWORD 1698

/* The token column is BIGINT UNSIGNED, and the next grant adds 1. */
#define TOKEN_FLOOR_MAX (UINT64_MAX - 1)
/* token=sequence: a MariaDB sequence is a signed BIGINT whose largest
 * value is 2^63 - 2, and the next grant takes the value after the floor. */
#define SEQ_MAX 9223372036854775806ull
#define SEQ_FLOOR_MAX (SEQ_MAX - 1)
#define SEQ_CACHE 1000 /* values a server hands out per write of the sequence */
#define ERR_STATEMENT_TIMEOUT 1969 /* MariaDB: max_statement_time ended it */
#define ERR_UNKNOWN_SEQUENCE 4091  /* MariaDB: not a sequence */

enum stmt_id {
    ST_LOCK_WAIT, ST_LOCK_NOWAIT, ST_SHARED_WAIT, ST_SHARED_NOWAIT, ST_CREATE_ROW, ST_GRANT,
    ST_RAISE, ST_TOP, ST_FLOOR, N_STMTS
};

/* The row of <table>_grants that holds the store's floor (raise_floor): a
 * key no name has (names' keys are SHA-256 digests). */
#define FLOOR_K "X'0000000000000000000000000000000000000000000000000000000000000000'"

/* What mc_session_open makes of a session. */
enum session_role {
    ROLE_CTL,   /* the control session: autocommit, gives up on a row lock after 1 s */
    ROLE_ROW,   /* a row lock's session: no autocommit (the lock is its transaction) */
    ROLE_NAMED, /* lock=named: autocommit (user locks need no transaction) */
};

struct mysql_mode;
struct row_source;

struct row_view;

/* A server connection. lock=named embeds it in its sql_session one. */
struct session {
    MYSQL *db;                 /* lock=named: NULL once closed, the struct kept
                                  while handles point to it */
    MYSQL_STMT *stmt[N_STMTS]; /* prepared on first use */
    unsigned wait_timeout_s;   /* as last set by us; 0 = server default */
    unsigned lock_wait_s;      /* innodb_lock_wait_timeout as last set; 0 = default */
    unsigned last_errno;       /* of the last failure on it */
    int dead;                  /* the server dropped it: close, never reuse */
    uint64_t silent_ms;        /* dead because no reply came in this long:
                                  the server may still be working on it, so
                                  a retry would only wait again; 0: no */
    struct session *next;      /* in the idle pool */
    uint64_t idle_since;       /* put in the pool (lock=named: left holding
                                  nothing) then (CLOCK_MONOTONIC) */
};

struct mysql_conn {
    dlock_conn base;
    char *host, *user, *password, *database, *socket, *table;
    char *tls_ca, *tls_cert, *tls_key;
    unsigned port;
    int tls; /* 0 off, 1 encrypt, 2 encrypt and verify the server */
    int ctl_dropped; /* the control session broke: its next open is a reconnect */
    int token_opt;   /* option token: 0 absent (table), 1 table, 2 sequence */
    int lock_named;  /* option lock=named (mysql.c picks the mode from these two) */
    int layout_plain; /* option layout=plain: lock=named on the plain name (GET_LOCK(name)) */
    int store_mode;  /* the token mode the store records: 0 none (a store from before the
                        record), 1 table, 2 sequence (mc_store_mode) */
    int mode_differs; /* option token names the other mode than the store's: only
                         token_top and raise_floor (dlock migrate) run */
    const struct mysql_mode *mode; /* picked at open: every method goes through it */
    const char *ctl_isolation; /* the control session's, when not READ COMMITTED */
    const char *row_isolation; /* lock sessions', when not READ COMMITTED */
    int mariadb;     /* the server is MariaDB (not MySQL) */
    uint64_t durable; /* the sequence: every token below it is on disk (mc_seq_durable) */
    unsigned char salt[DLOCK_SHA256_LEN]; /* lock=named: SHA-256 of database, table */
    struct dlock_sql_pool pool; /* lock=named: every session, holding or free */
    uint64_t connect_ms, timeout_ms;
    char where[128];        /* "host:port" or the socket path, for messages */
    char *sql[N_STMTS];
    struct session *ctl;    /* autocommit control session; NULL after it dropped */
    struct session *idle;   /* pool of idle lock sessions */
    unsigned nidle;
};

/*
 * When a step must be over, and what its end means. Deadlines are the
 * caller's (DLOCK_ETIMEDOUT when they pass); `timeout` and
 * `connect_timeout` are the server's time to answer (DLOCK_ECONNECT).
 */
struct bound {
    uint64_t until; /* absolute CLOCK_MONOTONIC; 0: none */
    int late;       /* the error when until passes */
    int extend;     /* a try: time spent connecting is added to until */
};

/*
 * Every exchange with the server runs on Connector/C's non-blocking API,
 * polled here until a bound of dlock's own: the library's timeouts count
 * whole seconds, and one blocking call with them could overrun a deadline
 * by as much.
 */
enum nb_op { NB_CONNECT, NB_QUERY, NB_STORE, NB_PREPARE, NB_EXECUTE, NB_STMT_STORE, NB_ROLLBACK };

struct nb {
    enum nb_op op;
    MYSQL *db;
    MYSQL_STMT *st;
    const char *sql;
    int status; /* what the call waits for; 0 once it is over */
    int ret;
    my_bool bret;
    MYSQL *cret;
    MYSQL_RES *res;
};


/*
 * A mode: what a held lock is and where its token comes from, picked once
 * at open (as curl picks a protocol handler): no recipe asks which mode it
 * runs in. open sets up the store and the first session; close (may be
 * NULL) frees what the mode keeps beyond the pool and the control session.
 */
struct mysql_mode {
    int (*open)(struct mysql_conn *mc);
    void (*close)(struct mysql_conn *mc);
    int (*acquire)(struct mysql_conn *mc, const dlock_request *req, dlock_held **heldp);
    int (*release)(struct mysql_conn *mc, dlock_held *held);
    int (*renew)(struct mysql_conn *mc, dlock_held *held, uint32_t ttl_ms);
    int (*keep)(struct mysql_conn *mc, dlock_held *held, uint32_t ttl_ms);
    int (*ping)(struct mysql_conn *mc);
    int (*raise_token)(struct mysql_conn *mc, dlock_held *held, uint64_t floor);
    int (*token_top)(struct mysql_conn *mc, uint64_t *top);
    int (*raise_floor)(struct mysql_conn *mc, uint64_t floor);
    int (*inspect)(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info);
    /* NULL: the one holder inspect tells (mc_one_holder). */
    int (*inspect_holders)(struct mysql_conn *mc, const char *name, size_t len,
                           dlock_holder *holders, size_t capacity, size_t *count);
    /* Elections (mysql_elect.c): publish, leader; wake may be NULL (lock=row:
     * a release rolls the value back by itself). */
    int (*publish)(struct mysql_conn *mc, dlock_held *held, const void *value, size_t len);
    int (*leader)(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info,
                  char *value, size_t *value_len);
    int (*wake)(struct mysql_conn *mc, const char *name, size_t len);
    unsigned caps_off; /* capabilities the mode lacks (lock=named: shared, semaphores) */
    const struct row_source *row; /* row locks: the token source (mysql_row.c) */
    const struct row_view *view;  /* row locks: inspect's part of it (mysql_inspect.c) */
};

extern const struct mysql_mode mc_row_table_mode; /* mysql_row.c */
extern const struct mysql_mode mc_row_seq_mode;   /* mysql_row.c */
extern const struct mysql_mode mc_named_mode;     /* mysql_named.c */

static inline dlock_client *cl(struct mysql_conn *mc)
{
    return mc->base.client;
}

/* ---- mysql_conn.c: errors, bounds, the driver, sessions, the pool ------- */

unsigned mc_ceil_s(uint64_t ms);
int mc_fail_on(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, const char *what);
struct bound mc_stmt_bound(const struct bound *call, uint64_t ms);
int mc_no_reply(struct mysql_conn *mc, struct session *s, const char *what, uint64_t start,
                int late);
void mc_nb_step(struct nb *c, int ev);
int mc_nb_wait(struct nb *c, uint64_t until_ns, int intr, int cancel_fd);
int mc_nb_finish(struct nb *c, uint64_t until_ns, int intr);
int mc_nb_failed(const struct nb *c);
int mc_run(struct mysql_conn *mc, struct session *s, enum nb_op op, MYSQL_STMT *st,
           const char *sql, const struct bound *b, const char *what);
void mc_session_disconnect(struct session *s);
void mc_session_close(struct session *s);
int mc_session_connect(struct mysql_conn *mc, enum session_role role, struct bound *call,
                       struct session *s);
int mc_session_open(struct mysql_conn *mc, enum session_role role, struct bound *call,
                    struct session **out);
int mc_prepare(struct mysql_conn *mc, struct session *s, enum stmt_id id,
               const struct bound *b, MYSQL_STMT **out);
int mc_exec_sql(struct mysql_conn *mc, struct session *s, const char *sql,
                const struct bound *call, const char *what);
int mc_query_until(struct mysql_conn *mc, struct session *s, const char *sql, uint64_t until_ns,
                   const char *what);
int mc_query_result(struct mysql_conn *mc, struct session *s, const char *sql,
                    const struct bound *b, const char *what, MYSQL_RES **out);
int mc_ctl_session(struct mysql_conn *mc, struct bound *call, struct session **out);
int mc_ctl_dropped(struct mysql_conn *mc);
int mc_ctl_exec(struct mysql_conn *mc, enum stmt_id id, MYSQL_BIND *params, int rows,
                struct bound *call, const char *what, MYSQL_STMT **stp);
int mc_ctl_lock_timed_out(const struct mysql_conn *mc);
int mc_ctl_query_u64(struct mysql_conn *mc, const char *sql, struct bound *call,
                     const char *what, uint64_t *v, int *isnull);
void mc_pool_drain(struct mysql_conn *mc);
int mc_pool_get(struct mysql_conn *mc, struct bound *call, struct session **out, int *pooled);
void mc_pool_put(struct mysql_conn *mc, struct session *s);
void mc_rollback_and_pool(struct mysql_conn *mc, struct session *s, uint64_t until_ns);
/* The end of a cleanup (ending a wait, letting go after a failure):
 * CLEANUP_MS from now, and never past a deadline wait's deadline +
 * CLEANUP_MS (req NULL or no deadline: from now alone). */
uint64_t mc_cleanup_until(const dlock_request *req);
void mc_bind_bytes(MYSQL_BIND *b, const void *p, unsigned long *len);
void mc_bind_u64(MYSQL_BIND *b, unsigned long long *v);
int mc_pause_ms(struct mysql_conn *mc, uint64_t ms, uint64_t until_ns, int cancel_fd);
int mc_lease_over(struct mysql_conn *mc, uint32_t ttl_ms, const char *what);
char *mc_with_table(const char *tmpl, const char *table);
int mc_ping_ctl(struct mysql_conn *mc);
int mc_ping_pooled(struct mysql_conn *mc);
int mc_one_holder(const dlock_info *info, dlock_holder *holders, size_t capacity, size_t *count);

/* ---- mysql_inspect.c: inspect of row locks ------------------------------ */

/* What inspect does differently per token source (mysql_inspect.c). */
struct row_view {
    /* inspect's statement (without its ORDER BY): its length, as snprintf. */
    int (*inspect_sql)(struct mysql_conn *mc, const char *kx, int mariadb, char *sql,
                       size_t size);
    /* Whether the row is locked, asked of the row; NULL: the views' grant says. */
    int (*held)(struct mysql_conn *mc, struct session *ctl, const char *kx, int mariadb,
                const struct bound *b, int *locked);
    unsigned known; /* what inspect knows beyond DLOCK_KNOWS_HELD */
    /* leader(): the table holding the grant ("_grants": <table>_grants;
     * "": the lock row), and what its row needs to be a live grant. */
    const char *grant_table, *grant_live;
};

extern const struct row_view mc_table_view, mc_seq_view;
int mc_row_inspect(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info);
int mc_row_inspect_holders(struct mysql_conn *mc, const char *name, size_t len,
                           dlock_holder *holders, size_t capacity, size_t *count);

/* ---- mysql_elect.c: elections ------------------------------------------ */

/* Creates <table>_leaders (CREATE TABLE IF NOT EXISTS) on the control
 * session: the first publish in a store made before elections. */
int mc_elect_table(struct mysql_conn *mc);
/* What publish writes: the value of the election whose key is k (lock=row:
 * SHA-256 of the name; lock=named: of its user lock), with its grant's
 * token, owner id ("" where the grant keeps it) and TTL; guard: SQL after
 * "FROM DUAL" that fails the statement (or writes nothing) when the
 * writing session no longer holds the lock. */
struct elect_pub {
    const unsigned char *k;
    uint64_t token;
    const char *owner;
    uint32_t ttl_ms;
    const void *value;
    size_t len;
    const char *guard;
};
/* Publishes p on the holder's session s, by b. *no_table: the table is
 * missing (0 returned): mc_elect_table, then publish again (with *no_table
 * still set: a missing table is then an error). */
int mc_elect_publish(struct mysql_conn *mc, struct session *s, const struct elect_pub *p,
                     const struct bound *b, int *no_table);
/* mc_elect_publish, making the table first when it is missing: for a
 * session that may wait for a connect of the control session. */
int mc_elect_publish_on(struct mysql_conn *mc, struct session *s, const struct elect_pub *p,
                        const struct bound *b);
/* The lease of a leader's value row: its ttl_ms column, the server's text
 * (NULL: no row). */
void mc_elect_lease(const char *ttl_ms, dlock_info *info);
/* sql's result on the control session at READ UNCOMMITTED (*ctlp: the
 * session it ran on, for its last_errno; ER_NO_SUCH_TABLE: no leaders'
 * table yet). */
int mc_elect_read(struct mysql_conn *mc, const char *sql, struct bound *call,
                  struct session **ctlp, MYSQL_RES **res);
/* Column col of row as the leader's value (*value_len 0 when NULL). */
void mc_elect_value(MYSQL_RES *res, MYSQL_ROW row, int col, char *value, size_t *value_len);
int mc_elect_row_leader(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info,
                        char *value, size_t *value_len);

/* ---- mysql_seq.c: the tables, the sequence and its durable mark --------- */

/* <table>, <table>_grants, <table>_shared ("@T": the table) */
extern const char *const mc_create_sql[3];
int mc_shared_table(struct mysql_conn *mc, struct bound *call);
/* Who holds a name in a mode (<table>_shared's rows): readers, permits,
 * the permits' smallest and largest limit, the oldest permit's token. */
struct shared_kinds {
    unsigned long readers, permits, min_lim, max_lim;
    uint64_t oldest; /* the oldest permit's token */
};
void mc_gate_name(struct mysql_conn *mc, const unsigned char *k, char out[65]);
int mc_shared_kinds(struct mysql_conn *mc, const char *kx, struct session *on, int passing,
                    struct bound *call, struct shared_kinds *kinds);
int mc_shared_read(struct mysql_conn *mc, struct session *ctl, const char *kx,
                   struct bound *call, dlock_holder *holders, size_t capacity, size_t *count,
                   dlock_holder *last);
int mc_seq_open(struct mysql_conn *mc, enum session_role role, const char *what,
                struct session *s);
int mc_seq_checkpoint(struct mysql_conn *mc, struct bound *call, uint64_t *mark);
int mc_seq_mark_read(struct mysql_conn *mc, struct session *s, uint64_t token,
                     struct bound *call, int *behind, uint64_t *replied);
int mc_seq_mark_past(struct mysql_conn *mc, uint64_t token, struct bound *call);
int mc_seq_durable(struct mysql_conn *mc, struct session *s, uint64_t token,
                   struct bound *call, uint64_t *replied);
int mc_seq_floor_check(struct mysql_conn *mc, uint64_t floor);
int mc_seq_token_top(struct mysql_conn *mc, uint64_t *top);
int mc_seq_raise_floor(struct mysql_conn *mc, uint64_t floor);
int mc_store_mode(struct mysql_conn *mc, int *exists);
int mc_store_mode_record(struct mysql_conn *mc, int mode, int replace);

#endif
