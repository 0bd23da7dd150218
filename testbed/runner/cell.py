"""One cell on a running testbed: re-shape the links live (no rebuild between latency cells), calibrate them (RTT
per DC pair), read the kernel counters of every inter-DC link end, start the ranks, watch them (faults on their
schedule, restarts from a checkpoint), read the counters again, and write cells/<id>/result.json last and
atomically: a cell without it is incomplete (complete()), so --resume redoes exactly those."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from testbed.atomic import write_text as atomic_write
from testbed.fabric import cancel
from testbed.fabric.forkserver import Forks
from testbed.fabric.lifecycle import Testbed
from testbed.model.predict import run_calibration
from testbed.model.transport import Transport
from testbed.plan.faults import longest_partition
from testbed.rankenv import RankEnv
from testbed.runner.cells import Cell
from testbed.runner.faults import FaultDriver
from testbed.runner.fidelity import delay_line_cpu_s, delay_line_lateness
from testbed.runner.follow import Follower
from testbed.runner.hostcpu import StealSampler
from testbed.runner.lighthouse import replica_groups
from testbed.runner.links import calibrate, counter_delta, inter_dc_counters
from testbed.runner.ranks import RankGroup, missing_torch, rank_layout
from testbed.runner.replicas import predict_heals, replica_figures
from testbed.runner.restarts import checkpoint_env, restart_figures
from testbed.runner.sdc import sdc_env, sdc_record
from testbed.spec.faults import Fault


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


def run_cell(testbed: Testbed, cell: Cell, argv: list[str], cell_dir: Path, timeout: float, calibration: str,
             ranks_per_node: int, on_tick: Callable[[Path], None] | None = None, faults: list[Fault] | None = None,
             seed: int = 0, sdc_replay: float = 0.0, sdc_replay_by: str = "self", forks: Forks | None = None,
             restarts: int = 0, checkpoint_every: int = 0, extra_env: dict[str, str] | None = None) -> dict:
    """Run one cell, with `faults` on their schedule; returns its result record (also written to
    cell_dir/result.json). With `forks`, ranks of the built-in workload are forked by it. After a rank dies,
    up to `restarts` times every rank is started again (on a fresh port), from the last checkpoint; `timeout`
    holds for the whole cell. `extra_env`: more for every rank's environment (a command's: ranks.command_env)."""
    faults = faults or []
    metrics_dir, log_dir = cell_dir / "metrics", cell_dir / "logs"
    groups = replica_groups(testbed, cell.options, log_dir)  # torchft's strategies: every DC a replica group
    if groups is None:
        # a DC's death ends any other strategy's job: it fails, or every rank restarts from the last checkpoint
        # (`restarts`); restart_after brings back only torchft's replica groups, which trained on without it
        faults = [fault.model_copy(update={"restart_after": None}) for fault in faults]
    if cell_dir.exists():
        shutil.rmtree(cell_dir)  # an incomplete earlier attempt
    metrics_dir.mkdir(parents=True)
    reshape(testbed, cell)
    started = time.time()
    probe = calibrate(testbed, calibration)
    before = inter_dc_counters(testbed)
    late_before = testbed.fabric.delay_line_stats()
    env = {**RankEnv(pg_timeout=pg_timeout(faults)).to_env(), **sdc_env(faults, cell.id, seed, sdc_replay, sdc_replay_by),
           **checkpoint_env(cell_dir, restarts, checkpoint_every, testbed.backend.shares_files),
           **(extra_env or {})}
    emulated = testbed.backend.emulated

    def layout() -> list:
        specs = rank_layout(testbed.topology, testbed.plan, ranks_per_node, metrics_dir, extra_env=env,
                            emulated=emulated)
        return groups.tell(specs) if groups else specs

    specs = layout()
    sampler = StealSampler().start() if emulated else None  # the ranks share this machine's CPUs
    launched, clock = time.time(), time.monotonic()
    if groups:
        groups.start()  # the lighthouse, before any group asks it for a quorum
    try:
        group = RankGroup(testbed.fabric, specs, argv, log_dir, forks)
    except BaseException:
        if groups:
            groups.close()
        raise
    follower = None
    rank0 = metrics_dir / "rank0.jsonl"
    if any(fault.kind != "sdc" for fault in faults) and not testbed.backend.shares_files:
        # rank 0 writes its step starts on another machine: a copy as it grows, for the driver's step anchors
        follower = Follower(testbed.fabric, specs[0].node.name, metrics_dir, "rank0.jsonl",
                            log_dir / "rank0.live.jsonl")
        rank0 = follower.path
    # the driver signals the ranks running now (a restart starts new ones)
    driver = FaultDriver(testbed, faults, cell.id, seed, rank0, cell_dir / "faults.json",
                         lambda rank, number: group.signal(rank, number),
                         lambda rank, slowdown, until: group.straggle(rank, slowdown, until),
                         rank_nodes=[spec.node.name for spec in specs], rank_dcs=[spec.node.dc for spec in specs],
                         # torchft's groups train on while a DC is down: its ranks' deaths do not end the cell
                         hold_rank=(lambda rank: group.hold(rank)) if groups else None,
                         restart_rank=lambda rank: group.restart(rank))
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
            specs = layout()
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
                if groups:
                    groups.close()
                host_cpu = sampler.stop() if sampler else None
    testbed.fabric.fetch_outputs(metrics_dir)
    after = inter_dc_counters(testbed)
    late_after = testbed.fabric.delay_line_stats()
    lateness = delay_line_lateness(testbed, late_before, late_after)
    killed = {rank for e in fault_record["faults"] if e["kind"] in ("kill", "partition") and e.get("applied_at") is not None
              for rank in driver.ranks_of(faults[e["index"]])}
    if not outcome.ok and outcome.failed_rank is not None and outcome.failed_rank in killed:
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
    if groups:  # torchft's groups: who was in the quorums, the heals, the pace around a DC's death or partition
        zero = fault_record["clock_zero"]
        outages = [(zero + e["applied_at"], zero + e["cleared_at"] if e.get("cleared_at") is not None else None)
                   for e in fault_record["faults"] if e["kind"] in ("kill", "partition")
                   and e.get("applied_at") is not None and zero is not None]
        result["replica_groups"] = replica_figures(metrics_dir, len(specs), outages,
                                                   [dc.name for dc in testbed.topology.dcs])
        fitted = run_calibration(cell_dir.parent.parent)  # the run's own calibration, where it has one
        predict_heals(result["replica_groups"], testbed.topology, cell.link_params(),
                      {node.address: node.dc for node in testbed.plan.nodes}, [spec.node.dc for spec in specs],
                      fitted.transport if fitted else Transport(), calibrated=fitted is not None,
                      options=cell.options)
    atomic_write(cell_dir / "result.json", json.dumps(result, indent=1))
    return result


def complete(cell_dir: Path) -> bool:
    try:
        return json.loads((cell_dir / "result.json").read_text()).get("status") in ("ok", "failed")
    except (OSError, ValueError):
        return False
