"""The shipped one-fault examples (experiments/restarts.yaml, killed-rank.yaml, straggler.yaml, sdc-replay.yaml), no
root: each loads, `testbed plan` predicts it, its cells are what its header says, and the replay share of
sdc-replay.yaml samples the step it says and not the one it says it misses. (Each runs for real in under a minute
here: `testbed run experiments/NAME.yaml`.)"""

from __future__ import annotations

import pytest
import torch

from testbed.runner.cells import plan_cells
from testbed.spec.experiment import load_experiment
from testbed.workload.sdc import Guard
from tests.conftest import ROOT, run_cli

EXAMPLES = {"restarts": ["kill"], "killed-rank": ["kill"], "straggler": ["straggler"],
            "sdc-replay": ["sdc", "sdc", "sdc"]}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_plans_and_holds_the_faults_it_names(name):
    path = ROOT / "experiments" / f"{name}.yaml"
    experiment, topology = load_experiment(path)
    assert [fault.kind for fault in experiment.faults] == EXAMPLES[name]
    cells = plan_cells(experiment, topology)
    assert cells and not any(cell.baseline for cell in cells)  # a fault needs no unshaped twin: under 3 minutes
    assert experiment.cell_timeout <= 180
    proc = run_cli("plan", str(path.relative_to(ROOT)), timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_restarts_resume_from_a_checkpoint_and_killed_rank_from_the_start():
    with_checkpoints, _ = load_experiment(ROOT / "experiments" / "restarts.yaml")
    without, _ = load_experiment(ROOT / "experiments" / "killed-rank.yaml")
    assert with_checkpoints.restarts == without.restarts == 1
    assert with_checkpoints.checkpoint_every == 4 and without.checkpoint_every == 0
    assert with_checkpoints.faults == without.faults  # the same kill: rank 3 at step 9


def test_the_replay_share_samples_the_step_it_names_and_not_the_one_it_misses():
    experiment, _ = load_experiment(ROOT / "experiments" / "sdc-replay.yaml")
    mantissa = [fault for fault in experiment.faults if fault.bit == 12]
    assert [(f.rank, f.at.step) for f in mantissa] == [(2, 5), (3, 7)]

    def sampled(rank: int, step: int) -> bool:
        param = torch.nn.Parameter(torch.zeros(4))
        guard = Guard(rank, ["w"], [param], None, [rank], [], check=True, replay_rate=experiment.sdc_replay,
                      seed=experiment.workload.seed)
        return guard._sampled(step)

    assert sampled(2, 5) and not sampled(3, 7)
