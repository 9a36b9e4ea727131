"""Hostile and careless ZeroMQ clients against a live carpool-router (docs/protocol.md): frames
over --max-request-bytes and frames that do not decode, numbers out of their field's range,
duplicate request ids, a client that stops reading, stats without a key, and requests too large
for the cluster. Every refusal must name the request it refuses; every accepted request ends
with exactly one final or error."""

import subprocess
import time
from contextlib import nullcontext

import pytest
import zmq

from conftest import (BUILT, PROTOCOL_VERSION, ROUTER_BIN, Zmq, bounded_resources, generate_msg,
                      pb, read_request)

pytestmark = pytest.mark.skipif(not BUILT, reason="carpool binaries not built")

MODEL = "synthetic:tiny"
MAX_MODEL_LEN = 512
MAX_REQUEST_BYTES = 64 << 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from conftest import Cluster
    c = Cluster(tmp_path_factory.mktemp("zmq"),
                ["--max-request-bytes", str(MAX_REQUEST_BYTES)], http=False)
    try:
        c.add_worker(MODEL, "--max-model-len", str(MAX_MODEL_LEN))
        client = Zmq(c.frontend)
        try:  # warm-up: every path once
            for i in range(50):
                client.send(generate_msg("warm%d" % i, max_tokens=4, stream=i % 2 == 0))
            for i in range(50):
                read_request_any(client)
            client.send(generate_msg("warm-big", text=b"x" * (2 * MAX_REQUEST_BYTES)))
            client.recv()
        finally:
            client.close()
        yield c
    finally:
        c.close()


def read_request_any(client, timeout_s=30):
    """Reads messages until one ends a request; returns it."""
    while True:
        m = client.recv(timeout_s)
        if m.WhichOneof("body") in ("final", "error", "embed_result"):
            return m


def expect_error(m, request_id, code, reason=None, words=()):
    assert m.WhichOneof("body") == "error", m
    e = m.error
    assert e.request_id == request_id, e
    assert e.code == code, e
    if reason is not None:
        assert e.reason == reason, e
    for w in words:
        assert w in e.message, (w, e)
    return e


# ---- hand-made protobuf, for values the generated classes refuse to encode

def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def field_bytes(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def envelope(body_field, body, version=PROTOCOL_VERSION):
    """A ClientMessage: protocol_version, then `body` (serialized) as field `body_field`."""
    return field_varint(1, version) + field_bytes(body_field, body)


# ---- frames that cannot be taken

def test_refused_frames_name_their_request(cluster):
    client = Zmq(cluster.frontend)
    try:
        with bounded_resources(cluster, "refused frames"):
            for _ in range(3):
                # Over --max-request-bytes: refused, naming the request.
                big = generate_msg("big-1", text=b"x" * (MAX_REQUEST_BYTES + 1000))
                client.send(big)
                expect_error(client.recv(), "big-1", "INVALID_ARGUMENT", "invalid_argument",
                             ["exceeds the limit of %d" % MAX_REQUEST_BYTES])
                # Truncated after its request_id.
                whole = generate_msg("cut-1", text=b"y" * 200).SerializeToString()
                client.send(whole[:len(whole) - 50])
                expect_error(client.recv(), "cut-1", "INVALID_ARGUMENT", "invalid_argument")
                # Another protocol version.
                g = generate_msg("v2-1").generate.SerializeToString()
                client.send(envelope(2, g, version=2))
                expect_error(client.recv(), "v2-1", "INVALID_ARGUMENT", "invalid_argument")
                # Several frames in one message.
                client.sock.send_multipart([generate_msg("multi-1").SerializeToString(), b"x"])
                expect_error(client.recv(), "multi-1", "INVALID_ARGUMENT", "invalid_argument")
                # Garbage names no request.
                client.send(b"\xff\xff\xff\xff garbage")
                expect_error(client.recv(), "", "INVALID_ARGUMENT", "invalid_argument")
                # The same socket is still served.
                client.send(generate_msg("after-1", max_tokens=3))
                tokens, end = read_request(client, "after-1")
                assert end.WhichOneof("body") == "final" and len(tokens) == 3, end
    finally:
        client.close()


# Fields of GenerateRequest / SamplingParams / EmbedRequest, and raw varints that do not fit
# their declared type (protobuf's parser would silently truncate them).
OUT_OF_RANGE = [
    ("deadline_ms 2^32 + 100", "deadline_ms", field_varint(6, (1 << 32) + 100)),
    ("deadline_ms 2^32 + 1", "deadline_ms", field_varint(6, (1 << 32) + 1)),
    ("deadline_ms 2^63", "deadline_ms", field_varint(6, 1 << 63)),
    ("deadline_ms 2^64 - 1", "deadline_ms", field_varint(6, (1 << 64) - 1)),
    ("priority 2^32", "priority", field_varint(5, 1 << 32)),
    ("priority 99", "priority", field_varint(5, 99)),
]
SAMPLING_OUT_OF_RANGE = [
    ("max_tokens 2^31", "max_tokens", field_varint(9, 1 << 31)),
    ("max_tokens 2^32 + 1", "max_tokens", field_varint(9, (1 << 32) + 1)),
    ("max_tokens -1", "max_tokens", field_varint(9, -1)),
    ("max_tokens 0", "max_tokens", field_varint(9, 0)),
    ("top_k 2^32 + 1", "top_k", field_varint(2, (1 << 32) + 1)),
    ("top_k 2^63", "top_k", field_varint(2, 1 << 63)),
    ("logprobs 2^31", "logprobs", field_varint(12, 1 << 31)),
    ("logprobs -1", "logprobs", field_varint(12, -1)),
]
FLOATS_OUT_OF_RANGE = [(name, value) for name in ("temperature", "top_p", "min_p",
                                                  "repetition_penalty", "presence_penalty",
                                                  "frequency_penalty")
                       for value in (float("nan"), float("inf"), float("-inf"))]


def test_numbers_out_of_range_are_invalid_argument(cluster):
    client = Zmq(cluster.frontend)
    try:
        with bounded_resources(cluster, "out-of-range numbers"):
            cases = []
            for i, (what, field, raw) in enumerate(OUT_OF_RANGE):
                rid = "range-g%d" % i
                g = generate_msg(rid, max_tokens=2).generate.SerializeToString()
                cases.append((what, field, rid, envelope(2, g + raw)))
            for i, (what, field, raw) in enumerate(SAMPLING_OUT_OF_RANGE):
                rid = "range-s%d" % i
                m = generate_msg(rid, max_tokens=2)
                m.generate.sampling.ClearField("max_tokens")
                sampling = m.generate.sampling.SerializeToString() + raw
                m.generate.ClearField("sampling")
                g = m.generate.SerializeToString() + field_bytes(4, sampling)
                cases.append((what, field, rid, envelope(2, g)))
            for i, (field, value) in enumerate(FLOATS_OUT_OF_RANGE):
                rid = "range-f%d" % i
                m = generate_msg(rid, max_tokens=2)
                setattr(m.generate.sampling, field, value)
                cases.append(("%s %r" % (field, value), field, rid, m.SerializeToString()))
            for i, raw in enumerate([field_varint(6, (1 << 32) + 100), field_varint(5, 1 << 40)]):
                rid = "range-e%d" % i
                e = pb.EmbedRequest(request_id=rid)
                e.inputs.add().token_ids.ids.extend([1, 2, 3])
                cases.append(("embed field %d" % i, "deadline_ms" if i == 0 else "priority", rid,
                              envelope(5, e.SerializeToString() + raw)))
            # The protocol version itself, 2^32 + 1 (truncated, it would read as 1).
            g = generate_msg("range-v").generate.SerializeToString()
            cases.append(("protocol_version 2^32 + 1", "protocol", "range-v",
                          envelope(2, g, version=(1 << 32) + 1)))
            failures = []
            for what, field, rid, frame in cases:
                client.send(frame)
                m = read_request_any(client)
                kind = m.WhichOneof("body")
                if kind != "error" or m.error.code != "INVALID_ARGUMENT" or \
                        m.error.request_id != rid or field not in m.error.message:
                    failures.append("%s: %s" % (what, str(m).replace("\n", " ")[:300]))
                if "max_tokens" in what and kind == "error" and "2^31" in what:
                    if "must be >= 1" in m.error.message:
                        failures.append("%s: names the wrong bound: %s" % (what, m.error.message))
            assert not failures, "\n".join(failures)
    finally:
        client.close()


def send_duplicates(client, live):
    """Sends a generate and an embed reusing each of `live`'s ids; asserts both are refused."""
    for rid in live:
        client.send(generate_msg(rid, max_tokens=5))  # same id, other content
        e = pb.EmbedRequest(request_id=rid)
        e.inputs.add().token_ids.ids.extend([1, 2, 3])
        client.send(pb.ClientMessage(protocol_version=PROTOCOL_VERSION, embed=e))
    for _ in range(2 * len(live)):
        m = client.recv()
        expect_error(m, m.error.request_id, "ALREADY_EXISTS", "duplicate_request_id")
        assert m.error.request_id in live
    assert not client.sock.poll(200), "more than the refusals"


def test_duplicate_request_id_does_not_disturb_the_live_request(make_cluster):
    # No worker at first: the live requests wait in the queue, so the duplicates surely meet
    # them in flight.
    c = make_cluster(http=False)
    client = Zmq(c.frontend)
    try:
        for round in range(3):
            live = ["dup-%d-%d" % (round, k) for k in range(20)]
            with bounded_resources(c, "duplicate request ids") if round == 1 else nullcontext():
                for rid in live:
                    client.send(generate_msg(rid, max_tokens=50, stream=True))
                send_duplicates(client, live)
                if round < 2:  # cancelled, each ends once
                    for rid in live:
                        client.send(pb.ClientMessage(protocol_version=PROTOCOL_VERSION,
                                                     cancel=pb.Cancel(request_id=rid)))
                    for rid in live:
                        expect_error(client.recv(), rid, "CANCELLED", "cancelled")
                    assert not client.sock.poll(200)
        c.add_worker(MODEL, "--max-model-len", str(MAX_MODEL_LEN))
        # Each live request goes on to its whole answer, untouched.
        tokens, ended = {rid: [] for rid in live}, set()
        while ended != set(live):
            m = client.recv(30)
            kind = m.WhichOneof("body")
            assert kind in ("chunk", "final"), m
            body = getattr(m, kind)
            assert body.request_id in live and body.request_id not in ended, m
            if kind == "chunk":
                seen = tokens[body.request_id]
                assert body.index == len(seen), "a gap or repeat in %s" % body.request_id
                seen.extend(t.id for t in body.tokens)
            else:
                assert len(tokens[body.request_id]) == 50, body
                ended.add(body.request_id)
        # The ids are free again once their requests ended.
        client.send(generate_msg(live[0], max_tokens=2))
        again, end = read_request(client, live[0])
        assert end.WhichOneof("body") == "final" and len(again) == 2, end
    finally:
        client.close()


def slow_reader(cluster, n, tag):
    """A DEALER with RCVHWM 10 sends `n` streaming requests and reads only once the router is
    idle, while another client is served; returns how many of the slow one's requests ended in
    client_too_slow. Asserts exactly one end (final or error) for each, no chunk after it."""
    slow = Zmq(cluster.frontend, rcvhwm=10)
    fast = Zmq(cluster.frontend)
    try:
        # Long request ids (every answer carries its id) and 64 tokens each: about 17 MB of
        # answers, more than the kernel's socket buffers and ZeroMQ's pipes hold, so the
        # router's per-client backlog overflows.
        ids = ["%s-%d-%s" % (tag, i, "x" * 100) for i in range(n)]
        for i, rid in enumerate(ids):
            slow.send(generate_msg(rid, max_tokens=64, stream=True, token_ids=[1 + i % 200, 2]))
        # Another client meanwhile is served as usual.
        for i in range(20):
            fast.send(generate_msg("fast-%d" % i, max_tokens=4, stream=True))
            tokens, end = read_request(fast, "fast-%d" % i, timeout_s=30)
            assert end.WhichOneof("body") == "final", end
            assert len(tokens) == 4
        cluster.wait_idle(timeout=60)
        ends, reasons, chunks_after_end = {}, {}, 0
        while len(ends) < n:
            m = slow.recv(30)
            kind = m.WhichOneof("body")
            body = getattr(m, kind)
            assert body.request_id in ids, m
            if kind == "chunk":
                chunks_after_end += body.request_id in ends
                continue
            assert body.request_id not in ends, "a second end for %s" % body.request_id
            ends[body.request_id] = kind
            if kind == "error":
                reasons[body.reason] = reasons.get(body.reason, 0) + 1
                assert body.code == "RESOURCE_EXHAUSTED", m
        assert chunks_after_end == 0
        assert set(reasons) <= {"client_too_slow"}, reasons
        assert not slow.sock.poll(500), "more after every request ended"
        print("slow reader: %d finals, %s" % (sum(1 for k in ends.values() if k == "final"),
                                              reasons))
        return reasons.get("client_too_slow", 0)
    finally:
        slow.close()
        fast.close()


def test_slow_reader_gets_exactly_one_end_per_request(cluster):
    n = 2000
    slow_reader(cluster, n, "warm")
    with bounded_resources(cluster, "a slow reader with %d streams" % n):
        too_slow = slow_reader(cluster, n, "slow")
    assert too_slow > 0, "the probe did not overflow the router's backlog for the client"


def stats_with(client, key):
    client.send(pb.ClientMessage(protocol_version=PROTOCOL_VERSION,
                                 stats=pb.StatsRequest(api_key=key)))
    return client.recv()


def test_stats_need_a_key_with_tenants(make_cluster, tmp_path):
    tenants = tmp_path / "tenants.textproto"
    tenants.write_text('tenant { key: "secret-key-a" name: "tenant-alpha" }\n'
                       'tenant { key: "secret-key-b" name: "tenant-beta" }\n')
    admin = tmp_path / "admin.keys"
    admin.write_text("admin-key\n")
    c = make_cluster(["--tenants", str(tenants), "--admin-key-file", str(admin)], http=False)
    client = Zmq(c.frontend)
    try:
        for round in range(2):
            with bounded_resources(c, "stats keys") if round == 1 else nullcontext():
                for _ in range(20):
                    for key in ("", "nope", "secret-key-a\n"):
                        m = stats_with(client, key)
                        assert m.WhichOneof("body") == "error", (
                            "stats with key %r answered: %s" % (key, m))
                        expect_error(m, "", "UNAUTHENTICATED", "unauthenticated")
                        assert "tenant-" not in m.error.message, m
                    # A tenant sees its own view, not the others'; an admin key sees all.
                    m = stats_with(client, "secret-key-a")
                    assert m.WhichOneof("body") == "stats", m
                    assert [t.name for t in m.stats.tenants] == ["tenant-alpha"], m
                    m = stats_with(client, "admin-key")
                    assert m.WhichOneof("body") == "stats", m
                    assert sorted(t.name for t in m.stats.tenants) == ["tenant-alpha",
                                                                        "tenant-beta"], m
    finally:
        client.close()


def too_large_embed(c, big, small, budget, tag):
    """An embed whose inputs together pass the cluster's in-flight budget, then small streamed
    completions right behind it: the embed is refused too_large, naming the limit, and the
    completions start at once. Returns their times to first token."""
    per_input = MAX_MODEL_LEN - 16
    e = pb.EmbedRequest(request_id="huge-" + tag)
    for i in range(budget // per_input + 10):
        e.inputs.add().token_ids.ids.extend([(i + j) % 200 + 1 for j in range(per_input)])
    big.send(pb.ClientMessage(protocol_version=PROTOCOL_VERSION, embed=e))
    ttfts = []
    for i in range(5):
        rid = "small-%s-%d" % (tag, i)
        t0 = time.monotonic()
        small.send(generate_msg(rid, max_tokens=4, stream=True))
        first = small.recv(10)
        ttfts.append(time.monotonic() - t0)
        assert first.WhichOneof("body") == "chunk", first
        tokens, end = read_request(small, rid, tokens=[t.id for t in first.chunk.tokens])
        assert end.WhichOneof("body") == "final" and len(tokens) == 4, end
    err = expect_error(big.recv(10), "huge-" + tag, "RESOURCE_EXHAUSTED", "too_large")
    assert str(budget) in err.message, err
    assert err.retry_after_ms == 0, err
    return ttfts


def test_request_larger_than_the_cluster_is_refused_and_blocks_nobody(make_cluster):
    c = make_cluster(http=False)
    c.add_worker(MODEL, "--max-model-len", str(MAX_MODEL_LEN))
    budget = c.stats().max_inflight_tokens
    assert budget > 0
    big = Zmq(c.frontend)
    small = Zmq(c.frontend)
    try:
        ttfts = too_large_embed(c, big, small, budget, "warm")
        with bounded_resources(c, "requests larger than the cluster"):
            ttfts += too_large_embed(c, big, small, budget, "probe")
        assert max(ttfts) < 1.0, "TTFT %.3f s behind a too-large request" % max(ttfts)
    finally:
        big.close()
        small.close()


def vanishing_clients(c, tag):
    """15 DEALERs each start 4 long streams (60: all running at once, under the worker's 64
    sequences) and read one chunk, a 16th sends 8 that must queue behind them and reads
    nothing; then all close. The router cancels a gone client's requests (docs/protocol.md,
    slow readers), the queued ones too once they run, so the cluster is idle long before the
    streams could have finished. Returns (seconds until idle, streams sent)."""
    ctx = zmq.Context()
    clients = []
    try:
        for _ in range(16):
            clients.append(Zmq(c.frontend, ctx=ctx))
        for k, client in enumerate(clients):
            for i in range(4 if k < 15 else 8):
                client.send(generate_msg("%s-%d-%d" % (tag, k, i), max_tokens=400, stream=True,
                                         token_ids=[1 + k, 2 + i, 3]))
        for client in clients[:15]:
            m = client.recv(30)
            assert m.WhichOneof("body") == "chunk", m
    finally:
        for client in clients:
            client.close()
        ctx.destroy(linger=0)  # closes any socket a failed constructor left behind
    t0 = time.monotonic()
    c.wait_idle(timeout=30)
    return time.monotonic() - t0, 15 * 4 + 8


def test_clients_that_vanish_mid_stream_have_their_requests_cancelled(make_cluster):
    # synthetic:small generates a few tens of tokens a second here: 68 streams of 400 tokens
    # would take minutes if they ran on.
    c = make_cluster(http=False)
    c.add_worker("synthetic:small", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "64")
    vanishing_clients(c, "warm")
    before = c.stats().workers[0].tokens_generated
    with bounded_resources(c, "16 vanished clients with 68 streams"):
        took, streams = vanishing_clients(c, "gone")
    generated = c.stats().workers[0].tokens_generated - before
    assert generated < streams * 400 / 4, "%d tokens generated for gone clients" % generated
    print("vanished clients: idle %.1f s after they closed, %d tokens generated" % (
        took, generated))


def test_curve_refuses_unknown_clients_silently(make_cluster, tmp_path):
    if not zmq.has("curve"):
        pytest.skip("this libzmq has no CURVE")
    server_key = tmp_path / "router.key"
    out = subprocess.run([ROUTER_BIN, "keygen", str(server_key)], capture_output=True, text=True,
                         timeout=30, check=True)
    server_public = (tmp_path / "router.key.pub").read_text().split()[-1]
    assert server_public in out.stdout + out.stderr
    allowed = [k.decode() for k in zmq.curve_keypair()]  # (public, secret)
    (tmp_path / "clients.allow").write_text(allowed[0] + "\n")
    c = make_cluster(["--curve-secret-key-file", str(server_key), "--curve-allow",
                      str(tmp_path / "clients.allow")], http=False)
    c._zmq = Zmq(c.frontend, curve=(server_public, allowed[0], allowed[1]))
    c.add_worker(MODEL, "--max-model-len", str(MAX_MODEL_LEN))

    def strangers(n):
        ctx = zmq.Context()
        socks = []
        try:
            for i in range(n):
                if i % 2:
                    pub, sec = (k.decode() for k in zmq.curve_keypair())
                    socks.append(Zmq(c.frontend, handshake=False, ctx=ctx,
                                     curve=(server_public, pub, sec)))
                else:  # no CURVE at all
                    socks.append(Zmq(c.frontend, handshake=False, ctx=ctx))
            for i, z in enumerate(socks):
                # Without waiting: once the router refuses a stranger's handshake, libzmq may drop
                # that socket's only pipe, and a send would then block (it is refused, which is
                # the point; what matters is that no answer ever comes).
                for msg in (generate_msg("stranger-%d" % i, max_tokens=2).SerializeToString(),
                            b"garbage"):
                    try:
                        z.sock.send(msg, zmq.NOBLOCK)
                    except zmq.Again:
                        pass
            time.sleep(0.5)
            for z in socks:
                assert not z.sock.poll(0), "a client without an allowed key got an answer"
        finally:
            for z in socks:
                z.close()
            ctx.destroy(linger=0)  # closes any socket a failed constructor left behind
        # The allowed client is served meanwhile.
        client = c.zmq()
        client.send(generate_msg("friend", max_tokens=3))
        tokens, end = read_request(client, "friend")
        assert end.WhichOneof("body") == "final" and len(tokens) == 3, end

    strangers(100)
    with bounded_resources(c, "100 clients without an allowed CURVE key"):
        strangers(100)
