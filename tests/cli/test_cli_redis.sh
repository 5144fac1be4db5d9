#!/bin/bash
# dlock run on a leased store (Redis): the lease is renewed while the
# command runs, and a lock lost under a paused dlock stops the command.
# TAP output. $1 = dlock binary; DLOCK_REDIS_URI from scripts/stores/start.sh.
set -u
dlock=$1
uri=${DLOCK_REDIS_URI:?DLOCK_REDIS_URI is not set: start the stores first}
tmp=$(mktemp -d /tmp/dlock-cli-redis.XXXXXX)
trap 'kill -CONT $bg 2>/dev/null; kill $bg 2>/dev/null; rm -rf "$tmp"' EXIT
bg=
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed + 1)); fi; }
name="cli-redis-$$-$RANDOM"

# 1. A 300 ms lease outlives 1.5 s of command: dlock renews it.
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
echo "1..$n"
[ $failed = 0 ]
