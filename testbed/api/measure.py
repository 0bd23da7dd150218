"""Measuring a testbed: probe its links (RTT and goodput against what is configured), calibrate the cost model
on them. Both on a testbed brought up for the purpose and torn down after, or (probe) on the running one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.api.errors import UserError, user_errors
from testbed.api.testbeds import Progress, dead_delay_lines_line, testbed

if TYPE_CHECKING:
    from testbed.fabric.backend import Backend


def seconds(command: str, flag: str, value: str, *, zero: bool = False) -> float:
    """A duration option (`10min`, `2s`) in seconds, parsed as a file's durations are: a bare number, a unit
    that reads two ways or a negative one is a UserError, and 0 too unless `zero`."""
    from testbed.spec import units

    try:
        parsed = units.parse_duration(value, unit_hint="s")
    except ValueError as error:
        raise UserError(f"testbed {command}: {flag}: {error}") from None
    if parsed == 0 and not zero:
        raise UserError(f"testbed {command}: {flag}: must be more than 0, got {value!r}")
    return parsed


def probe(topology: Path | None = None, *, prefix: str, pings: int = 200, flow_seconds: float = 3.0,
          out_dir: Path | None = None, shaper: str = "auto", backend: str | Backend = "netns",
          on_progress: Progress | None = None,
          on_pair: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """RTT (p50/p99 of `pings` pings) and TCP goodput (a flow of `flow_seconds` each way; 0: pings only) of
    every DC pair against what is configured: `topology` brought up for it and torn down after, or without one
    the running testbed of `prefix`. A delay line not running before the probe is a UserError (exit 1). Returns
    testbed (its description), pairs (one record per direction), dead_delay_lines (those that died during the
    probe: its figures are not valid) and report (probe.json and probe.md under `out_dir`, if given)."""
    from testbed.runner.probe import as_records, probe_all

    with testbed(topology, prefix=prefix, shaper=shaper, backend=backend, on_progress=on_progress) as probed:
        dead = probed.fabric.dead_delay_lines()
        if dead:
            raise UserError(dead_delay_lines_line(dead), 1)
        with user_errors():
            results = probe_all(probed.fabric, probed.plan, probed.topology, pings=pings, seconds=flow_seconds,
                                applied=probed.fabric.delay_applied, on_pair=on_pair,
                                here=probed.backend.emulated)
        dead = probed.fabric.dead_delay_lines()
        info = probed.describe()
    records = as_records(results)
    report = None
    if out_dir is not None:
        from testbed.collect.probe import write_probe_report

        report = write_probe_report(out_dir, info, records)
    return {"testbed": info, "pairs": records, "dead_delay_lines": dead, "report": report}


def calibrate(target: Path, output: Path, *, prefix: str, shaper: str = "auto", backend: str | Backend = "netns",
              sizes: list[int] | None = None, reps: int = 2) -> dict[str, Any]:
    """The cost model's calibration measured on this machine's emulated links: `target` (a topology, or an
    experiment: its topology, its ranks per node, its model's compute profiled) brought up, collective
    micro-benchmarks per DC pair, fitted, torn down; written to `output` (`plan(calibration=output)` reads it).
    Returns file and fit (samples, median_abs_error, p90_abs_error, ...)."""
    import yaml

    from testbed.runner.calibrate import calibrate_testbed
    from testbed.spec.experiment import load_experiment

    text = yaml.safe_load(Path(target).read_text()) if Path(target).exists() else None
    experiment, ranks_per_node = None, 1
    if isinstance(text, dict) and "strategies" in text:
        with user_errors():
            experiment, topology = load_experiment(target)
        ranks_per_node = experiment.workload.ranks_per_node
    else:
        topology = target
    with testbed(topology, prefix=prefix, shaper=shaper, backend=backend, source=Path(target)) as measured, \
            user_errors():
        calibration = calibrate_testbed(measured, output.parent / (output.stem + "-work"), experiment,
                                        ranks_per_node=ranks_per_node, sizes=sizes, reps=reps)
    calibration.save(output)
    return {"file": output, "fit": calibration.fit}
