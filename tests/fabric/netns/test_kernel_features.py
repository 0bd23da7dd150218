"""A kernel without a feature the fabric needs says so in one line; IPv6 is not one of them.

Each UML boot lacks some features: a module not loaded, or refused by the kernel's module loader (as on a
kernel built without it). Two boots serve the four tests: no IPv6 and no nfnetlink_queue; no htb and no netem.
"""

from __future__ import annotations

import json

import pytest

from testbed.fabric.lifecycle import attach
from tests.conftest import TOPOLOGIES, namespaces_with, run_cli
from tests.fabric.netns.test_netem import uml_round_trip_ms

pytestmark = [pytest.mark.uml, pytest.mark.root, pytest.mark.timeout(900)]


def one_line_error(proc) -> str:
    """The one error line (after any progress lines), with exit status 2 and no traceback."""
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert proc.returncode == 2 and errors == lines[-1:], (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return errors[0]


NO_IPV6_NO_NFQUEUE = pytest.mark.uml(modules=(), deny=("nfnetlink-subsys-3", "nfnetlink_queue"))
NO_HTB_NO_NETEM = pytest.mark.uml(deny=("sch_htb", "sch_netem"))


@NO_IPV6_NO_NFQUEUE
def test_a_kernel_without_ipv6_runs_the_testbed(prefix):
    """The fabric only switched IPv6 off in its namespaces; without the module there is nothing to switch off."""
    with open("/proc/modules") as modules:
        assert not any(line.startswith("ipv6 ") for line in modules)
    up = run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), "--shaper", "netem", timeout=300)
    assert up.returncode == 0, up.stderr
    probe = run_cli("probe", "--json", "--pings", "50", "--seconds", "1s", timeout=300)
    assert probe.returncode == 0, probe.stderr
    pairs = json.loads(probe.stdout)["pairs"]
    if not all(19.5 <= pair["rtt_p50_ms"] <= 25.0 for pair in pairs):
        # CI 2026-11-27 saw a p50 of 29.6 ms once (6 probes with both host cores busy here: 20.5-20.9 ms): say
        # whether UML itself was slow then (its unshaped round trip inside one DC) or only the shaped path
        own = uml_round_trip_ms(attach(prefix))
        pytest.fail(f"shaped RTT p50 outside 19.5-25 ms: {[(p['rtt_p50_ms'], p['rtt_p99_ms']) for p in pairs]}; "
                    f"UML's own unshaped round trip {own:.2f} ms")
    # (the link is shaped: an unshaped UML round trip is ~1 ms; netem's accuracy, net of UML's own round trip, is
    # held to its bound in test_netem.py: here a busy host adds UML's own delay on top, 1.7 ms seen)
    assert run_cli("down").returncode == 0


@NO_HTB_NO_NETEM
def test_a_kernel_without_htb_is_one_line_naming_it(prefix):
    line = one_line_error(run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), timeout=300))
    assert line.startswith("error: this kernel lacks sch_htb: tc qdisc add htb on "), line
    assert namespaces_with(prefix) == []


@NO_HTB_NO_NETEM
def test_netem_asked_for_on_a_kernel_without_it_is_one_line(prefix):
    """(Where netem is missing and htb is not, `auto` takes the delay line: tests/fabric/netns/test_links.py.)"""
    line = one_line_error(run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), "--shaper", "netem", timeout=300))
    assert "shaper netem requested but this kernel has no sch_netem" in line
    assert namespaces_with(prefix) == []


@NO_IPV6_NO_NFQUEUE
def test_the_delay_line_on_a_kernel_without_nfqueue_is_one_line(prefix):
    line = one_line_error(run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), "--shaper", "userspace-delay",
                                  timeout=300))
    assert "this kernel lacks nfnetlink_queue" in line, line
    assert namespaces_with(prefix) == []
