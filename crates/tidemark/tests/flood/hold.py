#!/usr/bin/env python3
"""Holds a flood of connections against one listener, for the flood test (tests/flood.rs).

    hold.py HOST:PORT --idle N --trickle M --source IP --seconds S

Idle connections connect and send nothing; trickling ones send a request head one byte a second
and never finish it. Each connection the server closes is opened again at once, as an attacker
would, so the pressure holds. Prints a JSON line with its counts every second and at the end.
A separate process because one process may hold only so many descriptors.
"""

import argparse
import errno
import json
import resource
import selectors
import socket
import sys
import time

HEAD = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Trickle: " + b"a" * 4096


def main():
    p = argparse.ArgumentParser()
    p.add_argument("target")
    p.add_argument("--idle", type=int, default=0)
    p.add_argument("--trickle", type=int, default=0)
    p.add_argument("--source", default="127.0.0.1")
    p.add_argument("--seconds", type=float, default=10)
    a = p.parse_args()
    host, port = a.target.rsplit(":", 1)
    port = int(port)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    sel = selectors.DefaultSelector()
    counts = {"open": 0, "opened": 0, "closed_by_server": 0, "connect_errors": 0}
    # socket -> [kind, bytes of the head sent]
    conns = {}
    have = {"idle": 0, "trickle": 0}

    def open_one(kind):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((a.source, 0))
            err = s.connect_ex((host, port))
        except OSError:
            s.close()
            counts["connect_errors"] += 1
            return False
        if err not in (0, errno.EINPROGRESS):
            s.close()
            counts["connect_errors"] += 1
            return False
        conns[s] = [kind, 0]
        have[kind] += 1
        sel.register(s, selectors.EVENT_READ)
        counts["opened"] += 1
        return True

    def close(s):
        sel.unregister(s)
        have[conns.pop(s)[0]] -= 1
        s.close()

    wanted = [("idle", a.idle), ("trickle", a.trickle)]
    began = time.monotonic()
    last_report = began
    last_trickle = began
    while True:
        now = time.monotonic()
        if now - began >= a.seconds:
            break
        # Top up to the wanted numbers, a bounded batch per round so reads keep up.
        budget = 2000
        for kind, n in wanted:
            for _ in range(min(n - have[kind], budget)):
                if not open_one(kind):
                    break
                budget -= 1
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except (ConnectionError, OSError):
                data = b""
            if not data:
                counts["closed_by_server"] += 1
                close(s)
        if now - last_trickle >= 1.0:
            last_trickle = now
            for s, v in list(conns.items()):
                if v[0] == "trickle" and v[1] < len(HEAD):
                    try:
                        s.send(HEAD[v[1] : v[1] + 1])
                        v[1] += 1
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        counts["closed_by_server"] += 1
                        close(s)
        if now - last_report >= 1.0:
            last_report = now
            counts["open"] = len(conns)
            print(json.dumps(counts), flush=True)
    counts["open"] = len(conns)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    sys.exit(main())
