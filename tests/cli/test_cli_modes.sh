#!/usr/bin/env bash
# TAP tests of dlock run --shared / --limit N and of dlock inspect's holder
# lines, on one store.
# Usage: test_cli_modes.sh PATH/TO/dlock file|URI_VARIABLE
# "file" uses a fresh directory; otherwise the store's URI is read from the
# named environment variable (scripts/stores/start.sh exports them). A store
# whose backend lacks a mode must refuse it with one clear line (exit 70);
# one that has it must hold readers together, keep a writer out, and count
# permits.
set -u

DLOCK=${1:?usage: test_cli_modes.sh PATH/TO/dlock file|URI_VARIABLE}
STORE=${2:?usage: test_cli_modes.sh PATH/TO/dlock file|URI_VARIABLE}
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cli-modes.XXXXXX") || exit 1
if [ "$STORE" = file ]; then
    uri="file://$dir/locks"
else
    uri=${!STORE:-}
    if [ -z "$uri" ]; then
        echo "Bail out! $STORE is not set: start the stores first (scripts/stores/start.sh)"
        rmdir "$dir"
        exit 1
    fi
fi
# Names of their own on a shared store.
pfx="cli-modes-$$-$RANDOM"
bg_pids=()

cleanup() {
    local pid
    local f
    for f in "$dir"/*.tok; do
        [ -e "$f" ] && touch "${f%.tok}.go"
    done
    for pid in "${bg_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

. "$(dirname "$0")/lib.sh"

skip() {
    n=$((n + 1))
    echo "ok $n # SKIP $1"
}

# hold TAG ARGS...: dlock run ARGS... in the background with a command that
# writes its token to $dir/TAG.tok, then holds until $dir/TAG.go exists.
hold() {
    local tag=$1 m="$dir/$1"
    shift
    "$DLOCK" run "$@" -- sh -c "printf %s \"\$DLOCK_TOKEN\" >'$m.tok.new'; mv '$m.tok.new' '$m.tok'; \
while [ ! -e '$m.go' ]; do sleep 0.05; done" </dev/null >/dev/null 2>"$m.err" &
    bg_pids+=($!)
    eval "pid_$tag=$!"
}

# let_go TAG: the holder TAG releases; waits for its dlock to end.
let_go() {
    local pid_var="pid_$1"
    touch "$dir/$1.go"
    wait "${!pid_var}" 2>/dev/null
}

# json_holders MODE LIMIT TOKEN...: the last `inspect --json` ($out) lists
# exactly these holders, in this order, each of MODE and LIMIT with an
# owner and a lease member; the name's token is the newest's.
json_holders() {
    printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
o = json.loads(sys.stdin.read())
mode, limit, tokens = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3:]]
h = o["holders"]
ok = (o["held"] is True and o["holder_count"] == len(tokens) and o["token"] == tokens[-1]
      and [x["token"] for x in h] == tokens and all(x["mode"] == mode and x["limit"] == limit
                                                    and "owner" in x and "lease_ms" in x for x in h))
sys.exit(0 if ok else 1)' "$@"
}

# --- usage errors (no store asked) -------------------------------------------
for l in 0 70000 65536 x -1 '' 3x; do
    dl run --limit "$l" "$uri" name -- true
    [ $rc -eq 64 ] && one_line && [[ $err == *limit* ]]
    check $? "--limit '$l': exit 64, one line naming the limit"
done
dl run --shared --limit 3 "$uri" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *--shared* ]] && [[ $err == *--limit* ]]
check $? "--shared with --limit: exit 64 naming both"
dl run --limit 3 --shared "$uri" name -- true
[ $rc -eq 64 ] && one_line
check $? "--limit with --shared (either order): exit 64"
dl run --limit
[ $rc -eq 64 ] && one_line && [[ $err == *--limit* ]]
check $? "--limit without a value: exit 64"
dl run --help
[ $rc -eq 0 ] && [[ $out == *--shared* ]] && [[ $out == *"--limit N"* ]]
check $? "run --help documents --shared and --limit N"
dl run --limit 65535 -n "$uri" "$pfx-max" -- true
[ $rc -eq 0 ] || [[ $err == *semaphore* ]]
check $? "--limit 65535 is accepted (granted, or refused by the store: $rc)"

# Whether the store has semaphores (the shared section refuses one on a
# read-write name: DLOCK_EMODE where it has them, DLOCK_ENOTSUP where not).
dl run --limit 2 -n "$uri" "$pfx-probe-sem0" -- true
sem_cap=$([ $rc -eq 0 ] && echo 1 || echo 0)

# --- shared --------------------------------------------------------------------
dl run --shared -n "$uri" "$pfx-probe" -- true
if [ $rc -ne 0 ]; then
    [ $rc -eq 70 ] && one_line && [[ $err == *shared* ]]
    check $? "a store without shared locks refuses --shared: exit 70, one line saying so"
    shared=0
else
    shared=1
fi

if [ $shared = 1 ]; then
    r="$pfx-rw"
    hold r1 --shared "$uri" "$r"
    wait_for "$dir/r1.tok"
    hold r2 --shared -w 10 "$uri" "$r"
    wait_for "$dir/r2.tok"
    [ -s "$dir/r2.tok" ] && [ -s "$dir/r1.tok" ] && [ ! -e "$dir/r1.go" ] && kill -0 $pid_r1 2>/dev/null
    check $? "two --shared holders hold together"
    t1=$(cat "$dir/r1.tok" 2>/dev/null) t2=$(cat "$dir/r2.tok" 2>/dev/null)
    [ -n "$t1" ] && [ -n "$t2" ] && [ "$t2" -gt "$t1" ]
    check $? "their tokens increase in grant order ($t1 < $t2)"
    dl run -n "$uri" "$r" -- true
    [ $rc -eq 75 ] && one_line
    check $? "an exclusive request while readers hold: exit 75"
    t0=$(now_ms)
    dl run -w 5 --limit 2 "$uri" "$r" -- true
    el=$(( $(now_ms) - t0 ))
    if [ $sem_cap = 1 ]; then
        [ $rc -eq 75 ] && one_line && [ $el -lt 2500 ]
        check $? "a semaphore on a name held shared: exit 75 at once (${el} ms, -w 5)"
    else
        [ $rc -eq 70 ] && one_line && [[ $err == *semaphore* ]] && [ $el -lt 2500 ]
        check $? "a semaphore on a store without them: exit 70 at once (${el} ms, -w 5)"
    fi
    dl inspect "$uri" "$r"
    [ $rc -eq 0 ] && [ "$(wc -l <"$dir/out")" -eq 3 ] &&
        [[ $(sed -n 1p "$dir/out") == "$r: held shared (2 holders), the newest"*", token $t2"* ]] &&
        [[ $(sed -n 2p "$dir/out") == "  holder 1 of 2: shared, token $t1"* ]] &&
        [[ $(sed -n 3p "$dir/out") == "  holder 2 of 2: shared, token $t2"* ]]
    check $? "inspect: the name's line, then one line per holder with mode and token"
    dl inspect --json "$uri" "$r"
    json_holders shared 0 "$t1" "$t2"
    check $? "inspect --json: holder_count 2, holders in grant order, mode and token each"
    let_go r1
    let_go r2
    dl run -n "$uri" "$r" -- sh -c 'printf %s "$DLOCK_TOKEN"'
    [ $rc -eq 0 ] && [ -n "$out" ] && [ "$out" -gt "$t2" ]
    check $? "once the readers left, a writer gets a token above theirs ($out)"
    dl inspect "$uri" "$r"
    [ $rc -eq 0 ] && [ "$(wc -l <"$dir/out")" -eq 1 ] && [[ $out == "$r: free"* ]]
    check $? "inspect after: free, one line"
else
    for i in 1 2 3 4 5 6 7 8 9; do skip "the store has no shared locks"; done
fi

# --- semaphore -------------------------------------------------------------------
dl run --limit 2 -n "$uri" "$pfx-probe-sem" -- true
if [ $rc -ne 0 ]; then
    [ $rc -eq 70 ] && one_line && [[ $err == *semaphore* ]]
    check $? "a store without semaphores refuses --limit: exit 70, one line saying so"
    sem=0
else
    sem=1
fi

if [ $sem = 1 ]; then
    s="$pfx-sem"
    hold p1 --limit 2 "$uri" "$s"
    wait_for "$dir/p1.tok"
    hold p2 --limit 2 -w 10 "$uri" "$s"
    wait_for "$dir/p2.tok"
    [ -s "$dir/p1.tok" ] && [ -s "$dir/p2.tok" ] && kill -0 $pid_p1 2>/dev/null
    check $? "two permits of a semaphore of 2 held together"
    p1=$(cat "$dir/p1.tok" 2>/dev/null) p2=$(cat "$dir/p2.tok" 2>/dev/null)
    dl run -n --limit 2 "$uri" "$s" -- true
    [ $rc -eq 75 ] && one_line && [[ $err == *"held elsewhere"* ]]
    check $? "a third permit of 2: exit 75, held elsewhere"
    for other in "--limit 3" "" "--shared"; do
        t0=$(now_ms)
        # shellcheck disable=SC2086
        dl run -w 5 $other "$uri" "$s" -- true
        el=$(( $(now_ms) - t0 ))
        [ $rc -eq 75 ] && one_line && [[ $err != *"timed out"* ]] && [ $el -lt 2500 ]
        check $? "'${other:-exclusive}' on a semaphore of 2: exit 75 at once (${el} ms, -w 5)"
    done
    dl inspect "$uri" "$s"
    [ $rc -eq 0 ] && [ "$(wc -l <"$dir/out")" -eq 3 ] &&
        [[ $(sed -n 1p "$dir/out") == "$s: held as a semaphore of 2 (2 permits taken), the newest"* ]] &&
        [[ $(sed -n 2p "$dir/out") == "  holder 1 of 2: permit, token $p1"* ]] &&
        [[ $(sed -n 3p "$dir/out") == "  holder 2 of 2: permit, token $p2"* ]]
    check $? "inspect: a semaphore of 2, one line per permit"
    dl inspect --json "$uri" "$s"
    json_holders exclusive 2 "$p1" "$p2"
    check $? "inspect --json: two exclusive holders with limit 2, in grant order"
    # A waiter for the third permit is admitted when one permit is given back.
    hold p3 --limit 2 -w 10 "$uri" "$s"
    sleep 0.3
    [ ! -e "$dir/p3.tok" ]
    check $? "a third permit waits while two are held"
    let_go p1
    wait_for "$dir/p3.tok"
    p3=$(cat "$dir/p3.tok" 2>/dev/null)
    [ -n "$p3" ] && [ "$p3" -gt "$p2" ] && kill -0 $pid_p2 2>/dev/null
    check $? "one permit given back admits the waiter (token $p3), the other holder keeps its own"
    let_go p2
    let_go p3
else
    for i in 1 2 3 4 5 6 7 8 9 10; do skip "the store has no semaphores"; done
fi

echo "1..$n"
[ $failed -eq 0 ]
