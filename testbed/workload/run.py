"""The training loop: init torch.distributed, build groups and the strategy, step, write metrics."""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from testbed import rankenv
from testbed.spec.strategies import OVERLAP
from testbed.workload import data
from testbed.workload.checkpoint import checkpointing_from_env
from testbed.workload.comm import Comm
from testbed.workload.compute import synthetic_seconds
from testbed.workload.groups import backend, build_groups, gpu_slot
from testbed.workload.layout import layout_from_env
from testbed.workload.metrics import Meter, MetricsWriter
from testbed.workload.model import GPT, PRESETS, count_parameters
from testbed.workload.options import Options, check_options
from testbed.workload.strategies import make_strategy
from testbed.workload.strategies.base import Context


def model_config(opts: Options):
    cfg = PRESETS[opts.preset]
    return dataclasses.replace(cfg, seq_len=opts.seq_len) if opts.seq_len else cfg


def parameter_count(cfg) -> int:
    """The whole model's parameters, counted on the meta device (nothing allocated, nothing initialised)."""
    with torch.device("meta"):
        return count_parameters(GPT(cfg))


def train(opts: Options) -> list[dict]:
    """Initialise torch.distributed from the environment, train, tear down; returns the step records."""
    layout = layout_from_env()
    torch.set_num_threads(max(1, int(os.environ.get(rankenv.THREADS_PER_RANK, "1"))))
    dist.init_process_group(backend(), timeout=timedelta(seconds=float(os.environ.get(rankenv.PG_TIMEOUT, "300"))))
    try:
        return train_in_group(opts, layout)
    finally:
        dist.destroy_process_group()


def train_in_group(opts: Options, layout) -> list[dict]:
    """Run `opts.steps` steps on this rank inside an initialised default group (JSON lines as it goes)."""
    check_options(opts, layout.dc_sizes)
    cfg = model_config(opts)
    device = torch.device("cpu")
    if backend() == "nccl":
        device = torch.device("cuda", gpu_slot(layout.local_rank))
        torch.cuda.set_device(device)
    if opts.inject_delay_ms and device.type == "cuda":
        raise ValueError("--inject-delay-ms is for gloo on loopback; on GPUs shape the links instead")
    overlap = opts.strategy in OVERLAP  # the only strategy with a second communication thread and lanes
    begun = time.perf_counter()
    groups = build_groups(layout, lanes=opts.lanes if overlap else 1, second_intra=overlap)
    groups_s = time.perf_counter() - begun  # every rank creates every group: its connects and barriers
    meter = Meter(layout)
    comm = Comm(meter, inject_delay=opts.inject_delay_ms / 1e3)
    synthetic = None
    if opts.synthetic:
        value = torch.tensor([synthetic_seconds(cfg, opts, device)], dtype=torch.float64, device=device)
        dist.broadcast(value, 0)  # every rank sleeps the same: rank 0's calibration
        synthetic = float(value)
    strategy = make_strategy(opts.strategy)
    checkpoints, first = checkpointing_from_env(), 0
    strategy.setup(Context(layout, groups, meter, comm, cfg, opts, synthetic, device, checkpoints))
    local = checkpoints is not None and checkpoints.local
    own = layout.rank if strategy.checkpoint_per_rank or local else None  # whose checkpoint this rank writes and reads
    saved = None if checkpoints is None else checkpoints.load_agreed(layout.rank, layout.world) if local \
        else checkpoints.load(own, layout.world)
    if saved is not None:  # a restart: go on after the step the checkpoint was written after
        strategy.restore(saved[1])
        first = saved[0] + 1
    writer = MetricsWriter(opts.metrics_dir or os.environ.get(rankenv.METRICS_DIR), layout.rank)
    writer.write({"event": "start", "rank": layout.rank, "resumed_after_step": None if saved is None else saved[0],
                  "dc": layout.dc, "num_dcs": layout.num_dcs,
                  "nodes_per_dc": layout.nodes_per_dc, "dc_sizes": list(layout.dc_sizes), "world": layout.world, "strategy": opts.strategy,
                  "options": dataclasses.asdict(opts), "model": dataclasses.asdict(cfg),
                  "parameters": parameter_count(cfg), "corpus_sha256": data.corpus_hash(),
                  "backend": backend(), "synthetic_s": synthetic, "groups_s": groups_s, "time": time.time()})
    ranges = strategy.sample_ranges()
    count = sum(n for _, n in ranges)
    share = layout.num_dcs if opts.strategy == "pp" else 1  # a pipeline's tokens, counted once
    records = []
    for step in range(first, opts.steps):
        micro = data.micro_batches(ranges, step, cfg.seq_len, opts.seed, opts.micro_batch, device)
        writer.write({"event": "step_begin", "step": step, "rank": layout.rank, "time": time.time()})  # faults' clock
        meter.reset()
        start = time.perf_counter()
        result = strategy.step(step, micro)
        wall = time.perf_counter() - start
        for event in result.pop("events", []):  # silent data corruption injected or caught (testbed.workload.sdc)
            writer.write({**event, "time": time.time()})
        c = meter.reset()
        record = {"event": "step", "step": step, "rank": layout.rank, "dc": layout.dc,
                  "strategy": opts.strategy, "time": time.time(), "wall_s": wall,
                  "compute_s": c.compute_s, "comm_s": c.comm_s, "comm_intra_s": c.comm_intra_s,
                  "comm_inter_s": c.comm_inter_s, "exposed_s": c.exposed_s,
                  "bubble_s": c.bubble_s, "bytes_intra": c.bytes_intra, "bytes_inter": c.bytes_inter,
                  "wire_intra": c.wire_intra, "wire_inter": c.wire_inter,
                  "tokens": count * cfg.seq_len / share, **result}
        writer.write(record)
        records.append(record)
        if checkpoints is not None and checkpoints.due(step) and (own is not None or layout.rank == 0):
            begun = time.perf_counter()
            checkpoints.save(step, strategy.checkpoint_state(), own)
            writer.write({"event": "checkpoint", "step": step, "rank": layout.rank, "seconds": time.perf_counter() - begun,
                          "time": time.time()})
    writer.close()
    if opts.dump_dir:
        Path(opts.dump_dir).mkdir(parents=True, exist_ok=True)
        torch.save({"grads": strategy.named_gradients(), "params": strategy.named_parameters(),
                    "records": records}, Path(opts.dump_dir) / f"rank{layout.rank}.pt")
    comm.close()
    dist.barrier()
    return records
