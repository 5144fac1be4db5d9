#!/bin/bash
# dlock check (docs/check.md). TAP output.
#   $1 = dlock binary, $2 = tests/check/broken_backend.so, $3 = what:
#   file     a file:// store in a temporary directory: passes
#   broken   the deliberately broken backend (broken://, LD_PRELOADed):
#            fails with exit 1 and a report naming what failed; a store
#            that times out when opened (broken://timeout) exits 75, as
#            in dlock run
#   cli      usage errors (64), an unreachable store (69), --json
#   VAR      the store of $VAR (DLOCK_REDIS_URI...; a missing variable
#            fails), with --cut: passes
# Each run is bounded by --duration (a few seconds).
set -u
dlock=$1 module=$2 what=$3
tmp=$(mktemp -d /tmp/dlock-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed + 1)); fi; }
# show FILE: a file's lines as TAP comments.
show() { sed 's/^/# /' "$1"; }
# field FILE KEY: a number of the first object of a --json report.
field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[0][sys.argv[2]])' "$1" "$2"; }
short="--ttl 300 --rounds 1 --duration 5"

case $what in
file)
    "$dlock" check $short --json "file://$tmp/locks" >"$tmp/out" 2>"$tmp/err"
    st=$?
    show "$tmp/out"; show "$tmp/err"
    ok $([ $st = 0 ] && echo 0 || echo 1) "dlock check passes on file:// (exit $st)"
    sections=$(field "$tmp/out" sections 2>/dev/null || echo 0)
    ok $([ "$sections" -gt 5 ] && echo 0 || echo 1) "critical sections ran ($sections)"
    ok $([ "$(field "$tmp/out" overlaps 2>/dev/null)" = 0 ] && echo 0 || echo 1) \
        "no overlapping holders on file:// (no lease: a paused holder keeps the lock)"
    ok $([ "$(field "$tmp/out" kills 2>/dev/null)" = 1 ] && [ "$(field "$tmp/out" pauses 2>/dev/null)" = 1 ] \
        && echo 0 || echo 1) "one pause and one kill injected"
    ok $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]["recovery_ms"]; sys.exit(0 if r and r["count"] == 1 else 1)' "$tmp/out" && echo 0 || echo 1) \
        "recovery after the kill measured"
    ;;
broken)
    start=$(date +%s)
    LD_PRELOAD=$module "$dlock" check --ttl 300 --rounds 1 --duration 3 broken://x >"$tmp/out" 2>"$tmp/err"
    st=$?
    show "$tmp/out"; show "$tmp/err"
    ok $([ $st = 1 ] && echo 0 || echo 1) "dlock check fails on broken:// with exit 1 (got $st)"
    grep -q "FAILED:.*overlapping holders with no fault injected" "$tmp/out"
    ok $? "the report says mutual exclusion was broken"
    grep -q "tokens out of order" "$tmp/out"
    ok $? "the report says tokens went out of order"
    grep -q "stale writes accepted (fencing failed)" "$tmp/out"
    ok $? "the report says fencing failed"
    ok $([ $(($(date +%s) - start)) -le 20 ] && echo 0 || echo 1) "bounded in time"
    LD_PRELOAD=$module "$dlock" check --ttl 300 --rounds 0 --duration 1 --json broken://x >"$tmp/json" 2>/dev/null
    st=$?
    ok $([ $st = 1 ] && [ "$(field "$tmp/json" passed 2>/dev/null)" = False ] && echo 0 || echo 1) \
        "--json: passed false, exit 1 (got $st)"
    LD_PRELOAD=$module "$dlock" check --duration 1 broken://timeout >"$tmp/out" 2>"$tmp/err"
    st=$?
    ok $([ $st = 75 ] && grep -q "did not answer in time" "$tmp/err" && echo 0 || echo 1) \
        "a store that times out when opened: 75 (got $st: $(cat "$tmp/err"))"
    LD_PRELOAD=$module "$dlock" run broken://timeout x -- true 2>"$tmp/err"
    st=$?
    ok $([ $st = 75 ] && echo 0 || echo 1) "the same exit status from dlock run (got $st: $(cat "$tmp/err"))"
    ;;
cli)
    "$dlock" check >/dev/null 2>"$tmp/err"; st=$?
    ok $([ $st = 64 ] && grep -q "missing URI" "$tmp/err" && echo 0 || echo 1) "no URI: 64 (got $st: $(cat "$tmp/err"))"
    "$dlock" check --procs 1 "file://$tmp/l" >/dev/null 2>"$tmp/err"; st=$?
    ok $([ $st = 64 ] && echo 0 || echo 1) "--procs 1: 64 (got $st: $(cat "$tmp/err"))"
    "$dlock" check --bogus "file://$tmp/l" >/dev/null 2>"$tmp/err"; st=$?
    ok $([ $st = 64 ] && echo 0 || echo 1) "unknown option: 64 (got $st: $(cat "$tmp/err"))"
    "$dlock" check "nosuch://x" >/dev/null 2>"$tmp/err"; st=$?
    ok $([ $st = 64 ] && echo 0 || echo 1) "unknown scheme: 64 (got $st: $(cat "$tmp/err"))"
    "$dlock" check --duration 1 "redis://:s3cretpw@127.0.0.1:1/0" >"$tmp/out" 2>"$tmp/err"; st=$?
    ok $([ $st = 69 ] && echo 0 || echo 1) "unreachable store: 69 (got $st: $(cat "$tmp/err"))"
    ! grep -q s3cretpw "$tmp/out" "$tmp/err"
    ok $? "no password in the report or the messages"
    "$dlock" check --help >"$tmp/out"; st=$?
    ok $([ $st = 0 ] && grep -q "Usage: dlock check" "$tmp/out" && echo 0 || echo 1) "--help"
    "$dlock" --help | grep -q "dlock check"
    ok $? "dlock --help lists check"
    ;;
*)
    uri=${!what:-}
    if [ -z "$uri" ]; then
        echo "1..1"
        echo "not ok 1 - $what is not set: start the stores (scripts/stores/start.sh)"
        exit 1
    fi
    opts=$short
    if [ "$what" = DLOCK_ZK_URI ]; then
        # A session shorter than the pause, so that the paused holder loses
        # the lock (ZooKeeper's lease is its session, not the TTL).
        case $uri in *\?*) uri="$uri&session_timeout=2000" ;; *) uri="$uri?session_timeout=2000" ;; esac
        opts="--ttl 300 --pause 2500 --rounds 1 --duration 10"
    fi
    start=$(date +%s)
    "$dlock" check $opts --cut --json "$uri" >"$tmp/out" 2>"$tmp/err"
    st=$?
    show "$tmp/out"; show "$tmp/err"
    ok $([ $st = 0 ] && echo 0 || echo 1) "dlock check --cut passes on \$$what (exit $st)"
    sections=$(field "$tmp/out" sections 2>/dev/null || echo 0)
    ok $([ "$sections" -gt 3 ] && echo 0 || echo 1) "critical sections ran ($sections)"
    ok $([ "$(field "$tmp/out" stale_accepted 2>/dev/null)" = 0 ] && echo 0 || echo 1) "no stale write accepted"
    ok $([ "$(field "$tmp/out" kills 2>/dev/null)" = 1 ] && echo 0 || echo 1) "a holder killed"
    ok $([ $(($(date +%s) - start)) -le 30 ] && echo 0 || echo 1) "bounded in time ($(($(date +%s) - start)) s)"
    ;;
esac
echo "1..$n"
[ $failed = 0 ]
