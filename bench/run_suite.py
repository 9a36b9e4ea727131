#!/usr/bin/env python3
"""carpool's benchmark suite: `make bench` (scripts/bench.sh) runs it.

Starts its own carpool-router and carpool-worker processes from BUILD/bin on free 127.0.0.1
ports, runs the scenarios, stops every process it started, and rewrites the suite's sections of
docs/PERFORMANCE.md (between `<!-- bench:KEY begin -->` / `end` markers; the hand-written
sections are left alone) and its plots in docs/img/bench_*.png.

    bench/run_suite.py --build build                 # every scenario, a to i
    bench/run_suite.py --build build --scenarios b,d # some of them; only their sections change

Scenarios (README of each is its section in docs/PERFORMANCE.md):
  a  continuous vs static batching at equal SLOs (goodput, throughput)    carpool bench serve
  b  batch-size sweep, --max-num-seqs 1..64                                carpool bench serve
  c  chunked prefill on/off with long prompts mixed in                     carpool bench serve
  d  router overhead vs direct ZeroMQ                                      carpool-bench-router
  e  CPU roofline: batch-1 decode vs bandwidth floor; GEMM vs OpenBLAS     carpool-bench-engine, -kernels
  f  engine overhead: forward time / step wall time                        carpool-bench-engine
  g  paged KV: concurrent sequences at a fixed KV budget                   carpool-bench-engine
  h  batch jobs under an interactive load: isolation, capacity they use   carpool bench serve
  i  one router before a simulated fleet of 1..1,024 workers              carpool-bench-fleet
"""
import argparse
import datetime
import json
import os
import platform
import random
import re
import shlex
import signal
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_SCENARIOS = "abcdefghi"

# KV cache bytes per token: 2 (K and V) x layers x KV heads x head dim x 4 bytes (fp32), from
# the presets in worker/weights/synthetic.cc.
KV_BYTES_PER_TOKEN = {
    "synthetic:small": 2 * 12 * 4 * 64 * 4,  # 12 layers, 4 KV heads, head dim 768 / 12
    "synthetic:tiny": 2 * 2 * 2 * 16 * 4,  # 2 layers, 2 KV heads, head dim 64 / 4
}


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Cluster:
    """One router and the given workers, on free loopback ports; stopped on exit. With
    `--http 127.0.0.1:0` among router_args, `http` is the gateway's base URL."""

    def __init__(self, bindir, logdir, name, workers, router_args=()):
        self.bindir, self.logdir, self.name, self.workers = bindir, logdir, name, workers
        self.router_args = list(router_args)
        self.procs = []
        self.frontend = None
        self.http = None

    def _spawn(self, argv, log_name):
        out = open(os.path.join(self.logdir, f"{self.name}_{log_name}.log"), "w")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        self.procs.append(p)
        return p

    def _router_log(self):
        with open(os.path.join(self.logdir, f"{self.name}_router.log")) as f:
            return f.read()

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        router = self._spawn([os.path.join(self.bindir, "carpool-router"), "--frontend",
                              "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*"] +
                             self.router_args, "router")
        pattern = r"frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)"
        if "--http" in self.router_args:
            pattern += r"(?s:.*)http gateway listening on (http://[0-9.:]+)"
        m = None
        deadline = time.time() + 20
        while m is None and time.time() < deadline:
            m = re.search(pattern, self._router_log())
            if router.poll() is not None:
                raise RuntimeError(f"carpool-router exited:\n{self._router_log()}")
            time.sleep(0.05)
        if m is None:
            raise RuntimeError("carpool-router did not report its endpoints")
        self.frontend, backend = m.group(1), m.group(2)
        if "--http" in self.router_args:
            self.http = m.group(3)
        for i, args in enumerate(self.workers):
            self._spawn([os.path.join(self.bindir, "carpool-worker"), "--router", backend,
                         "--worker-id", f"bench-{i + 1}"] + args, f"worker{i + 1}")
        deadline = time.time() + 180
        while self._router_log().count(" registered") < len(self.workers):
            if time.time() > deadline:
                raise RuntimeError(f"workers did not register:\n{self._router_log()}")
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a carpool process exited early (see {self.logdir})")
            time.sleep(0.1)

    def stop(self):
        # Workers first (they drain and deregister), then the router.
        for group in (self.procs[1:], self.procs[:1]):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in group:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []

    def __exit__(self, *exc):
        self.stop()


class Suite:
    def __init__(self, args):
        self.build = os.path.abspath(args.build)
        self.bindir = os.path.join(self.build, "bin")
        self.results = os.path.join(self.build, "bench-results")
        self.logdir = os.path.join(self.results, "logs")
        os.makedirs(self.logdir, exist_ok=True)
        self.doc = os.path.abspath(args.doc)
        self.imgdir = os.path.join(os.path.dirname(self.doc), "img")
        os.makedirs(self.imgdir, exist_ok=True)
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            self.plt = plt
        except ImportError:
            self.plt = None
            log("matplotlib is missing (scripts/install-deps.sh installs python3-matplotlib): "
                "tables only, no plots")

    # ---- running things

    def bench_serve(self, cluster, args, tag):
        path = os.path.join(self.results, f"{tag}.json")
        argv = [os.path.join(self.bindir, "carpool"), "bench", "serve", "--router",
                cluster.frontend, "--result-file", path, "--no-progress"] + args
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"carpool bench serve failed ({r.returncode}): {r.stderr}")
        with open(path) as f:
            j = json.load(f)
        log(f"  {tag}: {j['completed']} ok / {j['failed']} failed in {j['duration']:.1f} s, "
            f"{j['output_throughput']:.0f} tok/s, goodput {j['request_goodput']}, "
            f"TTFT p50 {j['median_ttft_ms']:.0f} ms, ITL p99 {j['p99_itl_ms']:.0f} ms")
        return j

    def run_tool(self, argv, tag):
        log(f"  {' '.join(argv)}")
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with open(os.path.join(self.logdir, f"{tag}.log"), "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
        return r.stdout

    def engine_bench(self, only, tag, extra=()):
        path = os.path.join(self.results, f"{tag}.json")
        self.run_tool([os.path.join(self.bindir, "carpool-bench-engine"), "--only", only,
                       "--json-file", path] + list(extra), tag)
        with open(path) as f:
            return json.load(f)

    def save_plot(self, fig, name):
        path = os.path.join(self.imgdir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        self.plt.close(fig)
        return f"![{name}](img/{name})"

    # ---- scenarios

    def scenario_a(self):
        model = "synthetic:small"
        seqs = 16
        slo = "ttft:500 tpot:50"
        fractions = [0.25, 0.5, 0.75]
        lengths = ["exponential:48:256", "fixed:48"]
        workers = {p: [["--model", model, "--max-num-seqs", str(seqs), "--max-model-len", "1024",
                        "--scheduler", p]] for p in ("continuous", "static")}
        rows, capacity, rates = {}, {}, {}
        for out_len in lengths:
            dist = out_len.split(":")[0]
            # The offered loads are fractions of what continuous batching sustains on this
            # machine right now (closed loop, 16 in flight), so the sweep means the same on a
            # faster or a busier machine.
            with Cluster(self.bindir, self.logdir, f"a_capacity_{dist}",
                         workers["continuous"]) as c:
                cap = self.bench_serve(c, ["--num-prompts", str(4 * seqs), "--input-len", "32",
                                           "--output-len", out_len, "--max-concurrency",
                                           str(seqs), "--seed", "1", "--num-warmups", "2"],
                                       f"a_capacity_{dist}")
            capacity[out_len] = cap["request_throughput"]
            rates[out_len] = [round(f * capacity[out_len], 2) for f in fractions]
            # The two policies run back to back at each point (a fresh cluster each), so a
            # burst of load from elsewhere on the machine hits both sides of a ratio alike.
            for f, rate in zip(fractions, rates[out_len]):
                for policy in ("continuous", "static"):
                    tag = f"a_{policy}_{dist}_{f}"
                    with Cluster(self.bindir, self.logdir, tag, workers[policy]) as c:
                        rows[(out_len, policy, f)] = self.bench_serve(c, [
                            "--num-prompts", str(max(24, round(8 * rate))), "--input-len", "32",
                            "--output-len", out_len, "--request-rate", str(rate), "--goodput",
                            *slo.split(), "--seed", "1", "--num-warmups", "2"], tag)
        md = [
            f"Model `{model}`, one worker, `--max-num-seqs {seqs}`; 32-token prompts; SLO "
            f"`{slo}` (ms) for both policies. Goodput = requests meeting every SLO per second of "
            "the run. Static batching starts a batch when 16 requests wait or 50 ms after the "
            "first arrived, and nobody joins a running batch. Capacity = requests/s of "
            "continuous batching with 16 requests always in flight (closed loop, 64 requests), "
            "measured first; the sweep then offers Poisson arrivals at 0.25, 0.5 and 0.75 of it "
            "(about 8 s of arrivals, at least 24 requests), each policy on a fresh worker, back "
            "to back.", "",
            "```", f"carpool-worker --model {model} --max-num-seqs {seqs} --max-model-len 1024 "
            "--scheduler {continuous|static}",
            "carpool bench serve --num-prompts 64 --input-len 32 --output-len "
            "{exponential:48:256|fixed:48} --max-concurrency 16 --seed 1 --num-warmups 2   "
            "# capacity",
            "carpool bench serve --num-prompts max(24,8xRATE) --input-len 32 --output-len "
            "{exponential:48:256|fixed:48} --request-rate RATE --goodput " + slo +
            " --seed 1 --num-warmups 2", "```", "",
            "| output lengths | offered req/s (x capacity) | goodput cont. / static (req/s) | "
            "ratio | output tok/s cont. / static | TTFT p50 cont. / static (ms) | TPOT p50 "
            "cont. / static (ms) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
        summary = []
        for out_len in lengths:
            peak = {}
            for f, rate in zip(fractions, rates[out_len]):
                c, s = rows[(out_len, "continuous", f)], rows[(out_len, "static", f)]
                gc, gs = c["request_goodput"], s["request_goodput"]
                md.append(f"| {out_len} | {rate:.2f} ({f}) | {gc:.2f} / {gs:.2f} | "
                          f"{ratio(gc, gs)} | {c['output_throughput']:.0f} / "
                          f"{s['output_throughput']:.0f} | {c['median_ttft_ms']:.0f} / "
                          f"{s['median_ttft_ms']:.0f} | {c['median_tpot_ms']:.1f} / "
                          f"{s['median_tpot_ms']:.1f} |")
                for p, g in (("continuous", gc), ("static", gs)):
                    peak[p] = max(peak.get(p, 0), g)
            summary.append((out_len, peak["continuous"], peak["static"]))
        md.append("")
        for out_len, pc, ps in summary:
            need = 3.0 if out_len.startswith("exponential") else 1.5
            ok = pc >= need * ps
            md.append(f"- {out_len.split(':')[0]} output lengths (capacity "
                      f"{capacity[out_len]:.2f} req/s): peak goodput over the sweep {pc:.2f} "
                      f"(continuous) vs {ps:.2f} (static) req/s: **{ratio(pc, ps)}**; target "
                      f">= {need}x: {verdict(ok)}.")
        if self.plt:
            fig, axes = self.plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
            for ax, out_len in zip(axes, lengths):
                xs = rates[out_len]
                for policy, style in (("continuous", "o-"), ("static", "s--")):
                    ax.plot(xs, [rows[(out_len, policy, f)]["request_goodput"]
                                 for f in fractions], style, label=f"{policy} goodput")
                    ax.plot(xs, [rows[(out_len, policy, f)]["request_throughput"]
                                 for f in fractions], style, alpha=0.3,
                            label=f"{policy} throughput")
                ax.plot(xs, xs, ":", color="gray", label="offered")
                ax.set_title(f"{model}, output {out_len}, SLO {slo}", fontsize=9)
                ax.set_xlabel("offered load (req/s)")
                ax.grid(alpha=0.3)
            axes[0].set_ylabel("req/s")
            axes[0].legend(fontsize=7)
            md += ["", self.save_plot(fig, "bench_a_batching.png")]
        return {"data": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in rows.items()},
                "capacity": capacity, "summary": summary}, md

    def scenario_b(self):
        model = "synthetic:small"
        max_len = 512
        rows = []
        for n in [1, 2, 4, 8, 16, 32, 64]:
            workers = [["--model", model, "--max-num-seqs", str(n), "--max-model-len",
                        str(max_len)]]
            with Cluster(self.bindir, self.logdir, f"b_{n}", workers) as c:
                j = self.bench_serve(c, ["--num-prompts", str(max(8, 3 * n)), "--input-len",
                                         "64", "--output-len", "64", "--max-concurrency",
                                         str(n), "--seed", "2", "--num-warmups", "1"], f"b_{n}")
            rows.append((n, j))
        per_block = KV_BYTES_PER_TOKEN[model] * 16
        base = rows[0][1]["output_throughput"]
        md = [
            f"Model `{model}`, one worker; 64-token prompts, 64 output tokens; the client keeps "
            "exactly `--max-num-seqs` requests in flight (closed loop), so the batch is full "
            "except while requests turn over. Step time = median inter-token latency seen by "
            "the client (one engine step per token). KV pool = the worker's default for "
            f"`--max-num-seqs` sequences of `--max-model-len {max_len}` tokens; peak used = "
            "router stats sampled every 250 ms. fp32 KV: "
            f"{KV_BYTES_PER_TOKEN[model] // 1024} KiB per token.", "",
            "```", f"carpool-worker --model {model} --max-num-seqs N --max-model-len {max_len}",
            "carpool bench serve --num-prompts max(8,3N) --input-len 64 --output-len 64 "
            "--max-concurrency N --seed 2 --num-warmups 1", "```", "",
            "| max-num-seqs | output tok/s | vs 1 | step ms (ITL p50) | ITL p99 ms | TTFT p50 / "
            "p99 ms | E2EL p50 / p99 ms | KV pool MiB | peak KV used MiB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for n, j in rows:
            s = j.get("server", {})
            md.append(
                f"| {n} | {j['output_throughput']:.1f} | {j['output_throughput'] / base:.1f}x | "
                f"{j['median_itl_ms']:.1f} | {j['p99_itl_ms']:.1f} | "
                f"{j['median_ttft_ms']:.0f} / {j['p99_ttft_ms']:.0f} | "
                f"{j['median_e2el_ms']:.0f} / {j['p99_e2el_ms']:.0f} | "
                f"{s.get('num_kv_blocks', 0) * per_block / 2**20:.0f} | "
                f"{s.get('peak_kv_used_blocks', 0) * per_block / 2**20:.1f} |")
        tput = {n: j["output_throughput"] for n, j in rows}
        md += ["", f"- Output tokens/s at 16 sequences: **{tput[16] / tput[1]:.1f}x** batch 1 "
               f"({tput[16]:.0f} vs {tput[1]:.0f}); target >= 6x: "
               f"{verdict(tput[16] >= 6 * tput[1])}."]
        if self.plt:
            ns = [n for n, _ in rows]
            fig, ax = self.plt.subplots(1, 2, figsize=(10, 3.8))
            ax[0].plot(ns, [j["output_throughput"] for _, j in rows], "o-")
            ax[0].set_title(f"throughput ({model}, closed loop)")
            ax[0].set_xscale("log", base=2)
            ax[0].set_xlabel("--max-num-seqs")
            ax[0].set_ylabel("output tokens/s")
            ax[0].grid(alpha=0.3)
            ax[1].plot(ns, [j["median_itl_ms"] for _, j in rows], "o-", label="step (ITL p50)")
            ax[1].plot(ns, [j["p99_itl_ms"] for _, j in rows], "s--", label="ITL p99")
            ax[1].plot(ns, [j["median_e2el_ms"] / 64 for _, j in rows], "^:",
                       label="E2EL p50 / 64 tokens")
            ax[1].set_title("latency")
            ax[1].set_yscale("log")
            ax[1].set_xscale("log", base=2)
            ax[1].set_xlabel("--max-num-seqs")
            ax[1].set_ylabel("ms")
            ax[1].legend(fontsize=8)
            ax[1].grid(alpha=0.3)
            md += ["", self.save_plot(fig, "bench_b_batch_sweep.png")]
        return {"data": {str(n): j for n, j in rows}}, md

    def scenario_c(self):
        model = "synthetic:small"
        prompts = os.path.join(self.results, "c_prompts.jsonl")
        rng = random.Random(3)
        num, long_len, long_every = 64, 1024, 8
        with open(prompts, "w") as f:
            for i in range(num):
                if i % long_every == long_every // 2:
                    line = {"prompt_ids": [rng.randrange(256) for _ in range(long_len)],
                            "max_tokens": 16}
                else:
                    line = {"prompt_ids": [rng.randrange(256) for _ in range(32)],
                            "max_tokens": 64}
                f.write(json.dumps(line) + "\n")
        configs = [("chunked", ["--enable-chunked-prefill", "--max-num-batched-tokens", "256"]),
                   ("unchunked", ["--no-enable-chunked-prefill", "--max-num-batched-tokens",
                                  "2048"])]
        rows = {}
        for name, flags in configs:
            workers = [["--model", model, "--max-num-seqs", "16", "--max-model-len", "2048"] +
                       flags]
            with Cluster(self.bindir, self.logdir, f"c_{name}", workers) as c:
                rows[name] = self.bench_serve(c, ["--dataset", "jsonl", "--dataset-path", prompts,
                                                  "--max-concurrency", "16", "--num-warmups", "1",
                                                  "--save-detailed"], f"c_{name}")
        ch, un = rows["chunked"], rows["unchunked"]
        md = [
            f"Model `{model}`, one worker, `--max-num-seqs 16`; {num} requests, 16 in flight "
            f"(closed loop): one in {long_every} has a {long_len}-token prompt and 16 output "
            "tokens, the others 32-token prompts and 64 output tokens (prompts file written by "
            "the suite, seed 3). Chunked: prompts are split into 256-token chunks that ride "
            "with the decodes; unchunked: a prompt is prefilled in one step, during which every "
            "running sequence waits.", "",
            "```",
            f"carpool-worker --model {model} --max-num-seqs 16 --max-model-len 2048 "
            "{--enable-chunked-prefill --max-num-batched-tokens 256 | --no-enable-chunked-prefill "
            "--max-num-batched-tokens 2048}",
            "carpool bench serve --dataset jsonl --dataset-path c_prompts.jsonl "
            "--max-concurrency 16 --num-warmups 1 --save-detailed", "```", "",
            "| prefill | ITL p50 ms | ITL p90 ms | ITL p99 ms | TTFT p50 / p99 ms | output tok/s "
            "| total tok/s |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
        for name in ("unchunked", "chunked"):
            j = rows[name]
            md.append(f"| {name} | {j['median_itl_ms']:.1f} | {j['p90_itl_ms']:.1f} | "
                      f"{j['p99_itl_ms']:.1f} | {j['median_ttft_ms']:.0f} / "
                      f"{j['p99_ttft_ms']:.0f} | {j['output_throughput']:.1f} | "
                      f"{j['total_token_throughput']:.1f} |")
        loss = 1 - ch["total_token_throughput"] / un["total_token_throughput"]
        itl_ratio = ch["p99_itl_ms"] / un["p99_itl_ms"]
        md += ["", f"- p99 ITL chunked / unchunked: **{itl_ratio:.2f}** (target <= 0.5: "
               f"{verdict(itl_ratio <= 0.5)}); total token throughput "
               f"{'lost' if loss >= 0 else 'gained'} by chunking: **{abs(loss) * 100:.1f}%** "
               f"(target <= 10% lost: {verdict(loss <= 0.10)}; output tokens/s "
               f"{(1 - ch['output_throughput'] / un['output_throughput']) * 100:+.1f}% lost)."]
        if self.plt:
            fig, ax = self.plt.subplots(figsize=(6, 3.8))
            for name, style in (("unchunked", "--"), ("chunked", "-")):
                gaps = sorted(g * 1e3 for r in rows[name]["itls"] for g in r)
                n = len(gaps)
                ax.plot(gaps, [1 - (i + 0.5) / n for i in range(n)], style, label=name)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"ITL tail, {long_len}-token prompts mixed in ({model})")
            ax.set_xlabel("inter-token latency (ms)")
            ax.set_ylabel("fraction of gaps longer")
            ax.grid(alpha=0.3)
            ax.legend()
            md += ["", self.save_plot(fig, "bench_c_chunked_prefill.png")]
        for j in rows.values():
            for k in ("itls", "ttfts", "e2els", "input_lens", "output_lens", "errors"):
                j.pop(k, None)
        return {"data": rows}, md

    def scenario_d(self):
        out = self.run_tool([os.path.join(self.bindir, "carpool-bench-router"), "--requests",
                             "2000", "--throughput-requests", "20000", "--json"], "d_router")
        j = json.loads(out[out.index("{"):])
        md = [
            "Minimal request (one prompt token, one output token), loopback TCP, one request in "
            "flight, the two paths interleaved; \"direct\" is a client and a bare ZeroMQ ROUTER "
            "server that decodes and answers; \"router\" is client -> carpool-router -> "
            "carpool-worker --model echo -> router -> client. Throughput: 20,000 requests, 64 "
            "in flight, router pinned to one core.", "",
            "```", "carpool-bench-router --requests 2000 --throughput-requests 20000 --json",
            "```", "",
            "| direct p50 / p99 µs | router p50 / p99 µs | router adds at p50 | requests/s "
            "through the router |",
            "| --- | --- | --- | --- |",
            f"| {j['direct_p50_us']:.1f} / {j['direct_p99_us']:.1f} | {j['router_p50_us']:.1f} / "
            f"{j['router_p99_us']:.1f} | {j['router_added_p50_us']:.1f} µs | "
            f"{j['router_rps_one_core']:,.0f} |"]
        return {"data": j}, md

    def scenario_e(self):
        j = self.engine_bench("decode,prefill", "e_engine")
        out = self.run_tool([os.path.join(self.bindir, "carpool-bench-kernels"), "0.15"],
                            "e_kernels")
        kernels = []
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 6 and all(re.fullmatch(r"[0-9.]+", x) for x in f[:6]):
                kernels.append({"n": int(f[0]), "k": int(f[1]), "m": int(f[2]),
                                "ours_gflops": float(f[3]), "openblas_gflops": float(f[4])})
        floor = j["batch1_floor_ms"]
        md = [
            f"Model `{j['model']}`, fp32, {j['threads']} threads, in one process: bandwidth = a "
            "2-thread streaming read of 1 GiB (best of 5); one decode step at batch 1 must read "
            f"{j['decode_weight_bytes'] / 1e6:.1f} MB of weights, so the floor is "
            f"{j['decode_weight_bytes'] / 1e6:.1f} MB / {j['bandwidth_gb_s']:.1f} GB/s = "
            f"{floor:.2f} ms.", "",
            "```", "carpool-bench-engine --only decode,prefill",
            "carpool-bench-kernels 0.15", "```", "",
            "| decode batch | step ms | step / floor | tokens/s | vs batch 1 |",
            "| --- | --- | --- | --- | --- |"]
        for b, d in sorted(j["decode"].items(), key=lambda kv: int(kv[0])):
            md.append(f"| {b} | {d['step_ms']:.2f} | {d['step_ms'] / floor:.2f} | "
                      f"{d['tokens_per_s']:.1f} | {d['speedup_vs_batch1']:.1f}x |")
        p = j["prefill"]
        md += ["", f"Prefill (8 prompts x 256 tokens): {p['tokens_per_s']:.0f} tokens/s = "
               f"{p['gflops']:.0f} GFLOP/s, against OpenBLAS's own sgemm at 512x2048x768 in the "
               f"same run, {p['openblas_gflops']:.0f} GFLOP/s: ratio {p['ratio']:.2f}.", "",
               "GEMM at prefill shapes (M = batch tokens; GFLOP/s, ours vs OpenBLAS 2-thread "
               "sgemm, best of repeated runs):", "",
               "| N x K | M=128 ours / OpenBLAS | M=512 ours / OpenBLAS |", "| --- | --- | --- |"]
        for n, k in sorted({(r["n"], r["k"]) for r in kernels}, key=lambda s: -s[0] * s[1]):
            cells = []
            for m in (128, 512):
                r = next((r for r in kernels if (r["n"], r["k"], r["m"]) == (n, k, m)), None)
                cells.append(f"{r['ours_gflops']:.0f} / {r['openblas_gflops']:.0f} "
                             f"({r['ours_gflops'] / r['openblas_gflops']:.2f}x)" if r else "-")
            md.append(f"| {n} x {k} | {cells[0]} | {cells[1]} |")
        b1 = j["decode"]["1"]["step_ms"] / floor
        md += ["", f"- Batch-1 decode step / bandwidth floor: **{b1:.2f}** (target <= 1.5: "
               f"{verdict(b1 <= 1.5)})."]
        if self.plt:
            fig, ax = self.plt.subplots(1, 2, figsize=(10, 3.8))
            bs = sorted(int(b) for b in j["decode"])
            ax[0].plot(bs, [j["decode"][str(b)]["step_ms"] for b in bs], "o-", label="decode step")
            ax[0].axhline(floor, color="r", ls="--", label=f"bandwidth floor {floor:.1f} ms")
            ax[0].axhline(1.5 * floor, color="r", ls=":", label="1.5x floor (target)")
            ax[0].set_xscale("log", base=2)
            ax[0].set_title(f"decode step vs bandwidth floor ({j['model']})")
            ax[0].set_xlabel("decode batch")
            ax[0].set_ylabel("ms per step")
            ax[0].legend(fontsize=8)
            ax[0].grid(alpha=0.3)
            shapes = [f"{r['n']}x{r['k']}\nM={r['m']}" for r in kernels if r["m"] in (128, 512)]
            ours = [r["ours_gflops"] for r in kernels if r["m"] in (128, 512)]
            blas = [r["openblas_gflops"] for r in kernels if r["m"] in (128, 512)]
            xs = range(len(shapes))
            ax[1].bar([x - 0.2 for x in xs], ours, 0.4, label="carpool Linear")
            ax[1].bar([x + 0.2 for x in xs], blas, 0.4, label="OpenBLAS sgemm")
            ax[1].set_xticks(list(xs))
            ax[1].set_xticklabels(shapes, fontsize=6)
            ax[1].set_title("GEMM at prefill shapes (N x K, M tokens)")
            ax[1].set_ylabel("GFLOP/s")
            ax[1].legend(fontsize=8)
            md += ["", self.save_plot(fig, "bench_e_roofline.png")]
        return {"data": {"engine": j, "kernels": kernels}}, md

    def scenario_f(self):
        j = self.engine_bench("overhead", "f_overhead")
        o = j["overhead"]
        md = [
            f"Model `{j['model']}`, {j['threads']} threads, `--max-num-seqs 64`: wall time "
            "inside the model's forward (Engine::forward_micros) over the wall time of "
            "Engine::Step (schedule, forward, sampling, scheduler update, events). Decode rows: "
            "N sequences, timed after every one has its first token; mixed: 128 requests "
            "(32-token prompts, exponential output lengths, mean 48) queued at once, every step "
            "full.", "",
            "```", "carpool-bench-engine --only overhead", "```", "",
            "| load | steps | forward ms / step | step ms | forward / step |",
            "| --- | --- | --- | --- | --- |"]
        for name in ("decode_batch_1", "decode_batch_16", "decode_batch_64", "mixed_saturated"):
            r = o[name]
            md.append(f"| {name.replace('_', ' ')} | {r['steps']} | "
                      f"{r['forward_ms_per_step']:.2f} | {r['step_ms']:.2f} | "
                      f"{r['ratio']:.3f} |")
        sat = min(o["decode_batch_64"]["ratio"], o["mixed_saturated"]["ratio"])
        md += ["", f"- At saturation (64-sequence decode and the mixed workload, the lower): "
               f"**{sat:.3f}** (target >= 0.9: {verdict(sat >= 0.9)})."]
        return {"data": j}, md

    def scenario_g(self):
        j = self.engine_bench("paged", "g_paged")
        p = j["paged"]
        md = [
            f"Model `{p['model']}` (the count does not depend on the model's size), block size "
            f"16, KV budget {p['num_kv_blocks']} blocks = {p['kv_tokens']} tokens, "
            f"`--max-model-len {p['max_model_len']}`, `--max-num-seqs 256`, prefix caching "
            f"off; {p['requests']} requests queued at once, prompts uniform in [64, 512] tokens, "
            "outputs exponential (mean 128, at most 1024). A contiguous allocator that gives "
            f"every sequence a max-length region fits {p['kv_tokens']} / "
            f"{p['max_model_len']} = {p['contiguous_seqs']} sequences.", "",
            "```", "carpool-bench-engine --only paged", "```", "",
            "| allocation | sequences running at once | vs contiguous |", "| --- | --- | --- |",
            f"| contiguous, max-length | {p['contiguous_seqs']} | 1x |",
            f"| paged, mean while requests waited ({p['saturated_steps']} steps) | "
            f"{p['mean_running']:.1f} | {p['mean_running'] / p['contiguous_seqs']:.1f}x |",
            f"| paged, peak | {p['peak_running']} | "
            f"{p['peak_running'] / p['contiguous_seqs']:.1f}x |", "",
            f"- Paged / contiguous (mean while saturated): "
            f"**{p['mean_running'] / p['contiguous_seqs']:.1f}x** (target >= 2x: "
            f"{verdict(p['mean_running'] >= 2 * p['contiguous_seqs'])}). Mean sequence length "
            f"{p['mean_seq_tokens']:.0f} tokens; {p['preemptions']} preemptions (the scheduler "
            "admits on the prompt's blocks and preempts the newest sequence by recompute when "
            "decoding runs out of blocks)."]
        return {"data": j}, md

    def scenario_i(self):
        path = os.path.join(self.results, "i_fleet.json")
        argv = [os.path.join(self.bindir, "carpool-bench-fleet"), "--json", path]
        self.run_tool(argv, "i_fleet")
        with open(path) as f:
            rows = json.load(f)
        failed = [r for r in rows if r.get("error")]
        if failed:
            raise RuntimeError(f"carpool-bench-fleet: {failed[0]['error']}")
        md = [
            "`carpool-bench-fleet` starts one `carpool-router` and, in its own process, a "
            "simulated fleet whose workers (one DEALER socket each, real registration, heartbeats "
            "with load and KV events, ZMTP heartbeats as carpool-worker's, 10,000 cached prefix "
            "blocks each) answer at once, so the "
            "router's own cost is what is measured; the clients, the fleet and the router share "
            "the machine's cores. Placement + admission is timed in process on the router's "
            "structures at the same fleet size (the placement index and the admission cycle); "
            "\"linear\" is the same choice made the old way, over a snapshot of every worker "
            "(kept as the reference the index is tested against).", "",
            "```", "carpool-bench-fleet --json FILE", "```", "",
            "| workers | policy | placement + admission µs | linear µs | req/s | router CPU µs / "
            "req | of it ZeroMQ I/O threads | fleet + clients CPU µs / req | p50 / p99 round trip "
            "µs | idle router, share of a core |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            admit = r["admission_cycle_ns"]
            indexed = (r["indexed_place_ns"] + admit) / 1000
            linear = (r["worker_list_ns"] + r["placement_view_ns"] + r["place_ns"] + admit) / 1000
            md.append(f"| {r['workers']} | {r['policy']} | {indexed:.2f} | {linear:.2f} | "
                      f"{r['requests_per_s']:,.0f} | {r['router_cpu_us_per_request']:.1f} | "
                      f"{r.get('router_zmq_io_cpu_us_per_request', 0):.1f} | "
                      f"{r.get('fleet_clients_cpu_us_per_request', 0):.1f} | "
                      f"{r['latency_p50_us']:.0f} / {r['latency_p99_us']:.0f} | "
                      f"{100 * r['idle_router_core_share']:.1f}% |")
        biggest = max(r["workers"] for r in rows)
        top = [r for r in rows if r["workers"] == biggest]
        worst = max((r["indexed_place_ns"] + r["admission_cycle_ns"]) / 1000 for r in top)
        rps = max(r["requests_per_s"] for r in top)
        idle = max(r["idle_router_core_share"] for r in top)
        t = top[0]
        # What the machine's cores allow at the biggest fleet: every request costs the router's
        # CPU plus the fleet's and the clients' (all on this machine), and cores x 1 s is all
        # there is; and what the router alone would allow with a core per thread (its loop and
        # ZeroMQ's I/O thread work in parallel, so the busier one limits).
        cores = t.get("cores", os.cpu_count() or 1)
        total = min(r["router_cpu_us_per_request"] + r.get("fleet_clients_cpu_us_per_request", 0)
                    for r in top)
        router_alone = max(1e6 / max(r["router_cpu_us_per_request"] -
                                     r.get("router_zmq_io_cpu_us_per_request", 0),
                                     r.get("router_zmq_io_cpu_us_per_request", 0), 1e-3)
                           for r in top)
        md += ["",
               f"- Placement + admission at {biggest} workers: at most **{worst:.2f} µs** "
               f"(target <= 5 µs: {verdict(worst <= 5)}; stretch 2 µs: {verdict(worst <= 2)}).",
               f"- Requests/s through one router at {biggest} workers: at most **{rps:,.0f}** "
               f"(target >= 100,000: {verdict(rps >= 100000)}). Router + fleet + clients take at "
               f"least {total:.1f} µs of CPU per request here, so this machine's {cores} cores "
               f"allow at most {cores * 1e6 / total:,.0f} req/s whatever the router does; the "
               f"router's own CPU per request (its loop and ZeroMQ's I/O thread, on a core each) "
               f"would allow at most {router_alone:,.0f} req/s (a bound from the measured CPU, "
               "not a measured rate).",
               f"- Idle router at {biggest} workers, heartbeats every {t['heartbeat_ms']} ms: "
               f"**{100 * idle:.1f}%** of a core (target <= 10%: {verdict(idle <= 0.10)}); its "
               f"50 ms housekeeping pass {t['housekeeping_pass_us'] / 1000:.2f} ms.",
               f"- Prefix index at {biggest} x {t['cached_blocks_per_worker']:,} blocks: "
               f"{t['index_table_bytes'] / 1e6:.1f} MB in its tables, bounded by each worker's "
               "KV blocks."]
        return {"data": rows}, md

    def scenario_h(self):
        model, seqs, max_len = "synthetic:small", 8, 512
        in_len, out_len = 32, 64
        load = 0.6
        batch_in_flight, batch_queued = 4, 8
        state = os.path.join(self.results, "h_state")
        shutil.rmtree(state, ignore_errors=True)  # a batch left by an earlier run would resume
        worker = ["--model", model, "--max-num-seqs", str(seqs), "--max-model-len", str(max_len)]
        router = ["--http", "127.0.0.1:0", "--state-dir", state, "--batch-max-in-flight",
                  str(batch_in_flight), "--batch-max-queued", str(batch_queued)]
        shape = ["--input-len", str(in_len), "--output-len", str(out_len)]
        capacity = ["--num-prompts", str(4 * seqs), *shape, "--max-concurrency", str(seqs),
                    "--seed", "8", "--num-warmups", "2"]
        runs, loads, windows = {}, {}, []
        with Cluster(self.bindir, self.logdir, "h", [worker], router) as c:
            def run(tag, args):
                loads[tag] = os.getloadavg()[0]
                runs[tag] = self.bench_serve(c, args, f"h_{tag}")

            # The runs go capacity, alone, with the batch, with the batch, alone, capacity, each
            # pair pooled, so a machine that gets slower or faster over the scenario moves both
            # sides of every ratio alike. The interactive load is a fraction of the capacity
            # measured first; every interactive run sends the same requests at the same times
            # (same seed), about 25 s of arrivals and at least 40 requests.
            run("capacity1", capacity)
            rate = round(load * runs["capacity1"]["request_throughput"], 2)
            half = max(40, round(25 * rate))
            interactive = ["--num-prompts", str(half), *shape, "--request-rate", str(rate),
                           "--seed", "8", "--save-detailed"]
            run("alone1", interactive)
            # Enough batch requests to keep the lane full past both loaded runs even if the
            # batch had the whole capacity; cancelled after them.
            lines = round(1.5 * runs["capacity1"]["request_throughput"] * 2 * half / rate) + \
                batch_in_flight + batch_queued
            batch_url = self.start_batch(c, model, lines, in_len, out_len,
                                         min(batch_in_flight, seqs))
            for tag in ("batch1", "batch2"):
                before = self.batch_counters(c)
                run(tag, interactive)
                windows.append((before, self.batch_counters(c)))
            at_end = http_json(batch_url)
            http_json(batch_url + "/cancel", {})
            # The second alone run starts once the batch has ended and left the lane.
            deadline = time.time() + 120
            while http_json(batch_url)["status"] not in ("cancelled", "completed", "failed",
                                                         "expired") or \
                    metric(c.http, "carpool_batch_lane_requests", 'state="running"') or \
                    metric(c.http, "carpool_batch_lane_requests", 'state="queued"'):
                if time.time() > deadline:
                    raise RuntimeError(f"{batch_url} did not end within 120 s of its cancel")
                time.sleep(0.2)
            final = http_json(batch_url)
            log(f"  batch {final['id']}: {at_end['status']} at the end of the load, then "
                f"{final['status']} ({final['request_counts']})")
            run("alone2", interactive)
            run("capacity2", capacity)
        alone = pooled([runs["alone1"], runs["alone2"]])
        mixed = pooled([runs["batch1"], runs["batch2"]])
        window = sum(a["time"] - b["time"] for b, a in windows)
        delta = {k: sum(a[k] - b[k] for b, a in windows)
                 for k in ("completion_tokens", "done", "kv_preemptions", "suspensions")}
        router_preemptions = None if windows[0][0]["batch_preemptions"] is None else sum(
            a["batch_preemptions"] - b["batch_preemptions"] for b, a in windows)
        b_tok = delta["completion_tokens"] / window
        c_tok = (runs["capacity1"]["output_throughput"] +
                 runs["capacity2"]["output_throughput"]) / 2
        i_tok = alone["output_throughput"]
        left = c_tok - i_tok
        share = b_tok / left if left > 0 else 0.0
        both = mixed["output_throughput"] + b_tok
        ttft = mixed["p99_ttft_ms"] / alone["p99_ttft_ms"]
        tpot = mixed["p99_tpot_ms"] / alone["p99_tpot_ms"]
        md = [
            f"Model `{model}`, the smallest preset whose engine step, not the per-token work of "
            "the router and the client, bounds the throughput (with `synthetic:tiny` the 2 "
            "cores spend most of a token on messages, which the batch's tokens would compete "
            f"for instead of the engine's steps). One worker, `--max-num-seqs {seqs}`; every "
            f"request, interactive or batch, has a {in_len}-token prompt and exactly {out_len} "
            "output tokens. One cluster, in this order: capacity C (closed loop, "
            f"{seqs} in flight); interactive alone (Poisson arrivals at {load} of the first "
            f"C's requests/s, {half} requests, seed 8); a batch of {lines} `/v1/completions` "
            "requests of the same shape uploaded to `/v1/files` and created on `/v1/batches`; "
            f"once {min(batch_in_flight, seqs)} of them run, the same interactive load twice; "
            "the batch cancelled; interactive alone again; C again. Alone and with the batch "
            "are each the two runs' requests pooled (I = their output tokens over their "
            "durations), C the mean of its two runs, so a drift of the shared machine's speed "
            "moves both sides alike. The batch's tokens/s B is the growth of "
            "`carpool_batch_tokens_total{kind=\"completion\"}` on `/metrics` over the two "
            "loaded runs' wall time.", "",
            f"Knobs: `--max-num-seqs {seqs}`, because up to about that many sequences this "
            "model's step grows slowly with the batch (scenario b), so a worker the batch keeps "
            "full slows the interactive tokens less than at 16 or more; "
            f"`--batch-max-in-flight {batch_in_flight}` bounds how many of the worker's steps' "
            "sequences the batch takes (an interactive request that finds every slot taken has "
            "the worker suspend a batch generation for it, KV kept); "
            f"`--batch-max-queued {batch_queued}` keeps "
            "a refill at the router without a long tail to cancel; `--interactive-reserve` "
            f"stays 0: sequence slots bind here, not the in-flight token budget ({seqs} x "
            f"{max_len} tokens of KV against {in_len + out_len}-token requests).", "",
            "```",
            f"carpool-worker --model {model} --max-num-seqs {seqs} --max-model-len {max_len}",
            f"carpool-router --http 127.0.0.1:0 --state-dir STATE --batch-max-in-flight "
            f"{batch_in_flight} --batch-max-queued {batch_queued}",
            f"carpool bench serve {' '.join(capacity)}   # C",
            f"carpool bench serve {' '.join(interactive)}   # alone, with the batch",
            "```", "",
            "| run | requests ok / failed | req/s | output tok/s | TTFT p50 / p99 ms | TPOT p50 "
            "/ p99 ms | peak running | load avg |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        names = {"capacity1": "C, first", "alone1": "alone, first", "batch1": "with the batch, "
                 "first", "batch2": "with the batch, second", "alone2": "alone, second",
                 "capacity2": "C, second"}
        for tag, name in names.items():
            j = runs[tag]
            md.append(f"| {name} | {j['completed']} / {j['failed']} | "
                      f"{j['request_throughput']:.2f} | {j['output_throughput']:.1f} | "
                      f"{j['median_ttft_ms']:.0f} / {j['p99_ttft_ms']:.0f} | "
                      f"{j['median_tpot_ms']:.1f} / {j['p99_tpot_ms']:.1f} | "
                      f"{j.get('server', {}).get('peak_running', '-')} | {loads[tag]:.2f} |")
        for name, p in (("**alone, pooled (I)**", alone), ("**with the batch, pooled**", mixed)):
            md.append(f"| {name} | {p['completed']} / {p['failed']} | {p['request_throughput']:.2f}"
                      f" | {p['output_throughput']:.1f} | {p['median_ttft_ms']:.0f} / "
                      f"{p['p99_ttft_ms']:.0f} | {p['median_tpot_ms']:.1f} / "
                      f"{p['p99_tpot_ms']:.1f} | | |")
        md.append(f"| **batch B**, over the loaded runs ({window:.0f} s) | {delta['done']:.0f} "
                  f"done | {delta['done'] / window:.2f} | {b_tok:.1f} | | | | |")
        md.append("")
        busiest = max(loads.values())
        if busiest > 1.25 * (os.cpu_count() or 1):
            md.append(f"- **The machine was busy** (1-minute load average up to {busiest:.1f} on "
                      f"{os.cpu_count()} cores): the other load slowed the runs unevenly (see "
                      "the two C runs), so the ratios below measure it as much as the batch and "
                      "are no verdict; rerun on an idle machine.")
        pairs = (("alone1", "batch1"), ("alone2", "batch2"))
        md += [
            f"- p99 TTFT with / without the batch: **{ttft:.2f}** ({mixed['p99_ttft_ms']:.0f} "
            f"/ {alone['p99_ttft_ms']:.0f} ms; target <= 1.25: {verdict(ttft <= 1.25)}); at "
            f"p50: {mixed['median_ttft_ms'] / alone['median_ttft_ms']:.2f}.",
            f"- p99 TPOT with / without the batch: **{tpot:.2f}** ({mixed['p99_tpot_ms']:.1f} / "
            f"{alone['p99_tpot_ms']:.1f} ms; target <= 1.25: {verdict(tpot <= 1.25)}); at p50: "
            f"{mixed['median_tpot_ms'] / alone['median_tpot_ms']:.2f}. Each loaded run against "
            "the alone run next to it (first, second): p99 TTFT " + ", ".join(
                f"{runs[b]['p99_ttft_ms'] / runs[a]['p99_ttft_ms']:.2f}" for a, b in pairs) +
            "; p99 TPOT " + ", ".join(
                f"{runs[b]['p99_tpot_ms'] / runs[a]['p99_tpot_ms']:.2f}" for a, b in pairs) + ".",
            f"- Batch tokens/s / capacity the interactive load leaves: **{share:.2f}** (B "
            f"{b_tok:.1f} / (C {c_tok:.1f} - I {i_tok:.1f}) tok/s; target >= 0.70: "
            f"{verdict(share >= 0.70)}). Interactive with the batch + B: {both:.1f} tok/s = "
            f"{both / c_tok:.2f} of C.",
            f"- The batch was {at_end['status']} at the end of the loaded runs "
            f"({at_end['request_counts']['completed']} of {lines} done"
            + ("" if at_end["status"] == "in_progress" else
               "; it did not outlast the load, so B is too low") +
            f"), then {final['status']}. During the loaded runs the router preempted "
            + ("(not reported)" if router_preemptions is None else f"{router_preemptions:.0f}")
            + f" batch requests for interactive ones; the worker suspended "
            f"{delta['suspensions']:.0f} batch sequences for interactive ones (KV kept) and "
            f"preempted {delta['kv_preemptions']:.0f} sequences for KV blocks."]
        for j in runs.values():
            for k in ("itls", "ttfts", "e2els", "input_lens", "output_lens", "errors"):
                j.pop(k, None)
        return {"data": {"runs": runs, "alone": alone, "mixed": mixed, "windows": windows,
                         "batch_at_end": at_end, "batch_final": final,
                         "ratios": {"p99_ttft": ttft, "p99_tpot": tpot, "batch_share": share}}}, md

    def start_batch(self, cluster, model, lines, in_len, out_len, running):
        """Uploads and creates a batch of `lines` completions, returns its URL once `running`
        of its requests are running."""
        rng = random.Random(8)
        body = "".join(json.dumps({
            "custom_id": f"h-{i}", "method": "POST", "url": "/v1/completions",
            "body": {"model": model, "prompt": [rng.randrange(256) for _ in range(in_len)],
                     "max_tokens": out_len, "temperature": 0, "ignore_eos": True}}) + "\n"
            for i in range(lines))
        file_id = http_upload(cluster.http, "h_batch.jsonl", body.encode())["id"]
        batch = http_json(cluster.http + "/v1/batches", {"input_file_id": file_id,
                                                         "endpoint": "/v1/completions",
                                                         "completion_window": "24h"})
        url = f"{cluster.http}/v1/batches/{batch['id']}"
        deadline = time.time() + 60
        while True:
            status = http_json(url)["status"]
            if status not in ("validating", "in_progress"):
                raise RuntimeError(f"batch {batch['id']} ended {status} before the load")
            now = metric(cluster.http, "carpool_batch_lane_requests", 'state="running"')
            if status == "in_progress" and now >= running:
                return url
            if time.time() > deadline:
                raise RuntimeError(f"batch {batch['id']} has {now:.0f} of {running} requests "
                                   f"running after 60 s ({status})")
            time.sleep(0.1)

    def batch_counters(self, cluster):
        text = metrics_text(cluster.http)
        return {"time": time.time(),
                "completion_tokens": metric(cluster.http, "carpool_batch_tokens_total",
                                            'kind="completion"', text),
                "done": metric(cluster.http, "carpool_batch_requests_done_total", "", text),
                "batch_preemptions": metric(cluster.http, "carpool_batch_preemptions_total", "",
                                            text, missing=None),
                "kv_preemptions": metric_sum(text, "carpool_preemptions_total"),
                "suspensions": metric_sum(text, "carpool_suspensions_total")}


# ---- the router's HTTP API (scenario h)

def http_json(url, body=None, timeout=30):
    """GET url, or POST body as JSON; the answer's JSON. An error status raises with its body."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={} if data is None else
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')}")


def http_upload(base, filename, content):
    """POST /v1/files (multipart/form-data, purpose=batch): the file object."""
    boundary = f"carpool-bench-{random.getrandbits(64):016x}"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{filename}\"\r\nContent-Type: application/jsonl\r\n\r\n").encode() + \
        content + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(base + "/v1/files", data=body, headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"/v1/files: HTTP {e.code}: {e.read().decode(errors='replace')}")


def pooled(results):
    """TTFT and TPOT percentiles over the requests of several `--save-detailed` results (TPOT
    as bench serve computes it), and their output tokens over their summed durations."""
    ttfts, tpots = [], []
    for j in results:
        for ttft, e2el, n, error in zip(j["ttfts"], j["e2els"], j["output_lens"], j["errors"]):
            if error:
                continue
            ttfts.append(ttft * 1e3)
            if n > 1:
                tpots.append((e2el - ttft) / (n - 1) * 1e3)
    duration = sum(j["duration"] for j in results)
    return {"completed": len(ttfts), "failed": sum(j["failed"] for j in results),
            "request_throughput": len(ttfts) / duration,
            "output_throughput": sum(j["total_output_tokens"] for j in results) / duration,
            "median_ttft_ms": percentile(ttfts, 50), "p99_ttft_ms": percentile(ttfts, 99),
            "median_tpot_ms": percentile(tpots, 50), "p99_tpot_ms": percentile(tpots, 99)}


def percentile(xs, q):
    """numpy's default (linear between ranks), as bench serve reports them."""
    xs = sorted(xs)
    if not xs:
        return 0.0
    pos = q / 100 * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def metrics_text(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        return r.read().decode()


def metric(base, name, labels="", text=None, missing=0.0):
    """The sample `name{labels}` of the router's /metrics; `missing` when it has none."""
    text = metrics_text(base) if text is None else text
    key = f"{name}{{{labels}}}" if labels else name
    m = re.search(rf"^{re.escape(key)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else missing


def metric_sum(text, name):
    """The sum of every sample of counter `name`, whatever its labels."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$",
                                            text, re.M))


def verdict(ok):
    return "**met**" if ok else "**NOT met**"


def ratio(a, b):
    if b <= 0:
        return "inf" if a > 0 else "-"
    return f"{a / b:.1f}x"


# ---- docs/PERFORMANCE.md

INTRO_KEY = "intro"


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            if m:
                cpu = m.group(1).strip()
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(re.search(r"MemTotal:\s*(\d+)", f.read()).group(1))
            mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, AttributeError):
        pass
    return f"{os.cpu_count()} cores of {cpu}{mem}"


def commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


TITLES = {
    "a": "a. Continuous vs static batching at equal SLOs",
    "b": "b. Batch-size sweep (`--max-num-seqs`)",
    "c": "c. Chunked prefill with long prompts mixed in",
    "d": "d. Router overhead vs direct ZeroMQ",
    "e": "e. CPU roofline: batch-1 decode vs bandwidth; GEMM vs OpenBLAS",
    "f": "f. Engine overhead: forward time / step wall time",
    "g": "g. Paged KV: concurrent sequences at a fixed KV budget",
    "h": "h. Batch jobs under interactive load: isolation and the capacity they use",
    "i": "i. One router in front of a simulated fleet of 1 to 1,024 workers",
}

INTRO = """## Serving benchmark suite (issue 9): `make bench`

`make bench` runs `bench/run_suite.py` (through `scripts/bench.sh`): it starts its own
`carpool-router` and `carpool-worker` processes from `build/bin` on free 127.0.0.1 ports, runs the
scenarios, stops them, and rewrites the sections below (between their `bench:` markers) and the
plots in `docs/img/bench_*.png`; the sections above are hand-written and stay as they are.
`make bench SCENARIO=b` (or `SCENARIO=a,c`) runs only those scenarios and rewrites only their
sections. Serving scenarios drive the cluster with `carpool bench serve` ([bench.md](bench.md));
each section names the worker flags and the client command. Raw JSON results land in
`build/bench-results/`. One worker with 2 kernel threads shares the machine's 2 cores with the
router and the client, so absolute figures are lower than the engine alone reaches; compare within
a table."""


def update_doc(path, key, body):
    begin, end = f"<!-- bench:{key} begin -->", f"<!-- bench:{key} end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = open(path).read() if os.path.exists(path) else "# carpool performance\n"
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build folder holding bin/ (default build)")
    ap.add_argument("--scenarios", default=ALL_SCENARIOS,
                    help="which to run, e.g. b or a,c (default: all, a to i)")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "PERFORMANCE.md"),
                    help="the report to update (default docs/PERFORMANCE.md)")
    args = ap.parse_args()
    wanted = [s for s in args.scenarios.replace(",", "").lower() if s.strip()]
    bad = [s for s in wanted if s not in ALL_SCENARIOS]
    if bad or not wanted:
        ap.error(f"unknown scenario(s) {''.join(bad)!r}: choose from {ALL_SCENARIOS}")
    suite = Suite(args)
    for tool in ("carpool", "carpool-router", "carpool-worker", "carpool-bench-engine",
                 "carpool-bench-kernels", "carpool-bench-router", "carpool-bench-fleet"):
        if not os.access(os.path.join(suite.bindir, tool), os.X_OK):
            sys.exit(f"run_suite: {suite.bindir}/{tool} is missing: build first (make build)")
    update_doc(suite.doc, INTRO_KEY, INTRO)
    start = time.time()
    failed = []
    for s in wanted:
        t0 = time.time()
        load = os.getloadavg()[0]
        log(f"scenario {TITLES[s]} (load average {load:.2f})")
        try:
            data, md = getattr(suite, f"scenario_{s}")()
        except Exception as e:  # one failed scenario must not lose the others
            log(f"scenario {s} FAILED: {e}")
            failed.append(s)
            continue
        took = time.time() - t0
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        header = [f"### {TITLES[s]}", "",
                  f"Run of {stamp}, commit `{commit()}`, {machine()}; 1-minute load average "
                  f"{load:.2f} when the scenario started; it took {took:.0f} s "
                  f"(`make bench SCENARIO={s}`).", ""]
        update_doc(suite.doc, s, "\n".join(header + md))
        with open(os.path.join(suite.results, f"scenario_{s}.json"), "w") as f:
            json.dump({"took_s": took, **data}, f, indent=1, default=str)
        log(f"scenario {s} done in {took:.0f} s")
    log(f"suite done in {time.time() - start:.0f} s; report: {suite.doc}")
    if failed:
        sys.exit(f"run_suite: scenario(s) {','.join(failed)} failed (logs in {suite.logdir})")


if __name__ == "__main__":
    main()
