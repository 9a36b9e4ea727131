"""carpool's Jinja interpreter against Jinja2 on small templates (issue 14, "How it is checked").

Every case of templates_corpus.py (a few hundred templates, one construct each: whitespace
control, if/for/loop/break/continue, generation, set, namespace, macro/call, raise_exception,
strftime_now, operators, tests, lookups, undefined, slicing, filters, string and dict methods,
syntax errors) renders through Jinja2 configured as transformers configures it
(jinja_reference.py) and through carpool-jinja-render; each must give the same output, or both
must raise (carpool's error then carries raise_exception's message). A case marked "extra" goes
beyond what the issue lists, and carpool may refuse it at parse time as unsupported instead; a
case marked "divergence" is a deliberate difference, where carpool must raise the error it names.
Every mismatch is written to $CARPOOL_CHAT_TEMPLATE_REPORT_DIR/constructs.jsonl.
"""

import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import jinja_reference  # noqa: E402
import templates_corpus  # noqa: E402

CASES = templates_corpus.CASES


@pytest.fixture(scope="module")
def results():
    assert os.path.isfile(harness.driver_path()), (
        f"carpool-jinja-render is not built ({harness.driver_path()}; set CARPOOL_JINJA_RENDER)")
    now = templates_corpus.NOW_UNIX_MICROS
    requests = [{"template": c["template"], "context": c["context"], "now_unix_micros": now} for c in CASES]
    carpool = harness.run_driver(requests)
    reference = [jinja_reference.render(c["template"], c["context"], now) for c in CASES]
    out = {}
    report = []
    for c, ref, got in zip(CASES, reference, carpool):
        if "divergence" in c:
            div = c["divergence"]
            if "carpool_output" in div:
                ok = got["ok"] and got["output"] == div["carpool_output"]
                why = "known divergence" if ok else f"carpool must render {div['carpool_output']!r} here ({div['why']})"
            else:
                ok = not got["ok"] and not got.get("crashed") and re.search(div["carpool_error"], got["error"]) is not None
                why = "deliberate divergence" if ok else f"carpool must raise /{div['carpool_error']}/ here ({div['why']})"
        else:
            ok, why = harness.same(ref, got, allow_unsupported=c["extra"])
        out[c["name"]] = (ok, why, ref, got)
        if not ok:
            report.append({"name": c["name"], "why": why, "template": c["template"], "jinja2": ref, "carpool": got})
    harness.write_jsonl(os.path.join(harness.report_dir(), "constructs.jsonl"), report)
    return out


def test_corpus_size():
    assert len(CASES) >= 300
    assert len({c["name"] for c in CASES}) == len(CASES)


def test_summary(results):
    """One line of counts (printed with -s or on failure): what matches, what is refused."""
    by_why = {}
    for ok, why, _, _ in results.values():
        by_why[why] = by_why.get(why, 0) + 1
    passed = sum(1 for ok, *_ in results.values() if ok)
    print(f"\nconstructs: {passed}/{len(results)} pass; " + ", ".join(f"{k}: {v}" for k, v in sorted(by_why.items())))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_construct(case, results):
    ok, why, ref, got = results[case["name"]]
    if not ok:
        pytest.fail(harness.describe(repr(case["template"]), ref, got, why), pytrace=False)
