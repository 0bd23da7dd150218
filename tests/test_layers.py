"""What the import contracts (pyproject, scripts/lint) cannot see, because it happens at run time: loading an
experiment file never imports torch, and the `testbed` command imports nothing heavy before a command runs
(so `testbed --help` stays fast)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def imported_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_loading_an_experiment_leaves_torch_unimported():
    modules = imported_after("from testbed.spec.experiment import load_experiment\n"
                             "load_experiment('experiments/quickstart.yaml')")
    assert "torch" not in modules and not {m for m in modules if m.startswith("testbed.workload")}
    assert {m.split(".")[1] for m in modules if m.startswith("testbed.")} == {"spec"}


def test_the_command_line_imports_nothing_heavy_until_a_command_runs():
    modules = imported_after("import testbed.cli")
    assert not {"torch", "pyroute2", "pydantic", "pandas", "matplotlib", "docker", "paramiko"} & modules
