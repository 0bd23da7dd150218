"""The fork launcher against the exec launcher (root): the same cells give the same losses and bytes; a forked
rank killed mid-cell fails its cell fast, named, and nothing is left (namespaces, ranks, the fork server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyroute2 import netns

from tests.conftest import ROOT, namespaces_with, run_cli

pytestmark = pytest.mark.root

EXPERIMENT = """name: launch
topology:
  name: pair
  dcs: [{{name: east, nodes: 2}}, {{name: west, nodes: 2}}]
  links: [{{between: [east, west], latency: 1ms, bandwidth: 1gbit}}]
workload: {{steps: {steps}, warmup_steps: 1, micro_batch: 2, micro_batches: 1, seed: 7}}
strategies: {strategies}
baseline: none
calibrate: none
cell_timeout: {timeout}s
"""
COMPARED = ("loss", "bytes_intra", "bytes_inter", "wire_intra", "wire_inter", "tokens")


def write(tmp: Path, steps: int = 3, strategies: str = "[flat-dp, hier-dp]", timeout: int = 120) -> Path:
    path = tmp / "launch.yaml"
    path.write_text(EXPERIMENT.format(steps=steps, strategies=strategies, timeout=timeout))
    return path


def only_run(out: Path) -> Path:
    runs = [p for p in (out / "launch").glob("*") if (p / "manifest.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def step_figures(run_dir: Path) -> dict[tuple[str, int, int], tuple]:
    """(cell, rank, step) -> the figures both launchers must agree on."""
    out = {}
    for path in (run_dir / "cells").glob("*/metrics/rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["event"] == "step":
                out[(path.parent.parent.name, record["rank"], record["step"])] = tuple(record[k] for k in COMPARED)
    return out


def results(run_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "cells").glob("*/result.json")}


def test_fork_and_exec_launchers_give_the_same_losses_and_bytes(prefix, tmp_path):
    path = write(tmp_path, strategies="[hier-dp]")  # the intra- and the inter-DC groups; one cell (each is ~10 s)
    figures, runs = {}, {}
    for launcher in ("exec", "fork"):
        run_cli("run", str(path), "--out", str(tmp_path / launcher), "--launcher", launcher, timeout=300, check=True)
        runs[launcher] = results(only_run(tmp_path / launcher))
        figures[launcher] = step_figures(only_run(tmp_path / launcher))
    assert {r["launcher"] for r in runs["exec"].values()} == {"exec"}
    assert {r["launcher"] for r in runs["fork"].values()} == {"fork"}
    assert len(figures["exec"]) == 1 * 4 * 3  # cells x ranks x steps
    assert figures["fork"] == figures["exec"]  # real compute: every loss equal to the last bit
    assert all(f[0] is not None and f[2] > 0 for f in figures["fork"].values())
    assert namespaces_with(prefix) == []


def _pids_in(namespace: str) -> list[int]:
    return list(netns.ns_pids().get(namespace, []))


def _forkservers() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if b"testbed.agents.forkserver" in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _start_fork_run(tmp_path: Path) -> subprocess.Popen:
    """`testbed run --launcher fork` of a long flat-dp cell, in the background."""
    path = write(tmp_path, steps=400, strategies="[flat-dp]", timeout=60)
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(path), "--out", str(tmp_path / "out"),
                             "--launcher", "fork"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rank3_metrics(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "out").glob("launch/*/cells/*/metrics/rank3.jsonl"))


def _while_running(proc: subprocess.Popen, condition, timeout: float = 120):
    """Poll `condition` until it is true and return it; fails if the run ends or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.05)
    return found


def test_a_killed_forked_rank_fails_its_cell_fast_and_leaves_nothing(prefix, tmp_path):
    before = set(_forkservers())
    proc = _start_fork_run(tmp_path)
    try:
        def victim() -> list[int]:
            metrics = _rank3_metrics(tmp_path)
            return _pids_in(f"{prefix}west-1") if metrics and metrics[0].read_text().count("\n") >= 3 else []

        victim = _while_running(proc, victim)
        assert len(victim) == 1  # the forked rank itself, in its node's namespace
        os.kill(victim[0], signal.SIGKILL)
        killed_at = time.monotonic()
        _out, err = proc.communicate(timeout=120)
        finished_in = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-2000:]
    result = results(only_run(tmp_path / "out"))["flat-dp__r0"]
    assert result["launcher"] == "fork" and result["status"] == "failed" and result["failed_rank"] == 3
    assert "rank 3 on west-1 died (signal 9)" in result["reason"]
    assert finished_in < 30, finished_in  # failed fast, not at the 60 s timeout
    assert namespaces_with(prefix) == []
    assert set(_forkservers()) <= before  # the fork server is gone, and so is every rank (they share its cmdline)
    for name in ("east-0", "east-1", "west-0"):
        assert _pids_in(f"{prefix}{name}") == []


def test_the_fork_server_and_its_ranks_go_when_the_runner_is_killed(prefix, tmp_path):
    before = set(_forkservers())
    proc = _start_fork_run(tmp_path)
    try:
        _while_running(proc, lambda: _rank3_metrics(tmp_path))
        inside = {pid for name, pids in netns.ns_pids().items() if name.startswith(prefix) for pid in pids}
        children = {pid for pid in _forkservers() if _parent(pid) == proc.pid}  # the server: the runner's child
        ours = (set(_forkservers()) - before) & (inside | children)  # not another run's started meanwhile
        assert len(ours) == 5  # the server and its four ranks
        proc.kill()  # SIGKILL: the runner tears nothing down
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while set(_forkservers()) & ours and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(_forkservers()) & ours  # the server saw its socket close, killed its ranks and left
    assert all(_pids_in(f"{prefix}{name}") == [] for name in ("east-0", "east-1", "west-0", "west-1"))
