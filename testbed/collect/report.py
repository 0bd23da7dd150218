"""Tables, plots and the report of a run directory; threshold checks for nightly CI."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from testbed.collect.faults import fault_lines, fault_windows, sdc_table, timeline_plot
from testbed.collect.frames import (
    HOST_STEAL_BOUND,
    add_predictions,
    aggregate,
    flagged,
    load_results,
    load_steps,
    rate_column,
    summarise,
)
from testbed.collect.gates import check_line, check_thresholds

EFFICIENCY_FLOOR = 0.9


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def warm() -> None:
    """Pay matplotlib's first-use costs (its font cache, text layout, the Agg renderer and PNG writer: ~1 s here,
    as much again as drawing the plots after) with a small figure drawn to memory: a run calls this while its fork
    server imports torch, so that the report after its cells does not."""
    import io

    plt = _plt()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1], marker="o", label="a")
    ax.bar([0], [1])
    ax.set_xticks([0, 1], ["a", "b"], rotation=35, ha="right", fontsize=7)
    ax.set(xlabel="x", ylabel="y", title="t")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(io.BytesIO(), format="png", dpi=100)
    plt.close(fig)


def _primary(agg: pd.DataFrame) -> str | None:
    keys = [c for c in agg.columns if c.startswith(("links[", "workload."))]
    return keys[0] if keys else None


def _axis_label(key: str | None) -> str:
    from testbed.model.labels import key_label

    return key_label(key) if key else "strategy"


def _people_axes(ax, percent: bool, digits: int = 0) -> None:
    """% or thousands separators on y (`digits` after the point)."""
    import matplotlib.ticker

    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0) if percent else
                                 matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:,.{digits}f}"))


def plots(run_dir: Path, summary: pd.DataFrame, agg: pd.DataFrame, steps: pd.DataFrame) -> list[tuple[str, str]]:
    plt = _plt()
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    made: list[tuple[str, str]] = []
    if agg.empty or "tokens_per_s" not in agg:
        return made
    from testbed.model.labels import value_label

    key = _primary(agg)
    shaped = agg[agg["baseline"] == "False"]
    rate = rate_column(agg)
    metrics = [("throughput.png", rate)]
    for metric in ("efficiency_vs_single_site", "scaling_efficiency"):
        if metric in agg and agg[metric].notna().any():
            metrics.append(("efficiency.png", metric))
            break
    for name, metric in metrics:
        fig, ax = plt.subplots(figsize=(7, 4))
        for strategy, group in shaped.groupby("strategy", sort=False):
            x = [value_label(key, v) for v in group[key]] if key else [strategy]  # '20 ms', not 20ms
            ax.plot(x, group[metric].tolist(), marker="o", label=strategy)
        if metric != rate:
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.axhline(EFFICIENCY_FLOOR, color="grey", lw=0.8, ls="--")
        label = {"tokens_per_s": "tokens/s", "steps_per_s": "steps/s", "efficiency_vs_single_site":
                 "efficiency against single site", "scaling_efficiency": "efficiency against its own single site"}[metric]
        ax.set(xlabel=_axis_label(key), ylabel=label, title=f"{label} per strategy")
        ax.set_ylim(bottom=0)
        _people_axes(ax, percent=metric != rate, digits=2 if metric == "steps_per_s" else 0)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        made.append((f"plots/{name}", f"{label} against {_axis_label(key)}"))

    ok = summary[(summary["status"] == "ok") & ~summary["baseline"]]
    if not ok.empty and "inter_dc_gb_per_step" in ok:
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ok)), 4))
        labels = ok["cell"].str.replace("__r0", "", regex=False).tolist()
        ax.bar(range(len(ok)), ok["inter_dc_gb_per_step"] * 1e3, label="kernel counters (all inter-DC link ends)")
        ax.plot(range(len(ok)), ok["workload_wire_inter_gb_per_step"] * 1e3, "k_", markersize=18, mew=2,
                label="workload's ring-model estimate")
        ax.set_xticks(range(len(ok)), labels, rotation=35, ha="right", fontsize=7)
        ax.set(ylabel="MB per step", title="bytes across DCs per training step")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "inter_dc_bytes.png", dpi=100)
        plt.close(fig)
        made.append(("plots/inter_dc_bytes.png", "inter-DC bytes per step"))

    if "bubble_ratio" in summary and summary["bubble_ratio"].notna().any():
        pp = summary.dropna(subset=["bubble_ratio"])
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(pp)), 4))
        ax.bar(range(len(pp)), pp["bubble_ratio"])
        ax.set_xticks(range(len(pp)), pp["cell"].str.replace("__r0", "", regex=False), rotation=35, ha="right",
                      fontsize=7)
        ax.set(ylabel="bubble / pipeline time", title="pipeline bubble ratio")
        fig.tight_layout()
        fig.savefig(out / "bubble.png", dpi=100)
        plt.close(fig)
        made.append(("plots/bubble.png", "pipeline bubble ratio"))

    if not steps.empty and "loss" in steps and steps["loss"].notna().any():
        fig, ax = plt.subplots(figsize=(7, 4))
        for cell, group in steps.dropna(subset=["loss"]).groupby("cell", sort=False):
            per_step = group.groupby("step").agg(wall=("wall_s", "max"), loss=("loss", "mean"))
            ax.plot(per_step["wall"].cumsum(), per_step["loss"], label=cell.replace("__r0", ""), lw=1)
        ax.set(xlabel="wall time (s)", ylabel="training loss", title="loss vs wall time")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "loss.png", dpi=100)
        plt.close(fig)
        made.append(("plots/loss.png", "loss vs wall time"))
    return made


def _percent(value: float | None) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.0%}"


def _at(row: pd.Series, keys: list[str]) -> str:
    """A sweep point for people: 'east–west latency 20 ms'."""
    from testbed.model.labels import point_label

    return point_label({key: row[key] for key in keys})


PEOPLE = {  # column: (heading, format) of the report's tables; nan reads "-"
    "tokens_per_s": ("tokens/s", "{:,.0f}"), "tokens_per_s_predicted": ("tokens/s predicted", "{:,.0f}"),
    "step_s_median": ("step s (median)", "{:,.3f}"), "step_s_p90": ("step s (p90)", "{:,.3f}"),
    "step_s_mean": ("step s (mean)", "{:,.3f}"), "step_s_predicted": ("step s predicted", "{:,.3f}"),
    "step_error": ("step error", "{:+.1%}"), "bytes_error": ("bytes error", "{:+.1%}"),
    "efficiency_vs_single_site": ("vs single site", "{:.1%}"), "scaling_efficiency": ("vs its own single site", "{:.1%}"),
    "exposed_comm_share": ("exposed communication", "{:.0%}"), "bubble_ratio": ("pipeline bubble", "{:.0%}"),
    "inter_dc_gb_per_step": ("inter-DC MB/step", "MB"), "inter_dc_gb_per_step_predicted": ("inter-DC MB/step predicted", "MB"),
    "workload_payload_inter_gb_per_step": ("payload MB/step", "MB"), "final_loss": ("final loss", "{:.3f}"),
    "repetitions": ("repetitions", "{:,.0f}"), "model_explain": ("where the time goes", "{}"),
    "steps_per_s": ("steps/s", "{:,.2f}"), "cell_s": ("wall s (start-up included)", "{:,.1f}"),
}


def for_people(table: pd.DataFrame) -> pd.DataFrame:
    """A table of the report as people read it: sweep keys and values with units ('east–west latency', '20 ms'),
    thousands separators, %, MB per step, '-' for no figure. The CSV files keep the plain numbers."""
    from testbed.model.labels import key_label, value_label

    shown = pd.DataFrame(index=table.index)
    for column in table.columns:
        values = table[column]
        if column.startswith(("links[", "workload.")):
            shown[key_label(column)] = [value_label(column, v) for v in values]
        elif column == "baseline":
            shown["single site"] = ["yes" if str(v) == "True" else "" for v in values]
        elif column in PEOPLE:
            heading, fmt = PEOPLE[column]
            shown[heading] = ["-" if v is None or (isinstance(v, float) and pd.isna(v)) else
                              f"{v * 1e3:,.2f}" if fmt == "MB" else fmt.format(v) for v in values]
        else:
            shown[column] = values
    return shown


RATES = {"tokens_per_s": ("tokens/s", "{:,.0f}"), "steps_per_s": ("steps/s", "{:,.2f}")}  # reading's throughput


def reading(summary: pd.DataFrame, agg: pd.DataFrame, command: bool = False) -> list[str]:
    """A short automatic reading: the fastest strategy at each sweep point in absolute terms first, then
    what each keeps of the best single-site throughput (and of its own), cells under 90 %, failures. `command`: a
    user's own command (`testbed run --topology`): its step time and efficiency against its baseline come first."""
    lines: list[str] = command_lines(summary) if command else []
    failed = summary[summary["status"] != "ok"] if not summary.empty else summary
    if agg.empty or "tokens_per_s" not in agg:  # e.g. a user's own command: no step metrics
        lines += [f"Cell `{row['cell']}` FAILED: {row['reason']}" for _, row in failed.iterrows()]
        for _, row in summary[summary["status"] == "ok"].iterrows() if not summary.empty else []:
            lines.append(f"Cell `{row['cell']}` finished; {row['inter_dc_bytes_kernel'] / 1e6:.1f} MB crossed the "
                         "inter-DC links (kernel counters).")
        return (lines + lateness_lines(summary)) or ["No cell completed."]
    keys = [c for c in agg.columns if c.startswith(("links[", "workload."))]
    shaped = agg[agg["baseline"] == "False"]
    versus = "efficiency_vs_single_site" in agg and agg["efficiency_vs_single_site"].notna().any()
    rate = rate_column(agg)
    unit, fmt = RATES[rate]
    groups = list(shaped.groupby(keys, sort=False)) if keys else [((), shaped)]
    for _, group in groups:
        ranked = group.sort_values(rate, ascending=False)
        # a torchft cell whose replicas ended apart trained no one model: it is never the fastest
        apart = pd.to_numeric(ranked["replicas_apart"], errors="coerce").fillna(0) > 0 \
            if "replicas_apart" in ranked else pd.Series(False, index=ranked.index)
        ranked = pd.concat([ranked[~apart], ranked[apart]])
        fastest = ranked.iloc[0]
        text = f"{'At ' + _at(fastest, keys) if keys else 'Across the strategies'}: fastest is " \
               f"**{fastest['strategy']}** at {fmt.format(fastest[rate])} {unit}"
        others = [f"{row['strategy']} {fmt.format(row[rate])} ("
                  + (f"{row[rate] / fastest[rate] - 1:.0%} faster, but its replicas ended apart: no one model"
                     if apart[index] and row[rate] > fastest[rate] else f"{1 - row[rate] / fastest[rate]:.0%} slower"
                     + ("; its replicas ended apart" if apart[index] else ""))
                  + ")" for index, row in ranked.iloc[1:].iterrows()]
        lines.append(text + ("; " + ", ".join(others) if others else "") + ".")
    if versus:
        workload_keys = [k for k in keys if k.startswith("workload.")]
        base = agg[agg["baseline"] == "True"]
        for _, single in (base.groupby(workload_keys, sort=False) if workload_keys else [((), base)]):
            best = single.sort_values(rate, ascending=False).iloc[0]
            lines.append(f"Single site{' at ' + _at(best, workload_keys) if workload_keys else ''} (every inter-DC "
                         f"link unshaped) the fastest is {best['strategy']} at {fmt.format(best[rate])} {unit}: "
                         "the best single-site throughput.")
        for _, group in groups:
            kept = ", ".join(f"{row['strategy']} {_percent(row['efficiency_vs_single_site'])}"
                             for _, row in group.iterrows())
            own = ", ".join(f"{row['strategy']} {_percent(row['scaling_efficiency'])}" for _, row in group.iterrows())
            where = f"At {_at(group.iloc[0], keys)}" if keys else "Across the strategies"
            lines.append(f"{where}, of the best single-site throughput: {kept} (of each strategy's own single-site "
                         f"run: {own}).")
        low = shaped[shaped["efficiency_vs_single_site"] < EFFICIENCY_FLOOR]
        for _, row in low.iterrows():
            cost = (f"pipeline bubble {row['bubble_ratio']:.0%} of the pipeline time"
                    if "bubble_ratio" in row and pd.notna(row["bubble_ratio"])
                    else f"exposed communication {row['exposed_comm_share']:.0%} of the step"
                    if pd.notna(row.get("exposed_comm_share")) else "its steps do not report exposed communication")
            lines.append(f"{row['strategy']} falls below {EFFICIENCY_FLOOR:.0%} of the best single-site throughput"
                         f"{' at ' + _at(row, keys) if keys else ''}: {row['efficiency_vs_single_site']:.0%} ({cost}).")
    lines += [f"Cell `{row['cell']}` FAILED: {row['reason']}" for _, row in failed.iterrows()]
    return lines + lateness_lines(summary) + steal_lines(summary)


def command_lines(summary: pd.DataFrame) -> list[str]:
    """What a user's own command (`testbed run --topology T [--baseline] -- CMD`) took across the DCs: its median
    step (the slowest rank's), tokens/s where it is known, and the efficiency against its baseline (the same
    command with every inter-DC link unshaped); where no step was seen, its wall time against the baseline's."""
    if summary.empty:
        return []
    ok = summary[summary["status"] == "ok"]
    shaped, base = ok[~ok["baseline"].astype(bool)], ok[ok["baseline"].astype(bool)]
    lines = []
    for _, row in shaped.iterrows():
        single = base[base["strategy"] == row["strategy"]]
        other = single.iloc[0] if not single.empty else None
        if pd.notna(row.get("step_s_median")):
            source = ("the optimizer's steps, seen by testbed's hook: no line of the script changed"
                      if row.get("step_source") == "optimizer hook" else "the steps the script reports")
            text = f"Your command's step ({source}): median {row['step_s_median']:.3f} s across the DCs"
            tokens = pd.notna(row.get("tokens_per_s"))
            if other is not None and pd.notna(other.get("step_s_median")):
                text += (f", {other['step_s_median']:.3f} s with every inter-DC link unshaped (the baseline): "
                         f"**{_percent(row.get('efficiency_vs_single_site'))}** efficiency against the baseline")
                text += (f"; {row['tokens_per_s']:,.0f} tokens/s against {other['tokens_per_s']:,.0f}" if tokens
                         else " (steps per second; for tokens/s give --tokens-per-step N)")
            else:
                text += (f", {row['tokens_per_s']:,.0f} tokens/s" if tokens else "")
                text += " (for efficiency, --baseline runs it first with every inter-DC link unshaped)"
            lines.append(text + ".")
        elif other is not None and pd.notna(row.get("cell_s")) and pd.notna(other.get("cell_s")):
            lines.append(f"No optimizer step was seen, so no step time: the cells' wall times, start-up included "
                         f"(interpreter, imports, process group): {row['cell_s']:.1f} s across the DCs against "
                         f"{other['cell_s']:.1f} s with every inter-DC link unshaped (the baseline): "
                         f"**{other['cell_s'] / row['cell_s']:.0%}** of the baseline's pace.")
    return lines


def lateness_lines(summary: pd.DataFrame) -> list[str]:
    """Cells whose delay line was itself late beyond its bound: their figures carry emulator error."""
    return [f"Cell `{row['cell']}`: the userspace delay line itself released packets {row['delay_late_p99_ms']:.2f} ms "
            f"late at p99 on {row['delay_late_link']} (bound {row['delay_late_bound_ms']:.2f} ms = max(5 % of its delay, "
            "1 ms)): part of this cell's time is emulator error, not the emulated network's."
            for _, row in flagged(summary, "delay_late_flag").iterrows()]


def steal_lines(summary: pd.DataFrame) -> list[str]:
    """Cells during whose measured steps the hypervisor took this machine's CPU beyond the bound: their step
    times are partly other guests' load."""
    return [f"Cell `{row['cell']}`: this machine's hypervisor took {row['host_steal']:.1%} of its CPU time during "
            f"the measured steps (bound {HOST_STEAL_BOUND:.0%}, /proc/stat's steal): the ranks share these cores, so "
            "part of this cell's time is the host's other guests' load, not the emulated system's."
            for _, row in flagged(summary, "host_steal_flag").iterrows()]


MODEL_TEXT = ("Each cell predicted by the calibrated cost model without its measured steps: the run's calibration "
              "(collective micro-benchmarks over the links), the cell's measured round trips and, for real compute, "
              "the compute of its warm-up steps (synthetic compute: the setting). step error = predicted mean step / "
              "measured mean step - 1; bytes error = predicted / kernel-counted "
              "inter-DC bytes per step - 1.")


def model_text(run_dir: Path) -> str:
    """MODEL_TEXT, and the calibration the predictions used: the run's own, measured at its start, which replaced
    the shipped reference calibration that `testbed plan` uses before a run."""
    from testbed.model.calibration import provenance, reference_for
    from testbed.model.predict import run_calibration

    own = run_calibration(run_dir)
    if own is None or not own.calibrated:
        return MODEL_TEXT
    profile = own.compute[0] if own.compute else None
    _, reference = reference_for(*((profile.preset, profile.micro_batch, profile.seq_len) if profile else
                                   (None, None, None)))
    return (f"{MODEL_TEXT} Calibration: the run's own ({provenance(own)}); it replaced the shipped reference "
            f"calibration ({provenance(reference)}) that `testbed plan` uses before a run.")


def model_table(summary: pd.DataFrame) -> pd.DataFrame:
    if "step_s_predicted" not in summary or summary["step_s_predicted"].isna().all():
        return pd.DataFrame()
    columns = [c for c in ("cell", "step_s_mean", "step_s_predicted", "step_error", "tokens_per_s",
                           "tokens_per_s_predicted", "inter_dc_gb_per_step", "inter_dc_bytes_predicted", "bytes_error",
                           "model_explain") if c in summary]
    table = summary[summary["status"] == "ok"][columns].copy()
    if "inter_dc_bytes_predicted" in table:
        table["inter_dc_bytes_predicted"] = table["inter_dc_bytes_predicted"] / 1e9
        table = table.rename(columns={"inter_dc_bytes_predicted": "inter_dc_gb_per_step_predicted"})
    return table


SIMULATED_CONGESTION_CONTROL = ("cubic", "reno")  # whose slow start testbed.model.transport simulates


def model_lines(summary: pd.DataFrame, tcp: dict | None = None) -> list[str]:
    """What the model says: its error over the shaped cells, where the time goes in the slowest cell, and
    whether the nodes ran a congestion control the model does not simulate (`tcp`: the manifest's)."""
    if "step_error" not in summary or summary["step_error"].dropna().empty:
        return []
    congestion_control = (tcp or {}).get("tcp_congestion_control")
    caveat = ([f"The nodes ran TCP **{congestion_control}**: the model simulates the slow start of "
               f"{' and '.join(SIMULATED_CONGESTION_CONTROL)}, so transfers that start from a small window (a "
               "pipeline's activations, a collective after an idle step) may take longer than predicted; "
               "`tcp: {congestion_control: cubic}` in the topology runs what the model simulates."]
              if congestion_control and congestion_control not in SIMULATED_CONGESTION_CONTROL else [])
    shaped = summary[(summary["status"] == "ok") & ~summary["baseline"].astype(bool)].dropna(subset=["step_error"])
    if shaped.empty:
        return caveat
    errors = shaped["step_error"].abs()
    lines = [f"Cost model: the mean step of the {len(shaped)} shaped cells was predicted within a median of "
             f"{errors.median():.1%} (p90 {errors.quantile(0.9):.1%}, worst {errors.max():.1%} in "
             f"`{shaped.loc[errors.idxmax(), 'cell']}`)."]
    stolen = flagged(shaped, "host_steal_flag")
    if not stolen.empty:
        calm = shaped.drop(stolen.index)["step_error"].abs()
        lines.append(f"{len(shaped) - len(calm)} of them ran while the hypervisor took over {HOST_STEAL_BOUND:.0%} of "
                     "this machine's CPU (see the notes), which no model of the emulated system predicts"
                     + (f"; over the other {len(calm)}: median {calm.median():.1%}, p90 {calm.quantile(0.9):.1%}."
                        if len(calm) else "."))
    slowest = shaped.sort_values("step_s_mean").iloc[-1]
    if isinstance(slowest.get("model_explain"), str) and slowest["model_explain"]:
        lines.append(f"The model on the slowest cell, `{slowest['cell']}` ({slowest['step_s_mean']:.2f} s per step, "
                     f"predicted {slowest['step_s_predicted']:.2f} s): {slowest['model_explain']}.")
    return lines + caveat


def model_plot(run_dir: Path, summary: pd.DataFrame) -> list[tuple[str, str]]:
    if "step_s_predicted" not in summary or "step_s_mean" not in summary:
        return []
    ok = summary[(summary["status"] == "ok")].dropna(subset=["step_s_predicted", "step_s_mean"])
    if ok.empty:
        return []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for baseline, marker, label in ((False, "o", "shaped cells"), (True, "x", "baselines (unshaped)")):
        part = ok[ok["baseline"].astype(bool) == baseline]
        ax.scatter(part["step_s_mean"], part["step_s_predicted"], marker=marker, label=label)
    top = float(max(ok["step_s_mean"].max(), ok["step_s_predicted"].max())) * 1.1
    ax.plot([0, top], [0, top], color="grey", lw=0.8)
    for bound in (0.9, 1.1):
        ax.plot([0, top], [0, top * bound], color="grey", lw=0.6, ls="--")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="measured mean step (s)", ylabel="predicted mean step (s)",
           title="cost model: predicted vs measured (dashed: ±10 %)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    (run_dir / "plots").mkdir(exist_ok=True)
    fig.savefig(run_dir / "plots" / "model.png", dpi=100)
    plt.close(fig)
    return [("plots/model.png", "predicted vs measured mean step")]


LATENESS_TEXT = ("How late the delay line released each packet against its due time, per link and cell: the "
                 "emulator's own error, apart from the endpoints' scheduling (which the probe's RTT includes). "
                 "`late` marks a p99 above max(5 % of the link's delay, 1 ms).")
NO_LATENESS = "(no userspace delay line ran: netem keeps no figure of how late it releases packets)"


def lateness_table(results: list[dict]) -> pd.DataFrame:
    rows = [{"cell": result["cell"]["id"], "link": key, **{k: figures.get(k) for k in (
             "packets", "delay_ms", "p50_ms", "p99_ms", "max_ms", "bound_ms", "late")}}
            for result in results for key, figures in (result.get("delay_line") or {}).items()]
    return pd.DataFrame(rows)


def shared_lines(manifest: dict) -> list[str]:
    """A note when other testbeds were held on this machine during the run (the manifest's shared_host): their
    ranks took the same CPUs, so timings carry their load."""
    others = manifest.get("shared_host") or []
    if not others:
        return []
    named = "; ".join(f"{o['prefix']} (pid {o['pid']}, {o['command']})" for o in others)
    return [f"**shared machine**: {len(others)} other testbed(s) ran on this machine's {manifest.get('host_cpus')} "
            f"CPUs during this run ({named}): step times include their load"]


def build_report(run_dir: Path) -> Path:
    """Write steps.csv, summary.csv, summary_by_point.csv, thresholds.json, plots/, report.md, report.html."""
    run_dir = Path(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    results = load_results(run_dir)
    steps = load_steps(run_dir)
    summary = add_predictions(summarise(results, steps, manifest.get("warmup_steps", 0)), run_dir, results)
    agg = aggregate(summary)
    steps.to_csv(run_dir / "steps.csv", index=False)
    summary.to_csv(run_dir / "summary.csv", index=False)
    agg.to_csv(run_dir / "summary_by_point.csv", index=False)
    checks = check_thresholds(manifest, agg) if manifest.get("experiment_text") else []
    (run_dir / "thresholds.json").write_text(json.dumps(checks, indent=1))
    images = plots(run_dir, summary, agg, steps) + model_plot(run_dir, summary) + timeline_plot(run_dir, results, steps,
                                                                                                 _plt())
    windows, sdc = fault_windows(results), sdc_table(results)
    notes = (reading(summary, agg, command="command" in manifest) + fault_lines(results, summary)
             + model_lines(summary, manifest.get("tcp")) + shared_lines(manifest))
    model = for_people(model_table(summary))
    calibration = []
    for result in results:
        for row in result.get("calibration", []):
            calibration.append({"cell": result["cell"]["id"], **row})
    cal = pd.DataFrame(calibration)
    swept = [c for c in agg.columns if c.startswith(("links[", "workload."))]
    table_cols = [c for c in ("strategy", *(swept or ["baseline"]),
                              "tokens_per_s", *(["steps_per_s"] if rate_column(agg) == "steps_per_s" else []),
                              "step_s_median", "step_s_p90", "efficiency_vs_single_site",
                              "scaling_efficiency", "exposed_comm_share", "bubble_ratio", "inter_dc_gb_per_step",
                              "workload_payload_inter_gb_per_step", "final_loss", "repetitions", "cell_s")
                  if c in agg.columns]
    main_table = for_people(agg[table_cols]) if not agg.empty else agg
    links = pd.DataFrame([{"link": k, **v} for k, v in manifest.get("links", {}).items()])
    md = [f"# {manifest['experiment']}", "", "## Reading", "", *[f"- {line}" for line in notes], "",
          "## The run", "", manifest.get("description", "").strip(), "",
          f"- run: `{run_dir}`", f"- git commit: `{manifest.get('git_commit')}`, kernel `{manifest.get('kernel')}`, "
          f"{manifest.get('host_cpus')} CPUs, shaper **{manifest.get('shaper')}**",
          f"- versions: {', '.join(f'{k} {v}' for k, v in manifest.get('versions', {}).items())}",
          f"- warm-up steps excluded from figures: {manifest.get('warmup_steps')}; repetitions: "
          f"{manifest.get('repetitions')}; seed {manifest.get('seed')}", ""]
    if checks:
        md += ["## Claims and thresholds", "", *[f"- {check_line(check)}" for check in checks], ""]
    md += ["## Results (median over repetitions)", "",
           main_table.to_markdown(index=False, disable_numparse=True) if not main_table.empty else "(none)", ""]
    md += [f"![{title}]({path})" for path, title in images] + [""]
    if not model.empty:
        md += ["## Predicted vs measured (cost model, testbed.model)", "", model_text(run_dir), "",
               model.to_markdown(index=False, disable_numparse=True), ""]
    md += ["## Links as the topology sets them (cells apply their sweep values; see the calibration)", "",
           links.to_markdown(index=False) if not links.empty else "(none)", ""]
    if not cal.empty:
        md += ["## Link calibration per cell", "", cal.to_markdown(index=False, floatfmt=".3f"), ""]
    if not windows.empty:
        md += ["## Faults (seconds on each cell's clock)", "", windows.to_markdown(index=False, floatfmt=".3f"), ""]
    if not sdc.empty:
        md += ["## Silent data corruption", "", sdc.to_markdown(index=False), ""]
    late = lateness_table(results)
    md += ["## Emulator lateness (userspace delay line, during each cell)", "", LATENESS_TEXT, "",
           late.to_markdown(index=False, floatfmt=".3f") if not late.empty else NO_LATENESS, ""]
    (run_dir / "report.md").write_text("\n".join(md))
    extra = "".join(f"<h2>{html.escape(title)}</h2>{frame.to_html(index=False, float_format=lambda v: f'{v:.3f}')}"
                    for title, frame in (("Faults (seconds on each cell's clock)", windows),
                                         ("Silent data corruption", sdc)) if not frame.empty)
    (run_dir / "report.html").write_text(_html(manifest, run_dir, notes, checks, main_table, images, links, cal,
                                               late, model, extra))
    return run_dir / "report.html"


def _html(manifest: dict, run_dir: Path, notes: list[str], checks: list[dict], table: pd.DataFrame,
          images: list[tuple[str, str]], links: pd.DataFrame, cal: pd.DataFrame, late: pd.DataFrame,
          model: pd.DataFrame, extra: str = "") -> str:
    esc = html.escape

    def md_bold(text: str) -> str:
        parts = esc(text).split("**")
        return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts)).replace("`", "")

    check_items = "".join(f"<li class={'pass' if c['passed'] else 'fail'}>{esc(check_line(c))}</li>" for c in checks)
    model_html = "" if model.empty else ("<h2>Predicted vs measured (cost model)</h2><p>" + esc(model_text(run_dir)) + "</p>"
                                         + model.to_html(index=False, float_format=lambda v: f"{v:.3g}"))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{esc(manifest['experiment'])}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;font-size:13px;display:block;max-width:100%;overflow-x:auto}}
td,th{{border:1px solid #ccc;padding:3px 7px;text-align:right}}th{{background:#f3f3f3}}
img{{max-width:100%;border:1px solid #ddd;margin:6px 0}}.pass{{color:#060}}.fail{{color:#a00}}
code{{overflow-wrap:anywhere}}</style></head><body>
<h1>{esc(manifest['experiment'])}</h1>
<h2>Reading</h2><ul>{''.join(f'<li>{md_bold(n)}</li>' for n in notes)}</ul>
<h2>The run</h2><p>{esc(manifest.get('description', ''))}</p>
<p>shaper <b>{esc(str(manifest.get('shaper')))}</b>, kernel {esc(str(manifest.get('kernel')))},
{manifest.get('host_cpus')} CPUs, commit <code>{esc(str(manifest.get('git_commit')))}</code></p>
{'<h2>Claims and thresholds</h2><ul>' + check_items + '</ul>' if checks else ''}
<h2>Results (median over repetitions)</h2>{table.to_html(index=False, float_format=lambda v: f'{v:.3g}')}
{''.join(f'<h3>{esc(t)}</h3><img src="{esc(p)}" alt="{esc(t)}">' for p, t in images)}
{model_html}
<h2>Links as the topology sets them (cells apply their sweep values; see the calibration)</h2>
{links.to_html(index=False)}
{'<h2>Link calibration per cell</h2>' + cal.to_html(index=False, float_format=lambda v: f'{v:.3f}') if not cal.empty else ''}
{extra}<h2>Emulator lateness (userspace delay line, during each cell)</h2><p>{esc(LATENESS_TEXT)}</p>
{late.to_html(index=False, float_format=lambda v: f'{v:.3f}') if not late.empty else f'<p>{esc(NO_LATENESS)}</p>'}
</body></html>"""
