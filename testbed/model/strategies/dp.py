"""The data-parallel strategies of the built-in workload: flat-dp, hier-dp, hier-dp-overlap."""

from __future__ import annotations

from testbed.model import shapes
from testbed.model.collectives import (
    LinkCalendar,
    Sim,
    add_bytes,
    gloo_all_gather,
    gloo_reduce_scatter,
)
from testbed.model.host import HostCpu, all_gather_load, all_to_all_load
from testbed.model.network import Network
from testbed.model.strategies.base import (
    CellModel,
    GlooWorkers,
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


def intra_dc_cpu(host: HostCpu | None, net: Network, nbytes: int, shard: int) -> tuple[float, float, int]:
    """The host's CPU bound (testbed.model.host) on the intra-DC phases of a hierarchical sync, every DC's group at
    once on the one machine: (reduce-scatter: the workload's all-to-all of `nbytes` a rank, all-gather of a `shard`
    a rank: seconds each, messages of both); 0 s without a measured host or where every rank has a core."""
    if host is None:
        return 0.0, 0.0, 0
    rs, ag = all_to_all_load(net.sizes, nbytes), all_gather_load(net.sizes, shard)
    return host.seconds(net.world, *rs), host.seconds(net.world, *ag), rs[0] + ag[0]


def _hier_sync(sim: Sim, numel: int, codec: str, start: float, key: object, flows_extra: int = 1,
               host: HostCpu | None = None) -> tuple[float, float, float, dict[str, float], float]:
    """Reduce-scatter in every DC, all-reduce of the shard across DCs (every inter group at once), all-gather:
    (end, end and start of the inter-DC part, payload bytes per direction, the intra-DC phases' simulated
    network time). Each intra-DC phase lasts at least the host's CPU bound (intra_dc_cpu): the larger counts."""
    net = sim.network
    n = min(net.sizes)
    padded = shapes.padded(numel, n)
    dc = _dc_groups(net)[0]
    cpu_rs, cpu_ag, _ = intra_dc_cpu(host, net, 4 * padded, 4 * padded // n) if n > 1 else (0.0, 0.0, 0)
    t1 = gloo_reduce_scatter(sim, dc, 4 * padded, start, (key, "rs")) if n > 1 else start
    network = t1 - start
    t1 = max(t1, start + cpu_rs)
    group = net.inter_groups()[0]
    t2, link = _inter_reduce(sim, group, padded // n, codec, t1, (key, "inter"), flows=n * flows_extra)
    link = _scaled(link, n)
    t3 = gloo_all_gather(sim, dc, 4 * padded // n, t2, (key, "ag")) if n > 1 else t2
    network += t3 - t2
    t3 = max(t3, t2 + cpu_ag)
    return t3, t2, t1, link, network


def hier_dp(m: CellModel) -> Prediction:
    opts, net = m.opts, m.network
    sim = Sim(net, m.transport)
    numel = shapes.parameter_count(shapes.config(opts))
    compute = m.compute_s * opts.micro_batches
    clock, walls, comms, inters, networks, link = 0.0, [], [], [], [], {}
    for _step in range(opts.steps):
        begin = clock
        clock += compute
        end, inter_end, inter_start, link, network = _hier_sync(sim, numel, opts.compression, clock, "hier",
                                                                host=m.host_cpu)
        comms.append(end - clock)
        inters.append(inter_end - inter_start)
        networks.append(network)
        clock = end
        walls.append(clock - begin)
    exposed, inter = _measured(m, comms), _measured(m, inters)
    n = min(net.sizes)
    explain = (f"exposed communication is the reduce-scatter in the DC, the all-reduce of a "
               f"{4 * numel / n / 1e6:.2f} MB shard across DCs ({n} groups at once) and the all-gather: "
               f"{exposed * 1e3:.0f} ms per step{_round_trips(net, exposed)}")
    return Prediction("hier-dp", _measured(m, walls), compute, exposed, comm_intra_s=exposed - inter,
                      comm_inter_s=inter, tokens_per_step=_tokens(m), link_bytes=link,
                      explain=explain + _host_cpu_sentence(m, numel, _measured(m, networks), exposed - inter),
                      wire_share=sim.wire_share())


def _host_cpu_sentence(m: CellModel, numel: int, network: float, intra: float) -> str:
    """Which bound the intra-DC phases took (`network`: their simulated network time; `intra`: what they took),
    where the host's CPU bound applies (its ranks outnumber its cores)."""
    net, host = m.network, m.host_cpu
    n = min(net.sizes)
    if host is None or n < 2 or net.world <= host.cores:
        return ""
    padded = shapes.padded(numel, n)
    cpu_rs, cpu_ag, messages = intra_dc_cpu(host, net, 4 * padded, 4 * padded // n)
    cpu = cpu_rs + cpu_ag
    larger = "the CPU's is the larger and counts" if intra > network * (1 + 1e-9) else \
        "the network's is the larger and counts"
    return (f"; inside the DCs the network takes {network * 1e3:.1f} ms and the {messages} messages every DC sends "
            f"at once take {cpu * 1e3:.1f} ms of this machine's {host.cores} cores for its {net.world} ranks "
            f"({host.message_core_s * 1e3:.3f} ms of a core a message, {host.byte_core_s * 1e9:.2f} ms a MB): "
            f"{larger}")


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
    # every node's chunks cross beside the simulated node's (its identical twins share the rate); the chunks in
    # flight at once on the lanes (two works a lane, a bucket's starting while earlier ones still cross) take turns
    # on the link direction (LinkCalendar): its bytes are carried at its rate, never faster
    flows, link_free = n, LinkCalendar()
    compute = m.compute_s * opts.micro_batches
    clock, walls, comms, link = 0.0, [], [], {}
    lane_workers = {lane: GlooWorkers() for lane in range(lanes)}  # each lane a process group
    for _step in range(opts.steps):
        begin = clock
        ready = _bucket_ready(m, clock, buckets)
        compute_end = clock + compute
        launch, gather = clock, clock
        link = {}
        for b, size in enumerate(buckets):
            padded = shapes.padded(size, n * chunks)
            launch = max(launch, ready[b])
            shard = padded // n
            cpu_rs, cpu_ag, _ = intra_dc_cpu(m.host_cpu, net, 4 * padded, 4 * shard) if n > 1 else (0.0, 0.0, 0)
            launch = max(gloo_reduce_scatter(sim, dc, 4 * padded, launch, ("rs", b)), launch + cpu_rs) if n > 1 \
                else launch
            piece = shard // chunks
            finished = launch
            for i in range(chunks):
                lane = (b * chunks + i) % lanes
                workers = lane_workers[lane]
                worker, begin_chunk = workers.start(launch + i * t.op_overhead)  # the launch thread issues in turn
                end, chunk_link = _inter_reduce(sim, group, piece, opts.compression, begin_chunk, ("lane", lane),
                                                flows, link_free)
                workers.done(worker, end)
                finished = max(finished, end)
                add_bytes(link, _scaled(chunk_link, n))
            gather = max(gather, finished)
            gather = max(gloo_all_gather(sim, dc, 4 * shard, gather, ("ag", b)), gather + cpu_ag) if n > 1 \
                else gather
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
