#!/bin/sh
# The whole test suite, from a fresh Debian 12 machine: installs packages,
# builds with warnings as errors, runs every suite and ends with the line
# `N passed, N failed, N skipped`. Exit status 0 only if nothing failed.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
BUILD=${DLOCK_BUILD_DIR:-build-test}
if [ -f "$BUILD/build.ninja" ]; then
    meson setup --reconfigure "$BUILD" -Dwerror=true >/dev/null
else
    meson setup "$BUILD" -Dwerror=true >/dev/null
fi
meson compile -C "$BUILD"
status=0
meson test -C "$BUILD" --print-errorlogs --num-processes 2 || status=$?
python3 scripts/test-summary.py "$BUILD/meson-logs/testlog.json" || status=1
exit $status
