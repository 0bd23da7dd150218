"""The faults of a run for its report: every fault window applied (faults.json, as result.json holds it), every
silent data corruption injected or caught (result.json's sdc), and each faulted cell's throughput over its
clock with the fault windows shaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

WINDOW_COLUMNS = ("cell", "kind", "target", "at", "scheduled_at", "applied_at", "clear_scheduled_at", "cleared_at")


def fault_windows(results: list[dict]) -> pd.DataFrame:
    """One row per fault window of every cell (seconds on the cell's clock; apply delay in ms)."""
    rows = []
    for result in results:
        for entry in (result.get("faults") or {}).get("faults", []):
            row = {"cell": result["cell"]["id"], **{k: entry.get(k) for k in WINDOW_COLUMNS[1:]}}
            if entry.get("applied_at") is not None and entry.get("scheduled_at") is not None:
                row["apply_late_ms"] = (entry["applied_at"] - entry["scheduled_at"]) * 1e3
            rows.append(row)
    return pd.DataFrame(rows)


def sdc_table(results: list[dict]) -> pd.DataFrame:
    """Every SDC injection (and every detection no injection explains) of every cell."""
    return pd.DataFrame([{"cell": result["cell"]["id"], **item} for result in results for item in result.get("sdc") or []])


def timeline_plot(run_dir: Path, results: list[dict], steps: pd.DataFrame, plt: Any) -> list[tuple[str, str]]:
    """tokens/s of every step of each cell that had faults, against the cell's clock, fault windows shaded."""
    faulted = [r for r in results if (r.get("faults") or {}).get("clock_zero") and (r["faults"].get("faults"))]
    if not faulted or steps.empty or "time" not in steps:
        return []
    fig, axes = plt.subplots(len(faulted), 1, figsize=(8, 2.6 * len(faulted)), squeeze=False)
    colours = {"partition": "red", "flap": "orange", "loss-burst": "purple", "latency": "blue",
               "bandwidth": "green", "straggler": "brown", "kill": "black"}
    for ax, result in zip(axes[:, 0], faulted):
        cell = result["cell"]["id"]
        zero = result["faults"]["clock_zero"]
        mine = steps[steps["cell"] == cell]
        per_step = mine.groupby("step").agg(end=("time", "max"), wall=("wall_s", "max"), tokens=("tokens", "sum"))
        ax.plot(per_step["end"] - zero, per_step["tokens"] / per_step["wall"], marker=".", lw=1, color="k")
        for entry in result["faults"]["faults"]:
            if entry.get("applied_at") is None:
                continue
            end = entry.get("cleared_at") if entry.get("cleared_at") is not None else entry["applied_at"]
            colour = colours.get(entry["kind"], "grey")
            if end > entry["applied_at"]:
                ax.axvspan(entry["applied_at"], end, color=colour, alpha=0.2, label=entry["kind"])
            else:
                ax.axvline(entry["applied_at"], color=colour, label=entry["kind"])
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=7)
        ax.set(title=cell.replace("__r0", ""), xlabel="seconds on the cell's clock (rank 0's step 0 = 0)",
               ylabel="tokens/s per step")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = run_dir / "plots" / "faults.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [("plots/faults.png", "throughput of each step with the fault windows shaded")]
