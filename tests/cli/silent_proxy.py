#!/usr/bin/env python3
"""A loopback proxy that can make a store's network go silent.

silent_proxy.py URI: listens on a port of its own for every 127.0.0.1:PORT
(or localhost:PORT) of URI, forwards to it, and prints URI with those
addresses replaced by its own, then a newline. On SIGUSR1 the network goes
silent: nothing more is forwarded either way and new connections are
accepted but never answered, while every socket stays open (as when a
network drops everything), so that only the client's own bounds end its
calls. Runs until SIGTERM or SIGKILL.
"""
import re
import selectors
import signal
import socket
import sys

silent = False


def go_silent(signum, frame):
    global silent
    silent = True


def main():
    uri = sys.argv[1]
    sel = selectors.DefaultSelector()
    listeners = {}

    def listen(match):
        up = (match.group(1), int(match.group(2)))
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", 0))
        ls.listen(64)
        ls.setblocking(False)
        listeners[ls] = up
        sel.register(ls, selectors.EVENT_READ, ("listen", ls))
        return "127.0.0.1:%d" % ls.getsockname()[1]

    shown = re.sub(r"(127\.0\.0\.1|localhost):(\d+)", listen, uri)
    if not listeners:
        sys.exit("silent_proxy.py: no 127.0.0.1:PORT in the URI")
    signal.signal(signal.SIGUSR1, go_silent)
    print(shown, flush=True)
    held = []  # sockets kept open, unanswered, once silent
    while True:
        for key, _ in sel.select(timeout=0.05):
            kind, s = key.data[0], key.data[1]
            if kind == "listen":
                try:
                    c, _ = s.accept()
                except OSError:
                    continue
                if silent:
                    held.append(c)
                    continue
                try:
                    u = socket.create_connection(listeners[s], timeout=2)
                except OSError:
                    c.close()
                    continue
                c.setblocking(False)
                u.setblocking(False)
                sel.register(c, selectors.EVENT_READ, ("pipe", c, u))
                sel.register(u, selectors.EVENT_READ, ("pipe", u, c))
                continue
            peer = key.data[2]
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if silent:
                # Dropped: nothing is forwarded, the socket stays open (one
                # the client closed is no longer watched).
                if not data:
                    sel.unregister(s)
                    held.append(s)
                continue
            if not data:
                for x in (s, peer):
                    try:
                        sel.unregister(x)
                    except (KeyError, ValueError):
                        pass
                    x.close()
                continue
            try:
                peer.setblocking(True)
                peer.sendall(data)
                peer.setblocking(False)
            except OSError:
                pass


if __name__ == "__main__":
    main()
