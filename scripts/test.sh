#!/bin/sh
# The whole test suite, from a fresh Debian 12 machine: installs packages,
# starts every store on loopback (scripts/stores), builds with warnings as
# errors and every backend that has landed required, runs all suites, stops
# the stores, and ends with the line `N passed, N failed, N skipped`.
# Exit status 0 only if nothing failed.
#
# Three builds, each counted in the closing line (scripts/test-summary.py):
#   $DLOCK_BUILD_DIR (build-test)   gcc: every suite; then the unit suite
#                                   again under valgrind (any leak fails)
#   <that>-asan                     gcc, ASan+UBSan (-fno-sanitize-recover):
#                                   the unit, conformance, faults and fuzz
#                                   (corpus replay) suites
# In both gcc builds the suites that kill or restart the stores' servers
# (faults; in the first build the backends' own suites too) run last, in
# DLOCK_FAULT_LANES (2) lanes side by side (scripts/store-lanes.sh).
#   <that>-fuzz                     clang, libFuzzer: each fuzz target for
#                                   DLOCK_FUZZ_SECONDS (30) from its seeds
# The runs go one after another: the store suites restart shared servers,
# and the timing-bounded tests must not compete with fuzzers for the CPU.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
bash scripts/stores/install.sh
BUILD=${DLOCK_BUILD_DIR:-build-test}
ASAN_BUILD=$BUILD-asan
FUZZ_BUILD=$BUILD-fuzz
export DLOCK_STORES_DIR=${DLOCK_STORES_DIR:-/tmp/dlock-stores}
export DLOCK_FUZZ_SECONDS=${DLOCK_FUZZ_SECONDS:-30}
# Every suite fails, rather than skips, a store whose URI is missing; the C
# suites also a store directory (DLOCK_STORES_DIR) or store that cannot be
# found.
export DLOCK_STORES_REQUIRED=1
t_start=$(date +%s)

# Backends whose code has landed are required: a missing library must fail
# the run, not quietly build without the backend.
opts="-Dredis=enabled -Dpostgres=enabled -Dmysql=enabled -Dzookeeper=enabled -Detcd=enabled"
setup() { # dir, options...
    dir=$1
    shift
    if [ -f "$dir/build.ninja" ]; then
        meson setup --reconfigure "$dir" "$@" >/dev/null
    else
        meson setup "$dir" "$@" >/dev/null
    fi
}
# Every log the summary reads (testlog*.json, store-lanes.sh's lane logs)
# goes before anything is built or run: a build or run that fails must not
# leave an earlier run's log to be counted again (the summary also fails a
# log older than $t_start).
fresh_logs() { rm -f "$1"/meson-logs/testlog*.json "$1"/meson-logs/*-lane*.json; }
for d in "$BUILD" "$ASAN_BUILD" "$FUZZ_BUILD"; do fresh_logs "$d"; done

setup "$BUILD" -Dwerror=true $opts
meson compile -C "$BUILD"
# The Node.js addon, against this build's libdlock (node-gyp, packages from
# the npm registry). A failed build leaves the 'node' test to fail.
sh bindings/node/build.sh "$BUILD" || echo "test.sh: the Node.js addon did not build" >&2

# A sanitizer or fuzz build that does not compile is counted as a failure
# (its log is missing) and the run goes on.
asan_ok=1
CC=${DLOCK_ASAN_CC:-gcc} setup "$ASAN_BUILD" -Dwerror=true $opts \
    -Db_sanitize=address,undefined || asan_ok=0
[ $asan_ok = 0 ] || meson compile -C "$ASAN_BUILD" || asan_ok=0

# No -Dwerror here: clang warns where gcc does not, and the gcc builds are
# the warning gate. Only the fuzz targets are compiled.
fuzz_ok=1
CC=clang setup "$FUZZ_BUILD" $opts -Dfuzz=true -Db_sanitize=address,undefined || fuzz_ok=0
if [ $fuzz_ok = 1 ]; then
    fuzz_targets=$(meson introspect --targets "$FUZZ_BUILD" | python3 -c '
import json, os, sys
for t in json.load(sys.stdin):
    if t["type"] == "executable" and \
            os.path.dirname(t["defined_in"]).endswith(os.path.join("tests", "fuzz")):
        print("tests/fuzz/" + t["name"])') || fuzz_ok=0
    # shellcheck disable=SC2086 # one word per target
    [ $fuzz_ok = 0 ] || [ -z "$fuzz_targets" ] ||
        meson compile -C "$FUZZ_BUILD" $fuzz_targets || fuzz_ok=0
fi
t_built=$(date +%s)

trap 'bash scripts/stores/stop.sh --clean >/dev/null 2>&1 || true' EXIT
env_file=$(mktemp)
bash scripts/stores/start.sh all >"$env_file"
. "$env_file"
rm -f "$env_file"

status=0
phase() { # name: prints the time since the last phase
    now=$(date +%s)
    echo "test.sh: $1 done in $((now - ${t_phase:-$t_built})) s" >&2
    t_phase=$now
}
# The suites that kill or restart shared servers (faults, backends) go in
# lanes side by side (scripts/store-lanes.sh), after the other suites: each
# test restarts only its own store's servers, and tests of one store share
# a lane, so they do not meet.
FAULT_LANES=${DLOCK_FAULT_LANES:-2}
meson test -C "$BUILD" --no-rebuild --print-errorlogs --num-processes 2 --no-suite faults \
    --no-suite faults-modes --no-suite backends || status=$?
phase "$BUILD (all suites but faults and backends)"
bash scripts/store-lanes.sh "$BUILD" test "$FAULT_LANES" faults faults-modes backends || status=1
phase "$BUILD faults and backends ($FAULT_LANES lanes)"
meson test -C "$BUILD" --no-rebuild --print-errorlogs --num-processes 2 \
    --setup valgrind --suite unit || status=1
phase "$BUILD valgrind (unit)"
if [ $asan_ok = 1 ]; then
    meson test -C "$ASAN_BUILD" --no-rebuild --print-errorlogs --num-processes 2 \
        --suite unit --suite conformance --suite tls --suite fuzz --no-suite layouts || status=1
    phase "$ASAN_BUILD (unit, conformance but the peer layouts', rediss:// refusals, fuzz replay)"
    bash scripts/store-lanes.sh "$ASAN_BUILD" asan "$FAULT_LANES" faults || status=1
    phase "$ASAN_BUILD faults ($FAULT_LANES lanes)"
fi
bash scripts/stores/stop.sh --clean >/dev/null 2>&1 || true
if [ $fuzz_ok = 1 ]; then
    meson test -C "$FUZZ_BUILD" --no-rebuild --print-errorlogs --num-processes 2 \
        --suite fuzz || status=1
    phase "$FUZZ_BUILD (fuzz, ${DLOCK_FUZZ_SECONDS} s per target)"
fi
echo "test.sh: builds $((t_built - t_start)) s, tests $(($(date +%s) - t_built)) s" >&2

# The logs, and what each build defines that they must hold between them
# (--expect: every test of the build, or of the suites each run chose).
set -- "$BUILD=$BUILD/meson-logs/testlog.json" "valgrind=$BUILD/meson-logs/testlog-valgrind.json"
build_labels=$BUILD
i=0
while [ $i -lt "$FAULT_LANES" ]; do
    set -- "$@" "$BUILD faults and backends lane $i=$BUILD/meson-logs/test-lane$i.json"
    build_labels="$build_labels,$BUILD faults and backends lane $i"
    i=$((i + 1))
done
set -- "$@" "asan=$ASAN_BUILD/meson-logs/testlog.json"
asan_labels=asan
i=0
while [ $i -lt "$FAULT_LANES" ]; do
    set -- "$@" "asan faults lane $i=$ASAN_BUILD/meson-logs/asan-lane$i.json"
    asan_labels="$asan_labels,asan faults lane $i"
    i=$((i + 1))
done
python3 scripts/test-summary.py --since "$t_start" \
    --expect "$build_labels=$BUILD" --expect "valgrind=$BUILD:unit" \
    --expect "$asan_labels=$ASAN_BUILD:unit,conformance,tls,fuzz,faults,!layouts" \
    --expect "fuzz=$FUZZ_BUILD:fuzz" \
    "$@" "fuzz=$FUZZ_BUILD/meson-logs/testlog.json" || status=1
exit $status
