"""The faults of a run for its report: every fault window applied (faults.json, as result.json holds it), every
silent data corruption injected or caught (result.json's sdc), and each faulted cell's throughput over its
clock with the fault windows shaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

QUORUM_COLOURS = ("tab:blue", "tab:cyan", "tab:olive", "tab:pink", "tab:grey")
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


def fault_lines(results: list[dict], summary: pd.DataFrame) -> list[str]:
    """The Reading's line on each cell that met faults: every restart (who died, from which checkpoint, what was done
    again), what the slow steps cost (stall_s, effective_time_ratio), and what caught each bit flip."""
    rows = {row["cell"]: row for _, row in summary.iterrows()} if not summary.empty else {}
    lines = []
    for result in results:
        cell, parts = result["cell"]["id"], []
        row = rows.get(cell, pd.Series(dtype=object))
        for restart in result.get("restarts") or []:
            after = restart.get("resumed_after_step")
            parts.append(f"{restart['reason']}; every rank started again"
                         + (f" {restart['recovery_s']:.1f} s later" if restart.get("recovery_s") is not None else "")
                         + (f" from the checkpoint after step {after}" if after is not None else
                            " from step 0 (no checkpoint)")
                         + f", {restart['steps_lost']} step(s) done again"
                         + (f" ({restart['lost_s']:.1f} s of work)" if restart.get("lost_s") is not None else ""))
        applied = [e for e in (result.get("faults") or {}).get("faults", []) if e.get("applied_at") is not None]
        if (applied or result.get("restarts")) and pd.notna(row.get("stall_s")):
            slow = (f"the slow steps took {row['stall_s']:.2f} s beyond the median step" if row["stall_s"] > 0
                    else "no step took twice the median")
            parts.append(f"{slow}, effective time ratio {row['effective_time_ratio']:.0%}")
        flips = [item for item in result.get("sdc") or [] if item.get("target")]
        if flips:
            caught = [f"rank {i['rank']} step {i['step']} by {i['detected_by']}" for i in flips
                      if i["classification"] != "missed"]
            missed = [f"rank {i['rank']} step {i['step']}" for i in flips if i["classification"] == "missed"]
            parts.append(f"{len(caught)} of {len(flips)} bit flips caught" + (f" ({', '.join(caught)})" if caught else "")
                         + (f", missed: {', '.join(missed)}" if missed else ""))
        parts += replica_parts(result.get("replica_groups") or {})
        unexplained = [item for item in result.get("sdc") or [] if not item.get("target")]
        if unexplained:
            parts.append(f"{len(unexplained)} detection(s) where no bit was flipped (false positives)")
        if parts:
            lines.append(f"Cell `{cell}`: " + "; ".join(parts) + ".")
    return lines


def replica_parts(figures: dict[str, Any]) -> list[str]:
    """What a torchft cell's replica groups did, for its Reading line: how far its quorums fell and whether every
    group ended with the same parameters (nothing while every quorum held every group and the replicas agree)."""
    groups, fewest = figures.get("replica_groups"), figures.get("participants_min")
    if not groups:
        return []
    parts = []
    if fewest is not None and fewest < groups:
        parts.append(f"the quorum fell to {fewest} of {groups} replica groups for {figures.get('degraded_steps')} "
                     "step(s)")
    apart = figures.get("groups_apart") or []
    if figures.get("params_agree") is False:
        every = len(apart) >= groups
        alone = {g: n for g, n in (figures.get("steps_after_others_ended") or {}).items() if g in apart}
        parts.append("**the replicas ended apart**: " + ("no two of " if every else "") + ", ".join(apart)
                     + (" ended with the same parameters" if every else
                        " did not end with the parameters the others hold")
                     + ("; " + ", ".join(f"{g} took {n} step(s) after every other group had ended, in quorums of "
                                         "its own" for g, n in alone.items()) if alone else "")
                     + " (not one model: a majority's min_replicas makes a group wait for the others instead)")
    elif figures.get("params_agree") and parts:
        parts.append("every group ended with the same parameters")
    parts += [heal_part(heal) for heal in figures.get("heals") or [] if heal.get("heal_s") is not None]
    return parts


def heal_part(heal: dict[str, Any]) -> str:
    """A restarted group's heal for the Reading: measured, and the cost model's prediction beside it in the same
    parts (setup, its own steps, the quorum's wait, the new quorum's process group, the fetch, the step's rest)."""
    who = heal.get("group") or f"rank {heal['rank']}"
    text = f"{who} healed in {heal['heal_s']:.2f} s"
    if heal.get("healed_bytes"):
        text += f", {heal['healed_bytes'] / 1e6:.1f} MB" + (f" from {heal['healed_from_dc']}" if heal.get("healed_from_dc") else "")
    predicted = heal.get("heal_predicted")
    if heal.get("heal_predicted_s") is None or not predicted:
        return text
    names = (("setup_s", "setup"), ("before_quorum_s", "own steps"), ("quorum_wait_s", "quorum"),
             ("reconfigure_s", "process group"), ("fetch_s", "fetch"), ("rest_s", "rest"))
    pairs = ", ".join(f"{label} {heal[key]:.2f}/{predicted[key]:.2f}" if heal.get(key) is not None else
                      f"{label} -/{predicted[key]:.2f}" for key, label in names if key in predicted)
    low, high = predicted["quorum_wait_range_s"]
    return (text + f" (predicted {heal['heal_predicted_s']:.2f} s, measured/predicted s: {pairs}; the quorum's wait "
            f"can fall from {low:.2f} to {high:.2f} s)")


def _throughput(mine: pd.DataFrame, result: dict) -> pd.DataFrame:
    """Per step (end time, wall, tokens of every rank): the ranks' records of one step number, in time order. Under
    torchft a step number is each group's own (a restarted group counts again from its heal, a DiLoCo's groups
    apart), so the steps are the survivor's with most of them, its tokens times its group's ranks and the groups
    in its quorum."""
    groups = (result.get("replica_groups") or {}).get("replica_groups")
    if groups and "participants" in mine:
        rank = mine["rank"].value_counts().idxmax()
        own = mine[mine["rank"] == rank].sort_values("time")
        per_group = max(1, mine["rank"].nunique() // groups)
        return pd.DataFrame({"end": own["time"], "wall": own["wall_s"],
                             "tokens": own["tokens"] * per_group * own["participants"].clip(lower=1)})
    per_step = mine.groupby("step").agg(end=("time", "max"), wall=("wall_s", "max"), tokens=("tokens", "sum"))
    return per_step.sort_values("end")


def timeline_plot(run_dir: Path, results: list[dict], steps: pd.DataFrame, plt: Any) -> list[tuple[str, str]]:
    """tokens/s of every step of each cell that had faults, against the cell's clock, fault windows shaded; under
    torchft also the groups in each step's quorum."""
    faulted = [r for r in results if (r.get("faults") or {}).get("clock_zero") and (r["faults"].get("faults"))]
    if not faulted or steps.empty or "time" not in steps:
        return []
    fig, axes = plt.subplots(len(faulted), 1, figsize=(8, 2.6 * len(faulted)), squeeze=False)
    colours = {"partition": "red", "flap": "orange", "loss-burst": "purple", "latency": "blue",
               "bandwidth": "green", "straggler": "brown", "kill": "black"}
    quorums = 0
    for ax, result in zip(axes[:, 0], faulted):
        cell = result["cell"]["id"]
        zero = result["faults"]["clock_zero"]
        mine = steps[steps["cell"] == cell]
        per_step = _throughput(mine, result)
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
        groups = mine[mine["participants"] > 0] if "participants" in mine else mine.iloc[0:0]  # 0 (or none): no
        # quorum yet (a DiLoCo's inner steps before its first)
        if not groups.empty:  # torchft: the groups in each step's quorum, as each group's first rank saw them (a
            # group that trained alone: its line apart from the others'; each line raised a little, so equal ones show)
            quorums += 1
            twin = ax.twinx()
            names = (result.get("replica_groups") or {}).get("group_names") or []
            for i, (dc, own) in enumerate(groups.groupby("dc") if "dc" in groups else [(0, groups)]):
                seen = own[own["rank"] == own["rank"].min()].sort_values("time")
                name = names[int(dc)] if "dc" in groups and int(dc) < len(names) else str(dc)
                twin.step(seen["time"] - zero, seen["participants"] + 0.06 * i, where="post", lw=1,
                          color=QUORUM_COLOURS[i % len(QUORUM_COLOURS)], label=f"groups in {name}'s quorum")
            twin.set(ylabel="groups in the quorum", ylim=(0, groups["participants"].max() + 0.5))
            more_handles, more_labels = twin.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
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
    caption = "throughput of each step with the fault windows shaded"
    return [("plots/faults.png", caption + (" and the groups in each step's quorum" if quorums else ""))]
