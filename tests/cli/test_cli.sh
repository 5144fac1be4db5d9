#!/usr/bin/env bash
# TAP tests of the dlock CLI over the file backend, in a fresh directory.
# Usage: test_cli.sh PATH/TO/dlock
set -u

DLOCK=${1:?usage: test_cli.sh PATH/TO/dlock}
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cli.XXXXXX") || exit 1
uri="file://$dir/locks"
n=0
failed=0
bg_pids=()

cleanup() {
    local pid
    for pid in "${bg_pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null
    done
    rm -rf "$dir"
}
trap cleanup EXIT

. "$(dirname "$0")/lib.sh"

# A command that marks it holds the lock, then holds it until FILE.go exists.
hold_until() { echo "touch '$1.ready'; while [ ! -e '$1.go' ]; do sleep 0.05; done"; }

# --- version, help, usage ---------------------------------------------------
dl --version
[ $rc -eq 0 ] && [[ $out =~ ^dlock\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
check $? "--version prints 'dlock X.Y.Z' ($out)"

dl
[ $rc -eq 64 ] && [[ $err == *Usage:* ]] && [ -z "$out" ]
check $? "no arguments: usage on stderr, exit 64"

dl help
[ $rc -eq 0 ] && [[ $out == *"dlock run"* ]]
check $? "'dlock help' prints usage, exit 0"

dl run --help
[ $rc -eq 0 ] && [[ $out == *"--nonblock"* ]]
check $? "'dlock run --help' prints usage, exit 0"

dl frobnicate
[ $rc -eq 64 ] && one_line && [[ $err == *frobnicate* ]]
check $? "unknown subcommand: exit 64 naming it"

# --- malformed URIs ---------------------------------------------------------
for bad in foo file:// nosuch://x/y; do
    dl run "$bad" name -- true
    [ $rc -eq 64 ] && one_line
    check $? "URI '$bad': exit 64 with one message line"
done

dl run 'file:///x?bogus=1' name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *bogus* ]]
check $? "URI with an unknown option: exit 64 naming 'bogus'"

dl run nosuch://x/y name -- true
[[ $err == *nosuch* ]]
check $? "unknown scheme: message names the scheme"

for bad in 'file://user:s3cret@/x' 'nosuch://user:s3cret@host/x' 'file://user:s3cret@'; do
    dl run "$bad" name -- true
    [ $rc -eq 64 ] && [ -n "$err" ] && [[ $err != *s3cret* ]]
    check $? "URI '$bad': exit 64, the password is not shown"
done

# --- option and argument errors ----------------------------------------------
dl run "$uri" name true
[ $rc -eq 64 ] && one_line && [[ $err == *--* ]]
check $? "missing '--': exit 64"

dl run "$uri" name --
[ $rc -eq 64 ] && one_line
check $? "missing COMMAND: exit 64"

dl run -- true
[ $rc -eq 64 ] && one_line
check $? "missing NAME: exit 64"

dl run a b c -- true
[ $rc -eq 64 ] && one_line && [[ $err == *URI* ]]
check $? "several arguments: the first is the URI ('a' is none): exit 64"

for w in abc 1x nan inf -1 ''; do
    dl run -w "$w" "$uri" name -- true
    [ $rc -eq 64 ] && one_line
    check $? "-w '$w': exit 64"
done

dl run -n -w 1 "$uri" name -- true
[ $rc -eq 64 ] && one_line
check $? "-n with -w: exit 64"

for t in 0 -1 4294967296 12ms; do
    dl run --ttl "$t" "$uri" name -- true
    [ $rc -eq 64 ] && one_line
    check $? "--ttl '$t': exit 64"
done

for g in abc -1 1x nan; do
    dl run -G "$g" "$uri" name -- true
    [ $rc -eq 64 ] && one_line
    check $? "-G '$g': exit 64"
done

dl run --grace=0 -G 2.5 "$uri" name -- true
[ $rc -eq 0 ]
check $? "--grace=0 and -G 2.5 are accepted"

dl run --bogus "$uri" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *--bogus* ]]
check $? "unknown option: exit 64 naming it"

dl run "$uri" name -- echo hi
[ $rc -eq 0 ] && [ "$out" = hi ] && [ -z "$err" ]
check $? "a plain run succeeds quietly"

dl run --ttl 5000 -w 2.5 "$uri" name -- true
[ $rc -eq 0 ]
check $? "--ttl and -w on a free lock: runs, exit 0"

dl run --wait=0 --ttl=1 "$uri" name -- true
[ $rc -eq 0 ]
check $? "--wait=0 on a free lock: runs, exit 0"

# --- the command's status ----------------------------------------------------
dl run "$uri" name -- sh -c 'exit 7'
[ $rc -eq 7 ]
check $? "command exit status 7 is propagated"

dl run "$uri" name -- sh -c 'kill -TERM $$'
[ $rc -eq 143 ]
check $? "command killed by SIGTERM: exit 128+15"

dl run "$uri" name -- sh -c 'kill -KILL $$'
[ $rc -eq 137 ]
check $? "command killed by SIGKILL: exit 128+9"

dl run "$uri" name -- "$dir/no such command"
[ $rc -eq 127 ] && one_line && [[ $err == *"no such command"* ]]
check $? "nonexistent command: exit 127 naming it"

: >"$dir/not-executable"
dl run "$uri" name -- "$dir/not-executable"
[ $rc -eq 126 ] && one_line
check $? "non-executable command: exit 126"

dl run "$uri" name -- sh -c 'echo out; echo errline >&2'
[ $rc -eq 0 ] && [ "$out" = out ] && [ "$err" = errline ]
check $? "the command's stdout and stderr pass through untouched"

out=$(echo piped | "$DLOCK" run "$uri" name -- cat 2>"$dir/err")
rc=$?
[ $rc -eq 0 ] && [ "$out" = piped ]
check $? "the command inherits stdin"

fds=$(sh -c 'ls /proc/self/fd | wc -l' </dev/null)
dl run "$uri" name -- sh -c 'ls /proc/self/fd | wc -l'
[ $rc -eq 0 ] && [ "$out" = "$fds" ]
check $? "no lock or pipe descriptor leaks into the command ($out fds, $fds without dlock)"

# --- DLOCK_TOKEN and DLOCK_NAME -------------------------------------------------
dl run "$uri" 'tok name' -- sh -c 'printf "%s|%s" "$DLOCK_TOKEN" "$DLOCK_NAME"'
first=${out%%|*}
[ $rc -eq 0 ] && [ "${out#*|}" = 'tok name' ]
check $? "DLOCK_NAME is the lock name"
[[ $first =~ ^[0-9]+$ ]]
check $? "DLOCK_TOKEN is a decimal number ($first)"
dl run "$uri" 'tok name' -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
[[ $out =~ ^[0-9]+$ ]] && [[ $first =~ ^[0-9]+$ ]] && [ "$out" -gt "$first" ]
check $? "DLOCK_TOKEN strictly increases across runs ($first then $out)"

# --- several names ---------------------------------------------------------------
dl run "$uri" 'n b' 'n a' -- sh -c 'printf "%s|%s" "$DLOCK_TOKEN" "$DLOCK_NAME"'
[ $rc -eq 0 ] && [ "${out#*|}" = $'n a\nn b' ]
check $? "URI NAME NAME: DLOCK_NAME lists the names in byte order, one per line"
m="$dir/names-held"
"$DLOCK" run "$uri" 'n b' -- sh -c "$(hold_until "$m")" </dev/null &
bg_pids+=($!)
wait_for "$m.ready"
dl run -n "$uri" 'n a' 'n b' -- true
[ $rc -eq 75 ] && one_line && [[ $err == *"'n a', 'n b'"* ]]
check $? "-n with one of the names held elsewhere: exit 75 naming the lock"
dl run -n "$uri" 'n a' -- true
[ $rc -eq 0 ]
check $? "the other name was not left held"
touch "$m.go"
wait "${bg_pids[-1]}"
dl run "$uri" x x -- true
[ $rc -eq 64 ] && one_line && [[ $err == *twice* ]]
check $? "a name given twice: exit 64 saying so"
dl run "$uri" x '' -- true
[ $rc -eq 64 ] && one_line && [[ $err == *empty* ]]
check $? "an empty name among several: exit 64"

# --- dlock inspect ---------------------------------------------------------------
dl inspect "$uri" 'ins free'
[ $rc -eq 0 ] && [[ $out == "ins free: free"* ]]
check $? "inspect a name never taken: free"
m="$dir/ins-held"
"$DLOCK" run "$uri" 'ins held' -- sh -c "printf %s \"\$DLOCK_TOKEN\" >'$m.tok'; $(hold_until "$m")" </dev/null &
bg_pids+=($!)
wait_for "$m.ready"
t_held=$(cat "$m.tok")
dl inspect "$uri" 'ins held' 'ins free'
[ $rc -eq 0 ] && [ "$(wc -l <"$dir/out")" -eq 2 ] && [[ $out == *"ins held: held by "*", token $t_held"* ]]
check $? "inspect a held name: its holder and token ($t_held), one line per name"
dl inspect --json "$uri" 'ins held'
printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
o = json.loads(sys.stdin.read())
ok = (o["name"] == "ins held" and o["held"] is True and o["token"] == int(sys.argv[1])
      and len(o["owner"]) == 32 and o["lease_ms"] is None and o["waiters"] is None)
sys.exit(0 if ok else 1)' "$t_held"
check $? "--json: one object with name, held, token, owner, lease_ms and waiters (null: unknown)"
dl run -n "$uri" 'ins held' -- true
[ $rc -eq 75 ]
check $? "inspecting took nothing: the holder still holds"
touch "$m.go"
wait "${bg_pids[-1]}"
dl inspect
[ $rc -eq 64 ] && one_line
check $? "inspect without NAME: exit 64"
dl inspect nope a
[ $rc -eq 64 ] && one_line && [[ $err == *URI* ]]
check $? "inspect with a first argument that is no URI: exit 64"
dl inspect --bogus "$uri" a
[ $rc -eq 64 ] && one_line && [[ $err == *--bogus* ]]
check $? "inspect with an unknown option: exit 64 naming it"
dl inspect 'redis://:s3cret@127.0.0.1:1/0' a
[ $rc -eq 69 ] && one_line && [[ $err != *s3cret* ]]
check $? "inspect an unreachable store: exit 69, the password not shown"

# --- mutual exclusion -----------------------------------------------------------
log="$dir/serial.log"
pids=()
for i in 1 2 3; do
    "$DLOCK" run "$uri" serial -- sh -c "echo start >>'$log'; sleep 0.2; echo end >>'$log'" \
        </dev/null 2>>"$dir/serial.err" &
    pids+=($!)
done
bg_pids+=("${pids[@]}")
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
[ $status -eq 0 ] && [ "$(tr '\n' ' ' <"$log" 2>/dev/null)" = "start end start end start end " ]
check $? "three concurrent runs on one name are serialised"

# --- a held lock: -n, -w, and a waiter ----------------------------------------
h="$dir/held"
"$DLOCK" run "$uri" held -- sh -c "$(hold_until "$h")" </dev/null &
holder=$!
bg_pids+=("$holder")
wait_for "$h.ready"
check $? "a holder takes the lock"

t0=$(now_ms)
dl run -n "$uri" held -- touch "$dir/n-ran"
t1=$(now_ms)
[ $rc -eq 75 ] && one_line && [[ $err == *held* ]] && [ ! -e "$dir/n-ran" ]
check $? "-n on a held lock: exit 75, one line, command not run"
[ $rc -eq 75 ] && [ $((t1 - t0)) -lt 2000 ]
check $? "-n on a held lock returns promptly ($((t1 - t0)) ms)"

t0=$(now_ms)
dl run -w 0.3 "$uri" held -- touch "$dir/w-ran"
t1=$(now_ms)
[ $rc -eq 75 ] && one_line && [[ $err == *"timed out"* ]] && [ ! -e "$dir/w-ran" ]
check $? "-w 0.3 on a held lock: exit 75 with a timeout message"
[ $rc -eq 75 ] && [ $((t1 - t0)) -ge 250 ] && [ $((t1 - t0)) -lt 5000 ]
check $? "-w 0.3 waits about that long ($((t1 - t0)) ms)"

dl run "$uri" other -- true
[ $rc -eq 0 ]
check $? "another name is not blocked by the held one"

"$DLOCK" run "$uri" held -- touch "$dir/waiter-ran" </dev/null &
waiter=$!
bg_pids+=("$waiter")
sleep 0.3
[ -e "$h.ready" ] && [ ! -e "$h.go" ] && kill -0 "$waiter" 2>/dev/null && [ ! -e "$dir/waiter-ran" ]
check $? "a waiter keeps waiting while the lock is held"
touch "$h.go"
wait "$holder"
hrc=$?
wait "$waiter"
rc=$?
[ $hrc -eq 0 ] && [ $rc -eq 0 ] && [ -e "$dir/waiter-ran" ]
check $? "the waiter runs once the holder's command ends"

# --- signals -------------------------------------------------------------------
s="$dir/sig"
"$DLOCK" run "$uri" sig -- sh -c "trap 'echo TERM >\"$s.marker\"; exit 3' TERM; touch '$s.ready'; i=0; while [ \$i -lt 200 ]; do sleep 0.05; i=\$((i + 1)); done" \
    </dev/null &
dpid=$!
bg_pids+=("$dpid")
wait_for "$s.ready"
kill -TERM "$dpid"
wait "$dpid"
rc=$?
[ $rc -eq 3 ] && [ "$(cat "$s.marker" 2>/dev/null)" = TERM ]
check $? "SIGTERM to dlock reaches the command, dlock exits with its status"
dl run -n "$uri" sig -- true
[ $rc -eq 0 ]
check $? "the lock is free after the forwarded SIGTERM"

k="$dir/kill"
"$DLOCK" run "$uri" kill -- sh -c "echo \$\$ >'$k.pid'; touch '$k.ready'; exec sleep 60" </dev/null &
dpid=$!
bg_pids+=("$dpid")
wait_for "$k.ready"
child=$(cat "$k.pid" 2>/dev/null)
kill -KILL "$dpid"
{ wait "$dpid"; } 2>/dev/null
gone=1
for ((i = 0; i < 100; i++)); do
    [ -n "$child" ] && kill -0 "$child" 2>/dev/null || { gone=0; break; }
    sleep 0.05
done
[ -n "$child" ] && [ $gone -eq 0 ]
check $? "the command dies with dlock (SIGKILL to dlock)"
[ -n "$child" ] && kill -KILL "$child" 2>/dev/null
dl run -n "$uri" kill -- true
[ $rc -eq 0 ]
check $? "the lock is free after dlock was killed"

# --- process group, grandchildren, SIGPIPE --------------------------------------
g="$dir/grp"
"$DLOCK" run "$uri" grp -- sh -c "sleep 30 & echo \$! >'$g.gc'; echo \$\$ >'$g.pid'; wait" \
    </dev/null 2>/dev/null &
dpid=$!
bg_pids+=("$dpid")
wait_for "$g.pid"
cpid=$(cat "$g.pid" 2>/dev/null)
gc=$(cat "$g.gc" 2>/dev/null)
cpg=$(ps -o pgid= -p "$cpid" 2>/dev/null | tr -d ' ')
dpg=$(ps -o pgid= -p "$dpid" 2>/dev/null | tr -d ' ')
[ -n "$cpid" ] && [ "$cpg" = "$cpid" ] && [ "$cpg" != "$dpg" ]
check $? "the command leads a process group of its own ($cpg; dlock's is $dpg)"
kill -TERM "$dpid"
wait "$dpid"
rc=$?
gone=1
for ((i = 0; i < 40; i++)); do
    st=$(sed 's/.*) //' "/proc/$gc/stat" 2>/dev/null | cut -d' ' -f1)
    if [ -n "$gc" ] && { [ -z "$st" ] || [ "$st" = Z ]; }; then gone=0; break; fi
    sleep 0.05
done
[ $rc -eq 143 ] && [ $gone -eq 0 ]
check $? "SIGTERM to dlock reaches the whole group: the command's child stops too (exit $rc)"

# dlock's stderr is a pipe nobody reads: the loss message cannot be
# written, and dlock must still stop the command and exit 70 (not die of
# SIGPIPE, 141).
p="$dir/pipe"
mkdir -p "$p"
( "$DLOCK" run "file://$p/locks" piped -- sh -c "rm -f '$p/locks/piped.lock'; sleep 30" \
      </dev/null 2>&1 >/dev/null | true
  exit "${PIPESTATUS[0]}" )
rc=$?
[ $rc -eq 70 ]
check $? "writing to a closed stderr does not kill dlock (exit $rc, not 141)"

# --- passwords (errors found before the store is contacted) -------------------
echo s3cret >"$dir/pw"
: >"$dir/pw-empty"
printf '\nsecond\n' >"$dir/pw-blank"
dl run --password-file "$dir/no such file" "$uri" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *"no such file"* ]]
check $? "--password-file missing: exit 64 naming it"
dl run --password-file "$dir/pw-empty" "$uri" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *empty* ]]
check $? "--password-file empty: exit 64"
dl run --password-file "$dir/pw-blank" "$uri" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *empty* ]]
check $? "--password-file with an empty first line: exit 64"
dl run --password-file "$dir" "$uri" name -- true
[ $rc -eq 64 ] && one_line
check $? "--password-file a directory: exit 64"
dl run --password-file "$dir/pw" 'redis://:uripw9@127.0.0.1:1/0' name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *"password already"* ]] && [[ $err != *s3cret* ]] &&
    [[ $err != *uripw9* ]]
check $? "a password both in the URI and in --password-file: exit 64, neither shown"
DLOCK_PASSWORD=s3cret dl run 'redis://:uripw9@127.0.0.1:1/0' name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *DLOCK_PASSWORD* ]]
check $? "a password both in the URI and in DLOCK_PASSWORD: exit 64"
DLOCK_PASSWORD='' dl run "$uri" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *DLOCK_PASSWORD* ]]
check $? "an empty DLOCK_PASSWORD: exit 64"
DLOCK_PASSWORD=s3cret dl run "$uri" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *DLOCK_PASSWORD* ]] && [[ $err != *s3cret* ]]
check $? "a password for the file store: exit 64 naming its source"
dl run --password-file "$dir/pw" 'redis://127.0.0.1:1/0' name -- true
[ $rc -eq 69 ] && [[ $err != *s3cret* ]]
check $? "--password-file with a store that cannot be reached: exit 69, password not shown"
dl run "$uri?password_file=$dir/pw" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *"no user or password"* ]] && [[ $err != *s3cret* ]]
check $? "password_file= on a file:// URI: exit 64, the password not shown"
dl run "$uri?password_file=$dir/no%20such%20file" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *password_file* ]] && [[ $err == *"no such file"* ]]
check $? "password_file= naming a missing file: exit 64 naming the option and the file"
dl run "redis://:uripw9@127.0.0.1:1/0?password_file=$dir/pw" name -- true
[ $rc -eq 64 ] && one_line && [[ $err == *"password already"* ]] && [[ $err != *s3cret* ]] &&
    [[ $err != *uripw9* ]]
check $? "password_file= and a password in the URI: exit 64, neither shown"
dl run "redis://127.0.0.1:1/0?password_file=$dir/pw" name -- true
[ $rc -eq 69 ] && [[ $err != *s3cret* ]] && [[ $err == *127.0.0.1* ]]
check $? "password_file= with a store that cannot be reached: exit 69, password not shown"
dl inspect --password-file "$dir/no such file" 'redis://127.0.0.1:1/0' name
[ $rc -eq 64 ] && one_line && [[ $err == *"no such file"* ]]
check $? "inspect --password-file missing: exit 64 naming it"
dl leader --password-file "$dir/pw-empty" 'redis://127.0.0.1:1/0' name
[ $rc -eq 64 ] && one_line && [[ $err == *empty* ]]
check $? "leader --password-file empty: exit 64"

# --- default URI ---------------------------------------------------------------
env_dir="$dir/from env"
DLOCK_URI="file://${env_dir// /%20}" "$DLOCK" run envname -- true </dev/null
rc=$?
[ $rc -eq 0 ] && [ -d "$env_dir" ]
check $? "DLOCK_URI is used when the URI is omitted"

xdg="$dir/xdg 50%"
mkdir -p "$xdg"
env -u DLOCK_URI XDG_RUNTIME_DIR="$xdg" "$DLOCK" run xdgname -- true </dev/null
rc=$?
[ $rc -eq 0 ] && [ -d "$xdg/dlock" ]
check $? "without DLOCK_URI the store is \$XDG_RUNTIME_DIR/dlock (even with ' ' and '%')"

DLOCK_URI="file://$dir/env-unused" "$DLOCK" run "file://$dir/explicit" argname -- true </dev/null
rc=$?
[ $rc -eq 0 ] && [ -d "$dir/explicit" ] && [ ! -e "$dir/env-unused" ]
check $? "an explicit URI wins over DLOCK_URI"

DLOCK_URI="file://$dir/exported" dl run name -- sh -c 'printf "%s" "$DLOCK_URI"'
[ $rc -eq 0 ] && [ "$out" = "file://$dir/exported" ]
check $? "the command gets DLOCK_URI, the store's URI"
DLOCK_URI="file://$dir/unused" dl run "file://$dir/explicit" name -- sh -c 'printf "%s" "$DLOCK_URI"'
[ $rc -eq 0 ] && [ "$out" = "file://$dir/explicit" ]
check $? "also when the URI is given on the command line"

dl run -w "redis://:s3cret-pw@127.0.0.1:1/0" name -- true
[ $rc -eq 64 ] && [[ $err != *s3cret-pw* ]] && [[ $err == *"invalid wait"* ]]
check $? "a URI given as -w's value: exit 64, its password not shown"

# --- a list of stores (one lock in each) ----------------------------------------
dl run "file://$dir/list-a file://$dir/list-b" listed -- sh -c 'printf "%s %s" "$DLOCK_TOKEN" "$DLOCK_URI"'
[ $rc -eq 0 ] && [ "${out#* }" = "file://$dir/list-a file://$dir/list-b" ] &&
    [ -e "$dir/list-a/listed.lock" ] && [ -e "$dir/list-b/listed.lock" ]
check $? "a list of two stores: the lock is taken in both, DLOCK_URI is the list"
"$DLOCK" run "file://$dir/list-b" listed -- sleep 5 </dev/null >/dev/null 2>&1 &
bpid=$!
sleep 0.3
dl run -n "file://$dir/list-a file://$dir/list-b" listed -- true
[ $rc -eq 75 ]
check $? "the second store's part held elsewhere: -n exits 75"
dl run -n "file://$dir/list-a" listed -- true
[ $rc -eq 0 ]
check $? "and the first store's part was released"
kill $bpid 2>/dev/null; wait $bpid 2>/dev/null
DLOCK_PASSWORD=secret dl run "file://$dir/list-a file://$dir/list-b" listed -- true
[ $rc -eq 64 ] && [[ $err == *"not of a list"* ]]
check $? "DLOCK_PASSWORD with a list of stores: exit 64"

# --- dlock migrate OLD NEW NAME... ---------------------------------------------
old="file://$dir/mig-old"
new="file://$dir/mig-new"
dl migrate --help
[ $rc -eq 0 ] && [[ $out == *"dlock migrate"* ]]
check $? "'dlock migrate --help' prints usage, exit 0"
dl migrate
[ $rc -eq 64 ] && one_line && [[ $err == *"migrate --help"* ]]
check $? "migrate without arguments: exit 64"
dl run "$old-floor" migfloor -- true
dl run "$old-floor" migfloor -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
t_floor_old=$out
dl migrate "$old-floor" "$new-floor"
t_top=$(sed -n 's/^\* \([0-9]*\) ok$/\1/p' "$dir/out")
[ $rc -eq 0 ] && [ -z "$err" ] && [ "$(wc -l <"$dir/out")" -eq 1 ] && [ -n "$t_top" ] &&
    [ "$t_top" -ge "$t_floor_old" ]
check $? "migrate without a NAME: '* TOP ok' (NEW's floor raised to OLD's top $t_top), exit 0"
dl run "$new-floor" never-on-old -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
[ $rc -eq 0 ] && [ -n "$t_top" ] && [ "$out" -gt "$t_top" ]
check $? "a name never taken on OLD gets a token from NEW above OLD's top ($out > $t_top)"
dl migrate -w abc "$old" "$new" m
[ $rc -eq 64 ] && one_line
check $? "migrate -w abc: exit 64"
dl migrate --bogus "$old" "$new" m
[ $rc -eq 64 ] && one_line && [[ $err == *--bogus* ]]
check $? "migrate with an unknown option: exit 64 naming it"
dl migrate "$old" "$new" ''
[ $rc -eq 64 ] && one_line
check $? "migrate with an empty NAME: exit 64"
dl migrate "$old $dir/x" "$new" m
[ $rc -eq 64 ] && one_line && [[ $err == *OLD* ]] && [[ $err == *list* ]]
check $? "OLD that is a list of stores: exit 64 saying so"
dl migrate "$old" "$new file://$dir/x" m
[ $rc -eq 64 ] && one_line && [[ $err == *NEW* ]] && [[ $err == *list* ]]
check $? "NEW that is a list of stores: exit 64 saying so"
dl migrate "$old" "$old" m
[ $rc -eq 64 ] && one_line && [[ $err == *same* ]] && [ ! -e "$dir/mig-old" ]
check $? "OLD == NEW: exit 64, nothing touched"
dl migrate 'redis://:s3cret@127.0.0.1:1/0' 'redis://:other9@127.0.0.1:1/0' m
[ $rc -eq 64 ] && one_line && [[ $err == *same* ]] && [[ $err != *s3cret* ]] && [[ $err != *other9* ]]
check $? "OLD == NEW but for the password: exit 64, no password shown"
dl migrate 'redis://:s3cret@127.0.0.1:1/0' "$new" m
[ $rc -eq 69 ] && one_line && [[ $err == *OLD* ]] && [[ $err != *s3cret* ]]
check $? "OLD unreachable: exit 69 naming OLD, the password not shown"
dl migrate -w 'redis://:s3cret@127.0.0.1:1/0' "$new" m
[ $rc -eq 64 ] && one_line && [[ $err != *s3cret* ]]
check $? "a URI given as -w's seconds: exit 64, its password not shown"

dl run "$old" mig1 -- true
dl run "$old" mig1 -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
t_old=$out
dl migrate "$old" "$new" mig1 'mig 2'
t_mig=$(sed -n 's/^mig1 \([0-9]*\) ok$/\1/p' "$dir/out")
[ $rc -eq 0 ] && [ -z "$err" ] && [ "$(wc -l <"$dir/out")" -eq 3 ] &&
    grep -qE '^\* [0-9]+ ok$' "$dir/out" && grep -qE '^mig 2 [0-9]+ ok$' "$dir/out" && [ -n "$t_mig" ] && [ "$t_mig" -gt "$t_old" ]
check $? "migrate file -> file: 'NAME TOKEN ok' per name, exit 0 (token $t_mig > OLD's $t_old)"
dl run "$new" mig1 -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
[ $rc -eq 0 ] && [ -n "$t_mig" ] && [ "$out" -gt "$t_mig" ]
check $? "the next grant on NEW alone is above migrate's token ($out > $t_mig)"
t_new=$out
dl migrate "$old" "$new" mig1
t_again=$(sed -n 's/^mig1 \([0-9]*\) ok$/\1/p' "$dir/out")
[ $rc -eq 0 ] && [ -n "$t_again" ] && [ "$t_again" -gt "$t_new" ]
check $? "migrate again (idempotent): exit 0, token still increasing ($t_again)"

m="$dir/mig-held"
"$DLOCK" run "$old" mheld -- sh -c "printf %s \"\$DLOCK_TOKEN\" >'$m.tok'; $(hold_until "$m")" </dev/null &
holder=$!
bg_pids+=("$holder")
wait_for "$m.ready"
check $? "a holder takes a name in OLD"
t0=$(now_ms)
dl migrate -w 1 "$old" "$new" mheld mfree
t1=$(now_ms)
[ $rc -eq 75 ] && one_line && [[ $err == *mheld* ]] && grep -qx 'mheld - busy' "$dir/out" &&
    grep -qE '^mfree [0-9]+ ok$' "$dir/out" && [ $((t1 - t0)) -ge 900 ]
check $? "-w 1 on a name held in OLD: 'mheld - busy', the other name ok, exit 75 ($((t1 - t0)) ms)"
dl run -n "$new" mheld -- true
[ $rc -eq 0 ]
check $? "nothing stays held in NEW after the busy name"
"$DLOCK" migrate "$old" "$new" mheld </dev/null >"$m.out" 2>"$m.err" &
migr=$!
bg_pids+=("$migr")
sleep 0.5
kill -0 "$migr" 2>/dev/null && ! grep -q mheld "$m.out"
check $? "migrate waits its turn behind OLD's holder"
touch "$m.go"
wait "$holder"
wait "$migr"
rc=$?
t_held=$(cat "$m.tok" 2>/dev/null)
t_mig=$(sed -n 's/^mheld \([0-9]*\) ok$/\1/p' "$m.out")
[ $rc -eq 0 ] && [ -n "$t_mig" ] && [ -n "$t_held" ] && [ "$t_mig" -gt "$t_held" ]
check $? "once the holder releases, migrate takes the name: exit 0 ($t_mig > $t_held)"
dl run "$new" mheld -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
[ $rc -eq 0 ] && [ -n "$t_mig" ] && [ "$out" -gt "$t_mig" ]
check $? "and NEW's next grant alone is above it ($out)"

# --- a lock lost while the command runs ----------------------------------------
# Removing the lock file breaks the lock (another process could lock a new
# file at the path): the keeper checks twice a second, dlock stops the
# command, exits 70 (tests/cli/test_cli_keep.sh checks the whole group).
lostdir="$dir/lost"
"$DLOCK" run "file://$lostdir" lostname -- sh -c \
    "trap 'touch \"$lostdir.stopped\"; exit 0' TERM; touch \"$lostdir.ready\"; while :; do sleep 0.05; done" \
    </dev/null 2>"$dir/err" &
lostpid=$!
wait_for "$lostdir.ready"
rm -f "$lostdir"/lostname.lock
t0=$(now_ms)
wait $lostpid
rc=$?
elapsed=$(( $(now_ms) - t0 ))
err=$(<"$dir/err")
[ $rc -eq 70 ] && [ -e "$lostdir.stopped" ] && [[ $err == *"was lost"* ]] && [ $elapsed -lt 5000 ]
check $? "lock file removed under the command: stopped, exit 70, noticed in ${elapsed} ms"

echo "1..$n"
[ $failed -eq 0 ]
