#!/bin/bash
# A dlock whose `inspect` fails every time, as on a store that does not
# answer it (a negative control of test_cli_cancel.sh's count of waiters);
# every other command is the real one, $DLOCK_REAL.
if [ "${1:-}" = inspect ]; then
    echo "dlock: inspect: the store did not answer (a negative control)" >&2
    exit 69
fi
exec "$DLOCK_REAL" "$@"
