"""A fake carpool router for the SDK's unit tests: a ZeroMQ ROUTER socket in a thread.

Each ClientMessage is decoded and handed to a handler, which answers with ServerMessages (or
nothing). Every message received is recorded, so tests can check what the client sent.
"""

import threading
import time
from typing import Callable, List, Optional

import zmq

from carpool import carpool_pb2 as pb

Handler = Callable[["FakeRouter", bytes, "pb.ClientMessage"], None]


def final(request_id: str, token_ids=(), text: bytes = b"", finish_reason: str = "length",
          prompt_tokens: int = 0) -> "pb.ServerMessage":
    m = pb.ServerMessage(protocol_version=1)
    f = m.final
    f.request_id = request_id
    for i in token_ids:
        t = f.tokens.add(id=i, logprob=-0.5)
        t.top_logprobs.add(token=i, logprob=-0.5)
    f.text = text
    f.finish_reason = finish_reason
    f.usage.prompt_tokens = prompt_tokens
    f.usage.completion_tokens = len(token_ids)
    f.timings.queue_ms, f.timings.ttft_ms, f.timings.total_ms = 1.0, 2.0, 3.0
    return m


def chunk(request_id: str, index: int, token_ids, text: bytes = b"") -> "pb.ServerMessage":
    m = pb.ServerMessage(protocol_version=1)
    c = m.chunk
    c.request_id = request_id
    c.index = index
    for i in token_ids:
        c.tokens.add(id=i, logprob=-1.0)
    c.text = text
    return m


def error(request_id: str, code: str, reason: str, message: str,
          retry_after_ms: int = 0) -> "pb.ServerMessage":
    m = pb.ServerMessage(protocol_version=1)
    m.error.request_id = request_id
    m.error.code = code
    m.error.reason = reason
    m.error.message = message
    m.error.retry_after_ms = retry_after_ms
    return m


def embed_result(request_id: str, embeddings, prompt_tokens: int) -> "pb.ServerMessage":
    m = pb.ServerMessage(protocol_version=1)
    r = m.embed_result
    r.request_id = request_id
    for e in embeddings:
        r.embeddings.add().values.extend(e)
    r.usage.prompt_tokens = prompt_tokens
    r.timings.queue_ms, r.timings.ttft_ms, r.timings.total_ms = 1.0, 2.0, 2.0
    return m


def echo_handler(router: "FakeRouter", client: bytes, msg: "pb.ClientMessage") -> None:
    """Answers like a router over an echo worker: the prompt's token ids (or text bytes) come
    back as output, streamed one token per chunk when asked; stats list one worker."""
    kind = msg.WhichOneof("body")
    if kind == "stats":
        s = pb.ServerMessage(protocol_version=1)
        w = s.stats.workers.add(worker_id="w1", healthy=True, epoch=3, running=1,
                                num_kv_blocks=100, kv_used_blocks=7, max_num_seqs=8,
                                model="synthetic:tiny", requests_served=5)
        w.outstanding_tokens = 12
        s.stats.queued, s.stats.inflight = 2, 1
        s.stats.requests_total, s.stats.requests_rejected = 9, 1
        s.stats.rejections_by_reason["queue_full"] = 1
        router.send(client, s)
        return
    if kind == "embed":
        # Each input's embedding: [its token count, its first token, 1 if normalize, pooling].
        e = msg.embed
        vectors, tokens = [], 0
        for item in e.inputs:
            ids = list(item.text) if item.WhichOneof("input") == "text" else list(item.token_ids.ids)
            tokens += len(ids)
            vectors.append([float(len(ids)), float(ids[0] if ids else -1),
                            float(e.normalize), float(e.pooling)])
        router.send(client, embed_result(e.request_id, vectors, tokens))
        return
    if kind == "tokenize":
        # The byte tokenizer: one id per byte, BOS (256) first with add_special_tokens.
        # A chat: the bytes of its messages' JSON, BOS only when add_special_tokens is set true.
        t = msg.tokenize
        m = pb.ServerMessage(protocol_version=1)
        m.tokenize_result.request_id = t.request_id
        if t.HasField("chat"):
            text = t.chat.messages_json.encode("utf-8")
            bos = t.HasField("add_special_tokens") and t.add_special_tokens
        else:
            text, bos = t.text, t.add_special_tokens
        m.tokenize_result.token_ids.extend(([256] if bos else []) + list(text))
        m.tokenize_result.max_model_len = 2048
        router.send(client, m)
        return
    if kind == "detokenize":
        d = msg.detokenize
        m = pb.ServerMessage(protocol_version=1)
        m.detokenize_result.request_id = d.request_id
        m.detokenize_result.text = b"".join(
            bytes([i]) if i < 256 else (b"" if d.skip_special_tokens else b"<|%d|>" % i)
            for i in d.token_ids)
        router.send(client, m)
        return
    if kind != "generate":
        return
    g = msg.generate
    if g.WhichOneof("prompt") == "chat":  # the "rendering" is the messages' JSON, echoed
        text = g.chat.messages_json.encode("utf-8")
        ids, pieces = list(text), [bytes([b]) for b in text]
    elif g.WhichOneof("prompt") == "text":
        ids, pieces = list(g.text), [bytes([b]) for b in g.text]
    else:
        ids, pieces = list(g.token_ids.ids), [b""] * len(g.token_ids.ids)
    n = g.sampling.max_tokens if g.sampling.HasField("max_tokens") else 16
    ids, pieces = ids[:n], pieces[:n]
    if g.stream:
        for i, (t, p) in enumerate(zip(ids, pieces)):
            router.send(client, chunk(g.request_id, i, [t], p))
        router.send(client, final(g.request_id, prompt_tokens=len(ids)))
    else:
        router.send(client, final(g.request_id, ids, b"".join(pieces), prompt_tokens=len(ids)))


def keyed_stats_handler(router: "FakeRouter", client: bytes, msg: "pb.ClientMessage") -> None:
    """Like a router with tenants: stats only for the key "admin", else an UNAUTHENTICATED error
    naming no request; everything else as echo_handler."""
    if msg.WhichOneof("body") == "stats" and msg.stats.api_key != "admin":
        router.send(client, error("", "UNAUTHENTICATED", "unauthenticated",
                                  "stats need an API key"))
        return
    echo_handler(router, client, msg)


class FakeRouter:
    """ROUTER socket on an ephemeral TCP port (or `bind`: another router's url, to stand in for
    it after it stopped), served by a thread until stop(), which drops every client's
    connection."""

    def __init__(self, handler: Handler = echo_handler, curve_secret_key: bytes = b"",
                 bind: str = "tcp://127.0.0.1:*") -> None:
        self.handler = handler
        self.received: List["pb.ClientMessage"] = []
        self._mu = threading.Lock()
        self._outbox: List[tuple] = []
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if curve_secret_key:
            self._sock.curve_server = True
            self._sock.curve_secretkey = curve_secret_key
        self._sock.bind(bind)
        self.url = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def send(self, client: bytes, msg) -> None:
        """Queues `msg` (a ServerMessage or raw bytes) for `client`; any thread."""
        with self._mu:
            self._outbox.append((client, msg if isinstance(msg, bytes) else
                                 msg.SerializeToString()))

    def messages(self, kind: Optional[str] = None) -> List["pb.ClientMessage"]:
        with self._mu:
            return [m for m in self.received if kind is None or m.WhichOneof("body") == kind]

    def wait_for(self, kind: str, n: int = 1, timeout: float = 5.0) -> List["pb.ClientMessage"]:
        """Waits until `n` messages of `kind` arrived; returns them (fewer after the timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.messages(kind)
            if len(got) >= n:
                return got
            time.sleep(0.01)
        return self.messages(kind)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(10, zmq.POLLIN):
                while True:
                    try:
                        client, payload = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    msg = pb.ClientMessage()
                    msg.ParseFromString(payload)
                    with self._mu:
                        self.received.append(msg)
                    self.handler(self, client, msg)
            with self._mu:
                out, self._outbox = self._outbox, []
            for client, payload in out:
                self._sock.send_multipart([client, payload])
