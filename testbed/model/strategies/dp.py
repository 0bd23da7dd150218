"""The data-parallel strategies of the built-in workload: flat-dp, hier-dp, hier-dp-overlap."""

from __future__ import annotations

from testbed.model import shapes
from testbed.model.collectives import (
    Sim,
    add_bytes,
    gloo_all_gather,
    gloo_reduce_scatter,
)
from testbed.model.strategies.base import (
    CellModel,
    Prediction,
    _bucket_ready,
    _dc_groups,
    _inter_reduce,
    _measured,
    _round_trips,
    _scaled,
    _tokens,
)


def flat_dp(m: CellModel) -> Prediction:
    opts, net = m.opts, m.network
    sim = Sim(net, m.transport)
    world = list(range(net.world))
    numel = shapes.parameter_count(shapes.config(opts))
    compute = m.compute_s * opts.micro_batches
    clock, walls, comms, link = 0.0, [], [], {}
    for _step in range(opts.steps):
        begin = clock
        clock += compute
        end, link = _inter_reduce(sim, world, numel, opts.compression, clock, "world")
        comms.append(end - clock)
        clock = end
        walls.append(clock - begin)
    exposed = _measured(m, comms)
    apart = len(net.sizes) > 1  # the world group spans DCs: the workload counts its collectives as inter-DC
    return Prediction("flat-dp", _measured(m, walls), compute, exposed,
                      comm_intra_s=0.0 if apart else exposed, comm_inter_s=exposed if apart else 0.0,
                      tokens_per_step=_tokens(m), link_bytes=link,
                      explain=f"exposed communication is the ring all-reduce of {4 * numel / 1e6:.2f} MB over all "
                              f"{net.world} ranks: {exposed * 1e3:.0f} ms per step{_round_trips(net, exposed)}",
                      wire_share=sim.wire_share())


def _hier_sync(sim: Sim, numel: int, codec: str, start: float, key: object, flows_extra: int = 1
               ) -> tuple[float, float, float, dict[str, float]]:
    """Reduce-scatter in every DC, all-reduce of the shard across DCs (every inter group at once), all-gather:
    (end, end and start of the inter-DC part, payload bytes per direction)."""
    net = sim.network
    n = min(net.sizes)
    padded = shapes.padded(numel, n)
    dc = _dc_groups(net)[0]
    t1 = gloo_reduce_scatter(sim, dc, 4 * padded, start, (key, "rs")) if n > 1 else start
    group = net.inter_groups()[0]
    t2, link = _inter_reduce(sim, group, padded // n, codec, t1, (key, "inter"), flows=n * flows_extra)
    link = _scaled(link, n)
    t3 = gloo_all_gather(sim, dc, 4 * padded // n, t2, (key, "ag")) if n > 1 else t2
    return t3, t2, t1, link


def hier_dp(m: CellModel) -> Prediction:
    opts, net = m.opts, m.network
    sim = Sim(net, m.transport)
    numel = shapes.parameter_count(shapes.config(opts))
    compute = m.compute_s * opts.micro_batches
    clock, walls, comms, inters, link = 0.0, [], [], [], {}
    for _step in range(opts.steps):
        begin = clock
        clock += compute
        end, inter_end, inter_start, link = _hier_sync(sim, numel, opts.compression, clock, "hier")
        comms.append(end - clock)
        inters.append(inter_end - inter_start)
        clock = end
        walls.append(clock - begin)
    exposed, inter = _measured(m, comms), _measured(m, inters)
    n = min(net.sizes)
    return Prediction("hier-dp", _measured(m, walls), compute, exposed, comm_intra_s=exposed - inter,
                      comm_inter_s=inter, tokens_per_step=_tokens(m), link_bytes=link,
                      explain=f"exposed communication is the reduce-scatter in the DC, the all-reduce of a "
                              f"{4 * numel / n / 1e6:.2f} MB shard across DCs ({n} groups at once) and the all-gather: "
                              f"{exposed * 1e3:.0f} ms per step{_round_trips(net, exposed)}",
                      wire_share=sim.wire_share())


def hier_dp_overlap(m: CellModel) -> Prediction:
    """Buckets handed over as backward produces them; a launch thread reduce-scatters each and starts its
    chunks on the lanes (each lane a process group with two worker threads); a gather thread waits for a
    bucket's chunks and all-gathers it. The step ends when the last bucket is gathered."""
    opts, net, t = m.opts, m.network, m.transport
    sim = Sim(net, t)
    cfg = shapes.config(opts)
    buckets = shapes.buckets(cfg, opts.bucket_mb)
    n = min(net.sizes)
    dc = _dc_groups(net)[0]
    group = net.inter_groups()[0]
    chunks, lanes = max(1, opts.chunks), max(1, opts.lanes)
    flows = n * min(chunks, 2 * lanes)
    compute = m.compute_s * opts.micro_batches
    clock, walls, comms, link = 0.0, [], [], {}
    lane_slots = {lane: [0.0, 0.0] for lane in range(lanes)}  # ProcessGroupGloo runs two works at a time
    for _step in range(opts.steps):
        begin = clock
        ready = _bucket_ready(m, clock, buckets)
        compute_end = clock + compute
        launch, gather = clock, clock
        link = {}
        for b, size in enumerate(buckets):
            padded = shapes.padded(size, n * chunks)
            launch = max(launch, ready[b])
            launch = gloo_reduce_scatter(sim, dc, 4 * padded, launch, ("rs", b)) if n > 1 else launch
            shard = padded // n
            piece = shard // chunks
            finished = launch
            for i in range(chunks):
                lane = (b * chunks + i) % lanes
                slots = lane_slots[lane]
                slot = min(range(2), key=lambda k: slots[k])
                begin_chunk = max(launch + i * t.op_overhead, slots[slot])  # the launch thread issues them in turn
                end, chunk_link = _inter_reduce(sim, group, piece, opts.compression, begin_chunk, ("lane", lane),
                                                flows)
                slots[slot] = end
                finished = max(finished, end)
                add_bytes(link, _scaled(chunk_link, n))
            gather = max(gather, finished)
            gather = gloo_all_gather(sim, dc, 4 * shard, gather, ("ag", b)) if n > 1 else gather
        end = max(compute_end, gather)
        comms.append(end - compute_end)
        clock = end
        walls.append(clock - begin)
    exposed = _measured(m, comms)
    return Prediction("hier-dp-overlap", _measured(m, walls), compute, exposed,
                      tokens_per_step=_tokens(m), link_bytes=link,
                      explain=f"{len(buckets)} buckets, each shard's all-reduce across DCs cut into {chunks} chunks on "
                              f"{lanes} lanes and started during backward: {exposed * 1e3:.0f} ms left exposed after "
                              f"compute{_round_trips(net, exposed)}", wire_share=sim.wire_share())
