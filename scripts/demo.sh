#!/bin/sh
# From a fresh Debian 12 machine: installs build dependencies, builds dlock,
# then runs its main job on the embedded default: two processes contend for
# one lock through `dlock run`, and a third, with -n, is turned away.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
meson compile -C build >/dev/null
DLOCK=build/tools/dlock
DIR=$(mktemp -d /tmp/dlock-demo.XXXXXX)
URI="file://$DIR"
trap 'rm -rf "$DIR"' EXIT
echo "== $($DLOCK --version); lock directory $DIR"

job() { # $1 = who
    $DLOCK run "$URI" nightly-report -- sh -c \
        'echo "[$0] holds nightly-report, fencing token $DLOCK_TOKEN"; sleep 1; echo "[$0] done"' "$1"
}
job A &
sleep 0.2
job B &           # waits for A, then runs
sleep 0.2
set +e
$DLOCK run -n "$URI" nightly-report -- echo "C should not run"
echo "[C] dlock run -n exited $? (75: held elsewhere)"
set -e
wait
echo "== A and B ran one after the other, with increasing tokens"
