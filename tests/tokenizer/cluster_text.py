"""Text through a real cluster (issue 13, "A cluster test"): a random Llama with Llama 3's
vocabulary (128,256 ids) and the real Llama 3 tokenizer.json beside it, served by one
carpool-router (ZeroMQ and --http) and one carpool-worker on 127.0.0.1, checked against the
Hugging Face `tokenizers` library (cluster_reference.js):

- the router's Tokenize (Python SDK tokenize, HTTP POST /tokenize) gives exactly the library's ids,
  and Detokenize (SDK detokenize, POST /detokenize) the library's decode;
- a text prompt through the CLI (`carpool generate --router`), the SDK and /v1/completions reaches
  the model as the library's ids: usage.prompt_tokens is the library's count and the greedy output
  equals that of the library's ids sent as token ids (no API returns the prompt ids; on random
  weights any other prompt would give other tokens);
- streamed text (SDK stream, SSE) and whole text equal the library's decode of the returned ids,
  with skip_special_tokens on and off (the checkpoint makes greedy decoding emit a special token);
- a stop string taken from the middle of a greedy output ends the output right before it (or
  after it with include_stop_str_in_output), finish_reason "stop", the ids up to the token that
  completed it, and the worker's KV blocks are back to 0 at once (it was told to finish; it would
  otherwise run for ~2,000 tokens);
- a text prompt that is not UTF-8 gets INVALID_ARGUMENT naming the byte offset; a prompt longer
  than max_model_len is refused prompt_too_long with the library's token count.

Run by run_cluster_text.sh (ctest: tokenizer_cluster_text), which installs the library with npm;
skipped only when npm cannot reach its registry.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
import llama3_checkpoint  # noqa: E402
from processes import stop, wait_for_log  # noqa: E402

import carpool  # noqa: E402  (client/python and its generated carpool_pb2: PYTHONPATH)

BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
NPM_DIR = os.environ.get("CARPOOL_TOKENIZER_NPM_DIR") or os.path.join(REPO, "build",
                                                                      "tokenizer-npm")
TOKENIZER_DIR = os.path.join(NPM_DIR, "node_modules", "@lenml", "tokenizer-llama3", "models")

MAX_MODEL_LEN = llama3_checkpoint.MAX_POSITIONS
SPECIAL_ID = 128006  # <|start_header_id|>: special, and not an end-of-sequence id
SPECIAL_TEXT = "<|start_header_id|>"
# Greedy decoding emits SPECIAL_ID right after this prompt's last token (llama3_checkpoint).
TRIGGER_PROMPT = "The secret word is xylophone"

PROMPTS = [
    "The carpool left at dawn, and nobody said a word.",
    "<|begin_of_text|>Hello<|eot_id|> world <|start_header_id|>user<|end_header_id|>\n\nHi",
    "Numbers: 1 12 123 1234 12345 123456 3.14159 -42 1e10 0x1F",
    "  leading spaces\n\n\ttabs\r\n  and   runs   of   spaces   \n",
    "Emoji \U0001F469\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 \U0001F44D\U0001F3FD, CJK "
    "\u6c49\u5b57\u304b\u306a\u30ab\u30ca \ud55c\uad6d\uc5b4, Arabic \u0627\u0644\u0639\u0631"
    "\u0628\u064a\u0629, Hindi \u0939\u093f\u0928\u094d\u0926\u0940, caf\u00e9 nai\u0308ve",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": None}  # code\n",
    "I'm sure you're right, they've said it's OK. DON'T STOP, WE'LL GO",
]

GREEDY = dict(temperature=0, ignore_eos=True)


class Library:
    """The Hugging Face tokenizers library on the Llama 3 tokenizer.json, in one node process."""

    def __init__(self, tokenizer_json):
        self.proc = subprocess.Popen(
            ["node", os.path.join(HERE, "cluster_reference.js"),
             os.path.join(NPM_DIR, "node_modules"), tokenizer_json],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            encoding="utf-8")
        first = self.proc.stdout.readline()
        if not first:
            raise RuntimeError("the reference library did not start:\n" + self.proc.stderr.read())
        self.vocab_size = json.loads(first)["vocab_size"]

    def _ask(self, request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError("the library refused %r: %s" % (request, answer["error"]))
        return answer

    def encode(self, text, add_special_tokens=True):
        return self._ask({"encode": text, "add_special_tokens": add_special_tokens})["ids"]

    def decode(self, ids, skip_special_tokens):
        return self._ask({"decode": list(ids), "skip_special_tokens": skip_special_tokens})["text"]

    def close(self):
        self.proc.stdin.close()
        stop(self.proc)


class Cluster:
    """carpool-router (ZeroMQ frontend and --http) and one carpool-worker serving `model_dir`."""

    def __init__(self, tmp, model_dir):
        self.tmp = tmp
        self.procs, self.logs = [], []
        router_log = self._log("router.log")
        with open(router_log, "w") as log:
            self.procs.append(subprocess.Popen(
                [os.path.join(BIN_DIR, "carpool-router"), "--frontend", "tcp://127.0.0.1:*",
                 "--backend", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        m = wait_for_log(router_log, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", 15)
        h = wait_for_log(router_log, r"http gateway listening on (http://127\.0\.0\.1:\d+)", 15)
        if m is None or h is None:
            self.fail("the router did not start")
        self.frontend, self.backend, self.url = m.group(1), m.group(2), h.group(1)
        worker_log = self._log("worker.log")
        with open(worker_log, "w") as log:
            # Prefix caching off: every request computes its prompt the same way, so greedy
            # decoding of the same ids gives the same tokens bit for bit.
            self.worker = subprocess.Popen(
                [os.path.join(BIN_DIR, "carpool-worker"), "--router", self.backend,
                 "--model", model_dir, "--threads", "1", "--no-enable-prefix-caching"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(self.worker)
        deadline = time.monotonic() + 60
        while requests.get(self.url + "/ready", timeout=5).status_code != 200:
            if time.monotonic() > deadline or self.worker.poll() is not None:
                self.fail("the worker did not register")
            time.sleep(0.05)
        self.client = carpool.Client(self.frontend, timeout=30)

    def _log(self, name):
        path = str(self.tmp / name)
        self.logs.append(path)
        return path

    def log_text(self):
        out = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                out.append("==> %s\n%s" % (os.path.basename(path), f.read()[-4000:]))
        return "\n".join(out)

    def fail(self, what):
        text = self.log_text()
        self.close()
        pytest.fail("%s:\n%s" % (what, text))

    def cli(self, *args, check=True):
        out = subprocess.run([os.path.join(BIN_DIR, "carpool")] + list(args),
                             capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            pytest.fail("carpool %s exited %d:\n%s%s" % (" ".join(args), out.returncode,
                                                       out.stdout, out.stderr))
        return out

    def cli_generate(self, prompt, *args):
        out = self.cli("generate", "--router", self.frontend, "--prompt=" + prompt, "--json",
                       "--temperature", "0", "--ignore-eos", *args)
        return json.loads(out.stdout)

    def post(self, path, body):
        return requests.post(self.url + path, json=body, timeout=60)

    def worker_stats(self):
        workers = self.client.stats().workers
        assert len(workers) == 1, workers
        return workers[0]

    def wait_kv_free(self, what, timeout=1.5):
        """Waits for the worker to hold no sequence and no KV block (its heartbeats come every
        200 ms); fails naming `what` after `timeout` seconds."""
        start = time.monotonic()
        while True:
            w = self.worker_stats()
            if w.kv_used_blocks == 0 and w.running == 0:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                pytest.fail("%s: the worker still holds %d KV blocks and %d running sequences "
                            "%.1f s after the answer (it was not told to finish)"
                            % (what, w.kv_used_blocks, w.running, timeout))
            time.sleep(0.02)

    def close(self):
        if getattr(self, "client", None) is not None:
            self.client.close()
        for p in reversed(self.procs):
            stop(p)


@pytest.fixture(scope="module")
def library():
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(TOKENIZER_DIR, name)):
            setup = subprocess.run(["bash", os.path.join(HERE, "npm_setup.sh"), NPM_DIR],
                                   capture_output=True, text=True)
            if setup.returncode == 77:
                pytest.skip("npm cannot reach its registry: " + setup.stderr.strip())
            assert setup.returncode == 0, "npm_setup.sh failed:\n" + setup.stderr
            break
    lib = Library(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    assert lib.vocab_size == llama3_checkpoint.VOCAB_SIZE
    yield lib
    lib.close()


@pytest.fixture(scope="module")
def cluster(library, tmp_path_factory):
    for name in ("carpool", "carpool-router", "carpool-worker"):
        path = os.path.join(BIN_DIR, name)
        assert os.access(path, os.X_OK), "%s is not built" % path
    tmp = tmp_path_factory.mktemp("cluster_text")
    trigger_id = library.encode(TRIGGER_PROMPT)[-1]
    model_dir = llama3_checkpoint.write(str(tmp / "llama3-random"), TOKENIZER_DIR, trigger_id,
                                        SPECIAL_ID)
    c = Cluster(tmp, model_dir)
    yield c
    c.close()


def sampling(**kwargs):
    return carpool.SamplingParams(**dict(GREEDY, **kwargs))


def ids_of_logprobs(logprobs):
    """The token ids of a completions `logprobs` object ("token_id:N" strings)."""
    ids = []
    for token in logprobs["tokens"]:
        assert token.startswith("token_id:"), token
        ids.append(int(token[len("token_id:"):]))
    return ids


def sse_completion(cluster, body):
    """Streams /v1/completions; returns (text chunks, token ids, finish_reason, usage)."""
    body = dict(body, stream=True, logprobs=0, stream_options={"include_usage": True})
    texts, ids, finish, usage = [], [], None, None
    with requests.post(cluster.url + "/v1/completions", json=body, stream=True,
                       timeout=60) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=False):
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):]
            if data == b"[DONE]":
                break
            event = json.loads(data)
            assert "error" not in event, event
            if event.get("usage"):
                usage = event["usage"]
            for choice in event["choices"]:
                texts.append(choice["text"])
                if choice.get("logprobs"):
                    ids += ids_of_logprobs(choice["logprobs"])
                if choice["finish_reason"] is not None:
                    finish = choice["finish_reason"]
    return texts, ids, finish, usage


# ---- Tokenize and Detokenize


def test_tokenize_gives_the_library_ids(cluster, library):
    bad = []
    for text in PROMPTS + [TRIGGER_PROMPT]:
        for add in (True, False):
            want = library.encode(text, add)
            got = cluster.client.tokenize(text, add_special_tokens=add)
            if got.token_ids != want or got.max_model_len != MAX_MODEL_LEN:
                bad.append("SDK tokenize(%r, add_special_tokens=%s): %s (max_model_len %d), "
                           "library %s" % (text, add, got.token_ids, got.max_model_len, want))
            r = cluster.post("/tokenize", {"prompt": text, "add_special_tokens": add})
            body = r.json()
            if (r.status_code != 200 or body.get("tokens") != want
                    or body.get("count") != len(want)
                    or body.get("max_model_len") != MAX_MODEL_LEN):
                bad.append("POST /tokenize %r add_special_tokens=%s: %d %s, library %s"
                           % (text, add, r.status_code, body, want))
    assert not bad, "\n".join(bad)


def test_detokenize_gives_the_library_text(cluster, library):
    bad = []
    lists = [library.encode(t) for t in PROMPTS]
    lists.append([SPECIAL_ID, 9906, 128000, 1917, 128009])
    lists.append([1202, 245, 17, 94])  # byte-level pieces that need not form UTF-8 alone
    for ids in lists:
        for skip in (False, True):
            want = library.decode(ids, skip)
            got = cluster.client.detokenize(ids, skip_special_tokens=skip)
            if got != want:
                bad.append("SDK detokenize(%s, skip_special_tokens=%s): %r, library %r"
                           % (ids, skip, got, want))
        r = cluster.post("/detokenize", {"tokens": ids})
        want = library.decode(ids, False)
        if r.status_code != 200 or r.json().get("prompt") != want:
            bad.append("POST /detokenize %s: %d %s, library %r" % (ids, r.status_code, r.text,
                                                                   want))
    assert not bad, "\n".join(bad)


# ---- text prompts through every front end


def test_text_prompts_reach_the_model_as_the_library_ids(cluster, library):
    bad = []
    n = 6
    for text in PROMPTS:
        for add in (True, False):
            want = library.encode(text, add)
            # What the model makes of the library's ids, sent as ids.
            ref = cluster.client.generate(token_ids=want, sampling=sampling(max_tokens=n))
            assert ref.usage.prompt_tokens == len(want)

            got = cluster.client.generate(text, add_bos=add, sampling=sampling(max_tokens=n))
            if got.usage.prompt_tokens != len(want) or got.token_ids != ref.token_ids:
                bad.append("SDK generate(%r, add_bos=%s): prompt_tokens %d, output %s; the "
                           "library's %d ids give %s" % (text, add, got.usage.prompt_tokens,
                                                         got.token_ids, len(want), ref.token_ids))

            flag = "--add-bos" if add else "--no-add-bos"
            out = cluster.cli_generate(text, "--max-tokens", str(n), flag)
            if out["usage"]["prompt_tokens"] != len(want) or out["tokens"] != ref.token_ids:
                bad.append("carpool generate --prompt %r %s: prompt_tokens %d, output %s; the "
                           "library's %d ids give %s" % (text, flag, out["usage"]["prompt_tokens"],
                                                         out["tokens"], len(want), ref.token_ids))
            if add:  # /v1/completions adds the special tokens, as vLLM does
                r = cluster.post("/v1/completions", {"prompt": text, "max_tokens": n,
                                                     "temperature": 0, "ignore_eos": True,
                                                     "logprobs": 0})
                assert r.status_code == 200, r.text
                body = r.json()
                ids = ids_of_logprobs(body["choices"][0]["logprobs"])
                if body["usage"]["prompt_tokens"] != len(want) or ids != ref.token_ids:
                    bad.append("/v1/completions %r: prompt_tokens %d, output %s; the library's "
                               "%d ids give %s" % (text, body["usage"]["prompt_tokens"], ids,
                                                   len(want), ref.token_ids))
    assert not bad, "\n".join(bad)


# ---- output text


def test_streamed_and_whole_text_is_the_library_decode(cluster, library):
    bad = []
    saw_special = False
    for text in [TRIGGER_PROMPT] + PROMPTS[:3]:
        for skip in (True, False):
            params = sampling(max_tokens=24, skip_special_tokens=skip)
            where = "%r skip_special_tokens=%s" % (text, skip)

            stream = cluster.client.stream(text, sampling=params)
            chunks = list(stream)
            ids = [t for c in chunks for t in c.token_ids]
            want = library.decode(ids, skip)
            saw_special |= SPECIAL_ID in ids
            for c in chunks:
                try:
                    c.text_bytes.decode("utf-8")
                except UnicodeDecodeError:
                    bad.append("SDK stream %s: chunk at %d is not UTF-8 alone: %r"
                               % (where, c.index, c.text_bytes))
            joined = "".join(c.text for c in chunks)
            if joined != want or stream.result.text != want:
                bad.append("SDK stream %s: chunks %r, result %r; library decode of %s: %r"
                           % (where, joined, stream.result.text, ids, want))

            whole = cluster.client.generate(text, sampling=params)
            if whole.token_ids != ids or whole.text != library.decode(whole.token_ids, skip):
                bad.append("SDK generate %s: %s %r; library %r (streamed ids %s)"
                           % (where, whole.token_ids, whole.text,
                              library.decode(whole.token_ids, skip), ids))

            texts, sse_ids, finish, usage = sse_completion(
                cluster, {"prompt": text, "max_tokens": 24, "temperature": 0,
                          "ignore_eos": True, "skip_special_tokens": skip})
            if "".join(texts) != library.decode(sse_ids, skip) or finish != "length":
                bad.append("SSE %s: %r (finish %s); library decode of %s: %r"
                           % (where, "".join(texts), finish, sse_ids,
                              library.decode(sse_ids, skip)))

            out = cluster.cli_generate(text, "--max-tokens", "24",
                                       "--skip-special-tokens" if skip else
                                       "--no-skip-special-tokens")
            if out["text"] != library.decode(out["tokens"], skip):
                bad.append("carpool generate %s: %r; library decode of %s: %r"
                           % (where, out["text"], out["tokens"],
                              library.decode(out["tokens"], skip)))
    assert saw_special, ("the checkpoint did not make greedy decoding emit %d after %r: "
                         "skip_special_tokens went untested" % (SPECIAL_ID, TRIGGER_PROMPT))
    assert not bad, "\n".join(bad)


# ---- stop strings


def pick_stop(text):
    """A 4-character stop string from the middle of `text`: no U+FFFD, not only spaces, first
    occurring after the start."""
    for start in list(range(len(text) // 2, len(text) - 4)) + list(range(1, len(text) // 2)):
        s = text[start:start + 4]
        if "\ufffd" not in s and s.strip() and text.find(s) > 0:
            return s
    pytest.fail("no stop string to take from %r" % text)


def test_stop_string_ends_the_output_and_frees_the_worker(cluster, library):
    prompt = "Write a poem about the sea."
    prompt_ids = library.encode(prompt)
    ref = cluster.client.generate(prompt, sampling=sampling(max_tokens=32))
    text = ref.text
    assert text == library.decode(ref.token_ids, True)
    stop_str = pick_stop(text)
    at = text.find(stop_str)
    # The output ends with the token whose text completes the first occurrence.
    k = next(i for i in range(1, len(ref.token_ids) + 1)
             if stop_str in library.decode(ref.token_ids[:i], True))
    want_ids = ref.token_ids[:k]
    # Without the stop, the worker would generate this many tokens (seconds of work).
    long_run = MAX_MODEL_LEN - len(prompt_ids) - 1
    where = "stop %r in %r" % (stop_str, text)
    bad = []

    got = cluster.client.generate(prompt, sampling=sampling(max_tokens=long_run, stop=[stop_str]))
    if (got.text != text[:at] or got.finish_reason != "stop" or got.stop_string != stop_str
            or got.token_ids != want_ids or got.usage.completion_tokens != k):
        bad.append("SDK generate, %s: text %r, finish %r, stop_string %r, ids %s (%d); want %r, "
                   "stop, ids %s" % (where, got.text, got.finish_reason, got.stop_string,
                                     got.token_ids, got.usage.completion_tokens, text[:at],
                                     want_ids))
    cluster.wait_kv_free("SDK generate with a stop string")

    stream = cluster.client.stream(prompt, sampling=sampling(
        max_tokens=long_run, stop=[stop_str], include_stop_str_in_output=True))
    joined = "".join(c.text for c in stream)
    r = stream.result
    if joined != text[:at + len(stop_str)] or r.finish_reason != "stop" or r.stop_string != stop_str:
        bad.append("SDK stream with include_stop_str_in_output, %s: %r, finish %r, stop_string "
                   "%r; want %r" % (where, joined, r.finish_reason, r.stop_string,
                                    text[:at + len(stop_str)]))
    cluster.wait_kv_free("SDK stream with a stop string")

    texts, ids, finish, usage = sse_completion(
        cluster, {"prompt": prompt, "max_tokens": long_run, "temperature": 0,
                  "ignore_eos": True, "stop": stop_str})
    if "".join(texts) != text[:at] or finish != "stop" or ids != want_ids:
        bad.append("SSE /v1/completions, %s: %r, finish %r, ids %s; want %r, stop, ids %s"
                   % (where, "".join(texts), finish, ids, text[:at], want_ids))
    cluster.wait_kv_free("SSE with a stop string")

    r = cluster.post("/v1/completions", {"prompt": prompt, "max_tokens": long_run,
                                         "temperature": 0, "ignore_eos": True,
                                         "stop": [stop_str]})
    body = r.json()
    if (r.status_code != 200 or body["choices"][0]["text"] != text[:at]
            or body["choices"][0]["finish_reason"] != "stop"
            or body["usage"]["completion_tokens"] != k):
        bad.append("/v1/completions, %s: %d %s; want %r, stop, %d tokens"
                   % (where, r.status_code, body, text[:at], k))
    cluster.wait_kv_free("/v1/completions with a stop string")

    out = cluster.cli_generate(prompt, "--max-tokens", str(long_run), "--stop=" + stop_str)
    if (out["text"] != text[:at] or out["finish_reason"] != "stop"
            or out.get("stop_string") != stop_str or out["tokens"] != want_ids):
        bad.append("carpool generate --stop, %s: %s; want %r, stop, ids %s"
                   % (where, out, text[:at], want_ids))
    cluster.wait_kv_free("carpool generate --stop")
    assert not bad, "\n".join(bad)


# ---- bad input


@pytest.mark.parametrize("prompt,offset", [
    (b"caf\xc3\xa9 \xff tail", 6),  # a byte that never starts a sequence
    (b"ok \xe2\x82", 3),            # a sequence cut short at the end
    (b"\xed\xa0\x80 surrogate", 0),  # an encoded surrogate
])
def test_text_that_is_not_utf8_is_refused_with_its_offset(cluster, prompt, offset):
    with pytest.raises(carpool.errors.InvalidArgument) as e:
        cluster.client.generate(prompt, sampling=sampling(max_tokens=2))
    assert e.value.code == "INVALID_ARGUMENT", repr(e.value)
    assert "at byte %d" % offset in e.value.message, repr(e.value)
    with pytest.raises(carpool.errors.InvalidArgument) as e:
        cluster.client.tokenize(prompt)
    assert "at byte %d" % offset in e.value.message, repr(e.value)
    cluster.wait_kv_free("after a refused prompt")


def test_prompt_longer_than_the_model_is_refused_with_its_token_count(cluster, library):
    text = "The carpool left at dawn. " * 400
    n = len(library.encode(text))
    assert n > MAX_MODEL_LEN
    with pytest.raises(carpool.errors.PromptTooLong) as e:
        cluster.client.generate(text, add_bos=True, sampling=sampling(max_tokens=1))
    assert e.value.reason == "prompt_too_long", repr(e.value)
    assert str(n) in e.value.message and str(MAX_MODEL_LEN) in e.value.message, repr(e.value)

    r = cluster.post("/v1/completions", {"prompt": text, "max_tokens": 1})
    assert r.status_code == 400, r.text
    assert str(n) in r.json()["error"]["message"], r.text

    out = cluster.cli("generate", "--router", cluster.frontend, "--prompt=" + text,
                      "--max-tokens", "1", check=False)
    assert out.returncode != 0 and "prompt_too_long" in out.stderr and str(n) in out.stderr, (
        out.returncode, out.stderr)
