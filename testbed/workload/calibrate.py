"""Calibration micro-benchmarks, run as every rank across the emulated DCs (`python -m testbed.workload.calibrate`).

What the cost model (testbed.model) needs measured rather than assumed: how long this transport's collectives
and point-to-point transfers take over the real links, at a few sizes, after an idle gap (as between training
steps: TCP restarts its window after an idle period) and again straight after (warm); and how long one
micro-batch's forward and backward take while every rank computes at once, and each optimizer's step after it.
Every rank starts a measured operation at one agreed instant. One JSON line per rank and measurement goes to
$TESTBED_METRICS_DIR/calib<r>.jsonl; times are CLOCK_MONOTONIC (shared by every namespace of one host), so the
fit can take an operation from its start to the moment the last rank left, and the gaps between operations
(which decide TCP's idle restarts) from the records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from testbed import rankenv

DEFAULT_SIZES = (4096, 262144, 2097152, 8388608)
LATE_S = 0.05  # how late the receive of a "late" send/recv is posted
MAX_MARGIN_S = 0.1  # most time between choosing a common start and the start (see _start_margin)


def _records_file(rank: int) -> Path:
    directory = Path(os.environ.get(rankenv.METRICS_DIR, "."))
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"calib{rank}.jsonl"


def _start_margin(dist: Any) -> float:
    """Seconds rank 0 leaves between choosing a common start and the start: time for the broadcast that tells
    every rank (1.5 x the slowest of three barriers, which cross the same links in more rounds), at most 0.1 s
    so that a warm measurement's connections, idle for a barrier and this, mostly stay below TCP's idle restart
    (its retransmission timeout is at least 0.2 s; the model takes the gaps as measured either way)."""
    spans = []
    for _ in range(3):
        begin = time.monotonic()
        dist.barrier()
        spans.append(time.monotonic() - begin)
    return min(MAX_MARGIN_S, max(0.01, 1.5 * max(spans)))


def _aligned_start(dist: Any, rank: int, ahead: float) -> tuple[float, float]:
    """Every rank starts the measured operation at one instant (on the wall clock: one host's namespaces share
    it, separate hosts keep it within NTP's error): rank 0 broadcasts when, `ahead` s from now, and each rank
    sleeps until then. Leaving a barrier, ranks differ by up to a one-way latency, which would otherwise be
    counted in (or out of) the operation. Returns this rank's CLOCK_MONOTONIC when the broadcast ended (the
    benchmark's last message on the default group's connections before the operation) and at its start (later
    than the common instant if the broadcast came too late)."""
    import torch

    when = torch.tensor([time.time() + ahead if rank == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(when, 0)
    synced = time.monotonic()
    wait = float(when[0]) - time.time()
    if wait > 0:
        time.sleep(wait)
    return synced, time.monotonic()


def optimizer_steps(params: list[Any]) -> dict[str, Any]:
    """One step of each optimizer a strategy may run (make_optimizer's: adamw, sgd) over `params` as their
    gradients stand: the calibration times them as a step's local time besides compute."""
    from types import SimpleNamespace

    from testbed.workload.strategies.base import make_optimizer

    out = {}
    for name in ("adamw", "sgd"):
        optimizer = make_optimizer(params, SimpleNamespace(optimizer=name, lr=1e-4))  # type: ignore[arg-type]
        out[name] = optimizer.step
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.workload.calibrate",
                                     description="Collective and compute micro-benchmarks for the cost model.")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes per operation")
    parser.add_argument("--reps", type=int, default=2, help="repetitions of each measurement")
    parser.add_argument("--idle-s", type=float, default=0.5, help="idle gap before a 'cold' measurement (s)")
    parser.add_argument("--lanes", type=int, default=4, help="concurrent inter-DC all-reduces to measure")
    parser.add_argument("--preset", default=None, help="model preset to profile forward+backward of (none: skip)")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--compute-reps", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]

    import torch
    import torch.distributed as dist

    from testbed.workload.comm import reduce_scatter_into
    from testbed.workload.groups import build_groups
    from testbed.workload.layout import layout_from_env

    layout = layout_from_env()
    torch.set_num_threads(max(1, int(os.environ.get(rankenv.THREADS_PER_RANK, "1"))))
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get(rankenv.PG_TIMEOUT, "300"))))
    groups = build_groups(layout, lanes=args.lanes)
    out = open(_records_file(layout.rank), "w", buffering=1)

    def record(**fields) -> None:
        out.write(json.dumps({"rank": layout.rank, "dc": layout.dc, **fields}) + "\n")

    record(event="start", dc_sizes=list(layout.dc_sizes), world=layout.world, lanes=args.lanes,
           inter_ranks=groups.inter_ranks, intra_ranks=groups.intra_ranks, sizes=sizes)

    margin = _start_margin(dist)  # every rank takes part in its barriers; rank 0's is the one used

    def timed(op: str, nbytes: int, rep: int, mode: str, fn, **extra) -> None:
        dist.barrier()
        synced, start = _aligned_start(dist, layout.rank, (args.idle_s if mode == "cold" else 0.0) + margin)
        fn()
        end = time.monotonic()
        record(event="op", op=op, bytes=nbytes, rep=rep, mode=mode, start=start, end=end, synced=synced, **extra)

    def measure(op: str, nbytes: int, fn, **extra) -> None:
        """An operation cold (after the idle gap) then warm (straight after, on the connections it warmed),
        `reps` times: each measurement follows the one before it, as the model simulates them."""
        for rep in range(args.reps):
            for mode in ("cold", "warm"):
                timed(op, nbytes, rep, mode, fn, **extra)

    world_ranks = list(range(layout.world))
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        flat = torch.ones(n)
        measure("all_reduce", nbytes, lambda flat=flat: dist.all_reduce(flat), group="world", ranks=world_ranks)
        if layout.num_dcs > 1 and len(groups.inter_ranks) > 1:
            one = torch.ones(n)
            measure("all_reduce", nbytes, lambda one=one: dist.all_reduce(one, group=groups.inter),
                    group="inter", ranks=groups.inter_ranks, concurrency=1)
            lanes = len(groups.lanes)
            if lanes > 1:
                pieces = list(torch.ones(max(lanes, n)).chunk(lanes))

                def concurrent(pieces: list = pieces) -> None:
                    works = [dist.all_reduce(piece, group=lane, async_op=True)
                             for piece, lane in zip(pieces, groups.lanes)]
                    for work in works:
                        work.wait()

                measure("all_reduce", nbytes, concurrent, group="inter", ranks=groups.inter_ranks,
                        concurrency=lanes)
        if len(groups.intra_ranks) > 1:
            g = len(groups.intra_ranks)
            full = torch.ones(max(g, n - n % g))
            shard = torch.empty(full.numel() // g)
            measure("reduce_scatter", full.numel() * 4,
                    lambda shard=shard, full=full: reduce_scatter_into(shard, full, groups.intra),
                    group="intra", ranks=groups.intra_ranks)
            gathered = torch.empty(full.numel())
            measure("all_gather", shard.numel() * 4,
                    lambda gathered=gathered, shard=shard: dist.all_gather_into_tensor(gathered, shard,
                                                                                     group=groups.intra),
                    group="intra", ranks=groups.intra_ranks)
        for dc in range(layout.num_dcs - 1):  # stage boundaries of a pipeline: DC d -> DC d + 1
            src, dst = layout.dc_start(dc), layout.dc_start(dc + 1)
            payload = torch.ones(n)
            ack = torch.zeros(1)

            def exchange(src: int = src, dst: int = dst, payload: Any = payload, ack: Any = ack,
                         late: float = 0.0) -> None:
                """A send and its acknowledgement; `late`: the receive posted that long after (a pipeline's pattern)."""
                if layout.rank == src:
                    dist.send(payload, dst)
                    dist.recv(ack, dst)
                elif layout.rank == dst:
                    if late:
                        time.sleep(late)
                    dist.recv(payload, src)
                    dist.send(ack, src)

            measure("send_recv", nbytes, exchange, group="p2p", ranks=[src, dst], pair=dc)
            measure("send_recv_late", nbytes, lambda exchange=exchange: exchange(late=LATE_S), group="p2p",
                    ranks=[src, dst], pair=dc, late_s=LATE_S)

    if args.preset:
        import dataclasses

        from testbed.workload.compute import ComputeStep
        from testbed.workload.model import PRESETS

        cfg = PRESETS[args.preset]
        if args.seq_len:
            cfg = dataclasses.replace(cfg, seq_len=args.seq_len)
        step = ComputeStep(cfg, args.micro_batch)
        optimizers = optimizer_steps(step.parameters)
        step()  # the first pass allocates and starts autograd's threads: not what a training step costs
        for optimizer_step in optimizers.values():
            optimizer_step()  # and the optimizers' state: the memory a training step works beside
        starts, seconds = [], []
        optimizer_reps: dict[str, list[float]] = {name: [] for name in optimizers}
        for _ in range(args.compute_reps):  # every rank computes at once, as in a step: they share the cores
            dist.barrier()
            _, start = _aligned_start(dist, layout.rank, margin)
            step()
            starts.append(start)
            seconds.append(time.monotonic() - start)
            for name, optimizer_step in optimizers.items():  # straight after, as a step's optimizer runs
                begin = time.monotonic()
                optimizer_step()
                optimizer_reps[name].append(time.monotonic() - begin)
        record(event="compute", preset=args.preset, micro_batch=args.micro_batch, seq_len=cfg.seq_len,
               seconds=sorted(seconds)[len(seconds) // 2], reps=seconds, starts=starts,
               concurrent_ranks=layout.world, optimizer_reps=optimizer_reps)
    dist.barrier()
    out.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
