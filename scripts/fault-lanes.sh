#!/bin/bash
# fault-lanes.sh BUILD LABEL LANES: runs the fault suite's runs of BUILD in
# LANES lanes side by side, each lane one `meson test` that runs its share
# one after another (the runs are is_parallel: false, so meson never puts
# two of them side by side within a lane). Called by scripts/test.sh once
# the other suites are done: nothing else uses the stores meanwhile, and
# each run kills and restarts only the instances of its own URI (found by
# port under DLOCK_STORES_DIR), so runs of different store sets do not meet.
#
# The runs are dealt out longest first, round robin, so the lanes end at
# about the same time. Lane N writes BUILD/meson-logs/LABEL-laneN.json (the
# summary reads it) and its console output, shown once all lanes are done.
# Exit status 1 if any lane failed.
set -u
build=$1 label=$2 lanes=${3:-2}
mapfile -t names < <(meson test -C "$build" --no-rebuild --list --suite faults 2>/dev/null |
    sed -n 's|^dlock:faults[^/]* / ||p')
if [ ${#names[@]} -eq 0 ]; then
    echo "fault-lanes.sh: no fault runs in $build" >&2
    exit 1
fi
# Their usual length, longest first (a CI run of 2026-11-26); others last.
order="faults-etcd-cluster faults-redis-sentinel faults-redis-cluster faults-zookeeper-ensemble
faults-zookeeper faults-redlock faults-etcd faults-mysql faults-redis faults-postgres"
sorted=()
for name in $order; do
    for i in "${!names[@]}"; do
        if [ "${names[$i]}" = "$name" ]; then
            sorted+=("$name")
            unset 'names[i]'
        fi
    done
done
sorted+=("${names[@]}")
lane=()
for ((i = 0; i < lanes; i++)); do lane[i]=""; done
i=0
for name in "${sorted[@]}"; do
    lane[i % lanes]+=" $name"
    i=$((i + 1))
done
pids=()
for ((i = 0; i < lanes; i++)); do
    rm -f "$build/meson-logs/$label-lane$i.json"
    [ -n "${lane[i]}" ] || continue
    # shellcheck disable=SC2086 # one word per run
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
