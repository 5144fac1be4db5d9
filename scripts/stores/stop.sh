#!/usr/bin/env bash
# Stops stores started by start.sh: SIGTERM (postgres: SIGINT, fast
# shutdown), waits up to 30 s, then SIGKILL. Only processes recorded in
# DIR's pidfiles are signalled. Idempotent.
#
#   scripts/stores/stop.sh [--dir DIR] [--clean] [redis|redlock|postgres|mariadb|zookeeper|zk-ensemble|
#                           redis-cluster|redis-sentinel|etcd|etcd-cluster|redis-tls|all ...]
#
# --clean also removes the data: all of DIR when stopping all stores, else
# the named stores' instance directories (a new cluster is formed, and the
# sentinel set starts afresh, at the next start).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0" >&2; }

parse_args 1 "$@"
names=$(expand_names "${ARGS[@]+"${ARGS[@]}"}")
if [ ! -d "$DIR" ]; then
    log "nothing to stop: $DIR does not exist"
    exit 0
fi
exec 9>"$DIR/.lock"
flock -w 600 9 || die "could not lock $DIR/.lock"
# Stop the instances of each store in parallel (a shutdown can take seconds).
# The instances are those DIR holds, whatever the DLOCK_*_PORTS say now.
pids=()
for n in $names; do
    if [ "$n" = redis-tls ]; then
        # The TLS set: its own directory, stopped by a stop.sh there.
        if [ -f "$DIR/tls/.tls" ]; then
            bash "$here/stop.sh" --dir "$DIR/tls" ${CLEAN:+--clean} all 9>&- &
            pids+=($!)
        fi
        continue
    fi
    if [ "$n" = etcd-cluster ]; then
        # One member after the other: a leader told to stop hands its
        # leadership over first, and when the member it chose is stopping
        # too, waits 7 s for the transfer to time out.
        ( for inst in $(inst_dirs_of "$n"); do stop_inst "$inst"; done ) 9>&- &
        pids+=($!)
        continue
    fi
    for inst in $(inst_dirs_of "$n"); do
        stop_inst "$inst" 9>&- &
        pids+=($!)
    done
done
rc=0
for p in "${pids[@]+"${pids[@]}"}"; do wait "$p" || rc=1; done
[ "$rc" -eq 0 ] || die "some stores could not be stopped"
if [ -n "$CLEAN" ]; then
    if [ "$(echo $names)" = "$(echo $ALL_STORES)" ]; then
        # Make sure nothing of ours is left before removing the data.
        for inst in "$DIR"/*/; do
            inst=$(basename "$inst")
            if inst_pid "$inst" >/dev/null; then die "$inst is still running; not removing $DIR"; fi
        done
        exec 9>&-
        rm -rf "$DIR"
        log "removed $DIR"
    else
        for n in $names; do
            for inst in $(inst_dirs_of "$n"); do
                if inst_pid "$inst" >/dev/null; then die "$inst is still running; not removing it"; fi
                rm -rf "${DIR:?}/$inst"
                log "removed $DIR/$inst"
            done
        done
    fi
fi
