"""pytest plugin: tests marked `uml` run inside user-mode Linux (a kernel with sch_netem), a boot per module.

On the host, the tests of one module with the same options share one boot of UML, which runs them all
(`@pytest.mark.uml(modules=..., deny=...)` give the boot's modules; `boot="name"` puts tests of a module in a
boot of their own, e.g. those that do not need its module-scoped testbed); each outer test then reports its own
inner outcome, with the inner failure text and what the host did during the boot (CPU stolen, the busiest
processes, the boots beside it: timing failures inside UML follow the host's load). UML runs on one CPU: the
first `uml` test reached starts every boot of the session, as many at once as the host has CPUs (the boots with
most tests first), and each outer test waits for its own. A boot that measures timing
(`@pytest.mark.uml(alone=True)`) runs with no other boot beside it: beside two busy host processes the netem
module's goodput bound failed 2 runs of 4 with a second boot beside the lab's, and held 5 of 5 with the lab's boot
alone (docs/development/tests.md, "How steady the netem tests are"). Inside UML the tests run as written.
`on_host=True` marks a test that needs UML but boots it itself (tests/suite/test_uml_stopped.py): it runs on the
host, once the boots are over.

From the first boot on, SIGTERM and SIGHUP end the session as Ctrl-C does: its boots are killed and their labs
removed (tests/support/uml/reaper.py covers SIGKILL).

Without UML (no `linux.uml`, or not root) the tests are skipped with the reason; when `CI` is set they fail
instead (tests/needs.py, applied by tests/conftest.py): in CI they must run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import pytest

from testbed.runner.hostcpu import PROC_STAT, cpu_times
from tests.support.uml import harness, reaper

ROOT = Path(__file__).resolve().parents[3]
BATCH_TIMEOUT = 1500  # seconds for one module's UML boot; the tests' own timeout marks must cover it


@dataclass(frozen=True)
class InnerOutcome:
    status: str  # passed | failed | skipped | missing
    text: str
    stdout: str = ""  # what the test printed (a passed test's record: `-rP` and the junit XML show it)


_batches: dict[BootKey, Future[dict[str, InnerOutcome]]] = {}
_running: dict[str, bool] = {}  # the boots running now -> whether each runs alone
_waiting_alone = 0  # boots that run alone waiting for their turn: no other boot starts before them
_spans: list[tuple[str, float, float]] = []  # (boot, start, end) of the boots that have ended, time.monotonic()
_gate = threading.Condition()  # guards the three: a boot running alone waits for none, others for none alone
_cancel = threading.Event()  # set when the session ends: boots still running are killed
_pool: ThreadPoolExecutor | None = None


def _boot_options(item: pytest.Item) -> tuple[tuple[str, ...], tuple[str, ...]]:
    marker = item.get_closest_marker("uml")
    assert marker is not None
    modules = tuple(marker.kwargs.get("modules", harness.DEFAULT_MODULES))
    deny = tuple(marker.kwargs.get("deny", ()))
    return modules, deny


class BootKey(NamedTuple):
    """What puts tests in one boot: their file, the boot's modules and options, and whether it runs alone."""

    path: str
    modules: tuple[str, ...]
    deny: tuple[str, ...]
    boot: str
    alone: bool

    @property
    def name(self) -> str:
        """The boot as a failure text names it: its test file, and its boot name or options where it has them."""
        extra = self.boot or (f"deny={','.join(self.deny)}" if self.deny else ""
                              if self.modules == harness.DEFAULT_MODULES else f"modules={','.join(self.modules) or '-'}")
        return Path(self.path).name + (f"[{extra}]" if extra else "")


def _key(item: pytest.Item) -> BootKey:
    marker = item.get_closest_marker("uml")
    assert marker is not None
    return BootKey(str(item.path), *_boot_options(item), marker.kwargs.get("boot", ""),
                   bool(marker.kwargs.get("alone")))


@contextmanager
def _turn(name: str, alone: bool) -> Iterator[None]:
    """Hold a boot's turn on the host: a boot running alone waits until none runs, and no other starts beside it
    or before it (once it waits) until it ends."""
    global _waiting_alone
    with _gate:
        _waiting_alone += alone
        try:
            _gate.wait_for(lambda: _cancel.is_set() or (not _running if alone else
                                                         not any(_running.values()) and not _waiting_alone))
        finally:
            _waiting_alone -= alone
        _running[name] = alone
    try:
        yield
    finally:
        with _gate:
            _running.pop(name, None)
            _gate.notify_all()


def _beside(name: str, start: float) -> str:
    """The boots that ran beside `name` since `start` (those running now and those that ended since)."""
    with _gate:
        names = {other for other, _, end in _spans if end > start} | _running.keys()
    return ", ".join(sorted(names - {name})) or "none"


def _on_host(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("uml")
    return marker is not None and bool(marker.kwargs.get("on_host"))


def _start_boots(session: pytest.Session) -> None:
    """Every boot of the session's `uml` tests, queued at once: one per host CPU at a time, most tests first."""
    global _pool
    groups: dict[BootKey, list[pytest.Item]] = {}
    for item in session.items:
        if item.get_closest_marker("uml") and not _on_host(item):
            groups.setdefault(_key(item), []).append(item)
    harness.interrupt_on_termination()
    _pool = ThreadPoolExecutor(max_workers=max(1, min(len(groups), os.cpu_count() or 1)),
                               thread_name_prefix="uml-boot")
    for key, items in sorted(groups.items(), key=lambda group: (not group[0].alone, -len(group[1]))):
        _batches[key] = _pool.submit(_run_batch, items, key)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Outside UML, a `uml` test's outcome is its inner run's: no fixture or body runs on the host."""
    if not item.get_closest_marker("uml") or harness.inside() or harness.unavailable_reason() is not None:
        return None  # inside UML: as written; unavailable: the skip/xfail mark added at collection decides
    if _on_host(item):
        for boot in _batches.values():  # a boot of its own beside them would slow theirs (their timing tests)
            _outcomes(boot)
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    start = time.time()
    if not _batches:
        _start_boots(item.session)
    outcome = _outcomes(_batches[_key(item)]).get(_inner_id(item),
                                                   InnerOutcome("missing", "not reported by the inner run"))
    if outcome.status == "passed":
        status, longrepr = "passed", None
    elif outcome.status == "skipped":
        status, longrepr = "failed", f"skipped inside user-mode Linux (a skip there is a test we do not have): " \
                                     f"{outcome.text}"
    else:
        status, longrepr = "failed", f"inside user-mode Linux: {outcome.status}\n{outcome.text}"
    stop = time.time()
    for when in ("setup", "call", "teardown"):
        failed_here = when == "call" and status == "failed"
        report = pytest.TestReport(item.nodeid, item.location, dict.fromkeys(item.keywords, 1),
                                   "failed" if failed_here else "passed", longrepr if failed_here else None, when,
                                   duration=(stop - start) if when == "call" else 0.0, start=start, stop=stop,
                                   sections=[("Captured stdout call", outcome.stdout)]
                                   if when == "call" and outcome.stdout else [])
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _outcomes(boot: Future[dict[str, InnerOutcome]]) -> dict[str, InnerOutcome]:
    """The boot's outcomes once it ends. Waits in short slices: a Ctrl-C that lands on a boot's thread (blocked
    in waitpid) leaves a plain wait asleep, and the main thread must wake to raise it."""
    while True:
        try:
            return boot.result(timeout=0.2)
        except TimeoutError:
            continue


def pytest_unconfigure(config: pytest.Config) -> None:
    """A session that ends early (-x, Ctrl-C) kills the boots still running and drops those not started."""
    if _pool is not None:
        _cancel.set()
        with _gate:
            _gate.notify_all()
        _pool.shutdown(wait=True, cancel_futures=True)


def _inner_id(item: pytest.Item) -> str:
    """classname.name as JUnit XML writes them (module path dotted, then classes, then the test's name)."""
    path, *rest = item.nodeid.split("::")
    return ".".join([path.removesuffix(".py").replace("/", "."), *rest])


def _processes() -> dict[int, tuple[str, int]]:
    """pid -> (command name, CPU ticks used so far) of every process on the host."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        out[int(stat.parent.name)] = (name, int(fields[11]) + int(fields[12]))  # utime + stime
    return out


def _host_during(before: tuple, after: tuple, seconds: float, beside: str) -> str:
    """One line on what the host did while a boot ran: CPU stolen by the hypervisor, the processes that used most
    CPU and the boots beside it (another UML boot beside this one is expected unless it runs alone; anything else
    is a lead for a timing failure)."""
    (cpu0, procs0), (cpu1, procs1) = before, after
    steal = f"{(cpu1[1] - cpu0[1]) / max(1, cpu1[0] - cpu0[0]):.1%}" if cpu0 and cpu1 else "unknown"
    ticks = os.sysconf("SC_CLK_TCK")
    used = sorted(((t - procs0.get(pid, (name, 0))[1], name, pid) for pid, (name, t) in procs1.items()),
                  reverse=True)[:6]
    busiest = ", ".join(f"{name}[{pid}] {t / ticks:.1f} s" for t, name, pid in used if t >= ticks / 10)
    return (f"host during this boot ({seconds:.0f} s, {os.cpu_count()} CPUs): steal {steal}, load "
            f"{os.getloadavg()[0]:.1f}; busiest: {busiest}; other boots beside it: {beside}")


def _snapshot() -> tuple:
    return cpu_times(PROC_STAT.read_text()), _processes()


def _run_batch(items: list[pytest.Item], key: BootKey) -> dict[str, InnerOutcome]:
    name = key.name
    with _turn(name, key.alone):
        if _cancel.is_set():
            return {}
        before, start = _snapshot(), time.monotonic()
        result, outcomes = _boot(items, key.modules, key.deny)
        host = _host_during(before, _snapshot(), time.monotonic() - start, _beside(name, start))
        with _gate:
            _spans.append((name, start, time.monotonic()))
    outcomes = {test: outcome if outcome.status == "passed" else replace(outcome, text=f"{outcome.text}\n{host}")
                for test, outcome in outcomes.items()}
    tail = "\n".join(result.output.strip().splitlines()[-60:])
    for item in items:
        outcomes.setdefault(_inner_id(item), InnerOutcome(
            "missing", f"user-mode Linux run ended with status {result.returncode} after {result.seconds:.0f}s "
                       f"without reporting this test; its output ends:\n{tail}\n{host}"))
    return outcomes


def _boot(items: list[pytest.Item], modules: tuple[str, ...], deny: tuple[str, ...]) -> tuple:
    """One boot of UML running `items` in an inner pytest: (harness.Result, outcomes by inner test id)."""
    with reaper.lab("junit-") as lab:
        junit = lab / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", f"--junitxml={junit}",
                "-o", "junit_family=xunit1", "-o", "junit_logging=system-out", *[item.nodeid for item in items]]
        result = harness.run(argv, cwd=ROOT, timeout=BATCH_TIMEOUT, modules=modules, deny=deny,
                             env={"COLUMNS": "160"}, cancel=_cancel)
        return result, _parse(junit) if junit.exists() else {}


def _parse(path: Path) -> dict[str, InnerOutcome]:
    out: dict[str, InnerOutcome] = {}
    for case in ElementTree.parse(path).iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        status, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                status = "skipped" if kind == "skipped" else "failed"
                text = "\n".join(x for x in (found.get("message") or "", found.text or "") if x)
                break
        for stream in ("system-out", "system-err"):
            found = case.find(stream)
            if status == "failed" and found is not None and found.text:
                text += f"\n--- captured {stream} ---\n{found.text[-4000:]}"
        out[name] = InnerOutcome(status, text, case.findtext("system-out") or "")
    return out
