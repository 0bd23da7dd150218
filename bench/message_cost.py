"""What one message of a collective costs the machine's CPU when more ranks than cores share it, measured apart
from the runs the cost model is judged on (issue 44: hier-dp's intra-DC time at 64-128 ranks on 2 cores).

DCs x ranks processes on this machine, gloo over loopback (no namespaces, no shaping: nothing but the ranks and
their messages), every DC's group at once, as hier-dp's intra-DC phase runs them: an all-to-all of the gradient
(testbed.workload.comm.reduce_scatter_into's exchange) and an all-gather of the shards. A group of g ranks sends
g(g-1) messages in each, so a shape sends DCs x 2g(g-1). Per repetition the slowest rank's time (all ranks start
together after a barrier); the table has the median over repetitions and what it is per message in ms of one core
(time x cores / messages).

    .venv/bin/python bench/message_cost.py --shapes 4x8,4x16,4x32,1x32 --reps 10
    .venv/bin/python bench/message_cost.py --netns   # each rank in a node of a testbed, as bench/scale.py's (root)
    .venv/bin/python bench/message_cost.py --shapes 4x2,1x8,4x8,1x32,2x32,4x16,4x32 --calibration CALIBRATION.json

It prints the two constants the cost model's host CPU bound takes (testbed.model.host: core-seconds per message and
per byte, fitted by least squares over the shapes whose ranks outnumber the cores); --calibration writes them, with
the shapes they came from, into a calibration file's `host_cpu` field (its other fields unchanged).

With --netns the ranks run in the nodes of a testbed of DCs x ranks nodes (the netns backend; the DCs' links 0 ms,
so the delay line has nothing to do): the same exchanges through each node's veth and its DC's bridge.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from testbed.model.calibration import load_calibration
from testbed.model.host import fit_host_cpu, shape_load
from testbed.workload.local import free_port

PREFIX = "tb-msg-"
ELEMENTS = 236928  # the tiny preset's parameters (testbed.model.shapes.parameter_count): its gradient's floats


def rank_main(rank: int, dcs: int, group_size: int, reps: int, elements: int, port: int, out: str,
              master: str = "127.0.0.1") -> None:
    torch.set_num_threads(1)
    world = dcs * group_size
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
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


def in_nodes(dcs: int, group_size: int, reps: int, elements: int, out: str) -> None:
    """Every rank as a process in its own node of a testbed (DC d's nodes are ranks d*g .. d*g+g-1)."""
    from testbed.fabric.lifecycle import bring_up, tear_down
    from testbed.spec.topology import topology_from_data

    names = [f"dc{dc}" for dc in range(dcs)]
    links = [{"between": [a, b], "latency": "0ms", "bandwidth": "10gbit"} for a, b in itertools.pairwise(names)]
    topology = topology_from_data({"name": "message-cost", "dcs": [{"name": n, "nodes": group_size} for n in names],
                                   "links": links})
    testbed = bring_up(topology, prefix=PREFIX, shaper="userspace-delay")
    procs = []
    try:
        master = testbed.plan.node(f"{names[0]}-0").address
        port = 29500
        for rank in range(dcs * group_size):
            node = f"{names[rank // group_size]}-{rank % group_size}"
            procs.append(testbed.fabric.popen(node, [sys.executable, __file__, "--rank", str(rank), "--shapes",
                                                     f"{dcs}x{group_size}", "--reps", str(reps), "--elements",
                                                     str(elements), "--master", f"{master}:{port}", "--out", out],
                                                env={**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}))
        for proc in procs:
            if proc.wait(timeout=900) != 0:
                raise RuntimeError(f"a rank failed ({proc.returncode})")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        tear_down(PREFIX)


def measure(dcs: int, group_size: int, reps: int, elements: int, netns: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.monotonic()
        if netns:
            in_nodes(dcs, group_size, reps, elements, out)
        else:
            mp.spawn(rank_main, args=(dcs, group_size, reps, elements, free_port(), out), nprocs=dcs * group_size)
        wall = time.monotonic() - start
        per_rank = [json.loads(path.read_text()) for path in Path(out).glob("*.json")]
    phase = statistics.median(max(times[i] for times in per_rank) for i in range(reps))
    messages, nbytes = shape_load(dcs, group_size, elements)  # DCs x 2g(g-1) messages
    cores = os.cpu_count() or 1
    return {"DCs x ranks": f"{dcs}x{group_size}", "ranks": dcs * group_size, "messages": messages,
            "MB": nbytes / 1e6, "phase s (median)": phase, "ms of a core per message": phase * cores / messages * 1e3,
            "whole run s": wall}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x8,4x16,4x32,1x32")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--elements", type=int, default=ELEMENTS)
    parser.add_argument("--netns", action="store_true", help="each rank in a node of a testbed (root)")
    parser.add_argument("--calibration", type=Path, help="write the fitted host CPU constants into this calibration "
                                                          "file's host_cpu field")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # one rank of --netns, run in its node
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        dcs, group_size = (int(part) for part in args.shapes.split("x"))
        host, port = args.master.rsplit(":", 1)
        rank_main(args.rank, dcs, group_size, args.reps, args.elements, int(port), args.out, host)
        return 0
    rows = []
    for shape in args.shapes.split(","):
        dcs, group_size = (int(part) for part in shape.split("x"))
        rows.append({"ranks in": "nodes" if args.netns else "this namespace",
                     **measure(dcs, group_size, args.reps, args.elements, args.netns)})
        print(f"done {shape}", file=sys.stderr, flush=True)
    when = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    cores = os.cpu_count() or 1
    print(f"{cores} cores, {args.elements} floats a gradient, {args.reps} repetitions, {when}")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"))
    shapes = [{"shape": row["DCs x ranks"], "ranks": row["ranks"], "messages": row["messages"],
               "bytes": round(row["MB"] * 1e6), "phase_s": row["phase s (median)"]} for row in rows]
    try:
        host = fit_host_cpu(shapes, cores, {
            "command": "bench/message_cost.py " + " ".join(argv), "measured": when,
            "ranks in": rows[0]["ranks in"], "elements": args.elements, "reps": args.reps})
    except ValueError as error:  # no shape outnumbers the cores
        print(f"no host CPU constants: {error}")
        return 0 if not args.calibration else 1
    print(f"host CPU bound: {host.message_core_s * 1e3:.4f} ms of a core a message, "
          f"{host.byte_core_s * 1e9:.3f} ms of a core a MB ({cores} cores; least squares over the shapes of more "
          f"than {cores} ranks)")
    if args.calibration:  # its other fields as they are (a calibration file's JSON, testbed.model.calibration)
        load_calibration(args.calibration)  # CalibrationError: not a calibration
        data = json.loads(args.calibration.read_text())
        data["host_cpu"] = host.to_dict()
        args.calibration.write_text(json.dumps(data, indent=1))
        print(f"written to {args.calibration} (host_cpu)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
