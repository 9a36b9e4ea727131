#!/usr/bin/python3
"""Writes json_value_test_cases.inc: JSON documents with what Python's json.loads makes of them
(the repr() of the result), the reference json_value_test.cc compares ParseJsonValue with.

  /usr/bin/python3 text/jinja/make_json_value_cases.py > text/jinja/json_value_test_cases.inc

json.loads reads the bytes (as a request's body is read: UTF-8, a leading BOM skipped) with
parse_int giving Python ints that fit in int64 and floats otherwise, the one thing carpool's
values cannot hold (Value::FromJson does the same). A case carpool refuses on purpose (json_value.h
lists them) names why; the script checks that json.loads indeed accepts it, so the list of
divergences stays true. Every other case json.loads refuses is expected to be refused, with the
fragment of carpool's message given.
"""
import json
import sys

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def parse_int(text):
    i = int(text)
    return i if INT64_MIN <= i <= INT64_MAX else float(text)


def loads(data):
    return json.loads(data, parse_int=parse_int)


OK = []          # documents json.loads accepts; carpool must give the same repr
REFUSED = []     # (document, fragment of carpool's message): json.loads refuses them too
DIVERGENT = []   # (document, fragment, why): json.loads accepts them, carpool does not


def ok(*docs):
    OK.extend(d.encode() if isinstance(d, str) else d for d in docs)


def refused(doc, fragment):
    REFUSED.append((doc.encode() if isinstance(doc, str) else doc, fragment))


def divergent(doc, fragment, why):
    DIVERGENT.append((doc.encode() if isinstance(doc, str) else doc, fragment, why))


# Scalars and numbers.
ok("null", "true", "false", " \t\r\n true \n", "0", "-0", "1", "-1", "123")
ok(str(INT64_MAX), str(INT64_MIN), str(INT64_MAX + 1), str(INT64_MIN - 1), str(2**64 - 1),
   str(2**64), "123456789012345678901234567890", "-123456789012345678901234567890",
   "9" * 300)
ok("1e2", "1E2", "1e+2", "1e-2", "-0.0", "0.0", "0.1", "1.5", "-1.5", "3.141592653589793",
   "1e16", "1e15", "1e-5", "1e-4", "0.1e1", "10.0e-1", "2.5E+20", "5e-324", "4e-324",
   "2.4703282292062328e-324", "2.4703282292062327e-324", "2e-324", "1e-400", "-1e-400",
   "0.000000000000000000000000001e-300", "1234e-330", "2.2250738585072014e-308",
   "1.7976931348623157e308", "1.7976931348623158e308", "0." + "0" * 400 + "1",
   "1" + "0" * 300, "123.456e-7", "0e0", "-0e-0", "1e0000000000000000000001",
   "0.30000000000000004", "100000000000000000000.0", "9007199254740993", "9007199254740993.0")

# Strings: escapes, UTF-8, the scan's 16-byte blocks.
ok('""', '"a"', '"it\'s"', '"say \\"hi\\""', '"both \' and \\""', '"\\\\ \\/ /"',
   '"\\b\\f\\n\\r\\t"', '"\\u0000"', '"a\\u0000b"', '"\\u001f\\u007f\\u0080\\u009f"',
   '"\\u00e9\\u00E9"', '"\\u20ac"', '"\\ud83d\\ude00"', '"\\uD83D\\uDE00x"', '"\\udbff\\udfff"',
   '"\\ud800\\udc00"', '"\\u2028\\u2029"', '"\\u200b\\ufeff"', '"\\uffff"', '"\\ufffd"',
   '"é€😀中文"', '"ascii then é"', '"\x7f"', '"tab\\there"', '"\u00a0nbsp"')
for n in (14, 15, 16, 17, 31, 32, 33):
    ok('"' + "x" * n + '\\n' + "y" * n + '"', '"' + "x" * n + '"', '"' + "x" * n + 'é"',
       '"' + "x" * n + '\\"' + '"')
ok('"' + "paragraph one.\\n\\nparagraph \\\"two\\\" with `code` and é, " * 40 + '"')
ok(b'"\xf0\x9f\x98\x80\xe2\x82\xac\xc3\xa9\xf4\x8f\xbf\xbf\xef\xbf\xbd"')

# Arrays, objects, nesting, repeated keys.
ok("[]", "{}", "[ ]", "{ }", "[1,2,3]", "[ 1 , 2 , 3 ]", '["a",1,1.5,true,null,[],{}]',
   '{"a":1}', '{"a" : 1 , "b" : [true, {"c": null}]}', '{"": 0}', '{"é": "\\u00e9"}',
   '[[[[[[[[[[1]]]]]]]]]]', '{"a":{"b":{"c":{"d":[{"e":{}}]}}}}',
   '{"a": 1, "b": 2, "a": 3}', '{"a": 1, "a": {"x": 1}, "b": 2}', '{"k": 1, "k": 2, "k": 3}',
   '[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"x"}]}]',
   '{"b": 1, "a": 2}')
big = ", ".join(f'"k{i}": {i}' for i in range(40))
ok("{" + big + ', "k3": "again", "k30": "again", "new": 1}', "{" + big + "}")
ok("[" + ",".join(str(i) for i in range(100)) + "]")
ok(b"\xef\xbb\xbf[1]", b"\xef\xbb\xbf \"x\"")

# What json.loads refuses too.
for doc, fragment in [
        ("", "expected a value at byte 0, found the end of the text"),
        (" ", "expected a value at byte 1"),
        ("[", "expected a value at byte 1"),
        ("[1", "expected ',' or ']' at byte 2"),
        ("[1,]", "expected a value at byte 3, found ']'"),
        ("[1 2]", "expected ',' or ']' at byte 3, found '2'"),
        ('{"a":1,}', "expected a string key at byte 7, found '}'"),
        ("{a:1}", "expected a string key at byte 1, found 'a'"),
        ('{"a" 1}', "expected ':' at byte 5, found '1'"),
        ('{"a":1', "expected ',' or '}' at byte 6"),
        ("01", "unexpected '1' after the JSON value at byte 1"),
        ("1.", "expected a digit after '.' at byte 2"),
        (".5", "expected a value at byte 0, found '.'"),
        ("+1", "expected a value at byte 0, found '+'"),
        ("-", "expected a digit at byte 1"),
        ("-a", "expected a digit at byte 1, found 'a'"),
        ("1e", "expected a digit in the exponent at byte 2"),
        ("1e+", "expected a digit in the exponent at byte 3"),
        ("[1] x", "unexpected 'x' after the JSON value at byte 4"),
        ("tru", "expected a value at byte 0"),
        ("nul", "expected a value at byte 0"),
        ("True", "expected a value at byte 0, found 'T'"),
        ("'a'", "expected a value at byte 0, found '''"),
        ('"\\x"', "invalid escape: a backslash followed by 'x' at byte 1"),
        ('"\\u12"', "a \\u escape needs four hex digits at byte 1"),
        ('"\\u12g4"', "a \\u escape needs four hex digits at byte 1"),
        ('"abc', "unterminated string starting at byte 0"),
        ('"abc\\', "unterminated escape at byte 4"),
        ('"a\tb"', "a control character (0x09) must be escaped in a string at byte 2"),
        (b'"a\x00b"', "a control character (0x00) must be escaped in a string at byte 2"),
        ('"a\nb"', "a control character (0x0a) must be escaped in a string at byte 2"),
        (b'"\xff"', "invalid UTF-8 at byte 1"),
        (b'"ab\x80"', "invalid UTF-8 at byte 3"),
        (b'"\xc0\x80"', "invalid UTF-8 at byte 1"),
        (b'"\xc1\xbf"', "invalid UTF-8 at byte 1"),
        (b'"\xe0\x80\x80"', "invalid UTF-8 at byte 1"),
        (b'"\xf0\x80\x80\x80"', "invalid UTF-8 at byte 1"),
        (b'"\xf4\x90\x80\x80"', "invalid UTF-8 at byte 1"),
        (b'"\xf5\x80\x80\x80"', "invalid UTF-8 at byte 1"),
        (b'"\xe2\x82"', "invalid UTF-8 at byte 1"),
        (b'"' + b"x" * 20 + b'\xe2\x82', "invalid UTF-8 at byte 21"),
        (b"[\xff]", "expected a value at byte 1, found invalid UTF-8"),
        (b"[1]\xc3\xa9", "unexpected 'é' after the JSON value at byte 3"),
        (b"\xef\xbb\xbf", "expected a value at byte 3"),
        ("[1]]", "unexpected ']' after the JSON value at byte 3"),
        ("{}{}", "unexpected '{' after the JSON value at byte 2"),
        ('["a\\u00"]', "a \\u escape needs four hex digits at byte 3"),
]:
    refused(doc, fragment)

# What json.loads accepts and carpool refuses (json_value.h says why).
for doc, fragment, why in [
        ('"\\ud800"', "lone surrogate \\ud800 at byte 1", "a lone surrogate"),
        ('"\\udc00"', "lone surrogate \\udc00 at byte 1", "a lone surrogate"),
        ('"\\uDFFF"', "lone surrogate \\uDFFF at byte 1", "a lone surrogate"),
        ('"x\\ud800\\u0041"', "lone surrogate \\ud800 at byte 2", "a lone surrogate"),
        ('"\\ud800x"', "lone surrogate \\ud800 at byte 1", "a lone surrogate"),
        ('"\\ud800\\ud800"', "lone surrogate \\ud800 at byte 1", "a lone surrogate"),
        ('"\\ude00\\ud83d"', "lone surrogate \\ude00 at byte 1", "a lone surrogate"),
        (b'"\xed\xa0\x80"', "invalid UTF-8 at byte 1", "an encoded surrogate (surrogatepass)"),
        (b'"\xed\xbf\xbf"', "invalid UTF-8 at byte 1", "an encoded surrogate (surrogatepass)"),
        ("NaN", "NaN is not JSON at byte 0", "NaN"),
        ("[Infinity]", "Infinity is not JSON at byte 1", "Infinity"),
        ("-Infinity", "-Infinity is not JSON at byte 0", "-Infinity"),
        ("1e400", "number too large for a double at byte 0", "inf"),
        ("[-1e400]", "number too large for a double at byte 1", "-inf"),
        ("1" + "0" * 400 + ".0", "number too large for a double at byte 0", "inf"),
        ("1.7976931348623159e308", "number too large for a double at byte 0", "inf"),
]:
    divergent(doc, fragment, why)


def c_string(data):
    """A C++ string literal of `data`'s bytes (octal escapes: they end after three digits)."""
    out = []
    for b in data:
        c = chr(b)
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif 0x20 <= b < 0x7F and c != "?":
            out.append(c)
        else:
            out.append("\\%03o" % b)
    return '"' + "".join(out) + '"'


def main():
    lines = [
        "// Generated by make_json_value_cases.py with /usr/bin/python3's json.loads: do not edit.",
        "// {document, its length, repr() of json.loads' result or nullptr, carpool's error fragment}",
        "const JsonCase kJsonCases[] = {",
    ]
    for doc in OK:
        value = loads(doc)
        lines.append(f"    {{{c_string(doc)}, {len(doc)}, {c_string(repr(value).encode())}, nullptr}},")
    for doc, fragment in REFUSED:
        try:
            value = loads(doc)
        except (ValueError, UnicodeDecodeError):
            pass
        else:
            sys.exit(f"json.loads accepts {doc!r} ({value!r}): not a refusal")
        lines.append(f"    {{{c_string(doc)}, {len(doc)}, nullptr, {c_string(fragment.encode())}}},")
    lines.append("    // json.loads accepts these; carpool refuses them on purpose (json_value.h).")
    for doc, fragment, why in DIVERGENT:
        value = loads(doc)  # raises if json.loads refuses it: then it is no divergence
        lines.append(f"    // {why}: json.loads gives {ascii(value)[:60]}")
        lines.append(f"    {{{c_string(doc)}, {len(doc)}, nullptr, {c_string(fragment.encode())}}},")
    lines.append("};")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
