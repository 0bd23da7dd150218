"""Which launcher a run takes (no root): fork on every backend (a fork server per run, container or host), exec
when asked; a wrong choice is refused before anything is built."""

from __future__ import annotations

import pytest

from testbed.fabric.errors import FabricError
from testbed.runner.forks import launcher_forks
from testbed.runner.ranks import workload_argv
from tests.support.fake_backend import FakeBackend, FakeOptions


@pytest.mark.parametrize("backend", ["netns", "docker", "ssh"])
def test_auto_and_fork_fork_and_exec_execs(backend):
    assert launcher_forks("auto", backend) is True
    assert launcher_forks("fork", backend) is True
    assert launcher_forks("exec", backend) is False


@pytest.mark.parametrize(("launcher", "backend", "message"), [
    ("spawn", "netns", "--launcher: expected one of auto, fork, exec, got 'spawn'"),
    ("fork", FakeBackend(FakeOptions()), "--launcher fork: the fake backend starts every rank with a command of its own"),
])
def test_refused(launcher, backend, message):
    with pytest.raises(FabricError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        launcher_forks(launcher, backend)


def test_only_the_built_in_workload_is_forked():
    argv = workload_argv(["--steps", "2"])
    assert argv[1:] == ["-m", "testbed.workload", "--steps", "2"] and argv[:3] == workload_argv([])
