"""A stopped UML run leaves nothing, and the harness runs from any checkout path (tests/support/uml/reaper.py, harness.py).

Each test runs pytest on one cheap UML test in a subprocess, from the host (it boots UML itself: `on_host`, after
the session's other boots), stops it as a CI's timeout, a Ctrl-C or the OOM killer would, and looks for what stayed:
UML kernel processes, lab directories under /var/tmp, watch processes. What UML's tests build (namespaces, veths,
qdiscs) lives in UML's own kernel, not the host's, and ends with its processes.
Run after run, quiet and beside two busy loops (2026-11-28, 14 runs of every `uml` test): these passed in every one;
docs/development/tests.md ("How steady the netem tests are").
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.uml import reaper

pytestmark = [pytest.mark.root, pytest.mark.uml(on_host=True), pytest.mark.timeout(300)]

# one boot: no htb, no netem; `testbed up` inside is refused in one line (~10 s in all on a quiet host)
CHEAP = "tests/fabric/netns/test_kernel_features.py::test_netem_asked_for_on_a_kernel_without_it_is_one_line"
GONE_WITHIN_S = 20.0


def labs_of(pid: int) -> list[Path]:
    """The lab directories (a boot's, the junit file's) recorded as `pid`'s."""
    found = []
    for lab in reaper.LABS.glob(f"{reaper.LAB_PREFIX}*"):
        try:
            if (lab / reaper.OWNER).read_text().split()[0] == str(pid):
                found.append(lab)
        except (OSError, IndexError):
            continue
    return found


def watches_of(labs: list[Path]) -> list[int]:
    """The watch processes (reaper.py run as a script) of `labs`."""
    wanted = {str(lab).encode() for lab in labs}
    return [pid for pid, argv in reaper.command_lines()
            if any(arg.endswith(b"reaper.py") for arg in argv) and wanted & set(argv)]


def start_pytest(tmp_path: Path, checkout: Path = ROOT) -> subprocess.Popen:
    log = open(tmp_path / "pytest.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", CHEAP], cwd=checkout,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc


def booting(proc: subprocess.Popen, tmp_path: Path, timeout: float = 120.0) -> list[Path]:
    """Once `proc`'s UML kernel runs: its labs."""
    deadline = time.monotonic() + timeout
    while True:
        labs = labs_of(proc.pid)
        if any(reaper.processes_of(lab) for lab in labs):
            return labs
        assert proc.poll() is None, (tmp_path / "pytest.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "no UML kernel started"
        time.sleep(0.05)


def guests_of(labs: list[Path]) -> list[int]:
    """Host processes running one of `labs`' guest programs (INIT is `sh LAB/init`; its children name LAB too):
    one that outlived its kernel would go on as a host process with the host's root."""
    wanted = tuple(str(lab).encode() for lab in labs)
    return [pid for pid, argv in reaper.command_lines()
            if not any(arg.endswith(b"reaper.py") for arg in argv) and any(arg.startswith(wanted) for arg in argv[1:])]


INIT_MOUNTS = ("/proc", "/sys", "/dev", "/dev/shm", "/dev/pts", "/run", "/tmp")  # where the harness's INIT mounts


def host_mounts() -> list[str]:
    """This namespace's mounts on the points INIT mounts on, in order (a guest's mount that got out shows here)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [" ".join(line.split()[3:5]) for line in lines if line.split()[4] in INIT_MOUNTS]


def left_after(labs: list[Path], timeout: float = GONE_WITHIN_S) -> list[str]:
    """What of `labs` is still there after `timeout` (processes, guest processes, directories, watches); [] as
    soon as nothing is."""
    deadline = time.monotonic() + timeout
    while True:
        left = [f"{lab}: pids {reaper.processes_of(lab)}" for lab in labs if reaper.processes_of(lab)]
        left += [f"guest process {pid}" for pid in guests_of(labs)]
        left += [f"{lab}: directory" for lab in labs if lab.exists()]
        left += [f"watch {pid}" for pid in watches_of(labs)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def stopped(tmp_path):
    """Stops the pytest a test started however the test ends (a failed assertion must not leave it running)."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


@pytest.mark.parametrize(("number", "after_s"), [(signal.SIGTERM, 0.0), (signal.SIGTERM, 4.0), (signal.SIGINT, 4.0),
                                                 (signal.SIGKILL, 4.0)], ids=["term-booting", "term-testing",
                                                                              "int-testing", "kill-testing"])
def test_a_stopped_pytest_leaves_no_uml_process_lab_or_namespace(number, after_s, tmp_path, stopped):
    """SIGTERM and SIGINT: pytest's own clean-up; SIGKILL: the watch. Stopped as the kernel starts, or `after_s`
    into the inner run."""
    mounts, hostname = host_mounts(), socket.gethostname()
    proc = start_pytest(tmp_path)
    stopped.append(proc)
    labs = booting(proc, tmp_path)
    time.sleep(after_s)
    labs = sorted(set(labs) | set(labs_of(proc.pid)))
    assert proc.poll() is None, "the inner run ended before it was stopped: stop it sooner"
    proc.send_signal(number)
    proc.wait(timeout=GONE_WITHIN_S)
    assert left_after(labs) == [], (tmp_path / "pytest.log").read_text()[-2000:]
    assert host_mounts() == mounts, "a guest's mount got out onto the host"
    assert socket.gethostname() == hostname, "a guest's host name got out onto the host"


def test_what_a_killed_watch_left_the_next_sweep_removes(tmp_path, stopped):
    """The watch and pytest both SIGKILLed (a CI killing every process it started): the kernel stays, and
    `scripts/uml-run --sweep` (what every harness start does first) removes it and its labs."""
    mounts, hostname = host_mounts(), socket.gethostname()
    proc = start_pytest(tmp_path)
    stopped.append(proc)
    labs = booting(proc, tmp_path)
    time.sleep(4.0)  # into the inner run: INIT has mounted, and its children run
    labs = sorted(set(labs) | set(labs_of(proc.pid)))
    for pid in watches_of(labs):
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    time.sleep(1.0)
    assert any(reaper.processes_of(lab) for lab in labs), "the kernel should outlive its killed owner and watch"
    sweep = subprocess.run([str(ROOT / "scripts" / "uml-run"), "--sweep"], capture_output=True, text=True, timeout=60)
    assert sweep.returncode == 0, sweep.stderr
    assert left_after(labs) == []
    assert host_mounts() == mounts, "a guest's mount got out onto the host"
    assert socket.gethostname() == hostname, "a guest's host name got out onto the host"


def copy_tree(checkout: Path) -> None:
    """This working tree to `checkout`: what git tracks and what it does not ignore, or, outside a git repository
    (a copy like this one), everything but the venv and caches."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(".venv", "__pycache__", ".*_cache"))
        return
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)


def test_a_checkout_under_tmp_with_spaces_in_its_path_runs_its_uml_tests(tmp_path):
    """UML covers /tmp with a tmpfs of its own: the harness binds the checkout back at its own path. The working
    tree copied to /tmp/tb uml <hex>/check out, run there with this interpreter."""
    base = Path(f"/tmp/tb uml {uuid.uuid4().hex[:6]}")
    checkout = base / "check out"
    try:
        copy_tree(checkout)
        proc = start_pytest(tmp_path, checkout)
        proc.wait(timeout=280)
        log = (tmp_path / "pytest.log").read_text()
        assert proc.returncode == 0 and "1 passed" in log, log[-3000:]
    finally:
        shutil.rmtree(base, ignore_errors=True)
