"""What every predictor is handed and returns (CellModel, Prediction), and the helpers the families share:
payload bytes of gloo's rings, the inter-DC step of a data-parallel strategy, when backward makes each bucket
ready, averages over the measured steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.model import shapes
from testbed.model.collectives import (
    LinkCalendar,
    Sim,
    _segment_lengths,
    add_bytes,
    gloo_all_reduce,
    gloo_ring,
    gloo_segments,
    p2p_link_bytes,
)
from testbed.model.host import HostCpu
from testbed.model.network import Network
from testbed.model.transport import Transport
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
    host_cpu: HostCpu | None = None  # the machine's CPU per message where its ranks outnumber its cores
    # (testbed.model.host; Calibration.host_cpu_term): a bound on the phases every DC runs at once; None: none

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
    comm_intra_s: float | None = None  # per step: in collectives inside one DC (the workload's comm_intra_s);
    comm_inter_s: float | None = None  # in collectives whose group spans DCs (comm_inter_s); None: not predicted

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
                  flows: int = 1, link_free: LinkCalendar | None = None) -> tuple[float, dict[str, float]]:
    """The inter-DC (or flat) step of a DP strategy, compressed or not: (end, payload bytes per direction).
    `link_free`: the directions' busy spans shared with the other collectives in flight (gloo_ring)."""
    net, t = sim.network, sim.transport
    if codec == "none":
        return (gloo_all_reduce(sim, ranks, 4 * numel, start, key, flows, link_free),
                _all_reduce_bytes(net, ranks, 4 * numel, t))
    end, link = start, {}
    for index, part in enumerate(_compressed_parts(numel, codec)):
        end = gloo_ring(sim, ranks, part * len(ranks), end, (key, index), ("ag",), flows, link_free)
        add_bytes(link, _ring_bytes(net, ranks, part * len(ranks), ("ag",), t.segment_bytes))
    return end, link


class GlooWorkers:
    """ProcessGroupGloo's two worker threads: two works in flight at once, the next on the one free first."""

    def __init__(self, free_at: float = 0.0) -> None:
        self.free = [free_at, free_at]

    def start(self, ready: float) -> tuple[int, float]:
        """(worker, when a work ready at `ready` starts on it)."""
        worker = min(range(2), key=self.free.__getitem__)
        return worker, max(ready, self.free[worker])

    def done(self, worker: int, end: float) -> None:
        self.free[worker] = end


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
