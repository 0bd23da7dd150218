"""How many ranks this machine holds: a synthetic-compute experiment (flat-dp and hier-dp cells) on 4 DCs of N/4 nodes
under `testbed run` (netns backend, or docker: one container per node), per launcher: time from launch until every
rank has finished its first step, the machine's used-memory rise at its peak (MemTotal - MemAvailable, sampled
every 0.1 s, against the figure before the run), the median step time, and the whole run's wall time (bring-up and
teardown included).

Usage: .venv/bin/python bench/scale.py [--ranks 8,32,64,128] [--launchers exec,fork] [--exec-max 32]
       [--steps 4] [--compute-ms 200] [--preset small] [--backend netns|docker]                          (root)
(docker: the image TESTBED_IMAGE names, e.g. one scripts/build-image built)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from testbed import api

PREFIX = "tb-scale-"
DCS = 4


FLOOR = 1.5 * 2**30  # a run is stopped (SIGINT: the runner tears down) when less than this stays available


def meminfo() -> dict[str, int]:
    fields = {}
    with open("/proc/meminfo") as source:
        for line in source:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024
    return fields


def used_bytes() -> int:
    """MemTotal - MemAvailable: what the machine has in use (shared pages counted once)."""
    fields = meminfo()
    return fields["MemTotal"] - fields["MemAvailable"]


class PeakMemory:
    """Samples used memory in a thread; `rise` is the peak over the figure at start. Interrupts the run when
    the machine is about to run out (other people's work shares it)."""

    def __init__(self, every: float = 0.1) -> None:
        self.start = used_bytes()
        self.peak = self.start
        self.stopped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every,), daemon=True)
        self._thread.start()

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            fields = meminfo()
            self.peak = max(self.peak, fields["MemTotal"] - fields["MemAvailable"])
            if fields["MemAvailable"] < FLOOR and not self.stopped:
                self.stopped = True
                os.kill(os.getpid(), signal.SIGINT)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


def write_experiment(directory: Path, ranks: int, steps: int, compute_ms: float, preset: str) -> Path:
    nodes = ranks // DCS
    names = [f"dc{i}" for i in range(DCS)]
    topology = {"name": f"scale-{DCS}x{nodes}", "dcs": [{"name": n, "nodes": nodes} for n in names],
                "links": [{"between": [a, b], "latency": "2ms", "bandwidth": "1gbit"}
                          for a, b in itertools.pairwise(names)]}
    experiment = {"name": f"scale-{ranks}", "topology": topology, "baseline": "none", "calibrate": "none",
                  "cell_timeout": "20min",
                  "workload": {"preset": preset, "micro_batch": 4, "micro_batches": 1, "steps": steps,
                               "warmup_steps": 1, "compute": "synthetic", "compute_ms": compute_ms, "seed": 1},
                  "strategies": ["flat-dp", "hier-dp"]}
    path = directory / f"scale-{ranks}.yaml"
    path.write_text(json.dumps(experiment))  # YAML is a superset of JSON
    return path


def cell_figures(cell_dir: Path) -> dict:
    """Launch-to-first-step and median step time (a step lasts as long as its slowest rank) of one cell."""
    result = json.loads((cell_dir / "result.json").read_text())
    steps: dict[int, list[dict]] = {}
    starts, starts_groups = [], []
    for path in (cell_dir / "metrics").glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "step":
                steps.setdefault(record["step"], []).append(record)
            elif record.get("event") == "start":
                starts.append(record["time"])
                if "groups_s" in record:
                    starts_groups.append(record["groups_s"])
    world = result["world"]
    first = steps.get(0, [])
    later = [group for s, group in steps.items() if s > 0]

    def slowest(name: str) -> float | None:
        """Median over the later steps of the rank that spent the most on `name` (a step waits for it)."""
        values = [max(r.get(name, 0.0) for r in group) for group in later]
        return statistics.median(values) if values else None

    return {"status": result["status"], "reason": result["reason"], "log_tail": result.get("log_tail"),
            "groups_s": max(starts_groups) if starts_groups else None,
            "compute_s": slowest("compute_s"), "comm_intra_s": slowest("comm_intra_s"),
            "comm_inter_s": slowest("comm_inter_s"),
            "setup_s": max(starts) - result["launched"] if len(starts) == world else None,
            "first_step_s": max(r["time"] for r in first) - result["launched"] if len(first) == world else None,
            "step_s": slowest("wall_s"),
            "cell_s": result["seconds"], "delay_line_cpu_s": result.get("delay_line_cpu_s")}


def model_columns(cell: dict) -> dict:
    """The cost model's figures for a cell (api.plan), beside the measured ones."""
    return {"model step s": cell.get("step_s_predicted"), "model compute s": cell.get("compute_s_predicted"),
            "model exposed comm s": cell.get("exposed_s_predicted"),
            "model intra-DC comm s": cell.get("comm_intra_s_predicted"),
            "model inter-DC comm s": cell.get("comm_inter_s_predicted")}


def measure(ranks: int, launcher: str, args: argparse.Namespace, root: Path) -> list[dict]:
    path = write_experiment(root, ranks, args.steps, args.compute_ms, args.preset)
    out = root / f"out-{launcher}"
    predicted = {cell["strategy"]: cell for cell in api.plan(path)["cells"]}  # the cost model, shipped calibration
    memory = PeakMemory()
    start = time.perf_counter()
    try:
        run_dir = api.run(path, out, prefix=PREFIX, shaper="auto", launcher=launcher, backend=args.backend)
    except KeyboardInterrupt:
        rise = memory.stop()
        if not memory.stopped:
            raise
        api.reset_stop()
        return [{"ranks": ranks, "layout": f"{DCS}x{ranks // DCS}", "launcher": launcher, "strategy": "-",
                 "status": f"stopped: under {FLOOR / 2**30:g} GiB available",
                 "used memory rise GiB (run peak)": rise / 2**30, "run wall s (both cells)": time.perf_counter() - start}]
    wall = time.perf_counter() - start
    rise = memory.stop()
    rows = []
    for cell_dir in sorted((run_dir / "cells").iterdir()):
        figures = cell_figures(cell_dir)
        strategy = cell_dir.name.split("__")[0]
        rows.append({"ranks": ranks, "layout": f"{DCS}x{ranks // DCS}", "backend": args.backend, "launcher": launcher,
                     "strategy": strategy, "status": figures["status"],
                     "launch to set up s": figures["setup_s"], "launch to first step s": figures["first_step_s"],
                     "step s (median)": figures["step_s"], "groups s (slowest rank)": figures["groups_s"],
                     "step compute s": figures["compute_s"], "step intra-DC comm s": figures["comm_intra_s"],
                     "step inter-DC comm s": figures["comm_inter_s"],
                     **model_columns(predicted.get(strategy, {})),
                     "cell s": figures["cell_s"], "delay lines CPU s": figures["delay_line_cpu_s"],
                     "used memory rise GiB (run peak)": rise / 2**30,
                     "run wall s (both cells)": wall})
        if figures["status"] != "ok":
            print(f"{ranks} ranks, {launcher}: {cell_dir.name} failed: {figures['reason']}", flush=True)
            print("\n".join(figures["log_tail"] or []), flush=True)
    return rows


def projected_fit(rows: list[dict], ranks: int, launcher: str) -> str | None:
    """Why `ranks` would not fit, projected from the largest run of this launcher so far (None: it may)."""
    done = [r for r in rows if r["launcher"] == launcher and r.get("used memory rise GiB (run peak)")]
    if not done:
        return None
    last = max(done, key=lambda r: r["ranks"])
    need = last["used memory rise GiB (run peak)"] * 2**30 / last["ranks"] * ranks
    available = meminfo()["MemAvailable"] - FLOOR
    if need <= available:
        return None
    return f"projected {need / 2**30:.1f} GiB from {last['ranks']} ranks, {available / 2**30:.1f} GiB available"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="8,32,64,128")
    parser.add_argument("--launchers", default="exec,fork")
    parser.add_argument("--exec-max", type=int, default=32, help="largest rank count the exec launcher is run at")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--compute-ms", type=float, default=200)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--backend", default="netns", help="netns, or docker (one container per node)")
    parser.add_argument("--keep", type=Path, help="keep the runs' results here (default: a temporary directory)")
    args = parser.parse_args()
    api.handle_signals()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        for ranks in (int(r) for r in args.ranks.split(",")):
            for launcher in args.launchers.split(","):
                if launcher == "exec" and ranks > args.exec_max:
                    continue
                fits = projected_fit(rows, ranks, launcher)
                if fits:
                    print(f"{ranks} ranks, {launcher}: skipped ({fits})", flush=True)
                    rows.append({"ranks": ranks, "layout": f"{DCS}x{ranks // DCS}", "backend": args.backend, "launcher": launcher,
                                 "strategy": "-", "status": f"skipped: {fits}"})
                    continue
                rows += measure(ranks, launcher, args, args.keep or Path(tmp))
                print(pd.DataFrame(rows[-2:]).to_markdown(index=False, floatfmt=".3g"), flush=True)
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {args.preset} model, {args.compute_ms:g} ms synthetic compute "
          f"per micro-batch, {args.steps} steps per cell")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"))


if __name__ == "__main__":
    main()
