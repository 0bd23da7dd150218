"""Faults on a schedule, while a cell runs: link faults through the fabric (Testbed.apply_fault / clear_fault,
recorded in the state file before each change), rank faults through the cell's ranks (kill: SIGKILL; straggler:
the rank stopped and continued by a loop on its node so that it runs 1/slowdown of the time:
testbed.runner.straggler), and `cells/<id>/faults.json` rewritten as each happens.

The schedule is testbed.plan.faults' (pure); this module only watches the clock and rank 0's step starts
(`step_begin` lines in its metrics) and acts. Times in faults.json are seconds on the cell's clock, whose zero is
rank 0's start of step 0."""

from __future__ import annotations

import gc
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from testbed import settings
from testbed.agents.realtime import fifo
from testbed.atomic import LatestWriter
from testbed.fabric.lifecycle import Testbed
from testbed.plan.faults import FaultAction, due, fault_seed, impaired, link_keys, schedule
from testbed.spec.faults import Fault

POLL_S = 0.01  # how often the driver looks at the clock and rank 0's metrics
# SCHED_FIFO for the driver's thread, below the probe's (5) and the delay line's (10): with three busy loops on
# this 2-core machine an ordinary thread acted 0.04-0.06 s late (CI: 0.046-0.052 s, 2026-12-01)
RT_PRIORITY = 3

Signal = Callable[[int, int], None]  # (rank, signal number)


class Slowing(Protocol):
    def stop(self) -> bool: ...  # whether the rank was continued as the straggler ended


Slow = Callable[[int, float, float], Slowing]  # (rank, slowdown, until: epoch seconds): a straggler's loop


def step_starts(path: Path, offset: int, seen: dict[int, float]) -> int:
    """Read rank 0's new `step_begin` lines from `path` (from byte `offset`) into `seen` (step -> time); the
    new offset (a line cut at the end is read next time)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except OSError:
        return offset
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].splitlines():
        if b'"step_begin"' in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            seen[int(record["step"])] = float(record["time"])
    return offset + end


def fault_id(index: int, window: int = 0) -> str:
    return f"fault{index}" + (f".{window}" if window else "")


class FaultDriver:
    """Applies one cell's faults on their schedule in a thread; stop() clears whatever is still in force."""

    def __init__(self, testbed: Testbed, faults: list[Fault], cell_id: str, workload_seed: int,
                 rank0: Path | None, record: Path | None, signal_rank: Signal | None = None,
                 slow_rank: Slow | None = None, zero: float | None = None,
                 rank_nodes: list[str] | None = None, clock_at_start: bool = False,
                 rank_dcs: list[str] | None = None, hold_rank: Callable[[int], None] | None = None,
                 restart_rank: Callable[[int], None] | None = None) -> None:
        """`rank0`: rank 0's metrics file, with its step starts, as it is written (here, or a live copy:
        testbed.runner.follow; None: no step anchors, as by hand); `zero`: the clock's zero when it is known now
        (by hand), else rank 0's start of step 0 (on its node's clock: SSH hosts' clocks must agree, as NTP
        keeps them; the host check reports each one's offset); `rank_nodes`: each rank's node (a kill's session
        there is opened before the clock starts); `clock_at_start` (by hand, instead of `zero`): the clock starts
        when the driver's thread is ready to act, so that what start() and the thread prepare (a full garbage
        collection, a netlink socket: 0.1-0.2 s) does not shorten a fault due at 0 s whose clear stays on time.
        `rank_dcs`: each rank's DC (a DC's kill); `hold_rank`: told of a rank before a kill, so that its death does
        not end the cell (torchft's strategies train on); `restart_rank`: starts a killed rank again (restart_after)."""
        self.testbed, self.faults = testbed, faults
        # faults.json is rewritten after every action from a thread of its own: on a busy disk one write took up to
        # 0.26 s here, and the next action (a flap's clear, the next fault) waited for it in the driver's thread
        self._writer = LatestWriter(record, name="faults.json") if record is not None else None
        self.rank_nodes = rank_nodes or []
        self.rank_dcs = rank_dcs or []
        self.hold_rank, self.restart_rank = hold_rank, restart_rank
        self.rank0 = rank0
        self.signal_rank, self.slow_rank = signal_rank, slow_rank
        self.actions = schedule(faults)
        self.entries: list[dict[str, Any]] = [
            {"index": i, "kind": f.kind, "target": f.target_name(), "at": str(f.at),
             "seed": fault_seed(workload_seed, cell_id, i), "windows": []} for i, f in enumerate(faults)]
        self.errors: list[str] = []
        self.zero: float | None = zero
        self.clock_at_start = clock_at_start
        self._stop = threading.Event()
        self.ready = threading.Event()  # set once the thread has prepared and can act (its clock started, if it starts it)
        self._lock = threading.Lock()
        self._stragglers: dict[int, tuple[int, Slowing]] = {}  # fault index -> (rank, its loop)
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self.scheduling = "other"  # what the thread runs as: 'fifo' once it could have SCHED_FIFO
        self._frozen = False  # whether start() froze the heap (gc.freeze) for stop() to hand back

    # --- the cell's side --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start acting. While the faults run, what the process holds now is kept out of the garbage collector's
        full passes (gc.freeze after a collection): one over the harness's heap took 0.11-0.13 s with torch and
        pandas loaded (measured 2026-11-24) and holds the GIL, so a fault fell due that much late (a clear came
        0.11 s late once in the suite); afterwards 0.1 ms. stop() hands the objects back to the collector."""
        self._write()
        if any(fault.is_link for fault in self.faults):
            self.testbed.fabric.prepare_link_faults()  # an SSH or docker exec session: most of a first change
        signalled = {rank for fault in self.faults if fault.kind in ("kill", "straggler") for rank in self.ranks_of(fault)}
        nodes = sorted({self.rank_nodes[rank] for rank in signalled if rank < len(self.rank_nodes)})
        if nodes:  # the same for a kill's signal and a straggler's loop on its rank's node
            self.testbed.fabric.prepare_rank_faults(nodes)
        if self.actions:
            gc.collect()
            gc.freeze()
            self._frozen = True
            self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop acting, clear every link fault still in force, continue stopped ranks; the faults.json record."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for index in list(self._stragglers):
            try:
                self._end_straggler(index)
            except Exception as error:  # its node unreachable: the link faults are cleared all the same
                fault = self.faults[index]
                self.errors.append(f"{fault.kind} {fault.target_name()} (ending it): {error}")
        for action in self.actions:
            window = self._window(action)
            if self.faults[action.fault].kind == "kill":
                continue  # a restart not yet due when the cell ended: the ranks are not started again
            if action.action == "clear" and window.get("applied_at") is not None and window.get("cleared_at") is None:
                self._act(action, self._now(), late=True)
        self._write()
        if self._writer is not None:
            self._writer.close()  # the record is on file when stop() returns
        if any(fault.is_link for fault in self.faults):
            self.testbed.fabric.release_link_faults()
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
        return self.summary()

    def ranks_of(self, fault: Fault) -> list[int]:
        """The ranks a rank fault acts on: its rank, or every rank of its DC."""
        if fault.dc is not None:
            return [rank for rank, dc in enumerate(self.rank_dcs) if dc == fault.dc]
        return [fault.rank] if fault.rank is not None else []

    def wait(self, timeout: float | None = None) -> None:
        """Until every action has been taken (or `timeout`)."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def summary(self) -> dict[str, Any]:
        """faults.json: one entry per fault (a flap: per down window) with kind, target, when it was due and
        when it was applied and cleared, seconds on the cell's clock."""
        flat = []
        for entry in self.entries:
            windows = entry["windows"] or [{"scheduled_at": None, "applied_at": None, "clear_scheduled_at": None,
                                            "cleared_at": None}]
            for number, window in enumerate(windows):
                flat.append({**{k: v for k, v in entry.items() if k != "windows"},
                             **({"window": number} if len(windows) > 1 else {}), **window})
        return {"clock_zero": self.zero, "scheduling": self.scheduling, "faults": flat, "errors": list(self.errors)}

    # --- the thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        self.scheduling = fifo(settings.FAULTS_RT, RT_PRIORITY, reset_on_fork=True)
        if any(fault.is_link for fault in self.faults):
            try:  # again, in the thread that makes the changes: pyroute2 keeps a netlink socket per thread (netns)
                self.testbed.fabric.prepare_link_faults()
            except Exception as error:  # start() prepared them once already: a change would say what is wrong
                self.errors.append(f"preparing the link faults in the fault thread: {error}")
        if self.clock_at_start:
            self.zero = time.time()
        self.ready.set()
        starts: dict[int, float] = {}
        offset = 0
        pending = list(self.actions)
        while pending and not self._stop.is_set():
            if self.rank0 is not None:
                offset = step_starts(self.rank0, offset, starts)
            if self.zero is None and 0 in starts:
                self.zero = starts[0]
            now = time.time()
            for action in list(pending):
                when = due(action, starts, self.zero)
                if when is not None and now >= when:
                    pending.remove(action)
                    self._act(action, when)
            self._stop.wait(POLL_S)

    def _now(self) -> float:
        return time.time()

    def _cell_time(self, moment: float) -> float | None:
        return None if self.zero is None else round(moment - self.zero, 4)

    def _window(self, action: FaultAction) -> dict[str, Any]:
        windows = self.entries[action.fault]["windows"]
        while len(windows) <= action.window:
            windows.append({"scheduled_at": None, "applied_at": None, "clear_scheduled_at": None, "cleared_at": None})
        return windows[action.window]

    def _act(self, action: FaultAction, when: float, late: bool = False) -> None:
        fault = self.faults[action.fault]
        window = self._window(action)
        with self._lock:
            try:
                if action.action == "apply":
                    window["scheduled_at"] = self._cell_time(when)
                    self._apply(action, fault, when)
                    window["applied_at"] = self._cell_time(time.time())
                else:
                    window["clear_scheduled_at"] = self._cell_time(when)
                    if window.get("applied_at") is not None:
                        self._clear(action, fault)
                        window["cleared_at"] = self._cell_time(time.time())
                        if late:
                            window["cleared_when"] = "at the cell's end"
            except Exception as error:
                self.errors.append(f"{fault.kind} {fault.target_name()} ({action.action}): {error}")
            self._write()

    def _apply(self, action: FaultAction, fault: Fault, when: float) -> None:
        if fault.is_link:
            plan = self.testbed.plan
            self.testbed.apply_fault(fault_id(action.fault, action.window),
                                     {key: impaired(plan.link_end(key).shaping.params, fault)
                                      for key in link_keys(fault)})
        elif fault.kind == "kill":
            ranks = self.ranks_of(fault)
            if not ranks:
                raise RuntimeError(f"no rank in {fault.target_name()}")
            for rank in ranks:
                if self.hold_rank is not None:
                    self.hold_rank(rank)
                self._signal_rank(rank, signal.SIGKILL)
        elif fault.kind == "straggler":
            assert fault.rank is not None and fault.duration is not None and fault.slowdown is not None
            if self.slow_rank is None:
                raise RuntimeError("this run cannot slow its ranks")
            # its loop ends by itself when the window is due to clear (from when it was due, not when it started);
            # slow_rank returns once the loop sent its first STOP, so applied_at is no earlier than that
            self._stragglers[action.fault] = (fault.rank, self.slow_rank(fault.rank, fault.slowdown,
                                                                         when + fault.duration))

    def _clear(self, action: FaultAction, fault: Fault) -> None:
        if fault.is_link:
            self.testbed.clear_fault(fault_id(action.fault, action.window))
        elif fault.kind == "kill":  # restart_after: the killed ranks start again
            if self.restart_rank is None:
                raise RuntimeError("this run cannot restart its ranks")
            for rank in self.ranks_of(fault):
                self.restart_rank(rank)
        elif fault.kind == "straggler":
            self._end_straggler(action.fault)

    def _end_straggler(self, index: int) -> None:
        """Its loop ends (it continues the rank as it goes; one killed first could not: the rank is continued)."""
        if index not in self._stragglers:
            return
        rank, straggler = self._stragglers.pop(index)
        continued = False
        try:
            continued = straggler.stop()
        finally:
            if not continued:
                try:
                    self._signal_rank(rank, signal.SIGCONT)
                except Exception:
                    pass  # the rank is gone

    def _signal_rank(self, rank: int, number: int) -> None:
        if self.signal_rank is None:
            raise RuntimeError("this run cannot signal its ranks")
        self.signal_rank(rank, number)

    def _write(self) -> None:
        if self._writer is not None:
            self._writer.submit(json.dumps(self.summary(), indent=1))
