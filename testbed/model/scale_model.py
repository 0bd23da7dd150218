"""A scenario's scale model (`testbed emulate`): for each strategy at each point, a laptop-scale cell whose
dimensionless groups (testbed.model.scale_groups) are the full scale's, chosen with the laptop-scale cost model.

Method, per (strategy, point): the full-scale efficiency is testbed.model.whatif's. The cell is 2 (or the
scenario's, at most MAX_DCS but for a pipeline) DCs of 2 nodes (a pipeline: 1, a stage per DC) training the `tiny`
preset with synthetic compute (a sleep split forward/backward as the workload splits a real step; the gradient still
crosses the links). For each
compute time of COMPUTE_S in turn, the link latency is set so that round trip / compute is the full scale's, and
the inter-DC rate is bisected (log scale, within RATE_RANGE) until the cost model's predicted efficiency of the
cell against its single-site baseline (testbed.model.predict, the shipped calibration) equals the full scale's
within EFFICIENCY_TOLERANCE; the first compute time that allows it is taken (the shortest run). Where even the
fastest rate this machine emulates cannot reach the full-scale efficiency (per-call overheads), the latency is
bisected down instead and rtt_over_compute is listed as unmatched. What cannot be the full scale's (a 2-node DC
cannot have 2304 ranks' ring steps; a 0.8 MB gradient cannot be cut into 40 buckets at 3 ms a call; H = 100 needs
more steps than the budget) is in `unmatched` with the two values.

This machine's limits: RATE_RANGE's top is the delay line's measured goodput (2.25 Gbit/s paced at 2.5 Gbit/s,
docs/validation/fidelity.md); every collective call costs the calibration's op_overhead (3 ms on the reference
machine) and every segment its message_overhead (1.5 ms), and where ranks outnumber cores the host's CPU per
message (host_cpu); latencies under LATENCY_FLOOR (the calibrated unshaped path's one way) are indistinguishable
from the floor.

Budget: a cell runs STEPS steps (DiLoCo: WARMUP + 2 H); at most a 2 s compute step over an efficiency near 0.3 is
about 7 s a step, about 1 min a cell with bring-up; nemotron's default points (6 distances x 3 strategies, + 3
baselines) are estimated at 8-14 min on 2 cores (the runner-side engineer measures it).

ScaleCell is the seam with testbed.runner.emulate; fields beyond the seam's have defaults (`compute_s`, `rate`,
`latency`: the chosen cell).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from testbed.model import shapes
from testbed.model.calibration import Calibration, reference_for
from testbed.model.predict import predict_experiment
from testbed.model.scale_groups import DILOCOS, PIPELINES, STRUCTURE, cell_groups, full_scale, structure
from testbed.model.whatif import evaluate_point
from testbed.spec.experiment import Experiment
from testbed.spec.loader import validate_data
from testbed.spec.scenario import Scenario, ScenarioStrategy
from testbed.spec.strategies import Options

POINTS = ("reference", "distance", "bandwidth", "all")
PRESET = "tiny"  # 0.2 M parameters, 0.8 MB of fp32 gradient: a step's bytes cross in ms on this machine
MICRO_BATCH = 4
COMPUTE_S = (0.25, 0.5, 1.0, 2.0)  # compute per step tried, shortest first
RATE_RANGE = (1e6, 2.25e9)  # bits/s: the delay line's measured goodput at the top
LATENCY_FLOOR = 5e-5  # seconds one way: the calibrated unshaped path's
EFFICIENCY_TOLERANCE = 0.01  # the scale model's predicted efficiency against the full scale's
GROUP_TOLERANCE = 0.25  # relative: a group within it is matched
STEPS, WARMUP = 8, 3
DILOCO_H = 4  # inner steps the scale model syncs after (the budget's; full scale's H is a group)
MAX_BUCKETS = 4  # of a 0.8 MB gradient: more and per-call overhead dominates
MAX_MICRO_BATCHES = 8
# DCs of a ring the scale model builds: beyond it every DC's 2 ranks outnumber this machine's cores many times and
# each link direction is a delay line of its own (a full mesh of 14 DCs: 182), and what the ring costs is the
# cores' wake-ups, not the links (intellect-1-usa, 14 DCs: an outer sync of 0.3-0.4 s unshaped and 0.85 s shaped
# where the model said 53 and 100 ms; covenant-72b, 20 DCs: 0.7-0.9 s and 1.9-2.4 s against 72 and 199 ms)
MAX_DCS = 4
WORKLOAD = {"flat-dp": "flat-dp", "hier-dp": "hier-dp", "hier-dp-overlap": "hier-dp-overlap", "diloco": "diloco",
            "streaming-diloco": "streaming-diloco", "pp-across": "pp", "pp-across-overlap": "pp"}
WHY_STRUCTURE = {"buckets": "a 0.8 MB gradient cut finer costs more per call (op_overhead) than it hides",
                 "inner_steps": "the run's step budget; the outer sync's cost per inner step is matched instead",
                 "fragments": "at most one fragment per inner step of the scale model's H",
                 "overlap_steps": "less than the scale model's H",
                 "micro_batches": "per-micro-batch overhead (op_overhead, message_overhead) on 2 cores",
                 "stages": "a stage per DC"}
WHY_TRANSFER = {"latency_steps": "a ring of the scale model's few ranks takes fewer latency-bound steps than the "
                                 "full scale's; the rate is chosen so the efficiency still agrees",
                "window_over_bdp": "gloo's window is its two segments in flight (no clamp knob on the links): it "
                                   "follows from the rate and round trip chosen",
                "intra_transfer_over_compute": "intra-DC paths are this machine's unshaped copies between "
                                               "namespaces (calibrated local_bandwidth)",
                "inter_transfer_over_compute": "the rate is solved for the efficiency, which also carries the "
                                               "latency steps and per-call overheads the full scale lacks",
                "rtt_over_compute": "even the fastest rate this machine emulates does not reach the full-scale "
                                    "efficiency at that round trip: the latency was lowered",
                "exposed_over_compute": "the efficiency could not be matched within the tolerance"}


@dataclass(frozen=True)
class ScaleCell:
    strategy: str  # the scenario strategy's name
    kind: str  # its kind (flat-dp, hier-dp-overlap, diloco, ...)
    distance_km: float
    bandwidth_gbit: float
    efficiency_full_scale: float  # testbed.model.whatif.evaluate_point(...).efficiency
    efficiency_scale_model_predicted: float  # the laptop-scale cost model's prediction of `experiment`
    groups_full: dict[str, float]  # group name -> value at full scale
    groups_scale: dict[str, float]  # the same names -> value in the scale model
    unmatched: dict[str, str]  # group -> why it could not be matched and by how much
    experiment: dict[str, Any]  # plain data of a valid testbed Experiment, topology inline, one strategy, baseline
    compute_s: float = 0.0  # extension: the cell's compute per step (s)
    rate: float = 0.0  # extension: its inter-DC rate (bits/s)
    latency: float = 0.0  # extension: its one-way inter-DC latency (s)


def points_of(s: Scenario, points: str) -> list[tuple[float, float]]:
    """(distance m, bandwidth bits/s) of each point: the reference; every swept distance at the reference
    bandwidth; every swept bandwidth at the reference distance; or both sweeps."""
    if points not in POINTS:
        raise ValueError(f"points: {points!r} is not one of {', '.join(POINTS)}")
    ref_d, ref_b = s.reference["distance"], s.reference["bandwidth"]
    out = [(ref_d, ref_b)]
    if points in ("distance", "all"):
        out += [(d, ref_b) for d in s.sweep.distance]
    if points in ("bandwidth", "all"):
        out += [(ref_d, b) for b in s.sweep.bandwidth]
    unique = sorted(set(out))
    return unique


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def _dc_names(count: int) -> list[str]:
    return ["east", "west"] if count == 2 else [f"dc{i}" for i in range(count)]


@dataclass(frozen=True)
class _Shape:
    """What the scale model keeps of a strategy: its workload strategy, options, nodes per DC, micro-batches."""

    workload: str
    options: dict[str, Any]
    nodes: int
    micro_batches: int
    steps: int
    warmup: int
    structure: dict[str, float]
    dcs: int  # the scale model's DCs: the scenario's, at most MAX_DCS but for a pipeline (a stage per DC)


def _shape(s: Scenario, strategy: ScenarioStrategy) -> _Shape:
    kind = strategy.kind
    options: dict[str, Any] = {}
    buckets = min(strategy.buckets, MAX_BUCKETS)
    h = min(strategy.inner_steps, DILOCO_H)
    fragments = min(strategy.fragments, h)
    overlap = min(strategy.overlap_steps, h - 1)
    mb = min(s.parallelism.micro_batches, MAX_MICRO_BATCHES) if kind in PIPELINES else 1
    steps, warmup = STEPS, WARMUP
    if kind == "hier-dp-overlap":
        grad_mb = shapes.parameter_count(shapes.config(Options(preset=PRESET))) * 4 / 1e6
        options = {"bucket_mb": round(grad_mb / buckets * 1.001, 4), "chunks": 2, "lanes": 2}
    if kind in DILOCOS:
        options = {"inner_steps": h}
        warmup, steps = 2, 2 + 2 * h
    if kind == "streaming-diloco":
        options |= {"fragments": fragments, "overlap_steps": overlap}
    if kind == "pp-across":
        options = {"schedule": "1f1b"}
    if kind == "pp-across-overlap":
        options = {"schedule": "overlap"}
    nodes = 1 if kind in PIPELINES else 2
    return _Shape(WORKLOAD[kind], options, nodes, mb, steps, warmup,
                  structure(kind, buckets, h, fragments, overlap, mb, s.dcs if kind in PIPELINES else 1),
                  s.dcs if kind in PIPELINES else min(s.dcs, MAX_DCS))


def _units(seconds: float, bits: float) -> tuple[str, str]:
    return f"{seconds * 1e3:.6g}ms", f"{bits / 1e6:.6g}mbit"


def experiment_data(s: Scenario, strategy: ScenarioStrategy, shape: _Shape, compute_ms: float, latency: float,
                    rate: float, label: str) -> dict[str, Any]:
    """Plain data of the cell's experiment: topology inline, the one strategy, its single-site baseline."""
    names = _dc_names(shape.dcs)
    lat, bw = _units(latency, rate)
    links = [{"between": [a, b], "latency": lat, "bandwidth": bw}
             for i, a in enumerate(names) for b in names[i + 1:]]
    return {"name": _slug(f"{s.name}-{label}")[:64],
            "description": f"scale model of {s.name}: {strategy.name} ({strategy.kind}) at {label}",
            "topology": {"name": _slug(f"{s.name}-scale")[:64],
                         "dcs": [{"name": name, "nodes": shape.nodes} for name in names], "links": links},
            "workload": {"preset": PRESET, "micro_batch": MICRO_BATCH, "micro_batches": shape.micro_batches,
                         "steps": shape.steps, "warmup_steps": shape.warmup, "seed": 1, "compute": "synthetic",
                         "compute_ms": round(compute_ms, 4)},
            "strategies": [{"name": _slug(strategy.name)[:40], "strategy": shape.workload,
                            "options": dict(shape.options)}],
            "baseline": "auto", "calibrate": "rtt", "cell_timeout": "300s"}


def validate(data: dict[str, Any]) -> tuple[Experiment, Any]:
    """The experiment and its topology, checked as `testbed run` checks a file (SpecError otherwise)."""
    experiment = validate_data(Experiment, data)
    topology = experiment.load_topology(None)
    experiment.check_cells(topology, None)
    return experiment, topology


def predicted_efficiency(data: dict[str, Any], calibration: Calibration) -> tuple[float, float]:
    """(efficiency against the baseline, exposed seconds a step) the cost model predicts for the cell."""
    experiment, topology = validate(data)
    cells = predict_experiment(experiment, topology, calibration)
    base = next(c for c in cells if c.baseline).prediction
    cell = next(c for c in cells if not c.baseline).prediction
    return base.step_s / cell.step_s, cell.step_s - base.step_s + base.exposed_s


def _compute_ms(shape: _Shape, kind: str, step_s: float, stages: int) -> float:
    """Synthetic compute per micro-batch (whole model) giving `step_s` of compute per step."""
    if kind in PIPELINES:  # the single-site span of (mb + p - 1) stage slots of compute/p each
        return step_s * stages / (shape.micro_batches + stages - 1) * 1e3
    return step_s / shape.micro_batches * 1e3


def _bisect(f: Any, low: float, high: float, target: float, log: bool, rounds: int = 18) -> float:
    """x in [low, high] with f(x) ~ target, f increasing."""
    for _ in range(rounds):
        mid = math.sqrt(low * high) if log else (low + high) / 2
        if f(mid) >= target:
            high = mid
        else:
            low = mid
    return high


def _relative(full: float, scale: float) -> float:
    if math.isinf(full) and math.isinf(scale):
        return 0.0
    if full == 0:
        return abs(scale)
    return abs(scale / full - 1)


def compare(full: dict[str, float], scale: dict[str, float], why: dict[str, str]) -> dict[str, str]:
    """Every group off by more than GROUP_TOLERANCE (window: unless both are >= 1, not window-limited), with the
    two values and why."""
    out = {}
    for name, value in full.items():
        other = scale.get(name, float("nan"))
        if name == "window_over_bdp" and value >= 1 and other >= 1:
            continue
        if name in STRUCTURE and value == other:
            continue
        if name == "exposed_over_compute" and name not in why:  # held by the efficiency's own tolerance
            continue
        off = _relative(value, other)
        if name in STRUCTURE or not off <= GROUP_TOLERANCE:
            reason = why.get(name) or WHY_STRUCTURE.get(name) or WHY_TRANSFER.get(name, "")
            out[name] = f"full scale {value:.4g}, scale model {other:.4g} (off by {off:.0%}): {reason}"
    return out


def derive_cell(s: Scenario, strategy: ScenarioStrategy, distance: float, bandwidth: float,
                calibration: Calibration) -> ScaleCell:
    """One strategy at one point (module docstring)."""
    kind = strategy.kind
    target = evaluate_point(s, strategy, distance, bandwidth).efficiency
    full = full_scale(s, strategy, distance, bandwidth)
    shape = _shape(s, strategy)
    label = f"{strategy.name}-{distance / 1e3:g}km-{bandwidth / 1e9:g}gbit"
    stages = s.dcs
    why: dict[str, str] = {}

    def build(step_s: float, latency: float, rate: float) -> dict[str, Any]:
        return experiment_data(s, strategy, shape, _compute_ms(shape, kind, step_s, stages), latency, rate, label)

    def efficiency(step_s: float, latency: float, rate: float) -> float:
        return _cached(build(step_s, latency, rate), calibration)[0]

    def rtt_time(step_s: float) -> float:  # the compute the round trip is measured against
        return step_s / (shape.micro_batches + stages - 1) if kind in PIPELINES else step_s

    chosen = None
    for step_s in COMPUTE_S:
        latency = max(LATENCY_FLOOR, full["rtt_over_compute"] * rtt_time(step_s) / 2)
        if efficiency(step_s, latency, RATE_RANGE[1]) >= target:
            rate = _bisect(lambda r, a=step_s, b=latency: efficiency(a, b, r), *RATE_RANGE, target, log=True)
            chosen = (step_s, latency, rate)
            break
    if chosen is None:  # overheads: even the top rate is too slow at that round trip; shorten the round trip
        step_s = COMPUTE_S[-1]
        top = max(LATENCY_FLOOR, full["rtt_over_compute"] * rtt_time(step_s) / 2)
        latency = _bisect(lambda x: -efficiency(step_s, x, RATE_RANGE[1]), LATENCY_FLOOR, top, -target, log=True)
        latency = LATENCY_FLOOR if latency <= LATENCY_FLOOR * 1.01 else latency
        chosen = (step_s, latency, RATE_RANGE[1])
    step_s, latency, rate = chosen
    if latency <= LATENCY_FLOOR * 1.01 and full["rtt_over_compute"] * rtt_time(step_s) / 2 < LATENCY_FLOOR:
        why["rtt_over_compute"] = (f"a one-way latency under {LATENCY_FLOOR * 1e3:g} ms (the unshaped path's floor) "
                                   "cannot be emulated: the floor is used, the rate carries the difference")
    data = build(step_s, latency, rate)
    predicted = _cached(data, calibration)[0]
    if abs(predicted - target) > EFFICIENCY_TOLERANCE:
        why["exposed_over_compute"] = (f"predicted {predicted:.3f} against {target:.3f}: the scale model's per-call "
                                       "overheads or its latency floor bound it" if predicted < target else
                                       f"predicted {predicted:.3f} against {target:.3f}: even the slowest rate "
                                       f"({RATE_RANGE[0] / 1e6:g} Mbit/s) leaves it above")
    opts = Options(preset=PRESET)
    cfg = shapes.config(opts)
    numel = shapes.parameter_count(cfg)
    transport = calibration.transport
    scale = cell_groups(kind, numel=numel, nodes=shape.nodes, dcs=shape.dcs, step_compute_s=step_s,
                        mb_compute_s=rtt_time(step_s), rtt_s=2 * latency, bandwidth=rate, transport=transport,
                        exposed_s=step_s * (1 / predicted - 1), activation_bytes=shapes.activation_bytes(
                            cfg, MICRO_BATCH), micro_batches=shape.micro_batches, structure_groups=shape.structure)
    scale = {name: scale[name] for name in full if name in scale}  # the full scale's groups (1 rank a DC: no intra)
    unmatched = compare(full, scale, why)
    if shape.dcs < s.dcs:
        unmatched["dcs"] = (f"full scale {s.dcs}, scale model {shape.dcs} (off by {1 - shape.dcs / s.dcs:.0%}): "
                            f"a ring of more DCs of 2 ranks costs this machine's cores more than its links; the "
                            f"rate is solved for the efficiency with the scale model's ring")
    if s.object_store is not None and kind in DILOCOS:
        unmatched["exchange"] = ("full scale: through object storage (one upload, the gathered payloads "
                                 "downloaded at once); the scale model all-reduces over its ring, at the rate "
                                 "solved for the efficiency")
    return ScaleCell(strategy.name, kind, distance / 1e3, bandwidth / 1e9, target, predicted, full, scale,
                     unmatched, data, step_s, rate, latency)


_CACHE: dict[tuple[str, int], tuple[float, float]] = {}


def _cached(data: dict[str, Any], calibration: Calibration) -> tuple[float, float]:
    """predicted_efficiency, remembered per (experiment, calibration) within a process."""
    import json

    key = (json.dumps(data, sort_keys=True), id(calibration))
    if key not in _CACHE:
        _CACHE[key] = predicted_efficiency(data, calibration)
    return _CACHE[key]


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    """The shipped reference calibration for the scale model's workload."""
    return reference_for(PRESET, MICRO_BATCH, shapes.config(Options(preset=PRESET)).seq_len)[1]


def derive(scenario: Scenario, points: str = "reference", calibration: Any | None = None) -> list[ScaleCell]:
    """points: reference | distance | bandwidth | all. Every strategy at every point, points in order."""
    calibration = calibration or default_calibration()
    return [derive_cell(scenario, strategy, distance, bandwidth, calibration)
            for distance, bandwidth in points_of(scenario, points) for strategy in scenario.strategies]
