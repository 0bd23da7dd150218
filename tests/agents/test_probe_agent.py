"""The probe's pinger and echo run SCHED_FIFO (below the delay line), so that a round trip times the network
and not how long a busy machine takes to wake them; its TCP flow does not (bench/delay_line_priority.py --part
probe measures what this buys)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.agents import probe
from testbed.agents.delayline.worker import RT_PRIORITY as DELAY_LINE_PRIORITY
from testbed.plan.delayline import UNSHAPED_DSCP
from testbed.runner.probe import _flow_counters

pytestmark = pytest.mark.root  # SCHED_FIFO needs CAP_SYS_NICE


def _policies(pid: int) -> dict[int, int]:
    """Every thread of `pid`: its scheduling policy."""
    return {int(tid.name): os.sched_getscheduler(int(tid.name)) for tid in Path(f"/proc/{pid}/task").iterdir()}


def _agent(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", probe.__name__, *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("switch", "expected"), [("1", "fifo"), ("0", "other")])
def test_the_pinger_and_the_echo_thread_run_fifo_unless_switched_off(switch, expected):
    server = _agent("serve", "--port", "5391", env={probe.RT_ENV: switch})
    try:
        assert "ready" in server.stdout.readline()
        pinger = _agent("rtt", "127.0.0.1", "--port", "5391", "--count", "20", "--interval", "0.005",
                        env={probe.RT_ENV: switch})
        result = json.loads(pinger.communicate(timeout=60)[0])
        policies = _policies(server.pid)
    finally:
        server.kill()
        server.wait()
    assert result["received"] == 20 and result["scheduling"] == expected, result
    fifo = [tid for tid, policy in policies.items() if policy == os.SCHED_FIFO]
    assert len(fifo) == (1 if expected == "fifo" else 0), policies  # the echo's thread only
    assert policies[server.pid] == os.SCHED_OTHER  # the main thread, which starts the TCP sink's threads


def test_pings_are_spaced_at_random_around_the_interval():
    """A fixed period phase-locks with a round trip that is a multiple of it: the gaps are the interval times
    U(0.5, 1.5). Of 79 gaps, a periodic pinger puts none outside 0.8-1.2 times the interval unless the machine
    holds a send back by a millisecond; uniform ones put 60 % there (fewer than 20 %: about 1e-10)."""
    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo.bind(("127.0.0.1", 0))
    arrivals: list[float] = []

    def answer() -> None:
        while len(arrivals) < 80:
            data, peer = echo.recvfrom(64)
            arrivals.append(time.monotonic())
            echo.sendto(data, peer)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    interval = 0.004
    pinger = _agent("rtt", "127.0.0.1", "--port", str(echo.getsockname()[1]), "--count", "80", "--interval",
                    str(interval))
    result = json.loads(pinger.communicate(timeout=60)[0])
    thread.join(timeout=10)
    echo.close()
    assert result["received"] == 80
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert 0.8 * interval <= statistics.mean(gaps) <= 1.2 * interval, gaps
    assert sum(not 0.8 * interval <= gap <= 1.2 * interval for gap in gaps) >= 0.2 * len(gaps), gaps


def test_the_probe_ranks_below_the_delay_line():
    """A FIFO pinger that kept the delay line's worker waiting would delay the packets it times."""
    assert 0 < probe.RT_PRIORITY < DELAY_LINE_PRIORITY


@pytest.mark.parametrize("seconds", ["0", "0.8"])
def test_one_pair_agent_pings_then_sends_only_when_asked(seconds):
    """A probe of a DC pair is one start of the agent (`pair`): the pings, then a flow only for seconds above 0
    (the run's link calibration times round trips only, before every cell)."""
    server = _agent("serve", "--port", "5392", "--warmup", "0.2")
    try:
        assert "ready" in server.stdout.readline()
        pair = _agent("pair", "127.0.0.1", "--port", "5392", "--count", "10", "--interval", "0.005",
                      "--seconds", seconds)
        result = json.loads(pair.communicate(timeout=60)[0])
    finally:
        server.kill()
        server.wait()
    assert result["rtt"]["received"] == 10 and len(result["rtt"]["rtts"]) == 10
    if seconds == "0":
        assert result["flow"] is None
    else:
        assert result["flow"]["sent_bytes"] > 0 and result["flow"]["goodput_bps"] > 0
        assert 0.4 <= result["flow"]["duration"] <= 2.0, result["flow"]
        tcp = result["flow"]["tcp"]  # the sender's TCP_INFO: how a shortfall would be read
        assert set(tcp) == set(probe.TCP_INFO_FIELDS), tcp
        assert 0 < tcp["busy_us"] <= result["flow"]["duration"] * 1e6 + 1e5 and tcp["min_rtt_us"] > 0, tcp
        assert tcp["bytes_retrans"] <= tcp["total_retrans"] * 65536, tcp


def test_a_pair_keeps_the_flows_retransmits_and_receiver_window_share():
    flow = {"tcp": {"total_retrans": 3, "busy_us": 2_000_000, "rwnd_limited_us": 500_000}}
    none = dict.fromkeys(("flow_retransmits", "flow_rwnd_limited", "flow_reader_gap_s", "goodput_by_reads_mbps",
                          "flow_sndbuf_limited", "flow_cwnd_packets", "flow_min_rtt_ms"))
    assert _flow_counters(flow) == {**none, "flow_retransmits": 3, "flow_rwnd_limited": 0.25}
    tcp = {"busy_us": 2_000_000, "sndbuf_limited_us": 1_000_000, "snd_cwnd": 1619, "min_rtt_us": 33_851}
    assert _flow_counters({"tcp": tcp}) == {**none, "flow_sndbuf_limited": 0.5, "flow_cwnd_packets": 1619,
                                            "flow_min_rtt_ms": 33.851}
    assert _flow_counters(None) == none
    assert _flow_counters({"goodput_bps": 1.0, "read_goodput_bps": 2e6, "reader_gap_max_s": 0.5}) == {
        **none, "flow_reader_gap_s": 0.5, "goodput_by_reads_mbps": 2.0}


def test_goodput_counts_bytes_where_the_kernel_received_them_not_when_a_stalled_reader_read_them():
    """A link carrying 1 MB every 10 ms for 3 s, its reader stalled from 0.45 s to 0.95 s (it then reads the
    backlog) and again for the last 0.3 s: the kernel's count gives the link's rate; the count of reads (the probe's
    figure before) reads the backlog into its window and the final wait out of it."""
    rate = 1e6 / 0.01  # bytes per second
    marks, read = [], 0
    for i in range(301):
        t = i * 0.01
        if 0.45 < t < 0.95 or t > 2.7:
            continue  # the reader is not running: no mark
        read = int(rate * t)
        marks.append((t, int(rate * t), read))
    marks.append((3.3, int(rate * 3.0), int(rate * 3.0)))  # EOF read 0.3 s after the last byte arrived
    figures = probe.flow_figures(marks, warmup=0.5)
    assert figures["goodput_bps"] == pytest.approx(rate * 8, rel=1e-6)
    assert figures["window_seconds"] == pytest.approx(2.7 - 0.95)
    assert abs(figures["read_goodput_bps"] / (rate * 8) - 1) > 0.05, figures


@pytest.mark.parametrize(("turnaround", "held"), [(True, False), (False, True)])
def test_a_round_trip_leaves_out_how_long_the_echo_held_the_ping(turnaround, held):
    """TWAMP's turnaround (RFC 5357): an echo that holds every ping 30 ms and says so in its answer reads as the
    network alone (loopback: well under 5 ms); one that does not say so (an older echo) reads the 30 ms."""
    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo.bind(("127.0.0.1", 0))

    def answer() -> None:
        for _ in range(5):
            data, peer = echo.recvfrom(64)
            time.sleep(0.03)
            echo.sendto(data + (probe.DWELL.pack(30_000_000) if turnaround else b""), peer)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    pinger = _agent("rtt", "127.0.0.1", "--port", str(echo.getsockname()[1]), "--count", "5", "--interval", "0.05")
    result = json.loads(pinger.communicate(timeout=60)[0])
    thread.join(timeout=10)
    echo.close()
    assert result["received"] == 5, result
    assert (statistics.median(result["rtts"]) >= 0.03) is held, result["rtts"]
    assert all(value < 0.005 for value in result["rtts"]) is not held, result["rtts"]


def _one_answer(port: int, tos: int = 0, *serve: str) -> tuple[bytes, list]:
    """Start the agent's echo with `serve`'s options, send it one ping marked `tos` and return its answer and the
    answer's ancillary data (its TOS byte)."""
    server = _agent("serve", "--port", str(port), *serve)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert "ready" in server.stdout.readline()
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        sock.settimeout(10)
        sock.sendto(probe.PING.pack(7, 1234), ("127.0.0.1", port))
        data, ancillary, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(4))
    finally:
        sock.close()
        server.kill()
        server.wait()
    assert probe.PING.unpack_from(data) == (7, 1234) and len(data) == probe.PING.size + probe.DWELL.size
    return data, ancillary


@pytest.mark.parametrize("tos", [0, UNSHAPED_DSCP << 2])
def test_the_echo_answers_with_the_pings_mark_and_how_long_it_held_it(tos):
    """A ping marked UNSHAPED_DSCP must come back marked, or the answer is delayed on its way back (the probe's
    floor would read one way shaped); the answer carries the echo's turnaround, from its kernel's receive time."""
    data, ancillary = _one_answer(5393, tos)
    assert 0 <= probe.DWELL.unpack_from(data, probe.PING.size)[0] < 1e9  # ns, and not the epoch
    assert probe.tos_of(ancillary) == tos


def test_the_echo_answers_with_the_mark_but_not_the_ecn_bits():
    """A ping marked and ECN-capable (ECT(0)) gets an answer marked, without the ECN bits: those are the sender's
    transport's, not the echo's."""
    _, ancillary = _one_answer(5394, UNSHAPED_DSCP << 2 | 0b10)
    assert probe.tos_of(ancillary) == UNSHAPED_DSCP << 2


@pytest.mark.parametrize("user_time", [False, True])
def test_a_node_whose_kernel_delays_what_it_receives_times_in_user_space(user_time):
    """--user-time (Fabric.delays_on_nodes): the echo reports no turnaround, since its kernel's receive time would
    predate a delay line's hold on the same node and the pinger would take the hold off; with kernel time it reports
    its own (a few microseconds here, never 0 ns)."""
    data, _ = _one_answer(5395, 0, *(["--user-time"] if user_time else []))
    dwell = probe.DWELL.unpack_from(data, probe.PING.size)[0]
    assert (dwell == 0) is user_time, dwell
