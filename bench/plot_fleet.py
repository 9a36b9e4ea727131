#!/usr/bin/env python3
"""Plots placement + admission time per request against fleet size from carpool-bench-fleet JSON.

Usage: bench/plot_fleet.py BEFORE_MICRO.json AFTER.json OUT.png
BEFORE_MICRO: a run of the linear placement (worker list + placement view + Place); AFTER: a run
with the placement index (indexed_place_ns). Both add admission_cycle_ns.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(rows, linear):
    out = {}
    for r in rows:
        if linear:
            ns = r["worker_list_ns"] + r["placement_view_ns"] + r["place_ns"]
        else:
            ns = r["indexed_place_ns"]
        out.setdefault(r["policy"], []).append((r["workers"], (ns + r["admission_cycle_ns"]) / 1000))
    return {p: sorted(v) for p, v in out.items()}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        before = series(json.load(f), linear=True)
    with open(sys.argv[2]) as f:
        after = series(json.load(f), linear=False)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {}
    for policy, points in before.items():
        (line,) = ax.plot(*zip(*points), "--o", label=f"{policy}, linear (before)")
        colors[policy] = line.get_color()
    for policy, points in after.items():
        ax.plot(*zip(*points), "-s", color=colors.get(policy), label=f"{policy}, index (after)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("workers")
    ax.set_ylabel("placement + admission, µs per request")
    ax.set_title("carpool router placement vs fleet size (issue 19)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[3], dpi=110)


if __name__ == "__main__":
    main()
