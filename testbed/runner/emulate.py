"""Run a scenario's scale model (`testbed emulate`): every laptop-scale cell testbed.model.scale_model derives, each
with its single-site baseline, through the same cell machinery as `testbed run` (testbed.runner.cell).

The run directory, results/<scenario>-emulate/<run>/:
- manifest.json: the scenario (file, text, hash), the points, versions, git commit, kernel, the other testbeds seen;
- scale_model.json: one record a scale cell (testbed.model.scale_model.ScaleCell without its experiment: strategy,
  point, the full-scale and scale-model predictions, the groups at both scales, what could not be matched) and
  `path`, the cell's directory relative to the run;
- cells/<strategy>__<distance>km__<bandwidth>gbit/: a run directory of its own, as `testbed run` writes one
  (experiment.yaml, the cell's experiment as the model derived it, which `testbed run` runs again; manifest.json;
  cells/<id>/result.json and metrics of its baseline and of the cell), so testbed.collect reads it as any run.

Cells whose topologies differ only in their inter-DC links' parameters share one testbed: it comes up once and each
cell re-shapes the links live, as an experiment's latency sweep does (no rebuild between cells). emulate.csv and the
report are testbed.collect.emulate's, built from this directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from testbed.atomic import write_text as atomic_write
from testbed.fabric import cancel, registry
from testbed.fabric.backend import Backend
from testbed.fabric.ownership import Owner, release
from testbed.runner.cell import complete, run_cell
from testbed.runner.cells import Cell, plan_cells
from testbed.runner.forks import fork_server, launcher_forks
from testbed.runner.manifest import git_commit, manifest, versions
from testbed.runner.ranks import workload_argv
from testbed.runner.session import fabric, finish_run, hold, note_beside, shared_host
from testbed.runner.space import cell_bytes, check_room, failed_for_room, room_for_cell, run_bytes, stop_when_full
from testbed.spec.experiment import Experiment, load_experiment
from testbed.spec.scenario import load_scenario
from testbed.spec.topology import Topology

SCALE_MODEL_FILE = "scale_model.json"
EXPERIMENT_FILE = "experiment.yaml"
SHAPING_FIELDS = ("latency", "distance", "bandwidth", "jitter", "loss", "queue", "reverse")  # re-shaped live

Derive = Callable[..., list[Any]]  # testbed.model.scale_model.derive(scenario, points, calibration)


@dataclasses.dataclass
class Planned:
    """One scale cell ready to run: its record, its directory, its experiment and the cells it expands into."""

    record: dict[str, Any]
    path: Path
    experiment: Experiment
    topology: Topology
    cells: list[Cell]


def cell_name(strategy: str, distance_km: float, bandwidth_gbit: float) -> str:
    """A scale cell's directory name: strategy__1000km__1600gbit."""
    slug = re.sub(r"[^A-Za-z0-9.+=-]+", "-", strategy).strip("-")
    return f"{slug}__{distance_km:g}km__{bandwidth_gbit:g}gbit"


def testbed_key(topology: dict[str, Any]) -> str:
    """What a testbed is built from, without what a cell re-shapes live (the inter-DC links' parameters): two
    scale cells with the same key run on one testbed."""
    data = json.loads(json.dumps(topology))
    data.pop("name", None)
    for link in data.get("links", []):
        for name in SHAPING_FIELDS:
            link.pop(name, None)
    return json.dumps(data, sort_keys=True)


def prepare(cells: list[Any], run_dir: Path) -> list[Planned]:
    """Write every scale cell's experiment.yaml and load it back as `testbed run` would (one clear line naming the
    file and field where the model derived something invalid), before anything is built."""
    planned = []
    for cell in cells:
        record = {f.name: getattr(cell, f.name) for f in dataclasses.fields(cell) if f.name != "experiment"}
        path = run_dir / "cells" / cell_name(cell.strategy, cell.distance_km, cell.bandwidth_gbit)
        path.mkdir(parents=True, exist_ok=True)
        if not (path / EXPERIMENT_FILE).exists():  # --resume keeps what the first attempt derived
            atomic_write(path / EXPERIMENT_FILE, yaml.safe_dump(cell.experiment, sort_keys=False))
        experiment, topology = load_experiment(path / EXPERIMENT_FILE)
        record["path"] = str(path.relative_to(run_dir))
        planned.append(Planned(record, path, experiment, topology, plan_cells(experiment, topology)))
    return planned


def latest_run(out_root: Path, name: str) -> Path | None:
    runs = sorted(p for p in (out_root / f"{name}-emulate").glob("*") if (p / SCALE_MODEL_FILE).exists())
    return runs[-1] if runs else None


def run_emulate(scenario_path: Path, out_root: Path, *, points: str = "distance", prefix: str | None = None,
                shaper: str = "auto", backend: str | Backend = registry.DEFAULT, launcher: str = "auto",
                progress: Any = None, resume: bool = False, derive: Derive | None = None,
                calibration: Any = None) -> Path:
    """Derive the scenario's scale model at `points` and run every cell with its baseline; returns the run
    directory (module docstring). `derive`: testbed.model.scale_model.derive unless given (tests give their own).
    Every testbed is torn down whatever happens; OutOfSpace as in run_experiment."""
    fork = launcher_forks(launcher, backend)
    scenario = load_scenario(scenario_path)
    if derive is None:
        from testbed.model.scale_model import derive
    run_dir = latest_run(out_root, scenario.name) if resume else None
    run_dir = run_dir or out_root / f"{scenario.name}-emulate" / datetime.now().strftime("%Y%m%d-%H%M%S")
    planned = prepare(derive(scenario, points, calibration), run_dir)
    todo = [(p, c) for p in planned for c in p.cells if not complete(p.path / "cells" / c.id)]
    total = sum(len(p.cells) for p in planned)
    ranks = {id(p): sum(dc.nodes for dc in p.topology.dcs) * p.experiment.workload.ranks_per_node for p in planned}
    check_room(run_dir, run_bytes([], 0) + sum(cell_bytes(c, ranks[id(p)]) for p, c in todo),
               f"this scale model ({len(todo)} cells)")
    resume_argv = ["testbed", "emulate", str(scenario_path), "--points", points, "--resume"] + (
        ["--out", str(out_root)] if out_root != Path("results") else [])
    text = Path(scenario_path).read_text()
    atomic_write(run_dir / SCALE_MODEL_FILE, json.dumps([p.record for p in planned], indent=1))
    if not (run_dir / "manifest.json").exists():
        atomic_write(run_dir / "manifest.json", json.dumps({
            "scenario": scenario.name, "scenario_file": str(scenario_path), "scenario_text": text,
            "scenario_sha256": hashlib.sha256(text.encode()).hexdigest(), "points": points,
            "git_commit": git_commit(), "versions": versions(), "started": datetime.now(UTC).isoformat()}, indent=1))
    groups: dict[str, list[Planned]] = {}
    for item in planned:
        groups.setdefault(testbed_key(item.experiment.topology if isinstance(item.experiment.topology, dict)
                                      else item.topology.model_dump(mode="json")), []).append(item)
    prefix = hold(prefix)
    beside: dict[str, Owner] = {}
    try:
        with stop_when_full(run_dir, total, resume_argv):
            if progress:
                progress.start(total, total - len(todo), run_dir)
                progress.console.print(f"[dim]testbed prefix: {prefix}; {len(groups)} testbed(s)[/dim]")
            for group in groups.values():
                wanted = [(p, c) for p, c in todo if any(p is g for g in group)]
                if not wanted:
                    continue
                _run_group(group, wanted, prefix, shaper, backend, fork, run_dir, total, resume_argv, ranks,
                           beside, progress)
            note_beside(beside, prefix)
    finally:
        release(prefix)
    data = json.loads((run_dir / "manifest.json").read_text())
    data.update(finished=datetime.now(UTC).isoformat(), shared_host=shared_host(beside))
    atomic_write(run_dir / "manifest.json", json.dumps(data, indent=1))
    return run_dir


def _run_group(group: list[Planned], wanted: list[tuple[Planned, Cell]], prefix: str, shaper: str,
               backend: str | Backend, fork: bool, run_dir: Path, total: int, resume_argv: list[str],
               ranks: dict[int, int], beside: dict[str, Owner], progress: Any) -> None:
    """The scale cells of one testbed: it comes up once (the first cell's topology), each cell re-shapes the
    links, and it goes down whatever happens."""
    first = group[0]
    with fabric(first.topology, first.path / EXPERIMENT_FILE, prefix, shaper, backend) as testbed, \
            fork_server(testbed, fork, first.path) as forks:
        note_beside(beside, prefix)
        for item in group:
            if not (item.path / "manifest.json").exists():
                atomic_write(item.path / "manifest.json", json.dumps(manifest(
                    item.experiment, item.path / EXPERIMENT_FILE, testbed,
                    {"prefix": prefix, "scale_model": item.record}), indent=1))
        for item, cell in wanted:
            cancel.check()
            room_for_cell(run_dir, cell_bytes(cell, ranks[id(item)]), total, resume_argv)
            note_beside(beside, prefix)
            if progress:
                progress.cell(cell)
            cell_dir = item.path / "cells" / cell.id
            result = run_cell(testbed, cell, workload_argv(cell.workload_args()), cell_dir,
                              item.experiment.cell_timeout, item.experiment.calibrate,
                              item.experiment.workload.ranks_per_node,
                              on_tick=(lambda d, c=cell: progress.tick(d, c.options["steps"])) if progress else None,
                              seed=item.experiment.workload.seed, forks=forks)
            failed_for_room(cell_dir, result, cell_bytes(cell, ranks[id(item)]), total, resume_argv)
            if progress:
                progress.done(cell, result)
        note_beside(beside, prefix)
        for item in group:
            finish_run(item.path, shared_host(beside))
