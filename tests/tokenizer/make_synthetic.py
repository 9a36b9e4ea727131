#!/usr/bin/env python3
"""Writes small hand-built tokenizer.json files (tests/tokenizer/synthetic/*.json) that exercise
tokenizer.json components the four real tokenizers of the parity test do not use: Metaspace with
each prepend_scheme and split, Digits, Whitespace, Split with every behavior and invert, NFKC,
Lowercase, Strip, Replace, Prepend, BPE with ignore_merges, unk_token with and without fuse_unk,
no unk_token, merges as "a b" strings and as [a, b] pairs, added tokens with lstrip / rstrip /
single_word / normalized, TemplateProcessing with a single-only template, and the decoders Fuse,
Strip, ByteFallback, Replace, Metaspace and ByteLevel.

Vocabularies and merges are learned here by a small deterministic BPE trainer from text of this
repository's corpus generator (make_corpus.py), so nothing is copied from a real model.

usage: make_synthetic.py OUT_DIR
"""

import collections
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_corpus  # noqa: E402

SP = "\u2581"  # Metaspace replacement


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: each byte maps to one printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_CHAR = bytes_to_unicode()


def training_text():
    c = make_corpus.Corpus(7)
    parts = list(make_corpus.HAND_SENTENCES)
    for script in ("latin", "latin", "latin", "cyrillic", "greek", "chinese", "devanagari"):
        for _ in range(40):
            parts.append(c.sentence(script))
    for _ in range(60):
        parts.append(c.number())
    parts.extend(make_corpus.CONTRACTION_WORDS)
    return "\n".join(parts)


def train_bpe(words, n_merges):
    """words: {tuple of symbols: count}. Returns the merges (pairs) in learned order."""
    words = dict(words)
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, count in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        merged = {}
        for w, count in words.items():
            out = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        words = merged
    return merges


def count_words(pieces):
    counts = collections.Counter(pieces)
    return {tuple(p): c for p, c in counts.items() if p}


class Vocab:
    def __init__(self):
        self.ids = {}

    def add(self, token):
        if token not in self.ids:
            self.ids[token] = len(self.ids)
        return self.ids[token]

    def __len__(self):
        return len(self.ids)


def added(id_, content, special=True, lstrip=False, rstrip=False, single_word=False, normalized=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def template(single, special_ids):
    """TemplateProcessing from a list like ["<s>", "$A", "</s>"]; the pair template repeats it."""
    def piece(p, type_id):
        if p == "$A":
            return {"Sequence": {"id": "A", "type_id": type_id}}
        if p == "$B":
            return {"Sequence": {"id": "B", "type_id": type_id}}
        return {"SpecialToken": {"id": p, "type_id": type_id}}
    pair = [piece(p, 0) for p in single] + [piece("$B" if p == "$A" else p, 1) for p in single]
    return {"type": "TemplateProcessing", "single": [piece(p, 0) for p in single], "pair": pair,
            "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in special_ids.items()}}


def bpe_model(vocab, merges, merges_as_pairs, unk=None, fuse_unk=False, byte_fallback=False,
              ignore_merges=False):
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": fuse_unk, "byte_fallback": byte_fallback,
            "ignore_merges": ignore_merges, "vocab": dict(vocab.ids),
            "merges": [[a, b] if merges_as_pairs else f"{a} {b}" for a, b in merges]}


def tokenizer(added_tokens, normalizer, pre_tokenizer, post_processor, decoder, model):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor, "decoder": decoder, "model": model}


def vocab_from(specials, alphabet, merges, byte_fallback=False, extra=()):
    v = Vocab()
    for s in specials:
        v.add(s)
    if byte_fallback:
        for b in range(256):
            v.add(f"<0x{b:02X}>")
    for ch in sorted(alphabet):
        v.add(ch)
    for a, b in merges:
        v.add(a + b)
    for e in extra:
        v.add(e)
    return v


def append_added(vocab, contents):
    """Ids for added tokens that are not in the model vocab: right after it, in order."""
    return {c: len(vocab) + i for i, c in enumerate(contents)}


TEXT = training_text()
WORD_RE = re.compile(r"\w+|[^\w\s]+")


def metaspace_words(text, lower=False):
    if lower:
        text = text.lower()
    words = [SP + w for w in text.split()]
    return count_words(words)


def bytelevel_words(text):
    pieces = re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", text)
    return count_words("".join(BYTE_CHAR[b] for b in p.encode("utf-8")) for p in pieces)


def char_words(text, lower=False):
    if lower:
        text = text.lower()
    return count_words(WORD_RE.findall(text))


def alphabet_of(words):
    return {ch for w in words for ch in w}


def metaspace_decoder(scheme, split):
    return {"type": "Metaspace", "replacement": SP, "prepend_scheme": scheme, "split": split}


def metaspace_pre(scheme, split):
    return {"type": "Metaspace", "replacement": SP, "prepend_scheme": scheme, "split": split}


BYTELEVEL_PRE = lambda prefix, regex: {"type": "ByteLevel", "add_prefix_space": prefix,  # noqa: E731
                                       "trim_offsets": True, "use_regex": regex}
BYTELEVEL_DEC = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
BYTELEVEL_POST = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
LLAMA2_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def build_all():
    files = {}

    # --- Metaspace family (sentencepiece-style vocab with byte fallback) --------------------
    # Trained on whole lines (spaces as the replacement), so that some tokens span words and
    # Metaspace's split option changes the result.
    mw = count_words(SP + line.replace(" ", SP) for line in TEXT.split("\n"))
    m_merges = train_bpe(mw, 500)
    m_alpha = alphabet_of(mw)
    specials = ["<unk>", "<s>", "</s>"]

    v = vocab_from(specials, m_alpha, m_merges, byte_fallback=True)
    extra = append_added(v, ["<sep>", "[MASK]"])
    files["metaspace_first_split"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"), added(extra["<sep>"], "<sep>"),
         added(extra["[MASK]"], "[MASK]", special=False)],
        None, metaspace_pre("first", True), template(["<s>", "$A"], {"<s>": 1}),
        {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}, metaspace_decoder("first", True)]},
        bpe_model(v, m_merges, merges_as_pairs=False, unk="<unk>", byte_fallback=True))

    files["metaspace_never_nosplit"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"), added(extra["<sep>"], "<sep>")],
        None, metaspace_pre("never", False), template(["$A", "</s>"], {"</s>": 2}),
        metaspace_decoder("never", False),
        bpe_model(v, m_merges, merges_as_pairs=True, unk="<unk>", fuse_unk=True))

    files["metaspace_always_split_fallback"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        {"type": "NFC"}, metaspace_pre("always", True), template(["<s>", "$A", "</s>"], {"<s>": 1, "</s>": 2}),
        {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}, metaspace_decoder("always", True)]},
        bpe_model(v, m_merges, merges_as_pairs=False, unk="<unk>", fuse_unk=True, byte_fallback=True))

    # Llama-2 style normalizer (Prepend + Replace) with a Strip decoder that cuts two characters.
    # (A Strip decoder with stop > 0 is not tested: the library panics on an empty decode.)
    files["prepend_replace_strip_decoder"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Prepend", "prepend": SP},
                                             {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
        None, template(["<s>", "$A"], {"<s>": 1}),
        {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 0}]},
        bpe_model(v, m_merges, merges_as_pairs=True, unk="<unk>", byte_fallback=True))

    # Added tokens with every flag, behind a Lowercase normalizer (normalized matters).
    mwl = metaspace_words(TEXT, lower=True)
    l_merges = train_bpe(mwl, 400)
    vl = vocab_from(specials, alphabet_of(mwl), l_merges, byte_fallback=True)
    names = ["<lst>", "<rst>", "<both>", "word", "Hello", "<NORM>", "@@", "<br>", "[MASK]"]
    ids = append_added(vl, names)
    files["added_token_flags"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"),
         added(ids["<lst>"], "<lst>", lstrip=True),
         added(ids["<rst>"], "<rst>", rstrip=True),
         added(ids["<both>"], "<both>", lstrip=True, rstrip=True),
         added(ids["word"], "word", special=False, single_word=True),
         added(ids["Hello"], "Hello", special=False, normalized=True),
         added(ids["<NORM>"], "<NORM>", special=False, normalized=True, single_word=True),
         added(ids["@@"], "@@", special=False, normalized=False, lstrip=True),
         added(ids["<br>"], "<br>", special=False, rstrip=True),
         added(ids["[MASK]"], "[MASK]", special=True, single_word=True, lstrip=True)],
        {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]},
        metaspace_pre("always", True), template(["<s>", "$A"], {"<s>": 1}),
        LLAMA2_DECODER, bpe_model(vl, l_merges, merges_as_pairs=False, unk="<unk>", byte_fallback=True))

    # --- Whitespace / Digits with NFKC + Lowercase + Strip + Replace; char-level vocab ---------
    cw = char_words(TEXT, lower=True)
    c_merges = train_bpe(cw, 400)
    cv = vocab_from(["[UNK]", "[CLS]", "[SEP]"], alphabet_of(cw), c_merges)
    files["whitespace_digits_nfkc_lower"] = tokenizer(
        [added(0, "[UNK]"), added(1, "[CLS]"), added(2, "[SEP]")],
        {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                                             {"type": "Strip", "strip_left": True, "strip_right": True}]},
        {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, {"type": "Digits", "individual_digits": True}]},
        template(["[CLS]", "$A", "[SEP]"], {"[CLS]": 1, "[SEP]": 2}),
        None,  # no decoder: tokens joined by spaces
        bpe_model(cv, c_merges, merges_as_pairs=False, unk="[UNK]", fuse_unk=False))

    files["whitespace_fuse_unk_fuse_decoder"] = tokenizer(
        [added(0, "[UNK]")],
        {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
            {"type": "Replace", "pattern": {"String": "``"}, "content": "\""},
            {"type": "Strip", "strip_left": False, "strip_right": True}, {"type": "Lowercase"}]},
        {"type": "Whitespace"}, None, {"type": "Fuse"},
        bpe_model(cv, c_merges, merges_as_pairs=True, unk="[UNK]", fuse_unk=True))

    # No unk token at all: characters outside the vocab are dropped by the model.
    files["digits_grouped_no_unk"] = tokenizer(
        [], {"type": "Strip", "strip_left": True, "strip_right": False},
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False},
                                               {"type": "Whitespace"}]},
        None, None, bpe_model(cv, c_merges, merges_as_pairs=False))

    # --- Byte-level family ----------------------------------------------------------------
    bw = bytelevel_words(TEXT)
    b_merges = train_bpe(bw, 600)
    byte_alpha = set(BYTE_CHAR.values())
    bv = vocab_from([], byte_alpha, b_merges)
    bids = append_added(bv, ["<eos>", "<pad>"])
    # GPT-2 style: ByteLevel does the regex split itself; merges as strings and as pairs.
    for fmt in ("strings", "pairs"):
        files[f"bytelevel_gpt2_merges_{fmt}"] = tokenizer(
            [added(bids["<eos>"], "<eos>"), added(bids["<pad>"], "<pad>")],
            None, BYTELEVEL_PRE(False, True), BYTELEVEL_POST, BYTELEVEL_DEC,
            bpe_model(bv, b_merges, merges_as_pairs=(fmt == "pairs")))

    # ignore_merges: whole words in the vocab that the merges would split differently.
    whole = ["".join(BYTE_CHAR[b] for b in w.encode("utf-8")) for w in
             [" router", " tokenizer", "hello", " Hello", " the", " \u00e9t\u00e9", " \u0442\u043e\u043a\u0435\u043d",
              "123", " 2026", "\u4eca\u5929"]]
    bvi = vocab_from([], byte_alpha, b_merges, extra=whole)
    iids = append_added(bvi, ["<eos>"])
    files["bytelevel_ignore_merges_prefix_space"] = tokenizer(
        [added(iids["<eos>"], "<eos>")],
        {"type": "NFC"}, BYTELEVEL_PRE(True, True), template(["$A", "<eos>"], {"<eos>": iids["<eos>"]}),
        BYTELEVEL_DEC, bpe_model(bvi, b_merges, merges_as_pairs=False, ignore_merges=True))

    # Split with every behavior (String and Regex patterns, invert), then ByteLevel without regex.
    splits = {
        "split_removed_string": {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
        "split_merged_previous_regex": {"type": "Split", "pattern": {"Regex": "[,.;:!?]"},
                                        "behavior": "MergedWithPrevious", "invert": False},
        "split_merged_next_string": {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext",
                                     "invert": False},
        "split_contiguous_digits": {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Contiguous",
                                    "invert": False},
        "split_isolated_invert": {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated",
                                  "invert": True},
        "split_removed_invert_words": {"type": "Split", "pattern": {"Regex": " ?\\p{L}+| ?\\p{N}{1,2}"},
                                       "behavior": "Removed", "invert": True},
    }
    for name, split in splits.items():
        files[name] = tokenizer(
            [added(bids["<eos>"], "<eos>")], None,
            {"type": "Sequence", "pretokenizers": [split, BYTELEVEL_PRE(False, False)]},
            BYTELEVEL_POST, BYTELEVEL_DEC, bpe_model(bv, b_merges, merges_as_pairs=(name.endswith("string"))))

    # Regex pre-tokenizers in the style of other published tokenizers (patterns written here):
    # case-split words with an optional contraction, CJK and kana runs written with \u escapes
    # and literal ranges, punctuation and symbol classes, escapes inside classes.
    regex_styles = {
        "regex_case_split_words": [
            {"type": "Split", "pattern": {"Regex":
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
             "behavior": "Isolated", "invert": False}],
        "regex_cjk_runs_punct_classes": [
            {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\\u3040-\u309f\u30a0-\u30ff]+"},
             "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex":
                r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
             "behavior": "Isolated", "invert": False}],
        "regex_hex_escapes_and_classes": [  # \h: a hex digit, as in Oniguruma
            {"type": "Split", "pattern": {"Regex": r"[\x{3000}-\x{303F}\x{FF00}-\x{FFEF}]|[\t ]+|[[:punct:]]+|\h{2,}|\d+|\w+"},
             "behavior": "Isolated", "invert": False}],
    }
    for name, pres in regex_styles.items():
        files[name] = tokenizer(
            [added(bids["<eos>"], "<eos>")], {"type": "NFC"},
            {"type": "Sequence", "pretokenizers": pres + [BYTELEVEL_PRE(False, False)]},
            None, BYTELEVEL_DEC, bpe_model(bv, b_merges, merges_as_pairs=False))

    # Only the fields the library requires: no version, truncation, padding, normalizer or
    # post_processor, and a BPE model with vocab and merges only.
    files["defaults_only"] = {
        "added_tokens": [added(bids["<eos>"], "<eos>")],
        "pre_tokenizer": BYTELEVEL_PRE(True, True), "decoder": BYTELEVEL_DEC,
        "model": {"type": "BPE", "vocab": dict(bv.ids), "merges": [f"{a} {b}" for a, b in b_merges]}}

    # Metaspace with another replacement character, and a regex Replace decoder.
    hv = Vocab()
    for tok in v.ids:
        hv.add(tok.replace(SP, "#"))
    h_merges = [(a.replace(SP, "#"), b.replace(SP, "#")) for a, b in m_merges]
    files["metaspace_hash_replacement"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")], None,
        {"type": "Metaspace", "replacement": "#", "prepend_scheme": "always", "split": True}, None,
        {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"},
                                          {"type": "Metaspace", "replacement": "#", "prepend_scheme": "always",
                                           "split": True}]},
        bpe_model(hv, h_merges, merges_as_pairs=True, unk="<unk>", byte_fallback=True))

    # Added tokens that hold spaces, normalized and not, behind a normalizer that rewrites spaces.
    sids = append_added(v, ["New York", "ice cream", " <br>"])
    files["added_tokens_with_spaces"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"),
         added(sids["New York"], "New York", special=False, normalized=False),
         added(sids["ice cream"], "ice cream", special=False, normalized=True),
         added(sids[" <br>"], " <br>", special=True)],
        {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SP},
                                             {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
        None, None,
        {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"Regex": SP + "+"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        bpe_model(v, m_merges, merges_as_pairs=False, unk="<unk>", byte_fallback=True))

    # A template special token that stands for two ids, and added tokens in a byte-level
    # tokenizer whose text is not ASCII or starts with a space (the ByteLevel decoder sees them).
    t = template(["<pair>", "$A", "</s>"], {"</s>": 2})
    t["special_tokens"]["<pair>"] = {"id": "<pair>", "ids": [1, 2], "tokens": ["<s>", "</s>"]}
    files["template_multi_id_special"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")], None, metaspace_pre("always", True), t,
        metaspace_decoder("always", True), bpe_model(v, m_merges, merges_as_pairs=False, unk="<unk>"))
    names = ["h\u00e9llo", "\u00fcn\u00ef", "<|user|>", " spaced"]
    nids = append_added(bv, names)
    files["bytelevel_added_non_ascii"] = tokenizer(
        [added(nids["h\u00e9llo"], "h\u00e9llo", special=False),
         added(nids["\u00fcn\u00ef"], "\u00fcn\u00ef", special=False, normalized=True),
         added(nids["<|user|>"], "<|user|>", special=True),
         added(nids[" spaced"], " spaced", special=False, normalized=False)],
        {"type": "NFKC"}, BYTELEVEL_PRE(True, True), BYTELEVEL_POST, BYTELEVEL_DEC,
        bpe_model(bv, b_merges, merges_as_pairs=True))

    # --- No normalizer, no pre-tokenizer: the whole text is one word; merges contain spaces ----
    raw_words = count_words(TEXT.split("\n"))
    r_merges = train_bpe(raw_words, 300)
    rv = vocab_from(["<unk>"], alphabet_of(raw_words), r_merges, byte_fallback=True)
    files["raw_one_word_byte_fallback"] = tokenizer(
        [added(0, "<unk>")], None, None, None,
        {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        bpe_model(rv, r_merges, merges_as_pairs=True, unk="<unk>", byte_fallback=True))
    files["raw_unk_no_fallback"] = tokenizer(
        [added(0, "<unk>")], None, None, None, {"type": "Fuse"},
        bpe_model(rv, r_merges, merges_as_pairs=True, unk="<unk>", fuse_unk=False))
    # Metaspace "first" prepends only to the piece that starts at offset 0 of the original text:
    # when a normalizer removed what was there (Strip, Replace), nothing is prepended.
    files["metaspace_first_after_strip"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        {"type": "Sequence", "normalizers": [{"type": "Strip", "strip_left": True, "strip_right": False},
                                             {"type": "Replace", "pattern": {"String": "#"}, "content": ""}]},
        metaspace_pre("first", True), None, metaspace_decoder("first", True),
        bpe_model(v, m_merges, merges_as_pairs=False, unk="<unk>", byte_fallback=True))

    # ... and the other way round: a Prepend normalizer's space, aligned with the first original
    # character, is cut by Whitespace, so the first word still starts at offset 0 and gets one.
    files["metaspace_first_after_prepend_whitespace"] = tokenizer(
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        {"type": "Sequence", "normalizers": [{"type": "Strip", "strip_left": True, "strip_right": True},
                                             {"type": "Prepend", "prepend": " "}]},
        {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, metaspace_pre("first", False)]},
        None, metaspace_decoder("first", False),
        bpe_model(v, m_merges, merges_as_pairs=True, unk="<unk>", byte_fallback=True))

    # Random pipelines from the supported components (fixed seed), with random added-token flags.
    rng = random.Random(RANDOM_SEED)
    for i in range(RANDOM_FILES):
        files[f"random_{i:02d}"] = random_pipeline(rng, {"sp": (v, m_merges), "byte": (bv, b_merges)})
    return files


RANDOM_SEED = 13
RANDOM_FILES = 10


def random_pipeline(rng, bases):
    """A tokenizer.json of random supported components over one of the learned vocabularies."""
    kind = rng.choice(["byte", "sp"])
    norm_pool = [
        {"type": "NFC"}, {"type": "NFKC"}, {"type": "Lowercase"},
        {"type": "Strip", "strip_left": rng.random() < 0.5, "strip_right": rng.random() < 0.5},
        {"type": "Replace", "pattern": {"String": rng.choice([" ", "a", "\n", "  "])},
         "content": rng.choice(["", " ", SP, "XY"])},
        {"type": "Replace", "pattern": {"Regex": rng.choice([r"\s+", r"\d", r"[aeiou]+", r"(?i)the"])},
         "content": rng.choice(["", " ", "#"])},
        {"type": "Prepend", "prepend": rng.choice([SP, " ", ">"])}]
    norms = rng.sample(norm_pool, rng.randint(0, 3))
    if not norms:
        normalizer = None
    elif len(norms) == 1 and rng.random() < 0.5:
        normalizer = norms[0]
    else:
        normalizer = {"type": "Sequence", "normalizers": norms}

    def split():
        pattern = rng.choice([{"String": " "}, {"String": "-"}, {"String": ", "}, {"Regex": r"\p{P}"},
                              {"Regex": r"\d+"}, {"Regex": r"\s+"}, {"Regex": r"[A-Z][a-z]*"},
                              {"Regex": r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"}])
        return {"type": "Split", "pattern": pattern,
                "behavior": rng.choice(["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]),
                "invert": rng.random() < 0.3}
    pre_pool = [lambda: {"type": "Whitespace"}, lambda: {"type": "Digits", "individual_digits": rng.random() < 0.5},
                split, lambda: metaspace_pre(rng.choice(["always", "first", "never"]), rng.random() < 0.5)]
    pres = [rng.choice(pre_pool)() for _ in range(rng.randint(0, 2))]
    if kind == "byte":
        pres.append(BYTELEVEL_PRE(rng.random() < 0.5, rng.random() < 0.5))
        vocab, merges = bases["byte"]
        decoder = BYTELEVEL_DEC
        byte_fallback = False
    else:
        vocab, merges = bases["sp"]
        byte_fallback = rng.random() < 0.7
        dec_pool = [{"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
                    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": rng.randint(0, 2), "stop": 0},
                    metaspace_decoder(rng.choice(["always", "first", "never"]), rng.random() < 0.5)]
        decs = rng.sample(dec_pool, rng.randint(0, 4))
        decoder = {"type": "Sequence", "decoders": decs} if decs else None
    if not pres:
        pre = None
    elif len(pres) == 1:
        pre = pres[0]
    else:
        pre = {"type": "Sequence", "pretokenizers": pres}

    added_tokens = []
    next_id = len(vocab)
    for content in rng.sample(make_corpus.SYNTHETIC_ADDED + ["<s>", "</s>", "<|im_start|>"], rng.randint(0, 8)):
        if content in vocab.ids:
            id_ = vocab.ids[content]
        else:
            id_, next_id = next_id, next_id + 1
        added_tokens.append(added(id_, content, special=rng.random() < 0.5, lstrip=rng.random() < 0.3,
                                  rstrip=rng.random() < 0.3, single_word=rng.random() < 0.3,
                                  normalized=rng.random() < 0.4))
    added_tokens.sort(key=lambda a: a["id"])
    specials = [a for a in added_tokens if a["special"]]
    post = None
    r = rng.random()
    if specials and r < 0.5:
        chosen = rng.sample(specials, min(len(specials), rng.randint(1, 2)))
        single = [chosen[0]["content"], "$A"] + [c["content"] for c in chosen[1:]]
        post = template(single, {c["content"]: c["id"] for c in chosen})
    elif kind == "byte" and r < 0.8:
        post = BYTELEVEL_POST
    unk = "<unk>" if "<unk>" in vocab.ids and rng.random() < 0.8 else None
    model = bpe_model(vocab, merges, merges_as_pairs=rng.random() < 0.5, unk=unk, fuse_unk=rng.random() < 0.5,
                      byte_fallback=byte_fallback, ignore_merges=rng.random() < 0.3)
    return tokenizer(added_tokens, normalizer, pre, post, decoder, model)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    for name, tok in sorted(build_all().items()):
        with open(os.path.join(out, name + ".json"), "w", encoding="utf-8", newline="\n") as f:
            json.dump(tok, f, ensure_ascii=False, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
