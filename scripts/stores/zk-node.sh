#!/usr/bin/env bash
# Stops, kills or (re)starts one member of the ZooKeeper ensemble started by
# "start.sh zk-ensemble", for fault tests:
#
#   scripts/stores/zk-node.sh [--dir DIR] stop|kill|start|restart|mode N
#
# stop: SIGTERM then (after 30 s) SIGKILL; kill: SIGKILL at once.
# start waits until the node answers ruok, and, when a quorum of members is
# running, until it serves (srvr shows Mode: leader/follower).
# mode prints the node's mode (leader, follower) or "down".
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0" >&2; }

parse_args "" "$@"
[ "${#ARGS[@]}" -eq 2 ] || { usage; exit 2; }
action=${ARGS[0]} n=${ARGS[1]}
case $n in ''|*[!0-9]*) die "node number expected, got '$n'" ;; esac
inst=zk-$n
nodes=$(instances_of zk-ensemble | wc -l)
[ "$n" -ge 1 ] && [ "$n" -le "$nodes" ] || die "no ensemble node $n (1..$nodes)"

do_start() {
    "$here/start.sh" --node zk "$n" --dir "$DIR"
    port=$(inst_port "$inst")
    wait_ready "$inst" zk_ruok "$port"
    alive=0
    for i in $(instances_of zk-ensemble); do
        if inst_pid "$i" >/dev/null; then alive=$((alive + 1)); fi
    done
    if [ $((alive * 2)) -gt "$nodes" ]; then
        wait_ready "$inst" zk_serving "$port"
    else
        log "$inst: started, but only $alive of $nodes members run: no quorum, not serving"
    fi
    log "$inst: $(zk_mode "$port" || echo 'not serving')"
}

case $action in
    stop) stop_inst "$inst" ;;
    kill)
        if pid=$(inst_pid "$inst"); then
            log "killing $inst (pid $pid)"
            kill -s KILL "$pid"
            for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
            rm -f "$DIR/$inst/pid"
        fi ;;
    start) do_start ;;
    restart) stop_inst "$inst"; do_start ;;
    mode)
        port=$(inst_port "$inst") || { echo down; exit 0; }
        zk_mode "$port" || echo down ;;
    *) usage; exit 2 ;;
esac
