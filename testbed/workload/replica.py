"""The training loop of a torchft strategy: this rank's DC is one replica group of its own.

The group's rank 0 hosts the group's TCPStore at TESTBED_REPLICA_STORE (its node's address, as torchrun's agent
would); the DC's ranks form the default process group over it (their own world: RANK minus the DC's first rank,
WORLD_SIZE the DC's size); torchft's Manager reaches the lighthouse at TORCHFT_LIGHTHOUSE. Steps follow the
Manager: a group that started again goes on from the step its heal brought, and every group stops at the same
step. Per step one JSON line as the built-in loop writes, plus the quorum's participants and the heal's bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from testbed import rankenv
from testbed.workload import data
from testbed.workload.layout import layout_from_env
from testbed.workload.metrics import Meter, MetricsWriter
from testbed.workload.options import Options, check_options
from testbed.workload.run import model_config, parameter_count
from testbed.workload.strategies import make_strategy
from testbed.workload.strategies.base import Context


def group_store(layout, timeout: timedelta) -> dist.TCPStore:
    """The replica group's TCPStore: served by its rank 0, reached by the others."""
    host, port = os.environ[rankenv.REPLICA_STORE].rsplit(":", 1)
    return dist.TCPStore(host, int(port), layout.dc_size, is_master=layout.index_in_dc == 0, timeout=timeout,
                         wait_for_workers=False)


GATE_KEY = "testbed/groups-ready"


def wait_for_every_group(layout, store: dist.TCPStore, timeout: timedelta) -> None:
    """Before the first quorum, until every rank of every group has its Manager (heartbeating to the lighthouse):
    torchft forms a quorum of whoever has joined, so a group still starting would miss the first steps and heal
    into them. The count is kept in the first DC's group store (every DC's store has the same port). A rank
    started again alone mid-cell (RANK_RESTARTED) does not wait: it joins at the next quorum, as torchft means."""
    if os.environ.get(rankenv.RANK_RESTARTED) == "1" or layout.num_dcs == 1:
        return
    _, port = os.environ[rankenv.REPLICA_STORE].rsplit(":", 1)
    gate = store if layout.dc == 0 else dist.TCPStore(os.environ[rankenv.MASTER_ADDR], int(port), is_master=False,
                                                      timeout=timeout, wait_for_workers=False)
    gate.add(GATE_KEY, 1)
    deadline = time.monotonic() + timeout.total_seconds()
    while gate.add(GATE_KEY, 0) < layout.world and time.monotonic() < deadline:
        time.sleep(0.01)


def train_replica_group(opts: Options) -> list[dict]:
    """Train this rank's replica group under torchft until the Manager's step reaches opts.steps."""
    layout = layout_from_env()
    check_options(opts, layout.dc_sizes)
    torch.set_num_threads(max(1, int(os.environ.get(rankenv.THREADS_PER_RANK, "1"))))
    timeout = timedelta(seconds=opts.quorum_timeout_s)
    store = group_store(layout, timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("testbed/dc", store), rank=layout.index_in_dc,
                            world_size=layout.dc_size, timeout=timeout)
    cfg = model_config(opts)
    meter = Meter(layout)
    writer = MetricsWriter(opts.metrics_dir or os.environ.get(rankenv.METRICS_DIR), layout.rank)
    begun = time.time()
    strategy = make_strategy(opts.strategy)
    strategy.setup(Context(layout, None, meter, None, cfg, opts, None))  # type: ignore[arg-type]
    setup_s = time.time() - begun  # the model, the optimizer and torchft's Manager, its servers and clients
    wait_for_every_group(layout, store, timeout)
    writer.write({"event": "start", "rank": layout.rank, "resumed_after_step": None, "dc": layout.dc,
                  "num_dcs": layout.num_dcs, "nodes_per_dc": layout.nodes_per_dc, "dc_sizes": list(layout.dc_sizes),
                  "world": layout.world, "strategy": opts.strategy, "options": dataclasses.asdict(opts),
                  "model": dataclasses.asdict(cfg), "parameters": parameter_count(cfg),
                  "corpus_sha256": data.corpus_hash(), "backend": "gloo", "synthetic_s": None, "groups_s": 0.0,
                  "time": begun, "setup_s": setup_s, "replica_group": layout.dc})
    ranges = strategy.sample_ranges()
    count = sum(n for _, n in ranges)
    records, local = [], 0
    try:
        while not strategy.done():
            step = strategy.current_step() if opts.strategy == "torchft-ddp" else local
            micro = data.micro_batches(ranges, step, cfg.seq_len, opts.seed, opts.micro_batch, torch.device("cpu"))
            writer.write({"event": "step_begin", "step": step, "rank": layout.rank, "time": time.time()})
            meter.reset()
            start = time.perf_counter()
            result = strategy.step(step, micro)
            wall = time.perf_counter() - start
            c = meter.reset()
            record = {"event": "step", "step": step, "rank": layout.rank, "dc": layout.dc, "strategy": opts.strategy,
                      "time": time.time(), "wall_s": wall, "compute_s": c.compute_s, "comm_s": c.comm_s,
                      "comm_intra_s": 0.0, "comm_inter_s": c.comm_s, "exposed_s": max(0.0, wall - c.compute_s),
                      "bubble_s": 0.0, "bytes_intra": 0.0, "bytes_inter": 0.0, "wire_intra": 0.0,
                      "wire_inter": 0.0, "tokens": count * cfg.seq_len, **result}
            writer.write(record)
            records.append(record)
            local += 1
        # the groups' replicas end equal (torchft's promise, a heal included): a digest of what they share says so
        digest = hashlib.sha256()
        for _, tensor in sorted(strategy.shared_parameters().items()):
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        writer.write({"event": "end", "rank": layout.rank, "step": strategy.current_step(),
                      "params_sha256": digest.hexdigest(), "time": time.time()})
    finally:
        strategy.shutdown()
        writer.close()
    if opts.dump_dir:
        Path(opts.dump_dir).mkdir(parents=True, exist_ok=True)
        torch.save({"params": strategy.named_parameters(), "records": records},
                   Path(opts.dump_dir) / f"rank{layout.rank}.pt")
    dist.destroy_process_group()
    return records
