/*
 * mysql://[user[:password]@]host[:port]/database[?options] (also mariadb://):
 * locks are InnoDB rows, through MariaDB Connector/C (libmariadb). The
 * server may be MariaDB (10.3 or later) or MySQL (8.0 or later).
 *
 * A held lock is an open transaction holding the row lock of its name in
 * <table>; rolling the transaction back releases it, and so does the
 * server when the session ends. Waiters block in InnoDB's own lock queue,
 * which grants the row to the next waiter inside the releaser's ROLLBACK:
 * no polling, no herd, no barging.
 *
 * Two ways to take the row and its fencing token, option token: table
 * (the default) or sequence (MariaDB 10.3+; MySQL has no sequences). Every
 * client of a store must use the same: tokens of one are not ordered with
 * the other's. token=sequence is not the default because its tokens are
 * one counter for every name: they grow with all the store's grants (and
 * a raise of one name raises all), so a list that also holds a ZooKeeper
 * lock, whose tokens cannot be raised, fails once they pass ZooKeeper's
 * transaction ids; token=table counts per name.
 *
 * token=sequence. One statement on the lock's session takes the row lock
 * and the token: UPDATE <table> SET token = LAST_INSERT_ID(NEXTVAL(
 * <table>_seq)), owner, session_id, acquired_at WHERE k = ? (see
 * lock_row_seq). UPDATE queues for the row's exclusive lock as FOR UPDATE
 * does and evaluates NEXTVAL once granted, so tokens grow in grant order;
 * the reply's insert id is the token: one round trip, and a release is one
 * ROLLBACK, which undoes the row's columns but not the sequence. NEXTVAL
 * commits nothing: the server writes the sequence's table once per 1000
 * values (CACHE), and after a restart starts again from the end of the
 * last range written, skipping values. But it writes it without writing
 * the redo log (a crash within InnoDB's next once-a-second flush loses
 * it: seen here, a SIGKILL brought a sequence back 1100 values), so a
 * token from a range not yet known on disk waits for a commit of a mark
 * past it (seq_durable): one commit per range, i.e. per 1000 grants of the
 * store (plus one per client per range it first meets, to read the mark:
 * a round trip on the lock session), from a session opened for it, not
 * one per grant. Tokens are then as durable as a commit
 * (innodb_flush_log_at_trx_commit). A deadline grant that has to wait for
 * that commit gets `timeout` for it past the grant (the only case where a
 * deadline wait may return later than its deadline + 200 ms). One sequence for all names: a name's
 * tokens grow, with gaps. A try is the same statement under SET STATEMENT
 * innodb_lock_wait_timeout = 0, a deadline under max_statement_time = what
 * is left of it (MariaDB ends the lock wait then, to the millisecond): no
 * control session to end a wait. A name's row is created on the lock session at its first use
 * (INSERT IGNORE, committed). So a client opens one session, used for the
 * first lock; each lock held or waited for has a session of its own; the
 * control session is opened only for raise_floor, token_top, inspect,
 * and to KILL QUERY a wait interrupted by a signal or cancelled (or one
 * the server failed to end by its max_statement_time), and for a moment
 * to commit the durable mark; ping uses an idle lock session. The sequence is
 * created, with the lock table's token columns, by the first client that
 * needs them (an older store's <table> gets them with ALTER TABLE ... ADD
 * COLUMN, instant but waiting for a metadata lock behind held locks: at
 * most 1 s, then the open fails with DLOCK_ESTORE), and starts above every
 * token <table>_grants ever recorded.
 *
 * token=table (MySQL 8's path, and the only one before issue 13). The
 * lock is `SELECT 1 FROM <table> WHERE k = ? FOR UPDATE`. Its token must be
 * committed while the lock is held (a holder that dies rolls back its
 * transaction, and the next holder must still get a higher token), but the
 * lock row is locked by the holder's own open transaction. So the token
 * lives in another table, <table>_grants, and an autocommit "control"
 * session bumps it right after the grant, one round trip: INSERT ... ON
 * DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), then one more on
 * the lock session proves it lived through the bump (a commit, so a
 * redo-log write, per grant). The control session also creates rows and
 * sends KILL QUERY to end a wait at its deadline: a client has it from its
 * open, plus a session per lock held or waited for.
 *
 * Sessions. One transaction per session, so every held lock has its own
 * session (releasing one lock must not release another); a client keeps a
 * small pool of idle lock sessions (IDLE_SESSIONS_MAX). lock=named shares
 * them (below).
 *
 * lock=named (MariaDB; option lock: row, the default, or named). A lock is
 * a user lock, GET_LOCK, not a row lock: a session holds any number of
 * them and releases each alone (RELEASE_LOCK), so held locks share
 * sessions, as PostgreSQL's advisory locks do (backends/postgres.c), and a
 * client can hold 10 000 locks. Its tokens come from token=sequence's
 * sequence and durable mark (seq_durable), so lock=named implies
 * token=sequence (token=table is refused, DLOCK_EBADURI; MySQL, without
 * sequences, DLOCK_ENOTSUP). Every client of a store must use the same
 * lock option: a user lock and a row lock of one name do not exclude each
 * other. The user lock's name is "dlock:" and 58 hex digits of
 * SHA-256(SHA-256(database 0x00 table) || SHA-256(name)): MariaDB's user
 * locks are server-wide, 64 characters at most. An acquire is one
 * statement: SELECT IF(GET_LOCK(n, t) = 1, NEXTVAL(seq), 0), NEXTVAL being
 * evaluated only once the lock is granted (a refused GET_LOCK takes no
 * value): one round trip, tokens in grant order. t is 0 for a try, what is
 * left of a deadline (GET_LOCK takes fractions of a second; the client
 * waits CLEANUP_MS more for the answer), a year (its maximum) without one;
 * a wait cut short by a signal, a cancel or a server that did not end it
 * in time has its session killed (KILL from the control session) and closed, so
 * whatever it got is freed. The lock table keeps only the durable mark's
 * row: names get no rows. GET_LOCK waiters are served first-come
 * first-served (MariaDB's metadata lock queue), and a GET_LOCK(n, 0) never
 * overtakes them.
 *
 * lock=named sessions. A try runs on a "holder session" whose lease
 * (wait_timeout) is the same whole number of seconds, holding fewer than
 * NAMED_LOCKS_MAX (256) locks and not the name already (GET_LOCK nests on
 * one session: a second grant there would exclude nothing), and the grant
 * stays there. A blocking wait cannot run on a holder session (its locks'
 * renewals and releases would queue behind it): it first tries on a holder
 * session (unless its deadline is nearer than `timeout`: a bound that ran
 * out would close the shared session), and only if the lock is taken
 * waits on a session that holds nothing, which then becomes a holder
 * session. So a client's sessions are ceil(H / 256) per lease for H locks
 * taken without queueing, plus one per wait in progress or per waited
 * lock's session, plus up to IDLE_SESSIONS_MAX that hold nothing, plus the
 * control session when opened (raise_floor, token_top, inspect, ping,
 * a KILL; for a moment for the durable mark). A lock never moves; a
 * session that ends (its lease, a KILL, a restart, no reply in time:
 * closed) takes every lock on it, and each reports DLOCK_ELOST on renew,
 * keep and release. A wait whose session the server dropped queues again
 * on a new session if the server restarted since the wait began (its
 * uptime, read on another session, says so; while it does not answer,
 * tried every 100 ms to 1 s until the deadline, or for connect_timeout),
 * not if the session was killed alone. Any statement restarts a
 * session's idle timer, so renewing one lock prolongs its mates on the
 * server; so every use of a session (a try, a
 * renewal, keep(), a release) first releases its other locks whose
 * client-side lease has ended (their handles then report DLOCK_ELOST),
 * EXPIRE_BATCH (64) at most per use, in one statement. Renew (and keep,
 * raise_token) is one statement that proves the lock and sets the
 * session's lease: SET SESSION wait_timeout = IF(IS_USED_LOCK(n) =
 * CONNECTION_ID(), L, NOT_OURS), L the longest TTL (rounded up) among the
 * session's live locks, so a renewal also lowers the session's lease once
 * its longest-lived mate is gone (a release alone does not: until the next
 * renewal on the session, the server keeps the remaining mates up to the
 * released lock's lease; their client-side leases are unchanged). Release
 * is SET @dlock_released = IF(RELEASE_LOCK(n) = 1, 1, NOT_OURS): an OK
 * when it was ours, else DLOCK_ELOST. NOT_OURS fails the statement (a
 * subquery of two rows) only where it is evaluated. Any statement that
 * fails after GET_LOCK may have granted (NEXTVAL out of values, a result
 * that could not be read) is followed by RELEASE_LOCK(n) (the session did
 * not hold n before), or the session is closed. On a session with other
 * live locks every statement gets a `timeout` of its own, counted once
 * the session's mutex is taken (no reply in time closes the session and
 * loses them all), so a try there may take more than one `timeout`.
 * Threads: each session has a mutex, held around each exchange on it (see
 * "named locks" below); keep() may wait for it while the application's
 * thread uses the same session, which is at most 5 exchanges (a try:
 * releasing stale mates, GET_LOCK, reading its result, the durable mark's
 * read, undoing a grant that failed; raise_token 3; release, renew 2),
 * each bounded by `timeout` (the durable mark's checkpoint, on the control
 * session, runs with the mutex unlocked), and then needs 2 more itself:
 * up to 7 x `timeout` when the server is slow but answering. A renewal
 * whose reply comes after the lock's lease end reports DLOCK_EEXPIRED for
 * that lock alone; keep a kept lock's TTL above 11 x `timeout` (the
 * keeper renews with two thirds of it left) to ride through that.
 * raise_token, raise_floor and token_top are token=sequence's. inspect (control
 * session, one statement): held, from IS_USED_LOCK, with the holder
 * named "session <connection id>" (the owner id, token and lease are
 * known to the holder's session only); the waiters, the sessions running
 * GET_LOCK of the name (information_schema.PROCESSLIST: other users'
 * sessions need the PROCESS privilege), the longest waiting first
 * (TIME_MS); no last token of a free name.
 *
 * Lease. The holding session is the lease: its wait_timeout is the TTL
 * rounded up to whole seconds, so a holder that stops talking (paused,
 * partitioned, dead) has its session closed by the server, which rolls the
 * transaction back. Renew is one SET of wait_timeout (it also resets the
 * idle timer). The client also remembers the TTL on CLOCK_MONOTONIC, so a
 * renew or release after it reports DLOCK_ELOST even within the rounding.
 *
 * Deadlines. token=sequence: max_statement_time ends the wait on the
 * server at the deadline (and innodb_lock_wait_timeout is its maximum, so
 * a dead waiter leaves the queue at its deadline); the client waits for
 * that answer until CLEANUP_MS past it. token=table, and a wait cut short
 * by a signal: innodb_lock_wait_timeout counts whole seconds, so it is set
 * to cover the deadline (a server-side backstop) and the wait itself runs
 * on the non-blocking API, polling the socket until the exact deadline;
 * then the control session sends KILL QUERY, and the transaction is rolled
 * back, all within CLEANUP_MS (200 ms) past the deadline: what is not done
 * by then is abandoned by closing the session (the server rolls back when
 * it sees the connection closed, and ends a wait still queued at its
 * innodb_lock_wait_timeout).
 *
 * Cancelling (DLOCK_CAP_CANCEL). Every lock wait (the locking read, the
 * sequence's UPDATE, GET_LOCK) polls the request's cancel fd beside the
 * socket, and so do the pauses between reconnects of a wait whose server
 * went away. A cancel ends the wait as a signal does, then DLOCK_ECANCELED:
 * a row lock's wait gets KILL QUERY from the control session (opened if
 * need be) and a rollback (undoing a grant that came in that instant), and
 * its session is pooled, all within CLEANUP_MS, else the session is closed
 * (a wait without a deadline then stays queued on the server until the row
 * reaches it); a GET_LOCK's session is killed (KILL) and closed, which
 * frees whatever it got.
 *
 * Bounds. Every exchange with the server, the connect included, runs on
 * the non-blocking API with a bound of dlock's own, to the millisecond
 * (Connector/C's own timeouts count whole seconds): a connect by
 * connect_timeout, a statement by `timeout`, and both by the caller's
 * deadline when it is sooner (DLOCK_ETIMEDOUT then); a try's statements
 * share one `timeout` (plus the time spent connecting). No reply in time
 * closes the session (its socket shut first, so closing never waits); the
 * server rolls back once it notices, at the latest after the session's
 * wait_timeout. A session that timed out is never retried on a new one
 * (the retry would wait as long again); one the server dropped is. A wait
 * without a deadline has no client-side bound: TCP keepalives (idle 5 s,
 * every 2 s, 3 probes) end it about 11 s after the peer host or the
 * network died, and TCP_USER_TIMEOUT (= timeout) fails a connection whose
 * sent data stays unacknowledged. lock=named: a statement on a session
 * that other held locks share gets a whole `timeout` of its own (above).
 *
 * Restarts. A wait whose session the server dropped is queued again on a
 * new session once the server answers, if the control session was
 * dropped too (a restart, a broken connection; token=sequence, without a
 * control session: if a new session cannot connect at once), until the
 * deadline (or for connect_timeout without one); a session killed alone
 * (KILL) while the server kept answering is reported, not waited on again.
 * A pooled session idle for a second or more may have been dropped for
 * idleness (wait_timeout): a failure on it is retried once on a new one.
 *
 * Keeping. keep() renews on the lock's own session (SET SESSION
 * wait_timeout), bounded by the timeout and the lease's end (lock=named:
 * by the lease's end only when the lock is alone on its session; among
 * mates a late reply is DLOCK_EEXPIRED for that lock, the session kept),
 * and touches nothing else: the pool and the control session belong to
 * the application's thread. A grant counts its lease from the last reply
 * on its session (token=sequence, lock=named: the grant's, or the durable
 * mark's read there), where the server's idle timer started, not after
 * the mark's checkpoint on the control session.
 *
 * Raising the token (raise_token, a floor carried over from another
 * store): the lock's session proves the row lock is still ours, then
 * token=table: the control session sets token = GREATEST(token, floor) in
 * autocommit, only where the grants row still names the lock's session;
 * token=sequence: SETVAL(seq, floor) on the lock's session (SETVAL never
 * moves a sequence back, and is not undone by a rollback). Two round
 * trips.
 *
 * Store-wide floor and top (raise_floor, token_top: dlock migrate).
 * token=sequence: the floor is SETVAL(seq, floor) (written to the
 * sequence's table when beyond the cached range), the top the sequence's
 * next_not_cached_value - 1 (an upper bound: up to the cache above the
 * last grant). token=table: the floor is a row of <table>_grants with the all-zero key (FLOOR_K, owner
 * 'floor', session_id 0; no name's SHA-256 is all zeros), set by the
 * control session in autocommit to GREATEST(token, floor): as durable as
 * the grants' bumps (innodb_flush_log_at_trx_commit). Every grant's
 * statement reads it (with a shared row lock, InnoDB's for a subquery of
 * an INSERT) and takes GREATEST(name's token + 1, floor + 1): one primary
 * key lookup more, no round trip. The top is MAX(token) over
 * <table>_grants (a scan; the floor row included). A store whose tables
 * predate the floor has no floor row: floor 0.
 *
 * Inspect (be_inspect) takes, waits for and probes no lock: one
 * autocommit statement on the control session. token=sequence reads the
 * lock row's grant at READ UNCOMMITTED (owner, token and session_id are
 * written by the holder's UPDATE and rolled back by its release: an owner
 * means a live holder), with the waiters as below (their sessions running
 * the locking UPDATE); it knows no token of a free name (no
 * DLOCK_KNOWS_LAST_TOKEN). token=table joins the name's row of
 * <table>_grants (token, owner, session_id: a consistent read) with
 * InnoDB's transaction views, which need the PROCESS privilege
 * (information_schema.INNODB_TRX; without it MariaDB and MySQL fail with
 * error 1227, and inspect returns DLOCK_ENOTSUP saying so: GRANT PROCESS
 * ON *.* TO user). Held: the row is locked, asked of the row itself by a
 * shared NOWAIT locking read (row_locked), since the views are a snapshot
 * that concurrent readers keep stale. The views find the holder's
 * transaction for its waiters: the grants row's session has a RUNNING
 * InnoDB transaction holding rows, started before the grant was recorded,
 * and no later grant of another name names that session (a released
 * lock's session rolled back; a pooled session may hold another name). Waiters
 * (MariaDB: information_schema.INNODB_LOCK_WAITS): the transactions in
 * LOCK WAIT that the holder's transaction blocks (a lock session holds
 * only its one row lock), named "session <thread id>" (a waiter's owner
 * id is stored only at its grant), in queue order (how many transactions
 * each waits behind); one whose session is no longer running its lock
 * statement (information_schema.PROCESSLIST, live) gave up and is not
 * counted. MySQL 8 has no INNODB_LOCK_WAITS (performance_schema's
 * data_lock_waits instead, not used): held, owner and tokens only there.
 * InnoDB's views are a snapshot refreshed once nobody read them for 0.1 s:
 * a grant recorded less than 0.12 s before is checked again 0.11 s later
 * (within `timeout`); clients reading them every 0.1 s keep them stale,
 * so waiters can show late. Not known:
 * the lease (the holder session's wait_timeout is visible only to
 * itself). Tokens: the token column is the latest grant's as raised by
 * raise_token (a list's acquire raises a store to the list's token, which
 * is then the lock's token): inspect reports that value, not the one the
 * store granted before the raise (not kept). Also: for the round trip
 * between a grant and its record, and for a row lock taken outside dlock,
 * the grants row names the previous grant (free, or its holder); a lease
 * counts whole seconds on the server, so a lock whose client-side lease
 * ended stays held up to a second longer. Reading the views and checking
 * the session's later grants scan them and <table>_grants.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <errmsg.h>
#include <mysql.h>
#include <mysqld_error.h>

#include "config.h"
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
#define IDLE_SESSIONS_MAX 4
/* lock=named: locks sharing one session at most. A session that ends takes
 * them all, and every use of it scans its list. */
#define NAMED_LOCKS_MAX 256
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

static const char *const mysql_schemes[] = {"mysql", "mariadb", NULL};
static const char *const mysql_options_list[] = {
    "connect_timeout", "timeout", "table", "socket", "tls", "tls_ca", "tls_cert", "tls_key", "token",
    "lock", NULL,
};

enum stmt_id {
    ST_LOCK_WAIT, ST_LOCK_NOWAIT, ST_CREATE_ROW, ST_GRANT, ST_RAISE, ST_TOP, ST_FLOOR, N_STMTS
};

/* The row of <table>_grants that holds the store's floor (raise_floor): a
 * key no name has (names' keys are SHA-256 digests). */
#define FLOOR_K "X'0000000000000000000000000000000000000000000000000000000000000000'"

/* "@T" stands for the lock table's name. */
static const char *const stmt_sql[N_STMTS] = {
    [ST_LOCK_WAIT] = "SELECT 1 FROM `@T` WHERE k = ? FOR UPDATE",
    [ST_LOCK_NOWAIT] = "SELECT 1 FROM `@T` WHERE k = ? FOR UPDATE NOWAIT",
    [ST_CREATE_ROW] = "INSERT IGNORE INTO `@T` (k, name, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))",
    /* The floor row is read in the same statement (a derived table:
     * MySQL refuses a plain subquery on the table inserted into; CAST:
     * the derived value is signed), and the token is the larger of the
     * name's token + 1 and the floor + 1. */
    [ST_GRANT] = "INSERT INTO `@T_grants` (k, token, owner, session_id, acquired_at) "
                 "VALUES (?, LAST_INSERT_ID(1 + CAST(COALESCE((SELECT m FROM (SELECT MAX(token)"
                 " AS m FROM `@T_grants` WHERE k = " FLOOR_K ") AS f), 0) AS UNSIGNED)), ?, ?,"
                 " UTC_TIMESTAMP(6)) "
                 "ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1,"
                 " VALUES(token))), owner = ?, session_id = ?, acquired_at = UTC_TIMESTAMP(6)",
    /* Matches only while the latest grant recorded is the holder's own
     * (session_id); LAST_INSERT_ID(expr) hands back the counter, and 0 when
     * no row matched (the expression never ran). */
    [ST_RAISE] = "UPDATE `@T_grants` SET token = LAST_INSERT_ID(GREATEST(token, ?)) "
                 "WHERE k = ? AND session_id = ?",
    [ST_TOP] = "SELECT COALESCE(MAX(token), 0) FROM `@T_grants`",
    [ST_FLOOR] = "INSERT INTO `@T_grants` (k, token, owner, session_id, acquired_at) "
                 "VALUES (" FLOOR_K ", ?, 'floor', 0, UTC_TIMESTAMP(6)) "
                 "ON DUPLICATE KEY UPDATE acquired_at = IF(token < VALUES(token),"
                 " UTC_TIMESTAMP(6), acquired_at), token = GREATEST(token, VALUES(token))",
};

/* token=sequence: the holder's grant, written by its locking statement and
 * never committed (a release rolls it back): visible only to READ
 * UNCOMMITTED readers, i.e. inspect, while the lock is held; owner '' when
 * free. Fixed-size and NOT NULL, so that a grant and its rollback update
 * the row in place: a change of the record's size makes InnoDB move every
 * lock queued on it (a hundred waiters made a rollback take 0.2 s). */
#define LOCK_COLUMNS                                                                              \
    " token BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'token=sequence: the holder''s token',"    \
    " owner CHAR(32) CHARACTER SET ascii NOT NULL DEFAULT ''"                                     \
    " COMMENT 'token=sequence: the holder''s owner id',"                                          \
    " session_id BIGINT UNSIGNED NOT NULL DEFAULT 0"                                              \
    " COMMENT 'token=sequence: the holder''s CONNECTION_ID()',"                                   \
    " acquired_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00'"                            \
    " COMMENT 'token=sequence: the grant, UTC'"

/* A lock table created before token=sequence gets its columns (instant in
 * MariaDB 10.3+: metadata only). Its metadata lock waits for every
 * transaction on the table, i.e. every held lock, and makes new statements
 * on it wait behind it: at most 1 s. */
static const char add_columns_sql[] =
    "SET STATEMENT lock_wait_timeout = 1 FOR ALTER TABLE `@T` ADD COLUMN IF NOT EXISTS token BIGINT UNSIGNED NOT NULL DEFAULT 0,"
    " ADD COLUMN IF NOT EXISTS owner CHAR(32) CHARACTER SET ascii NOT NULL DEFAULT '',"
    " ADD COLUMN IF NOT EXISTS session_id BIGINT UNSIGNED NOT NULL DEFAULT 0,"
    " ADD COLUMN IF NOT EXISTS acquired_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00'";

static const char *const create_sql[] = {
    "CREATE TABLE IF NOT EXISTS `@T` ("
    " k BINARY(32) NOT NULL PRIMARY KEY COMMENT 'SHA-256 of the lock name',"
    " name VARBINARY(255) NOT NULL COMMENT 'the name, cut to 255 bytes, for people',"
    " created_at DATETIME(6) NOT NULL COMMENT 'UTC'," LOCK_COLUMNS
    ") ENGINE=InnoDB COMMENT='dlock: one row per lock name, row-locked by its holder'",
    "CREATE TABLE IF NOT EXISTS `@T_grants` ("
    " k BINARY(32) NOT NULL PRIMARY KEY COMMENT 'SHA-256 of the lock name',"
    " token BIGINT UNSIGNED NOT NULL COMMENT 'fencing token of the latest grant',"
    " owner CHAR(32) CHARACTER SET ascii NOT NULL COMMENT 'owner id of the latest grant',"
    " session_id BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of the holding session',"
    " acquired_at DATETIME(6) NOT NULL COMMENT 'UTC'"
    ") ENGINE=InnoDB COMMENT='dlock: latest grant of each lock, committed at grant time'",
};

struct mysql_held;

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
    /* lock=named (see "named locks" below): */
    pthread_mutex_t mu;        /* around each exchange and what keep() reads */
    int waiting;               /* a blocking GET_LOCK runs on it: not shared */
    size_t nheld;              /* handles pointing to it */
    struct mysql_held *held;   /* those handles */
    unsigned pending_s;        /* the lease (s) of a grant on it not yet handed
                                  out (its mark being committed, mu unlocked):
                                  a renewal must not set a shorter one */
};

struct mysql_conn {
    dlock_conn base;
    char *host, *user, *password, *database, *socket, *table;
    char *tls_ca, *tls_cert, *tls_key;
    unsigned port;
    int tls; /* 0 off, 1 encrypt, 2 encrypt and verify the server */
    int ctl_dropped; /* the control session broke: its next open is a reconnect */
    int token_opt;   /* option token: 0 absent (table), 1 table, 2 sequence */
    int seq;         /* token=sequence: lock and token in one statement */
    uint64_t durable; /* token=sequence: every token below it is on disk (seq_durable) */
    int named;       /* lock=named: GET_LOCK, held locks share sessions */
    unsigned char salt[DLOCK_SHA256_LEN]; /* lock=named: SHA-256 of database, table */
    struct session **nsess; /* lock=named: every session, holding or free */
    size_t nn, ncap;
    uint64_t connect_ms, timeout_ms;
    char where[128];        /* "host:port" or the socket path, for messages */
    char *sql[N_STMTS];
    struct session *ctl;    /* autocommit control session; NULL after it dropped */
    struct session *idle;   /* pool of idle lock sessions */
    unsigned nidle;
};

struct mysql_held {
    dlock_held base;
    struct session *s;      /* holding session; NULL once the lock is lost */
    unsigned char k[DLOCK_SHA256_LEN];
    uint32_t ttl_ms;
    uint64_t expires_ns;    /* end of the lease as the client sees it */
    /* lock=named: */
    char lname[7 + 58];     /* "dlock:" + 58 hex digits */
    int gone;               /* let go on its session after its lease ended */
    struct mysql_held *prev, *next; /* its session's handles */
};

static dlock_client *cl(struct mysql_conn *mc)
{
    return mc->base.client;
}

/* lock=named (see "named locks" below). */
static int named_acquire(struct mysql_conn *mc, const dlock_request *req, dlock_held **heldp);
static int named_release(struct mysql_conn *mc, struct mysql_held *h);
static int named_renew(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms);
static int named_keep(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms);
static int named_raise(struct mysql_conn *mc, struct mysql_held *h, uint64_t floor);
static int named_inspect(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info);

static unsigned ceil_s(uint64_t ms)
{
    uint64_t s = (ms + 999) / 1000;
    return s == 0 ? 1 : s > LOCK_WAIT_MAX_S ? LOCK_WAIT_MAX_S : (unsigned)s;
}

/* ---- errors ------------------------------------------------------------- */

/* The session is gone: killed, timed out by wait_timeout, server restarted. */
static int session_dropped(unsigned e)
{
    return e == CR_SERVER_GONE_ERROR || e == CR_SERVER_LOST || e == CR_SERVER_LOST_EXTENDED ||
           e == ER_CONNECTION_KILLED || e == ER_SERVER_SHUTDOWN ||
           e == ERR_CLIENT_INTERACTION_TIMEOUT || e == CR_CONN_HOST_ERROR ||
           e == CR_CONNECTION_ERROR;
}

static int map_errno(unsigned e)
{
    switch (e) {
    case ER_ACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ERR_ACCESS_DENIED_NO_PASSWORD:
    case CR_AUTH_PLUGIN_CANNOT_LOAD:
        return DLOCK_EAUTH;
    case ER_LOCK_WAIT_TIMEOUT:
        return DLOCK_ETIMEDOUT;
    case ERR_LOCK_NOWAIT:
        return DLOCK_EBUSY;
    case ER_LOCK_DEADLOCK:
        return DLOCK_EDEADLK;
    case CR_OUT_OF_MEMORY:
        return DLOCK_ENOMEM;
    case CR_COMMANDS_OUT_OF_SYNC:
    case CR_MALFORMED_PACKET:
        return DLOCK_EPROTO;
    case CR_UNKNOWN_HOST:
    case CR_SSL_CONNECTION_ERROR:
    case ER_CON_COUNT_ERROR:
    case ER_TOO_MANY_USER_CONNECTIONS:
        return DLOCK_ECONNECT;
    default:
        return session_dropped(e) ? DLOCK_ECONNECT : DLOCK_ESTORE;
    }
}

/* Records the last error of s (of its statement st when given), and
 * whether it means the session itself is gone. */
static int fail_on(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, const char *what)
{
    int sys = errno; /* Connector/C leaves ETIMEDOUT there after a read or write timeout */
    unsigned e = st ? mysql_stmt_errno(st) : mysql_errno(s->db);
    s->last_errno = e;
    if (session_dropped(e))
        s->dead = 1;
    if (e == CR_SERVER_LOST && sys == ETIMEDOUT) {
        s->silent_ms = ceil_s(mc->timeout_ms) * 1000ull;
        return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                            "mysql %s: %s: the server did not answer (the connection timed out:"
                            " unacknowledged data or keepalive probes); the session was closed",
                            mc->where, what);
    }
    return dlock_seterr(cl(mc), map_errno(e), "mysql %s: %s: %s (%u)", mc->where, what,
                        st ? mysql_stmt_error(st) : mysql_error(s->db), e);
}

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

/* A statement's bound: `ms` from now, or the call's bound if tighter. */
static struct bound stmt_bound(const struct bound *call, uint64_t ms)
{
    struct bound b = {dlock_monotonic_ns() + ms * MS, DLOCK_ECONNECT, 0};
    if (call && call->until && call->until <= b.until)
        b = (struct bound){call->until, call->late, 0};
    return b;
}

/* No reply by a bound: the session is unusable (a statement is
 * outstanding); the caller closes it. */
static int no_reply(struct mysql_conn *mc, struct session *s, const char *what, uint64_t start,
                    int late)
{
    uint64_t ms = (dlock_monotonic_ns() - start + MS / 2) / MS;
    s->dead = 1;
    s->silent_ms = ms ? ms : 1;
    if (late == DLOCK_ETIMEDOUT)
        return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                            "mysql %s: %s: the deadline passed, the server not having answered"
                            " (no reply in %" PRIu64 " ms); the session was closed",
                            mc->where, what, s->silent_ms);
    return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                        "mysql %s: %s: the server did not answer (no reply within %" PRIu64
                        " ms); the session was closed", mc->where, what, s->silent_ms);
}

/* ---- non-blocking calls ------------------------------------------------- */

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

/* Waits for what status asks on db's socket, until until_ns (0: no
 * limit). Returns the events for the _cont call, -1 when until_ns passed
 * (the socket is polled once more at that instant), -2 when a signal
 * arrived (only with intr; otherwise the wait goes on), -3 when cancel_fd
 * (-1: none) turned readable and the socket had nothing (a reply that came
 * with the cancel is read). Connector/C's own timeouts (MYSQL_WAIT_TIMEOUT)
 * are not used: until_ns is the bound. */
static int wait_io(MYSQL *db, int status, uint64_t until_ns, int intr, int cancel_fd)
{
    for (;;) {
        struct pollfd p[2] = {{.fd = (int)mysql_get_socket(db)},
                              {.fd = cancel_fd, .events = POLLIN}};
        struct pollfd *pfd = p;
        struct timespec ts, *tsp = NULL;
        int last = 0;
        if (status & MYSQL_WAIT_READ)
            pfd->events |= POLLIN;
        if (status & MYSQL_WAIT_WRITE)
            pfd->events |= POLLOUT;
        if (status & MYSQL_WAIT_EXCEPT)
            pfd->events |= POLLPRI;
        if (until_ns) {
            uint64_t now = dlock_monotonic_ns();
            last = now >= until_ns;
            dlock_ns_to_timespec(last ? 0 : until_ns - now, &ts);
            tsp = &ts;
        }
        int pr = ppoll(p, cancel_fd >= 0 ? 2 : 1, tsp, NULL);
        if (pr < 0 && errno == EINTR && !intr)
            continue;
        if (pr < 0)
            return errno == EINTR ? -2 : -1;
        if (pr == 0) {
            if (last)
                return -1;
            continue;
        }
        if (pfd->revents == 0)
            return -3;
        if (pfd->revents & POLLNVAL) /* no socket: nothing will ever come */
            return -1;
        int ev = 0;
        if (pfd->revents & (POLLIN | POLLHUP | POLLERR))
            ev |= MYSQL_WAIT_READ;
        if (pfd->revents & (POLLOUT | POLLHUP | POLLERR))
            ev |= MYSQL_WAIT_WRITE;
        if (pfd->revents & POLLPRI)
            ev |= MYSQL_WAIT_EXCEPT;
        return ev & status;
    }
}

static void nb_step(struct nb *c, int ev)
{
    switch (c->op) {
    case NB_CONNECT:
        c->status = mysql_real_connect_cont(&c->cret, c->db, ev);
        break;
    case NB_QUERY:
        c->status = ev < 0 ? mysql_real_query_start(&c->ret, c->db, c->sql, strlen(c->sql))
                           : mysql_real_query_cont(&c->ret, c->db, ev);
        break;
    case NB_STORE:
        c->status = ev < 0 ? mysql_store_result_start(&c->res, c->db)
                           : mysql_store_result_cont(&c->res, c->db, ev);
        break;
    case NB_PREPARE:
        c->status = ev < 0 ? mysql_stmt_prepare_start(&c->ret, c->st, c->sql, strlen(c->sql))
                           : mysql_stmt_prepare_cont(&c->ret, c->st, ev);
        break;
    case NB_EXECUTE:
        c->status = ev < 0 ? mysql_stmt_execute_start(&c->ret, c->st)
                           : mysql_stmt_execute_cont(&c->ret, c->st, ev);
        break;
    case NB_STMT_STORE:
        c->status = ev < 0 ? mysql_stmt_store_result_start(&c->ret, c->st)
                           : mysql_stmt_store_result_cont(&c->ret, c->st, ev);
        break;
    case NB_ROLLBACK:
        c->status = ev < 0 ? mysql_rollback_start(&c->bret, c->db)
                           : mysql_rollback_cont(&c->bret, c->db, ev);
        break;
    }
}

/* Runs a started call to its end: 0 when it is over, -1 when until_ns
 * passed first, -2 when a signal interrupted it (only with intr), -3 when
 * cancel_fd (-1: none) fired; in the last three cases it is still
 * outstanding, and c->status says what it waits for. */
static int nb_wait(struct nb *c, uint64_t until_ns, int intr, int cancel_fd)
{
    while (c->status) {
        int ev = wait_io(c->db, c->status, until_ns, intr, cancel_fd);
        if (ev < 0)
            return ev;
        nb_step(c, ev);
    }
    return 0;
}

static int nb_finish(struct nb *c, uint64_t until_ns, int intr)
{
    return nb_wait(c, until_ns, intr, -1);
}

static int nb_failed(const struct nb *c)
{
    switch (c->op) {
    case NB_CONNECT:
        return c->cret == NULL;
    case NB_STORE:
        return c->res == NULL && mysql_errno(c->db) != 0;
    case NB_ROLLBACK:
        return c->bret != 0;
    default:
        return c->ret != 0;
    }
}

/* One call on s (op with st or sql), by b: 0, or its error recorded (no
 * reply by then: b's error, and s is dead). */
static int run(struct mysql_conn *mc, struct session *s, enum nb_op op, MYSQL_STMT *st,
               const char *sql, const struct bound *b, const char *what)
{
    struct nb c = {.op = op, .db = s->db, .st = st, .sql = sql};
    uint64_t start = dlock_monotonic_ns();
    nb_step(&c, -1);
    if (nb_finish(&c, b->until, 0) != 0)
        return no_reply(mc, s, what, start, b->late);
    if (nb_failed(&c))
        return fail_on(mc, s, st, what);
    if (c.res)
        mysql_free_result(c.res);
    return 0;
}

/* ---- sessions ----------------------------------------------------------- */

/* Closing never waits for the server: a session with a statement still
 * outstanding (dead) has its socket shut first, so that Connector/C finds
 * nothing to read (it would otherwise drain the statement's reply with
 * its whole-second timeouts). The server ends the session, rolling back,
 * when it sees the connection closed. */
static void session_disconnect(struct session *s)
{
    if (!s->db)
        return;
    if (s->dead && (int)mysql_get_socket(s->db) >= 0)
        shutdown((int)mysql_get_socket(s->db), SHUT_RDWR);
    for (int i = 0; i < N_STMTS; i++)
        if (s->stmt[i]) {
            mysql_stmt_close(s->stmt[i]);
            s->stmt[i] = NULL;
        }
    mysql_close(s->db);
    s->db = NULL;
}

static void session_close(struct session *s)
{
    if (!s)
        return;
    session_disconnect(s);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void set_tls(struct mysql_conn *mc, MYSQL *db)
{
    my_bool yes = 1, verify = mc->tls == 2;
    if (!mc->tls)
        return;
    mysql_options(db, MYSQL_OPT_SSL_ENFORCE, &yes);
    mysql_options(db, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify);
    if (mc->tls_ca)
        mysql_options(db, MYSQL_OPT_SSL_CA, mc->tls_ca);
    if (mc->tls_cert)
        mysql_options(db, MYSQL_OPT_SSL_CERT, mc->tls_cert);
    if (mc->tls_key)
        mysql_options(db, MYSQL_OPT_SSL_KEY, mc->tls_key);
}

/* A dead peer or a cut network must end even a wait without a deadline:
 * TCP keepalives probe an idle connection after 5 s, every 2 s, 3 times,
 * and data left unacknowledged for the timeout fails the connection
 * (Connector/C only turns keepalives on, with the system's 2-hour
 * default). Not for unix sockets. */
static void tune_socket(struct mysql_conn *mc, MYSQL *db)
{
    int fd = (int)mysql_get_socket(db), on = 1, idle = 5, intvl = 2, cnt = 3;
    unsigned user_ms = mc->timeout_ms > UINT32_MAX ? UINT32_MAX : (unsigned)mc->timeout_ms;
    if (mc->socket || fd < 0)
        return;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

/*
 * Opens a session, by connect_timeout or the call's deadline if sooner
 * (a try's bound grows by the time spent here instead).
 *
 * Nothing is left to the server's defaults, which an administrator may
 * change (SET GLOBAL, init_connect, which these commands run after):
 * every session runs READ COMMITTED (a FOR UPDATE on a missing row takes
 * no gap lock, and the statements never depend on a snapshot), but for
 * token=sequence's control session, READ UNCOMMITTED: inspect reads the
 * holders' grants, never committed, there (nothing else it runs reads
 * rows); lock
 * sessions without autocommit (the FOR UPDATE opens the transaction that
 * holds the lock; lock=named's sessions, lock_role 2, run in autocommit:
 * user locks need no transaction); the control session with autocommit,
 * so that every token is committed the moment it is bumped, and it gives
 * up on a row lock after 1 s (it only ever waits in the rare race of
 * creating a row, or behind another client's bump). Metadata locks (a DDL
 * on the tables) are waited for at most `timeout`.
 */
static int session_open(struct mysql_conn *mc, int lock_role, struct bound *call,
                        struct session **out)
{
    struct session *s = calloc(1, sizeof *s);
    unsigned connect_s = ceil_s(mc->connect_ms), io_s = ceil_s(mc->timeout_ms), no = 0;
    uint64_t start = dlock_monotonic_ns();
    my_bool off = 0;
    char limits[128];
    if (!s || pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    }
    if (!(s->db = mysql_init(NULL))) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    }
    mysql_options(s->db, MYSQL_OPT_CONNECT_TIMEOUT, &connect_s);
    mysql_options(s->db, MYSQL_OPT_READ_TIMEOUT, &io_s);
    mysql_options(s->db, MYSQL_OPT_WRITE_TIMEOUT, &io_s);
    mysql_options(s->db, MYSQL_OPT_RECONNECT, &off); /* a silent reconnect would hide a loss */
    mysql_options(s->db, MYSQL_OPT_LOCAL_INFILE, &no);
    mysql_options(s->db, MYSQL_OPT_NONBLOCK, 0);
    set_tls(mc, s->db);
    mysql_options(s->db, MYSQL_INIT_COMMAND,
                  !lock_role && mc->seq
                      ? "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED"
                      : "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    if (lock_role == 1)
        snprintf(limits, sizeof limits, "SET SESSION autocommit = 0, lock_wait_timeout = %u", io_s);
    else if (lock_role == 2) /* lock=named: GET_LOCK needs no transaction */
        snprintf(limits, sizeof limits, "SET SESSION autocommit = 1, lock_wait_timeout = %u", io_s);
    else
        snprintf(limits, sizeof limits,
                 "SET SESSION autocommit = 1, innodb_lock_wait_timeout = 1, lock_wait_timeout = %u",
                 io_s);
    mysql_options(s->db, MYSQL_INIT_COMMAND, limits);

    struct bound b = {start + mc->connect_ms * MS, DLOCK_ECONNECT, 0};
    if (call && call->until && !call->extend && call->until < b.until)
        b = (struct bound){call->until, call->late, 0};
    struct nb c = {.op = NB_CONNECT, .db = s->db};
    c.status = mysql_real_connect_start(&c.cret, s->db, mc->socket ? "localhost" : mc->host,
                                        mc->user, mc->password, mc->database, mc->port,
                                        mc->socket, 0);
    int w = nb_finish(&c, b.until, 0), err = 0;
    if (call && call->until && call->extend)
        call->until += dlock_monotonic_ns() - start;
    if (w != 0) {
        err = no_reply(mc, s, "cannot connect", start, b.late);
    } else if (!c.cret) {
        errno = 0; /* Connector/C's own message says what failed */
        err = fail_on(mc, s, NULL, "cannot connect");
        s->dead = 1;
    } else if (mc->tls && !mysql_get_ssl_cipher(s->db)) {
        /* This Connector/C enforces TLS only together with verification:
         * with tls=on a server without TLS would get a plain session. */
        err = dlock_seterr(cl(mc), DLOCK_ECONNECT, "mysql %s: the server did not agree to TLS",
                           mc->where);
    }
    if (err) {
        session_close(s);
        return err;
    }
    tune_socket(mc, s->db);
    *out = s;
    return 0;
}

static int prepare(struct mysql_conn *mc, struct session *s, enum stmt_id id,
                   const struct bound *b, MYSQL_STMT **out)
{
    MYSQL_STMT *st = s->stmt[id];
    if (!st) {
        if (!(st = mysql_stmt_init(s->db)))
            return fail_on(mc, s, NULL, "cannot allocate a statement");
        int err = run(mc, s, NB_PREPARE, st, mc->sql[id], b, "prepare");
        if (err) {
            if (s->dead)
                shutdown((int)mysql_get_socket(s->db), SHUT_RDWR);
            mysql_stmt_close(st);
            return err;
        }
        s->stmt[id] = st;
    }
    *out = st;
    return 0;
}

/* A statement without a result, by `timeout` or the call's bound. */
static int exec_sql(struct mysql_conn *mc, struct session *s, const char *sql,
                    const struct bound *call, const char *what)
{
    struct bound b = stmt_bound(call, mc->timeout_ms);
    return run(mc, s, NB_QUERY, NULL, sql, &b, what);
}

static int ctl_session(struct mysql_conn *mc, struct bound *call, struct session **out)
{
    int err = 0;
    if (!mc->ctl) {
        err = session_open(mc, 0, call, &mc->ctl);
        if (err == 0 && mc->ctl_dropped) {
            mc->ctl_dropped = 0;
            dlock_count_reconnect(cl(mc));
        }
    }
    *out = mc->ctl;
    return err;
}

/* After an error on the control session: drop it if the server did, so the
 * next use reconnects. Returns whether that is worth one retry now: not
 * when the server did not answer in time (a retry would wait as long
 * again, doubling the call's bound). */
static int ctl_dropped(struct mysql_conn *mc)
{
    if (!mc->ctl || !mc->ctl->dead)
        return 0;
    int retry = !mc->ctl->silent_ms;
    session_close(mc->ctl);
    mc->ctl = NULL;
    mc->ctl_dropped = 1;
    return retry;
}

/*
 * One prepared statement on the control session, by call (each round trip
 * by `timeout` too): opens the session if needed, prepares, binds params
 * (if any), executes and, with rows, stores the result set. A control
 * session the server had dropped (idle past wait_timeout, a restart) is
 * replaced and the statement run once more; not one that did not answer
 * in time (see ctl_dropped). *stp is the statement, NULL if none.
 */
static int ctl_exec(struct mysql_conn *mc, enum stmt_id id, MYSQL_BIND *params, int rows,
                    struct bound *call, const char *what, MYSQL_STMT **stp)
{
    int err = 0;
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl;
        struct bound sb = stmt_bound(call, mc->timeout_ms);
        *stp = NULL;
        if ((err = ctl_session(mc, call, &ctl)) == 0 &&
            (err = prepare(mc, ctl, id, &sb, stp)) == 0) {
            if (params && mysql_stmt_bind_param(*stp, params) != 0)
                return fail_on(mc, ctl, *stp, "bind");
            sb = stmt_bound(call, mc->timeout_ms);
            if ((err = run(mc, ctl, NB_EXECUTE, *stp, NULL, &sb, what)) == 0 &&
                (!rows || (err = run(mc, ctl, NB_STMT_STORE, *stp, NULL, &sb, what)) == 0))
                return 0;
        }
        if (!ctl_dropped(mc))
            return err;
    }
    *stp = NULL;
    return err;
}

/* The last failure on the control session was a row lock wait that ran
 * out (its innodb_lock_wait_timeout, 1 s), the session still usable. */
static int ctl_lock_timed_out(const struct mysql_conn *mc)
{
    return mc->ctl && !mc->ctl->dead && mc->ctl->last_errno == ER_LOCK_WAIT_TIMEOUT;
}

static void pool_drain(struct mysql_conn *mc)
{
    while (mc->idle) {
        struct session *s = mc->idle;
        mc->idle = s->next;
        session_close(s);
    }
    mc->nidle = 0;
}

/* A lock session from the pool, or a new one. *pooled = 1 for a pooled
 * session idle for a second or more, which the server may have dropped for
 * it (wait_timeout counts whole seconds): a failure on it is worth one
 * retry on a new session; not a session idle for less (the one be_open
 * pooled, say), whose failure is its own (KILL). */
static int pool_get(struct mysql_conn *mc, struct bound *call, struct session **out, int *pooled)
{
    *pooled = mc->idle && dlock_monotonic_ns() - mc->idle->idle_since >= 1000 * MS;
    if (mc->idle) {
        *out = mc->idle;
        mc->idle = mc->idle->next;
        mc->nidle--;
        (*out)->next = NULL;
        return 0;
    }
    return session_open(mc, 1, call, out);
}

static void pool_put(struct mysql_conn *mc, struct session *s)
{
    if (mc->nidle >= IDLE_SESSIONS_MAX) {
        session_close(s);
        return;
    }
    s->next = mc->idle;
    s->idle_since = dlock_monotonic_ns();
    mc->idle = s;
    mc->nidle++;
}

/* Ends a lock session's transaction (whatever it holds is released) and
 * pools it, by until_ns; a session that does not roll back by then is
 * closed, which makes the server roll back when it sees it. Keeps the
 * error already recorded on the client. */
static void rollback_and_pool(struct mysql_conn *mc, struct session *s, uint64_t until_ns)
{
    struct nb c = {.op = NB_ROLLBACK, .db = s->db};
    nb_step(&c, -1);
    if (nb_finish(&c, until_ns, 0) != 0 || nb_failed(&c)) {
        s->dead = 1;
        session_close(s);
        return;
    }
    pool_put(mc, s);
}

static uint64_t cleanup_until(void)
{
    return dlock_monotonic_ns() + CLEANUP_MS * MS;
}

/* ---- acquire ------------------------------------------------------------ */

static void bind_bytes(MYSQL_BIND *b, const void *p, unsigned long *len)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_BLOB;
    b->buffer = (void *)p;
    b->buffer_length = *len;
    b->length = len;
}

static void bind_u64(MYSQL_BIND *b, unsigned long long *v)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_LONGLONG;
    b->buffer = v;
    b->is_unsigned = 1;
}

/* The session's lease and server-side wait bounds, set only when they
 * change, so a steady workload pays no round trip for them. */
static int set_limits(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                      const struct bound *call)
{
    unsigned lease = ceil_s(req->ttl_ms), wait = s->lock_wait_s;
    char sql[160];
    int n;
    if (req->wait == DLOCK_WAIT_FOREVER || (mc->seq && req->wait == DLOCK_WAIT_DEADLINE)) {
        /* token=sequence ends a deadline's wait with max_statement_time. */
        wait = LOCK_WAIT_MAX_S;
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t now = dlock_monotonic_ns();
        unsigned need = ceil_s((req->deadline_ns > now ? req->deadline_ns - now : 0) / 1000000u);
        /* Never shorter than the deadline (the client ends the wait at the
         * exact deadline); not much longer either, so that a waiter that
         * died leaves InnoDB's queue soon. */
        if (wait < need || wait > 2 * need + 2)
            wait = need;
    }
    if (lease == s->wait_timeout_s && wait == s->lock_wait_s)
        return 0;
    n = snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", lease);
    if (wait != s->lock_wait_s)
        snprintf(sql + n, sizeof sql - (size_t)n,
                 ", innodb_lock_wait_timeout = %u, lock_wait_timeout = %u", wait,
                 wait > MDL_WAIT_MAX_S ? MDL_WAIT_MAX_S : wait);
    int err = exec_sql(mc, s, sql, call, "setting the session's lease");
    if (err)
        return err;
    s->wait_timeout_s = lease;
    s->lock_wait_s = wait;
    return 0;
}

/* A statement without a result on s, by until_ns (no reply by then:
 * DLOCK_ECONNECT, and s is dead: the caller closes it). Only s is
 * touched: safe on the keeper's thread for a lock's session. */
static int query_until(struct mysql_conn *mc, struct session *s, const char *sql, uint64_t until_ns,
                       const char *what)
{
    struct bound b = {until_ns, DLOCK_ECONNECT, 0};
    return run(mc, s, NB_QUERY, NULL, sql, &b, what);
}

/*
 * Ends a lock wait still running on the server, by until_ns (a small
 * margin past the deadline): KILL QUERY from the control session, then
 * the statement's own end (interrupted, or granted in that instant), then
 * a rollback, and the session goes back to the pool. Whatever of it does
 * not finish in time is abandoned: the session is closed, the server ends
 * the wait at its innodb_lock_wait_timeout (set near the deadline) and
 * rolls back, freeing anything granted meanwhile, once it sees the
 * connection closed.
 */
static void cancel_wait(struct mysql_conn *mc, struct session *s, struct nb *wait, uint64_t until_ns)
{
    char sql[64];
    struct session *ctl;
    struct bound b = {until_ns, DLOCK_ECONNECT, 0};
    dlock_errsave why;
    int err = 0;
    dlock_err_save(cl(mc), &why); /* report the wait's end, not this */
    snprintf(sql, sizeof sql, "KILL QUERY %lu", mysql_thread_id(s->db));
    for (int tries = 0; tries < 2; tries++) {
        if ((err = ctl_session(mc, &b, &ctl)) == 0 &&
            (err = run(mc, ctl, NB_QUERY, NULL, sql, &b, "KILL QUERY")) == 0)
            break;
        if (!ctl_dropped(mc))
            break;
    }
    if (err == 0 && nb_finish(wait, until_ns, 0) == 0) {
        if (wait->ret == 0 && wait->st) { /* granted after all: read the row, then let go */
            struct nb rd = {.op = NB_STMT_STORE, .db = s->db, .st = wait->st};
            nb_step(&rd, -1);
            if (nb_finish(&rd, until_ns, 0) != 0)
                err = 1;
            else
                mysql_stmt_free_result(wait->st);
        }
        if (err == 0) {
            rollback_and_pool(mc, s, until_ns);
            s = NULL;
        }
    }
    if (s) {
        s->dead = 1;
        session_close(s);
    }
    dlock_err_restore(cl(mc), &why);
}

/* The error of a locking read that the server refused. */
static int lock_error(struct mysql_conn *mc, struct session *s, MYSQL_STMT *st, int nowait)
{
    unsigned e = st ? mysql_stmt_errno(st) : mysql_errno(s->db);
    int err = fail_on(mc, s, st, "waiting for the row lock");
    if (e == ERR_STATEMENT_TIMEOUT)
        return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                            "the deadline passed with the lock still held elsewhere");
    if ((e == ER_LOCK_WAIT_TIMEOUT && nowait) || e == ERR_LOCK_NOWAIT)
        return dlock_seterr(cl(mc), DLOCK_EBUSY, "the lock is held by another owner");
    if (e == ER_LOCK_WAIT_TIMEOUT)
        return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                            "mysql %s: the server's lock wait timeout passed", mc->where);
    return err;
}

/*
 * The end of a row lock's statement that did not reply in time (nb_wait's
 * w: -1 no reply by until, -2 a signal, -3 the request's cancel fd). A try
 * the server does not answer: nothing to cancel (the control session would
 * likely wait as long), so the session is closed, which undoes whatever it
 * got once the server notices. A wait: DLOCK_EINTR, DLOCK_ECANCELED or
 * DLOCK_ETIMEDOUT (late: the detail), and the wait is cancelled (KILL
 * QUERY, rollback) within CLEANUP_MS. *sp is no longer the caller's either
 * way.
 */
static int lock_wait_cut(struct mysql_conn *mc, struct session *s, struct session **sp,
                         struct nb *c, int w, int nowait, uint64_t start, uint64_t until,
                         const char *late)
{
    int err;
    *sp = NULL;
    if (w == -1 && nowait) {
        err = no_reply(mc, s, "acquire", start, DLOCK_ECONNECT);
        session_close(s);
        return err;
    }
    uint64_t now = dlock_monotonic_ns();
    if (w == -2)
        err = dlock_seterr(cl(mc), DLOCK_EINTR, "a signal interrupted the wait");
    else if (w == -3)
        err = dlock_cancelled(cl(mc));
    else
        err = dlock_seterr(cl(mc), DLOCK_ETIMEDOUT, "%s", late);
    cancel_wait(mc, s, c, (w == -1 && until > now ? until : now) + CLEANUP_MS * MS);
    return err;
}

/*
 * One locking read of the name's row on session s. Returns 1 when the row
 * is ours, 0 when the row does not exist yet, or an error: DLOCK_EBUSY
 * (try), DLOCK_ETIMEDOUT, DLOCK_EINTR, DLOCK_ECANCELED... After a wait that was cut short
 * the session is already rolled back and pooled (or closed), and *sp is
 * NULL; after other errors the caller ends the transaction.
 */
static int lock_row(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                    const unsigned char *k, const struct bound *call)
{
    struct session *s = *sp;
    int nowait = req->wait == DLOCK_WAIT_TRY, err;
    unsigned long klen = DLOCK_SHA256_LEN;
    MYSQL_STMT *st;
    MYSQL_BIND b;
    struct bound pb = stmt_bound(call, mc->timeout_ms);
    if ((err = prepare(mc, s, nowait ? ST_LOCK_NOWAIT : ST_LOCK_WAIT, &pb, &st)) != 0)
        return err;
    bind_bytes(&b, k, &klen);
    if (mysql_stmt_bind_param(st, &b) != 0)
        return fail_on(mc, s, st, "bind");
    /* A try is bounded too: a server that never answers must not hang it. */
    uint64_t start = dlock_monotonic_ns();
    uint64_t until = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns
                     : nowait ? call->until : 0;
    struct nb c = {.op = NB_EXECUTE, .db = s->db, .st = st};
    nb_step(&c, -1);
    int w = nb_wait(&c, until, 1, nowait ? -1 : req->cancel_fd);
    if (w != 0)
        return lock_wait_cut(mc, s, sp, &c, w, nowait, start, until,
                             "the deadline passed with the lock still held elsewhere");
    if (c.ret != 0)
        return lock_error(mc, s, st, nowait);
    /* The rows follow the statement's reply at once. */
    struct bound rb = stmt_bound(call, mc->timeout_ms);
    if (req->wait == DLOCK_WAIT_DEADLINE)
        rb = (struct bound){dlock_monotonic_ns() + CLEANUP_MS * MS, DLOCK_ETIMEDOUT, 0};
    if ((err = run(mc, s, NB_STMT_STORE, st, NULL, &rb, "reading the row lock's result")) != 0)
        return err;
    int found = mysql_stmt_num_rows(st) > 0;
    mysql_stmt_free_result(st);
    return found;
}

static int query_result(struct mysql_conn *mc, struct session *s, const char *sql,
                        const struct bound *b, const char *what, MYSQL_RES **out);

/*
 * token=sequence: MariaDB writes a sequence's table (its next range, a
 * SETVAL) without writing the redo log at that moment: it reaches the disk
 * with the next commit that does, or InnoDB's once-a-second flush. A crash
 * before that restarts the sequence below tokens already handed out. So a
 * token is returned only once known to be on disk: below the mark, a row
 * of <table> with the all-zero key (FLOOR_K, no name's) whose token column
 * a committed write sets to the sequence's next_not_cached_value: the
 * commit writes the log up to itself, the sequence's earlier writes with
 * it, so every value below the mark is as durable as a commit
 * (innodb_flush_log_at_trx_commit). A commit per range of SEQ_CACHE
 * values, not per grant; clients share the mark.
 */

/* Commits the mark on a session in autocommit: the control session if
 * open, else one opened for it and closed after (rare: a new range). *mark:
 * the mark now. */
static int seq_checkpoint(struct mysql_conn *mc, struct bound *call, uint64_t *mark)
{
    static const char what[] = "writing the sequence's durable mark";
    char sql[640];
    int opened = !mc->ctl, err = 0;
    snprintf(sql, sizeof sql,
             "INSERT INTO `%s` (k, name, created_at, token) VALUES (" FLOOR_K ","
             " 'dlock: tokens below are on disk', UTC_TIMESTAMP(6),"
             " LAST_INSERT_ID((SELECT next_not_cached_value FROM `%s_seq`)))"
             " ON DUPLICATE KEY UPDATE created_at = VALUES(created_at),"
             " token = LAST_INSERT_ID(GREATEST(token, VALUES(token)))",
             mc->table, mc->table);
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl;
        if ((err = ctl_session(mc, call, &ctl)) == 0 &&
            (err = exec_sql(mc, ctl, sql, call, what)) == 0) {
            *mark = mysql_insert_id(ctl->db);
            break;
        }
        if (!ctl_dropped(mc))
            break;
    }
    if (opened && mc->ctl) {
        session_close(mc->ctl);
        mc->ctl = NULL;
    }
    return err;
}

/* Makes sure token is on disk before it is handed out (see above): below
 * the mark as this client last saw it (no round trip), or as read now on
 * s (a consistent read: the lock transaction stays as it is), or once a
 * checkpoint has moved the mark past it. seq_mark_read: 0 with *behind set
 * when a checkpoint is needed (*replied: when the read's reply came). */
static int seq_mark_read(struct mysql_conn *mc, struct session *s, uint64_t token,
                         struct bound *call, int *behind, uint64_t *replied)
{
    char sql[256];
    MYSQL_RES *res = NULL;
    uint64_t mark = 0;
    int err;
    *behind = 0;
    if (token < mc->durable)
        return 0;
    snprintf(sql, sizeof sql, "SELECT token FROM `%s` WHERE k = " FLOOR_K, mc->table);
    struct bound b = stmt_bound(call, mc->timeout_ms);
    if ((err = query_result(mc, s, sql, &b, "reading the sequence's durable mark", &res)) != 0)
        return err;
    if (replied)
        *replied = dlock_monotonic_ns();
    MYSQL_ROW row = mysql_fetch_row(res);
    mark = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
    mysql_free_result(res);
    if (mark <= token)
        *behind = 1;
    else if (mark > mc->durable)
        mc->durable = mark;
    return 0;
}

/* The checkpoint for a token the mark read on its session was not past:
 * the control session only, so it needs no lock session (lock=named runs
 * it without the session's mutex). */
static int seq_mark_past(struct mysql_conn *mc, uint64_t token, struct bound *call)
{
    uint64_t mark = 0;
    int err;
    if ((err = seq_checkpoint(mc, call, &mark)) != 0)
        return err;
    if (mark <= token)
        return dlock_seterr(cl(mc), DLOCK_EPROTO,
                            "mysql %s: the sequence's durable mark (%" PRIu64 ") is not past"
                            " token %" PRIu64 ": `%s_seq` changed outside dlock?",
                            mc->where, mark, token, mc->table);
    if (mark > mc->durable)
        mc->durable = mark;
    return 0;
}

/* *replied: when the last reply on s came (the mark's read), unchanged
 * when s was not used. */
static int seq_durable(struct mysql_conn *mc, struct session *s, uint64_t token,
                       struct bound *call, uint64_t *replied)
{
    int behind = 0, err = seq_mark_read(mc, s, token, call, &behind, replied);
    if (err == 0 && behind)
        err = seq_mark_past(mc, token, call);
    return err;
}

/*
 * token=sequence: the row lock and the token in one statement on the lock
 * session, in its transaction:
 *
 *   UPDATE <table> SET token = LAST_INSERT_ID(NEXTVAL(<table>_seq)),
 *     owner = ..., session_id = CONNECTION_ID(), acquired_at = ... WHERE k = ...
 *
 * UPDATE takes the row's exclusive lock, queueing in InnoDB as FOR UPDATE
 * does, and evaluates NEXTVAL only once it holds it, so tokens grow in
 * grant order; the reply carries LAST_INSERT_ID (mysql_insert_id): one
 * round trip. A try runs it under SET STATEMENT innodb_lock_wait_timeout =
 * 0, a deadline under max_statement_time = what is left of it (MariaDB
 * ends the lock wait then, to the millisecond), both part of the same
 * statement; the client waits for the answer until a margin past the
 * deadline. Returns 1 (ours, *token set, *replied the time of the last
 * reply on the session: the server's idle timer, the lease, starts
 * there), 0 (the row does not exist yet) or an error, as lock_row.
 */
static int lock_row_seq(struct mysql_conn *mc, struct session **sp, const dlock_request *req,
                        const unsigned char *k, struct bound *call, uint64_t *token,
                        uint64_t *replied)
{
    struct session *s = *sp;
    int nowait = req->wait == DLOCK_WAIT_TRY, err;
    char kx[2 * DLOCK_SHA256_LEN + 1], pre[96] = "", sql[640];
    uint64_t start = dlock_monotonic_ns(), until = 0;
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    if (nowait) {
        snprintf(pre, sizeof pre, "SET STATEMENT innodb_lock_wait_timeout = 0 FOR ");
        until = call->until; /* a server that never answers must not hang a try */
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t left_us = req->deadline_ns > start ? (req->deadline_ns - start) / 1000u : 0;
        if (left_us == 0)
            left_us = 1; /* 0 would be no limit */
        snprintf(pre, sizeof pre,
                 "SET STATEMENT max_statement_time = %" PRIu64 ".%06" PRIu64 " FOR ",
                 left_us / 1000000u, left_us % 1000000u);
        until = req->deadline_ns + CLEANUP_MS * MS;
    }
    snprintf(sql, sizeof sql,
             "%sUPDATE `%s` SET token = LAST_INSERT_ID(NEXTVAL(`%s_seq`)), owner = '%.32s',"
             " session_id = CONNECTION_ID(), acquired_at = UTC_TIMESTAMP(6) WHERE k = X'%s'",
             pre, mc->table, mc->table, req->owner_hex, kx);
    struct nb c = {.op = NB_QUERY, .db = s->db, .sql = sql};
    nb_step(&c, -1);
    int w = nb_wait(&c, until, 1, nowait ? -1 : req->cancel_fd);
    if (w != 0) /* the server did not end the wait itself: KILL QUERY it */
        return lock_wait_cut(mc, s, sp, &c, w, nowait, start, until,
                             "the deadline passed with the lock still held elsewhere (the"
                             " server did not end the wait at its max_statement_time)");
    if (c.ret != 0)
        return lock_error(mc, s, NULL, nowait);
    if (mysql_affected_rows(s->db) == 0)
        return 0;
    if ((*token = mysql_insert_id(s->db)) == 0)
        return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: no token from the grant", mc->where);
    *replied = dlock_monotonic_ns(); /* or the mark's read, below */
    /* After a wait the bound is the statement's, not a deadline past: the
     * mark (once per range) may need the control session opened and a
     * commit, so it gets `timeout` at least, as any statement does. */
    uint64_t mark_ns = mc->timeout_ms > CLEANUP_MS ? mc->timeout_ms * MS : CLEANUP_MS * MS;
    struct bound db = req->wait == DLOCK_WAIT_DEADLINE
                          ? (struct bound){dlock_monotonic_ns() + mark_ns, DLOCK_ETIMEDOUT, 0}
                          : *call;
    if ((err = seq_durable(mc, s, *token, req->wait == DLOCK_WAIT_FOREVER ? NULL : &db,
                           replied)) != 0)
        return err;
    return 1;
}

/* token=sequence: creates the name's row from its lock session (a name's
 * first use only), committed at once so that it outlives the lock. A row
 * lock conflict means the row exists (its creator or holder has it): not
 * waited for (innodb_lock_wait_timeout = 0), and the UPDATE then queues. */
static int create_row_seq(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                          const unsigned char *k, const struct bound *call)
{
    size_t nlen = req->name_len > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : req->name_len;
    char kx[2 * DLOCK_SHA256_LEN + 1], nx[2 * NAME_COLUMN_MAX + 1], sql[1024];
    dlock_hex(k, DLOCK_SHA256_LEN, kx);
    dlock_hex((const unsigned char *)req->name, nlen, nx);
    snprintf(sql, sizeof sql,
             "SET STATEMENT innodb_lock_wait_timeout = 0 FOR INSERT IGNORE INTO `%s` (k, name,"
             " created_at) VALUES (X'%s', X'%s', UTC_TIMESTAMP(6))", mc->table, kx, nx);
    int err = exec_sql(mc, s, sql, call, "creating the lock's row");
    if (err && !s->dead && s->last_errno == ER_LOCK_WAIT_TIMEOUT) {
        dlock_clearerr(cl(mc));
        err = 0;
    }
    if (err == 0)
        err = exec_sql(mc, s, "COMMIT", call, "creating the lock's row");
    return err;
}

/* Creates the name's row from the control session. INSERT IGNORE waits
 * for a row lock only if another client created and locked the row in the
 * meantime; a lock wait timeout then means the row exists, which is all
 * that is needed. */
static int create_row(struct mysql_conn *mc, const dlock_request *req, const unsigned char *k,
                      struct bound *call)
{
    unsigned long klen = DLOCK_SHA256_LEN;
    unsigned long nlen = req->name_len > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : req->name_len;
    MYSQL_BIND b[2];
    MYSQL_STMT *st;
    bind_bytes(&b[0], k, &klen);
    bind_bytes(&b[1], req->name, &nlen);
    int err = ctl_exec(mc, ST_CREATE_ROW, b, 0, call, "creating the lock's row", &st);
    if (err == 0 || ctl_lock_timed_out(mc)) {
        dlock_clearerr(cl(mc));
        return 0;
    }
    return err;
}

/* Bumps and commits the token from the control session, by b, while the
 * lock session holds the row; also records who holds the lock, for people
 * looking at the table. */
static int record_grant(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                        struct bound *b)
{
    unsigned long klen = DLOCK_SHA256_LEN, olen = 32;
    unsigned long long sid = mysql_thread_id(h->s->db);
    MYSQL_BIND bd[5];
    MYSQL_STMT *st;
    bind_bytes(&bd[0], h->k, &klen);
    bind_bytes(&bd[1], req->owner_hex, &olen);
    bind_u64(&bd[2], &sid);
    bind_bytes(&bd[3], req->owner_hex, &olen);
    bind_u64(&bd[4], &sid);
    /* A bump whose reply was lost may be repeated: tokens get a gap. */
    int err = ctl_exec(mc, ST_GRANT, bd, 0, b, "recording the grant", &st);
    if (err && ctl_lock_timed_out(mc))
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: the lock's token row or the floor row in %s_grants"
                            " is locked by another transaction (not a dlock grant): gave up"
                            " after 1 s", mc->where, mc->table);
    if (err)
        return err;
    h->base.token = mysql_stmt_insert_id(st);
    if (h->base.token == 0)
        return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: no token from the grant", mc->where);
    return 0;
}

/* After a failed attempt: a dropped session is closed, a live one has its
 * transaction ended (InnoDB undoes only the failed statement) and is
 * pooled. */
static void drop_or_pool(struct mysql_conn *mc, struct session *s)
{
    if (s->dead)
        session_close(s);
    else
        rollback_and_pool(mc, s, cleanup_until());
}

/* Sleeps ms, or less up to until_ns; DLOCK_EINTR if a signal came,
 * DLOCK_ECANCELED (recorded) once cancel_fd (-1: none) turns readable. */
static int pause_ms(struct mysql_conn *mc, uint64_t ms, uint64_t until_ns, int cancel_fd)
{
    uint64_t end = dlock_monotonic_ns() + ms * MS;
    if (until_ns && until_ns < end)
        end = until_ns;
    int err = dlock_pause_until(end, cancel_fd);
    return err == DLOCK_ECANCELED ? dlock_cancelled(cl(mc)) : err;
}

/*
 * A waiting session the server dropped: was it the whole server (a
 * restart, a cut connection: the control session is gone too), or this
 * session alone (KILL from another session)? Asks the control session,
 * by until_ns. Returns 1 for the server (worth waiting again), 0 for the
 * session alone.
 */
static int server_dropped_all(struct mysql_conn *mc, uint64_t until_ns)
{
    struct bound b = {until_ns, DLOCK_ECONNECT, 0};
    dlock_errsave why;
    int alive;
    if (!mc->ctl && !mc->seq)
        return 1; /* it was dropped too */
    dlock_err_save(cl(mc), &why);
    if (!mc->ctl) {
        /* token=sequence keeps no control session: a new session shows
         * whether the server answers (and joins the pool if it does). */
        struct session *p = NULL;
        alive = session_open(mc, 1, &b, &p) == 0;
        if (alive)
            pool_put(mc, p);
        dlock_err_restore(cl(mc), &why);
        return !alive;
    }
    alive = run(mc, mc->ctl, NB_QUERY, NULL, "DO 0", &b, "checking the server") == 0;
    if (!alive)
        ctl_dropped(mc);
    dlock_err_restore(cl(mc), &why);
    return !alive;
}

/*
 * Takes the row lock on a session of its own (h->s). A pooled session the
 * server dropped while idle (its lease ran out, a restart) is replaced,
 * and the rest of the pool with it. A missing row is created, once.
 *
 * A wait (deadline or forever) whose session the server dropped because
 * it went away (a restart, a broken connection) queues again on a new
 * session once the server is back, trying to reconnect every 100 ms to
 * 1 s, until the deadline, or for connect_timeout without a deadline; a
 * session killed alone (KILL from another session, the server still
 * answering) is not waited on again.
 */
static int take_lock(struct mysql_conn *mc, struct mysql_held *h, const dlock_request *req,
                     struct bound *call)
{
    int retried = 0, created = 0, err, pooled = 0;
    uint64_t down_since = 0, backoff = 100;
    struct session *s = NULL;
    for (;;) {
        if (!s && (err = pool_get(mc, call, &s, &pooled)) != 0) {
            if (!down_since || (err != DLOCK_ECONNECT && err != DLOCK_ETIMEDOUT))
                return err;
            /* The server is still away: try again, within bounds. */
            uint64_t now = dlock_monotonic_ns();
            uint64_t give_up = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns
                                                                : down_since + mc->connect_ms * MS;
            if (now + backoff * MS >= give_up)
                return dlock_seterr(cl(mc), err == DLOCK_ETIMEDOUT ? DLOCK_ETIMEDOUT : DLOCK_ECONNECT,
                                    "mysql %s: the server dropped the waiting session and was not"
                                    " back in time (%s)", mc->where,
                                    err == DLOCK_ETIMEDOUT ? "deadline" : "connect_timeout");
            if ((err = pause_ms(mc, backoff, give_up, req->cancel_fd)) == DLOCK_EINTR)
                return dlock_seterr(cl(mc), err, "a signal interrupted the wait");
            if (err)
                return err;
            backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
            continue;
        }
        err = set_limits(mc, s, req, call);
        if (err == 0)
            err = mc->seq ? lock_row_seq(mc, &s, req, h->k, call, &h->base.token, &h->expires_ns)
                          : lock_row(mc, &s, req, h->k, call);
        if (err == 1) {
            if (down_since) /* the failed reconnects are over */
                dlock_clearerr(cl(mc));
            h->s = s;
            return 0;
        }
        if (err == 0 && !created++) {
            if ((err = mc->seq ? create_row_seq(mc, s, req, h->k, call)
                               : create_row(mc, req, h->k, call)) == 0)
                continue;
        } else if (err == 0) {
            err = dlock_seterr(cl(mc), DLOCK_ESTORE, "mysql %s: the lock's row keeps vanishing",
                               mc->where);
        }
        if (s && s->dead && !s->silent_ms) {
            int again = pooled && !retried++; /* most likely dropped while idle */
            session_close(s);
            s = NULL;
            if (req->wait != DLOCK_WAIT_TRY) {
                uint64_t check = dlock_monotonic_ns() + mc->timeout_ms * MS;
                if (req->wait == DLOCK_WAIT_DEADLINE && req->deadline_ns < check)
                    check = req->deadline_ns;
                if (server_dropped_all(mc, check)) {
                    pool_drain(mc);
                    if (!down_since)
                        down_since = dlock_monotonic_ns();
                    dlock_clearerr(cl(mc));
                    continue;
                }
                if (!again)
                    return dlock_seterr(cl(mc), DLOCK_ECONNECT,
                                        "mysql %s: waiting for the row lock: the waiting session"
                                        " was killed (KILL from another session?) while the"
                                        " server kept answering: not waited on again", mc->where);
            }
            if (!again)
                return err;
            pool_drain(mc);
            continue;
        }
        if (s)
            drop_or_pool(mc, s);
        return err;
    }
}

static int hold_lost(struct mysql_conn *mc, struct mysql_held *h, const char *what, int err);

static int be_acquire(dlock_conn *conn, const dlock_request *req, dlock_held **heldp)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = calloc(1, sizeof *h);
    uint64_t start = dlock_monotonic_ns();
    int err;
    if (mc->named) {
        free(h);
        return named_acquire(mc, req, heldp);
    }
    if (!h)
        return dlock_seterr(conn->client, DLOCK_ENOMEM, "out of memory");
    dlock_sha256(req->name, req->name_len, h->k);
    /* The call's bound: a deadline is the caller's; a try gets `timeout`
     * (plus the time spent connecting); a wait without a deadline has a
     * bound per statement only. */
    struct bound call = {0, DLOCK_ECONNECT, 0};
    if (req->wait == DLOCK_WAIT_DEADLINE)
        call = (struct bound){req->deadline_ns, DLOCK_ETIMEDOUT, 0};
    else if (req->wait == DLOCK_WAIT_TRY)
        call = (struct bound){start + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if ((err = take_lock(mc, h, req, &call)) != 0) {
        free(h);
        return err;
    }
    /* The server's idle timer started when the grant was sent: counting from
     * its arrival makes the client's view of the lease end a little later
     * than the server's, never earlier than the TTL. */
    h->ttl_ms = req->ttl_ms;
    /* token=sequence: from the last reply on the lock's session (take_lock
     * left its time there), not after the durable mark's checkpoint on the
     * control session (a connect, a commit), during which the server's
     * idle timer already ran. */
    h->expires_ns = (mc->seq ? h->expires_ns : dlock_monotonic_ns()) + (uint64_t)req->ttl_ms * MS;
    /* After a wait (possibly longer than the TTL), the lease counts from
     * the grant: the "DO 0" below restarts the server's idle timer later
     * still, so this end is never after the server's. */
    if (req->wait != DLOCK_WAIT_TRY)
        h->base.lease_end_ns = h->expires_ns;
    if (mc->seq) { /* the token came with the row lock */
        *heldp = &h->base;
        return 0;
    }
    /* The token and the confirmation share one bound: what is left of a
     * try's, `timeout` for a wait without a deadline, and a small margin
     * past a deadline (the grant may come at its last instant). */
    struct bound post = stmt_bound(req->wait == DLOCK_WAIT_TRY ? &call : NULL, mc->timeout_ms);
    if (req->wait == DLOCK_WAIT_DEADLINE) {
        post = stmt_bound(&(struct bound){req->deadline_ns + CLEANUP_MS * MS, DLOCK_ETIMEDOUT, 0},
                          mc->timeout_ms);
    }
    if ((err = record_grant(mc, h, req, &post)) != 0) {
        rollback_and_pool(mc, h->s, cleanup_until());
        free(h);
        return err;
    }
    /* The token was bumped on the control session, so it belongs to this
     * grant only if our lock session, and with it the row lock, lived
     * through the bump: had the server dropped it meanwhile (KILL,
     * wait_timeout), another holder may already be using a lower token.
     * One round trip on the lock session proves it is still there. */
    if ((err = run(mc, h->s, NB_QUERY, NULL, "DO 0", &post, "confirming the grant")) != 0) {
        err = hold_lost(mc, h, "confirming the grant", err);
        if (h->s)
            rollback_and_pool(mc, h->s, cleanup_until());
        else if (err == DLOCK_ELOST)
            err = dlock_seterr(cl(mc), DLOCK_ELOST,
                               "mysql %s: the session holding the new lock ended before its "
                               "token was recorded: not acquired", mc->where);
        free(h);
        return err;
    }
    *heldp = &h->base;
    return 0;
}

/* ---- release, renew, ping ----------------------------------------------- */

/* The holding session failed with err (recorded): if the server dropped
 * it, the lock is lost; if it did not answer in time, the session is
 * closed and the lock goes with it once the server sees that; either way
 * h lets go of the session. Otherwise err is the store's, and h keeps its
 * session. Touches h's own session only: safe on the keeper's thread. */
static int hold_lost(struct mysql_conn *mc, struct mysql_held *h, const char *what, int err)
{
    if (!h->s->dead)
        return err;
    if (h->s->silent_ms)
        err = dlock_seterr(cl(mc), err == DLOCK_ETIMEDOUT ? DLOCK_ETIMEDOUT : DLOCK_ECONNECT,
                           "mysql %s: %s: the server did not answer within %" PRIu64
                           " ms; the session holding the lock was closed%s: the server frees"
                           " the lock when it sees that", mc->where, what, h->s->silent_ms,
                           strcmp(what, "release") ? ", so the lock is lost" : "");
    else
        err = dlock_seterr(cl(mc), DLOCK_ELOST,
                           "mysql %s: %s: the server dropped the session holding the lock (%s):"
                           " the lock is lost", mc->where, what, mysql_error(h->s->db));
    session_close(h->s);
    h->s = NULL;
    return err;
}

static int lease_over(struct mysql_conn *mc, struct mysql_held *h, const char *what)
{
    return dlock_seterr(cl(mc), DLOCK_ELOST, "%s: the lease (%" PRIu32 " ms) had run out",
                        what, h->ttl_ms);
}

static int be_release(dlock_conn *conn, dlock_held *held)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = (struct mysql_held *)held;
    int err = 0;
    if (mc->named)
        return named_release(mc, h);
    if (!h->s) {
        err = dlock_seterr(conn->client, DLOCK_ELOST, "the lock was lost earlier");
    } else if ((err = query_until(mc, h->s, "ROLLBACK", dlock_monotonic_ns() + mc->timeout_ms * MS,
                                  "release")) != 0) {
        /* Closing the session makes the server roll back, if it still can. */
        err = hold_lost(mc, h, "release", err);
        if (h->s) {
            h->s->dead = 1;
            session_close(h->s);
        }
    } else {
        if (dlock_monotonic_ns() >= h->expires_ns)
            err = lease_over(mc, h, "release");
        pool_put(mc, h->s);
    }
    free(h);
    return err;
}

/* SET SESSION wait_timeout on h's own session, by until_ns: the renewal of
 * renew() and keep(). Only h's session is touched. */
static int set_lease(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms, uint64_t sent,
                     uint64_t until_ns)
{
    unsigned lease = ceil_s(ttl_ms);
    char sql[64];
    snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", lease);
    int err = query_until(mc, h->s, sql, until_ns, "renew");
    if (err)
        return hold_lost(mc, h, "renew", err);
    h->s->wait_timeout_s = lease;
    h->ttl_ms = ttl_ms;
    h->expires_ns = sent + (uint64_t)ttl_ms * MS;
    return 0;
}

static int be_renew(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = (struct mysql_held *)held;
    if (mc->named)
        return named_renew(mc, h, ttl_ms);
    if (!h->s)
        return dlock_seterr(conn->client, DLOCK_ELOST, "the lock was lost earlier");
    uint64_t sent = dlock_monotonic_ns();
    if (sent >= h->expires_ns) {
        /* Possibly still ours on the server (wait_timeout is whole seconds),
         * but the lease is over: free it for others, never extend it. */
        rollback_and_pool(mc, h->s, cleanup_until());
        h->s = NULL;
        return lease_over(mc, h, "renew");
    }
    return set_lease(mc, h, ttl_ms, sent, sent + mc->timeout_ms * MS);
}

/*
 * The keeper's renewal: as renew, on the lock's own session, bounded by the
 * timeout and by the lease's end (no reply by then: the lease is over
 * anyway). It never touches the pool or the control session, which belong
 * to the application's thread: a lease found over is left for release() to
 * roll back and pool, and a session that failed is closed here (only this
 * lock used it).
 */
static int be_keep(dlock_conn *conn, dlock_held *held, uint32_t ttl_ms)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = (struct mysql_held *)held;
    if (mc->named)
        return named_keep(mc, h, ttl_ms);
    if (!h->s)
        return dlock_seterr(conn->client, DLOCK_ELOST, "the lock was lost earlier");
    uint64_t sent = dlock_monotonic_ns(), until = sent + mc->timeout_ms * MS;
    if (sent >= h->expires_ns)
        return dlock_seterr(conn->client, DLOCK_EEXPIRED,
                            "mysql %s: the lease (%" PRIu32 " ms) had run out before it could be"
                            " renewed", mc->where, h->ttl_ms);
    if (h->expires_ns < until)
        until = h->expires_ns;
    int err = set_lease(mc, h, ttl_ms, sent, until);
    /* The session closed for want of a reply: the lock must be assumed gone. */
    return err == DLOCK_ECONNECT && !h->s ? DLOCK_EEXPIRED : err;
}

/*
 * Proves h's row lock is still ours with one statement on its own session,
 * by until_ns: SET SESSION wait_timeout to what is left of the lease,
 * rounded up to the second as renew does (any statement restarts the
 * server's idle timer; this one keeps the server's lease end where the
 * client's is instead of pushing it a whole TTL later). An InnoDB row lock
 * lasts as long as its transaction, and the lock's session runs nothing
 * else: the session answering means the row lock is held.
 */
static int lock_alive(struct mysql_conn *mc, struct mysql_held *h, uint64_t until_ns,
                      const char *what)
{
    uint64_t now = dlock_monotonic_ns();
    char sql[64];
    if (now >= h->expires_ns) {
        rollback_and_pool(mc, h->s, cleanup_until());
        h->s = NULL;
        return lease_over(mc, h, what);
    }
    unsigned left = ceil_s((h->expires_ns - now + MS - 1) / MS);
    snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", left);
    int err = query_until(mc, h->s, sql, until_ns, what);
    if (err)
        return hold_lost(mc, h, what, err);
    h->s->wait_timeout_s = left;
    return 0;
}

/* A text statement with one integer result on the control session, by
 * call, retried once as ctl_exec does. *v: its value (0 if NULL); *isnull. */
static int ctl_query_u64(struct mysql_conn *mc, const char *sql, struct bound *call,
                         const char *what, uint64_t *v, int *isnull)
{
    int err = 0;
    for (int tries = 0; tries < 2; tries++) {
        struct session *ctl;
        MYSQL_RES *res = NULL;
        struct bound sb = stmt_bound(call, mc->timeout_ms);
        if ((err = ctl_session(mc, call, &ctl)) == 0 &&
            (err = query_result(mc, ctl, sql, &sb, what, &res)) == 0) {
            MYSQL_ROW row = mysql_fetch_row(res);
            if (!row) {
                mysql_free_result(res);
                return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: %s: no value returned",
                                    mc->where, what);
            }
            *isnull = row[0] == NULL;
            *v = row[0] ? strtoull(row[0], NULL, 10) : 0;
            mysql_free_result(res);
            return 0;
        }
        if (!ctl_dropped(mc))
            return err;
    }
    return err;
}

static int floor_too_high(struct mysql_conn *mc, uint64_t floor)
{
    if (mc->seq && floor > SEQ_FLOOR_MAX)
        return dlock_seterr(cl(mc), DLOCK_EINVAL,
                            "mysql: token=sequence: a MariaDB sequence is a signed BIGINT up to"
                            " 2^63 - 2, and the next grant takes the value after the floor: a"
                            " floor must be at most 2^63 - 3 (%" PRIu64 ")",
                            (uint64_t)SEQ_FLOOR_MAX);
    if (floor > TOKEN_FLOOR_MAX)
        return dlock_seterr(cl(mc), DLOCK_EINVAL,
                            "mysql: tokens are BIGINT UNSIGNED: a floor must be at most"
                            " 2^64 - 2 (%" PRIu64 ")", (uint64_t)TOKEN_FLOOR_MAX);
    return 0;
}

/*
 * Raises the name's counter to floor (never lowers it).
 *
 * token=table: first the lock's own session proves the row lock is still
 * ours (lock_alive), then the control session, in autocommit, sets token =
 * GREATEST(token, floor) on the name's grants row only while the latest
 * grant recorded there is ours (session_id). A later holder's grant is
 * recorded only after it got the row lock, i.e. after our transaction
 * ended; so a raise that matches is committed before any later token
 * exists, and every later grant of the name gets a token above floor. A
 * raise that matches nothing raised nothing: the lock was lost (or the row
 * was changed by hand, while the session still holds the row:
 * DLOCK_ESTORE). Two round trips, bounded together by `timeout` (plus
 * connect_timeout to reopen the control session); as durable as the
 * grants' commits.
 *
 * token=sequence: the sequence is every name's, and SETVAL never moves it
 * back (a value below the sequence's is ignored) and is atomic with
 * NEXTVAL, so no lock is needed: lock_alive, then SETVAL(seq, floor) on the
 * lock's own session (not undone by the lock transaction's rollback; the
 * session answering proves the row lock still ours, as lock_alive does),
 * then the durable mark is committed past it (seq_checkpoint: on disk).
 * Every later grant of every name gets more than floor. Three round trips
 * (and a connect, the control session being opened for the mark).
 */
static int be_raise_token(dlock_conn *conn, dlock_held *held, uint64_t floor)
{
    static const char what[] = "raising the token";
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct mysql_held *h = (struct mysql_held *)held;
    unsigned long klen = DLOCK_SHA256_LEN;
    unsigned long long f = floor, sid;
    MYSQL_BIND bd[3];
    MYSQL_STMT *st;
    int err;
    if ((err = floor_too_high(mc, floor)) != 0)
        return err;
    if (mc->named)
        return named_raise(mc, h, floor);
    if (!h->s)
        return dlock_seterr(conn->client, DLOCK_ELOST, "the lock was lost earlier");
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if ((err = lock_alive(mc, h, call.until, what)) != 0)
        return err;
    if (mc->seq) {
        char sql[160];
        MYSQL_RES *res = NULL;
        uint64_t mark = 0;
        snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %llu)", mc->table, f);
        if ((err = query_result(mc, h->s, sql, &call, what, &res)) != 0)
            return hold_lost(mc, h, what, err);
        mysql_free_result(res);
        /* On disk before the call returns (see seq_durable). */
        if ((err = seq_checkpoint(mc, &call, &mark)) != 0)
            return err;
        if (mark > mc->durable)
            mc->durable = mark;
        return 0;
    }
    sid = mysql_thread_id(h->s->db); /* what record_grant wrote as session_id */
    bind_u64(&bd[0], &f);
    bind_bytes(&bd[1], h->k, &klen);
    bind_u64(&bd[2], &sid);
    err = ctl_exec(mc, ST_RAISE, bd, 0, &call, what, &st);
    if (err && ctl_lock_timed_out(mc))
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: the lock's token row in %s_grants is locked by another"
                            " transaction (not a dlock grant): gave up after 1 s; not raised",
                            mc->where, mc->table);
    if (err)
        return err;
    if (mysql_stmt_insert_id(st) != 0)
        return 0;
    /* No row names our session: a later grant was recorded (so the session
     * is gone), or someone changed the row. */
    if ((err = lock_alive(mc, h, call.until, what)) != 0)
        return err;
    return dlock_seterr(cl(mc), DLOCK_ESTORE,
                        "mysql %s: %s: the lock is held, but its token row in %s_grants"
                        " does not name its session (changed or deleted outside dlock?):"
                        " nothing was raised", mc->where, what, mc->table);
}

/*
 * token_top, on the control session, one round trip bounded by `timeout`,
 * taking no lock a grant waits for. token=table: MAX(token) over
 * <table>_grants (a scan of every name's row, the floor's included; a
 * consistent read). token=sequence: the sequence's next_not_cached_value
 * - 1, at or above every value any server handed out (they come from the
 * cached range below it) and every floor set (SETVAL moves it past one
 * beyond the range): an upper bound, up to the cache (1000) above the last
 * token granted.
 */
static int be_token_top(dlock_conn *conn, uint64_t *top)
{
    static const char what[] = "reading the highest token";
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    unsigned long long v = 0;
    my_bool isnull = 0;
    MYSQL_BIND rb;
    MYSQL_STMT *st;
    int err;
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if (mc->seq) {
        char sql[160];
        uint64_t next = 0;
        int null = 0;
        snprintf(sql, sizeof sql, "SELECT next_not_cached_value FROM `%s_seq`", mc->table);
        if ((err = ctl_query_u64(mc, sql, &call, what, &next, &null)) != 0)
            return err;
        *top = next > 0 ? next - 1 : 0;
        return 0;
    }
    if ((err = ctl_exec(mc, ST_TOP, NULL, 1, &call, what, &st)) != 0)
        return err;
    bind_u64(&rb, &v);
    rb.is_null = &isnull;
    if (mysql_stmt_bind_result(st, &rb) != 0) {
        err = fail_on(mc, mc->ctl, st, what);
        mysql_stmt_free_result(st);
        return err;
    }
    int got = mysql_stmt_fetch(st); /* the stored row: no round trip */
    mysql_stmt_free_result(st);
    if (got != 0 && got != MYSQL_DATA_TRUNCATED)
        return dlock_seterr(cl(mc), DLOCK_EPROTO, "mysql %s: %s: no value returned", mc->where,
                            what);
    *top = isnull ? 0 : v;
    return 0;
}

/*
 * raise_floor, on the control session, one round trip bounded by
 * `timeout`.
 *
 * token=table: in autocommit (committed as a grant's bump is, so as
 * durable), sets the floor row of <table>_grants (key FLOOR_K, owner
 * 'floor') to GREATEST(token, floor), inserting it if missing. Every
 * grant's statement reads that row (under a shared row lock, InnoDB's for
 * a subquery of an INSERT) and takes GREATEST(name's token + 1, floor +
 * 1), so a grant recorded after the commit is above floor. The row lock it
 * takes is held only for that statement.
 *
 * token=sequence: SETVAL(seq, floor), which never moves the sequence back:
 * every later NEXTVAL, of any name, is above floor; then the durable mark
 * is committed past it (seq_checkpoint), which puts the SETVAL on disk.
 * Two round trips.
 */
static int be_raise_floor(dlock_conn *conn, uint64_t floor)
{
    static const char what[] = "raising the store's token floor";
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    unsigned long long f = floor;
    MYSQL_BIND bd[1];
    MYSQL_STMT *st;
    int err;
    if ((err = floor_too_high(mc, floor)) != 0)
        return err;
    if (floor == 0)
        return 0; /* every token is above 0 */
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if (mc->seq) {
        char sql[160];
        uint64_t v;
        int null;
        snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %llu)", mc->table, f);
        if ((err = ctl_query_u64(mc, sql, &call, what, &v, &null)) != 0 ||
            (err = seq_checkpoint(mc, &call, &v)) != 0) /* on disk: see seq_durable */
            return err;
        if (v > mc->durable)
            mc->durable = v;
        return 0;
    }
    bind_u64(&bd[0], &f);
    err = ctl_exec(mc, ST_FLOOR, bd, 0, &call, what, &st);
    if (err && ctl_lock_timed_out(mc))
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: the floor row of %s_grants is locked by another"
                            " transaction (not dlock's): gave up after 1 s; not raised",
                            mc->where, mc->table);
    return err;
}

/* ---- inspect ------------------------------------------------------------ */

/* A text statement with a result set on s, by b: *out is the stored
 * result (the caller frees it), or the error is recorded. */
static int query_result(struct mysql_conn *mc, struct session *s, const char *sql,
                        const struct bound *b, const char *what, MYSQL_RES **out)
{
    uint64_t start = dlock_monotonic_ns();
    struct nb c = {.op = NB_QUERY, .db = s->db, .sql = sql};
    nb_step(&c, -1);
    if (nb_finish(&c, b->until, 0) != 0)
        return no_reply(mc, s, what, start, b->late);
    if (nb_failed(&c))
        return fail_on(mc, s, NULL, what);
    struct nb r = {.op = NB_STORE, .db = s->db};
    nb_step(&r, -1);
    if (nb_finish(&r, b->until, 0) != 0)
        return no_reply(mc, s, what, start, b->late);
    if (!r.res)
        return mysql_errno(s->db) ? fail_on(mc, s, NULL, what)
                                  : dlock_seterr(cl(mc), DLOCK_EPROTO,
                                                 "mysql %s: %s: no result set", mc->where, what);
    *out = r.res;
    return 0;
}

/*
 * inspect: a text statement on the control session (autocommit, no
 * locking read, no row lock taken or waited for), then for token=table
 * row_locked's NOWAIT read of the row, bounded by `timeout` together.
 * The first is a UNION ALL of:
 *
 *  'g' the name's row of <table>_grants (a consistent read): token,
 *      owner and the grant's age;
 *  'p' COUNT(*) of INNODB_TRX, read whatever the grants say, so that a
 *      user without the PROCESS privilege always gets error 1227 rather
 *      than a "free" that was never seen;
 *  'w' (MariaDB) the transactions in LOCK WAIT that the holder's
 *      transaction blocks (INNODB_LOCK_WAITS; a lock session holds only
 *      its one row lock, so they wait for this name), whose session is
 *      still running its lock statement (information_schema.PROCESSLIST
 *      is live, the InnoDB views are a snapshot up to 0.1 s old: a waiter
 *      that gave up is not counted), in queue order: by the number of
 *      transactions each waits behind (the holder and the waiters queued
 *      before it), then trx_wait_started and trx_id.
 */
/* InnoDB's views are a snapshot refreshed when read at most every 0.1 s
 * (trx_i_s_cache): a grant recorded less than this long ago may not be in
 * it yet. */
#define VIEWS_AGE_MS "120"

/* The holder's transaction, for 'w': the trx_id of the grants row's
 * session's InnoDB transaction when that transaction is the grant's:
 * RUNNING (not in LOCK WAIT), holding rows (trx_rows_locked > 0), started
 * no later than the grant was recorded (trx_started is the session's local
 * time, whole seconds: acquired_at is moved by the session's UTC offset),
 * and no later grant of another name names the session (a pooled session
 * that went on to hold another name). */
#define INSPECT_HOLDER                                                                            \
    "(SELECT t.trx_id FROM information_schema.INNODB_TRX t WHERE t.trx_mysql_thread_id ="         \
    " g.session_id AND t.trx_state = 'RUNNING' AND t.trx_rows_locked > 0 AND t.trx_started <="     \
    " g.acquired_at + INTERVAL TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW()) SECOND AND NOT"     \
    " EXISTS (SELECT 1 FROM `%s_grants` o WHERE o.session_id = g.session_id AND o.k <> g.k AND"  \
    " o.acquired_at > g.acquired_at) LIMIT 1)"

/*
 * token=sequence's inspect statement, read on the control session at READ
 * UNCOMMITTED: the holder's grant is the lock row's uncommitted owner,
 * token, session and time (a release rolls them back to '' and 0: a row
 * with an owner has a live holder); 'p' as above; 'w' as above, the holder's
 * transaction found by the row's session_id, the waiters' sessions running
 * the locking UPDATE (its NEXTVAL names the sequence).
 */
static int inspect_seq_sql(struct mysql_conn *mc, const char *kx, char *sql, size_t size)
{
    const char *t = mc->table;
    return snprintf(sql, size,
                    "SELECT 'g' AS x, l.token AS a, l.owner AS b, l.session_id AS c,"
                    " GREATEST(0, " VIEWS_AGE_MS " - TIMESTAMPDIFF(MICROSECOND, l.acquired_at,"
                    " UTC_TIMESTAMP(6)) DIV 1000) AS d FROM `%s` l"
                    " WHERE l.k = X'%s' AND l.owner <> ''"
                    " UNION ALL SELECT 'p', COUNT(*), NULL, NULL, NULL"
                    " FROM information_schema.INNODB_TRX"
                    " UNION ALL SELECT 'w', w.trx_mysql_thread_id, w.trx_id,"
                    " (SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS q"
                    " WHERE q.requesting_trx_id = w.trx_id), w.trx_wait_started"
                    " FROM information_schema.INNODB_TRX w"
                    " JOIN information_schema.INNODB_LOCK_WAITS lw ON lw.requesting_trx_id = w.trx_id"
                    " WHERE w.trx_state = 'LOCK WAIT' AND lw.blocking_trx_id ="
                    " (SELECT h.trx_id FROM information_schema.INNODB_TRX h JOIN `%s` l"
                    " ON h.trx_mysql_thread_id = l.session_id WHERE l.k = X'%s'"
                    " AND l.owner <> '' LIMIT 1)"
                    " AND EXISTS (SELECT 1 FROM information_schema.PROCESSLIST p"
                    " WHERE p.ID = w.trx_mysql_thread_id AND p.COMMAND IN ('Query', 'Execute')"
                    " AND p.INFO LIKE '%%NEXTVAL(`%s_seq`)%%')",
                    t, kx, t, kx, t);
}

/*
 * token=table's held: whether the name's row is locked, asked of the row
 * itself, live (InnoDB's views are a snapshot that is not refreshed while
 * anybody read it in the last 0.1 s: a client inspecting in a loop, or
 * two, keep it stale for as long as they go on). A shared locking read
 * with NOWAIT in the control session's autocommit: refused at once when a
 * holder's (or a queued waiter's) exclusive lock is there, and when the
 * row is free a shared lock for the statement's own moment, which no
 * other inspect conflicts with and which a lock statement arriving then
 * waits out (microseconds; it queues no one and passes no one).
 */
static int row_locked(struct mysql_conn *mc, struct session *ctl, const char *kx, int mariadb,
                      const struct bound *b, int *locked)
{
    char sql[256];
    MYSQL_RES *res = NULL;
    snprintf(sql, sizeof sql, "SELECT 1 FROM `%s` WHERE k = X'%s' %s", mc->table, kx,
             mariadb ? "LOCK IN SHARE MODE NOWAIT" : "FOR SHARE NOWAIT");
    int err = query_result(mc, ctl, sql, b, "inspect", &res);
    *locked = 0;
    if (err == 0) {
        mysql_free_result(res);
        return 0;
    }
    if (!ctl->dead && (ctl->last_errno == ER_LOCK_WAIT_TIMEOUT || ctl->last_errno == ERR_LOCK_NOWAIT)) {
        dlock_clearerr(cl(mc));
        *locked = 1;
        return 0;
    }
    return err;
}

static int be_inspect(dlock_conn *conn, const char *name, size_t len, dlock_info *info)
{
    static const char what[] = "inspect";
    static const char hexd[] = "0123456789abcdef";
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    unsigned char k[DLOCK_SHA256_LEN];
    char kx[2 * DLOCK_SHA256_LEN + 1], sql[3072];
    struct session *ctl;
    MYSQL_RES *res = NULL;
    int err = 0;
    if (mc->named)
        return named_inspect(mc, name, len, info);
    dlock_sha256(name, len, k);
    for (size_t i = 0; i < DLOCK_SHA256_LEN; i++) {
        kx[2 * i] = hexd[k[i] >> 4];
        kx[2 * i + 1] = hexd[k[i] & 15];
    }
    kx[sizeof kx - 1] = '\0';
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    for (int tries = 0, again = 0; tries < 2; tries++) {
    retry:
        if ((err = ctl_session(mc, &call, &ctl)) != 0)
            goto failed;
        /* MySQL 8 has no INNODB_LOCK_WAITS (performance_schema's
         * data_lock_waits instead): no waiters there. */
        int mariadb = strstr(mysql_get_server_info(ctl->db), "MariaDB") != NULL;
        int n = mc->seq ? inspect_seq_sql(mc, kx, sql, sizeof sql) : snprintf(sql, sizeof sql,
                         /* c: held is row_locked's, not the views' (below) */
                         "SELECT 'g' AS x, g.token AS a, g.owner AS b, NULL AS c,"
                         " GREATEST(0, " VIEWS_AGE_MS " - TIMESTAMPDIFF(MICROSECOND, g.acquired_at,"
                         " UTC_TIMESTAMP(6)) DIV 1000) AS d FROM `%s_grants` g WHERE g.k = X'%s'"
                         " UNION ALL SELECT 'p', COUNT(*), NULL, NULL, NULL"
                         " FROM information_schema.INNODB_TRX",
                         mc->table, kx);
        if (mariadb && !mc->seq && n > 0 && (size_t)n < sizeof sql)
            n += snprintf(sql + n, sizeof sql - n,
                          " UNION ALL SELECT 'w', w.trx_mysql_thread_id, w.trx_id,"
                          " (SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS q"
                          " WHERE q.requesting_trx_id = w.trx_id), w.trx_wait_started"
                          " FROM information_schema.INNODB_TRX w"
                          " JOIN information_schema.INNODB_LOCK_WAITS lw"
                          " ON lw.requesting_trx_id = w.trx_id"
                          " WHERE w.trx_state = 'LOCK WAIT' AND lw.blocking_trx_id ="
                          " (SELECT " INSPECT_HOLDER " FROM `%s_grants` g WHERE g.k = X'%s')"
                          " AND EXISTS (SELECT 1 FROM information_schema.PROCESSLIST p"
                          " WHERE p.ID = w.trx_mysql_thread_id AND p.COMMAND IN ('Query', 'Execute')"
                          " AND p.INFO LIKE '%%FOR UPDATE')",
                          mc->table, mc->table, kx);
        if (n > 0 && (size_t)n < sizeof sql)
            n += snprintf(sql + n, sizeof sql - n, " ORDER BY x, c, d, b");
        if (n <= 0 || (size_t)n >= sizeof sql)
            return dlock_seterr(cl(mc), DLOCK_EINVAL, "mysql: inspect: statement too long");
        if ((err = query_result(mc, ctl, sql, &call, what, &res)) != 0) {
            if (!ctl->dead && ctl->last_errno == ER_SPECIFIC_ACCESS_DENIED_ERROR)
                return dlock_seterr(cl(mc), DLOCK_ENOTSUP,
                                    "mysql %s: inspecting MySQL locks needs the PROCESS privilege"
                                    " (information_schema.INNODB_TRX); grant it with"
                                    " GRANT PROCESS ON *.* TO user", mc->where);
            goto failed;
        }
        uint64_t token = 0, young = 0;
        int granted = 0, held = 0, seen = 0;
        char owner[33] = "";
        info->waiters = 0;
        info->listed = 0;
        for (MYSQL_ROW row; (row = mysql_fetch_row(res)) != NULL;) {
            if (!row[0])
                continue;
            if (row[0][0] == 'g' && row[1] && row[2]) {
                granted = 1;
                token = strtoull(row[1], NULL, 10);
                snprintf(owner, sizeof owner, "%s", row[2]);
                held = row[3] != NULL;
                young = row[4] ? strtoull(row[4], NULL, 10) : 0;
            } else if (row[0][0] == 'p') {
                seen = 1;
            } else if (row[0][0] == 'w' && row[1]) {
                if (info->listed < DLOCK_INFO_LISTED)
                    snprintf(info->waiter[info->listed++], DLOCK_HOLDER_MAX, "session %s", row[1]);
                info->waiters++;
            }
        }
        mysql_free_result(res);
        /* The grant was recorded after the views' snapshot may have been
         * taken: read them again once the snapshot has expired. */
        if (young && !again && dlock_monotonic_ns() + 110 * MS < call.until) {
            again = 1;
            /* 0.1 s without reads refreshes it */
            if ((err = pause_ms(mc, 110, call.until, -1)) != 0)
                return dlock_seterr(cl(mc), err, "mysql %s: inspect: interrupted", mc->where);
            memset(info->waiter, 0, sizeof info->waiter);
            goto retry;
        }
        if (!seen)
            return dlock_seterr(cl(mc), DLOCK_EPROTO,
                                "mysql %s: inspect: information_schema.INNODB_TRX gave no count",
                                mc->where);
        /* token=table: held is the row's lock, the grant the latest
         * recorded (the views above only find the holder's transaction
         * for the waiters it blocks). */
        if (!mc->seq && (err = row_locked(mc, ctl, kx, mariadb, &call, &held)) != 0)
            goto failed;
        /* token=sequence keeps no token of a free name (one sequence for
         * every name; a grant is never committed). */
        info->known |= DLOCK_KNOWS_HELD | (mc->seq ? 0 : DLOCK_KNOWS_LAST_TOKEN);
        info->held = held;
        info->last_token = granted && !mc->seq ? token : 0;
        if (held && granted) {
            info->token = token;
            info->known |= DLOCK_KNOWS_TOKEN;
            if (strlen(owner) == 32) {
                snprintf(info->owner, sizeof info->owner, "%s", owner);
                info->known |= DLOCK_KNOWS_OWNER;
            }
        }
        if (mariadb)
            info->known |= DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_ORDER;
        return 0;
    failed:
        if (!ctl_dropped(mc))
            return err;
    }
    return err;
}

/* token=sequence without a control session: SELECT 1 on an idle lock
 * session (it reads no table, so opens no transaction), which goes back to
 * the pool; one the server dropped while idle is replaced once. */
static int ping_pooled(struct mysql_conn *mc)
{
    int err = 0;
    for (int tries = 0; tries < 2; tries++) {
        struct session *s;
        int pooled = 0;
        if ((err = pool_get(mc, NULL, &s, &pooled)) != 0)
            return err;
        struct bound b = stmt_bound(NULL, mc->timeout_ms);
        if ((err = run(mc, s, NB_QUERY, NULL, "SELECT 1", &b, "SELECT 1")) == 0 &&
            (err = run(mc, s, NB_STORE, NULL, NULL, &b, "SELECT 1")) == 0) {
            pool_put(mc, s);
            return 0;
        }
        int retry = s->dead && !s->silent_ms;
        session_close(s);
        if (!retry)
            return err;
        dlock_clearerr(cl(mc));
    }
    return err;
}

static int be_ping(dlock_conn *conn)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    struct session *ctl;
    int err;
    if (mc->seq && !mc->ctl && !mc->named)
        return ping_pooled(mc);
    for (int tries = 0; tries < 2; tries++) {
        if ((err = ctl_session(mc, NULL, &ctl)) != 0)
            return err;
        struct bound b = stmt_bound(NULL, mc->timeout_ms);
        if ((err = run(mc, ctl, NB_QUERY, NULL, "SELECT 1", &b, "SELECT 1")) == 0 &&
            (err = run(mc, ctl, NB_STORE, NULL, NULL, &b, "SELECT 1")) == 0)
            return 0;
        if (!ctl_dropped(mc))
            return err;
    }
    return err;
}

/* ---- named locks (lock=named) ------------------------------------------- */

/*
 * Threads: the keeper calls keep() while the application's thread may be in
 * any other method, and a session is shared by several locks, so keep() of
 * one lock and the application's try, renew or release of another may meet
 * on one session. Each session's mutex is held around one exchange (a
 * statement and its reply, bounded by `timeout`) and around every change to
 * what keep() reads: the session's connection, lease, list of handles and
 * their state. A use of a shared session holds it for a few exchanges at
 * most (see the header: 5 for a try), never across a connect: an acquire's
 * durable-mark checkpoint unlocks it (pending_s keeps that grant's lease
 * from being lowered meanwhile). A blocking GET_LOCK runs on a session that holds nothing,
 * which keep() never touches. The list of sessions (mc->nsess) belongs to
 * the application's thread; a session struct lives while a handle points
 * to it. One mutex at a time.
 */

/* The user lock of key k: MariaDB's names are server-wide (every database
 * shares them), so the database and the table are in the hash. */
static void named_lock_name(const struct mysql_conn *mc, const unsigned char *k, char *out)
{
    unsigned char in[2 * DLOCK_SHA256_LEN], d[DLOCK_SHA256_LEN];
    char hex[2 * DLOCK_SHA256_LEN + 1];
    memcpy(in, mc->salt, DLOCK_SHA256_LEN);
    memcpy(in + DLOCK_SHA256_LEN, k, DLOCK_SHA256_LEN);
    dlock_sha256(in, sizeof in, d);
    dlock_hex(d, sizeof d, hex);
    snprintf(out, 7 + 58, "dlock:%.58s", hex);
}

static int named_add(struct mysql_conn *mc, struct session *s)
{
    if (mc->nn == mc->ncap) {
        size_t cap = mc->ncap ? 2 * mc->ncap : 8;
        struct session **p = realloc(mc->nsess, cap * sizeof *p);
        if (!p)
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
        mc->nsess = p;
        mc->ncap = cap;
    }
    mc->nsess[mc->nn++] = s;
    return 0;
}

/* Closes sessions that hold nothing beyond IDLE_SESSIONS_MAX live ones, and
 * frees the structs of closed ones no handle points to. */
static void named_trim(struct mysql_conn *mc)
{
    size_t idle = 0, o = 0;
    for (size_t i = 0; i < mc->nn; i++) {
        struct session *s = mc->nsess[i];
        if (s->nheld == 0 && !s->waiting) {
            if (s->db && !s->dead && idle < IDLE_SESSIONS_MAX) {
                idle++;
            } else {
                session_close(s);
                continue;
            }
        }
        mc->nsess[o++] = s;
    }
    mc->nn = o;
}

/* A session that holds nothing, live (as far as the client knows), or a
 * new one; *opened says which. Not locked: only the application's thread
 * sees a session without handles. */
static int named_free_session(struct mysql_conn *mc, struct bound *call, struct session **out,
                              int *opened)
{
    *opened = 0;
    for (size_t i = 0; i < mc->nn; i++) {
        struct session *s = mc->nsess[i];
        if (s->nheld == 0 && !s->waiting && s->db && !s->dead) {
            *out = s;
            return 0;
        }
    }
    int err = session_open(mc, 2, call, out);
    if (err == 0 && (err = named_add(mc, *out)) != 0)
        session_close(*out);
    *opened = err == 0;
    return err;
}

static int named_holds(const struct session *s, const char *lname)
{
    for (const struct mysql_held *h = s->held; h; h = h->next)
        if (!h->gone && strcmp(h->lname, lname) == 0)
            return 1;
    return 0;
}

/* A live session of this lease with locks and room, not holding lname
 * already (GET_LOCK nests on one session: a second grant there would be no
 * exclusion), its mutex locked; NULL if none. */
static struct session *named_holder(struct mysql_conn *mc, unsigned lease_s, const char *lname)
{
    for (size_t i = 0; i < mc->nn; i++) {
        struct session *s = mc->nsess[i];
        if (s->nheld == 0 || s->nheld >= NAMED_LOCKS_MAX || s->waiting)
            continue;
        pthread_mutex_lock(&s->mu);
        if (s->db && !s->dead && s->wait_timeout_s == lease_s && !named_holds(s, lname))
            return s;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* An expression that fails (ER_SUBQUERY_NO_1_ROW) where it is evaluated:
 * IF evaluates only the branch taken, so IF(ours, v, NOT_OURS) is v or an
 * error, in a statement answered by an OK packet. (NULL would not do: SET
 * takes it as 1 second, and a string makes the IF a string.) */
#define NOT_OURS "(SELECT 1 UNION ALL SELECT 2)"

/* How many stale locks one use of a session lets go at most (one
 * statement, so the mutex is held for one exchange more; the rest go at
 * the next uses). */
#define EXPIRE_BATCH 64

/* Whether s holds a live lock other than self: no reply in time on s
 * would close it and lose them, so a statement there gets a full
 * `timeout` of its own, counted once its mutex is taken. */
static int named_mates(const struct session *s, const struct mysql_held *self)
{
    for (const struct mysql_held *m = s->held; m; m = m->next)
        if (m != self && !m->gone)
            return 1;
    return 0;
}

/*
 * Locks on s, other than self, whose lease as their holder counts it has
 * ended: released now and marked gone (their handles report DLOCK_ELOST).
 * Alone on its session such a lock would go with the session when its
 * wait_timeout runs out; among mates that keep the session busy it would
 * stay held. s->mu held; one round trip (bounded by a `timeout` of its own:
 * s is shared), only when there is something to do, EXPIRE_BATCH at most.
 */
static void named_expire(struct mysql_conn *mc, struct session *s, const struct mysql_held *self)
{
    struct mysql_held *batch[EXPIRE_BATCH];
    char sql[16 + EXPIRE_BATCH * 90];
    uint64_t now = dlock_monotonic_ns();
    {
        size_t n = 0, o = 0;
        for (struct mysql_held *h = s->held; h && n < EXPIRE_BATCH; h = h->next)
            if (h != self && !h->gone && h->expires_ns <= now)
                batch[n++] = h;
        if (n == 0 || !s->db)
            return;
        o += (size_t)snprintf(sql, sizeof sql, "SELECT ");
        for (size_t i = 0; i < n; i++)
            o += (size_t)snprintf(sql + o, sizeof sql - o, "%sRELEASE_LOCK('%s')", i ? ", " : "",
                                  batch[i]->lname);
        dlock_errsave why;
        MYSQL_RES *res = NULL;
        struct bound b = stmt_bound(NULL, mc->timeout_ms);
        dlock_err_save(cl(mc), &why); /* not what the caller reports */
        int err = query_result(mc, s, sql, &b, "releasing locks whose lease ended", &res);
        dlock_err_restore(cl(mc), &why);
        if (err) {
            if (s->dead) /* a session gone takes them all */
                session_disconnect(s);
            return; /* else tried again at the next use */
        }
        mysql_free_result(res);
        for (size_t i = 0; i < n; i++)
            batch[i]->gone = 1;
    }
}

/* Why h is gone, for messages. */
static const char *named_lost_why(const struct mysql_held *h)
{
    if (h->gone)
        return "its lease had ended without a renewal, and it was released on the session it"
               " shared with locks that were still in use";
    if (h->s->silent_ms)
        return "the session holding it was closed after the server did not answer in time";
    return "the session holding it ended (its lease ran out, a KILL, or the connection was lost)";
}

/* A statement failed on s (err recorded): the session is gone if the
 * server dropped it or did not answer, and every lock on it with it. */
static int named_failed(struct session *s, int err)
{
    if (s->dead)
        session_disconnect(s);
    return err;
}

/* Undoes a grant on s whose handle will not be made (its token could not
 * be made durable); closes the session if even that fails. */
static void named_undo(struct mysql_conn *mc, struct session *s, const char *lname)
{
    char sql[128];
    MYSQL_RES *res = NULL;
    dlock_errsave why;
    struct bound b = stmt_bound(NULL, mc->timeout_ms);
    if (!s->db)
        return;
    dlock_err_save(cl(mc), &why);
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK('%s')", lname);
    if (query_result(mc, s, sql, &b, "undoing a grant", &res) == 0) {
        mysql_free_result(res);
    } else {
        s->dead = 1;
        session_disconnect(s);
    }
    dlock_err_restore(cl(mc), &why);
}

/* The acquire statement failed (err recorded) on s, which did not hold
 * lname before (named_holds): if s is live, GET_LOCK may have granted it
 * before the failure (NEXTVAL out of values, a result that could not be
 * read), and a handle-less grant would stay on s (forever among mates, or
 * nested by a later GET_LOCK on a pooled s): released, or s closed. */
static int named_unget(struct mysql_conn *mc, struct session *s, const char *lname, int err)
{
    if (!s->dead)
        named_undo(mc, s, lname);
    return named_failed(s, err);
}

/*
 * One GET_LOCK on s, with the token in the same statement:
 *
 *   SELECT IF(GET_LOCK('dlock:<hash>', t) = 1, NEXTVAL(<table>_seq), 0)
 *
 * NEXTVAL is evaluated only when the lock was granted (a refused or timed
 * out GET_LOCK takes no value), once it was, so tokens grow in grant order.
 * t: 0 for a try, what is left of a deadline (GET_LOCK takes fractions of
 * a second), a year (its maximum) without one. The client waits for the
 * answer: a try `timeout`, a deadline until CLEANUP_MS past it, a wait
 * without one unbounded (TCP keepalives). Returns 1 (granted, *token), 0
 * (not granted) or an error. A wait cut short (signal, cancel, no answer)
 * has its session killed from the control session and closed (whatever it
 * got is freed with it).
 */
static int named_get(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                     const char *lname, uint64_t until, uint64_t *token)
{
    char sql[256], t[48];
    uint64_t start = dlock_monotonic_ns();
    if (req->wait == DLOCK_WAIT_TRY) {
        snprintf(t, sizeof t, "0");
    } else if (req->wait == DLOCK_WAIT_DEADLINE) {
        uint64_t left_us = req->deadline_ns > start ? (req->deadline_ns - start) / 1000u : 0;
        snprintf(t, sizeof t, "%" PRIu64 ".%06" PRIu64, left_us / 1000000u, left_us % 1000000u);
    } else {
        snprintf(t, sizeof t, "%u", MDL_WAIT_MAX_S);
    }
    snprintf(sql, sizeof sql, "SELECT IF(GET_LOCK('%s', %s) = 1, NEXTVAL(`%s_seq`), 0)", lname, t,
             mc->table);
    struct nb c = {.op = NB_QUERY, .db = s->db, .sql = sql};
    nb_step(&c, -1);
    int w = nb_wait(&c, until, req->wait != DLOCK_WAIT_TRY,
                    req->wait != DLOCK_WAIT_TRY ? req->cancel_fd : -1);
    if (w == -1 && req->wait == DLOCK_WAIT_TRY)
        return named_failed(s, no_reply(mc, s, "acquire", start, DLOCK_ECONNECT));
    if (w != 0) {
        char kill[64];
        struct session *ctl;
        struct bound kb = {dlock_monotonic_ns() + CLEANUP_MS * MS, DLOCK_ECONNECT, 0};
        dlock_errsave why;
        int err = w == -2   ? dlock_seterr(cl(mc), DLOCK_EINTR, "a signal interrupted the wait")
                  : w == -3 ? dlock_cancelled(cl(mc))
                            : dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                                           "the deadline passed with the lock still held elsewhere"
                                           " (the server did not end the wait in time)");
        dlock_err_save(cl(mc), &why);
        snprintf(kill, sizeof kill, "KILL %lu", mysql_thread_id(s->db));
        if (ctl_session(mc, &kb, &ctl) == 0 && run(mc, ctl, NB_QUERY, NULL, kill, &kb, "KILL") != 0)
            ctl_dropped(mc);
        dlock_err_restore(cl(mc), &why);
        s->dead = 1;
        s->silent_ms = (dlock_monotonic_ns() - start) / MS + 1;
        session_disconnect(s);
        return err;
    }
    if (c.ret != 0)
        return named_unget(mc, s, lname, fail_on(mc, s, NULL, "acquire"));
    struct nb r = {.op = NB_STORE, .db = s->db};
    struct bound rb = stmt_bound(NULL, s->nheld ? mc->timeout_ms : CLEANUP_MS);
    nb_step(&r, -1);
    if (nb_finish(&r, rb.until, 0) != 0)
        return named_failed(s, no_reply(mc, s, "acquire", start, DLOCK_ECONNECT));
    if (!r.res)
        return named_unget(mc, s, lname, fail_on(mc, s, NULL, "acquire"));
    MYSQL_ROW row = mysql_fetch_row(r.res);
    *token = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
    mysql_free_result(r.res);
    return *token != 0;
}

/* One attempt on s (s->mu held): sets its lease first if it has none of
 * this length yet (a session holding nothing), then GET_LOCK, and makes
 * the token durable. 0 granted (*replied: when the last reply on s came,
 * where the server's idle timer, the lease, starts), else an error
 * (DLOCK_EBUSY, DLOCK_ETIMEDOUT...). On a shared session each statement
 * gets a `timeout` of its own, not what is left of the try's (until is
 * then ignored); the durable mark's checkpoint (the control session: a
 * connect, a commit) runs with s->mu unlocked, so keep() of s's mates
 * does not wait for it. */
static int named_attempt(struct mysql_conn *mc, struct session *s, const dlock_request *req,
                         const char *lname, struct bound *call, uint64_t until, uint64_t *token,
                         uint64_t *replied)
{
    unsigned lease = ceil_s(req->ttl_ms);
    int err, behind = 0;
    if (s->nheld)
        named_expire(mc, s, NULL);
    if (!s->db)
        return dlock_seterr(cl(mc), DLOCK_ECONNECT, "mysql %s: the session ended", mc->where);
    if (s->nheld == 0 && s->wait_timeout_s != lease) {
        char sql[64];
        snprintf(sql, sizeof sql, "SET SESSION wait_timeout = %u", lease);
        if ((err = exec_sql(mc, s, sql, call, "setting the session's lease")) != 0)
            return named_failed(s, err);
        s->wait_timeout_s = lease;
    }
    int shared = named_mates(s, NULL);
    if (shared)
        until = dlock_monotonic_ns() + mc->timeout_ms * MS;
    err = named_get(mc, s, req, lname, until, token);
    *replied = dlock_monotonic_ns();
    if (err < 0 || err > 1)
        return err;
    if (err == 0) {
        if (req->wait == DLOCK_WAIT_TRY)
            return dlock_seterr(cl(mc), DLOCK_EBUSY, "the lock is held by another owner");
        if (req->wait == DLOCK_WAIT_DEADLINE)
            return dlock_seterr(cl(mc), DLOCK_ETIMEDOUT,
                                "the deadline passed with the lock still held elsewhere");
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: GET_LOCK ended without the lock (killed?)", mc->where);
    }
    /* The mark (once per range) may need the control session and a
     * commit: `timeout` at least, as any statement. */
    struct bound db = stmt_bound(NULL, mc->timeout_ms > CLEANUP_MS ? mc->timeout_ms : CLEANUP_MS);
    if (req->wait == DLOCK_WAIT_TRY && !shared)
        db = *call;
    if ((err = seq_mark_read(mc, s, *token, &db, &behind, replied)) != 0) {
        if (s->dead)
            session_disconnect(s);
        else
            named_undo(mc, s, lname);
        return err;
    }
    if (!behind)
        return 0;
    if (shared)
        db = stmt_bound(NULL, mc->timeout_ms);
    s->pending_s = lease;
    pthread_mutex_unlock(&s->mu);
    err = seq_mark_past(mc, *token, &db);
    pthread_mutex_lock(&s->mu);
    s->pending_s = 0;
    if (!s->db) /* keep() of a mate found the session gone meanwhile */
        return err ? err
                   : dlock_seterr(cl(mc), DLOCK_ECONNECT, "mysql %s: acquire: the session"
                                  " holding the new lock ended before its token was on disk",
                                  mc->where);
    if (err)
        named_undo(mc, s, lname);
    return err;
}

/*
 * A waiting session the server dropped, not one idle long enough to have
 * been dropped for that: was the server restarted since since_ns (queue
 * again), or was the session killed alone (an administrator's KILL: not
 * waited on again)? A session that holds nothing (opened if need be)
 * reads the server's uptime: restarted if it started after since_ns
 * (whole seconds). While the server does not answer, tries again every
 * 100 ms to 1 s, until the deadline, or for connect_timeout without one.
 * 0 with *restarted set, or the error.
 */
static int named_restarted(struct mysql_conn *mc, const dlock_request *req, uint64_t since_ns,
                           struct bound *call, int *restarted)
{
    uint64_t down_since = dlock_monotonic_ns(), backoff = 100;
    uint64_t give_up = req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns
                                                        : down_since + mc->connect_ms * MS;
    int err;
    for (int dead = 0;;) {
        struct session *s;
        MYSQL_RES *res = NULL;
        int opened;
        if ((err = named_free_session(mc, call, &s, &opened)) == 0) {
            struct bound b = stmt_bound(call, mc->timeout_ms);
            err = query_result(mc, s, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                               " WHERE VARIABLE_NAME = 'UPTIME'", &b, "checking the server",
                               &res);
            if (err == 0) {
                MYSQL_ROW row = mysql_fetch_row(res);
                uint64_t up_s = row && row[0] ? strtoull(row[0], NULL, 10) : UINT64_MAX;
                mysql_free_result(res);
                s->idle_since = dlock_monotonic_ns();
                *restarted = up_s <= (dlock_monotonic_ns() - since_ns) / (1000 * MS) + 1;
                dlock_clearerr(cl(mc));
                return 0;
            }
            named_failed(s, err);
            named_trim(mc);
            if (!opened && dead++ < IDLE_SESSIONS_MAX)
                continue; /* a free session the restart dropped too */
        }
        if (err != DLOCK_ECONNECT && err != DLOCK_ETIMEDOUT)
            return err;
        uint64_t now = dlock_monotonic_ns();
        if (now + backoff * MS >= give_up)
            return dlock_seterr(cl(mc), err == DLOCK_ETIMEDOUT ? DLOCK_ETIMEDOUT : DLOCK_ECONNECT,
                                "mysql %s: the server dropped the waiting session and was not"
                                " back in time (%s)", mc->where,
                                req->wait == DLOCK_WAIT_DEADLINE ? "deadline" : "connect_timeout");
        if ((err = pause_ms(mc, backoff, give_up, req->cancel_fd)) == DLOCK_EINTR)
            return dlock_seterr(cl(mc), err, "a signal interrupted the wait");
        if (err)
            return err;
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
        dead = 0;
    }
}

/*
 * A try runs on a session holding locks of the same lease (shared, up to
 * NAMED_LOCKS_MAX), else on one holding nothing, and the grant stays there.
 * A wait first tries so on a shared session (most waits need not wait),
 * then waits on a session holding nothing: a session blocked in GET_LOCK
 * could not renew or release its other locks. A deadline nearer than
 * `timeout` skips the first try: a bound that ran out on a shared session
 * would close it and lose its mates.
 */
static int named_acquire(struct mysql_conn *mc, const dlock_request *req, dlock_held **heldp)
{
    struct mysql_held *h = calloc(1, sizeof *h);
    struct session *s = NULL;
    uint64_t start = dlock_monotonic_ns(), token = 0, replied = 0;
    unsigned lease = ceil_s(req->ttl_ms);
    int err = 0;
    if (!h)
        return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
    dlock_sha256(req->name, req->name_len, h->k);
    named_lock_name(mc, h->k, h->lname);
    struct bound call = {0, DLOCK_ECONNECT, 0};
    if (req->wait == DLOCK_WAIT_DEADLINE)
        call = (struct bound){req->deadline_ns, DLOCK_ETIMEDOUT, 0};
    else if (req->wait == DLOCK_WAIT_TRY)
        call = (struct bound){start + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if (req->wait != DLOCK_WAIT_TRY &&
        (req->wait == DLOCK_WAIT_FOREVER || req->deadline_ns >= start + mc->timeout_ms * MS) &&
        (s = named_holder(mc, lease, h->lname)) != NULL) {
        dlock_request t = *req;
        /* Counted once s->mu is ours (named_attempt counts again per
         * statement: s is shared). */
        struct bound tb = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 0};
        t.wait = DLOCK_WAIT_TRY;
        if (named_attempt(mc, s, &t, h->lname, &tb, tb.until, &token, &replied) == 0)
            goto granted;
        pthread_mutex_unlock(&s->mu);
        dlock_clearerr(cl(mc));
        s = NULL;
    }
    for (int tries = 0;; tries++) {
        int opened = 0, stale = 1;
        uint64_t attempt = dlock_monotonic_ns();
        if (req->wait == DLOCK_WAIT_TRY && (s = named_holder(mc, lease, h->lname)) != NULL) {
            opened = 0;
        } else {
            if ((err = named_free_session(mc, &call, &s, &opened)) != 0)
                break;
            pthread_mutex_lock(&s->mu);
            s->waiting = req->wait != DLOCK_WAIT_TRY;
            /* Idle for a second or more: the server may have dropped it
             * for that (wait_timeout counts whole seconds). */
            stale = !opened && dlock_monotonic_ns() - s->idle_since >= 1000 * MS;
        }
        uint64_t until = req->wait == DLOCK_WAIT_TRY        ? call.until
                         : req->wait == DLOCK_WAIT_DEADLINE ? req->deadline_ns + CLEANUP_MS * MS
                                                            : 0;
        err = named_attempt(mc, s, req, h->lname, &call, until, &token, &replied);
        s->waiting = 0;
        if (err == 0)
            goto granted;
        int gone = !s->db, silent = s->silent_ms != 0;
        if (s->nheld == 0)
            s->idle_since = dlock_monotonic_ns();
        pthread_mutex_unlock(&s->mu);
        /* A session reused after it may have been dropped while idle (its
         * lease, a restart): once more on another. Not one that did not
         * answer (a retry would wait as long again). A wait whose session
         * was dropped otherwise queues again if the server restarted, not
         * if the session was killed alone (an administrator's KILL is not
         * waited on again). */
        if (!gone || silent || err == DLOCK_EBUSY || err == DLOCK_ETIMEDOUT || err == DLOCK_EINTR ||
            err == DLOCK_ECANCELED)
            break;
        if (req->wait != DLOCK_WAIT_TRY && (opened || !stale || tries > 0)) {
            unsigned why = s->last_errno;
            int restarted = 0;
            if ((err = named_restarted(mc, req, attempt, &call, &restarted)) != 0)
                break;
            if (!restarted) {
                err = dlock_seterr(cl(mc), DLOCK_ECONNECT,
                                   "mysql %s: waiting for the lock: the waiting session was"
                                   " killed (error %u; KILL from another session?) while the"
                                   " server kept answering: not waited on again", mc->where,
                                   why);
                break;
            }
        } else if (opened || tries > 0) {
            break;
        }
        dlock_count_reconnect(cl(mc)); /* the next attempt opens or takes another */
        dlock_clearerr(cl(mc));
    }
    named_trim(mc);
    free(h);
    return err;
granted:
    h->base.token = token;
    h->s = s;
    h->ttl_ms = req->ttl_ms;
    /* From the last reply on s, where the server's idle timer started: not
     * after a checkpoint on the control session. */
    h->expires_ns = replied + (uint64_t)req->ttl_ms * MS;
    if (req->wait != DLOCK_WAIT_TRY) /* the lease counts from the grant */
        h->base.lease_end_ns = h->expires_ns;
    h->next = s->held;
    if (s->held)
        s->held->prev = h;
    s->held = h;
    s->nheld++;
    pthread_mutex_unlock(&s->mu);
    *heldp = &h->base;
    return 0;
}

static int named_release(struct mysql_conn *mc, struct mysql_held *h)
{
    struct session *s = h->s;
    char sql[192];
    int err = 0;
    pthread_mutex_lock(&s->mu);
    if (h->gone || !s->db) {
        err = dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: release: the lock was lost: %s",
                           mc->where, named_lost_why(h));
    } else {
        named_expire(mc, s, h);
        struct bound b = stmt_bound(NULL, mc->timeout_ms);
        snprintf(sql, sizeof sql,
                 "SET @dlock_released = IF(RELEASE_LOCK('%s') = 1, 1, " NOT_OURS ")", h->lname);
        if (!s->db) {
            err = dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: release: the lock was lost: %s",
                               mc->where, named_lost_why(h));
        } else if ((err = run(mc, s, NB_QUERY, NULL, sql, &b, "release")) != 0) {
            if (!s->dead && s->last_errno == ER_SUBQUERY_NO_1_ROW)
                err = dlock_seterr(cl(mc), DLOCK_ELOST,
                                   "mysql %s: release: the session no longer held the lock",
                                   mc->where);
            else if (s->dead && !s->silent_ms)
                err = dlock_seterr(cl(mc), DLOCK_ELOST,
                                   "mysql %s: release: the server dropped the session holding"
                                   " the lock (%s): the lock is lost", mc->where,
                                   mysql_error(s->db));
            else if (!s->dead) /* RELEASE_LOCK failed on a live session: it may hold it still */
                s->dead = 1;
            if (s->dead)
                session_disconnect(s);
        } else if (dlock_monotonic_ns() >= h->expires_ns) {
            err = lease_over(mc, h, "release");
        }
    }
    if (h->prev)
        h->prev->next = h->next;
    else
        s->held = h->next;
    if (h->next)
        h->next->prev = h->prev;
    if (--s->nheld == 0)
        s->idle_since = dlock_monotonic_ns();
    pthread_mutex_unlock(&s->mu);
    if (s->nheld == 0)
        named_trim(mc);
    free(h);
    return err;
}

/*
 * Renews h on its session (s->mu held) in one statement answered by an OK
 * packet (no result set to read):
 *
 *   SET SESSION wait_timeout = IF(IS_USED_LOCK(n) = CONNECTION_ID(), L, NOT_OURS)
 *
 * It proves the lock is still ours (IS_USED_LOCK names the session: a
 * GET_LOCK lock ends only with RELEASE_LOCK, which only its holder can do,
 * or with its session), sets the lease L, the longest the session's live
 * locks need (each mate's TTL rounded up: no mate's lease is cut short,
 * and one released no longer holds the others' up), and restarts the
 * session's idle timer. Stale mates are let go first. Each statement gets
 * `timeout` from when it starts; keep (the keeper's renewal) caps it by
 * h's lease end only when h is alone on s (a bound that runs out closes
 * the session: among mates, h's lease end must not cost them theirs), and
 * a reply that comes after h's lease end is then DLOCK_EEXPIRED for h
 * alone (h not renewed, the session kept). 0, DLOCK_ELOST, or the error.
 */
static int named_renew_on(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms, int keep)
{
    struct session *s = h->s;
    char sql[192];
    int err;
    if (h->gone || !s->db)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: the lock was lost: %s", mc->where,
                            named_lost_why(h));
    named_expire(mc, s, h);
    if (!s->db)
        return dlock_seterr(cl(mc), DLOCK_ELOST, "mysql %s: the lock was lost: %s", mc->where,
                            named_lost_why(h));
    unsigned lease = ceil_s(ttl_ms) > s->pending_s ? ceil_s(ttl_ms) : s->pending_s;
    int shared = s->pending_s != 0;
    for (const struct mysql_held *m = s->held; m; m = m->next)
        if (m != h && !m->gone) {
            shared = 1;
            if (ceil_s(m->ttl_ms) > lease)
                lease = ceil_s(m->ttl_ms);
        }
    uint64_t sent = dlock_monotonic_ns();
    struct bound b = {sent + mc->timeout_ms * MS, DLOCK_ECONNECT, 0};
    if (keep && !shared && h->expires_ns < b.until)
        b.until = h->expires_ns;
    snprintf(sql, sizeof sql, "SET SESSION wait_timeout = IF(IS_USED_LOCK('%s') = CONNECTION_ID(),"
             " %u, " NOT_OURS ")", h->lname, lease);
    if ((err = run(mc, s, NB_QUERY, NULL, sql, &b, "renew")) != 0) {
        if (s->dead || s->last_errno != ER_SUBQUERY_NO_1_ROW)
            goto failed;
        h->gone = 1;
        return dlock_seterr(cl(mc), DLOCK_ELOST,
                            "mysql %s: renew: the session no longer holds the lock", mc->where);
    }
    s->wait_timeout_s = lease;
    if (keep && dlock_monotonic_ns() >= h->expires_ns)
        return dlock_seterr(cl(mc), DLOCK_EEXPIRED,
                            "mysql %s: the lease (%" PRIu32 " ms) ran out before the renewal's"
                            " reply came", mc->where, h->ttl_ms);
    h->ttl_ms = ttl_ms;
    h->expires_ns = sent + (uint64_t)ttl_ms * MS;
    return 0;
failed:
    if (s->dead && !s->silent_ms)
        err = dlock_seterr(cl(mc), DLOCK_ELOST,
                           "mysql %s: renew: the server dropped the session holding the lock"
                           " (%s): the lock is lost", mc->where, mysql_error(s->db));
    return named_failed(s, err);
}

static int named_renew(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms)
{
    struct session *s = h->s;
    int err;
    pthread_mutex_lock(&s->mu);
    uint64_t now = dlock_monotonic_ns();
    if (!h->gone && s->db && now >= h->expires_ns) {
        /* Possibly still ours on the server, but the lease is over: free
         * it for others, never extend it. */
        named_undo(mc, s, h->lname);
        h->gone = 1;
        err = lease_over(mc, h, "renew");
    } else {
        err = named_renew_on(mc, h, ttl_ms, 0);
    }
    pthread_mutex_unlock(&s->mu);
    return err;
}

/* The keeper's renewal: as renew, bounded by the lease's end too when h is
 * alone on its session (see named_renew_on); touches h's session only (a
 * session that fails is closed, its struct kept). */
static int named_keep(struct mysql_conn *mc, struct mysql_held *h, uint32_t ttl_ms)
{
    struct session *s = h->s;
    int err;
    pthread_mutex_lock(&s->mu);
    uint64_t now = dlock_monotonic_ns();
    if (!h->gone && s->db && now >= h->expires_ns) {
        err = dlock_seterr(cl(mc), DLOCK_EEXPIRED,
                           "mysql %s: the lease (%" PRIu32 " ms) had run out before it could be"
                           " renewed", mc->where, h->ttl_ms);
    } else {
        err = named_renew_on(mc, h, ttl_ms, 1);
        if (err == DLOCK_ECONNECT && !s->db)
            err = DLOCK_EEXPIRED;
    }
    pthread_mutex_unlock(&s->mu);
    return err;
}

/* raise_token: proves the lock (as renew, keeping the lease's end), then
 * SETVAL on its session, then the durable mark past it (token=sequence),
 * the mark with s->mu unlocked. Each statement gets its own `timeout`. */
static int named_raise(struct mysql_conn *mc, struct mysql_held *h, uint64_t floor)
{
    static const char what[] = "raising the token";
    struct session *s = h->s;
    char sql[160];
    MYSQL_RES *res = NULL;
    uint64_t mark = 0;
    int err;
    pthread_mutex_lock(&s->mu);
    uint64_t now = dlock_monotonic_ns();
    if (!h->gone && s->db && now >= h->expires_ns) {
        named_undo(mc, s, h->lname);
        h->gone = 1;
        pthread_mutex_unlock(&s->mu);
        return lease_over(mc, h, what);
    }
    uint32_t left = (uint32_t)((h->expires_ns - now + MS - 1) / MS), ttl = h->ttl_ms;
    uint64_t expires = h->expires_ns;
    if ((err = named_renew_on(mc, h, left, 0)) == 0) {
        h->expires_ns = expires; /* proven, not renewed */
        h->ttl_ms = ttl;
        struct bound b = stmt_bound(NULL, mc->timeout_ms);
        snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %" PRIu64 ")", mc->table, floor);
        if ((err = query_result(mc, s, sql, &b, what, &res)) != 0)
            err = named_failed(s, err);
        else
            mysql_free_result(res);
    }
    pthread_mutex_unlock(&s->mu);
    if (err)
        return err;
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    if ((err = seq_checkpoint(mc, &call, &mark)) != 0)
        return err;
    if (mark > mc->durable)
        mc->durable = mark;
    return 0;
}

/*
 * inspect: one statement on the control session. IS_USED_LOCK names the
 * holder's session (its connection id); the waiters are the sessions
 * running GET_LOCK of the name (PROCESSLIST, live; other users' sessions
 * only with the PROCESS privilege), the longest waiting first (TIME_MS):
 * MariaDB grants a user lock to its waiters in arrival order. Not known:
 * the owner id, the token and the lease (kept on the holder's session
 * only), the last token of a free name.
 */
static int named_inspect(struct mysql_conn *mc, const char *name, size_t len, dlock_info *info)
{
    static const char what[] = "inspect";
    unsigned char k[DLOCK_SHA256_LEN];
    char lname[7 + 58], sql[768];
    struct session *ctl;
    MYSQL_RES *res = NULL;
    int err = 0;
    dlock_sha256(name, len, k);
    named_lock_name(mc, k, lname);
    snprintf(sql, sizeof sql,
             "SELECT 'g' AS x, IS_USED_LOCK('%s') AS a, 0 AS t UNION ALL"
             " SELECT 'w', ID, TIME_MS FROM information_schema.PROCESSLIST"
             " WHERE INFO LIKE 'SELECT IF(GET_LOCK(''%s'',%%' AND COMMAND = 'Query'"
             " AND ID <> CONNECTION_ID() AND ID <> COALESCE(IS_USED_LOCK('%s'), 0)"
             " ORDER BY x, t DESC, a",
             lname, lname, lname);
    struct bound call = {dlock_monotonic_ns() + mc->timeout_ms * MS, DLOCK_ECONNECT, 1};
    for (int tries = 0; tries < 2; tries++) {
        if ((err = ctl_session(mc, &call, &ctl)) == 0 &&
            (err = query_result(mc, ctl, sql, &call, what, &res)) == 0)
            break;
        if (!ctl_dropped(mc))
            return err;
    }
    if (err)
        return err;
    info->held = 0;
    info->waiters = 0;
    info->listed = 0;
    for (MYSQL_ROW row; (row = mysql_fetch_row(res)) != NULL;) {
        if (!row[0] || !row[1])
            continue;
        if (row[0][0] == 'g') {
            info->held = 1;
            snprintf(info->owner, sizeof info->owner, "session %s", row[1]);
        } else if (row[0][0] == 'w') {
            if (info->listed < DLOCK_INFO_LISTED)
                snprintf(info->waiter[info->listed++], DLOCK_HOLDER_MAX, "session %s", row[1]);
            info->waiters++;
        }
    }
    mysql_free_result(res);
    info->known |= DLOCK_KNOWS_HELD | DLOCK_KNOWS_WAITERS | DLOCK_KNOWS_ORDER;
    if (info->held)
        info->known |= DLOCK_KNOWS_OWNER;
    return 0;
}

/* ---- open, close -------------------------------------------------------- */

static void be_close(dlock_conn *conn)
{
    struct mysql_conn *mc = (struct mysql_conn *)conn;
    pool_drain(mc);
    for (size_t i = 0; i < mc->nn; i++)
        session_close(mc->nsess[i]);
    free(mc->nsess);
    session_close(mc->ctl);
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

/* tmpl with every "@T" replaced by the table name; NULL if out of memory. */
static char *with_table(const char *tmpl, const char *table)
{
    size_t tlen = strlen(table), n = strlen(tmpl) + 1;
    for (const char *p = strstr(tmpl, "@T"); p; p = strstr(p + 2, "@T"))
        n += tlen;
    char *out = malloc(n), *o = out;
    if (!out)
        return NULL;
    for (const char *p = tmpl; *p;) {
        if (p[0] == '@' && p[1] == 'T') {
            memcpy(o, table, tlen);
            o += tlen;
            p += 2;
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
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
    mc->named = lk && strcmp(lk, "named") == 0;
    if (mc->named && mc->token_opt == 1)
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
    for (int i = 0; i < N_STMTS; i++)
        if (!(mc->sql[i] = with_table(stmt_sql[i], mc->table)))
            return DLOCK_ENOMEM;
    if (!mc->database || !mc->host || !mc->table)
        return DLOCK_ENOMEM;
    if (mc->named) { /* user locks are server-wide: the store's database and table */
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

/* Prepares the control session's statements, creating the tables the
 * first time (that needs the CREATE privilege once). */
static int prepare_tables(struct mysql_conn *mc)
{
    MYSQL_STMT *st;
    struct bound b = stmt_bound(NULL, mc->timeout_ms);
    int err = prepare(mc, mc->ctl, ST_GRANT, &b, &st);
    if (err == 0)
        err = prepare(mc, mc->ctl, ST_CREATE_ROW, &b, &st);
    if (err == 0 || mc->ctl->last_errno != ER_NO_SUCH_TABLE)
        return err;
    dlock_clearerr(cl(mc));
    for (size_t i = 0; i < sizeof create_sql / sizeof create_sql[0]; i++) {
        char *sql = with_table(create_sql[i], mc->table);
        if (!sql)
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
        err = exec_sql(mc, mc->ctl, sql, NULL, "cannot create the lock table");
        free(sql);
        if (err)
            return err;
    }
    b = stmt_bound(NULL, mc->timeout_ms);
    if ((err = prepare(mc, mc->ctl, ST_GRANT, &b, &st)) != 0)
        return err;
    return prepare(mc, mc->ctl, ST_CREATE_ROW, &b, &st);
}

/*
 * token=sequence's objects, checked with one statement naming every
 * column used and the sequence (reading the durable mark's row only). What is missing is
 * created: the lock table, or its token=sequence columns on a table of an
 * older dlock, and the sequence, starting above every token <table>_grants
 * ever recorded (token=table's, an older dlock's; the floor row included),
 * so that tokens keep growing across the change, and raised there if it
 * already existed. Runs on a lock session (each DDL commits at once).
 */
static int setup_seq(struct mysql_conn *mc, struct session *s)
{
    static const char what[] = "cannot create the lock table or sequence";
    char sql[512];
    MYSQL_RES *res = NULL;
    uint64_t max = 0;
    struct bound b = stmt_bound(NULL, mc->timeout_ms);
    /* Also reads the durable mark (seq_durable): tokens below it need no
     * check. */
    snprintf(sql, sizeof sql,
             "SELECT (SELECT MAX(token) FROM `%s` WHERE k = " FLOOR_K " AND owner = ''"
             " AND session_id = 0 AND acquired_at IS NOT NULL), next_not_cached_value"
             " FROM `%s_seq`", mc->table, mc->table);
    int err = query_result(mc, s, sql, &b, "checking the lock table", &res);
    if (err == 0) {
        MYSQL_ROW row = mysql_fetch_row(res);
        mc->durable = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
        mysql_free_result(res);
        return 0;
    }
    if (s->dead || (s->last_errno != ER_NO_SUCH_TABLE && s->last_errno != ER_BAD_FIELD_ERROR &&
                    s->last_errno != ERR_UNKNOWN_SEQUENCE))
        return err;
    dlock_clearerr(cl(mc));
    const char *ddl[] = {create_sql[0], add_columns_sql};
    for (size_t i = 0; i < sizeof ddl / sizeof ddl[0]; i++) {
        char *q = with_table(ddl[i], mc->table);
        if (!q)
            return dlock_seterr(cl(mc), DLOCK_ENOMEM, "out of memory");
        err = exec_sql(mc, s, q, NULL, what);
        free(q);
        if (err && i == 1 && !s->dead && s->last_errno == ER_LOCK_WAIT_TIMEOUT)
            return dlock_seterr(cl(mc), DLOCK_ESTORE,
                                "mysql %s: token=sequence adds columns to %s, which waits for"
                                " every lock held in it: gave up after 1 s; open it again once"
                                " no lock is held (token=table clients stopped)",
                                mc->where, mc->table);
        if (err)
            return err;
    }
    snprintf(sql, sizeof sql, "SELECT COALESCE(MAX(token), 0) FROM `%s_grants`", mc->table);
    b = stmt_bound(NULL, mc->timeout_ms);
    if ((err = query_result(mc, s, sql, &b, what, &res)) == 0) {
        MYSQL_ROW row = mysql_fetch_row(res);
        max = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
        mysql_free_result(res);
    } else if (!s->dead && s->last_errno == ER_NO_SUCH_TABLE) {
        dlock_clearerr(cl(mc)); /* a new store */
    } else {
        return err;
    }
    if (max >= SEQ_MAX)
        return dlock_seterr(cl(mc), DLOCK_ESTORE,
                            "mysql %s: %s_grants holds a token (%" PRIu64 ") beyond what a"
                            " MariaDB sequence can exceed: use token=table", mc->where,
                            mc->table, max);
    snprintf(sql, sizeof sql,
             "CREATE SEQUENCE IF NOT EXISTS `%s_seq` START WITH %" PRIu64 " MINVALUE 1"
             " MAXVALUE %llu INCREMENT BY 1 CACHE %d NOCYCLE ENGINE=InnoDB"
             " COMMENT='dlock: fencing tokens of every name (token=sequence)'",
             mc->table, max + 1, SEQ_MAX, SEQ_CACHE);
    if ((err = exec_sql(mc, s, sql, NULL, what)) != 0 || max == 0)
        return err;
    snprintf(sql, sizeof sql, "SELECT SETVAL(`%s_seq`, %" PRIu64 ")", mc->table, max);
    b = stmt_bound(NULL, mc->timeout_ms);
    if ((err = query_result(mc, s, sql, &b, what, &res)) != 0)
        return err;
    mysql_free_result(res);
    return seq_checkpoint(mc, NULL, &max); /* on disk: see seq_durable */
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
    mc->seq = mc->token_opt == 2 || mc->named; /* not the default: see the header comment */
    /* token=table: the control session, as ever; token=sequence: the first
     * lock session, which sets up the store, then waits in the pool for the
     * first acquire. */
    struct session *s = NULL;
    if ((err = session_open(mc, mc->named ? 2 : mc->seq, NULL, mc->seq ? &s : &mc->ctl)) != 0)
        goto fail;
    MYSQL *db = mc->seq ? s->db : mc->ctl->db;
    int mariadb = strstr(mysql_get_server_info(db), "MariaDB") != NULL;
    /* MySQL 8 schedules row-lock waiters by contention (CATS), not by
     * arrival: only MariaDB's queue is first-come first-served. */
    if (!mariadb)
        mc->base.caps = dlock_mysql_backend.caps & ~(unsigned)DLOCK_CAP_FIFO;
    if (!mc->seq) {
        if ((err = prepare_tables(mc)) != 0)
            goto fail;
    } else if (!mariadb || mysql_get_server_version(db) < 100300) {
        session_close(s);
        err = dlock_seterr(c, DLOCK_ENOTSUP, "mysql %s: %s needs MariaDB 10.3 or"
                                             " later (MySQL has no sequences): use token=table",
                                             mc->where, mc->named ? "lock=named (its tokens come"
                                             " from a sequence)" : "token=sequence");
        goto fail;
    } else if ((err = setup_seq(mc, s)) != 0) {
        session_close(s);
        goto fail;
    } else if (mc->named) {
        s->idle_since = dlock_monotonic_ns();
        if ((err = named_add(mc, s)) != 0) {
            session_close(s);
            goto fail;
        }
    } else {
        rollback_and_pool(mc, s, dlock_monotonic_ns() + mc->timeout_ms * MS);
    }
    *connp = &mc->base;
    return 0;
fail:
    be_close(&mc->base);
    return err;
}

const dlock_backend dlock_mysql_backend = {
    DLOCK_BACKEND_INIT,
    .name = "mysql",
    .schemes = mysql_schemes,
    .caps = DLOCK_CAP_LEASE | DLOCK_CAP_RENEW | DLOCK_CAP_FENCING | DLOCK_CAP_FIFO |
            DLOCK_CAP_BLOCKING | DLOCK_CAP_DEADLINE | DLOCK_CAP_HOLDER_DEATH | DLOCK_CAP_RAISE |
            DLOCK_CAP_CANCEL,
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
};
