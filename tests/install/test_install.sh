#!/bin/bash
# Installs into a scratch DESTDIR and builds a program against the installed
# headers through dlock.pc, statically and dynamically: what a user of the
# package does. TAP output. $1 = build root.
set -u
build=$1
dest=$(mktemp -d /tmp/dlock-install.XXXXXX)
trap 'rm -rf "$dest"' EXIT
n=0 failed=0
check() { # description, command...
    local d=$1; shift
    n=$((n + 1))
    if "$@" >"$dest/out.log" 2>&1; then echo "ok $n - $d"; else
        echo "not ok $n - $d"; failed=$((failed + 1)); sed 's/^/#   /' "$dest/out.log"; fi
}
check "meson install into DESTDIR" meson install -C "$build" --destdir "$dest" --no-rebuild --quiet
pc=$(find "$dest" -name dlock.pc | head -n1)
check "dlock.pc installed" test -n "$pc"
export PKG_CONFIG_PATH=$(dirname "$pc")
# Point the installed prefix into DESTDIR, as a relocated install would.
prefix=$(pkg-config --variable=prefix dlock)
pc() { pkg-config --define-variable=prefix="$dest$prefix" "$@" dlock; }
check "pkg-config knows dlock" pc --exists
cat >"$dest/use.c" <<'C'
#include <dlock.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    if (argc != 2 || dlock_client_open(argv[1], &c) != 0) {
        fprintf(stderr, "open: %s\n", dlock_errmsg(c));
        return 1;
    }
    if (dlock_acquire(c, "installed", NULL, &l) != 0 || dlock_lock_token(l) == 0)
        return 2;
    dlock_release(l);
    dlock_client_close(c);
    return strcmp(dlock_version(), DLOCK_VERSION_STRING) != 0;
}
C
flags=$(pc --cflags --libs)
libdir=$(pc --variable=libdir)
check "a program builds with pkg-config flags" cc -std=c11 -Wall -Werror -o "$dest/use" "$dest/use.c" $flags
check "and runs against the installed shared library" env LD_LIBRARY_PATH="$libdir" "$dest/use" "file://$dest/locks"
# libdlock.a itself, with the libraries it needs (hiredis, libpq...) taken
# as shared ones: Debian ships no static libpq dependencies (-lpgcommon).
private_libs=$(sed -n 's/^Libs.private: //p' "$pc")
deps=$(pc --print-requires-private | awk '{print $1}')
check "libdlock.a links into a program" cc -std=c11 -o "$dest/use-static" "$dest/use.c" \
    $(pc --cflags) "$libdir/libdlock.a" ${deps:+$(pkg-config --libs $deps)} $private_libs
check "and runs" "$dest/use-static" "file://$dest/locks"
check "dlock(1) man page installed" test -n "$(find "$dest" -name dlock.1)"
check "dlock CLI installed and runs" "$(find "$dest" -name dlock -type f -perm -u+x | head -n1)" --version
echo "1..$n"
[ "$failed" -eq 0 ]
