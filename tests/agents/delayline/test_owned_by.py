"""Which namespaces (and delay-line files) a prefix owns: `clean` of `tb-` must not take `tb-m15-`'s."""

from __future__ import annotations

import pytest

from testbed.agents.delayline.control import remove_files
from testbed.plan import owned_by
from testbed.plan.network import build_plan
from tests.support.topologies import link_data, make_topology


@pytest.mark.parametrize("name,prefix,owned", [
    ("tb-east-0", "tb-", True),
    ("tb-east-gw", "tb-", True),
    ("tb-east-sw", "tb-", True),
    ("tb-dc_2-31", "tb-", True),
    ("tb-m15-east-0", "tb-", False),  # another testbed's, prefix tb-m15-
    ("tb-m15-east-0", "tb-m15-", True),
    ("tb-a-east-gw", "tb-", False),
    ("tb-east-0", "tb-m15-", False),
    ("tb-netem-check-42", "tb-", False),  # the kernel probe's throwaway namespace
    ("tb-east-router", "tb-", False),
    ("tb-East-0", "tb-", False),
    ("other-east-0", "tb-", False),
])
def test_owned_by(name, prefix, owned):
    assert owned_by(name, prefix) is owned


def test_every_namespace_a_plan_makes_is_owned_by_its_prefix():
    topology = make_topology("t", {"east": 12, "dc_2": 1}, [link_data("east", "dc_2", latency="1ms")])
    for prefix in ("tb-", "tb-m15-", "x"):
        plan = build_plan(topology, "userspace-delay", prefix)
        assert all(owned_by(space.name, prefix) for space in plan.namespaces)
        assert prefix == "tb-" or not any(owned_by(space.name, "tb-") for space in plan.namespaces)


def test_clean_removes_only_its_own_delay_line_files(tmp_path):
    for name in ("tb-east-gw", "tb-m15-east-gw"):
        for suffix in ("json", "status", "log"):
            (tmp_path / f"{name}.delayline.{suffix}").write_text("")
    remove_files(tmp_path, "tb-")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"tb-m15-east-gw.delayline.{s}" for s in ("json", "log", "status")]
