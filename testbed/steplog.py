"""Step metrics from any training script: one call per step, written as the JSON lines testbed reads.

Standard library only: import it (`from testbed.steplog import StepLog`) or copy this file next to your
script. Under `testbed run` every rank gets TESTBED_METRICS_DIR; elsewhere (no such variable) it writes
nothing, so the same script runs anywhere.

    log = StepLog()                     # rank from $RANK; the clock starts now
    for step in range(steps):
        loss = train_one_step()
        log.step(tokens=local_batch * seq_len, loss=loss.item())
    log.close()

File format: one file per rank, `$TESTBED_METRICS_DIR/rank<RANK>.jsonl`, one JSON object per line, each line
appended and flushed as it is written (a line cut by a crash is skipped when read):

    {"event": "start", "rank": 0, "time": 1767000000.0, "source": "steplog", ...}   optional, first
    {"event": "step", "step": 0, "rank": 0, "wall_s": 0.305, "tokens": 8192, "loss": 5.41, "time": ...}
    {"event": "end", "rank": 0, "steps": 12, "time": ...}                            close(): the script is done

A step line needs `event` ("step"), `step` (0, 1, ... the same numbering on every rank), `rank`, `wall_s`
(seconds this rank spent on the step) and `tokens` (tokens this rank trained on in the step: the step's
global tokens are the sum over ranks; null when not known: step times and efficiency then, no tokens/s).
Optional: `loss`, `exposed_s` (seconds spent waiting on communication), `bytes_inter` (bytes handed to
collectives that span DCs), and any other field.

From these testbed computes what it computes for its own workload (after the experiment's warm-up
steps, 2 for `testbed run --topology`): a step lasts as long as its slowest rank; tokens/s is the measured
steps' global tokens over their summed wall time; step time median, p90 and mean; with a baseline run
(`testbed run --topology T --baseline -- ...`: the same command first with every inter-DC link unshaped)
the efficiency against that single-site run; final loss and the loss curve.

A script that does not call this still gets step lines under `testbed run --topology`: the optimizer's steps, seen
by a hook testbed installs at each rank's start (testbed/workload/autostep.py, lines with `"source": "autostep"`).
Where a rank's file has lines of its own script, those count and the hook's are left out (step_records).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

try:
    from testbed import rankenv
except ImportError:  # loaded by its path (testbed.workload.autostep, a script's copy): rankenv is stdlib only too
    import importlib.util

    _spec = importlib.util.spec_from_file_location("_testbed_rankenv", Path(__file__).resolve().parent / "rankenv.py")
    assert _spec is not None and _spec.loader is not None
    rankenv = sys.modules["_testbed_rankenv"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
    _spec.loader.exec_module(rankenv)

__all__ = ["StepLog"]


def read_records(path: str | os.PathLike, containing: str | None = None) -> list[dict[str, Any]]:
    """Every record of one rank's file, in order; a line cut by a crash (or a kill) is skipped. `containing`:
    only lines with this text are parsed (a cheap filter for a few records among many steps)."""
    records = []
    for line in Path(path).read_text().splitlines():
        if containing is not None and containing not in line:
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


END = "end"  # the event StepLog.close() writes: the script said it is done with its steps


def closed(path: str | os.PathLike) -> dict[str, Any] | None:
    """The end line of one rank's file when its script closed its StepLog after its last step (a process that ends
    by a signal after it is how the runner tells an abort in teardown from a death mid-run), else None."""
    try:
        records = read_records(path)
    except OSError:
        return None
    last = next((record for record in reversed(records) if record.get("event") in (END, "step")), None)
    return last if last is not None and last.get("event") == END else None


AUTOMATIC = "autostep"  # the `source` of the step lines testbed's optimizer hook writes (testbed.workload.autostep)


def step_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The step lines of one rank's file: those its script wrote (with StepLog, or in this format) where there
    are any, else the ones testbed's optimizer hook wrote: one count of each step, never both."""
    steps = [record for record in read_records(path) if record.get("event") == "step"]
    own = [record for record in steps if record.get("source") != AUTOMATIC]
    return own or steps


class StepLog:
    """Appends one JSON line per training step to $TESTBED_METRICS_DIR/rank<RANK>.jsonl (nothing without it)."""

    def __init__(self, directory: str | os.PathLike | None = None, rank: int | None = None, **start: Any) -> None:
        """directory: default $TESTBED_METRICS_DIR; rank: default $RANK (0); `start`: extra fields for the
        start line (model size, options...). The clock of the first step starts here."""
        directory = directory if directory is not None else os.environ.get(rankenv.METRICS_DIR)
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
        self.path = Path(directory) / f"rank{self.rank}.jsonl" if directory else None
        self.steps = 0
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)
        self._write({"event": "start", "rank": self.rank, "time": time.time(), "source": "steplog", **start})
        self._last = time.perf_counter()

    def restart_clock(self) -> None:
        """Start the next step's clock now (e.g. after setup done between construction and the loop)."""
        self._last = time.perf_counter()

    def step(self, tokens: int | float | None, loss: float | None = None, *, wall_s: float | None = None,
             **fields: Any) -> dict:
        """Record one finished step: `tokens` this rank trained on (None: not known), its `loss`; the step's wall
        time is the time since the previous call (or construction, or restart_clock()) unless given. Returns the
        record."""
        now = time.perf_counter()
        record = {"event": "step", "step": self.steps, "rank": self.rank,
                  "wall_s": float(now - self._last if wall_s is None else wall_s),
                  "tokens": None if tokens is None else float(tokens),
                  "loss": None if loss is None else float(loss), "time": time.time(), **fields}
        self._write(record)
        self.steps += 1
        self._last = now  # consecutive steps partition the time: writing this line counts in the next step
        return record

    def close(self) -> None:
        """The script is done with its steps: one end line, then the file is closed (again: nothing)."""
        if self._file is not None:
            self._write({"event": END, "rank": self.rank, "steps": self.steps, "time": time.time()})
            self._file.close()
            self._file = None

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
