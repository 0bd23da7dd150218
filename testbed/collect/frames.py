"""Rank JSON lines and cell results into pandas; the derived figures of every cell.

Per cell (steps after the warm-up only):
- step_s: the slowest rank's wall time of a step (median, p90 and mean); tokens_per_s: every measured
  step's global tokens over their summed wall time (a median step would hide DiLoCo's one slow step in H);
  steps_per_s likewise; step_source: whose step lines (the script's own, or the optimizer hook's of a command
  that reports nothing: testbed.workload.autostep);
- scaling_efficiency: tokens_per_s over the matching baseline cell's (same strategy and workload sweep
  values, every inter-DC link unshaped); steps_per_s's where a command's steps do not say their tokens;
- efficiency_vs_single_site: tokens_per_s over the best baseline cell of any strategy at the same workload
  values: the same job in one DC, run the fastest way this experiment knows (NeMo's definition);
- exposed_comm_share: mean over ranks and steps of exposed communication / step time;
- bubble_ratio (pipeline): mean of bubble / pipeline time;
- inter_dc_gb_per_step: bytes the kernel counted leaving every inter-DC link end during the cell, over
  all its steps (start-up traffic included, so a slight over-estimate), beside the workload's own
  ring-model estimate (wire_inter) and its payload count (bytes_inter);
- final_loss and the loss curve;
- delay_late_p99_ms: how late the userspace delay line itself released packets (p99 on the cell's worst link;
  flagged when above max(5 % of that link's delay, 1 ms)): emulator error, as opposed to the endpoints' own
  scheduling. netem keeps no such figure; delay_line_cpu_s: the CPU seconds every delay line's worker spent
  during the cell (the kernel carrying the released units on included);
- host_steal: the share of this machine's CPU time its hypervisor took (/proc/stat's steal) during the
  measured steps (netns and docker, whose ranks share this machine's cores; testbed.runner.hostcpu); flagged
  (host_steal_flag) above HOST_STEAL_BOUND: the cell's step time is then partly the host's other guests';
- stall_s: what the measured steps slower than STALL_FACTOR x the median step took beyond the median (a
  partition, a killed peer's timeout, a straggler); effective_time_ratio: the median step times the measured
  steps over their summed wall time (productive step time over wall time: 1.0 when nothing stalled). Under a
  DiLoCo the median is that of the steps at the same place in its synchronisation period (sync_period), so
  its outer syncs are held to outer syncs, not taken for stalls;
- faults_applied and fault_late_max_ms: how many scheduled fault windows were applied (faults.json) and the
  latest one's delay after its schedule;
- restarts, steps_lost, recovery_s, restart_lost_s (cells whose experiment allows restarts and that had one):
  how often every rank was started again after a death, the steps done again, the seconds from each death to
  the first step begun after it, and the seconds of work done again (from the checkpoint to the death); a
  step done twice counts once (its last time), and effective_time_ratio counts the restarts' seconds as wall
  time;
- quorum_min, degraded_steps, replicas_apart (torchft's cells): the fewest replica groups in a quorum, the steps
  taken with fewer than all, and how many groups ended with parameters apart from the others' (not one model).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from testbed.runner.hostcpu import HOST_STEAL_BOUND, stolen_share
from testbed.spec.strategies import DILOCO, TORCHFT_DILOCO, TORCHFT_STREAMING
from testbed.steplog import AUTOMATIC, step_records


def load_results(run_dir: Path) -> list[dict]:
    """Cell results in the order the cells ran, which is the experiment's order (sweep values as listed)."""
    results = [json.loads(path.read_text()) for path in (run_dir / "cells").glob("*/result.json")]
    return sorted(results, key=lambda result: result.get("started", 0.0))


def load_steps(run_dir: Path) -> pd.DataFrame:
    rows = []
    for result in load_results(run_dir):
        cell_dir = run_dir / "cells" / result["cell"]["id"]
        for path in sorted((cell_dir / "metrics").glob("rank*.jsonl")):
            for record in step_records(path):  # the script's own where it wrote any, else the optimizer hook's
                record["cell"] = cell_dir.name
                rows.append(record)
    frame = pd.DataFrame(rows)
    if not frame.empty and {"rank", "step"} <= set(frame):  # a restart does the steps since its checkpoint again:
        frame["superseded"] = frame.duplicated(["cell", "rank", "step"], keep="last")  # the last time counts
    return frame


def _sweep_columns(results: list[dict]) -> list[str]:
    keys: list[str] = []
    for result in results:
        for key in result["cell"]["sweep"]:
            if key not in keys:
                keys.append(key)
    return keys


def worst_lateness(result: dict) -> dict:
    """The delay line's lateness on the cell's worst link (by p99): delay_late_p99_ms, its link, max and bound,
    and whether any link exceeded its bound; nothing when no delay line ran (netem)."""
    links = {key: value for key, value in (result.get("delay_line") or {}).items() if value.get("p99_ms") is not None}
    if not links:
        return {}
    worst = max(links, key=lambda key: links[key]["p99_ms"])
    return {"delay_late_p99_ms": links[worst]["p99_ms"], "delay_late_max_ms": max(v["max_ms"] for v in links.values()),
            "delay_late_link": worst, "delay_late_bound_ms": links[worst]["bound_ms"],
            "delay_late_flag": any(value["late"] for value in links.values())}


def host_steal(result: dict, start: float, end: float) -> float | None:
    """The share of all CPU time stolen between `start` and `end` (epoch seconds), from the cell's samples
    (testbed.runner.hostcpu): from the last sample at or before `start` to the first at or after `end`."""
    samples = (result.get("host_cpu") or {}).get("samples") or []
    before = [s for s in samples if s[0] <= start]
    after = [s for s in samples if s[0] >= end]
    if not before or not after:
        return None
    return stolen_share((int(before[-1][1]), int(before[-1][2])), (int(after[0][1]), int(after[0][2])))


def flagged(summary: pd.DataFrame, flag: str) -> pd.DataFrame:
    """The rows whose boolean column `flag` (delay_late_flag, host_steal_flag) is True (a missing column or NaN:
    not measured, not flagged)."""
    return summary[summary[flag] == True] if flag in summary else summary.iloc[0:0]  # noqa: E712


STEP_REQUIRED = ("step", "wall_s")  # what a step line must carry (testbed.steplog documents the format)
STEP_OPTIONAL = (("wire", "wire_inter"), ("payload", "bytes_inter"))  # summed per step when a script reports them


def _mean_share(measured: pd.DataFrame) -> float | None:
    """Mean over ranks and steps of exposed communication / step time; None when the steps do not say."""
    if "exposed_s" not in measured or measured["exposed_s"].isna().all():
        return None
    return float((measured["exposed_s"] / measured["wall_s"]).mean())


def _mean_gb(per_step: pd.DataFrame, name: str) -> float | None:
    return float(per_step[name].mean()) / 1e9 if name in per_step else None


STALL_FACTOR = 2.0  # a step slower than this many medians stalled


def sync_period(options: dict) -> int:
    """Every how many steps a cell's strategy synchronises across DCs where that is not every step: a DiLoCo's
    inner_steps (a streaming one's inner_steps / fragments), else 1."""
    strategy, inner = options.get("strategy"), int(options.get("inner_steps") or 1)
    if strategy in ("streaming-diloco", *TORCHFT_STREAMING):
        return max(1, inner // int(options.get("fragments") or 1))
    return max(1, inner) if strategy in DILOCO + TORCHFT_DILOCO else 1


def stall_figures(walls: pd.Series, lost: float = 0.0, period: int = 1) -> dict[str, float]:
    """stall_s and effective_time_ratio of a cell from its measured steps' wall times (indexed by step) and the
    seconds restarts cost besides (see the module's doc). With `period` > 1 (a DiLoCo) each step is held to the
    median of the steps at its place in the period, so an outer sync is measured against outer syncs, not
    counted as a stall."""
    if period > 1 and len(walls) >= 3 * period:
        median = walls.groupby(walls.index.to_numpy() % period).transform("median")
    else:
        median = pd.Series(float(walls.median()), index=walls.index)
    slow = walls > STALL_FACTOR * median
    total = float(walls.sum()) + lost
    return {"stall_s": float((walls[slow] - median[slow]).sum()),
            "effective_time_ratio": float(median.sum()) / total if total > 0 else float("nan")}


def restart_cost(result: dict) -> float:
    """The seconds a cell's restarts cost beyond its counted steps: work done again and recovery."""
    return sum((r.get("lost_s") or 0.0) + (r.get("recovery_s") or 0.0) for r in result.get("restarts") or [])


def restart_columns(result: dict) -> dict:
    """restarts, steps_lost, recovery_s (summed over the cell's restarts); nothing for a cell that allows none."""
    restarts = result.get("restarts")
    if not restarts:
        return {}
    return {"restarts": len(restarts), "steps_lost": sum(r["steps_lost"] for r in restarts),
            "recovery_s": sum(r["recovery_s"] or 0.0 for r in restarts),
            "restart_lost_s": sum(r["lost_s"] or 0.0 for r in restarts)}


def replica_columns(result: dict) -> dict:
    """quorum_min, degraded_steps and replicas_apart of a torchft cell (nothing for any other): the fewest groups
    in a quorum, the steps a group took with fewer than all, and how many groups ended with parameters other than
    those most held (0: every replica equal; blank: a rank left no final digest)."""
    figures = result.get("replica_groups")
    if not figures:
        return {}
    agree = figures.get("params_agree")
    return {"quorum_min": figures.get("participants_min"), "degraded_steps": figures.get("degraded_steps"),
            "replicas_apart": None if agree is None else len(figures.get("groups_apart") or [])}


def fault_figures(result: dict) -> dict:
    """How many fault windows the cell applied and the worst delay after schedule (nothing without faults)."""
    entries = [e for e in (result.get("faults") or {}).get("faults", []) if e.get("applied_at") is not None]
    if not entries:
        return {}
    late = [e["applied_at"] - e["scheduled_at"] for e in entries if e.get("scheduled_at") is not None]
    return {"faults_applied": len(entries), "fault_late_max_ms": max(late) * 1e3 if late else float("nan")}


def summarise(results: list[dict], steps: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """One row per cell with the derived figures (see module docstring)."""
    sweep_keys = _sweep_columns(results)
    rows = []
    for result in results:
        cell = result["cell"]
        row = {"cell": cell["id"], "strategy": cell["strategy"], "baseline": cell["baseline"],
               "repetition": cell["repetition"], "status": result["status"], "reason": result["reason"],
               "cell_s": result.get("seconds")}
        for key in sweep_keys:
            row[key] = cell["sweep"].get(key, "baseline" if cell["baseline"] else None)
        link_bytes = result.get("link_bytes", {})
        row["inter_dc_bytes_kernel"] = sum(v["tx_bytes"] for v in link_bytes.values())
        for key, value in link_bytes.items():
            row[f"bytes[{key}]"] = value["tx_bytes"]
        row.update(worst_lateness(result))
        row["delay_line_cpu_s"] = result.get("delay_line_cpu_s")
        row.update(fault_figures(result))
        row.update(restart_columns(result))
        row.update(replica_columns(result))
        mine = steps[steps["cell"] == cell["id"]] if not steps.empty else steps
        if "superseded" in mine:
            mine = mine[~mine["superseded"].astype(bool)]
        mine = mine.dropna(subset=[c for c in STEP_REQUIRED if c in mine]) if not mine.empty else mine
        if result["status"] == "ok" and not mine.empty and all(c in mine for c in STEP_REQUIRED):
            total_steps = int(mine["step"].max()) + 1
            measured = mine[mine["step"] >= warmup]
            counted = "tokens" in measured and measured["tokens"].notna().all()  # null: the script did not say
            per_step = measured.groupby("step").agg(wall=("wall_s", "max"),
                                                    **{name: (column, "sum") for name, column in STEP_OPTIONAL
                                                       if column in measured and measured[column].notna().any()},
                                                    **({"tokens": ("tokens", "sum")} if counted else {}))
            row.update({
                "steps": total_steps, "measured_s": float(per_step["wall"].sum()),
                "step_s_median": float(per_step["wall"].median()), "step_s_p90": float(per_step["wall"].quantile(0.9)),
                "step_s_mean": float(per_step["wall"].mean()),
                "tokens_per_s": float(per_step["tokens"].sum() / per_step["wall"].sum()) if counted else float("nan"),
                "steps_per_s": len(per_step) / float(per_step["wall"].sum()),
                "step_source": "optimizer hook" if "source" in mine and (mine["source"] == AUTOMATIC).all()
                else "script",
                "exposed_comm_share": _mean_share(measured),
                "inter_dc_gb_per_step": row["inter_dc_bytes_kernel"] / total_steps / 1e9,
                "workload_wire_inter_gb_per_step": _mean_gb(per_step, "wire"),
                "workload_payload_inter_gb_per_step": _mean_gb(per_step, "payload"),
                **stall_figures(per_step["wall"], restart_cost(result), sync_period(cell.get("options") or {})),
            })
            if "time" in measured and measured["time"].notna().all():
                stolen = host_steal(result, float((measured["time"] - measured["wall_s"]).min()),
                                    float(measured["time"].max()))
                if stolen is not None:
                    row["host_steal"], row["host_steal_flag"] = stolen, stolen > HOST_STEAL_BOUND
            if "pipeline_s" in measured and measured["pipeline_s"].notna().any():
                pp = measured.dropna(subset=["pipeline_s"])
                row["bubble_ratio"] = float(pp["bubble_s"].sum() / pp["pipeline_s"].sum())
            losses = mine.dropna(subset=["loss"]) if "loss" in mine else mine.iloc[0:0]
            if not losses.empty:
                last = losses[losses["step"] == losses["step"].max()]
                row["final_loss"] = float(last["loss"].mean())
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    if "steps_per_s" in frame:
        workload_keys = [k for k in sweep_keys if k.startswith("workload.")]
        frame["scaling_efficiency"], frame["efficiency_vs_single_site"] = _efficiencies(frame, workload_keys,
                                                                                        rate_column(frame))
    return frame


def rate_column(frame: pd.DataFrame) -> str:
    """What throughput and efficiency are measured in: tokens_per_s where every cell with steps counted its
    tokens, else steps_per_s (a command that does not say how many tokens a step trains on)."""
    stepped = frame[frame["steps_per_s"].notna()] if "steps_per_s" in frame else frame.iloc[0:0]
    return "tokens_per_s" if stepped.empty or stepped["tokens_per_s"].notna().all() else "steps_per_s"


PREDICTED = ("step_s_predicted", "tokens_per_s_predicted", "inter_dc_bytes_predicted", "exposed_s_predicted",
             "bubble_ratio_predicted")


def add_predictions(summary: pd.DataFrame, run_dir: Path, results: list[dict]) -> pd.DataFrame:
    """The cost model's prediction beside each cell's measurement (testbed.model, from the run's calibration
    and the cell's measured round trips): step_s_predicted (the mean step), tokens_per_s_predicted,
    inter_dc_bytes_predicted (per step, as the kernel counters count them), the model's explanation, and the
    errors predicted/measured - 1 of the mean step and of the bytes; NaN without a calibration."""
    from testbed.model.predict import predict_run

    if summary.empty:
        return summary
    try:
        predictions = {p.cell: p.figures() for p in predict_run(run_dir, results)}
    except (OSError, ValueError):  # an unreadable calibration file: no predictions (NaN), the run's figures stand
        predictions = {}
    for column in (*PREDICTED, "explain"):  # the same columns with or without a calibration (NaN without)
        summary[column if column != "explain" else "model_explain"] = [
            predictions.get(cell, {}).get(column) for cell in summary["cell"]]
    for column in PREDICTED:
        summary[column] = pd.to_numeric(summary[column], errors="coerce")
    summary["step_error"], summary["bytes_error"] = float("nan"), float("nan")
    if "step_s_mean" in summary:
        summary["step_error"] = summary["step_s_predicted"] / summary["step_s_mean"] - 1
    if "inter_dc_gb_per_step" in summary:
        measured = summary["inter_dc_gb_per_step"] * 1e9
        summary["bytes_error"] = (summary["inter_dc_bytes_predicted"] / measured).where(measured > 0) - 1
    return summary


def _efficiencies(frame: pd.DataFrame, workload_keys: list[str], rate: str = "tokens_per_s") -> tuple[list, list]:
    """Each cell's `rate` (tokens/s, or steps/s) over its own strategy's baseline (median over repetitions), and
    over the best strategy's baseline, both at the same workload sweep values (None where there is no baseline)."""
    def point(row: pd.Series) -> tuple[str, ...]:
        return tuple(str(row[k]) for k in workload_keys)

    runs: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    for _, row in frame[frame["baseline"] & (frame["status"] == "ok")].iterrows():
        runs.setdefault((row["strategy"], point(row)), []).append(row[rate])
    own = {key: float(pd.Series(values).median()) for key, values in runs.items()}
    best: dict[tuple[str, ...], float] = {}
    for (_, at), value in own.items():
        best[at] = max(best.get(at, 0.0), value)
    scaling, versus_best = [], []
    for _, row in frame.iterrows():
        mine, top = own.get((row["strategy"], point(row))), best.get(point(row))
        scaling.append(row[rate] / mine if mine else None)
        versus_best.append(row[rate] / top if top else None)
    return scaling, versus_best


def aggregate(summary: pd.DataFrame) -> pd.DataFrame:
    """Median over repetitions, one row per (strategy, sweep point)."""
    if summary.empty or "tokens_per_s" not in summary:
        return summary
    keys = ["strategy", "baseline"] + [c for c in summary.columns if c.startswith(("links[", "workload."))]
    numeric = [c for c in ("tokens_per_s", "steps_per_s", "scaling_efficiency", "efficiency_vs_single_site", "step_s_median",
                           "step_s_p90", "step_s_mean", "exposed_comm_share",
                           "bubble_ratio", "inter_dc_gb_per_step", "workload_wire_inter_gb_per_step",
                           "workload_payload_inter_gb_per_step", "final_loss", *PREDICTED, "step_error",
                           "bytes_error") if c in summary]
    ok = summary[summary["status"] == "ok"].copy()
    ok[numeric] = ok[numeric].apply(pd.to_numeric, errors="coerce")  # a figure no cell reported is all None
    for key in keys:
        ok[key] = ok[key].astype(str)
    grouped = ok.groupby(keys, sort=False)[numeric].median().reset_index()
    if "replicas_apart" in ok:  # the worst repetition's: one run of two models is one too many
        grouped["replicas_apart"] = pd.to_numeric(ok["replicas_apart"], errors="coerce").groupby(
            [ok[k] for k in keys], sort=False).max().values
    grouped["repetitions"] = ok.groupby(keys, sort=False).size().values
    return grouped


def load_points(run_dir: Path) -> pd.DataFrame:
    """A run's figures per (strategy, sweep point), median over repetitions (per cell without step metrics)."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return aggregate(summarise(load_results(run_dir), load_steps(run_dir), manifest.get("warmup_steps", 0)))
