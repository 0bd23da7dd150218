"""`testbed plan`: predict every cell of an experiment without building anything, name the fastest strategy
at each sweep point, and (search) explore strategy options for the topology to recommend a configuration:
the adaptive orchestration NeMo describes, from a calibrated model instead of a guess."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from testbed.model.calibration import Calibration, model_error
from testbed.model.labels import point_label
from testbed.model.predict import CellPrediction, predict_cell, predict_experiment
from testbed.plan.cells import Cell, plan_cells
from testbed.spec.experiment import Experiment
from testbed.spec.strategies import OptionError, Options, check_options
from testbed.spec.topology import Topology

# What --search varies per strategy (every combination the options' checks accept)
SEARCH_SPACE: dict[str, dict[str, list[Any]]] = {
    "flat-dp": {"compression": ["none", "bf16", "int8"]},
    "hier-dp": {"compression": ["none", "bf16", "int8"]},
    "hier-dp-overlap": {"bucket_mb": [0.25, 0.5, 1.0, 2.0, 4.0], "chunks": [1, 2, 4, 8], "lanes": [1, 2, 4, 8]},
    "pp": {"schedule": ["gpipe", "1f1b", "interleaved-1f1b", "overlap"], "virtual_chunks": [2, 3],
           "lookahead": [-1, 0, 2], "micro_batches": ["x1", "x2"]},
    "diloco": {"inner_steps": [1, 5, 10, 50], "outer_shard": [True, False]},
    "streaming-diloco": {"inner_steps": [5, 10, 50], "fragments": [1, 2, 4], "overlap_steps": [0, 1, 2]},
}
CHANGES_TRAINING = {"diloco", "streaming-diloco"}  # fewer synchronisations: a different optimiser, not just faster
LOSSY = {"compression"}


def point_key(sweep: dict[str, Any]) -> str:
    """A sweep point as one string: 'links[east,west].latency=20ms, workload.micro_batches=4' ('' without a sweep)."""
    return ", ".join(f"{k}={v}" for k, v in sweep.items())


def best_per_point(predictions: list[CellPrediction]) -> dict[str, str]:
    """The strategy (label) with the highest predicted tokens/s at every sweep point of the shaped cells."""
    return {key: verdict["best"] for key, verdict in verdicts(predictions, None).items()}


def verdicts(predictions: list[CellPrediction], model_error: float | None) -> dict[str, dict[str, Any]]:
    """Per sweep point of the shaped cells: the fastest strategy, every strategy whose predicted tokens/s is
    within `model_error` (a fraction) of it (a tie: the model cannot tell them apart), and the point for people."""
    rates: dict[str, dict[str, float]] = {}
    labels: dict[str, str] = {}
    for p in predictions:
        if p.baseline:
            continue
        key = point_key(p.sweep)
        labels[key] = point_label(p.sweep)
        mine = rates.setdefault(key, {})
        mine[p.strategy] = max(mine.get(p.strategy, 0.0), p.prediction.tokens_per_s)
    out = {}
    for key, by_strategy in rates.items():
        ranked = sorted(by_strategy.items(), key=lambda item: -item[1])
        best, top = ranked[0]
        tied = [name for name, rate in ranked[1:]
                if model_error is not None and top > 0 and (top - rate) / top < model_error]
        runner_up = ranked[1] if len(ranked) > 1 else None
        out[key] = {"label": labels[key], "best": best, "tied": tied,
                    "gap": (top - runner_up[1]) / top if runner_up and top > 0 else None,
                    "runner_up": runner_up[0] if runner_up else None}
    return out


def single_site_efficiency(predictions: list[CellPrediction]) -> dict[str, float]:
    """Each shaped cell's predicted tokens/s over the best predicted baseline (every inter-DC link unshaped, any
    strategy) at the same workload sweep values: the report's efficiency_vs_single_site, before running."""
    def workload(p: CellPrediction) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in p.sweep.items() if k.startswith("workload.")))

    best: dict[tuple, float] = {}
    for p in predictions:
        if p.baseline:
            best[workload(p)] = max(best.get(workload(p), 0.0), p.prediction.tokens_per_s)
    return {p.cell: p.prediction.tokens_per_s / best[workload(p)] for p in predictions
            if not p.baseline and best.get(workload(p))}


def plan(experiment: Experiment, topology: Topology, calibration: Calibration) -> dict[str, Any]:
    predictions = predict_experiment(experiment, topology, calibration)
    error = model_error(calibration)
    efficiency = single_site_efficiency(predictions)
    cells = [{**cell_record(p), "efficiency_vs_single_site_predicted": efficiency.get(p.cell)} for p in predictions]
    found = verdicts(predictions, error)
    return {"experiment": experiment.name, "calibrated": calibration.calibrated, "model_error": error,
            "cells": cells, "best": {key: verdict["best"] for key, verdict in found.items()}, "points": found}


def cell_record(p: CellPrediction) -> dict[str, Any]:
    """A planned cell's prediction as the plan prints it: the cell, its sweep point, the figures a run's summary
    holds beside its measurement (CellPrediction.figures), and the bytes per link direction."""
    return {"cell": p.cell, "strategy": p.strategy, "baseline": p.baseline, "sweep": p.sweep, **p.figures(),
            "link_bytes_predicted": p.kernel_link_bytes}


def _variants(cell: Cell, sizes: list[int]) -> list[tuple[dict[str, Any], Cell]]:
    strategy = cell.options["strategy"]
    space = SEARCH_SPACE.get(strategy, {})
    names = list(space)
    out = []
    for values in itertools.product(*(space[n] for n in names)):
        changed = dict(zip(names, values))
        if changed.get("micro_batches") == "x1":
            changed.pop("micro_batches")
        elif changed.get("micro_batches") == "x2":  # more micro-batches: a smaller bubble, a larger global batch
            changed["micro_batches"] = 2 * cell.options["micro_batches"]
        if strategy == "pp" and changed.get("schedule") != "interleaved-1f1b":
            changed.pop("virtual_chunks", None)
        if strategy == "pp" and changed.get("schedule") != "overlap":
            changed.pop("lookahead", None)
        options = {**cell.options, **changed}
        if strategy in CHANGES_TRAINING:
            options["steps"] = max(options["steps"], 2 * options.get("inner_steps", 1))
        try:
            opts = Options(**options)
            check_options(opts, sizes)
        except (OptionError, ValueError):
            continue
        if changed in [c for c, _ in out]:
            continue
        out.append((changed, dataclasses.replace(cell, options=dataclasses.asdict(opts))))
    return out


def search(experiment: Experiment, topology: Topology, calibration: Calibration, top: int = 3) -> dict[str, Any]:
    """For every shaped sweep point: each strategy's options searched, the best few configurations ranked by
    predicted tokens/s, and the recommendation (the fastest that keeps the training algorithm and its
    precision; DiLoCo and compression are listed with what they change)."""
    sizes = [dc.nodes * experiment.workload.ranks_per_node for dc in topology.dcs]
    points: dict[str, list[dict[str, Any]]] = {}
    seen: set[tuple] = set()
    for cell in plan_cells(experiment, topology):
        if cell.baseline or cell.repetition:
            continue
        key = point_key(cell.sweep)
        for changed, variant in _variants(cell, sizes):
            identity = (key, tuple(sorted((k, str(v)) for k, v in variant.options.items())))
            if identity in seen:
                continue
            seen.add(identity)
            p = predict_cell(topology, variant, calibration, ranks_per_node=experiment.workload.ranks_per_node,
                             warmup_steps=experiment.workload.warmup_steps)
            strategy = variant.options["strategy"]
            caveat = ("changes the optimiser (fewer synchronisations): check the loss" if strategy in CHANGES_TRAINING
                      else "lossy inter-DC compression: check the loss" if changed.get("compression", "none") != "none"
                      else "doubles the global batch" if "micro_batches" in changed else "")
            points.setdefault(key, []).append({"strategy": strategy, "options": changed,
                                               "tokens_per_s_predicted": p.prediction.tokens_per_s,
                                               "step_s_predicted": p.prediction.step_s, "caveat": caveat,
                                               "explain": p.prediction.explain})
    out = {}
    for key, candidates in points.items():
        ranked = sorted(candidates, key=lambda c: -c["tokens_per_s_predicted"])
        exact = [c for c in ranked if not c["caveat"]]
        out[key] = {"recommended": exact[0] if exact else ranked[0], "top": ranked[:top],
                    "candidates": len(candidates)}
    return out
