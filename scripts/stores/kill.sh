#!/usr/bin/env bash
# Store faults for the fault suite (tests/faults): kills, pauses, resumes and
# starts again single instances started by start.sh, and kills client
# connections from the server side. Instances are the names of DIR's
# subdirectories: redis, redis-auth, redlock-1..5, postgres, mariadb,
# zookeeper, zk-1..3, rcluster-1..6 (Redis Cluster nodes),
# rsentinel-data-1..3 (the data nodes Sentinel fails over),
# rsentinel-1..3 (the sentinels), etcd and etcd-1..3 (the etcd cluster's
# members).
#
#   scripts/stores/kill.sh [--dir DIR] INSTANCE...          SIGKILL, wait until gone
#   scripts/stores/kill.sh [--dir DIR] pause INSTANCE...    SIGSTOP
#   scripts/stores/kill.sh [--dir DIR] resume INSTANCE...   SIGCONT
#   scripts/stores/kill.sh [--dir DIR] start INSTANCE...    start again, wait until ready
#   scripts/stores/kill.sh [--dir DIR] leader               the ensemble's leader (zk-N)
#   scripts/stores/kill.sh [--dir DIR] leader etcd-cluster  SIGKILL the etcd cluster's leader, print it (etcd-N)
#   scripts/stores/kill.sh [--dir DIR] primary redis-sentinel     the data node the sentinels name primary
#   scripts/stores/kill.sh [--dir DIR] primary rcluster SLOT|KEY  the cluster node serving SLOT (a number) or KEY's slot
#   scripts/stores/kill.sh [--dir DIR] conns INSTANCE PORT...
#
# PostgreSQL is the postmaster and all its children (backends, checkpointer,
# walwriter...): all of them get the signal, as in a crash of the host
# process tree. start reads each instance's ports from DIR (port files,
# zoo.cfg), so it works for a store set started on other ports than the
# defaults without the DLOCK_*_PORT variables. conns kills, on the server,
# the client connections whose client-side (local) TCP port is one of PORT:
# Redis CLIENT KILL ADDR (with the password on cluster and sentinel
# instances), PostgreSQL pg_terminate_backend, MariaDB KILL.
#
# Cluster and Sentinel: start also takes the store names redis-cluster and
# redis-sentinel (all their instances). A cluster node comes back with its
# nodes.conf and no data; a data node comes back as a replica of whoever the
# sentinels name primary now (Sentinel would reconfigure it anyway; this
# spares a test the window in which it is an empty primary). start waits for
# the whole cluster or sentinel set to be consistent again (start.sh's
# readiness) only when every instance of it runs; while a test keeps some
# down it waits for the started ones alone (answering; a replica linked to
# its primary if that one runs). primary asks the live sentinels or cluster
# nodes, first answer wins: during a failover ask again after it settles.
#
# etcd: unlike "leader" for ZooKeeper, which only names the leader,
# "leader etcd-cluster" kills it (one step, so the member that dies is the
# one that led) and prints its name for a later "start etcd-N". A member
# comes back with its data dir and rejoins; start waits for it to answer
# when a quorum runs, for the whole cluster when every member runs, else
# only until it listens. scripts/stores/etcd-node.sh does the same by member
# number, and names the leader without killing it. conns is not supported
# (the backend talks HTTP to the gateway; kill or pause a member instead).
# Tests that run etcdctl themselves (e.g. "etcdctl compact REV") take the
# endpoints and credentials from the URIs start.sh exports:
#   DLOCK_ETCD_URI=etcd://dlock:dlock-secret-pw@127.0.0.1:2379/dlock
#     -> etcdctl --endpoints=http://127.0.0.1:2379 --user=dlock:dlock-secret-pw
#   DLOCK_ETCD_CLUSTER_URI=etcd://127.0.0.1:2479,127.0.0.1:2481,127.0.0.1:2483/dlock
#     -> etcdctl --endpoints=http://127.0.0.1:2479,http://127.0.0.1:2481,http://127.0.0.1:2483
# (or etcdctl's own ETCDCTL_ENDPOINTS and ETCDCTL_USER). User dlock may read,
# write and compact; root (same password) is needed only for user and role
# changes.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0" >&2; }

parse_args "" "$@"
[ "${#ARGS[@]}" -ge 1 ] || { usage; exit 2; }
action=kill
case ${ARGS[0]} in
    pause|resume|start|leader|primary|conns|kill) action=${ARGS[0]}; ARGS=("${ARGS[@]:1}") ;;
esac

known() { # inst
    [ -f "$DIR/$1/port" ] || die "no instance '$1' under $DIR (start the stores with start.sh)"
}

# The pids of an instance's process tree: the server, and for postgres its
# whole process group and direct children.
tree_pids() { # pid
    local pid=$1 p
    echo "$pid"
    for p in $(pgrep -g "$pid" 2>/dev/null || true) $(pgrep -P "$pid" 2>/dev/null || true); do
        [ "$p" = "$pid" ] || echo "$p"
    done | sort -u
}

signal_inst() { # SIG inst
    local sig=$1 inst=$2 pid pids
    known "$inst"
    pid=$(inst_pid "$inst") || { log "$inst is not running"; return 0; }
    if [ "$(cat "$DIR/$inst/comm")" = postgres ]; then
        # Stop the postmaster first so that it cannot fork anything new
        # while its children are signalled.
        [ "$sig" != KILL ] || kill -s STOP "$pid" 2>/dev/null || true
        pids=$(tree_pids "$pid")
    else
        pids=$pid
    fi
    log "$inst: SIG$sig to $(echo $pids)"
    # shellcheck disable=SC2086
    kill -s "$sig" $pids 2>/dev/null || true
    if [ "$sig" = KILL ]; then
        local p i
        for p in $pids; do
            for i in $(seq 1 100); do alive "$p" || break; sleep 0.05; done
            ! alive "$p" || die "$inst: pid $p survived SIGKILL"
        done
        rm -f "$DIR/$inst/pid"
    fi
}

# The DLOCK_*_PORT variables start.sh needs, from what DIR records.
export_ports() {
    local p list i
    if p=$(inst_port redis); then export DLOCK_REDIS_PORT=$p; fi
    if p=$(inst_port redis-auth); then export DLOCK_REDIS_AUTH_PORT=$p; fi
    if p=$(inst_port postgres); then export DLOCK_POSTGRES_PORT=$p; fi
    if p=$(inst_port mariadb); then export DLOCK_MARIADB_PORT=$p; fi
    if p=$(inst_port zookeeper); then export DLOCK_ZK_PORT=$p; fi
    if p=$(inst_port etcd); then export DLOCK_ETCD_PORT=$p; fi
    list=$(dir_ports etcd-)
    [ -z "$list" ] || export DLOCK_ETCD_CLUSTER_PORTS="$list"
    list=
    for i in 1 2 3 4 5 6 7 8 9; do
        p=$(inst_port "redlock-$i") || break
        list="$list $p"
    done
    [ -z "$list" ] || export DLOCK_REDLOCK_PORTS="${list# }"
    list=$(dir_ports rcluster-)
    [ -z "$list" ] || export DLOCK_REDIS_CLUSTER_PORTS="$list"
    list=$(dir_ports rsentinel-data-)
    [ -z "$list" ] || export DLOCK_REDIS_SENTINEL_DATA_PORTS="$list"
    list=$(dir_ports rsentinel-)
    [ -z "$list" ] || export DLOCK_REDIS_SENTINEL_PORTS="$list"
    list=
    for i in 1 2 3 4 5 6 7 8 9; do
        p=$(inst_port "zk-$i") || break
        list="$list $p"
    done
    if [ -n "$list" ]; then
        export DLOCK_ZK_ENSEMBLE_PORTS="${list# }"
        # server.1=127.0.0.1:QUORUM:ELECTION
        local q e
        q=$(sed -n 's/^server\.1=[^:]*:\([0-9]*\):\([0-9]*\).*/\1/p' "$DIR/zk-1/zoo.cfg")
        e=$(sed -n 's/^server\.1=[^:]*:\([0-9]*\):\([0-9]*\).*/\2/p' "$DIR/zk-1/zoo.cfg")
        [ -z "$q" ] || export DLOCK_ZK_QUORUM_BASE=$((q - 1))
        [ -z "$e" ] || export DLOCK_ZK_ELECTION_BASE=$((e - 1))
    fi
}

start_insts() { # inst...
    local inst stores=() ensemble='' cluster=() sentinel=() etcds=() args=()
    export_ports
    for inst in "$@"; do
        case $inst in
            etcd-cluster) mapfile -t -O "${#args[@]}" args < <(instances_of etcd-cluster) ;;
            redis-cluster|rcluster) mapfile -t -O "${#args[@]}" args < <(instances_of redis-cluster) ;;
            redis-sentinel|rsentinel) mapfile -t -O "${#args[@]}" args < <(instances_of redis-sentinel) ;;
            *) args+=("$inst") ;;
        esac
    done
    for inst in "${args[@]+"${args[@]}"}"; do
        known "$inst"
        case $inst in
            redis|redis-auth|redlock-*)
                "$here/start.sh" --node redis "$(inst_port "$inst")" --dir "$DIR" >&2 ;;
            postgres|mariadb|zookeeper|etcd) stores+=("$inst") ;;
            etcd-[0-9]*) etcds+=("$inst") ;;
            zk-*) ensemble=1 ;;
            rcluster-*) cluster+=("$inst") ;;
            rsentinel-*) sentinel+=("$inst") ;;
            *) die "cannot start '$inst'" ;;
        esac
    done
    [ -z "$ensemble" ] || stores+=(zk-ensemble)
    [ "${#stores[@]}" -eq 0 ] || "$here/start.sh" --dir "$DIR" "${stores[@]}" >/dev/null
    [ "${#cluster[@]}" -eq 0 ] || "$here/start.sh" --node redis-cluster "${cluster[@]}" --dir "$DIR" >&2
    [ "${#sentinel[@]}" -eq 0 ] || "$here/start.sh" --node redis-sentinel "${sentinel[@]}" --dir "$DIR" >&2
    [ "${#etcds[@]}" -eq 0 ] || "$here/start.sh" --node etcd-cluster "${etcds[@]}" --dir "$DIR" >&2
}

# SIGKILLs the member of the etcd cluster that leads now; prints its name.
kill_etcd_leader() {
    local ports port inst
    export_ports
    ports=$(for inst in $(instances_of etcd-cluster); do
                inst_pid "$inst" >/dev/null && inst_port "$inst"
            done | joined) || true
    [ -n "$ports" ] || die "no etcd-cluster member runs under $DIR"
    # shellcheck disable=SC2086
    port=$(etcd_leader_port $ports) || die "no etcd-cluster member under $DIR says it leads"
    # shellcheck disable=SC2046
    inst=$(inst_by_port "$port" $(instances_of etcd-cluster)) ||
        die "the etcd leader 127.0.0.1:$port is not a member under $DIR"
    signal_inst KILL "$inst"
    echo "$inst"
}

# The data node the live sentinels name primary.
sentinel_primary() {
    local port inst
    export_ports
    port=$(sentinel_says_primary) || die "no sentinel under $DIR answers"
    # shellcheck disable=SC2046
    inst=$(inst_by_port "$port" $(sentinel_data_insts)) ||
        die "the sentinels name 127.0.0.1:$port, not a data node under $DIR"
    echo "$inst"
}

# The cluster node that a live node says serves SLOT (a number, else a key).
cluster_primary() { # slot|key
    local slot=$1 inst port nodes owner
    export_ports
    for inst in $(instances_of redis-cluster); do
        inst_pid "$inst" >/dev/null || continue
        port=$(inst_port "$inst")
        case $slot in
            ''|*[!0-9]*) slot=$(rcli "$port" CLUSTER KEYSLOT "$1") || continue ;;
        esac
        [ "$slot" -le 16383 ] || die "slot $slot out of range (0..16383)"
        nodes=$(rcli "$port" CLUSTER NODES) || continue
        # id addr flags master ping pong epoch link slot...; "[...]" are
        # slots in migration. Skip nodes flagged fail.
        owner=$(printf '%s\n' "$nodes" | tr -d '\r' | awk -v s="$slot" '
            $3 ~ /master/ && $3 !~ /fail/ {
                for (i = 9; i <= NF; i++) {
                    if ($i ~ /^\[/) continue
                    n = split($i, r, "-")
                    if (s + 0 >= r[1] + 0 && s + 0 <= r[n] + 0) {
                        a = $2; sub(/@.*/, "", a); sub(/.*:/, "", a); print a; exit
                    }
                }
            }')
        [ -n "$owner" ] || continue
        # shellcheck disable=SC2046
        inst_by_port "$owner" $(instances_of redis-cluster) ||
            die "slot $slot is served by 127.0.0.1:$owner, not a node under $DIR"
        return 0
    done
    die "no live cluster node under $DIR knows who serves slot $slot"
}

conns() { # inst port...
    local inst=$1 port p; shift
    known "$inst"
    port=$(inst_port "$inst")
    [ $# -gt 0 ] || return 0
    case $inst in
        redis-auth) die "conns: not for the password instance" ;;
        redis|redlock-*)
            for p in "$@"; do
                timeout 5 redis-cli -h 127.0.0.1 -p "$port" CLIENT KILL ADDR "127.0.0.1:$p" >&2 || true
            done ;;
        rcluster-*|rsentinel-*)
            for p in "$@"; do
                rcli "$port" CLIENT KILL ADDR "127.0.0.1:$p" >&2 || true
            done ;;
        postgres)
            local in
            in=$(printf '%s,' "$@"); in=${in%,}
            PGCONNECT_TIMEOUT=5 "$DLOCK_PG_BIN/psql" -X -w -q -At -h 127.0.0.1 -p "$port" \
                -U "$STORE_USER" -d postgres -c \
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port IN ($in) AND pid <> pg_backend_pid()" >&2 ;;
        mariadb)
            local ids id
            for p in "$@"; do
                ids=$(timeout 10 mariadb --no-defaults --protocol=TCP -h 127.0.0.1 -P "$port" \
                    -u "$STORE_USER" "-p$STORE_PASSWORD" -N -B -e \
                    "SELECT id FROM information_schema.processlist WHERE host = '127.0.0.1:$p'") || true
                for id in $ids; do
                    if timeout 10 mariadb --no-defaults --protocol=TCP -h 127.0.0.1 -P "$port" \
                        -u "$STORE_USER" "-p$STORE_PASSWORD" -e "KILL $id" >&2 2>/dev/null; then
                        log "mariadb: killed connection $id (127.0.0.1:$p)"
                    fi
                done
            done ;;
        *) die "conns: not supported for '$inst' (ZooKeeper: cut the session's connection instead; etcd: kill or pause a member)" ;;
    esac
}

case $action in
    kill) for i in "${ARGS[@]}"; do signal_inst KILL "$i"; done ;;
    pause) for i in "${ARGS[@]}"; do signal_inst STOP "$i"; done ;;
    resume) for i in "${ARGS[@]}"; do signal_inst CONT "$i"; done ;;
    start) start_insts "${ARGS[@]}" ;;
    leader)
        case ${ARGS[0]:-zk-ensemble} in
            etcd-cluster) kill_etcd_leader; exit 0 ;;
            zk-ensemble|zk) ;;
            *) die "usage: kill.sh leader [zk-ensemble] | kill.sh leader etcd-cluster" ;;
        esac
        for i in 1 2 3 4 5 6 7 8 9; do
            p=$(inst_port "zk-$i") || break
            if [ "$(zk_mode "$p" 2>/dev/null)" = leader ]; then echo "zk-$i"; exit 0; fi
        done
        die "no ensemble member under $DIR is the leader" ;;
    primary)
        case ${ARGS[0]:-} in
            redis-sentinel|rsentinel|sentinel) sentinel_primary ;;
            redis-cluster|rcluster)
                [ "${#ARGS[@]}" -eq 2 ] || die "usage: kill.sh primary rcluster SLOT|KEY"
                cluster_primary "${ARGS[1]}" ;;
            *) die "usage: kill.sh primary redis-sentinel | kill.sh primary rcluster SLOT|KEY" ;;
        esac ;;
    conns) [ "${#ARGS[@]}" -ge 1 ] || { usage; exit 2; }; conns "${ARGS[@]}" ;;
esac
