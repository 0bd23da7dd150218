"""Shared fixtures: a unique object prefix and state directory per test, always torn down."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest_plugins = ["tests.uml.plugin"]

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = ROOT / "topologies"


def _is_root() -> bool:
    return os.geteuid() == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Root tests fail loudly (not skip) without root: in CI they must run."""
    if _is_root():
        return
    for item in items:
        if "root" in item.keywords:
            item.add_marker(pytest.mark.xfail(reason="needs root (network namespaces)", run=False, strict=True))


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("TESTBED_STATE_DIR", str(path))
    return path


@pytest.fixture
def prefix(state_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A unique `tb-xxxx-` prefix; everything with it is removed after the test, pass or fail."""
    from testbed.fabric.lifecycle import tear_down

    value = f"tb-{uuid.uuid4().hex[:4]}-"
    monkeypatch.setenv("TESTBED_PREFIX", value)
    yield value
    tear_down(value)


def run_cli(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """Run the `testbed` CLI in a subprocess with the current environment (prefix, state dir)."""
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"testbed {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def namespaces_with(prefix: str) -> list[str]:
    from testbed.fabric.netns.namespaces import list_namespaces

    return list_namespaces(prefix)
