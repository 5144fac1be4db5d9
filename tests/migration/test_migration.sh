#!/bin/bash
# A rolling migration of one lock from store OLD to store NEW, end to end
# through `dlock run` (issue 11 item 5).
#
# WORKERS worker processes loop `dlock run -w 10 URI NAME -- sh -c CS` on
# one lock name. The critical section CS, under the lock, reads a shared
# counter, sets an "inside" marker (noclobber: finding it already there is
# an overlap), appends $DLOCK_TOKEN to a tokens log, sleeps 20 ms, writes
# counter + 1 and removes the marker. Before each run a worker reads the
# URI to use (and the phase number) from its own phase file, and the test
# moves the workers through the five phases of a rolling migration:
#
#   1. all on OLD                 2. half on OLD, half on "OLD NEW"
#   3. all on "OLD NEW"           4. half on "OLD NEW", half on NEW
#   5. all on NEW
#
# A phase ends only once every worker has run a critical section in it (the
# mark is written under the lock), so no run of
# an earlier phase is still going (no OLD-only run survives into phase 4),
# as a rolling deployment finishes one step before the next.
#
# As the runbook says (docs/migration.md), `dlock migrate OLD NEW` runs
# before phase 2 and again in phase 3. A second name is taken on OLD alone
# in phase 1 only, and on NEW alone after phase 5: NEW's token for it must
# be above OLD's (NEW's store-wide floor, since the name was never taken on
# the list). Each store is used in a namespace of the test's own (table,
# key prefix, ZooKeeper node, directory), so no other suite sees its floor.
#
# Asserted: every dlock run succeeded; the counter equals the number of
# critical sections (lines of the tokens log); no overlap was seen; the
# tokens strictly increase in grant order (the log's order) across all
# phases; every phase had at least one critical section, and in phases 2
# and 4 both kinds of worker ran critical sections. Per-phase counts
# and times are printed as TAP comments.
#
# TAP output. $1 = dlock binary; $2 = OLD, $3 = NEW: each the name of the
# variable holding the store's URI (DLOCK_REDIS_URI...; a missing one
# fails), or an absolute directory for a file:// store.
set -u
dlock=$1
old_arg=$2
new_arg=$3
WORKERS=${DLOCK_MIGRATION_WORKERS:-4}
PHASE_MS=${DLOCK_MIGRATION_PHASE_MS:-1500}
# Test-only: make the migration wrong on purpose (the negative controls in
# meson.build): "skip-dual" puts half the workers on OLD alone and half on
# NEW alone in phases 2 to 4 (no "OLD NEW" list), which the overlap check
# must catch; "no-list" has every "OLD NEW" worker take OLD and NEW one
# after the other, run by run, without the list and without `dlock
# migrate`, which the overlap or token-order check must catch.
BREAK=${DLOCK_MIGRATION_BREAK:-}

tmp=$(mktemp -d /tmp/dlock-migration.XXXXXX)
name="job-$$-$RANDOM$RANDOM"
workers=()
file_dirs=()
cleanup() {
    local p i
    [ -d "$tmp" ] && : > "$tmp/stop"
    for p in "${workers[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    for ((i = 0; i < WORKERS; i++)); do
        p=$(cat "$tmp/cur.$i" 2>/dev/null)
        # timeout(1) runs in a process group of its own, with dlock in it.
        [ -n "$p" ] && kill -KILL -- "-$p" 2>/dev/null
    done
    for p in "${file_dirs[@]}"; do
        rm -f "$p/$name.lock"
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

# ns_uri URI NS: URI in namespace NS (as tests/util.h uri_namespace()).
ns_uri() {
    local u=$1 ns=$2 base q key=table
    case $u in
    file:* | zookeeper:* | etcd:*)
        base=${u%%\?*}
        q=${u#"$base"}
        echo "${base%/}/$ns$q"
        ;;
    *)
        [[ $u == redis:* ]] && key=prefix ns="$ns:"
        # ZooKeeper's and etcd's tokens cannot be raised: a MariaDB store
        # listed or migrated with them runs token=table (docs/mysql.md).
        [[ $u == mysql:* && ( "$old_arg $new_arg" == *ZK* || "$old_arg $new_arg" == *ETCD* ) ]] && ns="$ns&token=table"
        if [[ $u == *\?* ]]; then echo "$u&$key=$ns"; else echo "$u?$key=$ns"; fi
        ;;
    esac
}

# The namespace of this pair: dlock_mig_OLD_NEW (e.g. dlock_mig_redis_postgres).
kind_label() {
    local l
    case $1 in
    /*) echo file ;;
    *) l=${1#DLOCK_} && l=${l%_URI} && echo "${l,,}" ;;
    esac
}
ns="dlock_mig_$(kind_label "$old_arg")_$(kind_label "$new_arg")"

# store_uri ARG: sets $uri and $label.
store_uri() {
    case $1 in
    /*)
        uri="file://$1"
        label="file"
        mkdir -p "$1"
        file_dirs+=("$1")
        ;;
    *)
        uri=${!1:-}
        label=${1#DLOCK_}
        label=${label%_URI}
        label=${label,,}
        if [ -z "$uri" ]; then
            echo "1..0 # $1 is not set"
            echo "Bail out! $1 is not set: start the stores first (scripts/stores/start.sh)"
            exit 1
        fi
        uri=$(ns_uri "$uri" "$ns")
        ;;
    esac
}
store_uri "$old_arg"
OLD=$uri old_label=$label
store_uri "$new_arg"
NEW=$uri new_label=$label
BOTH="$OLD $NEW"
pair="$old_label -> $new_label"

n=0 failed=0
check() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $n - $pair: $2"
    else
        echo "not ok $n - $pair: $2"
        failed=$((failed + 1))
    fi
}
now_ms() { date +%s%3N; }
t_start=$(now_ms)
since() { echo $(($(now_ms) - t_start)); }

echo "# $pair: lock '$name', $WORKERS workers, phases of $PHASE_MS ms"
echo "# OLD = $OLD" | sed 's|//[^/@ ]*@|//|g'
echo "# NEW = ${NEW}" | sed 's|//[^/@ ]*@|//|g'

# The critical section. $1 = the shared dir, $2 = phase, $3 = worker,
# $4 = which stores (OLD, OLD+NEW, NEW).
# shellcheck disable=SC2016
cs='d=$1
if ( set -C; : > "$d/inside" ) 2>/dev/null; then :; else
    echo "$DLOCK_TOKEN phase $2 worker $3" >> "$d/overlaps"
fi
echo "$2" > "$d/ack.$3.new" && mv -f "$d/ack.$3.new" "$d/ack.$3"
c=$(cat "$d/counter")
printf "%s %s %s %s %s\n" "$DLOCK_TOKEN" "$2" "$3" "$4" "$DLOCK_URI" >> "$d/tokens"
sleep 0.02
echo $((c + 1)) > "$d/counter"
rm -f "$d/inside"'

echo 0 > "$tmp/counter"
: > "$tmp/tokens"
: > "$tmp/runs"

# set_phase WORKER PHASE: its URI and the label of its stores, atomically
# as the worker reads them.
set_phase() {
    local k
    k=$(kind_of "$1" "$2")
    case $k in
    OLD) u=$OLD ;;
    NEW) u=$NEW ;;
    *) u=$BOTH ;;
    esac
    [ "$BREAK" = no-list ] && [ "$k" = OLD+NEW ] && u=ALTERNATE
    printf '%s\n%s\n%s\n' "$2" "$k" "$u" > "$tmp/phase.$1.new"
    mv -f "$tmp/phase.$1.new" "$tmp/phase.$1"
}

# worker I: runs until the stop file appears (or the test is gone, or 120 s
# passed: nothing outlives a killed test for long). Each dlock run is
# bounded by timeout(1); its exit status goes to the runs log.
worker() {
    local i=$1 p k u rc tp parent=$$ t_end=$(($(now_ms) + 120000)) alt=0
    while [ ! -e "$tmp/stop" ] && kill -0 "$parent" 2>/dev/null && [ "$(now_ms)" -lt $t_end ]; do
        { read -r p && read -r k && read -r u; } < "$tmp/phase.$i" || continue
        if [ "$u" = ALTERNATE ]; then
            alt=$((1 - alt))
            if [ $alt = 1 ]; then u=$OLD; else u=$NEW; fi
        fi
        timeout -k 5 20 "$dlock" run -w 10 "$u" "$name" -- sh -c "$cs" cs "$tmp" "$p" "$i" "$k" \
            </dev/null >/dev/null 2>>"$tmp/err.$i" &
        tp=$!
        echo "$tp" > "$tmp/cur.$i"
        wait "$tp"
        rc=$?
        echo "$rc $p $i $k" >> "$tmp/runs"
    done
}

# The stores of worker I in phase P: the first half of the workers moves
# first.
kind_of() {
    local first=$(($1 < WORKERS / 2))
    if [ "$BREAK" = skip-dual ] && [ "$2" -ge 2 ] && [ "$2" -le 4 ]; then
        if [ $first = 1 ]; then echo NEW; else echo OLD; fi
        return
    fi
    case $2 in
    1) echo OLD ;;
    2) if [ $first = 1 ]; then echo OLD+NEW; else echo OLD; fi ;;
    3) echo OLD+NEW ;;
    4) if [ $first = 1 ]; then echo NEW; else echo OLD+NEW; fi ;;
    5) echo NEW ;;
    esac
}

for ((i = 0; i < WORKERS; i++)); do
    set_phase "$i" 1
done
for ((i = 0; i < WORKERS; i++)); do
    worker "$i" &
    workers+=($!)
done

# all_acked P: every worker has run a critical section (under the lock) in
# phase P or later: the critical section writes the mark.
all_acked() {
    local i a
    for ((i = 0; i < WORKERS; i++)); do
        a=$(cat "$tmp/ack.$i" 2>/dev/null)
        [ -n "$a" ] && [ "$a" -ge "$1" ] || return 1
    done
}

# migrate WHEN: dlock migrate OLD NEW, as the runbook says; checked.
migrate() {
    local out rc
    [ "$BREAK" = no-list ] && return
    out=$(timeout -k 5 60 "$dlock" migrate "$OLD" "$NEW" 2>"$tmp/migrate.err")
    rc=$?
    check "$([ $rc = 0 ] && [[ $out =~ ^\*\ [0-9]+\ ok$ ]] && echo 0 || echo 1)" \
        "dlock migrate OLD NEW $1: exit $rc, '$out'"
    sed 's/^/#   stderr: /' "$tmp/migrate.err"
}

# side_token URI: the token of a grant of the side name on URI alone.
side="$name-side"
side_token() {
    timeout -k 5 20 "$dlock" run -w 10 "$1" "$side" -- sh -c 'printf %s "$DLOCK_TOKEN"' </dev/null
}

declare -a p_start p_end
phases_ok=0
side_old=0
for p in 1 2 3 4 5; do
    if [ "$p" = 1 ]; then
        for k in 1 2 3; do
            t=$(side_token "$OLD") && [ "$t" -gt "$side_old" ] && side_old=$t
        done
    fi
    [ "$p" = 2 ] && migrate "before phase 2"
    if [ "$p" -gt 1 ]; then
        for ((i = 0; i < WORKERS; i++)); do
            set_phase "$i" "$p"
        done
    fi
    p_start[p]=$(since)
    sleep "$(awk -v ms="$PHASE_MS" 'BEGIN { printf "%.3f", ms / 1000 }')"
    # The phase ends once every worker has moved into it (up to 25 s).
    for ((w = 0; w < 500; w++)); do
        all_acked "$p" && break
        sleep 0.05
    done
    if ! all_acked "$p"; then
        echo "# phase $p: not every worker started a run in it within 25 s"
        phases_ok=1
    fi
    [ "$p" = 3 ] && migrate "in phase 3"
    p_end[p]=$(since)
done
check $phases_ok "every worker moved through all five phases, one after the other"

# Stop: workers finish their current run (bounded by timeout(1)).
: > "$tmp/stop"
t_stop=$(since)
for ((w = 0; w < 600; w++)); do
    alive=0
    for pid in "${workers[@]}"; do
        kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ $alive = 0 ] && break
    sleep 0.05
done
check "$alive" "the workers stopped within 30 s ($(($(since) - t_stop)) ms)"
for pid in "${workers[@]}"; do
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
done
workers=()

# A name taken on OLD alone before the overlap, never during it.
side_new=$(side_token "$NEW")
check "$([ "$side_old" -gt 0 ] && [ "${side_new:-0}" -gt "$side_old" ] && echo 0 || echo 1)" \
    "a name used on OLD alone, taken on NEW after the migration: token above OLD's ($side_new > $side_old)"

# Per-phase figures.
sections=$(wc -l < "$tmp/tokens")
runs=$(wc -l < "$tmp/runs")
echo "# $runs dlock runs, $sections critical sections in $(since) ms"
for p in 1 2 3 4 5; do
    cnt=$(awk -v p="$p" '$2 == p' "$tmp/tokens" | wc -l)
    eval "count_$p=$cnt"
    dur=$((p_end[p] - p_start[p]))
    detail=$(awk -v p="$p" '$2 == p { c[$4]++ }
        END { printf "OLD %d, OLD+NEW %d, NEW %d", c["OLD"], c["OLD+NEW"], c["NEW"] }' "$tmp/tokens")
    first=$(awk -v p="$p" '$2 == p { print $1; exit }' "$tmp/tokens")
    last=$(awk -v p="$p" '$2 == p { t = $1 } END { print t }' "$tmp/tokens")
    echo "# phase $p: $cnt sections ($detail) from ${p_start[p]} to ${p_end[p]} ms ($dur ms); tokens ${first:-none}..${last:-none}"
done

# 1. Every dlock run succeeded.
bad_runs=$(awk '$1 != 0' "$tmp/runs" | wc -l)
check "$([ "$bad_runs" = 0 ] && [ "$runs" -gt 0 ] && echo 0 || echo 1)" \
    "every dlock run succeeded ($runs runs, $bad_runs failed)"
if [ "$bad_runs" != 0 ]; then
    awk '$1 != 0' "$tmp/runs" | head -n 10 | sed 's/^/#   exit status, phase, worker, stores: /'
    cat "$tmp"/err.* 2>/dev/null | sort | uniq -c | head -n 10 | sed 's/^/#   stderr: /'
fi

# 2. The counter equals the number of critical sections.
counter=$(cat "$tmp/counter")
check "$([ "$counter" = "$sections" ] && [ "$sections" -gt 0 ] && echo 0 || echo 1)" \
    "the counter ($counter) equals the number of critical sections ($sections)"

# 3. No overlap.
overlaps=0
[ -e "$tmp/overlaps" ] && overlaps=$(wc -l < "$tmp/overlaps")
check "$([ "$overlaps" = 0 ] && echo 0 || echo 1)" "no two critical sections overlapped ($overlaps overlaps)"
[ "$overlaps" != 0 ] && head -n 10 "$tmp/overlaps" | sed 's/^/#   overlap: token /'

# 4. Tokens strictly increase in grant order, across all phases.
prev=-1 line=0 bad_tokens=0 prev_line=
while read -r tok rest; do
    line=$((line + 1))
    if ! [[ $tok =~ ^[0-9]{1,19}$ ]] || ((tok <= prev)); then
        bad_tokens=$((bad_tokens + 1))
        if [ $bad_tokens -le 5 ]; then
            echo "#   line $((line - 1)): $prev_line" | sed 's|//[^/@ ]*@|//|g'
            echo "#   line $line: $tok $rest  <- not above the previous token" | sed 's|//[^/@ ]*@|//|g'
        fi
    fi
    [[ $tok =~ ^[0-9]{1,19}$ ]] && prev=$tok
    prev_line="$tok $rest"
done < "$tmp/tokens"
check "$([ $bad_tokens = 0 ] && echo 0 || echo 1)" \
    "DLOCK_TOKEN strictly increases in grant order across all phases ($bad_tokens out of order)"

# 5. Every phase had a critical section.
for p in 1 2 3 4 5; do
    eval "cnt=\$count_$p"
    check "$([ "$cnt" -gt 0 ] && echo 0 || echo 1)" "phase $p had critical sections ($cnt)"
done

# 6. In the mixed phases both kinds of worker ran critical sections: the
# two kinds really shared the lock (2: OLD and "OLD NEW"; 4: "OLD NEW" and
# NEW).
for pk in "2 OLD" "2 OLD+NEW" "4 OLD+NEW" "4 NEW"; do
    set -- $pk
    cnt=$(awk -v p="$1" -v k="$2" '$2 == p && $4 == k' "$tmp/tokens" | wc -l)
    check "$([ "$cnt" -gt 0 ] && echo 0 || echo 1)" "phase $1: workers on $2 ran critical sections ($cnt)"
done

echo "1..$n"
[ $failed = 0 ]
