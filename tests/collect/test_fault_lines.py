"""The Reading's line on each cell that met faults (testbed.collect.faults.fault_lines), from result records as a
run writes them: a restart, the slow steps, the bit flips caught and missed; nothing for a quiet cell. No root."""

from __future__ import annotations

import pandas as pd

from testbed.collect.faults import fault_lines


def result(cell: str, **fields) -> dict:
    return {"cell": {"id": cell}, "faults": {"faults": fields.pop("faults", [])}, **fields}


def test_a_restart_a_straggler_and_flips_each_read_in_one_line_per_cell():
    results = [
        result("flat-dp__r0", faults=[{"kind": "kill", "applied_at": 3.0}],
               restarts=[{"reason": "rank 3 on west-1 died (signal 9)", "resumed_after_step": 7, "steps_lost": 1,
                          "lost_s": 0.43, "recovery_s": 1.0}]),
        result("slow__r0", faults=[{"kind": "straggler", "applied_at": 2.0}]),
        result("sdc__r0", sdc=[
            {"rank": 1, "step": 3, "target": "gradient", "detected_by": "grad-checksum", "classification": "transient"},
            {"rank": 3, "step": 7, "target": "gradient", "detected_by": None, "classification": "missed"},
            {"rank": 0, "step": 9, "target": None, "detected_by": "grad-norm", "classification": "reproduced"}]),
        result("quiet__r0"),
    ]
    summary = pd.DataFrame([{"cell": "flat-dp__r0", "stall_s": 0.0, "effective_time_ratio": 0.64},
                            {"cell": "slow__r0", "stall_s": 0.46, "effective_time_ratio": 0.86},
                            {"cell": "sdc__r0", "stall_s": 0.0, "effective_time_ratio": 0.99},
                            {"cell": "quiet__r0", "stall_s": 0.0, "effective_time_ratio": 1.0}])
    assert fault_lines(results, summary) == [
        "Cell `flat-dp__r0`: rank 3 on west-1 died (signal 9); every rank started again 1.0 s later from the "
        "checkpoint after step 7, 1 step(s) done again (0.4 s of work); no step took twice the median, effective "
        "time ratio 64%.",
        "Cell `slow__r0`: the slow steps took 0.46 s beyond the median step, effective time ratio 86%.",
        "Cell `sdc__r0`: 1 of 2 bit flips caught (rank 1 step 3 by grad-checksum), missed: rank 3 step 7; 1 "
        "detection(s) where no bit was flipped (false positives)."]


def test_a_restart_with_no_checkpoint_starts_over():
    restart = {"reason": "rank 3 died", "resumed_after_step": None, "steps_lost": 9, "lost_s": 2.3, "recovery_s": None}
    (line,) = fault_lines([result("a", restarts=[restart])], pd.DataFrame([{"cell": "a", "stall_s": float("nan")}]))
    assert line == "Cell `a`: rank 3 died; every rank started again from step 0 (no checkpoint), 9 step(s) done " \
                   "again (2.3 s of work)."


def test_replicas_that_ended_apart_are_read_out_and_a_healed_partition_says_the_replicas_agree():
    split = {"replica_groups": 3, "participants_min": 1, "degraded_steps": 49, "params_agree": False,
             "groups_apart": ["north"], "participants_min_by_group": {"east": 2, "west": 2, "north": 1},
             "steps_after_others_ended": {"north": 50}}
    healed = {**split, "participants_min": 2, "params_agree": True, "groups_apart": [],
              "participants_min_by_group": {"east": 2, "west": 2, "north": 3}, "steps_after_others_ended": {}}
    whole = {**healed, "participants_min": 3, "degraded_steps": 0}
    pair = {"replica_groups": 2, "participants_min": 1, "degraded_steps": 169, "params_agree": False,
            "groups_apart": ["east", "west"], "steps_after_others_ended": {"west": 170}}
    lines = fault_lines([result("min1", replica_groups=split), result("majority", replica_groups=healed),
                         result("whole", replica_groups=whole), result("pair", replica_groups=pair)], pd.DataFrame())
    assert lines == [
        "Cell `min1`: the quorum fell to 1 of 3 replica groups for 49 step(s); **the replicas ended apart**: north "
        "did not end with the parameters the others hold; north took 50 step(s) after every other group had ended, "
        "in quorums of its own (not one model: a majority's min_replicas makes a group wait for the others "
        "instead).",
        "Cell `majority`: the quorum fell to 2 of 3 replica groups for 49 step(s); every group ended with the same "
        "parameters.",
        "Cell `pair`: the quorum fell to 1 of 2 replica groups for 169 step(s); **the replicas ended apart**: no two "
        "of east, west ended with the same parameters; west took 170 step(s) after every other group had ended, in "
        "quorums of its own (not one model: a majority's min_replicas makes a group wait for the others instead)."]


def test_a_strategy_whose_replicas_ended_apart_is_never_the_fastest():
    from testbed.collect.report import reading

    agg = pd.DataFrame([{"strategy": "min1", "baseline": "False", "tokens_per_s": 14000.0, "replicas_apart": 2},
                        {"strategy": "majority", "baseline": "False", "tokens_per_s": 7000.0, "replicas_apart": 0}])
    summary = pd.DataFrame([{"cell": f"{s}__r0", "strategy": s, "status": "ok"} for s in ("min1", "majority")])
    first = reading(summary, agg)[0]
    assert first == ("Across the strategies: fastest is **majority** at 7,000 tokens/s; min1 14,000 (100% faster, but "
                     "its replicas ended apart: no one model).")
    agg["replicas_apart"] = 0
    assert reading(summary, agg)[0].startswith("Across the strategies: fastest is **min1**")


def test_a_heal_reads_measured_against_predicted_part_by_part():
    heal = {"rank": 1, "group": "west", "heal_s": 2.61, "healed_bytes": 4.74e6, "healed_from_dc": "east",
            "setup_s": 1.0, "before_quorum_s": 0.41, "quorum_wait_s": 0.3, "reconfigure_s": 0.2, "fetch_s": 0.52,
            "rest_s": 0.18, "heal_predicted_s": 2.55,
            "heal_predicted": {"setup_s": 1.0, "before_quorum_s": 0.4, "quorum_wait_s": 0.31, "reconfigure_s": 0.19,
                               "fetch_s": 0.64, "rest_s": 0.2,
                                                         "quorum_wait_range_s": [0.01, 0.61]}}
    unpredicted = {"rank": 2, "group": "north", "heal_s": 0.7, "healed_bytes": 0}
    figures = {"replica_groups": 3, "participants_min": 2, "degraded_steps": 4, "params_agree": True,
               "heals": [heal, unpredicted, {"rank": 0, "heal_s": None}]}
    (line,) = fault_lines([result("kill", replica_groups=figures)], pd.DataFrame())
    assert line == (
        "Cell `kill`: the quorum fell to 2 of 3 replica groups for 4 step(s); every group ended with the same "
        "parameters; west healed in 2.61 s, 4.7 MB from east (predicted 2.55 s, measured/predicted s: setup "
        "1.00/1.00, own steps 0.41/0.40, quorum 0.30/0.31, process group 0.20/0.19, fetch 0.52/0.64, rest 0.18/0.20; the quorum's wait can "
        "fall from 0.01 to 0.61 s); north healed in 0.70 s.")
