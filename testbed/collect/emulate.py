"""A scale-model run (testbed.runner.emulate) into emulate.csv and its report: measured efficiency beside the
full-scale prediction (testbed.model.whatif) and the scale model's own (the laptop-scale cost model).

emulate.csv, one row per scale cell: strategy, kind, distance_km, bandwidth_gbit, efficiency_full_scale,
efficiency_scale_model_predicted, efficiency_measured (the cell's tokens/s over its own single-site baseline's,
testbed.collect.frames), status, every group at both scales (`<group>_full`, `<group>_scale`), `unmatched` (the
groups the scale model could not match, with why) and `cell_path` (the cell's run directory, relative to the run).

The report (emulate.md, plots/emulate.png): per strategy the three efficiencies against distance on one plot (one
panel per strategy and bandwidth), the winner at each point by each of the three, and a Reading: how many rows
measure within AGREE of the full-scale prediction, and for each that does not, what explains it from what the run
recorded (a group not matched, the scale model's own prediction already apart, the delay line releasing late, the
host's steal, TCP's slow start after an idle phase, ranks outnumbering cores).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from testbed.collect.frames import load_points, load_results, load_steps, summarise

AGREE = 0.05  # issue 54: measured within 0.05 of the full-scale prediction
TIE = 0.005  # efficiencies this close are a tie: the winner is every strategy within it ("a = b")
CSV = "emulate.csv"
REPORT = "emulate.md"
PLOT = "emulate.png"
COLUMNS = ("strategy", "kind", "distance_km", "bandwidth_gbit", "efficiency_full_scale",
           "efficiency_scale_model_predicted", "efficiency_measured", "status")
EFFICIENCIES = (("efficiency_full_scale", "full scale (whatif)"),
                ("efficiency_scale_model_predicted", "scale model, predicted"),
                ("efficiency_measured", "scale model, measured"))


def measured(cell_dir: Path) -> tuple[float | None, str, dict]:
    """The scale cell's measured efficiency (its non-baseline cell over its baseline), its status, and its summary
    row (the figures the Reading looks at); None where it did not run to the end."""
    if not (cell_dir / "manifest.json").exists():
        return None, "not run", {}
    results = load_results(cell_dir)
    if not results:
        return None, "not run", {}
    warmup = json.loads((cell_dir / "manifest.json").read_text()).get("warmup_steps", 0)
    summary = summarise(results, load_steps(cell_dir), warmup)
    failed = summary[summary["status"] != "ok"]
    if not failed.empty:
        return None, f"failed: {failed.iloc[0]['cell']}: {failed.iloc[0]['reason']}", {}
    points = load_points(cell_dir)
    shaped = points[points["baseline"].astype(str) != "True"] if not points.empty else points
    if shaped.empty or "scaling_efficiency" not in shaped or pd.isna(shaped.iloc[0]["scaling_efficiency"]):
        return None, "no baseline or no steps", {}
    row = summary[~summary["baseline"].astype(bool)].iloc[0].to_dict()
    return float(shaped.iloc[0]["scaling_efficiency"]), "ok", row


def table(run_dir: Path) -> pd.DataFrame:
    """emulate.csv's rows (module docstring), in the order the scale model listed its cells."""
    records = json.loads((run_dir / "scale_model.json").read_text())
    rows = []
    for record in records:
        value, status, _ = measured(run_dir / record["path"])
        row = {name: record.get(name) for name in COLUMNS}
        row.update(efficiency_measured=value, status=status)
        for group, full in record.get("groups_full", {}).items():
            row[f"{group}_full"] = full
            row[f"{group}_scale"] = record.get("groups_scale", {}).get(group)
        row["unmatched"] = "; ".join(f"{g}: {why}" for g, why in record.get("unmatched", {}).items())
        row["cell_path"] = record["path"]
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame[[*COLUMNS, *[c for c in frame.columns if c not in COLUMNS]]] if not frame.empty else frame


def winners(frame: pd.DataFrame) -> pd.DataFrame:
    """Per point (distance, bandwidth): the strategy with the highest efficiency by each of the three (those within
    TIE of it: a tie), and whether the measured winner is the full-scale one (a tie agrees where it shares one)."""
    rows = []
    for (distance, bandwidth), at in frame.groupby(["distance_km", "bandwidth_gbit"], sort=True):
        row = {"distance_km": distance, "bandwidth_gbit": bandwidth}
        for column, _ in EFFICIENCIES:
            known = at.dropna(subset=[column])
            best = known[known[column] >= known[column].max() - TIE] if not known.empty else known
            row[column.replace("efficiency_", "winner_")] = " = ".join(best["strategy"]) if not best.empty else None
        measured, full = (set((row[k] or "").split(" = ")) - {""} for k in ("winner_measured", "winner_full_scale"))
        row["agree"] = bool(measured & full)
        rows.append(row)
    return pd.DataFrame(rows)


def explain(row: dict, figures: dict, tcp: dict) -> str:
    """What the run recorded that explains a row measuring more than AGREE from the full-scale prediction."""
    reasons = []
    if row.get("unmatched"):
        reasons.append(f"groups not matched ({row['unmatched']})")
    full, predicted, got = (row.get(k) for k in ("efficiency_full_scale", "efficiency_scale_model_predicted",
                                                 "efficiency_measured"))
    if predicted is not None and full is not None and abs(predicted - full) > AGREE:
        reasons.append(f"the scale model's own prediction is already {predicted - full:+.3f} from full scale")
    if got is not None and predicted is not None and abs(got - predicted) > AGREE:
        reasons.append(f"measured {got - predicted:+.3f} from the scale model's prediction: a mechanism the "
                       "laptop-scale model misses")
    if figures.get("delay_late_flag"):
        reasons.append(f"the delay line released late (p99 {figures.get('delay_late_p99_ms', float('nan')):.2f} ms "
                       f"on {figures.get('delay_late_link')})")
    if figures.get("host_steal_flag"):
        reasons.append(f"the host's steal took {figures.get('host_steal', 0.0):.0%} of the CPU")
    if tcp.get("tcp_slow_start_after_idle") == "1":
        reasons.append("possibly TCP's slow start after an idle phase (net.ipv4.tcp_slow_start_after_idle=1 on the "
                       "nodes: a sync after compute starts again from the initial window)")
    return "; ".join(reasons) or "nothing recorded explains it"


def reading(run_dir: Path, frame: pd.DataFrame, wins: pd.DataFrame) -> list[str]:
    """The Reading: agreement counts, the fastest strategy per point, and each row that disagrees with why."""
    done = frame.dropna(subset=["efficiency_measured"])
    if done.empty:
        return ["No scale cell measured an efficiency: see each cell's status in emulate.csv."]
    within = (done["efficiency_measured"] - done["efficiency_full_scale"]).abs() <= AGREE
    lines = [f"{int(within.sum())} of {len(done)} measured rows ({within.mean():.0%}) are within {AGREE} of the "
             f"full-scale prediction (of {len(frame)} rows in all); the fastest strategy measured is the full "
             f"scale's at {int(wins['agree'].sum())} of {len(wins)} points."]
    for _, row in done[~within].iterrows():
        cell_dir = run_dir / row["cell_path"]
        _, _, figures = measured(cell_dir)
        tcp = json.loads((cell_dir / "manifest.json").read_text()).get("tcp", {})
        lines.append(f"{row['strategy']} at {row['distance_km']:g} km, {row['bandwidth_gbit']:g} Gbit/s: measured "
                     f"{row['efficiency_measured']:.3f}, full scale {row['efficiency_full_scale']:.3f} "
                     f"({row['efficiency_measured'] - row['efficiency_full_scale']:+.3f}): "
                     f"{explain(row.to_dict(), figures, tcp)}.")
    for _, win in wins[~wins["agree"]].iterrows():
        lines.append(f"At {win['distance_km']:g} km, {win['bandwidth_gbit']:g} Gbit/s the fastest measured is "
                     f"{win['winner_measured']}, the full scale's {win['winner_full_scale']}.")
    return lines


def plot(run_dir: Path, frame: pd.DataFrame) -> Path | None:
    """plots/emulate.png: per strategy (and bandwidth) the three efficiencies against distance."""
    from testbed.collect.report import _plt

    if frame.empty:
        return None
    plt = _plt()
    panels = list(frame.groupby(["strategy", "bandwidth_gbit"], sort=False))
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), squeeze=False)
    for ax, ((strategy, bandwidth), at) in zip(axes.flat, panels, strict=False):
        at = at.sort_values("distance_km")
        for column, label in EFFICIENCIES:
            ax.plot(at["distance_km"], at[column].astype(float), marker="o", label=label)
        ax.set_title(f"{strategy} at {bandwidth:g} Gbit/s", fontsize=9)
        ax.set_xlabel("distance (km)")
        ax.set_ylabel("scaling efficiency")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    out = run_dir / "plots" / PLOT
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(frame: pd.DataFrame) -> str:
    """A plain markdown table of `frame`."""
    head = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"
    return head + "".join("| " + " | ".join(_cell(v) for v in row) + " |\n" for row in frame.itertuples(index=False))


def build(run_dir: Path) -> Path:
    """Write emulate.csv, plots/emulate.png and emulate.md into the run directory; returns emulate.md's path."""
    frame = table(run_dir)
    frame.to_csv(run_dir / CSV, index=False)
    wins = winners(frame) if not frame.empty else pd.DataFrame()
    plot(run_dir, frame)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    lines = [f"# {manifest.get('scenario')}: scale model against full scale", "",
             f"Points: {manifest.get('points')}; commit {manifest.get('git_commit')}; started "
             f"{manifest.get('started')}, finished {manifest.get('finished')}.", "", f"![efficiencies](plots/{PLOT})",
             "", "## Efficiencies", "", markdown(frame[list(COLUMNS)]) if not frame.empty else "(no cells)", "",
             "## Winner at each point", "", markdown(wins) if not wins.empty else "(none)", "", "## Reading", "",
             *[f"- {line}" for line in reading(run_dir, frame, wins)], ""]
    out = run_dir / REPORT
    out.write_text("\n".join(lines))
    return out
