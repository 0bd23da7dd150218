"""What of an experiment's faults each backend runs, refused before anything is built: every fault everywhere
(a straggler's loop runs on its rank's node: testbed.runner.straggler); restarts only where ranks share this
machine's files (netns)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.fabric.errors import NotSupported
from testbed.runner.experiment import refuse_what_the_backend_cannot_run
from testbed.spec.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "experiments" / "faults.yaml"


def sdc_only(tmp_path: Path) -> Path:
    data = yaml.safe_load(SHIPPED.read_text())
    data["faults"] = [f for f in data["faults"] if f["kind"] == "sdc"]
    path = tmp_path / "sdc.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("backend", ["netns", "docker", "ssh"])
def test_the_shipped_timeline_runs_on_every_backend(backend):
    experiment, _ = load_experiment(SHIPPED)
    refuse_what_the_backend_cannot_run(SHIPPED, experiment, backend)


@pytest.mark.parametrize("backend", ["netns", "docker", "ssh"])
def test_a_straggler_runs_everywhere(backend, tmp_path):
    data = yaml.safe_load(SHIPPED.read_text())
    data["faults"] = [{"kind": "straggler", "rank": 1, "at": "step 2", "duration": "2s", "slowdown": 3}]
    path = tmp_path / "straggler.yaml"
    path.write_text(yaml.safe_dump(data))
    experiment, _ = load_experiment(path)
    refuse_what_the_backend_cannot_run(path, experiment, backend)


@pytest.mark.parametrize("backend", ["netns", "docker", "ssh"])
def test_sdc_alone_runs_everywhere(backend, tmp_path):
    path = sdc_only(tmp_path)
    experiment, _ = load_experiment(path)
    refuse_what_the_backend_cannot_run(path, experiment, backend)


def test_docker_and_ssh_fabrics_take_link_faults_by_hand():
    from testbed.fabric.docker.fabric import DockerFabric
    from testbed.fabric.ssh.fabric import SshFabric

    assert DockerFabric.link_faults and SshFabric.link_faults


@pytest.mark.parametrize("backend", ["docker", "ssh"])
def test_restarts_are_refused_where_ranks_do_not_share_files(backend, tmp_path):
    path = sdc_only(tmp_path)
    data = yaml.safe_load(path.read_text())
    data.update(strategies=["flat-dp"], restarts=1, checkpoint_every=2)
    path.write_text(yaml.safe_dump(data))
    experiment, _ = load_experiment(path)
    refuse_what_the_backend_cannot_run(path, experiment, "netns")
    with pytest.raises(NotSupported, match=f"restarts: .*not on {backend}"):
        refuse_what_the_backend_cannot_run(path, experiment, backend)
