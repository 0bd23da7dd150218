"""Tests this machine cannot run (not root, no docker engine, no sshd, no user-mode Linux): skipped with the
reason; when CI is set they fail instead, with the same reason (CI must run every test)."""

from __future__ import annotations

import os

import pytest

CI_MUST_RUN = "ci_must_run"


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
