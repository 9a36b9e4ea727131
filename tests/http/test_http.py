"""The OpenAI-compatible HTTP gateway against a real carpool-router and carpool-workers, with a
real HTTP client (requests). Every cluster runs on 127.0.0.1 and ephemeral ports and is stopped
by its fixture."""

import json
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import BUILT, CLI_BIN, Cluster

pytestmark = pytest.mark.skipif(not BUILT, reason="carpool binaries not built")

MODEL = "synthetic:tiny"
MAX_MODEL_LEN = 512
PROMPT = "The carpool left at dawn"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("main"), ["--http-idle-timeout-ms", "1000"])
    try:
        c.add_worker(MODEL, "--max-model-len", str(MAX_MODEL_LEN))
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("echo"))
    try:
        c.add_worker("echo")
        yield c
    finally:
        c.close()


def post(c, path, body, **kw):
    kw.setdefault("timeout", 60)
    return requests.post(c.url + path, json=body, **kw)


def sse_events(resp):
    """Every event of an SSE response, parsed; asserts the data: framing and the final [DONE]."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events, done = [], False
    for line in resp.iter_lines():
        if not line or line.startswith(b":"):
            continue
        assert line.startswith(b"data: "), line
        data = line[len(b"data: "):]
        if data == b"[DONE]":
            done = True
            continue
        assert not done, "an event after [DONE]"
        events.append(json.loads(data))
    assert done, "no data: [DONE]"
    return events


def greedy(**extra):
    body = dict(model=MODEL, temperature=0, max_tokens=16, ignore_eos=True)
    body.update(extra)
    return body


def error_of(resp, status, code):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == code, err
    assert err["message"] and err["type"]
    return err


# ---- happy paths

def test_health_ready_and_models(cluster):
    assert requests.get(cluster.url + "/health", timeout=10).status_code == 200
    r = requests.get(cluster.url + "/ready", timeout=10)
    assert r.status_code == 200 and r.json()["healthy_workers"] == 1
    models = requests.get(cluster.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["object"] == "model"


def test_completion(cluster):
    r = post(cluster, "/v1/completions", greedy(prompt=PROMPT, max_tokens=8, logprobs=2, seed=7))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert isinstance(choice["text"], str)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 8
    assert all(len(t) == 2 for t in lp["top_logprobs"])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert all(x <= 0 for x in lp["token_logprobs"])
    usage = body["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["prompt_tokens"] >= len(PROMPT)
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    # Token-id prompts, and the same answer again for greedy decoding.
    ids = post(cluster, "/v1/completions", greedy(prompt=[1, 2, 3], max_tokens=4)).json()
    assert ids["usage"]["prompt_tokens"] == 3 and ids["usage"]["completion_tokens"] == 4
    again = post(cluster, "/v1/completions", greedy(prompt=PROMPT, max_tokens=8, logprobs=2))
    assert again.json()["choices"][0]["text"] == choice["text"]


def test_chat_stream_equals_the_whole_answer(cluster):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    whole = post(cluster, "/v1/chat/completions", greedy(messages=messages))
    assert whole.status_code == 200, whole.text
    wb = whole.json()
    assert wb["object"] == "chat.completion"
    assert wb["choices"][0]["message"]["role"] == "assistant"
    content = wb["choices"][0]["message"]["content"]
    assert wb["usage"]["completion_tokens"] == 16

    r = post(cluster, "/v1/chat/completions",
             greedy(messages=messages, stream=True, stream_options={"include_usage": True}),
             stream=True)
    events = sse_events(r)
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == events[0]["id"]
               for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    chunks = [e for e in events if e["choices"]]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in chunks)
    assert text == content
    assert [e["choices"][0]["finish_reason"] for e in chunks][-1] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 16


def test_completion_stream_equals_the_whole_answer(cluster):
    whole = post(cluster, "/v1/completions", greedy(prompt=PROMPT)).json()
    events = sse_events(post(cluster, "/v1/completions", greedy(prompt=PROMPT, stream=True),
                             stream=True))
    assert all(e["object"] == "text_completion" for e in events)
    assert "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_logprobs(cluster):
    r = post(cluster, "/v1/chat/completions",
             greedy(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5,
                    logprobs=True, top_logprobs=3))
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    for t in content:
        assert isinstance(t["token"], str) and t["logprob"] <= 0
        assert isinstance(t["bytes"], list) and len(t["top_logprobs"]) == 3
        # Greedy: the chosen token is the most likely one.
        assert t["top_logprobs"][0]["logprob"] == pytest.approx(t["logprob"])


def test_seeded_sampling_is_reproducible(cluster):
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=0.9, top_k=50,
                seed=1234, ignore_eos=True)
    a = post(cluster, "/v1/completions", body).json()["choices"][0]["text"]
    b = post(cluster, "/v1/completions", body).json()["choices"][0]["text"]
    assert a == b


def test_stop_strings(echo):
    # The echo worker answers with the prompt itself: a readable, known output.
    prompt = "alpha beta STOP gamma delta"
    base = dict(model="echo", prompt=prompt, max_tokens=len(prompt) + 1, temperature=0)
    full = post(echo, "/v1/completions", base).json()["choices"][0]["text"]
    assert "STOP" in full
    expected = full[:full.index("STOP")]
    r = post(echo, "/v1/completions", dict(base, stop=["zzz", "STOP"]))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    events = sse_events(post(echo, "/v1/completions", dict(base, stop="STOP", stream=True),
                             stream=True))
    assert "".join(e["choices"][0]["text"] for e in events) == expected
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_embeddings(cluster):
    r = post(cluster, "/v1/embeddings", {"model": MODEL, "input": ["hello", "carpool"]})
    if r.status_code != 200 and "embed" in r.text and "cannot" in r.text:
        pytest.skip("this worker cannot embed: " + r.text)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    dims = {len(d["embedding"]) for d in body["data"]}
    assert len(dims) == 1 and dims.pop() > 0
    assert body["usage"]["prompt_tokens"] >= len("hello") + len("carpool")
    ids = post(cluster, "/v1/embeddings", {"model": MODEL, "input": [[1, 2, 3]]})
    assert ids.status_code == 200 and len(ids.json()["data"]) == 1


# ---- bad input

def test_bad_requests(cluster):
    url = cluster.url + "/v1/completions"
    bad_json = requests.post(url, data="{not json", timeout=10,
                             headers={"Content-Type": "application/json"})
    error_of(bad_json, 400, "invalid_argument")
    error_of(post(cluster, "/v1/completions", {"model": MODEL, "prompt": 5}), 400,
             "invalid_argument")
    error_of(post(cluster, "/v1/completions", greedy(prompt="x", max_tokens="ten")), 400,
             "invalid_argument")
    error_of(post(cluster, "/v1/completions", greedy(prompt="x", temperature="hot")), 400,
             "invalid_argument")
    n2 = error_of(post(cluster, "/v1/completions", greedy(prompt="x", n=2)), 400,
                  "invalid_argument")
    assert "'n'" in n2["message"]
    error_of(post(cluster, "/v1/completions", {"model": "gpt-4", "prompt": "x"}), 404,
             "model_not_found")
    error_of(post(cluster, "/v1/chat/completions", {"model": MODEL}), 400, "invalid_argument")
    error_of(post(cluster, "/v1/chat/completions", {"model": MODEL, "messages": "hi"}), 400,
             "invalid_argument")
    error_of(post(cluster, "/v1/completions", greedy(prompt="x" * (MAX_MODEL_LEN + 10))), 400,
             "prompt_too_long")
    error_of(post(cluster, "/v1/completions", greedy(prompt="x", temperature=-1)), 400,
             "invalid_argument")
    error_of(requests.get(cluster.url + "/v1/nothing", timeout=10), 404, "not_found")
    # Still serving.
    assert post(cluster, "/v1/completions", greedy(prompt="ok", max_tokens=2)).status_code == 200


def test_huge_body_is_refused(cluster):
    r = requests.post(cluster.url + "/v1/completions", data=b"x" * (2 << 20), timeout=30,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert post(cluster, "/v1/completions", greedy(prompt="ok", max_tokens=2)).status_code == 200


def test_slow_clients_do_not_block_others(cluster):
    host, port = cluster.url[len("http://"):].split(":")
    silent = socket.create_connection((host, int(port)), timeout=10)
    partial = socket.create_connection((host, int(port)), timeout=10)
    partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    try:
        start = time.monotonic()
        r = post(cluster, "/v1/completions", greedy(prompt="ok", max_tokens=2))
        assert r.status_code == 200
        assert time.monotonic() - start < 5
        # The gateway closes both after its idle timeout (1 s here).
        for s in (silent, partial):
            s.settimeout(10)
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            assert not data or data.startswith(b"HTTP/1.1 4") or data.startswith(b"HTTP/1.1 5")
        assert time.monotonic() - start < 8
    finally:
        silent.close()
        partial.close()


def wait_until_freed(cluster, served):
    """The request is gone from the router and the worker's KV blocks are back; the worker did
    not count it as served (cancelled, not finished)."""
    deadline = time.monotonic() + 15
    while True:
        s = cluster.stats()
        if s["inflight"] == 0 and s["workers"][0]["kv_used_blocks"] == 0:
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.1)
    assert s["workers"][0]["requests_served"] == served


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_the_request(make_cluster, stream):
    # synthetic:small decodes slowly enough (hundreds of ms for 900 tokens at the very least)
    # that the request cannot finish, nor sit whole in the socket buffers, before the drop.
    cluster = make_cluster()
    cluster.add_worker("synthetic:small", "--max-model-len", "1024")
    served = cluster.stats()["workers"][0]["requests_served"]
    body = greedy(prompt=PROMPT, max_tokens=900, stream=stream)
    body["model"] = "synthetic:small"
    if stream:
        r = post(cluster, "/v1/completions", body, stream=True)
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        r.close()  # drops the connection mid-stream
    else:
        # The client gives up while the answer is being generated and closes its connection.
        with pytest.raises(requests.exceptions.ReadTimeout):
            post(cluster, "/v1/completions", body, timeout=0.5)
    wait_until_freed(cluster, served)


# ---- overload, draining, auth, readiness

def test_queue_full_is_429_with_retry_after(make_cluster):
    c = make_cluster(["--max-queued-requests", "1", "--http-max-connections", "32"])
    c.add_worker(MODEL, "--max-num-seqs", "1", "--max-model-len", str(MAX_MODEL_LEN))
    body = greedy(prompt=PROMPT, max_tokens=MAX_MODEL_LEN - 64)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: post(c, "/v1/completions", body), range(8)))
    codes = sorted(r.status_code for r in results)
    assert 200 in codes and 429 in codes, codes
    for r in results:
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["code"] == "queue_full"
            assert r.json()["error"]["type"] == "rate_limit_error"


def test_ready_before_a_worker_and_503_while_draining(make_cluster):
    c = make_cluster(["--drain-grace-ms", "20000"])
    assert requests.get(c.url + "/health", timeout=10).status_code == 200
    r = requests.get(c.url + "/ready", timeout=10)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    # synthetic:small: slow enough that the stream below outlasts the checks (with
    # synthetic:tiny it could finish first, and the drained router exit under them).
    c.add_worker("synthetic:small", "--max-model-len", "1024")
    assert requests.get(c.url + "/ready", timeout=10).status_code == 200
    # A long stream keeps the draining router up while a new request is refused.
    body = greedy(prompt=PROMPT, max_tokens=900, stream=True)
    body["model"] = "synthetic:small"
    long_stream = post(c, "/v1/completions", body, stream=True)
    assert long_stream.status_code == 200
    lines = long_stream.iter_lines()
    next(lines)
    c.router.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while True:
        r = post(c, "/v1/completions", dict(greedy(prompt="x", max_tokens=2),
                                            model="synthetic:small"), timeout=10)
        if r.status_code == 503:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.02)
    assert r.json()["error"]["code"] == "draining"
    assert int(r.headers["Retry-After"]) >= 1
    assert requests.get(c.url + "/ready", timeout=10).status_code == 503
    long_stream.close()


def test_api_keys(make_cluster, tmp_path):
    tenants = tmp_path / "tenants.textproto"
    tenants.write_text('tenant { key: "http-key" name: "web" }\n')
    c = make_cluster(["--tenants", str(tenants)])
    c.add_worker("echo")
    body = {"model": "echo", "prompt": "hi", "max_tokens": 2}
    error_of(post(c, "/v1/completions", body), 401, "unauthenticated")
    error_of(post(c, "/v1/completions", body, headers={"Authorization": "Bearer nope"}), 401,
             "unauthenticated")
    ok = post(c, "/v1/completions", body, headers={"Authorization": "Bearer http-key"})
    assert ok.status_code == 200, ok.text


def scrape(c):
    """/metrics parsed by the Prometheus project's own text-format parser: {(name, labels): value}
    with histogram samples under their _bucket/_sum/_count names."""
    from prometheus_client.parser import text_string_to_metric_families

    r = requests.get(c.url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics(cluster):
    post(cluster, "/v1/completions", greedy(prompt="m", max_tokens=1))
    before = scrape(cluster)
    for name in ("carpool_time_to_first_token_seconds", "carpool_e2e_request_latency_seconds",
                 "carpool_request_queue_time_seconds", "carpool_time_per_output_token_seconds",
                 "carpool_batch_size", "carpool_batch_fill_ratio"):
        assert any(k[0] == name + "_count" for k in before), name
    generate = ("carpool_requests_total", (("kind", "generate"),))
    ttft = ("carpool_time_to_first_token_seconds_count", ())
    tokens = ("carpool_generation_tokens_total", ())
    e2e = ("carpool_e2e_request_latency_seconds_count", (("kind", "generate"),))
    http_ok = ("carpool_http_responses_total", (("code", "200"), ("route", "/v1/completions")))
    assert before[generate] >= 1
    assert before[http_ok] >= 1
    assert any(k[0] == "carpool_worker_up" and v == 1 for k, v in before.items()), before
    assert any(k[0] == "carpool_kv_cache_usage_ratio" for k in before)
    for _ in range(3):
        r = post(cluster, "/v1/completions", greedy(prompt="count me", max_tokens=4))
        assert r.status_code == 200, r.text
    error_of(post(cluster, "/v1/completions", greedy(prompt="x" * 4 * MAX_MODEL_LEN)), 400,
             "prompt_too_long")
    after = scrape(cluster)
    assert after[generate] == before[generate] + 4
    assert after[ttft] == before[ttft] + 3
    assert after[e2e] == before[e2e] + 3
    assert after[tokens] == before[tokens] + 12
    assert after[http_ok] == before[http_ok] + 3
    rejected = ("carpool_rejections_total", (("reason", "prompt_too_long"),))
    assert after[rejected] == before.get(rejected, 0) + 1
    # Cumulative buckets end at +Inf with the count.
    inf = ("carpool_time_to_first_token_seconds_bucket", (("le", "+Inf"),))
    assert after[inf] == after[ttft]


def test_status_and_metrics_show_each_workers_dtypes(make_cluster):
    """Issue 17: how each worker stores its weights and KV cache, in `carpool status` and on
    /metrics, and a model in int8 beside one in fp32 both answer."""
    c = make_cluster()
    c.add_worker(MODEL, "--max-model-len", str(MAX_MODEL_LEN), "--quantization", "int8")
    c.add_worker(MODEL, "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-dtype", "float32")
    deadline = time.monotonic() + 30
    while len(c.stats()["workers"]) < 2:
        assert time.monotonic() < deadline, c.log_text()
        time.sleep(0.05)
    dtypes = sorted((w["weight_dtype"], w["kv_cache_dtype"]) for w in c.stats()["workers"])
    int8 = dtypes[1][0]  # "int8 (group G)", G the kernel's default
    assert dtypes == [("fp32", "fp32"), (int8, "bf16")] and int8.startswith("int8 (group "), dtypes
    info = sorted((dict(k[1])["weights"], dict(k[1])["kv_cache"])
                  for k, v in scrape(c).items() if k[0] == "carpool_worker_dtype_info" and v == 1)
    assert info == dtypes
    table = subprocess.run([CLI_BIN, "status", "--router", c.frontend], capture_output=True,
                           text=True, timeout=30, check=True).stdout
    assert int8 + "/bf16" in table and "fp32/fp32" in table, table
    for _ in range(4):  # round-robin or least-loaded: both workers are asked
        r = post(c, "/v1/completions", greedy(prompt=PROMPT, max_tokens=4))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4


def test_embed_batcher_metrics(cluster):
    """The workers' embedding batchers reach /metrics through their heartbeats (every 200 ms)."""
    answered = ("carpool_embed_inputs_total", (("outcome", "answered"),))
    batches = ("carpool_embed_batches_total", ())
    waits = ("carpool_embed_queue_waits_total", ())
    sizes = ("carpool_embed_batch_size_count", ())

    def settled():
        # Earlier tests' embeds may still be on their way in a heartbeat.
        last = scrape(cluster)
        for _ in range(20):
            time.sleep(0.5)
            now = scrape(cluster)
            if now[answered] == last[answered] and now[batches] == last[batches]:
                return now
            last = now
        return last

    before = settled()
    for key in (answered, batches, waits, sizes, ("carpool_embed_refusals_total", ()),
                ("carpool_embed_timeouts_total", ()), ("carpool_embed_queue_wait_seconds_total", ()),
                ("carpool_embed_batch_fill_ratio_count", ()),
                ("carpool_embed_inputs_total", (("outcome", "failed"),)),
                ("carpool_embed_inputs_total", (("outcome", "cancelled"),))):
        assert key in before, key
    inputs = 0
    for batch in (["one", "two", "three"], ["four"], [[1, 2, 3], [4, 5]]):
        r = post(cluster, "/v1/embeddings", {"model": MODEL, "input": batch})
        if r.status_code != 200 and "embed" in r.text and "cannot" in r.text:
            pytest.skip("this worker cannot embed: " + r.text)
        assert r.status_code == 200, r.text
        inputs += len(batch)
    deadline = time.monotonic() + 10
    after = scrape(cluster)
    while after[answered] < before[answered] + inputs and time.monotonic() < deadline:
        time.sleep(0.1)
        after = scrape(cluster)
    # Once more: the scrape that saw the inputs may have raced the rest of that heartbeat's update.
    after = scrape(cluster)
    assert after[answered] == before[answered] + inputs
    assert after[batches] > before[batches]
    assert after[waits] == before[waits] + inputs
    assert after[sizes] > before[sizes]
