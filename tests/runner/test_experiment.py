"""What a cell's result says of the delay lines' CPU (testbed.runner.fidelity), from two stats snapshots."""

import pytest

from testbed.runner.fidelity import delay_line_cpu_s


def direction(worker: int, cpu: float | None) -> dict:
    return {"worker": worker, "worker_cpu_s": cpu}


@pytest.mark.parametrize(("before", "after", "expected"), [
    # one worker serving two directions is counted once; two workers add up
    ({"a->b": direction(7, 1.0), "c->b": direction(7, 1.0), "b->a": direction(8, 2.0)},
     {"a->b": direction(7, 1.5), "c->b": direction(7, 1.5), "b->a": direction(8, 2.25)}, 0.75),
    ({"a->b": direction(7, 1.0)}, {"a->b": direction(9, 0.5)}, 0.5),  # restarted: counted from its start
    ({}, {"a->b": direction(7, 3.0)}, None),  # nothing before: what it spent earlier is unknown
    # the same pid in two gateways (docker: each router's own pid namespace) is two workers
    ({"a->b": direction(1, 1.0), "b->a": direction(1, 4.0)}, {"a->b": direction(1, 2.0), "b->a": direction(1, 4.5)},
     1.5),
    # a direction of a worker new since the snapshot (a link given a delay) does not hide what the worker spent
    ({"a->b": direction(7, 1.0)}, {"a->b": direction(7, 2.0), "c->b": direction(7, 2.0)}, 1.0),
    ({"a->b": direction(7, 1.0)}, {"a->b": direction(7, None)}, None),  # a worker that does not say
    ({}, {}, None),  # no delay line (netem)
])
def test_the_delay_lines_cpu_is_each_workers_once(before, after, expected):
    assert delay_line_cpu_s(before, after) == (pytest.approx(expected) if expected is not None else None)
