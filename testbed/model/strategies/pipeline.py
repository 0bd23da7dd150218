"""The pipeline strategy (pp): a stage per DC, its schedule simulated operation by operation."""

from __future__ import annotations

from testbed.model import shapes
from testbed.model.collectives import (
    Sim,
    add_bytes,
    gloo_all_reduce,
    p2p_link_bytes,
    transfer,
)
from testbed.model.strategies.base import BACKWARD_SHARE, CellModel, Prediction, _measured
from testbed.spec.schedules import overlap_lookahead, schedule_ops


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
