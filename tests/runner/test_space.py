"""The one line of a run stopped by a full disk, for each state a run can be in (no root: a directory of result
files; the disk itself is tests/runner/test_full_disk.py's)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from testbed.runner.space import OutOfSpace, full_line, kept_cells, stop_when_full


def cells(run_dir: Path, statuses: list[str | None]) -> None:
    for index, status in enumerate(statuses):
        cell = run_dir / "cells" / f"c{index}"
        (cell / "metrics").mkdir(parents=True)
        if status is not None:
            (cell / "result.json").write_text(json.dumps({"status": status}))


def test_the_line_names_what_was_kept_and_how_to_finish(tmp_path):
    run_dir = tmp_path / "run"
    cells(run_dir, ["ok", "failed", None])  # the third began, its result was never written
    assert kept_cells(run_dir) == ["c0", "c1"]
    resume = ["testbed", "run", "my exp.yaml", "--resume"]
    assert full_line(run_dir, 4, resume) == (
        f"{run_dir}: no space left on the device (2 of 4 cells kept, each with its result.json); free some space, "
        "then `testbed run 'my exp.yaml' --resume` runs the other 2 and writes the report")
    assert full_line(run_dir, 2, resume).endswith(f"then `testbed report {run_dir}` writes the report")
    assert full_line(run_dir, 4, None).endswith(f"then `testbed report {run_dir}` reports the cells kept")
    assert "(none of 3 cells finished)" in full_line(tmp_path / "empty", 3, resume)


def test_only_a_full_disk_becomes_out_of_space(tmp_path):
    with pytest.raises(OutOfSpace, match=r"no space left on the device \(none of 1 cells finished\)"):
        with stop_when_full(tmp_path, 1, ["testbed", "run", "x", "--resume"]):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OutOfSpace):
        with stop_when_full(tmp_path, 1):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(PermissionError):
        with stop_when_full(tmp_path, 1):
            raise PermissionError(errno.EACCES, "Permission denied")
