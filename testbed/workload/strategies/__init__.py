"""Training strategies, selectable by name."""

from __future__ import annotations

from testbed.spec.strategies import STRATEGIES
from testbed.workload.strategies.base import Strategy


def strategy_classes() -> dict[str, type[Strategy]]:
    """Every strategy's class by its name in testbed.spec.strategies.STRATEGIES (imports the families: torch)."""
    from testbed.workload.strategies.diloco import AsyncDiLoCo, DiLoCo, StreamingDiLoCo
    from testbed.workload.strategies.dp import FlatDP, HierDP, HierDPOverlap
    from testbed.workload.strategies.pipeline import Pipeline
    from testbed.workload.strategies.torch_native import DDP, FSDP, HSDP
    from testbed.workload.strategies.torchft import TorchftDDP, TorchftDiLoCo, TorchftStreamingDiLoCo

    table = {"flat-dp": FlatDP, "hier-dp": HierDP, "hier-dp-overlap": HierDPOverlap, "pp": Pipeline,
             "diloco": DiLoCo, "streaming-diloco": StreamingDiLoCo, "async-diloco": AsyncDiLoCo, "ddp": DDP,
             "fsdp": FSDP, "hsdp": HSDP, "torchft-ddp": TorchftDDP, "torchft-diloco": TorchftDiLoCo,
             "torchft-streaming-diloco": TorchftStreamingDiLoCo}
    return table


def make_strategy(name: str) -> Strategy:
    table = strategy_classes()
    assert set(table) == set(STRATEGIES), "every strategy of testbed.spec.strategies has a class"
    if name not in table:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(table)})")
    return table[name]()

