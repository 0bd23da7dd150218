"""One predictor per strategy: a cell's steps simulated on the network with the calibrated transport.

Each predictor takes a CellModel (options, network, transport, compute per micro-batch) and returns a
Prediction: mean step, compute, exposed communication, bubble, payload bytes per inter-DC link direction
and per step, and a sentence that says where the time goes. Steps are simulated one after the other (TCP
windows carry over and restart after idle gaps, as they do on the real links) and averaged over the
measured steps, as the collectors average the measured ones.

Extension point: PREDICTORS maps a workload strategy name to its function; a new strategy adds one function
here that composes the collectives in testbed.model.collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.model import shapes
from testbed.model.collectives import (
    Sim,
    _segment_lengths,
    add_bytes,
    gloo_all_gather,
    gloo_all_reduce,
    gloo_broadcast_link_bytes,
    gloo_reduce_scatter,
    gloo_ring,
    gloo_segments,
    p2p_link_bytes,
    transfer,
)
from testbed.model.network import Network
from testbed.model.transport import Transport
from testbed.spec.schedules import overlap_lookahead, schedule_ops
from testbed.spec.strategies import Options

BACKWARD_SHARE = 2 / 3  # the workload's split of a micro-batch's compute (backward about twice the forward)


@dataclass(frozen=True)
class CellModel:
    """Everything a predictor needs about one cell."""

    opts: Options
    network: Network
    transport: Transport
    compute_s: float  # forward+backward of one micro-batch of the whole model on one rank (s)
    warmup_steps: int = 0
    link_rtt_s: float = 0.0  # what the runner tells the overlap schedule (largest configured inter-DC RTT)
    step_overhead_s: float = 0.0  # per step besides compute and communication (optimizer, bookkeeping)

    @property
    def measured_steps(self) -> range:
        return range(min(self.warmup_steps, self.opts.steps - 1), self.opts.steps)


@dataclass
class Prediction:
    strategy: str
    step_s: float  # mean wall time of a measured step (the slowest rank's)
    compute_s: float  # per step and rank
    exposed_s: float  # per step: the training thread waiting on communication
    bubble_s: float = 0.0  # per step (pipelines)
    pipeline_s: float = 0.0  # per step (pipelines): the schedule's span
    tokens_per_step: float = 0.0
    link_bytes: dict[str, float] = field(default_factory=dict)  # payload per step, per inter-DC link direction
    once_link_bytes: dict[str, float] = field(default_factory=dict)  # payload once per run (start-up), per direction
    wire_share: dict[str, float] = field(default_factory=dict)  # per direction: headers of the TSO units the sends
    # were cut into beyond each message's first, per payload byte (Sim.wire_share)
    explain: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.step_s > 0 else 0.0

    @property
    def inter_dc_bytes(self) -> float:
        return sum(self.link_bytes.values())

    @property
    def bubble_ratio(self) -> float | None:
        return self.bubble_s / self.pipeline_s if self.pipeline_s > 0 else None


def _round_trips(net: Network, seconds: float) -> str:
    """'= k round trips of r ms' for a time spent across DCs (nothing when the DCs are not apart)."""
    if len(net.sizes) < 2:
        return ""
    rtt = max(net.rtt(a, b) for (a, b) in net.paths)
    return f" (= {seconds / rtt:.1f} round trips of {rtt * 1e3:.1f} ms)" if rtt > 1e-4 else ""


def _tokens(m: CellModel) -> float:
    """Tokens one step of a data-parallel strategy trains: every rank its micro-batches."""
    return m.opts.micro_batch * m.opts.micro_batches * m.network.world * shapes.config(m.opts).seq_len


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _measured(m: CellModel, per_step: list[float]) -> float:
    """The mean of a per-step figure over the steps the collectors count (warm-up steps left out)."""
    return _mean([per_step[i] for i in m.measured_steps])


def _ring_bytes(net: Network, ranks: list[int], total: int, phases: tuple[str, ...], segment: int) -> dict[str, float]:
    """Bytes per link direction of gloo's ring over `ranks`: the segments as gloo cuts them, each with its
    messages' overhead."""
    g = len(ranks)
    out: dict[str, float] = {}
    if g < 2:
        return out
    count, size = gloo_segments(total, g, cap=segment)
    for phase in phases:
        lengths = _segment_lengths(total, g, count, size, phase)
        for s in range(g):
            sent = [row[s] for row in lengths if row[s] > 0]
            add_bytes(out, p2p_link_bytes(net, ranks[s], ranks[(s - 1) % g], sum(sent), len(sent)))
    return out


def _all_reduce_bytes(net: Network, ranks: list[int], total: int, t: Transport) -> dict[str, float]:
    return _ring_bytes(net, ranks, total, ("rs", "ag"), t.segment_bytes)


def _compressed_parts(numel: int, codec: str) -> list[int]:
    """Bytes of each part a compressed all-reduce all-gathers from every rank."""
    if codec in ("fp16", "bf16"):
        return [2 * numel]
    blocks = -(-numel // 4096)
    return [blocks * 4096, 4 * blocks]  # int8 values, fp32 scales


def _inter_reduce(sim: Sim, ranks: list[int], numel: int, codec: str, start: float, key: object,
                  flows: int = 1) -> tuple[float, dict[str, float]]:
    """The inter-DC (or flat) step of a DP strategy, compressed or not: (end, payload bytes per direction)."""
    net, t = sim.network, sim.transport
    if codec == "none":
        return gloo_all_reduce(sim, ranks, 4 * numel, start, key, flows), _all_reduce_bytes(net, ranks, 4 * numel, t)
    end, link = start, {}
    for index, part in enumerate(_compressed_parts(numel, codec)):
        end = gloo_ring(sim, ranks, part * len(ranks), end, (key, index), ("ag",), flows)
        add_bytes(link, _ring_bytes(net, ranks, part * len(ranks), ("ag",), t.segment_bytes))
    return end, link


def _bucket_ready(m: CellModel, clock: float, buckets: list[int]) -> list[float]:
    """When each gradient bucket (in the order backward fills them) is final, for a step starting at `clock`:
    synthetic compute spreads every micro-batch's backward over the buckets after all forwards; real compute
    arms the hooks for the last micro-batch's backward only."""
    compute = m.compute_s * m.opts.micro_batches
    if m.opts.synthetic:
        backward_from, backward = clock + compute * (1 - BACKWARD_SHARE), compute * BACKWARD_SHARE
    else:
        backward_from, backward = clock + compute - m.compute_s * BACKWARD_SHARE, m.compute_s * BACKWARD_SHARE
    total, done, ready = sum(buckets), 0, []
    for size in buckets:
        done += size
        ready.append(backward_from + backward * done / total)
    return ready


def _dc_groups(net: Network) -> list[list[int]]:
    return [list(range(net.dc_start(dc), net.dc_start(dc) + size)) for dc, size in enumerate(net.sizes)]


def _scaled(link: dict[str, float], times: float) -> dict[str, float]:
    return {k: v * times for k, v in link.items()}


# --- data parallel ------------------------------------------------------------------------------------------

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
    return Prediction("flat-dp", _measured(m, walls), compute, exposed,
                      tokens_per_step=_tokens(m), link_bytes=link,
                      explain=f"exposed communication is the ring all-reduce of {4 * numel / 1e6:.2f} MB over all "
                              f"{net.world} ranks: {exposed * 1e3:.0f} ms per step{_round_trips(net, exposed)}",
                      wire_share=sim.wire_share())


def _hier_sync(sim: Sim, numel: int, codec: str, start: float, key: object, flows_extra: int = 1
               ) -> tuple[float, float, dict[str, float]]:
    """Reduce-scatter in every DC, all-reduce of the shard across DCs (every inter group at once), all-gather:
    (end, end of the inter-DC part, payload bytes per direction)."""
    net = sim.network
    n = min(net.sizes)
    padded = shapes.padded(numel, n)
    dc = _dc_groups(net)[0]
    t1 = gloo_reduce_scatter(sim, dc, 4 * padded, start, (key, "rs")) if n > 1 else start
    group = net.inter_groups()[0]
    t2, link = _inter_reduce(sim, group, padded // n, codec, t1, (key, "inter"), flows=n * flows_extra)
    link = _scaled(link, n)
    t3 = gloo_all_gather(sim, dc, 4 * padded // n, t2, (key, "ag")) if n > 1 else t2
    return t3, t2, link


def hier_dp(m: CellModel) -> Prediction:
    opts, net = m.opts, m.network
    sim = Sim(net, m.transport)
    numel = shapes.parameter_count(shapes.config(opts))
    compute = m.compute_s * opts.micro_batches
    clock, walls, comms, link = 0.0, [], [], {}
    for _step in range(opts.steps):
        begin = clock
        clock += compute
        end, _, link = _hier_sync(sim, numel, opts.compression, clock, "hier")
        comms.append(end - clock)
        clock = end
        walls.append(clock - begin)
    exposed = _measured(m, comms)
    n = min(net.sizes)
    return Prediction("hier-dp", _measured(m, walls), compute, exposed,
                      tokens_per_step=_tokens(m), link_bytes=link,
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


# --- PyTorch's own data parallelism ---------------------------------------------------------------------------

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
    slots = [0.0, 0.0]
    for step in range(opts.steps):
        begin = clock
        done = clock
        buckets = rebuilt if step else [sum(rebuilt)]
        for size, ready in zip(buckets, _bucket_ready(m, clock, buckets)):  # DDP runs real compute only
            slot = min(range(2), key=lambda k: slots[k])
            start = max(ready, slots[slot])
            parts = [size] if lowrank is None or step < opts.powersgd_start_iter else [n for n in lowrank if n]
            for part in parts:
                start = gloo_all_reduce(sim, world, element * part, start, "ddp")
                add_bytes(total, _ring_bytes(net, world, element * part, ("rs", "ag"), t.segment_bytes))
            slots[slot] = start
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


# --- pipeline -------------------------------------------------------------------------------------------------

def pipeline(m: CellModel) -> Prediction:
    """Every stage runs its schedule's operations in order; an operation starts when its stage is free and its
    input has arrived. Receives are posted when their operation is next (or all at the step's start with the
    overlap schedule), so a late one costs the rendezvous. Each stage's step ends with its sends done and the
    gradient all-reduce over its DC's replicas."""
    opts, net, t = m.opts, m.network, m.transport
    sim = Sim(net, t)
    cfg = shapes.config(opts)
    p = len(net.sizes)
    v = opts.virtual_chunks if opts.schedule == "interleaved-1f1b" else 1
    mb = opts.micro_batches
    per_chunk = m.compute_s / (p * v)
    fwd, bwd = per_chunk * (1 - BACKWARD_SHARE), per_chunk * BACKWARD_SHARE
    lookahead = overlap_lookahead(opts.lookahead, m.link_rtt_s, m.compute_s / p if opts.synthetic else 0.0, p, mb) \
        if opts.schedule == "overlap" else 0
    ops = [schedule_ops(opts.schedule, p, s, mb, v, lookahead) for s in range(p)]
    act = shapes.activation_bytes(cfg, opts.micro_batch)
    pipelines = max(net.sizes)
    runs = [max(1, -(-pipelines // net.sizes[s])) for s in range(p)]  # replicas a rank of stage s runs in turn
    stage_rank = [net.dc_start(s) for s in range(p)]
    chunk_params = shapes.chunk_parameters(cfg, p * v)
    stage_params = [sum(chunk_params[s + k * p] for k in range(v)) for s in range(p)]
    last_chunk = p * v - 1
    overlap = opts.schedule == "overlap"
    clocks = [0.0] * p
    free: dict = {}
    walls, bubbles, spans, exposed_all = [], [], [], []
    link: dict[str, float] = {}
    for g in range(last_chunk):  # every replica sends each micro-batch's activations forward and gradients back
        a, b = stage_rank[g % p], stage_rank[(g + 1) % p]
        add_bytes(link, p2p_link_bytes(net, a, b, act), mb * pipelines)
        add_bytes(link, p2p_link_bytes(net, b, a, act), mb * pipelines)
    for _step in range(opts.steps):
        starts = list(clocks)
        arrive: dict[tuple, float] = {}  # (global chunk, mb, backward) -> arrival of its input at that chunk's stage
        sent: dict[tuple, float] = {}  # (global chunk, mb, backward) -> when its input was sent
        ends, span, exposed_step, bubble_step = [0.0] * p, [0.0] * p, [0.0] * p, [0.0] * p
        for replica in range(max(runs)):
            # one replica's schedule on every stage, simulated by sweeping until every operation has run
            position = [0] * p
            time = [clocks[s] for s in range(p)]
            active = [replica < runs[s] for s in range(p)]
            posted: dict[tuple, float] = {}
            sends_done = [0.0] * p  # a stage's schedule ends when its last send has left (the rank waits for it)
            if overlap:
                for s in range(p):
                    for kind, k, micro in ops[s]:
                        g = s + k * p
                        if (kind == "F" and g > 0) or (kind == "B" and g < last_chunk):
                            posted[(g, micro, kind == "B")] = time[s]
            progress = True
            compute_total = [0.0] * p
            while progress:
                progress = False
                for s in range(p):
                    if not active[s] or position[s] >= len(ops[s]):
                        continue
                    kind, k, micro = ops[s][position[s]]
                    g = s + k * p
                    need = (g, micro, kind == "B") if (kind == "F" and g > 0) or (kind == "B" and g < last_chunk) \
                        else None
                    if need is not None:
                        if need not in sent:
                            continue  # its producer has not run yet
                        if need not in arrive:
                            src_stage = (g - 1) % p if kind == "F" else (g + 1) % p
                            post = posted.get(need, time[s])
                            if src_stage == s:
                                arrive[need] = sent[need]
                            else:
                                leave, arrival = transfer(sim, stage_rank[src_stage], stage_rank[s], act, sent[need],
                                                          post, ("p2p", min(src_stage, s), max(src_stage, s)), free)
                                arrive[need] = arrival
                                sends_done[src_stage] = max(sends_done[src_stage], leave)
                        begin = max(time[s], arrive[need])
                    else:
                        begin = time[s]
                    duration = fwd if kind == "F" else bwd
                    time[s] = begin + duration
                    compute_total[s] += duration
                    if kind == "F" and g < last_chunk:
                        sent[(g + 1, micro, False)] = time[s]
                    if kind == "B" and g > 0:
                        sent[(g - 1, micro, True)] = time[s]
                    position[s] += 1
                    progress = True
            for s in range(p):
                if active[s]:
                    time[s] = max(time[s], sends_done[s])
                    span[s] += time[s] - clocks[s]
                    bubble_step[s] += max(0.0, time[s] - clocks[s] - compute_total[s])
                    clocks[s] = time[s]
            arrive.clear()
            sent.clear()
        for s in range(p):
            dc = list(range(net.dc_start(s), net.dc_start(s) + net.sizes[s]))
            done = gloo_all_reduce(sim, dc, 4 * stage_params[s], clocks[s], ("dp", s)) if len(dc) > 1 else clocks[s]
            exposed_step[s] = done - clocks[s]
            clocks[s] = done
            ends[s] = done
        walls.append(max(ends[s] - starts[s] for s in range(p)))
        bubbles.append(sum(bubble_step) / p)
        spans.append(sum(span) / p)
        exposed_all.append(sum(exposed_step) / p)
    compute = m.compute_s * mb * max(runs) / p
    bubble, span = _measured(m, bubbles), _measured(m, spans)
    tokens = pipelines * opts.micro_batch * mb * cfg.seq_len
    hops = sum(net.path(s, s + 1).latency for s in range(p - 1))
    return Prediction("pp", _measured(m, walls), compute, _measured(m, exposed_all),
                      bubble, span, tokens, link,
                      explain=f"{opts.schedule} over {p} stages, {mb} micro-batches: bubble {bubble * 1e3:.0f} ms of a "
                              f"{span * 1e3:.0f} ms pipeline ({bubble / span:.0%}); the stage chain crosses "
                              f"{hops * 1e3:.1f} ms one way" if span > 0 else "", wire_share=sim.wire_share())


# --- DiLoCo -----------------------------------------------------------------------------------------------------

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


def diloco(m: CellModel) -> Prediction:
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
            end, link = _outer(sim, m, numel, clock, "outer", opts.outer_shard)
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


PREDICTORS: dict[str, Callable[[CellModel], Prediction]] = {
    "flat-dp": flat_dp,
    "hier-dp": hier_dp,
    "hier-dp-overlap": hier_dp_overlap,
    "pp": pipeline,
    "diloco": diloco,
    "streaming-diloco": streaming_diloco,
    "async-diloco": async_diloco,
    "ddp": ddp,
    "fsdp": fsdp,
    "hsdp": hsdp,
}


def predict(m: CellModel) -> Prediction:
    """The prediction for a cell; KeyError names a strategy the model does not cover yet."""
    try:
        predictor = PREDICTORS[m.opts.strategy]
    except KeyError:
        raise KeyError(f"the cost model has no predictor for strategy {m.opts.strategy!r} "
                       f"(covered: {', '.join(PREDICTORS)})") from None
    prediction = predictor(m)
    prediction.step_s += m.step_overhead_s
    return prediction


__all__ = ["PREDICTORS", "CellModel", "Prediction", "predict"]
