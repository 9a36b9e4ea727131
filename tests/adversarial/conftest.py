"""The adversarial suite's clusters and probes' tools: carpool-router (with the HTTP gateway on
127.0.0.1:0) and carpool-worker processes on ephemeral ports, from $CARPOOL_BIN_DIR (CTest sets
it), else build/bin; a raw ZeroMQ client speaking carpool.v1 protobuf; and the router's resident
memory and open descriptors, read from /proc, checked around each group of probes."""

import contextlib
import faulthandler
import os
import resource
import subprocess
import sys
import tempfile
import time

import pytest
import requests
import zmq

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
from processes import stop, wait_for_log  # noqa: E402

# The suite takes about a minute; CTest ends it at 300 s without a word. Past 240 s every
# thread's stack is printed and the run ends, so a hang says where it is.
faulthandler.dump_traceback_later(240, exit=True)

BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
ROUTER_BIN = os.path.join(BIN_DIR, "carpool-router")
WORKER_BIN = os.path.join(BIN_DIR, "carpool-worker")
# The router runs with glibc's malloc set so that its RSS follows its live memory: one arena,
# blocks of 64 KiB and more mapped on their own (and unmapped when freed), free memory at the
# heap's top returned past 128 KiB. With the defaults, the arenas' free lists keep whatever a
# burst of 1,000 connections left fragmented, and RSS wanders by 10-20% between identical
# rounds of a probe, which would hide a leak as well as fake one.
ROUTER_ENV = dict(os.environ, GLIBC_TUNABLES=(
    "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=65536:"
    "glibc.malloc.trim_threshold=131072"))
BUILT = all(os.access(p, os.X_OK) for p in (ROUTER_BIN, WORKER_BIN))


def _load_pb():
    """carpool.v1's generated module: the SDK's (build/client/python/carpool, on PYTHONPATH under
    CTest), else generated here with protoc from proto/carpool.proto."""
    try:
        from carpool import carpool_pb2
        return carpool_pb2
    except ImportError:
        pass
    out = tempfile.mkdtemp(prefix="carpool-adversarial-pb-")
    subprocess.run(["protoc", "-I" + os.path.join(REPO, "proto"), "--python_out=" + out,
                    os.path.join(REPO, "proto", "carpool.proto")], check=True, timeout=60)
    sys.path.insert(0, out)
    import carpool_pb2
    return carpool_pb2


pb = _load_pb()
PROTOCOL_VERSION = 1


def raise_nofile(n):
    """Raises this process's descriptor limit to at least `n` (children inherit it); skips the
    test when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < n:
        pytest.skip("RLIMIT_NOFILE hard limit %d < %d" % (hard, n))
    if soft != resource.RLIM_INFINITY and soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


# The router takes its hard limit for the HTTP gateway's connections; so may the probes.
raise_nofile(min(8192, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


# ---- the router's resources

def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


@contextlib.contextmanager
def bounded_resources(cluster, what, settle_s=15):
    """Asserts that the router's RSS and open descriptors after the block are within 10% of
    before it. Descriptors close asynchronously (timers, lingering closes): the check polls for
    up to `settle_s` seconds, which only noise can lengthen."""
    pid = cluster.router.pid
    rss0, fds0 = rss_kb(pid), open_fds(pid)
    yield
    deadline = time.monotonic() + settle_s
    while True:
        rss1, fds1 = rss_kb(pid), open_fds(pid)
        if (rss1 <= rss0 * 1.1 and fds1 <= fds0 * 1.1) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print("%s: router RSS %d -> %d KiB, descriptors %d -> %d" % (what, rss0, rss1, fds0, fds1))
    assert cluster.router.poll() is None, "the router exited:\n" + cluster.log_text()
    assert fds1 <= fds0 * 1.1, "%s: router descriptors %d -> %d" % (what, fds0, fds1)
    assert rss1 <= rss0 * 1.1, "%s: router RSS %d -> %d KiB" % (what, rss0, rss1)


# ---- raw ZeroMQ

class Zmq:
    """A DEALER on the router's frontend, sending and receiving carpool.v1 frames."""

    def __init__(self, endpoint, rcvhwm=None, handshake=True, curve=None, ctx=None):
        """curve: (server public key, client public key, client secret key), Z85."""
        self.own_ctx = ctx is None
        self.ctx = zmq.Context() if ctx is None else ctx
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        if curve is not None:
            self.sock.setsockopt_string(zmq.CURVE_SERVERKEY, curve[0])
            self.sock.setsockopt_string(zmq.CURVE_PUBLICKEY, curve[1])
            self.sock.setsockopt_string(zmq.CURVE_SECRETKEY, curve[2])
        self.sock.connect(endpoint)
        if handshake:  # connected for sure (the router holds its descriptor) once answered
            self.stats()

    def send(self, msg):
        if not isinstance(msg, (bytes, bytearray)):
            msg = msg.SerializeToString()
        # A probe never waits on a send (a DEALER blocks while it has no pipe or at its HWM).
        if not self.sock.poll(10_000, zmq.POLLOUT):
            raise AssertionError("the socket could not send within 10 s")
        self.sock.send(msg, zmq.NOBLOCK)

    def recv(self, timeout_s=10):
        """The next ServerMessage; AssertionError after `timeout_s` seconds without one."""
        if not self.sock.poll(int(timeout_s * 1000)):
            raise AssertionError("no answer from the router within %.1f s" % timeout_s)
        m = pb.ServerMessage()
        m.ParseFromString(self.sock.recv())
        return m

    def stats(self, timeout_s=10):
        self.send(pb.ClientMessage(protocol_version=PROTOCOL_VERSION, stats=pb.StatsRequest()))
        while True:
            m = self.recv(timeout_s)
            if m.WhichOneof("body") in ("stats", "error"):
                return m

    def close(self):
        self.sock.close(0)
        if self.own_ctx:
            self.ctx.destroy(linger=0)


def generate_msg(request_id, token_ids=None, text=None, max_tokens=8, stream=False, **kw):
    m = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    g = m.generate
    g.request_id = request_id
    if text is not None:
        g.text = text if isinstance(text, bytes) else text.encode()
    else:
        g.token_ids.ids.extend(token_ids if token_ids is not None else [1, 2, 3])
    g.sampling.max_tokens = max_tokens
    g.sampling.temperature = 0
    g.sampling.ignore_eos = True
    g.stream = stream
    for k, v in kw.items():
        setattr(g, k, v)
    return m


def read_request(client, request_id, timeout_s=30, tokens=None):
    """(token ids, the ending message) of one request on `client`, checking that chunks come in
    order with no gap or repeat; `tokens`: those of the chunks already read."""
    tokens, deadline = list(tokens or []), time.monotonic() + timeout_s
    while True:
        m = client.recv(max(0.1, deadline - time.monotonic()))
        kind = m.WhichOneof("body")
        body = getattr(m, kind)
        assert body.request_id == request_id, m
        if kind == "chunk":
            assert body.index == len(tokens), "chunk at %d after %d tokens" % (body.index,
                                                                               len(tokens))
            tokens.extend(t.id for t in body.tokens)
            continue
        if kind == "final":
            tokens.extend(t.id for t in body.tokens)
        return tokens, m


# ---- clusters

class Cluster:
    """One router (HTTP gateway on unless http=False); workers are added with add_worker()."""

    def __init__(self, tmp, router_args=(), http=True):
        self.tmp = tmp
        self.procs = []
        self.logs = []
        self.workers = []
        self._zmq = None
        self.url = None
        log_path = str(tmp / "router.log")
        self.logs.append(log_path)
        args = [ROUTER_BIN, "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*"]
        if http:
            args += ["--http", "127.0.0.1:0"]
        with open(log_path, "w") as log:
            self.router = subprocess.Popen(args + list(router_args), stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=ROUTER_ENV)
        self.procs.append(self.router)
        m = wait_for_log(log_path, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", 15)
        h = wait_for_log(log_path, r"http gateway listening on (http://127\.0\.0\.1:\d+)",
                         15) if http else None
        if m is None or (http and h is None):
            self.close()
            pytest.fail("the router did not start:\n" + self.log_text())
        self.frontend, self.backend = m.group(1), m.group(2)
        if h:
            self.url = h.group(1)
            self.host, self.port = "127.0.0.1", int(self.url.rsplit(":", 1)[1])

    def add_worker(self, model="synthetic:tiny", *args, wait=True):
        log_path = str(self.tmp / ("worker%d.log" % len(self.logs)))
        self.logs.append(log_path)
        with open(log_path, "w") as log:
            p = subprocess.Popen(
                [WORKER_BIN, "--router", self.backend, "--model", model, "--threads", "1"]
                + list(args),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        self.workers.append(p)
        if wait:
            self.wait_workers(sum(1 for w in self.workers if w.poll() is None), p)
        return p

    def wait_workers(self, n, proc=None, timeout=60):
        """Until the router counts `n` healthy workers."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if sum(1 for w in s.workers if w.healthy) >= n:
                return s
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                pytest.fail("the worker did not register:\n" + self.log_text())
            time.sleep(0.05)

    def zmq(self):
        if self._zmq is None:
            self._zmq = Zmq(self.frontend)
        return self._zmq

    def stats(self):
        m = self.zmq().stats()
        assert m.WhichOneof("body") == "stats", m
        return m.stats

    def wait_idle(self, timeout=15):
        """Until nothing is queued or in flight and every worker's KV blocks are free."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if s.inflight == 0 and s.queued == 0 and all(w.kv_used_blocks == 0 and w.running == 0
                                                         for w in s.workers):
                return s
            assert time.monotonic() < deadline, "not idle: %s" % s
            time.sleep(0.1)

    def log_text(self):
        out = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                out.append("==> %s\n%s" % (os.path.basename(path), f.read()[-4000:]))
        return "\n".join(out)

    def close(self):
        if self._zmq is not None:
            self._zmq.close()
            self._zmq = None
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.kill(p.pid, 18)  # SIGCONT: a stopped process cannot take SIGTERM
                except ProcessLookupError:
                    pass
            stop(p)


@pytest.fixture
def make_cluster(tmp_path_factory):
    made = []

    def make(router_args=(), http=True):
        c = Cluster(tmp_path_factory.mktemp("cluster"), router_args, http)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def get(c, path, **kw):
    kw.setdefault("timeout", 10)
    return requests.get(c.url + path, **kw)
