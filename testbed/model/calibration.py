"""Calibration: the transport's machine-dependent parameters and the compute per micro-batch, fitted to
micro-benchmarks measured over the real links (testbed.workload.calibrate, run by `testbed calibrate` and at
the start of every `testbed run`), stored as a JSON file that `plan` and `whatif` accept.

Fit: every measured operation (all-reduce over all ranks, over the inter-DC groups one or several lanes at a
time, reduce-scatter and all-gather inside a DC, a send and its acknowledgement between neighbouring DCs; at
a few sizes; after an idle gap and back to back) is simulated with the same collectives the strategies use
(testbed.model.collectives), and the free parameters (per-call and per-segment overhead, the rate of unshaped
paths, the share of a shaped rate TCP payload gets) are chosen by coordinate search to minimise the squared
log error. Bytes: the kernel counters of the benchmark over its payload give the header and control overhead.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testbed.model.collectives import (
    MESSAGE_BYTES,
    Sim,
    gloo_all_gather,
    gloo_all_reduce,
    gloo_reduce_scatter,
    notify,
    transfer,
)
from testbed.model.host import HostCpu
from testbed.model.network import Network, build_network
from testbed.model.transport import Connections, Transport
from testbed.spec.topology import Topology

FORMAT = "testbed-calibration/1"
GRID = {
    "efficiency": [0.3 + 0.025 * i for i in range(29)],
    "local_bandwidth": [10 ** (8.0 + 0.125 * i) for i in range(21)],
    "op_overhead": [0.0, 1e-4, 2e-4, 4e-4, 7e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 8e-3],
    "message_overhead": [0.0, 2e-5, 5e-5, 1e-4, 2e-4, 4e-4, 8e-4, 1.5e-3, 2.5e-3, 4e-3, 6e-3, 9e-3],
    "late_receive": [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0],
}


class CalibrationError(ValueError):
    """A calibration file that cannot be used; str() is one line naming the file and field."""


@dataclass(frozen=True)
class ComputeProfile:
    preset: str
    micro_batch: int
    seq_len: int
    seconds: float  # forward+backward of one micro-batch of the whole model, every rank computing at once
    # (the slowest rank's: compute_profiles)
    concurrent_ranks: int
    # each optimizer's step over the whole model straight after it ("adamw", "sgd"; the slowest rank's); none in
    # calibrations from before 2026-11-27
    optimizer_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Calibration:
    transport: Transport = field(default_factory=Transport)
    compute: list[ComputeProfile] = field(default_factory=list)
    fit: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)  # topology, links, probe, machine, date
    # what a message costs the machine's CPU when its ranks outnumber its cores (testbed.model.host), measured
    # apart by bench/message_cost.py --calibration FILE; None in calibrations `testbed calibrate` writes (its
    # micro-benchmark does not outnumber the cores) and in those from before 2026-11-29: no such bound then
    host_cpu: HostCpu | None = None

    @property
    def calibrated(self) -> bool:
        return bool(self.fit)

    def compute_seconds(self, preset: str, micro_batch: int, seq_len: int) -> float | None:
        for profile in self.compute:
            if (profile.preset, profile.micro_batch, profile.seq_len) == (preset, micro_batch, seq_len):
                return profile.seconds
        same = [p for p in self.compute if p.preset == preset and p.seq_len == seq_len]
        if same:  # compute grows with the samples of a micro-batch: scale the nearest profile
            nearest = min(same, key=lambda p: abs(p.micro_batch - micro_batch))
            return nearest.seconds * micro_batch / nearest.micro_batch
        return None

    def optimizer_seconds(self, preset: str, seq_len: int, optimizer: str) -> float | None:
        """One step of `optimizer` over the whole model (it does not depend on the micro-batch): the profile's."""
        for profile in self.compute:
            if (profile.preset, profile.seq_len) == (preset, seq_len) and optimizer in profile.optimizer_seconds:
                return profile.optimizer_seconds[optimizer]
        return None

    def host_cpu_term(self) -> HostCpu | None:
        """The host CPU bound for predictions with this calibration: its `host_cpu`, where that was measured on a
        machine of the calibration's own core count (source host_cpus; a measurement of another machine does not
        apply), else None."""
        host = self.host_cpu
        cpus = self.source.get("host_cpus")
        if host is None or (cpus is not None and int(cpus) != host.cores):
            return None
        return host

    def to_dict(self) -> dict[str, Any]:
        out = {"format": FORMAT, "transport": self.transport.to_dict(),
               "compute": [vars(p) for p in self.compute], "fit": self.fit, "samples": self.samples,
               "source": self.source}
        if self.host_cpu is not None:
            out["host_cpu"] = self.host_cpu.to_dict()
        return out

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def load_calibration(path: str | Path) -> Calibration:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise CalibrationError(f"{path}: cannot read ({error.strerror or error})") from None
    except ValueError as error:
        raise CalibrationError(f"{path}: not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CalibrationError(f"{path}: format: expected {FORMAT!r} (a file written by `testbed calibrate`)")
    try:
        transport = Transport.from_dict(data["transport"])
        compute = [ComputeProfile(**item) for item in data.get("compute", [])]
    except (KeyError, TypeError) as error:
        raise CalibrationError(f"{path}: transport/compute: malformed ({error})") from None
    try:
        host = HostCpu.from_dict(data["host_cpu"]) if data.get("host_cpu") is not None else None
    except (KeyError, TypeError, ValueError) as error:
        raise CalibrationError(f"{path}: host_cpu: malformed ({error})") from None
    return Calibration(transport, compute, data.get("fit", {}), data.get("samples", []), data.get("source", {}),
                       host)


# --- the reference calibrations shipped in the package ----------------------------------------------------------

REFERENCE_DIR = Path(__file__).parent / "reference"  # package data: what `plan` uses when the user has none


def reference_calibrations() -> list[tuple[Path, Calibration]]:
    """Every shipped reference calibration (measured by `testbed calibrate` on a named machine), by file name."""
    return [(path, load_calibration(path)) for path in sorted(REFERENCE_DIR.glob("*.json"))]


def reference_for(preset: str | None, micro_batch: int | None, seq_len: int | None) -> tuple[Path, Calibration]:
    """The reference calibration whose compute profile is this workload's (else one of the same preset and sequence
    length, scaled by the micro-batch; else the first)."""
    shipped = reference_calibrations()

    def rank(item: tuple[Path, Calibration]) -> int:
        profiles = [(p.preset, p.micro_batch, p.seq_len) for p in item[1].compute]
        if (preset, micro_batch, seq_len) in profiles:
            return 0
        return 1 if any(p[0] == preset and p[2] == seq_len for p in profiles) else 2

    return min(shipped, key=rank)


def provenance(calibration: Calibration) -> str:
    """Where and when a calibration was measured, in one line: 'measured 2026-11-28 11:42 UTC on <machine>'."""
    source = calibration.source
    when = source.get("measured") or source.get("created")
    try:
        when = datetime.fromisoformat(when).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if when else None
    except ValueError:
        pass
    reference = source.get("reference") or {}
    machine = reference.get("machine") or ", ".join(
        part for part in (f"{source['host_cpus']} CPUs" if source.get("host_cpus") else "",
                          f"kernel {source['kernel']}" if source.get("kernel") else "",
                          f"{source.get('backend')} {source.get('shaper')}" if source.get("backend") else "") if part)
    commit = f", commit {reference['commit']}" if reference.get("commit") else ""
    return f"measured {when or 'at an unknown date'} on {machine or 'an unnamed machine'}{commit}"


def model_error(calibration: Calibration) -> float | None:
    """The calibration's own median error (|predicted/measured - 1| over its micro-benchmarks): predictions that
    differ by less than this are within the model's error."""
    value = calibration.fit.get("median_abs_error")
    return float(value) if value is not None else None


# --- from the benchmark's records to samples -------------------------------------------------------------------

def samples_from_records(records: Iterable[dict], shared_clock: bool = True) -> list[dict[str, Any]]:
    """One sample per measured operation: from the last rank entering it to the last rank leaving it (ranks on
    one host share CLOCK_MONOTONIC); on hosts of their own, the longest any rank spent in it."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        if record.get("event") != "op":
            continue
        key = (record["op"], record["group"], record["bytes"], record.get("concurrency", 1), record["mode"],
               record["rep"], record.get("pair", 0))
        groups.setdefault(key, []).append(record)
    out = []
    for (op, group, nbytes, concurrency, mode, rep, pair), items in sorted(groups.items(), key=lambda kv: str(kv[0])):
        items = [r for r in items if r["rank"] in r.get("ranks", [r["rank"]])] or items  # p2p: its two ranks
        start, end = max(r["start"] for r in items), max(r["end"] for r in items)
        sample = {"op": op, "group": group, "bytes": nbytes, "concurrency": concurrency, "mode": mode, "rep": rep,
                  "pair": pair, "late_s": items[0].get("late_s"),
                  "seconds": end - start if shared_clock else max(r["end"] - r["start"] for r in items),
                  "ranks": len(items)}
        if shared_clock:  # where it ran on the benchmark's clock: the gaps between operations are measured
            sample.update(start=start, end=end)
            if all("synced" in r for r in items):
                sample["synced"] = max(r["synced"] for r in items)
        out.append(sample)
    return out


def compute_profiles(records: Iterable[dict]) -> list[ComputeProfile]:
    """One profile per (preset, micro-batch, sequence length). Where every rank recorded its repetitions (all
    ranks starting each one at one instant), per repetition the slowest rank's time, then the median over the
    repetitions: what gates a synchronous step while the ranks share this machine's cores. Older records (each
    rank's own median only, ranks not started together): the median over ranks. Each optimizer's step likewise
    (per repetition the slowest rank's, the median over them)."""
    by_key: dict[tuple, list[dict]] = {}
    for record in records:
        if record.get("event") == "compute":
            by_key.setdefault((record["preset"], record["micro_batch"], record["seq_len"]), []).append(record)
    out = []
    for (preset, micro_batch, seq_len), items in by_key.items():
        reps = [item.get("reps") or [] for item in items]
        count = min(len(r) for r in reps)
        if count:
            seconds = statistics.median(max(r[i] for r in reps) for i in range(count))
        else:
            seconds = statistics.median(item["seconds"] for item in items)
        optimizer = {}
        for name in sorted({name for item in items for name in item.get("optimizer_reps") or {}}):
            runs = [(item.get("optimizer_reps") or {}).get(name) or [] for item in items]
            count = min(len(r) for r in runs)
            if count:
                optimizer[name] = statistics.median(max(r[i] for r in runs) for i in range(count))
        out.append(ComputeProfile(preset, micro_batch, seq_len, seconds,
                                  items[0].get("concurrent_ranks", len(items)), optimizer))
    return out


# --- the model of each benchmark operation -----------------------------------------------------------------------

def _predict_pair(network: Network, transport: Transport, sample: dict[str, Any],
                  idle: float = 0.5) -> tuple[float, float]:
    """(cold, warm) seconds of one measured operation where the benchmark's clock is unknown (hosts of their
    own): its connections were last used by the previous operation of the same kind (primed here), then idle
    for `idle` s before the cold run; the warm run follows straight after on the same connections."""
    sim = Sim(network, transport, Connections(transport))
    clock = _one(sim, sample, 0.0) + idle
    out = []
    for _ in ("cold", "warm"):
        out.append(_one(sim, sample, clock) - clock)
        clock += out[-1] + 1e-3
    return out[0], out[1]


def _one(sim: Sim, sample: dict[str, Any], start: float) -> float:
    """When one benchmark operation started at `start` ends; on the connections of its process group (the
    default group's for send/recv, one group for a DC's reduce-scatter and all-gather), as the benchmark ran it."""
    net = sim.network
    op, group, nbytes = sample["op"], sample["group"], int(sample["bytes"])
    n = min(net.sizes)
    dc0 = list(range(net.sizes[0]))
    if op == "all_reduce" and group == "world":
        return gloo_all_reduce(sim, list(range(net.world)), nbytes, start, "world")
    if op == "all_reduce" and group == "inter":
        c = int(sample.get("concurrency", 1))
        piece = max(4, nbytes // c)
        ends = [gloo_all_reduce(sim, net.inter_groups()[0], piece, start, ("lane", i), flows=n * c) for i in range(c)]
        return max(ends)
    if op == "reduce_scatter":
        return gloo_reduce_scatter(sim, dc0, nbytes, start, "intra")
    if op == "all_gather":
        return gloo_all_gather(sim, dc0, nbytes, start, "intra")
    if op in ("send_recv", "send_recv_late"):
        pair = int(sample.get("pair", 0))
        src, dst = net.dc_start(pair), net.dc_start(pair + 1)
        posted = start + (float(sample.get("late_s", 0.05)) if op == "send_recv_late" else 0.0)
        leave, arrival = transfer(sim, src, dst, nbytes, start, posted, "world")
        _, back = transfer(sim, dst, src, 4, arrival, leave, "world")
        return back
    raise ValueError(f"unknown benchmark operation {op}/{group}")


def _predict_timeline(network: Network, transport: Transport, samples: list[dict[str, Any]],
                      sim: Sim | None = None) -> list[float]:
    """Seconds of every operation, simulated in the order the benchmark ran them on one set of connections,
    each after the idle gap measured before it: a connection's window is what the operations before it left
    (TCP restarts it after an idle period longer than its retransmission timeout). `sim`: simulate on it (to read
    its connections after)."""
    sim = sim or Sim(network, transport, Connections(transport))
    out = [0.0] * len(samples)
    clock, previous_end = 0.0, None
    control = _control_pairs(network.world)
    for index in sorted(range(len(samples)), key=lambda i: samples[i]["start"]):
        sample = samples[index]
        if previous_end is not None:
            gap = max(0.0, sample["start"] - previous_end)
            synced = min(gap, max(0.0, sample.get("synced", previous_end) - previous_end))  # into the gap
            for src, dst in control:  # the barrier's and the start broadcast's messages, before the idle gap
                notify(sim, "world", src, dst, clock + synced)
            clock += gap
        end = _one(sim, sample, clock)
        out[index], clock, previous_end = end - clock, end, sample["end"]
    return out


def _control_pairs(world: int) -> list[tuple[int, int]]:
    """(sender, receiver) of the messages the benchmark itself sends on the default group before each operation:
    gloo's dissemination barrier (rank r -> r + 2^k) and its binomial-tree broadcast of the start from rank 0."""
    pairs = {(r, (r + d) % world) for d in (2 ** k for k in range(max(1, world).bit_length())) if d < world
             for r in range(world)}
    mask = 1
    while mask < world:
        mask <<= 1
    while mask > 1:
        mask >>= 1
        pairs |= {(r, r + mask) for r in range(0, world, 2 * mask) if r + mask < world}
    return sorted(pairs)


def predict_samples(network: Network, transport: Transport, samples: list[dict[str, Any]]) -> list[float]:
    if samples and all("start" in sample for sample in samples):
        return _predict_timeline(network, transport, samples)
    cache: dict[tuple, tuple[float, float]] = {}
    out = []
    for sample in samples:
        key = (sample["op"], sample["group"], sample["bytes"], sample.get("concurrency", 1), sample.get("pair", 0))
        if key not in cache:
            cache[key] = _predict_pair(network, transport, sample)
        out.append(cache[key][0 if sample["mode"] == "cold" else 1])
    return out


def _loss(network: Network, transport: Transport, samples: list[dict[str, Any]]) -> float:
    predicted = predict_samples(network, transport, samples)
    return sum(math.log(max(p, 1e-6) / max(s["seconds"], 1e-6)) ** 2 for p, s in zip(predicted, samples))


def fit_transport(network: Network, samples: list[dict[str, Any]], start: Transport | None = None,
                  rounds: int = 3) -> tuple[Transport, dict[str, Any]]:
    """Coordinate search over the free parameters (GRID); returns the fitted transport and its errors."""
    transport = start or Transport()
    best = _loss(network, transport, samples)
    for _ in range(rounds):
        improved = False
        for name, values in GRID.items():
            for value in values:
                candidate = replace(transport, **{name: value})
                loss = _loss(network, candidate, samples)
                if loss < best - 1e-12:
                    best, transport, improved = loss, candidate, True
        if not improved:
            break
    predicted = predict_samples(network, transport, samples)
    errors = [p / s["seconds"] - 1 for p, s in zip(predicted, samples) if s["seconds"] > 0]
    for sample, value in zip(samples, predicted):
        sample["predicted"] = value
    summary = {"samples": len(samples), "median_abs_error": _quantile([abs(e) for e in errors], 0.5),
               "p90_abs_error": _quantile([abs(e) for e in errors], 0.9), "loss": best,
               "fitted": {name: getattr(transport, name) for name in GRID}}
    return transport, summary


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def benchmark_payload(network: Network, transport: Transport, samples: list[dict[str, Any]]) -> float:
    """Payload bytes the benchmark's operations put on the inter-DC links (closed forms), summed."""
    from testbed.model.strategies import _all_reduce_bytes

    total = 0.0
    n = min(network.sizes)
    for sample in samples:
        op, group, nbytes = sample["op"], sample["group"], int(sample["bytes"])
        if op == "all_reduce" and group == "world":
            total += sum(_all_reduce_bytes(network, list(range(network.world)), nbytes, transport).values())
        elif op == "all_reduce" and group == "inter":
            c = int(sample.get("concurrency", 1))
            piece = max(4, nbytes // c)
            total += n * c * sum(_all_reduce_bytes(network, network.inter_groups()[0], piece, transport).values())
        elif op in ("send_recv", "send_recv_late") and len(network.sizes) > 1:
            pair = int(sample.get("pair", 0))
            total += (nbytes + MESSAGE_BYTES) * len(network.path(pair, pair + 1).hops) + \
                (4 + MESSAGE_BYTES) * len(network.path(pair + 1, pair).hops)
    return total


def benchmark_wire_share(network: Network, transport: Transport, samples: list[dict[str, Any]]) -> float:
    """The headers of the TSO units the benchmark's simulated sends were cut into (beyond each message's first),
    per payload byte over every inter-DC link direction; 0 where the records have no timeline to simulate."""
    if not samples or not all("start" in sample for sample in samples):
        return 0.0
    sim = Sim(network, transport, Connections(transport))
    _predict_timeline(network, transport, samples, sim)
    per_hop = sim.wire_bytes().values()
    sent = sum(sent for _, sent in per_hop)
    return sum(extra for extra, _ in per_hop) / sent if sent > 0 else 0.0


def fit(topology: Topology, measured: dict[str, Any], ranks_per_node: int = 1) -> Calibration:
    """A Calibration from what testbed.runner.calibrate.measure returned."""
    rtts = {(p["src"], p["dst"]): p["rtt_p50_ms"] / 1e3 for p in measured.get("probe", [])
            if p.get("rtt_p50_ms") is not None}
    network = build_network(topology, measured["link_params"], ranks_per_node, rtts)
    samples = samples_from_records(measured["records"], measured.get("shared_clock", True))
    transport, summary = fit_transport(network, samples)
    payload = benchmark_payload(network, transport, samples)
    kernel = sum(v.get("tx_bytes", 0) for v in measured.get("link_bytes", {}).values())
    if payload > 0 and kernel > 0:
        units = benchmark_wire_share(network, transport, samples)
        transport = replace(transport, wire_overhead=kernel / payload - 1 - units)
        summary["bytes"] = {"kernel": kernel, "payload": payload, "overhead": kernel / payload - 1,
                            "tso_units": units, "residual": kernel / payload - 1 - units}
    source = {"topology": topology.name, "links": measured.get("links"), "link_params": measured.get("link_params"),
              "probe": measured.get("probe"), "world": measured.get("world"),
              "created": datetime.now(UTC).isoformat(), **measured.get("machine", {})}
    return Calibration(transport, compute_profiles(measured["records"]), summary, samples, source)
