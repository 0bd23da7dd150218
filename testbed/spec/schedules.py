"""Pipeline schedules as pure data: the order of forward (F) and backward (B) operations each stage runs.

Defined once, for the workload that executes them (testbed.workload.strategies.pipeline) and the cost model
that predicts them (testbed.model): no torch.
- gpipe: all forwards, then all backwards.
- 1f1b: p-s-1 warm-up forwards, then one forward / one backward, then the remaining backwards.
- interleaved-1f1b: Megatron's virtual-pipeline order over v chunks per stage (m divisible by p).
- overlap: 1f1b with (p-s-1) x (1 + lookahead) warm-up forwards (the GeoPipe idea).
"""

from __future__ import annotations

import math

from testbed.spec.strategies import SCHEDULES

Op = tuple[str, int, int]  # ("F" | "B", virtual chunk index on this stage, micro-batch)


def gpipe(p: int, s: int, m: int) -> list[Op]:
    return [("F", 0, mb) for mb in range(m)] + [("B", 0, mb) for mb in reversed(range(m))]


def one_f_one_b(p: int, s: int, m: int, extra: int = 0) -> list[Op]:
    """1F1B; with `extra`, each of the p-s-1 hops to the last stage and back gets `extra` more micro-batches
    in flight (the last stage, whose forward->backward path crosses no link, gets none)."""
    warmup = min(m, (p - s - 1) * (1 + extra))
    ops: list[Op] = [("F", 0, mb) for mb in range(warmup)]
    forward, backward = warmup, 0
    while forward < m:
        ops.append(("F", 0, forward))
        forward += 1
        ops.append(("B", 0, backward))
        backward += 1
    ops += [("B", 0, mb) for mb in range(backward, m)]
    return ops


def interleaved(p: int, s: int, m: int, v: int) -> list[Op]:
    """Megatron-LM's interleaved 1F1B order for stage s (m must be a multiple of p)."""
    if m % p:
        raise ValueError(f"interleaved-1f1b needs micro-batches ({m}) to be a multiple of stages ({p})")
    total = m * v

    def forward_op(k: int) -> Op:
        return ("F", (k // p) % v, (k // (p * v)) * p + k % p)

    def backward_op(k: int) -> Op:
        return ("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)

    warmup = total if m == p else min(total, (p - s - 1) * 2 + (v - 1) * p)
    ops = [forward_op(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(forward_op(warmup + k))
        ops.append(backward_op(k))
    ops += [backward_op(k) for k in range(total - warmup, total)]
    return ops


def schedule_ops(name: str, p: int, s: int, m: int, v: int, lookahead: int) -> list[Op]:
    if name == "gpipe":
        return gpipe(p, s, m)
    if name == "1f1b":
        return one_f_one_b(p, s, m)
    if name == "interleaved-1f1b":
        return interleaved(p, s, m, v)
    if name == "overlap":
        return one_f_one_b(p, s, m, extra=lookahead)
    raise ValueError(f"unknown schedule {name!r} (known: {', '.join(SCHEDULES)})")


def overlap_lookahead(option: int, rtt_s: float, per_micro_s: float, p: int, m: int) -> int:
    """Extra warm-up micro-batches of the `overlap` schedule: the option when set (>= 0), else enough to cover
    one cross-DC round trip (`rtt_s`) at `per_micro_s` of compute per micro-batch and stage."""
    if option >= 0:
        return option
    if rtt_s <= 0 or per_micro_s <= 0:
        return max(1, p - 1)
    return min(m, math.ceil(rtt_s / per_micro_s))
