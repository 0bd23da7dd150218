"""A routed topology on ssh hosts (sshd in namespaces on one flat lab network): the chain a - b - c is shaped end
to end on the hosts, `status` names the composed pairs, the probe holds a - c at the hops' summed delay, and
`down` leaves every host as it was."""

from __future__ import annotations

import json

import pytest

from testbed.fabric.lifecycle import bring_up
from tests.fabric.ssh.test_ssh_backend import ssh_args
from tests.support.ssh import start_hosts
from tests.support.topologies import make_topology

pytestmark = [pytest.mark.root, pytest.mark.sshd]

CHAIN = """name: chain-3
dcs:
  - {name: a, nodes: 1}
  - {name: b, nodes: 1}
  - {name: c, nodes: 1}
links:
  - {between: [a, b], latency: 6ms}
  - {between: [b, c], latency: 4ms}
"""


@pytest.mark.timeout(600)
def test_a_chain_on_ssh_hosts_is_shaped_end_to_end(prefix, tmp_path):
    testbed = bring_up(make_topology("lab", {"lab": 4}), prefix=prefix)
    hosts = start_hosts(testbed, tmp_path, {"a": ["lab-0"], "b": ["lab-1"], "c": ["lab-2"]},
                        workdir=str(tmp_path / "remote"))
    env = {"TESTBED_PREFIX": f"{prefix}s-"}
    topology = tmp_path / "chain-3.yaml"
    topology.write_text(CHAIN)
    try:
        up = hosts.cli("lab-3", "up", str(topology), *ssh_args(hosts), env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        info = json.loads(hosts.cli("lab-3", "status", "--json", env=env).stdout)
        assert info["composed"] == {"a->c": ["a->b", "b->c"], "c->a": ["c->b", "b->a"]}
        probe = hosts.cli("lab-3", "probe", "--json", "--pings", "30", "--seconds", "0s", env=env)
        assert probe.returncode == 0, probe.stderr
        pairs = {(p["src"], p["dst"]): p for p in json.loads(probe.stdout)["pairs"]}
        assert pairs[("a", "c")]["rtt_applied_ms"] == pytest.approx(20.0)
        assert abs(pairs[("a", "c")]["rtt_p50_ms"] - 20.0) < 2.0, pairs[("a", "c")]
        assert abs(pairs[("a", "b")]["rtt_p50_ms"] - 12.0) < 2.0, pairs[("a", "b")]
        down = hosts.cli("lab-3", "down", env=env)
        assert down.returncode == 0, down.stderr
    finally:
        hosts.cli("lab-3", "clean", env=env)
        hosts.stop()
