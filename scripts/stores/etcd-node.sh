#!/usr/bin/env bash
# Stops, kills, pauses or (re)starts one member of the etcd cluster started
# by "start.sh etcd-cluster", for fault tests:
#
#   scripts/stores/etcd-node.sh [--dir DIR] stop|kill|start|restart|pause|resume|mode N
#   scripts/stores/etcd-node.sh [--dir DIR] leader
#
# stop: SIGTERM then (after 30 s) SIGKILL; kill: SIGKILL at once; pause and
# resume: SIGSTOP and SIGCONT (a paused member keeps its sockets: clients
# connect and then wait). start brings member N back with its data dir, as
# "kill.sh start etcd-N" does: it waits until the member answers a quorum
# read when a quorum of members runs, else only until it listens. mode
# prints leader, follower or down (down also for a paused member); leader
# prints the leading member's number without touching it (kill.sh leader
# etcd-cluster kills it).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0" >&2; }

parse_args "" "$@"
DLOCK_ETCD_CLUSTER_PORTS=$(dir_ports etcd-)
[ -n "$DLOCK_ETCD_CLUSTER_PORTS" ] || die "no etcd-cluster under $DIR (start it with start.sh etcd-cluster)"
members=$(instances_of etcd-cluster | wc -l)

if [ "${#ARGS[@]}" -eq 1 ] && [ "${ARGS[0]}" = leader ]; then
    # shellcheck disable=SC2086
    port=$(etcd_leader_port $DLOCK_ETCD_CLUSTER_PORTS) || die "no member under $DIR says it leads"
    # shellcheck disable=SC2046
    inst=$(inst_by_port "$port" $(instances_of etcd-cluster)) || die "the leader 127.0.0.1:$port is not a member under $DIR"
    echo "${inst#etcd-}"
    exit 0
fi
[ "${#ARGS[@]}" -eq 2 ] || { usage; exit 2; }
action=${ARGS[0]} n=${ARGS[1]}
case $n in ''|*[!0-9]*) die "member number expected, got '$n'" ;; esac
[ "$n" -ge 1 ] && [ "$n" -le "$members" ] || die "no etcd-cluster member $n (1..$members)"
inst=etcd-$n

case $action in
    stop) stop_inst "$inst" ;;
    kill) bash "$here/kill.sh" --dir "$DIR" kill "$inst" ;;
    pause) bash "$here/kill.sh" --dir "$DIR" pause "$inst" ;;
    resume) bash "$here/kill.sh" --dir "$DIR" resume "$inst" ;;
    start) bash "$here/kill.sh" --dir "$DIR" start "$inst" ;;
    restart) stop_inst "$inst"; bash "$here/kill.sh" --dir "$DIR" start "$inst" ;;
    mode)
        port=$(inst_port "$inst")
        if ! inst_pid "$inst" >/dev/null; then echo down; exit 0; fi
        case $(etcd_status "$port" | awk '{ print $3 }') in
            true) echo leader ;;
            false) echo follower ;;
            *) echo down ;;
        esac ;;
    *) usage; exit 2 ;;
esac
