"""The host CPU bound (testbed.model.host): collectives of more ranks than the machine has cores wait for the CPU
their messages cost, measured apart by bench/message_cost.py. Pure: no root, no torch."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from testbed.model.calibration import (
    REFERENCE_DIR,
    Calibration,
    load_calibration,
    reference_calibrations,
)
from testbed.model.host import HostCpu, all_gather_load, all_to_all_load, fit_host_cpu, shape_load
from testbed.model.predict import predict_cell
from testbed.model.transport import Transport
from tests.support.topologies import link_data, make_topology

ELEMENTS = 236928  # the tiny preset's gradient, as bench/message_cost.py sends it
# bench/message_cost.py --shapes 4x2,1x8,4x8,1x32,2x32,4x16,4x32 --reps 10, 2026-11-29 01:41-01:47 UTC, 2 cores
# (docs/validation/scale.md): the phase of every DC's all-to-all and all-gather at once, slowest rank, median
MEASURED = {"4x2": 0.00897, "1x8": 0.0212, "4x8": 0.0519, "1x32": 0.125, "4x16": 0.123, "2x32": 0.216, "4x32": 0.452}
# what scale.md derives from them: 4x16 against 2x32 (equal bytes) 0.091 ms of a core a message; the rest of 4x16's
# 0.63 ms of a core a MB
BENCH = HostCpu(cores=2, message_core_s=0.091e-3, byte_core_s=0.63e-3 / 1e6)


def shapes_measured() -> list[dict]:
    out = []
    for shape, phase in MEASURED.items():
        dcs, group = map(int, shape.split("x"))
        messages, nbytes = shape_load(dcs, group, ELEMENTS)
        out.append({"shape": shape, "ranks": dcs * group, "messages": messages, "bytes": nbytes, "phase_s": phase})
    return out


def scale_cell(ranks: int, strategy: str = "hier-dp"):
    """bench/scale.py's experiment (4 DCs of ranks/4 nodes in a chain over 2 ms, 1 Gbit/s links; the tiny model,
    50 ms of synthetic compute, 4 steps, the first a warm-up): its topology and one cell."""
    names = [f"dc{i}" for i in range(4)]
    topology = make_topology(f"scale-4x{ranks // 4}", dict.fromkeys(names, ranks // 4),
                             [link_data(a, b, latency="2ms", bandwidth="1gbit") for a, b in itertools.pairwise(names)])
    links = {}
    for a, b in itertools.pairwise(names):
        links[f"{a}->{b}"] = links[f"{b}->{a}"] = {"latency": 0.002, "bandwidth": 1e9}
    options = {"strategy": strategy, "preset": "tiny", "micro_batch": 4, "micro_batches": 1, "steps": 4,
               "synthetic": True, "compute_ms": 50.0}
    return topology, {"id": strategy, "strategy": strategy, "options": options, "links": links}


def intra(ranks: int, calibration: Calibration, strategy: str = "hier-dp"):
    topology, cell = scale_cell(ranks, strategy)
    return predict_cell(topology, cell, calibration, warmup_steps=1).prediction


def shipped() -> Calibration:
    return reference_calibrations()[0][1]


def with_host(host: HostCpu | None, host_cpus: int | None = 2) -> Calibration:
    base = shipped()
    return Calibration(base.transport, base.compute, base.fit, [], {"host_cpus": host_cpus}, host)


# --- the bound ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cores,ranks", [(2, 1), (2, 2), (8, 8), (16, 8), (128, 128)])
def test_the_bound_is_0_while_every_rank_has_a_core(cores, ranks):
    host = dataclasses.replace(BENCH, cores=cores)
    assert host.seconds(ranks, 10_000, 1e9) == 0.0


@pytest.mark.parametrize("cores,ranks", [(2, 3), (2, 8), (16, 17), (2, 128)])
def test_the_bound_is_the_core_seconds_over_the_cores_once_ranks_outnumber_them(cores, ranks):
    host = dataclasses.replace(BENCH, cores=cores)
    assert host.seconds(ranks, 1000, 1e8) == pytest.approx((1000 * 0.091e-3 + 100 * 0.63e-3) / cores)


@pytest.mark.parametrize("smaller,larger", [("4x8", "4x16"), ("4x16", "4x32"), ("4x16", "2x32"), ("1x8", "1x32"),
                                            ("4x2", "1x8")])
def test_the_bound_grows_with_the_messages(smaller, larger):
    """More messages (4x16 and 2x32: the same bytes, twice the messages) take longer."""
    loads = {s["shape"]: s for s in shapes_measured()}
    a, b = loads[smaller], loads[larger]
    assert b["messages"] > a["messages"]
    assert BENCH.seconds(b["ranks"], b["messages"], b["bytes"]) > BENCH.seconds(a["ranks"], a["messages"], a["bytes"])


@pytest.mark.parametrize("shape,messages,megabytes", [("4x2", 16, 7.58), ("4x8", 448, 53.1), ("4x16", 1920, 114),
                                                      ("2x32", 3968, 118), ("4x32", 7936, 235)])
def test_a_shape_sends_dcs_times_2g_g_minus_1_messages(shape, messages, megabytes):
    """As docs/validation/scale.md counts them (its 114 and 118 MB for 4x16 and 2x32)."""
    dcs, group = map(int, shape.split("x"))
    got = shape_load(dcs, group, ELEMENTS)
    assert got[0] == messages == dcs * 2 * group * (group - 1)
    assert got[1] / 1e6 == pytest.approx(megabytes, rel=0.01)
    assert all_to_all_load([group] * dcs, 1.0)[0] == all_gather_load([group] * dcs, 1.0)[0] == messages // 2


def test_fit_recovers_the_constants_that_made_the_phases():
    host = HostCpu(2, 0.1e-3, 0.5e-9)
    made = [{**s, "phase_s": host.seconds(s["ranks"], s["messages"], s["bytes"])} for s in shapes_measured()]
    fitted = fit_host_cpu(made, 2)
    assert (fitted.message_core_s, fitted.byte_core_s) == pytest.approx((0.1e-3, 0.5e-9), rel=1e-6)


def test_fit_of_the_measured_shapes_gives_the_largest_within_a_few_percent():
    """The constants fitted to the bench's table give its 4x32 phase within 4 % (scale.md: 0.434 s from 0.091 ms a
    message and 0.63 ms a MB against 0.452 s measured)."""
    fitted = fit_host_cpu(shapes_measured(), 2)
    for host in (fitted, BENCH):
        largest = next(s for s in shapes_measured() if s["shape"] == "4x32")
        assert host.seconds(128, largest["messages"], largest["bytes"]) == pytest.approx(0.452, rel=0.04)
    assert fitted.message_core_s == pytest.approx(0.091e-3, rel=0.05)


def test_fit_needs_a_shape_of_more_ranks_than_cores():
    with pytest.raises(ValueError, match="more ranks than the 128 cores"):
        fit_host_cpu(shapes_measured(), 128)


# --- in the model's predictions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("host", [BENCH, None], ids=["bench", "shipped"])
def test_hier_dps_intra_dc_phase_at_4x32_on_2_cores_is_the_benchs(host):
    """128 ranks on 2 cores, every DC's all-to-all and all-gather at once: the phase the bench measured apart at
    0.452 s. Without the bound the model says 0.108 s (the network's time alone); this fails then."""
    calibration = with_host(host) if host else shipped()
    assert intra(128, calibration).comm_intra_s == pytest.approx(0.452, rel=0.15)


def test_the_shipped_reference_calibrations_carry_the_measured_constants():
    for path, calibration in reference_calibrations():
        host = calibration.host_cpu_term()
        assert host is not None, path
        assert host.cores == calibration.source["host_cpus"] == 2
        assert host.source["command"].startswith("bench/message_cost.py")
        assert {s["shape"]: s["phase_s"] for s in host.shapes} == MEASURED
        assert host == fit_host_cpu(host.shapes, host.cores, host.source)  # the field is the fit of its shapes


@pytest.mark.parametrize("ranks,network_larger", [(8, True), (32, False), (64, False), (128, False)])
def test_the_larger_of_network_and_cpu_counts_and_the_explanation_says_which(ranks, network_larger):
    """At 8 ranks (4x2) the simulated network time (0.0119 s) is larger than the CPU bound (0.004 s: the training
    run measured 0.0036 s) and stands; from 32 ranks the CPU's is larger. The step grows by what the phase does."""
    without, bound = intra(ranks, with_host(None)), intra(ranks, shipped())
    if network_larger:
        assert bound.comm_intra_s == without.comm_intra_s == pytest.approx(0.0119, rel=0.05)
        assert "the network's is the larger" in bound.explain
    else:
        assert bound.comm_intra_s > without.comm_intra_s
        assert "the CPU's is the larger" in bound.explain
    assert bound.step_s - without.step_s == pytest.approx(bound.comm_intra_s - without.comm_intra_s)
    assert bound.comm_inter_s == pytest.approx(without.comm_inter_s)


@pytest.mark.parametrize("why,calibration", [
    ("every rank has a core", with_host(dataclasses.replace(BENCH, cores=128), host_cpus=128)),
    ("another host: the calibration's machine has 16 cores", with_host(BENCH, host_cpus=16)),
    ("no measurement", with_host(None)),
])
def test_no_bound_where_it_does_not_apply(why, calibration):
    plain = Calibration(shipped().transport, shipped().compute)
    for strategy in ("hier-dp", "hier-dp-overlap", "flat-dp"):
        assert intra(128, calibration, strategy) == intra(128, plain, strategy), why


def test_flat_dp_is_untouched_and_hier_dp_overlap_is_bound_too():
    assert intra(128, shipped(), "flat-dp") == intra(128, with_host(None), "flat-dp")
    assert intra(128, shipped(), "hier-dp-overlap").step_s > intra(128, with_host(None), "hier-dp-overlap").step_s


# --- the calibration field ---------------------------------------------------------------------------------------

def test_a_calibration_without_the_field_loads_and_one_with_it_round_trips(tmp_path):
    data = json.loads(next(REFERENCE_DIR.glob("*.json")).read_text())
    older = dict(data)
    del older["host_cpu"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    loaded = load_calibration(tmp_path / "old.json")
    assert loaded.host_cpu is None and loaded.host_cpu_term() is None
    assert "host_cpu" not in loaded.to_dict()
    saved = Calibration(Transport(), host_cpu=BENCH).save(tmp_path / "new.json")
    assert load_calibration(saved).host_cpu == BENCH


def test_a_malformed_field_is_refused_with_its_name(tmp_path):
    from testbed.model.calibration import CalibrationError

    data = json.loads(next(REFERENCE_DIR.glob("*.json")).read_text())
    data["host_cpu"] = {"cores": 2}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="host_cpu"):
        load_calibration(tmp_path / "bad.json")
