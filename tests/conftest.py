"""Shared fixtures: a unique object prefix and state directory per test, always torn down."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.needs import CAPABILITIES, cannot_run, fail_if_ci_must_run, missing

pytest_plugins = ["tests.support.uml.plugin", "tests.support.fakes"]

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = ROOT / "topologies"


# what a test needs (tests/needs.py's markers): written on the test (a module's `pytestmark` or its own decorator),
# or applied here by a fixture it uses and by the backend a fixture of it is parametrized with
# (tests/fabric/test_backends.py: one test, every backend); never by the folder a test is in
FIXTURE_NEEDS = {"docker_image": ("root", "docker"), "netns_quickstart": ("root",)}
BACKEND_NEEDS = {"docker": ("root", "docker"), "ssh": ("root", "sshd")}


def _direct_parameters(item: pytest.Item) -> set[str]:
    """The names a test's own @pytest.mark.parametrize gives (a fixture's params are not among them)."""
    names: set[str] = set()
    for marker in item.iter_markers("parametrize"):
        argnames = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        names.update(argnames.replace(" ", "").split(",") if isinstance(argnames, str) else argnames)
    return names


def needs_of(item: pytest.Item) -> set[str]:
    """The capabilities `item` needs beyond the markers written on it: its fixtures', its backend's."""
    needs: set[str] = set()
    for fixture in getattr(item, "fixturenames", ()):
        needs.update(FIXTURE_NEEDS.get(fixture, ()))
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        direct = _direct_parameters(item)
        for name, value in callspec.params.items():
            if name not in direct and isinstance(value, str):
                needs.update(BACKEND_NEEDS.get(value, ()))
    return needs


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets the markers of what it needs; one this machine lacks skips it with the reason (fails it when
    CI is set: in CI every test must run)."""
    for item in items:
        for capability in sorted(needs_of(item)):
            if item.get_closest_marker(capability) is None:
                item.add_marker(capability)
        why = next((missing(c) for c in CAPABILITIES if item.get_closest_marker(c) and missing(c)), None)
        if why is not None:
            cannot_run(item, why)


def pytest_runtest_setup(item: pytest.Item) -> None:
    fail_if_ci_must_run(item)


def memory_base(fallback: Path) -> Path:
    """A fresh directory to hold a test's state directory where testbed keeps its own (runtime_root(): /run or
    /dev/shm, in memory), so that the fault and delay-line writes of a test wait for no disk, as a run's do;
    `fallback` (a test's tmp_path, on /tmp) where no in-memory root is writable (not root). Remove it after."""
    from testbed.fabric.state import MEMORY_FILESYSTEMS, mount_type, runtime_root

    root = runtime_root()
    if mount_type(str(root)) in MEMORY_FILESYSTEMS and os.access(root, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="testbed-test-", dir=root))
    return fallback


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """TESTBED_STATE_DIR for one test, not created yet (bad input must leave it so)."""
    base = memory_base(tmp_path)
    monkeypatch.setenv("TESTBED_STATE_DIR", str(base / "state"))
    yield base / "state"
    if base != tmp_path:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def prefix(state_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A unique `tb-xxxx-` prefix; everything with it is removed after the test, pass or fail."""
    from testbed.fabric.lifecycle import tear_down

    value = f"tb-{uuid.uuid4().hex[:4]}-"
    monkeypatch.setenv("TESTBED_PREFIX", value)
    yield value
    tear_down(value)


QUICKSTART_CELL = "hier-dp-overlap__*20ms*"  # one 20 ms cell of the quickstart: it crosses the link both ways,
# overlapped, with the intra- and the inter-DC groups (the quickstart's six take five minutes here)


@dataclass(frozen=True)
class QuickstartRun:
    proc: subprocess.CompletedProcess
    run_dir: Path | None


@pytest.fixture(scope="session")
def netns_quickstart(tmp_path_factory: pytest.TempPathFactory) -> QuickstartRun:
    """`testbed run experiments/quickstart.yaml --only QUICKSTART_CELL` on the netns backend, once per session
    (root): the cost model's calibration and predictions (tests/model) and the report the compose path must
    write alike (tests/fabric/docker) are read from the same run, which takes ~45 s here. Torn down like `prefix`."""
    from testbed.fabric.lifecycle import tear_down

    base = tmp_path_factory.mktemp("netns-quickstart")
    value = f"tb-{uuid.uuid4().hex[:4]}-"
    memory = memory_base(base)
    state = memory / "state"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TESTBED_PREFIX", value)
        env.setenv("TESTBED_STATE_DIR", str(state))
        try:
            proc = run_cli("run", "experiments/quickstart.yaml", "--only", QUICKSTART_CELL, "--out", str(base / "out"),
                           timeout=900)
        finally:
            tear_down(value)
            if memory != base:
                shutil.rmtree(memory, ignore_errors=True)
    runs = sorted((base / "out" / "quickstart").glob("*"))
    return QuickstartRun(proc, runs[0] if len(runs) == 1 else None)


OWNER_LABEL = "testbed.owner-pid"


def _remove_orphaned_test_images() -> None:
    """Test images whose pytest is gone (killed before its teardown) are removed: the next CI check on this
    machine would count them as this suite's leak. Images of a pytest still running are left alone."""
    import docker

    from testbed.waiting import alive

    client = docker.from_env()
    try:
        for image in client.images.list(filters={"label": ["testbed=image", OWNER_LABEL]}):
            pid = image.labels.get(OWNER_LABEL, "")
            if pid.isdigit() and not alive(int(pid)):
                client.images.remove(image.id, force=True)
    finally:
        client.close()


@pytest.fixture(scope="session")
def docker_image():
    """An image built from this tree by scripts/build-image (its base is cached by a hash of its inputs and kept;
    this image is removed after the session, or by the next session if this one is killed first)."""
    _remove_orphaned_test_images()
    tag = f"testbed:test-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "TESTBED_IMAGE_LABELS": f"{OWNER_LABEL}={os.getpid()}"}
    proc = subprocess.run([str(ROOT / "scripts" / "build-image"), tag], capture_output=True, text=True, timeout=1200,
                          env=env)
    assert proc.returncode == 0, f"scripts/build-image failed:\n{proc.stderr[-3000:]}"
    yield tag
    for _ in range(5):  # a container still being removed holds the image for a moment
        rmi = subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, text=True, timeout=120)
        if rmi.returncode == 0 or "No such image" in rmi.stderr:
            return
        time.sleep(2)
    raise AssertionError(f"docker rmi -f {tag} failed: {rmi.stderr.strip()}")


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


def jittered_uniformly(rtts: list[float], jitter: float, points: int = 100) -> list[float]:
    """The round trips `rtts` of a path without jitter, each spread over `points` evenly spaced offsets of the
    uniform law on [-jitter, +jitter], sorted: the law a path with that jitter should follow on the same host
    (its own delays and the jitter convolved)."""
    offsets = [jitter * (2 * (k + 0.5) / points - 1) for k in range(points)]
    return sorted(rtt + offset for rtt in rtts for offset in offsets)
