"""The dimensionless groups of a training step across DCs (Buckingham pi), at full scale (a scenario's point) and
in a laptop-scale cell: what two systems must share to behave alike.

- inter_transfer_over_compute: the inter-DC bytes of a synchronisation over the rate the transport gets, over the
  compute they sync (a step's; DiLoCo's: the H inner steps of an outer step, its exchange as whatif has it);
- intra_transfer_over_compute: the same for the phases inside a DC (hierarchical strategies);
- rtt_over_compute: the inter-DC round trip over a step's compute (a pipeline's: over one micro-batch's);
- latency_steps: the one-way latencies a step's inter-DC collective pays in sequence;
- window_over_bdp: bytes the crossing flows keep in flight over the link's bandwidth-delay product (< 1: the flows,
  not the line, set the rate);
- exposed_over_compute: the exposed communication over compute, 1/efficiency - 1 (the result the others make);
- structure: buckets, inner_steps (H), fragments, overlap_steps, micro_batches, stages: the overlap structure.
"""

from __future__ import annotations

from testbed.model.collectives import gloo_segments, ring_all_reduce_factor
from testbed.model.transport import Transport
from testbed.model.whatif import compute_seconds, evaluate_point, outer_exchange
from testbed.spec.scenario import Scenario, ScenarioStrategy
from testbed.spec.units import fibre_delay

TRANSFER = ("inter_transfer_over_compute", "intra_transfer_over_compute", "rtt_over_compute", "latency_steps",
            "window_over_bdp", "exposed_over_compute")
STRUCTURE = ("buckets", "inner_steps", "fragments", "overlap_steps", "micro_batches", "stages")
DILOCOS = ("diloco", "streaming-diloco")
PIPELINES = ("pp-across", "pp-across-overlap")
HIERARCHICAL = ("hier-dp", "hier-dp-overlap")


def structure(kind: str, buckets: int, inner_steps: int, fragments: int, overlap_steps: int, micro_batches: int,
              stages: int) -> dict[str, float]:
    """The overlap-structure groups a kind has (only those)."""
    out: dict[str, float] = {}
    if kind == "hier-dp-overlap":
        out["buckets"] = buckets
    if kind in DILOCOS:
        out["inner_steps"] = inner_steps
    if kind == "streaming-diloco":
        out["fragments"], out["overlap_steps"] = fragments, overlap_steps
    if kind in PIPELINES:
        out["micro_batches"], out["stages"] = micro_batches, stages
    return out


def full_scale(s: Scenario, strategy: ScenarioStrategy, distance: float, bandwidth: float) -> dict[str, float]:
    """The groups of `strategy` at a scenario's point, by the closed forms testbed.model.whatif uses."""
    kind = strategy.kind
    tc = compute_seconds(s)
    rtt = 2 * fibre_delay(distance)
    m, par, t = s.model, s.parallelism, s.transport
    d, n, shards = s.dcs, s.replicas_per_dc, par.tp * par.pp
    channels = strategy.channels or t.channels
    line = bandwidth / 8 * t.efficiency
    model_bytes = m.parameters * m.bytes_per_gradient
    groups: dict[str, float] = {}
    if kind in PIPELINES:
        mb = par.micro_batches
        pipelines = n * d
        act = s.global_batch_tokens / (pipelines * mb) * m.hidden * 2
        flows = pipelines * par.tp * channels
        per_transfer = pipelines * act / min(line, flows * t.window / rtt if rtt else line)
        t_mb = tc / (mb + par.pp - 1)
        groups["inter_transfer_over_compute"] = per_transfer / t_mb
        groups["rtt_over_compute"] = rtt / t_mb
        groups["latency_steps"] = (2 * mb if kind == "pp-across" else 2) * (d - 1)
    else:
        flat = kind == "flat-dp"
        per_direction = ring_all_reduce_factor(n * d if flat else d) * model_bytes
        flows = shards * channels * (1 if flat else n)
        rate = min(line, flows * t.window / rtt) if rtt else line
        if kind in DILOCOS:  # the round's outer exchange as whatif has it: its precision, top-k, ring or store
            transfer = outer_exchange(s, strategy, distance, bandwidth)[0]
            groups["inter_transfer_over_compute"] = transfer / (tc * strategy.inner_steps)
        else:
            groups["inter_transfer_over_compute"] = per_direction / rate / tc
        groups["rtt_over_compute"] = rtt / tc
        groups["latency_steps"] = (2 * (n * d - 1) / t.depth) if flat else 2 * (d - 1)
        if kind in HIERARCHICAL and n > 1:
            shard = model_bytes / shards
            groups["intra_transfer_over_compute"] = 2 * (n - 1) / n * shard / (s.intra.bandwidth / 8) / tc
    groups["window_over_bdp"] = flows * t.window / (line * rtt) if rtt else float("inf")
    point = evaluate_point(s, strategy, distance, bandwidth)
    groups["exposed_over_compute"] = point.exposed_s / tc
    groups.update(structure(kind, strategy.buckets, strategy.inner_steps, strategy.fragments, strategy.overlap_steps,
                            par.micro_batches, d if kind in PIPELINES else 1))
    return groups


def cell_groups(kind: str, *, numel: int, nodes: int, dcs: int, step_compute_s: float, mb_compute_s: float,
                rtt_s: float, bandwidth: float, transport: Transport, exposed_s: float,
                activation_bytes: int, micro_batches: int, structure_groups: dict[str, float]) -> dict[str, float]:
    """The same groups for a laptop-scale cell: gloo's ring over TCP (testbed.model.transport). Its flows keep
    `in_flight` segments of at most `segment_bytes` in flight (the rendezvous): gloo's own window."""
    t = transport
    line = bandwidth / 8 * t.efficiency
    groups: dict[str, float] = {}
    if kind in PIPELINES:
        flows = 1
        window = activation_bytes
        groups["inter_transfer_over_compute"] = activation_bytes / line / mb_compute_s
        groups["rtt_over_compute"] = rtt_s / mb_compute_s
        groups["latency_steps"] = (2 * micro_batches if kind == "pp-across" else 2) * (dcs - 1)
    else:
        flat = kind == "flat-dp"
        ranks = nodes * dcs if flat else dcs
        payload = 4 * numel if flat else 4 * numel // nodes
        count, size = gloo_segments(payload, ranks, cap=t.segment_bytes)
        flows = 1 if flat else nodes
        window = t.in_flight * size
        per = structure_groups.get("inner_steps", 1)
        rate = min(line, flows * window / rtt_s) if rtt_s else line
        groups["inter_transfer_over_compute"] = ring_all_reduce_factor(ranks) * payload * flows / rate / (
            step_compute_s * per)
        groups["rtt_over_compute"] = rtt_s / step_compute_s
        groups["latency_steps"] = 2 * (count - count // ranks) / t.in_flight if flat else 2 * (dcs - 1)
        if kind in HIERARCHICAL and nodes > 1:
            groups["intra_transfer_over_compute"] = (2 * (nodes - 1) / nodes * 4 * numel / (t.local_bandwidth / 8)
                                                     / step_compute_s)
    groups["window_over_bdp"] = flows * window / (line * rtt_s) if rtt_s else float("inf")
    groups["exposed_over_compute"] = exposed_s / step_compute_s
    groups.update(structure_groups)
    return groups
