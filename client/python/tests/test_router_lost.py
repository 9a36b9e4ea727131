"""A lost router: every call open on the connection raises RouterLost (UNAVAILABLE, router_lost)
within 3 s, with Client and AsyncClient; a busy router is not lost; the client redials. Against
the fake router, a peer that answers no heartbeats, and real carpool-router / carpool-worker
processes (kill -9 and SIGSTOP of the router; skipped when the binaries are not built)."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import carpool
from fake_router import FakeRouter, chunk, echo_handler

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
from processes import stop as _stop, wait_for_log as _wait_for_log  # noqa: E402

BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
ROUTER_BIN = os.path.join(BIN_DIR, "carpool-router")
WORKER_BIN = os.path.join(BIN_DIR, "carpool-worker")
TIMEOUT = 30  # of every call: far beyond the 3 s a loss may take


def first_chunk_only(router, client, msg):
    """Answers a streaming generate with one chunk, then nothing; nothing else is answered."""
    if msg.WhichOneof("body") == "generate" and msg.generate.stream:
        router.send(client, chunk(msg.generate.request_id, 0, [7]))


def is_router_lost(e):
    return (isinstance(e, carpool.RouterLost) and e.code == "UNAVAILABLE"
            and e.reason == "router_lost")


def run_sync(calls):
    """Runs each callable on its own thread; returns {name: the exception it raised, or None}."""
    out, threads = {}, []

    def one(name, fn):
        try:
            fn()
            out[name] = None
        except carpool.CarpoolError as e:
            out[name] = e

    for name, fn in calls.items():
        threads.append(threading.Thread(target=one, args=(name, fn), daemon=True))
        threads[-1].start()
    return threads, out


def test_router_stopping_ends_every_open_call():
    router = FakeRouter(first_chunk_only)
    client = carpool.Client(router.url, timeout=TIMEOUT)
    try:
        stream = client.stream([1, 2], request_id="iterated")
        first = next(stream)
        threads, out = run_sync({
            "generate": lambda: client.generate([1], request_id="blocking"),
            "embed": lambda: client.embed([[3]], request_id="embed"),
            "stats": lambda: client.stats(),
        })
        assert len(router.wait_for("generate", 2)) == 2
        assert router.wait_for("embed") and router.wait_for("stats")
        start = time.monotonic()
        router.stop()  # closes its socket: TCP FIN, as when a router process dies
        with pytest.raises(carpool.RouterLost) as lost:
            list(stream)
        for t in threads:
            t.join(5)
        took = time.monotonic() - start
    finally:
        client.close()
    assert took < 3
    assert first.token_ids == [7]
    assert is_router_lost(lost.value) and lost.value.request_id == "iterated"
    assert "lost the connection to the router" in lost.value.message
    assert stream.done
    for name in ("generate", "embed", "stats"):
        assert is_router_lost(out[name]), (name, out[name])


def test_async_router_stopping_ends_every_open_call():
    router = FakeRouter(first_chunk_only)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=TIMEOUT) as client:
            stream = await client.generate([1, 2], stream=True, request_id="iterated")
            first = await stream.__anext__()

            async def consume():
                return [c async for c in stream]

            tasks = {
                "stream": asyncio.ensure_future(consume()),
                "generate": asyncio.ensure_future(client.generate([1], request_id="blocking")),
                "embed": asyncio.ensure_future(client.embed([[3]], request_id="embed")),
                "stats": asyncio.ensure_future(client.stats()),
            }
            while not (len(router.messages("generate")) >= 2 and router.messages("embed")
                       and router.messages("stats")):
                await asyncio.sleep(0.01)
            start = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, router.stop)
            await asyncio.wait(list(tasks.values()), timeout=5)
            took = time.monotonic() - start
            return first, took, {k: t.exception() for k, t in tasks.items()}

    first, took, out = asyncio.run(asyncio.wait_for(main(), 20))
    assert took < 3
    assert first.token_ids == [7]
    for name, e in out.items():
        assert is_router_lost(e), (name, e)


class SilentZmtpPeer:
    """Completes a ZMTP 3.1 handshake as a ROUTER (NULL mechanism), then reads and drops
    everything, answering nothing, not even PINGs: a router whose host froze."""

    GREETING = (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x01" + b"NULL" + b"\0" * 16 + b"\0"
                + b"\0" * 31)
    READY_BODY = b"\x05READY\x0bSocket-Type\0\0\0\x06ROUTER"

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = "tcp://127.0.0.1:%d" % self._listener.getsockname()[1]
        self._peers = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        hello = self.GREETING + b"\x04" + bytes([len(self.READY_BODY)]) + self.READY_BODY
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            conn.sendall(hello)
            self._peers.append(conn)
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn):
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        for c in self._peers:
            c.close()
        self._listener.close()


def test_silent_router_is_lost_after_missed_heartbeats():
    peer = SilentZmtpPeer()
    try:
        with carpool.Client(peer.url, timeout=TIMEOUT, heartbeat_ms=100) as client:
            start = time.monotonic()
            with pytest.raises(carpool.RouterLost):
                client.generate([1])
            assert time.monotonic() - start < 3
        # Without heartbeats nothing tells the client: the call ends at its own timeout.
        with carpool.Client(peer.url, timeout=0.5, heartbeat_ms=0) as client:
            with pytest.raises(carpool.Timeout):
                client.generate([1])
    finally:
        peer.stop()


def test_async_silent_router_is_lost_after_missed_heartbeats():
    peer = SilentZmtpPeer()

    async def main():
        async with carpool.AsyncClient(peer.url, timeout=TIMEOUT, heartbeat_ms=100) as client:
            start = time.monotonic()
            with pytest.raises(carpool.RouterLost):
                await client.generate([1])
            return time.monotonic() - start

    try:
        assert asyncio.run(asyncio.wait_for(main(), 20)) < 3
    finally:
        peer.stop()


def test_busy_router_answering_late_is_not_lost():
    # The router's thread is stuck for 20 heartbeat intervals; its ZeroMQ I/O thread still
    # answers the PINGs, so the connection stays up and the answer arrives.
    def slow(router, client, msg):
        time.sleep(1.0)
        echo_handler(router, client, msg)

    router = FakeRouter(slow)
    try:
        with carpool.Client(router.url, timeout=TIMEOUT, heartbeat_ms=50) as client:
            assert client.generate([4, 5]).token_ids == [4, 5]

        async def main():
            async with carpool.AsyncClient(router.url, timeout=TIMEOUT,
                                           heartbeat_ms=50) as client:
                return (await client.generate([6])).token_ids

        assert asyncio.run(main()) == [6]
    finally:
        router.stop()


def test_client_works_with_the_next_router_after_a_loss():
    router = FakeRouter(lambda r, c, m: None)
    url = router.url
    with carpool.Client(url, timeout=TIMEOUT) as client:
        for round_ in range(2):  # a second loss is noticed as the first was
            threads, out = run_sync({"g": lambda: client.generate([1])})
            assert router.wait_for("generate")
            router.stop()
            threads[0].join(5)
            assert is_router_lost(out["g"]), out
            router = FakeRouter(echo_handler if round_ == 1 else (lambda r, c, m: None),
                                bind=url)
        try:
            assert client.generate([5]).token_ids == [5]  # redialled by itself
        finally:
            router.stop()


# ---- real processes

needs_binaries = pytest.mark.skipif(
    not (os.access(ROUTER_BIN, os.X_OK) and os.access(WORKER_BIN, os.X_OK)),
    reason="carpool-router / carpool-worker not built in %s" % BIN_DIR)

STREAMS = 16
LONG = 2000  # max_tokens: far more than can be generated before the worker is frozen


@pytest.fixture
def cluster(tmp_path):
    """A router and one synthetic:tiny worker; yields (frontend, router, worker)."""
    router_log, worker_log = str(tmp_path / "router.log"), str(tmp_path / "worker.log")
    procs = []
    try:
        with open(router_log, "w") as log:
            router = subprocess.Popen(
                [ROUTER_BIN, "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(router)
        m = _wait_for_log(router_log, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", 15)
        assert m is not None, open(router_log).read()
        with open(worker_log, "w") as log:
            worker = subprocess.Popen(
                [WORKER_BIN, "--router", m.group(2), "--model", "synthetic:tiny", "--worker-id",
                 "lost-w1", "--threads", "1", "--max-model-len", "2048"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(worker)
        yield m.group(1), router, worker
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)  # a stopped process takes no SIGTERM
            _stop(p)


def wait_for_inflight(client, n, worker):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and worker.poll() is None:
        try:
            s = client.stats(timeout=1)
            if s.workers and s.inflight >= n:
                return
        except carpool.CarpoolError:
            pass
        time.sleep(0.02)
    pytest.fail("the router never had %d requests in flight" % n)


def open_streams(frontend, worker, sync_client, async_client, loop):
    """STREAMS streams in flight, half sync and half async, each with a first chunk read; then
    the worker is frozen so none can finish. Returns (sync streams, async streams)."""
    args = dict(sampling=carpool.SamplingParams(max_tokens=LONG, ignore_eos=True))
    sync_streams = [sync_client.stream([1, 2, i], **args) for i in range(STREAMS // 2)]
    for s in sync_streams:
        next(s)

    async def start():
        streams = [await async_client.generate([3, 4, i], stream=True, **args)
                   for i in range(STREAMS // 2)]
        for s in streams:
            await s.__anext__()
        return streams

    async_streams = loop.run_until_complete(start())
    wait_for_inflight(sync_client, STREAMS, worker)
    worker.send_signal(signal.SIGSTOP)
    return sync_streams, async_streams


def expect_all_lost(sync_streams, async_streams, loop):
    for s in sync_streams:
        with pytest.raises(carpool.RouterLost):
            for _ in s:
                pass

    async def drain():
        for s in async_streams:
            with pytest.raises(carpool.RouterLost):
                async for _ in s:
                    pass

    loop.run_until_complete(asyncio.wait_for(drain(), 10))


@needs_binaries
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_real_router_lost_under_open_streams(cluster, how):
    frontend, router, worker = cluster
    loop = asyncio.new_event_loop()
    try:
        with carpool.Client(frontend, timeout=60) as client:
            async_client = carpool.AsyncClient(frontend, timeout=60)
            sync_streams, async_streams = open_streams(frontend, worker, client, async_client,
                                                       loop)
            start = time.monotonic()
            # kill -9: the kernel closes TCP at once. SIGSTOP: the sockets stay open and nothing
            # is answered, not even PINGs: 1 s heartbeats notice within 3 s of the last word.
            router.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            expect_all_lost(sync_streams, async_streams, loop)
            took = time.monotonic() - start
            assert took < 3, took
            if how == "stop":  # the router resumes: the same clients redial it by themselves
                router.send_signal(signal.SIGCONT)
                assert client.stats(timeout=10) is not None
                assert loop.run_until_complete(async_client.stats(timeout=10)) is not None
            loop.run_until_complete(async_client.aclose())
    finally:
        loop.close()
