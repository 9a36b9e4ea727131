"""End to end (issue 14, "How it is checked"): the official OpenAI Node SDK's
chat.completions.create against a carpool cluster serving a random Llama with the Llama 3.1
vocabulary and its real tokenizer.json and tokenizer_config.json (whose chat_template is the
model's template), checked against Jinja2 as transformers configures it (jinja_reference.py) and
the Hugging Face `tokenizers` library (tests/tokenizer/cluster_reference.js):

- for every conversation (system + user, multi-turn, unicode and whitespace the template trims,
  tools with tool_choice "none", chat_template_kwargs, add_generation_prompt off; and, through a
  router started with --chat-template set to Qwen3's template, tool definitions with non-ASCII
  text, tool calls and results, reasoning content and enable_thinking), the prompt the
  router built is Jinja2's rendering tokenized by the library with add_special_tokens=false: seen
  as usage.prompt_tokens of the SDK's create (whole and streamed), as the ids of POST /tokenize with
  the same messages, and as the Python SDK's tokenize(messages=...); and the model got exactly
  those ids: the greedy output of create (and of the Python SDK's chat) equals that of the
  library's ids sent as token ids (on random weights any other prompt gives other tokens);
- a streamed create's deltas add up to the whole create's text, with usage in its last chunk;
- bad input through the cluster: an unknown role and a content part whose text is not a string
  are 400; a second router started with --chat-template FILE (the Llama 3.1 template plus three
  hostile branches) answers its normal conversations with the override's rendering, a template
  that calls raise_exception with 400 and the template's message, a template that would loop for
  minutes with 400 within --chat-template-timeout-ms while normal requests to the same router are
  served meanwhile, and a template that writes megabytes with 400; a model whose folder has no
  chat template answers chat requests 400 saying so, and text requests as before.

Run by run_e2e_openai.sh (ctest: chat_template_e2e_openai), which installs the npm packages;
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
sys.path.insert(0, os.path.join(REPO, "tests", "tokenizer"))
sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
import jinja_reference  # noqa: E402
import llama3_checkpoint  # noqa: E402
from cluster_text import Library  # noqa: E402  (the tokenizers library, one node process)
from processes import stop, wait_for_log  # noqa: E402

import carpool  # noqa: E402  (client/python and its generated carpool_pb2: PYTHONPATH)

BIN_DIR = os.environ.get("CARPOOL_BIN_DIR") or os.path.join(REPO, "build", "bin")
NPM_DIR = os.environ.get("CARPOOL_TOKENIZER_NPM_DIR") or os.path.join(REPO, "build",
                                                                      "tokenizer-npm")
MODULES = os.path.join(NPM_DIR, "node_modules")
TOKENIZER_DIR = os.path.join(MODULES, "@lenml", "tokenizer-llama3_1", "models")

MAX_TOKENS = 6
TIMEOUT_MS = 2000  # the second router's --chat-template-timeout-ms
RAISE_TRIGGER = "please raise"
RAISE_MESSAGE = "carpool e2e: this template refuses the conversation"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

# (name, messages, extra body fields of the create, and of /tokenize and the Python SDK)
CONVERSATIONS = [
    ("system and user",
     [{"role": "system", "content": "You are a terse assistant."},
      {"role": "user", "content": "Where does the carpool leave from?"}], {}),
    ("user only", [{"role": "user", "content": "Hello!"}], {}),
    ("multi-turn",
     [{"role": "system", "content": "Answer in one line."},
      {"role": "user", "content": "What is 2 + 2?"},
      {"role": "assistant", "content": "4."},
      {"role": "user", "content": "And times 3?"}], {}),
    ("unicode and whitespace the template trims",
     [{"role": "user", "content": "  Gr\u00fc\u00dfe, \u4e16\u754c \U0001F44B\U0001F3FD\n\n"},
      {"role": "assistant", "content": " caf\u00e9 na\u00efve\t"},
      {"role": "user", "content": "\u0645\u0631\u062d\u0628\u0627 <|eot_id|> literal"}], {}),
    ("tools with tool_choice none",
     [{"role": "system", "content": "Use tools when they help."},
      {"role": "user", "content": "Weather in Lisbon?"}],
     {"tools": TOOLS, "tool_choice": "none"}),
    ("chat_template_kwargs, no generation prompt",
     [{"role": "user", "content": "Continue: the road was long"}],
     {"chat_template_kwargs": {"enable_thinking": False, "note": "ignored by this template"},
      "add_generation_prompt": False}),
]

QWEN3_CONFIG = os.path.join(MODULES, "@lenml", "tokenizer-qwen3", "models",
                            "tokenizer_config.json")
WEATHER_CALL = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Lisbon\"}"}}
TOOLS_FR = [{"type": "function", "function": {
    "name": "get_weather", "description": "La m\u00e9t\u00e9o d'une ville",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]

# Conversations for Qwen3's template (a third router's --chat-template; the vocabulary stays
# Llama 3.1's): tool definitions, tool calls and results, reasoning content, enable_thinking.
QWEN3_CONVERSATIONS = [
    ("qwen3: tools and a system prompt",
     [{"role": "system", "content": "You help with the weather."},
      {"role": "user", "content": "Weather in Lisbon?"}],
     {"tools": TOOLS_FR, "tool_choice": "none"}),
    ("qwen3: a tool call and its result",
     [{"role": "user", "content": "Weather in Lisbon?"},
      {"role": "assistant", "content": "", "tool_calls": [WEATHER_CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}],
     {"tools": TOOLS_FR}),
    ("qwen3: reasoning content in an earlier turn, thinking off",
     [{"role": "user", "content": "2 + 2?"},
      {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
      {"role": "user", "content": "And 3 + 3?"}],
     {"chat_template_kwargs": {"enable_thinking": False}}),
    ("qwen3: a think block in the content",
     [{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"}],
     {"add_generation_prompt": False}),
]

# The second router's --chat-template: the model's template behind three hostile branches.
HOSTILE_PREFIX = (
    "{% if spin is defined and spin %}"
    "{% set s = 'ab' * 100000 %}"
    "{% for i in range(1000) %}{% for j in range(1000) %}"
    "{% set t = s | replace('a', 'c') %}"
    "{% endfor %}{% endfor %}"
    "{% endif %}"
    "{% if flood is defined and flood %}"
    "{% for i in range(1000) %}{{ 'x' * 20000 }}{% endfor %}"
    "{% endif %}"
    "{% for m in messages %}{% if m['content'] == '" + RAISE_TRIGGER + "' %}"
    "{{ raise_exception('" + RAISE_MESSAGE + "') }}"
    "{% endif %}{% endfor %}")


class OpenAINode:
    """The openai npm package driven from Python (e2e_openai.js)."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["node", os.path.join(HERE, "e2e_openai.js"), MODULES],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            encoding="utf-8")
        first = self.proc.stdout.readline()
        if not first:
            raise RuntimeError("the openai SDK did not load:\n" + self.proc.stderr.read())
        self.version = json.loads(first)["version"]

    def ask(self, request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("e2e_openai.js exited:\n" + self.proc.stderr.read())
        answer = json.loads(line)
        if "error" in answer and "ok" not in answer:
            raise RuntimeError("e2e_openai.js: %s" % answer["error"])
        return answer

    def models(self, base_url):
        return self.ask({"models": base_url})["ids"]

    def create(self, base_url, body):
        return self.ask({"create": body, "base_url": base_url})

    def parallel(self, requests_):
        return self.ask({"parallel": requests_})["results"]

    def close(self):
        self.proc.stdin.close()
        stop(self.proc)


class Cluster:
    """carpool-router (ZeroMQ frontend and --http, with `router_args`) and one carpool-worker
    serving `model_dir`."""

    def __init__(self, tmp, name, model_dir, router_args=()):
        self.procs, self.logs = [], []
        self.tmp, self.name = tmp, name
        router_log = self._log("router.log")
        with open(router_log, "w") as log:
            self.procs.append(subprocess.Popen(
                [os.path.join(BIN_DIR, "carpool-router"), "--frontend", "tcp://127.0.0.1:*",
                 "--backend", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0"] + list(router_args),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        m = wait_for_log(router_log, r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)", 15)
        h = wait_for_log(router_log, r"http gateway listening on (http://127\.0\.0\.1:\d+)", 15)
        if m is None or h is None:
            self.fail("the router did not start")
        self.frontend, backend, self.url = m.group(1), m.group(2), h.group(1)
        self.base_url = self.url + "/v1"
        worker_log = self._log("worker.log")
        with open(worker_log, "w") as log:
            # Prefix caching off: every request computes its prompt the same way, so greedy
            # decoding of the same ids gives the same tokens bit for bit.
            self.procs.append(subprocess.Popen(
                [os.path.join(BIN_DIR, "carpool-worker"), "--router", backend,
                 "--model", model_dir, "--threads", "1", "--no-enable-prefix-caching"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while requests.get(self.url + "/ready", timeout=5).status_code != 200:
            if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                self.fail("the worker did not register")
            time.sleep(0.05)
        self.client = carpool.Client(self.frontend, timeout=30)
        # The router loads the handed-over tokenizer after the worker registers; a text call
        # waits for it (token-id prompts do not, and would come back without text).
        self.client.tokenize("ready?")

    def _log(self, name):
        path = str(self.tmp / ("%s-%s" % (self.name, name)))
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

    def post(self, path, body):
        return requests.post(self.url + path, json=body, timeout=60)

    def close(self):
        if getattr(self, "client", None) is not None:
            self.client.close()
            self.client = None
        for p in reversed(self.procs):
            stop(p)
        self.procs = []


@pytest.fixture(scope="module")
def config():
    path = os.path.join(TOKENIZER_DIR, "tokenizer_config.json")
    if not os.path.isfile(path) or not os.path.isdir(os.path.join(MODULES, "openai")):
        setup = subprocess.run(["bash", os.path.join(REPO, "tests", "tokenizer", "npm_setup.sh"),
                                NPM_DIR], capture_output=True, text=True)
        if setup.returncode == 77:
            pytest.skip("npm cannot reach its registry: " + setup.stderr.strip())
        assert setup.returncode == 0, "npm_setup.sh failed:\n" + setup.stderr
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    assert isinstance(c.get("chat_template"), str), "the Llama 3.1 config has no chat_template"
    return c


@pytest.fixture(scope="module")
def library(config):
    lib = Library(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    assert lib.vocab_size == llama3_checkpoint.VOCAB_SIZE
    yield lib
    lib.close()


@pytest.fixture(scope="module")
def openai_node(config):
    node = OpenAINode()
    yield node
    node.close()


@pytest.fixture(scope="module")
def model_dir(library, tmp_path_factory):
    for name in ("carpool-router", "carpool-worker"):
        path = os.path.join(BIN_DIR, name)
        assert os.access(path, os.X_OK), "%s is not built" % path
    tmp = tmp_path_factory.mktemp("e2e_openai_model")
    trigger_id = library.encode("The secret word is xylophone")[-1]
    return llama3_checkpoint.write(str(tmp / "llama31-random"), TOKENIZER_DIR, trigger_id,
                                   128006)


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("e2e_openai"), "own", model_dir)
    yield c
    c.close()


@pytest.fixture(scope="module")
def hostile_template(config, tmp_path_factory):
    source = HOSTILE_PREFIX + config["chat_template"]
    path = tmp_path_factory.mktemp("e2e_openai_template") / "hostile.jinja"
    path.write_text(source, encoding="utf-8")
    return str(path), source


@pytest.fixture(scope="module")
def hostile(model_dir, hostile_template, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("e2e_openai_hostile"), "hostile", model_dir,
                ["--chat-template", hostile_template[0],
                 "--chat-template-timeout-ms", str(TIMEOUT_MS)])
    yield c
    c.close()


@pytest.fixture(scope="module")
def qwen3_template(config, tmp_path_factory):
    with open(QWEN3_CONFIG, encoding="utf-8") as f:
        source = json.load(f)["chat_template"]
    path = tmp_path_factory.mktemp("e2e_openai_qwen3") / "qwen3.jinja"
    path.write_text(source, encoding="utf-8")
    return str(path), source


@pytest.fixture(scope="module")
def qwen3(model_dir, qwen3_template, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("e2e_openai_qwen3_cluster"), "qwen3", model_dir,
                ["--chat-template", qwen3_template[0]])
    yield c
    c.close()


@pytest.fixture(scope="module")
def bare(model_dir, tmp_path_factory):
    """A router and worker serving the same weights from a folder whose tokenizer_config.json
    has no chat_template (and no chat_template.jinja beside it)."""
    tmp = tmp_path_factory.mktemp("e2e_openai_bare")
    folder = tmp / "no-template"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        os.symlink(os.path.join(model_dir, name), str(folder / name))
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        c = json.load(f)
    del c["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(c), encoding="utf-8")
    cluster = Cluster(tmp, "bare", str(folder))
    yield cluster
    cluster.close()


def want_ids(library, config, messages, extra, template=None):
    """Jinja2's rendering (as transformers renders), tokenized by the library without special
    tokens (as apply_chat_template tokenizes it)."""
    if template is not None:
        config = dict(config, chat_template=template)
    r = jinja_reference.render_chat(config, messages, tools=extra.get("tools"),
                                    add_generation_prompt=extra.get("add_generation_prompt", True),
                                    kwargs=extra.get("chat_template_kwargs"))
    assert r["ok"], "Jinja2 refused %r: %s" % (messages, r.get("error"))
    return r["output"], library.encode(r["output"], add_special_tokens=False)


def body(model, messages, extra, **kwargs):
    b = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
         "ignore_eos": True}
    b.update(extra)
    b.update(kwargs)
    return b


def greedy(n=MAX_TOKENS):
    return carpool.SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def tokenize_body(messages, extra):
    b = {"messages": messages, "add_generation_prompt": extra.get("add_generation_prompt", True)}
    for k in ("tools", "chat_template_kwargs"):
        if k in extra:
            b[k] = extra[k]
    return b


def streamed(answer):
    """(text, usage, finish_reason) of a streamed create's chunks."""
    assert answer["ok"], answer
    text, usage, finish = "", None, None
    for chunk in answer["chunks"]:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            text += choice.get("delta", {}).get("content") or ""
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return text, usage, finish


def check_conversation(cluster, openai_node, library, config, model, name, messages, extra,
                       template=None):
    """Every way of seeing the prompt of one conversation; returns the problems found."""
    bad = []
    rendered, want = want_ids(library, config, messages, extra, template)
    where = "%s (%s; Jinja2 renders %r, %d ids)" % (name, cluster.name, rendered, len(want))
    ref = cluster.client.generate(token_ids=want, sampling=greedy())

    got = openai_node.create(cluster.base_url, body(model, messages, extra))
    if not got["ok"]:
        return ["%s: create failed: %s %s" % (where, got["status"], got["message"])]
    r = got["response"]
    if r["usage"]["prompt_tokens"] != len(want):
        bad.append("%s: create usage.prompt_tokens %d" % (where, r["usage"]["prompt_tokens"]))
    content = r["choices"][0]["message"]["content"]
    if content != ref.text or r["usage"]["completion_tokens"] != len(ref.token_ids):
        bad.append("%s: create answered %r (%d tokens); the ids sent as token ids give %r (%s)"
                   % (where, content, r["usage"]["completion_tokens"], ref.text, ref.token_ids))

    text, usage, _ = streamed(openai_node.create(
        cluster.base_url, body(model, messages, extra, stream=True,
                               stream_options={"include_usage": True})))
    if text != content or usage is None or usage["prompt_tokens"] != len(want):
        bad.append("%s: streamed create %r, usage %s; whole %r" % (where, text, usage, content))

    t = cluster.post("/tokenize", tokenize_body(messages, extra))
    if t.status_code != 200 or t.json().get("tokens") != want or t.json().get("count") != len(want):
        bad.append("%s: POST /tokenize: %d %s; want %s" % (where, t.status_code, t.text, want))

    sdk_kwargs = dict(tools=extra.get("tools"),
                      add_generation_prompt=extra.get("add_generation_prompt", True),
                      chat_template_kwargs=extra.get("chat_template_kwargs"))
    ids = cluster.client.tokenize(messages=messages, **sdk_kwargs).token_ids
    if ids != want:
        bad.append("%s: Python SDK tokenize(messages=...): %s; want %s" % (where, ids, want))
    chat = cluster.client.chat(messages, sampling=greedy(), **sdk_kwargs)
    if chat.usage.prompt_tokens != len(want) or chat.token_ids != ref.token_ids:
        bad.append("%s: Python SDK chat: prompt_tokens %d, output %s; the ids give %s"
                   % (where, chat.usage.prompt_tokens, chat.token_ids, ref.token_ids))
    return bad


# ---- the model's own template


def test_the_models_id_is_listed(cluster, openai_node):
    assert len(openai_node.models(cluster.base_url)) == 1


@pytest.mark.parametrize("name,messages,extra", CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
def test_prompt_ids_are_jinja2_rendering_tokenized_by_the_library(cluster, openai_node, library,
                                                                  config, name, messages, extra):
    model = openai_node.models(cluster.base_url)[0]
    bad = check_conversation(cluster, openai_node, library, config, model, name, messages, extra)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name,messages,extra", QWEN3_CONVERSATIONS,
                         ids=[c[0] for c in QWEN3_CONVERSATIONS])
def test_qwen3_template_with_tools_and_reasoning(qwen3, qwen3_template, openai_node, library,
                                                 config, name, messages, extra):
    model = openai_node.models(qwen3.base_url)[0]
    bad = check_conversation(qwen3, openai_node, library, config, model, name, messages, extra,
                             template=qwen3_template[1])
    assert not bad, "\n".join(bad)


def test_the_template_writes_bos_once(cluster, library, config):
    messages = CONVERSATIONS[0][1]
    ids = cluster.client.tokenize(messages=messages).token_ids
    assert ids[0] == llama3_checkpoint.BOS_ID and ids.count(llama3_checkpoint.BOS_ID) == 1, ids


# ---- bad input


def refusal(answer):
    assert not answer["ok"], answer
    return answer["status"], answer["message"]


def test_unknown_role_and_bad_content_parts_are_400(cluster, openai_node):
    model = openai_node.models(cluster.base_url)[0]
    status, message = refusal(openai_node.create(
        cluster.base_url, body(model, [{"role": "wizard", "content": "abracadabra"}], {})))
    assert status == 400 and "wizard" in message, (status, message)
    status, message = refusal(openai_node.create(
        cluster.base_url,
        body(model, [{"role": "user", "content": [{"type": "text", "text": 5}]}], {})))
    assert status == 400, (status, message)
    with pytest.raises(carpool.errors.InvalidArgument) as e:
        cluster.client.chat([{"role": "wizard", "content": "x"}], sampling=greedy(1))
    assert "wizard" in e.value.message, repr(e.value)
    # The router serves on.
    assert openai_node.create(cluster.base_url, body(model, CONVERSATIONS[1][1], {}))["ok"]


def test_override_template_renders_normal_conversations(hostile, hostile_template, openai_node,
                                                        library, config):
    model = openai_node.models(hostile.base_url)[0]
    bad = []
    for name, messages, extra in CONVERSATIONS[:3]:
        bad += check_conversation(hostile, openai_node, library, config, model, name, messages,
                                  extra, template=hostile_template[1])
    assert not bad, "\n".join(bad)


def test_a_template_that_raises_is_400_with_its_message(hostile, openai_node):
    model = openai_node.models(hostile.base_url)[0]
    messages = [{"role": "user", "content": RAISE_TRIGGER}]
    status, message = refusal(openai_node.create(hostile.base_url, body(model, messages, {})))
    assert status == 400 and RAISE_MESSAGE in message, (status, message)
    t = hostile.post("/tokenize", {"messages": messages})
    assert t.status_code == 400 and RAISE_MESSAGE in t.text, t.text
    with pytest.raises(carpool.errors.InvalidArgument) as e:
        hostile.client.chat(messages, sampling=greedy(1))
    assert RAISE_MESSAGE in e.value.message, repr(e.value)


def test_a_looping_template_is_stopped_while_the_router_serves_others(hostile, openai_node):
    model = openai_node.models(hostile.base_url)[0]
    normal = body(model, CONVERSATIONS[0][1], {})
    spin = body(model, CONVERSATIONS[0][1], {"chat_template_kwargs": {"spin": True}})
    results = openai_node.parallel(
        [{"create": spin, "base_url": hostile.base_url}] +
        [{"create": normal, "base_url": hostile.base_url, "delay_ms": 200 + 100 * i}
         for i in range(3)])
    looped, others = results[0], results[1:]
    status, message = refusal(looped)
    assert status == 400, (status, message)
    # Stopped by a limit (the run time, or the loop iterations if those end it first), within
    # the router's --chat-template-timeout-ms and some slack for a loaded machine.
    assert looped["ms"] < TIMEOUT_MS + 3000, looped
    assert any(w in message for w in ("ran longer than", "loop iterations")), message
    for r in others:
        assert r["ok"], r
    if looped["ms"] > 1000:  # the loop held a tokenizer thread that long: the others went on
        assert all(r["end_ms"] < looped["end_ms"] for r in others), (
            looped["end_ms"], [r["end_ms"] for r in others])
    assert openai_node.create(hostile.base_url, normal)["ok"]


def test_a_template_that_writes_megabytes_is_400(hostile, openai_node):
    model = openai_node.models(hostile.base_url)[0]
    flood = body(model, CONVERSATIONS[1][1], {"chat_template_kwargs": {"flood": True}})
    status, message = refusal(openai_node.create(hostile.base_url, flood))
    assert status == 400, (status, message)
    assert openai_node.create(hostile.base_url, body(model, CONVERSATIONS[1][1], {}))["ok"]


def test_a_model_without_a_chat_template_is_400_and_serves_text(bare, openai_node, library):
    model = openai_node.models(bare.base_url)[0]
    messages = CONVERSATIONS[1][1]
    status, message = refusal(openai_node.create(bare.base_url, body(model, messages, {})))
    assert status == 400 and "no chat template" in message, (status, message)
    assert "--chat-template" in message, message  # says how to give it one
    t = bare.post("/tokenize", {"messages": messages})
    assert t.status_code == 400 and "no chat template" in t.text, t.text
    with pytest.raises(carpool.errors.InvalidArgument):
        bare.client.chat(messages, sampling=greedy(1))
    # Text prompts do not need a template.
    r = bare.post("/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(library.encode("Hello")), r.text
