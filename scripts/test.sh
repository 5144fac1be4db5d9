#!/bin/sh
# The whole test suite, from a fresh Debian 12 machine: installs packages,
# starts every store on loopback (scripts/stores), builds with warnings as
# errors and every backend that has landed required, runs all suites, stops
# the stores, and ends with the line `N passed, N failed, N skipped`.
# Exit status 0 only if nothing failed.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
bash scripts/stores/install.sh
BUILD=${DLOCK_BUILD_DIR:-build-test}
export DLOCK_STORES_DIR=${DLOCK_STORES_DIR:-/tmp/dlock-stores}
# Backends whose code has landed are required: a missing library must fail
# the run, not quietly build without the backend.
opts="-Dwerror=true -Dredis=enabled -Dpostgres=enabled -Dmysql=enabled -Dzookeeper=enabled"
if [ -f "$BUILD/build.ninja" ]; then
    meson setup --reconfigure "$BUILD" $opts >/dev/null
else
    meson setup "$BUILD" $opts >/dev/null
fi
meson compile -C "$BUILD"

trap 'bash scripts/stores/stop.sh --clean >/dev/null 2>&1 || true' EXIT
env_file=$(mktemp)
bash scripts/stores/start.sh all >"$env_file"
. "$env_file"
rm -f "$env_file"

status=0
meson test -C "$BUILD" --print-errorlogs --num-processes 2 || status=$?
python3 scripts/test-summary.py "$BUILD/meson-logs/testlog.json" || status=1
exit $status
