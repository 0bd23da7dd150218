"""Workload pieces that need no processes: layout, schedules, compression, data, model."""

import itertools

import pytest
import torch

from testbed.workload import data
from testbed.workload.compression import BLOCK, make_codec
from testbed.workload.layout import LayoutError, layout_from_env
from testbed.workload.model import GPT, PRESETS, count_parameters, split_points
from testbed.workload.strategies.pipeline import schedule_ops


def test_layout_from_torchrun_env():
    layout = layout_from_env({"RANK": "5", "WORLD_SIZE": "6", "TESTBED_NUM_DCS": "3", "TESTBED_NODES_PER_DC": "2"})
    assert (layout.dc, layout.index_in_dc) == (2, 1)
    assert layout.inter_group(1) == [1, 3, 5] and layout.dc_ranks(1) == [2, 3]
    assert layout.nodes_per_dc == 2 and layout.inter_weight == 1.0


def test_layout_of_unequal_dcs():
    env = {"RANK": "3", "WORLD_SIZE": "5", "TESTBED_DC_SIZES": "2,1,2", "TESTBED_DC": "2"}
    layout = layout_from_env(env)
    assert (layout.dc, layout.index_in_dc, layout.num_dcs, layout.nodes_per_dc) == (2, 0, 3, None)
    assert [layout.dc_of(r) for r in range(5)] == [0, 0, 1, 2, 2] and layout.dc_ranks(2) == [3, 4]
    # the smallest DC has one rank: one inter-DC group, in which DCs a and c count once each
    assert layout.inter_count == 1 and layout.inter_group(0) == [0, 1, 2, 3, 4] and layout.inter_weight == 0.5
    wider = layout_from_env({"RANK": "4", "WORLD_SIZE": "7", "TESTBED_DC_SIZES": "4,3"})
    assert wider.inter_count == 3 and wider.inter_group(0) == [0, 3, 4] and wider.inter_group(1) == [1, 5]
    assert layout_from_env({"RANK": "0", "WORLD_SIZE": "7", "TESTBED_DC_SIZES": "4,3"}).inter_weight == 0.5


@pytest.mark.parametrize("env,needle", [
    ({"RANK": "0", "WORLD_SIZE": "4", "TESTBED_NUM_DCS": "3", "TESTBED_NODES_PER_DC": "2"}, "does not match"),
    ({"RANK": "0", "WORLD_SIZE": "4", "TESTBED_NUM_DCS": "2", "TESTBED_NODES_PER_DC": "2", "TESTBED_DC": "1"},
     "numbered DC by DC"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, "not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "4", "TESTBED_DC_SIZES": "2,1,2"}, "does not add up to WORLD_SIZE=4"),
    ({"RANK": "0", "WORLD_SIZE": "5", "TESTBED_DC_SIZES": "2,one,2"}, "comma-separated"),
    ({"RANK": "0", "WORLD_SIZE": "5", "TESTBED_DC_SIZES": "2,1,2", "TESTBED_NUM_DCS": "2"}, "lists 3"),
    ({"RANK": "2", "WORLD_SIZE": "5", "TESTBED_DC_SIZES": "2,1,2", "TESTBED_DC": "0"}, "falls in DC 1"),
])
def test_bad_layouts_are_one_line(env, needle):
    with pytest.raises(LayoutError, match=needle):
        layout_from_env(env)


def simulate(p: int, m: int, v: int, schedule: str, t_f: float = 1.0, t_b: float = 2.0, lookahead: int = 0):
    """Event simulation of every stage's op list with zero-latency links: (makespan, busy per stage)."""
    ops = {s: schedule_ops(schedule, p, s, m, v, lookahead) for s in range(p)}
    done: dict[tuple, float] = {}
    clock = dict.fromkeys(range(p), 0.0)
    position = dict.fromkeys(range(p), 0)
    last = p * v - 1
    progressed = True
    while progressed:
        progressed = False
        for s in range(p):
            while position[s] < len(ops[s]):
                kind, k, mb = ops[s][position[s]]
                g = s + k * p
                need = (("F", g - 1, mb) if g > 0 else None) if kind == "F" else (
                    ("B", g + 1, mb) if g < last else ("F", g, mb))
                if need is not None and need not in done:
                    break
                start = max(clock[s], done.get(need, 0.0))
                clock[s] = start + (t_f if kind == "F" else t_b)
                done[(kind, g, mb)] = clock[s]
                position[s] += 1
                progressed = True
    assert all(position[s] == len(ops[s]) for s in range(p)), "schedule deadlocks"
    return max(clock.values())


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "overlap"])
@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8)])
def test_schedules_cover_every_op_once_without_deadlock(schedule, p, m):
    v = 2 if schedule == "interleaved-1f1b" else 1
    for s in range(p):
        ops = schedule_ops(schedule, p, s, m, v, lookahead=2)
        assert sorted(ops) == sorted((kind, k, mb) for kind in "FB" for k in range(v) for mb in range(m))
        for k, mb in itertools.product(range(v), range(m)):
            assert ops.index(("F", k, mb)) < ops.index(("B", k, mb))
    simulate(p, m, v, schedule, lookahead=2)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 16)])
def test_1f1b_bubble_matches_theory(p, m):
    makespan = simulate(p, m, 1, "1f1b")
    bubble = 1 - m * 3.0 / makespan
    assert bubble == pytest.approx((p - 1) / (m + p - 1))


def test_interleaving_shrinks_the_bubble():
    p, m, v = 4, 8, 2
    plain = 1 - m * 3.0 / simulate(p, m, 1, "1f1b")
    inter = 1 - m * 3.0 / simulate(p, m, v, "interleaved-1f1b", t_f=0.5, t_b=1.0)
    assert inter < plain
    assert inter == pytest.approx((p - 1) / (m * v + p - 1), rel=0.35)


def test_int8_error_stays_within_the_documented_bound():
    torch.manual_seed(0)
    ranks = [torch.randn(3 * BLOCK + 17) * (r + 1) for r in range(3)]
    codec = make_codec("int8")
    parts = [codec.encode(x, f"r{r}") for r, x in enumerate(ranks)]
    decoded = codec.decode(parts, ranks[0].numel())
    exact = torch.stack(ranks).sum(0)
    bound = sum(x.abs().max() / 254 for x in ranks)  # sum over ranks of max|x|/254
    assert (decoded - exact).abs().max() <= bound * 1.0001
    assert parts[0][0].dtype == torch.int8


def test_int8_error_feedback_carries_what_was_lost():
    torch.manual_seed(1)
    x = torch.randn(BLOCK) * 1e-3
    x[0] = 1.0  # one large value makes the small ones round to zero without feedback
    codec = make_codec("int8")
    sent = torch.zeros_like(x)
    for _step in range(50):
        sent += codec.decode([codec.encode(x, "k")], x.numel())
    assert torch.allclose(sent / 50, x, atol=1.0 / 254 / 50 * 2)


def test_half_codecs_halve_the_payload():
    x = torch.randn(1000)
    for name in ("fp16", "bf16"):
        codec = make_codec(name)
        (part,) = codec.encode(x, "k")
        assert part.element_size() == 2
        assert torch.allclose(codec.decode([[part]], 1000), x, rtol=1e-2, atol=1e-2)


def test_data_is_offline_deterministic_and_layout_invariant():
    assert len(data.corpus()) > 100_000 and len(data.corpus_hash()) == 16
    x, y = data.samples(3, 0, 8, 64, seed=7)
    x2, _ = data.samples(3, 4, 4, 64, seed=7)
    assert torch.equal(x[4:], x2)  # sample i does not depend on who asks for it
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(data.samples(4, 0, 8, 64, seed=7)[0], x)


def test_presets_and_pipeline_cuts():
    assert 90e6 < count_parameters(GPT(PRESETS["gpt-100m"])) < 110e6
    assert split_points(6, 2) == [(0, 3), (3, 6)] and split_points(7, 3) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ValueError):
        split_points(2, 3)


def test_the_workload_command_line_comes_from_the_option_definitions(capsys):
    from testbed.spec.strategies import OPTIONS, STRATEGIES
    from testbed.workload.__main__ import parser
    from testbed.workload.strategies import make_strategy

    args = vars(parser().parse_args(["--strategy", "pp", "--schedule", "overlap", "--no-outer-shard",
                                     "--compute-ms", "12.5"]))
    assert set(args) == set(OPTIONS) and args["schedule"] == "overlap" and args["outer_shard"] is False
    assert args["compute_ms"] == 12.5 and args["chunks"] == OPTIONS["chunks"].default
    for bad, needle in ((["--chunks", "four"], "--chunks: expected a whole number, got 'four'"),
                        (["--lanes", "0"], "--lanes: must be at least 1, got '0'"),
                        (["--schedule", "zigzag"], "--schedule: expected 'gpipe', '1f1b'")):
        with pytest.raises(SystemExit) as caught:
            parser().parse_args(bad)
        assert caught.value.code == 2 and needle in capsys.readouterr().err
    assert all(type(make_strategy(name)).name == name for name in STRATEGIES)


@pytest.mark.parametrize("preset", ["tiny", "small", "medium"])
def test_the_spec_counts_the_models_parameters(preset):
    """The spec's torch-free count (what load-time checks such as PowerSGD's one-bucket rule use) is the model's."""
    from dataclasses import replace

    cfg = PRESETS[preset]
    assert cfg.parameters() == count_parameters(GPT(cfg))
    assert cfg.parameters(seq_len=2 * cfg.seq_len) == count_parameters(GPT(replace(cfg, seq_len=2 * cfg.seq_len)))


def test_the_cost_model_counts_the_real_model_without_torch():
    """testbed.model.shapes (no torch) against the workload's modules: parameters in order, buckets, pipeline chunks."""
    from testbed.model import shapes
    from testbed.spec.presets import PRESETS
    from testbed.workload.model import GPT, split_points

    for cfg in PRESETS.values():
        model = GPT(cfg)
        assert shapes.tensors(cfg) == [p.numel() for p in model.parameters()]
        assert [shape for module in shapes.module_shapes(cfg) for shape in module] == [
            tuple(p.shape) for p in model.parameters()]
        modules = list(model)
        assert shapes.chunk_parameters(cfg, 3) == [sum(p.numel() for m in modules[lo:hi] for p in m.parameters())
                                                   for lo, hi in split_points(len(modules), 3)]


def test_the_cost_model_splits_gradients_as_powersgd_does():
    """powerSGD_hook's own test of which gradients it compresses, on the real model's parameters: the vectors and
    the matrices not worth it all-reduced as they are, the others as P (n x k) and Q (m x k)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, _should_compress

    from testbed.model import shapes
    from testbed.spec.presets import PRESETS

    rate = PowerSGDState(process_group=None).min_compression_rate
    assert rate == shapes.POWERSGD_MIN_COMPRESSION_RATE
    for cfg in PRESETS.values():
        for rank in (1, 4):
            plain = p = q = 0
            for param in GPT(cfg).parameters():
                n, m = param.view(param.shape[0], -1).shape
                k = min(n, m, rank)
                if _should_compress(n, m, k, rate)[0]:
                    p, q = p + n * k, q + m * k
                else:
                    plain += n * m
            assert shapes.powersgd_elements(cfg, rank) == (plain, p, q)


def test_the_cost_model_buckets_gradients_as_ddp_and_units_as_fsdp2():
    """DDP (built as the workload builds it, bucket_cap_mb given) runs step 0 with every gradient in one bucket
    and then rebuilds its buckets in the order gradients became ready, each closed at bucket_cap_mb, the first
    too: the model's buckets are DDP's own (read back from DDP after three steps). The model once capped the first
    at DDP's default 1 MiB, which DDP keeps for callers who pass no bucket_cap_mb: one bucket where vs-pytorch's
    DDP ran two. The workload wraps each Block in fully_shard, then the root."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from testbed.model import shapes
    from testbed.spec.presets import PRESETS
    from testbed.workload.model import Block

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for cfg in (PRESETS["tiny"], PRESETS["small"]):  # the larger presets: the same rule, seconds more each
            model = GPT(cfg)
            for cap_mb in (0.25, 0.5, 25.0):
                ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
                tokens = torch.randint(0, cfg.vocab, (1, 8))
                for _ in range(3):
                    ddp(tokens).float().mean().backward()
                data = ddp._get_ddp_logging_data()
                assert data["bucket_sizes"] == str(4 * shapes.parameter_count(cfg))  # step 0: one bucket
                rebuilt = [int(x) for x in data["rebuilt_bucket_sizes"].split(", ")]
                assert [4 * n for n in shapes.ddp_buckets(cfg, cap_mb)] == rebuilt, (cfg, cap_mb)
            blocks = [sum(p.numel() for p in m.parameters()) for m in model.modules() if isinstance(m, Block)]
            assert shapes.fsdp_units(cfg) == [count_parameters(model) - sum(blocks), *blocks]
    finally:
        dist.destroy_process_group()


def test_calibration_ranks_start_at_the_instant_rank_0_broadcasts(monkeypatch):
    """Every rank sleeps until the wall-clock instant rank 0 chose and broadcast (ranks leave a barrier up to a
    one-way latency apart); a rank that hears of it too late starts at once; the margin is 1.5 x the slowest of
    three barriers and stays under TCP's idle restart (0.2 s). Every bound is from clocks read in this run (a loaded
    machine stretches sleeps: a fixed bound once read 0.079 s for 0.03 +- 0.02)."""
    import time

    from testbed.workload import calibrate

    class Dist:
        def __init__(self, when: float | None = None, barrier_s: float = 0.0) -> None:
            self.when, self.barrier_s = when, barrier_s
            self.told: list[float] = []  # the instant broadcast, as rank 0 chose it or as this rank hears it
            self.clocks: tuple[float, float] = (0.0, 0.0)  # monotonic, then wall, read in the broadcast
            self.barriers: list[tuple[float, float]] = []  # monotonic at each barrier's entry and exit

        def broadcast(self, tensor, src: int) -> None:
            if self.when is not None:
                tensor[0] = self.when
            self.told.append(float(tensor[0]))
            self.clocks = (time.monotonic(), time.time())

        def barrier(self) -> None:
            begin = time.monotonic()
            time.sleep(self.barrier_s)
            self.barriers.append((begin, time.monotonic()))

    sleeps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(calibrate.time, "sleep", lambda s: sleeps.append(s) or real_sleep(s))

    begin = time.time()
    rank0 = Dist()
    synced, start = calibrate._aligned_start(rank0, 0, 0.05)
    (when,) = rank0.told
    assert begin + 0.05 <= when <= rank0.clocks[1] + 0.05 and len(sleeps) == 1 and 0 < sleeps[0] <= 0.05
    mono, wall = rank0.clocks  # wall read after mono: the rank's wall clock at `mono` was at most `wall`
    assert synced >= mono and start - mono >= when - wall - 1e-3  # it started at the instant, not before (1 ms:
    # the two clocks' rates may differ by NTP's slew, 500 ppm at most)
    sleeps.clear()
    synced, start = calibrate._aligned_start(Dist(when=time.time() - 1.0), 1, 0.0)  # too late: at once
    assert sleeps == [] and start >= synced

    def bracket(dist: Dist) -> tuple[float, float, float]:
        """The margin and what the barriers' spans, as the function timed them, put it between: each span holds
        its barrier's own sleep and lies between the previous barrier's exit and the next one's entry."""
        before = time.monotonic()
        margin = calibrate._start_margin(dist)
        after = time.monotonic()
        entries, exits = [b for b, _ in dist.barriers], [e for _, e in dist.barriers]
        inner = max(e - b for b, e in dist.barriers)
        outer = max(nxt - prev for prev, nxt in zip([before, *exits[:-1]], [*entries[1:], after]))
        clip = lambda s: min(calibrate.MAX_MARGIN_S, max(0.01, s))  # noqa: E731
        return margin, clip(1.5 * inner), clip(1.5 * outer)

    margin, low, high = bracket(Dist(barrier_s=0.02))
    assert low <= margin <= high and low >= 0.03  # 1.5 x at least the 20 ms slept
    margin, low, _ = bracket(Dist(barrier_s=0.2))
    assert margin == low == calibrate.MAX_MARGIN_S < 0.2


def test_a_collectives_time_counts_as_intra_or_inter_dc_by_its_group():
    """comm_s splits into comm_intra_s (a group inside one DC) and comm_inter_s (a group across DCs): the step
    record's per-phase figures (bench/scale.py's columns)."""
    from testbed.workload.metrics import Meter

    layout = layout_from_env({"RANK": "1", "WORLD_SIZE": "4", "TESTBED_NUM_DCS": "2", "TESTBED_NODES_PER_DC": "2"})
    meter = Meter(layout)
    with meter.comm_timed(layout.dc_ranks(0)):
        pass
    with meter.comm_timed([1, 3]):
        sum(range(10000))
    meter.add_comm(0.5, [0, 2])  # a wait a strategy timed itself (an async all-reduce across DCs)
    step = meter.reset()
    assert step.comm_intra_s > 0 and step.comm_inter_s > 0.5
    assert step.comm_s == pytest.approx(step.comm_intra_s + step.comm_inter_s, rel=1e-12)  # added in another order
