"""Silent data corruption: bit flips as the hardware would make them, the checksum that any one flip changes,
the majority that names the odd replica, the gradient check and its replay, and 4 real ranks on loopback where
exponent-bit flips in a gradient and a parameter are caught at the injected rank and step and rolled back."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import pytest
import torch

from testbed.workload.options import Options
from testbed.workload.sdc import Guard, Injection, checksum, flip_bit, odd_ones, poison
from tests.workload.test_strategies import run


def sdc_events(directory, world: int) -> list[dict]:
    """Every rank's SDC lines (injected, detected, replayed) of a run's metrics under `directory`."""
    return [record for rank in range(world)
            for line in (directory / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()
            if (record := json.loads(line))["event"].startswith("sdc")]


# bit 30 of a gradient element on rank 1 at step 3, bit 24 (a factor of 2^2, which the gradient's norm does not
# notice) of one on rank 0 at step 4, bit 30 of a parameter element on rank 2 at step 2; on 2 DCs x 2 ranks
THREE_FLIPS = [{"rank": 1, "step": 3, "target": "gradient", "bit": 30, "tensor": "1.attn.weight", "index": 100,
                "seed": 0},
               {"rank": 0, "step": 4, "target": "gradient", "bit": 24, "tensor": "2.mlp.0.weight", "index": 100,
                "seed": 0},
               {"rank": 2, "step": 2, "target": "parameter", "bit": 30, "tensor": None, "index": None, "seed": 7}]
THREE_CAUGHT = [(0, 4, "gradient", "grad-checksum", "transient"), (1, 3, "gradient", "grad-checksum", "transient"),
                (2, 2, "parameter", "param-checksum", "transient")]


def bits_of(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


@pytest.mark.parametrize("bit", [0, 7, 22, 23, 27, 30, 31])
def test_flip_bit_flips_exactly_that_bit_of_the_float32(bit):
    tensor = torch.tensor([0.5, -1.25e-3, 3.0], dtype=torch.float32)
    before, after = flip_bit(tensor, 1, bit)
    assert before == pytest.approx(-1.25e-3)
    assert bits_of(after) ^ bits_of(before) == 1 << bit and float(tensor[1]) == after
    assert tensor[0] == 0.5 and tensor[2] == 3.0
    flip_bit(tensor, 1, bit)
    assert float(tensor[1]) == before  # a second flip restores it


def test_an_exponent_flip_of_a_small_gradient_makes_it_huge():
    tensor = torch.tensor([1e-3])
    _, after = flip_bit(tensor, 0, 30)
    assert after > 1e30


def test_any_single_flip_changes_the_checksum():
    params = [torch.randn(50), torch.randn(7, 3)]
    reference = checksum(params)
    for bit in range(32):
        flip_bit(params[1], 5, bit)
        assert checksum(params) != reference, bit
        flip_bit(params[1], 5, bit)
    assert checksum(params) == reference


@pytest.mark.parametrize(("values", "odd", "good"), [
    ([5, 5, 5, 5], [], 0), ([5, 9, 5, 5], [1], 0), ([9, 5, 5, 5], [0], 1), ([5, 9], [0, 1], None),
    ([5, 9, 7, 5], [1, 2], 0)])
def test_the_majority_names_the_odd_replicas(values, odd, good):
    assert odd_ones(values) == (odd, good)


def _guard(grad_value: float, injections: list[Injection]) -> tuple[Guard, torch.nn.Parameter]:
    param = torch.nn.Parameter(torch.zeros(100))
    param.grad = torch.full((100,), grad_value)
    return Guard(0, ["w"], [param], None, [0], injections, check=True), param


def test_the_gradient_check_replays_a_flipped_step_and_calls_it_transient():
    guard, param = _guard(1e-3, [Injection(rank=0, step=3, target="gradient", bit=30, tensor="w", index=7)])
    replays = []

    def replay() -> float:
        param.grad.fill_(1e-3)
        replays.append(True)
        return 0.5

    for step in range(6):
        param.grad.fill_(1e-3)
        assert guard.before_collective(step, replay) == (0.5 if step == 3 else None)
    events, seconds = guard.take()
    assert [e["event"] for e in events] == ["sdc_injected", "sdc_detected"]
    assert events[0]["after"] > 1e30 and events[0]["index"] == 7
    assert {k: events[1][k] for k in ("rank", "step", "detected_by", "classification")} == {
        "rank": 0, "step": 3, "detected_by": "grad-norm", "classification": "transient"}
    assert replays == [True] and seconds > 0 and float(param.grad.max()) == pytest.approx(1e-3)


def test_an_anomaly_the_replay_reproduces_bit_for_bit_is_the_datas_own():
    guard, param = _guard(1e-3, [])
    for step in range(3):
        param.grad.fill_(1e-3)
        guard.before_collective(step, lambda: None)
    param.grad[0] = 5.0  # a genuine spike: the replay computes the very same bits
    guard.before_collective(3, lambda: None)
    events, _ = guard.take()
    assert [(e["step"], e["detected_by"], e["classification"]) for e in events] == [(3, "grad-norm", "reproduced")]


def test_a_corruption_the_replay_does_not_clear_is_persistent():
    guard, param = _guard(1e-3, [])
    for step in range(3):
        param.grad.fill_(1e-3)
        guard.before_collective(step, lambda: None)
    param.grad[0] = float("inf")

    def faulty_again() -> None:
        param.grad.fill_(1e-3)
        param.grad[1] = float("inf")  # other bits, still broken: the fault is still there

    guard.before_collective(3, faulty_again)
    events, _ = guard.take()
    assert [(e["step"], e["classification"]) for e in events] == [(3, "persistent")]


@pytest.mark.parametrize(("rate", "expected"), [(0.0, []), (1.0, [(4, "replay-sample", "transient")])])
def test_a_flip_too_small_for_the_norm_is_caught_only_by_a_sampled_replay(rate, expected):
    param = torch.nn.Parameter(torch.zeros(100))
    param.grad = torch.full((100,), 1e-3)
    guard = Guard(0, ["w"], [param], None, [0], [Injection(rank=0, step=4, target="gradient", bit=3, tensor="w")],
                  check=True, replay_rate=rate)
    for step in range(8):
        param.grad.fill_(1e-3)
        guard.before_collective(step, lambda: param.grad.fill_(1e-3))
    events, _ = guard.take()
    assert [(e["step"], e["detected_by"], e["classification"]) for e in events if e["event"] == "sdc_detected"] \
        == expected


class TwoRanks:
    """A bucket's reduce as two ranks would make it: the sum of this rank's bucket (as the guard left it) and a
    clean peer's, so that a poisoned bucket comes back non-finite."""

    def __init__(self, guard: Guard, param: torch.nn.Parameter) -> None:
        self.guard, self.param, self.reduced = guard, param, torch.zeros(100)
        self.computations: list[int] = []

    def backward(self, step: int, grad: torch.Tensor) -> None:
        self.computations.append(step)
        self.param.grad.copy_(grad)
        if self.guard.bucket_ready(step, 0, {"w": self.param.grad}):
            poison(self.param.grad)
        self.reduced = self.param.grad + 1e-3

    def step(self, step: int, first: torch.Tensor, again: torch.Tensor | None = None) -> bool:
        self.backward(step, first)
        apply, _ = self.guard.after_sync(step, lambda: [self.reduced],
                                         lambda: self.backward(step, first if again is None else again))
        return apply


@pytest.mark.parametrize(("again", "classification", "applied"),
                         [(None, "transient", True), ("same", "reproduced", True), ("other", "persistent", False)])
def test_a_bucket_found_corrupt_is_poisoned_and_every_rank_computes_the_step_again(again, classification, applied):
    """A bucket checked as it leaves (DDP's, hier-dp-overlap's): an exponent flip is poisoned, so the reduced
    gradient is non-finite everywhere and the step is computed again: the flip is not injected twice (transient,
    the replay's gradient is applied); the same bits again are the data's own (reproduced: sent as they are);
    other bits still anomalous are persistent, and the step is skipped."""
    guard, param = _guard(1e-3, [Injection(rank=0, step=3, target="gradient", bit=30, tensor="w", index=7)]
                          if again is None else [])
    ranks = TwoRanks(guard, param)
    clean = torch.full((100,), 1e-3)
    for step in range(3):
        assert ranks.step(step, clean)
    spike = clean.clone()
    spike[5] = 4.0
    other = clean.clone()
    other[6] = float("inf")
    first = clean if again is None else spike
    assert ranks.step(3, first, {None: None, "same": spike, "other": other}[again]) is applied
    assert ranks.computations == [0, 1, 2, 3, 3] and ranks.step(4, clean)
    events, _ = guard.take()
    caught = [(e["step"], e["detected_by"], e["classification"]) for e in events if e["event"] == "sdc_detected"]
    assert caught == [(3, "grad-norm", classification)]
    assert torch.isfinite(ranks.reduced).all() and ranks.computations[-1] == 4


@pytest.mark.parametrize(("sticky", "classification"), [(False, "transient"), (True, "persistent")])
def test_a_rank_alone_catches_a_parameter_flip_by_its_seal_and_undoes_it(sticky, classification):
    """No replica (a group of one rank): the parameters sealed as the update left them; a flip of bit 23 (a factor
    of 2 in one element, which no norm would notice) breaks the seal, is named at the rank and step and put back
    from the copy; a flip that comes back (sticky) stays and is persistent. Clean steps raise nothing."""
    param = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 100))
    before = param.detach().clone()
    flip = Injection(rank=0, step=2, target="parameter", bit=23, tensor="w", index=17, sticky=sticky)
    guard = Guard(0, ["w"], [param], None, [0], [flip], check=True)
    for step in range(4):
        guard.after_update(step)
    events, seconds = guard.take()
    caught = [(e["rank"], e["step"], e["detected_by"], e["classification"])
              for e in events if e["event"] == "sdc_detected"]
    assert caught == [(0, 2, "param-seal", classification)]
    assert torch.equal(param.detach(), before) != sticky
    assert seconds > 0


def test_clean_steps_raise_nothing():
    guard, param = _guard(1e-3, [])
    gen = torch.Generator().manual_seed(0)
    for step in range(200):
        param.grad.copy_(torch.randn(100, generator=gen) * 1e-3 * (1 + step % 3))
        guard.before_collective(step, lambda: None)
    assert guard.take()[0] == []


def test_exponent_flips_are_caught_at_the_injected_rank_and_step_and_rolled_back(tmp_path, monkeypatch):
    """2 DCs x 2 ranks, real compute: bit 30 of a gradient element on rank 1 at step 3, bit 24 (a factor of 2^2,
    which the gradient's norm does not notice) of one on rank 0 at step 4, and bit 30 of a parameter element on
    rank 2 at step 2, in flat-dp and hier-dp; nothing else is flagged, replicas end identical."""
    env = {"TESTBED_SDC": json.dumps(THREE_FLIPS), "TESTBED_SDC_CHECK": "1"}
    base = Options(steps=6, micro_batch=2, micro_batches=1, seed=3)
    out = run(tmp_path, 2, 2, {"flat": replace(base, strategy="flat-dp"), "hier": replace(base, strategy="hier-dp")},
              env=env)
    for name in ("flat", "hier"):
        events = sdc_events(tmp_path / name, 4)
        injected = sorted((e["rank"], e["step"], e["target"]) for e in events if e["event"] == "sdc_injected")
        caught = sorted((e["rank"], e["step"], e["target"], e["detected_by"], e["classification"])
                        for e in events if e["event"] == "sdc_detected")
        assert injected == [(0, 4, "gradient"), (1, 3, "gradient"), (2, 2, "parameter")], name
        assert caught == THREE_CAUGHT, (name, caught)
        params = [out[name][r]["params"] for r in range(4)]
        for key in params[0]:
            assert all(torch.equal(params[0][key], p[key]) for p in params[1:]), (name, key)
        assert all(torch.isfinite(params[0][k]).all() for k in params[0])
        assert all(r["sdc_check_s"] >= 0 for r in out[name][0]["records"])


def test_the_diloco_strategies_catch_flips_inside_each_dc(tmp_path):
    """2 DCs x 3 ranks, inner steps of 2: a gradient flip of bit 25 (a factor of 2^4) on rank 1 at step 3 is
    caught by the gradient checksums before the DC's all-reduce; a parameter flip on rank 4 at step 2 by the
    digest over its DC's ranks (the replicas between outer syncs), which restores it from the DC's majority."""
    injections = [{"rank": 1, "step": 3, "target": "gradient", "bit": 25, "tensor": "2.mlp.0.weight", "index": 100,
                   "seed": 0},
                  {"rank": 4, "step": 2, "target": "parameter", "bit": 30, "tensor": None, "index": None, "seed": 7}]
    env = {"TESTBED_SDC": json.dumps(injections), "TESTBED_SDC_CHECK": "1"}
    base = Options(steps=6, micro_batch=2, micro_batches=1, seed=3, inner_steps=2)
    out = run(tmp_path, 2, 3, {"diloco": replace(base, strategy="diloco"),
                               "async": replace(base, strategy="async-diloco")}, env=env)
    for name in ("diloco", "async"):
        events = sdc_events(tmp_path / name, 6)
        caught = sorted((e["rank"], e["step"], e["target"], e["detected_by"], e["classification"])
                        for e in events if e["event"] == "sdc_detected")
        assert caught == [(1, 3, "gradient", "grad-checksum", "transient"),
                          (4, 2, "parameter", "param-checksum", "transient")], (name, caught)
        for dc in ((0, 1, 2), (3, 4, 5)):
            params = [out[name][r]["params"] for r in dc]
            assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), (name, dc)


def test_a_pipeline_catches_flips_in_each_stage_and_replays_the_stage_alone(tmp_path):
    """2 DCs x 3 ranks, interleaved 1F1B over 2 virtual chunks per stage and 2 micro-batches: a stage's replicas
    are its DC's ranks. Gradient flips on a stage-0 rank (in its second, virtual chunk) and a stage-1 rank (the
    head) are caught by the checksums before the DC's all-reduce and replayed from the inputs and incoming
    gradients the stage's backwards used (no other stage takes part), which give the same bits on clean steps
    (every step is replayed); a parameter flip is caught by the DC's digest."""
    injections = [{"rank": 1, "step": 3, "target": "gradient", "bit": 25, "tensor": "4.mlp.0.weight", "index": 100,
                   "seed": 0},
                  {"rank": 4, "step": 4, "target": "gradient", "bit": 24, "tensor": "5.out.weight", "index": 100,
                   "seed": 0},
                  {"rank": 5, "step": 2, "target": "parameter", "bit": 30, "tensor": "2.attn.weight", "index": 7,
                   "seed": 0}]
    # every step also replayed unasked: a clean replay that did not give the same bits would be a verdict
    env = {"TESTBED_SDC": json.dumps(injections), "TESTBED_SDC_CHECK": "1", "TESTBED_SDC_REPLAY": "1"}
    base = Options(strategy="pp", schedule="interleaved-1f1b", virtual_chunks=2, steps=6, micro_batch=2,
                   micro_batches=2, seed=3)
    out = run(tmp_path, 2, 3, {"pp": base}, env=env)
    events = sdc_events(tmp_path / "pp", 6)
    caught = sorted((e["rank"], e["step"], e["target"], e["detected_by"], e["classification"])
                    for e in events if e["event"] == "sdc_detected")
    assert caught == [(1, 3, "gradient", "grad-checksum", "transient"),
                      (4, 4, "gradient", "grad-checksum", "transient"),
                      (5, 2, "parameter", "param-checksum", "transient")], caught
    for dc in ((0, 1, 2), (3, 4, 5)):
        params = [out["pp"][r]["params"] for r in dc]
        assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), dc
        assert all(torch.isfinite(t).all() for t in params[0].values())
    losses = [r["loss"] for r in out["pp"][3]["records"]]  # the last stage's: a replay reports the same loss
    assert all(loss is not None and 0 < loss < 10 for loss in losses), losses


def test_pytorchs_strategies_catch_a_parameter_flip_among_their_replicas(tmp_path):
    """3 DCs x 2 ranks. DDP's replicas are all ranks; HSDP's are the ranks holding the same shard, one per DC (3:
    a majority to restore from). A flip of bit 27 in a parameter element of rank 3 (HSDP: in its local shard) is
    named at its rank and step and restored; every replica ends the same."""
    injections = [{"rank": 3, "step": 2, "target": "parameter", "bit": 27, "tensor": None, "index": None, "seed": 11}]
    env = {"TESTBED_SDC": json.dumps(injections), "TESTBED_SDC_CHECK": "1"}
    base = Options(steps=4, micro_batch=2, micro_batches=1, seed=3)
    out = run(tmp_path, 3, 2, {name: replace(base, strategy=name) for name in ("ddp", "hsdp")}, env=env)
    for strategy in ("ddp", "hsdp"):
        events = sdc_events(tmp_path / strategy, 6)
        injected = [(e["rank"], e["step"], e["target"]) for e in events if e["event"] == "sdc_injected"]
        assert injected == [(3, 2, "parameter")], (strategy, injected)
        caught = [(e["rank"], e["step"], e["detected_by"], e["classification"])
                  for e in events if e["event"] == "sdc_detected"]
        assert caught == [(3, 2, "param-checksum", "transient")], (strategy, caught)
        params = [out[strategy][r]["params"] for r in range(6)]
        assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), strategy


def test_gradients_that_leave_during_backward_are_checked_bucket_by_bucket(tmp_path):
    """2 DCs x 2 ranks, hier-dp-overlap (several buckets, chunks over 2 lanes; also with int8 and its error
    feedback) and DDP (several buckets, 2 micro-batches under no_sync): gradient flips of bit 30 and bit 24 are
    caught in their bucket as it leaves, at the injected rank and step; every rank drops the poisoned reduction
    and computes the step again (transient); a parameter flip is caught by the digest. A flip at step 0 is judged
    in a replay whose buckets DDP has laid out anew (it rebuilds them after its first backward). Replicas end
    identical."""
    at_start = {"rank": 3, "step": 0, "target": "gradient", "bit": 27, "tensor": "0.tok.weight", "index": 3000,
                "seed": 0}
    env = {"TESTBED_SDC": json.dumps([*THREE_FLIPS, at_start]), "TESTBED_SDC_CHECK": "1"}
    base = Options(steps=6, micro_batch=2, micro_batches=2, seed=3)
    overlap = replace(base, strategy="hier-dp-overlap", bucket_mb=0.1, chunks=2, lanes=2)
    runs = {"overlap": overlap, "int8": replace(overlap, compression="int8"),
            "ddp": replace(base, strategy="ddp", bucket_cap_mb=0.05)}
    out = run(tmp_path, 2, 2, runs, env=env)
    for name in runs:
        events = sdc_events(tmp_path / name, 4)
        caught = sorted((e["rank"], e["step"], e["target"], e["detected_by"], e["classification"])
                        for e in events if e["event"] == "sdc_detected")
        assert caught == sorted([*THREE_CAUGHT, (3, 0, "gradient", "grad-checksum", "transient")]), (name, caught)
        replayed = sorted((e["rank"], e["step"], e["applied"]) for e in events if e["event"] == "sdc_replayed")
        assert replayed == sorted((r, s, True) for r in range(4) for s in (0, 3, 4)), (name, replayed)
        params = [out[name][r]["params"] for r in range(4)]
        assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), name
        assert all(torch.isfinite(t).all() for t in params[0].values()), name
        losses = [r["loss"] for r in out[name][0]["records"]]
        assert all(0 < loss < 10 for loss in losses), (name, losses)


def test_fsdp2s_gradients_are_checked_before_its_reduce_scatter_and_its_shards_by_their_seal(tmp_path):
    """2 DCs x 2 ranks, 2 micro-batches: in hsdp and fsdp each unsharded gradient is checked when the last
    micro-batch has accumulated it, before FSDP2 reduce-scatters it; a flip of bit 28 on rank 3 at step 2 is caught
    there, filled with NaN so that every rank's shard comes back non-finite, and every rank computes the step
    again. A flip of bit 25 in rank 1's parameter shard at step 1, which no majority can name (fsdp: no replica;
    hsdp: two, one per DC), breaks rank 1's seal and is undone from its copy. Replicas (hsdp: the ranks holding the
    same shard) end identical and finite, and each run ends bit for bit as a run without the parameter flip."""
    gradient = {"rank": 3, "step": 2, "target": "gradient", "bit": 28, "tensor": "3.mlp.2.weight", "index": 5,
                "seed": 0}
    parameter = {"rank": 1, "step": 1, "target": "parameter", "bit": 25, "tensor": "2.attn.weight", "index": 3,
                 "seed": 0}
    env = {"TESTBED_SDC": json.dumps([gradient, parameter]), "TESTBED_SDC_CHECK": "1"}
    base = Options(steps=4, micro_batch=2, micro_batches=2, seed=3)
    out = run(tmp_path, 2, 2, {name: replace(base, strategy=name) for name in ("hsdp", "fsdp")}, env=env)
    for strategy in ("hsdp", "fsdp"):
        events = sdc_events(tmp_path / strategy, 4)
        caught = sorted((e["rank"], e["step"], e["detected_by"], e["classification"])
                        for e in events if e["event"] == "sdc_detected")
        assert caught == [(1, 1, "param-seal", "transient"), (3, 2, "grad-checksum", "transient")], (strategy, caught)
        replayed = sorted((e["rank"], e["step"], e["applied"]) for e in events if e["event"] == "sdc_replayed")
        assert replayed == [(r, 2, True) for r in range(4)], (strategy, replayed)
        params = [out[strategy][r]["params"] for r in range(4)]
        assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), strategy
        assert all(torch.isfinite(t).all() for t in params[0].values()), strategy
    clean = run(tmp_path / "clean", 2, 2, {"fsdp": replace(base, strategy="fsdp")},
                env={"TESTBED_SDC": json.dumps([gradient]), "TESTBED_SDC_CHECK": "1"})
    assert all(torch.equal(clean["fsdp"][0]["params"][key], out["fsdp"][0]["params"][key])
               for key in clean["fsdp"][0]["params"])


def test_a_defect_of_the_ranks_own_that_a_replay_repeats_is_persistent_and_kept_out(tmp_path):
    """Sticky flips (every replay of the step flips the same bit again: a rank's own defect) on 2 DCs x 2 ranks:
    a gradient's, which its checksums deny and the replay repeats bit for bit, is `persistent`, not the data's own
    spike; flat-dp leaves the rank's gradient out of the step, hier-dp-overlap (poisoned twice) skips the step on
    every rank. A parameter's, flipped again after the restore, is `persistent` too (and restored the step after).
    Replicas end identical and finite: the corrupt gradient reached no one."""
    injections = [{"rank": 1, "step": 3, "target": "gradient", "bit": 30, "tensor": "1.attn.weight", "index": 100,
                   "seed": 0, "sticky": True},
                  {"rank": 2, "step": 2, "target": "parameter", "bit": 23, "tensor": "2.mlp.0.weight", "index": 9,
                   "seed": 0, "sticky": True}]
    env = {"TESTBED_SDC": json.dumps(injections), "TESTBED_SDC_CHECK": "1"}
    base = Options(steps=5, micro_batch=2, micro_batches=1, seed=3)
    runs = {"flat": replace(base, strategy="flat-dp"),
            "overlap": replace(base, strategy="hier-dp-overlap", bucket_mb=0.1, chunks=2, lanes=2)}
    out = run(tmp_path, 2, 2, runs, env=env)
    for name in runs:
        events = sdc_events(tmp_path / name, 4)
        injected = sorted((e["rank"], e["step"], e["target"]) for e in events if e["event"] == "sdc_injected")
        assert injected == [(1, 3, "gradient"), (2, 2, "parameter")], (name, injected)  # reported once each
        caught = sorted((e["rank"], e["step"], e["target"], e["detected_by"], e["classification"])
                        for e in events if e["event"] == "sdc_detected")
        assert caught == [(1, 3, "gradient", "grad-checksum", "persistent"),
                          (2, 2, "parameter", "param-checksum", "persistent"),
                          (2, 3, "parameter", "param-checksum", "transient")], (name, caught)
        replayed = sorted((e["rank"], e["step"], e["applied"]) for e in events if e["event"] == "sdc_replayed")
        assert replayed == ([(r, 3, False) for r in range(4)] if name == "overlap" else []), (name, replayed)
        params = [out[name][r]["params"] for r in range(4)]
        assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), name
        assert all(torch.isfinite(t).all() for t in params[0].values()), name


def test_a_buddy_replay_sees_a_defect_that_the_ranks_own_replay_repeats(tmp_path):
    """flat-dp, 2 DCs x 2 ranks, every step replayed (sdc_replay 100 %): a sticky flip of mantissa bit 10 (too small
    for norm and checksums) on rank 1 at step 3 comes back in the rank's own replay, so replaying itself finds
    nothing (missed); its buddy, recomputing the rank's gradient from the rank's samples, disagrees, the rank's
    replay repeats its first, the second buddy sides with the first: `persistent`, left out. A one-off flip of bit 10
    on rank 2 at step 2 is `transient` both ways; an exponent flip on rank 0 at step 4 is caught by the checksums."""
    injections = [{"rank": 1, "step": 3, "target": "gradient", "bit": 10, "tensor": "1.attn.weight", "index": 100,
                   "seed": 0, "sticky": True},
                  {"rank": 2, "step": 2, "target": "gradient", "bit": 10, "tensor": "2.mlp.0.weight", "index": 7,
                   "seed": 0},
                  {"rank": 0, "step": 4, "target": "gradient", "bit": 30, "tensor": "2.mlp.0.weight", "index": 100,
                   "seed": 0}]
    env = {"TESTBED_SDC": json.dumps(injections), "TESTBED_SDC_CHECK": "1", "TESTBED_SDC_REPLAY": "1"}
    options = {"run": Options(strategy="flat-dp", steps=5, micro_batch=2, micro_batches=1, seed=3)}
    out = {"self": run(tmp_path / "self", 2, 2, options, env=env)["run"],
           "buddy": run(tmp_path / "buddy", 2, 2, options, env={**env, "TESTBED_SDC_BUDDY": "1"})["run"]}
    expected = {"self": [(0, 4, "grad-checksum", "transient"), (2, 2, "replay-sample", "transient")],
                "buddy": [(0, 4, "grad-checksum", "transient"), (1, 3, "buddy-replay", "persistent"),
                          (2, 2, "buddy-replay", "transient")]}
    for mode in out:
        caught = sorted((e["rank"], e["step"], e["detected_by"], e["classification"])
                        for e in sdc_events(tmp_path / mode / "run", 4) if e["event"] == "sdc_detected")
        assert caught == expected[mode], (mode, caught)
        params = [out[mode][r]["params"] for r in range(4)]
        assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), mode
    # the buddies' run kept rank 1's corrupt gradient out of step 3; the rank's own replay let it through
    assert any(not torch.equal(out["self"][0]["params"][k], out["buddy"][0]["params"][k]) for k in out["self"][0]["params"])


def test_bucket_strategies_sample_steps_by_computing_their_gradient_beforehand_without_communicating(tmp_path):
    """2 DCs x 2 ranks, DDP and hier-dp-overlap (int8, with its error feedback) in small buckets, FSDP2's fsdp and
    hsdp parameter by parameter, 2 micro-batches, every step sampled (TESTBED_SDC_REPLAY=1): each rank computes the
    step's gradient once with no bucket leaving (DDP: no_sync; FSDP2: gradient sync off, its unsharded gradients
    taken out), then each bucket leaving in the step itself must match it bit for bit. A flip of mantissa bit 10
    (far below what the checksums see) on rank 1 at step 2 is caught there (`replay-sample`), every rank computes
    step 2 again (transient); no other step raises anything, so the buckets hold exactly the gradient a pass
    without communication computes."""
    flip = {"rank": 1, "step": 2, "target": "gradient", "bit": 10, "tensor": "2.mlp.0.weight", "index": 7, "seed": 0}
    env = {"TESTBED_SDC": json.dumps([flip]), "TESTBED_SDC_CHECK": "1", "TESTBED_SDC_REPLAY": "1"}
    base = Options(steps=5, micro_batch=2, micro_batches=2, seed=3)
    runs = {"ddp": replace(base, strategy="ddp", bucket_cap_mb=0.05),
            "int8": replace(base, strategy="hier-dp-overlap", bucket_mb=0.1, chunks=2, lanes=2, compression="int8"),
            "fsdp": replace(base, strategy="fsdp"), "hsdp": replace(base, strategy="hsdp")}
    out = run(tmp_path, 2, 2, runs, env=env)
    for name in runs:
        events = sdc_events(tmp_path / name, 4)
        injected = [(e["rank"], e["step"], e["bit"]) for e in events if e["event"] == "sdc_injected"]
        assert injected == [(1, 2, 10)], name
        caught = [(e["rank"], e["step"], e["detected_by"], e["classification"])
                  for e in events if e["event"] == "sdc_detected"]
        assert caught == [(1, 2, "replay-sample", "transient")], (name, caught)
        replayed = sorted((e["rank"], e["step"], e["applied"]) for e in events if e["event"] == "sdc_replayed")
        assert replayed == [(r, 2, True) for r in range(4)], (name, replayed)
        params = [out[name][r]["params"] for r in range(4)]
        assert all(torch.equal(params[0][key], p[key]) for p in params[1:] for key in params[0]), name


def test_fsdp2_ranks_sample_the_same_steps_because_its_reference_pass_all_gathers(tmp_path):
    """fsdp and hsdp, 2 DCs x 2 ranks, half the steps sampled (TESTBED_SDC_REPLAY=0.5): computing a sampled step's
    gradient beforehand runs FSDP2's forwards, which all-gather the weights, so a rank sampling a step its peers
    do not would wait in a collective they never join (this run hung at step 0 when each rank drew its own steps).
    Every rank samples step 7 of 0-7 (seed 3): a mantissa flip there is caught (`replay-sample`), one at step 3,
    sampled by none, is not -- a share r of steps catches such flips at about r."""
    import random

    per_rank = [[s for s in range(8) if random.Random(f"3/{r}/{s}").random() < 0.5] for r in range(4)]
    assert len({tuple(steps) for steps in per_rank}) > 1  # drawn per rank, the ranks would sample different steps
    assert [s for s in range(8) if random.Random(f"3/{s}").random() < 0.5] == [7]
    flips = [{"rank": 1, "step": 3, "target": "gradient", "bit": 10, "tensor": "2.mlp.0.weight", "index": 7, "seed": 0},
             {"rank": 2, "step": 7, "target": "gradient", "bit": 10, "tensor": "1.attn.weight", "index": 5, "seed": 0}]
    env = {"TESTBED_SDC": json.dumps(flips), "TESTBED_SDC_CHECK": "1", "TESTBED_SDC_REPLAY": "0.5"}
    base = Options(steps=8, micro_batch=2, micro_batches=2, seed=3)
    run(tmp_path, 2, 2, {name: replace(base, strategy=name) for name in ("fsdp", "hsdp")}, env=env)
    for name in ("fsdp", "hsdp"):
        events = sdc_events(tmp_path / name, 4)
        caught = [(e["rank"], e["step"], e["detected_by"], e["classification"])
                  for e in events if e["event"] == "sdc_detected"]
        assert caught == [(2, 7, "replay-sample", "transient")], (name, caught)
