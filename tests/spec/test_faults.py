"""The faults: timeline without root: what each kind takes, when each action falls due, what a link fault does
to a direction's parameters, and a good file with every kind loading."""

from __future__ import annotations

import pytest

from testbed.plan.faults import FaultAction, due, fault_seed, impaired, link_keys, longest_partition, schedule
from testbed.spec.errors import SpecError
from testbed.spec.experiment import load_experiment
from testbed.spec.faults import Fault, parse_at
from testbed.spec.link import LinkParams
from tests.support.malformed import text

EVERY_KIND = """faults:
  - {kind: partition, between: [east, west], at: step 2, duration: 3s}
  - {kind: flap, between: [east, west], at: 4s, duration: 2.5s, period: 1s, down: 200ms}
  - {kind: loss-burst, between: [west, east], at: step 3, duration: 1s, loss: 20%}
  - {kind: bandwidth, between: [east, west], at: 8s, duration: 2s, bandwidth: 10mbit}
  - {kind: latency, between: [east, west], at: 8s, duration: 2s, latency: 80ms, jitter: 5ms}
  - {kind: kill, rank: 3, at: step 3}
  - {kind: straggler, rank: 2, at: step 1, duration: 5s, slowdown: 3}
  - {kind: sdc, rank: 1, at: step 2, target: gradient, bit: 30}
"""


def test_a_file_with_every_kind_loads_with_units_parsed(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text(text("[flat-dp]", extra=EVERY_KIND))
    experiment, _ = load_experiment(path)
    kinds = [f.kind for f in experiment.faults]
    assert kinds == ["partition", "flap", "loss-burst", "bandwidth", "latency", "kill", "straggler", "sdc"]
    partition, flap, burst, rate, latency = experiment.faults[:5]
    assert partition.at.step == 2 and partition.duration == 3.0
    assert flap.at.seconds == 4.0 and flap.down == pytest.approx(0.2)
    assert burst.loss == pytest.approx(0.2) and rate.bandwidth == 10e6
    assert latency.latency == pytest.approx(0.08) and latency.jitter == pytest.approx(0.005)


@pytest.mark.parametrize(("written", "step", "seconds"), [
    ("step 0", 0, None), ("step 12", 12, None), ("  step 3 ", 3, None), ("4s", None, 4.0), ("250ms", None, 0.25),
    ("2s", None, 2.0), ("0.5s", None, 0.5), (0, None, 0.0)])
def test_at_is_a_step_or_a_time(written, step, seconds):
    at = parse_at(written)
    assert (at.step, at.seconds) == (step, seconds)


@pytest.mark.parametrize("written", ["step", "step -1", "step 1.5", "later", "-2s", "step five", 2, "5m"])
def test_at_refuses_what_is_neither(written):
    with pytest.raises(ValueError):
        parse_at(written)


def test_a_partition_is_applied_then_cleared_after_its_duration():
    fault = Fault(kind="partition", between=("east", "west"), at="step 5", duration="3s")
    assert schedule([fault]) == [FaultAction(0, "apply", 5, 0.0), FaultAction(0, "clear", 5, 3.0)]


def test_a_flap_is_one_down_window_per_period_cut_at_its_duration():
    fault = Fault(kind="flap", between=("east", "west"), at="4s", duration="2.5s", period="1s", down="600ms")
    windows = [(a.action, a.window, round(a.offset_s, 6)) for a in schedule([fault])]
    assert windows == [("apply", 0, 4.0), ("clear", 0, 4.6), ("apply", 1, 5.0), ("clear", 1, 5.6),
                       ("apply", 2, 6.0), ("clear", 2, 6.5)]
    assert all(a.step is None for a in schedule([fault]))


def test_a_dcs_kill_with_restart_after_loads_beside_strategies_that_restart_from_checkpoints(tmp_path):
    """One file compares torchft's groups, which ride out a DC's death and take it back after restart_after, with
    built-in strategies, whose job the death ends and `restarts:` starts again from the last checkpoint (the
    runner leaves restart_after to torchft's cells: tests/runner/test_faults_run.py)."""
    path = tmp_path / "dc-death.yaml"
    path.write_text(text("[flat-dp, {name: ft, strategy: torchft-ddp}, {name: d, strategy: diloco, options: "
                         "{inner_steps: 2}}, {name: ftd, strategy: torchft-diloco, options: {inner_steps: 2}}]",
                         workload="{steps: 8, warmup_steps: 1}",
                         extra="restarts: 1\ncheckpoint_every: 2\nfaults:\n"
                               "  - {kind: kill, dc: west, at: step 4, restart_after: 2s}\n"))
    experiment, _ = load_experiment(path)
    (kill,) = experiment.faults
    assert kill.restart_after == 2.0 and experiment.restarts == 1


def test_a_kill_is_never_cleared_and_sdc_is_the_workloads():
    kill = Fault(kind="kill", rank=3, at="step 6")
    sdc = Fault(kind="sdc", rank=1, at="step 8", target="parameter", bit=30)
    assert schedule([kill, sdc]) == [FaultAction(0, "apply", 6, 0.0)]


def test_a_dcs_kill_with_restart_after_is_cleared_by_starting_its_ranks_again_that_long_after():
    kill = Fault(kind="kill", dc="west", at="step 4", restart_after="2.5s")
    assert schedule([kill]) == [FaultAction(0, "apply", 4, 0.0), FaultAction(0, "clear", 4, 2.5)]
    assert kill.target_name() == "dc west"
    with pytest.raises(ValueError, match="restart_after: must be longer than 0"):
        Fault(kind="kill", dc="west", at="1s", restart_after="0s")
    with pytest.raises(ValueError, match="a rank or a DC"):
        Fault(kind="kill", at="1s")


def test_schedule_orders_clears_before_applies_at_the_same_moment():
    a = Fault(kind="latency", between=("east", "west"), at="1s", duration="1s", latency="50ms")
    b = Fault(kind="loss-burst", between=("east", "west"), at="2s", duration="1s", loss="5%")
    assert [(x.fault, x.action, x.offset_s) for x in schedule([b, a])] == [
        (1, "apply", 1.0), (1, "clear", 2.0), (0, "apply", 2.0), (0, "clear", 3.0)]


def test_due_waits_for_its_anchor():
    on_step, on_time = FaultAction(0, "apply", 3, 0.5), FaultAction(1, "apply", None, 2.0)
    assert due(on_step, {0: 100.0, 1: 101.0}, 100.0) is None
    assert due(on_step, {3: 105.0}, 100.0) == 105.5
    assert due(on_time, {}, None) is None and due(on_time, {}, 100.0) == 102.0


def test_what_each_link_fault_does_to_a_direction():
    base = LinkParams(latency=0.01, bandwidth=1e9, jitter=0.001, loss=0.0)
    between = ("east", "west")
    cases = {
        Fault(kind="partition", between=between, at="1s", duration="1s"): LinkParams(0.01, 1e9, 0.001, 1.0),
        Fault(kind="flap", between=between, at="1s", duration="2s", period="1s", down="0.1s"):
            LinkParams(0.01, 1e9, 0.001, 1.0),
        Fault(kind="loss-burst", between=between, at="1s", duration="1s", loss="20%"): LinkParams(0.01, 1e9, 0.001, 0.2),
        Fault(kind="latency", between=between, at="1s", duration="1s", latency="80ms"): LinkParams(0.08, 1e9, 0.0, 0.0),
        Fault(kind="bandwidth", between=between, at="1s", duration="1s", bandwidth="10mbit"):
            LinkParams(0.01, 1e7, 0.001, 0.0),
    }
    for fault, expected in cases.items():
        assert impaired(base, fault) == expected, fault.kind
    with pytest.raises(ValueError):
        impaired(base, Fault(kind="kill", rank=0, at="step 1"))
    assert link_keys(Fault(kind="partition", between=between, at="1s", duration="1s")) == ["east->west", "west->east"]


def test_the_longest_dark_window_sizes_the_process_group_timeout():
    faults = [Fault(kind="partition", between=("east", "west"), at="1s", duration="3s"),
              Fault(kind="flap", between=("east", "west"), at="1s", duration="10s", period="5s", down="4s"),
              Fault(kind="latency", between=("east", "west"), at="1s", duration="60s", latency="250ms")]
    assert longest_partition(faults) == 4.0 and longest_partition([]) == 0.0


def test_fault_seeds_replay_and_differ_between_cells_and_faults():
    assert fault_seed(1, "flat-dp__r0", 0) == fault_seed(1, "flat-dp__r0", 0)
    seeds = {fault_seed(1, "flat-dp__r0", 0), fault_seed(1, "flat-dp__r0", 1), fault_seed(1, "hier-dp__r0", 0),
             fault_seed(2, "flat-dp__r0", 0)}
    assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)


def test_a_bad_fault_is_one_line_naming_its_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(text("[flat-dp]", extra="faults: [{kind: straggler, rank: 1, at: step 1, duration: 1s}]\n"))
    with pytest.raises(SpecError) as caught:
        load_experiment(path)
    assert str(caught.value) == f"{path}: faults[0].slowdown: straggler needs slowdown"


def test_stall_is_the_excess_of_the_slow_steps_and_the_ratio_what_was_productive():
    import pandas as pd

    from testbed.collect.frames import stall_figures

    calm = stall_figures(pd.Series([0.1, 0.1, 0.12, 0.1, 0.11]))
    assert calm["stall_s"] == 0.0 and calm["effective_time_ratio"] == pytest.approx(0.5 / 0.53)
    stalled = stall_figures(pd.Series([0.1, 0.1, 3.1, 0.1, 0.1]))
    assert stalled["stall_s"] == pytest.approx(3.0) and stalled["effective_time_ratio"] == pytest.approx(0.5 / 3.5)
    # a DiLoCo with H = 4: every fourth step an outer sync of 1 s, one of them stalled 3 s more
    walls = pd.Series([0.1, 0.1, 0.1, 1.0] * 3 + [0.1, 0.1, 0.1, 4.0], index=range(16))
    diloco = stall_figures(walls, period=4)
    assert diloco["stall_s"] == pytest.approx(3.0)
    assert diloco["effective_time_ratio"] == pytest.approx((12 * 0.1 + 4 * 1.0) / float(walls.sum()))
    assert stall_figures(walls)["stall_s"] == pytest.approx(3 * 0.9 + 3.9)  # against one median: every sync "stalled"


def test_fault_figures_count_applied_windows_and_the_latest():
    from testbed.collect.frames import fault_figures

    result = {"faults": {"faults": [{"scheduled_at": 1.0, "applied_at": 1.02}, {"scheduled_at": 2.0, "applied_at": 2.1},
                                    {"scheduled_at": None, "applied_at": None}]}}
    figures = fault_figures(result)
    assert figures["faults_applied"] == 2 and figures["fault_late_max_ms"] == pytest.approx(100.0)
    assert fault_figures({}) == {}


def test_the_report_lists_fault_windows_and_sdc_and_shades_the_windows(tmp_path):
    import pandas as pd

    from testbed.collect.faults import fault_windows, sdc_table, timeline_plot
    from testbed.collect.report import _plt

    result = {"cell": {"id": "flat-dp__r0"},
              "faults": {"clock_zero": 100.0, "faults": [
                  {"kind": "partition", "target": "east<->west", "at": "step 2", "scheduled_at": 0.5,
                   "applied_at": 0.52, "clear_scheduled_at": 2.5, "cleared_at": 2.53},
                  {"kind": "kill", "target": "rank 1", "at": "step 5", "scheduled_at": 4.0, "applied_at": 4.01,
                   "clear_scheduled_at": None, "cleared_at": None}]},
              "sdc": [{"rank": 1, "step": 3, "target": "gradient", "detected_by": "grad-norm",
                       "classification": "transient"}]}
    windows = fault_windows([result, {"cell": {"id": "calm"}}])
    assert windows["kind"].tolist() == ["partition", "kill"]
    assert windows["apply_late_ms"].tolist() == pytest.approx([20.0, 10.0])
    assert sdc_table([result])[["cell", "rank", "classification"]].values.tolist() == [["flat-dp__r0", 1, "transient"]]
    steps = pd.DataFrame([{"cell": "flat-dp__r0", "step": s, "rank": 0, "time": 100.0 + 0.5 * (s + 1),
                           "wall_s": 0.5, "tokens": 1000} for s in range(8)])
    (tmp_path / "plots").mkdir()
    made = timeline_plot(tmp_path, [result], steps, _plt())
    assert made == [("plots/faults.png", "throughput of each step with the fault windows shaded")]
    assert (tmp_path / "plots" / "faults.png").stat().st_size > 1000
    assert timeline_plot(tmp_path, [{"cell": {"id": "calm"}}], steps, _plt()) == []
    # torchft's cells: the groups in each step's quorum beside (2 of 3 while one DC was down; 0: no quorum yet)
    steps["participants"] = [0, 3, 3, 2, 2, 3, 3, 3]
    made = timeline_plot(tmp_path, [result], steps, _plt())
    assert made == [("plots/faults.png", "throughput of each step with the fault windows shaded and the groups in "
                                         "each step's quorum")]
    # replicas apart: each group's own quorums, one line per group (north alone in quorums of 1)
    north = steps.assign(rank=1, dc=1, participants=[0, 3, 3, 1, 1, 1, 1, 1])
    split = {**result, "replica_groups": {"group_names": ["east", "north"]}}
    made = timeline_plot(tmp_path, [split], pd.concat([steps.assign(dc=0), north]), _plt())
    assert made and (tmp_path / "plots" / "faults.png").stat().st_size > 1000


def test_the_timeline_under_torchft_follows_one_survivors_steps_in_time_order():
    """A restarted group counts its steps again from its heal: grouped by step number with the survivors', its
    later records pulled their points forward in time and the line went back and forth (the dc-death gallery's
    first plot). Under torchft the line is the survivor's own steps, its tokens times the groups in its quorum."""
    import pandas as pd

    from testbed.collect.faults import _throughput

    survivor = [{"rank": 0, "step": s, "time": 10.0 + s, "wall_s": 1.0, "tokens": 100, "participants": p}
                for s, p in enumerate([3, 3, 2, 2, 3])]
    restarted = [{"rank": 2, "step": s, "time": 13.5 + s, "wall_s": 1.0, "tokens": 100, "participants": 3}
                 for s in (1, 2)]  # healed at the survivor's step 3, counting again from its own step 1
    steps = pd.DataFrame(survivor + restarted + [{**r, "rank": 1} for r in survivor])
    line = _throughput(steps, {"replica_groups": {"replica_groups": 3}})
    assert line["end"].tolist() == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert line["tokens"].tolist() == [300, 300, 200, 200, 300]
    flat = _throughput(steps.drop(columns="participants"), {})
    assert flat["end"].is_monotonic_increasing


def test_result_sdc_joins_injections_with_their_detections_and_keeps_false_alarms(tmp_path):
    import json

    from testbed.runner.sdc import sdc_record

    lines = {0: [{"event": "step", "step": 2, "sdc_check_s": 0.01},  # a step record also names sdc_check_s
                 {"event": "sdc_detected", "rank": 2, "step": 7, "target": "parameter", "detected_by": "param-checksum",
                  "classification": "transient"},
                 {"event": "sdc_detected", "rank": 0, "step": 9, "target": "gradient", "detected_by": "grad-norm",
                  "classification": "reproduced"}],
             1: [{"event": "sdc_injected", "rank": 1, "step": 2, "target": "gradient", "tensor": "w", "index": 3, "bit": 30},
                 {"event": "sdc_detected", "rank": 1, "step": 2, "target": "gradient", "detected_by": "grad-norm",
                  "classification": "transient"}],
             2: [{"event": "sdc_injected", "rank": 2, "step": 7, "target": "parameter", "tensor": "v", "index": 0, "bit": 27},
                 {"event": "sdc_injected", "rank": 2, "step": 8, "target": "gradient", "tensor": "v", "index": 0, "bit": 1}]}
    for rank, records in lines.items():
        (tmp_path / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    got = [(r["rank"], r["step"], r["target"], r["detected_by"], r["classification"]) for r in sdc_record(tmp_path)]
    assert got == [(1, 2, "gradient", "grad-norm", "transient"), (2, 7, "parameter", "param-checksum", "transient"),
                   (2, 8, "gradient", None, "missed"), (0, 9, None, "grad-norm", "reproduced")]
