#!/usr/bin/env bash
# Starts dlock's test coordination stores as plain background processes on
# loopback ports, each in its own subdirectory of DIR, and waits until each
# one really answers. Idempotent: a store that is already running (pidfile,
# live process, answering) is left alone.
#
#   scripts/stores/start.sh [--dir DIR] [redis|redlock|postgres|mariadb|zookeeper|zk-ensemble|all ...]
#
# On success prints, on stdout, shell assignments for the started stores:
#   eval "$(scripts/stores/start.sh)"
# Everything else goes to stderr. See docs/stores.md.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

usage() {
    sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0" >&2
}

# ---- redis ---------------------------------------------------------------

launch_redis_inst() { # inst port [password]
    local inst=$1 port=$2 pw=${3:-} d=$DIR/$1
    if inst_pid "$inst" >/dev/null; then return 0; fi
    command -v redis-server >/dev/null || die "redis-server not found: run scripts/stores/install.sh"
    check_port_free "$inst" "$port"
    mkdir -p "$d/data"
    echo "$port" >"$d/port"
    {
        echo "port $port"
        echo "bind 127.0.0.1"
        echo "protected-mode no"
        echo "dir $d/data"
        echo 'save ""'
        echo "appendonly no"
        echo "daemonize no"
        echo 'logfile ""'
        echo "maxmemory 64mb"
        echo "maxclients 1000"
        [ -z "$pw" ] || echo "requirepass $pw"
    } >"$d/redis.conf"
    chmod 600 "$d/redis.conf"
    log "starting $inst on 127.0.0.1:$port"
    launch "$inst" redis-server redis-server "$d/redis.conf"
}

launch_redis() {
    launch_redis_inst redis "$DLOCK_REDIS_PORT"
    launch_redis_inst redis-auth "$DLOCK_REDIS_AUTH_PORT" "$STORE_PASSWORD"
}
ready_redis() {
    wait_ready redis redis_ping "$(inst_port redis)"
    wait_ready redis-auth redis_ping "$(inst_port redis-auth)" "$STORE_PASSWORD"
}

launch_redlock() {
    local i=1 p
    for p in $DLOCK_REDLOCK_PORTS; do
        launch_redis_inst "redlock-$i" "$p"
        i=$((i + 1))
    done
}
ready_redlock() {
    local inst
    for inst in $(instances_of redlock); do
        wait_ready "$inst" redis_ping "$(inst_port "$inst")"
    done
}

# ---- postgres ------------------------------------------------------------

launch_postgres() {
    local d=$DIR/postgres port=$DLOCK_POSTGRES_PORT
    if inst_pid postgres >/dev/null; then return 0; fi
    [ -x "$DLOCK_PG_BIN/postgres" ] || die "$DLOCK_PG_BIN/postgres not found: run scripts/stores/install.sh"
    check_port_free postgres "$port"
    mkdir -p "$d"
    if [ "$(id -u)" -eq 0 ]; then
        getent passwd postgres >/dev/null || die "no 'postgres' system user (postgresql-15 creates it)"
        own_dir "$d" postgres
        check_reachable postgres postgres
    fi
    as_user postgres
    if [ ! -s "$d/data/PG_VERSION" ]; then
        log "postgres: initdb into $d/data"
        rm -rf "$d/data"
        "${AS_USER[@]}" "$DLOCK_PG_BIN/initdb" -D "$d/data" -U "$STORE_USER" --auth=trust \
            -E UTF8 --no-locale --no-sync --no-instructions >>"$d/log" 2>&1 ||
            { tail -n 20 "$d/log" >&2; die "postgres: initdb failed"; }
        cat >"$d/data/pg_hba.conf" <<EOF
# dlock test cluster: $STORE_PG_PW_USER must use its password, everyone else is trusted (loopback only).
local   all  $STORE_PG_PW_USER                scram-sha-256
host    all  $STORE_PG_PW_USER  127.0.0.1/32  scram-sha-256
host    all  $STORE_PG_PW_USER  ::1/128       scram-sha-256
local   all  all                       trust
host    all  all       127.0.0.1/32    trust
host    all  all       ::1/128         trust
EOF
        cat >>"$d/data/postgresql.conf" <<EOF

# ---- dlock test settings (scripts/stores/start.sh) ----
shared_buffers = 16MB
max_connections = 600
password_encryption = scram-sha-256
fsync = off
synchronous_commit = off
full_page_writes = off
wal_level = minimal
max_wal_senders = 0
max_wal_size = 64MB
min_wal_size = 32MB
huge_pages = off
logging_collector = off
log_line_prefix = '%m [%p] %u@%d '
log_min_messages = warning
EOF
        own_dir "$d" postgres
    fi
    # A postmaster that was SIGKILLed leaves postmaster.pid behind, and where
    # init does not reap orphans its pid stays a zombie that postgres takes
    # for a live postmaster: drop the lock file if its pid is not alive.
    # The socket's lock file (.s.PGSQL.<port>.lock) names the same pid.
    local opid f
    for f in "$d/data/postmaster.pid" "$d/.s.PGSQL.$port.lock"; do
        [ -f "$f" ] || continue
        opid=$(head -n1 "$f")
        if ! alive "$opid"; then
            log "postgres: removing stale $(basename "$f") (pid $opid is gone)"
            rm -f "$f"
        fi
    done
    echo "$port" >"$d/port"
    log "starting postgres on 127.0.0.1:$port and [::1]:$port"
    launch postgres postgres "${AS_USER[@]}" "$DLOCK_PG_BIN/postgres" -D "$d/data" \
        -p "$port" -k "$d" -c "listen_addresses=127.0.0.1,::1"
}

ready_postgres() {
    local d=$DIR/postgres port
    port=$(inst_port postgres)
    wait_ready postgres pg_select1 "$port"
    # Idempotent provisioning, over the unix socket as the superuser.
    "$DLOCK_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$d" -p "$port" -U "$STORE_USER" -d postgres >/dev/null <<EOF ||
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$STORE_PG_PW_USER') THEN
    CREATE ROLE $STORE_PG_PW_USER LOGIN;
  END IF;
END\$\$;
ALTER ROLE $STORE_PG_PW_USER LOGIN PASSWORD '$STORE_PASSWORD';
SELECT 'CREATE DATABASE $STORE_USER OWNER $STORE_USER'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$STORE_USER') \gexec
GRANT ALL ON DATABASE $STORE_USER TO $STORE_PG_PW_USER;
\c $STORE_USER
GRANT ALL ON SCHEMA public TO $STORE_PG_PW_USER;
EOF
        die "postgres: provisioning the '$STORE_USER' database and '$STORE_PG_PW_USER' role failed"
}

# ---- mariadb -------------------------------------------------------------

MARIADB_OPTS=(
    --innodb-buffer-pool-size=32M
    --innodb-log-file-size=16M
    --innodb-log-buffer-size=4M
    --innodb-flush-log-at-trx-commit=2
    --innodb-doublewrite=0
    --innodb-flush-method=fsync
    --innodb-use-native-aio=0
    --performance-schema=OFF
    --key-buffer-size=1M
    --character-set-server=utf8mb4
    --collation-server=utf8mb4_general_ci
)

launch_mariadb() {
    local d=$DIR/mariadb port=$DLOCK_MARIADB_PORT
    if inst_pid mariadb >/dev/null; then return 0; fi
    command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] ||
        die "mariadbd not found: run scripts/stores/install.sh"
    check_port_free mariadb "$port"
    mkdir -p "$d/tmp"
    if [ "$(id -u)" -eq 0 ]; then
        getent passwd mysql >/dev/null || die "no 'mysql' system user (mariadb-server creates it)"
        own_dir "$d" mysql
        check_reachable mysql mariadb
    fi
    as_user mysql
    if [ ! -d "$d/data/mysql" ]; then
        log "mariadb: mariadb-install-db into $d/data"
        rm -rf "$d/data"
        "${AS_USER[@]}" mariadb-install-db --no-defaults --datadir="$d/data" --tmpdir="$d/tmp" \
            --auth-root-authentication-method=socket --skip-test-db "${MARIADB_OPTS[@]}" \
            >>"$d/log" 2>&1 ||
            { tail -n 20 "$d/log" >&2; die "mariadb: mariadb-install-db failed"; }
    fi
    # Run at every start (idempotent), before connections are accepted.
    cat >"$d/init.sql" <<EOF
CREATE DATABASE IF NOT EXISTS $STORE_USER;
CREATE USER IF NOT EXISTS '$STORE_USER'@'127.0.0.1' IDENTIFIED BY '$STORE_PASSWORD';
CREATE USER IF NOT EXISTS '$STORE_USER'@'localhost' IDENTIFIED BY '$STORE_PASSWORD';
ALTER USER '$STORE_USER'@'127.0.0.1' IDENTIFIED BY '$STORE_PASSWORD';
ALTER USER '$STORE_USER'@'localhost' IDENTIFIED BY '$STORE_PASSWORD';
GRANT ALL PRIVILEGES ON $STORE_USER.* TO '$STORE_USER'@'127.0.0.1';
GRANT ALL PRIVILEGES ON $STORE_USER.* TO '$STORE_USER'@'localhost';
GRANT PROCESS ON *.* TO '$STORE_USER'@'127.0.0.1';
GRANT PROCESS ON *.* TO '$STORE_USER'@'localhost';
EOF
    own_dir "$d" mysql
    log "starting mariadb on 127.0.0.1:$port"
    echo "$port" >"$d/port"
    launch mariadb mariadbd "${AS_USER[@]}" /usr/sbin/mariadbd --no-defaults \
        --datadir="$d/data" --tmpdir="$d/tmp" --socket="$d/mysqld.sock" \
        --pid-file="$d/mariadbd.pid" --port="$port" --bind-address=127.0.0.1 \
        --skip-name-resolve --max-connections=1000 --init-file="$d/init.sql" \
        "${MARIADB_OPTS[@]}"
}

ready_mariadb() {
    wait_ready mariadb maria_select1 "$(inst_port mariadb)"
}

# ---- zookeeper -----------------------------------------------------------

ZK_CP=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar

# Writes the parts of zoo.cfg common to the single node and the ensemble.
zk_common_cfg() { # datadir clientport
    cat <<EOF
tickTime=1000
initLimit=10
syncLimit=5
dataDir=$1
clientPort=$2
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,stat,mntr
forceSync=no
preAllocSize=4096
autopurge.purgeInterval=0
EOF
}

launch_zk_inst() { # inst clientport cfg-writer...
    local inst=$1 port=$2 d=$DIR/$1; shift 2
    if inst_pid "$inst" >/dev/null; then return 0; fi
    command -v java >/dev/null || die "java not found: run scripts/stores/install.sh"
    [ -r /usr/share/java/zookeeper.jar ] || die "/usr/share/java/zookeeper.jar not found (libzookeeper-java): run scripts/stores/install.sh"
    check_port_free "$inst" "$port"
    mkdir -p "$d/data"
    echo "$port" >"$d/port"
    "$@" >"$d/zoo.cfg"
    log "starting $inst on 127.0.0.1:$port"
    launch "$inst" java java -Xms32m "-Xmx$DLOCK_ZK_HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -XX:-UsePerfData -XX:+ExitOnOutOfMemoryError -Djava.net.preferIPv4Stack=true \
        -Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
        -Dzookeeper.log.dir="$d" -Dzookeeper.admin.enableServer=false \
        -cp "$ZK_CP" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg"
}

launch_zookeeper() {
    launch_zk_inst zookeeper "$DLOCK_ZK_PORT" zk_common_cfg "$DIR/zookeeper/data" "$DLOCK_ZK_PORT"
}
ready_zookeeper() {
    wait_ready zookeeper zk_serving "$(inst_port zookeeper)"
}

zk_ensemble_cfg() { # n
    local n=$1 i=1 p
    zk_common_cfg "$DIR/zk-$n/data" "$(nth "$n" $DLOCK_ZK_ENSEMBLE_PORTS)"
    for p in $DLOCK_ZK_ENSEMBLE_PORTS; do
        echo "server.$i=127.0.0.1:$((DLOCK_ZK_QUORUM_BASE + i)):$((DLOCK_ZK_ELECTION_BASE + i))"
        i=$((i + 1))
    done
}

launch_zk_node() { # n
    local n=$1 port
    port=$(nth "$n" $DLOCK_ZK_ENSEMBLE_PORTS) || die "no ensemble node $n"
    mkdir -p "$DIR/zk-$n/data"
    echo "$n" >"$DIR/zk-$n/data/myid"
    launch_zk_inst "zk-$n" "$port" zk_ensemble_cfg "$n"
}

launch_zk-ensemble() {
    local n=1 p
    for p in $DLOCK_ZK_ENSEMBLE_PORTS; do launch_zk_node "$n"; n=$((n + 1)); done
}

# Ready when every member serves and exactly one of them leads.
zk_ensemble_ok() {
    local inst m leaders=0
    for inst in $(instances_of zk-ensemble); do
        m=$(zk_mode "$(inst_port "$inst")") || return 1
        [ "$m" != leader ] || leaders=$((leaders + 1))
    done
    [ "$leaders" -eq 1 ]
}

ready_zk-ensemble() {
    local inst
    for inst in $(instances_of zk-ensemble); do
        wait_ready "$inst" zk_serving "$(inst_port "$inst")"
    done
    wait_ready zk-1 zk_ensemble_ok
}

# ---- main ----------------------------------------------------------------

main() {
    parse_args "" "$@"
    local names n t0=$SECONDS
    names=$(expand_names "${ARGS[@]+"${ARGS[@]}"}")
    mkdir -p "$DIR"
    chmod 755 "$DIR"
    exec 9>"$DIR/.lock"
    flock -w 600 9 || die "could not lock $DIR/.lock"
    # Launch everything first (the JVMs boot while the databases initialise),
    # then wait for each.
    for n in zookeeper zk-ensemble redis redlock postgres mariadb; do
        case " $(echo $names) " in *" $n "*) "launch_$n" ;; esac
    done
    for n in $names; do "ready_$n"; done
    log "ready: $(echo $names) (${DIR}, $((SECONDS - t0))s)"
    # shellcheck disable=SC2086
    emit_env $names
}

# Called as "start.sh --node zk N" by zk-node.sh / redis-node.sh.
if [ "${1:-}" = --node ]; then
    kind=$2 id=$3; shift 3
    parse_args "" "$@"
    mkdir -p "$DIR"
    exec 9>"$DIR/.lock"
    flock -w 600 9 || die "could not lock $DIR/.lock"
    case $kind in
        zk) launch_zk_node "$id" ;;
        redis)
            for inst in redis redis-auth $(instances_of redlock); do
                [ "$(inst_port "$inst" 2>/dev/null)" = "$id" ] || continue
                pw=
                [ "$inst" != redis-auth ] || pw=$STORE_PASSWORD
                launch_redis_inst "$inst" "$id" $pw
                wait_ready "$inst" redis_ping "$id" $pw
                exit 0
            done
            die "no redis instance with port $id under $DIR (start it with start.sh first)" ;;
    esac
    exit 0
fi

main "$@"
