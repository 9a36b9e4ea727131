"""The SDK against a real cluster: carpool-router and one carpool-worker (synthetic:tiny) run as
subprocesses on ephemeral ports. Binaries come from $CARPOOL_BIN_DIR (CTest sets it), else
build/bin; the tests skip when they are not built."""

import asyncio
import os
import subprocess
import sys
import time

import pytest

import carpool

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
from processes import stop as _stop, wait_for_log as _wait_for_log  # noqa: E402
BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
ROUTER_BIN = os.path.join(BIN_DIR, "carpool-router")
WORKER_BIN = os.path.join(BIN_DIR, "carpool-worker")
MAX_MODEL_LEN = 2048
LONG = 2000  # max_tokens of a request meant to still run while the test acts (~0.1 s)
KEY = "py-key"          # the tenant every test uses
ONE_KEY = "one-key"     # a tenant with one request at a time
TENANTS = """
tenant { key: "py-key" name: "py" }
tenant { key: "one-key" name: "one" max_concurrent: 1 }
"""

pytestmark = pytest.mark.skipif(
    not (os.access(ROUTER_BIN, os.X_OK) and os.access(WORKER_BIN, os.X_OK)),
    reason="carpool-router / carpool-worker not built in %s" % BIN_DIR)




class Cluster:
    def __init__(self, frontend, router, worker, logs):
        self.frontend = frontend
        self.router = router
        self.worker = worker
        self.logs = logs

    def log_text(self):
        out = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                out.append("==> %s\n%s" % (os.path.basename(path), f.read()[-4000:]))
        return "\n".join(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    router_log, worker_log = str(tmp / "router.log"), str(tmp / "worker.log")
    tenants = tmp / "tenants.textproto"
    tenants.write_text(TENANTS)
    procs = []
    try:
        with open(router_log, "w") as log:
            router = subprocess.Popen(
                [ROUTER_BIN, "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                 "--tenants", str(tenants)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(router)
        m = _wait_for_log(router_log, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", 15)
        if m is None:
            pytest.fail("the router did not report its endpoints:\n" + open(router_log).read())
        frontend, backend = m.group(1), m.group(2)
        with open(worker_log, "w") as log:
            worker = subprocess.Popen(
                [WORKER_BIN, "--router", backend, "--model", "synthetic:tiny", "--worker-id",
                 "py-w1", "--threads", "1", "--max-model-len", str(MAX_MODEL_LEN)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(worker)
        c = Cluster(frontend, router, worker, [router_log, worker_log])
        with carpool.Client(frontend, timeout=5, api_key=KEY) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.stats(timeout=1).workers:
                        break
                except carpool.Timeout:
                    pass
                if time.monotonic() > deadline or worker.poll() is not None:
                    pytest.fail("the worker did not register:\n" + c.log_text())
                time.sleep(0.05)
        yield c
    finally:
        for p in reversed(procs):
            _stop(p)


PROMPT = "The carpool left at dawn"
ONE_TOKEN = carpool.SamplingParams(max_tokens=1)
LONG_RUN = carpool.SamplingParams(max_tokens=LONG, ignore_eos=True)


def greedy(**extra):
    return dict(sampling=carpool.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                **extra))


def test_generate(cluster):
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=60) as client:
        result = client.generate(PROMPT, **greedy(logprobs=2))
    assert len(result.tokens) == 12
    assert all(0 <= t < 258 for t in result.token_ids)
    assert all(len(t.top_logprobs) == 2 for t in result.tokens)
    assert result.finish_reason == "length"
    assert result.usage.prompt_tokens == len(PROMPT) + 1  # the byte tokenizer's bytes and BOS
    assert result.usage.completion_tokens == 12
    assert 0 <= result.timings.queue_ms <= result.timings.ttft_ms <= result.timings.total_ms
    # The byte tokenizer: ids below 256 are the text's bytes.
    assert result.text_bytes == bytes(t for t in result.token_ids if t < 256)


def test_sync_stream_matches_the_whole_answer(cluster):
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=60) as client:
        whole = client.generate(PROMPT, **greedy())
        stream = client.stream(PROMPT, **greedy())
        chunks = list(stream)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert sum((c.token_ids for c in chunks), []) == whole.token_ids
    assert b"".join(c.text_bytes for c in chunks) == whole.text_bytes
    assert stream.result.token_ids == whole.token_ids
    assert stream.result.text == whole.text
    assert stream.result.usage.completion_tokens == 12
    assert stream.result.finish_reason == "length"


def test_async_stream_matches_the_whole_answer(cluster):
    async def main():
        async with carpool.AsyncClient(cluster.frontend, api_key=KEY, timeout=60) as client:
            whole = await client.generate([256, 10, 20, 30], **greedy())

            async def one():
                s = client.stream([256, 10, 20, 30], **greedy())
                ids = [t async for c in s for t in c.token_ids]
                return ids, s.result

            streams = await asyncio.gather(*(one() for _ in range(3)))
            return whole, streams

    whole, streams = asyncio.run(asyncio.wait_for(main(), 120))
    assert len(whole.token_ids) == 12
    for ids, result in streams:
        assert ids == whole.token_ids
        assert result.token_ids == whole.token_ids
        assert result.usage.prompt_tokens == 4


def test_typed_errors(cluster):
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=30) as client:
        with pytest.raises(carpool.InvalidArgument) as info:
            client.generate(PROMPT, sampling=carpool.SamplingParams(max_tokens=100000))
        assert info.value.code == "INVALID_ARGUMENT"
        assert "max_tokens" in info.value.message
        with pytest.raises(carpool.PromptTooLong) as info:
            client.generate([1] * MAX_MODEL_LEN, sampling=ONE_TOKEN)
        assert info.value.reason == "prompt_too_long"
        with pytest.raises(carpool.InvalidArgument) as info:
            client.stream([100000], sampling=ONE_TOKEN).wait()
        assert "vocabulary" in info.value.message
        with pytest.raises(carpool.Unauthenticated) as info:
            client.generate(PROMPT, api_key="not-a-key")
        assert info.value.code == "UNAUTHENTICATED"


def test_tenant_quota(cluster):
    # While one request of tenant "one" runs, a second one is refused. synthetic:tiny is fast, so
    # a long request may still end before the second arrives: then try again.
    refused = None
    with carpool.Client(cluster.frontend, api_key=ONE_KEY, timeout=60) as client:
        for _ in range(5):
            with client.stream(PROMPT, sampling=LONG_RUN) as first:
                next(first)
                try:
                    client.generate(PROMPT, sampling=ONE_TOKEN)
                except carpool.TenantQuota as e:
                    refused = e
                    break
        assert refused is not None, "never refused"
        assert refused.code == "RESOURCE_EXHAUSTED"
        assert refused.retry_after_ms > 0
        # Closing the stream cancelled it: the tenant's slot is free again.
        deadline = time.monotonic() + 10
        while True:
            try:
                two = client.generate(PROMPT, sampling=carpool.SamplingParams(max_tokens=2))
                assert len(two.tokens) == 2
                break
            except carpool.TenantQuota:
                assert time.monotonic() < deadline
                time.sleep(0.05)


def test_async_typed_error(cluster):
    async def main():
        async with carpool.AsyncClient(cluster.frontend, api_key=KEY, timeout=30) as client:
            with pytest.raises(carpool.InvalidArgument):
                too_many = carpool.SamplingParams(max_tokens=100000)
                async for _ in client.stream(PROMPT, sampling=too_many):
                    pass

    asyncio.run(asyncio.wait_for(main(), 60))


def test_cancel_mid_stream_frees_the_request(cluster):
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=60) as client:
        for _ in range(5):  # a long request may end before the cancel arrives: try again
            stream = client.stream(PROMPT, sampling=LONG_RUN)
            assert next(stream).index == 0
            if stream.cancel():
                break
            stream.wait()
        else:
            pytest.fail("every stream ended before its cancel")
        with pytest.raises(carpool.Cancelled):
            stream.wait()
        assert stream.result.tokens  # the chunks read before the cancel
        deadline = time.monotonic() + 10
        while True:
            stats = client.stats()
            if stats.inflight == 0 and stats.queued == 0 and stats.workers[0].running == 0:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)


def test_stats(cluster):
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=10) as client:
        stats = client.stats()
    (w,) = stats.workers
    assert w.worker_id == "py-w1"
    assert w.healthy
    assert w.model.endswith("tiny")
    assert w.num_kv_blocks > 0
    assert stats.requests_total >= 1
    assert {t.name for t in stats.tenants} == {"py"}  # a tenant's key sees itself only
    # Without a key, a router with tenants refuses stats at once.
    with carpool.Client(cluster.frontend, timeout=10) as client:
        with pytest.raises(carpool.Unauthenticated):
            client.stats()


def test_embed(cluster):
    texts = ["the carpool left at dawn", "b", "the carpool left at dawn"]
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=60) as client:
        r = client.embed(texts + [[256, 65, 66]], pooling="mean")
        last = client.embed(texts[:1], pooling="last", normalize=False)
        with pytest.raises(carpool.InvalidArgument, match=r"inputs\[1\]"):
            client.embed(["ok", ""])
    assert len(r) == 4
    dim = len(r[0])
    assert dim > 0 and all(len(e) == dim for e in r.embeddings)
    assert r[0] == r[2]                       # same input, same embedding
    assert abs(sum(x * x for x in r[0]) - 1.0) < 1e-4  # normalized by default
    assert r.usage.prompt_tokens == (len(texts[0]) + 1) * 2 + 2 + 3  # BOS on each text
    assert last[0] != r[0]


def test_async_embed_concurrent_calls_match(cluster):
    async def main():
        async with carpool.AsyncClient(cluster.frontend, api_key=KEY, timeout=60) as client:
            inputs = ["input %d" % i for i in range(12)]
            together = await asyncio.gather(*(client.embed(t) for t in inputs))
            alone = [await client.embed(t) for t in inputs]
            return together, alone

    together, alone = asyncio.run(main())
    for a, b in zip(together, alone):
        assert max(abs(x - y) for x, y in zip(a[0], b[0])) <= 1e-5


def test_tokenize_and_detokenize(cluster):
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=60) as client:
        t = client.tokenize("hi")
        assert t.token_ids == [256, 104, 105]  # the byte tokenizer: BOS, then the bytes
        assert t.max_model_len == MAX_MODEL_LEN
        assert client.tokenize("hi", add_special_tokens=False).token_ids == [104, 105]
        assert client.detokenize([256, 104, 105]) == "<|256|>hi"
        assert client.detokenize([256, 104, 105], skip_special_tokens=True) == "hi"
        with pytest.raises(carpool.InvalidArgument):
            client.detokenize([104, 1 << 20])
        with pytest.raises(carpool.UnknownModel):
            client.tokenize("hi", model="no-such-model")


def test_stop_strings_end_the_output_at_the_router(cluster):
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=60) as client:
        whole = client.generate(PROMPT, **greedy())
        printable = [i for i, b in enumerate(whole.text_bytes) if 0x21 <= b <= 0x7E and i > 0]
        if not printable:
            pytest.skip("the greedy output holds no printable ASCII byte to stop at")
        stop = chr(whole.text_bytes[printable[0]])
        at = whole.text_bytes.index(stop.encode())
        cut = client.generate(PROMPT, **greedy(stop=[stop]))
        kept = client.generate(PROMPT, **greedy(stop=stop, include_stop_str_in_output=True))
        streamed = client.stream(PROMPT, **greedy(stop=[stop]))
        chunks = list(streamed)
    assert cut.finish_reason == "stop" and cut.stop_string == stop
    assert cut.text_bytes == whole.text_bytes[:at]
    assert cut.usage.completion_tokens < 12
    assert kept.text_bytes == whole.text_bytes[:at + 1]
    assert streamed.result.stop_string == stop
    assert b"".join(c.text_bytes for c in chunks) == whole.text_bytes[:at]


CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Where does the carpool leave from?"}]


def test_chat_prompt_is_the_tokenized_conversation(cluster):
    # The byte models' built-in template renders the conversation in the router; whatever it
    # writes, chat() must reach the model as exactly the ids tokenize(messages=...) gives.
    with carpool.Client(cluster.frontend, api_key=KEY, timeout=60) as client:
        ids = client.tokenize(messages=CONVERSATION).token_ids
        text = client.detokenize(ids, skip_special_tokens=True)
        assert "Where does the carpool leave from?" in text, text
        ref = client.generate(token_ids=ids, **greedy())
        whole = client.chat(CONVERSATION, **greedy())
        stream = client.chat(CONVERSATION, stream=True, **greedy())
        chunks = list(stream)
        no_prompt = client.tokenize(messages=CONVERSATION, add_generation_prompt=False).token_ids
        with pytest.raises(carpool.InvalidArgument):
            client.chat([{"role": "wizard", "content": "x"}], **greedy())
    assert whole.usage.prompt_tokens == len(ids)
    assert whole.token_ids == ref.token_ids
    assert sum((c.token_ids for c in chunks), []) == ref.token_ids
    assert stream.result.usage.prompt_tokens == len(ids)
    assert no_prompt != ids and len(no_prompt) < len(ids)


def test_async_chat(cluster):
    async def main():
        async with carpool.AsyncClient(cluster.frontend, api_key=KEY, timeout=60) as client:
            ids = (await client.tokenize(messages=CONVERSATION)).token_ids
            ref = await client.generate(token_ids=ids, **greedy())
            got = await client.chat(CONVERSATION, **greedy())
            return ref, got

    ref, got = asyncio.run(asyncio.wait_for(main(), 60))
    assert got.token_ids == ref.token_ids
