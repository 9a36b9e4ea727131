"""OpenAI's response and error shapes, field by field, as the OpenAI SDKs read them (no `openai`
package here: requests, with the bodies those SDKs send, nulls and extra fields included)."""

import base64
import struct
import time

import pytest
import requests

from conftest import BUILT, Cluster
from test_http import MODEL, PROMPT, greedy, post, sse_events

pytestmark = pytest.mark.skipif(not BUILT, reason="carpool binaries not built")

COMPLETION_CHOICE = {"index", "text", "logprobs", "finish_reason"}
USAGE = {"prompt_tokens", "completion_tokens", "total_tokens"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("shapes"))
    try:
        c.add_worker(MODEL, "--max-model-len", "512")
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("shapes-echo"))
    try:
        c.add_worker("echo")
        yield c
    finally:
        c.close()


def check_envelope(body, obj, prefix):
    assert body["object"] == obj
    assert isinstance(body["id"], str) and body["id"].startswith(prefix)
    assert isinstance(body["created"], int) and abs(body["created"] - time.time()) < 120
    assert body["model"] == MODEL


def param_error(resp, param, status=400, code="invalid_argument"):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["param"] == param, err
    assert err["code"] == code and err["message"]
    assert err["type"] == "invalid_request_error"
    return err


# ---- /v1/completions

def test_completion_shape_and_sdk_defaults(cluster):
    # What the SDK sends for unset options: nulls. max_tokens null is OpenAI's default (16).
    body = dict(model=MODEL, prompt=PROMPT, temperature=0, ignore_eos=True, max_tokens=None,
                logprobs=None, stop=None, n=None, best_of=1, echo=False, suffix=None, seed=None,
                user="user-1234", frequency_penalty=0, presence_penalty=0, logit_bias={},
                stream=False, metadata={"k": "v"}, store=False)
    r = post(cluster, "/v1/completions", body)
    assert r.status_code == 200, r.text
    b = r.json()
    check_envelope(b, "text_completion", "cmpl-")
    assert len(b["choices"]) == 1
    choice = b["choices"][0]
    assert set(choice) == COMPLETION_CHOICE
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["logprobs"] is None  # null, not absent, when not asked for
    assert set(b["usage"]) >= USAGE
    assert b["usage"]["completion_tokens"] == 16
    assert b["usage"]["total_tokens"] == b["usage"]["prompt_tokens"] + 16


def test_completion_logprobs_zero_and_top_n(cluster):
    r = post(cluster, "/v1/completions", greedy(prompt=PROMPT, max_tokens=4, logprobs=0))
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 4
    assert all(isinstance(t, str) for t in lp["tokens"])
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"])
    assert lp["top_logprobs"] == [{}, {}, {}, {}]
    three = post(cluster, "/v1/completions", greedy(prompt=PROMPT, max_tokens=3, logprobs=3))
    lp3 = three.json()["choices"][0]["logprobs"]
    # A dict per token: byte tokens that are not UTF-8 on their own all read U+FFFD, so two
    # alternatives can share a key (docs/http.md); never more than the 3 asked for.
    assert len(lp3["top_logprobs"]) == 3
    assert all(1 <= len(t) <= 3 for t in lp3["top_logprobs"])
    assert all(isinstance(v, float) for t in lp3["top_logprobs"] for v in t.values())


def test_completion_stream_chunks(cluster):
    r = post(cluster, "/v1/completions",
             greedy(prompt=PROMPT, max_tokens=6, logprobs=1, stream=True), stream=True)
    events = sse_events(r)
    for e in events:
        check_envelope(e, "text_completion", "cmpl-")
        assert "usage" not in e  # only with stream_options.include_usage
        assert len(e["choices"]) == 1 and set(e["choices"][0]) == COMPLETION_CHOICE
        assert e["choices"][0]["index"] == 0
    assert len({(e["id"], e["created"]) for e in events}) == 1
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    tokens = [t for e in events if e["choices"][0]["logprobs"]
              for t in e["choices"][0]["logprobs"]["tokens"]]
    assert len(tokens) == 6


# ---- /v1/chat/completions

def test_chat_shape(cluster):
    r = post(cluster, "/v1/chat/completions",
             greedy(messages=[{"role": "developer", "content": "Be brief."},
                              {"role": "user", "content": PROMPT, "name": "bob"}],
                    max_tokens=None, max_completion_tokens=5, user="u", tools=[],
                    tool_choice="none", response_format={"type": "text"},
                    parallel_tool_calls=False, logprobs=False, top_logprobs=None))
    assert r.status_code == 200, r.text
    b = r.json()
    check_envelope(b, "chat.completion", "chatcmpl-")
    choice = b["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["logprobs"] is None
    msg = choice["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    assert msg.get("refusal") is None
    assert b["usage"]["completion_tokens"] == 5


def test_chat_logprobs_top_zero(cluster):
    r = post(cluster, "/v1/chat/completions",
             greedy(messages=[{"role": "user", "content": "hi"}], max_tokens=3, logprobs=True))
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for t in content:
        assert set(t) == {"token", "logprob", "bytes", "top_logprobs"}
        assert t["top_logprobs"] == []
        assert bytes(t["bytes"]).decode("utf-8", "replace") == t["token"]


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_stream_chunks(cluster, include_usage):
    body = greedy(messages=[{"role": "user", "content": PROMPT}], max_tokens=8, stream=True,
                  logprobs=True, top_logprobs=2)
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    events = sse_events(post(cluster, "/v1/chat/completions", body, stream=True))
    for e in events:
        check_envelope(e, "chat.completion.chunk", "chatcmpl-")
        assert ("usage" in e) == include_usage
    assert len({(e["id"], e["created"]) for e in events}) == 1
    chunks = [e for e in events if e["choices"]]
    # The role only in the first chunk, content after it.
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["choices"][0]["logprobs"] is None
    for e in chunks[1:]:
        choice = e["choices"][0]
        assert choice["index"] == 0 and "role" not in choice["delta"]
        assert set(choice["delta"]) <= {"content"}
    assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed = [t for e in chunks if e["choices"][0]["logprobs"]
                for t in e["choices"][0]["logprobs"]["content"]]
    assert len(streamed) == 8 and all(len(t["top_logprobs"]) == 2 for t in streamed)
    if include_usage:
        assert all(e["usage"] is None for e in chunks)
        last = events[-1]
        assert last["choices"] == [] and set(last["usage"]) >= USAGE
        assert last["usage"]["completion_tokens"] == 8
    else:
        assert events[-1] is chunks[-1]


def test_stop_as_string_or_list_in_chat(echo):
    # The echo worker answers with its (templated) prompt: "user: alpha STOP beta\nassistant:".
    messages = [{"role": "user", "content": "alpha STOP beta"}]
    base = dict(model="echo", messages=messages, max_tokens=64, temperature=0)
    full = post(echo, "/v1/chat/completions", base).json()["choices"][0]["message"]["content"]
    assert "STOP" in full
    for stop in ("STOP", ["nope", "STOP"]):
        r = post(echo, "/v1/chat/completions", dict(base, stop=stop))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == full[:full.index("STOP")]
        assert choice["finish_reason"] == "stop"


# ---- options carpool cannot honour, and errors

def test_penalties_reach_the_sampler(cluster):
    ok = post(cluster, "/v1/chat/completions",
              greedy(messages=[{"role": "user", "content": "x"}], max_tokens=2,
                     frequency_penalty=0.5, presence_penalty=-0.5))
    assert ok.status_code == 200, ok.text
    # Outside OpenAI's [-2, 2]: the sampler's range check answers, naming the field.
    bad = post(cluster, "/v1/completions", greedy(prompt="x", max_tokens=2, frequency_penalty=5))
    assert bad.status_code == 400, bad.text
    assert "frequency_penalty" in bad.json()["error"]["message"]


@pytest.mark.parametrize("path,extra,param", [
    ("/v1/completions", {"n": 2}, "n"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"suffix": "tail"}, "suffix"),
    ("/v1/completions", {"logit_bias": {"50256": -100}}, "logit_bias"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"max_tokens": "8"}, "max_tokens"),
    ("/v1/completions", {"stop": [1, 2]}, "stop"),
    ("/v1/chat/completions", {"n": 2}, "n"),
    ("/v1/chat/completions", {"logit_bias": {"1": 5}}, "logit_bias"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools[0].function"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}},
     "response_format.type"),
    ("/v1/chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
])
def test_unsupported_options_are_400_naming_the_param(cluster, path, extra, param):
    body = greedy(**extra)
    if path == "/v1/completions":
        body["prompt"] = "x"
    else:
        body["messages"] = [{"role": "user", "content": "x"}]
    param_error(post(cluster, path, body), param)


def test_chat_tools_and_kwargs_reach_the_template(cluster):
    # Tools and chat_template_kwargs go to the model's template (the synthetic model's built-in
    # one ignores them); tool_choice "none" is accepted, and /tokenize with the same fields
    # gives the prompt the completion used.
    fields = dict(messages=[{"role": "user", "content": "x"}],
                  tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
                  chat_template_kwargs={"enable_thinking": False})
    r = post(cluster, "/v1/chat/completions", greedy(tool_choice="none", max_tokens=2, **fields))
    assert r.status_code == 200, r.text
    tok = post(cluster, "/tokenize", dict(model=MODEL, **fields))
    assert tok.status_code == 200, tok.text
    assert tok.json()["count"] == r.json()["usage"]["prompt_tokens"]
    assert bytes(tok.json()["tokens"]) == b"user: x\nassistant:"


def test_error_params(cluster):
    param_error(post(cluster, "/v1/chat/completions",
                     greedy(messages=[{"role": "user", "content": [{"type": "image_url"}]}])),
                "messages[0].content")
    param_error(post(cluster, "/v1/completions", {"model": "gpt-4", "prompt": "x"}), "model",
                status=404, code="model_not_found")
    bad_json = requests.post(cluster.url + "/v1/completions", data="{", timeout=10,
                             headers={"Content-Type": "application/json"})
    param_error(bad_json, None)


# ---- /v1/embeddings and /v1/models

def test_embeddings_float_and_base64(cluster):
    floats = post(cluster, "/v1/embeddings", {"model": MODEL, "input": ["hello", "carpool"]})
    if floats.status_code != 200 and "embed" in floats.text and "cannot" in floats.text:
        pytest.skip("this worker cannot embed: " + floats.text)
    assert floats.status_code == 200, floats.text
    fb = floats.json()
    assert set(fb) == {"object", "data", "model", "usage"}
    assert fb["usage"]["total_tokens"] == fb["usage"]["prompt_tokens"] > 0
    for i, d in enumerate(fb["data"]):
        assert d == {"object": "embedding", "index": i, "embedding": d["embedding"]}
    b64 = post(cluster, "/v1/embeddings", {"model": MODEL, "input": ["hello", "carpool"],
                                           "encoding_format": "base64", "user": "u"})
    assert b64.status_code == 200, b64.text
    for f, b in zip(fb["data"], b64.json()["data"]):
        assert b["object"] == "embedding" and b["index"] == f["index"]
        raw = base64.b64decode(b["embedding"])
        values = struct.unpack("<%df" % (len(raw) // 4), raw)
        assert values == pytest.approx(f["embedding"], rel=1e-6, abs=1e-7)
    param_error(post(cluster, "/v1/embeddings", {"model": MODEL, "input": "x",
                                                 "encoding_format": "int8"}), "encoding_format")
    param_error(post(cluster, "/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 8}),
                "dimensions")


def test_models_list_and_retrieve(cluster):
    models = requests.get(cluster.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list"
    (m,) = models["data"]
    assert set(m) == {"id", "object", "created", "owned_by"}
    assert m["id"] == MODEL and m["object"] == "model" and m["owned_by"] == "carpool"
    assert isinstance(m["created"], int) and 0 < m["created"] <= time.time() + 1
    one = requests.get(cluster.url + "/v1/models/" + MODEL, timeout=10)
    assert one.status_code == 200 and one.json() == m
    param_error(requests.get(cluster.url + "/v1/models/gpt-4", timeout=10), "model", status=404,
                code="model_not_found")
