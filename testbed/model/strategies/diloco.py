"""DiLoCo and its variants: diloco, async-diloco, streaming-diloco."""

from __future__ import annotations

from collections.abc import Callable

from testbed.model import shapes
from testbed.model.collectives import (
    Sim,
    add_bytes,
    gloo_all_gather,
    gloo_all_reduce,
)
from testbed.model.strategies.base import (
    CellModel,
    Prediction,
    _all_reduce_bytes,
    _dc_groups,
    _measured,
    _scaled,
    _tokens,
)


def _inner(sim: Sim, m: CellModel, numel: int, start: float) -> float:
    net = sim.network
    dc = _dc_groups(net)[0]
    return gloo_all_reduce(sim, dc, 4 * numel, start, "intra") if len(dc) > 1 else start


def _outer(sim: Sim, m: CellModel, numel: int, start: float, key: object, shard: bool) -> tuple[float, dict]:
    net = sim.network
    n = min(net.sizes)
    group = net.inter_groups()[0]
    dc = _dc_groups(net)[0]
    if shard and n > 1:
        padded = shapes.padded(numel, n)
        end = gloo_all_reduce(sim, group, 4 * padded // n, start, (key, "inter"), flows=n)
        link = _scaled(_all_reduce_bytes(net, group, 4 * padded // n, sim.transport), n)
        end = gloo_all_gather(sim, dc, 4 * padded // n, end, (key, "ag"))
        return end, link
    end = gloo_all_reduce(sim, group, 4 * numel, start, (key, "inter"), flows=n)
    return end, _scaled(_all_reduce_bytes(net, group, 4 * numel, sim.transport), n)


def diloco(m: CellModel, outer: Callable[..., tuple[float, dict]] = _outer) -> Prediction:
    """`outer`: how the outer synchronisation moves the pseudo-gradient (_outer's signature)."""
    opts, net = m.opts, m.network
    sim = Sim(net, m.transport)
    numel = shapes.parameter_count(shapes.config(opts))
    compute = m.compute_s * opts.micro_batches
    h = max(1, opts.inner_steps)
    clock, walls, comms, per_step_link = 0.0, [], [], {}
    outer_cost = 0.0
    for step in range(opts.steps):
        begin = clock
        clock = _inner(sim, m, numel, clock + compute)
        if (step + 1) % h == 0:
            end, link = outer(sim, m, numel, clock, "outer", opts.outer_shard)
            outer_cost = end - clock
            clock = end
            per_step_link = _scaled(link, 1 / h)
        walls.append(clock - begin)
        comms.append(clock - begin - compute)
    return Prediction(opts.strategy, _measured(m, walls), compute, _measured(m, comms),
                      tokens_per_step=_tokens(m), link_bytes=per_step_link,
                      explain=f"an outer synchronisation every {h} steps costs {outer_cost * 1e3:.0f} ms, "
                              f"{outer_cost / h * 1e3:.1f} ms per step amortised", wire_share=sim.wire_share())


def async_diloco(m: CellModel) -> Prediction:
    """DiLoCo whose outer all-reduce (every node of a DC syncing the whole pseudo-gradient with its counterparts,
    the DCs' groups at once) runs in the background: one falls due every H steps (not at the last), one is in
    flight at a time, it is applied at the first step after it arrived, waited for only once it is
    max_staleness steps old, and every sync still owed is settled at the last step."""
    opts, net = m.opts, m.network
    sim = Sim(net, m.transport)
    numel = shapes.parameter_count(shapes.config(opts))
    compute = m.compute_s * opts.micro_batches
    h, n, group = max(1, opts.inner_steps), min(net.sizes), net.inter_groups()[0]
    clock, walls, comms, link = 0.0, [], [], {}
    flight: tuple[int, float] | None = None  # (step it started at, when it arrives)
    owed, durations = 0, []

    def start(step: int, now: float) -> tuple[int, float]:
        end = gloo_all_reduce(sim, group, 4 * numel, now, "outer", flows=n)
        add_bytes(link, _scaled(_all_reduce_bytes(net, group, 4 * numel, sim.transport), n))
        durations.append(end - now)
        return step, end

    for step in range(opts.steps):
        begin = clock
        clock = _inner(sim, m, numel, clock + compute)
        last = step == opts.steps - 1
        owed += (step + 1) % h == 0 and not last
        if flight and (last or step - flight[0] >= opts.max_staleness or flight[1] <= clock):
            clock, flight = max(clock, flight[1]), None
        if flight is None and owed:
            flight, owed = start(step, clock), owed - 1
        while last and (flight or owed):
            if flight:
                clock, flight = max(clock, flight[1]), None
            if owed:
                flight, owed = start(step, clock), owed - 1
        walls.append(clock - begin)
        comms.append(clock - begin - compute)
    exposed = _measured(m, comms)
    outer = max(durations, default=0.0)
    return Prediction(opts.strategy, _measured(m, walls), compute, exposed,
                      tokens_per_step=_tokens(m),
                      link_bytes=_scaled(link, 1 / opts.steps),
                      explain=f"an outer synchronisation every {h} steps takes {outer * 1e3:.0f} ms in the background "
                              f"(waited for only at {opts.max_staleness} steps' staleness and at the end): "
                              f"{exposed * 1e3:.1f} ms per step exposed", wire_share=sim.wire_share())


def streaming_diloco(m: CellModel) -> Prediction:
    opts, net, t = m.opts, m.network, m.transport
    sim = Sim(net, t)
    cfg = shapes.config(opts)
    numel = shapes.parameter_count(cfg)
    frags = shapes.fragments(cfg, opts.fragments)
    count = len(frags)
    period = max(1, opts.inner_steps)
    compute = m.compute_s * opts.micro_batches
    group = net.inter_groups()[0]
    n = min(net.sizes)
    clock, walls, comms = 0.0, [], []
    in_flight: list[tuple[int, float]] = []  # (step it started at, completion time)
    link_total: dict[str, float] = {}
    for step in range(opts.steps):
        begin = clock
        clock = _inner(sim, m, numel, clock + compute)
        for f in range(count):
            offset = f * period // count
            if (step + 1 - offset) % period == 0 and step + 1 >= offset:
                end = gloo_all_reduce(sim, group, 4 * frags[f], clock, ("frag", f), flows=n)
                add_bytes(link_total, _scaled(_all_reduce_bytes(net, group, 4 * frags[f], t), n))
                in_flight.append((step, end))
                if opts.overlap_steps <= 0:
                    clock = max(clock, end)
                    in_flight.pop()
        for item in [x for x in in_flight if step == opts.steps - 1 or step >= x[0] + opts.overlap_steps]:
            clock = max(clock, item[1])
            in_flight.remove(item)
        walls.append(clock - begin)
        comms.append(clock - begin - compute)
    return Prediction("streaming-diloco", _measured(m, walls), compute, _measured(m, comms),
                      tokens_per_step=_tokens(m),
                      link_bytes=_scaled(link_total, 1 / opts.steps),
                      explain=f"{count} fragments synchronised in turn every {period} steps, each hidden behind "
                              f"{opts.overlap_steps} inner steps", wire_share=sim.wire_share())
