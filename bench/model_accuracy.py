"""How well the cost model predicts the shipped experiments: per cell predicted vs measured mean step, inter-DC
bytes against the kernel counters, and whether the predicted best strategy at each sweep point is the measured
best; the error table (median and p90 of |predicted/measured - 1| per experiment and strategy), and where cells
have repetitions how far they lie from the median of theirs (the floor for any prediction made before them).

    .venv/bin/python bench/model_accuracy.py results/quickstart/<run> results/hierarchical-vs-flat/<run> ...
    .venv/bin/python bench/model_accuracy.py --run            # run every shipped experiment first (long; as root,
                                                              # under flock /tmp/testbed-heavy.lock)
    .venv/bin/python bench/model_accuracy.py --run --tcp cubic   # ... with every node on CUBIC

Each run is predicted again with the current model from its own calibration (real compute: from each cell's
warm-up steps; --a-priori: from the calibration's profile alone, as `testbed plan` predicts before running) (re-fitted from the raw
micro-benchmark figures the run kept, so a better fit applies to old runs too) and each cell's measured round
trips. Only shaped cells count toward the step-time figures (baselines are listed apart).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.collect.frames import (  # noqa: E402
    HOST_STEAL_BOUND,
    add_predictions,
    aggregate,
    flagged,
    load_results,
    load_steps,
    summarise,
)
from testbed.model.calibration import fit  # noqa: E402
from testbed.model.predict import CALIBRATION_FILE  # noqa: E402
from testbed.spec.topology import topology_from_data  # noqa: E402

SHIPPED = ("quickstart", "hierarchical-vs-flat", "pipeline-across-dcs", "distance-sweep", "diloco-vs-dp", "vs-pytorch",
           "compression-vs-pytorch")  # faults.yaml is not: its cells are judged by what the faults cost


def refit(run_dir: Path) -> None:
    """Fit the run's calibration again from its raw figures (calibration/measured.json) with this code."""
    raw = run_dir / "calibration" / "measured.json"
    if not raw.exists():
        return
    manifest = json.loads((run_dir / "manifest.json").read_text())
    topology = topology_from_data(manifest["topology"], si=True)  # a model_dump: SI numbers
    fit(topology, json.loads(raw.read_text())).save(run_dir / CALIBRATION_FILE)


def cells(run_dir: Path) -> pd.DataFrame:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    results = load_results(run_dir)
    summary = add_predictions(summarise(results, load_steps(run_dir), manifest.get("warmup_steps", 0)), run_dir,
                              results)
    summary.insert(0, "experiment", manifest["experiment"])
    summary.insert(1, "run", run_dir.name)
    return summary


def sweep_keys(frame: pd.DataFrame) -> list[str]:
    """The columns that make a sweep point (links[...] and workload.* values)."""
    return [c for c in frame.columns if c.startswith(("links[", "workload."))]


def best_match(summary: pd.DataFrame) -> pd.DataFrame:
    """Per sweep point: the measured and the predicted fastest strategy (median over repetitions)."""
    rows = []
    for experiment, part in summary.groupby("experiment", sort=False):
        agg = aggregate(part.drop(columns=["experiment", "run"]).dropna(axis=1, how="all"))
        shaped = agg[agg["baseline"] == "False"]
        keys = sweep_keys(agg)
        for point, group in (shaped.groupby(keys, sort=False) if keys else [((), shaped)]):
            if "tokens_per_s_predicted" not in group or group["tokens_per_s_predicted"].isna().all():
                continue
            measured = group.sort_values("tokens_per_s", ascending=False)
            predicted = group.sort_values("tokens_per_s_predicted", ascending=False)
            gap = (measured.iloc[0]["tokens_per_s"] / measured.iloc[1]["tokens_per_s"] - 1) if len(group) > 1 else None
            rows.append({"experiment": experiment, "point": ", ".join(f"{k}={v}" for k, v in zip(keys, point))
                         if keys else "-", "measured_best": measured.iloc[0]["strategy"],
                         "predicted_best": predicted.iloc[0]["strategy"],
                         "match": measured.iloc[0]["strategy"] == predicted.iloc[0]["strategy"],
                         "measured_margin": gap})
    return pd.DataFrame(rows)


def error_table(summary: pd.DataFrame) -> pd.DataFrame:
    ok = summary[(summary["status"] == "ok") & ~summary["baseline"].astype(bool)].dropna(subset=["step_error"])
    rows = []

    def stats(name: str, strategy: str, part: pd.DataFrame) -> dict:
        step, nbytes = part["step_error"].abs(), part["bytes_error"].abs().dropna()
        return {"experiment": name, "strategy": strategy, "cells": len(part),
                f"host steal > {HOST_STEAL_BOUND:.0%}": len(flagged(part, "host_steal_flag")),
                "step median": step.median(), "step p90": step.quantile(0.9), "step worst": step.max(),
                "bytes median": nbytes.median() if len(nbytes) else None,
                "bytes worst": nbytes.max() if len(nbytes) else None}

    for (experiment, strategy), part in ok.groupby(["experiment", "strategy"], sort=False):
        rows.append(stats(experiment, strategy, part))
    for experiment, part in ok.groupby("experiment", sort=False):
        rows.append(stats(experiment, "all", part))
    if not ok.empty:
        rows.append(stats("all", "all", ok))
    return pd.DataFrame(rows)


def repeatability(summary: pd.DataFrame) -> pd.DataFrame:
    """Per experiment with repetitions: how far each shaped cell's measured mean step lies from the median of its
    repetitions (|step_s_mean / median - 1|), beside the model's error on the same cells: a prediction made before
    a cell's measured steps cannot be held tighter than the cells themselves repeat."""
    ok = summary[(summary["status"] == "ok") & ~summary["baseline"].astype(bool)].dropna(subset=["step_error"])
    rows = []
    for experiment, part in ok.groupby("experiment", sort=False):
        keys = ["strategy", *sweep_keys(part)]
        counts = part.groupby(keys, dropna=False)["step_s_mean"].transform("count")
        part = part[counts > 1]
        if part.empty:
            continue
        spread = (part["step_s_mean"] / part.groupby(keys, dropna=False)["step_s_mean"].transform("median") - 1).abs()
        error = part["step_error"].abs()
        rows.append({"experiment": experiment, "cells": len(part), "repetitions median": spread.median(),
                     "repetitions p90": spread.quantile(0.9), "repetitions worst": spread.max(),
                     "model median": error.median(), "model p90": error.quantile(0.9)})
    return pd.DataFrame(rows)


def variant(name: str, directory: Path, congestion_control: str | None = None,
            repetitions: int | None = None) -> Path:
    """Shipped experiment `name` as it is, or a copy whose topology (inlined) has every node run
    `congestion_control` and/or that runs `repetitions` repetitions."""
    import yaml

    source = ROOT / "experiments" / f"{name}.yaml"
    if congestion_control is None and repetitions is None:
        return source
    data = yaml.safe_load(source.read_text())
    if congestion_control is not None:
        topology = data["topology"]
        if isinstance(topology, str):
            topology = yaml.safe_load((source.parent / topology).read_text())
        data["topology"] = {**topology, "tcp": {"congestion_control": congestion_control}}
    if repetitions is not None:
        data["repetitions"] = repetitions
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_shipped(out: Path, names: tuple[str, ...] = SHIPPED, congestion_control: str | None = None,
                repetitions: int | None = None) -> list[Path]:
    import tempfile

    dirs = []
    with tempfile.TemporaryDirectory(prefix="model-accuracy-") as scratch:
        for name in names:
            path = variant(name, Path(scratch), congestion_control, repetitions)
            subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(path), "--out", str(out)],
                           cwd=ROOT, check=False)
            runs = sorted(p for p in (out / name).glob("*") if (p / "manifest.json").exists())
            if runs:
                dirs.append(runs[-1])
    return dirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (results/<experiment>/<run>)")
    parser.add_argument("--run", action="store_true", help="run the shipped experiments first")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    parser.add_argument("--tcp", metavar="CC", help="with --run: every node runs this congestion control (the "
                        "model's slow start is CUBIC's and Reno's; a host running BBR must allow cubic first)")
    parser.add_argument("--experiments", default=",".join(SHIPPED),
                        help="with --run: which shipped experiments, comma-separated (default: all of them)")
    parser.add_argument("--repetitions", type=int, help="with --run: this many repetitions per cell instead of "
                        "each experiment's own")
    parser.add_argument("--no-refit", action="store_true", help="use each run's calibration.json as it is")
    parser.add_argument("--csv", type=Path, help="write every cell's figures here")
    parser.add_argument("--a-priori", action="store_true", help="real compute from the calibration's profile only, "
                        "not from each cell's warm-up steps (what `testbed plan` knows before running)")
    parser.add_argument("--warm-up-only", action="store_true", help="real compute from each cell's warm-up steps "
                        "alone, not averaged with the calibration's profile (the model before 2026-11-27)")
    args = parser.parse_args(argv)
    if args.a_priori:
        import testbed.model.predict as predict

        predict.warmup_local = lambda *_: None
    if args.warm_up_only:
        import testbed.model.predict as predict

        predict.blend_local = lambda model, *_: model
    runs = list(args.runs) + (run_shipped(args.out, tuple(args.experiments.split(",")), args.tcp, args.repetitions)
                                 if args.run else [])
    if not runs:
        parser.error("give run directories, or --run")
    for run_dir in runs:
        if not (run_dir / "manifest.json").is_file():
            parser.error(f"{run_dir}: not a run directory (no manifest.json: a run that never started?)")
    frames = []
    for run_dir in runs:
        if not args.no_refit:
            refit(run_dir)
        frames.append(cells(run_dir))
    summary = pd.concat(frames, ignore_index=True)
    if args.csv:
        summary.to_csv(args.csv, index=False)
    errors = error_table(summary)
    matches = best_match(summary)
    print(errors.to_markdown(index=False, floatfmt=".1%"))
    print()
    spread = repeatability(summary)
    if not spread.empty:
        print(spread.to_markdown(index=False, floatfmt=".1%"))
        print()
    if not matches.empty:
        print(matches.to_markdown(index=False, floatfmt=".1%"))
        print(f"\npredicted best = measured best at {int(matches['match'].sum())} of {len(matches)} sweep points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
