"""Checkpoints for restarts (torchelastic's semantics): every TESTBED_CHECKPOINT_EVERY steps the strategy's state
after the step is written (to a temporary file renamed over the last: a rank killed while writing leaves the
previous checkpoint whole); a rank started where one exists loads it and resumes at the next step. The data of a
step is a pure function of (seed, step, index), so a resumed run trains on what the uninterrupted one would have.

Two kinds (Strategy.checkpoint_per_rank): where every replica holds the whole state identically (flat-dp, hier-dp,
hier-dp-overlap, ddp) rank 0 writes one file; where ranks hold different state (FSDP2's shards, a pipeline's stages, the
DiLoCos' DCs: parameters, inner and outer optimizers, and in streaming-diloco and async-diloco the syncs in flight,
waited for at the checkpoint's step and saved with their reduced pseudo-gradients, testbed.workload.strategies.diloco)
every rank writes its own, under the step (`ranks/step<S>/rank<r>.pt`), and a restart takes
the last step whose files are all there -- the set is complete or not used, as torch.distributed.checkpoint
commits a checkpoint only once every rank has written. Each rank keeps its last two: ranks are never more than one
checkpoint apart (every step synchronises them, or in the DiLoCos the cross-DC sync at each checkpoint's step, as the
experiment's checkpoint_every is a multiple of H).

Where the ranks' nodes share no file system (docker, ssh: TESTBED_CHECKPOINT_LOCAL=1) every rank writes its own
in every strategy, and a restart's ranks agree over the process group on the last step each of them holds."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from testbed import rankenv

FILE = "checkpoint.pt"
RANKS = "ranks"
STEP = re.compile(r"step(\d+)$")


@dataclass(frozen=True)
class Checkpointing:
    directory: Path
    every: int
    local: bool = False  # each rank sees only its own files: every rank writes its own, the ranks agree on a step

    @property
    def path(self) -> Path:
        return self.directory / FILE

    def due(self, step: int) -> bool:
        """Whether the state after `step` is written."""
        return self.every > 0 and (step + 1) % self.every == 0

    def save(self, step: int, state: dict, rank: int | None = None) -> None:
        """Write the state after `step`: the world's (rank None) or rank `rank`'s own."""
        path = self.path if rank is None else self._rank_file(step, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"step": step, "state": state}, partial)
        os.replace(partial, path)
        if rank is not None:
            for old in self._steps()[:-2]:
                self._rank_file(old, rank).unlink(missing_ok=True)

    def _rank_file(self, step: int, rank: int) -> Path:
        return self.directory / RANKS / f"step{step}" / f"rank{rank}.pt"

    @staticmethod
    def _read(path: Path) -> tuple[int, dict]:
        saved = torch.load(path, weights_only=False)
        return int(saved["step"]), saved["state"]

    def _steps(self) -> list[int]:
        """The steps of which some rank wrote its own checkpoint, in order."""
        found = [STEP.match(p.name) for p in (self.directory / RANKS).glob("step*")]
        return sorted(int(m.group(1)) for m in found if m)

    def load(self, rank: int | None = None, world: int = 1) -> tuple[int, dict] | None:
        """(the step the checkpoint was written after, the strategy's state), or None when there is none: the
        world's (rank None), or rank `rank`'s from the last step all `world` ranks wrote theirs."""
        if rank is None:
            path = self.path
        else:
            complete = [step for step in self._steps()
                        if all(self._rank_file(step, r).exists() for r in range(world))]
            if not complete:
                return None
            path = self._rank_file(complete[-1], rank)
        if not path.exists():
            return None
        return self._read(path)

    def load_agreed(self, rank: int, world: int) -> tuple[int, dict] | None:
        """Rank `rank`'s own checkpoint of the last step every rank of the default group holds (each sees only its
        own files), or None when they hold none in common; every rank must call it."""
        import torch.distributed as dist

        mine = [step for step in self._steps() if self._rank_file(step, rank).exists()]
        held: list[list[int] | None] = [None] * world
        dist.all_gather_object(held, mine)
        common = set(mine).intersection(*(set(steps or []) for steps in held))
        if not common:
            return None
        return self._read(self._rank_file(max(common), rank))


def checkpointing_from_env() -> Checkpointing | None:
    directory = os.environ.get(rankenv.CHECKPOINT_DIR)
    if not directory:
        return None
    return Checkpointing(Path(directory), int(os.environ.get(rankenv.CHECKPOINT_EVERY) or 0),
                         os.environ.get(rankenv.CHECKPOINT_LOCAL) == "1")
