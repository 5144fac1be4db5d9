#!/bin/bash
# dlock run on a leased store (Redis): the keeper renews the lease while
# the command runs, a lock lost under a paused dlock stops the command, and
# no password reaches the command's environment (DLOCK_REDIS_AUTH_URI, a
# server that wants one), which --password-file and DLOCK_PASSWORD supply.
# TAP output. $1 = dlock binary; DLOCK_REDIS_URI, DLOCK_REDIS_AUTH_URI and
# DLOCK_REDLOCK_URI from scripts/stores/start.sh.
set -u
dlock=$1
uri=${DLOCK_REDIS_URI:?DLOCK_REDIS_URI is not set: start the stores first}
auth=${DLOCK_REDIS_AUTH_URI:?DLOCK_REDIS_AUTH_URI is not set: start the stores first}
redlock=${DLOCK_REDLOCK_URI:?DLOCK_REDLOCK_URI is not set: start the stores first}
tmp=$(mktemp -d /tmp/dlock-cli-redis.XXXXXX)
trap 'kill -CONT $bg 2>/dev/null; kill $bg 2>/dev/null; rm -rf "$tmp"' EXIT
bg=
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed + 1)); fi; }
name="cli-redis-$$-$RANDOM"

# 1. A 300 ms lease outlives 1.5 s of command: the keeper renews it.
"$dlock" run --ttl 300 "$uri" "$name-renew" -- sleep 1.5 &
bg=$!
sleep 1
"$dlock" run -n "$uri" "$name-renew" -- true 2>"$tmp/err1"
ok $([ $? = 75 ] && echo 0 || echo 1) "lease renewed while the command runs (-n refused after 1 s with ttl 300 ms)"
wait $bg
ok $? "the renewed run exits 0"

# 2. dlock paused past its lease: another client takes the lock; when dlock
#    resumes it finds the lock lost, stops the command and exits 70.
"$dlock" run --ttl 300 "$uri" "$name-lost" -- sh -c \
    'trap "echo stopped > '"$tmp"'/marker; exit 0" TERM; echo "$DLOCK_TOKEN" > '"$tmp"'/t1; while :; do sleep 0.05; done' \
    2>"$tmp/err2" &
bg=$!
for _ in $(seq 50); do [ -s "$tmp/t1" ] && break; sleep 0.1; done
kill -STOP $bg
sleep 0.8
"$dlock" run -n "$uri" "$name-lost" -- sh -c 'echo "$DLOCK_TOKEN" > '"$tmp"'/t2'
ok $? "another client acquires once the paused holder's lease ran out"
ok $([ "$(cat "$tmp/t2" 2>/dev/null || echo 0)" -gt "$(cat "$tmp/t1" 2>/dev/null || echo 0)" ] && echo 0 || echo 1) \
    "its fencing token is higher ($(cat "$tmp/t2" 2>/dev/null) > $(cat "$tmp/t1" 2>/dev/null))"
kill -CONT $bg
wait $bg
st=$?
bg=
ok $([ $st = 70 ] && echo 0 || echo 1) "the resumed dlock exits 70 (got $st)"
ok $([ -f "$tmp/marker" ] && echo 0 || echo 1) "and its command was stopped with SIGTERM"
grep -q "was lost while" "$tmp/err2"
ok $? "with a message: $(head -n1 "$tmp/err2")"

# 3. Passwords. redis://:PW@host... -> PW (percent-decoded) and redis://host...
pw_enc=${auth#*://}
pw_enc=${pw_enc%%@*}
pw_enc=${pw_enc#*:}
pw=$(printf '%b' "${pw_enc//%/\\x}")
bare=${auth/":$pw_enc@"/}
# clean_env ARGS...: dlock in an environment that holds no other password.
clean_env() { env -i PATH="$PATH" "$@" </dev/null; }
# has_no_password FILE: FILE (the command's environment) holds no password.
has_no_password() { ! grep -qF -e "$pw" -e "$pw_enc" "$1" && ! grep -q '^DLOCK_PASSWORD=' "$1"; }

clean_env "$dlock" run -n "$bare" "$name-pw" -- true 2>"$tmp/err3"
st=$?
ok $([ $st = 69 ] && echo 0 || echo 1) "without its password the server refuses: exit 69 (got $st)"

clean_env DLOCK_URI="$auth" "$dlock" run "$name-pw" -- env >"$tmp/env1" 2>"$tmp/err3"
st=$?
ok $([ $st = 0 ] && has_no_password "$tmp/env1" && echo 0 || echo 1) \
    "URI from DLOCK_URI: the command's environment holds no password (exit $st)"
shown=$(grep '^DLOCK_URI=' "$tmp/env1")
grep -qxF "DLOCK_URI=$bare" "$tmp/env1"
ok $? "its DLOCK_URI is the URI without the password: ${shown//"$pw"/***}"

clean_env "$dlock" run "$auth" "$name-pw" -- env >"$tmp/env2" 2>"$tmp/err3"
st=$?
ok $([ $st = 0 ] && has_no_password "$tmp/env2" && grep -qxF "DLOCK_URI=$bare" "$tmp/env2" && echo 0 || echo 1) \
    "URI on the command line: the same (exit $st)"

clean_env DLOCK_PASSWORD="$pw" "$dlock" run "$bare" "$name-pw" -- env >"$tmp/env3" 2>"$tmp/err3"
st=$?
ok $([ $st = 0 ] && has_no_password "$tmp/env3" && echo 0 || echo 1) \
    "DLOCK_PASSWORD authenticates and is removed from the command's environment (exit $st)"

printf '%s\n' "$pw" >"$tmp/pw"
chmod 600 "$tmp/pw"
clean_env "$dlock" run --password-file "$tmp/pw" "$bare" "$name-pw" -- env >"$tmp/env4" 2>"$tmp/err3"
st=$?
ok $([ $st = 0 ] && has_no_password "$tmp/env4" && echo 0 || echo 1) \
    "--password-file authenticates, the password stays out of the environment (exit $st)"

printf '%s\r\n' "$pw" >"$tmp/pw-crlf"
clean_env DLOCK_PASSWORD=wrong-one "$dlock" run --password-file "$tmp/pw-crlf" "$bare" "$name-pw" -- true 2>"$tmp/err3"
st=$?
ok $([ $st = 0 ] && echo 0 || echo 1) "--password-file (CRLF line) wins over DLOCK_PASSWORD (exit $st)"

echo wrong-one >"$tmp/pw-wrong"
clean_env "$dlock" run --password-file "$tmp/pw-wrong" "$bare" "$name-pw" -- true 2>"$tmp/err3"
st=$?
ok $([ $st = 69 ] && ! grep -q wrong-one "$tmp/err3" && grep -q -- --password-file "$tmp/err3" && echo 0 || echo 1) \
    "a wrong password from the file: exit 69, not shown, its source named (exit $st: $(head -n1 "$tmp/err3"))"
# 4. Redlock: a lease too short to ever be valid (TTL <= drift allowance)
#    is bad input, exit 64 at once; it used to wait forever.
timeout 10 "$dlock" run --ttl 2 "$redlock" "$name-tiny" -- true 2>"$tmp/err4"
st=$?
ok $([ $st = 64 ] && grep -q "at least 3 ms" "$tmp/err4" && echo 0 || echo 1) \
    "Redlock --ttl 2: exit 64 at once (got $st: $(head -n1 "$tmp/err4"))"
# 5. dlock migrate redis -> file: the file store's next grant alone is
#    above everything Redis granted for the name.
mfile="file://$tmp/migrated"
"$dlock" run "$uri" "$name-mig" -- sh -c 'printf %s "$DLOCK_TOKEN"' >"$tmp/tr" 2>"$tmp/err5"
"$dlock" migrate "$uri" "$mfile" "$name-mig" >"$tmp/mig" 2>>"$tmp/err5"
st=$?
tr=$(cat "$tmp/tr") tm=$(sed -n "s/^$name-mig \([0-9]*\) ok\$/\1/p" "$tmp/mig")
ok $([ $st = 0 ] && [ -n "$tr" ] && [ -n "$tm" ] && [ "$tm" -gt "$tr" ] && echo 0 || echo 1) \
    "migrate redis -> file: exit $st, token ${tm:-?} > Redis's ${tr:-?}"
"$dlock" run "$mfile" "$name-mig" -- sh -c 'printf %s "$DLOCK_TOKEN"' >"$tmp/tf" 2>>"$tmp/err5"
tf=$(cat "$tmp/tf")
ok $([ -n "$tf" ] && [ -n "$tm" ] && [ "$tf" -gt "$tm" ] && echo 0 || echo 1) \
    "the file store's next grant alone is above it (${tf:-?})"
#    The password of OLD or NEW never shows, even when the server refuses.
clean_env "$dlock" migrate "${bare/redis:\/\//redis://:wrong-one@}" "$mfile" "$name-mig" >/dev/null 2>"$tmp/err5"
st=$?
ok $([ $st = 69 ] && ! grep -q wrong-one "$tmp/err5" && grep -q OLD "$tmp/err5" && echo 0 || echo 1) \
    "migrate with a wrong password in OLD: exit 69, not shown (exit $st: $(head -n1 "$tmp/err5"))"
#    ZooKeeper as NEW cannot raise its tokens above Redis's: the floor is
#    refused ('* - failed'), no name is tried, exit 69.
if [ -n "${DLOCK_ZK_URI:-}" ]; then
    "$dlock" migrate "$uri" "$DLOCK_ZK_URI" "$name-mig" >"$tmp/mig" 2>"$tmp/err5"
    st=$?
    ok $([ $st = 69 ] && grep -qx '\* - failed' "$tmp/mig" && ! grep -q "$name-mig" "$tmp/mig" &&
        grep -q "cannot be set" "$tmp/err5" && echo 0 || echo 1) \
        "migrate redis -> zookeeper: refused, exit 69 (got $st: $(head -n1 "$tmp/err5"))"
fi
# 6. No password shows anywhere the CLI writes: the command's environment
#    (password_file= in the URI: the child gets that URI and can reuse it),
#    inspect and leader (password from the URI, from --password-file), the
#    message of a wrong password or an unreachable store, bench --json; the
#    sentinel_password of a Sentinel URI neither.
pwuri="$bare?password_file=$tmp/pw"
clean_env "$dlock" run "$pwuri" "$name-sec" -- sh -c 'env; "$0" run "$DLOCK_URI" "$1-inner" -- true && echo inner-ok' \
    "$dlock" "$name-sec" >"$tmp/env6" 2>"$tmp/err6"
st=$?
ok $([ $st = 0 ] && has_no_password "$tmp/env6" && ! grep -qF -e "$pw" "$tmp/err6" &&
    grep -qxF "DLOCK_URI=$pwuri" "$tmp/env6" && grep -qx inner-ok "$tmp/env6" && echo 0 || echo 1) \
    "password_file= in the URI: the command's DLOCK_URI keeps it (no password) and opens the store (exit $st)"
"$dlock" run "$auth" "$name-sec" -- sh -c '"$0" inspect "$1" "$2"; "$0" inspect --json --password-file "$3" "$4" "$2";
    "$0" inspect --json "$5" "$2"; "$0" leader --password-file "$3" "$4" "$2"' \
    "$dlock" "$auth" "$name-sec" "$tmp/pw" "$bare" "$pwuri" >"$tmp/out6" 2>&1
st=$?
ok $([ $st = 0 ] && ! grep -qF -e "$pw" -e "$pw_enc" "$tmp/out6" && grep -q '"held":true' "$tmp/out6" &&
    echo 0 || echo 1) "inspect and leader (URI, --password-file, password_file=) show no password (exit $st)"
clean_env "$dlock" inspect --password-file "$tmp/pw-wrong" "$bare" "$name-sec" >"$tmp/out6" 2>&1
st=$?
ok $([ $st = 69 ] && ! grep -q wrong-one "$tmp/out6" && echo 0 || echo 1) \
    "inspect with a wrong password from --password-file: exit 69, not shown (exit $st: $(head -n1 "$tmp/out6"))"
port=${bare##*:}; port=${port%%/*}
clean_env "$dlock" run "${auth/":$port/"/:1/}" "$name-sec" -- true >"$tmp/out6" 2>&1
st=$?
clean_env "$dlock" run "${pwuri/":$port/"/:1/}" "$name-sec" -- true >>"$tmp/out6" 2>&1
st2=$?
ok $([ $st = 69 ] && [ $st2 = 69 ] && ! grep -qF -e "$pw" -e "$pw_enc" "$tmp/out6" && echo 0 || echo 1) \
    "an unreachable store, password in the URI or in password_file=: exit 69, not shown ($st, $st2)"
"$dlock" bench --json --scale 2 --iterations 5 "$auth" >"$tmp/out6" 2>&1
st=$?
"$dlock" bench --json --scale 2 --iterations 5 "${auth/"$pw_enc"/wrong-one}" >>"$tmp/out6" 2>&1
ok $([ $st = 0 ] && ! grep -qF -e "$pw" -e "$pw_enc" -e wrong-one "$tmp/out6" && grep -qF ':***@' "$tmp/out6" &&
    echo 0 || echo 1) "bench --json and its error show no password (exit $st)"
if [ -n "${DLOCK_REDIS_SENTINEL_URI:-}" ]; then
    sent=$DLOCK_REDIS_SENTINEL_URI spw=${DLOCK_REDIS_SENTINEL_URI##*sentinel_password=}
    spw=${spw%%&*}
    clean_env "$dlock" run "$sent" "$name-sent" -- env >"$tmp/env7" 2>"$tmp/err7"
    st=$?
    "$dlock" bench --json --scale 2 --iterations 5 "$sent" >>"$tmp/err7" 2>&1
    ok $([ $st = 0 ] && ! grep -qF -e "$spw" -e "$pw" "$tmp/env7" "$tmp/err7" &&
        grep -q '^DLOCK_URI=redis+sentinel://' "$tmp/env7" && ! grep -q '^DLOCK_URI=.*sentinel_password' "$tmp/env7" &&
        echo 0 || echo 1) "Sentinel: no sentinel_password in the command's DLOCK_URI nor in bench --json (exit $st)"
else
    echo "ok $((n += 1)) # SKIP DLOCK_REDIS_SENTINEL_URI is not set"
fi
echo "1..$n"
[ $failed = 0 ]
