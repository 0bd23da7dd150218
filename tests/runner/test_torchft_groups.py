"""torchft strategies: three replica groups (one rank each, on loopback) and the runner's lighthouse; one group
is killed mid-run and started again. The others train on without it, it heals from a peer and rejoins, and
every group ends with the same parameters; nothing is left (no lighthouse, no port)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import rankenv
from testbed.runner.lighthouse import Lighthouse, lighthouse_argv
from tests import needs

HEARTBEAT_MS = 1000
STEPS = 400


class Loopback:
    """The one fabric call the lighthouse makes, on this machine."""

    def popen(self, node: str, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(argv, **kwargs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def records(metrics: Path, rank: int) -> list[dict]:
    lines = (metrics / f"rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


# a group's process imports torch and torchft, then waits for its gate file before it trains: a restart takes
# milliseconds (as the fork launcher's does), not the seconds of an import on a loaded machine
GATED = ("import sys, time, pathlib, torch, torchft, testbed.workload.replica\n"
         "from testbed.workload.__main__ import main\n"
         "while not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.01)\n"
         "sys.exit(main(sys.argv[2:]))")


def start_group(group: int, strategy: str, env: dict[str, str], tmp: Path, extra: list[str],
                gate: Path) -> subprocess.Popen:
    log = open(tmp / f"group{group}.{time.monotonic_ns()}.log", "wb")
    argv = [sys.executable, "-c", GATED, str(gate), "--strategy", strategy, "--steps", str(STEPS),
            "--heartbeat-timeout-ms", str(HEARTBEAT_MS), "--quorum-timeout-s", "20", "--dump-dir", str(tmp / "dump"),
            *extra]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.parametrize("strategy, extra", [("torchft-ddp", []),
                                             ("torchft-diloco", ["--inner-steps", "4"])])
def test_a_killed_group_heals_from_a_peer_and_the_others_train_on(tmp_path, strategy, extra):
    try:
        import torchft  # noqa: F401
    except ImportError:
        needs.unavailable("torchft is not installed (pip install -e '.[torchft]')")
    import torch

    port = free_port()
    metrics = tmp_path / "metrics"
    with Lighthouse(Loopback(), "dc0", lighthouse_argv(port, heartbeat_timeout_ms=HEARTBEAT_MS),
                    tmp_path / "lighthouse.log") as lighthouse:
        lighthouse.wait_ready()
        envs = [{**os.environ, "RANK": str(g), "WORLD_SIZE": "3", rankenv.DC: str(g), rankenv.DC_SIZES: "1,1,1",
                 rankenv.REPLICA_STORE: f"127.0.0.1:{free_port()}", rankenv.METRICS_DIR: str(metrics),
                 rankenv.TORCHFT_LIGHTHOUSE: f"http://127.0.0.1:{port}", "OMP_NUM_THREADS": "1"} for g in range(3)]
        go, again = tmp_path / "go", tmp_path / "again"
        go.touch()
        procs = [start_group(g, strategy, envs[g], tmp_path, extra, go) for g in range(3)]
        spare = start_group(2, strategy, envs[2], tmp_path, extra, again)  # group 2's restart, waiting
        try:
            deadline = time.monotonic() + 120
            while not (metrics / "rank2.jsonl").exists() or \
                    sum(r["event"] == "step" and r["participants"] == 3 for r in records(metrics, 2)) < 3:
                assert time.monotonic() < deadline and procs[2].poll() is None, "group 2 never trained in a quorum of 3"
                time.sleep(0.2)
            os.killpg(procs[2].pid, signal.SIGKILL)
            killed_at = time.time()
            procs[2].wait()
            while not any(r["event"] == "step" and r["time"] > killed_at and r["participants"] == 2
                          for r in records(metrics, 0)):  # the others went on without it: start it again
                assert time.monotonic() < deadline and procs[0].poll() is None, "group 0 did not go on"
                time.sleep(0.05)
            again.touch()
            procs[2] = spare
            codes = [proc.wait(timeout=240) for proc in procs]
        finally:
            for proc in [*procs, spare]:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        assert codes == [0, 0, 0]
        assert lighthouse.alive()
    assert not lighthouse.alive()
    with socket.socket(socket.AF_INET6) as sock:  # its port is free again
        sock.bind(("::", port))

    survivors = [[r for r in records(metrics, g) if r["event"] == "step"] for g in (0, 1)]
    for steps in survivors:
        after = [r for r in steps if r["time"] > killed_at]
        assert min(r["participants"] for r in after) < 3, "the others trained on without the killed group"
        assert steps[-1]["participants"] == 3, "the restarted group rejoined"
        walls = sorted(r["wall_s"] for r in steps)
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(steps) if b["time"] > killed_at]
        # what a step takes in this run (its median), and every group's inner steps between quorums
        assert max(gaps) <= HEARTBEAT_MS / 1e3 + 2 * statistics.median(walls) + max(walls), gaps
    restarted = [r for r in records(metrics, 2) if r["event"] in ("start", "step")]
    second = [i for i, r in enumerate(restarted) if r["event"] == "start"][1]
    healed = [r for r in restarted[second:] if r["event"] == "step" and r["healed_bytes"] > 0]
    assert healed, "the restarted group loaded a peer's state"
    params = [torch.load(tmp_path / "dump" / f"rank{g}.pt")["params"] for g in range(3)]
    assert all(torch.equal(params[0][k], p[k]) for p in params[1:] for k in params[0])
