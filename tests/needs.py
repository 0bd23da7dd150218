"""What a test needs of this machine, as markers (registered in pyproject.toml, applied in tests/conftest.py), and
what happens when the machine lacks it: skipped with the reason; when CI is set failed instead, with the same reason
(CI must run every test).

    root    root: network namespaces, tc
    docker  a docker engine (DOCKER_HOST or /var/run/docker.sock)
    sshd    /usr/sbin/sshd (the "remote hosts" are sshd in namespaces)
    uml     user-mode Linux (tests/support/uml/harness.py: a 6.1 kernel with sch_netem)
    slurm   a Slurm lab can run (scripts/slurm-lab): slurmctld, slurmd and munged installed

A test says what it needs with a module's `pytestmark` or its own decorator; tests/conftest.py adds what a fixture
it uses or a backend a fixture of it is parametrized with needs. The folder a test is in says nothing.

`pytest -m "not (docker or uml)"` runs the quick part; `-m "not (root or docker or sshd or uml or slurm)"` what needs
none.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import pytest

CI_MUST_RUN = "ci_must_run"
SSHD = "/usr/sbin/sshd"
SLURM = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")  # what scripts/slurm-lab starts


def _root() -> str | None:
    return None if os.geteuid() == 0 else "needs root (network namespaces, tc)"


def _docker() -> str | None:
    from testbed.fabric.docker.engine import engine_available

    return None if engine_available() else "no docker engine here (DOCKER_HOST unset, no /var/run/docker.sock)"


def _sshd() -> str | None:
    return None if os.access(SSHD, os.X_OK) else f"no {SSHD} (apt-get install openssh-server; scripts/setup --tests does)"


def _slurm() -> str | None:
    absent = [path for path in SLURM if not os.access(path, os.X_OK)]
    return None if not absent else f"no {', '.join(absent)} (scripts/setup --tests installs slurmctld, slurmd, slurm-client and munge)"


def _uml() -> str | None:
    from tests.support.uml import harness

    if harness.inside():
        return None
    why = harness.unavailable_reason()
    return None if why is None else f"user-mode Linux unavailable: {why}"


CAPABILITIES: dict[str, Callable[[], str | None]] = {"root": _root, "docker": _docker, "sshd": _sshd, "uml": _uml,
                                                     "slurm": _slurm}


@functools.cache
def missing(capability: str) -> str | None:
    """Why this machine lacks `capability` (a key of CAPABILITIES), or None when it has it; asked once a session."""
    return CAPABILITIES[capability]()


def cannot_run(item: pytest.Item, why: str) -> None:
    if os.environ.get("CI"):
        item.add_marker(pytest.mark.ci_must_run(why))
    else:
        item.add_marker(pytest.mark.skip(reason=why))


def fail_if_ci_must_run(item: pytest.Item) -> None:
    """From pytest_runtest_setup: a test CI must run, on a machine that cannot, fails here (no body runs)."""
    marker = item.get_closest_marker(CI_MUST_RUN)
    if marker is not None:
        pytest.fail(f"CI must run this test, and this machine cannot: {marker.args[0]}", pytrace=False)


def unavailable(why: str) -> None:
    """From inside a test or fixture: skip with the reason, or fail when CI is set."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test, and this machine cannot: {why}", pytrace=False)
    pytest.skip(why)
