"""Checkpoints for restarts (torchelastic's semantics): every TESTBED_CHECKPOINT_EVERY steps rank 0 writes the
strategy's state after the step (written to a temporary file and renamed over the last: a rank killed while
writing leaves the previous checkpoint whole); a rank started where one exists loads it and resumes at the next
step. The data of a step is a pure function of (seed, step, index), so a resumed run trains on what the
uninterrupted one would have. Only strategies whose replicas hold the whole state identically write one
(Strategy.checkpoint_state)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

FILE = "checkpoint.pt"


@dataclass(frozen=True)
class Checkpointing:
    directory: Path
    every: int

    @property
    def path(self) -> Path:
        return self.directory / FILE

    def due(self, step: int) -> bool:
        """Whether the state after `step` is written."""
        return self.every > 0 and (step + 1) % self.every == 0

    def save(self, step: int, state: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"step": step, "state": state}, partial)
        os.replace(partial, self.path)

    def load(self) -> tuple[int, dict] | None:
        """(the step the checkpoint was written after, the strategy's state), or None when there is none."""
        if not self.path.exists():
            return None
        saved = torch.load(self.path, weights_only=False)
        return int(saved["step"]), saved["state"]


def checkpointing_from_env() -> Checkpointing | None:
    directory = os.environ.get("TESTBED_CHECKPOINT_DIR")
    if not directory:
        return None
    return Checkpointing(Path(directory), int(os.environ.get("TESTBED_CHECKPOINT_EVERY") or 0))
