"""Run workload configurations on loopback without the harness: one process per rank, torchrun's env.

Each process initialises torch.distributed once and runs every configuration in turn (torch's import
and rendezvous are paid once), writing metrics and dumps under the directory given. Used by the tests and
bench/workload.py; `python -m testbed.workload` under torchrun is the user-facing way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from testbed.workload.options import Options


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(num_dcs: int, nodes_per_dc: int, runs: list[Options], out: Path, timeout: float = 300,
           env: dict[str, str] | None = None, dc_sizes: Sequence[int] | None = None) -> None:
    """Run `runs` on num_dcs x nodes_per_dc ranks (or DCs of `dc_sizes` ranks) on loopback; raises with the
    failing rank's stderr."""
    sizes = list(dc_sizes) if dc_sizes else [nodes_per_dc] * num_dcs
    world = sum(sizes)
    dc_of = [dc for dc, size in enumerate(sizes) for _ in range(size)]
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "runs.json"
    spec.write_text(json.dumps([dataclasses.asdict(r) for r in runs]))
    port = str(free_port())
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, **(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                    "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
                    "TESTBED_NUM_DCS": str(len(sizes)), "TESTBED_DC_SIZES": ",".join(map(str, sizes)),
                    "TESTBED_DC": str(dc_of[rank])}
        if len(set(sizes)) == 1:
            rank_env["TESTBED_NODES_PER_DC"] = str(sizes[0])
        log = open(out / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, "-m", "testbed.workload.local", str(spec)], env=rank_env,
                                       stdout=log, stderr=subprocess.STDOUT), log))
    failed = None
    try:
        for rank, (proc, _) in enumerate(procs):
            if proc.wait(timeout=timeout) != 0 and failed is None:
                failed = rank
    except subprocess.TimeoutExpired:
        failed = -1
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
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
