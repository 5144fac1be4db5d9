#!/usr/bin/env bash
# Stops, kills or (re)starts one redis instance started by start.sh
# (redis, redis-auth or a redlock member), named by its port, for fault
# tests:
#
#   scripts/stores/redis-node.sh [--dir DIR] stop|kill|start|restart PORT
#
# stop: SIGTERM then (after 30 s) SIGKILL; kill: SIGKILL at once. The data
# is not persisted (save ""), so a restarted instance comes back empty.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0" >&2; }

parse_args "" "$@"
[ "${#ARGS[@]}" -eq 2 ] || { usage; exit 2; }
action=${ARGS[0]} port=${ARGS[1]}
case $port in ''|*[!0-9]*) die "port number expected, got '$port'" ;; esac
inst=
for i in redis redis-auth $(instances_of redlock); do
    if [ "$(inst_port "$i" 2>/dev/null)" = "$port" ]; then inst=$i; break; fi
done
[ -n "$inst" ] || die "no redis instance with port $port under $DIR (start it with start.sh first)"

case $action in
    stop) stop_inst "$inst" ;;
    kill)
        if pid=$(inst_pid "$inst"); then
            log "killing $inst (pid $pid)"
            kill -s KILL "$pid"
            for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
            rm -f "$DIR/$inst/pid"
        fi ;;
    start) "$here/start.sh" --node redis "$port" --dir "$DIR" ;;
    restart) stop_inst "$inst"; "$here/start.sh" --node redis "$port" --dir "$DIR" ;;
    *) usage; exit 2 ;;
esac
