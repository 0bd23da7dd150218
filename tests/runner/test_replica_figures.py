"""Whether torchft's replica groups ended equal (testbed.runner.replicas.replica_figures' params_agree and
groups_apart, summary.csv's replicas_apart), from rank files as the workload writes them. No root."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.collect.frames import replica_columns
from testbed.runner.replicas import replica_figures

NAMES = ["east", "west", "north"]


def write_ranks(metrics: Path, digests: list[str | None], participants: list[list[int]],
                per_group: int = 1) -> None:
    metrics.mkdir(parents=True, exist_ok=True)
    for rank, (digest, quorums) in enumerate(zip(digests, participants)):
        records = [{"event": "start", "rank": rank, "time": 0.0, "replica_group": rank // per_group}]
        records += [{"event": "step", "step": i, "rank": rank, "time": 1.0 + i, "wall_s": 1.0, "participants": n}
                    for i, n in enumerate(quorums)]
        if digest is not None:
            records.append({"event": "end", "rank": rank, "step": len(quorums), "params_sha256": digest, "time": 99.0})
        (metrics / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_group_that_trained_alone_ends_apart_and_is_named(tmp_path):
    write_ranks(tmp_path, ["aa", "aa", "bb"], [[3, 3, 2, 2], [3, 3, 2, 2], [3, 3, 1, 1]])
    figures = replica_figures(tmp_path, 3, [], NAMES)
    assert figures["params_agree"] is False and figures["groups_apart"] == ["north"]
    assert figures["participants_min_by_group"] == {"east": 2, "west": 2, "north": 1}
    assert figures["steps_after_others_ended"] == {}  # every group ended at once
    assert replica_columns({"replica_groups": figures}) == {"quorum_min": 1, "degraded_steps": 2, "replicas_apart": 1}


def test_equal_replicas_agree_and_a_missing_digest_says_nothing(tmp_path):
    write_ranks(tmp_path / "a", ["aa"] * 3, [[3, 3, 3]] * 3)
    figures = replica_figures(tmp_path / "a", 3, [], NAMES)
    assert figures["params_agree"] is True and figures["groups_apart"] == []
    assert replica_columns({"replica_groups": figures})["replicas_apart"] == 0
    write_ranks(tmp_path / "b", ["aa", "aa", None], [[3, 3, 3]] * 3)  # north died before its end
    figures = replica_figures(tmp_path / "b", 3, [], NAMES)
    assert figures["params_agree"] is None and figures["groups_apart"] == []
    assert replica_columns({"replica_groups": figures})["replicas_apart"] is None


def test_two_groups_apart_with_no_majority_are_both_apart(tmp_path):
    write_ranks(tmp_path, ["aa", "bb"], [[2, 1], [2, 1]])
    figures = replica_figures(tmp_path, 2, [], NAMES[:2])
    assert figures["params_agree"] is False and figures["groups_apart"] == ["east", "west"]


def test_a_group_back_after_the_others_ended_counts_the_steps_it_took_alone(tmp_path):
    write_ranks(tmp_path, ["aa", "aa", "bb"], [[3, 2], [3, 2], [3, 1, 1, 1]])
    north = (tmp_path / "rank2.jsonl").read_text().splitlines()
    late = [line.replace('"time": 99.0', '"time": 199.0') if '"end"' in line else line for line in north]
    for i, line in enumerate(late):  # its last three steps after the others' end (99 s)
        if '"step", "step": ' in line and i > 1:
            late[i] = line.replace(f'"time": {float(i)}', f'"time": {100.0 + i}')
    (tmp_path / "rank2.jsonl").write_text("\n".join(late) + "\n")
    figures = replica_figures(tmp_path, 3, [], NAMES)
    assert figures["groups_apart"] == ["north"] and figures["steps_after_others_ended"] == {"north": 3}


def test_groups_of_several_ranks_are_named_once_each_in_their_order(tmp_path):
    """The timeline names each group's line by its index in group_names: one name per group, not per rank."""
    write_ranks(tmp_path, ["aa"] * 4, [[2, 2]] * 4, per_group=2)
    figures = replica_figures(tmp_path, 4, [], NAMES[:2])
    assert figures["group_names"] == ["east", "west"] and figures["params_agree"] is True
    assert figures["participants_min_by_group"] == {"east": 2, "west": 2}
