"""PyTorch's own data parallelism: ddp, fsdp, hsdp."""

from __future__ import annotations

from testbed.model import shapes
from testbed.model.collectives import (
    Sim,
    add_bytes,
    gloo_all_gather,
    gloo_all_reduce,
    gloo_broadcast_link_bytes,
)
from testbed.model.strategies.base import (
    BACKWARD_SHARE,
    CellModel,
    GlooWorkers,
    Prediction,
    _bucket_ready,
    _dc_groups,
    _inter_reduce,
    _measured,
    _ring_bytes,
    _round_trips,
    _scaled,
    _tokens,
)


def ddp(m: CellModel) -> Prediction:
    """DistributedDataParallel: DDP's buckets (step 0: every gradient in one; from step 1 its rebuilt ones, closed
    at bucket_cap_mb in the order gradients become ready) each all-reduced over all ranks as soon as the last
    micro-batch's backward has produced it, ProcessGroupGloo running two at a time on the group's one set of
    connections; fp16_compress_hook all-reduces half the bytes; powerSGD_hook (one bucket: several are refused at
    load time), from its start step on, all-reduces the vectors, then P, then Q, each after the one before (its
    futures' chain), instead of the bucket."""
    opts, net, t = m.opts, m.network, m.transport
    if opts.comm_hook not in ("none", "fp16", "powersgd"):
        raise KeyError(f"the cost model has no predictor for ddp with comm_hook {opts.comm_hook!r} "
                       "(covered: none, fp16, powersgd)")
    sim = Sim(net, t)
    cfg = shapes.config(opts)
    rebuilt = shapes.ddp_buckets(cfg, opts.bucket_cap_mb)
    world = list(range(net.world))
    element = 2 if opts.comm_hook == "fp16" else 4
    lowrank = shapes.powersgd_elements(cfg, opts.powersgd_rank) if opts.comm_hook == "powersgd" else None
    if lowrank is not None and len(rebuilt) > 1:
        raise KeyError("the cost model predicts ddp with comm_hook powersgd over one bucket only (several are refused "
                       "at load time)")
    compute = m.compute_s * opts.micro_batches
    clock, walls, comms, total = 0.0, [], [], {}  # total: every step's bytes (PowerSGD's first steps are plain)
    # ProcessGroupGloo's two worker threads: two buckets' all-reduces in flight at once, interleaved on the group's
    # one gloo pair per peer (one connection: the second's payloads take the gaps the first leaves, in one window)
    workers = GlooWorkers()
    for step in range(opts.steps):
        begin = clock
        done = clock
        buckets = rebuilt if step else [sum(rebuilt)]
        for size, ready in zip(buckets, _bucket_ready(m, clock, buckets)):  # DDP runs real compute only
            worker, start = workers.start(ready)
            parts = [size] if lowrank is None or step < opts.powersgd_start_iter else [n for n in lowrank if n]
            for part in parts:
                start = gloo_all_reduce(sim, world, element * part, start, "ddp")
                add_bytes(total, _ring_bytes(net, world, element * part, ("rs", "ag"), t.segment_bytes))
            workers.done(worker, start)
            done = max(done, start)
        compute_end = clock + compute
        clock = max(compute_end, done)
        comms.append(clock - compute_end)
        walls.append(clock - begin)
    exposed = _measured(m, comms)
    link = _scaled(total, 1 / max(1, opts.steps))
    hook = {"fp16": " in fp16 (DDP's fp16_compress_hook)", "none": "",
            "powersgd": f" as PowerSGD's rank-{opts.powersgd_rank} factors (three all-reduces in turn)"}[opts.comm_hook]
    # DDP's constructor broadcasts the parameters from rank 0 (_sync_module_states; this model has no buffers)
    once = gloo_broadcast_link_bytes(net, world, 0, 4 * shapes.parameter_count(cfg))
    return Prediction("ddp", _measured(m, walls), compute, exposed,
                      tokens_per_step=_tokens(m), link_bytes=link, once_link_bytes=once,
                      explain=f"DDP's {len(rebuilt)} buckets, each all-reduced over all {net.world} ranks{hook} as "
                              f"the last micro-batch's backward produces it: {exposed * 1e3:.0f} ms left exposed after "
                              f"compute{_round_trips(net, exposed)}", wire_share=sim.wire_share())


def _sharded(m: CellModel, name: str) -> Prediction:
    """FSDP2 on CPU, where every collective blocks the training thread: per micro-batch each unit (the root, then
    each block) is all-gathered over its shard group before its forward, and each block again before its
    backward (reshard_after_forward); the last micro-batch's backward reduce-scatters each unit's gradients (with
    gloo an all-reduce of the whole unit: measured, the kernel counted 35 % more inter-DC bytes than a ring
    reduce-scatter would move) and, for hsdp, all-reduces the shard across DCs (the DCs' shard groups at once)."""
    opts, net, t = m.opts, m.network, m.transport
    sim = Sim(net, t)
    units = shapes.fsdp_units(shapes.config(opts))
    total = sum(units)
    if name == "hsdp":
        shard, inter = _dc_groups(net)[0], net.inter_groups()[0]
        groups = _dc_groups(net)
    else:
        shard, inter = list(range(net.world)), None
        groups = [shard]
    n = len(shard)
    forward = [m.compute_s * (1 - BACKWARD_SHARE) * size / total for size in units]
    backward = [m.compute_s * BACKWARD_SHARE * size / total for size in units]
    clock, walls, comms, link = 0.0, [], [], {}
    for _step in range(opts.steps):
        begin, blocked, link = clock, 0.0, {}

        def collective(run, *args) -> None:
            nonlocal clock, blocked
            end = run(sim, *args)
            blocked += end - clock
            clock = end

        for mb in range(opts.micro_batches):
            last = mb == opts.micro_batches - 1
            for u, size in enumerate(units):
                shard_bytes = 4 * shapes.padded(size, n) // n
                if n > 1:
                    collective(gloo_all_gather, shard, shard_bytes, clock, "shard")
                    for group in groups:
                        add_bytes(link, _ring_bytes(net, group, shard_bytes * n, ("ag",), t.segment_bytes))
                clock += forward[u]
            for u in reversed(range(len(units))):
                size = units[u]
                padded = shapes.padded(size, n)
                if u > 0 and opts.reshard_after_forward and n > 1:
                    collective(gloo_all_gather, shard, 4 * padded // n, clock, "shard")
                    for group in groups:
                        add_bytes(link, _ring_bytes(net, group, 4 * padded, ("ag",), t.segment_bytes))
                clock += backward[u]
                if not last:
                    continue
                if n > 1:  # gloo's reduce_scatter_tensor is an all-reduce of the whole input, then a copy of the
                    # rank's chunk (ProcessGroupGloo::reduce_scatter_tensor_coalesced): twice a ring RS's bytes
                    collective(gloo_all_reduce, shard, 4 * padded, clock, "shard")
                    for group in groups:
                        add_bytes(link, _ring_bytes(net, group, 4 * padded, ("rs", "ag"), t.segment_bytes))
                if inter is not None:
                    end, inter_link = _inter_reduce(sim, inter, padded // n, "none", clock, "inter", flows=n)
                    blocked += end - clock
                    clock = end
                    add_bytes(link, _scaled(inter_link, n))
        comms.append(blocked)
        walls.append(clock - begin)
    exposed = _measured(m, comms)
    where = "inside each DC, the shard's all-reduce across DCs" if name == "hsdp" else f"over all {net.world} ranks"
    return Prediction(name, _measured(m, walls), m.compute_s * opts.micro_batches, exposed,
                      tokens_per_step=_tokens(m), link_bytes=link,
                      explain=f"FSDP2's {len(units)} units gathered and reduced {where}, every collective blocking "
                              f"(no CUDA stream on CPU): {exposed * 1e3:.0f} ms per step{_round_trips(net, exposed)}",
                      wire_share=sim.wire_share())


def fsdp(m: CellModel) -> Prediction:
    return _sharded(m, "fsdp")


def hsdp(m: CellModel) -> Prediction:
    return _sharded(m, "hsdp")
