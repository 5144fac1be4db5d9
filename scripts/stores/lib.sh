# shellcheck shell=bash
# Common code for scripts/stores/*.sh: sourced, not run.
#
# Layout under $DIR (default ${DLOCK_STORES_DIR:-/tmp/dlock-stores}), one
# subdirectory per server instance:
#   redis/ redis-auth/ redlock-1..5/ postgres/ mariadb/ zookeeper/ zk-1..3/
#   rcluster-1..6/ rsentinel-data-1..3/ rsentinel-1..3/ etcd/ etcd-1..3/
# each holding: pid (pidfile), port, comm (expected process name), log
# (server log) and the server's data.

: "${DLOCK_REDIS_PORT:=6390}"
: "${DLOCK_REDIS_AUTH_PORT:=6396}"
: "${DLOCK_REDLOCK_PORTS:=6391 6392 6393 6394 6395}"
: "${DLOCK_POSTGRES_PORT:=5440}"
: "${DLOCK_MARIADB_PORT:=3310}"
: "${DLOCK_ZK_PORT:=2181}"
: "${DLOCK_ZK_ENSEMBLE_PORTS:=2191 2192 2193}"
: "${DLOCK_ZK_QUORUM_BASE:=2890}"    # ensemble node N: quorum port BASE+N
: "${DLOCK_ZK_ELECTION_BASE:=3890}"  # ensemble node N: election port BASE+N
: "${DLOCK_REDIS_CLUSTER_PORTS:=6400 6401 6402 6403 6404 6405}"  # cluster bus: port+10000
: "${DLOCK_REDIS_SENTINEL_DATA_PORTS:=6410 6411 6412}"
: "${DLOCK_REDIS_SENTINEL_PORTS:=26410 26411 26412}"
: "${DLOCK_REDIS_TLS_PORT:=6420}"                # the TLS set (redis-tls): one Redis,
: "${DLOCK_REDLOCK_TLS_PORTS:=6421 6422 6423}"    # Redlock,
: "${DLOCK_REDIS_CLUSTER_TLS_PORTS:=6430 6431 6432 6433 6434 6435}"  # a cluster,
: "${DLOCK_REDIS_SENTINEL_TLS_DATA_PORTS:=6440 6441 6442}"           # and a
: "${DLOCK_REDIS_SENTINEL_TLS_PORTS:=26440 26441 26442}"             # sentinel set
: "${DLOCK_ETCD_PORT:=2379}"                      # peer port: port+1
: "${DLOCK_ETCD_CLUSTER_PORTS:=2479 2481 2483}"  # member N's peer port: its port+1
: "${DLOCK_STORES_TIMEOUT:=60}"      # seconds to wait for each server
: "${DLOCK_PG_BIN:=/usr/lib/postgresql/15/bin}"
: "${DLOCK_ZK_HEAP:=256m}"

# Credentials (fixed: tests and docs rely on them).
STORE_PASSWORD=dlock-secret-pw
STORE_USER=dlock          # postgres superuser / mariadb and etcd user / database name
STORE_PG_PW_USER=dlock_pw # postgres role that must authenticate with a password

ALL_STORES="redis redlock postgres mariadb zookeeper zk-ensemble redis-cluster redis-sentinel etcd etcd-cluster redis-tls"
# redis-tls is a set of its own under $DIR/tls, started by a start.sh of its
# own there: the same four Redis stores as above (its "all"), TLS-only, on
# the DLOCK_*_TLS_PORT(S). A directory holding .tls is such a set: every
# script run with --dir on it (kill.sh, redis-node.sh, stop.sh) speaks TLS
# to its servers (tls_set, redis_cli below).
TLS_STORES="redis redlock redis-cluster redis-sentinel"

# Redis ACL users of the TLS set's one Redis (password $STORE_PASSWORD),
# with the rights of redis-acl.conf (docs/security.md, "Least
# privileges"): dlock-app all of them, dlock-noscript all but loading the
# script (a refusal case).
STORE_REDIS_USER=dlock-app
STORE_REDIS_NOSCRIPT_USER=dlock-noscript

# The name of the primary the sentinels monitor (in DLOCK_REDIS_SENTINEL_URI).
SENTINEL_MASTER=dlock-primary

DIR=${DLOCK_STORES_DIR:-/tmp/dlock-stores}

log() { printf '%s\n' "stores: $*" >&2; }
die() { printf '%s\n' "stores: error: $*" >&2; exit 1; }

# Parses "--dir DIR", "--dir=DIR" and "--clean" (when allowed) out of the
# arguments; the remaining ones are left in the array ARGS.
CLEAN=
parse_args() { # allow_clean args...
    local allow_clean=$1; shift
    ARGS=()
    while [ $# -gt 0 ]; do
        case $1 in
            --dir) [ $# -ge 2 ] || die "--dir needs an argument"; DIR=$2; shift ;;
            --dir=*) DIR=${1#--dir=} ;;
            --clean) [ -n "$allow_clean" ] || die "unknown option --clean"; CLEAN=1 ;;
            -h|--help) usage; exit 0 ;;
            -*) die "unknown option $1" ;;
            *) ARGS+=("$1") ;;
        esac
        shift
    done
    case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
}

# True when DIR is a TLS set (redis-tls's directory).
tls_set() { [ -f "$DIR/.tls" ]; }

# TLS_ARGS: what redis-cli needs to reach DIR's servers (in a TLS set: TLS
# with the set's CA and client certificate; else nothing).
tls_args() {
    TLS_ARGS=()
    if tls_set; then
        TLS_ARGS=(--tls --cacert "$DIR/certs/ca.crt" --cert "$DIR/certs/client.crt"
                  --key "$DIR/certs/client.key")
    fi
}

# Expands store names (with "all" and aliases) to the canonical list.
expand_names() {
    local n out=()
    [ $# -gt 0 ] || set -- all
    for n in "$@"; do
        case $n in
            all) if tls_set; then out+=($TLS_STORES); else out+=($ALL_STORES); fi ;;
            redis-tls|tls) out+=(redis-tls) ;;
            redis|redlock|postgres|mariadb|zookeeper|zk-ensemble|redis-cluster|redis-sentinel) out+=("$n") ;;
            etcd|etcd-cluster) out+=("$n") ;;
            rcluster) out+=(redis-cluster) ;;
            rsentinel|sentinel) out+=(redis-sentinel) ;;
            postgresql|pg) out+=(postgres) ;;
            mysql) out+=(mariadb) ;;
            zk) out+=(zookeeper) ;;
            *) die "unknown store '$n' (want: all $ALL_STORES)" ;;
        esac
    done
    # de-duplicate, keep order
    local seen=" " r=()
    for n in "${out[@]}"; do
        case $seen in *" $n "*) ;; *) seen="$seen$n "; r+=("$n") ;; esac
    done
    printf '%s\n' "${r[@]}"
}

# Instance directories for a store name.
instances_of() {
    local i
    case $1 in
        redis) echo redis; tls_set || echo redis-auth ;;
        redlock) i=1; for _ in $DLOCK_REDLOCK_PORTS; do echo "redlock-$i"; i=$((i + 1)); done ;;
        postgres) echo postgres ;;
        mariadb) echo mariadb ;;
        zookeeper) echo zookeeper ;;
        zk-ensemble) i=1; for _ in $DLOCK_ZK_ENSEMBLE_PORTS; do echo "zk-$i"; i=$((i + 1)); done ;;
        redis-cluster) i=1; for _ in $DLOCK_REDIS_CLUSTER_PORTS; do echo "rcluster-$i"; i=$((i + 1)); done ;;
        redis-sentinel)
            i=1; for _ in $DLOCK_REDIS_SENTINEL_DATA_PORTS; do echo "rsentinel-data-$i"; i=$((i + 1)); done
            i=1; for _ in $DLOCK_REDIS_SENTINEL_PORTS; do echo "rsentinel-$i"; i=$((i + 1)); done ;;
        etcd) echo etcd ;;
        etcd-cluster) i=1; for _ in $DLOCK_ETCD_CLUSTER_PORTS; do echo "etcd-$i"; i=$((i + 1)); done ;;
    esac
}

# The instance directories DIR holds for a store name, whatever the
# DLOCK_*_PORTS variables say now (stop.sh must find every one it started).
inst_dirs_of() { # name
    local d b
    for d in "$DIR"/*/; do
        [ -d "$d" ] || continue
        b=$(basename "$d")
        case $1:$b in
            redis:redis|redis:redis-auth) ;;
            redlock:redlock-[0-9]*|zk-ensemble:zk-[0-9]*) ;;
            redis-cluster:rcluster-[0-9]*) ;;
            redis-sentinel:rsentinel-data-[0-9]*|redis-sentinel:rsentinel-[0-9]*) ;;
            etcd-cluster:etcd-[0-9]*) ;;
            "$b:$b") ;;
            *) continue ;;
        esac
        echo "$b"
    done
}

# Joins lines into one space-separated line.
joined() { tr '\n' ' ' | sed 's/ $//'; }

# The instance under DIR among "$@" that listens on port $1.
inst_by_port() { # port inst...
    local port=$1 i; shift
    for i in "$@"; do
        if [ "$(inst_port "$i" 2>/dev/null)" = "$port" ]; then echo "$i"; return 0; fi
    done
    return 1
}

nth() { # N words... -> the Nth word (1-based)
    local n=$1; shift
    [ "$n" -ge 1 ] && [ "$n" -le $# ] || return 1
    eval "echo \${$n}"
}

# The ports recorded under DIR for PREFIX1, PREFIX2... (space-separated), so
# that a script acting on a running set needs none of the DLOCK_*_PORTS.
dir_ports() { # prefix
    local i=1 p list=''
    while p=$(inst_port "$1$i"); do list="$list $p"; i=$((i + 1)); done
    echo "${list# }"
}

sentinel_data_insts() { instances_of redis-sentinel | grep '^rsentinel-data-'; }
sentinel_mon_insts() { instances_of redis-sentinel | grep -v '^rsentinel-data-'; }

# ---- process bookkeeping -------------------------------------------------

# True if process $1 exists and is not a zombie (an orphaned server that
# exits stays a zombie until init reaps it; in containers init may not).
alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed 's/^.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [ "$st" != Z ] && [ "$st" != X ]
}

# Prints the pid of instance $1 if its pidfile names a live process with the
# expected command name; returns 1 otherwise.
inst_pid() {
    local d=$DIR/$1 pid comm
    [ -r "$d/pid" ] || return 1
    pid=$(head -n1 "$d/pid" 2>/dev/null) || return 1
    case $pid in ''|*[!0-9]*) return 1 ;; esac
    alive "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [ "$comm" = "$(cat "$d/comm" 2>/dev/null)" ] || return 1
    echo "$pid"
}

inst_port() { cat "$DIR/$1/port" 2>/dev/null; }

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# Refuses to start on a port that another (foreign) process listens on.
check_port_free() { # inst port
    if port_open "$2"; then
        die "$1: port $2 on 127.0.0.1 is already in use by a process not started from $DIR (override the port with the DLOCK_*_PORT variables)"
    fi
}

# Starts "$@" in the background, detached (own session, stdin from
# /dev/null, output appended to the instance's log) and records its pid.
launch() { # inst comm cmd...
    local inst=$1 comm=$2; shift 2
    local d=$DIR/$inst
    echo "$comm" >"$d/comm"
    # 9>&- : do not leak start.sh's lock fd into the server.
    setsid "$@" </dev/null >>"$d/log" 2>&1 9>&- &
    echo $! >"$d/pid"
}

# Waits until "$@" succeeds, at most $DLOCK_STORES_TIMEOUT seconds; on
# timeout or if the process (any of INSTS, a space-separated list) died,
# prints the log's tail (and $WAIT_HINT if set) and fails.
WAIT_HINT=
wait_ready() { # insts cmd...
    local insts=$1 inst; shift
    local deadline=$((SECONDS + DLOCK_STORES_TIMEOUT))
    while :; do
        if "$@" >/dev/null 2>&1; then return 0; fi
        for inst in $insts; do
            # Alive, not inst_pid: just launched, the process may not have
            # exec'd the server yet (its name still bash or setsid; seen
            # once in CI under load, a redis declared dead that then
            # started), and its pid cannot have been reused.
            if ! alive "$(head -n1 "$DIR/$inst/pid" 2>/dev/null)"; then
                log "$inst: server process exited; last lines of $DIR/$inst/log:"
                tail -n 30 "$DIR/$inst/log" >&2 2>/dev/null || true
                die "$inst did not start"
            fi
        done
        if [ $SECONDS -ge $deadline ]; then
            inst=${insts%% *}
            log "$inst: not ready after ${DLOCK_STORES_TIMEOUT}s; last lines of $DIR/$inst/log:"
            tail -n 30 "$DIR/$inst/log" >&2 2>/dev/null || true
            [ -z "$WAIT_HINT" ] || log "$WAIT_HINT"
            die "$insts did not become ready"
        fi
        sleep 0.2
    done
}

# Stops one instance: SIGTERM (SIGINT for postgres: fast shutdown), waits up
# to 30 s, then SIGKILL. No-op if not running.
stop_inst() { # inst
    local inst=$1 pid sig=TERM i
    pid=$(inst_pid "$inst") || { rm -f "$DIR/$inst/pid"; return 0; }
    [ "$(cat "$DIR/$inst/comm")" = postgres ] && sig=INT
    log "stopping $inst (pid $pid)"
    kill -s "$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 150); do
        alive "$pid" || break
        sleep 0.2
    done
    if alive "$pid"; then
        log "$inst: still alive after 30s, sending SIGKILL"
        kill -s KILL "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
    fi
    rm -f "$DIR/$inst/pid"
}

# Sets the array AS_USER to the command prefix that runs a command as the
# unprivileged user $1 when we are root (postgres and mariadbd refuse to run
# as root); empty when we are not root. setpriv exec's, so the pid of a
# backgrounded "${AS_USER[@]}" server is the server's pid.
as_user() { # user
    if [ "$(id -u)" -eq 0 ]; then
        AS_USER=(env HOME=/tmp "USER=$1" "LOGNAME=$1"
                 setpriv "--reuid=$1" "--regid=$(id -g "$1")" --init-groups --)
    else
        AS_USER=()
    fi
}

# Makes $1 (a directory) owned by $2 when we are root.
own_dir() { # dir user
    if [ "$(id -u)" -eq 0 ]; then chown -R "$2:$(id -g "$2")" "$1"; fi
}

# When root, make sure user $1 can reach $DIR (every parent must be
# searchable), otherwise postgres/mariadb fail with obscure errors.
check_reachable() { # user
    [ "$(id -u)" -eq 0 ] || return 0
    setpriv "--reuid=$1" "--regid=$(id -g "$1")" --init-groups -- test -x "$DIR" -a -w "$DIR/$2" ||
        die "user $1 cannot access $DIR/$2: use a --dir whose parents are world-searchable (e.g. under /tmp)"
}

# ---- readiness probes ----------------------------------------------------

redis_ping() { # port [password]
    local out
    if [ -n "${2:-}" ]; then
        tls_args
        out=$(REDISCLI_AUTH=$2 timeout 5 redis-cli "${TLS_ARGS[@]}" -h 127.0.0.1 -p "$1" ping 2>/dev/null) || return 1
    else
        tls_args
        out=$(timeout 5 redis-cli "${TLS_ARGS[@]}" -h 127.0.0.1 -p "$1" ping 2>/dev/null) || return 1
    fi
    [ "$out" = PONG ]
}

# redis-cli against 127.0.0.1:$1 with the store password (REDISCLI_AUTH
# rather than -a, which warns on every call).
rcli() { # port args...
    local port=$1; shift
    tls_args
    REDISCLI_AUTH=$STORE_PASSWORD timeout 5 redis-cli "${TLS_ARGS[@]}" -h 127.0.0.1 -p "$port" "$@" 2>/dev/null
}

# Prints the value of FIELD in "field:value" lines (INFO, CLUSTER INFO).
info_field() { # field
    tr -d '\r' | sed -n "s/^$1://p"
}

# The port of the primary that the first live sentinel names.
sentinel_says_primary() {
    local inst port out
    for inst in $(sentinel_mon_insts); do
        inst_pid "$inst" >/dev/null || continue
        port=$(inst_port "$inst") || continue
        out=$(rcli "$port" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" | sed -n 2p) || continue
        case $out in ''|*[!0-9]*) continue ;; esac
        echo "$out"
        return 0
    done
    return 1
}

# Counts, in a flattened SENTINEL reply (one field per line), the entries
# of kind KIND (master, slave, sentinel) that are up and settled: not
# s_down, o_down, disconnected or in a failover. (A peer sentinel keeps
# "master_down", its vote in the last failover, for seconds after: that
# is no fault of the peer.)
count_flags() { # kind
    awk -v f="$1" '{ sub(/\r$/, "") }
        prev == "flags" && ($0 == f || index($0, f ",") == 1) && $0 !~ /(^|,)(s_down|o_down|disconnected|failover_in_progress)(,|$)/ { n++ }
        { prev = $0 } END { print n + 0 }'
}

# Sends a ZooKeeper four-letter word to 127.0.0.1:$1 and prints the answer.
zk4lw() { # port word
    timeout 5 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf %s "$2" >&3
        cat <&3' _ "$1" "$2" 2>/dev/null
}

zk_ruok() { [ "$(zk4lw "$1" ruok)" = imok ]; }

# Prints leader/follower/standalone, or fails if not serving.
zk_mode() {
    local m
    m=$(zk4lw "$1" srvr | sed -n 's/^Mode: //p')
    [ -n "$m" ] || return 1
    echo "$m"
}

zk_serving() { zk_mode "$1" >/dev/null; }

# etcdctl (v3 API) against ENDPOINTS (host:port[,host:port...]), as USER
# ("name:password", or "" for no credentials). Fails within seconds on a
# member that does not answer: a paused one accepts TCP (the kernel does)
# and then never replies, which ECTL_TIMEOUT (per request) bounds. A user's
# ETCDCTL_* variables must not redirect the probes.
ectl() { # endpoints user args...
    local eps=$1 user=$2 e list=''; shift 2
    for e in ${eps//,/ }; do list=${list:+$list,}http://$e; done
    timeout 10 env -u ETCDCTL_ENDPOINTS -u ETCDCTL_USER -u ETCDCTL_PASSWORD ETCDCTL_API=3 \
        etcdctl --endpoints="$list" --dial-timeout=2s --command-timeout="${ECTL_TIMEOUT:-3s}" \
        ${user:+"--user=$user"} "$@" 2>/dev/null
}

# A member answers a quorum read. The credentials are harmless while auth
# is off (the server's "authentication is not enabled" is ignored by
# etcdctl), and needed once it is on. A closed port fails at once: etcdctl
# would retry the connection for all of its dial timeout.
etcd_healthy() { # port [user]
    port_open "$1" && ectl "127.0.0.1:$1" "${2:-}" endpoint health >/dev/null
}

# The "endpoint status" of each of PORTS that answers, one line each (in
# no particular order): "port member-id is-leader raft-term". The members
# are asked at once, each for at most 1 s (a loaded member on loopback
# answers in well under that), so that a paused one costs a second, not
# three per call; a closed port is skipped at once (etcdctl would retry it
# for all of its dial timeout).
etcd_status() { # ports...
    local p pids=()
    for p in "$@"; do
        port_open "$p" || continue
        ECTL_TIMEOUT=1s ectl "127.0.0.1:$p" "" endpoint status -w simple |
            awk -F', ' -v p="$p" 'NF >= 7 { print p, $2, $5, $7 }' &
        pids+=($!)
    done
    # Not a bare wait: start.sh's servers are its background jobs too.
    [ "${#pids[@]}" -eq 0 ] || wait "${pids[@]}" || true
}

# The client port of the leader: a member that says it leads, with the
# highest raft term among the answers (a member resumed after a pause may
# still believe it leads an older term).
etcd_leader_port() { # ports...
    etcd_status "$@" | awk '$3 == "true" && $4 + 0 >= t { t = $4 + 0; p = $1 } END { if (p == "") exit 1; print p }'
}

pg_select1() { # port
    PGCONNECT_TIMEOUT=5 "$DLOCK_PG_BIN/psql" -X -w -q -At -h 127.0.0.1 -p "$1" -U "$STORE_USER" -d postgres \
        -c 'SELECT 1' 2>/dev/null | grep -qx 1
}

maria_select1() { # port
    timeout 10 mariadb --no-defaults --protocol=TCP -h 127.0.0.1 -P "$1" -u "$STORE_USER" \
        "-p$STORE_PASSWORD" --connect-timeout=5 -N -B -e 'SELECT 1' "$STORE_USER" 2>/dev/null | grep -qx 1
}

# ---- URIs ----------------------------------------------------------------

# Prints the eval-able assignments for the given (running) stores.
print_env() { # names...
    local n i p list inst ports dports
    for n in "$@"; do
        case $n in
            redis-tls) print_tls_env ;;
            redis)
                if p=$(inst_port redis) && inst_pid redis >/dev/null; then
                    echo "DLOCK_REDIS_URI=redis://127.0.0.1:$p/0"
                fi
                if p=$(inst_port redis-auth) && inst_pid redis-auth >/dev/null; then
                    echo "DLOCK_REDIS_AUTH_URI=redis://:$STORE_PASSWORD@127.0.0.1:$p/0"
                fi ;;
            redlock|zk-ensemble)
                list=
                for i in $(instances_of "$n"); do
                    p=$(inst_port "$i") && inst_pid "$i" >/dev/null || { list=; break; }
                    list=${list:+$list,}127.0.0.1:$p
                done
                [ -z "$list" ] || case $n in
                    redlock) echo "DLOCK_REDLOCK_URI=redis://$list/0" ;;
                    zk-ensemble) echo "DLOCK_ZK_ENSEMBLE_URI=zookeeper://$list/dlock" ;;
                esac ;;
            postgres)
                if p=$(inst_port postgres) && inst_pid postgres >/dev/null; then
                    echo "DLOCK_POSTGRES_URI=postgresql://$STORE_USER@127.0.0.1:$p/$STORE_USER"
                    echo "DLOCK_POSTGRES_AUTH_URI=postgresql://$STORE_PG_PW_USER:$STORE_PASSWORD@127.0.0.1:$p/$STORE_USER"
                fi ;;
            mariadb)
                if p=$(inst_port mariadb) && inst_pid mariadb >/dev/null; then
                    echo "DLOCK_MYSQL_URI=mysql://$STORE_USER:$STORE_PASSWORD@127.0.0.1:$p/$STORE_USER"
                fi ;;
            zookeeper)
                if p=$(inst_port zookeeper) && inst_pid zookeeper >/dev/null; then
                    echo "DLOCK_ZK_URI=zookeeper://127.0.0.1:$p/dlock"
                fi ;;
            redis-cluster)
                # Seeds: the first three nodes (the primaries when the
                # cluster was created); a client learns the rest from them.
                list='' ports='' i=0
                for inst in $(instances_of redis-cluster); do
                    if ! p=$(inst_port "$inst") || ! inst_pid "$inst" >/dev/null; then ports=''; break; fi
                    ports=${ports:+$ports }$p
                    i=$((i + 1))
                    [ $i -gt 3 ] || list=${list:+$list,}127.0.0.1:$p
                done
                if [ -n "$ports" ]; then
                    echo "DLOCK_REDIS_CLUSTER_URI=redis+cluster://:$STORE_PASSWORD@$list"
                    echo "DLOCK_REDIS_CLUSTER_PORTS=\"$ports\""
                fi ;;
            etcd)
                if p=$(inst_port etcd) && inst_pid etcd >/dev/null; then
                    echo "DLOCK_ETCD_URI=etcd://$STORE_USER:$STORE_PASSWORD@127.0.0.1:$p/dlock"
                fi ;;
            etcd-cluster)
                list=
                for i in $(instances_of "$n"); do
                    p=$(inst_port "$i") && inst_pid "$i" >/dev/null || { list=; break; }
                    list=${list:+$list,}127.0.0.1:$p
                done
                [ -z "$list" ] || echo "DLOCK_ETCD_CLUSTER_URI=etcd://$list/dlock" ;;
            redis-sentinel)
                list='' ports='' dports=''
                for inst in $(instances_of redis-sentinel); do
                    if ! p=$(inst_port "$inst") || ! inst_pid "$inst" >/dev/null; then ports=''; break; fi
                    case $inst in
                        rsentinel-data-*) dports=${dports:+$dports }$p ;;
                        *) ports=${ports:+$ports }$p; list=${list:+$list,}127.0.0.1:$p ;;
                    esac
                done
                if [ -n "$ports" ]; then
                    echo "DLOCK_REDIS_SENTINEL_URI=redis+sentinel://:$STORE_PASSWORD@$list/$SENTINEL_MASTER/0?sentinel_password=$STORE_PASSWORD"
                    echo "DLOCK_REDIS_SENTINEL_DATA_PORTS=\"$dports\""
                    echo "DLOCK_REDIS_SENTINEL_PORTS=\"$ports\""
                fi ;;
        esac
    done
    echo "DLOCK_STORES_DIR=$DIR"
}

# The ACL rules of redis-acl.conf on one line: dlock-app's, or with
# "noscript" dlock-noscript's (its "noscript:" lines too); both with the
# "test:" lines (the test suites' prefixes).
acl_rules() { # [noscript]
    local want=${1:-}
    sed 's/#.*//' "$(dirname "${BASH_SOURCE[0]}")/redis-acl.conf" |
        awk -v ns="$want" '/^noscript:/ { if (ns == "") next; sub(/^noscript:/, "") }
                          { sub(/^test:/, ""); printf "%s ", $0 }' |
        tr -s ' \t' ' ' | sed 's/^ //; s/ $//'
}

# redis.conf lines that create the ACL users dlock-app and dlock-noscript,
# and dlock-noqueue (dlock-app without RPUSH: the script of a wait is
# refused inside, a refusal the server words differently).
acl_user_lines() {
    echo "user $STORE_REDIS_USER $(acl_rules) >$STORE_PASSWORD"
    echo "user $STORE_REDIS_NOSCRIPT_USER $(acl_rules noscript) >$STORE_PASSWORD"
    echo "user dlock-noqueue $(acl_rules) -rpush >$STORE_PASSWORD"
}

# The TLS set's URIs (print_env redis-tls), from the port files under
# $DIR/tls: quoted, for the '&' between their options.
print_tls_env() (
    DIR=$DIR/tls
    tls_set || exit 0
    c=$DIR/certs ca="cacert=$DIR/certs/ca.crt" list=
    DLOCK_REDLOCK_PORTS=$(dir_ports redlock-)
    DLOCK_REDIS_CLUSTER_PORTS=$(dir_ports rcluster-)
    DLOCK_REDIS_SENTINEL_DATA_PORTS=$(dir_ports rsentinel-data-)
    DLOCK_REDIS_SENTINEL_PORTS=$(dir_ports rsentinel-)
    if p=$(inst_port redis) && inst_pid redis >/dev/null; then
        echo "DLOCK_REDIS_TLS_URI='rediss://$STORE_REDIS_USER:$STORE_PASSWORD@localhost:$p/0?$ca'"
    fi
    for i in $(instances_of redlock); do
        p=$(inst_port "$i") && inst_pid "$i" >/dev/null || { list=; break; }
        list=${list:+$list,}127.0.0.1:$p
    done
    [ -z "$list" ] ||
        echo "DLOCK_REDLOCK_TLS_URI='rediss://$list/0?$ca&cert=$c/client.crt&key=$c/client.key'"
    list= i=0
    for inst in $(instances_of redis-cluster); do
        p=$(inst_port "$inst") && inst_pid "$inst" >/dev/null || { list=; break; }
        i=$((i + 1))
        [ $i -gt 3 ] || list=${list:+$list,}127.0.0.1:$p
    done
    [ -z "$list" ] ||
        echo "DLOCK_REDIS_CLUSTER_TLS_URI='rediss+cluster://:$STORE_PASSWORD@$list?$ca'"
    list=
    for inst in $(sentinel_mon_insts); do
        p=$(inst_port "$inst") && inst_pid "$inst" >/dev/null || { list=; break; }
        list=${list:+$list,}127.0.0.1:$p
    done
    [ -z "$list" ] ||
        echo "DLOCK_REDIS_SENTINEL_TLS_URI='rediss+sentinel://:$STORE_PASSWORD@$list/$SENTINEL_MASTER/0?sentinel_password=$STORE_PASSWORD&$ca'"
    echo "DLOCK_TLS_DIR=$c"
)

# print_env, followed by one "export NAME..." line so that
# eval "$(scripts/stores/start.sh)" makes the variables visible to children.
emit_env() { # names...
    local out
    out=$(print_env "$@")
    printf '%s\n' "$out"
    printf 'export %s\n' "$(printf '%s\n' "$out" | sed 's/=.*//' | tr '\n' ' ' | sed 's/ $//')"
}
