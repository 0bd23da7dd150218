"""`testbed run` refuses every malformed experiment file of the table before building anything: exit 2,
one line naming file and field, no namespace, no results directory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..conftest import ROOT, namespaces_with
from ..experiments.malformed import MALFORMED, write

pytestmark = pytest.mark.root


def test_malformed_experiments_are_refused_before_anything_runs(prefix, tmp_path):
    procs = {}
    for case in sorted(MALFORMED):  # all at once: each is a CLI start-up, nothing more
        path = write(tmp_path, case)
        procs[case] = (path, subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(path), "--out",
                                               str(tmp_path / case / "results")], cwd=ROOT, text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for case, (path, proc) in procs.items():
        out, err = proc.communicate(timeout=120)
        _, field, needle = MALFORMED[case]
        lines = err.strip().splitlines()
        assert proc.returncode == 2, (case, out, err)
        assert len(lines) == 1 and f"{path}: {field}: " in lines[0] and needle in lines[0], (case, err)
        assert "Traceback" not in err and not (tmp_path / case / "results").exists(), case
    assert namespaces_with(prefix) == []
