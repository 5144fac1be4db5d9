# What the TAP scripts of tests/cli that run dlock one call at a time share
# (sourced): $DLOCK is the dlock to run, $dir a scratch directory of the
# script's own; n and failed count the cases.
n=${n:-0}
failed=${failed:-0}

# check STATUS DESC: one TAP line; on failure the last run's output as diagnostics.
check() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $n - $2"
    else
        echo "not ok $n - $2"
        failed=$((failed + 1))
        echo "#   last exit status: ${rc-}"
        sed 's/^/#   stdout: /' "$dir/out" 2>/dev/null
        sed 's/^/#   stderr: /' "$dir/err" 2>/dev/null
    fi
}

# dl ARGS...: runs dlock; leaves $rc, $out and $err.
dl() {
    "$DLOCK" "$@" </dev/null >"$dir/out" 2>"$dir/err"
    rc=$?
    out=$(<"$dir/out")
    err=$(<"$dir/err")
}

now_ms() { date +%s%3N; }

# wait_for FILE: up to 10 s for FILE to appear.
wait_for() {
    local i
    for ((i = 0; i < 200; i++)); do
        [ -e "$1" ] && return 0
        sleep 0.05
    done
    return 1
}

# one_line: dlock's stderr is exactly one "dlock: ..." line.
one_line() {
    [ "$(wc -l <"$dir/err")" -eq 1 ] && [[ $err == "dlock: "* ]]
}
