"""What the chat template tests share: finding and running carpool-jinja-render, and comparing its
answers with Jinja2's.

Environment (set by the ctest entries, tests/chat_template/run_tests.sh):
  CARPOOL_JINJA_RENDER          the driver binary (default: BUILD/bin/carpool-jinja-render)
  CARPOOL_CHAT_TEMPLATE_REPORT_DIR  where mismatch reports go (default build/chat-template-parity)
"""

import json
import os
import re
import selectors
import subprocess
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "build")

# strftime_now formats in the local time zone, on both sides: pin it.
os.environ["TZ"] = "UTC"
time.tzset()


def driver_path():
    return os.environ.get("CARPOOL_JINJA_RENDER", os.path.join(BUILD, "bin", "carpool-jinja-render"))


def report_dir():
    d = os.environ.get("CARPOOL_CHAT_TEMPLATE_REPORT_DIR", os.path.join(BUILD, "chat-template-parity"))
    os.makedirs(d, exist_ok=True)
    return d


def run_driver(requests, chat=False, timeout_per_case_s=10.0):
    """Each request through carpool-jinja-render, in one process while it lives.

    Returns one answer per request. A request the driver died on (a crash) or stalled on (no
    answer within timeout_per_case_s) answers {"ok": False, "crashed": True, "error": ...}; the
    driver is restarted after it, so one bad case costs only itself.
    """
    args = [driver_path()] + (["--chat"] if chat else [])
    lines = [(json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8") for r in requests]
    answers = []
    while len(answers) < len(lines):
        answers.extend(_run_until_failure(args, lines[len(answers):], timeout_per_case_s))
    return answers


def _run_until_failure(args, lines, timeout_s):
    errfile = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile)

    def feed():
        try:
            for line in lines:
                proc.stdin.write(line)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    answers = []
    buf = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    why = None
    while len(answers) < len(lines):
        if b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                answers.append(json.loads(line.decode("utf-8", "replace")))
            continue
        if not sel.select(timeout_s):
            why = f"no answer within {timeout_s} s (killed)"
            break
        chunk = os.read(proc.stdout.fileno(), 1 << 16)
        if not chunk:
            break
        buf += chunk
    sel.close()
    if len(answers) < len(lines):
        proc.kill()
        proc.wait()
        if why is None:
            errfile.seek(0)
            err = errfile.read().decode("utf-8", "replace")[-500:]
            why = f"carpool-jinja-render exited with {proc.returncode}: {err}"
        answers.append({"ok": False, "crashed": True, "error": why})
    else:
        proc.stdout.close()
        proc.wait()
    errfile.close()
    writer.join(timeout=5)
    return answers


def same(reference, carpool, allow_unsupported=False):
    """(passed, why): the same output, or both raised (raise_exception's message kept).

    allow_unsupported: carpool refusing the template at parse time as unsupported also passes.
    """
    if carpool.get("crashed"):
        return False, "carpool crashed or hung: " + carpool["error"]
    if reference["ok"] and carpool["ok"]:
        if reference["output"] == carpool["output"]:
            return True, "same output"
        return False, "different output"
    if not reference["ok"] and not carpool["ok"]:
        ref_err = reference["error"]
        if ref_err.startswith("TemplateError: "):  # raise_exception(message)
            message = ref_err[len("TemplateError: "):]
            if message not in carpool["error"]:
                return False, "both raised, but carpool's error lacks raise_exception's message"
        message = ref_err.split(": ", 1)[-1]
        if message and message in carpool["error"]:
            return True, "both raised (the same message)"
        return True, "both raised (other messages)"
    if (allow_unsupported and not carpool["ok"] and carpool.get("phase") == "parse"
            and re.search(r"unsupported|not supported", carpool["error"])):
        return True, "carpool refuses it at parse time as unsupported"
    if reference["ok"]:
        return False, "Jinja2 renders, carpool raises"
    return False, "Jinja2 raises, carpool renders"


def first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n if len(a) != len(b) else -1


def describe(case_text, reference, carpool, why):
    lines = [why, "  case:    " + case_text]
    if reference["ok"]:
        lines.append("  jinja2:  " + repr(reference["output"])[:400])
    else:
        lines.append("  jinja2 raises:  " + reference["error"][:300])
    if carpool.get("ok"):
        lines.append("  carpool: " + repr(carpool["output"])[:400])
        if reference["ok"]:
            i = first_difference(reference["output"], carpool["output"])
            lines.append(f"  first difference at character {i}: jinja2 {reference['output'][i:i + 30]!r} "
                         f"carpool {carpool['output'][i:i + 30]!r}")
    else:
        lines.append("  carpool raises: " + carpool.get("error", "")[:300])
    return "\n".join(lines)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
