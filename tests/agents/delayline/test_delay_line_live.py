"""A live change to 0 ms takes a direction out of the delay line and one back to a delay puts it in again, on a real
testbed (root: namespaces, iptables, NFQUEUE)."""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import time

import pytest

from testbed.fabric.lifecycle import attach, bring_up
from testbed.runner.probe import _run_agent, _Server
from testbed.waiting import wait_for
from tests.support.topologies import pair_topology

pytestmark = pytest.mark.root


def rtt_median(testbed, count: int = 30, src: str = "east-0", to: str = "west-0") -> float:
    dst = testbed.plan.node(to)
    with _Server(testbed.fabric, dst.name):
        answer = _run_agent(testbed.fabric, src, ["rtt", dst.address, "--port", "5201", "--count", str(count),
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


def test_changes_of_one_delay_line_at_once_neither_kill_it_nor_get_lost(prefix):
    """Two link faults of one gateway applied or cleared at the same moment (a DC cut off from two others: issue 56's
    partition test, in CI) sent two SIGHUPs a millisecond apart: the supervisor's handler ran inside itself, the
    inner status write renamed the outer one's temporary file, and the exception killed the supervisor ("delay line
    died"). East's two incoming directions (from north, from west) changed from two threads, 20 times each, then a burst of 50
    SIGHUPs: the delay line lives, never restarted, and serves the last change of each direction (no lost update)."""
    import os
    import signal
    import threading

    from testbed.agents.delayline import control
    from testbed.agents.delayline.files import DelayLineFiles
    from testbed.fabric.state import state_dir
    from testbed.plan.delayline import load_config
    from testbed.spec.topology import load_topology
    from tests.conftest import ROOT

    testbed = bring_up(load_topology(ROOT / "topologies" / "three-dc-1.yaml"), prefix=prefix,
                       shaper="userspace-delay")
    gateway = testbed.plan.delay_line_of("north->east")  # a direction's delay line is where it arrives
    assert gateway == testbed.plan.delay_line_of("west->east")
    specs = {key: testbed.plan.link_end(key).shaping.delay_line for key in ("north->east", "west->east")}
    last = {key: dataclasses.replace(spec, latency=spec.latency - 0.003) for key, spec in specs.items()}

    def hammer(key: str) -> None:
        for i in range(20):
            control.reconfigure(state_dir(), gateway, key, dataclasses.replace(specs[key], latency=0.001 * (2 + i % 3)))
        control.reconfigure(state_dir(), gateway, key, last[key])

    threads = [threading.Thread(target=hammer, args=(key,)) for key in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    status = control.read_status(state_dir(), gateway)
    for _ in range(50):
        os.kill(status.supervisor, signal.SIGHUP)
    time.sleep(0.5)
    now = control.read_status(state_dir(), gateway)
    assert attach(prefix).fabric.dead_delay_lines() == [] and now.ready and now.restarts == 0, now
    served = {item.key: item.latency for item in load_config(DelayLineFiles.named(state_dir(), gateway).config.read_text())}
    assert served == {key: spec.latency for key, spec in last.items()}
    # north->east now 2 ms, east->north 5 ms: the worker read the last config
    assert 0.0065 <= rtt_median(attach(prefix), src="north-0", to="east-0") <= 0.0085
