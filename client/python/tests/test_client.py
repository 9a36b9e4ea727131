"""The blocking Client against the in-test fake router."""

import gc
import json
import threading
import time

import pytest
import zmq

import carpool
from carpool import carpool_pb2 as pb
from fake_router import FakeRouter, chunk, error, final, keyed_stats_handler


def test_generate_text_returns_the_whole_result(fake_router, client):
    result = client.generate("héllo", sampling=carpool.SamplingParams(max_tokens=32))
    assert isinstance(result, carpool.GenerateResult)
    assert result.text == "héllo"
    assert result.text_bytes == "héllo".encode()
    assert result.token_ids == list("héllo".encode())
    assert result.finish_reason == "length"
    assert result.usage.completion_tokens == 6
    assert result.usage.total_tokens == 12
    assert result.timings == carpool.Timings(1.0, 2.0, 3.0)
    assert result.tokens[0].logprob == -0.5
    assert result.tokens[0].top_logprobs == [carpool.TokenLogprob(ord("h"), -0.5)]
    assert result.request_id.startswith("py-")


def test_text_prompts_add_special_tokens_by_default(fake_router):
    # As Hugging Face's encode, the CLI, the C++ SDK and the HTTP gateway do.
    with carpool.Client(fake_router.url, timeout=10) as client:
        client.generate("hi", sampling=carpool.SamplingParams(max_tokens=1))
        client.generate("hi", add_bos=False, sampling=carpool.SamplingParams(max_tokens=1))
    first, second = [m.generate for m in fake_router.messages("generate")]
    assert first.add_bos and not second.add_bos


def test_generate_sends_every_argument(fake_router):
    with carpool.Client(fake_router.url, timeout=10, api_key="key-1") as client:
        sampling = carpool.SamplingParams(
            max_tokens=2, temperature=0.5, top_k=4, top_p=0.9, min_p=0.1, repetition_penalty=1.1,
            presence_penalty=0.2, frequency_penalty=0.3, seed=42, stop_token_ids=[9],
            ignore_eos=True, logprobs=3)
        client.generate([5, 6, 7], sampling=sampling, priority="interactive", deadline_ms=500,
                        add_bos=True, request_id="mine")
        client.generate(token_ids=[1], api_key="key-2")
    first, second = [m.generate for m in fake_router.messages("generate")]
    assert first.request_id == "mine"
    assert list(first.token_ids.ids) == [5, 6, 7]
    s = first.sampling
    assert (s.max_tokens, s.top_k, s.seed, list(s.stop_token_ids)) == (2, 4, 42, [9])
    assert s.temperature == pytest.approx(0.5)
    assert s.top_p == pytest.approx(0.9)
    assert s.min_p == pytest.approx(0.1)
    assert s.repetition_penalty == pytest.approx(1.1)
    assert s.presence_penalty == pytest.approx(0.2)
    assert s.frequency_penalty == pytest.approx(0.3)
    assert s.ignore_eos and s.logprobs == 3
    assert first.priority == pb.PRIORITY_INTERACTIVE
    assert first.deadline_ms == 500 and first.add_bos and not first.stream
    assert first.api_key == "key-1"
    # Unset sampling fields stay unset, so the router's defaults apply.
    assert not second.sampling.HasField("temperature")
    assert not second.sampling.HasField("max_tokens")
    assert second.api_key == "key-2"
    assert fake_router.messages("generate")[0].protocol_version == 1


def test_bad_arguments_fail_before_sending(fake_router, client):
    with pytest.raises(TypeError):
        client.generate()
    with pytest.raises(TypeError):
        client.generate("a", token_ids=[1])
    with pytest.raises(TypeError):
        client.generate(["x"])
    with pytest.raises(carpool.InvalidArgument):
        client.generate("a", priority="urgent")
    with pytest.raises(carpool.InvalidArgument):  # out of int32's range
        client.generate("a", sampling=carpool.SamplingParams(max_tokens=1 << 40))
    with pytest.raises(ValueError):
        carpool.Client(fake_router.url, timeout=0)
    with pytest.raises(carpool.InvalidArgument):
        carpool.Client("nonsense://")
    assert fake_router.messages("generate") == []


def test_stream_yields_chunks_then_the_result(fake_router, client):
    stream = client.generate("abc", stream=True)
    chunks = list(stream)
    assert [c.index for c in chunks] == [0, 1, 2]
    assert [c.token_ids for c in chunks] == [[97], [98], [99]]
    assert "".join(c.text for c in chunks) == "abc"
    assert stream.done
    assert stream.result.text == "abc"
    assert stream.result.token_ids == [97, 98, 99]
    assert stream.result.usage.prompt_tokens == 3
    assert fake_router.messages("generate")[0].generate.stream
    assert list(stream) == []  # ended streams stay ended


def test_stream_holds_back_split_utf8(fake_router, client):
    # "é" is two bytes, one per token: the first chunk's text waits for the second.
    chunks = list(client.stream("é!"))
    assert [c.text for c in chunks] == ["", "é", "!"]
    assert chunks[0].text_bytes == b"\xc3"


def test_stream_wait_returns_the_result(client):
    assert client.stream([1, 2, 3]).wait().token_ids == [1, 2, 3]


@pytest.mark.parametrize("reason,code,cls", [
    ("queue_full", "UNAVAILABLE", carpool.QueueFull),
    ("token_budget", "RESOURCE_EXHAUSTED", carpool.TokenBudget),
    ("tenant_quota", "RESOURCE_EXHAUSTED", carpool.TenantQuota),
    ("deadline_unmeetable", "DEADLINE_EXCEEDED", carpool.DeadlineUnmeetable),
    ("deadline_exceeded", "DEADLINE_EXCEEDED", carpool.DeadlineExceeded),
    ("prompt_too_long", "INVALID_ARGUMENT", carpool.PromptTooLong),
    ("invalid_argument", "INVALID_ARGUMENT", carpool.InvalidArgument),
    ("unknown_model", "NOT_FOUND", carpool.UnknownModel),
    ("worker_lost", "UNAVAILABLE", carpool.WorkerLost),
    ("cancelled", "CANCELLED", carpool.Cancelled),
    ("draining", "UNAVAILABLE", carpool.Draining),
    ("internal", "INTERNAL", carpool.InternalError),
    ("unauthenticated", "UNAUTHENTICATED", carpool.Unauthenticated),
    ("too_large", "RESOURCE_EXHAUSTED", carpool.TooLarge),
    ("no_workers", "UNAVAILABLE", carpool.NoWorkers),
    ("client_too_slow", "RESOURCE_EXHAUSTED", carpool.ClientTooSlow),
    ("duplicate_request_id", "ALREADY_EXISTS", carpool.DuplicateRequestId),
    # A reason this SDK does not know falls back to the code's class, then to the base.
    ("brand_new", "UNAUTHENTICATED", carpool.Unauthenticated),
    ("brand_new", "ABORTED", carpool.CarpoolError),
])
@pytest.mark.parametrize("stream", [False, True])
def test_server_errors_raise_their_class(reason, code, cls, stream):
    def handler(router, client, msg):
        if msg.WhichOneof("body") == "generate":
            rid = msg.generate.request_id
            if msg.generate.stream:
                router.send(client, chunk(rid, 0, [1], b"x"))
            router.send(client, error(rid, code, reason, "because", retry_after_ms=120))

    router = FakeRouter(handler)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            with pytest.raises(cls) as info:
                if stream:
                    s = client.stream("x")
                    assert next(s).text == "x"  # chunks before the error still arrive
                    next(s)
                else:
                    client.generate("x")
            e = info.value
            assert type(e) is cls
            assert isinstance(e, carpool.CarpoolError)
            assert (e.code, e.reason, e.message, e.retry_after_ms) == (code, reason, "because",
                                                                        120)
            assert e.request_id.startswith("py-")
            assert "because" in str(e) and "120 ms" in str(e)
    finally:
        router.stop()


def test_error_hierarchy():
    assert issubclass(carpool.PromptTooLong, carpool.InvalidArgument)
    assert issubclass(carpool.InvalidArgument, ValueError)
    assert issubclass(carpool.Timeout, carpool.DeadlineExceeded)
    assert issubclass(carpool.Timeout, TimeoutError)


def silent(router, client, msg):
    pass


def test_timeout_raises_and_cancels_at_the_router():
    router = FakeRouter(silent)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            start = time.monotonic()
            with pytest.raises(carpool.Timeout) as info:
                client.generate("x", timeout=0.3, request_id="slow")
            elapsed = time.monotonic() - start
            assert 0.25 <= elapsed < 3
            assert info.value.code == "DEADLINE_EXCEEDED"
            assert info.value.request_id == "slow"
            cancels = router.wait_for("cancel")
            assert [m.cancel.request_id for m in cancels] == ["slow"]
            # The id is free again.
            with pytest.raises(carpool.Timeout):
                client.generate("x", timeout=0.1, request_id="slow")
    finally:
        router.stop()


def test_stream_timeout_covers_the_whole_call():
    def one_chunk(router, client, msg):
        if msg.WhichOneof("body") == "generate":
            router.send(client, chunk(msg.generate.request_id, 0, [1]))

    router = FakeRouter(one_chunk)
    try:
        with carpool.Client(router.url) as client:
            stream = client.stream("x", timeout=0.3)
            assert next(stream).token_ids == [1]
            with pytest.raises(carpool.Timeout):
                next(stream)
            with pytest.raises(carpool.Timeout):  # the same end again
                next(stream)
            assert stream.done
            assert stream.result.token_ids == [1]
            assert router.wait_for("cancel")
    finally:
        router.stop()


def test_no_router_times_out():
    with carpool.Client("tcp://127.0.0.1:1", timeout=0.2) as client:
        with pytest.raises(carpool.Timeout):
            client.generate("x")
        with pytest.raises(carpool.Timeout):
            client.stats()


def test_cancel_ends_a_stream_and_tells_the_router():
    def one_chunk(router, client, msg):
        if msg.WhichOneof("body") == "generate":
            router.send(client, chunk(msg.generate.request_id, 0, [1]))

    router = FakeRouter(one_chunk)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            stream = client.stream("x", request_id="r1")
            assert next(stream).token_ids == [1]
            assert client.cancel("r1")
            with pytest.raises(carpool.Cancelled):
                next(stream)
            assert not client.cancel("r1")  # no longer in flight
            assert not client.cancel("never-sent")
            assert [m.cancel.request_id for m in router.wait_for("cancel")] == ["r1"]
    finally:
        router.stop()


def test_cancel_from_another_thread_wakes_a_blocked_generate():
    router = FakeRouter(silent)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            threading.Timer(0.2, client.cancel, args=("r2",)).start()
            start = time.monotonic()
            with pytest.raises(carpool.Cancelled):
                client.generate("x", request_id="r2")
            assert time.monotonic() - start < 5
    finally:
        router.stop()


def test_stream_close_and_drop_cancel_the_request():
    router = FakeRouter(silent)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            with client.stream("x", request_id="closed"):
                pass
            client.stream("x", request_id="dropped")
            gc.collect()
            cancels = router.wait_for("cancel", 2)
            assert sorted(m.cancel.request_id for m in cancels) == ["closed", "dropped"]
    finally:
        router.stop()


def test_duplicate_request_id_in_flight_is_refused():
    router = FakeRouter(silent)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            stream = client.stream("x", request_id="same")
            with pytest.raises(carpool.InvalidArgument) as info:
                client.generate("x", request_id="same")
            assert info.value.code == "ALREADY_EXISTS"
            stream.close()
    finally:
        router.stop()


def test_stats(client):
    stats = client.stats()
    assert (stats.queued, stats.inflight, stats.requests_total, stats.requests_rejected) == (
        2, 1, 9, 1)
    assert stats.rejections_by_reason == {"queue_full": 1}
    (w,) = stats.workers
    assert (w.worker_id, w.healthy, w.epoch, w.model) == ("w1", True, 3, "synthetic:tiny")
    assert (w.running, w.max_num_seqs, w.kv_used_blocks, w.num_kv_blocks) == (1, 8, 7, 100)
    assert (w.outstanding_tokens, w.requests_served) == (12, 5)


def test_stats_send_the_key_and_a_refusal_ends_them_at_once():
    router = FakeRouter(keyed_stats_handler)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            start = time.monotonic()
            with pytest.raises(carpool.Unauthenticated):
                client.stats()
            assert time.monotonic() - start < 5
            assert client.stats(api_key="admin").workers[0].worker_id == "w1"
        with carpool.Client(router.url, timeout=10, api_key="admin") as client:
            assert client.stats().workers[0].worker_id == "w1"
        assert [m.stats.api_key for m in router.messages("stats")] == ["", "admin", "admin"]
    finally:
        router.stop()


def test_answers_reach_their_own_caller_across_threads():
    # The router answers in reverse order of arrival, in one burst.
    pending = []

    def reverse(router, client, msg):
        if msg.WhichOneof("body") != "generate":
            return
        pending.append((client, msg.generate))
        if len(pending) == 8:
            for c, g in reversed(pending):
                router.send(c, final(g.request_id, list(g.token_ids.ids)))

    router = FakeRouter(reverse)
    results, failures = {}, []
    try:
        with carpool.Client(router.url, timeout=10) as client:
            def call(i):
                try:
                    results[i] = client.generate([i, i + 100]).token_ids
                except Exception as e:  # surfaced by the assertion below
                    failures.append(e)

            threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=15)
        assert failures == []
        assert results == {i: [i, i + 100] for i in range(8)}
    finally:
        router.stop()


def test_close_cancels_calls_in_flight():
    router = FakeRouter(silent)
    try:
        client = carpool.Client(router.url, timeout=10)
        stream = client.stream("x", request_id="open")
        client.close()
        client.close()  # idempotent
        assert client.closed
        with pytest.raises(carpool.Cancelled):
            next(stream)
        with pytest.raises(carpool.Cancelled):
            client.generate("x")
        assert [m.cancel.request_id for m in router.wait_for("cancel")] == ["open"]
    finally:
        router.stop()


def test_garbage_from_the_router_is_ignored_and_reported_on_timeout():
    def garbage(router, client, msg):
        if msg.WhichOneof("body") == "generate":
            router.send(client, b"\xff\xfe not a protobuf")
            router.send(client, error("", "INVALID_ARGUMENT", "invalid_argument", "too big"))

    router = FakeRouter(garbage)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            with pytest.raises(carpool.Timeout) as info:
                client.generate("x", timeout=0.5)
            assert "could not match or decode" in str(info.value)
            assert "too big" in str(info.value)
    finally:
        router.stop()


def test_embed_returns_one_vector_per_input_in_order(client, fake_router):
    r = client.embed(["hi", b"abc", [7, 8, 9, 10]], normalize=False, pooling="last",
                     priority="batch", deadline_ms=500, add_bos=False, request_id="e1")
    assert isinstance(r, carpool.EmbedResult)
    assert r.request_id == "e1"
    assert len(r) == 3
    assert r.embeddings == [[2.0, ord("h"), 0.0, 1.0], [3.0, ord("a"), 0.0, 1.0],
                            [4.0, 7.0, 0.0, 1.0]]
    assert r[2][1] == 7.0
    assert r.usage.prompt_tokens == 9
    assert r.timings.total_ms == 2.0
    sent = fake_router.messages("embed")[0].embed
    assert sent.request_id == "e1" and not sent.add_bos and sent.deadline_ms == 500
    assert sent.inputs[2].token_ids.ids == [7, 8, 9, 10]


def test_embed_defaults_and_a_single_text(client, fake_router):
    r = client.embed("hello")
    assert r.embeddings == [[5.0, ord("h"), 1.0, 0.0]]  # normalize, mean pooling
    sent = fake_router.messages("embed")[0].embed
    assert sent.add_bos and sent.normalize and sent.api_key == ""


def test_embed_rejects_bad_arguments_before_sending(client, fake_router):
    with pytest.raises(carpool.InvalidArgument, match="pooling"):
        client.embed(["x"], pooling="max")
    with pytest.raises(carpool.InvalidArgument, match="priority"):
        client.embed(["x"], priority="urgent")
    with pytest.raises(TypeError, match="wrap token ids"):
        client.embed([1, 2, 3])
    with pytest.raises(TypeError):
        client.embed([["not", "ids"]])
    assert fake_router.messages("embed") == []


def test_embed_raises_the_routers_error():
    def handler(router, client_id, msg):
        if msg.WhichOneof("body") == "embed":
            e = msg.embed
            if len(e.inputs) == 1:
                router.send(client_id, error(e.request_id, "FAILED_PRECONDITION", "unsupported",
                                             "no worker of this cluster serves embeddings"))
            else:
                router.send(client_id, error(e.request_id, "INVALID_ARGUMENT", "invalid_argument",
                                             "inputs[1]: text is empty"))
    router = FakeRouter(handler)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            with pytest.raises(carpool.Unsupported):
                client.embed(["x"])
            with pytest.raises(carpool.InvalidArgument, match=r"inputs\[1\]"):
                client.embed(["x", ""])
    finally:
        router.stop()


def test_embed_timeout_cancels_at_the_router():
    router = FakeRouter(lambda *args: None)  # never answers
    try:
        with carpool.Client(router.url, timeout=10) as client:
            with pytest.raises(carpool.Timeout):
                client.embed(["x"], timeout=0.3, request_id="slow")
        cancels = router.wait_for("cancel", 1)
        assert [m.cancel.request_id for m in cancels] == ["slow"]
    finally:
        router.stop()


def test_embed_cancel_from_another_thread():
    router = FakeRouter(lambda *args: None)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            timer = threading.Timer(0.2, lambda: client.cancel("c1"))
            timer.start()
            with pytest.raises(carpool.Cancelled):
                client.embed(["x"], request_id="c1")
            timer.join()
        assert [m.cancel.request_id for m in router.wait_for("cancel", 1)] == ["c1"]
    finally:
        router.stop()


def test_curve_encrypts_the_connection():
    server_public, server_secret = zmq.curve_keypair()
    router = FakeRouter(curve_secret_key=server_secret)
    try:
        with carpool.Client(router.url, timeout=10,
                            curve_server_key=server_public.decode()) as client:
            assert client.generate("ok").text == "ok"
        public, secret = (k.decode() for k in zmq.curve_keypair())
        with carpool.Client(router.url, timeout=10, curve_server_key=server_public.decode(),
                            curve_public_key=public, curve_secret_key=secret) as client:
            assert client.generate("ok").text == "ok"
        with carpool.Client(router.url, timeout=0.3) as plain:  # no handshake, no answer
            with pytest.raises(carpool.Timeout):
                plain.generate("x")
    finally:
        router.stop()
    with pytest.raises(carpool.InvalidArgument):
        carpool.Client("tcp://127.0.0.1:1", curve_server_key="short")
    with pytest.raises(carpool.InvalidArgument):
        carpool.Client("tcp://127.0.0.1:1", curve_server_key=server_public.decode(),
                       curve_public_key=server_public.decode())


def test_a_stream_keeps_its_client_alive(fake_router):
    stream = carpool.Client(fake_router.url, timeout=10).stream("abc")
    gc.collect()
    assert [c.text for c in stream] == ["a", "b", "c"]


# ---- text: tokenize / detokenize, models, stop strings


def test_tokenize_and_detokenize(client, fake_router):
    t = client.tokenize("hé")
    assert isinstance(t, carpool.TokenizeResult)
    assert t.token_ids == [256] + list("hé".encode())
    assert t.max_model_len == 2048
    assert len(t) == 4
    assert client.tokenize(b"ab", add_special_tokens=False, model="m").token_ids == [97, 98]
    assert client.detokenize([256, 104, 105]) == "<|256|>hi"
    assert client.detokenize([256, 104, 105], skip_special_tokens=True, model="m") == "hi"
    first, second = [m.tokenize for m in fake_router.messages("tokenize")]
    assert first.add_special_tokens and first.HasField("add_special_tokens")
    assert first.model == "" and second.model == "m"
    assert not second.add_special_tokens
    d1, d2 = [m.detokenize for m in fake_router.messages("detokenize")]
    assert not d1.skip_special_tokens and d2.skip_special_tokens and d2.model == "m"


def test_tokenize_bad_arguments_fail_before_sending(client, fake_router):
    with pytest.raises(TypeError):
        client.tokenize([1, 2])
    with pytest.raises(TypeError):
        client.detokenize("text")
    with pytest.raises(TypeError):
        client.detokenize([1, "x"])
    with pytest.raises(TypeError):
        client.tokenize("x", model=3)
    assert fake_router.messages("tokenize") == []
    assert fake_router.messages("detokenize") == []


def test_tokenize_raises_the_routers_error_and_times_out():
    def handler(router, client, msg):
        if msg.WhichOneof("body") == "tokenize":
            router.send(client, error(msg.tokenize.request_id, "NOT_FOUND", "unknown_model",
                                      "model 'x' is not served"))
    router = FakeRouter(handler)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            with pytest.raises(carpool.UnknownModel):
                client.tokenize("a", model="x")
            with pytest.raises(carpool.Timeout):
                client.detokenize([1], timeout=0.2, request_id="slow")
            cancels = router.wait_for("cancel")
            assert [m.cancel.request_id for m in cancels] == ["slow"]
    finally:
        router.stop()


def test_generate_sends_model_and_text_options(client, fake_router):
    sampling = carpool.SamplingParams(max_tokens=4, stop=["\n", "END"],
                                      include_stop_str_in_output=True,
                                      skip_special_tokens=False)
    client.generate("x", sampling=sampling, model="llama")
    client.generate("y", sampling=carpool.SamplingParams(stop="one"))
    client.generate("z")
    client.embed("e", model="bge")
    first, second, third = [m.generate for m in fake_router.messages("generate")]
    assert first.model == "llama"
    assert list(first.stop) == ["\n", "END"]
    assert first.include_stop_str_in_output
    assert first.HasField("skip_special_tokens") and not first.skip_special_tokens
    assert list(second.stop) == ["one"]
    assert third.model == "" and list(third.stop) == []
    assert not third.include_stop_str_in_output and third.skip_special_tokens
    assert fake_router.messages("embed")[0].embed.model == "bge"


def test_stop_params_are_checked():
    assert carpool.SamplingParams(stop="a").stop == ("a",)
    with pytest.raises(TypeError):
        carpool.SamplingParams(stop=[1])
    with pytest.raises(TypeError):
        carpool.SamplingParams(stop=5)
    with pytest.raises(TypeError):
        carpool.SamplingParams(skip_special_tokens=1)


@pytest.mark.parametrize("stream", [False, True])
def test_result_carries_the_stop_string(stream):
    def handler(router, client, msg):
        if msg.WhichOneof("body") != "generate":
            return
        g = msg.generate
        if g.stream:
            router.send(client, chunk(g.request_id, 0, [104], b"h"))
            f = final(g.request_id, finish_reason="stop")
        else:
            f = final(g.request_id, [104], b"h", finish_reason="stop")
        f.final.stop_string = g.stop[0]
        router.send(client, f)
    router = FakeRouter(handler)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            params = carpool.SamplingParams(stop=["i"])
            if stream:
                result = client.stream("hi", sampling=params).wait()
            else:
                result = client.generate("hi", sampling=params)
            assert result.finish_reason == "stop"
            assert result.stop_string == "i"
            assert result.text == "h"
    finally:
        router.stop()


# ---- chat: conversations for the model's chat template


CONVERSATION = [
    {"role": "system", "content": "Be brief. Ünïcode ✓"},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ana"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "2"},
]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_chat_sends_the_conversation_as_json_in_order(client, fake_router):
    result = client.chat(CONVERSATION, tools=TOOLS, chat_template_kwargs={"enable_thinking": False,
                                                                          "a": [1, "é"]},
                         sampling=carpool.SamplingParams(max_tokens=4000, temperature=0),
                         model="llama", request_id="c-1", priority="batch")
    g = fake_router.messages("generate")[0].generate
    assert g.WhichOneof("prompt") == "chat"
    # Key order and non-ASCII text are kept as given (json.dumps, ensure_ascii=False).
    assert g.chat.messages_json == (
        '[{"role": "system", "content": "Be brief. Ünïcode ✓"}, '
        '{"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ana"}, '
        '{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": '
        '"function", "function": {"name": "f", "arguments": "{\\"x\\": 1}"}}]}, '
        '{"role": "tool", "tool_call_id": "c1", "content": "2"}]')
    assert json.loads(g.chat.messages_json) == CONVERSATION
    assert json.loads(g.chat.tools_json) == TOOLS
    assert g.chat.HasField("add_generation_prompt") and g.chat.add_generation_prompt
    assert g.chat.chat_template_kwargs_json == '{"enable_thinking": false, "a": [1, "é"]}'
    assert (g.model, g.request_id, g.priority, g.stream) == ("llama", "c-1",
                                                             pb.PRIORITY_BATCH, False)
    assert g.sampling.max_tokens == 4000 and g.sampling.temperature == 0
    # The fake router echoes the messages' JSON as the output.
    assert result.text == g.chat.messages_json
    assert result.request_id == "c-1"


def test_chat_defaults_and_no_generation_prompt(client, fake_router):
    client.chat([{"role": "user", "content": "hi"}])
    client.chat([], add_generation_prompt=False, tools=[])
    first, second = [m.generate.chat for m in fake_router.messages("generate")]
    assert first.messages_json == '[{"role": "user", "content": "hi"}]'
    assert first.tools_json == "" and first.chat_template_kwargs_json == ""  # None: not sent
    assert first.add_generation_prompt
    assert second.messages_json == "[]"
    assert second.tools_json == "[]"  # an empty list is not None: the template sees []
    assert second.HasField("add_generation_prompt") and not second.add_generation_prompt


def test_chat_streams(client, fake_router):
    stream = client.chat([{"role": "user", "content": "é"}], stream=True,
                         sampling=carpool.SamplingParams(max_tokens=500))
    assert isinstance(stream, carpool.Stream)
    chunks = list(stream)
    assert "".join(c.text for c in chunks) == stream.result.text == \
        '[{"role": "user", "content": "é"}]'
    assert fake_router.messages("generate")[0].generate.stream


def test_chat_bad_arguments_fail_before_sending(client, fake_router):
    for bad in ("hi", {"role": "user"}, [["user", "hi"]], None, 5):
        with pytest.raises(TypeError):
            client.chat(bad)
    with pytest.raises(TypeError):
        client.chat([{"role": "user", "content": object()}])  # not JSON
    with pytest.raises(TypeError):
        client.chat([{"role": "user", "content": float("nan")}])  # NaN is not JSON
    with pytest.raises(TypeError):
        client.chat([], tools={"type": "function"})
    with pytest.raises(TypeError):
        client.chat([], chat_template_kwargs=["x"])
    with pytest.raises(TypeError):
        client.chat([], add_generation_prompt="yes")
    with pytest.raises(TypeError):
        client.chat([], sampling={"max_tokens": 1})
    with pytest.raises(carpool.InvalidArgument):
        client.chat([{"role": "user", "content": "\ud800"}])  # a lone surrogate is not UTF-8
    assert fake_router.messages("generate") == []


def test_chat_raises_the_routers_error():
    def handler(router, client, msg):
        if msg.WhichOneof("body") == "generate":
            router.send(client, error(msg.generate.request_id, "INVALID_ARGUMENT",
                                      "invalid_argument", "chat template: unknown role 'bot'"))
    router = FakeRouter(handler)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            for stream in (False, True):
                with pytest.raises(carpool.InvalidArgument) as e:
                    r = client.chat([{"role": "bot", "content": "x"}], stream=stream)
                    if stream:
                        r.wait()
                assert "unknown role 'bot'" in e.value.message
    finally:
        router.stop()


def test_tokenize_messages(client, fake_router):
    t = client.tokenize(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                        add_generation_prompt=False, chat_template_kwargs={"k": 1}, model="m")
    assert t.token_ids == list(b'[{"role": "user", "content": "hi"}]')
    t2 = client.tokenize(messages=[], add_special_tokens=True)
    assert t2.token_ids == [256] + list(b"[]")
    first, second = [m.tokenize for m in fake_router.messages("tokenize")]
    assert first.HasField("chat") and first.text == b"" and first.model == "m"
    # For a conversation add_special_tokens stays unset (the router reads false) unless given.
    assert not first.HasField("add_special_tokens")
    assert json.loads(first.chat.tools_json) == TOOLS
    assert not first.chat.add_generation_prompt
    assert first.chat.chat_template_kwargs_json == '{"k": 1}'
    assert second.HasField("add_special_tokens") and second.add_special_tokens
    with pytest.raises(TypeError):
        client.tokenize("text", messages=[])
    with pytest.raises(TypeError):
        client.tokenize()
    with pytest.raises(TypeError):
        client.tokenize("text", tools=TOOLS)
    with pytest.raises(TypeError):
        client.tokenize(messages="[]")
    assert len(fake_router.messages("tokenize")) == 2
