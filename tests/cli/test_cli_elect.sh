#!/usr/bin/env bash
# TAP tests of dlock elect and dlock leader, on one store.
# Usage: test_cli_elect.sh PATH/TO/dlock file|URI_VARIABLE
# "file" uses a fresh directory; otherwise the store's URI is read from the
# named environment variable (scripts/stores/start.sh exports them).
# - dlock leader (text and --json) with no leader and with one;
# - dlock elect runs its command with the term and the value, a second
#   candidate with -n is refused (75), one that waits leads when the first
#   command ends (resign), with a higher term;
# - dlock leader --watch --json prints each change in order, ends on SIGTERM;
# - on the file store, leadership lost (the lock file removed) stops the
#   command's process group and dlock exits 70.
set -u

DLOCK=${1:?usage: test_cli_elect.sh PATH/TO/dlock file|URI_VARIABLE}
STORE=${2:?usage: test_cli_elect.sh PATH/TO/dlock file|URI_VARIABLE}
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cli-elect.XXXXXX") || exit 1
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
name="cli-elect-$$-$RANDOM"
bg_pids=()

cleanup() {
    local pid
    touch "$dir/go" "$dir/go2"
    for pid in "${bg_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

. "$(dirname "$0")/lib.sh"

# json_field FILE-LINE FIELD: the field's value in one JSON line.
json_field() {
    python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("null" if v is None else (str(v).lower() if isinstance(v,bool) else v))' "$1" "$2"
}

# 1. No leader yet.
dl leader "$uri" "$name"
check $([ $rc -eq 0 ] && [ "$out" = "$name: no leader" ] && echo 0 || echo 1) \
    "dlock leader with no leader: '$name: no leader', exit 0"
dl leader --json "$uri" "$name"
check $([ $rc -eq 0 ] && [ "$(json_field "$out" held)" = false ] &&
        [ "$(json_field "$out" term)" = null ] && [ "$(json_field "$out" value)" = null ] &&
        [ "$(json_field "$out" name)" = "$name" ] && echo 0 || echo 1) \
    "dlock leader --json with no leader: held false, term and value null"

# The watcher, from here to the end.
"$DLOCK" leader --json --watch "$uri" "$name" </dev/null >"$dir/watch" 2>"$dir/watch.err" &
watch_pid=$!
bg_pids+=($watch_pid)
for ((i = 0; i < 100; i++)); do
    [ -s "$dir/watch" ] && break
    sleep 0.05
done

# 2. A leader runs its command with the term and the value.
"$DLOCK" elect "$uri" "$name" --value "first node" -- sh -c \
    "printf '%s %s' \"\$DLOCK_TOKEN\" \"\$DLOCK_VALUE\" >'$dir/a.new'; mv '$dir/a.new' '$dir/a'; \
while [ ! -e '$dir/go' ]; do sleep 0.05; done" </dev/null >/dev/null 2>"$dir/a.err" &
a_pid=$!
bg_pids+=($a_pid)
wait_for "$dir/a"
read -r term1 value1 <"$dir/a"
value1="$value1"
check $([ -n "$term1" ] && [ "$term1" -gt 0 ] && [ "$(cut -d' ' -f2- "$dir/a")" = "first node" ] &&
        echo 0 || echo 1) "dlock elect: the command has DLOCK_TOKEN ($term1) and DLOCK_VALUE"
dl leader "$uri" "$name"
check $([ $rc -eq 0 ] && [[ $out == "$name: led"*", term $term1"*"value 'first node'" ]] &&
        echo 0 || echo 1) "dlock leader names the term and the value"
dl leader --json "$uri" "$name"
check $([ "$(json_field "$out" held)" = true ] && [ "$(json_field "$out" term)" = "$term1" ] &&
        [ "$(json_field "$out" value)" = "first node" ] && echo 0 || echo 1) \
    "dlock leader --json: held true, the term, the value"

# 3. Another candidate: -n is refused; a waiting one leads after the resign.
dl elect -n "$uri" "$name" -- true
check $([ $rc -eq 75 ] && [[ $err == *"election '$name' is led elsewhere"* ]] && one_line &&
        echo 0 || echo 1) "dlock elect -n while led: exit 75, one line"
"$DLOCK" elect -w 20 "$uri" "$name" --value second -- sh -c \
    "printf '%s' \"\$DLOCK_TOKEN\" >'$dir/b.new'; mv '$dir/b.new' '$dir/b'; \
while [ ! -e '$dir/go2' ]; do sleep 0.05; done" </dev/null >/dev/null 2>"$dir/b.err" &
b_pid=$!
bg_pids+=($b_pid)
sleep 0.3
touch "$dir/go"
wait $a_pid
a_rc=$?
wait_for "$dir/b"
term2=$(<"$dir/b")
check $([ $a_rc -eq 0 ] && [ -n "$term2" ] && [ "$term2" -gt "$term1" ] && echo 0 || echo 1) \
    "the first command's end resigns: the waiting candidate leads, term $term2 > $term1"
sleep 0.5 # long enough for an observer that polls (MariaDB: every 100 ms)
touch "$dir/go2"
wait $b_pid
sleep 0.5

# 4. The watcher saw: none, first (term1), [none], second (term2), none.
kill -TERM $watch_pid
wait $watch_pid
w_rc=$?
seq=$(python3 - "$dir/watch" <<'EOF'
import json, sys
out = []
for line in open(sys.argv[1]):
    o = json.loads(line)
    out.append("-" if not o["held"] else "%s:%s" % (o["term"], o["value"]))
print(" ".join(out))
EOF
)
want_re="^- $term1:first node( -)? $term2:second -\$"
check $([ $w_rc -eq 0 ] && [[ $seq =~ $want_re ]] && echo 0 || echo 1) \
    "dlock leader --watch --json: each change in order ($seq), exit 0 on SIGTERM"

# 5. File store: leadership lost stops the command's group, exit 70.
if [ "$STORE" = file ]; then
    "$DLOCK" elect -G 1 "$uri" "$name-lost" -- sh -c \
        "touch '$dir/c'; sleep 30" </dev/null >/dev/null 2>"$dir/c.err" &
    c_pid=$!
    bg_pids+=($c_pid)
    wait_for "$dir/c"
    rm -f "$dir/locks/$name-lost.lock"
    wait $c_pid
    c_rc=$?
    check $([ $c_rc -eq 70 ] &&
            grep -q "leadership of '$name-lost' was lost while 'sh' ran: .*stopping its process group" \
                "$dir/c.err" && echo 0 || echo 1) \
        "leadership lost: the command's group is stopped, exit 70 (got $c_rc)"
fi

echo "1..$n"
[ "$failed" -eq 0 ]
