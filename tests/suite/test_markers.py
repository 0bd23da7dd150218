"""The markers of what a test needs select as pytest's `-m` does (no root; pytest runs in a subprocess on this
tree): `-m docker` is the docker tests and nothing else, `-m "not (root or docker or sshd or uml or slurm)"` leaves out
every test that needs any, and a capability this machine lacks skips a test naming it, or fails it when CI is set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

NOTHING_NEEDED = "not (root or docker or sshd or uml or slurm)"


def pytest_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--strict-markers", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, **(env or {})})


def collected(*args: str) -> set[str]:
    proc = pytest_run("--collect-only", "-q", *args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}


@pytest.fixture(scope="module")
def everything() -> set[str]:
    """Every test of the suite (3 s to collect)."""
    return collected()


def test_docker_selects_the_docker_tests_and_nothing_else(everything):
    backends = "tests/fabric/test_backends.py::"
    fake_engine = "tests/fabric/docker/test_docker_fabric.py::"  # the docker fabric against a fake client
    docker = {test for test in everything
              if (test.startswith("tests/fabric/docker/") and not test.startswith(fake_engine))
              or (test.startswith(backends) and test.endswith("[docker]"))}
    assert len(docker) > 2 and any(test.startswith(backends) for test in docker)
    assert collected("-m", "docker") == docker


def test_nothing_needed_leaves_out_every_test_that_needs_root_docker_sshd_or_uml(everything):
    quick = collected("-m", NOTHING_NEEDED)
    assert quick and quick < everything
    # every test there needs one of them (each module's pytestmark; the backends' test by its fixture's backend)
    for where in ("tests/fabric/docker/test_docker_backend", "tests/fabric/ssh/", "tests/fabric/netns/test_netem",
                  "tests/fabric/test_backends", "tests/fabric/netns/test_netns_fabric", "tests/suite/test_uml_stopped"):
        assert not [test for test in quick if test.startswith(where)], where
    # a backend's name as a test's own parameter needs nothing: only a fixture parametrized with it does
    assert "tests/runner/test_launcher_choice.py::test_auto_and_fork_fork_and_exec_execs[docker]" in quick
    assert "tests/suite/test_markers.py::test_docker_selects_the_docker_tests_and_nothing_else" in quick


def test_a_missing_capability_skips_naming_it_and_fails_in_ci(tmp_path: Path):
    """A plugin makes this machine lack docker; the backends' docker test is then skipped with the reason, and
    failed with it when CI is set (no fixture runs: nothing is built either way)."""
    (tmp_path / "no_docker_here.py").write_text(
        "from tests import needs\nneeds.CAPABILITIES['docker'] = lambda: 'pretend: no docker engine'\n")
    test = "tests/fabric/test_backends.py::test_up_status_probe_shape_down[docker]"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "CI": ""}
    local = pytest_run("-p", "no_docker_here", "-rs", test, env=env)
    assert local.returncode == 0 and "1 skipped" in local.stdout and "pretend: no docker engine" in local.stdout, \
        local.stdout[-2000:]
    ci = pytest_run("-p", "no_docker_here", test, env={**env, "CI": "true"})
    assert ci.returncode == 1 and "1 error" in ci.stdout, ci.stdout[-2000:]  # failed in its setup
    assert "CI must run this test, and this machine cannot: pretend: no docker engine" in ci.stdout
