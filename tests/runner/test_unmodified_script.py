"""A training script nobody changed for testbed (examples/toy_ddp.py: the PyTorch DDP tutorial's ToyModel, no testbed
import) gets step figures under `testbed run --topology ... --baseline` on the netns fabric (root): its optimizer's
steps, seen by the hook testbed installs at each rank's start, give both cells step times, the efficiency against the
baseline and, with --tokens-per-step, tokens/s. A command whose interpreter has no torch fails naming it."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.collect.report import PEOPLE
from tests.conftest import ROOT, namespaces_with, run_cli

pytestmark = pytest.mark.root

PAIR = """name: pair
dcs: [{name: east, nodes: 1}, {name: west, nodes: 1}]
links: [{between: [east, west], latency: 5ms, bandwidth: 1gbit}]
"""


def test_an_unmodified_ddp_script_gets_step_times_and_efficiency(prefix, tmp_path):
    assert "testbed" not in (ROOT / "examples" / "toy_ddp.py").read_text().split('"""')[2]  # not a line of its code
    topology = tmp_path / "pair.yaml"
    topology.write_text(PAIR)
    proc = run_cli("run", "--topology", str(topology), "--baseline", "--tokens-per-step", "40", "--out",
                   str(tmp_path / "out"), "--", sys.executable, str(ROOT / "examples" / "toy_ddp.py"), "--steps", "6",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp_path / "out").glob("command-pair/*"))
    rows = {row["cell"]: row for row in csv.DictReader(open(run_dir / "summary.csv"))}
    assert set(rows) == {"command__baseline", "command"}
    for row in rows.values():
        assert row["status"] == "ok" and row["steps"] == "6" and row["step_source"] == "optimizer hook"
        assert float(row["step_s_median"]) > 0 and float(row["tokens_per_s"]) > 0
    shaped, unshaped = rows["command"], rows["command__baseline"]
    assert float(shaped["step_s_median"]) > float(unshaped["step_s_median"])  # each step all-reduces across 2 x 5 ms
    assert float(shaped["efficiency_vs_single_site"]) == pytest.approx(
        float(shaped["tokens_per_s"]) / float(unshaped["tokens_per_s"]))
    steps = list(csv.DictReader(open(run_dir / "steps.csv")))
    assert sorted((r["cell"], r["rank"], r["step"]) for r in steps) == sorted(
        (cell, str(rank), str(step)) for cell in rows for rank in range(2) for step in range(6))
    assert all(float(r["tokens"]) == 20 for r in steps)  # 40 per step, all ranks together
    reading = (run_dir / "report.md").read_text().split("## Reading", 1)[1].split("##", 1)[0]
    first = reading.strip().splitlines()[0]
    assert first.startswith("- Your command's step (the optimizer's steps, seen by testbed's hook"), reading
    assert f"**{float(shaped['efficiency_vs_single_site']):.0%}** efficiency against the baseline" in first
    assert PEOPLE["step_s_median"][0] in (run_dir / "report.html").read_text()  # the Results table's column
    assert namespaces_with(prefix) == []


def python_without_torch() -> str:
    for name in ("/usr/bin/python3", shutil.which("python3") or ""):
        if name and os.access(name, os.X_OK) and subprocess.run([name, "-c", "import torch"], capture_output=True,
                                                                timeout=60).returncode != 0:
            return name
    pytest.skip("every python3 here has torch")
    raise AssertionError("unreachable")


def test_a_command_whose_python_has_no_torch_names_it(prefix, tmp_path):
    bare = python_without_torch()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(bare)
    topology = tmp_path / "pair.yaml"
    topology.write_text(PAIR)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "--topology", str(topology), "--out",
                           str(tmp_path / "out"), "--", "python", str(ROOT / "examples" / "toy_ddp.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = next(line for line in proc.stderr.splitlines() if line.startswith("FAIL: cell command:"))
    assert "died (exit code 1): `python` (on the rank's PATH) ran " in line, line
    ran = line.split(" ran ", 1)[1].split(", which cannot import torch", 1)[0]
    assert Path(ran).resolve() == Path(bare).resolve(), line
    assert namespaces_with(prefix) == []
