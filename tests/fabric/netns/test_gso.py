"""A fast link's units pass whole from sender to receiver: every interface of the path takes the plan's GSO size
(testbed.plan.gso), so the delay line handles one unit where it handled two or three; one interface left at 64 KiB
would cut every unit into packets of the MTU there (1.4 kB each, about 100 times the delay line's work)."""

import pytest

from testbed.fabric.lifecycle import bring_up
from testbed.plan.gso import KERNEL_DEFAULT
from testbed.runner.probe import _run_agent, _Server
from tests.support.topologies import pair_topology

pytestmark = pytest.mark.root


def bytes_per_unit(testbed) -> float:
    """Payload bytes a 2 s flow east -> west carried per packet its delay line released."""
    dst = testbed.plan.node("west-0")
    with _Server(testbed.fabric, dst.name):
        before = testbed.fabric.delay_line_stats()["east->west"]["released"]
        flow = _run_agent(testbed.fabric, "east-0", ["send", dst.address, "--port", "5201", "--seconds", "2"],
                          timeout=60)
        after = testbed.fabric.delay_line_stats()["east->west"]["released"]
    return flow["bytes"] / (after - before)


@pytest.mark.parametrize("switch", ["1", "0"])
def test_units_of_a_fast_link_pass_whole(prefix, monkeypatch, switch):
    """At 2.5 Gbit/s the plan asks for 156 kB units; with TESTBED_GSO=0 the kernel's 64 KiB, which no unit can
    exceed (so the first case fails if any interface kept the kernel's size: units would be MTU-sized)."""
    monkeypatch.setenv("TESTBED_GSO", switch)
    testbed = bring_up(pair_topology(latency="1ms", bandwidth="2.5gbit"), prefix=prefix, shaper="userspace-delay")
    assert testbed.plan.gso_max > KERNEL_DEFAULT
    carried = bytes_per_unit(testbed)
    if switch == "1":
        assert KERNEL_DEFAULT < carried <= testbed.plan.gso_max, carried
    else:
        assert 0.5 * KERNEL_DEFAULT < carried <= KERNEL_DEFAULT, carried
