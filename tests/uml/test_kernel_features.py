"""A kernel without a feature the fabric needs says so in one line; IPv6 is not one of them.

Each test boots user-mode Linux with a feature missing: its module not loaded, or refused by the kernel's module
loader (as on a kernel built without it).
"""

from __future__ import annotations

import json

import pytest

from ..conftest import TOPOLOGIES, namespaces_with, run_cli

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]


def one_line_error(proc) -> str:
    """The one error line (after any progress lines), with exit status 2 and no traceback."""
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert proc.returncode == 2 and errors == lines[-1:], (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return errors[0]


@pytest.mark.uml(modules=())
def test_a_kernel_without_ipv6_runs_the_testbed(prefix):
    """The fabric only switched IPv6 off in its namespaces; without the module there is nothing to switch off."""
    with open("/proc/modules") as modules:
        assert not any(line.startswith("ipv6 ") for line in modules)
    up = run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), "--shaper", "netem", timeout=300)
    assert up.returncode == 0, up.stderr
    probe = run_cli("probe", "--json", "--pings", "50", "--seconds", "1", timeout=300)
    assert probe.returncode == 0, probe.stderr
    for pair in json.loads(probe.stdout)["pairs"]:
        assert abs(pair["rtt_p50_ms"] - 20.0) <= 1.5, pair
    assert run_cli("down").returncode == 0


@pytest.mark.uml(deny=("sch_htb",))
def test_a_kernel_without_htb_is_one_line_naming_it(prefix):
    line = one_line_error(run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), timeout=300))
    assert line.startswith("error: this kernel lacks sch_htb: tc qdisc add htb on "), line
    assert namespaces_with(prefix) == []


@pytest.mark.uml(deny=("sch_netem",))
def test_netem_asked_for_on_a_kernel_without_it_is_one_line(prefix):
    line = one_line_error(run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), "--shaper", "netem", timeout=300))
    assert "shaper netem requested but this kernel has no sch_netem" in line
    assert namespaces_with(prefix) == []
    auto = run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), timeout=300)  # auto falls back, and says which it took
    assert auto.returncode == 0 and "shaper userspace-delay" in auto.stdout, auto.stderr
    assert run_cli("down").returncode == 0


@pytest.mark.uml(deny=("nfnetlink-subsys-3", "nfnetlink_queue"))
def test_the_delay_line_on_a_kernel_without_nfqueue_is_one_line(prefix):
    line = one_line_error(run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), "--shaper", "userspace-delay",
                                  timeout=300))
    assert "this kernel lacks nfnetlink_queue" in line, line
    assert namespaces_with(prefix) == []
