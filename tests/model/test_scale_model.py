"""The scale model (testbed.model.scale_model), root-free: for every shipped scenario at `testbed emulate`'s default
points and for scenarios written here (another model size, 3 DCs, DiLoCo with other H, pipelines), every derived
experiment loads as `testbed run` loads a file, each group is the full scale's within GROUP_TOLERANCE (25 %
relative) or is listed in `unmatched` with both values, and the cost model's prediction of the written experiment,
made again from the file, is the full-scale efficiency within EFFICIENCY_TOLERANCE (0.01)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from testbed.model import scale_model
from testbed.model.predict import predict_experiment
from testbed.model.scale_groups import STRUCTURE
from testbed.model.scale_model import (
    DILOCO_H,
    EFFICIENCY_TOLERANCE,
    GROUP_TOLERANCE,
    LATENCY_FLOOR,
    MAX_BUCKETS,
    MAX_MICRO_BATCHES,
    RATE_RANGE,
    ScaleCell,
    default_calibration,
    derive,
    points_of,
)
from testbed.model.whatif import compute_seconds, evaluate_point
from testbed.spec.experiment import load_experiment
from testbed.spec.scenario import Scenario, load_scenario
from testbed.spec.units import parse_delay, parse_rate

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))
NEMOTRON = ROOT / "scenarios" / "nemotron-340b-two-dc.yaml"


def written_scenarios() -> dict[str, Scenario]:
    """Scenarios the shipped ones do not cover: another model size, 3 DCs, DiLoCo with H = 20 and 500, pipelines."""
    base = yaml.safe_load(NEMOTRON.read_text())
    base.pop("published_figures", None)  # checks of the shipped file's own strategies and figures
    out = {}
    small = copy.deepcopy(base)
    small.update(name="llama-8b", model={"parameters": 8e9, "layers": 32, "hidden": 4096, "seq_len": 8192},
                 gpus_per_dc=256, global_batch_tokens=2097152, parallelism={"tp": 8, "pp": 1, "micro_batches": 1})
    out["llama-8b"] = small
    three = copy.deepcopy(base)
    three.update(name="three-dc", dcs=3, gpus_per_dc=2016)
    out["three-dc"] = three
    diloco = copy.deepcopy(base)
    diloco.update(name="diloco-h", strategies=[
        {"name": "diloco-h20", "kind": "diloco", "inner_steps": 20},
        {"name": "diloco-h500", "kind": "diloco", "inner_steps": 500},
        {"name": "streaming-h50", "kind": "streaming-diloco", "inner_steps": 50, "fragments": 8, "overlap_steps": 2}])
    out["diloco-h"] = diloco
    pipes = copy.deepcopy(base)
    pipes.update(name="pipes", strategies=[{"name": "pp-1f1b", "kind": "pp-across"},
                                           {"name": "pp-overlap", "kind": "pp-across-overlap"}])
    out["pipes"] = pipes
    return {name: Scenario.model_validate(data) for name, data in out.items()}


def _load_written(cell: ScaleCell, tmp: Path):
    path = tmp / f"{cell.experiment['name']}.yaml"
    path.write_text(yaml.safe_dump(cell.experiment, sort_keys=False))
    return load_experiment(path)


def _check(cell: ScaleCell, scenario: Scenario, tmp: Path) -> None:
    where = f"{cell.strategy} at {cell.distance_km:g} km, {cell.bandwidth_gbit:g} Gbit/s"
    strategy = next(s for s in scenario.strategies if s.name == cell.strategy)
    full = evaluate_point(scenario, strategy, cell.distance_km * 1e3, cell.bandwidth_gbit * 1e9).efficiency
    assert cell.efficiency_full_scale == pytest.approx(full), where
    experiment, topology = _load_written(cell, tmp)  # what the runner writes and loads back
    cells = predict_experiment(experiment, topology, default_calibration())
    assert [c.baseline for c in cells] == [True, False], where  # one strategy, its single-site baseline
    again = cells[0].prediction.step_s / cells[1].prediction.step_s
    assert again == pytest.approx(cell.efficiency_scale_model_predicted, rel=1e-9), where
    assert abs(again - full) <= EFFICIENCY_TOLERANCE or "exposed_over_compute" in cell.unmatched, where
    # it fits this machine: the delay line's rate, above the latency floor, few ranks and steps
    link = cell.experiment["topology"]["links"][0]
    assert RATE_RANGE[0] <= parse_rate(link["bandwidth"]) <= RATE_RANGE[1] * (1 + 1e-6), where
    assert parse_delay(link["latency"]) >= LATENCY_FLOOR * (1 - 1e-6), where
    assert sum(dc.nodes for dc in topology.dcs) <= 2 * scenario.dcs and experiment.workload.steps <= 12, where
    assert set(cell.groups_full) == set(cell.groups_scale), where
    full_groups = cell.groups_full
    assert full_groups["exposed_over_compute"] == pytest.approx(1 / full - 1, rel=1e-9), where
    # round trip over compute, read back from the file: the full scale's unless listed
    workload = experiment.workload
    if cell.kind.startswith("pp"):
        stages = len(topology.dcs)
        per = workload.compute_ms / 1e3 / stages
    else:
        per = workload.compute_ms / 1e3 * workload.micro_batches
    rtt = 2 * parse_delay(link["latency"])
    if "rtt_over_compute" not in cell.unmatched and rtt > 2 * LATENCY_FLOOR * 1.01:
        assert rtt / per == pytest.approx(full_groups["rtt_over_compute"], rel=GROUP_TOLERANCE), where
    # what may be listed: the round trip only where the top rate could not reach the efficiency (the latency is
    # lowered then); the structure only where the scale model's cap is below the full scale's
    if "rtt_over_compute" in cell.unmatched:
        at_floor = parse_delay(link["latency"]) <= LATENCY_FLOOR * (1 + 1e-6)
        assert at_floor or parse_rate(link["bandwidth"]) == pytest.approx(RATE_RANGE[1], rel=1e-6), where
    h = min(full_groups.get("inner_steps", 1), DILOCO_H)
    caps = {"buckets": MAX_BUCKETS, "inner_steps": DILOCO_H, "fragments": h, "overlap_steps": h - 1,
            "micro_batches": MAX_MICRO_BATCHES, "stages": scenario.dcs}
    for name in STRUCTURE:
        if name in full_groups:
            assert cell.groups_scale[name] == min(full_groups[name], caps[name]), (where, name)
            assert (name in cell.unmatched) == (full_groups[name] > caps[name]), (where, name)
    for name, value in full_groups.items():
        other = cell.groups_scale[name]
        if name in cell.unmatched:
            why = cell.unmatched[name]
            assert f"{value:.4g}" in why and f"{other:.4g}" in why and len(why) > 40, (where, name, why)
            continue
        if name in STRUCTURE:
            assert other == value, (where, name)
        elif name == "window_over_bdp" and value >= 1:
            assert other >= 1, (where, name)
        elif name != "exposed_over_compute":
            assert other == pytest.approx(value, rel=GROUP_TOLERANCE), (where, name, value, other)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_scale_model_matches(path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(path)
    cells = derive(scenario, "distance")
    assert len(cells) == len(points_of(scenario, "distance")) * len(scenario.strategies)
    for cell in cells:
        _check(cell, scenario, tmp_path)
    matched = [c for c in cells if "exposed_over_compute" not in c.unmatched]
    assert len(matched) >= 0.8 * len(cells), [c.unmatched.get("exposed_over_compute") for c in cells]
    winners_full = {}
    winners_scale = {}
    for cell in cells:  # the fastest strategy at each point is the same by both predictions
        key = cell.distance_km
        if cell.efficiency_full_scale > winners_full.get(key, ("", -1))[1]:
            winners_full[key] = (cell.strategy, cell.efficiency_full_scale)
        if cell.efficiency_scale_model_predicted > winners_scale.get(key, ("", -1))[1]:
            winners_scale[key] = (cell.strategy, cell.efficiency_scale_model_predicted)
    if len(scenario.strategies) < 2:
        return
    close = {k for k in winners_full
             if abs(winners_full[k][1] - sorted(c.efficiency_full_scale for c in cells if c.distance_km == k)[-2])
             <= 2 * EFFICIENCY_TOLERANCE}  # a tie within the tolerance may go either way
    assert {k: v[0] for k, v in winners_full.items() if k not in close} == \
        {k: v[0] for k, v in winners_scale.items() if k not in close}


@pytest.mark.parametrize("name", list(written_scenarios()))
def test_written_scenarios_scale_model_matches(name: str, tmp_path: Path) -> None:
    scenario = written_scenarios()[name]
    cells = derive(scenario, "distance")
    assert cells
    for cell in cells:
        _check(cell, scenario, tmp_path)


def test_structure_is_kept_or_said() -> None:
    scenario = written_scenarios()["diloco-h"]
    cells = {c.strategy: c for c in derive(scenario)}
    assert cells["diloco-h20"].groups_full["inner_steps"] == 20
    assert "inner_steps" in cells["diloco-h500"].unmatched
    assert cells["streaming-h50"].experiment["strategies"][0]["options"]["overlap_steps"] == 2
    three = derive(written_scenarios()["three-dc"])[0]
    assert len(three.experiment["topology"]["dcs"]) == 3 and len(three.experiment["topology"]["links"]) == 3


def test_a_ring_of_many_dcs_is_emulated_with_few_and_says_so() -> None:
    """20 DCs of 2 ranks on this machine's 2 cores measured an outer sync 6-12 times what the model said (covenant-72b
    and intellect-1-usa, 2026-12-02): the scale model rings MAX_DCS DCs, lists the DCs and the ring's latency steps
    as unmatched, and still matches the efficiency; a pipeline keeps a stage per DC."""
    cell = derive(load_scenario(ROOT / "scenarios" / "covenant-72b.yaml"))[0]
    assert len(cell.experiment["topology"]["dcs"]) == scale_model.MAX_DCS
    assert "full scale 20, scale model 4" in cell.unmatched["dcs"]
    assert cell.groups_scale["latency_steps"] == 2 * (scale_model.MAX_DCS - 1) and "latency_steps" in cell.unmatched
    assert abs(cell.efficiency_scale_model_predicted - cell.efficiency_full_scale) <= EFFICIENCY_TOLERANCE
    three = derive(written_scenarios()["three-dc"])[0]
    assert "dcs" not in three.unmatched


def test_points() -> None:
    scenario = load_scenario(NEMOTRON)
    ref = (scenario.reference["distance"], scenario.reference["bandwidth"])
    assert points_of(scenario, "reference") == [ref]
    assert len(points_of(scenario, "distance")) == len(set(scenario.sweep.distance) | {ref[0]})
    assert len(points_of(scenario, "all")) == len(set(points_of(scenario, "distance")) |
                                                  set(points_of(scenario, "bandwidth")))
    with pytest.raises(ValueError, match="points"):
        points_of(scenario, "everything")


def test_unreachable_efficiency_is_said() -> None:
    """70B at 1 Gbit/s keeps 0.2 % at full scale; the slowest rate the scale model uses keeps more: it says so."""
    scenario = load_scenario(ROOT / "scenarios" / "diloco-bandwidth.yaml")
    strategy = scenario.strategies[0]
    cell = scale_model.derive_cell(scenario, strategy, 2e6, 1e9, default_calibration())
    assert cell.efficiency_scale_model_predicted > cell.efficiency_full_scale + EFFICIENCY_TOLERANCE
    assert "exposed_over_compute" in cell.unmatched
    assert math.isfinite(compute_seconds(scenario))


def test_a_dilocos_full_scale_transfer_group_is_its_outer_exchange() -> None:
    """The full scale's inter_transfer_over_compute for a DiLoCo is whatif's outer exchange over the round's compute:
    int8 pseudo-gradients take half of bf16's, and a ring's slowest hop or an object store's gathered downloads
    set it (before: the model's bf16 bytes over a sharded all-reduce whatever the scenario said)."""
    from testbed.model.scale_groups import full_scale

    s = load_scenario(ROOT / "scenarios" / "streaming-diloco-10b.yaml")
    diloco = next(x for x in s.strategies if x.name == "diloco")
    bf16 = full_scale(s, diloco, 1e3, 5e9)["inter_transfer_over_compute"]
    int8 = full_scale(s, diloco.model_copy(update={"outer_precision": "int8"}), 1e3, 5e9)["inter_transfer_over_compute"]
    assert int8 == pytest.approx(bf16 / 2, rel=1e-6)
    covenant = load_scenario(ROOT / "scenarios" / "covenant-72b.yaml")
    sparse = covenant.strategies[0]
    fewer = covenant.model_copy(update={"object_store": covenant.object_store.model_copy(update={"gather": 10})})
    assert full_scale(fewer, sparse, 1e3, 110e6)["inter_transfer_over_compute"] < \
        full_scale(covenant, sparse, 1e3, 110e6)["inter_transfer_over_compute"]
