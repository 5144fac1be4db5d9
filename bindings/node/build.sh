#!/bin/sh
# Builds the Node.js package against a meson build of libdlock:
#   bindings/node/build.sh BUILD_DIR
# npm ci installs the locked node-addon-api and node-gyp and runs the
# package's install step (scripts/install.js: node-gyp with this node's own
# headers, nothing downloaded), with pkg-config pointed at BUILD_DIR's
# uninstalled dlock.pc, so the addon loads BUILD_DIR's libdlock.
set -eu
if [ $# -ne 1 ]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
if [ ! -f "$build/meson-uninstalled/dlock-uninstalled.pc" ]; then
    echo "$0: $build is not a configured meson build of dlock" >&2
    exit 1
fi
cd "$(dirname "$0")"
PKG_CONFIG_PATH="$build/meson-uninstalled${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" \
    npm ci --no-audit --no-fund --loglevel=error
