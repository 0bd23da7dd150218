"""Harness overhead: the same workload's steps/s under `testbed run` (netns fabric, unshaped links) and
under plain `torchrun --standalone` on loopback. Repetitions alternate the two; medians of step time over
the steps after the warm-up (slowest rank per step).

Usage: .venv/bin/python bench/harness_overhead.py [--reps 3] [--steps 40]   (root)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
STRATEGY = ["--strategy", "flat-dp", "--micro-batch", "8", "--micro-batches", "2"]


def step_times(metrics: list[Path], warmup: int) -> float:
    per_step: dict[int, float] = {}
    for path in metrics:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "step" and record["step"] >= warmup:
                per_step[record["step"]] = max(per_step.get(record["step"], 0.0), record["wall_s"])
    return statistics.median(per_step.values())


def under_torchrun(tmp: Path, steps: int, warmup: int) -> float:
    out = tmp / "torchrun"
    env = {**os.environ, "TESTBED_NUM_DCS": "2", "TESTBED_NODES_PER_DC": "2", "TESTBED_METRICS_DIR": str(out),
           "OMP_NUM_THREADS": "1"}
    subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", "4", "-m",
                    "testbed.workload", *STRATEGY, "--steps", str(steps)], env=env, check=True, capture_output=True)
    return step_times(sorted(out.glob("rank*.jsonl")), warmup)


def under_harness(tmp: Path, steps: int, warmup: int) -> float:
    experiment = tmp / "overhead.yaml"
    experiment.write_text(f"""name: overhead
topology:
  name: unshaped
  dcs: [{{name: east, nodes: 2}}, {{name: west, nodes: 2}}]
  links: [{{between: [east, west]}}]
workload: {{preset: tiny, micro_batch: 8, micro_batches: 2, steps: {steps}, warmup_steps: {warmup}}}
strategies: [flat-dp]
baseline: none
calibrate: none
""")
    out = tmp / "harness"
    env = {**os.environ, "TESTBED_PREFIX": "tb-ovh-", "TESTBED_STATE_DIR": str(tmp / "state")}
    subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(experiment), "--out", str(out)], env=env,
                   check=True, capture_output=True, cwd=ROOT)
    return step_times(sorted(out.glob("overhead/*/cells/*/metrics/rank*.jsonl")), warmup)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory() as tmp:
            plain = under_torchrun(Path(tmp), args.steps, args.warmup)
            harness = under_harness(Path(tmp), args.steps, args.warmup)
        rows.append({"repetition": rep, "torchrun step s": plain, "testbed run step s": harness,
                     "harness steps/s vs torchrun": plain / harness})
    frame = pd.DataFrame(rows)
    print(frame.to_markdown(index=False, floatfmt=".4g"))
    print(f"\nmedian: testbed run reaches {statistics.median(frame['harness steps/s vs torchrun']):.1%} of plain "
          "torchrun's steps/s (2 DCs x 2 nodes, flat-dp, tiny preset, inter-DC link unshaped)")


if __name__ == "__main__":
    main()
