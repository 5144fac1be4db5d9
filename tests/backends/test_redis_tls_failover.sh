#!/bin/bash
# rediss+sentinel:// and rediss+cluster:// across a failover (issue 31):
# a lock taken over TLS, the primary that holds its name killed, the lock
# taken again over TLS from the promoted replica with a higher fencing
# token, then the node started again. TAP output.
# $1 = dlock binary, $2 = scripts/stores; DLOCK_REDIS_SENTINEL_TLS_URI,
# DLOCK_REDIS_CLUSTER_TLS_URI and DLOCK_STORES_DIR from scripts/stores/start.sh
# (the TLS set is under $DLOCK_STORES_DIR/tls).
set -u
dlock=$1 stores=$2
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed + 1)); fi; }
bail() { echo "Bail out! $*"; exit 1; }
sentinel=${DLOCK_REDIS_SENTINEL_TLS_URI:-} cluster=${DLOCK_REDIS_CLUSTER_TLS_URI:-}
dir=${DLOCK_STORES_DIR:-}/tls
[ -n "$sentinel" ] && [ -n "$cluster" ] || bail "DLOCK_REDIS_*_TLS_URI are not set: start the stores with scripts/stores/start.sh"
[ -f "$dir/.tls" ] || bail "no TLS store set under $dir"
kill_sh() { bash "$stores/kill.sh" --dir "$dir" "$@"; }

# The token of one grant of $2 on $1, waiting up to $3 s; empty if none.
token() {
    "$dlock" run -w "$3" "$1" "$2" -- sh -c 'echo "$DLOCK_TOKEN"' 2>/dev/null
}

# Takes $2 on $1 again after killing the primary $3 names: up to 30 s of
# tries (each open fails while the failover runs), then compares tokens.
across() { # what uri name inst
    local what=$1 uri=$2 name=$3 inst=$4 t1 t2 deadline=$((SECONDS + 30))
    t1=$(token "$uri" "$name" 5)
    ok $([ -n "$t1" ] && echo 0 || echo 1) "$what: a lock over TLS before the failover (token $t1)"
    kill_sh "$inst" 2>/dev/null
    ok $? "$what: the primary serving it ($inst) killed"
    t2=
    while [ -z "$t2" ] && [ $SECONDS -lt $deadline ]; do
        t2=$(token "$uri" "$name" 2)
        [ -n "$t2" ] || sleep 0.5
    done
    ok $([ -n "$t2" ] && echo 0 || echo 1) \
        "$what: taken again over TLS from the promoted replica within 30 s (token $t2)"
    ok $([ -n "$t2" ] && [ -n "$t1" ] && [ "$t2" -gt "$t1" ] && echo 0 || echo 1) \
        "$what: its token is higher ($t2 > $t1)"
    kill_sh start "$inst" >/dev/null 2>&1
    ok $? "$what: $inst started again (it rejoins as a replica)"
}

name="tls-failover-$$-$RANDOM"
inst=$(kill_sh primary redis-sentinel 2>/dev/null) || bail "kill.sh cannot name the sentinels' primary"
across "sentinel" "$sentinel" "$name" "$inst"
inst=$(kill_sh primary rcluster "$name" 2>/dev/null) || bail "kill.sh cannot name the slot's primary"
across "cluster" "$cluster" "$name" "$inst"
echo "1..$n"
[ "$failed" -eq 0 ]
