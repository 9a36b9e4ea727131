#!/usr/bin/env python3
"""Where a carpool cluster's processes go on a list of hosts (docs/cluster.md, "Many hosts").

  plan.py --hosts node1,node2 --slots 8 --tp 2 --model DIR            a table
  plan.py --hostfile FILE --tp 1 --model synthetic:tiny --format sh   lines for a launcher
  plan.py --slurm --model DIR --format json                           inside a Slurm job

The router goes on the first host; every host's slots (its GPUs, or worker ranks on CPU hosts)
are cut into tensor-parallel groups of --tp consecutive slots, one worker each, so a group never
spans hosts. The router's address is the first host's (resolved here, or --address HOST=ADDR),
so nobody types an address. The plan says what runs where; how a command reaches its host is the
launcher's: cluster/launch/mpirun.sh and cluster/slurm/carpool.sbatch start each worker with
`mpirun --host HOST:RANKS`, tests/netns/netns_test.py with `ip netns exec HOST`.

--format sh prints one line per process, fields separated by blanks, the command shell-quoted:
  router HOST - 1 CMD...
  worker HOST GPUS RANKS CMD...      GPUS: the worker's slots on HOST, comma-separated
A worker with RANKS > 1 is a tensor-parallel group: run CMD as RANKS ranks of one mpirun job on
HOST (its own job, so its local ranks are 0..RANKS-1). CMD names the GPUs itself, as ordinals
into the GPUs a process on HOST sees: `--gpu K` for one rank, `--gpus A,B,...` for a group (the
rank of local rank r takes the r-th). A launcher leaves CUDA_VISIBLE_DEVICES as it finds it: on a
node shared between jobs without device cgroups Slurm sets it to the job's GPUs (say 4,5,6,7),
and slot k is then the k-th of those (slots 2,3 run on the node's GPUs 6 and 7); where nothing
sets it, slot k is the host's GPU k. GPUS repeats the slots for tables and logs.
Exit status 2 with a message naming the problem when the hosts cannot hold the plan.
"""

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys


class PlanError(Exception):
    pass


def parse_hosts(args):
    """[(host, slots)] in order, from --hosts, --hostfile or Slurm's variables."""
    hosts = []
    if args.hosts:
        for item in args.hosts.replace(" ", ",").split(","):
            if not item:
                continue
            name, _, slots = item.partition(":")
            hosts.append((name, int(slots) if slots else args.slots))
    elif args.hostfile:
        with open(args.hostfile) as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                slots = args.slots
                for w in words[1:]:
                    if w.startswith("slots="):
                        slots = int(w[len("slots="):])
                hosts.append((words[0], slots))
    elif args.slurm:
        hosts = slurm_hosts(args.slots)
    else:
        raise PlanError("name the hosts: --hosts, --hostfile or --slurm")
    if not hosts:
        raise PlanError("the host list is empty")
    seen = set()
    for name, slots in hosts:
        if name in seen:
            raise PlanError(f"host {name} is listed twice")
        seen.add(name)
        if slots is None or slots < 0:
            raise PlanError(f"host {name}: slots must be >= 0 (--slots, host:N or slots=N)")
    return hosts


def slurm_hosts(slots):
    """The job's nodes, each with its GPUs (SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE) or else
    its tasks (SLURM_NTASKS_PER_NODE), unless --slots says."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise PlanError("--slurm: SLURM_JOB_NODELIST is not set (not inside a Slurm job?)")
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                               capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        if "[" in nodelist:
            raise PlanError(f"--slurm: cannot expand {nodelist} with scontrol: {e}")
        names = nodelist.split(",")
    if slots is None:
        for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                    "SLURM_TASKS_PER_NODE"):
            value = os.environ.get(var, "")
            digits = value.split(":")[-1].split("(")[0]
            if digits.isdigit() and int(digits) > 0:
                slots = int(digits)
                break
        else:
            slots = 1
    return [(n, slots) for n in names]


def resolve(host, addresses, single_host):
    if host in addresses:
        return addresses[host]
    if single_host and host in ("localhost", socket.gethostname()):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise PlanError(f"cannot resolve router host {host} ({e}); give --address {host}=ADDR")


def make_plan(args):
    if args.tp < 1:
        raise PlanError(f"--tp must be >= 1, got {args.tp}")
    hosts = parse_hosts(args)
    addresses = {}
    for a in args.address:
        host, sep, addr = a.partition("=")
        if not sep or not addr:
            raise PlanError(f"--address wants HOST=ADDR, got {a!r}")
        addresses[host] = addr
    router_host = hosts[0][0]
    addr = args.router_address or resolve(router_host, addresses, len(hosts) == 1)
    frontend = args.frontend or f"tcp://{addr}:{args.frontend_port}"
    backend = args.backend or f"tcp://{addr}:{args.backend_port}"
    binary = lambda name: os.path.join(args.bin, name) if args.bin else name
    router_cmd = [binary("carpool-router"), "--frontend", frontend, "--backend", backend]
    router_cmd += shlex.split(args.router_flags)
    workers = []
    for host, slots in hosts:
        if slots % args.tp != 0:
            raise PlanError(f"host {host} has {slots} slots; --tp {args.tp} does not divide them "
                            "(a tensor-parallel group stays on one host)")
        for first in range(0, slots, args.tp):
            gpus = list(range(first, first + args.tp))
            wid = f"{host}-gpu{first}" if args.tp == 1 else f"{host}-gpu{first}-{gpus[-1]}"
            cmd = [binary("carpool-worker")]
            if args.tp > 1:
                cmd += ["--tp", str(args.tp)]
            cmd += ["--router", backend, "--model", args.model, "--worker-id", wid]
            # Ordinals into the GPUs the rank sees, never CUDA_VISIBLE_DEVICES (see the top).
            if args.tp == 1:
                cmd += ["--gpu", str(first)]
            else:
                cmd += ["--gpus", ",".join(map(str, gpus))]
            cmd += shlex.split(args.worker_flags)
            workers.append({"host": host, "gpus": gpus, "ranks": args.tp, "worker_id": wid,
                            "cmd": cmd})
    if args.workers and len(workers) < args.workers:
        raise PlanError(f"the hosts hold {len(workers)} workers of {args.tp} slots, "
                        f"need {args.workers}")
    if args.workers:
        workers = workers[:args.workers]
    if not workers:
        raise PlanError("the hosts have no slots for a worker")
    return {"router": {"host": router_host, "address": addr, "frontend": frontend,
                       "backend": backend, "cmd": router_cmd},
            "tp": args.tp, "workers": workers}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--hosts", help="host[:slots],... the first one gets the router")
    where.add_argument("--hostfile", help='Open MPI hostfile: "host slots=N" lines')
    where.add_argument("--slurm", action="store_true", help="the Slurm job's nodes")
    p.add_argument("--slots", type=int, default=None,
                   help="slots (GPUs) of a host that names none (default 1; --slurm: its GPUs "
                        "or tasks per node)")
    p.add_argument("--tp", type=int, default=1, help="slots per worker (default 1)")
    p.add_argument("--workers", type=int, default=0,
                   help="use only the first N workers (default: every slot)")
    p.add_argument("--model", required=True)
    p.add_argument("--bin", default="", help="folder of the carpool binaries")
    p.add_argument("--address", action="append", default=[], metavar="HOST=ADDR",
                   help="address of a host (default: resolved)")
    p.add_argument("--router-address", default="", help="the router host's address")
    p.add_argument("--frontend", default="", help="client endpoint (default tcp://ADDR:PORT)")
    p.add_argument("--backend", default="", help="worker endpoint (default tcp://ADDR:PORT)")
    p.add_argument("--frontend-port", type=int, default=5555)
    p.add_argument("--backend-port", type=int, default=5556)
    p.add_argument("--router-flags", default="", help="extra carpool-router flags")
    p.add_argument("--worker-flags", default="", help="extra carpool-worker flags")
    p.add_argument("--format", choices=["table", "json", "sh"], default="table")
    args = p.parse_args(argv)
    if args.slots is None and not args.slurm:
        args.slots = 1
    try:
        plan = make_plan(args)
    except (PlanError, OSError, ValueError) as e:
        print(f"plan.py: {e}", file=sys.stderr)
        return 2
    r = plan["router"]
    if args.format == "json":
        json.dump(plan, sys.stdout, indent=1)
        print()
    elif args.format == "sh":
        print("router", r["host"], "-", 1, shlex.join(r["cmd"]))
        for w in plan["workers"]:
            print("worker", w["host"], ",".join(map(str, w["gpus"])), w["ranks"],
                  shlex.join(w["cmd"]))
    else:
        print(f"router  on {r['host']}: frontend {r['frontend']}, backend {r['backend']}")
        for w in plan["workers"]:
            print(f"worker  {w['worker_id']:<24} on {w['host']}, GPU "
                  f"{','.join(map(str, w['gpus']))}, {w['ranks']} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
