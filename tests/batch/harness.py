"""Processes and HTTP helpers for the batch job tests (issue 16, docs/batch.md): a carpool-router
with the HTTP gateway and a --state-dir, carpool-workers on synthetic models, the Batch API over
plain HTTP (requests), all on 127.0.0.1 and ephemeral ports. Binaries from $CARPOOL_BIN_DIR (CTest
sets it), else build/bin. Every process a Cluster started is stopped by close()."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import requests

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
from processes import stop  # noqa: E402

BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
ROUTER_BIN = os.path.join(BIN_DIR, "carpool-router")
WORKER_BIN = os.path.join(BIN_DIR, "carpool-worker")
BUILT = all(os.access(p, os.X_OK) for p in (ROUTER_BIN, WORKER_BIN))

# The smallest synthetic model (byte tokenizer, a built-in chat template): fast on 2 cores.
MODEL = "synthetic:tiny"
FINAL = ("completed", "failed", "expired", "cancelled")


class Cluster:
    """One carpool-router (HTTP gateway on, batch jobs in `state_dir`) and its workers. The router
    can be killed (SIGKILL) and started again on the same state dir and the same backend port, so
    running workers reconnect to it."""

    def __init__(self, tmp, state_dir=None, router_args=()):
        self.tmp = str(tmp)
        self.state_dir = state_dir or os.path.join(self.tmp, "state")
        self.router_args = list(router_args)
        self.router = None
        self.workers = []
        self.logs = []
        self.backend = "tcp://127.0.0.1:*"
        self.frontend = "tcp://127.0.0.1:*"
        self.url = None
        self.start_router()

    def _log(self, name):
        path = os.path.join(self.tmp, "%s-%d.log" % (name, len(self.logs)))
        self.logs.append(path)
        return path

    def start_router(self):
        """Starts the router; after the first start, on the same frontend and backend ports (the
        HTTP port is a new ephemeral one: self.url follows it)."""
        assert self.router is None or self.router.poll() is not None
        restart = self.router is not None
        # A port the killed router held can be taken for a moment (a client's connect to it can
        # land on it as its own source port): a restart that finds it in use tries again.
        for attempt in range(20):
            log_path = self._log("router")
            with open(log_path, "w") as log:
                self.router = subprocess.Popen(
                    [ROUTER_BIN, "--frontend", self.frontend, "--backend", self.backend,
                     "--http", "127.0.0.1:0", "--state-dir", self.state_dir] + self.router_args,
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            started = self._wait_started(log_path, 30)
            if started is not None:
                break
            with open(log_path, errors="replace") as f:
                in_use = "Address already in use" in f.read()
            if not (restart and in_use and self.router.poll() is not None):
                text = self.log_text()
                self.close()
                raise AssertionError("the router did not start:\n" + text)
            time.sleep(0.25)
        else:
            raise AssertionError("the router's ports stayed in use:\n" + self.log_text())
        (self.frontend, self.backend), self.url = started

    def _wait_started(self, log_path, timeout):
        """The router's endpoints and gateway URL from its log; None when it exits or `timeout`
        seconds pass first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log_path, errors="replace") as f:
                text = f.read()
            m = re.search(r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", text)
            h = re.search(r"http gateway listening on (http://127\.0\.0\.1:\d+)", text)
            if m and h:
                return (m.group(1), m.group(2)), h.group(1)
            if self.router.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def kill_router(self):
        """SIGKILL: no chance to stop cleanly, as a crash."""
        self.router.send_signal(signal.SIGKILL)
        self.router.wait(timeout=30)

    def add_worker(self, model=MODEL, *args, wait=True):
        log_path = self._log("worker")
        with open(log_path, "w") as log:
            p = subprocess.Popen(
                [WORKER_BIN, "--router", self.backend, "--model", model, "--threads", "1",
                 "--max-model-len", "512"] + list(args),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.workers.append(p)
        if wait:
            self.wait_ready(p)
        return p

    def kill_worker(self, p):
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)

    def wait_ready(self, worker=None, timeout=60):
        """Until the gateway's /ready says a worker serves."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if requests.get(self.url + "/ready", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or (worker is not None and worker.poll() is not None):
                raise AssertionError("no worker became ready:\n" + self.log_text())
            time.sleep(0.05)

    def log_text(self):
        out = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                out.append("==> %s\n%s" % (os.path.basename(path), f.read()[-4000:]))
        return "\n".join(out)

    def close(self):
        for p in reversed(self.workers):
            stop(p)
        if self.router is not None:
            stop(self.router)

    # ---- the Batch API over HTTP

    def headers(self, key):
        return {"Authorization": "Bearer " + key} if key else {}

    def upload(self, content, key=None, purpose="batch", filename="input.jsonl"):
        if isinstance(content, str):
            content = content.encode()
        return requests.post(self.url + "/v1/files", headers=self.headers(key), timeout=60,
                             data={"purpose": purpose},
                             files={"file": (filename, content, "application/jsonl")})

    def create_batch(self, file_id, endpoint="/v1/chat/completions", window="24h", key=None,
                     metadata=None):
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window}
        if metadata is not None:
            body["metadata"] = metadata
        return requests.post(self.url + "/v1/batches", json=body, headers=self.headers(key),
                             timeout=60)

    def get(self, path, key=None):
        return requests.get(self.url + path, headers=self.headers(key), timeout=60)

    def post(self, path, body=None, key=None):
        return requests.post(self.url + path, json=body, headers=self.headers(key), timeout=120)

    def delete(self, path, key=None):
        return requests.delete(self.url + path, headers=self.headers(key), timeout=60)

    def submit(self, content, endpoint="/v1/chat/completions", key=None, window="24h"):
        """Uploads `content` and creates a batch of it: the batch object."""
        f = self.upload(content, key=key)
        assert f.status_code == 200, f.text
        b = self.create_batch(f.json()["id"], endpoint, window=window, key=key)
        assert b.status_code == 200, b.text
        return b.json()

    def wait_batch(self, batch_id, timeout, key=None, until=FINAL):
        """Polls the batch until its status is one of `until`; the batch object."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.get("/v1/batches/" + batch_id, key=key)
            assert r.status_code == 200, r.text
            b = r.json()
            if b["status"] in until:
                return b
            if time.monotonic() > deadline:
                raise AssertionError("batch %s still %s after %ds: %s\n%s" % (
                    batch_id, b["status"], timeout, json.dumps(b), self.log_text()))
            time.sleep(0.1)

    def content_lines(self, file_id, key=None):
        """The JSON lines of a file's content."""
        r = self.get("/v1/files/%s/content" % file_id, key=key)
        assert r.status_code == 200, r.text
        return [json.loads(line) for line in r.text.splitlines() if line]


def request_line(custom_id, body, url="/v1/chat/completions"):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(lines):
    return "".join(line + "\n" for line in lines)

