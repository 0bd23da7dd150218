"""Checkpoints and restarts on loopback (real ranks, real compute): a run stopped after a checkpoint and started
again goes on from it and ends with the very parameters of a run that never stopped (samples are a pure function
of seed, step and index; the optimizer's state travels with the weights). Rank 0 writes the world's checkpoint
where every replica holds the whole state (ddp here; flat-dp and hier-dp alike); every rank writes its own where
they differ (FSDP2's shards, a pipeline's stages, DiLoCo's DCs), and a restart takes the last step all of them wrote."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from testbed.workload.checkpoint import Checkpointing
from testbed.workload.options import Options

from .test_strategies import run

BASE = Options(steps=6, micro_batch=2, micro_batches=1, seed=3, optimizer="adamw")
CASES = {  # strategy: (options, DCs, ranks per DC, checkpoint every, steps of the first run, per rank)
    # DDP sums its first step's buckets in the order parameters were registered and later ones in the order their
    # gradients came (it rebuilds them after step 0): a resumed DDP's first step sums in gloo's ring chunks laid out
    # otherwise, so its weights match to rounding (1e-5, where two steps of AdamW at lr 3e-3 move them ~6e-3)
    "ddp": (replace(BASE, strategy="ddp"), 2, 1, 2, 4, False),
    # FSDP2: each rank its own shards (fsdp: half of every parameter on each of the 2 ranks; hsdp on 2 DCs x 1: a
    # whole replica per DC), and the optimizer's state sharded alike
    "fsdp": (replace(BASE, strategy="fsdp"), 2, 1, 2, 4, True),
    "hsdp": (replace(BASE, strategy="hsdp"), 2, 1, 2, 4, True),
    "pp": (replace(BASE, strategy="pp", micro_batches=2), 2, 1, 2, 4, True),
    "diloco": (replace(BASE, strategy="diloco", inner_steps=2), 2, 1, 2, 4, True),
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """Every case run without a stop, in one launch (all on 2 DCs x 1 rank)."""
    assert {(dcs, nodes) for _, dcs, nodes, *_ in CASES.values()} == {(2, 1)}
    return run(tmp_path_factory.mktemp("whole"), 2, 1, {name: case[0] for name, case in CASES.items()})


@pytest.mark.parametrize("strategy", list(CASES))
def test_a_restart_from_the_checkpoint_ends_where_an_uninterrupted_run_ends(tmp_path, strategy, uninterrupted):
    options, dcs, nodes, every, first, per_rank = CASES[strategy]
    world = dcs * nodes
    whole = uninterrupted[strategy]
    env = {"TESTBED_CHECKPOINT_DIR": str(tmp_path / "checkpoint"), "TESTBED_CHECKPOINT_EVERY": str(every)}
    run(tmp_path / "first", dcs, nodes, {"run": replace(options, steps=first)}, env=env)  # after steps 1 and 3
    saved = Checkpointing(tmp_path / "checkpoint", every)
    for rank in range(world if per_rank else 1):
        step, state = saved.load(rank if per_rank else None, world)
        assert step == first - 1 and {"params", "optimizer"} <= set(state), (rank, step, set(state))
    resumed = run(tmp_path / "again", dcs, nodes, {"run": options}, env=env)["run"]
    for rank in range(world):
        assert [r["step"] for r in resumed[rank]["records"]] == list(range(first, options.steps))
        for name, value in whole[rank]["params"].items():
            again = resumed[rank]["params"][name]
            same = torch.allclose(again, value, rtol=1e-4, atol=1e-5) if strategy == "ddp" else torch.equal(again, value)
            assert same, (rank, name, float((again - value).abs().max()))
    lines = [json.loads(line) for line in (tmp_path / "again" / "run" / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["resumed_after_step"] == first - 1
    assert [e["step"] for e in lines if e["event"] == "checkpoint"] == [5]  # after every 2nd step
    assert not list((tmp_path / "checkpoint").rglob("*.tmp*"))


def test_a_rank_checkpoint_counts_only_once_every_rank_wrote_its_step(tmp_path):
    """A rank killed before writing step 5 leaves step 3 the last complete set; each rank keeps its last two."""
    saved = Checkpointing(tmp_path, 2)
    for step in (1, 3, 5):
        for rank in range(3):
            if (step, rank) != (5, 2):
                saved.save(step, {"rank": rank, "step": step}, rank)
    assert saved.load(0, 3) == (3, {"rank": 0, "step": 3}) and saved.load(2, 3) == (3, {"rank": 2, "step": 3})
    assert not (tmp_path / "ranks" / "step1" / "rank0.pt").exists()  # older than its last two
    assert (tmp_path / "ranks" / "step1" / "rank2.pt").exists()  # rank 2 wrote only up to step 3
    saved.save(5, {"rank": 2, "step": 5}, 2)
    assert saved.load(1, 3) == (5, {"rank": 1, "step": 5})
    assert Checkpointing(tmp_path / "none", 2).load(0, 3) is None
