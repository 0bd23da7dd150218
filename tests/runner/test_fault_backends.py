"""Every fault and restarts run on every backend: the fabrics that take link faults by hand, and where ranks do
not share this machine's files, every rank keeping its own checkpoint on its node."""

from __future__ import annotations

from pathlib import Path

from testbed.runner.restarts import checkpoint_env


def test_docker_and_ssh_fabrics_take_link_faults_by_hand():
    from testbed.fabric.docker.fabric import DockerFabric
    from testbed.fabric.ssh.fabric import SshFabric

    assert DockerFabric.link_faults and SshFabric.link_faults


def test_ranks_that_do_not_share_files_keep_their_own_checkpoints(tmp_path: Path):
    assert checkpoint_env(tmp_path, 0, 3) == {}
    shared = checkpoint_env(tmp_path, 1, 3)
    assert shared == {"TESTBED_CHECKPOINT_DIR": str(tmp_path / "checkpoint"), "TESTBED_CHECKPOINT_EVERY": "3"}
    assert checkpoint_env(tmp_path, 1, 3, shared=False) == {**shared, "TESTBED_CHECKPOINT_LOCAL": "1"}
