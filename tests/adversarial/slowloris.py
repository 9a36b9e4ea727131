"""Slowloris clients, run as a process of their own so that their busy loop shares no
interpreter lock with the probes measuring the server meanwhile:

  python3 slowloris.py HOST PORT N INTERVAL_S DEADLINE_S

opens N connections that send a request head one byte every INTERVAL_S, never finishing it,
prints "ready T" (T: time.monotonic() at the first connect, the same clock in every process)
once all are open, reads their answers until each has one or DEADLINE_S passed, and prints one
JSON line: for each connection [seconds from its connect to its answer or null, the answer's
first 200 bytes]."""

import json
import selectors
import socket
import sys
import time

HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100000


def main(host, port, n, interval_s, deadline_s):
    sel = selectors.DefaultSelector()
    conns = {}
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        # The server's clock starts at its accept, after this.
        conns[s] = {"start": time.monotonic(), "sent": 0, "data": b"", "answered": None}
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    print("ready %r" % min(st["start"] for st in conns.values()), flush=True)
    next_tick = time.monotonic()
    deadline = time.monotonic() + deadline_s
    while any(st["answered"] is None for st in conns.values()) and time.monotonic() < deadline:
        if time.monotonic() >= next_tick:
            for s, st in conns.items():
                if st["answered"] is None:
                    try:
                        s.send(HEAD[st["sent"]:st["sent"] + 1])
                        st["sent"] += 1
                    except OSError:
                        pass
            next_tick += interval_s
        for key, _ in sel.select(max(0, next_tick - time.monotonic())):
            st = conns[key.fileobj]
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data:  # closed: an answer, if any, came before
                sel.unregister(key.fileobj)
                if st["answered"] is None:
                    st["answered"] = time.monotonic()
                continue
            st["data"] += data
            if st["answered"] is None and b"\r\n\r\n" in st["data"]:
                st["answered"] = time.monotonic()
    out = [[None if st["answered"] is None else st["answered"] - st["start"],
            st["data"][:200].decode("latin-1")] for st in conns.values()]
    for s in conns:
        s.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
         float(sys.argv[5]))
