"""DiLoCo's outer synchronisation: the bytes its pseudo-gradients take (precision, top-k) and the part of it a
round exposes when it may start layer by layer during the last inner step's backward (the DAG of the Streaming
DiLoCo paper's simulator: forward, backward, then each layer's reduction once its gradients exist)."""

from __future__ import annotations

from testbed.spec.scenario import ModelShape, ScenarioStrategy

PRECISION_BITS = {"bf16": 16, "int8": 8, "fp4": 4, "int2": 2}


def outer_bytes(model: ModelShape, strategy: ScenarioStrategy) -> float:
    """One replica's outer pseudo-gradients on the wire: every parameter at the outer precision (default: the
    model's bytes_per_gradient), or with top-k the kept share, each value with its index."""
    bits = (model.bytes_per_gradient * 8 if strategy.outer_precision is None
            else PRECISION_BITS[strategy.outer_precision])
    if strategy.outer_topk is not None:
        bits = strategy.outer_topk * (bits + strategy.outer_index_bits)
    return model.parameters * bits / 8


def dag_exposed(outer: float, fragments: int, layers: int, step: float, tau: int, inner_steps: int,
                backward_share: float) -> float:
    """Seconds of one round (inner_steps steps of `step`) spent waiting on `outer` seconds of outer sync, split
    into `fragments` fragments of consecutive layers. A layer's reduction starts once its backward is done (the
    backward runs from the last layer down), they share the link in that order, and a fragment's result is
    needed when the forward reaches its first layer `tau` steps later. Never less than the link's own bound:
    a round's bytes cannot go faster than the link, whatever overlaps."""
    forward, backward = step * (1 - backward_share), step * backward_share
    per_layer = outer / layers
    span = layers / fragments  # layers per fragment
    waited = 0.0
    for k in range(fragments):
        first, top = k * span + 1, (k + 1) * span  # layers first..top, 1 nearest the input
        start = forward + backward * (layers - top + 1) / layers  # the fragment's top layer has its gradients
        last_ready = forward + backward * (layers - first + 1) / layers
        finish = max(start + span * per_layer, last_ready + per_layer)
        needed = step * (1 + tau) + forward * (first - 1) / layers
        waited += max(0.0, finish - needed)
    return max(waited, outer - inner_steps * step)
