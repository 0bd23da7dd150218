"""Checkpoints and restarts on loopback (real ranks, real compute): a run stopped after step 3 and started again
goes on from its checkpoint and ends with the very parameters of a run that never stopped (samples are a pure
function of seed, step and index; the optimizer's state travels with the weights)."""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from testbed.workload.options import Options

from .test_strategies import run

BASE = Options(steps=6, micro_batch=2, micro_batches=1, seed=3, optimizer="adamw", strategy="hier-dp")


def test_a_restart_from_the_checkpoint_ends_where_an_uninterrupted_run_ends(tmp_path):
    whole = run(tmp_path / "whole", 2, 2, {"run": BASE})["run"]
    env = {"TESTBED_CHECKPOINT_DIR": str(tmp_path / "checkpoint"), "TESTBED_CHECKPOINT_EVERY": "2"}
    run(tmp_path / "first", 2, 2, {"run": replace(BASE, steps=4)}, env=env)  # checkpoints after steps 1 and 3
    saved = torch.load(tmp_path / "checkpoint" / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 3 and set(saved["state"]) == {"params", "optimizer"}
    resumed = run(tmp_path / "again", 2, 2, {"run": BASE}, env=env)["run"]
    for rank in range(4):
        assert [r["step"] for r in resumed[rank]["records"]] == [4, 5]
        for name, value in whole[rank]["params"].items():
            assert torch.equal(resumed[rank]["params"][name], value), (rank, name)
    lines = [json.loads(line) for line in (tmp_path / "again" / "run" / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["resumed_after_step"] == 3
    assert [e["step"] for e in lines if e["event"] == "checkpoint"] == [5]  # rank 0 writes, after every 2nd step
    assert not list((tmp_path / "checkpoint").glob("*.tmp*"))
