#!/usr/bin/python3
"""One client of a Python peer lock library, driven by bench/peers/run.py.

    worker.py KIND URI

KIND: redis-py, tooz, kazoo, etcd3 (peer libraries); select1, etcd-put,
etcd-range, zk-create, redis-ping (a store's round trip: "solo" only). The
Redis floor (SET NX PX + PUBLISH) is worker.js's "bare".

Reads JSON lines on stdin, answers JSON lines on stdout (see run.py):
  {"op":"solo","name":N,"n":K}  K try-acquire+release (or K round trips)
                                after K/10 (at least 5) unmeasured -> {"ns":[...]}
  {"op":"hold","name":N}        blocking acquire -> {"t1":ns}
  {"op":"wait","name":N}        {"about":1}, then a blocking acquire -> {"t1":ns}
  {"op":"release"}              stamps t0, releases -> {"t0":ns}
Every answer has "ok"; an error is {"ok":false,"error":"..."}. Times are
CLOCK_MONOTONIC nanoseconds (time.monotonic_ns), the clock of dlock bench
and of Node's process.hrtime.
"""
import json
import os
import sys
import time
import urllib.parse
import uuid

TTL = 30


def parts(uri):
    u = urllib.parse.urlsplit(uri)
    return u, [h for h in u.netloc.rsplit("@", 1)[-1].split(",")]


def hostport(h, default):
    host, _, port = h.rpartition(":")
    return (host, int(port)) if host else (h, default)


class Peer:
    """try_acquire(name) -> bool; acquire(name) blocks; release()."""

    def __init__(self, kind, uri):
        self.kind, self.uri = kind, uri
        self.u, self.hosts = parts(uri)
        self.lock = None
        getattr(self, "open_" + kind.replace("-", "_"))()

    # --- peer libraries -------------------------------------------------
    def open_redis_py(self):
        import redis
        self.r = redis.Redis.from_url(self.uri)
        self.r.ping()

    def lock_redis_py(self, name):
        return self.r.lock("peers:" + name, timeout=TTL)

    def open_tooz(self):
        from tooz import coordination
        scheme = self.u.scheme
        url = self.uri
        if scheme == "etcd":
            h, p = hostport(self.hosts[0], 2379)
            url = "etcd3://%s:%d" % (h, p)
        elif scheme == "zookeeper":
            url = "zookeeper://" + ",".join(self.hosts)
        elif scheme == "redis":
            h, p = hostport(self.hosts[0], 6379)
            url = "redis://%s:%d" % (h, p)
        self.coord = coordination.get_coordinator(url, uuid.uuid4().hex.encode())
        self.coord.start(start_heart=True)

    def lock_tooz(self, name):
        return self.coord.get_lock(("peers-" + name).encode())

    def open_kazoo(self):
        from kazoo.client import KazooClient
        self.zk = KazooClient(hosts=",".join(self.hosts))
        self.zk.start(timeout=10)

    def lock_kazoo(self, name):
        return self.zk.Lock("/dlock-peers/" + name, uuid.uuid4().hex)

    def open_etcd3(self):
        import etcd3
        h, p = hostport(self.hosts[0], 2379)
        user = urllib.parse.unquote(self.u.username) if self.u.username else None
        pw = urllib.parse.unquote(self.u.password) if self.u.password else None
        self.etcd = etcd3.client(host=h, port=p, user=user, password=pw, timeout=10)
        if user:
            # grpc sends call credentials only over TLS; python-etcd3 also
            # sets the token as metadata, which is what goes in the clear.
            self.etcd.call_credentials = None
            self.etcd.watcher._credentials = None

    def lock_etcd3(self, name):
        return self.etcd.lock("peers-" + name, ttl=TTL)

    def try_acquire(self, name):
        self.lock = getattr(self, "lock_" + self.kind.replace("-", "_"))(name)
        if self.kind == "etcd3":
            return self.lock.acquire(timeout=0)
        return self.lock.acquire(blocking=False)

    def acquire(self, name):
        self.lock = getattr(self, "lock_" + self.kind.replace("-", "_"))(name)
        if self.kind == "etcd3":
            # The recipe's own wait (a watch on the key, then a try again),
            # written out: its acquire(timeout) cannot wait with Debian's
            # tenacity (a changed wait-callback signature).
            from etcd3 import exceptions
            end = time.monotonic() + 20
            ok = self.lock.acquire(timeout=0)
            while not ok and time.monotonic() < end:
                try:
                    self.etcd.watch_once(self.lock.key, timeout=1.0)
                except exceptions.WatchTimedOut:
                    pass
                ok = self.lock.acquire(timeout=0)
        elif self.kind == "redis-py":
            ok = self.lock.acquire(blocking=True, blocking_timeout=20)
        elif self.kind == "kazoo":
            ok = self.lock.acquire(blocking=True, timeout=20)
        else:
            ok = self.lock.acquire(blocking=20)
        if not ok:
            raise RuntimeError("not granted within 20 s")

    def release(self):
        self.lock.release()
        self.lock = None

    # --- round trips -----------------------------------------------------
    def open_select1(self):
        if self.u.scheme.startswith("postgres"):
            import psycopg2
            self.db = psycopg2.connect(self.uri)
            self.db.autocommit = True
        else:
            import pymysql
            h, p = hostport(self.hosts[0], 3306)
            self.db = pymysql.connect(host=h, port=p, user=urllib.parse.unquote(self.u.username),
                                      password=urllib.parse.unquote(self.u.password or ""),
                                      database=self.u.path.strip("/"), autocommit=True)
        self.cur = self.db.cursor()

    def open_etcd_put(self):
        self.open_etcd3()

    open_etcd_range = open_etcd_put

    def open_zk_create(self):
        self.open_kazoo()
        self.zk.ensure_path("/dlock-peers")

    def open_redis_ping(self):
        import redis
        self.r = redis.Redis.from_url(self.uri)

    def round_trip(self, name):
        k = self.kind
        if k == "select1":
            self.cur.execute("SELECT 1")
            self.cur.fetchall()
        elif k == "etcd-put":
            self.etcd.put("peers-rt-" + name, "x")
        elif k == "etcd-range":
            self.etcd.get("peers-rt-" + name)
        elif k == "zk-create":
            p = self.zk.create("/dlock-peers/rt-" + name, b"", ephemeral=True)
            self.zk.delete(p)
        else:
            self.r.ping()


def reason(op, e):
    """One line: grpc errors' details rather than their repr."""
    detail = e.details() if callable(getattr(e, "details", None)) else str(e)
    return "%s: %s: %s" % (op, type(e).__name__, " ".join(str(detail).split()))


def main():
    kind, uri = sys.argv[1], sys.argv[2]
    out = sys.stdout

    def say(**kw):
        out.write(json.dumps(dict(ok=True, **kw)) + "\n")
        out.flush()

    try:
        peer = Peer(kind, uri)
    except Exception as e:  # noqa: BLE001 - reported to the driver
        out.write(json.dumps({"ok": False, "error": reason("open", e)}) + "\n")
        out.flush()
        return 1
    rt = kind in ("select1", "etcd-put", "etcd-range", "zk-create", "redis-ping")
    say(ready=1)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "quit":
                break
            if op == "solo":
                ns, name = [], cmd["name"]
                for i in range(max(5, cmd["n"] // 10) + cmd["n"]):
                    t = time.monotonic_ns()
                    if rt:
                        peer.round_trip(name)
                    else:
                        if not peer.try_acquire(name):
                            raise RuntimeError("an uncontended try was refused")
                        peer.release()
                    ns.append(time.monotonic_ns() - t)
                say(ns=ns[max(5, cmd["n"] // 10):])
            elif op in ("hold", "wait"):
                if op == "wait":
                    say(about=1)
                peer.acquire(cmd["name"])
                say(t1=time.monotonic_ns())
            elif op == "release":
                t0 = time.monotonic_ns()
                peer.release()
                say(t0=t0)
        except Exception as e:  # noqa: BLE001 - reported to the driver
            out.write(json.dumps({"ok": False, "error": reason(op, e)}) + "\n")
            out.flush()
    os._exit(0)  # background threads of the libraries (heartbeats, watches)


if __name__ == "__main__":
    sys.exit(main())
