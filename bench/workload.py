"""Workload throughput on loopback: steps/s of every strategy at 2 DCs x 2 nodes (real compute), and the
synthetic-compute mode running 32 ranks (4 DCs x 8 nodes) on this machine. Medians over the steps after
the first (warm-up).

Usage: .venv/bin/python bench/workload.py [--steps 12] [--skip-32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from testbed.workload.local import launch
from testbed.workload.options import Options


def read(directory: Path) -> list[dict]:
    rows = []
    for path in sorted(directory.glob("rank*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if r.get("event") == "step"]


def summarise(label: str, ranks: str, rows: list[dict]) -> dict:
    steady = [r for r in rows if r["step"] > 0]
    by_step: dict[int, list[dict]] = {}
    for r in steady:
        by_step.setdefault(r["step"], []).append(r)
    walls = [max(r["wall_s"] for r in group) for group in by_step.values()]
    step_s = statistics.median(walls)
    tokens = statistics.median(sum(r["tokens"] for r in group) for group in by_step.values())
    return {"run": label, "ranks": ranks, "step s (median)": step_s, "steps/s": 1 / step_s,
            "tokens/s": tokens / step_s,
            "exposed comm share": statistics.median(r["exposed_s"] / r["wall_s"] for r in steady),
            "inter-DC payload MB/step/rank": statistics.mean(r["bytes_inter"] for r in steady) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip-32", action="store_true")
    args = parser.parse_args()
    base = Options(steps=args.steps, preset="tiny", micro_batch=8, micro_batches=2)
    runs = {
        "flat-dp": replace(base, strategy="flat-dp"),
        "hier-dp": replace(base, strategy="hier-dp"),
        "hier-dp-overlap": replace(base, strategy="hier-dp-overlap", bucket_mb=0.25),
        "hier-dp int8": replace(base, strategy="hier-dp", compression="int8"),
        "pp 1f1b": replace(base, strategy="pp", schedule="1f1b", micro_batches=4),
        "pp interleaved": replace(base, strategy="pp", schedule="interleaved-1f1b", micro_batches=4),
        "pp overlap": replace(base, strategy="pp", schedule="overlap", micro_batches=4),
        "diloco H=5": replace(base, strategy="diloco", inner_steps=5),
        "streaming-diloco": replace(base, strategy="streaming-diloco", inner_steps=4, fragments=2),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        configs = [replace(o, metrics_dir=str(out / name)) for name, o in runs.items()]
        launch(2, 2, configs, out / "launch", timeout=900)
        rows += [summarise(name, "2x2", read(out / name)) for name in runs]
        if not args.skip_32:
            synthetic = Options(steps=6, preset="small", micro_batch=4, synthetic=True, compute_ms=200, lanes=1)
            big = {f"synthetic {s}": replace(synthetic, strategy=s, metrics_dir=str(out / f"s32-{s}"))
                   for s in ("flat-dp", "hier-dp")}
            start = time.perf_counter()
            launch(4, 8, list(big.values()), out / "launch32", timeout=1200)
            rows += [summarise(name, "4x8 (32)", read(Path(o.metrics_dir))) for name, o in big.items()]
            print(f"32-rank launch took {time.perf_counter() - start:.0f} s (start-up included)")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"))


if __name__ == "__main__":
    main()
