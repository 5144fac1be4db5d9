#!/bin/bash
# dlock run waiting for a lock, on one store: SIGTERM (or SIGINT, SIGHUP,
# SIGQUIT) first takes the waiter out of the store's queue (dlock_cancel),
# then ends dlock as the signal would have: killed by it, the command never
# run. Where the store can count waiters (dlock inspect), none is left at
# once: on ZooKeeper and etcd a killed waiter used to hold its place until
# its session or lease ran out. (On file, Redis, PostgreSQL and MySQL a
# killed waiter leaves the queue anyway: there the case checks how dlock
# ends, and that the command never runs.) Every store but file counts its
# waiters: there a `dlock inspect` that fails on every try, or says
# "waiters unknown", fails the count (with inspect's message); on file,
# which cannot count them, that check is skipped.
#
# TAP output. $1 = dlock binary; $2 = "file", or the name of the variable
# holding the store's URI (DLOCK_REDIS_URI...): a missing one fails.
set -u
dlock=$1
store=$2
tmp=$(mktemp -d /tmp/dlock-cli-cancel.XXXXXX)
holder= waiter=
trap 'kill $holder $waiter 2>/dev/null; rm -rf "$tmp"' EXIT
if [ "$store" = file ]; then
    uri="file://$tmp/locks"
    mkdir "$tmp/locks"
else
    uri=${!store:-}
    if [ -z "$uri" ]; then
        echo "Bail out! $store is not set: start the stores first (scripts/stores/start.sh)"
        exit 1
    fi
fi
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed + 1)); fi; }
name="cli-cancel-$$-$RANDOM"
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# waiting: the inspect line's waiter count; "unknown" when inspect says it
# cannot count them; "failed" when inspect fails (its message kept in
# $tmp/inspect-failed).
waiting() {
    local line
    if ! line=$("$dlock" inspect "$uri" "$name" 2>&1); then
        echo "$line" >"$tmp/inspect-failed"
        echo failed
        return
    fi
    case $line in
    *" waiting"*) line=${line%% waiting*}; echo "${line##* }" ;;
    *) echo "$line" >"$tmp/inspect-unknown"; echo unknown ;;
    esac
}

"$dlock" run "$uri" "$name" -- sh -c "echo > '$tmp/held'; exec sleep 60" &
holder=$!
for _ in $(seq 100); do [ -f "$tmp/held" ] && break; sleep 0.1; done
ok $([ -f "$tmp/held" ] && echo 0 || echo 1) "a holder runs its command"

for sig in TERM INT; do
    # A background job of a script starts with SIGINT ignored, which dlock
    # keeps; a subshell that resets it hands dlock the default instead.
    (trap - INT; exec "$dlock" run -w 60 "$uri" "$name" -- touch "$tmp/ran-$sig") 2>"$tmp/err-$sig" &
    waiter=$!
    before=unknown
    # Every 0.2 s, up to 8 s: MySQL counts waiters from InnoDB's views, a
    # snapshot refreshed only once nobody has read it for 0.1 s.
    for _ in $(seq 40); do
        before=$(waiting)
        [ "$before" = 1 ] && break
        [ "$before" = unknown ] && { sleep 0.5; break; }
        sleep 0.2
    done
    t0=$(now_ms)
    kill -$sig $waiter
    wait $waiter
    st=$?
    took=$(($(now_ms) - t0))
    waiter=
    want=$((128 + $(kill -l $sig)))
    ok $([ $st = $want ] && echo 0 || echo 1) "SIG$sig ends a waiting dlock as the signal does (status $st, want $want; $took ms; waiters before: $before)"
    ok $([ $took -lt 5000 ] && echo 0 || echo 1) "within 5 s ($took ms)"
    ok $([ ! -e "$tmp/ran-$sig" ] && echo 0 || echo 1) "its command never ran"
    # Asked again for up to 1.5 s (MySQL's snapshot again): well before a
    # place abandoned by a killed waiter is freed (ZooKeeper's session, 4 s;
    # etcd's waiters' lease, 3 s).
    for _ in $(seq 8); do
        sleep 0.2
        after=$(waiting)
        [ "$after" = 0 ] && break
    done
    if [ "$store" = file ] && [ "$before" = unknown ] && [ "$after" = unknown ]; then
        echo "ok $((n += 1)) - the store counts no waiter after # SKIP the file store cannot count waiters"
    else
        ok $([ "$before" = 1 ] && [ "$after" = 0 ] && echo 0 || echo 1) \
            "the store counted the waiter (got $before), and none within 1.6 s after (got $after)"
        [ "$before" = failed ] || [ "$after" = failed ] &&
            echo "#   dlock inspect failed: $(tail -n 1 "$tmp/inspect-failed")"
        [ "$before" = unknown ] || [ "$after" = unknown ] &&
            echo "#   dlock inspect cannot count the waiters: $(tail -n 1 "$tmp/inspect-unknown")"
    fi
done

kill $holder
wait $holder
holder=
"$dlock" run -n "$uri" "$name" -- true
ok $? "the lock is free once the holder is stopped"
echo "1..$n"
[ $failed = 0 ]
