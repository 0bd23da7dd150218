"""A live change to 0 ms takes a direction out of the delay line and one back to a delay puts it in again, on a real
testbed (root: namespaces, iptables, NFQUEUE)."""

from __future__ import annotations

import dataclasses
import statistics
import subprocess

import pytest

from testbed.fabric.lifecycle import attach, bring_up
from testbed.runner.probe import _run_agent, _Server
from testbed.waiting import wait_for
from tests.support.topologies import pair_topology

pytestmark = pytest.mark.root


def rtt_median(testbed, count: int = 30) -> float:
    dst = testbed.plan.node("west-0")
    with _Server(testbed.fabric, dst.name):
        answer = _run_agent(testbed.fabric, "east-0", ["rtt", dst.address, "--port", "5201", "--count", str(count),
                                                       "--interval", "0.005"], timeout=120)
    return statistics.median(answer["rtts"])


def queued(gateway: str) -> list[str]:
    """The gateway's rules that send packets to a delay line's queue."""
    rules = subprocess.run(["ip", "netns", "exec", gateway, "iptables", "-w", "-t", "mangle", "-S", "PREROUTING"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return [rule for rule in rules if "NFQUEUE" in rule]


def reshape(testbed, latency: float) -> None:
    for key in ("east->west", "west->east"):
        testbed.shape(key, dataclasses.replace(testbed.plan.link_end(key).shaping.params, latency=latency))


def test_a_live_change_to_0_ms_deletes_the_rule_and_back_to_a_delay_adds_it(prefix):
    """The supervisor changes the rules when SIGHUP reaches it, shortly after shape() returns: waited for."""
    testbed = bring_up(pair_topology(latency="8ms", bandwidth="1gbit"), prefix=prefix, shaper="userspace-delay")
    gateway = testbed.plan.delay_line_of("east->west")
    assert len(queued(gateway)) == 1
    reshape(testbed, 0.0)
    assert wait_for(lambda: queued(gateway) == [], 5.0, interval=0.05)
    assert rtt_median(attach(prefix)) < 0.003
    reshape(attach(prefix), 0.008)
    assert wait_for(lambda: len(queued(gateway)) == 1, 5.0, interval=0.05)
    assert 0.016 <= rtt_median(attach(prefix)) <= 0.018
