#!/bin/sh
# Installs what dlock needs to build and test on Debian 12, from Debian's
# packages only. Idempotent; needs root (or sudo).
set -eu
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential meson ninja-build pkg-config python3 libhiredis-dev libssl-dev \
    libcurl4-openssl-dev libjson-c-dev \
    python3-matplotlib python3-prometheus-client \
    clang libclang-rt-14-dev valgrind \
    g++ make python3-pytest python3-venv python3-setuptools \
    golang-go \
    >/dev/null
# Node.js with npm and its headers, for the Node.js package: the machine's
# own when it has one, else Debian's.
command -v npm >/dev/null 2>&1 && [ -f /usr/include/node/node_api.h ] ||
    $SUDO apt-get install -y -qq --no-install-recommends nodejs npm libnode-dev >/dev/null
# The peers dlock is tested against (tests/interop) and measured beside
# (bench/peers; python3-etcd3 for the etcd recipe): their real clients,
# Debian's, and npm's for Node.js (tests/interop/node, from its lock file).
$SUDO apt-get install -y -qq --no-install-recommends \
    python3-redis python3-kazoo python3-tooz python3-pymysql python3-psycopg2 python3-etcd3 \
    etcd-client \
    >/dev/null
(cd "$(dirname "$0")/../tests/interop/node" && npm ci --no-audit --no-fund --loglevel=error)
echo "install-deps: build dependencies present"
