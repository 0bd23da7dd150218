"""Which iptables rules a live change adds and deletes (no root: iptables itself is replaced by a recorder)."""

from __future__ import annotations

from testbed.agents.delayline import supervisor
from testbed.agents.delayline.files import DelayLineStatus
from testbed.plan.delayline import DelayDirection, DelayLineSpec

DELAYED, UNDELAYED = DelayLineSpec(0.02, 0.0, 0.0, 1), DelayLineSpec(0.0, 0.0, 0.0, 1)


def test_a_live_change_to_nothing_to_do_deletes_the_rule_and_back_adds_it(monkeypatch):
    """A 0 ms cell after a 20 ms one: its packets skip the delay line (the rule goes); a 20 ms one after it adds the
    rule again; a direction that had work and keeps it is left alone."""
    ran: list[list[str]] = []
    monkeypatch.setattr(supervisor, "_iptables", lambda rule: ran.append(rule))
    a = DelayDirection.serving("a->b", "to-a", 0, DELAYED)
    c = DelayDirection.serving("c->b", "to-c", 1, DELAYED)
    status = DelayLineStatus(supervisor=1, rules=[" ".join(a.rule()), " ".join(c.rule())])

    def change(work: list[DelayDirection]) -> None:
        assert supervisor._add_rules(work, status) is None and supervisor._drop_rules(work, status) is None

    change([a.reshaped(UNDELAYED), c])
    assert ran == [["-t", "mangle", "-D", *a.rule()[3:]]]
    assert status.rules == [" ".join(c.rule())]
    ran.clear()
    change([a.reshaped(UNDELAYED), c])
    assert ran == []  # nothing left to delete
    change([a, c])
    assert ran == [a.rule()] and status.rules == [" ".join(c.rule()), " ".join(a.rule())]


def test_a_rule_that_cannot_be_deleted_is_said_and_kept(monkeypatch):
    monkeypatch.setattr(supervisor, "_iptables", lambda rule: "iptables said no")
    a = DelayDirection.serving("a->b", "to-a", 0, DELAYED)
    status = DelayLineStatus(supervisor=1, rules=[" ".join(a.rule())])
    assert supervisor._drop_rules([a.reshaped(UNDELAYED)], status) == "iptables said no"
    assert status.rules == [" ".join(a.rule())]
