"""The `fakes` fixture (a pytest plugin of tests/conftest.py): the fake backends of tests/support/fake_backend.py
registered alone, the public way (testbed.fabric.registry.registered), for tests of the lifecycle, ownership and
faults that build nothing (no root)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import settings
from testbed.fabric import ownership, registry
from tests.support.fake_backend import LOG

FAKES = {"fake": "tests.support.fake_backend:FakeBackend", "other": "tests.support.fake_backend:OtherBackend"}


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Iterator[None]:
    """Only the fake backends are registered (the real ones would look for namespaces and an engine), their log
    starts empty, and the lock files of the test's testbeds are its own, beside its state (the host's are for real
    testbeds): a fake testbed brought up and never torn down leaves nothing, and what this process still holds of
    it is let go after."""
    monkeypatch.setenv(settings.OWNERS_DIR, str(state_dir.parent / "owners"))
    LOG.clear()
    with registry.registered(FAKES, only=True):
        yield
    for path in list(ownership._held):  # what this process still holds (bring_up without tear_down)
        os.close(ownership._held.pop(path))
