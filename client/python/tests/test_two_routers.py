"""Two routers (docs/cluster.md, "Two routers"): a Client given both endpoints sends every call
open when its router is lost to the other one, a stream resuming after the tokens it received
(resume_tokens), any other call as it was; a router down from the start is skipped. Against fake
routers, and against real carpool-router / carpool-worker processes (kill -9 of the active
router under seeded streams; skipped when the binaries are not built)."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import carpool
from fake_router import FakeRouter, chunk, echo_handler, final

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
from processes import stop as _stop, wait_for_log as _wait_for_log  # noqa: E402

BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
ROUTER_BIN = os.path.join(BIN_DIR, "carpool-router")
WORKER_BIN = os.path.join(BIN_DIR, "carpool-worker")
SENT_BEFORE_LOSS = 3


def partly(router, client, msg):
    """Streams the first SENT_BEFORE_LOSS tokens of a streamed generate, then nothing (the test
    stops it); answers nothing else."""
    if msg.WhichOneof("body") == "generate" and msg.generate.stream:
        g = msg.generate
        for i, t in enumerate(list(g.token_ids.ids)[:SENT_BEFORE_LOSS]):
            router.send(client, chunk(g.request_id, i, [t]))


def resuming(router, client, msg):
    """As echo_handler, a resumed stream continuing after its resume_tokens."""
    if msg.WhichOneof("body") != "generate":
        echo_handler(router, client, msg)
        return
    g = msg.generate
    ids = list(g.token_ids.ids)[:g.sampling.max_tokens]
    start = len(g.resume_tokens)
    if g.stream:
        for i in range(start, len(ids)):
            router.send(client, chunk(g.request_id, i, [ids[i]]))
        m = final(g.request_id, prompt_tokens=len(ids))
        m.final.usage.completion_tokens = len(ids)
        router.send(client, m)
    else:
        router.send(client, final(g.request_id, ids[start:], prompt_tokens=len(ids)))


def generates(router, request_id):
    return [m.generate for m in router.messages("generate")
            if m.generate.request_id == request_id]


def test_streams_continue_on_the_other_router_after_the_tokens_received():
    first, second = FakeRouter(partly), FakeRouter(resuming)
    try:
        with carpool.Client([first.url, second.url], timeout=10) as client:
            prompts = {"s%d" % i: list(range(10, 20 + i)) for i in range(6)}
            streams = {rid: client.stream(ids, request_id=rid,
                                          sampling=carpool.SamplingParams(max_tokens=len(ids)))
                       for rid, ids in prompts.items()}
            for s in streams.values():
                for _ in range(SENT_BEFORE_LOSS):
                    next(s)
            first.stop()  # as kill -9: the connection drops
            for rid, s in streams.items():
                indexes = [c.index for c in s]
                assert indexes == list(range(SENT_BEFORE_LOSS, len(prompts[rid])))
                assert [t.id for t in s.result.tokens] == prompts[rid]  # no gap, no duplicate
                [resent] = generates(second, rid)
                assert list(resent.resume_tokens) == prompts[rid][:SENT_BEFORE_LOSS]
                [original] = generates(first, rid)
                # The seed was drawn by the client (none given): the same at both routers.
                assert original.sampling.HasField("seed")
                assert resent.sampling.seed == original.sampling.seed
    finally:
        second.stop()


def test_a_call_not_answered_yet_is_sent_again_as_it_was():
    first, second = FakeRouter(partly), FakeRouter(resuming)  # the first answers nothing
    try:
        with carpool.Client("%s, %s" % (first.url, second.url), timeout=10) as client:
            out = {}
            sampling = carpool.SamplingParams(max_tokens=4, seed=42)
            t = threading.Thread(target=lambda: out.setdefault(
                "r", client.generate([5, 6, 7, 8], request_id="g1", sampling=sampling)))
            t.start()
            assert first.wait_for("generate")
            first.stop()
            t.join(timeout=10)
            assert [tok.id for tok in out["r"].tokens] == [5, 6, 7, 8]
            [resent] = generates(second, "g1")
            assert not resent.resume_tokens
            assert resent.sampling.seed == 42  # the caller's seed is kept
    finally:
        second.stop()


def test_a_router_down_from_the_start_is_skipped_after_connect_timeout():
    probe = FakeRouter()
    down = probe.url
    probe.stop()
    up = FakeRouter(resuming)
    try:
        with carpool.Client([down, up.url], timeout=10, connect_timeout=0.3) as client:
            start = time.monotonic()
            r = client.generate([1, 2, 3], sampling=carpool.SamplingParams(max_tokens=3))
            assert [t.id for t in r.tokens] == [1, 2, 3]
            assert time.monotonic() - start >= 0.25
    finally:
        up.stop()


def test_a_batch_call_that_changes_the_store_is_not_sent_again():
    first, second = FakeRouter(partly), FakeRouter(resuming)
    try:
        with carpool.Client([first.url, second.url], timeout=10) as client:
            out = {}

            def upload():
                try:
                    client.upload_file(b'{"custom_id": "a"}\n')
                except carpool.CarpoolError as e:
                    out["e"] = e

            t = threading.Thread(target=upload)
            t.start()
            assert first.wait_for("batch")
            first.stop()
            t.join(timeout=10)
            assert isinstance(out.get("e"), carpool.RouterLost), out
            assert "failing over to %s" % second.url in str(out["e"])
            time.sleep(0.2)
            assert not second.messages("batch")
    finally:
        second.stop()


def test_both_routers_lost_raises_router_lost():
    first, second = FakeRouter(partly), FakeRouter(partly)
    with carpool.Client([first.url, second.url], timeout=10, connect_timeout=0.3) as client:
        s = client.stream(list(range(10)), sampling=carpool.SamplingParams(max_tokens=10))
        for _ in range(SENT_BEFORE_LOSS):
            next(s)
        first.stop()
        assert second.wait_for("generate")
        second.stop()
        with pytest.raises(carpool.RouterLost):
            for _ in s:
                pass


def test_an_empty_endpoint_is_invalid():
    with pytest.raises(carpool.InvalidArgument, match="empty endpoint"):
        carpool.Client("tcp://127.0.0.1:1,")
    with pytest.raises(carpool.InvalidArgument, match="empty endpoint"):
        carpool.Client([])


# ---- real processes

needs_binaries = pytest.mark.skipif(
    not (os.access(ROUTER_BIN, os.X_OK) and os.access(WORKER_BIN, os.X_OK)),
    reason="carpool-router / carpool-worker not built in %s" % BIN_DIR)

STREAMS = 16


@pytest.fixture
def pair(tmp_path):
    """Two routers and one synthetic:tiny worker given both; yields (frontends, routers)."""
    with pair_of_routers(tmp_path) as p:
        yield p


@contextlib.contextmanager
def pair_of_routers(tmp_path, *worker_args):
    """Two routers and one synthetic:tiny worker given both (and `worker_args`); yields
    (frontends, routers) and stops them all."""
    procs, frontends, backends = [], [], []
    try:
        for i in range(2):
            log_path = str(tmp_path / ("router%d.log" % i))
            with open(log_path, "w") as log:
                procs.append(subprocess.Popen(
                    [ROUTER_BIN, "--frontend", "tcp://127.0.0.1:*", "--backend",
                     "tcp://127.0.0.1:*"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            m = _wait_for_log(log_path, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)",
                              15)
            assert m is not None, open(log_path).read()
            frontends.append(m.group(1))
            backends.append(m.group(2))
        with open(str(tmp_path / "worker.log"), "w") as log:
            procs.append(subprocess.Popen(
                [WORKER_BIN, "--router", ",".join(backends), "--model", "synthetic:tiny",
                 "--worker-id", "pair-w1", "--threads", "1", "--max-model-len", "1024",
                 *worker_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        yield frontends, procs[:2]
    finally:
        for p in reversed(procs):
            _stop(p)


def wait_for_worker(frontend, limit=20):
    """Waits (up to `limit` s) until the router at `frontend` has a worker."""
    with carpool.Client(frontend, timeout=5) as watch:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                if watch.stats(timeout=1).workers:
                    return
            except carpool.CarpoolError:
                pass
            time.sleep(0.02)
    pytest.fail("no worker registered with the router at %s" % frontend)


def run_streams(client, prompts, on_token=None):
    """Streams every prompt at once; returns {request_id: (token ids, chunk indexes in order)}."""
    out, threads = {}, []

    def one(rid, ids, seed):
        sampling = carpool.SamplingParams(max_tokens=400, temperature=0.9, top_p=0.95,
                                          seed=seed, ignore_eos=True)
        tokens, in_order = [], True
        for c in client.stream(ids, request_id=rid, sampling=sampling):
            in_order &= c.index == len(tokens)
            tokens.extend(t.id for t in c.tokens)
            if on_token:
                on_token()
        out[rid] = (tokens, in_order)

    for i, ids in enumerate(prompts):
        threads.append(threading.Thread(target=one, args=("p%d" % i, ids, 500 + i), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(timeout=60)
    return out


@needs_binaries
def test_kill_nine_of_the_active_router_streams_equal_the_no_fault_run(pair):
    frontends, routers = pair
    wait_for_worker(frontends[0])
    prompts = [[256] + [(7 * i + j) % 256 for j in range(4 + i)] for i in range(STREAMS)]
    with carpool.Client(frontends, timeout=60) as client:
        no_fault = run_streams(client, prompts)  # both routers up: the first serves
        seen, lock = [0], threading.Lock()
        killed = threading.Event()

        def count():
            with lock:
                seen[0] += 1
                fire = seen[0] >= STREAMS * 400 // 3 and not killed.is_set()
                if fire:
                    killed.set()
            if fire:
                routers[0].send_signal(signal.SIGKILL)  # a third of the way through

        faulted = run_streams(client, prompts, count)
    assert killed.is_set(), "the run ended before the kill"
    assert len(faulted) == STREAMS
    for rid, (tokens, in_order) in faulted.items():
        assert in_order, "%s: a gap or a duplicate" % rid
        assert tokens == no_fault[rid][0], rid
