"""torchft's lighthouse for a cell of a torchft strategy, and what each rank is told of its replica group.

The lighthouse runs in the first node of the first DC: every backend has that node already (no node, address or
namespace of its own to plan), it is inside the emulated network, so every other DC's quorum requests and
heartbeats cross the inter-DC links to reach it as they would in a real deployment; the first DC's own groups
reach it inside their DC. It is started with the cell's ranks (start_new_session: a process group of its own)
and killed with them on close(); a runner killed outright leaves it in a node's namespace, where `testbed down`
and `testbed clean` kill every process left (netns: testbed.fabric.netns.namespaces.kill_namespace_processes).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed import rankenv
from testbed.agents import lighthouse as lighthouse_agent
from testbed.fabric.lifecycle import Testbed
from testbed.plan.network import NetworkPlan
from testbed.runner.ranks import RankSpec
from testbed.spec.strategies import TORCHFT

AGENT = lighthouse_agent.__name__  # torchft's console script beside the node's own interpreter, on every backend
JOIN_TIMEOUT_MS = 1000  # how long a quorum waits for more groups once min_replicas have joined
QUORUM_TICK_MS = 100


def lighthouse_argv(port: int, min_replicas: int = 1, heartbeat_timeout_ms: int = 5000,
                    join_timeout_ms: int = JOIN_TIMEOUT_MS) -> list[str]:
    """The lighthouse's command line: on every address of its node at `port`."""
    return [sys.executable, "-m", AGENT, "--min_replicas", str(min_replicas), "--bind",
            f"[::]:{port}", "--join_timeout_ms", str(join_timeout_ms), "--quorum_tick_ms", str(QUORUM_TICK_MS),
            "--heartbeat_timeout_ms", str(heartbeat_timeout_ms)]


def replica_group_env(specs: list[RankSpec], plan: NetworkPlan, lighthouse_port: int,
                      store_port: int) -> list[RankSpec]:
    """Each rank's spec with its replica group's store (the DC's first node, `store_port`) and the lighthouse's
    address (the first node's) added."""
    first_of_dc: dict[int, str] = {}
    for node in plan.nodes:
        first_of_dc.setdefault(node.dc_index, node.address)
    url = f"http://{plan.nodes[0].address}:{lighthouse_port}"
    return [replace(s, env={**s.env, rankenv.REPLICA_STORE: f"{first_of_dc[s.node.dc_index]}:{store_port}",
                            rankenv.NODE_ADDRESS: s.node.address, rankenv.TORCHFT_LIGHTHOUSE: url}) for s in specs]


class Lighthouse:
    """torchft's lighthouse running in a node; close() kills it (and is safe to call twice)."""

    def __init__(self, fabric, node: str, argv: list[str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "wb")
        self.log_path = log
        self.proc = fabric.popen(node, argv, env=dict(os.environ), stdout=self._log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until its log says it listens; RuntimeError (its log's last line) if it died or did not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "listening" in text.lower():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        lines = self.log_path.read_text(errors="replace").splitlines()
        raise RuntimeError(f"torchft lighthouse did not start ({lines[-1] if lines else 'no output'})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if isinstance(self.proc, subprocess.Popen):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self.proc.kill()
            except Exception:  # already gone
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def __enter__(self) -> Lighthouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplicaGroups:
    """What a cell of a torchft strategy adds to its ranks: the lighthouse in the first node (start() before the
    ranks, close() after them) and each rank's group store and lighthouse address (tell())."""

    def __init__(self, testbed: Testbed, heartbeat_timeout_ms: int, log: Path, min_replicas: int = 1) -> None:
        self.testbed, self.log = testbed, log
        # below Linux's ephemeral range, as the ranks' master port (testbed.runner.ranks.rank_layout)
        self.lighthouse_port, self.store_port = random.sample(range(20000, 32000), 2)
        self.argv = lighthouse_argv(self.lighthouse_port, min_replicas, heartbeat_timeout_ms)
        self.lighthouse: Lighthouse | None = None

    def tell(self, specs: list[RankSpec]) -> list[RankSpec]:
        return replica_group_env(specs, self.testbed.plan, self.lighthouse_port, self.store_port)

    def start(self) -> None:
        self.lighthouse = Lighthouse(self.testbed.fabric, self.testbed.plan.nodes[0].name, self.argv, self.log)
        try:
            self.lighthouse.wait_ready()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.lighthouse is not None:
            self.lighthouse.close()


def heartbeat_timeout_ms(options: dict[str, Any]) -> int:
    """The lighthouse's heartbeat timeout a cell's workload options ask for (the option's default where absent)."""
    return int(options.get("heartbeat_timeout_ms") or 5000)


def replica_groups(testbed: Testbed, options: dict[str, Any], log_dir: Path) -> ReplicaGroups | None:
    """A cell's replica groups where its strategy is one of torchft's, else None."""
    if options.get("strategy") not in TORCHFT:
        return None
    return ReplicaGroups(testbed, heartbeat_timeout_ms(options), log_dir / "lighthouse.log",
                         int(options.get("min_replicas") or 1))
