"""torchft's strategies: a DC is one replica group; between quorums they move what their algorithm's twin does.

torchft-ddp all-reduces every gradient over the groups (one rank index at a time) as PyTorch's DDP does, so its
steps are DDP's; torchft's DiLoCo moves the built-in diloco's (unsharded) pseudo-gradient, but one all-reduce per
tensor (torchft 0.2.0's default: use_bucketization off), each a ring's latency-bound steps: at 25 ms one way across
3 DCs its outer sync of the tiny GPT took 5.9-7.5 s where the built-in diloco's one all-reduce took 0.3-0.6 s
(experiments/dc-death.yaml, 2026-12-02). Its Streaming DiLoCo moves the built-in streaming-diloco's fragments. Not
in these figures: the quorum's round trip to the lighthouse every step (or every outer step) and a heal
(testbed.model.heal)."""

from __future__ import annotations

import dataclasses

from testbed.model import shapes
from testbed.model.collectives import Sim, add_bytes, gloo_all_reduce
from testbed.model.strategies.base import CellModel, GlooWorkers, Prediction, _all_reduce_bytes, _scaled
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
    p = diloco(_as(m, "diloco", outer_shard=False), outer=_per_tensor_outer)
    return _named(p, "torchft-diloco", "diloco, one all-reduce per tensor")


def _per_tensor_outer(sim: Sim, m: CellModel, numel: int, start: float, key: object,
                      shard: bool) -> tuple[float, dict]:
    """torchft's DiLoCo outer step: every tensor's pseudo-gradient all-reduced on its own over the groups (one
    rank index at a time, the DCs' other nodes beside), issued at once and run two at a time by ProcessGroupGloo's
    workers; the outer step waits for them all."""
    net = sim.network
    n, group = min(net.sizes), net.inter_groups()[0]
    workers, link = GlooWorkers(start), {}
    for size in shapes.tensors(shapes.config(m.opts)):
        worker, begin = workers.start(start)
        workers.done(worker, gloo_all_reduce(sim, group, 4 * size, begin, (key, worker), flows=n))
        add_bytes(link, _scaled(_all_reduce_bytes(net, group, 4 * size, sim.transport), n))
    return max(workers.free), link



def torchft_streaming_diloco(m: CellModel) -> Prediction:
    """torchft's fragment_sync_delay is the built-in streaming-diloco's overlap_steps: the inner steps a fragment's
    all-reduce runs beside before its outer step waits for it."""
    twin = _as(m, "streaming-diloco", overlap_steps=m.opts.fragment_sync_delay)
    return _named(streaming_diloco(twin), "torchft-streaming-diloco", "streaming-diloco")
