"""Training strategies, selectable by name."""

from __future__ import annotations

from testbed.spec.strategies import STRATEGIES
from testbed.workload.strategies.base import Strategy


def make_strategy(name: str) -> Strategy:
    from testbed.workload.strategies.diloco import AsyncDiLoCo, DiLoCo, StreamingDiLoCo
    from testbed.workload.strategies.dp import FlatDP, HierDP, HierDPOverlap
    from testbed.workload.strategies.pipeline import Pipeline
    from testbed.workload.strategies.torch_native import DDP, FSDP, HSDP

    table = {"flat-dp": FlatDP, "hier-dp": HierDP, "hier-dp-overlap": HierDPOverlap, "pp": Pipeline,
             "diloco": DiLoCo, "streaming-diloco": StreamingDiLoCo, "async-diloco": AsyncDiLoCo, "ddp": DDP,
             "fsdp": FSDP, "hsdp": HSDP}
    assert set(table) == set(STRATEGIES), "every strategy of testbed.spec.strategies has a class"
    if name not in table:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(table)})")
    return table[name]()

