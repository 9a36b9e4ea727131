"""Small templates, each exercising one construct, for test_constructs.py.

A case is {"name", "template", "context", "extra", "divergence"?}: test_constructs.py renders it
with Jinja2 (as transformers configures it) and with carpool, and asserts the same output or that
both raise. "extra" marks what goes beyond the constructs issue 14 lists: for those carpool may
instead refuse the template at parse time as unsupported (the issue's rule for a construct it
lacks). "divergence" marks a deliberate difference (carpool must raise, matching its regex).

Everything here is deterministic: strftime_now runs at a fixed time (NOW_UNIX_MICROS, TZ=UTC),
and nothing prints an object's address.
"""

import copy

NOW_UNIX_MICROS = 1_764_624_896_123_456  # 2025-12-01 21:34:56.123456 UTC, a Monday

CASES = []

_CTX = {
    "s": "Hello World",
    "n": 7,
    "f": 2.5,
    "l": [3, 1, 2],
    "e": [],
    "d": {"b": 1, "a": 2},
    "t": True,
    "no": None,
    "users": [{"name": "ann", "age": 31, "admin": True, "tags": ["x"]},
              {"name": "bob", "age": 25, "admin": False, "tags": []},
              {"name": "cy", "age": 40, "admin": True, "address": {"city": "Oslo"}}],
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
    "items_dict": {"items": "the item", "keys": "k", "x": 1},
    "nested": {"a": {"b": {"c": [10, 20, {"d": "deep"}]}}},
    "u": "日本語 😀 e\u0301",
    "ws": "  \n padded \t\n ",
}


def add(group, template, context=None, extra=False, divergence=None, divergence_output=None):
    """divergence: (regex, why) for a deliberate difference from Jinja2: carpool must raise an
    error matching regex (why says what Jinja2 does and why carpool does not).
    divergence_output: (output, why) for a known difference where carpool renders `output`
    exactly (docs/chat_templates.md, "Known differences from Jinja2", lists each)."""
    n = sum(1 for c in CASES if c["name"].startswith(group + "-")) + 1
    case = {"name": f"{group}-{n:02d}", "template": template,
            "context": copy.deepcopy(dict(_CTX, **(context or {}))),
            "extra": extra}
    if divergence:
        case["divergence"] = {"carpool_error": divergence[0], "why": divergence[1]}
    if divergence_output:
        case["divergence"] = {"carpool_output": divergence_output[0], "why": divergence_output[1]}
    CASES.append(case)


# ---- output, comments, literals --------------------------------------------------------------
add("text", "plain text, no tags")
add("text", "")
add("text", "trailing newline dropped\n")
add("text", "two trailing newlines\n\n")
add("text", "crlf\r\nline\r\n")
add("text", "{{ s }}")
add("text", "{{ s }}{{ n }}{{ f }}{{ t }}{{ no }}")
add("text", "a{# a comment #}b")
add("text", "a{# multi\nline {{ x }} {% if %} #}b")
add("text", "{{ '{{' }} and {{ '%}' }}")
add("literal", "{{ 'single' }} {{ \"double\" }}")
add("literal", "{{ 'it\\'s' }} {{ \"say \\\"hi\\\"\" }}")
add("literal", "{{ 'a\\nb\\tc' }}")
add("literal", "{{ '\\u00e9\\x41' }}")
add("literal", "{{ 'é 日本' }}")
add("literal", "{{ 42 }} {{ -3 }} {{ 1_000 }} {{ 0 }}")
add("literal", "{{ 1.5 }} {{ 1.0 }} {{ 1e3 }} {{ 1.5e-3 }} {{ 1e20 }} {{ 1e16 }} {{ 123456789.125 }}")
add("literal", "{{ true }} {{ false }} {{ True }} {{ False }} {{ none }} {{ None }}")
add("literal", "{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}")
add("literal", "{{ {'b': 1, 'a': [2, 'x'], 'c': {'d': none}} }}")
add("literal", "{{ [] }} {{ {} }} {{ () }} {{ (1,) }} {{ (1, 'a') }}")
add("literal", "{{ ['it\\'s', \"q\\\"\", 'back\\\\slash', 'nl\\n'] }}")
add("literal", "{{ 0x1f }} {{ 0o17 }} {{ 0b101 }}", extra=True)
add("literal", "{{ [1, 2,] }} {{ {'a': 1,} }}")
add("literal", "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 2 / 3 }} {{ 10 / 4 }} {{ 1e-7 }} {{ 1e-4 }}")
add("literal", "{{ -0.0 }} {{ 100.0 }} {{ 1e15 }} {{ 12345678901234567.0 }}")
add("literal", "{{ 'a' 'b' }} {{ 'c' \"d\" 'e' }}")
add("literal", "{{ 1e-5 }} {{ 123e-20 }} {{ 1.7976931348623157e308 }} {{ 5e-324 }} {{ 10 / 3 }} {{ 0.1 * 3 }} {{ 2 ** 62 }}")
add("literal", "{{ nums }} {{ nums|tojson }} {% for x in nums %}{{ x }};{% endfor %}",
    {"nums": [1.0, 1e2, 1.5e-10, 0.1, -0.0, 3, -7, 2.5e15, 1e22, 123456.789]})
add("literal", r"""{{ ['\u200b', '\u00a0', 'é', '\x7f', '\t', "it's", 'both\'"', '😀', '\u0301', '\x00', '\\', '\u2028'] }}""")
add("literal", "{{ {'k\n': 'v\r', \"q'\": ['\x1b']} }}")
add("literal", "{{ ctx_strings }}", {"ctx_strings": ["\u200b", "\u00a0", "\ufeff", "e\u0301", "\U0001F600", "\x01", "\u0600", "\u200f"]})

# ---- whitespace control -----------------------------------------------------------------------
add("ws", "{% if true %}\nyes\n{% endif %}\nafter")
add("ws", "  {% if true %}\n  indented\n  {% endif %}\ndone")
add("ws", "\t{% if true %}\n\tx\n\t{% endif %}\n")
add("ws", "text {% if true %}\nkept-left{% endif %} right")
add("ws", "a\n  {%- if true %}\nb\n  {%- endif %}\nc")
add("ws", "a\n  {% if true -%}\n   b   \n  {%- endif %}  \nc")
add("ws", "a  {{- s -}}  b")
add("ws", "a\n{{ s }}\nb")
add("ws", "  {{ s }}\n  {{ n }}\n")
add("ws", "x\n  {%+ if true %}\ny{% endif %}")
add("ws", "x\n{% if true +%}\ny{% endif %}")
add("ws", "x\n  {#- comment -#}\n  y")
add("ws", "x\n  {# comment #}\ny")
add("ws", "x\n  {# comment #}  trailing\ny")
add("ws", "{% for i in l %}\n{{ i }}\n{% endfor %}\n")
add("ws", "{% for i in l -%}\n  {{ i }}\n{%- endfor %}")
add("ws", "{%- for i in l %} {{ i }} {% endfor -%} !")
add("ws", "<{%- set x = 1 -%}\n\n>")
add("ws", "{% set x %}\n  a\n  b\n{% endset %}[{{ x }}]")
add("ws", "a {%- if false %}x{% else -%} b {%- endif %} c")
add("ws", "{% if true %}\r\ncrlf body\r\n{% endif %}\r\nend")
add("ws", "  {%- for m in messages -%}\n    {{- m.role }}:{{ m.content }}\n  {% endfor %}")
add("ws", "{% macro m() %}\n  body\n{% endmacro %}[{{ m() }}]")
add("ws", "  {% raw %}\n  {{ x }}\n  {% endraw %}\n", extra=True)
add("ws", "{{ 'a' }}   \n   {% if true %}b{% endif %}")
add("ws", "line1\n    {% if true %}    inner    {% endif %}    \nline3")

# ---- if / elif / else, truthiness -------------------------------------------------------------
add("if", "{% if t %}T{% endif %}{% if no %}N{% endif %}")
add("if", "{% if n > 10 %}big{% elif n > 5 %}mid{% elif n > 0 %}small{% else %}neg{% endif %}")
add("if", "{% if false %}a{% elif false %}b{% else %}c{% endif %}")
add("if", "{% if [] %}1{% endif %}{% if {} %}2{% endif %}{% if '' %}3{% endif %}{% if 0 %}4{% endif %}"
          "{% if 0.0 %}5{% endif %}{% if none %}6{% endif %}{% if undefined_var %}7{% endif %}"
          "{% if ' ' %}8{% endif %}{% if [0] %}9{% endif %}{% if {'a': 0} %}10{% endif %}{% if '0' %}11{% endif %}")
add("if", "{% if t %}{% if n == 7 %}nested{% else %}no{% endif %}{% endif %}")
add("if", "{% if n is defined and n is not none %}def{% endif %}")
add("if", "{% if not e %}empty{% endif %}")
add("if", "{% if t %}{% set inner = 'set in if' %}{% endif %}{{ inner }}")

# ---- for and the loop object ------------------------------------------------------------------
add("for", "{% for x in l %}{{ x }},{% endfor %}")
add("for", "{% for x in l %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
           "{{ loop.length }} {% endfor %}")
add("for", "{% for x in l %}{{ loop.first }}-{{ loop.last }} {% endfor %}")
add("for", "{% for x in l %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}")
add("for", "{% for x in l %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }} {% endfor %}")
add("for", "{% for x in e %}never{% else %}empty-else{% endfor %}")
add("for", "{% for x in l %}{{ x }}{% else %}not-run{% endfor %}")
add("for", "{% for k in d %}{{ k }}={{ d[k] }};{% endfor %}")
add("for", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}")
add("for", "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}")
add("for", "{% for c in 'héllo' %}{{ c }}.{% endfor %}")
add("for", "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}")
add("for", "{% for a, b in [(1, 'x'), (2, 'y')] %}{{ a }}{{ b }}{% endfor %}")
add("for", "{% for x in l if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}")
add("for", "{% for x in l %}{% for y in l %}{{ loop.index }}{% endfor %}|{{ loop.index }} {% endfor %}")
add("for", "{% for x in l %}{% set outer = loop %}{% for y in e + [0] %}{{ outer.index }}{% endfor %}{% endfor %}")
add("for", "{% for x in l %}{% set y = x * 2 %}{{ y }}{% endfor %}[{{ y }}]")
add("for", "{% set x = 'outer' %}{% for x in l %}{% endfor %}{{ x }}")
add("for", "{% for x in undefined_var %}never{% endfor %}ok")
add("for", "{% for x in range(3) %}{{ x }}{% endfor %}")
add("for", "{% for x in range(1, 10, 3) %}{{ x }}{% endfor %}{% for x in range(5, 0, -2) %}{{ x }}{% endfor %}")
add("for", "{% for m in messages %}{{ loop.index0 }}:{{ m['role'] }}{% if not loop.last %}, {% endif %}{% endfor %}")
add("for", "{% for x in n %}{% endfor %}")
add("for", "{% for x in l %}{{ loop.cycle('odd', 'even') }} {% endfor %}", extra=True)
add("for", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", extra=True)
add("for", "{% for x in l %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}", extra=True)
add("for", "{% for n in [{'v': 1, 'c': [{'v': 2, 'c': []}]}] recursive %}{{ n.v }}({{ loop(n.c) }}){% endfor %}",
    extra=True)
add("for", "{% for x in (1, 2) %}{{ x }}{% endfor %}")
add("for", "{% for x in [1, 2] %}{% set loop = 5 %}{{ loop }}{% endfor %}")
add("for", "{% for x in [[1, [2, 3]]] %}{% for a, (b, c) in [x] %}{{ a }}{{ b }}{{ c }}{% endfor %}{% endfor %}")
add("for", "{% for x in [] %}{% else %}{{ loop is defined }}{% endfor %}{% for x in [1] %}{% endfor %}{{ loop is defined }}")
add("for", "{% for i in [1, 2] %}{% if i == 1 %}{% set x = 'one' %}{% endif %}[{{ x }}]{% endfor %}")
add("for", "{% set x = 0 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}")
add("for", "{% for x in l|sort %}{{ x }}{% endfor %}", extra=True)
add("for", "{% for m in messages[1:] %}{{ m.content }}{% endfor %}")
add("for", "{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}")

# ---- break / continue -------------------------------------------------------------------------
add("loopctl", "{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}")
add("loopctl", "{% for x in range(6) %}{% if x is odd %}{% continue %}{% endif %}{{ x }}{% endfor %}")
add("loopctl", "{% for x in l %}{% break %}{% else %}else-runs-only-without-iterations{% endfor %}done")
add("loopctl", "{% for x in [1, 2] %}{% for y in [1, 2, 3] %}{% if y == 2 %}{% break %}{% endif %}{{ x }}{{ y }} "
               "{% endfor %}{% endfor %}")
add("loopctl", "{% for x in range(5) %}{% if x < 3 %}{% continue %}{% endif %}{{ loop.index }}{% endfor %}")
add("loopctl", "{% break %}")

# ---- set, block set, namespace ----------------------------------------------------------------
add("set", "{% set x = 1 %}{% set y = x + 1 %}{{ x }}{{ y }}")
add("set", "{% set a, b = 1, 2 %}{{ a }}{{ b }}")
add("set", "{% set a, b = [3, 4] %}{{ b }}{{ a }}")
add("set", "{% set x %}block {{ s }}{% endset %}[{{ x }}]")
add("set", "{% set x | upper %}block {{ s }}{% endset %}[{{ x }}]", extra=True)
add("set", "{% set x = s %}{% set x = x ~ '!' %}{{ x }}")
add("set", "{% set ns = namespace(count=0, items=[]) %}{% for x in l %}{% set ns.count = ns.count + x %}{% endfor %}"
           "{{ ns.count }}")
add("set", "{% set ns = namespace() %}{% set ns.found = false %}{% for m in messages %}{% if m.role == 'user' %}"
           "{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}")
add("set", "{% set ns = namespace(a=1, b='x') %}{{ ns.a }}{{ ns.b }}{{ ns.missing }}")
add("set", "{% set ns = namespace(last=none) %}{% for m in messages %}{% set ns.last = m.role %}{% endfor %}{{ ns.last }}")
add("set", "{% set ns = namespace(x=1) %}{{ ns }}", extra=True)
add("set", "{% set d2 = {'k': 1} %}{% set d2.k = 2 %}")
add("set", "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}")
add("set", "{% set l2 = l + [4] %}{{ l2 }}{{ l }}")
add("set", "{% set ns = namespace(d={}) %}{% set ns.d = dict(ns.d, k=1) %}{{ ns.d }}", extra=True)
add("set", "{% set x = namespace(v=[1]) %}{% set x.v = x.v + [2] %}{{ x.v }}")

# ---- generation (transformers' tag) -----------------------------------------------------------
add("generation", "a{% generation %}B{{ s }}{% endgeneration %}c")
add("generation", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                  "{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}")
add("generation", "{% generation %}\n  inner\n{% endgeneration %}\nafter")
add("generation", "{% set x = 1 %}{% generation %}{% set x = 2 %}{{ x }}{% endgeneration %}{{ x }}")
add("generation", "{% generation %}{% endgeneration %}")

# ---- macro / call / caller --------------------------------------------------------------------
add("macro", "{% macro greet(name) %}Hi {{ name }}!{% endmacro %}{{ greet('ann') }} {{ greet(name='bob') }}")
add("macro", "{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='y') }}")
add("macro", "{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}")
add("macro", "{% macro m() %}{{ s }}{% endmacro %}{{ m() }}")
add("macro", "{% macro m(x) %}{{ x|upper }}{% endmacro %}{{ m('a') ~ m('b') }}{{ m('c')|lower }}")
add("macro", "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inside {{ s }}{% endcall %}")
add("macro", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
             "{% call(item) each(l) %}({{ item }}){% endcall %}")
add("macro", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}")
add("macro", "{% macro m() %}{% set local = 1 %}{{ local }}{% endmacro %}{{ m() }}[{{ local }}]")
add("macro", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}")
add("macro", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}")
add("macro", "{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}", extra=True)
add("macro", "{% macro m() %}x{% endmacro %}{{ m }}", extra=True)
add("macro", "{% macro render_tool(t) %}{{ t.function.name }}({{ t.function.parameters.properties|list|join(', ') }})"
             "{% endmacro %}{{ render_tool({'function': {'name': 'f', 'parameters': {'properties': {'a': 1, 'b': 2}}}}) }}")
add("macro", "{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}")
add("macro", "{{ later() }}{% macro later() %}defined after use{% endmacro %}")
add("macro", "{% macro outer() %}{% macro inner() %}in{% endmacro %}{{ inner() }}{% endmacro %}{{ outer() }}")
add("macro", "{% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}")
add("macro", "{% macro m() %}{{ y }}{% endmacro %}{% for y in [7] %}{{ m() }}{% endfor %}|{% set y = 8 %}{{ m() }}")
add("macro", "{% set ns = namespace(v=0) %}{% macro inc() %}{% set ns.v = ns.v + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}{{ ns.v }}")
add("macro", "{% macro m(a) %}{{ caller(a * 2) }}{% endmacro %}{% call(v) m(3) %}{% call(w) m(v) %}{{ w }}{% endcall %}{% endcall %}")
add("macro", "{% macro m(a, b) %}{{ a }}-{{ b }}{% endmacro %}{{ m(b=2, a=1) }}")
add("macro", "{% macro m(a, b) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1, a=2) }}")
add("macro", "{% macro m() %}{{ m.name }}{{ m.arguments }}{% endmacro %}{{ m() }}", extra=True,
    divergence_output=("", "a Jinja2 macro has name and arguments attributes (m, ()); carpool's macros have "
                       "no attributes, so both are undefined and print nothing"))

# ---- raise_exception, strftime_now ------------------------------------------------------------
add("raise", "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}")
add("raise", "before{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}after")
add("raise", "{% if false %}{{ raise_exception('never') }}{% endif %}fine")
add("raise", "{{ raise_exception('unicode: 日本 😀') }}")
add("strftime", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}")
add("strftime", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %-d') }}|{{ strftime_now('%A %a %j %p %I %y') }}")
add("strftime", "{{ strftime_now('%%literal%% %m/%d') }}")
add("strftime", "Today Date: {{ strftime_now('%d %b %Y') }}")
add("strftime", "{{ strftime_now('%Z|%z|%f') }}")
add("strftime", "{{ strftime_now('%c|%x|%X|%U|%W|%G|%V|%u|%w|%e|%C|%D|%F|%T|%R|%h|%n|%t') }}")

# ---- arithmetic and operators -----------------------------------------------------------------
add("arith", "{{ 1 + 2 }} {{ 5 - 8 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }}")
add("arith", "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }}")
add("arith", "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 10 - 2 - 3 }} {{ 100 / 10 / 2 }} {{ 2 * 3 % 4 }}")
add("arith", "{{ 1.5 + 1 }} {{ 2.5 * 2 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }} {{ -f }} {{ +n }} {{ - -n }}")
add("arith", "{{ n + f }} {{ n * 2 }} {{ n - 10 }} {{ n / 7 }}")
add("arith", "{{ 1 / 0 }}")
add("arith", "{{ 1 // 0 }}")
add("arith", "{{ 1 % 0 }}")
add("arith", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ [1, 2] + [3] }} {{ 'x' * 0 }} {{ 'x' * -1 }}")
add("arith", "{{ 'a' + 1 }}")
add("arith", "{{ 1 + 'a' }}")
add("arith", "{{ [1] + 'a' }}")
add("arith", "{{ none + 1 }}")
add("arith", "{{ true + true }} {{ true * 3 }} {{ false - 1 }}")
add("arith", "{{ 10 ** 18 }} {{ 9223372036854775807 }} {{ -9223372036854775807 - 1 }}")
add("arith", "{{ messages|length - 1 }} {{ (messages|length - 1) - 2 }}")
add("arith", "{{ 1e308 * 10 }} {{ -1e308 * 10 }}")
add("arith", "{{ 7 // 2.0 }} {{ -7.0 // 2 }} {{ 7 % -3 }} {{ 7.0 % -3 }}")
add("concat", "{{ 'a' ~ 'b' }} {{ 1 ~ 2 }} {{ 'x' ~ none ~ true ~ 1.0 }} {{ 'l' ~ [1, 'a'] }} {{ 'u' ~ undefined_var ~ 'v' }}")
add("concat", "{{ 1 ~ 2 + 3 }} {{ 'a' ~ 2 * 3 }}")
add("concat", "{{ s ~ d }}")
add("precedence", "{{ 'a' ~ 'b'|upper }} {{ not t|string }} {{ 'abc'[1:]|upper }} {{ messages|length > 2 }}")
add("precedence", "{{ -n|string }}")
add("precedence", "{{ 1 + 2|string }}")
add("precedence", "{{ 1 + 1 is odd }} {{ 2 * 3 is even }} {{ not 1 == 2 }} {{ not n is odd }}")
add("precedence", "{{ 'a' if 1 else 'b' ~ 'c' }} {{ 0 or 1 and 0 }} {{ (l|length > 2) and 'long' or 'short' }}")
add("precedence", "{{ 2 + 3 ~ 4 * 5 }} {{ 1 < 2 == true }} {{ 'b' in 'abc' == true }} {{ - 2 ** 2 }} {{ 2 ** -1 ** 2 }}")
add("precedence", "{{ l|length * 2 }} {{ l[0] + l[1] * l[2] }} {{ d['a'] ** 2 }} {{ -l[0] }} {{ (1, 2)|length }}")

# ---- comparisons, logic, membership -----------------------------------------------------------
add("compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 4 >= 4 }} {{ 1 == 1 }} {{ 1 != 1 }}")
add("compare", "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' == 'a' }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ 'é' > 'z' }}")
add("compare", "{{ [1, 2] < [1, 3] }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ {'a': 1} == {'a': 1} }}")
add("compare", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1 == 1 }}")
add("compare", "{{ none == none }} {{ none == 0 }} {{ undefined_var == none }} {{ '1' == 1 }}")
add("compare", "{{ 'a' < 1 }}")
add("compare", "{{ none < 1 }}")
add("compare", "{{ [1] < 'a' }}")
add("logic", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }} {{ 1 and 0 or 2 }} {{ [] or {} }}")
add("logic", "{{ not 0 }} {{ not 'a' }} {{ not [] }} {{ not not 1 }} {{ not none }}")
add("logic", "{{ true and false or true }} {{ true or false and false }} {{ not true or true }} {{ not (true or true) }}")
add("logic", "{{ undefined_var or 'fallback' }} {{ undefined_var and 'x' }}|{{ s and n }}")
add("logic", "{{ (t and 'yes') or 'no' }}")
add("in", "{{ 'a' in 'abc' }} {{ 'z' in 'abc' }} {{ '' in 'abc' }} {{ 'bc' in 'abc' }}")
add("in", "{{ 1 in [1, 2] }} {{ 3 in [1, 2] }} {{ 1.0 in [1] }} {{ 'k' in {'k': 1} }} {{ 1 in {'k': 1} }}")
add("in", "{{ 'z' not in 'abc' }} {{ 1 not in l }} {{ not 'a' in 'abc' }}")
add("in", "{{ '</think>' in 'x</think>y' }} {{ 'b' in d }} {{ 'role' in messages[0] }}")
add("in", "{{ 1 in 'abc' }}")
add("in", "{{ 1 in 5 }}")
add("in", "{{ 'a' in undefined_var }}")
add("in", "{{ [1] in [[1], 2] }} {{ (1, 2) in [(1, 2)] }}")

# ---- is-tests ---------------------------------------------------------------------------------
add("is", "{{ n is defined }} {{ undefined_var is defined }} {{ undefined_var is undefined }} {{ d.zz is defined }}")
add("is", "{{ no is none }} {{ n is none }} {{ undefined_var is none }} {{ n is not none }}")
add("is", "{{ s is string }} {{ n is string }} {{ d is mapping }} {{ l is mapping }} {{ messages[0] is mapping }}")
add("is", "{{ l is iterable }} {{ s is iterable }} {{ d is iterable }} {{ n is iterable }} {{ undefined_var is iterable }}")
add("is", "{{ l is sequence }} {{ s is sequence }} {{ d is sequence }} {{ n is sequence }}")
add("is", "{{ n is number }} {{ f is number }} {{ t is number }} {{ s is number }}")
add("is", "{{ n is integer }} {{ f is integer }} {{ t is integer }} {{ f is float }} {{ n is float }}")
add("is", "{{ t is boolean }} {{ 1 is boolean }} {{ t is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}")
add("is", "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}")
add("is", "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 1 is le 1 }} {{ 1 is ge 2 }}")
add("is", "{{ 'a' is in 'abc' }} {{ 3 is in l }} {{ 'q' is in d }}")
add("is", "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }}", extra=True)
add("is", "{{ no is sameas none }} {{ t is sameas true }}", extra=True)
add("is", "{{ s.upper is callable }} {{ s is callable }}", extra=True)
add("is", "{{ (5).real }}|{{ 1.5.is_integer() }}|{{ true.real }}", extra=True)
add("is", "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }}", extra=True)
add("is", "{{ n is not odd }} {{ not n is odd }} {{ s is not string }}")
add("is", "{{ n is divisibleby 0 }}")
add("is", "{{ undefined_var is odd }}")
add("is", "{% if messages[0]['content'] is string %}str{% elif messages[0]['content'] is iterable %}it{% endif %}")

# ---- attribute vs item lookup -----------------------------------------------------------------
add("lookup", "{{ items_dict['items'] }} {{ items_dict['keys'] }} {{ items_dict.x }} {{ items_dict['x'] }}")
add("lookup", "{{ items_dict.items()|list }}")
add("lookup", "{% for k, v in items_dict.items() %}{{ k }}{% endfor %}")
add("lookup", "{{ items_dict.keys()|list }} {{ items_dict.values()|list }}")
add("lookup", "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }}")
add("lookup", "{{ nested.a.b.c[2].d }} {{ nested['a']['b']['c'][0] }} {{ nested.a.b.c.1 }}")
add("lookup", "{{ l[0] }} {{ l[-1] }} {{ l.0 }} {{ l[5] }}|{{ l[-5] }}|")
add("lookup", "{{ s[0] }} {{ s[-1] }} {{ u[0] }} {{ u[-1] }} {{ s[100] }}|")
add("lookup", "{{ messages[0].role }} {{ messages[0]['role'] }} {{ messages[-1].content }}")
add("lookup", "{{ d.zz }}|{{ d['zz'] }}|{{ l.zz }}|{{ s.zz }}|{{ n.zz }}|")
add("lookup", "{{ d.zz.yy }}")
add("lookup", "{{ d['zz']['yy'] }}")
add("lookup", "{{ undefined_var.attr }}")
add("lookup", "{{ undefined_var['key'] }}")
add("lookup", "{{ none.attr }}|{{ no.attr }}|")
add("lookup", "{{ no.attr.deeper }}")
add("lookup", "{{ l['0'] }}|{{ d[0] }}|")
add("lookup", "{{ d[none] }}|{{ {none: 'nk'}[none] }}|{{ {1: 'one'}[1] }}|{{ {1: 'one'}[1.0] }}|{{ {true: 'b'}[1] }}")
add("lookup", "{{ users[0].address is defined }} {{ users[2].address.city }} {{ users[0].address.city }}")
add("lookup", "{{ users[0].address.city.x }}")
add("lookup", "{{ messages[10] }}|{{ messages[10] is defined }}")
add("lookup", "{{ messages[10].role }}")
add("lookup", "{{ s.0 }}")

# ---- undefined --------------------------------------------------------------------------------
add("undef", "[{{ undefined_var }}]")
add("undef", "{{ undefined_var|length }} {{ undefined_var|list }} {{ undefined_var|join(',') }}|{{ undefined_var|upper }}|"
             "{{ undefined_var|trim }}|{{ undefined_var|first }}|")
add("undef", "{{ undefined_var|default('d') }} {{ undefined_var|d('d2') }} {{ no|default('d') }} {{ ''|default('d') }}"
             " {{ ''|default('d', true) }} {{ 0|default('d', boolean=true) }}")
add("undef", "{{ undefined_var + 1 }}")
add("undef", "{{ undefined_var * 2 }}")
add("undef", "{{ -undefined_var }}")
add("undef", "{{ undefined_var() }}")
add("undef", "{{ undefined_var|tojson }}")
add("undef", "{{ undefined_var|int }}")
add("undef", "{{ undefined_var|float }}", extra=True)
add("undef", "{{ undefined_var|string }}|{{ undefined_var ~ '' }}|")
add("undef", "{{ undefined_var == undefined_var }} {{ undefined_var != 1 }} {{ not undefined_var }}")
add("undef", "{{ undefined_var < 1 }}")
add("undef", "{{ [undefined_var] }}")
add("undef", "{{ {'k': undefined_var}|tojson }}")
add("undef", "{% set x = undefined_var %}[{{ x }}]{{ x is defined }}")
add("undef", "{{ undefined_var|items|list }}")
add("undef", "{% for x in undefined_var.child %}{% endfor %}")
add("undef", "{{ undefined_var.startswith('a') }}")
add("undef", "{{ undefined_var|capitalize }}|{{ undefined_var|lower }}|{{ undefined_var|replace('a', 'b') }}|")
add("undef", "{{ messages[0].nope is defined }} {{ messages[0].nope is none }} [{{ messages[0].nope }}]")
add("undef", "{{ messages[0].nope.startswith('x') }}")
add("undef", "{{ undefined_var|selectattr('a')|list }} {{ undefined_var|map(attribute='a')|list }}")

# ---- slicing ----------------------------------------------------------------------------------
add("slice", "{{ s[1:3] }}|{{ s[:5] }}|{{ s[6:] }}|{{ s[-5:] }}|{{ s[:-1] }}|{{ s[::2] }}|{{ s[::-1] }}|{{ s[5:1] }}|")
add("slice", "{{ l[1:] }} {{ l[:1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[10:] }} {{ l[1:-1] }} {{ l[-100:100] }}")
add("slice", "{{ u[::-1] }}|{{ u[1:4] }}|{{ u[-2:] }}")
add("slice", "{{ messages[1:]|length }} {{ messages[:-1]|map(attribute='role')|join(',') }} {{ messages[::-1][0].content }}")
add("slice", "{{ l[::0] }}")
add("slice", "{{ s[5:0:-1] }}|{{ s[-1:-4:-1] }}|{{ s[::-2] }}|{{ l[:0:-1] }}")
add("slice", "{{ (1, 2, 3)[1:] }} {{ ''[::-1] }}|{{ e[::-1] }}")
add("slice", "{{ n[1:] }}")
add("slice", "{{ d[1:] }}")
add("slice", "{{ s[n:] }}|{{ s[:n - 5] }}|{{ l[none:2] }}")

# ---- ternary ----------------------------------------------------------------------------------
add("ternary", "{{ 'a' if t else 'b' }} {{ 'a' if no else 'b' }} {{ 'a' if undefined_var else 'b' }}")
add("ternary", "[{{ 'only-if' if false }}]")
add("ternary", "{{ 'x' if n > 5 else 'y' if n > 0 else 'z' }}")
add("ternary", "{{ (1 if t else 2) + 10 }} {{ 'p' ~ ('q' if t else 'r') }}")
add("ternary", "{% set v = messages[0].content if messages[0].role == 'system' else '' %}[{{ v }}]")

# ---- calls of globals -------------------------------------------------------------------------
add("global", "{{ range(4)|list }} {{ range(2, 5)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}")
add("global", "{{ range(3)|length }} {{ range(5)[1] }}", extra=True)
add("global", "{{ range(3) }} {{ range(1, 9, 2) }}", extra=True,
    divergence_output=("[0, 1, 2] [1, 3, 5, 7]", "Python prints a range object as range(0, 3); carpool's "
                       "range() makes a list, which prints as one"))
add("global", "{{ range(0, 10, 0)|list }}")
add("global", "{{ dict(a=1, b='x') }} {{ dict() }}", extra=True)
add("global", "{{ namespace(a=1).a }}")
add("global", "{{ range(100001)|length }}")
add("global", "{% set j = joiner(', ') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}", extra=True)
add("global", "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}", extra=True)


# ---- filters of the issue ---------------------------------------------------------------------
add("filter", "[{{ ws|trim }}] [{{ 'xxhixx'|trim('x') }}] [{{ '  '|trim }}] [{{ '\\u3000wide\\u3000'|trim }}]")
add("filter", "{{ {'a': [1, 'é', none, true, 1.5]}|tojson }}")
add("filter", "{{ users|tojson }}")
add("filter", "{{ users[0]|tojson(indent=2) }}")
add("filter", "{{ {'a': [], 'b': {}, 'c': [1, [2, {}]]}|tojson(indent=4) }}")
add("filter", "{{ [1, 2]|tojson(indent=0) }}")
add("filter", "{{ {'a': 1, 'b': [1, 2]}|tojson(separators=(',', ':')) }}")
add("filter", "{{ {'a': 1}|tojson(indent=2, separators=(',', ': ')) }}")
add("filter", "{{ 'quote\" back\\\\ nl\\n tab\\t ctl\\x01 \\x7f </script> é 😀'|tojson }}")
add("filter", "{{ 1.0|tojson }} {{ 1e20|tojson }} {{ 0.1|tojson }} {{ 10|tojson }} {{ -0.0|tojson }} {{ 1e-7|tojson }}")
add("filter", "{{ none|tojson }} {{ true|tojson }} {{ ''|tojson }} {{ (1, 2)|tojson }}")
add("filter", "{{ {1: 'int key', none: 'none key', true: 'bool key', 1.5: 'float key'}|tojson }}")
add("filter", "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}")
add("filter", "{{ 'é'|tojson(ensure_ascii=true) }} {{ 'é'|tojson(ensure_ascii=false) }}")
add("filter", "{{ users[1]|tojson(2) }}")  # transformers' tojson: the first positional is ensure_ascii
add("filter", "{{ messages|tojson }}")
add("filter", "{{ namespace(a=1)|tojson }}")
add("filter", "{{ l|length }} {{ s|length }} {{ d|length }} {{ e|length }} {{ u|length }} {{ l|count }}")
add("filter", "{{ n|length }}")
add("filter", "{{ l|first }} {{ l|last }} {{ s|first }} {{ s|last }} [{{ e|first }}] [{{ e|last }}] {{ u|last }}")
add("filter", "{{ d|first }}")
add("filter", "{{ d|last }}", extra=True)
add("filter", "{{ l|join }} {{ l|join(', ') }} {{ s|join('-') }} {{ users|join(', ', attribute='name') }} {{ e|join(',') }}|")
add("filter", "{{ [1, none, 'a', 1.5, true]|join('|') }}")
add("filter", "{{ s|upper }} {{ s|lower }} {{ 'hELLO wORLD'|capitalize }} {{ u|upper }} {{ 'ÉCOLE ß'|lower }} {{ 'straße'|upper }}")
add("filter", "{{ s|replace('l', 'L') }} {{ s|replace('l', 'L', 2) }} {{ s|replace('', '-') }} {{ 'aaa'|replace('a', 'bb') }}")
add("filter", "{{ d|items|list }} {{ {}|items|list }}")
add("filter", "{{ s|list }} {{ d|list }} {{ l|list }} {{ (1, 2)|list }} {{ u|list }}")
add("filter", "{{ users|map(attribute='name')|join(',') }} {{ users|map(attribute='address.city')|list }}")
add("filter", "{{ users|map(attribute='address.city', default='?')|list }}")
add("filter", "{{ l|map('string')|join('') }} {{ ['a', 'b']|map('upper')|list }} {{ ['1', '2']|map('int')|sum }}", extra=True)
add("filter", "{{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|map(attribute='name')|list }}")
add("filter", "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}")
add("filter", "{{ messages|selectattr('role', 'eq', 'user')|list|length }} {{ messages|rejectattr('role', 'in', ['user', 'system'])|list }}")
add("filter", "{{ users|map(attribute='name')|length }}")  # a generator has no len() in Jinja2
add("filter", "{{ users|map(attribute='name')|last }}")
add("filter", "[{{ (users|map(attribute='name'))[0] }}]")
add("filter", "{{ users|selectattr('admin')|length }}")
add("filter", "{{ users|rejectattr('admin')|last }}")
add("filter", "{{ users|selectattr('address', 'defined')|map(attribute='name')|first }} {{ users|selectattr('age', 'gt', 30)|list|length }}")
add("filter", "{{ users|selectattr('address.city')|list|length }} {{ users|selectattr('tags')|list|length }}")
add("filter", "{{ users|selectattr('age', 'nosuchtest')|list }}")
add("filter", "{{ n|string }} {{ no|string }} {{ l|string }} {{ f|string }} {{ t|string }} {{ d|string }}")
add("filter", "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ -3.9|int }} {{ t|int }} {{ '  12  '|int }}")
add("filter", "{{ '0x1A'|int(0, 16) }} {{ '1A'|int(base=16) }} {{ '0b11'|int(0, 0) }} {{ none|int }} {{ ''|int }} {{ '1_000'|int }}")
add("filter", "{{ '<b>'|safe }} {{ s|safe }}")
add("filter", "[{{ 'a\\nb\\n\\nc'|indent }}]")
add("filter", "[{{ 'a\\nb\\n\\nc'|indent(2, true) }}]")
add("filter", "[{{ 'a\\nb\\n\\nc\\n'|indent(2, first=true, blank=true) }}]")
add("filter", "[{{ 'a\\nb'|indent('>> ') }}] [{{ ''|indent(4, true) }}] [{{ 'one'|indent(4) }}]")
add("filter", "[{{ 'a\\r\\nb'|indent(2) }}]")
add("filter", "{{ l|indent(2) }}|{{ l }}")  # Jinja2's indent of a list extends the list it is given
add("filter", "{{ d|items|map('first')|list }}", extra=True)

# ---- more filters (beyond the issue's list) ---------------------------------------------------
add("filter_x", "{{ l|sort }} {{ l|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='name')|list }} "
                "{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }}", extra=True)
add("filter_x", "{{ l|reverse|list }} {{ s|reverse }} {{ [1, 2, 1, 3, 2]|unique|list }}", extra=True)
add("filter_x", "{{ d|dictsort }} {{ d|dictsort(by='value') }}", extra=True)
add("filter_x", "{{ l|sum }} {{ users|sum(attribute='age') }} {{ l|min }} {{ l|max }} {{ [1.5, 2]|sum(start=10) }}", extra=True)
add("filter_x", "{{ (-0.0)|round(1, 'floor') }} {{ -0.00001|round(1, 'ceil') }} {{ -0.04|round(1) }}", extra=True)
add("filter_x", "{{ -5|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 2.5|round(0, 'floor') }} {{ 7|float }} {{ 'x'|float }}",
    extra=True)
add("filter_x", "{{ s|title }} {{ \"they're bill's\"|title }} {{ s|wordcount }} {{ 'ab'|center(6) }}|", extra=True)
add("filter_x", "{{ 'long sentence here'|truncate(9) }} {{ '%s-%d'|format('a', 3) }} {{ '<a&b>'|e }} {{ '<p>x</p>'|striptags }}",
    extra=True)
add("filter_x", "{{ l|batch(2)|list }} {{ l|slice(2)|list }}", extra=True)
add("filter_x", "{% for g in users|groupby('admin') %}{{ g.grouper }}:{{ g.list|length }} {% endfor %}", extra=True)
add("filter_x", "{{ l|select('odd')|list }} {{ l|reject('odd')|list }} {{ l|select('gt', 1)|list }} {{ [0, 1, '', 'a']|select|list }}",
    extra=True)
add("filter_x", "{{ users[0]|attr('name') }}", extra=True)
add("filter_x", "{{ d|pprint }}", extra=True)
add("filter_x", "{{ 'a b'|urlencode }}", extra=True)
add("filter_x", "{{ s|nosuchfilter }}")

# ---- string methods ---------------------------------------------------------------------------
add("str", "[{{ ws.strip() }}] [{{ ws.lstrip() }}] [{{ ws.rstrip() }}] [{{ 'xxhixx'.strip('x') }}] [{{ '\\n\\nx\\n'.lstrip('\\n') }}]"
           " [{{ 'abcba'.rstrip('ab') }}]")
add("str", "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'x'.split('x') }} {{ ''.split() }}")
add("str", "{{ 'a</think>b</think>c'.split('</think>')[-1] }} {{ 'a</think>b'.split('</think>')[0] }}")
add("str", "{{ s.startswith('He') }} {{ s.startswith('he') }} {{ s.endswith('ld') }} {{ s.startswith(('x', 'H')) }} "
           "{{ s.endswith('') }} {{ s.startswith('World', 6) }}")
add("str", "{{ s.upper() }} {{ s.lower() }} {{ u.upper() }} {{ s.replace('o', '0') }} {{ s.replace('o', '0', 1) }}")
add("str", "{{ 'hello wORLD foo-bar o\\'neil 3rd'.title() }} {{ 'ǆemal'.title() }}")
add("str", "{{ '{} and {}'.format('a', 1) }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} "
           "{{ '{:>5}|{:<3}|{:^5}'.format('r', 'l', 'c') }} {{ '{:.2f}'.format(3.14159) }}")
add("str", "{{ '{0.__class__}'.format(1) }}")
add("str", "{{ 'hello'.capitalize() }} {{ 'a-b'.count('-') }} {{ 'abc'.find('c') }} {{ 'abc'.find('z') }} "
           "{{ 'abc'.index('b') }}", extra=True)
add("str", "{{ ', '.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'Ab'.islower() }} "
           "{{ 'AB'.isupper() }}", extra=True)
add("str", "{{ 'ab'.center(6, '*') }} {{ '7'.zfill(3) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'a=b=c'.partition('=') }} "
           "{{ 'a=b=c'.rsplit('=', 1) }}", extra=True)
add("str", "{{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4, '.') }} {{ 'prefix-x'.removeprefix('prefix-') }} "
           "{{ 'x.txt'.removesuffix('.txt') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.rfind('c') }}", extra=True)
add("str", "{{ 'AbC'.swapcase() }}", extra=True)
add("str", "{{ 'ß'.casefold() }}", extra=True)
add("str", "{{ 'a\tb'.expandtabs(4) }}", extra=True)
add("str", "{{ 'x'.isidentifier() }} {{ 'Ab1'.isalnum() }} {{ 'A b'.istitle() }} {{ '12'.isnumeric() }} {{ '12'.isdecimal() }} "
           "{{ 'x'.isprintable() }} {{ 'x'.isascii() }}", extra=True)
add("str", "{{ 'abc'.translate({}) }}", extra=True)
add("str", "{{ 'abc'.encode('utf-8') }}", extra=True,
    divergence=(r"encode", "Python's str.encode gives bytes (b'abc'); carpool has no bytes type, so a string "
                "has no encode method"))
add("str", "{{ '\\N{BULLET}' }}", extra=True)
add("str", "{{ s.split(' ')|length }} {{ s.lower().split()|join('_') }} {{ s.strip().lower().replace(' ', '') }}")
add("str", "{{ s.nosuchmethod() }}")
add("str", "{{ s.split(1) }}")
add("str", "{{ s.upper() ~ s.lower() }}")
add("str", "{{ messages[0].content.startswith('sy') }} {{ messages[1]['content'].endswith('i') }}")
add("str", "{{ '<tool_response>x</tool_response>'.startswith('<tool_response>') and "
           "'<tool_response>x</tool_response>'.endswith('</tool_response>') }}")
add("str", "{{ 'x'.strip(none) }} {{ ' x '.split(none) }} {{ 'a b'.split(none, 1) }}")
add("str", "[{{ '\u00a0\u2003 x \u3000\n'.strip() }}] {{ 'a\u3000b\x1cc\u2028d'.split() }} [{{ '\u200bx\u200b'.strip() }}]")
add("str", "{{ 'ÉCOLE Ǆ'.lower() }} {{ 'ǆ straße ﬁ'.upper() }} {{ 'ǆ'.title() }} {{ 'ΣΑΣ'.lower() }} {{ 'İ'.lower()|length }}")
add("str", "{{ 'a b'.split(' ', -1) }} {{ 'a,b,c'.split(',', 0) }}")
add("str", "{{ 'abc'.split('') }}")
add("str", "{{ 'a\\nb'.splitlines('x') }}")
add("str", "{{ 'a\\nb\\r\\nc\\x85d\\u2028e'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }}", extra=True)
add("str", "{{ '  a  '.strip(' a') }}|{{ 'xyx'.lstrip('') }}|{{ 'aXbXc'.replace('X', '') }}|{{ 'aaa'.replace('a', 'b', 0) }}|"
           "{{ 'aaa'.replace('a', 'b', -1) }}")
add("str", "{{ '{:d}|{!r}|{:,}|{:5.1f}|{:<4}|{:x}'.format(3, 'a', 1234567, 2.25, 'ab', 255) }}")
add("str", "{{ '{0}{}'.format(1, 2) }}")
add("str", "{{ '{}'.format() }}")
add("str", "{{ '{a[0]}{b.c}'.format(a=[1], b={'c': 2}) }}")
add("str", "{{ '%s-%d' % ('a', 3) }} {{ '%.2f' % 3.14159 }} {{ '%s' % none }} {{ '%r' % 'x' }}", extra=True)
add("str", "{{ s.startswith() }}")
add("str", "{{ s.upper('x') }}")

# ---- dict methods -----------------------------------------------------------------------------
add("dict", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('b') }} {{ {}.get('x') }}")
add("dict", "{% for k, v in users[0].items() %}{{ k }}:{{ v }};{% endfor %}")
add("dict", "{{ d.copy() }}", extra=True)
add("dict", "{{ d.update({'z': 1}) }}")
add("dict", "{{ d.pop('a') }}")
add("dict", "{{ d.setdefault('z', 1) }}")
add("dict", "{{ d.clear() }}")
# A key named as a mutating method: the attribute is the refused method, not the item.
add("dict", "[{{ {'pop': 1, 'update': 2}.pop }}][{{ {'pop': 1}['pop'] }}]")
add("dict", "{% set m = {'update': 2, 'role': 'user'} %}{{ m.update is defined }} {{ m.role }}")
add("dict", "{{ l.append(4) }}")
add("dict", "{{ l.pop() }}", divergence=(r"unsafe", "Jinja2 3.1.2's ImmutableSandboxedEnvironment lets list.pop "
                                           "through (it is missing from its list of mutating methods); carpool's "
                                           "values are immutable, so it refuses every mutating method"))
add("dict", "{{ l.sort() }}")
add("dict", "{{ l.index(1) }} {{ l.count(3) }}", extra=True)

# ---- syntax errors and unsupported tags (both must refuse) ------------------------------------
add("syntax", "{% if %}x{% endif %}")
add("syntax", "{{ }}")
add("syntax", "{% endfor %}")
add("syntax", "{% if true %}unclosed")
add("syntax", "{% for x in l %}unclosed")
add("syntax", "{{ 1 + }}")
add("syntax", "{{ unclosed")
add("syntax", "{% nosuchtag %}")
add("syntax", "{% include 'other.jinja' %}")
add("syntax", "{% extends 'base.jinja' %}")
add("syntax", "{% import 'macros.jinja' as m %}")
add("syntax", "{% from 'm.jinja' import x %}")
add("syntax", "{% do l.append(1) %}")
add("syntax", "{{ [1, 2 }}")
add("syntax", "{{ x | }}")
add("syntax", "{% set %}")
add("syntax", "{% macro %}{% endmacro %}")
add("syntax", "{% else %}")
add("syntax", "{% continue %}")
add("syntax", "{{ 'unterminated }}")
add("syntax", "{# unterminated comment")
add("syntax", "{% if true %}{% endfor %}")
add("syntax", "{{ x is nosuchtest }}")
add("syntax", "{% for in l %}{% endfor %}")
add("syntax", "{{ a.1b }}")

# ---- chat-template idioms ---------------------------------------------------------------------
add("idiom", "{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + "
             "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    {"bos_token": "<s>", "add_generation_prompt": True})
add("idiom", "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
             "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
             "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
             "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
             "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
             "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
             "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
    {"bos_token": "<s>", "eos_token": "</s>"})
add("idiom", "{%- if tools %}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{%- endif %}",
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "enum": ["a", "b"]}}}}}]})
add("idiom", "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
             "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
             "{%- if ns.multi_step_tool and message.role == 'user' %}{%- set ns.multi_step_tool = false %}"
             "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}{{ ns.last_query_index }}")
add("idiom", "{%- for tool_call in tc %}{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
             "{{ tool_call.name }}:{% if tool_call.arguments is string %}{{ tool_call.arguments }}{% else %}"
             "{{ tool_call.arguments | tojson }}{% endif %};{%- endfor %}",
    {"tc": [{"function": {"name": "a", "arguments": "{\"x\": 1}"}}, {"name": "b", "arguments": {"y": [1, 2]}}]})
add("idiom", "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if tools is not none %}{{- 'Environment: ipython\\n' }}"
             "{%- endif %}{{- 'Cutting Knowledge Date: December 2023\\n' }}{{- 'Today Date: ' + date_string + '\\n\\n' }}",
    {"tools": None, "date_string": "26 Jul 2024"})
add("idiom", "{%- if messages[0]['content'] is string %}{%- set system_message = messages[0]['content']|trim %}{%- else %}"
             "{%- set system_message = messages[0]['content'][0]['text']|trim %}{%- endif %}[{{ system_message }}]",
    {"messages": [{"role": "system", "content": [{"type": "text", "text": "  parts system  "}]}]})
add("idiom", "{% for message in messages %}{% if message['content'] is not string %}{% for part in message['content'] %}"
             "{% if part['type'] == 'text' %}{{ part['text'] }}{% elif part['type'] == 'image' %}<image>{% endif %}"
             "{% endfor %}{% else %}{{ message['content'] }}{% endif %}{% endfor %}",
    {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]},
                  {"role": "assistant", "content": "ok"}]})
add("idiom", "{{ messages[0]['content'] | trim }}|{{ '<p>' + messages[1]['content'] | trim + '</p>' }}",
    {"messages": [{"role": "user", "content": None}, {"role": "user", "content": [{"type": "text", "text": "x"}]}]})
add("idiom", "{{ message.content.split('</think>')[-1].lstrip('\\n') }}|"
             "{{ message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
    {"message": {"content": "<think>\nreason\n</think>\n\nanswer"}})
add("idiom", "{%- if enable_thinking is defined and enable_thinking is false %}off{% else %}on{%- endif %}",
    {"enable_thinking": False})
add("idiom", "{{ (messages|selectattr('role', 'equalto', 'system')|list|length) > 0 }}")
add("idiom", "{% for m in messages %}{% if loop.first and m.role != 'system' %}{{ 'default system\\n' }}{% endif %}"
             "{{ m.role|upper }}: {{ m.content }}\n{% endfor %}")


# ---- random whitespace control ----------------------------------------------------------------
# Text with spaces, tabs, newlines and CRLF around if/else/for/set-block tags, {{ }} and {# #},
# each tag with a random -, + or no marker on either side: how trim_blocks, lstrip_blocks and the
# markers combine. Deterministic (a fixed seed).
def _random_whitespace_templates(count, seed=1401):
    import random
    rng = random.Random(seed)
    texts = ["a", "b c", " ", "  ", "\t", "\n", "\n\n", "  \n", "\n  ", " \t \n", "x\n  ", "\r\n", "y "]

    def tag(body):
        return "{%" + rng.choice(["", "-", "+", ""]) + " " + body + " " + rng.choice(["", "-", "+", ""]) + "%}"

    def var(expr):
        return "{{" + rng.choice(["", "-"]) + " " + expr + " " + rng.choice(["", "-"]) + "}}"

    def block(depth):
        out = []
        for _ in range(rng.randint(1, 4)):
            k = rng.random()
            if k < 0.35 or depth >= 3:
                out.append(rng.choice(texts))
            elif k < 0.5:
                out.append(var(rng.choice(["1", "'s'", "x"])))
            elif k < 0.58:
                out.append("{#" + rng.choice(["", "-"]) + " c " + rng.choice(["", "-"]) + "#}")
            elif k < 0.75:
                body = tag("if true") + block(depth + 1)
                if rng.random() < 0.3:
                    body += tag("else") + block(depth + 1)
                out.append(body + tag("endif"))
            elif k < 0.88:
                out.append(tag("for i in [1, 2]") + block(depth + 1) + tag("endfor"))
            else:
                out.append(tag("set y") + block(depth + 1) + tag("endset") + var("y"))
            if rng.random() < 0.4:
                out.append(rng.choice(texts))
        return "".join(out)

    return [block(0) for _ in range(count)]


for _t in _random_whitespace_templates(80):
    add("ws_random", _t, {"x": "X"})
