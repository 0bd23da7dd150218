"""Checkpoints and restarts on loopback (real ranks, real compute): a run stopped after a checkpoint and started
again goes on from it and ends with the very parameters of a run that never stopped (samples are a pure function
of seed, step and index; the optimizer's state travels with the weights). Rank 0 writes the world's checkpoint
where every replica holds the whole state (ddp here; flat-dp and hier-dp alike); every rank writes its own where
they differ (FSDP2's shards, a pipeline's stages, DiLoCo's DCs), and a restart takes the last step all of them wrote.
streaming-diloco and async-diloco also save the syncs in flight (drained at the checkpoint's step) and apply them
after a restart where they would have been applied."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from testbed.workload import data
from testbed.workload.checkpoint import RANKS, Checkpointing
from testbed.workload.comm import Comm
from testbed.workload.groups import Groups
from testbed.workload.layout import Layout
from testbed.workload.metrics import Meter
from testbed.workload.model import PRESETS
from testbed.workload.options import Options
from testbed.workload.strategies import make_strategy
from testbed.workload.strategies.base import Context, Strategy
from testbed.workload.strategies.diloco import AsyncDiLoCo
from tests.workload.test_strategies import run

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
    # H = 4, fragment 1 synced at steps 1 and 5, fragment 0 at 3 and 7, each applied 3 steps later: at the
    # checkpoint after step 3 both are in flight (fragment 1's to be applied at 4, fragment 0's at 6)
    "streaming-diloco": (replace(BASE, strategy="streaming-diloco", steps=8, inner_steps=4, fragments=2,
                                 overlap_steps=3), 2, 1, 4, 4, True),
    # max_staleness 1: a sync is applied the step after it started, whenever it arrives (so the run is
    # deterministic); the one started at step 3 is in flight at the checkpoint
    "async-diloco": (replace(BASE, strategy="async-diloco", inner_steps=2, max_staleness=1), 2, 1, 2, 4, True),
}
IN_FLIGHT = {"streaming-diloco": [(1, 1), (0, 3)], "async-diloco": [(0, 3)]}  # (fragment, step started) saved
SETTLES_AT_THE_END = ("streaming-diloco", "async-diloco")  # whose last step differs (it settles every sync): a
# shorter run is no stop


def stopped_run(tmp_path: Path, strategy: str, dcs: int, nodes: int, options: Options, first: int, env: dict) -> None:
    """A run stopped after step first - 1 and its checkpoint: a run of `first` steps, or where the last step is
    not as the others, the whole run with the checkpoints after step first - 1 taken away (written per rank)."""
    if strategy not in SETTLES_AT_THE_END:
        run(tmp_path / "first", dcs, nodes, {"run": replace(options, steps=first)}, env=env)
        return
    run(tmp_path / "first", dcs, nodes, {"run": options}, env=env)
    for later in (Path(env["TESTBED_CHECKPOINT_DIR"]) / RANKS).glob("step*"):
        if int(later.name.removeprefix("step")) >= first:
            shutil.rmtree(later)


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
    stopped_run(tmp_path, strategy, dcs, nodes, options, first, env)  # after steps 1 and 3 (streaming-diloco: 3)
    saved = Checkpointing(tmp_path / "checkpoint", every)
    states = []
    for rank in range(world if per_rank else 1):
        step, state = saved.load(rank if per_rank else None, world)
        assert step == first - 1 and {"params", "optimizer"} <= set(state), (rank, step, set(state))
        states.append(state)
        if strategy in IN_FLIGHT:  # the syncs in flight at the checkpoint, with their reduced pseudo-gradients
            assert [(item["fragment"], item["started"]) for item in state["in_flight"]] == IN_FLIGHT[strategy]
    if strategy in IN_FLIGHT:  # every DC saved the same global weights and the same reduced sums
        for other in states[1:]:
            assert all(torch.equal(a, b) for a, b in zip(states[0]["global"], other["global"]))
            assert all(torch.equal(a["delta"], b["delta"]) for a, b in zip(states[0]["in_flight"], other["in_flight"]))
    resumed = run(tmp_path / "again", dcs, nodes, {"run": options}, env=env)["run"]
    for rank in range(world):
        assert [r["step"] for r in resumed[rank]["records"]] == list(range(first, options.steps))
        for name, value in whole[rank]["params"].items():
            again = resumed[rank]["params"][name]
            same = torch.allclose(again, value, rtol=1e-4, atol=1e-5) if strategy == "ddp" else torch.equal(again, value)
            assert same, (rank, name, float((again - value).abs().max()))
    lines = [json.loads(line) for line in (tmp_path / "again" / "run" / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["resumed_after_step"] == first - 1
    assert [e["step"] for e in lines if e["event"] == "checkpoint"] == [
        step for step in range(first, options.steps) if (step + 1) % every == 0]
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


def test_async_diloco_resumes_with_its_sync_in_flight_wherever_syncs_arrived(tmp_path):
    """async-diloco where a sync is applied when it arrives (H = 1, up to 3 steps late): at a checkpoint every DC
    first starts and settles every sync due, so each saves the one started at the checkpoint's step, none owed,
    and the same global weights; a restart applies that sync at its first step and finishes every step."""
    options = replace(BASE, strategy="async-diloco", steps=12, inner_steps=1, max_staleness=3)
    env = {"TESTBED_CHECKPOINT_DIR": str(tmp_path / "checkpoint"), "TESTBED_CHECKPOINT_EVERY": "4"}
    stopped_run(tmp_path, options.strategy, 2, 1, options, 8, env)  # after steps 3 and 7
    states = [Checkpointing(tmp_path / "checkpoint", 4).load(rank, 2) for rank in range(2)]
    for step, state in states:
        assert step == 7 and state["owed"] == 0, (step, state["owed"])
        assert [(item["fragment"], item["started"]) for item in state["in_flight"]] == [(0, 7)]
    (_, a), (_, b) = states
    assert all(torch.equal(x, y) for x, y in zip(a["global"], b["global"]))
    assert torch.equal(a["in_flight"][0]["delta"], b["in_flight"][0]["delta"])
    resumed = run(tmp_path / "again", 2, 1, {"run": options}, env=env)["run"]
    for rank in range(2):
        records = resumed[rank]["records"]
        assert [r["step"] for r in records] == list(range(8, 12))
        assert records[0]["outer_applied"] == 1 and records[0]["staleness"] == 1  # the saved sync, arrived
        assert sum(r["outer_started"] for r in records) == 3  # due at steps 8, 9 and 10 (not at the last)


def alone(options: Options, checkpoints: Checkpointing | None) -> Strategy:
    """A strategy on one rank in one DC, in this process (no process group: nothing has a peer)."""
    layout = Layout(rank=0, world=1, local_rank=0, dc=0, dc_sizes=(1,))
    meter = Meter(layout)
    strategy = make_strategy(options.strategy)
    strategy.setup(Context(layout, Groups(layout, None, None, None, [], [0], [0]), meter, Comm(meter),
                           PRESETS[options.preset], options, None, checkpoints=checkpoints))
    return strategy


def step(strategy: Strategy, index: int) -> dict:
    opts, cfg = strategy.ctx.opts, strategy.ctx.cfg
    micro = data.micro_batches(strategy.sample_ranges(), index, cfg.seq_len, opts.seed, opts.micro_batch,
                               torch.device("cpu"))
    return strategy.step(index, micro)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("strategy", ["streaming-diloco", "async-diloco"])
def test_what_a_diloco_checkpoint_restores_is_what_it_saved_and_goes_on_alike(tmp_path, strategy, monkeypatch):
    """In one process: a strategy restored from a checkpoint holds the state saved (syncs in flight with their
    steps, sums and snapshots; async-diloco's syncs owed) and its next steps match the original's bit for bit.
    async-diloco's syncs never arrive here before the staleness bound (as over a slow link), so syncs pile up
    owed; at a checkpoint's step (3) they are all started and settled but the last, and the state saved two steps
    later (5, no checkpoint due) has that one in flight and two owed."""
    if strategy == "streaming-diloco":
        options = replace(BASE, strategy=strategy, steps=8, inner_steps=4, fragments=2, overlap_steps=3)
        at, in_flight, owed = 3, [(1, 1), (0, 3)], None
    else:
        options = replace(BASE, strategy=strategy, steps=10, inner_steps=1, max_staleness=3)
        at, in_flight, owed = 5, [(0, 3)], 2
        monkeypatch.setattr(AsyncDiLoCo, "_arrived", lambda self: False)
    checkpoints = Checkpointing(tmp_path, 4)
    original = alone(options, checkpoints)
    for index in range(at + 1):
        record = step(original, index)
        if index == 3 and owed is not None:  # the checkpoint's step: every sync due started, the last in flight
            assert original.owed == 0 and [x[1] for x in original.in_flight] == [3], record
    checkpoints.save(at, original.checkpoint_state(), 0)
    saved_at, state = checkpoints.load(0, 1)
    assert saved_at == at and [(x["fragment"], x["started"]) for x in state["in_flight"]] == in_flight
    assert state.get("owed") == owed
    restored = alone(options, checkpoints)
    restored.restore(state)
    assert same(restored.checkpoint_state(), state)
    for index in range(at + 1, options.steps):
        assert same(step(restored, index), step(original, index)), index
    assert same(restored.named_parameters(), original.named_parameters())
    assert not same(restored.named_parameters(), alone(options, None).named_parameters())  # it did train


def test_streaming_diloco_applies_every_fragment_still_in_flight_at_its_last_step():
    """In one process, H 4, 2 fragments, overlap 3, 6 steps: fragment 0's sync starts at step 3 and fragment 1's at
    step 5, both due after the end; the last step waits for them and applies them (the run does not end with
    fragments its DCs never agreed on), as async-diloco settles its syncs at its last step."""
    options = replace(BASE, strategy="streaming-diloco", steps=6, inner_steps=4, fragments=2, overlap_steps=3)
    strategy = alone(options, None)
    for index in range(options.steps - 1):
        step(strategy, index)
    assert sorted((f, begun) for f, begun, *_ in strategy.in_flight) == [(0, 3)]
    before = [p.clone() for p in strategy.global_params]
    record = step(strategy, options.steps - 1)
    assert record["outer_fragments"] == [1] and strategy.in_flight == []
    changed = [not torch.equal(a, b) for a, b in zip(before, strategy.global_params)]
    assert all(changed[i] for frag in strategy.fragments for i in frag), changed
