"""What-if at real scale: predicted scaling efficiency of each strategy against the distance and the inter-DC
bandwidth between two (or more) DCs, for a scenario file (testbed.spec.scenario).

Closed forms, one per strategy, over: compute per step (6N + attention FLOPs per token over GPUs x peak x MFU,
the single-site step), the gradient bytes, the inter-DC link's rate as the transport can use it (every group
crossing it runs `channels` flows of at most `window` bytes in flight per round trip: NCCL's buffers or TCP's
window), and its latency
(fibre: 4.9 us per km one way). Efficiency = single-site step / step (NeMo's definition: the same job in one DC).
The emulator validates the same structure cell by cell at small scale (testbed.model.strategies); these forms
extrapolate it, and their assumptions are the scenario's, listed in its file.

Two figures per point, named apart: compute utilisation (time computing / wall time: the DiLoCo papers',
INTELLECT-1's) and efficiency against one site (NeMo's). The single-site step here is compute at the MFU (intra-DC
communication folded into it), so the two coincide; a scenario's `published_figures` say which one a source gave.
DiLoCo's outer sync may carry quantised or top-k pseudo-gradients, start layer by layer during the last inner
step's backward (testbed.model.outer), and run over a ring of replicas whose slowest hop bounds it, or go
through object storage (each replica uploads once and downloads the payloads it gathers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.model.collectives import ring_all_reduce_factor, windowed_rate
from testbed.model.labels import distance_label, duration_label, rate_label
from testbed.model.outer import dag_exposed, outer_bytes
from testbed.spec.scenario import Scenario, ScenarioStrategy
from testbed.spec.units import fibre_delay

BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class Point:
    strategy: str
    kind: str
    distance_km: float
    bandwidth_gbit: float
    step_s: float
    single_site_s: float
    exposed_s: float
    inter_dc_gbit_per_step: float
    note: str = ""
    compute_s: float | None = None  # time computing per step (default: the single-site step)

    @property
    def efficiency(self) -> float:
        """Throughput against the same job on one site (NeMo's scaling efficiency)."""
        return self.single_site_s / self.step_s

    @property
    def compute_utilisation(self) -> float:
        """Time computing over wall time (the DiLoCo papers', INTELLECT-1's, Covenant's)."""
        return (self.single_site_s if self.compute_s is None else self.compute_s) / self.step_s


METRIC_TEXT = {"compute_utilisation": "compute utilisation (time computing / wall time)",
               "efficiency": "efficiency (throughput / single-site throughput)",
               "bandwidth_for_utilisation": "inter-DC bandwidth for a compute utilisation"}


def compute_seconds(s: Scenario) -> float:
    """The single-site step: the scenario's published step_seconds, else the step's training FLOPs over every GPU
    at its peak times the MFU."""
    if s.step_seconds is not None:
        return s.step_seconds
    assert s.gpu is not None and s.global_batch_tokens is not None  # the scenario's schema holds it
    m = s.model
    flops_per_token = 6 * m.parameters + 12 * m.layers * m.hidden * m.seq_len
    gpus = s.gpus_per_dc * s.dcs
    return flops_per_token * s.global_batch_tokens / (gpus * s.gpu.peak_tflops * 1e12 * s.gpu.mfu)


def _rate(s: Scenario, bandwidth: float, rtt: float, streams: int) -> float:
    """Payload bytes/s the transport gets across the inter-DC link."""
    line = bandwidth / 8 * s.transport.efficiency
    return windowed_rate(line, rtt, s.transport.window, streams)


def _intra_allreduce_part(s: Scenario, nbytes: float, n: int, factor: float) -> float:
    """A reduce-scatter (factor (n-1)/n) or all-gather inside a DC over n ranks at the per-GPU intra bandwidth."""
    if n < 2:
        return 0.0
    return factor * nbytes / (s.intra.bandwidth / 8) + (n - 1) * (s.intra.latency + s.transport.intra_latency)


def _ring_seconds(s: Scenario, nbytes: float, distance: float, bandwidth: float,
                  streams: int) -> tuple[float, float]:
    """A ring all-reduce of `nbytes` over the scenario's ring of DCs: 2(n-1) steps, each moving nbytes/n over
    every hop at once, so each lasts as long as the slowest hop's latency plus transfer. (transfer, latency) s."""
    assert s.ring is not None
    n = len(s.ring)
    slowest, parts = 0.0, (0.0, 0.0)
    for hop in s.ring:
        latency = fibre_delay(distance) if hop.latency is None else hop.latency
        transfer = nbytes / n / _rate(s, bandwidth if hop.bandwidth is None else hop.bandwidth, 2 * latency, streams)
        if latency + transfer > slowest:
            slowest, parts = latency + transfer, (transfer, latency)
    return 2 * (n - 1) * parts[0], 2 * (n - 1) * parts[1]


def object_store_seconds(s: Scenario, nbytes: float, distance: float, bandwidth: float,
                         streams: int) -> tuple[float, float, float]:
    """The outer exchange through object storage: one upload of a replica's `nbytes` over its uplink, then the
    gathered payloads downloaded at once over its downlink (the store's own rate unbounded), a round trip each.
    (upload, download, latency) s."""
    store = s.object_store
    assert store is not None
    rtt = 2 * fibre_delay(distance)
    gather = store.gathered(s.dcs)
    up = _rate(s, bandwidth if store.upload is None else store.upload, rtt, streams)
    down = _rate(s, bandwidth if store.download is None else store.download, rtt, streams * gather)
    return nbytes / up, gather * nbytes / down, 2 * rtt


def outer_streams(s: Scenario, strategy: ScenarioStrategy) -> int:
    """Flows a DC's outer exchange runs at once: every replica's every model-parallel shard, `channels` each."""
    par = s.parallelism
    return s.replicas_per_dc * par.tp * par.pp * (strategy.channels or s.transport.channels)


def outer_exchange(s: Scenario, strategy: ScenarioStrategy, distance: float,
                   bandwidth: float) -> tuple[float, float, float]:
    """A DiLoCo round's outer exchange at a point: (transfer s, latency s, bytes a link direction carries): an
    all-reduce sharded over each DC's replicas, over the scenario's `ring:`, or through its `object_store:`."""
    nbytes = outer_bytes(s.model, strategy)
    streams = outer_streams(s, strategy)
    latency = fibre_delay(distance)
    if s.object_store is not None:
        upload, download, latencies = object_store_seconds(s, nbytes, distance, bandwidth, streams)
        return upload + download, latencies, s.object_store.gathered(s.dcs) * nbytes  # the direction downloading
    per_direction = ring_all_reduce_factor(s.dcs) * nbytes
    if s.ring is not None:
        return (*_ring_seconds(s, nbytes, distance, bandwidth, streams), per_direction)
    rate = _rate(s, bandwidth, 2 * latency, streams)  # the outer all-reduce sharded over the DC
    return per_direction / rate, 2 * (s.dcs - 1) * latency, per_direction


def evaluate_point(s: Scenario, strategy: ScenarioStrategy, distance: float, bandwidth: float) -> Point:
    latency = fibre_delay(distance)
    rtt = 2 * latency
    tc = compute_seconds(s)
    m, par = s.model, s.parallelism
    d = s.dcs
    shard = m.parameters * m.bytes_per_gradient / (par.tp * par.pp)  # one DP rank's gradient bytes
    n = s.replicas_per_dc
    groups = par.tp * par.pp  # model-parallel shards, each with its own DP collectives, all at once
    channels = strategy.channels or s.transport.channels
    model_bytes = m.parameters * m.bytes_per_gradient
    kind = strategy.kind
    note = ""
    if kind == "flat-dp":
        g = n * d
        per_direction = ring_all_reduce_factor(g) * model_bytes
        latency_s = 2 * (g - 1) * latency / s.transport.depth
        rate = _rate(s, bandwidth, rtt, groups * channels)  # every model-parallel shard's ring crosses
        exposed = per_direction / rate + latency_s
        step, link = tc + exposed, per_direction
        note = f"ring of {g} ranks: {latency_s:.2f} s of latency steps"
    elif kind in ("hier-dp", "hier-dp-overlap"):
        rs = _intra_allreduce_part(s, shard, n, (n - 1) / n)
        ag = rs
        per_direction = ring_all_reduce_factor(d) * model_bytes  # every shard of every group crosses once
        rate = _rate(s, bandwidth, rtt, n * groups * channels)
        inter = per_direction / rate + 2 * (d - 1) * latency
        if kind == "hier-dp":
            exposed = rs + inter + ag
        else:  # per bucket during backward; the last bucket's sync is exposed
            window = BACKWARD_SHARE * tc
            last = (rs + inter + ag) / strategy.buckets
            exposed = max(last, rs + inter + ag - window * (1 - 1 / strategy.buckets))
        step, link = tc + exposed, per_direction
        note = f"inter-DC part {inter:.2f} s at {rate * 8 / 1e9:.0f} Gbit/s usable"
    elif kind in ("pp-across", "pp-across-overlap"):
        p, mb = par.pp, par.micro_batches
        t_mb = tc / (mb + p - 1)  # one micro-batch's forward+backward on one stage (the single-site schedule)
        pipelines = n * d  # the same replicas as on one site, each with its stages split across the DCs
        tokens = s.global_batch_tokens or 0.0  # the scenario's schema requires it for a pipeline across DCs
        act = tokens / (pipelines * mb) * m.hidden * 2  # one micro-batch's activations, bf16
        link = pipelines * mb * act  # per direction: activations one way, their gradients back
        per_transfer = pipelines * act / _rate(s, bandwidth, rtt, pipelines * par.tp * channels)  # all at once
        hop = latency + per_transfer
        crossings = d - 1
        if kind == "pp-across":  # 1F1B: each micro-batch's round trip over the boundary stalls the stage
            stall = mb * 2 * hop * crossings
        else:  # GeoPipe-like: enough micro-batches in flight to cover the round trip
            lookahead = math.ceil(2 * hop / t_mb)
            stall = 2 * hop * crossings + mb * max(0.0, 2 * hop - lookahead * t_mb) * crossings
            note = f"lookahead {lookahead} micro-batches"
        exposed = stall
        step = tc + stall
    elif kind in ("diloco", "streaming-diloco"):
        transfer, latencies, per_direction = outer_exchange(s, strategy, distance, bandwidth)
        outer = transfer + latencies
        h = strategy.inner_steps
        fragments, tau = (1, 0) if kind == "diloco" else (strategy.fragments, strategy.overlap_steps)
        if strategy.outer_start == "during-backward":
            exposed = dag_exposed(outer, fragments, m.layers, tc, tau, h, BACKWARD_SHARE) / h
        elif kind == "diloco":
            exposed = outer / h
        else:
            frag = outer / strategy.fragments
            exposed = strategy.fragments * max(0.0, frag - strategy.overlap_steps * tc) / h
        step, link = tc + exposed, per_direction / h
        note = f"outer sync {outer:.1f} s every {h} steps"
    else:  # pragma: no cover - the scenario's schema lists the kinds
        raise ValueError(kind)
    return Point(strategy.name, kind, distance / 1e3, bandwidth / 1e9, step, tc, exposed, link * 8 / 1e9, note,
                 compute_s=tc)


def evaluate(s: Scenario) -> pd.DataFrame:
    """Every strategy at every swept distance (at the reference bandwidth) and bandwidth (at the reference
    distance), plus the full grid."""
    rows = []
    for strategy in s.strategies:
        for distance in s.sweep.distance:
            for bandwidth in s.sweep.bandwidth:
                p = evaluate_point(s, strategy, distance, bandwidth)
                rows.append({"strategy": p.strategy, "kind": p.kind, "distance_km": p.distance_km,
                             "bandwidth_gbit": p.bandwidth_gbit, "rtt_ms": 2 * fibre_delay(distance) * 1e3,
                             "step_s": p.step_s, "single_site_s": p.single_site_s, "efficiency": p.efficiency,
                             "compute_utilisation": p.compute_utilisation,
                             "exposed_s": p.exposed_s, "inter_dc_gbit_per_step": p.inter_dc_gbit_per_step,
                             "note": p.note})
    return pd.DataFrame(rows)


def bandwidth_for(s: Scenario, strategy: ScenarioStrategy, distance: float, target: float,
                  high: float = 1e15, metric: str = "efficiency") -> float | None:
    """The least inter-DC bandwidth (bits/s) at which `strategy` keeps `target` of `metric` (a Point property:
    efficiency or compute_utilisation) at `distance`; None if even `high` does not (latency- or window-bound)."""
    if getattr(evaluate_point(s, strategy, distance, high), metric) < target:
        return None
    low = 1e6
    for _ in range(80):
        mid = math.sqrt(low * high)
        if getattr(evaluate_point(s, strategy, distance, mid), metric) >= target:
            high = mid
        else:
            low = mid
    return high


def grid_bandwidth(s: Scenario, strategy: ScenarioStrategy, distance: float, target: float, start: float,
                   ratio: float, metric: str = "compute_utilisation") -> float | None:
    """The first point start x ratio^k of a log grid of bandwidths reaching `target` of `metric` (how the
    published tables read their bandwidths); None if none up to 1 Pbit/s does."""
    exact = bandwidth_for(s, strategy, distance, target, metric=metric)
    if exact is None:
        return None
    k = max(0, math.ceil(math.log(exact / start) / math.log(ratio) - 1e-6))
    while getattr(evaluate_point(s, strategy, distance, start * ratio ** k), metric) < target:
        k += 1
    while k > 0 and getattr(evaluate_point(s, strategy, distance, start * ratio ** (k - 1)), metric) >= target:
        k -= 1
    return start * ratio ** k


def check_figures(s: Scenario) -> list[dict[str, Any]]:
    """Each of the scenario's published figures beside the model's at the reference point: the difference (in
    points of a fraction, grid steps or a ratio of a bandwidth), the tolerance, PASS or FAIL."""
    by_name = {strategy.name: strategy for strategy in s.strategies}
    ref_d, ref_b = s.reference["distance"], s.reference["bandwidth"]
    rows = []
    for figure in s.published_figures:
        strategy = by_name[figure.strategy]
        if figure.metric == "bandwidth_for_utilisation":
            assert figure.utilisation is not None
            if figure.grid_start is not None and figure.grid_ratio is not None:
                model = grid_bandwidth(s, strategy, ref_d, figure.utilisation, figure.grid_start, figure.grid_ratio)
                off = None if model is None else round(math.log(model / figure.value) / math.log(figure.grid_ratio))
                unit = "grid steps"
                ok = off is not None and abs(off) <= figure.tolerance
            else:
                model = bandwidth_for(s, strategy, ref_d, figure.utilisation, metric="compute_utilisation")
                off = None if model is None else model / figure.value
                unit = "x"
                ok = off is not None and max(off, 1 / off) <= figure.tolerance
            shown = (f"{rate_label(figure.value)} for {figure.utilisation:.0%}",
                     "never" if model is None else rate_label(model))
        else:
            model = getattr(evaluate_point(s, strategy, ref_d, ref_b), figure.metric)
            off, unit = round((model - figure.value) * 100, 2), "points"
            ok = abs(model - figure.value) <= figure.tolerance + 1e-12
            shown = (f"{figure.value:.1%}", f"{model:.1%}")
        tolerance = figure.tolerance * 100 if unit == "points" else figure.tolerance
        rows.append({"strategy": figure.strategy, "metric": figure.metric, "utilisation": figure.utilisation,
                     "published": figure.value, "model": model, "off": off, "unit": unit, "tolerance": tolerance,
                     "verdict": "PASS" if ok else "FAIL", "source": figure.source,
                     "line": f"{'PASS' if ok else 'FAIL'} {figure.strategy}: {METRIC_TEXT[figure.metric]} "
                             f"published {shown[0]}, model {shown[1]} "
                             f"({'-' if off is None else off:} {unit} off, tolerance {tolerance:g})"})
    return rows


def distance_for(s: Scenario, strategy: ScenarioStrategy, bandwidth: float, target: float,
                 high: float = 2e7) -> float | None:
    """The longest distance (m) at which `strategy` keeps `target` efficiency at `bandwidth`; None if not even
    10 m does."""
    if evaluate_point(s, strategy, 10.0, bandwidth).efficiency < target:
        return None
    if evaluate_point(s, strategy, high, bandwidth).efficiency >= target:
        return high
    low = 10.0
    for _ in range(80):
        mid = (low + high) / 2
        if evaluate_point(s, strategy, mid, bandwidth).efficiency >= target:
            low = mid
        else:
            high = mid
    return low


def answers(s: Scenario) -> list[dict[str, Any]]:
    """Per strategy, at the reference point: efficiency, the bandwidth the target needs at the reference
    distance, and the distance it holds to at the reference bandwidth."""
    ref_d, ref_b = s.reference["distance"], s.reference["bandwidth"]
    out = []
    for strategy in s.strategies:
        p = evaluate_point(s, strategy, ref_d, ref_b)
        need = bandwidth_for(s, strategy, ref_d, s.target_efficiency)
        reach = distance_for(s, strategy, ref_b, s.target_efficiency)
        out.append({"strategy": strategy.name, "efficiency": p.efficiency,
                    "compute_utilisation": p.compute_utilisation, "step_s": p.step_s,
                    "bandwidth_for_target_gbit": None if need is None else need / 1e9,
                    "distance_for_target_km": None if reach is None else reach / 1e3, "note": p.note})
    return out


CHANGES_TRAINING = {"diloco", "streaming-diloco"}  # fewer synchronisations: a different optimiser, not just faster


def reference_text(s: Scenario) -> str:
    """The point the answers are given at: '1,000 km and 1.6 Tbit/s between the DCs (9.8 ms one way)'."""
    distance, bandwidth = s.reference["distance"], s.reference["bandwidth"]
    return (f"{distance_label(distance)} and {rate_label(bandwidth)} between the DCs "
            f"({duration_label(fibre_delay(distance))} one way)")


def recommendation(s: Scenario, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The strategy to use at the reference point: the most efficient, preferring one that keeps the training
    algorithm (DiLoCo changes the optimiser) when it also reaches the target; with a line that says so."""
    kinds = {strategy.name: strategy.kind for strategy in s.strategies}
    ranked = sorted(rows, key=lambda row: -row["efficiency"])
    exact = [row for row in ranked if kinds[row["strategy"]] not in CHANGES_TRAINING]
    chosen = ranked[0]
    if kinds[chosen["strategy"]] in CHANGES_TRAINING and exact and exact[0]["efficiency"] >= s.target_efficiency:
        chosen = exact[0]
    met = chosen["efficiency"] >= s.target_efficiency
    line = (f"recommended at {reference_text(s)}: {chosen['strategy']}, {chosen['efficiency']:.1%} of single-site "
            f"throughput ({'meets' if met else 'misses'} the {s.target_efficiency:.0%} target)")
    if kinds[chosen["strategy"]] in CHANGES_TRAINING:
        line += "; it changes the optimiser (fewer synchronisations): check the loss"
    elif not met:
        line += "; none of the strategies reaches it here"
    return {"strategy": chosen["strategy"], "efficiency": chosen["efficiency"], "meets_target": met, "line": line}


SCALE_TEXT = ("These are predictions at the scenario's scale ({params} parameters on {gpus:,} GPUs); `testbed plan` "
              "predicts the emulated cells of an experiment (a small model over this machine's links), where "
              "communication weighs differently, so the two can name different strategies.")


def scale_text(s: Scenario) -> str:
    """Why whatif and plan can disagree, with this scenario's scale."""
    params = f"{s.model.parameters / 1e9:,.0f}B" if s.model.parameters >= 1e9 else f"{s.model.parameters:,.0f}"
    return SCALE_TEXT.format(params=params, gpus=s.gpus_per_dc * s.dcs)


def calculator_outer_seconds(s: Scenario, bandwidth: float) -> float:
    """The published DiLoCo bandwidth calculators' outer-sync time: the flat-ring lower bound
    (2N bytes / W)(1 - 1/R) with R replicas (here the DCs) and no latency or window term."""
    model_bytes = s.model.parameters * s.model.bytes_per_gradient
    return 2 * model_bytes / (bandwidth / 8) * (1 - 1 / s.dcs)


CALCULATOR_TEXT = ("The calculators' outer synchronisation is the flat-ring bound (2N bytes / W)(1 - 1/R) with no "
                   "latency term; ours adds the ring's round trips and the transport's window (flows x window / RTT "
                   "caps the rate over a long link), so it needs more bandwidth for the same utilisation where the "
                   "window, not the line, is the limit; at short distances the two agree.")


def calculator_table(s: Scenario) -> pd.DataFrame:
    """Compute utilisation of every DiLoCo strategy at the reference distance against bandwidth: ours and the
    calculators' formula (plain DiLoCo: the outer sync in sequence with the inner steps)."""
    rows = []
    tc = compute_seconds(s)
    for strategy in s.strategies:
        if strategy.kind not in ("diloco", "streaming-diloco"):
            continue
        for bandwidth in s.sweep.bandwidth:
            ours = evaluate_point(s, strategy, s.reference["distance"], bandwidth).efficiency
            outer = calculator_outer_seconds(s, bandwidth)
            if strategy.kind == "diloco":
                theirs = tc / (tc + outer / strategy.inner_steps)
            else:
                frag = outer / strategy.fragments
                theirs = tc / (tc + strategy.fragments * max(0.0, frag - strategy.overlap_steps * tc) /
                               strategy.inner_steps)
            rows.append({"strategy": strategy.name, "bandwidth_gbit": bandwidth / 1e9,
                         "distance_km": s.reference["distance"] / 1e3, "utilisation_ours": ours,
                         "utilisation_calculator_formula": theirs})
    return pd.DataFrame(rows)


def answers_for_people(ans: pd.DataFrame) -> pd.DataFrame:
    """The answers as the terminal shows them: %, thousands separators, 'never' where no bandwidth or distance
    reaches the target (answers.csv keeps the numbers, empty there)."""
    def amount(value: Any, cap: float | None = None) -> str:
        if value is None or pd.isna(value):
            return "never"
        return f">= {cap:,.0f}" if cap is not None and value >= cap else f"{value:,.0f}"

    return pd.DataFrame({"strategy": ans["strategy"], "efficiency": [f"{v:.1%}" for v in ans["efficiency"]],
                         "step s": [f"{v:,.2f}" for v in ans["step_s"]],
                         "bandwidth for target (Gbit/s)": [amount(v) for v in ans["bandwidth_for_target_gbit"]],
                         "distance for target (km)": [amount(v, 20_000) for v in ans["distance_for_target_km"]],
                         "note": ans["note"]})


def write_outputs(s: Scenario, table: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """table.csv, answers.csv, efficiency.png (against distance and against bandwidth) and report.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_dir / "table.csv", index=False)
    ans = pd.DataFrame(answers(s))
    ans.to_csv(out_dir / "answers.csv", index=False)
    ref_d, ref_b = s.reference["distance"] / 1e3, s.reference["bandwidth"] / 1e9
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, group in table.groupby("strategy", sort=False):
        at_b = group[(group["bandwidth_gbit"] - ref_b).abs() < 1e-9]
        at_d = group[(group["distance_km"] - ref_d).abs() < 1e-9]
        if not at_b.empty:
            left.plot(at_b["distance_km"], at_b["efficiency"], marker="o", label=name)
        if not at_d.empty:
            right.plot(at_d["bandwidth_gbit"], at_d["efficiency"], marker="o", label=name)
    chosen = recommendation(s, ans.to_dict("records"))
    for ax, at in ((left, ref_d), (right, ref_b)):  # the reference point: where the answers and the recommendation are
        ax.axvline(at, color="black", lw=0.8, ls=":")
        ax.plot([at], [chosen["efficiency"]], marker="*", markersize=14, color="black", zorder=5,
                label=f"reference point: {chosen['strategy']} recommended")
    for ax, xlabel, title in ((left, "distance between DCs (km)",
                               f"at {rate_label(s.reference['bandwidth'])} between DCs"),
                              (right, "inter-DC bandwidth (Gbit/s)", f"at {distance_label(s.reference['distance'])}")):
        ax.axhline(s.target_efficiency, color="grey", lw=0.8, ls="--")
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.set(xlabel=xlabel, ylabel="scaling efficiency vs one site", title=title, ylim=(0, 1.02))
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
        ax.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.suptitle(f"{s.name}: predicted efficiency (dashed: {s.target_efficiency:.0%})")
    fig.tight_layout()
    fig.savefig(out_dir / "efficiency.png", dpi=100)
    plt.close(fig)
    beside = calculator_table(s)
    if not beside.empty:
        beside.to_csv(out_dir / "calculator.csv", index=False)
    md = [f"# what-if: {s.name}", "", s.description.strip(), "",
          f"Single-site step: {compute_seconds(s):.2f} s " + (
              f"({s.gpus_per_dc} GPUs per DC x {s.dcs} DCs, {s.gpu.peak_tflops:g} TFLOP/s at MFU {s.gpu.mfu:.0%})."
              if s.step_seconds is None and s.gpu is not None else "(published: the scenario's step_seconds)."), "",
          f"## Answers at the reference point: {reference_text(s)}", "",
          answers_for_people(ans).to_markdown(index=False, disable_numparse=True),
          "", chosen["line"][0].upper() + chosen["line"][1:] + ".", "", scale_text(s), "",
          "## Published", "", *[f"- `{k}`: {v}" for k, v in s.published.items()], "",
          "## Assumed", "", *[f"- `{k}`: {v}" for k, v in s.assumed.items()], "",
          "![efficiency](efficiency.png)", ""]
    checks = check_figures(s)
    if checks:
        md += ["## Published figures, checked", "", *[f"- {row['line']}" for row in checks], ""]
    if not beside.empty:
        md += ["## Beside the DiLoCo bandwidth calculators", "", CALCULATOR_TEXT, "",
               pd.DataFrame({"strategy": beside["strategy"],
                             "bandwidth (Gbit/s)": [f"{v:,g}" for v in beside["bandwidth_gbit"]],
                             "distance (km)": [f"{v:,.0f}" for v in beside["distance_km"]],
                             "utilisation, ours": [f"{v:.1%}" for v in beside["utilisation_ours"]],
                             "utilisation, calculators' formula": [
                                 f"{v:.1%}" for v in beside["utilisation_calculator_formula"]]}
                            ).to_markdown(index=False, disable_numparse=True), ""]
    (out_dir / "report.md").write_text("\n".join(md))
    return {"table": out_dir / "table.csv", "answers": out_dir / "answers.csv", "plot": out_dir / "efficiency.png",
            "report": out_dir / "report.md"}
