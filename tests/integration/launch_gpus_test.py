#!/usr/bin/env python3
"""How the launchers choose a worker's GPUs (docs/cluster.md, "Many hosts"), without GPUs or MPI.

  launch_gpus_test.py BIN_DIR SOURCE_DIR

- cluster/launch/plan.py names each worker's GPUs in its command, as ordinals into the GPUs its
  host's processes see: `--gpu K` for one rank, `--gpus A,B` (its slots) for a group.
- cluster/launch/mpirun.sh --router-outside --dry-run and cluster/slurm/carpool.sbatch (run with a
  fake mpirun and scontrol) start a group with those flags and leave CUDA_VISIBLE_DEVICES as the
  job had it (4,5,6,7 here, as Slurm sets it on a shared node), no `-x CUDA_VISIBLE_DEVICES`.
- carpool-worker refuses a bad --gpus with status 2 and a message naming the problem.
The slot -> device mapping itself is carpool_gpu_list_test's (worker/gpu_list.h).
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import unittest

BIN = SRC = ""


def plan(*args):
    r = subprocess.run([sys.executable, os.path.join(SRC, "cluster/launch/plan.py"), *args],
                       capture_output=True, text=True, timeout=30)
    return r


def worker_lines(sh_text):
    """[(host, gpus, ranks, argv)] of a --format sh plan."""
    out = []
    for line in sh_text.splitlines():
        role, host, gpus, ranks, cmd = line.split(" ", 4)
        if role == "worker":
            out.append((host, gpus, int(ranks), shlex.split(cmd)))
    return out


def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


class PlanTest(unittest.TestCase):
    def test_group_commands_name_their_slots_with_gpus(self):
        r = plan("--hosts", "a:4,b:4", "--tp", "2", "--model", "M", "--address", "a=10.0.0.1",
                 "--format", "sh")
        self.assertEqual(r.returncode, 0, r.stderr)
        workers = worker_lines(r.stdout)
        self.assertEqual([(h, g, n) for h, g, n, _ in workers],
                         [("a", "0,1", 2), ("a", "2,3", 2), ("b", "0,1", 2), ("b", "2,3", 2)])
        for host, gpus, ranks, argv in workers:
            self.assertEqual(flag(argv, "--gpus"), gpus, argv)
            self.assertEqual(flag(argv, "--tp"), "2", argv)
            self.assertNotIn("--gpu", argv)
        self.assertNotIn("CUDA_VISIBLE_DEVICES", r.stdout)

    def test_one_rank_workers_keep_gpu(self):
        r = plan("--hosts", "a:3", "--model", "M", "--address", "a=10.0.0.1", "--format", "sh")
        self.assertEqual(r.returncode, 0, r.stderr)
        workers = worker_lines(r.stdout)
        self.assertEqual([flag(argv, "--gpu") for _, _, _, argv in workers], ["0", "1", "2"])
        for _, _, _, argv in workers:
            self.assertNotIn("--gpus", argv)
            self.assertNotIn("--tp", argv)

    def test_json_carries_the_same_commands(self):
        r = plan("--hosts", "a:8", "--tp", "4", "--model", "M", "--address", "a=10.0.0.1",
                 "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        workers = json.loads(r.stdout)["workers"]
        self.assertEqual([w["gpus"] for w in workers], [[0, 1, 2, 3], [4, 5, 6, 7]])
        self.assertEqual([flag(w["cmd"], "--gpus") for w in workers], ["0,1,2,3", "4,5,6,7"])


class MpirunShTest(unittest.TestCase):
    def test_router_outside_passes_gpus_not_cuda_visible_devices(self):
        with tempfile.TemporaryDirectory() as d:
            hostfile = os.path.join(d, "hosts")
            with open(hostfile, "w") as f:
                f.write("nodeA slots=4\n")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="4,5,6,7")
            r = subprocess.run(
                ["bash", os.path.join(SRC, "cluster/launch/mpirun.sh"), "--model", "M",
                 "--workers", "2", "--tp", "2", "--hostfile", hostfile, "--router-outside",
                 "--backend", "tcp://10.0.0.1:5556", "--bin", "/opt/carpool/bin", "--dry-run",
                 "--", "--threads", "1"],
                capture_output=True, text=True, timeout=30, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        groups = [shlex.split(l) for l in r.stdout.splitlines() if "carpool-worker" in l]
        self.assertEqual(len(groups), 2, r.stdout)
        for argv, gpus in zip(groups, ["0,1", "2,3"]):
            self.assertEqual(flag(argv, "--host"), "nodeA:2", argv)
            self.assertEqual(flag(argv, "-np"), "2", argv)
            self.assertEqual(flag(argv, "--gpus"), gpus, argv)
            self.assertEqual(argv[-2:], ["--threads", "1"], argv)
            self.assertNotIn("-x", argv)
        self.assertNotIn("CUDA_VISIBLE_DEVICES", r.stdout)


# A stand-in for mpirun: one JSON line per call with its arguments and the CUDA_VISIBLE_DEVICES
# its ranks would get (inherited, unless `-x NAME=VALUE` sets it); exits 0 at once, as a worker
# job that ended.
FAKE_MPIRUN = """#!/usr/bin/env python3
import json, os, sys
env = dict(os.environ)
args = sys.argv[1:]
for i, a in enumerate(args[:-1]):
    if a == "-x" and "=" in args[i + 1]:
        name, value = args[i + 1].split("=", 1)
        env[name] = value
with open(os.environ["FAKE_MPIRUN_LOG"], "a") as f:
    f.write(json.dumps({"argv": args,
                        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
"""
FAKE_SCONTROL = """#!/bin/sh
# scontrol show hostnames LIST: the names, one a line.
echo "$3" | tr ',' '\\n'
"""
FAKE_ROUTER = """#!/bin/sh
exec sleep 30
"""


class SbatchTest(unittest.TestCase):
    def test_worker_jobs_keep_the_jobs_cuda_visible_devices(self):
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("path/mpirun", FAKE_MPIRUN), ("path/scontrol", FAKE_SCONTROL),
                               ("bin/carpool-router", FAKE_ROUTER)):
                p = os.path.join(d, name)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as f:
                    f.write(text)
                os.chmod(p, 0o755)
            log = os.path.join(d, "mpirun.log")
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
            env.update({
                "PATH": os.path.join(d, "path") + os.pathsep + env.get("PATH", ""),
                "FAKE_MPIRUN_LOG": log,
                # What Slurm gives a job of 4 GPUs and 4 tasks on a node it shares.
                "CUDA_VISIBLE_DEVICES": "4,5,6,7",
                "SLURM_JOB_NODELIST": "nodeA", "SLURM_JOB_NUM_NODES": "1",
                "SLURM_NTASKS_PER_NODE": "4", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "17",
                "SLURM_SUBMIT_DIR": d,
                "CARPOOL_MODEL": "synthetic:tiny", "CARPOOL_TP": "2",
                "CARPOOL_BIN": os.path.join(d, "bin"), "CARPOOL_RUN_DIR": os.path.join(d, "run"),
                "CARPOOL_PLAN": os.path.join(SRC, "cluster/launch/plan.py"),
                "CARPOOL_RESTARTS": "0",
            })
            r = subprocess.run(["bash", os.path.join(SRC, "cluster/slurm/carpool.sbatch")],
                               capture_output=True, text=True, timeout=60, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(log) as f:
                calls = [json.loads(l) for l in f]
        self.assertEqual(len(calls), 2, calls)
        calls.sort(key=lambda c: flag(c["argv"], "--gpus") or "")
        for call, gpus in zip(calls, ["0,1", "2,3"]):
            argv = call["argv"]
            self.assertEqual(call["cuda_visible_devices"], "4,5,6,7", call)
            self.assertNotIn("-x", argv)
            self.assertEqual(flag(argv, "--host"), "nodeA:2", argv)
            self.assertEqual(flag(argv, "--gpus"), gpus, argv)
            self.assertTrue(any(a.endswith("carpool-worker") for a in argv), argv)


class WorkerGpusFlagTest(unittest.TestCase):
    """carpool-worker's own refusal of a bad --gpus: status 2 and the problem, before any model,
    device or network."""

    def run_worker(self, *args, local_rank=None):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "PMI_", "MPI_", "MV2_"))}
        if local_rank is not None:
            env["OMPI_COMM_WORLD_LOCAL_RANK"] = str(local_rank)
        return subprocess.run([os.path.join(BIN, "carpool-worker"), "--router",
                               "tcp://127.0.0.1:9", "--model", "echo", *args],
                              capture_output=True, text=True, timeout=30, env=env)

    def test_refusals(self):
        cases = [
            (["--gpus", "0,x"], None, "--gpus 0,x: 'x' is not a device ordinal"),
            (["--gpus", "0,-1"], None, "device ordinal -1 must be >= 0"),
            (["--gpus", "1,1", "--tp", "2"], 0, "device ordinal 1 is listed twice"),
            (["--gpus", "0,1"], None, "--gpus 0,1 lists 2 GPUs for --tp 1"),
            (["--gpus", "0,1,2", "--tp", "2"], 0, "lists 3 GPUs for --tp 2"),
            (["--gpus", "2,3", "--tp", "2"], 2, "local rank 2 has no entry"),
            (["--gpus", "2,3", "--tp", "2"], None, "no local rank"),
            (["--gpus", "1", "--gpu", "0"], None, "give --gpu or --gpus, not both"),
        ]
        for args, local_rank, says in cases:
            r = self.run_worker(*args, local_rank=local_rank)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(says, r.stderr, args)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    BIN, SRC = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0], "-v"])
