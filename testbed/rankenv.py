"""What a rank is told, written down once: torchrun's variables and testbed's own TESTBED_* ones.

The runner writes them (RankEnv(...).to_env()), the workload and testbed.steplog read them (the names below,
RankEnv.from_env()); no other module spells a rank variable. Standard library only (a contract in pyproject
keeps it so): a script under plain torchrun imports it through testbed.steplog."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

PREFIX = "TESTBED_"  # every testbed variable's (the runner passes them on, and strips this process's own)

# torchrun's
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
RANK, WORLD_SIZE, GROUP_RANK = "RANK", "WORLD_SIZE", "GROUP_RANK"
LOCAL_RANK, LOCAL_WORLD_SIZE = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
# where the rank sits
DC = "TESTBED_DC"  # its DC (ranks are numbered DC by DC)
NUM_DCS = "TESTBED_NUM_DCS"
NODES_PER_DC = "TESTBED_NODES_PER_DC"  # only when every DC holds the same number of ranks
DC_SIZES = "TESTBED_DC_SIZES"  # ranks per DC, comma-separated
NODE = "TESTBED_NODE"  # the node it runs on
LINK_RTT_MS = "TESTBED_LINK_RTT_MS"  # the longest inter-DC round trip
# what it writes
METRICS_DIR = "TESTBED_METRICS_DIR"  # where rank<r>.jsonl goes (testbed.steplog writes nothing without it)
TOKENS_PER_STEP = "TESTBED_TOKENS_PER_STEP"  # all ranks together (testbed.workload.autostep)
CHECKPOINT_DIR = "TESTBED_CHECKPOINT_DIR"
CHECKPOINT_EVERY = "TESTBED_CHECKPOINT_EVERY"
CHECKPOINT_LOCAL = "TESTBED_CHECKPOINT_LOCAL"  # 1: every rank keeps its own (no shared files)
# how it runs
PG_TIMEOUT = "TESTBED_PG_TIMEOUT"  # the process groups' timeout in seconds
DIST_BACKEND = "TESTBED_DIST_BACKEND"  # gloo or nccl outright (the user's)
THREADS_PER_RANK = "TESTBED_THREADS_PER_RANK"  # intra-op threads (the user's)
GPU_SHARERS = "TESTBED_GPU_SHARERS"  # how many ranks share this machine's GPUs
GPU_SLOT = "TESTBED_GPU_SLOT"  # this rank's place among them
# torchft strategies (testbed.workload.replica): the DC's replica group
REPLICA_STORE = "TESTBED_REPLICA_STORE"  # host:port of the group's TCPStore (served by the group's rank 0)
NODE_ADDRESS = "TESTBED_NODE_ADDRESS"  # this rank's node's address (its Manager and checkpoint servers are reached there)
TORCHFT_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # torchft's own variable: the lighthouse's http://host:port
RANK_RESTARTED = "TESTBED_RANK_RESTARTED"  # 1: this rank was started again alone, mid-cell (a DC's kill)
# silent data corruption (testbed.workload.sdc)
SDC = "TESTBED_SDC"  # the corruptions this rank injects, a JSON list
SDC_CHECK = "TESTBED_SDC_CHECK"
SDC_REPLAY = "TESTBED_SDC_REPLAY"
SDC_BUDDY = "TESTBED_SDC_BUDDY"


def _flag(value: bool) -> str:
    return "1" if value else "0"


# each field's variable, how its value is written and how it is read back
_INT = (str, int)
_STR = (str, str)
_BOOL = (_flag, lambda text: text == "1")
CODECS: dict[str, tuple[str, Any, Any]] = {
    "master_addr": (MASTER_ADDR, *_STR), "master_port": (MASTER_PORT, *_INT), "rank": (RANK, *_INT),
    "world_size": (WORLD_SIZE, *_INT), "local_rank": (LOCAL_RANK, *_INT),
    "local_world_size": (LOCAL_WORLD_SIZE, *_INT), "group_rank": (GROUP_RANK, *_INT),
    "dc": (DC, *_INT), "num_dcs": (NUM_DCS, *_INT), "nodes_per_dc": (NODES_PER_DC, *_INT),
    "dc_sizes": (DC_SIZES, lambda sizes: ",".join(map(str, sizes)),
                 lambda text: tuple(int(part) for part in text.split(","))),
    "node": (NODE, *_STR), "link_rtt_ms": (LINK_RTT_MS, lambda ms: f"{ms:.3f}", float),
    "metrics_dir": (METRICS_DIR, *_STR), "tokens_per_step": (TOKENS_PER_STEP, *_INT),
    "checkpoint_dir": (CHECKPOINT_DIR, *_STR), "checkpoint_every": (CHECKPOINT_EVERY, *_INT),
    "checkpoint_local": (CHECKPOINT_LOCAL, *_BOOL),
    "pg_timeout": (PG_TIMEOUT, lambda seconds: f"{seconds:g}", float), "dist_backend": (DIST_BACKEND, *_STR),
    "threads_per_rank": (THREADS_PER_RANK, *_INT), "gpu_sharers": (GPU_SHARERS, *_INT),
    "gpu_slot": (GPU_SLOT, *_INT),
    "sdc": (SDC, lambda items: json.dumps(list(items)), lambda text: tuple(json.loads(text))),
    "sdc_check": (SDC_CHECK, *_BOOL), "sdc_replay": (SDC_REPLAY, lambda share: f"{share:g}", float),
    "sdc_buddy": (SDC_BUDDY, *_BOOL),
    "replica_store": (REPLICA_STORE, *_STR), "node_address": (NODE_ADDRESS, *_STR),
    "torchft_lighthouse": (TORCHFT_LIGHTHOUSE, *_STR), "rank_restarted": (RANK_RESTARTED, *_BOOL),
}


@dataclass(frozen=True)
class RankEnv:
    """Everything a rank is told; None: not told (the variable is absent). The runner builds its parts apart
    (layout, faults, checkpoints) and merges their to_env()."""

    master_addr: str | None = None
    master_port: int | None = None
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    group_rank: int | None = None
    dc: int | None = None
    num_dcs: int | None = None
    nodes_per_dc: int | None = None
    dc_sizes: tuple[int, ...] | None = None
    node: str | None = None
    link_rtt_ms: float | None = None
    metrics_dir: str | None = None
    tokens_per_step: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    checkpoint_local: bool | None = None
    pg_timeout: float | None = None
    dist_backend: str | None = None
    threads_per_rank: int | None = None
    gpu_sharers: int | None = None
    gpu_slot: int | None = None
    sdc: tuple[dict[str, Any], ...] | None = None
    sdc_check: bool | None = None
    sdc_replay: float | None = None
    sdc_buddy: bool | None = None
    replica_store: str | None = None  # torchft strategies: the replica group's TCPStore, host:port
    node_address: str | None = None  # torchft strategies: where this rank's Manager and checkpoint servers are reached
    torchft_lighthouse: str | None = None  # torchft strategies: the lighthouse's http://host:port
    rank_restarted: bool | None = None  # started again alone mid-cell (a DC's kill with restart_after)

    def to_env(self) -> dict[str, str]:
        """The variables of the fields that are set, as the rank reads them."""
        out = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                name, write, _ = CODECS[field.name]
                out[name] = write(value)
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        """What `env` (default: this process's environment) tells; ValueError naming the variable when one
        cannot be read."""
        env = os.environ if env is None else env
        values = {}
        for field in fields(cls):
            name, _, read = CODECS[field.name]
            if name in env:
                try:
                    values[field.name] = read(env[name])
                except ValueError as error:
                    raise ValueError(f"{name}={env[name]!r}: {error}") from None
        return cls(**values)
