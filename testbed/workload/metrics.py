"""Per-step accounting: time (compute, communication total and exposed, bubble) and bytes (intra/inter DC).

Bytes are counted two ways, both per rank and per step:
- payload: bytes of the tensors this rank hands to collectives (or sends point to point), split by whether
  the group spans DCs. This is the quantity the strategies' theory speaks of (hier-dp moves 1/n of
  flat-dp's payload across DCs with n nodes per DC; DiLoCo 1/H per step).
- wire: what this rank puts on the wire under a ring algorithm (gloo's): all-reduce 2(g-1)/g x N,
  reduce-scatter (g-1)/g x N, all-gather (g-1) x N; counted inter-DC when the rank's ring successor
  sits in another DC. The kernel's link counters are the ground truth for this.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from testbed.workload.layout import Layout

WIRE_FACTOR = {"all_reduce": lambda g: 2 * (g - 1) / g, "reduce_scatter": lambda g: (g - 1) / g,
               "all_gather": lambda g: float(g - 1), "p2p": lambda g: 1.0}


@dataclass
class StepCounters:
    compute_s: float = 0.0
    comm_s: float = 0.0  # time collectives were in flight (may overlap compute)
    comm_intra_s: float = 0.0  # of comm_s: collectives over one DC's ranks
    comm_inter_s: float = 0.0  # of comm_s: collectives whose group spans DCs
    exposed_s: float = 0.0  # time the training thread waited for communication
    bubble_s: float = 0.0  # pipeline: time waiting for activations/gradients
    bytes_intra: float = 0.0
    bytes_inter: float = 0.0
    wire_intra: float = 0.0
    wire_inter: float = 0.0
    extra: dict = field(default_factory=dict)


class Meter:
    """Collects one step's counters; thread-safe (the overlap strategies communicate from a thread)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.step = StepCounters()
        self._lock = threading.Lock()

    def reset(self) -> StepCounters:
        with self._lock:
            done, self.step = self.step, StepCounters()
        return done

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            setattr(self.step, name, getattr(self.step, name) + seconds)

    @contextmanager
    def timed(self, *names: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            for name in names:
                self.add(name, elapsed)

    def spans_dcs(self, ranks: list[int]) -> bool:
        """Whether a group of `ranks` reaches across DCs."""
        return len({self.layout.dc_of(r) for r in ranks}) > 1

    def _comm_share(self, ranks: list[int]) -> str:
        return "comm_inter_s" if self.spans_dcs(ranks) else "comm_intra_s"

    def comm_timed(self, ranks: list[int]) -> AbstractContextManager[None]:
        """Time a collective over `ranks` into comm_s and into comm_intra_s or comm_inter_s."""
        return self.timed("comm_s", self._comm_share(ranks))

    def add_comm(self, seconds: float, ranks: list[int]) -> None:
        """`seconds` of communication over `ranks` timed by the caller (a wait on an async collective, a hook):
        into comm_s and into comm_intra_s or comm_inter_s, as comm_timed."""
        for name in ("comm_s", self._comm_share(ranks)):
            self.add(name, seconds)

    def traffic(self, kind: str, nbytes: float, ranks: list[int]) -> None:
        """Account one collective (kind in WIRE_FACTOR) of `nbytes` local input over group `ranks`."""
        g = len(ranks)
        if g <= 1:
            return
        successor = ranks[(ranks.index(self.layout.rank) + 1) % g] if self.layout.rank in ranks else ranks[0]
        wire = nbytes * WIRE_FACTOR[kind](g)
        crosses = self.layout.dc_of(successor) != self.layout.dc
        with self._lock:
            if self.spans_dcs(ranks):
                self.step.bytes_inter += nbytes
            else:
                self.step.bytes_intra += nbytes
            if crosses:
                self.step.wire_inter += wire
            else:
                self.step.wire_intra += wire

    def p2p(self, nbytes: float, peer: int) -> None:
        with self._lock:
            if self.layout.dc_of(peer) != self.layout.dc:
                self.step.bytes_inter += nbytes
                self.step.wire_inter += nbytes
            else:
                self.step.bytes_intra += nbytes
                self.step.wire_intra += nbytes


class MetricsWriter:
    """Appends one JSON line per step to <dir>/rank<r>.jsonl, flushed every step."""

    def __init__(self, directory: str | os.PathLike | None, rank: int) -> None:
        self.path = Path(directory) / f"rank{rank}.jsonl" if directory else None
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cut = False
            if self.path.exists() and self.path.stat().st_size > 0:
                with open(self.path, "rb") as existing:
                    existing.seek(-1, os.SEEK_END)  # only its last byte: the file may be long
                    cut = existing.read(1) != b"\n"
            self._file = open(self.path, "a", buffering=1)
            if cut:  # a restarted rank after one killed mid-line: its first line stays whole
                self._file.write("\n")

    def write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
