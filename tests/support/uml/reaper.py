"""What a stopped user-mode Linux run leaves, removed: its kernel's host processes and its lab directory.

Each UML run has a lab directory under /var/tmp (tb-uml-*) holding an `owner` record (the pid and start time of the
process that made it); every host process of its kernel names that directory on its command line (`uml_dir=...`:
UML's processes are forks of the kernel, which keep its argv). Three layers remove them, so that SIGTERM, SIGINT or
SIGKILL of pytest or of scripts/uml-run at any moment leaves nothing:

- the owner's own clean-up (tests/support/uml/harness.py; SIGTERM and SIGHUP are turned into KeyboardInterrupt there);
- a watch per lab (this file run as a script, in a session of its own, deaf to SIGINT, SIGTERM and SIGHUP): it
  holds the read end of a pipe whose write end only the owner holds, and when that reads EOF (the owner ended, even
  by SIGKILL) it kills what names the lab and removes the lab;
- a sweep at the harness's next start (sweep(), `scripts/uml-run --sweep`): labs whose owner is gone, in case the
  watch was killed too.

The namespaces, veths and qdiscs the tests make live inside UML's own kernel: they end with it, nothing reaches the
host's network. Run as a script, it needs nothing but the standard library (of this checkout only
testbed/waiting.py, standard library only too, loaded by its path).

    python tests/support/uml/reaper.py LAB   (stdin: the owner's pipe)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LABS = Path("/var/tmp")
LAB_PREFIX = "tb-uml-"
OWNER = "owner"
UNOWNED_GRACE_S = 60.0  # a lab with no owner record yet may be in the making: left alone for this long


_spec = importlib.util.spec_from_file_location("_testbed_waiting", Path(__file__).resolve().parents[3] / "testbed"
                                               / "waiting.py")
assert _spec is not None and _spec.loader is not None
waiting = sys.modules["_testbed_waiting"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(waiting)


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None if it is gone:
    with the pid, it names one process (a pid alone is reused)."""
    stat = waiting.proc_stat(pid)
    return str(stat.start) if stat is not None and stat.running else None  # a zombie has ended: only its parent
    # has not noticed


def claim(lab: Path, pid: int | None = None) -> None:
    """Record `pid` (this process by default) as the owner of `lab`."""
    pid = os.getpid() if pid is None else pid
    (lab / OWNER).write_text(f"{pid} {start_time(pid)}\n")


@contextmanager
def lab(kind: str = "") -> Iterator[Path]:
    """A fresh lab directory under LABS (tb-uml-KIND...), owned by this process and watched until it is removed on
    leaving, or by the watch when this process ends first."""
    path = Path(tempfile.mkdtemp(prefix=f"{LAB_PREFIX}{kind}", dir=LABS))
    claim(path)
    watch = subprocess.Popen([sys.executable, __file__, str(path)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        assert watch.stdin is not None
        watch.stdin.close()  # the watch finds nothing left, and ends
        watch.wait()


def owner_alive(lab: Path) -> bool | None:
    """Whether the process recorded as `lab`'s owner still runs; None where the lab has no record."""
    try:
        pid, started = (lab / OWNER).read_text().split()
    except (OSError, ValueError):
        return None
    return start_time(int(pid)) == started


def command_lines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every host process whose command line can be read now."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            yield int(cmdline.parent.name), cmdline.read_bytes().split(b"\0")
        except OSError:
            continue


def processes_of(lab: Path) -> list[int]:
    """Host processes whose command line names `lab` (a UML kernel started with uml_dir=LAB, and its forks)."""
    needle = f"uml_dir={lab}".encode()
    return [pid for pid, argv in command_lines() if needle in argv]


def remove(lab: Path, timeout: float = 10.0) -> None:
    """SIGKILL every process naming `lab` until none is left (or `timeout`), then remove `lab`."""
    deadline = time.monotonic() + timeout
    while (pids := processes_of(lab)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    shutil.rmtree(lab, ignore_errors=True)


def sweep(labs: Path = LABS) -> list[Path]:
    """Remove the labs whose owner is gone (and their processes); return them. A lab without an owner record (one
    in the making, or an older harness's) goes only once nothing names it and it is UNOWNED_GRACE_S old."""
    removed = []
    for lab in sorted(labs.glob(f"{LAB_PREFIX}*")):
        alive = owner_alive(lab)
        if alive is None:
            try:
                young = time.time() - lab.stat().st_mtime < UNOWNED_GRACE_S
            except OSError:
                continue
            if young or processes_of(lab):
                continue
        elif alive:
            continue
        remove(lab)
        removed.append(lab)
    return removed


def watch(lab: Path) -> None:
    """Wait for EOF on stdin (the owner's pipe: it closed it, or ended), then remove what `lab` holds."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    while os.read(0, 4096):
        pass
    remove(lab)


if __name__ == "__main__":
    watch(Path(sys.argv[1]))
