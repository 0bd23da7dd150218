"""A full disk is an ordinary error (root: a small tmpfs holds the results): a run the file system has no room for
is refused before anything is built; a file system that fills during a run stops it at once with one line naming
the run directory, what was kept and how to finish, exit status 1, the finished cells intact; `--resume` after
freeing space finishes the run. The estimate the check uses is held against what the cells wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.runner.space import cell_bytes, run_bytes
from testbed.spec.experiment import load_experiment
from tests.conftest import ROOT, namespaces_with, run_cli
from tests.runner.test_run import experiment

pytestmark = pytest.mark.root


@pytest.fixture
def small_disk(tmp_path: Path):
    """Mount a tmpfs of the size asked for on a fresh directory (unmounted after the test)."""
    mounted: list[Path] = []

    def mount(size_kib: int) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(point)], check=True)
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its file system is full; the file."""
    filler = directory / "filler"
    block = b"\0" * 65536
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(block)
        except OSError:
            pass
        try:
            while True:
                out.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def only_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_a_run_the_disk_has_no_room_for_is_refused_before_anything_is_built(prefix, tmp_path, small_disk):
    disk = small_disk(64)
    path = experiment(tmp_path)
    proc = run_cli("run", str(path), "--out", str(disk), timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = only_line(proc.stderr)
    experiment_spec, topology = load_experiment(path)
    from testbed.runner.cells import plan_cells

    needed = run_bytes(plan_cells(experiment_spec, topology), 2) // 1024
    assert re.fullmatch(rf"error: {re.escape(str(disk))}/tiny/\S+: \d+ KiB free, and this run \(6 cells of 2 ranks\) "
                        rf"writes about {needed} KiB \(estimated; .*\): free some space or give another --out", line)
    assert namespaces_with(prefix) == [] and list(disk.iterdir()) == []


def test_a_disk_that_fills_during_a_run_stops_it_in_one_line_keeping_the_finished_cells(prefix, tmp_path, small_disk):
    path = experiment(tmp_path)
    experiment_spec, topology = load_experiment(path)
    from testbed.runner.cells import plan_cells

    cells = plan_cells(experiment_spec, topology)
    disk = small_disk(2 * run_bytes(cells, 2) // 1024)  # room for the run as estimated
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(path), "--out", str(disk)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:  # the first cell is finished and the second has begun: fill the disk under it
            results = list(disk.glob("tiny/*/cells/*/result.json"))
            started = list(disk.glob("tiny/*/cells/*/metrics"))
            if results and len(started) >= 2:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.02)
        filler = fill(disk)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stderr[-3000:]
    (run_dir,) = disk.glob("tiny/*")
    kept = sorted(p.parent for p in run_dir.glob("cells/*/result.json"))
    assert kept and all(json.loads((cell / "result.json").read_text())["status"] == "ok" for cell in kept)
    line = only_line(stderr)
    print(line)
    assert line == (f"error: {run_dir}: no space left on the device ({len(kept)} of 6 cells kept, each with its "
                    f"result.json); free some space, then `testbed run {path} --resume --out {disk}` runs the other "
                    f"{6 - len(kept)} and writes the report")
    assert namespaces_with(prefix) == []

    # what the finished cells wrote (tmpfs counts whole pages, as a disk counts blocks) is within the estimate
    by_id = {cell.id: cell for cell in cells}
    for cell_dir in kept:
        used = int(subprocess.run(["du", "-s", "-B1", str(cell_dir)], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
        print(f"{cell_dir.name}: {used} B written, {cell_bytes(by_id[cell_dir.name], 2)} B estimated")
        assert used <= cell_bytes(by_id[cell_dir.name], 2)

    report = run_cli("report", str(run_dir), timeout=120)  # still full: the report says so in one line
    assert report.returncode == 1 and only_line(report.stderr) == (
        f"error: {run_dir}: no space left on the device ({len(kept)} of {len(kept)} cells kept, each with its "
        f"result.json); free some space, then `testbed report {run_dir}` writes the report")

    os.unlink(filler)  # space again: the line's command finishes the run
    resumed = run_cli("run", str(path), "--resume", "--out", str(disk), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in run_dir.glob("cells/*/result.json")]
    assert len(results) == 6 and all(r["status"] == "ok" for r in results)
    assert (run_dir / "report.html").exists()
