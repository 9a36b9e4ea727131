#!/usr/bin/python3
"""The HTTP gateway against slow and idle clients, and its request rate, in one run.

Starts a carpool-router (--http) and an echo worker on free 127.0.0.1 ports for each router
binary given (the current one, and optionally an older build to compare with), then measures:

  rate      requests/s through `carpool bench serve` at concurrency 1 and 16, over HTTP and ZeroMQ
  slowloris latency of normal requests (a new connection each, POST /v1/completions and
            GET /metrics) while N connections dribble a request head, one byte every 0.3 s
  idle      router RSS with N idle keep-alive connections open, per connection

    /usr/bin/python3 bench/http_gateway_bench.py --build build [--old-router OLD/carpool-router]
        [--slowloris 1000] [--idle 10000] [--json OUT.json]

Prints a markdown table per scenario. Every process it starts is stopped on exit.
"""
import argparse
import http.client
import json
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "testing"))
from processes import stop, wait_for_log  # noqa: E402


def log(msg):
    print(f"[http-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


class Cluster:
    def __init__(self, router_bin, worker_bin, tmp, name, args):
        self.procs = []
        self.router_log = os.path.join(tmp, f"{name}_router.log")
        with open(self.router_log, "w") as out:
            self.router = subprocess.Popen(
                [router_bin, "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                 "--http", "127.0.0.1:0"] + args, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        self.procs.append(self.router)
        m = wait_for_log(self.router_log, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", 20)
        h = wait_for_log(self.router_log, r"http gateway listening on http://127\.0\.0\.1:(\d+)", 20)
        if m is None or h is None:
            self.close()
            raise RuntimeError("the router did not start: " + open(self.router_log).read()[-2000:])
        self.frontend, self.backend, self.port = m.group(1), m.group(2), int(h.group(1))
        with open(os.path.join(tmp, f"{name}_worker.log"), "w") as out:
            self.procs.append(subprocess.Popen(
                [worker_bin, "--router", self.backend, "--model", "echo", "--threads", "1"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while self.get("/ready")[0] != 200:
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the worker did not register")
            time.sleep(0.05)

    def get(self, path, timeout=5):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        except OSError:
            return 0, b""
        finally:
            c.close()

    def close(self):
        for p in reversed(self.procs):
            stop(p)


COMPLETION = json.dumps({"model": "echo", "prompt": "hello there", "max_tokens": 4,
                         "temperature": 0}).encode()


def timed_request(port, kind, timeout):
    """Seconds for one request on a new connection; None when it failed or timed out."""
    start = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if kind == "completion":
            c.request("POST", "/v1/completions", COMPLETION, {"Content-Type": "application/json"})
        else:
            c.request("GET", "/metrics")
        r = c.getresponse()
        r.read()
        return time.monotonic() - start if r.status == 200 else None
    except OSError:
        return None
    finally:
        c.close()


class Slowloris:
    """N connections that each send a request head one byte every `interval` seconds, and
    reconnect when the server closes them, so N stay open; counts the answers they get."""

    HEAD = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000

    def __init__(self, port, n, interval=0.3):
        self.port, self.n, self.interval = port, n, interval
        self.stop_flag = threading.Event()
        self.answers = {}
        self.reconnects = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self, sel):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        sel.register(s, selectors.EVENT_READ, [0])

    def run(self):
        sel = selectors.DefaultSelector()
        for _ in range(self.n):
            self.open_one(sel)
        next_send = time.monotonic()
        while not self.stop_flag.is_set():
            for key, _ in sel.select(timeout=0.02):
                try:
                    data = key.fileobj.recv(4096)
                except OSError:
                    data = b""
                if data[:12].startswith(b"HTTP/1.1 "):
                    code = data[9:12].decode()
                    self.answers[code] = self.answers.get(code, 0) + 1
                if not data:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    self.reconnects += 1
                    self.open_one(sel)
            if time.monotonic() >= next_send:
                next_send += self.interval
                for key in list(sel.get_map().values()):
                    sent = key.data
                    try:
                        key.fileobj.send(self.HEAD[sent[0]:sent[0] + 1])
                        sent[0] = (sent[0] + 1) % len(self.HEAD)
                    except OSError:
                        pass
        for key in list(sel.get_map().values()):
            key.fileobj.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        self.thread.join()


def bench_serve(cli, cluster, backend, concurrency, prompts):
    out = subprocess.run(
        [cli, "bench", "serve", "--backend", backend, "--router", cluster.frontend,
         "--url", f"http://127.0.0.1:{cluster.port}", "--num-prompts", str(prompts),
         "--input-len", "64", "--output-len", "32", "--max-concurrency", str(concurrency),
         "--seed", "1", "--no-progress", "--json"],
        capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"bench serve failed: {out.stderr[-2000:]}")
    j = json.loads(out.stdout[out.stdout.index("{"):])
    return {"requests_per_s": j["request_throughput"], "completed": j["completed"],
            "failed": j["failed"]}


def scenario_rate(cli, clusters, out):
    rows = []
    for name, cluster in clusters.items():
        for concurrency, prompts in ((1, 1000), (16, 2000)):
            for backend in ("http", "zmq"):
                if backend == "zmq" and name != "new":
                    continue
                r = bench_serve(cli, cluster, backend, concurrency, prompts)
                r.update(router=name, backend=backend, concurrency=concurrency)
                log(f"rate {r}")
                rows.append(r)
    out["rate"] = rows
    print("\n| router | backend | concurrency | requests/s | failed |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['router']} | {r['backend']} | {r['concurrency']} | "
              f"{r['requests_per_s']:.0f} | {r['failed']} |")


def scenario_slowloris(clusters, n, out, requests=200, pace_s=0.025):
    rows = []
    for name, cluster in clusters.items():
        before = rss_kib(cluster.router.pid)
        with Slowloris(cluster.port, n) as slow:
            time.sleep(3)  # every slow connection is open and mid-head
            for kind in ("completion", "metrics"):
                times, failed = [], 0
                deadline = time.monotonic() + 60
                for _ in range(requests):
                    t = timed_request(cluster.port, kind, timeout=10)
                    if t is None:
                        failed += 1
                    else:
                        times.append(t * 1000)
                    if time.monotonic() > deadline:
                        break
                    time.sleep(pace_s)  # spread over the slow heads' 408s and reconnects
                row = {"router": name, "slow_connections": n, "request": kind,
                       "sent": len(times) + failed, "failed": failed,
                       "p50_ms": percentile(times, 0.5) if times else None,
                       "p99_ms": percentile(times, 0.99) if times else None}
                log(f"slowloris {row}")
                rows.append(row)
            rows[-1]["slow_answers"] = dict(slow.answers)
            rows[-1]["slow_reconnects"] = slow.reconnects
        rows[-1]["rss_growth_kib"] = rss_kib(cluster.router.pid) - before
    out["slowloris"] = rows
    print(f"\n| router | request (new connection each) | sent | failed | p50 (ms) | p99 (ms) |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"| {r['router']} | {r['request']} | {r['sent']} | {r['failed']} | "
              f"{fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} |")


def scenario_idle(cluster, n, out):
    base = rss_kib(cluster.router.pid)
    conns = []
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", cluster.port), timeout=10)
        s.sendall(request)
        conns.append(s)
        if len(conns) % 500 == 0:  # read the answers so each connection is idle, not pending
            for c in conns[-500:]:
                c.recv(4096)
    for c in conns[len(conns) - len(conns) % 500:]:
        c.recv(4096)
    time.sleep(1)
    held = rss_kib(cluster.router.pid)
    status, body = cluster.get("/metrics")
    open_now = re.search(rb"carpool_http_connections (\d+)", body)
    for c in conns:
        c.close()
    row = {"idle_connections": n, "rss_before_kib": base, "rss_held_kib": held,
           "bytes_per_connection": (held - base) * 1024 / n,
           "gateway_reported_open": int(open_now.group(1)) if open_now else None}
    log(f"idle {row}")
    out["idle"] = row
    print(f"\n| idle keep-alive connections | router RSS before (MiB) | with them (MiB) | "
          f"per connection (bytes) |\n| --- | --- | --- | --- |\n| {n} | {base / 1024:.1f} | "
          f"{held / 1024:.1f} | {row['bytes_per_connection']:.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--old-router", help="another carpool-router binary to compare with")
    ap.add_argument("--slowloris", type=int, default=1000)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--scenarios", default="rate,slowloris,idle")
    ap.add_argument("--json")
    a = ap.parse_args()
    bindir = os.path.join(a.build, "bin")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    scenarios = a.scenarios.split(",")
    out = {"machine": os.uname().nodename, "cpus": os.cpu_count()}
    tmp = tempfile.mkdtemp(prefix="carpool-http-bench-")
    common = ["--http-idle-timeout-ms", "60000", "--http-max-connections", str(a.idle + 2000)]
    clusters = {}
    try:
        clusters["new"] = Cluster(os.path.join(bindir, "carpool-router"),
                                  os.path.join(bindir, "carpool-worker"), tmp, "new", common)
        if a.old_router:
            # The old gateway: one thread per connection, so it gets a slot per slow client.
            clusters["old"] = Cluster(a.old_router, os.path.join(bindir, "carpool-worker"), tmp,
                                      "old", ["--http-idle-timeout-ms", "5000"])
        if "rate" in scenarios:
            scenario_rate(os.path.join(bindir, "carpool"), clusters, out)
        if "slowloris" in scenarios:
            for c in clusters.values():
                c.close()
            # Default idle timeout (5 s): the slow heads are cut there and reconnect.
            clusters = {"new": Cluster(os.path.join(bindir, "carpool-router"),
                                       os.path.join(bindir, "carpool-worker"), tmp, "new2", [])}
            if a.old_router:
                clusters["old"] = Cluster(a.old_router, os.path.join(bindir, "carpool-worker"),
                                          tmp, "old2", [])
            scenario_slowloris(clusters, a.slowloris, out)
        if "idle" in scenarios:
            for c in clusters.values():
                c.close()
            clusters = {"new": Cluster(os.path.join(bindir, "carpool-router"),
                                       os.path.join(bindir, "carpool-worker"), tmp, "new3", common)}
            scenario_idle(clusters["new"], a.idle, out)
    finally:
        for c in clusters.values():
            c.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
