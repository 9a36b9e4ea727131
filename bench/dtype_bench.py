"""Issue 17's table: carpool-bench-engine in fp32, bf16 and int8 weights, in one run.

    /usr/bin/python3 bench/dtype_bench.py [--build build] [--rounds 3] [--checkpoint DIR]

For synthetic:small and for a BF16 Hugging Face checkpoint of the same shapes (written by
bench/write_bf16_checkpoint.py into DIR unless it is there), runs carpool-bench-engine for each
weight type in turn, `--rounds` times interleaved (fp32, bf16, int8, fp32, ...), and keeps each
figure's best round: on a shared machine a round is slowed by the others' load, never sped up.
Decode is at batch 1, 8 and 32 over 128-token prompts (llama-batched-bench -npp 128 -ntg 64's
shape). Prints a Markdown table of tokens/s and ratios to fp32, prefill tokens/s, step over the
weight-bytes / bandwidth floor at batch 1, and the RSS at the end of each run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [("fp32", ["--dtype", "float32", "--kv-cache-dtype", "float32"]),
           ("bf16", ["--dtype", "bfloat16"]),
           ("int8", ["--quantization", "int8"])]
BATCHES = ("1", "8", "32")


def run_once(binary, model, flags):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([binary, "--model", model, "--only", "bandwidth,decode,prefill",
                        "--decode-prompt-len", "128", "--decode-steps", "32",
                        "--json-file", out.name] + flags,
                       check=True, stdout=subprocess.DEVNULL, timeout=900)
        with open(out.name) as f:
            return json.load(f)


def best(runs):
    """Each figure's best over the rounds: highest tokens/s, lowest step / floor and RSS."""
    b = {"weights": runs[0]["weights"], "kv_cache": runs[0]["kv_cache"],
         "paths": runs[0]["kernel_paths"]}
    for batch in BATCHES:
        b[batch] = max(r["decode"][batch]["tokens_per_s"] for r in runs)
    b["floor1"] = min(r["decode"]["1"]["step_over_floor"] for r in runs)
    b["prefill"] = max(r["prefill"]["tokens_per_s"] for r in runs)
    b["rss"] = min(r["rss_at_end_bytes"] for r in runs) / 2**20
    b["load_rss"] = min(r["peak_rss_after_load_bytes"] for r in runs) / 2**20
    return b


def table(model, results):
    fp32 = results["fp32"]
    lines = [f"`{model}`:", "",
             "| weights / KV | batch 1 tok/s | batch 8 | batch 32 | prefill tok/s | "
             "batch-1 step / floor | peak RSS after load | RSS at end |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, _ in CONFIGS:
        r = results[name]
        cells = [f"{r[b]:.1f}" + ("" if name == "fp32" else f" ({r[b] / fp32[b]:.2f}x)")
                 for b in BATCHES]
        lines.append(
            f"| {r['weights']} / {r['kv_cache']} | " + " | ".join(cells) +
            f" | {r['prefill']:.0f}" + ("" if name == "fp32" else
                                        f" ({r['prefill'] / fp32['prefill']:.2f}x)") +
            f" | {r['floor1']:.2f} | {r['load_rss']:.0f} MiB | {r['rss']:.0f} MiB"
            + ("" if name == "fp32" else f" ({r['rss'] / fp32['rss']:.2f}x)") + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoint", default=os.path.join("build", "bench-bf16-small"))
    args = parser.parse_args()
    binary = os.path.join(args.build, "bin", "carpool-bench-engine")
    if not os.path.exists(os.path.join(args.checkpoint, "model.safetensors")):
        subprocess.run([sys.executable, os.path.join(HERE, "write_bf16_checkpoint.py"),
                        args.checkpoint], check=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    for model in ("synthetic:small", args.checkpoint):
        runs = {name: [] for name, _ in CONFIGS}
        for _ in range(args.rounds):
            for name, flags in CONFIGS:
                runs[name].append(run_once(binary, model, flags))
        results = {name: best(r) for name, r in runs.items()}
        print(table(model, results) + "\n", flush=True)
        paths = results["fp32"]["paths"]
        print(f"kernel paths: bf16 {paths['bf16']}, int8 {paths['int8']}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
