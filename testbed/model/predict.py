"""Predict the cells of an experiment (before running) or of a run (with each cell's measured round trips),
from the topology, the cell's options and links and a calibration."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from testbed.model import shapes
from testbed.model.calibration import Calibration, load_calibration
from testbed.model.network import Network, build_network
from testbed.model.strategies import CellModel, Prediction, predict
from testbed.plan.cells import Cell, plan_cells
from testbed.plan.gso import gso_max_bytes
from testbed.spec.experiment import Experiment
from testbed.spec.strategies import Options
from testbed.spec.topology import Topology
from testbed.steplog import read_records

CALIBRATION_FILE = "calibration.json"


class NoComputeProfile(ValueError):
    """Real compute without a measured profile of this model and micro-batch; str() says how to get one."""


def compute_seconds(opts: Options, calibration: Calibration) -> float:
    """Forward+backward of one micro-batch of the whole model on one rank: the synthetic setting, or the
    calibration's measured profile."""
    cfg = shapes.config(opts)
    if opts.synthetic and opts.compute_ms is not None:
        return opts.compute_ms / 1e3
    if opts.synthetic and opts.device_tflops:
        return shapes.flops_per_token(cfg) * opts.micro_batch * cfg.seq_len / (opts.device_tflops * 1e12)
    seconds = calibration.compute_seconds(opts.preset, opts.micro_batch, cfg.seq_len)
    if seconds is None:
        raise NoComputeProfile(f"no compute profile for preset {opts.preset} at micro_batch {opts.micro_batch}: "
                               "run `testbed calibrate EXPERIMENT` (it profiles the experiment's model)")
    return seconds


def optimizer_share(opts: Options, network: Network) -> float:
    """The part of the model whose optimizer step one rank runs: a pipeline stage's (one per DC), a shard's
    (fsdp: over every rank; hsdp: over the first DC's ranks), else all of it."""
    if opts.strategy == "pp":
        return 1 / max(1, len(network.sizes))
    if opts.strategy == "fsdp":
        return 1 / max(1, network.world)
    if opts.strategy == "hsdp":
        return 1 / max(1, network.sizes[0])
    return 1.0


def step_overhead_seconds(opts: Options, network: Network, calibration: Calibration) -> float:
    """A step's local time besides compute and communication, before running: the calibration's optimizer step
    (its profile of this model) for the rank's part of the model; 0 for synthetic compute or without one."""
    if opts.synthetic:
        return 0.0
    seconds = calibration.optimizer_seconds(opts.preset, shapes.config(opts).seq_len, opts.optimizer)
    return 0.0 if seconds is None else seconds * optimizer_share(opts, network)


def link_rtt(links: Mapping[str, Mapping[str, Any]]) -> float:
    """What the runner hands the overlap schedule: the largest configured inter-DC round trip."""
    return max((2 * float(v.get("latency", 0.0)) for v in links.values()), default=0.0)


@dataclass
class CellPrediction:
    cell: str
    strategy: str
    baseline: bool
    sweep: dict[str, Any]
    prediction: Prediction
    kernel_bytes_per_step: float  # all inter-DC link directions, as the kernel counters count them
    kernel_link_bytes: dict[str, float]  # the same per link direction ("east->west")

    def figures(self) -> dict[str, Any]:
        """The predicted figures by the names a run's tables and the plan's cells give them (`*_predicted`)."""
        p = self.prediction
        return {"step_s_predicted": p.step_s, "tokens_per_s_predicted": p.tokens_per_s,
                "compute_s_predicted": p.compute_s, "exposed_s_predicted": p.exposed_s,
                "comm_intra_s_predicted": p.comm_intra_s, "comm_inter_s_predicted": p.comm_inter_s,
                "bubble_ratio_predicted": p.bubble_ratio, "inter_dc_bytes_predicted": self.kernel_bytes_per_step,
                "explain": p.explain}


def cell_options(cell: Mapping[str, Any]) -> Options:
    """The workload options of a planned or recorded cell (its `options`, less what is not a workload option)."""
    return Options(**{k: v for k, v in cell["options"].items() if k in Options.__pydantic_fields__})


def predict_cell(topology: Topology, cell: Cell | Mapping[str, Any], calibration: Calibration, *,
                 ranks_per_node: int = 1, warmup_steps: int = 0,
                 rtts: Mapping[tuple[str, str], float] | None = None,
                 local: tuple[float, float] | None = None, warm_wall: float | None = None,
                 profile_scale: float = 1.0) -> CellPrediction:
    """`cell`: a planned Cell or the `cell` mapping of a result.json. `rtts`: measured (src, dst) round trips.
    `local`: (compute per micro-batch, other seconds per step) measured in the cell's own warm-up steps; for real
    compute they are averaged with the calibration's profile times `profile_scale` where it has one
    (blend_local); `warm_wall`: those steps' measured step time, from which real compute's per-call overhead is
    taken (warmup_overhead, with the warm-up's own compute)."""
    data = cell if isinstance(cell, Mapping) else {"id": cell.id, "strategy": cell.strategy, "options": cell.options,
                                                   "links": cell.links, "sweep": cell.sweep,
                                                   "baseline": cell.baseline}
    opts = cell_options(data)
    network = build_network(topology, data["links"], ranks_per_node, rtts)
    measured = local if local and not opts.synthetic else None
    compute, overhead = measured or (compute_seconds(opts, calibration),
                                     step_overhead_seconds(opts, network, calibration))
    transport = replace(calibration.transport, gso_max=gso_max_bytes(topology))  # as the fabric sets it at `up`
    model = CellModel(opts, network, transport, compute, warmup_steps, link_rtt(data["links"]), overhead,
                      calibration.host_cpu_term())
    if measured:
        if warm_wall:
            model = warmup_overhead(model, warm_wall)
        model = blend_local(model, calibration, profile_scale)
    prediction = predict(model)
    t = calibration.transport
    steps = max(1, opts.steps)
    per_link = {key: (prediction.link_bytes.get(key, 0.0) + prediction.once_link_bytes.get(key, 0.0) / steps)
                * (1 + t.wire_overhead + prediction.wire_share.get(key, 0.0))
                for key in {**prediction.link_bytes, **prediction.once_link_bytes}}
    kernel = (sum(per_link.values()) * steps + t.fixed_bytes) / steps
    return CellPrediction(data["id"], data["strategy"], bool(data.get("baseline")), dict(data.get("sweep", {})),
                          prediction, kernel, per_link)


def predict_experiment(experiment: Experiment, topology: Topology, calibration: Calibration) -> list[CellPrediction]:
    """Every cell the experiment would run, predicted from configured links (nothing is built). Before running,
    a cell's repetitions are the same cell: each distinct (strategy, options, links) is simulated once."""
    ranks = experiment.workload.ranks_per_node
    out, seen = [], {}
    for cell in plan_cells(experiment, topology):
        key = json.dumps([cell.strategy, cell.options, cell.links, cell.baseline], sort_keys=True, default=str)
        if key not in seen:
            seen[key] = predict_cell(topology, cell, calibration, ranks_per_node=ranks,
                                     warmup_steps=experiment.workload.warmup_steps)
        out.append(replace(seen[key], cell=cell.id, sweep=dict(cell.sweep)))
    return out


def probe_rtts(result: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """Measured round trips of a cell's link calibration, (src, dst) -> seconds."""
    return {(p["src"], p["dst"]): p["rtt_p50_ms"] / 1e3 for p in result.get("calibration") or []
            if p.get("rtt_p50_ms") is not None and p.get("rtt_configured_ms", 0) > 0}


def _warmup_records(cell_dir: Path, warmup_steps: int) -> list[dict]:
    """Every rank's step records of the warm-up steps the model learns from: the first, which initialises, left
    out when there are others."""
    first = 1 if warmup_steps > 1 else 0
    return [record for path in sorted((cell_dir / "metrics").glob("rank*.jsonl")) for record in read_records(path)
            if record.get("event") == "step" and first <= record.get("step") < warmup_steps]


def warmup_local(cell_dir: Path, warmup_steps: int, micro_batches: int) -> tuple[float, float] | None:
    """(compute per micro-batch, other local seconds per step) of the cell's warm-up steps (_warmup_records):
    per step the slowest rank's compute and the ranks' median other time, then the median over those steps.
    What this machine's shared CPU gave the cell's own ranks, measured before the steps the figures count."""
    compute: dict[int, list[float]] = {}
    other: dict[int, list[float]] = {}
    for record in _warmup_records(cell_dir, warmup_steps):
        step = record["step"]
        compute.setdefault(step, []).append(record["compute_s"])
        other.setdefault(step, []).append(max(0.0, record["wall_s"] - record["compute_s"] - record["exposed_s"]
                                              - record.get("bubble_s", 0.0)))
    if not compute:
        return None
    per_step = sorted(max(values) for values in compute.values())
    others = sorted(sorted(values)[len(values) // 2] for values in other.values())
    return per_step[len(per_step) // 2] / max(1, micro_batches), others[len(others) // 2]


CONTENTION = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)  # multiples of the calibrated per-call overhead tried


def warmup_overhead(model: CellModel, warm_wall: float) -> CellModel:
    """The model with the per-call overhead of its collectives as the cell's own warm-up steps saw it: the
    multiple of the calibrated overhead (CONTENTION) whose simulated warm-up steps come closest to `warm_wall`.
    The calibration measures calls with the ranks otherwise idle; with real compute the ranks' own threads
    (backward, the overlap's launch, gather and lane threads) share this machine's cores with them, and no more
    contention than the calibration's is assumed, only found. The same steps give the compute (warmup_local)."""
    if model.warmup_steps < 1:
        return model
    first = 1 if model.warmup_steps > 1 else 0  # as _warmup_records
    warm = replace(model, opts=replace(model.opts, steps=model.warmup_steps), warmup_steps=first)
    base = model.transport.op_overhead

    def miss(factor: float) -> float:
        fitted = replace(warm, transport=model.transport.with_fit(op_overhead=base * factor))
        return abs(predict(fitted).step_s - warm_wall)

    best = min(CONTENTION, key=miss)
    return replace(model, transport=model.transport.with_fit(op_overhead=base * best))


def blend_local(model: CellModel, calibration: Calibration, scale: float = 1.0) -> CellModel:
    """Real compute per micro-batch as the mean of the cell's own warm-up steps (model's: three steps, just
    before its counted ones) and the calibration's profile times `scale` (profile_scales: the profile as the
    run's cells of this strategy ran it), where the calibration profiled this model and micro-batch; the other
    local time likewise with the profiled optimizer step. Two measurements of one quantity, each off by noise
    the other does not share (bench/model_accuracy.py --warm-up-only gives the warm-up's alone)."""
    try:
        profile = compute_seconds(model.opts, calibration) * scale
    except NoComputeProfile:
        return model
    profiled = calibration.optimizer_seconds(model.opts.preset, shapes.config(model.opts).seq_len,
                                             model.opts.optimizer) is not None
    other = step_overhead_seconds(model.opts, model.network, calibration) if profiled else model.step_overhead_s
    return replace(model, compute_s=(model.compute_s + profile) / 2,
                   step_overhead_s=(model.step_overhead_s + other) / 2)


def profile_scales(cells: Iterable[tuple[Mapping[str, Any], tuple[float, float] | None]],
                   calibration: Calibration) -> dict[str, float]:
    """Per strategy, the median over a run's real-compute cells of their warm-up compute per micro-batch over
    the calibration's profile: what the strategy's own threads, the run's ranks and the machine's drift did to
    the profiled compute (0.86-1.21 on this project's 2-core machine, 0.94-1.38 on a 16-core one, in eight runs of
    2026-11-27), from every warm-up of the run, never from a counted step."""
    ratios: dict[str, list[float]] = {}
    for cell, local in cells:
        opts = cell_options(cell)
        if local is None or opts.synthetic:
            continue
        try:
            ratio = local[0] / compute_seconds(opts, calibration)
        except NoComputeProfile:
            continue
        ratios.setdefault(cell["strategy"], []).append(ratio)
    return {strategy: statistics.median(values) for strategy, values in ratios.items()}


def warmup_wall(cell_dir: Path, warmup_steps: int) -> float | None:
    """The measured step time of the cell's warm-up steps (_warmup_records): per step the slowest rank's wall,
    then the median over those steps."""
    walls: dict[int, float] = {}
    for record in _warmup_records(cell_dir, warmup_steps):
        walls[record["step"]] = max(walls.get(record["step"], 0.0), record["wall_s"])
    values = sorted(walls.values())
    return values[len(values) // 2] if values else None


def run_calibration(run_dir: Path) -> Calibration | None:
    path = Path(run_dir) / CALIBRATION_FILE
    return load_calibration(path) if path.exists() else None


def predict_run(run_dir: Path, results: list[dict], calibration: Calibration | None = None) -> list[CellPrediction]:
    """Each completed cell of a run, predicted with its own measured round trips and the run's calibration."""
    from testbed.spec.topology import topology_from_data

    run_dir = Path(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    calibration = calibration or run_calibration(run_dir)
    if calibration is None or "topology" not in manifest:
        return []
    topology = topology_from_data(manifest["topology"], si=True)  # a model_dump: SI numbers
    warmup = manifest.get("warmup_steps", 0)
    # a user's own command (no strategy): nothing to predict
    cells = [(result, warmup_local(run_dir / "cells" / result["cell"]["id"], warmup,
                                   result["cell"]["options"].get("micro_batches", 1)))
             for result in results if "strategy" in result["cell"].get("options", {})]
    scales = profile_scales(((result["cell"], local) for result, local in cells), calibration)
    out = []
    for result, local in cells:
        cell = result["cell"]
        wall = warmup_wall(run_dir / "cells" / cell["id"], warmup) if local else None
        try:
            out.append(predict_cell(topology, cell, calibration, ranks_per_node=result.get("ranks_per_node", 1),
                                    warmup_steps=warmup, rtts=probe_rtts(result), local=local, warm_wall=wall,
                                    profile_scale=scales.get(cell["strategy"], 1.0)))
        except (NoComputeProfile, KeyError):
            continue
    return out
