"""What a restart cost, read from rank 0's metrics: the checkpoint it resumed from, the steps done again, the
seconds of work lost and of recovery; and the summary's figures, each step counted once."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from testbed.collect.frames import restart_columns, stall_figures
from testbed.runner.restarts import checkpoint_env, restart_figures


def _write(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"event": "step", "st')  # a line cut by a kill
    return path


def _attempt(resumed: int | None, steps: range, t0: float) -> list[dict]:
    out: list[dict] = [{"event": "start", "resumed_after_step": resumed, "time": t0}]
    for i, step in enumerate(steps):
        out += [{"event": "step_begin", "step": step, "time": t0 + 1 + i},
                {"event": "step", "step": step, "wall_s": 1.0, "time": t0 + 2 + i}]
    return out


def test_a_restart_from_a_checkpoint_names_the_steps_done_again_and_the_seconds(tmp_path):
    # steps 0-6 end at t = 102..108; killed at 108.5; the restart resumes after step 5 and begins step 6 at 111
    rank0 = _write(tmp_path / "rank0.jsonl", _attempt(None, range(7), 100) + _attempt(5, range(6, 10), 110))
    (figures,) = restart_figures(rank0, [{"failed_rank": 3, "reason": "rank 3 died", "died_at": 108.5}])
    assert figures == {"failed_rank": 3, "reason": "rank 3 died", "died_at": 108.5, "resumed_after_step": 5,
                       "steps_lost": 1, "lost_s": pytest.approx(108.5 - 107), "recovery_s": pytest.approx(111 - 108.5)}


def test_without_a_checkpoint_everything_before_the_death_is_lost_and_a_second_restart_is_its_own(tmp_path):
    events = _attempt(None, range(3), 100) + _attempt(None, range(2), 110) + _attempt(None, range(4), 120)
    rank0 = _write(tmp_path / "rank0.jsonl", events)
    deaths = [{"died_at": 104.0}, {"died_at": 113.5}]
    first, second = restart_figures(rank0, deaths)
    assert (first["resumed_after_step"], first["steps_lost"], first["lost_s"]) == (None, 3, pytest.approx(3.0))
    assert first["recovery_s"] == pytest.approx(111 - 104)
    assert (second["steps_lost"], second["recovery_s"]) == (2, pytest.approx(121 - 113.5))


def test_a_restart_that_never_began_a_step_has_no_recovery(tmp_path):
    rank0 = _write(tmp_path / "rank0.jsonl", _attempt(None, range(2), 100))
    (figures,) = restart_figures(rank0, [{"died_at": 103.5}])
    assert figures["recovery_s"] is None and figures["resumed_after_step"] is None


def test_the_summary_counts_restarts_and_their_seconds_as_wall_time():
    result = {"restarts": [{"steps_lost": 1, "lost_s": 1.5, "recovery_s": 2.5},
                           {"steps_lost": 2, "lost_s": 2.0, "recovery_s": None}]}
    assert restart_columns(result) == {"restarts": 2, "steps_lost": 3, "recovery_s": 2.5, "restart_lost_s": 3.5}
    assert restart_columns({"restarts": []}) == {} and restart_columns({}) == {}
    walls = pd.Series([1.0] * 10)
    assert stall_figures(walls)["effective_time_ratio"] == 1.0
    assert stall_figures(walls, 6.0)["effective_time_ratio"] == pytest.approx(10 / 16)


def test_checkpoints_go_under_the_cell_only_with_restarts(tmp_path):
    assert checkpoint_env(tmp_path, 0, 5) == {}
    assert checkpoint_env(tmp_path, 2, 5) == {"TESTBED_CHECKPOINT_DIR": str(tmp_path / "checkpoint"),
                                              "TESTBED_CHECKPOINT_EVERY": "5"}


def test_a_restarted_rank_starts_a_new_line_after_one_cut_by_a_kill(tmp_path):
    from testbed.workload.metrics import MetricsWriter

    (tmp_path / "rank0.jsonl").write_text('{"event": "step", "step": 1}\n{"event": "step", "st')
    writer = MetricsWriter(tmp_path, 0)
    writer.write({"event": "start", "resumed_after_step": 0})
    writer.close()
    lines = (tmp_path / "rank0.jsonl").read_text().splitlines()
    assert json.loads(lines[-1]) == {"event": "start", "resumed_after_step": 0} and len(lines) == 3
