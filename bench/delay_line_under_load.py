"""Does the delay line keep time under the training's own load? The quickstart, run as a user runs it, N times.

Each run is `testbed run experiments/quickstart.yaml` (root; the userspace delay line where the kernel has no netem)
into a results directory of its own, removed after. Per cell and delayed direction it prints how late the delay line
released that cell's packets against their due times, as the delay line itself counted them (its stats, what the
report flags a cell by), and the machine's load before the run. A cell whose packets skipped the delay line (a 0 ms
link has no rule) has none. The check: every cell's p99 at most --bound-ms and no cell flagged by the report.

--before DIR runs the code of another tree too (e.g. `git archive <commit> | tar -x -C DIR`), alternating with this
one run by run, the same quickstart, so the two are compared in the same window of the machine's load.

Usage: .venv/bin/python bench/delay_line_under_load.py [--runs 5] [--bound-ms 0.2] [--before DIR]   (root)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parents[1]
EXPERIMENT = "experiments/quickstart.yaml"


def quickstart(tree: Path) -> tuple[list[dict], str]:
    """One quickstart run with the code of `tree`: a row per cell and delayed direction, and the load before it."""
    load = Path("/proc/loadavg").read_text().split()[0]
    out = Path(tempfile.mkdtemp(prefix="tb-dlul-"))
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, "-m", "testbed.cli", "run", EXPERIMENT, "-o", str(out)], cwd=tree,
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"delay_line_under_load: the quickstart failed (exit {done.returncode}): "
                             f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}")
        rows = []
        for result in sorted(out.glob("*/*/cells/*/result.json")):
            figures = json.loads(result.read_text()).get("delay_line") or {}
            cell = result.parent.name
            delayed = {key: value for key, value in figures.items() if value.get("p99_ms") is not None}
            if not delayed:
                rows.append({"cell": cell, "direction": "(no packet delayed)", "packets": 0})
            for key, value in sorted(delayed.items()):
                rows.append({"cell": cell, "direction": key, "packets": value["packets"], "p50 ms": value["p50_ms"],
                             "p99 ms": value["p99_ms"], "max ms": value["max_ms"], "flagged": bool(value["late"])})
        return rows, load
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bound-ms", type=float, default=0.2)
    parser.add_argument("--before", type=Path, help="a tree with the code to compare, run alternating with this one")
    args = parser.parse_args()
    trees = [("this", HERE)] + ([("before", args.before.resolve())] if args.before else [])
    rows = []
    for run in range(args.runs):
        for name, tree in trees if run % 2 == 0 else trees[::-1]:
            cells, load = quickstart(tree)
            rows += [{"run": run + 1, "code": name, "load": load, **cell} for cell in cells]
            worst = max((cell["p99 ms"] for cell in cells if cell["packets"]), default=None)
            print(f"run {run + 1} ({name}, load {load}): worst p99 {worst} ms", file=sys.stderr, flush=True)
    frame = pd.DataFrame(rows)
    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, {args.runs} "
          f"quickstart runs a tree; lateness as the delay line counted it, ms (load: 1-min average before the run)")
    print(frame.to_markdown(index=False, floatfmt=".2f"))
    delayed = frame[frame["packets"] > 0]
    print(f"\nper tree: every cell's p99 <= {args.bound_ms} ms and none flagged?")
    summary = []
    for name, _ in trees:
        mine = delayed[delayed["code"] == name]
        over = mine[mine["p99 ms"] > args.bound_ms + 1e-9]
        summary.append({"code": name, "directions": len(mine), "median p99 ms": statistics.median(mine["p99 ms"]),
                        "worst p99 ms": mine["p99 ms"].max(), "worst max ms": mine["max ms"].max(),
                        f"over {args.bound_ms} ms": len(over), "flagged": int(mine["flagged"].sum()),
                        "holds": bool(len(over) == 0 and not mine["flagged"].any())})
    print(pd.DataFrame(summary).to_markdown(index=False, floatfmt=".2f"))


if __name__ == "__main__":
    main()
