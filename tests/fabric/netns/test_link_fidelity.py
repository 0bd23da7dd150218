"""Every DC pair's round trip against the one fidelity definition (testbed.runner.fidelity): its median within
0.2 ms of the applied round trip plus the floor (here the same path unshaped: pings marked to skip the delay lines,
measured at the same time as the pair's pings), through the userspace delay line, on links of 0.8 ms, 3 ms and 0 ms
one way. The delay line measures its own path and aims that much early; a 0 ms link does not pass through it.
(bench/link_fidelity.py holds the 0.05 ms target.) Beside the suite's own UML boots, with the floors measured before
the pairs, 2 runs of 8 missed the bound (by up to 1.16 ms) and CI failed once at 0.203 ms; with the DCs' own floors
measured beside each pair's pings the worst of 8 runs was 0.116 ms, and 0.115 ms of 4 quiet ones (2026-11-29,
CHANGELOG). CI then read a->d (two delay lines each way) 0.266 ms off once, in a run whose UML boot beside it lost
8.3 % of the CPU to the hypervisor; here the same pair read 0.024-0.055 ms in 8 runs, quiet, beside two UML boots
and beside two SCHED_RR busy loops (2026-12-06). So each pair keeps the steal during its pings, and a pair the
probe flags for it (above 2 %) is not held to the bound; more than half of them flagged fails the run (it then
measured the host's other guests more than the delay line)."""

import json
import statistics
import subprocess
import sys

import pytest

from testbed import settings
from testbed.agents import probe
from testbed.fabric.lifecycle import bring_up
from testbed.plan.delayline import UNSHAPED_DSCP
from testbed.runner.hostcpu import HOST_STEAL_BOUND
from tests.conftest import namespaces_with, run_cli
from tests.support.topologies import pair_topology

pytestmark = pytest.mark.root

CHAIN = """\
name: fidelity-chain
dcs:
  - {name: a, nodes: 2}
  - {name: b, nodes: 2}
  - {name: c, nodes: 2}
  - {name: d, nodes: 2}
links:
  - {between: [a, b], latency: 0.8ms, bandwidth: 1gbit}
  - {between: [b, c], latency: 3ms, bandwidth: 1gbit}
  - {between: [c, d], latency: 0ms, bandwidth: 1gbit}
"""
BOUND_MS = 0.2


def test_every_pair_is_its_configured_round_trip_plus_the_floor(prefix, tmp_path):
    path = tmp_path / "chain.yaml"
    path.write_text(CHAIN)
    proc = run_cli("probe", str(path), "--json", "--pings", "200", "--seconds", "0", "--shaper", "userspace-delay",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    pairs = json.loads(proc.stdout)["pairs"]
    assert namespaces_with(prefix) == []
    one_way = {("a", "b"): 0.8, ("b", "c"): 3.0, ("c", "d"): 0.0}
    assert len(pairs) == 12
    for pair in pairs:
        dcs = "abcd"
        low, high = sorted((dcs.index(pair["src"]), dcs.index(pair["dst"])))
        configured = 2 * sum(one_way[(dcs[i], dcs[i + 1])] for i in range(low, high))
        assert pair["rtt_applied_ms"] == pytest.approx(configured) and pair["not_applied"] == ""
        assert pair["rtt_floor_of"] == "path" and pair["rtt_floor_ms"] is not None, pair
        assert 0 < pair["rtt_floor_ms"] < 1.0 and 0 < pair["rtt_dc_floor_ms"] < 1.0, pair
        assert pair["rtt_expected_ms"] == pytest.approx(configured + pair["rtt_floor_ms"])
        assert pair["host_steal"] is not None and bool(pair["host_steal_note"]) == (pair["host_steal"] > HOST_STEAL_BOUND)
        if not pair["host_steal_note"]:  # a pair the probe itself flags is partly the hypervisor's other guests'
            assert abs(pair["rtt_p50_error_ms"]) <= BOUND_MS, pair
        assert pair["delay_line_note"] == ""  # 0.8 ms and 3 ms are above what the delay line needs
        if configured > 0:
            assert pair["delay_line_residual_ms"] is not None
    stolen = [pair for pair in pairs if pair["host_steal_note"]]
    assert len(stolen) <= len(pairs) // 2, f"the hypervisor took over {HOST_STEAL_BOUND:.0%} of the CPU during " \
        f"{len(stolen)} of {len(pairs)} pairs' pings: this run could not measure the delay line's fidelity"


def test_status_says_where_a_link_asks_for_less_than_the_delay_line_can_give(prefix, tmp_path):
    """5 us one way is below the delay line's own reaction to a packet (tens of microseconds here): `status` shows
    each direction's figures and names that link, where 3 ms is compensated without a note."""
    path = tmp_path / "tiny.yaml"
    path.write_text(CHAIN.replace("0.8ms", "0.005ms"))
    run_cli("up", str(path), "--shaper", "userspace-delay", check=True)
    run_cli("probe", "--pings", "50", "--seconds", "0", check=True)  # packets through every delay line
    lines = json.loads(run_cli("status", "--json", check=True).stdout)["delay_lines"]
    assert sorted(lines) == ["a->b", "b->a", "b->c", "c->b", "c->d", "d->c"]
    for key in ("a->b", "b->a"):
        assert lines[key]["packets"] > 0 and lines[key]["least_ms"] > 0.005
        assert lines[key]["note"].startswith(f"{key}: 0.005 ms is below the delay line's own"), lines[key]
    for key in ("b->c", "c->b"):
        assert lines[key]["packets"] > 0 and lines[key]["note"] == "" and lines[key]["residual_ms"] is not None
    assert lines["c->d"]["packets"] == 0  # 0 ms: no rule, its packets never pass through the delay line
    table = run_cli("status", check=True).stdout
    assert "userspace delay lines" in table and "not compensated" in table


def test_pings_marked_unshaped_skip_the_delay_line_both_ways(prefix):
    """The floor's pings (DSCP UNSHAPED_DSCP) cross a 5 ms link unshaped, there and back (the probe's echo answers
    with the ping's mark), and the delay line never holds them; unmarked pings take the 10 ms round trip."""
    testbed = bring_up(pair_topology(latency="5ms", bandwidth="1gbit"), prefix=prefix, shaper="userspace-delay")
    target = testbed.plan.node("west-0").address
    server = testbed.fabric.popen("west-0", [sys.executable, "-m", probe.__name__, "serve", "--port", "5201"],
                                  stdout=subprocess.PIPE, text=True)
    try:
        assert "ready" in server.stdout.readline()

        def median_ms(*marks: str) -> float:
            proc = testbed.fabric.popen("east-0", [sys.executable, "-m", probe.__name__, "rtt", target, "--port",
                                                   "5201", "--count", "20", "--interval", "0.01", *marks],
                                        stdout=subprocess.PIPE, text=True)
            answer = json.loads(proc.communicate(timeout=60)[0])
            assert answer["received"] == 20, answer
            return statistics.median(answer["rtts"]) * 1e3

        held = testbed.fabric.delay_line_stats()
        marked = median_ms("--dscp", str(UNSHAPED_DSCP))
        after = testbed.fabric.delay_line_stats()
        plain = median_ms()
    finally:
        server.kill()
        server.wait()
    assert marked < 1.0 and plain >= 10.0, (marked, plain)
    for key in ("east->west", "west->east"):  # not one marked packet was held, either way
        assert after.get(key, {}).get("released", 0) == held.get(key, {}).get("released", 0), key


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_release_after_a_sleep_warms_the_verdicts_path_first_unless_switched_off(prefix, monkeypatch, switch):
    """Idle pings 2 ms one way: the worker sleeps before each release, so each one is preceded by a verdict that
    accepts nothing (the delay line's `warmed` count) unless its sleep ended past the packet's aim (`woke_late`), none
    with TESTBED_DELAY_LINE_WARM=0 (`cold`); every ping comes back either way. (What it buys is measured by bench/delay_line_path.py.)"""
    monkeypatch.setenv(settings.DELAY_LINE_WARM, switch)
    testbed = bring_up(pair_topology(latency="2ms", bandwidth="1gbit"), prefix=prefix, shaper="userspace-delay")
    pings = 20
    proc = testbed.fabric.popen("east-0", ["ping", "-n", "-q", "-i", "0.02", "-c", str(pings),
                                           testbed.plan.node("west-0").address],
                                stdout=subprocess.PIPE, text=True)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0 and f"{pings} received" in out, out
    stats = testbed.fabric.delay_line_stats()["east->west"]
    assert stats["released"] >= pings, stats
    # every release after a sleep was warmed first, unless the sleep ended past its aim (a VM's late timers: CI
    # warmed 3, then 9 of 20 with a 2 ms hold, 2026-12-02) or warm-ups are off
    if switch == "1":
        assert stats["warmed"] > 0 and stats["cold"] == 0, stats
        assert stats["warmed"] + stats["woke_late"] >= pings, stats
    else:
        assert stats["warmed"] == 0 and stats["cold"] + stats["woke_late"] >= pings, stats
