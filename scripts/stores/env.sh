#!/usr/bin/env bash
# Prints, on stdout, the shell assignments for the stores that are running
# under DIR (same format as start.sh), without starting anything:
#
#   scripts/stores/env.sh [--dir DIR] [names...|all]
#   eval "$(scripts/stores/env.sh)"
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0" >&2; }

parse_args "" "$@"
names=$(expand_names "${ARGS[@]+"${ARGS[@]}"}")
# shellcheck disable=SC2086
emit_env $names
