"""`testbed run` refuses every malformed experiment file of the table before building anything: exit 2,
one line naming file and field, no namespace, no results directory.

Every case goes through the command's own code in this process (typer's runner: the same app, arguments and
error path); two of them also as the real command, whose exit status, stderr and start-up a user sees. Each
real start-up costs ~1 s of CPU here: the 49 cases as processes took 32 s of the suite (2026-11-26), in this
process 2 s."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from testbed.cli.commands import app
from tests.conftest import namespaces_with, run_cli
from tests.support.malformed import MALFORMED, write

pytestmark = pytest.mark.root

AS_PROCESSES = ("option_of_wrong_type", "fault_on_a_link_that_does_not_exist")  # a strategy's field, a fault's


def assert_refused(case: str, path: Path, results: Path, status: int, err: str) -> None:
    _, field, needle = MALFORMED[case]
    lines = err.strip().splitlines()
    assert status == 2, (case, err)
    assert len(lines) == 1 and f"{path}: {field}: " in lines[0] and needle in lines[0], (case, err)
    assert "Traceback" not in err and not results.exists(), case


def test_malformed_experiments_are_refused_before_anything_runs(prefix, tmp_path):
    runner = CliRunner()
    for case in sorted(MALFORMED):
        path, results = write(tmp_path, case), tmp_path / case / "results"
        outcome = runner.invoke(app, ["run", str(path), "--out", str(results)])
        assert_refused(case, path, results, outcome.exit_code, outcome.stderr)
    assert namespaces_with(prefix) == []


@pytest.mark.parametrize("case", AS_PROCESSES)
def test_the_command_refuses_in_one_line_on_its_stderr(prefix, tmp_path, case):
    path, results = write(tmp_path, case), tmp_path / case / "results"
    proc = run_cli("run", str(path), "--out", str(results))
    assert_refused(case, path, results, proc.returncode, proc.stderr)
    assert namespaces_with(prefix) == []
