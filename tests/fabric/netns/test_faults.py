"""Link faults on a live testbed, as a probe sees them: `testbed fault partition` blocks the link and clears it;
SIGKILL of the fault command mid-partition leaves the record that `fault --clear` restores the link from, and
`clean` leaves nothing, after which a fresh testbed probes at its configured RTT."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from testbed.fabric.lifecycle import attach
from testbed.fabric.state import load as load_state
from testbed.runner.probe import PORT, _agent, _Server
from tests.conftest import ROOT, TOPOLOGIES, namespaces_with, run_cli

pytestmark = pytest.mark.root

INTERVAL = 0.025  # seconds between pings


def _fault(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "fault", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _pings(prefix: str, count: int, during=None) -> dict:
    """`count` UDP pings east-0 -> west-0, INTERVAL apart; `during()` runs once they are going."""
    testbed = attach(prefix)
    west = testbed.plan.node("west-0")
    with _Server(testbed.fabric, "west-0"):
        proc = testbed.fabric.popen("east-0", _agent("rtt", west.address, "--port", str(PORT), "--count", str(count),
                                                     "--interval", str(INTERVAL), "--timeout", "1"),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if during is not None:
            time.sleep(0.5)
            during()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out)


def _runs(numbers: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs


def _wait_for_fault_record(prefix: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        saved = load_state(prefix)
        if saved is not None and saved.faults:
            time.sleep(0.3)  # recorded first, applied right after
            return
        time.sleep(0.05)
    raise AssertionError("the fault was never recorded in the state file")


def test_a_partition_blocks_the_link_for_its_duration_then_clears(prefix):
    run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), check=True)
    faults: list[subprocess.Popen] = []
    result = _pings(prefix, 200, during=lambda: faults.append(_fault("partition", "east", "west", "--for", "1.5s")))
    out, err = faults[0].communicate(timeout=30)
    assert faults[0].returncode == 0, err
    assert "partition east<->west: applied at" in out
    runs = _runs(result["lost"])
    # one contiguous gap, as long as the partition (pings already on the wire when it starts still arrive)
    assert len(runs) == 1, runs
    assert 1.5 * 0.85 <= len(runs[0]) * INTERVAL <= 1.5 * 1.15 + 0.1, len(runs[0]) * INTERVAL
    assert runs[0][-1] < 199  # it cleared: the pings after it came back
    assert load_state(prefix).faults == {}
    after = [r * 1e3 for r in result["rtts"][-40:]]
    assert 20.0 <= sorted(after)[len(after) // 2] <= 22.0  # and the link has its own 10 ms each way again


def test_sigkill_during_a_partition_then_clear_or_clean_restores_the_link(prefix, state_dir):
    run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), check=True)
    victim = _fault("partition", "east", "west", "--for", "60s")
    _wait_for_fault_record(prefix)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    dark = _pings(prefix, 20)
    assert dark["received"] == 0  # the partition outlives its command...
    assert "east->west" in json.dumps(load_state(prefix).faults)
    run_cli("fault", "--clear", check=True)  # ...until --clear restores the link from the state file's record
    light = _pings(prefix, 40)
    assert light["received"] == 40 and 20.0 <= sorted(light["rtts"])[20] * 1e3 <= 22.0
    assert load_state(prefix).faults == {}

    victim = _fault("loss-burst", "east", "west", "--for", "60s", "--loss", "100%")
    _wait_for_fault_record(prefix)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    run_cli("clean", check=True)
    assert namespaces_with(prefix) == [] and not list(state_dir.glob("*.json"))
    leftover = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(state_dir) not in leftover  # no delay line of ours still running
    run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), check=True)
    fresh = _pings(prefix, 40)
    assert fresh["received"] == 40 and 20.0 <= sorted(fresh["rtts"])[20] * 1e3 <= 22.0


def test_a_bad_fault_is_refused_in_one_line(prefix):
    run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), check=True)
    for args, needle in ((["partition", "east", "west"], "--for: partition needs --for"),
                         (["partition", "east", "north", "--for", "1s"], "no direct link between east and north"),
                         (["latency", "east", "west", "--for", "1s", "--latency", "80ms", "--loss", "5%"],
                          "--loss: latency does not take"),
                         (["kill", "east", "west"], "KIND A B")):
        proc = run_cli("fault", *args)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            proc.stderr


def _while_in_force(prefix: str, args: list[str], measure):
    """Start `testbed fault ARGS`, wait until its record is in the state file, measure, let it finish."""
    proc = _fault(*args)
    try:
        _wait_for_fault_record(prefix)
        return measure()
    finally:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err


def test_every_link_kind_is_applied_as_the_probe_and_status_see_it_and_cleared(prefix):
    run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), check=True)
    slow = _while_in_force(prefix, ["latency", "east", "west", "--for", "4s", "--latency", "60ms", "--jitter", "1ms"],
                           lambda: _pings(prefix, 30))
    assert 119.0 <= sorted(slow["rtts"])[15] * 1e3 <= 124.0  # 60 ms each way (+-1 ms)
    lossy = _while_in_force(prefix, ["loss-burst", "east", "west", "--for", "8s", "--loss", "50%"],
                            lambda: _pings(prefix, 200))
    assert 0.6 <= 1 - lossy["received"] / 200 <= 0.9  # both ways: 1 - 0.5 x 0.5 = 75 % of round trips lost
    status = _while_in_force(prefix, ["bandwidth", "east", "west", "--for", "3s", "--bandwidth", "10mbit"],
                             lambda: json.loads(run_cli("status", "--json", check=True).stdout))
    assert {link["key"]: link["bandwidth"] for link in status["links"] if link["kind"] == "inter-dc"} == {
        "east->west": "10mbit", "west->east": "10mbit"}
    flap: list[subprocess.Popen] = []
    # 6 s of pings: the flap's 2.3 s start 0.5 s in, after the fault command's own start (up to 2 s in CI; with
    # 4 s of pings the third window was cut short there)
    flapped = _pings(prefix, 240, during=lambda: flap.append(_fault("flap", "east", "west", "--for", "3s",
                                                                    "--period", "1s", "--down", "300ms")))
    out, err = flap[0].communicate(timeout=30)
    assert flap[0].returncode == 0 and out.count("flap east<->west") == 3, (out, err)
    runs = _runs(flapped["lost"])
    gaps = [len(run) * INTERVAL for run in runs]
    assert runs and runs[-1][-1] < 239, "the pings ended before the flap did"
    assert len(gaps) == 3 and all(0.2 <= gap <= 0.45 for gap in gaps), gaps  # three 300 ms windows
    after = _pings(prefix, 40)  # every fault cleared: the link as configured
    assert after["received"] == 40 and 20.0 <= sorted(after["rtts"])[20] * 1e3 <= 22.0
    status = json.loads(run_cli("status", "--json", check=True).stdout)
    assert all(link["latency"] == "10ms" and link["bandwidth"] == "1gbit" and link["loss"] == "0%"
               for link in status["links"] if link["kind"] == "inter-dc")


def test_sigterm_ends_the_fault_command_with_the_link_restored(prefix):
    run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), check=True)
    proc = _fault("partition", "east", "west", "--for", "60s")
    _wait_for_fault_record(prefix)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert "partition east<->west: applied at" in out and "cleared at None" not in out, (out, err)
    assert load_state(prefix).faults == {}
    assert _pings(prefix, 20)["received"] == 20
