"""Measure what the cost model needs on a running testbed: the links' round trips, every rank running the
calibration micro-benchmarks (testbed.workload.calibrate) with the kernel counters of every inter-DC link end
read around them, and hand the records to testbed.model.calibration to fit."""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC
from pathlib import Path
from typing import Any

from testbed.atomic import write_text as atomic_write
from testbed.fabric.forkserver import Forks
from testbed.fabric.lifecycle import Testbed
from testbed.runner.links import calibrate as probe_links
from testbed.runner.links import counter_delta, inter_dc_counters, node_tcp
from testbed.runner.ranks import RankGroup, rank_layout
from testbed.spec.experiment import Experiment

CALIBRATION_FILE = "calibration.json"  # testbed.model.predict.CALIBRATION_FILE: where it reads it from a run


def benchmark_argv(sizes: list[int] | None = None, preset: str | None = None, micro_batch: int = 4,
                   seq_len: int | None = None, reps: int = 2, lanes: int = 4) -> list[str]:
    argv = [sys.executable, "-m", "testbed.workload.calibrate", "--reps", str(reps), "--lanes", str(lanes),
            "--micro-batch", str(micro_batch)]
    if sizes:
        argv += ["--sizes", ",".join(map(str, sizes))]
    if preset:
        argv += ["--preset", preset]
    if seq_len:
        argv += ["--seq-len", str(seq_len)]
    return argv


def measure(testbed: Testbed, work_dir: Path, argv: list[str], *, ranks_per_node: int = 1,
            timeout: float = 600, forks: Forks | None = None) -> dict[str, Any]:
    """Run the micro-benchmarks as every rank (forked by `forks` if given); returns {'records', 'probe',
    'link_bytes', 'links', 'world', 'launcher', ...}. Raises RuntimeError naming the rank when one fails."""
    if work_dir.exists():
        shutil.rmtree(work_dir)
    metrics, logs = work_dir / "metrics", work_dir / "logs"
    metrics.mkdir(parents=True)
    probe = probe_links(testbed, "rtt")
    before = inter_dc_counters(testbed)
    specs = rank_layout(testbed.topology, testbed.plan, ranks_per_node, metrics,
                        emulated=testbed.backend.emulated)
    group = RankGroup(testbed.fabric, specs, argv, logs, forks)
    try:
        outcome = group.watch(timeout)
    finally:
        group.close()
    testbed.fabric.fetch_outputs(metrics)
    after = inter_dc_counters(testbed)
    if not outcome.ok:
        tail = "; ".join((outcome.log_tail or [])[-3:])
        raise RuntimeError(f"calibration benchmark failed: {outcome.reason}{': ' + tail if tail else ''}")
    records = []
    for path in sorted(metrics.glob("calib*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {"records": records, "probe": probe, "link_bytes": counter_delta(before, after),
            "links": {k: testbed.plan.link_end(k).shaping.params.describe() for k in after},
            "link_params": {k: _params(testbed, k) for k in after}, "world": len(specs),
            "seconds": outcome.seconds, "launcher": group.launcher}


def _params(testbed: Testbed, key: str) -> dict[str, Any]:
    params = testbed.plan.link_end(key).shaping.params
    return {"latency": params.latency, "bandwidth": params.bandwidth, "jitter": params.jitter, "loss": params.loss}


def workload_profile(experiment: Any) -> dict[str, Any]:
    """The model and micro-batch whose forward+backward the benchmark profiles: an experiment's, when it runs
    real compute (or synthetic compute timed by measuring); none otherwise."""
    if experiment is None:
        return {}
    wl = experiment.workload
    if wl.compute == "synthetic" and (wl.compute_ms is not None or wl.device_tflops is not None):
        return {}
    return {"preset": wl.preset, "micro_batch": wl.micro_batch, "seq_len": wl.seq_len}


def calibrate_testbed(testbed: Testbed, work_dir: Path, experiment: Any = None, *, ranks_per_node: int = 1,
                      sizes: list[int] | None = None, reps: int = 1, timeout: float = 600,
                      forks: Forks | None = None):
    """Measure and fit: a testbed.model Calibration for this testbed as its links are now."""
    import os
    import platform
    from datetime import datetime

    from testbed.model.calibration import fit

    argv = benchmark_argv(sizes or [65536, 4194304], reps=reps, lanes=4, **workload_profile(experiment))
    measured = measure(testbed, work_dir, argv, ranks_per_node=ranks_per_node, timeout=timeout, forks=forks)
    measured["machine"] = {"kernel": platform.release(), "host_cpus": os.cpu_count(), "backend": testbed.state.backend,
                           "shaper": testbed.plan.shaper, "measured": datetime.now(UTC).isoformat(),
                           "tcp": node_tcp(testbed)}
    measured["shared_clock"] = testbed.backend.shared_clock
    (work_dir / "measured.json").write_text(json.dumps(measured))  # the raw figures, to refit later
    return fit(testbed.topology, measured, ranks_per_node)


def calibrate_for_model(testbed: Testbed, run_dir: Path, experiment: Experiment, progress: Any = None,
                        forks: Forks | None = None) -> None:
    """The cost model's calibration for this run (collective micro-benchmarks over the links as the topology
    sets them, the model's compute profile), written to the run directory; its ranks forked by the run's fork
    server where there is one. A failure is recorded, not fatal: the cells still run, without predictions."""
    if progress:
        progress.console.print("[dim]calibrating the cost model (collective micro-benchmarks)[/dim]")
    try:
        calibration = calibrate_testbed(testbed, run_dir / "calibration", experiment,
                                        ranks_per_node=experiment.workload.ranks_per_node, forks=forks)
    except Exception as error:  # the run goes on without predictions
        atomic_write(run_dir / "calibration-failed.txt", f"{type(error).__name__}: {error}\n")
        return
    calibration.save(run_dir / CALIBRATION_FILE)
