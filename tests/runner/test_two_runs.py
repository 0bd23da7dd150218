"""Two users on one machine (root): while `testbed run` runs, every command aimed at its testbed is refused in one
line naming it, a second `testbed run` with the default prefix runs beside it on a prefix of its own, `up` and
`down` of the default prefix and `clean` leave it alone, and both finish with every cell ok. Each run's manifest
names the other (they shared the machine's cores: the first saw the second before one of its cells, the second
saw the first when its testbed came up)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.fabric.lifecycle import tear_down
from testbed.plan import DEFAULT_PREFIX
from tests.conftest import ROOT, namespaces_with, run_cli
from tests.runner.test_run import experiment

pytestmark = pytest.mark.root


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a refused command printed (asserting it is one line and nothing went to stdout)."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    return lines[0]


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in (out / "tiny").glob("*") if (p / "manifest.json").exists())


def test_a_run_is_never_removed_and_a_second_run_goes_beside_it(state_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("TESTBED_PREFIX", raising=False)  # the default: each run takes a prefix of its own
    assert namespaces_with(DEFAULT_PREFIX) == [], "this test brings the default prefix up: nothing may use it"
    path = experiment(tmp_path, steps=10, sweep="[1ms, 2ms, 3ms, 4ms, 5ms]")  # 12 cells: long enough for the rest
    first = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(path), "--out", str(tmp_path / "a")],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(first.stderr), daemon=True)  # the pipe never fills
    reader.start()
    prefix, second = None, None
    try:
        while prefix is None:  # its progress names the prefix it took before the testbed comes up
            found = re.search(r"testbed prefix: (\S+)", "".join(said))
            prefix = found.group(1) if found else None
            assert prefix or first.poll() is None, "".join(said)
            time.sleep(0.05)
        assert prefix.startswith(f"{DEFAULT_PREFIX}run"), prefix
        while not namespaces_with(prefix):  # up (the run has a cell timeout of its own)
            assert first.poll() is None, "".join(said)
            time.sleep(0.1)
        owner = rf"testbed {re.escape(prefix)} is held by pid {first.pid} \(testbed run {re.escape(str(path))} "
        # a second run with the default prefix, while the first is in its first cells
        second = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(path), "--only",
                                   "flat-dp__latency*1ms*", "--out", str(tmp_path / "b")], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        for command, doing in ((["up", "topologies/two-dc.yaml"], "another testbed does not come up under its "
                                "prefix"), (["down"], "it is not removed while that process lives"),
                               (["clean"], "it is not removed while that process lives"),
                               (["run", str(path), "--out", str(tmp_path / "c")], "another testbed does not come "
                                "up under its prefix")):
            started = time.monotonic()
            refused = run_cli(*command, "--prefix", prefix, timeout=120)
            line = error_line(refused)
            print(f"{command[0]} --prefix {prefix}: refused in {time.monotonic() - started:.2f} s: {line}")
            assert refused.returncode == 2 and re.match(rf"error: {owner}.*\) since .* UTC: {doing} \(", line), line
            assert f"`testbed clean --force --prefix {prefix}` removes it anyway" in line
            assert first.poll() is None and namespaces_with(prefix)  # untouched
        assert not (tmp_path / "c").exists()

        # the default prefix is not the run's: `up` then `down` there, and `clean`, leave the run alone
        up = run_cli("up", "topologies/two-dc.yaml", timeout=120)
        assert up.returncode == 0, up.stderr
        assert namespaces_with(DEFAULT_PREFIX) and namespaces_with(prefix)
        assert run_cli("down", timeout=120).returncode == 0 and namespaces_with(DEFAULT_PREFIX) == []
        cleaned = run_cli("clean", timeout=120)
        assert cleaned.returncode == 0, cleaned.stderr
        assert first.poll() is None and namespaces_with(prefix)

        # the second run with the default prefix goes beside the first, on a prefix of its own
        _, second_err = second.communicate(timeout=300)
        assert second.returncode == 0, second_err[-3000:]
        other = re.search(r"testbed prefix: (\S+)", second_err).group(1)
        assert other != prefix and namespaces_with(other) == []
        (b_run,) = run_dirs(tmp_path / "b")
        b_manifest = json.loads((b_run / "manifest.json").read_text())
        assert b_manifest["prefix"] == other
        assert (prefix, first.pid) in {(o["prefix"], o["pid"]) for o in b_manifest["shared_host"]}  # and others

        first.wait(timeout=600)
        reader.join(timeout=10)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if prefix:
            tear_down(prefix)
        tear_down(DEFAULT_PREFIX)
    assert first.returncode == 0, "".join(said)[-3000:]
    assert namespaces_with(prefix) == []
    (a_run,) = run_dirs(tmp_path / "a")
    results = [json.loads(p.read_text()) for p in (a_run / "cells").glob("*/result.json")]
    assert len(results) == 12 and all(r["status"] == "ok" for r in results), [r["reason"] for r in results]
    a_manifest = json.loads((a_run / "manifest.json").read_text())
    assert a_manifest["prefix"] == prefix
    assert other in {o["prefix"] for o in a_manifest["shared_host"]}  # seen before one of its cells
    assert "**shared machine**: " in (a_run / "report.md").read_text()
