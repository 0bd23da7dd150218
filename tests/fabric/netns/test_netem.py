"""The kernel netem path, run for real inside user-mode Linux 6.1 (this host's kernel has no sch_netem).

Bounds are looser than on the host: UML has one CPU and coarser timing (its probe p99 is several ms where the
host's is sub-ms), so these tests prove that the netem path works, is changed in place and is removed; the
host's benchmarks stay the fidelity reference. A silent fall-back to the userspace delay line fails them.

Round trips are held against the configured ones net of what UML itself adds on the same route, measured in the
same boot just before (route_round_trips_ms: the route's netem qdiscs held at 0 delay), and measured while the
host runs UML's processes real-time (harness.host_realtime): each netem hop's timer needs the host to wake UML,
and beside busy host processes those wake-ups came late, more so the more hops a path has (figures in
host_realtime's docstring; the issue's failures: 1.82 ms beyond 20 ms on one hop, 5.27 ms beyond 50 ms, against
UML's own unshaped round trip inside one DC). With 3-5 `python3 -c 'while True: pass'` beside on this 2-core host
and other sessions' tests running (load 5-12, 2026-11-28), p50 minus own route minus configured, per probe pair
and for the live-shaped 50 ms: real-time, eight runs, -0.38..+0.24 ms and -0.16..+0.24 ms; without it
(TESTBED_UML_RT=0, one run), up to +1.10 ms (west->east) and +1.22 ms. UML's own round trips on the routes:
0.30-0.87 ms. How steady the module is, run after run, quiet and beside two busy loops: docs/development/tests.md
("How steady the netem tests are", 2026-11-28). With a second UML boot beside the lab's, beside two busy loops 2 runs
of 4 failed the goodput bound (UML carried 19-39 % under the rate, no retransmission); so the lab's boot runs alone
(uml(alone=True)): then 5 of 5 beside two busy loops (lowest goodput ratio 0.979), then 5 of 5 quiet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.fabric.lifecycle import attach
from testbed.runner.fidelity import percentile
from testbed.runner.probe import _run_agent, _Server
from tests.conftest import ROOT, jittered_uniformly, namespaces_with, run_cli
from tests.support.stalls import watched
from tests.support.topologies import pair_topology
from tests.support.uml.harness import host_realtime, host_share

# the lab's boot measures round trips and goodput: no other boot beside it (tests/support/uml/plugin.py says why)
pytestmark = [pytest.mark.uml(alone=True), pytest.mark.root, pytest.mark.timeout(1800)]
WITHOUT_LAB = pytest.mark.uml(boot="without-lab")  # tests that build their own: a boot of their own

THREE_DC = """
name: three-netem
dcs:
  - {name: east, nodes: 2}   # east-1: the other end of an unshaped path, to measure UML's own round trip
  - {name: west, nodes: 1}
  - {name: north, nodes: 1}
links:                       # east <-> north has no link: routed over west
  - {between: [east, west], latency: 10ms, bandwidth: 200mbit}
  - {between: [west, north], latency: 5ms, bandwidth: 100mbit, reverse: {latency: 8ms, bandwidth: 50mbit}}
"""


FLOW_SECONDS = 3  # each pair's goodput flow


def rtt_bound_ms(configured_ms: float) -> float:
    """How far the probe's RTT p50 may be from the configured RTT inside UML: max(5 %, 1.5 ms)."""
    return max(0.05 * configured_ms, 1.5)


def uml_round_trip_ms(testbed) -> float:
    """The probe's round trip over an unshaped path inside one DC (east-0 -> east-1): what UML's one slow CPU
    adds to every round trip (ptrace'd Python endpoints; ~1 ms here, more while the host is busy), taken off
    before a measured RTT is held against the configured one. On the host this is ~0.1 ms."""
    return statistics.median(pings(testbed, "east-0", "east-1", 100, 0.01)["rtts"]) * 1e3


SHAPED_KEYS = ("east->west", "west->east", "west->north", "north->west")
HELD_MS = 1.0  # what each netem qdisc holds while UML's own round trip with its timers is measured


def route_round_trips_ms(prefix: str, pairs: list[tuple[str, str]], quantile: float = 0.5,
                         ends: dict[tuple[str, str], int] | None = None) -> dict[tuple[str, str], float]:
    """The probe's round trip (its `quantile` of 100: the median unless told) between node 0 of each pair of DCs
    over its own route, with every netem qdisc of the testbed held at 0 delay, no jitter, no loss (the same qdiscs,
    gateways and ptrace'd endpoints: what UML adds on that route), then every link end put back as it was. With
    `ends` (the netem link ends each pair's round trip crosses) every qdisc holds HELD_MS instead, taken off again:
    what UML adds then includes how late its timers release what netem holds, which a 0 delay never waits for."""
    testbed = attach(prefix)
    saved = {key: testbed.plan.link_end(key).shaping.params for key in SHAPED_KEYS}
    held = HELD_MS if ends else 0.0
    try:
        for key in SHAPED_KEYS:
            testbed.change(key, latency=held / 1e3, jitter=0.0, loss=0.0)
        return {(src, dst): percentile(pings(attach(prefix), f"{src}-0", f"{dst}-0", 100, 0.01)["rtts"], quantile) * 1e3
                - held * (ends or {}).get((src, dst), 0) for src, dst in pairs}
    finally:
        for key, params in saved.items():
            testbed.shape(key, params)


def tc(namespace: str, *args: str) -> str:
    return subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True,
                          check=True).stdout


def netem_line(namespace: str, dev: str) -> str:
    lines = [line for line in tc(namespace, "-s", "qdisc", "show", "dev", dev).splitlines() if " netem " in line]
    assert len(lines) == 1, lines
    return lines[0]


def qdisc_sent_bytes(namespace: str, dev: str) -> int:
    """Bytes the netem qdisc on `dev` has sent since it was created (a rebuilt qdisc starts again at 0)."""
    out = tc(namespace, "-s", "qdisc", "show", "dev", dev).splitlines()
    for index, line in enumerate(out):
        if " netem " in line:
            return int(out[index + 1].split()[1])
    raise AssertionError(f"no netem qdisc on {namespace}/{dev}")


def reshape(prefix: str, one_way: bool = False, **params: float) -> None:
    """`testbed shape east west` done in this process: each CLI call costs 3-5 s inside UML (its imports), and
    test_live_shape_changes_the_qdisc_in_place_and_the_probe_sees_it tests the command itself."""
    testbed = attach(prefix)
    for key in ("east->west",) if one_way else ("east->west", "west->east"):
        testbed.change(key, **params)


def pings(testbed, src: str, dst: str, count: int, interval: float) -> dict:
    target = testbed.plan.node(dst)
    with _Server(testbed.fabric, dst):
        return _run_agent(testbed.fabric, src, ["rtt", target.address, "--port", "5201", "--count", str(count),
                                                "--interval", str(interval)], timeout=300)


@dataclass(frozen=True)
class Lab:
    prefix: str
    state_dir: Path
    up_output: str


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The 3-DC topology brought up once for the module with `--shaper auto` (bring-ups are slow in UML)."""
    from testbed.fabric.lifecycle import tear_down

    base = tmp_path_factory.mktemp("three-dc")
    (base / "three.yaml").write_text(THREE_DC)
    with pytest.MonkeyPatch.context() as env:
        prefix = f"tb-{uuid.uuid4().hex[:4]}-"
        env.setenv("TESTBED_PREFIX", prefix)
        env.setenv("TESTBED_STATE_DIR", str(base / "state"))
        up = run_cli("up", str(base / "three.yaml"), timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        try:
            yield Lab(prefix, base / "state", up.stdout)
        finally:
            run_cli("down")
            tear_down(prefix)


@pytest.fixture
def three_dc(lab, monkeypatch):
    """The module's testbed for one test; its east <-> west link is put back as the topology sets it after."""
    monkeypatch.setenv("TESTBED_PREFIX", lab.prefix)
    monkeypatch.setenv("TESTBED_STATE_DIR", str(lab.state_dir))
    yield lab
    reshape(lab.prefix, latency=0.010, bandwidth=200e6, jitter=0.0, loss=0.0)


def test_auto_picks_netem_and_status_names_it_on_every_inter_dc_end(three_dc):
    prefix = three_dc.prefix
    assert "shaper netem" in three_dc.up_output
    info = json.loads(run_cli("status", "--json", check=True).stdout)
    assert info["shaper"] == "netem"
    inter = [link for link in info["links"] if link["kind"] == "inter-dc"]
    assert len(inter) == 4
    for link in inter:
        assert link["shaper"] == "netem" and link["mechanism"] == "htb+netem", link
    assert not list(three_dc.state_dir.glob("*.delayline.*"))  # no userspace delay line was started
    line = netem_line(f"{prefix}west-gw", "to-north")
    assert "delay 5ms" in line and "rate 100Mbit" in line, line
    assert "delay 8ms" in netem_line(f"{prefix}north-gw", "to-west")


def test_probe_meets_rtt_and_goodput_on_direct_routed_and_asymmetric_pairs(three_dc):
    """Each pair's RTT net of UML's own round trip on that route (1 netem hop each way east-west and west-north, 2
    east-north), measured in this boot (see the module's docstring), at the 10th percentile of each: UML's stalls
    only ever add to a round trip (p99s of 44-80 ms for 13-33 ms), and how many pings they catch changes within a
    boot, so the median moved either way by more than the bound (CI, 2026-12-02: east->west's p50 2.50 ms under with
    the own route's p50 at 4.13 ms; here the same day +2.67 ms over with 0.51 ms), the 10th percentile much less.
    And UML's timers release what netem holds late by an amount that changes from boot to boot (CI, 2026-12-02:
    north->east's p10 3.46 ms over 33 ms, 4 netem ends, with the own route at 0 delay 0.49 ms), which a route held
    at 0 delay never waits for: the own route is measured with every qdisc holding HELD_MS, taken off again. A
    netem that delays twice, or not at all, is 10-33 ms off at any percentile; no p50 may be under the configured
    round trip (netem never releases early). The round trips are measured with
    the host running UML real-time, the flows without: SCHED_RR shares a CPU among UML's processes in 100 ms
    quanta, which stalls a TCP flow (east->north's goodput read 18 % under its rate on a quiet host, load 1.1); the
    flows with the largest CPU share instead (harness.host_share)."""
    prefix = three_dc.prefix
    expected_rtt = {("east", "west"): 20, ("west", "north"): 13, ("east", "north"): 33}
    ends = {("east", "west"): 2, ("west", "north"): 2, ("east", "north"): 4}  # netem ends crossed, both ways
    with host_realtime() as realtime:
        own = route_round_trips_ms(prefix, list(expected_rtt), quantile=0.10, ends=ends)
        proc = run_cli("probe", "--json", "--pings", "100", "--seconds", "0", timeout=600)
    assert proc.returncode == 0, proc.stderr
    with host_share() as shared:
        flows = run_cli("probe", "--json", "--pings", "5", "--seconds", f"{FLOW_SECONDS}s", timeout=600)
    assert flows.returncode == 0, flows.stderr
    flow_keys = ("goodput_mbps", "goodput_error", "flow_retransmits", "flow_rwnd_limited", "flow_reader_gap_s",
                 "goodput_by_reads_mbps", "flow_sndbuf_limited", "flow_cwnd_packets", "flow_min_rtt_ms")
    goodput = {(p["src"], p["dst"]): {key: p[key] for key in flow_keys} for p in json.loads(flows.stdout)["pairs"]}
    pairs = {(p["src"], p["dst"]): {**p, **goodput[(p["src"], p["dst"])]} for p in json.loads(proc.stdout)["pairs"]}
    assert len(pairs) == 6 and all(0 <= ms < 10 for ms in own.values()), own
    expected_rate = {("east", "west"): 200, ("west", "east"): 200, ("west", "north"): 100,
                     ("north", "west"): 50, ("east", "north"): 100, ("north", "east"): 50}
    for (src, dst), pair in pairs.items():
        route = (src, dst) if (src, dst) in expected_rtt else (dst, src)
        rtt, overhead = expected_rtt[route], own[route]
        assert pair["shaper"] == "netem" and pair["not_applied"] == "", pair
        assert pair["rtt_configured_ms"] == pytest.approx(rtt)
        # its floor: the same route, pings marked to take the class beside netem's on every link end, both ways
        assert pair["rtt_floor_of"] == "path" and pair["rtt_floor_ms"] < rtt / 2, pair
        assert abs(pair["rtt_p10_ms"] - overhead - rtt) <= rtt_bound_ms(rtt), (overhead, realtime, pair)
        assert pair["rtt_p50_ms"] >= rtt, pair
        assert pair["rate_configured_mbps"] == pytest.approx(expected_rate[(src, dst)])
        # a stall of UML's one CPU that holds the sink's reads is UML's, not the shaper's: the share of the flow's
        # 3 s its longest measured gap between two reads took may come off the goodput, never add to it (2026-12-02:
        # east->north 13.3 % under with a 0.165 s gap, no retransmission, receiver-limited 0.6 % of the time)
        stalled = (pair["flow_reader_gap_s"] or 0.0) / FLOW_SECONDS
        assert -0.10 - stalled <= pair["goodput_error"] <= 0.10, json.dumps(
            {"src": src, "dst": dst, "host_share": shared, **{key: pair[key] for key in flow_keys}})
    print(f"host real-time {realtime}, share {shared}; UML's own round trips, ms: {own};",  # for the record
          json.dumps(list(pairs.values()), indent=1))


def test_jitter_and_loss_follow_their_laws(three_dc):
    """Jitter adds a uniform delay in [-j, +j] to each packet's one-way time. UML's own timing noise (it has heavy
    tails while the host is busy, e.g. with a second UML kernel beside it) is measured on the same link first; the
    jittered round trips must then spread as that noise plus the uniform law (their convolution), at the 10-90 %
    and 25-75 % spreads. Quantiles, not the standard deviation, so that a few stalls of UML's one CPU do not decide
    the test. (Subtracting the quiet spread from the jittered one, as before, over-corrects: spreads of independent
    delays do not add; with 3.3 ms of noise it read 12.4 ms for a law of 16 ms.)"""
    prefix = three_dc.prefix
    jitter = 0.010
    reshape(prefix, one_way=True, latency=0.030)
    # both with UML real-time, as the probe's round trips: without it the host's load decides UML's noise, and it
    # changes between the two (load 15, 2026-11-28: quiet 4.05 ms, jittered 23.16 ms for a law of 16.5 ms)
    with host_realtime() as realtime:
        quiet = sorted(pings(attach(prefix), "east-0", "west-0", 300, 0.025)["rtts"])
        reshape(prefix, one_way=True, jitter=jitter)
        # 25 ms apart: packets never catch up with each other, so FIFO order does not bend the law
        rtts = sorted(pings(attach(prefix), "east-0", "west-0", 400, 0.025)["rtts"])
    law = jittered_uniformly(quiet, jitter)

    def spread(values: list[float], low: float) -> float:
        return values[int(len(values) * (1 - low))] - values[int(len(values) * low)]

    print(f"host real-time {realtime}; 10-90 % spreads, ms: quiet, jittered, law",  # record
          *(round(spread(v, 0.1) * 1e3, 2) for v in (quiet, rtts, law)))
    for low, noiseless in ((0.1, 0.8), (0.25, 0.5)):
        # the law with no noise at all is noiseless x 2 j: a missing or doubled jitter is far outside 20 %
        assert spread(law, low) >= noiseless * 2 * jitter * 0.98
        assert spread(rtts, low) == pytest.approx(spread(law, low), rel=0.2), (low, spread(quiet, low))
    assert rtts[len(rtts) // 100] >= 0.030 - 0.0005  # 20..40 ms one way + 10 ms back
    assert statistics.median(rtts) - statistics.median(quiet) == pytest.approx(0.0, abs=0.0025)

    reshape(prefix, one_way=True, latency=0.010, jitter=0.0, loss=0.02)
    result = pings(attach(prefix), "east-0", "west-0", 3000, 0.002)
    measured = 1 - result["received"] / result["sent"]
    assert 0.010 <= measured <= 0.032, measured  # binomial: 2 % of 3000 has a standard deviation of 0.26 %


def test_live_shape_changes_the_qdisc_in_place_and_the_probe_sees_it(three_dc):
    prefix = three_dc.prefix
    gateway = f"{prefix}east-gw"
    testbed = attach(prefix)
    pings(testbed, "east-0", "west-0", 50, 0.005)
    sent_before = qdisc_sent_bytes(gateway, "to-west")
    assert sent_before > 0
    shaped = run_cli("shape", "east", "west", "--latency", "25ms", "--bandwidth", "80mbit", "--jitter", "1ms",
                     "--loss", "0.5%")
    assert shaped.returncode == 0, shaped.stderr
    line = netem_line(gateway, "to-west")
    for part in ("delay 25ms", "1ms", "loss 0.5%", "rate 80Mbit"):
        assert part in line, line
    assert "rate 80Mbit" in tc(gateway, "class", "show", "dev", "to-west")
    assert qdisc_sent_bytes(gateway, "to-west") >= sent_before  # the same qdisc: `tc change`, not a rebuild
    with host_realtime() as realtime:  # the p50 net of UML's own round trip on this route: the module's docstring
        overhead = route_round_trips_ms(prefix, [("east", "west")])[("east", "west")]
        rtts = pings(attach(prefix), "east-0", "west-0", 200, 0.005)["rtts"]
    off = statistics.median(rtts) * 1e3 - overhead - 50
    print(f"host real-time {realtime}; UML's own round trip {overhead:.2f} ms; p50 {off:+.2f} ms off 50 ms")  # record
    assert abs(off) <= rtt_bound_ms(50), (overhead, realtime)
    info = json.loads(run_cli("status", "--json", check=True).stdout)
    link = next(link for link in info["links"] if link["key"] == "east->west")
    assert link["latency"] == "25ms" and link["bandwidth"] == "80mbit" and link["mechanism"] == "htb+netem"


def test_a_partition_is_netem_loss_on_both_ends_and_clear_restores_the_same_qdisc(three_dc):
    """`testbed fault` on netem: 100 % loss on both link ends (tc change, not a rebuild), nothing gets through;
    after SIGKILL of the command the partition stays, and `fault --clear` restores the link from the state file."""
    prefix = three_dc.prefix
    ends = [(f"{prefix}east-gw", "to-west"), (f"{prefix}west-gw", "to-east")]
    pings(attach(prefix), "east-0", "west-0", 20, 0.005)
    sent_before = [qdisc_sent_bytes(*end) for end in ends]
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "fault", "partition", "east", "west", "--for",
                             "300s"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not all("loss 100%" in netem_line(*end) for end in ends):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    dark = pings(attach(prefix), "east-0", "west-0", 20, 0.01)
    assert dark["received"] == 0
    run_cli("fault", "--clear", check=True)
    for end, before in zip(ends, sent_before):
        line = netem_line(*end)
        assert "loss" not in line and "delay 10ms" in line, line
        assert qdisc_sent_bytes(*end) >= before  # changed in place both ways
    light = pings(attach(prefix), "east-0", "west-0", 50, 0.01)
    assert light["received"] == 50


def test_every_link_fault_kind_is_netem_on_both_ends_on_schedule_and_cleared(three_dc):
    """Issue 16's link faults on netem as the runner applies a timeline (its FaultDriver, in this process: each CLI
    call costs 3-5 s in UML): on east <-> west a latency rise, a loss burst, a bandwidth cut and a flap, one after
    the other. A look inside each window finds both ends' netem qdiscs carrying it (a flap: 100 % loss in its down
    windows, none between them); each is applied and cleared within 0.25 s of its schedule, and the link ends as
    configured, its qdiscs changed in place. (Before the fault thread kept a netlink socket in each namespace,
    every change opened two, 1 s each in UML: a fault came 1.5-2 s late there, 12 ms on the host.) What the bound
    excuses is only time UML itself did not run, measured beside the driver (tests/support/stalls.py): CI failed
    once with the first fault 0.45 s late (8.3 % of the host's CPU stolen over that boot; what held it was not
    recorded then), where 9 quiet runs read 0.10-0.14 s for the first and 0.02-0.07 s for the others, and two
    host processes at SCHED_FIFO 50 spinning 0.4 s in each 1.7 s showed as stalls of up to 0.33 s (2026-12-06).
    A 0.3 s sleep added to the driver's apply fails it (0.356 s late, 0 s stalled)."""
    from testbed.runner.faults import FaultDriver
    from testbed.spec.faults import Fault
    from testbed.spec.loader import validate_data

    prefix = three_dc.prefix
    ends = [(f"{prefix}east-gw", "to-west"), (f"{prefix}west-gw", "to-east")]
    sent_before = [qdisc_sent_bytes(*end) for end in ends]
    link = {"between": ["east", "west"]}
    timeline = [{"kind": "latency", **link, "at": "0.5s", "duration": "2s", "latency": "40ms", "jitter": "2ms"},
                {"kind": "loss-burst", **link, "at": "3s", "duration": "2s", "loss": "20%"},
                {"kind": "bandwidth", **link, "at": "5.5s", "duration": "2s", "bandwidth": "10mbit"},
                {"kind": "flap", **link, "at": "8s", "duration": "8s", "period": "4s", "down": "2s"}]
    faults = [validate_data(Fault, data, "timeline") for data in timeline]
    looks = [("latency", 0.5, lambda line: "delay 40ms" in line and "2ms" in line),
             ("loss-burst", 3.0, lambda line: "loss 20%" in line),
             ("bandwidth", 5.5, lambda line: "rate 10Mbit" in line)]
    looks += [(f"flap down {k}", 8.0 + 4 * k, lambda line: "loss 100%" in line) for k in range(2)]
    looks += [(f"flap up {k}", 10.0 + 4 * k, lambda line: "loss" not in line) for k in range(2)]
    testbed = attach(prefix)
    # UML pays for the first touch of each page of code and data a change uses (the first change of a process took
    # 2.7 s there, the next 0.02 s; on the host 5 ms and 2 ms, measured 2026-11-25): one change and its clear first
    testbed.apply_fault("warm-up", {key: dataclasses.replace(testbed.plan.link_end(key).shaping.params, loss=0.001)
                                    for key in ("east->west", "west->east")})
    testbed.clear_fault("warm-up")
    # the clock starts once the fault thread is ready: start() collects the heap and opens the namespaces' netlink
    # sockets, and the thread its own (pyroute2 keeps one per thread), 1 s each in UML; a clock started 10 s ahead
    # instead was not enough in CI (2026-12-01: the first fault 1.14 s late, the thread still preparing)
    driver = FaultDriver(testbed, faults, "uml", 0, None, None, clock_at_start=True)
    seen: dict[str, list[str]] = {}
    taken: dict[str, tuple[float, float]] = {}  # when each look began and ended, seconds from the clock's zero
    # the timeline with UML real-time: on schedule is the driver's duty, not the host's; without it, at load 15
    # (2026-11-28), a loss burst was cleared 0.46 s late and a look's two `tc` took 2 s, past the window's end
    with host_realtime() as realtime, watched() as stalls:
        try:
            driver.start()
            assert driver.ready.wait(120), "the fault thread did not get ready in 120 s"
            for name, begin, _ in sorted(looks, key=lambda look: look[1]):
                time.sleep(max(0.0, begin + 0.5 - (time.time() - driver.zero)))  # 0.25 s late at most, then a look
                looked = time.time() - driver.zero
                seen[name] = [netem_line(*end) for end in ends]  # a `tc` process each (slow in a busy UML)
                taken[name] = (round(looked, 2), round(time.time() - driver.zero, 2))
            driver.wait(timeout=30)
        finally:
            record = driver.stop()
    assert not record["errors"], record["errors"]
    windows = record["faults"]
    when = [(w["kind"], w["applied_at"] and round(w["applied_at"], 2), w["cleared_at"] and round(w["cleared_at"], 2))
            for w in windows]  # on the clock of the looks
    for name, _, carries in looks:
        assert all(carries(line) for line in seen[name]), (name, taken[name], when, seen[name], realtime)
    assert [w["kind"] for w in windows] == ["latency", "loss-burst", "bandwidth", "flap", "flap"]
    assert stalls.scheduling == "fifo"  # the watch preempts the driver: what it misses, no process could have had
    for window in windows:
        for due, done in (("scheduled_at", "applied_at"), ("clear_scheduled_at", "cleared_at")):
            stalled = stalls.within(driver.zero + window[due], driver.zero + window[done])
            assert 0 <= window[done] - window[due] <= 0.25 + stalled, (window, due, realtime, stalled, stalls.spans)
    for end, before in zip(ends, sent_before):
        line = netem_line(*end)
        assert "delay 10ms" in line and "loss" not in line and "rate 200Mbit" in line, line
        assert qdisc_sent_bytes(*end) >= before  # changed in place throughout, never rebuilt


def test_kernel_counters_move_with_traffic(three_dc):
    prefix = three_dc.prefix
    testbed = attach(prefix)
    before = testbed.fabric.counters()
    pings(testbed, "east-0", "north-0", 100, 0.002)
    after = testbed.fabric.counters()
    for key in ("east->west", "west->north", "north->west", "west->east"):  # east -> north is routed over west
        assert after[key].tx_packets - before[key].tx_packets >= 100, key
        assert after[key].tx_bytes > before[key].tx_bytes
    assert after["west->north"].qdisc_drops == before["west->north"].qdisc_drops


@WITHOUT_LAB
def test_down_and_clean_after_sigkill_leave_no_namespace_or_qdisc(prefix, state_dir, tmp_path):
    path = tmp_path / "three.yaml"
    path.write_text(THREE_DC)
    qdiscs_before = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    run_cli("up", str(path), "--shaper", "netem", check=True, timeout=300)
    assert run_cli("down").returncode == 0
    assert namespaces_with(prefix) == []

    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", str(path), "--shaper", "netem"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # kill it in the middle of shaping
        if line.startswith("shaping"):
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert namespaces_with(prefix), "the killed up should have left a half-built testbed for clean to find"
    clean = run_cli("clean")
    assert clean.returncode == 0, clean.stderr
    assert namespaces_with(prefix) == []
    assert subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout == qdiscs_before
    assert not list(state_dir.glob("*"))  # no state file, no delay-line file


@WITHOUT_LAB
def test_the_docker_router_agent_picks_netem_and_builds_its_tree(prefix, tmp_path):
    """The router agent's code in a namespace standing in for a container (no dockerd needed)."""
    from pyroute2 import NetNS, netns

    from testbed.agents.bootstrap import argv_in
    from testbed.plan.containers import ROUTER_ENV, ROUTER_READY, build_containers_plan

    topology = pair_topology(latency="7ms", bandwidth="300mbit", reverse={"latency": "9ms"})
    plan = build_containers_plan(topology, "auto", prefix)
    router = next(c for c in plan.routers() if c.dc == "east")
    config = json.loads(router.environment[ROUTER_ENV])
    ns = f"{prefix}router"
    netns.create(ns)
    proc = None
    try:
        with NetNS(ns) as handle:  # one interface per network, named as docker would, addressed as planned
            for index, attachment in enumerate(router.attachments):
                network = next(n for n in plan.networks if n.name == attachment.network)
                handle.link("add", ifname=f"eth{index}", kind="veth", peer=f"peer{index}")
                link = handle.link_lookup(ifname=f"eth{index}")[0]
                handle.addr("add", index=link, address=attachment.address, prefixlen=int(network.subnet.split("/")[1]))
                handle.link("set", index=link, state="up")
                handle.link("set", index=handle.link_lookup(ifname=f"peer{index}")[0], state="up")
        env = {**os.environ, ROUTER_ENV: json.dumps(config), "TESTBED_STATE_DIR": str(tmp_path / "router-state")}
        proc = subprocess.Popen(argv_in(ns, [sys.executable, "-m", "testbed.agents.router", "serve"]), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(ROUTER_READY):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        state = json.loads(open("/run/testbed/router.json").read())
        assert state["shaper"] == "netem" and state["delay_line"] is None
        line = netem_line(ns, "to-west")
        assert "delay 7ms" in line and "rate 300Mbit" in line, line
        assert "rate 300Mbit" in tc(ns, "class", "show", "dev", "to-west")

        def router(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(argv_in(ns, [sys.executable, "-m", "testbed.agents.router", *args]),
                                  env=env, capture_output=True, text=True, timeout=120)

        changed = router("shape", "east->west", json.dumps({"latency": 0.012, "bandwidth": 1e8, "jitter": 0.0,
                                                             "loss": 0.01, "queue": None}))
        assert changed.returncode == 0, changed.stderr
        line = netem_line(ns, "to-west")
        assert "delay 12ms" in line and "loss 1%" in line and "rate 100Mbit" in line, line
        counters = router("counters")
        assert counters.returncode == 0 and "east->west" in json.loads(counters.stdout)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
            assert code == 0, proc.stdout.read() if proc.stdout else code
        netns.remove(ns)
        for path in ("/run/testbed/router.json", ROUTER_READY):
            if os.path.exists(path):
                os.unlink(path)


@WITHOUT_LAB
def test_the_ssh_backend_netem_commands_run_against_a_real_tc(prefix):
    """The host plan's argv lists (what `up --backend ssh` runs on each host) on an interface here."""
    from pyroute2 import NetNS, netns

    from testbed.plan.hosts import ROOT_HANDLE, build_hosts_plan, class_commands
    from testbed.spec.inventory import Inventory
    from testbed.spec.link import LinkParams

    topology = pair_topology(latency="6ms", bandwidth="400mbit", jitter="1ms", loss="0.1%")
    host = {"user": "root", "key": "/nonexistent", "interface": "wan0"}
    inventory = Inventory(dcs={"east": [{"name": "e0", "address": "198.18.0.2", **host}],
                               "west": [{"name": "w0", "address": "198.18.1.2", **host}]})
    plan = build_hosts_plan(topology, inventory, "netem", prefix)
    east = plan.host("e0")
    ns = f"{prefix}host"
    netns.create(ns)
    try:
        with NetNS(ns) as handle:
            handle.link("add", ifname="wan0", kind="veth", peer="wan1")
            handle.link("set", index=handle.link_lookup(ifname="wan0")[0], state="up")
        for argv in east.apply:
            done = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
        line = netem_line(ns, "wan0")
        for part in ("delay 6ms", "1ms", "loss 0.1%", "rate 400Mbit", "limit"):
            assert part in line, line
        assert f"qdisc htb {ROOT_HANDLE}" in tc(ns, "qdisc", "show", "dev", "wan0")
        classid = east.classes["west"]
        for argv in class_commands("wan0", classid, LinkParams(latency=0.015, bandwidth=1e8), "netem", verb="change"):
            done = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
        line = netem_line(ns, "wan0")
        assert "delay 15ms" in line and "rate 100Mbit" in line and "loss" not in line, line
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "wan0", "root", "handle", ROOT_HANDLE],
                       check=True)
        assert "htb" not in tc(ns, "qdisc", "show", "dev", "wan0")
    finally:
        netns.remove(ns)
