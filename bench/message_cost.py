"""What one message of a collective costs the machine's CPU when more ranks than cores share it, measured apart
from the runs the cost model is judged on (issue 44: hier-dp's intra-DC time at 64-128 ranks on 2 cores).

DCs x ranks processes on this machine, gloo over loopback (no namespaces, no shaping: nothing but the ranks and
their messages), every DC's group at once, as hier-dp's intra-DC phase runs them: an all-to-all of the gradient
(testbed.workload.comm.reduce_scatter_into's exchange) and an all-gather of the shards. A group of g ranks sends
g(g-1) messages in each, so a shape sends DCs x 2g(g-1). Per repetition the slowest rank's time (all ranks start
together after a barrier); the table has the median over repetitions and what it is per message in ms of one core
(time x cores / messages).

    .venv/bin/python bench/message_cost.py --shapes 4x8,4x16,4x32,1x32 --reps 10
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ELEMENTS = 236928  # the tiny preset's parameters (testbed.model.shapes.parameter_count): its gradient's floats


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, dcs: int, group_size: int, reps: int, elements: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    world = dcs * group_size
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = [dist.new_group(list(range(dc * group_size, (dc + 1) * group_size))) for dc in range(dcs)]
    group = groups[rank // group_size]
    flat = torch.ones(elements - elements % group_size)
    parts = torch.empty_like(flat)
    shard = torch.empty(flat.numel() // group_size)
    gathered = [torch.empty_like(shard) for _ in range(group_size)]
    times = []
    for rep in range(reps + 2):  # two to warm the connections up
        dist.barrier()
        start = time.perf_counter()
        dist.all_to_all_single(parts, flat, group=group)
        torch.sum(parts.view(-1, shard.numel()), dim=0, out=shard)
        dist.all_gather(gathered, shard, group=group)
        if rep >= 2:
            times.append(time.perf_counter() - start)
    Path(out, f"{rank}.json").write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def measure(dcs: int, group_size: int, reps: int, elements: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.monotonic()
        mp.spawn(rank_main, args=(dcs, group_size, reps, elements, free_port(), out), nprocs=dcs * group_size)
        wall = time.monotonic() - start
        per_rank = [json.loads(path.read_text()) for path in Path(out).glob("*.json")]
    phase = statistics.median(max(times[i] for times in per_rank) for i in range(reps))
    messages = dcs * 2 * group_size * (group_size - 1)
    cores = os.cpu_count() or 1
    return {"DCs x ranks": f"{dcs}x{group_size}", "ranks": dcs * group_size, "messages": messages,
            "phase s (median)": phase, "ms of a core per message": phase * cores / messages * 1e3,
            "whole run s": wall}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x8,4x16,4x32,1x32")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--elements", type=int, default=ELEMENTS)
    args = parser.parse_args(argv)
    rows = []
    for shape in args.shapes.split(","):
        dcs, group_size = (int(part) for part in shape.split("x"))
        rows.append(measure(dcs, group_size, args.reps, args.elements))
        print(f"done {shape}", file=sys.stderr, flush=True)
    print(f"{os.cpu_count()} cores, {args.elements} floats a gradient, {args.reps} repetitions, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
