#!/usr/bin/env bash
# Starts dlock's test coordination stores as plain background processes on
# loopback ports, each in its own subdirectory of DIR, and waits until each
# one really answers. Idempotent: a store that is already running (pidfile,
# live process, answering) is left alone. (The Redis cluster and sentinel
# sets are checked as a whole, and a set missing an instance gets it back
# in its current layout: see their sections below and docs/stores.md.)
#
#   scripts/stores/start.sh [--dir DIR] [redis|redlock|postgres|mariadb|zookeeper|zk-ensemble|
#                            redis-cluster|redis-sentinel|etcd|etcd-cluster|all ...]
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

launch_redis_inst() { # inst port [password [extra-config-line...]]
    local inst=$1 port=$2 pw=${3:-} d=$DIR/$1
    shift 2; [ $# -eq 0 ] || shift
    if inst_pid "$inst" >/dev/null; then return 0; fi
    command -v redis-server >/dev/null || die "redis-server not found: run scripts/stores/install.sh"
    check_port_free "$inst" "$port"
    mkdir -p "$d/data"
    echo "$port" >"$d/port"
    # A replica keeps the snapshot of its last full sync in dump.rdb and
    # would load it at start: the test stores come back empty, always.
    rm -f "$d/data/dump.rdb"
    {
        if tls_set; then
            # TLS only; Redlock's instances also want a client certificate.
            echo "port 0"
            echo "tls-port $port"
            tls_conf
            case $inst in redlock-*) echo "tls-auth-clients yes" ;; esac
            echo "tls-replication yes"
            echo "tls-cluster yes"
        else
            echo "port $port"
        fi
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
        if tls_set && [ "$inst" = redis ]; then
            # The least-rights user of docs/security.md (redis-acl.conf),
            # and one without SCRIPT LOAD.
            acl_user_lines
        fi
        [ $# -eq 0 ] || printf '%s\n' "$@"
    } >"$d/redis.conf"
    chmod 600 "$d/redis.conf"
    log "starting $inst on 127.0.0.1:$port"
    launch "$inst" redis-server redis-server "$d/redis.conf"
}

# The TLS settings of a server in a TLS set (the set's certificates).
tls_conf() {
    echo "tls-cert-file $DIR/certs/server.crt"
    echo "tls-key-file $DIR/certs/server.key"
    echo "tls-ca-cert-file $DIR/certs/ca.crt"
    echo "tls-auth-clients optional"
}

launch_redis() {
    if tls_set; then # one instance, with a password and the ACL users
        launch_redis_inst redis "$DLOCK_REDIS_PORT" "$STORE_PASSWORD"
        return
    fi
    launch_redis_inst redis "$DLOCK_REDIS_PORT"
    launch_redis_inst redis-auth "$DLOCK_REDIS_AUTH_PORT" "$STORE_PASSWORD"
}
ready_redis() {
    if tls_set; then
        wait_ready redis redis_ping "$(inst_port redis)" "$STORE_PASSWORD"
        return
    fi
    wait_ready redis redis_ping "$(inst_port redis)"
    wait_ready redis-auth redis_ping "$(inst_port redis-auth)" "$STORE_PASSWORD"
}

# ---- redis-tls: the TLS set ----------------------------------------------
#
# Under $DIR/tls: certificates (certs/, made once with openssl) and a store
# set of its own (one Redis, Redlock, a cluster, a sentinel set, all
# TLS-only), started by start.sh run there in the background while the
# other stores boot.

TLS_PID=

# The test certificates under $1 (a directory): a CA, the servers'
# (localhost, 127.0.0.1, ::1), a client's, and for the refusal cases an
# unrelated CA, a certificate for another host, an expired one and the
# client's key encrypted. Made
# again when missing or near their end.
make_certs() { # dir
    local c=$1 f
    if [ -s "$c/expired.crt" ] && [ -s "$c/client-encrypted.key" ] && openssl x509 -checkend 86400 -noout -in "$c/ca.crt" >/dev/null 2>&1 &&
        openssl x509 -checkend 86400 -noout -in "$c/server.crt" >/dev/null 2>&1; then
        return 0
    fi
    command -v openssl >/dev/null || die "openssl not found: run scripts/stores/install.sh"
    rm -rf "$c"
    mkdir -p "$c"
    (
        cd "$c" || exit 1
        set -e
        ca() { openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.crt" -days 30 \
                   -subj "/CN=$2" 2>/dev/null; }
        signed() { # name days subject san
            openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
            if [ -n "$4" ]; then echo "subjectAltName=$4" >"$1.ext"; else : >"$1.ext"; fi
            openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
                -days "$2" -extfile "$1.ext" 2>/dev/null
            rm -f "$1.csr" "$1.ext"
        }
        ca ca "dlock test CA"
        ca other-ca "another CA"
        signed server 30 localhost "DNS:localhost,IP:127.0.0.1,IP:::1"
        signed client 30 "dlock test client" ""
        signed wrong-host 30 wrong.example "DNS:wrong.example"
        # Valid from now, ended a day ago: expired whatever the clock.
        signed expired -1 localhost "DNS:localhost,IP:127.0.0.1,IP:::1"
        # The client's key under a passphrase (dlock asks for none: refused).
        openssl rsa -in client.key -aes128 -passout pass:dlock-test -out client-encrypted.key \
            2>/dev/null
    ) || die "openssl could not make the test certificates in $c"
    for f in "$c"/*.key; do chmod 600 "$f"; done
}

launch_redis-tls() {
    mkdir -p "$DIR/tls"
    make_certs "$DIR/tls/certs"
    touch "$DIR/tls/.tls"
    log "starting redis-tls (TLS-only Redis, Redlock, cluster and sentinel set) under $DIR/tls"
    (
        # Its start.sh reads the set's ports from the usual variables.
        export DLOCK_REDIS_PORT=$DLOCK_REDIS_TLS_PORT DLOCK_REDLOCK_PORTS=$DLOCK_REDLOCK_TLS_PORTS \
            DLOCK_REDIS_CLUSTER_PORTS=$DLOCK_REDIS_CLUSTER_TLS_PORTS \
            DLOCK_REDIS_SENTINEL_DATA_PORTS=$DLOCK_REDIS_SENTINEL_TLS_DATA_PORTS \
            DLOCK_REDIS_SENTINEL_PORTS=$DLOCK_REDIS_SENTINEL_TLS_PORTS
        bash "$here/start.sh" --dir "$DIR/tls" all >/dev/null 9>&-
    ) &
    TLS_PID=$!
}
ready_redis-tls() {
    if [ -n "$TLS_PID" ]; then
        wait "$TLS_PID" || die "redis-tls: the TLS set did not start (see above)"
        TLS_PID=
    fi
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

# ---- redis cluster -------------------------------------------------------
#
# Three primaries with a replica each, made by redis-cli --cluster create.
# Each node keeps the cluster's layout in its nodes.conf across restarts but
# not its data: a node started again rejoins empty, and a primary whose slots
# a replica took over meanwhile comes back as that replica's replica.

launch_rcluster_inst() { # inst port
    local inst=$1 port=$2
    if inst_pid "$inst" >/dev/null; then return 0; fi
    check_port_free "$inst" $((port + 10000))
    # repl-diskless-sync-delay 0: a primary otherwise waits 5 s for more
    # replicas before it streams the first sync.
    launch_redis_inst "$inst" "$port" "$STORE_PASSWORD" \
        "masterauth $STORE_PASSWORD" \
        "cluster-enabled yes" \
        "cluster-config-file $DIR/$inst/nodes.conf" \
        "cluster-node-timeout 1000" \
        "repl-diskless-sync-delay 0"
}

launch_redis-cluster() {
    local i=1 p
    for p in $DLOCK_REDIS_CLUSTER_PORTS; do
        launch_rcluster_inst "rcluster-$i" "$p"
        i=$((i + 1))
    done
}

# Ready: every node sees every slot served and every node, half of them are
# primaries with one replica each, and every replica's link is up.
cluster_ok() {
    local inst port info repl n=0 primaries=0
    for inst in $(instances_of redis-cluster); do n=$((n + 1)); done
    for inst in $(instances_of redis-cluster); do
        port=$(inst_port "$inst")
        info=$(rcli "$port" CLUSTER INFO) || return 1
        [ "$(info_field cluster_state <<<"$info")" = ok ] || return 1
        [ "$(info_field cluster_slots_ok <<<"$info")" = 16384 ] || return 1
        [ "$(info_field cluster_known_nodes <<<"$info")" = "$n" ] || return 1
        repl=$(rcli "$port" INFO replication) || return 1
        case $(info_field role <<<"$repl") in
            master)
                [ "$(info_field connected_slaves <<<"$repl")" = 1 ] || return 1
                primaries=$((primaries + 1)) ;;
            slave) [ "$(info_field master_link_status <<<"$repl")" = up ] || return 1 ;;
            *) return 1 ;;
        esac
    done
    [ "$primaries" -eq $((n / 2)) ]
}

# True if no node has a slot: the cluster was never created, or its
# creation stopped half-way (nodes met, no slots).
cluster_unformed() {
    local inst info
    for inst in $(instances_of redis-cluster); do
        info=$(rcli "$(inst_port "$inst")" CLUSTER INFO) || die "$inst: CLUSTER INFO failed"
        [ "$(info_field cluster_slots_assigned <<<"$info")" = 0 ] || return 1
    done
}

create_cluster() {
    local inst port addrs=() log=$DIR/rcluster-1/create.log
    for inst in $(instances_of redis-cluster); do
        port=$(inst_port "$inst")
        addrs+=("127.0.0.1:$port")
        # Left over from an interrupted create: forget the other nodes.
        if [ "$(rcli "$port" CLUSTER INFO | info_field cluster_known_nodes)" != 1 ]; then
            rcli "$port" CLUSTER RESET HARD >/dev/null || die "$inst: CLUSTER RESET failed"
        fi
    done
    log "redis-cluster: creating the cluster (${#addrs[@]} nodes, a replica per primary)"
    tls_args
    REDISCLI_AUTH=$STORE_PASSWORD timeout 120 redis-cli "${TLS_ARGS[@]}" --cluster create "${addrs[@]}" \
        --cluster-replicas 1 --cluster-yes >"$log" 2>&1 ||
        { tail -n 20 "$log" >&2; die "redis-cluster: redis-cli --cluster create failed"; }
}

# Creates the cluster if need be; main() calls it right after the launches,
# so that the cluster converges while the slower stores boot.
form_redis-cluster() {
    local inst
    for inst in $(instances_of redis-cluster); do
        wait_ready "$inst" redis_ping "$(inst_port "$inst")" "$STORE_PASSWORD"
    done
    if cluster_unformed; then create_cluster; fi
}

ready_redis-cluster() {
    local all
    all=$(instances_of redis-cluster | joined)
    WAIT_HINT="redis-cluster: not ok (CLUSTER INFO, INFO replication on each node); if a node lost its nodes.conf: scripts/stores/stop.sh --clean redis-cluster"
    wait_ready "$all" cluster_ok
    WAIT_HINT=
}

# kill.sh start: the given nodes again, with their nodes.conf; the whole
# cluster ready only if every node runs (a test may keep others down).
node_redis-cluster() { # inst...
    local inst all up=1
    for inst in "$@"; do
        launch_rcluster_inst "$inst" "$(inst_port "$inst")"
    done
    for inst in "$@"; do
        wait_ready "$inst" redis_ping "$(inst_port "$inst")" "$STORE_PASSWORD"
    done
    all=$(instances_of redis-cluster | joined)
    for inst in $all; do inst_pid "$inst" >/dev/null || up=; done
    [ -z "$up" ] || wait_ready "$all" cluster_ok
}

# ---- redis sentinel ------------------------------------------------------
#
# Data nodes rsentinel-data-1..3 (1 the primary, the others its replicas)
# and sentinels rsentinel-1..3 that monitor them as $SENTINEL_MASTER, quorum
# 2. After a failover the sentinels rewrite their own sentinel.conf and (by
# CONFIG REWRITE) the data nodes' redis.conf. When no process of the set
# runs, start.sh writes every file anew, so a cold start always has data-1
# primary; while some run, a node started again follows the current primary.

SENTINEL_COLD=
SENTINEL_PRIMARY=

# The port of the current primary: as the sentinels say, else the live data
# node that is a primary, else the one a live replica follows.
current_primary() {
    local inst port repl
    sentinel_says_primary && return 0
    for inst in $(sentinel_data_insts); do
        inst_pid "$inst" >/dev/null || continue
        port=$(inst_port "$inst") || continue
        repl=$(rcli "$port" INFO replication) || continue
        if [ "$(info_field role <<<"$repl")" = master ]; then echo "$port"; return 0; fi
    done
    for inst in $(sentinel_data_insts); do
        inst_pid "$inst" >/dev/null || continue
        port=$(inst_port "$inst") || continue
        port=$(rcli "$port" INFO replication | info_field master_port)
        if [ -n "$port" ]; then echo "$port"; return 0; fi
    done
    return 1
}

launch_rsentinel_data_inst() { # inst port primary-port
    local inst=$1 port=$2 primary=$3 extra
    if inst_pid "$inst" >/dev/null; then return 0; fi
    extra=("masterauth $STORE_PASSWORD" "repl-diskless-sync-delay 0")
    [ "$primary" = "$port" ] || extra+=("replicaof 127.0.0.1 $primary")
    launch_redis_inst "$inst" "$port" "$STORE_PASSWORD" "${extra[@]}"
}

launch_rsentinel_inst() { # inst port primary-port
    local inst=$1 port=$2 primary=$3 d=$DIR/$1
    if inst_pid "$inst" >/dev/null; then return 0; fi
    check_port_free "$inst" "$port"
    mkdir -p "$d"
    echo "$port" >"$d/port"
    # Kept when it exists: the sentinel's state (epoch, primary, peers).
    if [ ! -s "$d/sentinel.conf" ]; then
        # TLS set: TLS to clients, and to the data nodes and other sentinels.
        if tls_set; then
            { echo "port 0"; echo "tls-port $port"; tls_conf; echo "tls-replication yes"; } \
                >"$d/sentinel.conf"
        else
            echo "port $port" >"$d/sentinel.conf"
        fi
        cat >>"$d/sentinel.conf" <<EOF
bind 127.0.0.1
protected-mode no
daemonize no
logfile ""
dir $d
requirepass $STORE_PASSWORD
sentinel sentinel-pass $STORE_PASSWORD
sentinel resolve-hostnames no
sentinel announce-hostnames no
sentinel monitor $SENTINEL_MASTER 127.0.0.1 $primary 2
sentinel auth-pass $SENTINEL_MASTER $STORE_PASSWORD
sentinel down-after-milliseconds $SENTINEL_MASTER 1000
sentinel failover-timeout $SENTINEL_MASTER 5000
sentinel parallel-syncs $SENTINEL_MASTER 1
EOF
        chmod 600 "$d/sentinel.conf"
    fi
    log "starting $inst (sentinel) on 127.0.0.1:$port"
    launch "$inst" redis-server redis-server "$d/sentinel.conf" --sentinel
}

launch_redis-sentinel() {
    local inst i p
    SENTINEL_COLD=1
    for inst in $(instances_of redis-sentinel); do
        if inst_pid "$inst" >/dev/null; then SENTINEL_COLD=; fi
    done
    if [ -n "$SENTINEL_COLD" ] || ! SENTINEL_PRIMARY=$(current_primary); then
        SENTINEL_PRIMARY=${DLOCK_REDIS_SENTINEL_DATA_PORTS%% *}
    fi
    if [ -n "$SENTINEL_COLD" ]; then
        for inst in $(sentinel_mon_insts); do rm -f "$DIR/$inst/sentinel.conf"; done
    fi
    i=1
    for p in $DLOCK_REDIS_SENTINEL_DATA_PORTS; do
        launch_rsentinel_data_inst "rsentinel-data-$i" "$p" "$SENTINEL_PRIMARY"
        i=$((i + 1))
    done
}

# One data node is the primary (port $1, or "any") with every other one
# linked to it.
sentinel_data_ok() { # primary-port|any
    local inst port repl n primary=
    n=$(sentinel_data_insts | wc -l)
    for inst in $(sentinel_data_insts); do
        port=$(inst_port "$inst")
        repl=$(rcli "$port" INFO replication) || return 1
        [ "$(info_field role <<<"$repl")" = master ] || continue
        [ -z "$primary" ] || return 1
        primary=$port
        [ "$(info_field connected_slaves <<<"$repl")" = $((n - 1)) ] || return 1
    done
    [ -n "$primary" ] || return 1
    for inst in $(sentinel_data_insts); do
        port=$(inst_port "$inst")
        [ "$port" != "$primary" ] || continue
        repl=$(rcli "$port" INFO replication) || return 1
        [ "$(info_field master_port <<<"$repl")" = "$primary" ] || return 1
        [ "$(info_field master_link_status <<<"$repl")" = up ] || return 1
    done
    [ "$1" = any ] || [ "$1" = "$primary" ]
}

# Every sentinel names the same live primary, sees it as a plain "master",
# and knows the other sentinels and the replicas, none of them down.
sentinel_ok() {
    local inst port addr='' a nd ns
    nd=$(sentinel_data_insts | wc -l)
    ns=$(sentinel_mon_insts | wc -l)
    for inst in $(sentinel_mon_insts); do
        port=$(inst_port "$inst")
        a=$(rcli "$port" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" | tr -d '\r' | sed -n 2p)
        [ -n "$a" ] || return 1
        [ -z "$addr" ] || [ "$a" = "$addr" ] || return 1
        addr=$a
        [ "$(rcli "$port" SENTINEL master "$SENTINEL_MASTER" | count_flags master)" = 1 ] || return 1
    done
    settle_old_primary "$addr"
    for inst in $(sentinel_mon_insts); do
        port=$(inst_port "$inst")
        [ "$(rcli "$port" SENTINEL sentinels "$SENTINEL_MASTER" | count_flags sentinel)" = $((ns - 1)) ] || return 1
        [ "$(rcli "$port" SENTINEL replicas "$SENTINEL_MASTER" | count_flags slave)" = $((nd - 1)) ] || return 1
    done
    sentinel_data_ok "$addr"
}

# After a SENTINEL FAILOVER the sentinels turned the old primary into a
# replica only ~10 s later here (they read its role by an INFO sent every
# 10 s, and wait until a wrong role looks lasting). Once they all agree on
# the new primary, do it for them: start.sh waits for a consistent set, not
# for Sentinel's caution.
settle_old_primary() { # primary-port
    local inst port
    for inst in $(sentinel_data_insts); do
        port=$(inst_port "$inst")
        [ "$port" != "$1" ] || continue
        if [ "$(rcli "$port" INFO replication | info_field role)" = master ]; then
            log "$inst: a primary besides the sentinels' 127.0.0.1:$1: REPLICAOF it"
            rcli "$port" REPLICAOF 127.0.0.1 "$1" >/dev/null || true
        fi
    done
}

# Starts the sentinels once the data nodes are up (see main()).
form_redis-sentinel() {
    local inst i p
    for inst in $(sentinel_data_insts); do
        wait_ready "$inst" redis_ping "$(inst_port "$inst")" "$STORE_PASSWORD"
    done
    # Sentinels find the replicas in the primary's INFO, which they read at
    # once and then every 10 s: start them once the replicas are linked.
    for inst in $(sentinel_mon_insts); do
        inst_pid "$inst" >/dev/null && continue
        wait_ready "$(sentinel_data_insts | joined)" sentinel_data_ok any
        break
    done
    i=1
    for p in $DLOCK_REDIS_SENTINEL_PORTS; do
        launch_rsentinel_inst "rsentinel-$i" "$p" "$SENTINEL_PRIMARY"
        i=$((i + 1))
    done
    for inst in $(sentinel_mon_insts); do
        wait_ready "$inst" redis_ping "$(inst_port "$inst")" "$STORE_PASSWORD"
    done
}

ready_redis-sentinel() {
    local all
    all=$(instances_of redis-sentinel | joined)
    WAIT_HINT="redis-sentinel: not consistent (SENTINEL master/replicas/sentinels $SENTINEL_MASTER on each sentinel); a cold start resets it: scripts/stores/stop.sh redis-sentinel"
    wait_ready "$all" sentinel_ok
    WAIT_HINT=
}

# A data node answers and, if a replica of a live primary, is linked to it.
data_node_ok() { # port
    local repl mp
    repl=$(rcli "$1" INFO replication) || return 1
    [ "$(info_field role <<<"$repl")" = slave ] || return 0
    mp=$(info_field master_port <<<"$repl")
    redis_ping "$mp" "$STORE_PASSWORD" || return 0
    [ "$(info_field master_link_status <<<"$repl")" = up ]
}

sentinel_answers() { # port
    [ -n "$(rcli "$1" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" | sed -n 2p)" ]
}

# kill.sh start: the given instances again, data nodes following the
# current primary; the whole set ready only if every instance runs.
node_redis-sentinel() { # inst...
    local inst all up=1 primary
    primary=$(current_primary) || primary=${DLOCK_REDIS_SENTINEL_DATA_PORTS%% *}
    for inst in "$@"; do
        case $inst in
            rsentinel-data-*) launch_rsentinel_data_inst "$inst" "$(inst_port "$inst")" "$primary" ;;
            *) launch_rsentinel_inst "$inst" "$(inst_port "$inst")" "$primary" ;;
        esac
    done
    for inst in "$@"; do
        wait_ready "$inst" redis_ping "$(inst_port "$inst")" "$STORE_PASSWORD"
    done
    all=$(instances_of redis-sentinel | joined)
    for inst in $all; do inst_pid "$inst" >/dev/null || up=; done
    if [ -n "$up" ]; then
        wait_ready "$all" sentinel_ok
        return 0
    fi
    for inst in "$@"; do
        case $inst in
            rsentinel-data-*) wait_ready "$inst" data_node_ok "$(inst_port "$inst")" ;;
            *) wait_ready "$inst" sentinel_answers "$(inst_port "$inst")" ;;
        esac
    done
}

# ---- etcd ----------------------------------------------------------------
#
# etcd 3.4 (Debian's etcd-server), v3 API and its JSON gateway on the client
# port, which is what the backend talks to. Peer port: client port + 1.
# Each member keeps its data dir across restarts (auth, users and keys
# included); auto-compaction stays off (etcd's default) because tests
# compact by hand.

ETCD_QUOTA=134217728      # 128 MiB; etcd's default is 2 GiB
STORE_ETCD_ROLE=dlock-rw  # etcd role of user dlock: readwrite on every key

launch_etcd_inst() { # inst port initial-cluster token
    local inst=$1 port=$2 cluster=$3 token=$4 d=$DIR/$1 peer=$(($2 + 1))
    if inst_pid "$inst" >/dev/null; then return 0; fi
    command -v etcd >/dev/null || die "etcd not found: run scripts/stores/install.sh"
    check_port_free "$inst" "$port"
    check_port_free "$inst" "$peer"
    mkdir -p "$d"
    echo "$port" >"$d/port"
    echo "$token" >"$d/token"
    log "starting $inst on 127.0.0.1:$port (peer port $peer)"
    # With a data dir already there etcd ignores the --initial-* flags: a
    # member started again rejoins with its log, whatever the token.
    # --log-outputs is the file that launch() sends stderr to, so a Go panic
    # and zap's lines land in the one log that wait_ready shows.
    # --bcrypt-cost 4 (the least): the test user's password is hashed at
    # that cost when it is created, so an authentication costs the member
    # about a millisecond, not the default cost 10's 80 ms of CPU, which
    # parallel suites opening clients by the hundred on two cores queued
    # past connect_timeout. docs/etcd.md says what production costs.
    launch "$inst" etcd etcd --name "$inst" --data-dir "$d/data" \
        --listen-client-urls "http://127.0.0.1:$port" \
        --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "$cluster" --initial-cluster-state new \
        --initial-cluster-token "$token" \
        --heartbeat-interval 100 --election-timeout 1000 --bcrypt-cost 4 \
        --quota-backend-bytes "$ETCD_QUOTA" --auto-compaction-retention 0 \
        --logger zap --log-outputs "$d/log"
}

launch_etcd() {
    local port=$DLOCK_ETCD_PORT
    launch_etcd_inst etcd "$port" "etcd=http://127.0.0.1:$((port + 1))" "dlock-etcd"
}

# The dlock user may read and write every key, nothing else (no user or
# role admin: that takes root). Checked at every start, done when missing:
# each step may already be done (an interrupted start), so failures are
# ignored and only the end result counts. Once auth is on, the changes need
# root, whose password is the store password too.
etcd_auth_ok() { # port
    ectl "127.0.0.1:$1" "$STORE_USER:$STORE_PASSWORD" put /dlock-stores-probe x >/dev/null &&
        ectl "127.0.0.1:$1" "$STORE_USER:$STORE_PASSWORD" del /dlock-stores-probe >/dev/null &&
        ! ectl "127.0.0.1:$1" "" get /dlock-stores-probe >/dev/null
}

provision_etcd() { # port
    local port=$1 as=''
    etcd_auth_ok "$port" && return 0
    etcd_healthy "$port" "" || as=root:$STORE_PASSWORD
    log "etcd: creating users root and $STORE_USER, role $STORE_ETCD_ROLE; enabling auth"
    {
        ectl "127.0.0.1:$port" "$as" user add root --new-user-password="$STORE_PASSWORD"
        ectl "127.0.0.1:$port" "$as" user grant-role root root
        ectl "127.0.0.1:$port" "$as" user add "$STORE_USER" --new-user-password="$STORE_PASSWORD"
        ectl "127.0.0.1:$port" "$as" user passwd "$STORE_USER" --interactive=false <<<"$STORE_PASSWORD"
        ectl "127.0.0.1:$port" "$as" role add "$STORE_ETCD_ROLE"
        ectl "127.0.0.1:$port" "$as" role grant-permission "$STORE_ETCD_ROLE" readwrite "" --from-key
        ectl "127.0.0.1:$port" "$as" user grant-role "$STORE_USER" "$STORE_ETCD_ROLE"
        ectl "127.0.0.1:$port" "$as" auth enable
    } >>"$DIR/etcd/log" 2>&1 || true
    etcd_auth_ok "$port" ||
        die "etcd: provisioning auth failed (see $DIR/etcd/log); to start afresh: scripts/stores/stop.sh --clean etcd"
}

ready_etcd() {
    local port
    port=$(inst_port etcd)
    wait_ready etcd etcd_healthy "$port" "$STORE_USER:$STORE_PASSWORD"
    provision_etcd "$port"
}

# A new token each time the cluster is created, so that a member left over
# from an earlier cluster cannot join this one (etcd derives member and
# cluster ids from it).
etcd_cluster_spec() { # -> sets ETCD_CLUSTER, ETCD_TOKEN and ETCD_FRESH
    local i=1 p inst token=''
    ETCD_CLUSTER=''
    ETCD_FRESH=1
    for p in $DLOCK_ETCD_CLUSTER_PORTS; do
        ETCD_CLUSTER=${ETCD_CLUSTER:+$ETCD_CLUSTER,}etcd-$i=http://127.0.0.1:$((p + 1))
        if [ -d "$DIR/etcd-$i/data/member" ]; then
            ETCD_FRESH=
            [ -n "$token" ] || token=$(cat "$DIR/etcd-$i/token" 2>/dev/null) || true
        fi
        i=$((i + 1))
    done
    if [ -n "$ETCD_FRESH" ]; then
        ETCD_TOKEN=dlock-etcd-cluster-$(date +%s)-$$
        for inst in $(instances_of etcd-cluster); do rm -rf "${DIR:?}/$inst/data"; done
    else
        ETCD_TOKEN=${token:-dlock-etcd-cluster}
    fi
}

# A member without data cannot join a cluster that exists (it would need
# "etcdctl member remove/add"): refuse rather than let it fail obscurely.
etcd_member_has_data() { # inst
    [ -d "$DIR/$1/data/member" ] ||
        die "$1 has no data but other members of etcd-cluster do: scripts/stores/stop.sh --clean etcd-cluster, then start it again"
}

launch_etcd_member() { # inst (after etcd_cluster_spec)
    local inst=$1 n=${1#etcd-} port
    port=$(nth "$n" $DLOCK_ETCD_CLUSTER_PORTS) || die "no etcd-cluster member $n"
    if inst_pid "$inst" >/dev/null; then return 0; fi
    [ -n "$ETCD_FRESH" ] || etcd_member_has_data "$inst"
    launch_etcd_inst "$inst" "$port" "$ETCD_CLUSTER" "$ETCD_TOKEN"
}

launch_etcd-cluster() {
    local inst
    etcd_cluster_spec
    for inst in $(instances_of etcd-cluster); do launch_etcd_member "$inst"; done
}

# Ready: every member answers a quorum read, all of them are started
# members, and exactly one of them leads.
etcd_cluster_ok() {
    local inst ports n st
    ports=$(for inst in $(instances_of etcd-cluster); do inst_port "$inst"; done | joined)
    n=$(wc -w <<<"$ports")
    # shellcheck disable=SC2086
    st=$(etcd_status $ports)
    [ "$(wc -l <<<"$st")" -eq "$n" ] || return 1
    [ "$(awk '$3 == "true"' <<<"$st" | wc -l)" -eq 1 ] || return 1
    [ "$(ectl "127.0.0.1:${ports%% *}" "" member list | grep -c ', started, ')" -eq "$n" ]
}

ready_etcd-cluster() {
    local inst all
    all=$(instances_of etcd-cluster | joined)
    for inst in $all; do
        wait_ready "$all" etcd_healthy "$(inst_port "$inst")"
    done
    WAIT_HINT="etcd-cluster: not ready (etcdctl endpoint status, member list); to start afresh: scripts/stores/stop.sh --clean etcd-cluster"
    wait_ready "$all" etcd_cluster_ok
    WAIT_HINT=
}

# kill.sh start: the given members again, with their data. A member waits
# for a quorum to answer only if a quorum runs (etcd_healthy is a quorum
# read), else only until it listens; the whole cluster is checked when
# every member runs.
node_etcd-cluster() { # inst...
    local inst all n=0 up=0
    etcd_cluster_spec
    for inst in "$@"; do launch_etcd_member "$inst"; done
    all=$(instances_of etcd-cluster | joined)
    for inst in $all; do
        n=$((n + 1))
        if inst_pid "$inst" >/dev/null; then up=$((up + 1)); fi
    done
    for inst in "$@"; do
        if [ $((up * 2)) -gt "$n" ]; then
            wait_ready "$inst" etcd_healthy "$(inst_port "$inst")"
        else
            wait_ready "$inst" port_open "$(inst_port "$inst")"
            log "$inst: started, but only $up of $n members run: no quorum, not serving"
        fi
    done
    [ "$up" -ne "$n" ] || wait_ready "$all" etcd_cluster_ok
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
    # then wait for each. The Redis cluster and sentinel set are formed in
    # the background meanwhile: creating them needs only their own servers.
    local form=() form_pid='' sel
    sel=" $(joined <<<"$names") "
    for n in redis-tls zookeeper zk-ensemble redis redlock redis-cluster redis-sentinel etcd etcd-cluster; do
        case $sel in *" $n "*) "launch_$n" ;; esac
    done
    for n in redis-cluster redis-sentinel; do
        case $sel in *" $n "*) form+=("$n") ;; esac
    done
    if [ "${#form[@]}" -gt 0 ]; then
        ( for n in "${form[@]}"; do "form_$n"; done ) &
        form_pid=$!
    fi
    for n in postgres mariadb; do
        case $sel in *" $n "*) "launch_$n" ;; esac
    done
    if [ -n "$form_pid" ]; then wait "$form_pid" || exit 1; fi
    for n in $names; do "ready_$n"; done
    log "ready: $(echo $names) (${DIR}, $((SECONDS - t0))s)"
    # shellcheck disable=SC2086
    emit_env $names
}

# Called as "start.sh --node zk N" by zk-node.sh / redis-node.sh, and as
# "start.sh --node redis-cluster|redis-sentinel|etcd-cluster INSTANCE..." by
# kill.sh.
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
                ! tls_set || [ "$inst" != redis ] || pw=$STORE_PASSWORD
                launch_redis_inst "$inst" "$id" "$pw"
                wait_ready "$inst" redis_ping "$id" "$pw"
                exit 0
            done
            die "no redis instance with port $id under $DIR (start it with start.sh first)" ;;
        redis-cluster|redis-sentinel|etcd-cluster)
            DLOCK_ETCD_CLUSTER_PORTS=$(dir_ports etcd-)
            DLOCK_REDIS_CLUSTER_PORTS=$(dir_ports rcluster-)
            DLOCK_REDIS_SENTINEL_DATA_PORTS=$(dir_ports rsentinel-data-)
            DLOCK_REDIS_SENTINEL_PORTS=$(dir_ports rsentinel-)
            for inst in "$id" "${ARGS[@]+"${ARGS[@]}"}"; do
                [ -f "$DIR/$inst/port" ] || die "no instance '$inst' under $DIR (start it with start.sh first)"
            done
            "node_$kind" "$id" "${ARGS[@]+"${ARGS[@]}"}" ;;
        *) die "--node: unknown kind '$kind'" ;;
    esac
    exit 0
fi

main "$@"
