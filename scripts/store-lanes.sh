#!/bin/bash
# store-lanes.sh BUILD LABEL LANES SUITE...: runs the tests of the SUITEs
# (those that kill or restart the stores' servers: the fault suite, the
# backends' own suites) in LANES lanes side by side, each lane one `meson
# test` that runs its share one after another (the tests are is_parallel:
# false, so meson never puts two side by side within a lane). Called by
# scripts/test.sh once the other suites are done: nothing else uses the
# stores meanwhile.
#
# Each test kills and restarts only the servers of its own store set
# (found by port under DLOCK_STORES_DIR). Tests that touch the same
# servers form a group (group_of below), which runs in one lane, so they
# never meet; groups are dealt out longest first, each to the lane that
# ends soonest so far, so the lanes end at about the same time. Lane N
# writes BUILD/meson-logs/LABEL-laneN.json (the summary reads it; empty
# for a lane with nothing to run) and its console output, shown once all
# lanes are done; every LABEL-lane log of an earlier run is removed first.
# Exit status 1 if any lane failed.
set -u
if [ $# -lt 4 ]; then
    echo "usage: store-lanes.sh BUILD LABEL LANES SUITE..." >&2
    exit 2
fi
build=$1 label=$2 lanes=$3
shift 3
# An earlier run's lane logs go first, whatever happens next (no tests
# found, fewer lanes): the summary must never count them again.
rm -f "$build"/meson-logs/"$label"-lane*.json "$build"/meson-logs/"$label"-lane*.out
suites=()
for s in "$@"; do suites+=(--suite "$s"); done
mapfile -t names < <(meson test -C "$build" --no-rebuild --list "${suites[@]}" 2>/dev/null |
    sed -n 's|^dlock:[^/]* / ||p')
if [ ${#names[@]} -eq 0 ]; then
    echo "store-lanes.sh: no tests of suites $* in $build" >&2
    exit 1
fi

# The servers a test kills or restarts: a backend's own test goes with the
# fault run of the same store (faults-X with X). test_redis and
# test_redis_modes also use the Redlock nodes, test_zookeeper the ensemble.
group_of() {
    local n=$1
    # A fault run in a mode (faults-modes: faults-X-shared, faults-X-permit)
    # kills what faults-X kills.
    case $n in faults-*-shared | faults-*-permit) n=${n%-*} ;; esac
    case $n in
    redis | redis_modes | redlock | faults-redis | faults-redlock) echo redis ;;
    zookeeper | zookeeper-modes | faults-zookeeper | faults-zookeeper-ensemble) echo zookeeper ;;
    postgres_modes) echo postgres ;;
    etcd-modes) echo etcd ;;
    faults-*) echo "${n#faults-}" ;;
    *) echo "$n" ;;
    esac
}
# Their usual length in seconds (CI runs of 2026-11-26); 30 if unknown.
secs_of() {
    case $1 in
    mysql) echo 56 ;; faults-etcd-cluster) echo 51 ;; zookeeper | postgres | redis) echo 40 ;;
    faults-redis-sentinel) echo 52 ;; faults-redis-cluster) echo 38 ;;
    faults-zookeeper-ensemble) echo 32 ;; faults-zookeeper) echo 23 ;;
    faults-redlock | faults-etcd) echo 21 ;; faults-redis) echo 12 ;;
    faults-mysql | faults-postgres | redlock) echo 10 ;; faults-file*) echo 1 ;;
    faults-*-shared | faults-*-permit) secs_of "${1%-*}" ;;
    *) echo 30 ;;
    esac
}

declare -A gtests gsecs
for name in "${names[@]}"; do
    g=$(group_of "$name")
    gtests[$g]+=" $name"
    gsecs[$g]=$((${gsecs[$g]:-0} + $(secs_of "$name")))
done
lane=() load=()
for ((i = 0; i < lanes; i++)); do lane[i]="" load[i]=0; done
for g in $(for g in "${!gsecs[@]}"; do echo "${gsecs[$g]} $g"; done | sort -rn | cut -d' ' -f2); do
    best=0
    for ((i = 1; i < lanes; i++)); do
        [ "${load[i]}" -lt "${load[best]}" ] && best=$i
    done
    lane[best]+="${gtests[$g]}"
    load[best]=$((load[best] + gsecs[$g]))
done
pids=()
for ((i = 0; i < lanes; i++)); do
    if [ -z "${lane[i]}" ]; then
        # An empty lane ran nothing: its log says so (the summary judges
        # the lanes together by the tests the build defines).
        : >"$build/meson-logs/$label-lane$i.json"
        continue
    fi
    echo "store-lanes.sh: lane $i (about ${load[i]} s):${lane[i]}" >&2
    # shellcheck disable=SC2086 # one word per test
    meson test -C "$build" --no-rebuild --print-errorlogs --logbase "$label-lane$i" \
        ${lane[i]} >"$build/meson-logs/$label-lane$i.out" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for ((i = 0; i < lanes; i++)); do
    [ -f "$build/meson-logs/$label-lane$i.out" ] && cat "$build/meson-logs/$label-lane$i.out"
done
exit $rc
