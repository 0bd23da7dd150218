"""Restarts after a rank dies (an experiment's `restarts:`): every rank is started again and goes on from the
workload's last checkpoint (testbed.workload.checkpoint). What each restart cost, from rank 0's metrics."""

from __future__ import annotations

import itertools
from pathlib import Path

from testbed.rankenv import RankEnv
from testbed.steplog import read_records

CHECKPOINT_DIR = "checkpoint"  # under the cell's directory


def checkpoint_env(cell_dir: Path, restarts: int, every: int, shared: bool = True) -> dict[str, str]:
    """Where the ranks write and find checkpoints, and how often they write them; nothing without restarts.
    Where the ranks' nodes do not share this machine's files (`shared` false: docker, ssh; the fabric puts the
    directory on each node) every rank keeps its own and they agree on a step (testbed.workload.checkpoint)."""
    if not restarts:
        return {}
    return RankEnv(checkpoint_dir=str(cell_dir / CHECKPOINT_DIR), checkpoint_every=every,
                   checkpoint_local=None if shared else True).to_env()


def restart_figures(rank0: Path, deaths: list[dict]) -> list[dict]:
    """Each restart in `deaths` (failed_rank, reason, died_at: when the death was seen) with what rank 0 wrote
    about it: resumed_after_step (the checkpoint's step; None: from the beginning), steps_lost (steps rank 0 had
    finished after that checkpoint: done again), lost_s (from the end of the checkpoint's step, or the first
    step's start, to the death: work done again) and recovery_s (from the death to the first step begun after
    the restart: start-up, loading the checkpoint, connecting; None when none began)."""
    events = read_records(rank0) if rank0.exists() else []
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"] + [len(events)]
    attempts = [events[a:b] for a, b in itertools.pairwise(starts)]
    out = []
    for number, death in enumerate(deaths):
        before = attempts[number] if number < len(attempts) else []
        after = attempts[number + 1] if number + 1 < len(attempts) else []
        resumed = after[0].get("resumed_after_step") if after else None
        steps = [e for e in before if e.get("event") == "step"]
        redone = [e for e in steps if resumed is None or e["step"] > resumed]
        saved = [e["time"] for e in steps if e["step"] == resumed]
        begun = [e["time"] for e in before if e.get("event") == "step_begin"]
        since = saved[0] if saved else begun[0] if begun else None
        resumed_at = [e["time"] for e in after if e.get("event") == "step_begin"]
        out.append({**death, "resumed_after_step": resumed, "steps_lost": len(redone),
                    "lost_s": death["died_at"] - since if since is not None else None,
                    "recovery_s": resumed_at[0] - death["died_at"] if resumed_at else None})
    return out
