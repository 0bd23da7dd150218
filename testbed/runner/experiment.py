"""Run an experiment cell by cell on a fabric (any backend) and write results/<experiment>/<run>/cells/.

Per cell: re-shape the links live (no rebuild between latency cells), calibrate them (RTT per DC pair),
read the kernel counters of every inter-DC link end, start the ranks, watch them, read the counters
again, and write cells/<id>/result.json last and atomically: a cell without it is incomplete, so
--resume redoes exactly those. The fabric is always torn down, also on Ctrl-C or a failure. The tables, plots
and report are testbed.collect's, built from that directory.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testbed.agents.delayline.release import lateness_delta, lateness_summary
from testbed.atomic import write_text as atomic_write
from testbed.fabric import cancel, registry
from testbed.fabric.backend import Backend
from testbed.fabric.errors import FabricError
from testbed.fabric.forkserver import Forks
from testbed.fabric.lifecycle import Testbed, bring_up, tear_down
from testbed.fabric.ownership import Owner, claim, claim_free, live_owners, release
from testbed.plan import DEFAULT_PREFIX
from testbed.plan.faults import fault_seed, longest_partition
from testbed.rankenv import RankEnv
from testbed.runner.cells import UNSHAPED, Cell, base_links, plan_cells
from testbed.runner.faults import FaultDriver
from testbed.runner.fidelity import below_compensation
from testbed.runner.follow import Follower
from testbed.runner.hostcpu import StealSampler
from testbed.runner.links import calibrate, counter_delta, inter_dc_counters, node_tcp
from testbed.runner.ranks import (
    LAUNCHERS,
    PRELOAD,
    RankGroup,
    command_env,
    missing_torch,
    rank_layout,
    server_env,
    workload_argv,
)
from testbed.runner.restarts import checkpoint_env, restart_figures
from testbed.runner.space import (
    OutOfSpace,
    cell_bytes,
    check_room,
    free_bytes,
    full_line,
    run_bytes,
    stop_when_full,
)
from testbed.spec.experiment import Experiment, load_experiment
from testbed.spec.faults import Fault
from testbed.spec.topology import load_topology
from testbed.steplog import read_records

ROOT = Path(__file__).resolve().parents[2]


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("testbed", "torch", "pyroute2", "pydantic", "pandas", "matplotlib"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def manifest(experiment: Experiment, source: Path | None, testbed: Testbed, extra: dict | None = None) -> dict:
    text = source.read_text() if source else json.dumps(experiment.model_dump(mode="json"))
    return {
        "experiment": experiment.name, "experiment_file": str(source) if source else None,
        "experiment_sha256": hashlib.sha256(text.encode()).hexdigest(), "experiment_text": text,
        "description": experiment.description, "git_commit": git_commit(), "versions": versions(),
        "kernel": platform.release(), "host_cpus": os.cpu_count(), "backend": testbed.state.backend,
        "shaper": testbed.plan.shaper, "tcp": node_tcp(testbed),
        "links": {end.key: {**end.shaping.params.describe(), "shaper": testbed.plan.shaper,
                            "mechanism": testbed.mechanism(end)}
                  for end in testbed.plan.link_ends if end.kind == "inter-dc"},
        "topology": testbed.topology.model_dump(mode="json"), "seed": experiment.workload.seed,
        "warmup_steps": experiment.workload.warmup_steps, "repetitions": experiment.repetitions,
        "started": datetime.now(UTC).isoformat(), **(extra or {}),
    }


LATE_FLAG_FRACTION, LATE_FLAG_FLOOR_MS = 0.05, 1.0  # the emulator itself is too late above max(5 % of delay, 1 ms)


def late_bound_ms(delay_ms: float) -> float:
    """p99 lateness of the delay line above which a cell's figures carry emulator error, not just endpoints'."""
    return max(LATE_FLAG_FRACTION * delay_ms, LATE_FLAG_FLOOR_MS)


def delay_line_cpu_s(before: dict, after: dict) -> float | None:
    """CPU seconds the delay lines' workers spent between two stats snapshots (direction key -> figures): one
    worker per gateway, which serves every direction arriving there (a->b is delayed in b's), counted once; a worker
    that replaced the one before counts from its start; a gateway with no figure before counts nothing (what it
    spent earlier is unknown). None where no worker says."""
    earlier = _workers(before)
    spent = []
    for gateway, now in _workers(after).items():
        then = earlier.get(gateway, [])
        worker, cpu = now[0]["worker"], max(f["worker_cpu_s"] for f in now)
        same = [f["worker_cpu_s"] for f in then if f["worker"] == worker]
        if same:
            spent.append(cpu - min(same))
        elif then:
            spent.append(cpu)  # restarted during the cell
    return sum(spent) if spent else None


def _workers(snapshot: dict) -> dict[str, list[dict]]:
    """A stats snapshot's figures that carry the worker's CPU, by gateway (the direction's receiving DC)."""
    out: dict[str, list[dict]] = {}
    for key, figures in snapshot.items():
        if figures.get("worker_cpu_s") is not None:
            out.setdefault(key.split("->")[-1], []).append(figures)
    return out


def delay_line_lateness(testbed: Testbed, before: dict, after: dict) -> dict[str, dict]:
    """Per delayed direction: how late the delay line released this cell's packets against their due times, and
    how its worker was scheduled (fifo, or other: where the machine refused real-time priority)."""
    out = {}
    for key, figures in sorted(after.items()):
        summary = lateness_summary(lateness_delta(before.get(key, {}), figures))
        delay_ms = testbed.plan.link_end(key).shaping.params.latency * 1e3
        out[key] = {**summary, "scheduling": figures.get("scheduling"), "delay_ms": delay_ms,
                    "bound_ms": late_bound_ms(delay_ms),
                    "late": summary["p99_ms"] is not None and summary["p99_ms"] > late_bound_ms(delay_ms),
                    # its own path, taken back (p50_ms above is the residual); a delay below least_ms is not
                    **{name: figures.get(name) for name in ("compensation_ms", "least_ms")},
                    "below_compensation": below_compensation(key, {**figures, "latency_ms": delay_ms})}
    return out


def reshape(testbed: Testbed, cell: Cell) -> None:
    """Bring every inter-DC direction to the cell's parameters with live changes only where they differ."""
    for key, params in cell.link_params().items():
        if testbed.plan.link_end(key).shaping.params != params:
            testbed.shape(key, params)


PG_TIMEOUT_S = 300.0  # the workload's process-group timeout without faults (its own default)
PG_TIMEOUT_MARGIN_S = 60.0  # beyond the longest partition: TCP's retransmission back-off after it clears


def pg_timeout(faults: list[Fault]) -> float:
    """The process-group timeout of a cell: long enough that no collective gives up during a declared partition
    (or a flap's down window), so training rides it out instead of failing."""
    return max(PG_TIMEOUT_S, longest_partition(faults) + PG_TIMEOUT_MARGIN_S)


def sdc_env(faults: list[Fault], cell_id: str, seed: int, replay: float = 0.0, by: str = "self") -> dict[str, str]:
    """TESTBED_SDC (the corruptions the workload injects, each with its fault's seed), TESTBED_SDC_CHECK (the
    checks run in every cell that has one), TESTBED_SDC_REPLAY (the share of steps replayed unasked) and
    TESTBED_SDC_BUDDY (replayed by a buddy); nothing without SDC faults."""
    items = [{"rank": f.rank, "step": f.at.step, "target": f.target, "bit": f.bit, "tensor": f.tensor,
              "index": f.index, "seed": fault_seed(seed, cell_id, i), "sticky": bool(f.sticky)}
             for i, f in enumerate(faults) if f.kind == "sdc"]
    if not items:
        return {}
    return RankEnv(sdc=tuple(items), sdc_check=True, sdc_replay=replay, sdc_buddy=by == "buddy").to_env()


def sdc_record(metrics_dir: Path) -> list[dict]:
    """result.json's `sdc`: every injection with what caught it (detected_by, classification; none: missed), then
    every detection no injection explains (a false positive, target null)."""
    injected, detected = [], []
    for path in sorted(metrics_dir.glob("rank*.jsonl")):
        for record in read_records(path, containing='"event": "sdc_'):
            if record.get("event") == "sdc_injected":
                injected.append(record)
            elif record.get("event") == "sdc_detected":
                detected.append(record)
    out, explained = [], set()
    for item in sorted(injected, key=lambda r: (r["step"], r["rank"])):
        hits = [i for i, d in enumerate(detected) if d["rank"] == item["rank"] and d["target"] == item["target"]
                and d["step"] >= item["step"] and i not in explained]
        first = hits[0] if hits else None
        if first is not None:
            explained.add(first)
        found = detected[first] if first is not None else {}
        out.append({"rank": item["rank"], "step": item["step"], "target": item["target"], "tensor": item["tensor"],
                    "index": item["index"], "bit": item["bit"], "detected_by": found.get("detected_by"),
                    "detected_at_step": found.get("step"), "classification": found.get("classification", "missed")})
    for i, found in enumerate(detected):
        if i not in explained:
            out.append({"rank": found["rank"], "step": found["step"], "target": None, "detected_by": found["detected_by"],
                        "detected_at_step": found["step"], "classification": found["classification"]})
    return out


def run_cell(testbed: Testbed, cell: Cell, argv: list[str], cell_dir: Path, timeout: float, calibration: str,
             ranks_per_node: int, on_tick: Callable[[Path], None] | None = None, faults: list[Fault] | None = None,
             seed: int = 0, sdc_replay: float = 0.0, sdc_replay_by: str = "self", forks: Forks | None = None,
             restarts: int = 0, checkpoint_every: int = 0, extra_env: dict[str, str] | None = None) -> dict:
    """Run one cell, with `faults` on their schedule; returns its result record (also written to
    cell_dir/result.json). With `forks`, ranks of the built-in workload are forked by it. After a rank dies,
    up to `restarts` times every rank is started again (on a fresh port), from the last checkpoint; `timeout`
    holds for the whole cell. `extra_env`: more for every rank's environment (a command's: ranks.command_env)."""
    faults = faults or []
    if cell_dir.exists():
        shutil.rmtree(cell_dir)  # an incomplete earlier attempt
    metrics_dir, log_dir = cell_dir / "metrics", cell_dir / "logs"
    metrics_dir.mkdir(parents=True)
    reshape(testbed, cell)
    started = time.time()
    probe = calibrate(testbed, calibration)
    before = inter_dc_counters(testbed)
    late_before = testbed.fabric.delay_line_stats()
    env = {**RankEnv(pg_timeout=pg_timeout(faults)).to_env(), **sdc_env(faults, cell.id, seed, sdc_replay, sdc_replay_by),
           **checkpoint_env(cell_dir, restarts, checkpoint_every, registry.get(testbed.state.backend).shares_files),
           **(extra_env or {})}
    emulated = registry.get(testbed.state.backend).emulated
    specs = rank_layout(testbed.topology, testbed.plan, ranks_per_node, metrics_dir, extra_env=env, emulated=emulated)
    sampler = StealSampler().start() if emulated else None  # the ranks share this machine's CPUs
    launched, clock = time.time(), time.monotonic()
    group = RankGroup(testbed.fabric, specs, argv, log_dir, forks)
    follower = None
    rank0 = metrics_dir / "rank0.jsonl"
    if any(fault.kind != "sdc" for fault in faults) and not registry.get(testbed.state.backend).shares_files:
        # rank 0 writes its step starts on another machine: a copy as it grows, for the driver's step anchors
        follower = Follower(testbed.fabric, specs[0].node.name, metrics_dir, "rank0.jsonl",
                            log_dir / "rank0.live.jsonl")
        rank0 = follower.path
    # the driver signals the ranks running now (a restart starts new ones)
    driver = FaultDriver(testbed, faults, cell.id, seed, rank0, cell_dir / "faults.json",
                         lambda rank, number: group.signal(rank, number),
                         lambda rank, slowdown, until: group.straggle(rank, slowdown, until),
                         rank_nodes=[spec.node.name for spec in specs])
    deaths: list[dict] = []
    try:
        driver.start()
        def health() -> str | None:
            cancel.check()
            dead = testbed.fabric.dead_delay_lines()
            return f"delay line died in {', '.join(dead)}" if dead else None

        while True:
            outcome = group.watch(timeout - (time.monotonic() - clock),
                                  on_tick=(lambda: on_tick(metrics_dir)) if on_tick else None, health=health)
            if outcome.ok or not outcome.died or len(deaths) >= restarts:
                break
            deaths.append({"failed_rank": outcome.failed_rank, "reason": outcome.reason, "died_at": time.time()})
            group.close()
            specs = rank_layout(testbed.topology, testbed.plan, ranks_per_node, metrics_dir, extra_env=env, emulated=emulated)
            group = RankGroup(testbed.fabric, specs, argv, log_dir / f"restart{len(deaths)}", forks)
        outcome.seconds = time.monotonic() - clock
    finally:
        try:
            fault_record = driver.stop()  # every link fault cleared before the next cell, also on failure
        finally:
            try:
                group.close()
            finally:
                if follower is not None:
                    follower.close()
                host_cpu = sampler.stop() if sampler else None
    testbed.fabric.fetch_outputs(metrics_dir)
    after = inter_dc_counters(testbed)
    late_after = testbed.fabric.delay_line_stats()
    lateness = delay_line_lateness(testbed, late_before, late_after)
    killed = [e["target"] for e in fault_record["faults"] if e["kind"] == "kill" and e.get("applied_at") is not None]
    if not outcome.ok and outcome.failed_rank is not None and f"rank {outcome.failed_rank}" in killed:
        outcome.reason += " (killed by the faults: timeline)"
    interpreter = None if outcome.ok else missing_torch(argv, outcome.log_tail)
    if interpreter:  # a command whose interpreter has no torch: which one it ran
        outcome.reason += ": " + interpreter
    if outcome.ok and fault_record["errors"]:  # the cell did not run under the faults it declares
        outcome.ok, outcome.reason = False, "fault not applied: " + "; ".join(fault_record["errors"])
    result = {"cell": dataclasses.asdict(cell), "argv": argv, "status": "ok" if outcome.ok else "failed",
              "reason": outcome.reason, "failed_rank": outcome.failed_rank, "log_tail": outcome.log_tail,
              "seconds": outcome.seconds, "started": started, "launched": launched,
              "launcher": group.launcher, "calibration": probe,
              "link_bytes": counter_delta(before, after), "world": len(specs), "ranks_per_node": ranks_per_node,
              "links": {k: testbed.plan.link_end(k).shaping.params.describe() for k in after},
              "mechanism": {k: testbed.mechanism(testbed.plan.link_end(k)) for k in after},
              "delay_line": lateness, "delay_line_cpu_s": delay_line_cpu_s(late_before, late_after),
              "host_cpu": host_cpu, "faults": fault_record, "sdc": sdc_record(metrics_dir),
              "restarts": restart_figures(metrics_dir / "rank0.jsonl", deaths),
              "delay_line_note": "" if lateness else f"no userspace delay line ({testbed.plan.shaper}): "
                                 "netem keeps no figure of how late it releases packets"}
    atomic_write(cell_dir / "result.json", json.dumps(result, indent=1))
    return result


def complete(cell_dir: Path) -> bool:
    try:
        return json.loads((cell_dir / "result.json").read_text()).get("status") in ("ok", "failed")
    except (OSError, ValueError):
        return False


def latest_run(out_root: Path, name: str) -> Path | None:
    runs = sorted(p for p in (out_root / name).glob("*") if (p / "manifest.json").exists())
    return runs[-1] if runs else None


def run_experiment(path: Path, out_root: Path, *, prefix: str | None = None, shaper: str = "auto",
                   resume: bool = False, only: str | None = None, progress: Any = None,
                   backend: str | Backend = registry.DEFAULT, launcher: str = "auto",
                   meanwhile: Callable[[], None] | None = None) -> Path:
    """Run (or resume) an experiment; returns the run directory (its report is testbed.collect's to build).
    Tears the fabric down whatever happens. `prefix`: None for one of the run's own that nobody else holds
    (ownership.claim_free), so that runs go side by side. `launcher`: how ranks start
    (testbed.runner.ranks.LAUNCHERS). `meanwhile`: work to do while the fork server imports torch (the CLI readies
    the report's plotting). OutOfSpace before the testbed comes up when the results' file system has too little
    room for the run, and as soon as a write fails for want of space (what was kept stays; --resume finishes)."""
    fork = launcher_forks(launcher, backend)
    experiment, topology = load_experiment(path)
    cells = plan_cells(experiment, topology)
    if only:
        cells = [c for c in cells if fnmatch.fnmatch(c.id, only) or only in c.id]
    run_dir = latest_run(out_root, experiment.name) if resume else None
    if run_dir is None:
        run_dir = out_root / experiment.name / datetime.now().strftime("%Y%m%d-%H%M%S")
    todo = [c for c in cells if not complete(run_dir / "cells" / c.id)]
    ranks = sum(dc.nodes for dc in topology.dcs) * experiment.workload.ranks_per_node
    check_room(run_dir, run_bytes(todo, ranks, experiment.restarts), f"this run ({len(todo)} cells of {ranks} ranks)")
    resume_argv = ["testbed", "run", str(path), "--resume"] + (["--out", str(out_root)] if out_root != Path("results")
                                                                else []) + (["--only", only] if only else [])
    prefix = hold(prefix)
    beside: dict[str, Owner] = {}
    try:
        with stop_when_full(run_dir, len(cells), resume_argv):
            run_dir.mkdir(parents=True, exist_ok=True)
            if progress:
                progress.start(len(cells), len(cells) - len(todo), run_dir)
                progress.console.print(f"[dim]testbed prefix: {prefix}[/dim]")
            with fabric(topology, path, prefix, shaper, backend) as testbed, \
                    fork_server(testbed, fork and bool(todo), run_dir, meanwhile) as forks:
                note_beside(beside, prefix)
                if not (run_dir / "manifest.json").exists():
                    atomic_write(run_dir / "manifest.json", json.dumps(manifest(
                        experiment, path, testbed, {"prefix": prefix, "shared_host": shared_host(beside)}), indent=1))
                if todo and experiment.calibrate != "none" and not (run_dir / CALIBRATION_FILE).exists():
                    calibrate_for_model(testbed, run_dir, experiment, progress, forks)
                for cell in todo:
                    cancel.check()
                    restarts = 0 if cell.baseline else experiment.restarts
                    room_for_cell(run_dir, cell_bytes(cell, ranks, restarts), len(cells), resume_argv)
                    note_beside(beside, prefix)
                    argv = workload_argv(cell.workload_args())
                    if progress:
                        progress.cell(cell)
                    cell_dir = run_dir / "cells" / cell.id
                    result = run_cell(testbed, cell, argv, cell_dir, experiment.cell_timeout,
                                      experiment.calibrate, experiment.workload.ranks_per_node,
                                      on_tick=(lambda d, c=cell: progress.tick(d, c.options["steps"])) if progress
                                      else None,
                                      faults=[] if cell.baseline else experiment.faults, seed=experiment.workload.seed,
                                      sdc_replay=experiment.sdc_replay, sdc_replay_by=experiment.sdc_replay_by,
                                      forks=forks, restarts=restarts, checkpoint_every=experiment.checkpoint_every)
                    failed_for_room(cell_dir, result, cell_bytes(cell, ranks, restarts), len(cells), resume_argv)
                    if progress:
                        progress.done(cell, result)
                note_beside(beside, prefix)
            return finish_run(run_dir, shared_host(beside))
    finally:
        release(prefix)  # a run's own prefix, also when the testbed never came up


def hold(prefix: str | None) -> str:
    """Hold the run's prefix before anything is written: the one given, or one of its own that nobody holds."""
    if prefix:
        claim(prefix, "another testbed does not come up under its prefix")
        return prefix
    return claim_free(DEFAULT_PREFIX, "it is not touched while that run lives")


def note_beside(beside: dict[str, Owner], prefix: str) -> None:
    """Add the testbeds other live processes hold now (they share this machine's cores) to `beside`."""
    for owner in live_owners():
        if owner.prefix != prefix:
            beside.setdefault(f"{owner.prefix} {owner.pid}", owner)


def shared_host(beside: dict[str, Owner]) -> list[dict]:
    """The manifest's `shared_host`: the other testbeds seen held on this machine during the run (at its start,
    before each cell and at its end): their prefix, pid, command and start. Empty: the run had the machine's
    cores to itself, as far as testbeds go."""
    return [{"prefix": o.prefix, "pid": o.pid, "command": o.command, "started": o.started} for o in beside.values()]


def room_for_cell(run_dir: Path, needed: int, total: int, resume: list[str] | None) -> None:
    """Stop before a cell whose files cannot be written (its estimate is more than the space left)."""
    if free_bytes(run_dir) < needed:
        raise OutOfSpace(full_line(run_dir, total, resume))


def failed_for_room(cell_dir: Path, result: dict, needed: int, total: int, resume: list[str] | None) -> None:
    """A cell that failed while the disk was full (its ranks could not write) is not kept as a failure: its
    result goes (--resume runs it again) and the run stops."""
    if result["status"] == "ok":
        return
    said = any("No space left" in line for line in result.get("log_tail") or [])
    if said or free_bytes(cell_dir) < needed:
        (cell_dir / "result.json").unlink(missing_ok=True)
        raise OutOfSpace(full_line(cell_dir.parent.parent, total, resume))


def launcher_forks(launcher: str, backend: str | Backend) -> bool:
    """Whether ranks of the built-in workload are forked; refuses (FabricError) fork where the backend cannot."""
    if launcher not in LAUNCHERS:
        raise FabricError(f"--launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    chosen = registry.get(backend) if isinstance(backend, str) else type(backend)
    if launcher == "fork" and not chosen.forks_ranks:
        raise FabricError(f"--launcher fork: the {chosen.name} backend starts every rank with a command of its "
                          "own (use exec or auto)")
    return launcher != "exec" and chosen.forks_ranks


@contextmanager
def fork_server(testbed: Testbed, wanted: bool, run_dir: Path,
                meanwhile: Callable[[], None] | None = None) -> Iterator[Forks | None]:
    """The run's fork server (its output in run_dir/forkserver.log), ready, closed whatever happens; None unless
    wanted. `meanwhile` runs while the server imports torch (seconds), before anything is measured."""
    forks = testbed.fabric.fork_server(PRELOAD, run_dir / "forkserver.log", server_env()) if wanted else None
    try:
        if meanwhile is not None:
            meanwhile()
        if forks is not None:
            forks.ready()
        yield forks
    finally:
        if forks is not None:
            forks.close()
CALIBRATION_FILE = "calibration.json"  # testbed.model.predict reads it from the run directory


def calibrate_for_model(testbed: Testbed, run_dir: Path, experiment: Experiment, progress: Any = None,
                        forks: Forks | None = None) -> None:
    """The cost model's calibration for this run (collective micro-benchmarks over the links as the topology
    sets them, the model's compute profile), written to the run directory; its ranks forked by the run's fork
    server where there is one. A failure is recorded, not fatal: the cells still run, without predictions."""
    from testbed.runner.calibrate import calibrate_testbed

    if progress:
        progress.console.print("[dim]calibrating the cost model (collective micro-benchmarks)[/dim]")
    try:
        calibration = calibrate_testbed(testbed, run_dir / "calibration", experiment,
                                        ranks_per_node=experiment.workload.ranks_per_node, forks=forks)
    except Exception as error:  # the run goes on without predictions
        atomic_write(run_dir / "calibration-failed.txt", f"{type(error).__name__}: {error}\n")
        return
    calibration.save(run_dir / CALIBRATION_FILE)


@contextmanager
def fabric(topology, topology_file: Path, prefix: str, shaper: str, backend: str | Backend) -> Iterator[Testbed]:
    """The testbed for a run, torn down whatever happens (also Ctrl-C or a failed cell)."""
    testbed = bring_up(topology, prefix=prefix, shaper=shaper, topology_file=topology_file, backend=backend)
    try:
        yield testbed
    finally:
        tear_down(prefix)


def finish_run(run_dir: Path, shared: list[dict] | None = None) -> Path:
    """Add every cell's link calibration, the end time and (given) the other testbeds seen on this machine
    during the run to the manifest."""
    path = run_dir / "manifest.json"
    data = json.loads(path.read_text())
    if shared is not None:
        seen = {(o["prefix"], o["pid"]) for o in data.get("shared_host", [])}
        data["shared_host"] = data.get("shared_host", []) + [o for o in shared if (o["prefix"], o["pid"]) not in seen]
    results = sorted((json.loads(p.read_text()) for p in (run_dir / "cells").glob("*/result.json")),
                     key=lambda result: result.get("started", 0.0))
    data["calibration"] = {r["cell"]["id"]: r.get("calibration", []) for r in results}
    data["finished"] = datetime.now(UTC).isoformat()
    atomic_write(path, json.dumps(data, indent=1))
    return run_dir


def run_command(topology_path: Path, command: list[str], out_root: Path, *, prefix: str | None = None,
                shaper: str = "auto",
                ranks_per_node: int = 1, timeout: float = 3600, progress: Any = None,
                backend: str | Backend = registry.DEFAULT, baseline: bool = False, warmup_steps: int = 2,
                tokens_per_step: int | None = None) -> Path:
    """Bring your own workload: run `command` as every rank across the emulated DCs, with the same env,
    logs, counters and manifest as an experiment (one cell named `command`; with `baseline`, first a cell
    `command__baseline` with every inter-DC link unshaped). Its optimizer's steps (seen by a hook installed at
    each rank's start: ranks.command_env), or the steps it reports itself (testbed.steplog), get the built-in
    workload's figures, the first `warmup_steps` left out; tokens/s with `tokens_per_step` (all ranks together)
    or steps it reports. `prefix` and a full disk as in run_experiment (the command's own files are not in the
    estimate: only the harness's)."""
    topology = load_topology(topology_path)
    experiment = Experiment(name=f"command-{topology.name}", topology=str(topology_path),
                            strategies=[{"name": "flat-dp"}], baseline="auto" if baseline else "none",
                            calibrate="rtt", cell_timeout=f"{timeout!r}s",  # seconds, as the CLI parsed them
                            description=f"user command: {' '.join(command)}")
    links = {k: dataclasses.asdict(v) for k, v in base_links(topology).items()}
    cells = [Cell("command", "command", {"steps": 0}, links)]
    if baseline:
        unshaped = {key: dataclasses.asdict(UNSHAPED) for key in links}
        cells.insert(0, Cell("command__baseline", "command", {"steps": 0}, unshaped, baseline=True))
    run_dir = out_root / experiment.name / datetime.now().strftime("%Y%m%d-%H%M%S")
    ranks = sum(dc.nodes for dc in topology.dcs) * ranks_per_node
    check_room(run_dir, run_bytes(cells, ranks), f"this run ({len(cells)} cells of {ranks} ranks)")
    prefix = hold(prefix)
    beside: dict[str, Owner] = {}
    try:
        with stop_when_full(run_dir, len(cells)), fabric(topology, topology_path, prefix, shaper, backend) as testbed:
            note_beside(beside, prefix)
            atomic_write(run_dir / "manifest.json", json.dumps(
                manifest(experiment, None, testbed, {"command": command, "warmup_steps": warmup_steps,
                                                     "tokens_per_step": tokens_per_step,
                                                     "prefix": prefix, "shared_host": shared_host(beside)}), indent=1))
            if progress:
                progress.start(len(cells), 0, run_dir)
                progress.console.print(f"[dim]testbed prefix: {prefix}[/dim]")
            for cell in cells:
                cancel.check()
                room_for_cell(run_dir, cell_bytes(cell, ranks), len(cells), None)
                note_beside(beside, prefix)
                if progress:
                    progress.cell(cell)
                result = run_cell(testbed, cell, command, run_dir / "cells" / cell.id, timeout, "rtt", ranks_per_node,
                                  extra_env=command_env(tokens_per_step))
                failed_for_room(run_dir / "cells" / cell.id, result, cell_bytes(cell, ranks), len(cells), None)
                if progress:
                    progress.done(cell, result)
            note_beside(beside, prefix)
            return finish_run(run_dir, shared_host(beside))
    finally:
        release(prefix)
