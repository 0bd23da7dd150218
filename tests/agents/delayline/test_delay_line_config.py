"""What crosses into the delay line's processes, typed: its config (the directions it serves), the iptables rule
of each, and the supervisor's status file (no root)."""

from __future__ import annotations

import pytest

from testbed.agents.delayline.files import DelayLineFiles, DelayLineStatus
from testbed.plan.delayline import DELAY_LINE_QUEUE_MIN, DelayDirection, DelayLineSpec, dump_config, load_config
from testbed.plan.network import build_plan
from tests.support.topologies import link_data, make_topology

SPEC = DelayLineSpec(latency=0.01, jitter=0.002, loss=0.001, limit=20000)


def test_the_config_round_trips_as_the_same_directions_and_refuses_what_it_does_not_know():
    work = [DelayDirection.serving("east->west", "eth1", 0, SPEC, ("198.18.0.2", "198.18.0.3"), "testbed:tb-"),
            DelayDirection.serving("north->west", "eth1", 1, DelayLineSpec(0.03, 0, 0, 10))]
    assert load_config(dump_config(work)) == work
    assert work[1].limit == DELAY_LINE_QUEUE_MIN  # a queue never shorter than NFQUEUE would want
    with pytest.raises(ValueError, match="unknown keys colour"):
        load_config('[{"key": "a->b", "ifname": "x", "queue": 0, "latency": 0, "jitter": 0, "loss": 0, '
                    '"limit": 1, "colour": "red"}]')


def test_a_live_change_keeps_the_queue_and_its_rule():
    direction = DelayDirection.serving("east->west", "to-east", 2, SPEC, comment="testbed:tb-")
    changed = direction.reshaped(DelayLineSpec(0.05, 0.0, 0.02, 1))
    assert (changed.latency, changed.jitter, changed.loss) == (0.05, 0.0, 0.02)
    assert (changed.queue, changed.limit, changed.rule()) == (direction.queue, direction.limit, direction.rule())


RULES = [
    (DelayDirection.serving("a->b", "to-a", 0, SPEC),
     "-t mangle -A PREROUTING -i to-a -m dscp ! --dscp 63 -j NFQUEUE --queue-num 0"),
    (DelayDirection.serving("a->b", "eth0", 3, SPEC, ("10.0.0.2", "10.0.0.3"), "testbed:tb-x-"),
     "-t mangle -A PREROUTING -i eth0 -s 10.0.0.2,10.0.0.3 -m dscp ! --dscp 63 -m comment --comment testbed:tb-x- "
     "-j NFQUEUE --queue-num 3"),
]


@pytest.mark.parametrize("direction,rule", RULES)
def test_each_direction_has_one_rule_without_a_bypass(direction, rule):
    """No --queue-bypass (a dead delay line darkens the link); only packets marked UNSHAPED_DSCP, the probe's
    floor pings, skip it."""
    assert " ".join(direction.rule()) == rule


def test_the_plan_says_which_gateway_delays_which_direction():
    topology = make_topology("tri", {"a": 1, "b": 1, "c": 1},
                             [link_data("a", "b", latency="5ms"), link_data("b", "c", latency="7ms")])
    plan = build_plan(topology, "userspace-delay", "tb-")
    lines = plan.delay_lines()
    assert {ns: [(d.key, d.ifname, d.queue) for d in work] for ns, work in lines.items()} == {
        "tb-b-gw": [("a->b", "to-a", 0), ("c->b", "to-c", 1)], "tb-a-gw": [("b->a", "to-b", 0)],
        "tb-c-gw": [("b->c", "to-b", 0)]}
    assert plan.delay_line_of("c->b") == "tb-b-gw" and plan.delay_line_of("a->c") is None
    assert build_plan(topology, "netem", "tb-").delay_lines() == {}


def test_the_status_file_is_read_back_typed_or_not_at_all(tmp_path):
    files = DelayLineFiles.named(tmp_path, "tb-b-gw")
    assert files.status.name == "tb-b-gw.delayline.status" and files.stats.name == "tb-b-gw.delayline.stats"
    assert DelayLineFiles.of_config(files.config) == files
    assert DelayLineStatus.read(files.status) is None  # not written yet
    DelayLineStatus(supervisor=10, worker=11, ready=True, rules=["-t mangle ..."]).write(files.status)
    assert DelayLineStatus.read(files.status) == DelayLineStatus(10, 11, 0, True, ["-t mangle ..."])
    files.status.write_text('{"supervisor": 10, "colour": 1}')
    assert DelayLineStatus.read(files.status) is None
