"""torchft's strategies: a DC is one replica group; between quorums they move what their algorithm's twin does.

torchft-ddp all-reduces every gradient over the groups (one rank index at a time) as PyTorch's DDP does, so its
steps are DDP's; torchft's DiLoCo moves the built-in diloco's (unsharded) outer all-reduce, its Streaming DiLoCo the
built-in streaming-diloco's fragments. Not in these figures: the quorum's round
trip to the lighthouse every step (or every outer step) and a heal (testbed.model.heal)."""

from __future__ import annotations

import dataclasses

from testbed.model.strategies.base import CellModel, Prediction
from testbed.model.strategies.diloco import diloco, streaming_diloco
from testbed.model.strategies.torch_native import ddp

_QUORUM = "; the quorum's round trips to the lighthouse are not in this figure"


def _as(m: CellModel, strategy: str, **changes: object) -> CellModel:
    return dataclasses.replace(m, opts=dataclasses.replace(m.opts, strategy=strategy, **changes))


def _named(p: Prediction, name: str, twin: str) -> Prediction:
    return dataclasses.replace(p, strategy=name, explain=f"as {twin}: {p.explain}{_QUORUM}")


def torchft_ddp(m: CellModel) -> Prediction:
    return _named(ddp(_as(m, "ddp")), "torchft-ddp", "ddp")


def torchft_diloco(m: CellModel) -> Prediction:
    return _named(diloco(_as(m, "diloco", outer_shard=False)), "torchft-diloco", "diloco")



def torchft_streaming_diloco(m: CellModel) -> Prediction:
    """torchft's fragment_sync_delay is the built-in streaming-diloco's overlap_steps: the inner steps a fragment's
    all-reduce runs beside before its outer step waits for it."""
    twin = _as(m, "streaming-diloco", overlap_steps=m.opts.fragment_sync_delay)
    return _named(streaming_diloco(twin), "torchft-streaming-diloco", "streaming-diloco")
