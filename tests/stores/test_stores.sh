#!/usr/bin/env bash
# TAP test: the coordination stores started by scripts/stores/start.sh answer
# on the URIs it printed, and reject bad credentials.
#
#   eval "$(scripts/stores/start.sh)"
#   bash tests/stores/test_stores.sh
#
# Every check needs its DLOCK_*_URI variable: a missing one is a failure,
# never a skip. Needs redis-cli, psql, mariadb, etcdctl and curl
# (scripts/stores/install.sh).
set -u

n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
    n=$((n + 1)); failed=$((failed + 1))
    echo "not ok $n - $1"
    shift
    local l
    for l in "$@"; do printf '%s\n' "$l" | sed 's/^/#   /'; done
}
# check DESCRIPTION COMMAND...: ok if COMMAND succeeds; its output is shown
# as a diagnostic otherwise.
check() {
    local desc=$1 out; shift
    if out=$("$@" 2>&1); then ok "$desc"; else not_ok "$desc" "$out"; fi
}
need() { # var description -> fails the case if the variable is missing
    if [ -z "${!1:-}" ]; then
        not_ok "$2" "$1 is not set (run: eval \"\$(scripts/stores/start.sh)\")"
        return 1
    fi
}

# "scheme://[user[:pw]@]h1:p1,h2:p2/db" -> "h1:p1 h2:p2"
uri_hosts() {
    local r=${1#*://}
    r=${r%%/*}
    r=${r##*@}
    echo "${r//,/ }"
}

# ---- redis ---------------------------------------------------------------

redis_cmd() { # host:port [password] -- command...
    local hp=$1 pw=$2; shift 2
    if [ -n "$pw" ]; then
        REDISCLI_AUTH=$pw timeout 10 redis-cli -h "${hp%:*}" -p "${hp##*:}" "$@"
    else
        env -u REDISCLI_AUTH timeout 10 redis-cli -h "${hp%:*}" -p "${hp##*:}" "$@"
    fi
}
expect_out() { # expected command... : the command's output must be exactly "expected"
    local want=$1 got; shift
    got=$("$@" 2>&1)
    [ "$got" = "$want" ] || { echo "expected '$want', got '$got'"; return 1; }
}
expect_match() { # regex command... : the command's output must match
    local re=$1 got; shift
    got=$("$@" 2>&1)
    printf '%s\n' "$got" | grep -Eq "$re" || { echo "expected /$re/, got '$got'"; return 1; }
}

if need DLOCK_REDIS_URI "redis PING"; then
    check "redis PING on $(uri_hosts "$DLOCK_REDIS_URI")" \
        expect_out PONG redis_cmd "$(uri_hosts "$DLOCK_REDIS_URI")" "" ping
fi

if need DLOCK_REDLOCK_URI "redlock: 5 instances"; then
    read -r -a hosts <<<"$(uri_hosts "$DLOCK_REDLOCK_URI")"
    if [ "${#hosts[@]}" -eq 5 ]; then ok "redlock: 5 instances in DLOCK_REDLOCK_URI"
    else not_ok "redlock: 5 instances in DLOCK_REDLOCK_URI" "got ${#hosts[@]}: $DLOCK_REDLOCK_URI"; fi
    for hp in "${hosts[@]}"; do
        check "redlock PING on $hp" expect_out PONG redis_cmd "$hp" "" ping
    done
fi

if need DLOCK_REDIS_AUTH_URI "redis auth instance"; then
    a=$(uri_hosts "$DLOCK_REDIS_AUTH_URI")
    pw=${DLOCK_REDIS_AUTH_URI#redis://}
    pw=${pw%%@*}
    pw=${pw#*:}
    check "redis auth instance on $a rejects a client without password" \
        expect_match NOAUTH redis_cmd "$a" "" ping
    check "redis auth instance rejects a wrong password" \
        expect_match 'WRONGPASS|invalid password' redis_cmd "$a" "wrong-$pw" ping
    check "redis auth instance accepts the password" \
        expect_out PONG redis_cmd "$a" "$pw" ping
fi

if need DLOCK_REDIS_CLUSTER_URI "redis cluster"; then
    read -r -a hosts <<<"$(uri_hosts "$DLOCK_REDIS_CLUSTER_URI")"
    pw=${DLOCK_REDIS_CLUSTER_URI#redis+cluster://}
    pw=${pw%%@*}
    pw=${pw#*:}
    check "redis cluster: a seed rejects a client without password" \
        expect_match NOAUTH redis_cmd "${hosts[0]}" "" ping
    for hp in "${hosts[@]}"; do
        check "redis cluster: $hp says cluster_state:ok" \
            expect_match '^cluster_state:ok' redis_cmd "$hp" "$pw" cluster info
    done
    check "redis cluster: 6 nodes, 3 of them primaries" \
        expect_match '^3/6$' sh -c "REDISCLI_AUTH='$pw' timeout 10 redis-cli -h '${hosts[0]%:*}' \
            -p '${hosts[0]##*:}' cluster nodes | awk '\$3 ~ /master/ { p++ } { n++ }
            END { print p \"/\" n }'"
fi

if need DLOCK_REDIS_SENTINEL_URI "redis sentinel"; then
    read -r -a hosts <<<"$(uri_hosts "$DLOCK_REDIS_SENTINEL_URI")"
    pw=${DLOCK_REDIS_SENTINEL_URI#redis+sentinel://}
    pw=${pw%%@*}
    pw=${pw#*:}
    spw=${DLOCK_REDIS_SENTINEL_URI##*sentinel_password=}
    spw=${spw%%&*}
    for hp in "${hosts[@]}"; do
        check "redis sentinel: $hp names the primary of dlock-primary" \
            expect_match '^127\.0\.0\.1$' redis_cmd "$hp" "$spw" sentinel get-master-addr-by-name dlock-primary
    done
    addr=$(redis_cmd "${hosts[0]}" "$spw" sentinel get-master-addr-by-name dlock-primary | tr '\n' ' ')
    read -r ph pp <<<"$addr"
    check "redis sentinel: the primary $ph:$pp has two replicas" \
        expect_match '^connected_slaves:2' redis_cmd "$ph:$pp" "$pw" info replication
fi

# ---- redis-tls: the TLS-only set -----------------------------------------

tls_cli() { # host:port command... (TLS with the set's CA, as the ACL user)
    local hp=$1; shift
    REDISCLI_AUTH=dlock-secret-pw timeout 10 redis-cli --tls --cacert "$DLOCK_TLS_DIR/ca.crt" \
        --cert "$DLOCK_TLS_DIR/client.crt" --key "$DLOCK_TLS_DIR/client.key" \
        --user dlock-app -h "${hp%:*}" -p "${hp##*:}" "$@"
}
if need DLOCK_REDIS_TLS_URI "redis over TLS" && need DLOCK_TLS_DIR "the TLS set's certificates"; then
    hp=$(uri_hosts "${DLOCK_REDIS_TLS_URI%%\?*}")
    check "redis TLS PING as the ACL user on $hp" expect_out PONG tls_cli "$hp" ping
    check "the ACL user may not run FLUSHALL" expect_match NOPERM tls_cli "$hp" flushall
    check "a plain client gets no PONG from the TLS port" \
        bash -c '! timeout 5 redis-cli -h "${1%:*}" -p "${1##*:}" ping 2>/dev/null | grep -q PONG' _ "$hp"
fi
for v in DLOCK_REDLOCK_TLS_URI DLOCK_REDIS_CLUSTER_TLS_URI DLOCK_REDIS_SENTINEL_TLS_URI; do
    if need "$v" "$v"; then
        u=${!v}; u=${u%%\?*}; u=${u%/dlock-primary/0}
        for hp in $(uri_hosts "$u"); do
            check "$v: TLS PING on $hp" expect_match 'PONG|NOAUTH' \
                env REDISCLI_AUTH= timeout 10 redis-cli --tls --cacert "$DLOCK_TLS_DIR/ca.crt" \
                --cert "$DLOCK_TLS_DIR/client.crt" --key "$DLOCK_TLS_DIR/client.key" \
                -h "${hp%:*}" -p "${hp##*:}" ping
        done
    fi
done

# ---- postgres ------------------------------------------------------------

pg() { # uri sql   (ignores ~/.pgpass and PGPASSWORD; never prompts)
    env -u PGPASSWORD PGPASSFILE=/nonexistent/dlock-no-pgpass PGCONNECT_TIMEOUT=10 \
        psql -X -w -q -At -d "$1" -c "$2"
}

if need DLOCK_POSTGRES_URI "postgres SELECT 1 as dlock"; then
    check "postgres SELECT 1 as dlock on $(uri_hosts "$DLOCK_POSTGRES_URI")" \
        expect_out 1 pg "$DLOCK_POSTGRES_URI" 'SELECT 1'
    check "postgres: dlock is a superuser in database dlock" \
        expect_out 't|dlock' pg "$DLOCK_POSTGRES_URI" \
        "SELECT rolsuper, current_database() FROM pg_roles WHERE rolname = current_user"
fi

if need DLOCK_POSTGRES_AUTH_URI "postgres password role"; then
    u=$DLOCK_POSTGRES_AUTH_URI
    check "postgres: dlock_pw with its password can SELECT 1" \
        expect_out 1 pg "$u" 'SELECT 1'
    wrong=$(printf '%s' "$u" | sed 's#^\(postgresql://[^:]*:\)[^@]*@#\1wrong-password@#')
    check "postgres: dlock_pw with a wrong password is refused" \
        expect_match 'password authentication failed' pg "$wrong" 'SELECT 1'
    nopw=$(printf '%s' "$u" | sed 's#^\(postgresql://[^:]*\):[^@]*@#\1@#')
    check "postgres: dlock_pw without a password is refused" \
        expect_match 'password|authentication' pg "$nopw" 'SELECT 1'
fi

# ---- mariadb -------------------------------------------------------------

# mysql://user:pw@host:port/db
my() { # uri password-override|"" sql
    local r=${1#mysql://} user pw hp db
    user=${r%%:*}
    pw=${r#*:}; pw=${pw%%@*}
    hp=${r#*@}; hp=${hp%%/*}
    db=${r##*/}
    [ -z "$2" ] || pw=$2
    timeout 20 mariadb --no-defaults --protocol=TCP -h "${hp%:*}" -P "${hp##*:}" -u "$user" \
        "-p$pw" --connect-timeout=10 -N -B -e "$3" "$db"
}

if need DLOCK_MYSQL_URI "mariadb SELECT 1 as dlock"; then
    check "mariadb SELECT 1 as dlock on $(uri_hosts "$DLOCK_MYSQL_URI")" \
        expect_out 1 my "$DLOCK_MYSQL_URI" "" 'SELECT 1'
    check "mariadb: dlock can create a table and take GET_LOCK in database dlock" \
        expect_out 1 my "$DLOCK_MYSQL_URI" "" \
        "CREATE TABLE IF NOT EXISTS dlock_stores_probe (k INT); DROP TABLE dlock_stores_probe; SELECT GET_LOCK('dlock-stores-probe', 1)"
    check "mariadb: a wrong password is refused" \
        expect_match 'Access denied' my "$DLOCK_MYSQL_URI" wrong-password 'SELECT 1'
fi

# ---- zookeeper -----------------------------------------------------------

zk4lw() { # host:port word
    timeout 10 bash -c '
        exec 3<>"/dev/tcp/$1/$2" || exit 1
        printf %s "$3" >&3
        cat <&3' _ "${1%:*}" "${1##*:}" "$2"
}
zk_mode() { zk4lw "$1" srvr | sed -n 's/^Mode: //p'; }

if need DLOCK_ZK_URI "zookeeper ruok"; then
    z=$(uri_hosts "$DLOCK_ZK_URI")
    check "zookeeper $z: ruok -> imok" expect_out imok zk4lw "$z" ruok
    check "zookeeper $z: srvr Mode: standalone" expect_out standalone zk_mode "$z"
fi

if need DLOCK_ZK_ENSEMBLE_URI "zookeeper ensemble"; then
    read -r -a zs <<<"$(uri_hosts "$DLOCK_ZK_ENSEMBLE_URI")"
    leaders=0 followers=0 modes=
    for z in "${zs[@]}"; do
        check "zookeeper ensemble member $z: ruok -> imok" expect_out imok zk4lw "$z" ruok
        m=$(zk_mode "$z" 2>/dev/null)
        modes="$modes $z=${m:-down}"
        case $m in leader) leaders=$((leaders + 1)) ;; follower) followers=$((followers + 1)) ;; esac
    done
    if [ "${#zs[@]}" -eq 3 ] && [ $leaders -eq 1 ] && [ $followers -eq 2 ]; then
        ok "zookeeper ensemble: one leader, two followers"
    else
        not_ok "zookeeper ensemble: one leader, two followers" "modes:$modes"
    fi
fi

# ---- etcd ----------------------------------------------------------------

# "etcd://[user:pw@]h1:p1,h2:p2/prefix" -> "http://h1:p1,http://h2:p2"
etcd_endpoints() {
    local h out=''
    for h in $(uri_hosts "$1"); do out=${out:+$out,}http://$h; done
    echo "$out"
}
# "etcd://user:pw@..." -> "user:pw" ("" without credentials)
etcd_userinfo() {
    local r=${1#etcd://}
    r=${r%%/*}
    case $r in *@*) echo "${r%@*}" ;; *) echo '' ;; esac
}
ectl() { # endpoints user|"" args...
    local eps=$1 user=$2; shift 2
    timeout 15 env -u ETCDCTL_ENDPOINTS -u ETCDCTL_USER -u ETCDCTL_PASSWORD ETCDCTL_API=3 \
        etcdctl --endpoints="$eps" --dial-timeout=3s --command-timeout=5s ${user:+"--user=$user"} "$@"
}
# POST to the v3 JSON gateway (what the backend talks to); prints the body.
gw() { # host:port path json [token]
    timeout 15 curl -sS --max-time 10 -X POST ${4:+-H "Authorization: $4"} \
        -d "$3" "http://$1$2"
}
b64() { printf %s "$1" | base64 -w0; }

if need DLOCK_ETCD_URI "etcd with auth"; then
    eps=$(etcd_endpoints "$DLOCK_ETCD_URI")
    cred=$(etcd_userinfo "$DLOCK_ETCD_URI")
    hp=$(uri_hosts "$DLOCK_ETCD_URI")
    check "etcd on $hp: endpoint health with the URI's credentials" \
        expect_match 'is healthy' ectl "$eps" "$cred" endpoint health
    check "etcd: ${cred%%:*} can put, get and delete" \
        expect_out "$(printf 'OK\ndlock-stores-test\nv\n1')" sh -c "
            $(declare -f ectl); ectl '$eps' '$cred' put dlock-stores-test v &&
            ectl '$eps' '$cred' get dlock-stores-test && ectl '$eps' '$cred' del dlock-stores-test"
    check "etcd: a request without credentials is refused" \
        expect_match 'user name is empty' ectl "$eps" "" get dlock-stores-test
    check "etcd: a wrong password is refused" \
        expect_match 'authentication failed' ectl "$eps" "${cred%%:*}:wrong-password" get dlock-stores-test
    check "etcd: ${cred%%:*} is no admin (role list needs root)" \
        expect_match 'permission denied' ectl "$eps" "$cred" role list
    # The same through the JSON gateway on the client port.
    check "etcd gateway: a range without a token is refused" \
        expect_match 'user name is empty' gw "$hp" /v3/kv/range "{\"key\":\"$(b64 dlock-stores-test)\"}"
    check "etcd gateway: authenticate with a wrong password is refused" \
        expect_match 'authentication failed' gw "$hp" /v3/auth/authenticate \
        "{\"name\":\"${cred%%:*}\",\"password\":\"wrong-password\"}"
    tok=$(gw "$hp" /v3/auth/authenticate "{\"name\":\"${cred%%:*}\",\"password\":\"${cred#*:}\"}" 2>&1 |
        sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
    if [ -n "$tok" ]; then ok "etcd gateway: authenticate with the URI's password gives a token"
    else not_ok "etcd gateway: authenticate with the URI's password gives a token"; fi
    check "etcd gateway: a range with the token is served" \
        expect_match '"header":\{"cluster_id"' gw "$hp" /v3/kv/range "{\"key\":\"$(b64 dlock-stores-test)\"}" "$tok"
fi

if need DLOCK_ETCD_CLUSTER_URI "etcd cluster"; then
    read -r -a hosts <<<"$(uri_hosts "$DLOCK_ETCD_CLUSTER_URI")"
    eps=$(etcd_endpoints "$DLOCK_ETCD_CLUSTER_URI")
    if [ "${#hosts[@]}" -eq 3 ]; then ok "etcd cluster: 3 members in DLOCK_ETCD_CLUSTER_URI"
    else not_ok "etcd cluster: 3 members in DLOCK_ETCD_CLUSTER_URI" "got ${#hosts[@]}: $DLOCK_ETCD_CLUSTER_URI"; fi
    for hp in "${hosts[@]}"; do
        check "etcd cluster member $hp: endpoint health (no credentials)" \
            expect_match 'is healthy' ectl "http://$hp" "" endpoint health
    done
    check "etcd cluster: member list has 3 started members" \
        expect_out 3 sh -c "$(declare -f ectl); ectl '$eps' '' member list | grep -c ', started, '"
    # endpoint status -w simple: endpoint, id, version, db size, is leader, ...
    check "etcd cluster: exactly one member leads" \
        expect_out '3 1' sh -c "$(declare -f ectl); ectl '$eps' '' endpoint status -w simple |
            awk -F', ' '{ n++ } \$5 == \"true\" { l++ } END { print n + 0, l + 0 }'"
    check "etcd cluster gateway: a range without a token is served" \
        expect_match '"header":\{"cluster_id"' gw "${hosts[0]}" /v3/kv/range "{\"key\":\"$(b64 dlock-stores-test)\"}"
fi

echo "1..$n"
if [ $failed -ne 0 ]; then
    echo "# $failed of $n failed"
    exit 1
fi
