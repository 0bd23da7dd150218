"""tests/support/uml/harness.py's choices made before a boot (no UML): where the kernel keeps its memory, what it
binds back over its tmpfs mounts, which labs of killed runs the sweep removes (tests/support/uml/reaper.py), how the host
answers a guest's ask for real-time, and which boots the plugin lets run at once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.waiting import wait_for
from tests.support.uml import harness, plugin, reaper


def test_uml_keeps_its_memory_in_dev_shm_where_it_can_and_on_disk_where_it_cannot(tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(harness, "SHM", tmp_path)  # writable and executable: used
    assert harness.memory_dir(work) == tmp_path
    monkeypatch.setattr(harness, "SHM", tmp_path / "absent")
    assert harness.memory_dir(work) == work
    monkeypatch.setenv("TMP", "/elsewhere")  # UML reads TMP before TMPDIR: it must not win
    monkeypatch.setattr(harness, "SHM", tmp_path)
    env = harness._kernel_env(work)
    assert env["TMPDIR"] == str(tmp_path) and "TMP" not in env and "TEMP" not in env


def test_a_checkout_under_tmp_is_bound_back_at_its_own_path(tmp_path, monkeypatch):
    """UML covers /tmp, /run and /dev/shm with tmpfs: what the command needs there is bound back (spaces kept)."""
    checkout = Path("/tmp/a b/check out")
    monkeypatch.setattr(harness, "CHECKOUT", checkout)
    monkeypatch.setattr(sys, "prefix", "/opt/venv")  # wherever this run's own interpreter is (a clone under /tmp)
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert harness.kept_visible(checkout / "tests") == [checkout]  # the checkout holds the cwd: one bind
    monkeypatch.setattr(harness, "CHECKOUT", Path("/work/main"))
    assert harness.kept_visible(Path("/work/main")) == []
    monkeypatch.setattr(sys, "prefix", "/tmp/clone/.venv")  # an interpreter under /tmp is bound back too
    assert harness.kept_visible(Path("/work/main")) == [Path("/tmp/clone/.venv")]
    before, after = harness.bind_lines([checkout], tmp_path)
    assert before == f"mount --bind /tmp {tmp_path}/host-0" and (tmp_path / "host-0").is_dir()
    assert after == (f"mkdir -p '/tmp/a b/check out' && mount --bind '{tmp_path}/host-0/a b/check out' "
                     "'/tmp/a b/check out'")


def test_the_sweep_removes_the_labs_of_owners_gone_and_keeps_the_others(tmp_path, monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    labs = {name: tmp_path / f"{reaper.LAB_PREFIX}{name}" for name in ("dead", "alive", "unowned-young", "unowned-old")}
    for lab in labs.values():
        lab.mkdir()
    reaper.claim(labs["alive"])
    (labs["dead"] / reaper.OWNER).write_text(f"{dead.pid} 1\n")
    old = time.time() - reaper.UNOWNED_GRACE_S - 5
    os.utime(labs["unowned-old"], (old, old))
    assert reaper.sweep(tmp_path) == [labs["dead"], labs["unowned-old"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [labs["alive"].name, labs["unowned-young"].name]


def test_a_boot_that_runs_alone_waits_for_the_others_and_holds_back_those_after_it():
    """Boot a runs; then the lab's boot (alone=True) asks for its turn, then b: the lab starts only when a has
    ended, and b, which asked while the lab waited, only when the lab has ended."""
    events: list[str] = []
    release = {name: threading.Event() for name in ("a", "lab", "b")}

    def boot(name: str, alone: bool) -> None:
        with plugin._turn(name, alone):
            events.append(f"{name} starts")
            release[name].wait(10)
            events.append(f"{name} ends")

    threads = {"a": threading.Thread(target=boot, args=("a", False))}
    threads["a"].start()
    assert wait_for(lambda: events == ["a starts"], 10)
    threads["lab"] = threading.Thread(target=boot, args=("lab", True))
    threads["lab"].start()
    assert wait_for(lambda: plugin._waiting_alone == 1, 10)
    threads["b"] = threading.Thread(target=boot, args=("b", False))
    threads["b"].start()
    time.sleep(0.2)
    assert events == ["a starts"]  # neither the lab beside a, nor b before the lab
    release["a"].set()
    assert wait_for(lambda: events[-1] == "lab starts", 10)
    time.sleep(0.2)
    assert events == ["a starts", "a ends", "lab starts"]
    release["lab"].set()
    release["b"].set()
    for thread in threads.values():
        thread.join(10)
    assert events == ["a starts", "a ends", "lab starts", "lab ends", "b starts", "b ends"]
    assert not plugin._running and plugin._waiting_alone == 0


@pytest.mark.root  # SCHED_RR needs CAP_SYS_NICE
def test_what_the_guest_asks_the_host_runs_real_time_and_back(tmp_path):
    """harness.host_realtime() inside asks through a file in the lab; the boot's loop on the host answers for every
    process naming the lab (here a sleeper standing in for UML's kernel)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"uml_dir={tmp_path}"])
    try:
        # until the child has exec'd, /proc shows the parent's command line and the host finds nothing to answer for
        deadline = time.monotonic() + 30
        while reaper.processes_of(tmp_path) != [sleeper.pid] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert harness._answer_realtime(tmp_path, False) is False  # nothing asked: nothing changes
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_OTHER
        (tmp_path / harness.REALTIME_ASKED).write_text("1\n")
        assert harness._answer_realtime(tmp_path, False) is True
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_RR and (tmp_path / harness.REALTIME_GIVEN).exists()
        (tmp_path / harness.REALTIME_ASKED).unlink()
        assert harness._answer_realtime(tmp_path, True) is False
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_OTHER
        assert not (tmp_path / harness.REALTIME_GIVEN).exists()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.root  # a negative nice needs CAP_SYS_NICE
def test_what_the_guest_asks_the_host_gives_the_largest_share_and_back(tmp_path):
    """harness.host_share() asks as host_realtime() does; the host sets nice -20 on every process naming the lab
    (and on its session's autogroup, where the kernel has them), then 0 again, never a real-time policy."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"uml_dir={tmp_path}"],
                               start_new_session=True)  # a session, so an autogroup, of its own: as UML's kernel
    autogroup = Path(f"/proc/{sleeper.pid}/autogroup")
    try:
        deadline = time.monotonic() + 30
        while reaper.processes_of(tmp_path) != [sleeper.pid] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert harness._answer_share(tmp_path, False) is False  # nothing asked: nothing changes
        assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == 0
        (tmp_path / harness.SHARE_ASKED).write_text("1\n")
        assert harness._answer_share(tmp_path, False) is True
        assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == harness.SHARE_NICE
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_OTHER and (tmp_path / harness.SHARE_GIVEN).exists()
        if autogroup.exists():
            assert autogroup.read_text().split()[-1] == str(harness.SHARE_NICE), autogroup.read_text()
        (tmp_path / harness.SHARE_ASKED).unlink()
        assert harness._answer_share(tmp_path, True) is False
        assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == 0 and not (tmp_path / harness.SHARE_GIVEN).exists()
        if autogroup.exists():
            assert autogroup.read_text().split()[-1] == "0", autogroup.read_text()
    finally:
        sleeper.kill()
        sleeper.wait()
