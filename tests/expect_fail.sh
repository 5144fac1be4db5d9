#!/bin/bash
# A negative control: runs a test program made to fail on purpose (a
# store's capability taken away, a store missing under
# DLOCK_STORES_REQUIRED=1...), and passes when the program failed for that
# reason: its exit status is not 0 and a line of its output matches the
# detector's own message, so that a failure of another kind does not count.
# TAP output; the program's output follows as comments.
#   $1 = an extended regular expression (grep -E) one line must match
#   $2... = the program and its arguments
set -u
want=$1
shift
out=$(mktemp /tmp/dlock-expect-fail.XXXXXX)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
st=$?
sed 's/^/# | /' "$out"
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed + 1)); fi; }
ok $([ $st != 0 ] && echo 0 || echo 1) "the run fails (exit $st)"
grep -Eq -- "$want" "$out"
ok $? "for the reason expected: a line matches '$want'"
echo "1..$n"
[ $failed = 0 ]
