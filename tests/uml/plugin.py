"""pytest plugin: tests marked `uml` run inside user-mode Linux (a kernel with sch_netem), one boot per module.

On the host, the first `uml` test of a module boots UML once and runs all of that module's `uml` tests there
(same options: `@pytest.mark.uml(modules=..., deny=...)` give the boot's modules); each outer test then reports
its own inner outcome, with the inner failure text. Inside UML the tests run as written.

Without UML (no `linux.uml`, or not root) the tests are skipped with the reason; when `CI` is set they fail
instead (tests/needs.py): in CI they must run.
"""

from __future__ import annotations

import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.needs import cannot_run
from tests.uml import harness

ROOT = Path(__file__).resolve().parents[2]
BATCH_TIMEOUT = 1500  # seconds for one module's UML boot; the tests' own timeout marks must cover it


@dataclass(frozen=True)
class InnerOutcome:
    status: str  # passed | failed | skipped | missing
    text: str


_batches: dict[tuple, dict[str, InnerOutcome]] = {}


def _boot_options(item: pytest.Item) -> tuple[tuple[str, ...], tuple[str, ...]]:
    marker = item.get_closest_marker("uml")
    assert marker is not None
    modules = tuple(marker.kwargs.get("modules", harness.DEFAULT_MODULES))
    deny = tuple(marker.kwargs.get("deny", ()))
    return modules, deny


def _key(item: pytest.Item) -> tuple:
    return (str(item.path), *_boot_options(item))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "uml(modules=..., deny=...): runs inside user-mode Linux (a kernel with "
                                       "sch_netem); one boot per module and options")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if harness.inside():
        return
    why = harness.unavailable_reason()
    if why is None:
        return
    for item in items:
        if item.get_closest_marker("uml"):
            cannot_run(item, f"user-mode Linux unavailable: {why}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Outside UML, a `uml` test's outcome is its inner run's: no fixture or body runs on the host."""
    if not item.get_closest_marker("uml") or harness.inside() or harness.unavailable_reason() is not None:
        return None  # inside UML: as written; unavailable: the skip/xfail mark added at collection decides
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    start = time.time()
    key = _key(item)
    if key not in _batches:
        siblings = [other for other in item.session.items if other.get_closest_marker("uml") and _key(other) == key]
        _batches[key] = _run_batch(siblings, *_boot_options(item))
    outcome = _batches[key].get(_inner_id(item), InnerOutcome("missing", "not reported by the inner run"))
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
                                   duration=(stop - start) if when == "call" else 0.0, start=start, stop=stop)
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _inner_id(item: pytest.Item) -> str:
    """classname.name as JUnit XML writes them (module path dotted, then classes, then the test's name)."""
    path, *rest = item.nodeid.split("::")
    return ".".join([path.removesuffix(".py").replace("/", "."), *rest])


def _run_batch(items: list[pytest.Item], modules: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, InnerOutcome]:
    with tempfile.TemporaryDirectory(prefix="tb-uml-junit-", dir="/var/tmp") as tmp:
        junit = Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", f"--junitxml={junit}",
                "-o", "junit_family=xunit1", *[item.nodeid for item in items]]
        result = harness.run(argv, cwd=ROOT, timeout=BATCH_TIMEOUT, modules=modules, deny=deny,
                             env={"COLUMNS": "160"})
        outcomes = _parse(junit) if junit.exists() else {}
    tail = "\n".join(result.output.strip().splitlines()[-60:])
    for item in items:
        outcomes.setdefault(_inner_id(item), InnerOutcome(
            "missing", f"user-mode Linux run ended with status {result.returncode} after {result.seconds:.0f}s "
                       f"without reporting this test; its output ends:\n{tail}"))
    return outcomes


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
        out[name] = InnerOutcome(status, text)
    return out
