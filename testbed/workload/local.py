"""Run workload configurations on loopback without the harness: one process per rank, torchrun's env.

Each process initialises torch.distributed once and runs every configuration in turn (torch's import
and rendezvous are paid once), writing metrics and dumps under the directory given. Used by the tests and
bench/workload.py; `python -m testbed.workload` under torchrun is the user-facing way. The ranks are fresh
pythons unless the caller passes `spawn` (the tests fork them from a process that imported torch once).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from testbed.rankenv import RankEnv
from testbed.workload.options import Options


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Rank(Protocol):
    """What launch needs of a rank's process (subprocess.Popen has it)."""

    def wait(self, timeout: float | None = None) -> int: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


# how a rank starts: (module, its arguments, the whole environment, the log for stdout and stderr) -> the process
Spawn = Callable[[str, list[str], dict[str, str], Path], Rank]


def exec_rank(module: str, args: list[str], env: dict[str, str], log: Path) -> Rank:
    """A fresh python running `module` (it imports torch itself)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def launch(num_dcs: int, nodes_per_dc: int, runs: list[Options], out: Path, timeout: float = 300,
           env: dict[str, str] | None = None, dc_sizes: Sequence[int] | None = None, spawn: Spawn = exec_rank) -> None:
    """Run `runs` on num_dcs x nodes_per_dc ranks (or DCs of `dc_sizes` ranks) on loopback; raises with the
    failing rank's stderr."""
    sizes = list(dc_sizes) if dc_sizes else [nodes_per_dc] * num_dcs
    world = sum(sizes)
    dc_of = [dc for dc, size in enumerate(sizes) for _ in range(size)]
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "runs.json"
    spec.write_text(json.dumps([dataclasses.asdict(r) for r in runs]))
    port = free_port()
    procs = []
    for rank in range(world):
        told = RankEnv(master_addr="127.0.0.1", master_port=port, rank=rank, world_size=world, local_rank=rank,
                       local_world_size=world, num_dcs=len(sizes), dc_sizes=tuple(sizes), dc=dc_of[rank],
                       nodes_per_dc=sizes[0] if len(set(sizes)) == 1 else None)
        rank_env = {**os.environ, **(env or {}), **told.to_env()}
        procs.append(spawn("testbed.workload.local", [str(spec)], rank_env, out / f"rank{rank}.log"))
    failed = None
    try:
        for rank, proc in enumerate(procs):
            if proc.wait(timeout=timeout) != 0 and failed is None:
                failed = rank
    except subprocess.TimeoutExpired:
        failed = -1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed is not None:
        which = 0 if failed < 0 else failed
        tail = (out / f"rank{which}.log").read_text()[-3000:]
        raise RuntimeError(f"workload failed on rank {failed} ({'timeout' if failed < 0 else 'exit'}):\n{tail}")


def _worker(spec: str) -> int:
    import torch
    import torch.distributed as dist

    from testbed.workload.groups import backend
    from testbed.workload.layout import layout_from_env
    from testbed.workload.run import train_in_group

    torch.set_num_threads(1)
    layout = layout_from_env()
    dist.init_process_group(backend())
    try:
        for options in json.loads(Path(spec).read_text()):
            train_in_group(Options(**options), layout)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
