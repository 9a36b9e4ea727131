#!/usr/bin/env python3
"""Writes the tokenizer parity corpus: JSON lines {"text": ...}, deterministic (fixed seed, no
network, no input files).

The strings cover what a tokenizer.json implementation gets wrong first: prose in many scripts
(generated from code point ranges, plus a few sentences written for this corpus), code, JSON,
numbers of every length, whitespace and newline runs, emoji sequences, combining marks and
NFC/NFD-different forms, the special and added tokens of the tested tokenizers inside text,
contractions in every case, very long words, and the empty and one-character edges.

usage: make_corpus.py OUT [--small]   (--small: every 8th string plus every added-token string)
"""

import json
import random
import sys
import unicodedata

SEED = 20261201
OLD_UCD = unicodedata.ucd_3_2_0  # characters assigned since Unicode 3.2 classify the same everywhere


def cp_range(lo, hi, cats=("L", "M", "N")):
    """Code points in [lo, hi] assigned in Unicode 3.2 whose category starts with one of cats."""
    out = []
    for cp in range(lo, hi + 1):
        ch = chr(cp)
        cat = OLD_UCD.category(ch)
        if cat != "Cn" and cat[0] in cats:
            out.append(ch)
    return out


def letters(*ranges):
    out = []
    for lo, hi in ranges:
        out.extend(cp_range(lo, hi, cats=("L",)))
    return out


def marks(*ranges):
    out = []
    for lo, hi in ranges:
        out.extend(cp_range(lo, hi, cats=("M",)))
    return out


# Each script: letters, combining marks used inside words (may be empty), word separator,
# sentence punctuation, digits of the script (may be empty).
SCRIPTS = {
    "latin": (letters((0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x1E00, 0x1EFF)), [], " ",
              list(".,;:!?"), list("0123456789")),
    "greek": (letters((0x391, 0x3A9), (0x3AC, 0x3CE), (0x1F00, 0x1FFC)), [], " ",
              [".", ",", ";", "\u00b7"], []),
    "cyrillic": (letters((0x410, 0x44F), (0x400, 0x40F), (0x450, 0x45F), (0x460, 0x4FF)), [], " ",
                 list(".,!?:;") + ["\u2014", "\u00ab", "\u00bb"], []),
    "armenian": (letters((0x531, 0x556), (0x561, 0x587)), [], " ", ["\u0589", ",", "\u055e"], []),
    "hebrew": (letters((0x5D0, 0x5EA)), marks((0x5B0, 0x5BC)), " ", [".", ",", "\u05be", "?"], []),
    "arabic": (letters((0x621, 0x63A), (0x641, 0x64A)), marks((0x64B, 0x652)), " ",
               ["\u060c", "\u061f", ".", "\u061b"], [chr(c) for c in range(0x660, 0x66A)]),
    "devanagari": (letters((0x905, 0x939)), marks((0x93E, 0x94D)), " ", ["\u0964", ",", "?"],
                   [chr(c) for c in range(0x966, 0x970)]),
    "bengali": (letters((0x985, 0x9B9)), marks((0x9BE, 0x9CD)), " ", ["\u0964", ","],
                [chr(c) for c in range(0x9E6, 0x9F0)]),
    "tamil": (letters((0xB85, 0xBB9)), marks((0xBBE, 0xBCD)), " ", [".", ","],
              [chr(c) for c in range(0xBE7, 0xBF0)]),
    "thai": (letters((0xE01, 0xE2E)), marks((0xE31, 0xE3A), (0xE47, 0xE4E)), "", [" ", "\u0e2f"],
             [chr(c) for c in range(0xE50, 0xE5A)]),
    "georgian": (letters((0x10D0, 0x10F6)), [], " ", [".", ",", "!"], []),
    "ethiopic": (letters((0x1200, 0x1357)), [], " ", ["\u1362", "\u1363"], []),
    "chinese": (letters((0x4E00, 0x9FA5)), [], "", ["\u3002", "\uff0c", "\uff01", "\uff1f",
                                                    "\u300c", "\u300d"], []),
    "japanese": (letters((0x3041, 0x3093), (0x30A1, 0x30F6), (0x4E00, 0x6000)), [], "",
                 ["\u3002", "\u3001", "\u30fb", "\uff01"], []),
    "korean": (letters((0xAC00, 0xD7A3)), [], " ", [".", ",", "?"], []),
    "cjk_ext_b": (letters((0x20000, 0x2A6D6)), [], "", ["\u3002"], []),
    "fullwidth": ([chr(c) for c in range(0xFF21, 0xFF3B)] + [chr(c) for c in range(0xFF41, 0xFF5B)],
                  [], "\u3000", ["\uff0e", "\uff0c", "\uff01"], [chr(c) for c in range(0xFF10, 0xFF1A)]),
}

# Sentences written for this corpus.
HAND_SENTENCES = [
    "The router counts every prompt token before it admits a request.",
    "A worker hands its tokenizer to the router when it registers.",
    "Tokens arrive one at a time; the text must never break inside a character.",
    "She said: \"stop here\" -- and the stream stopped.",
    "Is 3.14 close enough to pi? Not for this test!",
    "Ten small boats sailed past the old lighthouse at dawn.",
    "My cat doesn't care about byte pair encodings, but I do.",
    "Le routeur compte les jetons avant d'accepter la requ\u00eate.",
    "\u00c7a marche tr\u00e8s bien, m\u00eame avec des accents \u00e9tranges.",
    "Der Z\u00e4hler l\u00e4uft \u00fcber gro\u00dfe Stra\u00dfen und kleine Gassen.",
    "El ni\u00f1o comi\u00f3 una manzana en la ma\u00f1ana fr\u00eda.",
    "Jo\u00e3o n\u00e3o p\u00f4de vir \u00e0 reuni\u00e3o de s\u00e1bado.",
    "\u017b\u00f3\u0142w pije w\u00f3d\u0119 przy \u015bcie\u017cce.",
    "\u041c\u0430\u0440\u0448\u0440\u0443\u0442\u0438\u0437\u0430\u0442\u043e\u0440 \u0441\u0447\u0438\u0442\u0430\u0435\u0442 \u0442\u043e\u043a\u0435\u043d\u044b.",
    "\u0397 \u03b3\u03ac\u03c4\u03b1 \u03ba\u03bf\u03b9\u03bc\u03ac\u03c4\u03b1\u03b9 \u03c3\u03c4\u03bf \u03c0\u03b1\u03c1\u03ac\u03b8\u03c5\u03c1\u03bf.",
    "\u732b\u306f\u7a93\u306e\u305d\u3070\u3067\u5bdd\u3066\u3044\u308b\u3002",
    "\u4eca\u5929\u7684\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u5427\u3002",
    "\uc624\ub298\uc740 \ub0a0\uc528\uac00 \uc88b\uc2b5\ub2c8\ub2e4.",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0643 \u0641\u064a \u0627\u0644\u0645\u062f\u064a\u0646\u0629.",
    "\u092f\u0939 \u090f\u0915 \u091b\u094b\u091f\u093e \u0935\u093e\u0915\u094d\u092f \u0939\u0948\u0964",
    "\u05e9\u05dc\u05d5\u05dd \u05dc\u05db\u05d5\u05dc\u05dd.",
    "\u0e41\u0e21\u0e27\u0e19\u0e2d\u0e19\u0e2b\u0e25\u0e31\u0e1a\u0e1a\u0e19\u0e40\u0e01\u0e49\u0e32\u0e2d\u0e35\u0e49",
    "Numbers: 1, 22, 333, 4444, 55555 and -6.02e23.",
    "Mix: English, \u65e5\u672c\u8a9e, \u0440\u0443\u0441\u0441\u043a\u0438\u0439, \u0627\u0644\u0639\u0631\u0628\u064a\u0629 and emoji \U0001F600 in one line.",
]

SPECIAL_TOKENS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|reserved_special_token_0|>", "<|reserved_special_token_5|>",
    "<|reserved_special_token_247|>", "<|finetune_right_pad_id|>", "<|python_tag|>", "<|eom_id|>",
    "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|box_start|>", "<|vision_pad|>", "<tool_response>",
]
# Added tokens of the synthetic tokenizers (tests/tokenizer/make_synthetic.py).
SYNTHETIC_ADDED = ["[MASK]", "<sep>", "<cls>", "<pad>", "<eos>", "<bos>", "@@", "Hello",
                   "<lst>", "<rst>", "<both>", "word", "<NORM>", "<br>", "New York", "ice cream",
                   "h\u00e9llo", "\u00fcn\u00ef", "<|user|>", " spaced"]
ALL_ADDED = SPECIAL_TOKENS + SYNTHETIC_ADDED

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
CONTRACTION_WORDS = ["don't", "can't", "won't", "it's", "I'm", "we're", "they've", "you'll",
                     "she'd", "let's", "y'all", "o'clock", "rock'n'roll", "isn't", "we'd've"]

EMOJI_BASE = [0x1F600, 0x1F602, 0x1F60D, 0x1F914, 0x1F44D, 0x1F44B, 0x1F64F, 0x1F525, 0x2764,
              0x1F680, 0x1F389, 0x1F4A9, 0x1F916, 0x1F40D, 0x1F355, 0x2600, 0x2614, 0x1F9E0]
SKIN_TONES = [0x1F3FB, 0x1F3FC, 0x1F3FD, 0x1F3FE, 0x1F3FF]
ZWJ = "\u200d"
PEOPLE = [0x1F468, 0x1F469, 0x1F467, 0x1F466, 0x1F9D1]
FLAGS = ["US", "FR", "JP", "DE", "IN", "BR", "KE", "UA", "IL", "EG", "KR", "CN", "GE", "AM", "TH"]

CODE_TEMPLATES = [
    "def {f}({a}, {b}=None):\n    \"\"\"{doc}\"\"\"\n    if {b} is None:\n        return {a} * {n}\n    return [{a} + i for i in range({b})]\n",
    "class {F}:\n    def __init__(self):\n        self.{a} = {{}}\n\n    def __repr__(self):\n        return f\"{F}({{self.{a}!r}})\"\n",
    "#include <vector>\n\nint {f}(const std::vector<int>& {a}) {{\n  int {b} = 0;\n  for (int x : {a}) {b} += x * {n};\n  return {b};\n}}\n",
    "template <typename T>\nstruct {F} {{\n\tT {a};\n\tT {b}[{n}];\n}};  // {doc}\n",
    "function {f}({a}, {b}) {{\n  const r = {a}.map((x) => x ** 2).filter(Boolean);\n  return r.length > {n} ? r : null;\n}}\n",
    "fn {f}({a}: &[u8]) -> Result<usize, String> {{\n    let {b}: usize = {a}.iter().map(|&c| c as usize).sum();\n    Ok({b} % {n})\n}}\n",
    "func {f}({a} []string) (map[string]int, error) {{\n\t{b} := make(map[string]int)\n\tfor _, s := range {a} {{\n\t\t{b}[s]++\n\t}}\n\treturn {b}, nil\n}}\n",
    "SELECT {a}, COUNT(*) AS {b}\nFROM {f}\nWHERE {a} <> '' AND {b} >= {n}\nGROUP BY {a}\nORDER BY 2 DESC;\n",
    "#!/bin/sh\nset -eu\nfor {a} in $(seq 1 {n}); do\n  echo \"${{{a}}}\" >> /tmp/{f}.log 2>&1 || true\ndone\n",
    "<div class=\"{a}\" id='{b}'>\n  <p>{doc} &amp; more&nbsp;text</p>\n  <!-- {n} -->\n</div>\r\n",
    "{a} = lambda x: x if x <= {n} else {f}(x // 2)  # {doc}\n",
    "    if ({a} != {b} && !{f}) {{ /* {doc} */ }}\n\n\n",
    "@decorator(\"{f}\")\nasync def {a}(*args, **kwargs) -> dict[str, int]:\n    await {b}()\n",
    "let {a} = `template ${{{b}}} and \\${{escaped}} {n}`;\r\nconsole.log({a});\r\n",
    "x[{n}] = {{'{a}': [1, 2, 3], \"{b}\": (4, 5)}}\n",
]
IDENTS = ["count", "value", "tokenize", "admit", "router_id", "kvBlocks", "__init__", "self",
          "HTTPServer", "parse_json", "x1", "_tmp", "streamDecode", "MAX_LEN", "i", "utf8Len"]
DOCS = ["Return the total.", "TODO: handle errors", "naive O(n^2) version", "", "see docs/x.md",
        "ça dépend", "返回结果", "Счётчик"]


class Corpus:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.items = []  # (text, is_added_token_string)

    def add(self, text, added=False):
        self.items.append((text, added))

    # ---- generators -------------------------------------------------------------------------
    def word(self, script, lo=1, hi=9):
        letters_, marks_, _, _, _ = SCRIPTS[script]
        rng = self.rng
        n = rng.randint(lo, hi)
        out = []
        for _ in range(n):
            out.append(rng.choice(letters_))
            if marks_ and rng.random() < 0.35:
                out.append(rng.choice(marks_))
        w = "".join(out)
        if script in ("latin", "greek", "cyrillic", "armenian", "georgian") and rng.random() < 0.2:
            w = w.capitalize()
        return w

    def sentence(self, script, words_lo=3, words_hi=14):
        _, _, sep, punct, digits = SCRIPTS[script]
        rng = self.rng
        parts = []
        for _ in range(rng.randint(words_lo, words_hi)):
            if digits and rng.random() < 0.08:
                parts.append("".join(rng.choice(digits) for _ in range(rng.randint(1, 6))))
            else:
                parts.append(self.word(script))
            if rng.random() < 0.12:
                parts[-1] += rng.choice(punct)
        return sep.join(parts) + rng.choice(punct)

    def number(self):
        rng = self.rng
        n = rng.randint(1, 40)
        digits = "".join(rng.choice("0123456789") for _ in range(n))
        kind = rng.randrange(9)
        if kind == 0:
            return digits
        if kind == 1:
            return rng.choice("+-") + digits
        if kind == 2:  # thousands separators
            sep = rng.choice([",", ".", " ", "_", "'", "\u00a0", "\u202f"])
            groups = []
            while digits:
                groups.insert(0, digits[-3:])
                digits = digits[:-3]
            return sep.join(groups)
        if kind == 3:
            cut = rng.randint(0, n)
            return (digits[:cut] or "0") + rng.choice(".,") + (digits[cut:] or "0")
        if kind == 4:
            return digits[:1] + "." + digits[1:6] + rng.choice(["e", "E"]) + rng.choice(["", "+", "-"]) + str(rng.randint(0, 308))
        if kind == 5:
            return "0x" + "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randint(1, 16)))
        if kind == 6:
            return rng.choice(["$", "\u20ac", "\u00a3", "\u00a5", ""]) + digits[:12] + rng.choice(["%", "", " USD", "k", "\u00b0C"])
        if kind == 7:  # dates, times, versions, phone numbers
            return rng.choice([
                f"{rng.randint(1900, 2099)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999)}",
                f"v{rng.randint(0, 20)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}",
                f"+{rng.randint(1, 999)} ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
            ])
        return " ".join(digits[i:i + rng.randint(1, 5)] for i in range(0, n, 5))

    def emoji(self):
        rng = self.rng
        kind = rng.randrange(7)
        if kind == 0:
            return chr(rng.choice(EMOJI_BASE))
        if kind == 1:
            return chr(rng.choice([0x1F44D, 0x1F44B, 0x1F64F, 0x1F9D1, 0x1F466])) + chr(rng.choice(SKIN_TONES))
        if kind == 2:  # family / couple ZWJ sequences, with and without tones
            members = [chr(rng.choice(PEOPLE)) + (chr(rng.choice(SKIN_TONES)) if rng.random() < 0.4 else "")
                       for _ in range(rng.randint(2, 4))]
            return ZWJ.join(members)
        if kind == 3:  # flag from regional indicators
            code = rng.choice(FLAGS)
            return "".join(chr(0x1F1E6 + ord(c) - ord("A")) for c in code)
        if kind == 4:  # keycap and variation selectors
            return rng.choice("0123456789#*") + "\ufe0f\u20e3"
        if kind == 5:
            return rng.choice(["\u2764\ufe0f", "\u2764\ufe0f\u200d\U0001F525", "\U0001F3F3\ufe0f\u200d\U0001F308",
                               "\U0001F469\u200d\U0001F4BB", "\U0001F9D1\U0001F3FD\u200d\U0001F680",
                               "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"])
        return "".join(chr(rng.choice(EMOJI_BASE)) for _ in range(rng.randint(2, 8)))

    def combining(self):
        rng = self.rng
        kind = rng.randrange(5)
        base = self.word("latin", 3, 10)
        if kind == 0:  # NFD of a precomposed word (differs from NFC)
            return unicodedata.normalize("NFD", self.word(rng.choice(["latin", "greek", "cyrillic"]), 3, 10))
        if kind == 1:  # base letters with stacked combining marks (several orders)
            out = []
            for ch in base:
                out.append(ch)
                for _ in range(rng.randint(0, 3)):
                    out.append(chr(rng.choice([0x300, 0x301, 0x302, 0x303, 0x308, 0x30A, 0x323, 0x327, 0x328, 0x331, 0x35C, 0x361])))
            return "".join(out)
        if kind == 2:  # Hangul: precomposed vs conjoining jamo
            syl = "".join(chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(rng.randint(1, 6)))
            return rng.choice([syl, unicodedata.normalize("NFD", syl)])
        if kind == 3:  # compatibility characters (NFKC changes them, NFC keeps them)
            return "".join(rng.choice(["\ufb01", "\ufb02", "\u2460", "\u00bd", "\u2126", "\u212b", "\u1e9b\u0323",
                                       "\uff21", "\u3000", "\u2028", "\u00b5", "\u2167", "\u33a1", "\u00aa",
                                       "\u0130", "\u03d2\u0301", "x\u0338", "\u1100\u1161\u11a8"]) for _ in range(rng.randint(1, 6)))
        return "".join(rng.choice(["e\u0301", "\u00e9", "a\u030a", "\u00e5", "\u212b", "o\u0308\u0304",
                                   "\u022b", "\u0928\u093c", "\u0929", "\u05e9\u05c1\u05bc", "\u0627\u0653"])
                       for _ in range(rng.randint(1, 8)))

    def whitespace_run(self):
        rng = self.rng
        pieces = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\x0b", "\x0c", "\u2028", "\u0085"]
        weights = [30, 8, 10, 6, 2, 2, 1, 1, 1, 1, 1, 1]
        return "".join(rng.choices(pieces, weights)[0] for _ in range(rng.randint(1, 40)))

    def json_value(self, depth=0):
        rng = self.rng
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return rng.randint(-10**9, 10**9)
        if kind == 1:
            return round(rng.uniform(-1e6, 1e6), rng.randint(0, 6))
        if kind == 2:
            return rng.choice([True, False, None])
        if kind == 3:
            return rng.choice([self.word("latin"), self.sentence(rng.choice(list(SCRIPTS)), 1, 4), "", "a\"b\\c", "line1\nline2"])
        if kind in (4, 5):
            return {rng.choice(IDENTS) + str(i): self.json_value(depth + 1) for i in range(rng.randint(0, 5))}
        return [self.json_value(depth + 1) for _ in range(rng.randint(0, 5))]

    def random_unicode(self, n):
        rng = self.rng
        out = []
        while len(out) < n:
            cp = rng.choice([rng.randint(0x20, 0x7F), rng.randint(0xA0, 0x2FFF), rng.randint(0x3000, 0xD7FF),
                             rng.randint(0xE000, 0xFFFD), rng.randint(0x10000, 0x1FFFF)])
            ch = chr(cp)
            if OLD_UCD.category(ch) not in ("Cn", "Cs"):
                out.append(ch)
        return "".join(out)

    # ---- sections -----------------------------------------------------------------------------
    def build(self):
        rng = self.rng
        # Edges.
        self.add("")
        for s in [" ", "  ", "\n", "\t", "\r\n", "a", "A", " a", "a ", " a ", "  hello  ", "\u00e9", "\U0001F600",
                  "\x00", "a\x00b", "\x01\x02\x7f", "\x1b[31mred\x1b[0m", "\ufeffBOM at start", "\ufffd", "\u200b",
                  "\u200c\u200d", "\U0010FFFD", "\uffff"]:
            self.add(s)
        for cp in range(0x20, 0x7F):  # every printable ASCII character alone and padded
            self.add(chr(cp))
            self.add(" " + chr(cp))
            self.add(chr(cp) + " ")
        for script in SCRIPTS:
            for ch in rng.sample(SCRIPTS[script][0], 6):
                self.add(ch)
        for _ in range(60):
            self.add(self.random_unicode(1))

        # Hand-written sentences, as is and with leading/trailing spaces and mixed case.
        for s in HAND_SENTENCES:
            self.add(s)
            self.add(" " + s)
            self.add(s + "  ")
            self.add("\n" + s.upper() + "\n")
            self.add(s.lower())
        self.add("\n\n".join(HAND_SENTENCES))
        self.add(" ".join(HAND_SENTENCES))

        # Generated prose in each script.
        for script in SCRIPTS:
            for _ in range(75):
                k = rng.randrange(10)
                if k < 6:
                    s = self.sentence(script)
                elif k < 8:
                    s = " ".join(self.sentence(script) for _ in range(rng.randint(2, 5)))
                else:
                    s = "\n".join(self.sentence(script) for _ in range(rng.randint(2, 4)))
                if rng.random() < 0.15:
                    s = " " * rng.randint(1, 3) + s
                if rng.random() < 0.15:
                    s = s + " " * rng.randint(1, 3)
                self.add(s)
        # Mixed-script lines.
        for _ in range(200):
            scripts = rng.sample(list(SCRIPTS), rng.randint(2, 4))
            self.add(" ".join(self.sentence(sc, 1, 5) for sc in scripts))

        # Code.
        for _ in range(360):
            t = rng.choice(CODE_TEMPLATES)
            s = t.format(f=rng.choice(IDENTS), F=rng.choice(IDENTS).title().replace("_", ""),
                         a=rng.choice(IDENTS), b=rng.choice(IDENTS), n=rng.randint(0, 100000),
                         doc=rng.choice(DOCS))
            if rng.random() < 0.3:
                s = s.replace("    ", "\t")
            if rng.random() < 0.2:
                s = s.replace("\n", "\r\n")
            if rng.random() < 0.3:
                s = s + rng.choice(CODE_TEMPLATES).format(f="g", F="G", a="a", b="b", n=7, doc="")
            self.add(s)

        # JSON.
        for _ in range(300):
            v = self.json_value()
            style = rng.randrange(4)
            if style == 0:
                s = json.dumps(v)
            elif style == 1:
                s = json.dumps(v, indent=rng.choice([1, 2, 4]))
            elif style == 2:
                s = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
            else:
                s = json.dumps(v, indent="\t", ensure_ascii=False)
            self.add(s)

        # Numbers of every length, alone and in text.
        for n in range(1, 41):
            d = "".join(str((i * 7 + n) % 10) for i in range(n))
            self.add(d)
            self.add("-" + d)
            self.add(" " + d)
            self.add("x" + d + "y")
            self.add(d[:1] + "." + d[1:] if n > 1 else d + ".0")
            self.add("1" + "0" * (n - 1))
        for _ in range(500):
            k = rng.randrange(4)
            if k == 0:
                self.add(self.number())
            elif k == 1:
                self.add(" ".join(self.number() for _ in range(rng.randint(2, 8))))
            elif k == 2:
                self.add(f"{self.word('latin')} {self.number()} {self.word('latin')}")
            else:
                self.add(rng.choice(["total: ", "x=", "(", "[", "\u2248 "]) + self.number() + rng.choice([")", "]", ".", "", "\n"]))

        # Whitespace, newlines, tabs, \r\n.
        for n in range(1, 41):
            self.add(" " * n)
            self.add("\n" * n)
            self.add("a" + " " * n + "b")
            self.add("a" + "\n" * n + "b")
        for _ in range(340):
            k = rng.randrange(4)
            if k == 0:
                self.add(self.whitespace_run())
            elif k == 1:
                self.add(self.whitespace_run() + self.word("latin") + self.whitespace_run())
            elif k == 2:
                self.add(self.whitespace_run().join(self.word(rng.choice(["latin", "cyrillic", "chinese"])) for _ in range(rng.randint(2, 8))))
            else:
                self.add("\r\n".join(self.sentence("latin", 1, 6) for _ in range(rng.randint(2, 6))) + rng.choice(["", "\r\n", "\n", "\r"]))

        # Emoji.
        for _ in range(320):
            k = rng.randrange(4)
            if k == 0:
                self.add(self.emoji())
            elif k == 1:
                self.add(" ".join(self.emoji() for _ in range(rng.randint(2, 6))))
            elif k == 2:
                self.add(self.sentence("latin", 2, 6) + " " + self.emoji() + self.emoji())
            else:
                self.add("".join(self.emoji() for _ in range(rng.randint(2, 10))))

        # Combining marks, NFC/NFD-different forms.
        for _ in range(320):
            k = rng.randrange(3)
            if k == 0:
                self.add(self.combining())
            elif k == 1:
                s = self.sentence(rng.choice(["latin", "greek", "cyrillic", "korean", "devanagari"]))
                self.add(unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFC", "NFKC"]), s))
            else:
                self.add(self.word("latin") + " " + self.combining() + " " + self.combining())

        # Special and added tokens inside text.
        for tok in ALL_ADDED:
            for s in [tok, tok + tok, " " + tok, tok + " ", " " + tok + " ", "a" + tok + "b", "a " + tok + " b",
                      "\n" + tok + "\n", tok + "Hello", "Hello" + tok, "  " + tok + "  x", tok[:-1], tok[1:],
                      tok.upper(), tok.lower(), tok + "\n" + tok, tok + tok[:3]]:
                self.add(s, added=True)
        for _ in range(420):
            parts = []
            for _ in range(rng.randint(2, 8)):
                k = rng.randrange(5)
                if k == 0:
                    parts.append(rng.choice(ALL_ADDED))
                elif k == 1:
                    parts.append(self.sentence(rng.choice(list(SCRIPTS)), 1, 4))
                elif k == 2:
                    parts.append(rng.choice(["", " ", "\n", "  ", "\t", "\n\n"]))
                elif k == 3:
                    parts.append(rng.choice(CONTRACTION_WORDS))
                else:
                    parts.append(self.emoji())
            self.add(rng.choice(["", " "]).join(parts), added=True)
        # Chat templates.
        for _ in range(60):
            u = self.sentence(rng.choice(list(SCRIPTS)), 2, 8)
            a = self.sentence("latin", 2, 8)
            self.add(f"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{a}<|im_end|>\n", added=True)
            self.add(f"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{u}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{a}<|eot_id|>", added=True)
            self.add(f"<s>[INST] {u} [/INST] {a}</s><s>[INST] again [/INST]", added=True)

        # Contractions in every case.
        for c in CONTRACTIONS:
            variants = {c, c.upper(), c.capitalize(), c[0] + c[1:].upper()}
            if len(c) == 3:
                variants |= {c[0] + c[1].upper() + c[2], c[0] + c[1] + c[2].upper()}
            for v in sorted(variants):
                for w in ["it", "IT", "It", "you", "YOU", "Bob", "\u00e9t\u00e9", "x", "1", " ", ""]:
                    self.add(w + v)
                self.add("he" + v + " and she" + v + " " + v)
                self.add(v + v + v)
        for w in CONTRACTION_WORDS:
            for v in [w, w.upper(), w.title(), w.swapcase(), w.replace("'", "\u2019"), " " + w, w + "s"]:
                self.add(v)
        for _ in range(60):
            self.add(" ".join(rng.choice([w, w.upper(), w.title()]) for w in rng.sample(CONTRACTION_WORDS, 5)))

        # Very long words and runs.
        for n in (500, 501, 777, 1024, 2049, 4000):
            self.add("a" * n)
            self.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)))
            self.add(self.word("chinese", n, n))
            self.add(" " * n + "x")
            self.add("7" * n)
            self.add("\U0001F600" * (n // 4))
            self.add(self.word(rng.choice(["cyrillic", "arabic", "devanagari", "thai", "korean"]), n, n))
        for _ in range(30):
            self.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
                             for _ in range(rng.randint(500, 1500))))
            self.add("https://example.com/" + "/".join(self.word("latin", 4, 20) for _ in range(40)) + "?q=" + "x" * 300)

        # Where implementations part ways: Unicode whitespace and near-whitespace as regex \s sees
        # it (or not), digits and letters outside ASCII, case folding inside (?i:'s), lowercase
        # and NFKC/NFC special cases, noncharacters and private use.
        spaces = ["\u00a0", "\u1680", "\u180e", "\u2000", "\u2001", "\u2005", "\u200a", "\u200b", "\u2028",
                  "\u2029", "\u202f", "\u205f", "\u2060", "\u3000", "\ufeff", "\x1c", "\x1d", "\x1e", "\x1f",
                  "\x85", "\x0b", "\x0c", "\r", "\t"]
        for sp in spaces:
            for s in [sp, "a" + sp + "b", sp * 3, " " + sp + " x", "x" + sp + "\n", sp + "\n\n", "1" + sp + "2",
                      "don't" + sp + "IT'S", sp + "<|im_start|>" + sp, "x  " + sp + "  y"]:
                self.add(s)
        digits_zoo = ["\u00b2", "\u00b3", "\u00b9", "\u00bc", "\u0660\u0661\u0662\u0663", "\u06f4\u06f5",
                      "\u0966\u0967\u0968\u0969", "\uff11\uff12\uff13\uff14", "\u2160\u2161\u2162", "\u2460\u2461",
                      "\u3007", "\u4e00\u4e8c\u4e09", "\U0001D7CE\U0001D7CF", "\u0e51\u0e52", "\u1369\u136a",
                      "\u2070\u2074", "\u00bd\u2153", "\U00010107"]
        for d in digits_zoo:
            for s in [d, d * 3, "x" + d + "y", "12" + d + "34", " " + d, d + "abc", "$" + d + ".5"]:
                self.add(s)
        letters_zoo = ["\u02b0\u02b1", "\u3005\u3005", "\u01c5", "\u1fbc", "\u00aa\u00ba", "\u2071", "\u0e46",
                       "\u3031\u3032", "\U0001D400\U0001D401", "\u2102\u210e", "\u0345", "\u0640"]
        for lt in letters_zoo:
            for s in [lt, " " + lt + "word", "a" + lt, lt + "'s", "'" + lt]:
                self.add(s)
        for s in ["it'\u017f", "IT'\u017f", "'\u017f", "he'\u017f done", "it\u2019s", "it\u02bcs", "it`s", "it''s",
                  "'''s", "'s's's", "x's'll'd", "O'Neil's", "'S'LL'RE", "\u00c9T\u00c9'S", "\u0130'll",
                  "don\u2019t DON\u2019T"]:
            self.add(s)
        for s in ["\u039f\u0394\u039f\u03a3 \u03a3\u0391\u03a3", "\u03a3", "A\u03a3", "\u0130stanbul \u0130I\u0131i",
                  "\u1e9e STRASSE Stra\u00dfe", "\u01c4\u01c5\u01c6", "\u0149", "\u1f88\u1fbc", "\u212a\u212b\u2126",
                  "\u0344 \u0f73 \u2adc \u0958", "\u1e0b\u0323 \u1e0d\u0307", "\u00c5\u0301", "\ufb00\ufb03\ufb06",
                  "\u33c6\u33cf\u3392", "\u2474\u24b6\u3251", "\uff76\uff9e \uff8a\uff9f", "\u2126m", "\u1d2c\u1d43",
                  "\ufdfa", "\ufb2c", "\U0001F16A", "\u00df\u00df", "\u0587", "\u1e9b"]:
            for v in [s, s.upper(), s.lower(), " " + s + " "]:
                self.add(v)
        for s in ["\ufffe", "\U0010ffff", "\U0001fffe", "\ue000\uf8ff", "\U000f0000\U00100000", "\U000e0001",
                  "\U000e0020\U000e007f", "\u00ad", "soft\u00adhyphen", "\u034f", "\u061c", "\u200e\u200f",
                  "\u202a\u202e\u2066\u2069", "\ufe0f", "a\ufe0e", "\u20e3"]:
            self.add(s)
            self.add("x " + s + " y")
        # Added tokens that are prefixes of one another, back to back and cut short.
        for s in ["<|reserved_special_token_1|><|reserved_special_token_10|><|reserved_special_token_100|>",
                  "<|reserved_special_token_2|>0|>", "<|reserved_special_token_|>", "<<|eot_id|>>", "<|<|eot_id|>|>",
                  "<s><s>></s>", "<<s>>", "</s/s>", "<|im_start|im_end|>", "<|im_start|><|im_end|><|endoftext|>",
                  "<think></think><think>", "<tool_call>\n{\"a\": 1}\n</tool_call>", "<|end_of_text|>" * 5,
                  "<|begin_of_text|> <|begin_of_text|>  <|begin_of_text|>"]:
            self.add(s, added=True)
            self.add(" " + s + " x", added=True)
        # Contexts for single_word / lstrip / rstrip added tokens of the synthetic tokenizers.
        for tok in SYNTHETIC_ADDED:
            for left, right in [("a", ""), ("", "s"), ("_", ""), ("", "_"), ("1", ""), ("", "2"), ("\u00e9", ""),
                                ("", "\u00e9"), ("\u4e00", ""), ("", "\u4e00"), (".", "!"), ("(", ")"), ("\U0001F600", ""),
                                (" \t ", " \n "), ("\n\n", ""), ("", "\r\n"), ("\u00a0", "\u3000"), ("'", "'s")]:
                self.add(left + tok + right, added=True)
                self.add("x " + left + tok + right + " y", added=True)
        # Long inputs: one word of 20,000 characters and a 50,000 character document.
        self.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz\u00e9\u00fc") for _ in range(20000)))
        doc = []
        while sum(map(len, doc)) < 50000:
            doc.append(self.sentence(rng.choice(list(SCRIPTS))))
        self.add(" ".join(doc))

        # Random Unicode soup and mixtures of everything above.
        for _ in range(240):
            self.add(self.random_unicode(rng.randint(1, 60)))
        generators = [lambda: self.sentence(rng.choice(list(SCRIPTS)), 1, 6), self.number, self.emoji, self.combining,
                      self.whitespace_run, lambda: rng.choice(CONTRACTION_WORDS), lambda: rng.choice(ALL_ADDED),
                      lambda: json.dumps(self.json_value(2))]
        for _ in range(500):
            parts = [rng.choice(generators)() for _ in range(rng.randint(2, 7))]
            self.add(rng.choice(["", " ", "\n"]).join(parts), added=any(p in ALL_ADDED for p in parts))
        # Whole documents (a few KB each).
        for _ in range(12):
            self.add("\n\n".join(rng.choice(generators)() for _ in range(rng.randint(40, 120))))


def main(argv):
    if len(argv) < 2 or len(argv) > 3 or (len(argv) == 3 and argv[2] != "--small"):
        print(__doc__, file=sys.stderr)
        return 2
    corpus = Corpus(SEED)
    corpus.build()
    seen = set()
    items = []
    for text, added in corpus.items:  # first occurrence of each string, in order
        if text not in seen:
            seen.add(text)
            items.append((text, added))
    if len(argv) == 3:
        items = [it for i, it in enumerate(items) if i % 8 == 0 or it[1]]
    with open(argv[1], "w", encoding="utf-8", newline="\n") as f:
        for text, _ in items:
            line = json.dumps({"text": text}, ensure_ascii=False)
            # Line separators other than \n stay escaped so that no JSON-lines reader splits there.
            for sep in ("\u0085", "\u2028", "\u2029"):
                line = line.replace(sep, "\\u%04x" % ord(sep))
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
