#!/bin/bash
# etcd over TLS, as etcd users set it up: a CA of the test's own, a server
# certificate for 127.0.0.1 and a client certificate that etcd requires
# (--client-cert-auth). The test makes them with openssl and starts its
# own etcd member on loopback (the shared test stores speak plain HTTP),
# then checks through `dlock run` and `dlock inspect` that:
#   - cacert=, cert= and key= take and release a lock, and inspect works;
#   - without a client certificate, with another CA, or over plain HTTP,
#     the open fails at once with a message saying why;
#   - a missing certificate file is named in the error.
#
# TAP output. $1 = dlock binary. Port: DLOCK_ETCD_TLS_PORT (2399; peer +1).
set -u
dlock=$(realpath "$1")
port=${DLOCK_ETCD_TLS_PORT:-2399}
tmp=$(mktemp -d /tmp/dlock-etcd-tls.XXXXXX)
etcd_pid=
cleanup() {
    if [ -n "$etcd_pid" ]; then
        kill -KILL "$etcd_pid" 2>/dev/null
        wait "$etcd_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
n=0 failed=0
ok() {
    n=$((n + 1))
    if [ "$1" = 0 ]; then
        echo "ok $n - $2"
    else
        echo "not ok $n - $2"
        failed=$((failed + 1))
        sed 's/^/#   /' "$tmp/err" 2>/dev/null
    fi
}
for p in openssl etcd; do
    if ! command -v $p >/dev/null; then
        echo "Bail out! $p is not installed (scripts/install-deps.sh installs it)"
        exit 1
    fi
done

# The certificates: a CA, the server's (IP 127.0.0.1), a client's, and a
# second CA that signed nothing here.
cd "$tmp" || exit 1
cert() { # NAME CN EXT: a key and a certificate signed by ca
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null &&
        printf '%s\n' "$3" >"$1.ext" &&
        openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" \
            -days 2 -extfile "$1.ext" 2>/dev/null
}
if ! openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
    -subj "/CN=dlock test CA" 2>/dev/null ||
    ! openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem -days 2 \
        -subj "/CN=another CA" 2>/dev/null ||
    ! cert server 127.0.0.1 "subjectAltName=IP:127.0.0.1" ||
    ! cert client dlock "extendedKeyUsage=clientAuth"; then
    echo "Bail out! openssl could not make the test certificates"
    exit 1
fi

etcd --name tls --data-dir "$tmp/data" \
    --listen-client-urls "https://127.0.0.1:$port" --advertise-client-urls "https://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "tls=http://127.0.0.1:$((port + 1))" \
    --cert-file server.pem --key-file server.key --client-cert-auth --trusted-ca-file ca.pem \
    >"$tmp/etcd.log" 2>&1 &
etcd_pid=$!
tls="cacert=$tmp/ca.pem&cert=$tmp/client.pem&key=$tmp/client.key"
uri="etcd://127.0.0.1:$port/dlock-tls?$tls&connect_timeout=1000"
up=1
for ((i = 0; i < 100; i++)); do
    if "$dlock" run -n "$uri" tls-probe -- true 2>"$tmp/err"; then
        up=0
        break
    fi
    kill -0 "$etcd_pid" 2>/dev/null || break
    sleep 0.1
done
if [ $up != 0 ]; then
    echo "Bail out! the TLS etcd on 127.0.0.1:$port did not come up: $(cat "$tmp/err") $(tail -n 2 "$tmp/etcd.log")"
    exit 1
fi

"$dlock" run -n "$uri" tls-job -- sh -c 'echo ran > "$1"' sh "$tmp/ran" 2>"$tmp/err" &&
    [ "$(cat "$tmp/ran")" = ran ]
ok $? "cacert, cert and key: a lock is taken, the command runs, the lock is released"
"$dlock" run -n "$uri" tls-held -- sh -c "sleep 0.3" 2>"$tmp/err" &
holder=$!
sleep 0.15
"$dlock" inspect "$uri" tls-held >"$tmp/out" 2>"$tmp/err"
grep -q "held by" "$tmp/out"
ok $? "inspect over TLS: $(cat "$tmp/out")"
wait $holder

# fails URI NAME PATTERN DESCRIPTION: dlock run fails fast with PATTERN.
fails() {
    local t0 t1
    t0=$(date +%s%3N)
    "$dlock" run -n "$1" tls-denied -- true 2>"$tmp/err"
    local rc=$?
    t1=$(date +%s%3N)
    [ $rc != 0 ] && grep -Eqi "$2" "$tmp/err" && [ $((t1 - t0)) -lt 3000 ]
    ok $? "$3 → exit $rc in $((t1 - t0)) ms: $(head -c 300 "$tmp/err")"
}
fails "etcd://127.0.0.1:$port/dlock-tls?cacert=$tmp/ca.pem&connect_timeout=1000" \
    "cannot connect.*(certificate|alert|handshake)" "no client certificate (the server requires one)"
fails "etcd://127.0.0.1:$port/dlock-tls?cacert=$tmp/other.pem&cert=$tmp/client.pem&key=$tmp/client.key&connect_timeout=1000" \
    "certificate" "a CA that did not sign the server's certificate"
fails "etcd://127.0.0.1:$port/dlock-tls?connect_timeout=1000" \
    "cannot connect.*http://127.0.0.1:$port" "plain HTTP to a TLS port"
fails "etcd://127.0.0.1:$port/dlock-tls?cacert=$tmp/missing.pem&connect_timeout=1000" \
    "missing.pem|CA cert|certificate" "a CA file that does not exist"
fails "etcd://127.0.0.1:$port/dlock-tls?cacert=$tmp/ca.pem&cert=$tmp/client.pem&connect_timeout=1000" \
    "cert= and key= go together" "a client certificate without its key"

echo "1..$n"
[ $failed = 0 ]
