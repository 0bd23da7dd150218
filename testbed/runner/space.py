"""Room for a run's results: what a run will write (estimated before its first cell), the free space of the file
system that holds them, and a full disk as an ordinary error (OutOfSpace: one line naming the run directory, what
was kept and how to finish).

The estimate, in file system blocks (4 KiB: small files take a whole one), from two runs' result directories on
this machine (2026-11-28, ext4): a cell writes 5 blocks (its directory, metrics/ and logs/, result.json,
faults.json), 2 per rank (its log and its metrics file) and 370-450 bytes per rank and step of metrics, which
the report's steps.csv repeats in about 250 more; a run writes 200-350 KiB besides (manifest, calibration,
report, plots, tables). Measured: one quickstart cell of 4 ranks x 12 steps took 76 KiB on disk (estimated
100 KiB), six cells of 2 ranks x 4 steps 216 KiB (estimated 264 KiB); the whole runs 352 and 424 KiB (estimated
612 and 776 KiB): the estimate is above what a run writes, never far below. With restarts, each rank may keep
three checkpoints at once (two kept, one being written) of the model's parameters and AdamW's two moments."""

from __future__ import annotations

import errno
import json
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed.plan.cells import Cell

FULL = (errno.ENOSPC, errno.EDQUOT)  # the file system (or the user's quota) is full
BLOCK = 4096
CELL_BLOCKS = 5  # cells/<id>/, metrics/, logs/, result.json, faults.json
RANK_BLOCKS = 2  # logs/rankN.log, metrics/rankN.jsonl
RANK_STEP_BYTES = 1024  # metrics (370-450 B measured) and the report's steps.csv (~250 B), rounded up
RUN_BYTES = 512 * 1024  # manifest, calibration, report, plots, tables: 200-350 KiB measured
CHECKPOINT_BYTES_PER_PARAMETER = 12  # fp32 parameters and AdamW's two moments
CHECKPOINTS_AT_ONCE = 3  # two kept and one being written (testbed.workload.checkpoint)


class OutOfSpace(Exception):
    """The results' file system is (or would be) full: str() is the one line for the user (exit status 1)."""


def cell_bytes(cell: Cell, ranks: int, restarts: int = 0) -> int:
    """What cell `cell` of `ranks` ranks writes (module docstring)."""
    steps = int(cell.options.get("steps") or 0)
    total = BLOCK * (CELL_BLOCKS + RANK_BLOCKS * ranks) + RANK_STEP_BYTES * ranks * steps
    if restarts and cell.options.get("preset"):
        total += CHECKPOINTS_AT_ONCE * ranks * CHECKPOINT_BYTES_PER_PARAMETER * parameters(cell)
    return total


def parameters(cell: Cell) -> int:
    """The parameter count of the cell's model."""
    from testbed.model.shapes import config, parameter_count
    from testbed.spec.strategies import Options

    return parameter_count(config(Options(**cell.options)))


def run_bytes(cells: list[Cell], ranks: int, restarts: int = 0) -> int:
    """What a run of `cells` writes: theirs and the run's own files (a resumed run: only the cells still to do)."""
    return RUN_BYTES + sum(cell_bytes(cell, ranks, restarts) for cell in cells)


def free_bytes(path: Path) -> int:
    """Free space for an ordinary user on the file system that holds `path` (or would: its nearest existing
    parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def size(count: float) -> str:
    """Bytes in words: 512 KiB, 3.2 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit in ("B", "KiB") else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover


def check_room(run_dir: Path, needed: int, what: str) -> None:
    """OutOfSpace, before anything is written, when the file system of `run_dir` has less than `needed` free."""
    free = free_bytes(run_dir)
    if free < needed:
        raise OutOfSpace(f"{run_dir}: {size(free)} free, and {what} writes about {size(needed)} "
                         f"(estimated; see testbed.runner.space): free some space or give another --out")


def is_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in FULL


def kept_cells(run_dir: Path) -> list[str]:
    """The cells of `run_dir` whose result.json is complete."""
    kept = []
    for path in sorted((run_dir / "cells").glob("*/result.json")):
        try:
            if json.loads(path.read_text()).get("status") in ("ok", "failed"):
                kept.append(path.parent.name)
        except (OSError, ValueError):
            pass
    return kept


def full_line(run_dir: Path, total: int, resume: list[str] | None) -> str:
    """The one line of a run stopped by a full disk: the directory, what was kept, how to finish. `resume`: the
    command that runs the missing cells (None: the run's files cannot be made again, e.g. a user's command)."""
    kept = len(kept_cells(run_dir))
    missing = max(total - kept, 0)
    if not missing:
        finish = f"`testbed report {shlex.quote(str(run_dir))}` writes the report"
    elif resume:
        finish = f"`{shlex.join(resume)}` runs the other {missing} and writes the report"
    else:
        finish = f"`testbed report {shlex.quote(str(run_dir))}` reports the cells kept"
    what = f"{kept} of {total} cells kept, each with its result.json" if kept else f"none of {total} cells finished"
    return f"{run_dir}: no space left on the device ({what}); free some space, then {finish}"


@contextmanager
def stop_when_full(run_dir: Path, total: int, resume: list[str] | None = None) -> Iterator[None]:
    """Turn a write that failed for want of space (anywhere in the block) into OutOfSpace with full_line()."""
    try:
        yield
    except OSError as error:
        if not is_full(error):
            raise
        raise OutOfSpace(full_line(run_dir, total, resume)) from error


def room_for_cell(run_dir: Path, needed: int, total: int, resume: list[str] | None) -> None:
    """Stop before a cell whose files cannot be written (its estimate is more than the space left)."""
    if free_bytes(run_dir) < needed:
        raise OutOfSpace(full_line(run_dir, total, resume))


def failed_for_room(cell_dir: Path, result: dict, needed: int, total: int, resume: list[str] | None) -> None:
    """A cell that failed while the disk was full (its ranks could not write) is not kept as a failure: its
    result goes (--resume runs it again) and the run stops."""
    if result["status"] == "ok":
        return
    said = any("No space left" in line for line in result.get("log_tail") or [])
    if said or free_bytes(cell_dir) < needed:
        (cell_dir / "result.json").unlink(missing_ok=True)
        raise OutOfSpace(full_line(cell_dir.parent.parent, total, resume))
