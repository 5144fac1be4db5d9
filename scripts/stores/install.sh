#!/bin/sh
# Installs the coordination stores dlock's tests run against (Redis,
# PostgreSQL 15, MariaDB, ZooKeeper 3.8 + a headless JRE, etcd 3.4) and the
# client development libraries the backends link with, from Debian 12's
# packages only.
#
# Idempotent. Needs root (or sudo). Daemons are NOT left running: the
# stores are started as plain processes by scripts/stores/start.sh.
#
# ZooKeeper: Debian's `zookeeper` package only adds init scripts/config and
# depends on the full (GUI) default-jre; the jars live in `libzookeeper-java`,
# which is all start.sh needs (with default-jre-headless), so that is what we
# install.
#
# etcd: etcd-server has the daemon, etcd-client etcdctl (start.sh and the
# tests use it); the backend itself links libcurl and json-c, and the store
# check also uses curl against etcd's JSON gateway; openssl makes the TLS
# test's certificates (tests/backends/test_etcd_tls.sh).
set -eu

SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

PKGS="redis-server redis-tools
postgresql-15 postgresql-client-15
mariadb-server mariadb-client
libzookeeper-java default-jre-headless
etcd-server etcd-client curl openssl
libhiredis-dev libssl-dev libpq-dev libmariadb-dev libzookeeper-mt-dev
libcurl4-openssl-dev libjson-c-dev
procps util-linux"

DAEMONS="redis-server postgres mariadbd mysqld mysqld_safe etcd"

# Pids of the daemons Debian's packaged services would run: by name, and by
# their packaged configuration (so other users' servers are never matched;
# the packaged etcd runs with no arguments, reading /etc/default/etcd).
pids_of() {
    for d in $DAEMONS; do pgrep -x "$d" 2>/dev/null || true; done | sort -n |
        while read -r pid; do
            tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
                grep -Eq ':6379|/etc/postgresql/|/var/run/postgresql|/run/mysqld|/var/lib/mysql|mysqld_safe|^/usr/bin/etcd $' &&
                echo "$pid" || true
        done
}

missing=
for p in $PKGS; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' \
        || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "stores/install: all packages already installed" >&2
    exit 0
fi
echo "stores/install: installing:$missing" >&2

before=$(pids_of)

# Keep maintainer scripts from starting daemons (Debian's standard mechanism;
# many images already ship one). Only add ours if none exists, and remove it.
own_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
fi
cleanup() { [ -z "$own_policy" ] || $SUDO rm -f /usr/sbin/policy-rc.d; }
trap cleanup EXIT INT TERM

$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null

# Stop daemons the install started (only new pids, never pre-existing ones).
after=$(pids_of)
new=$(printf '%s\n' "$after" | grep -vxF -e "$before" -e '' || true)
[ -n "$before" ] || new=$after
if [ -n "$new" ]; then
    echo "stores/install: stopping daemons started by the install:" $new >&2
    # shellcheck disable=SC2086
    $SUDO kill $new 2>/dev/null || true
    sleep 2
    # shellcheck disable=SC2086
    $SUDO kill -9 $new 2>/dev/null || true
fi
echo "stores/install: done" >&2
