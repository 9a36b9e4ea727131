"""Sandbox probes of carpool's Jinja interpreter (issue 14, "How it is checked").

Two kinds of hostile template, each rendered by carpool-jinja-render in a process of its own:
  - reaching for internals (''.__class__.__mro__, cycler.__init__.__globals__, self,
    range.__self__, x.__dict__, format fields, attr(), ...): carpool raises when Jinja2's sandbox
    raises, and whatever it prints holds nothing of an interpreter's insides;
  - exhausting the render (loops of 10**12 or nested to 10**9 iterations, unbounded macro
    recursion, 'x' * 10**9 and outputs that double, huge indents and format widths, powers that
    overflow, nesting 100,000 deep): carpool ends each with an error naming the limit it hit, within
    a bounded wall time (MAX_WALL_S, with its default limits: 2 s of run time) and memory
    (MAX_RSS_KIB).
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import jinja_reference  # noqa: E402

MAX_WALL_S = 5.0
MAX_RSS_KIB = 1 << 20  # 1 GiB
CONTEXT = {"messages": [{"role": "user", "content": "hi"}], "d": {"k": "v"}, "s": "text", "l": [1, 2]}

# What Python internals look like when printed; no carpool output may contain one.
LEAK = re.compile(r"__|<class|<function|<module|object at 0x|TemplateReference|"
                  r"Environment|Context|os\.|subprocess|/usr/|sys\.")

INTERNALS = [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__()[0] }}",
    "{{ [].__class__.__subclasses__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__['os'] }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ lipsum.__globals__ }}",
    "{{ lipsum.__globals__['os'].system('true') }}",
    "{{ self }}",
    "{{ self.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ self._TemplateReference__context.environment }}",
    "{{ range.__self__ }}",
    "{{ range.__class__ }}",
    "{{ range.__self__.__import__('os') }}",
    "{{ dict.__base__ }}",
    "{{ d.__dict__ }}",
    "{{ d.__class__.__dict__ }}",
    "{{ d.items.__self__ }}",
    "{{ d.__len__() }}",
    "{{ s.format.__self__ }}",
    "{{ s.__len__() }}",
    "{{ messages.__class__.__base__ }}",
    "{{ messages[0].__class__ }}",
    "{{ l.__getitem__(0) }}",
    "{{ raise_exception.__globals__ }}",
    "{{ raise_exception.__code__ }}",
    "{{ strftime_now.__globals__ }}",
    "{{ strftime_now.__closure__ }}",
    "{{ ''['__class__'] }}",
    "{{ ''['__class__']['__mro__'] }}",
    "{{ ''|attr('__class__') }}",
    "{{ (''|attr('__class__')).__mro__ }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '{0.__class__}'.format(s) }}",
    "{{ '{0[__class__]}'.format(d) }}",
    "{% set ns = namespace(a=1) %}{{ ns.__dict__ }}",
    "{% set ns = namespace(a=1) %}{{ ns.__class__.__init__.__globals__ }}",
    "{% macro m() %}{% endmacro %}{{ m.__globals__ }}",
    "{% macro m() %}{% endmacro %}{{ m._func.__globals__ }}",
    "{% for x in l %}{{ loop.__class__ }}{{ loop._iterator }}{% endfor %}",
    "{{ config }}{{ request }}{{ environ }}{{ os }}{{ __builtins__ }}{{ __import__ }}",
    "{{ __import__('os').system('true') }}",
    "{{ getattr(s, '__class__') }}",
    "{{ eval('1+1') }}",
    "{{ open('/etc/passwd').read() }}",
    "{{ d.mro() }}",
    "{{ s.translate }}{{ s.encode('utf-8') }}",
    "{% set x = ''.__class__ %}{{ x.__mro__ }}",
]

# (template, what the error must name: a regex over carpool's error message)
ITERATIONS = r"iteration|loop|range"
RECURSION = r"recursion|depth|nest|deep"
SIZE = r"output|bytes|size|long|large|too big|overflow"
TIME = r"time|" + ITERATIONS
OVERFLOW = r"overflow|too large|too big|out of range|" + SIZE
LIMITS = [
    ("{% for x in range(10**12) %}{% endfor %}", ITERATIONS),
    ("{% for x in range(10**12) %}x{% endfor %}", ITERATIONS + "|" + SIZE),
    ("{{ range(10**12)|length }}", ITERATIONS + "|" + SIZE),
    ("{{ range(10**12)|list|length }}", ITERATIONS + "|" + SIZE),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ITERATIONS),
    ("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}x{% endfor %}{% endfor %}"
     "{% endfor %}", ITERATIONS + "|" + SIZE),
    ("{% set ns = namespace(n=0) %}{% for a in range(2000) %}{% for b in range(2000) %}{% set ns.n = ns.n + 1 %}"
     "{% endfor %}{% endfor %}{{ ns.n }}", ITERATIONS),
    ("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", RECURSION),
    ("{% macro r(n) %}x{{ r(n + 1) }}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", RECURSION + "|" + TIME + "|" + SIZE),
    ("{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}", RECURSION),
    ("{% macro w() %}{% call w() %}{{ caller() }}{% endcall %}{% endmacro %}{{ w() }}", RECURSION),
    ("{{ 'x' * 10**9 }}", SIZE),
    ("{{ ('x' * 10**9)|length }}", SIZE),
    ("{{ [1] * 10**9 }}", SIZE + "|" + ITERATIONS),
    ("{{ ([0] * 10**6) * 10**6 }}", SIZE + "|" + ITERATIONS),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", SIZE),
    ("{% for i in range(10000) %}{% for j in range(10000) %}xxxxxxxxxx{% endfor %}{% endfor %}", SIZE + "|" + ITERATIONS),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
     SIZE),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
     SIZE),
    ("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
     SIZE + "|" + ITERATIONS),
    ("{% set x %}{% for i in range(200000) %}{{ 'y' * 100 }}{% endfor %}{% endset %}{{ x|length }}", SIZE),
    ("{{ 'x'|indent(10**9, true) }}", SIZE),
    ("{{ ('a\\n' * 1000)|indent(10**6) }}", SIZE),
    ("{{ messages|tojson(indent=10**9) }}", SIZE),
    ("{{ '{:>1000000000}'.format('x') }}", SIZE),
    ("{{ ('x' * 1000000)|replace('x', 'x' * 1000) }}", SIZE),
    ("{{ ('x' * 100000)|replace('', 'y' * 1000) }}", SIZE),
    ("{{ (('ab' * 1000000)|list)|join(',' * 100) }}", SIZE + "|" + ITERATIONS),
    ("{{ 2 ** 10**9 }}", OVERFLOW),
    ("{{ 10**18 * 10**18 }}", OVERFLOW),
    ("{{ 9223372036854775807 + 1 }}", OVERFLOW),
    ("{{ (-9223372036854775807 - 1) // -1 }}", OVERFLOW),
    ("{{ -(-9223372036854775807 - 1) }}", OVERFLOW),
    ("{% for i in range(200000) %}{{ ('x' * 50000).upper()|length }}{% endfor %}", TIME + "|" + SIZE),
    ("{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}", RECURSION),
    ("{{ " + "[" * 100000 + "]" * 100000 + " }}", RECURSION),
    ("{{ " + "-" * 100000 + "1 }}", RECURSION),
    ("{{ x" + ".a" * 100000 + " }}", RECURSION + "|undefined"),
    ("{{ " + "not " * 100000 + "1 }}", RECURSION),
    ("{% if true %}" * 50000 + "{% endif %}" * 50000, RECURSION),
    ("{% for x in l %}" * 50000 + "{% endfor %}" * 50000, RECURSION + "|" + ITERATIONS),
    ("{% macro m() %}" * 20000 + "{% endmacro %}" * 20000, RECURSION),
    ("{{ " + "x|default(" * 20000 + "1" + ")" * 20000 + " }}", RECURSION),
]

# Templates carpool may render or refuse, but without crashing, in bounded time and memory.
BOUNDED = [
    "{{ 1" + " + 1" * 100000 + " }}",
    "{{ 'a'" + " ~ 'a'" * 100000 + " }}",
    "{% if x %}" + "{% elif y %}" * 50000 + "{% endif %}",
    "{% set a = 1 %}" * 100000 + "{{ a }}",
    "x" * 5_000_000,
    "{{ s }}" * 500_000,
    "{# " + "x" * 5_000_000 + " #}",
    "{{ '" + "é" * 1_000_000 + "' }}",
    "{{ [" + "1, " * 200_000 + "1] | length }}",
    "{{ {" + ", ".join(f"'k{i}': {i}" for i in range(100_000)) + "} | length }}",
]


def render_alone(template, context=None, context_json=None):
    """(answer, wall seconds, peak RSS in KiB) of one render in a driver process of its own.
    context_json: the context as JSON text (for values Python's json cannot write)."""
    if context_json is None:
        context_json = json.dumps(context if context is not None else CONTEXT)
    line = '{"template": ' + json.dumps(template) + ', "context": ' + context_json + '}\n'
    start = time.monotonic()
    proc = subprocess.Popen([harness.driver_path()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        proc.stdin.write(line.encode())
        proc.stdin.close()
        out = proc.stdout.read()
        # Reap the child here (not through Popen) to read its own peak RSS.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        watchdog.cancel()
    wall = time.monotonic() - start
    rss = usage.ru_maxrss
    if proc.returncode != 0:
        return {"ok": False, "crashed": True, "error": f"exit status {proc.returncode}"}, wall, rss
    text = out.decode("utf-8", "replace").strip()
    if not text:
        return {"ok": False, "crashed": True, "error": "no answer"}, wall, rss
    return json.loads(text), wall, rss


@pytest.fixture(scope="module", autouse=True)
def driver():
    assert os.path.isfile(harness.driver_path()), f"carpool-jinja-render is not built ({harness.driver_path()})"


@pytest.mark.parametrize("template", INTERNALS)
def test_internals_stay_out_of_reach(template):
    ref = jinja_reference.render(template, CONTEXT)
    got, wall, _ = render_alone(template)
    assert not got.get("crashed"), f"carpool crashed: {got['error']}"
    assert wall < MAX_WALL_S
    if got["ok"]:
        assert not LEAK.search(got["output"]), f"carpool printed internals: {got['output'][:300]!r}"
        assert ref["ok"], f"Jinja2's sandbox raises ({ref['error']}) but carpool renders {got['output'][:200]!r}"
    else:
        assert got["error"], "an error without a message"


@pytest.mark.parametrize("template,names", LIMITS, ids=[f"limit-{i:02d}" for i in range(len(LIMITS))])
def test_limits_end_with_a_clear_error(template, names):
    got, wall, rss = render_alone(template)
    shown = template if len(template) < 120 else template[:60] + "..." + template[-40:]
    assert not got.get("crashed"), f"carpool crashed on {shown!r}: {got['error']}"
    assert not got["ok"], f"carpool rendered {shown!r} ({len(got['output'])} chars) instead of stopping it"
    assert re.search(names, got["error"], re.IGNORECASE), (
        f"the error for {shown!r} does not name its limit ({names}): {got['error'][:300]}")
    assert wall < MAX_WALL_S, f"{shown!r} took {wall:.1f} s"
    assert rss < MAX_RSS_KIB, f"{shown!r} peaked at {rss // 1024} MiB"


@pytest.mark.parametrize("template", BOUNDED, ids=[f"bounded-{i:02d}" for i in range(len(BOUNDED))])
def test_large_templates_stay_bounded(template):
    got, wall, rss = render_alone(template)
    assert not got.get("crashed"), f"carpool crashed on {template[:80]!r}...: {got['error']}"
    assert wall < MAX_WALL_S, f"{template[:80]!r}... took {wall:.1f} s"
    assert rss < MAX_RSS_KIB, f"{template[:80]!r}... peaked at {rss // 1024} MiB"


def test_small_limits_are_honoured():
    """Limits given to Render are the ones enforced (the router passes its flags' values)."""
    cases = [
        ("{% for i in range(11) %}{% endfor %}", {"max_loop_iterations": 10}, ITERATIONS),
        ("{{ 'x' * 101 }}", {"max_output_bytes": 100}, SIZE),
        ("{% for i in range(101) %}x{% endfor %}", {"max_output_bytes": 100}, SIZE),
        ("{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(20) }}",
         {"max_recursion_depth": 10}, RECURSION),
        ("{% for i in range(10**6) %}{{ ('x' * 10000).upper()|length }}{% endfor %}",
         {"max_run_time_us": 50_000, "max_output_bytes": 1 << 30, "max_loop_iterations": 10**9}, TIME),
    ]
    requests = [{"template": t, "context": {}, "limits": lim} for t, lim, _ in cases]
    within = [
        {"template": "{% for i in [1, 2, 3, 4] %}{% endfor %}ok", "limits": {"max_loop_iterations": 10}},
        {"template": "{{ 'x' * 50 }}", "limits": {"max_output_bytes": 100}},
        {"template": "{% for i in range(50) %}x{% endfor %}", "limits": {"max_output_bytes": 100}},
        {"template": "{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}ok",
         "limits": {"max_recursion_depth": 10}},
    ]
    answers = harness.run_driver(requests + within)
    for (t, lim, names), a in zip(cases, answers):
        assert not a["ok"] and not a.get("crashed"), f"{t!r} with {lim}: {a}"
        assert re.search(names, a["error"], re.IGNORECASE), f"{t!r} with {lim}: {a['error']}"
    for r, a in zip(within, answers[len(cases):]):
        assert a["ok"], f"{r['template']!r} is within {r['limits']} but fails: {a.get('error')}"
    # The time limit stopped the slow loop near its 50 ms, not after the whole loop.
    assert answers[4].get("render_us", 0) < 2_000_000


def test_deep_context_values():
    """A deeply nested value in the context (as a request's JSON could carry) prints, serializes
    and compares without crashing: an answer or an error, in bounded time."""
    deep = '{"deep": ' + "[" * 5000 + "]" * 5000 + "}"
    for template in ("{{ deep }}", "{{ deep|tojson }}", "{{ deep == deep }}", "{{ deep|length }}"):
        got, wall, _ = render_alone(template, context_json=deep)
        assert not got.get("crashed"), f"{template}: {got['error']}"
        assert wall < MAX_WALL_S


def test_chat_request_with_many_keys_is_bounded():
    """A conversation under 1 MiB (the HTTP body limit) whose message holds 70,000 keys: Render
    (parsing messages_json included) answers within its 2 s run-time limit, or stops with an
    error; never seconds past it."""
    message = {"role": "user", "content": "hi"}
    for i in range(70_000):
        message[f"k{i}"] = 0
    config = {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    request = {"tokenizer_config": config, "messages": [message], "add_generation_prompt": False}
    assert len(json.dumps(request["messages"], separators=(",", ":"))) < 1 << 20
    answer = harness.run_driver([request], chat=True, timeout_per_case_s=60)[0]
    assert not answer.get("crashed"), answer["error"]
    assert answer["render_us"] < 2_500_000, (
        f"Render took {answer['render_us'] / 1e6:.1f} s (limit 2 s): "
        f"{answer.get('output', answer.get('error'))[:100]!r}")
