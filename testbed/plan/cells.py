"""Expand an experiment into cells (pure): strategy x sweep point x repetition, plus baseline cells."""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from testbed.plan.network import direction_key
from testbed.spec import units
from testbed.spec.experiment import LINK_KEY, LINK_PARSERS, Experiment
from testbed.spec.link import LinkParams
from testbed.spec.strategies import Options
from testbed.spec.topology import Topology

UNSHAPED = LinkParams()


@dataclass(frozen=True)
class Cell:
    id: str
    strategy: str  # label from the experiment
    options: dict[str, Any]  # testbed.workload Options fields
    links: dict[str, dict[str, Any]]  # direction key -> LinkParams fields
    sweep: dict[str, Any] = field(default_factory=dict)  # sweep key -> value as written
    repetition: int = 0
    baseline: bool = False

    def link_params(self) -> dict[str, LinkParams]:
        return {key: LinkParams(**value) for key, value in self.links.items()}

    def workload_args(self) -> list[str]:
        """Command-line arguments of `python -m testbed.workload` for this cell."""
        args = []
        for name, value in self.options.items():  # explicit, so result.json's argv reproduces the cell
            if value is None:
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + name.replace("_", "-"))
            else:
                args += [flag, str(value)]
        return args


def base_links(topology: Topology) -> dict[str, LinkParams]:
    out = {}
    for link in topology.links:
        a, b = link.between
        out[direction_key(a, b)] = link.forward()
        out[direction_key(b, a)] = link.backward()
    return out


def _apply_link_sweep(links: dict[str, LinkParams], topology: Topology, key: str, value: Any) -> None:
    match = LINK_KEY.match(key)
    assert match is not None
    target, name = match.group(1), match.group(2)
    number = LINK_PARSERS[name](value)
    if name == "distance":
        name, number = "latency", units.fibre_delay(number)
    if target == "*":
        pairs = [tuple(link.between) for link in topology.links]
    else:
        pairs = [tuple(part.strip() for part in target.split(","))]
    for a, b in pairs:
        for key_ in (direction_key(a, b), direction_key(b, a)):
            links[key_] = dataclasses.replace(links[key_], **{name: number})


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+=-]+", "-", text).strip("-")


def point_label(key: str, value: Any) -> str:
    """'links[east,west].latency', '10ms' -> 'latency-east-west=10ms'; 'workload.micro_batches' -> 'micro_batches=4'."""
    match = LINK_KEY.match(key)
    if match:
        target = "all" if match.group(1) == "*" else match.group(1).replace(" ", "").replace(",", "-")
        return _slug(f"{match.group(2)}-{target}={value}")
    return _slug(f"{key.split('.', 1)[-1]}={value}")


def _options(experiment: Experiment, strategy_index: int, workload_point: dict[str, Any]) -> dict[str, Any]:
    """Every workload option of the cell, explicit (defaults included), so result.json's argv reproduces it."""
    return dataclasses.asdict(Options(**experiment.cell_options(strategy_index, workload_point)))


def plan_cells(experiment: Experiment, topology: Topology) -> list[Cell]:
    """Baselines first (every inter-DC link unshaped, per strategy and workload sweep point), then every
    strategy at every sweep point, repetitions innermost."""
    keys = list(experiment.sweep)
    points = [dict(zip(keys, combo)) for combo in itertools.product(*(experiment.sweep[k] for k in keys))] or [{}]
    cells: list[Cell] = []
    if experiment.baseline == "auto":
        workload_points = []
        for point in points:
            wl = {k: v for k, v in point.items() if k.startswith("workload.")}
            if wl not in workload_points:
                workload_points.append(wl)
        unshaped = {key: dataclasses.asdict(UNSHAPED) for key in base_links(topology)}
        for s, spec in enumerate(experiment.strategies):
            for wl in workload_points:
                for rep in range(experiment.repetitions):
                    label = "__".join([_slug(spec.name), "baseline", *[point_label(k, v) for k, v in wl.items()],
                                       f"r{rep}"])
                    cells.append(Cell(label, spec.name, _options(experiment, s, wl), unshaped, wl, rep, True))
    for point in points:
        links = base_links(topology)
        for key, value in point.items():
            if key.startswith("links["):
                _apply_link_sweep(links, topology, key, value)
        wl = {k: v for k, v in point.items() if k.startswith("workload.")}
        link_fields = {k: dataclasses.asdict(v) for k, v in links.items()}
        for s, spec in enumerate(experiment.strategies):
            for rep in range(experiment.repetitions):
                label = "__".join([_slug(spec.name), *[point_label(k, v) for k, v in point.items()], f"r{rep}"])
                cells.append(Cell(label, spec.name, _options(experiment, s, wl), link_fields, point, rep, False))
    ids = [c.id for c in cells]
    assert len(ids) == len(set(ids)), "cell ids collide"
    return cells
