"""Which launcher a run takes (no root): fork where the backend forks ranks, exec elsewhere; a wrong or
impossible choice is refused before anything is built."""

from __future__ import annotations

import pytest

from testbed.fabric.errors import FabricError
from testbed.runner.experiment import launcher_forks
from testbed.runner.ranks import workload_argv


def test_auto_forks_on_netns_and_execs_on_docker_and_ssh():
    assert launcher_forks("auto", "netns") is True
    assert launcher_forks("fork", "netns") is True
    assert launcher_forks("exec", "netns") is False
    assert launcher_forks("auto", "docker") is False
    assert launcher_forks("auto", "ssh") is False


@pytest.mark.parametrize(("launcher", "backend", "message"), [
    ("fork", "docker", "--launcher fork: the docker backend starts every rank in its own container or host"),
    ("fork", "ssh", "--launcher fork: the ssh backend"),
    ("spawn", "netns", "--launcher: expected one of auto, fork, exec, got 'spawn'"),
])
def test_refused(launcher, backend, message):
    with pytest.raises(FabricError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        launcher_forks(launcher, backend)


def test_only_the_built_in_workload_is_forked():
    argv = workload_argv(["--steps", "2"])
    assert argv[1:] == ["-m", "testbed.workload", "--steps", "2"] and argv[:3] == workload_argv([])
