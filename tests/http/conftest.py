"""Clusters for the HTTP gateway tests: carpool-router --http 127.0.0.1:0 plus carpool-worker
processes on ephemeral ports, from $CARPOOL_BIN_DIR (CTest sets it), else build/bin."""

import json
import os
import subprocess
import sys
import time

import pytest
import requests

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
from processes import stop, wait_for_log  # noqa: E402
BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
ROUTER_BIN = os.path.join(BIN_DIR, "carpool-router")
WORKER_BIN = os.path.join(BIN_DIR, "carpool-worker")
CLI_BIN = os.path.join(BIN_DIR, "carpool")
BUILT = all(os.access(p, os.X_OK) for p in (ROUTER_BIN, WORKER_BIN, CLI_BIN))




class Cluster:
    """One router with the HTTP gateway; workers are added with add_worker()."""

    def __init__(self, tmp, router_args=()):
        self.tmp = tmp
        self.procs = []
        self.logs = []
        log_path = str(tmp / "router.log")
        self.logs.append(log_path)
        with open(log_path, "w") as log:
            self.router = subprocess.Popen(
                [ROUTER_BIN, "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                 "--http", "127.0.0.1:0"] + list(router_args),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(self.router)
        m = wait_for_log(log_path, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", 15)
        h = wait_for_log(log_path, r"http gateway listening on (http://127\.0\.0\.1:\d+)", 15)
        if m is None or h is None:
            self.close()
            pytest.fail("the router did not start:\n" + self.log_text())
        self.frontend, self.backend = m.group(1), m.group(2)
        self.url = h.group(1)

    def add_worker(self, model, *args, wait=True):
        log_path = str(self.tmp / ("worker%d.log" % len(self.logs)))
        self.logs.append(log_path)
        with open(log_path, "w") as log:
            p = subprocess.Popen(
                [WORKER_BIN, "--router", self.backend, "--model", model, "--threads", "1"]
                + list(args),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        if wait:
            deadline = time.monotonic() + 60
            while requests.get(self.url + "/ready", timeout=5).status_code != 200:
                if time.monotonic() > deadline or p.poll() is not None:
                    pytest.fail("the worker did not register:\n" + self.log_text())
                time.sleep(0.05)
        return p

    def stats(self):
        out = subprocess.run([CLI_BIN, "status", "--router", self.frontend, "--json"],
                             capture_output=True, text=True, timeout=30, check=True)
        return json.loads(out.stdout)

    def log_text(self):
        out = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                out.append("==> %s\n%s" % (os.path.basename(path), f.read()[-4000:]))
        return "\n".join(out)

    def close(self):
        for p in reversed(self.procs):
            stop(p)


@pytest.fixture
def make_cluster(tmp_path_factory):
    made = []

    def make(router_args=()):
        c = Cluster(tmp_path_factory.mktemp("cluster"), router_args)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
