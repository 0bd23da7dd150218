"""The experiment file: a topology x strategies x a parameter sweep, the workload, repetitions, thresholds.

Everything that can be known before running is checked when the file loads: options against their
definitions (testbed.spec.strategies), every cell's options together against the model and the topology,
thresholds against the cells the experiment will produce."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from testbed.spec import units
from testbed.spec.errors import SpecError, closest, did_you_mean, named_pattern
from testbed.spec.faults import Fault
from testbed.spec.link import check_link, si_numbers
from testbed.spec.loader import load_yaml, validate_data
from testbed.spec.strategies import (
    DILOCO,
    OPTIONS,
    STRATEGIES,
    TORCHFT,
    OptionError,
    Options,
    check_option,
    check_options,
    problem_of,
)
from testbed.spec.topology import FILE_NAME_PATTERN, Topology, load_topology, topology_from_data

LINK_KEY = re.compile(r"^links\[(\*|[a-z][a-z0-9_]*\s*,\s*[a-z][a-z0-9_]*)\]\.(latency|distance|bandwidth|jitter|loss)$")
LINK_FIELDS = ("latency", "distance", "bandwidth", "jitter", "loss")
LINK_PARSERS = {"latency": units.parse_delay, "distance": units.parse_distance, "bandwidth": units.parse_rate,
                "jitter": units.parse_delay, "loss": units.parse_fraction}
METRICS = ("tokens_per_s", "step_s_median", "step_s_mean", "step_s_p90", "scaling_efficiency",
           "efficiency_vs_single_site", "exposed_comm_share", "bubble_ratio", "inter_dc_gb_per_step", "final_loss",
           "replicas_apart")
NEEDS_BASELINE = ("scaling_efficiency", "efficiency_vs_single_site")
# which restart from a checkpoint: rank 0's (the data-parallel ones: its state is every rank's) or each rank's own
# (FSDP2's shards, pp's stages, the DiLoCos' DCs with their syncs in flight), testbed.workload.checkpoint
RESTART_STRATEGIES = ("flat-dp", "hier-dp", "hier-dp-overlap", "ddp", "fsdp", "hsdp", "pp", "diloco",
                      "streaming-diloco", "async-diloco")
# where replicas are bit-identical after every step (in the DiLoCos: a DC's ranks, between outer syncs; in pp a
# stage's ranks; in hsdp the ranks holding the same shard, one per DC)
SDC_STRATEGIES = ("flat-dp", "hier-dp", "hier-dp-overlap", "pp", "diloco", "streaming-diloco", "async-diloco", "ddp",
                  "hsdp", "fsdp")
# whose gradients leave bucket by bucket during backward (FSDP2's: parameter by parameter): each is checked as it
# leaves, and a step sampled for a replay computes its gradient once beforehand, without communicating; no buddy
# can compare a rank's gradient before it leaves
CHECKED_IN_BUCKETS = ("hier-dp-overlap", "ddp", "fsdp", "hsdp")
WORKLOAD_OPTIONS = ("preset", "micro_batch", "micro_batches", "seq_len", "steps", "seed", "lr", "compute_ms",
                    "device_tflops")  # WorkloadSpec fields that are workload options (checked by their definition)


class WorkloadSpec(BaseModel):
    """What every rank runs (the built-in workload); strategy options come from each strategy entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str = "tiny"
    micro_batch: int = 4
    micro_batches: int = 2
    seq_len: int | None = None
    steps: int = 12
    warmup_steps: int = Field(2, ge=0)
    seed: int = 1234
    lr: float = 3e-3
    compute: Literal["real", "synthetic"] = "real"
    compute_ms: float | None = None
    device_tflops: float | None = None
    ranks_per_node: int = Field(1, ge=1, le=8)

    @field_validator(*WORKLOAD_OPTIONS, mode="before")
    @classmethod
    def _option(cls, value: Any, info: Any) -> Any:
        return check_option(info.field_name, value)

    @model_validator(mode="after")
    def _warmup(self) -> WorkloadSpec:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps: {self.warmup_steps} leaves no measured step of {self.steps}")
        return self


class StrategySpec(BaseModel):
    """One strategy to compare: a label, the workload strategy, and its options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=named_pattern(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}$",
                                            "a label: a letter or digit, then up to 39 letters, digits, _, ., + or -"))
    strategy: str | None = None
    options: dict[str, Any] = {}

    @model_validator(mode="after")
    def _known(self) -> StrategySpec:
        strategy = self.strategy or self.name
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: unknown strategy {strategy!r}{did_you_mean(strategy, STRATEGIES)} "
                             f"(known: {', '.join(STRATEGIES)})")
        for key, value in self.options.items():
            definition = OPTIONS.get(key)
            if definition is None or definition.place == "harness":
                known = [name for name, d in OPTIONS.items() if d.place == "any" and strategy in d.strategies]
                raise ValueError(f"options.{key}: unknown strategy option{did_you_mean(key, known)}")
            if definition.place == "workload":
                raise ValueError(f"options.{key}: set it under workload:, for every strategy")
            if strategy not in definition.strategies:
                raise ValueError(f"options.{key}: {strategy} does not use it (used by {', '.join(definition.strategies)})")
            try:
                self.options[key] = check_option(key, value)
            except ValueError as error:
                raise ValueError(f"options.{key}: {error}") from None
            if definition.when:
                other, values = definition.when
                if self.options.get(other, OPTIONS[other].default) not in values:
                    raise ValueError(f"options.{key}: only used with {other}: {' or '.join(values)}")
        return self

    @property
    def workload_strategy(self) -> str:
        return self.strategy or self.name


class Threshold(BaseModel):
    """A CI gate: `metric` of the cells matching `strategy` and `where` must stay within [min, max];
    with `than`, the ratio of strategy's metric to `than`'s must. `claim` names the published claim the
    threshold mirrors, for the report."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    claim: str | None = None
    than: str | None = None

    metric: Literal[METRICS]  # type: ignore[valid-type]
    strategy: str | None = None
    where: dict[str, Any] = {}
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> Threshold:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.than is not None and self.strategy is None:
            raise ValueError("than: compares a strategy with another; give strategy too")
        return self


def resolve_where(key: str, sweep_keys: list[str]) -> str:
    """The sweep key a threshold's `where` key names: itself, or the one sweep key ending in '.key'."""
    if key in sweep_keys:
        return key
    matches = [k for k in sweep_keys if k.endswith("." + key)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"{key!r} is ambiguous: give the whole sweep key ({' or '.join(matches)})")
    raise ValueError(f"{key!r} is not swept (sweep keys: {', '.join(sweep_keys) or 'none'})")


class Experiment(BaseModel):
    """A whole experiment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=FILE_NAME_PATTERN)
    description: str = ""
    topology: str | dict[str, Any]
    workload: WorkloadSpec = WorkloadSpec()
    strategies: list[StrategySpec] = Field(min_length=1)
    sweep: dict[str, list[Any]] = {}
    repetitions: int = Field(1, ge=1, le=20)
    baseline: Literal["auto", "none"] = "auto"
    calibrate: Literal["rtt", "full", "none"] = "rtt"
    cell_timeout: float = Field(300.0, gt=0)  # a duration with its unit (300s, 10min), in seconds once parsed
    thresholds: list[Threshold] = []
    faults: list[Fault] = []  # the timeline every cell of this experiment replays (testbed.spec.faults)
    sdc_replay: float = 0.0  # with sdc faults: the share of steps each rank replays unasked (testbed.workload.sdc)
    sdc_replay_by: Literal["self", "buddy"] = "self"  # who replays a sampled step: the rank, or another replica
    restarts: int = Field(0, ge=0, le=100)  # after a rank dies, start every rank again (from the last checkpoint)
    checkpoint_every: int = Field(0, ge=0)  # steps between checkpoints (0: a restart begins at step 0)

    @field_validator("cell_timeout", mode="before")
    @classmethod
    def _cell_timeout(cls, value: Any, info: ValidationInfo) -> float:
        return units.parse_duration(value, si=si_numbers(info), unit_hint="s")

    @field_validator("sdc_replay", mode="before")
    @classmethod
    def _replay_share(cls, value: Any) -> float:
        return units.parse_fraction(value)

    @field_validator("strategies", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Experiment:
        names = [s.name for s in self.strategies]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"strategies[{index}].name: duplicate strategy name {name!r}")
        for key, values in self.sweep.items():
            self._check_sweep(key, values, si_numbers(info))
        for index, threshold in enumerate(self.thresholds):
            self._check_threshold(f"thresholds[{index}]", threshold)
        for index, fault in enumerate(self.faults):
            if fault.kind == "sdc":
                self._check_sdc(f"faults[{index}]", fault)
        for index, fault in enumerate(self.faults):
            dark = fault.duration if fault.kind == "partition" else fault.down if fault.kind == "flap" else None
            if dark is not None and dark >= self.cell_timeout:
                raise ValueError(f"faults[{index}].{'duration' if fault.kind == 'partition' else 'down'}: the link "
                                 f"is dark for {dark:g} s, as long as cell_timeout ({self.cell_timeout:g} s) or longer")
        if self.sdc_replay and not any(fault.kind == "sdc" for fault in self.faults):
            raise ValueError("sdc_replay: replays check for silent data corruption: add an sdc fault to faults:")
        if self.sdc_replay_by == "buddy":
            if not self.sdc_replay:
                raise ValueError("sdc_replay_by: a buddy replays sampled steps: set sdc_replay too")
            if self.workload.compute == "synthetic":
                raise ValueError("sdc_replay_by: a buddy recomputes another rank's gradient from its samples: "
                                 "synthetic compute has none (workload.compute: real)")
            for index, spec in enumerate(self.strategies):
                if spec.workload_strategy == "pp":
                    raise ValueError(f"sdc_replay_by: a pipeline stage's inputs come from other stages, so no buddy "
                                     f"can recompute them (strategies[{index}], {spec.name})")
        if self.checkpoint_every and not self.restarts:
            raise ValueError("checkpoint_every: checkpoints are what restarts begin from: set restarts too")
        if self.restarts:
            for index, spec in enumerate(self.strategies):
                if spec.workload_strategy not in (*RESTART_STRATEGIES, *TORCHFT):
                    raise ValueError(f"restarts: ranks restart from a checkpoint in {', '.join(RESTART_STRATEGIES)} "
                                     f"only, not {spec.workload_strategy} (strategies[{index}], {spec.name}: it "
                                     "keeps no checkpoint)")
        return self

    def _check_sdc(self, field: str, fault: Fault) -> None:
        """Silent data corruption is injected and checked where replicas are identical (testbed.workload.sdc)."""
        for spec in self.strategies:
            strategy = spec.workload_strategy
            if strategy not in SDC_STRATEGIES:
                raise ValueError(f"{field}.kind: sdc is injected and checked in {', '.join(SDC_STRATEGIES)} only, "
                                 f"not {strategy} (strategy {spec.name})")
            if fault.target == "gradient" and spec.options.get("comm_hook") == "powersgd":
                raise ValueError(f"{field}.target: PowerSGD's error feedback would carry a poisoned bucket into "
                                 f"every later step (strategy {spec.name}; target: parameter can)")
            if self.sdc_replay_by == "buddy" and strategy in CHECKED_IN_BUCKETS:
                raise ValueError(f"sdc_replay_by: {strategy}'s gradients leave bucket by bucket during backward: no "
                                 f"buddy can compare a rank's gradient before it leaves (strategy {spec.name}; "
                                 "sdc_replay_by: self can)")

    def _check_sweep(self, key: str, values: list[Any], si: bool = False) -> None:
        if not values:
            raise ValueError(f"sweep.{key}: give at least one value")
        match = LINK_KEY.match(key)
        if match:
            parser = LINK_PARSERS[match.group(2)]
            for index, value in enumerate(values):
                try:
                    parser(value, si=si)
                except ValueError as error:
                    raise ValueError(f"sweep.{key}[{index}]: {error}") from None
            return
        if not key.startswith("workload."):
            head, _, field = key.rpartition(".")
            close = closest(field, LINK_FIELDS) if key.startswith("links[") else None
            hint = f" (did you mean {head}.{close}?)" if close else ""
            raise ValueError(f"sweep.{key}: expected links[A,B].<field> for the link between DCs A and B, "
                             f"links[*].<field> for every link (field: {', '.join(LINK_FIELDS)}) or "
                             f"workload.<option>{hint}")
        name = key.split(".", 1)[1]
        definition = OPTIONS.get(name)
        if definition is None or definition.place == "harness":
            known = [option for option, d in OPTIONS.items() if d.place != "harness"]
            raise ValueError(f"sweep.{key}: unknown workload option {name!r}{did_you_mean(name, known)}")
        if name == "synthetic":
            raise ValueError(f"sweep.{key}: sweep workload.compute in separate experiments")
        users = [s.name for s in self.strategies if s.workload_strategy in definition.strategies]
        if not users:
            raise ValueError(f"sweep.{key}: no strategy of this experiment uses {name} "
                             f"(used by {', '.join(definition.strategies)})")
        for index, value in enumerate(values):
            try:
                check_option(name, value)
            except ValueError as error:
                raise ValueError(f"sweep.{key}[{index}]: {error}") from None

    def _check_threshold(self, field: str, threshold: Threshold) -> None:
        names = [s.name for s in self.strategies]
        for part in ("strategy", "than"):
            value = getattr(threshold, part)
            if value is not None and value not in names:
                raise ValueError(f"{field}.{part}: {value!r} is not a strategy of this experiment"
                                 f"{did_you_mean(value, names)} (strategies: {', '.join(names)})")
        if threshold.than is not None and threshold.than == threshold.strategy:
            raise ValueError(f"{field}.than: compares {threshold.than} with itself")
        for key, value in threshold.where.items():
            try:
                sweep_key = resolve_where(key, list(self.sweep))
            except ValueError as error:
                raise ValueError(f"{field}.where.{key}: {error}") from None
            written = [str(v) for v in self.sweep[sweep_key]]
            if str(value) not in written:
                raise ValueError(f"{field}.where.{key}: no cell has {sweep_key} = {value} "
                                 f"(swept: {', '.join(written)})")
        if threshold.metric in NEEDS_BASELINE and self.baseline != "auto":
            raise ValueError(f"{field}.metric: {threshold.metric} is measured against baseline cells, "
                             "and this experiment has baseline: none")
        involved = [s for s in self.strategies if threshold.strategy is None or s.name in
                    (threshold.strategy, threshold.than)]
        if threshold.metric == "bubble_ratio":
            other = [s.name for s in involved if s.workload_strategy != "pp"]
            if other:
                raise ValueError(f"{field}.metric: bubble_ratio is measured for pipelines (pp) only, "
                                 f"not {', '.join(other)}")
        if threshold.metric == "replicas_apart":
            other = [s.name for s in involved if s.workload_strategy not in TORCHFT]
            if other:
                raise ValueError(f"{field}.metric: replicas_apart is measured for torchft's replica groups only, "
                                 f"not {', '.join(other)}")
        if threshold.metric == "final_loss" and self.workload.compute == "synthetic":
            raise ValueError(f"{field}.metric: synthetic compute has no loss")

    # --- cells ---------------------------------------------------------------------------------------------
    def workload_points(self) -> list[dict[str, Any]]:
        """Every combination of the workload sweep values ([{}] without any)."""
        keys = [k for k in self.sweep if k.startswith("workload.")]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(self.sweep[k] for k in keys))]

    def cell_options(self, index: int, workload_point: dict[str, Any]) -> dict[str, Any]:
        """The workload options of strategy `index` at a workload sweep point (only those set)."""
        wl = self.workload
        spec = self.strategies[index]
        values: dict[str, Any] = {
            "strategy": spec.workload_strategy, "steps": wl.steps, "preset": wl.preset, "micro_batch": wl.micro_batch,
            "micro_batches": wl.micro_batches, "seq_len": wl.seq_len, "lr": wl.lr, "seed": wl.seed,
            "synthetic": wl.compute == "synthetic", "compute_ms": wl.compute_ms, "device_tflops": wl.device_tflops}
        values.update(spec.options)
        values.update({key.split(".", 1)[1]: value for key, value in workload_point.items()})
        return values

    def field_of(self, index: int, workload_point: dict[str, Any], option: str) -> tuple[str, str]:
        """Where the user wrote option `option` of strategy `index`, or would write it: (field, note)."""
        if option in self.strategies[index].options:
            return f"strategies[{index}].options.{option}", ""
        if f"workload.{option}" in workload_point:
            return f"sweep.workload.{option}", ""
        if option in WorkloadSpec.model_fields:
            return f"workload.{option}", "" if option in self.workload.model_fields_set else " (the default)"
        if option == "synthetic":
            return "workload.compute", ""
        if option in OPTIONS and OPTIONS[option].place == "any":
            return f"strategies[{index}].options.{option}", " (the default)"
        return f"strategies[{index}]", ""

    def check_cells(self, topology: Topology, source: Path | None) -> None:
        """Every cell's options together, against the model and the topology's DCs; raises SpecError."""
        ranks = self.workload.ranks_per_node
        sizes = [dc.nodes * ranks for dc in topology.dcs]
        names = [dc.name for dc in topology.dcs]
        for point in self.workload_points():
            at = f" (at {', '.join(f'{k}={v}' for k, v in point.items())})" if point else ""
            steps = point.get("workload.steps", self.workload.steps)
            if self.workload.warmup_steps >= int(steps):
                raise SpecError(source, "workload.warmup_steps",
                                f"{self.workload.warmup_steps} leaves no measured step of {steps}{at}")
            self._check_fault_steps(int(steps), sum(sizes), at, source)
            for index in range(len(self.strategies)):
                self._check_checkpoints(index, point, at, source)
                try:
                    check_options(Options(**self.cell_options(index, point)), sizes, names)
                except ValidationError as error:
                    option, problem = problem_of(error)
                    field, note = self.field_of(index, point, option)
                    raise SpecError(source, field, problem + note + at) from None
                except OptionError as error:
                    field, note = self.field_of(index, point, error.field)
                    raise SpecError(source, field, f"{error}{note}{at}") from None

    def _check_checkpoints(self, index: int, point: dict[str, Any], at: str, source: Path | None) -> None:
        """The DiLoCos' DCs wait for each other only at their syncs, and each rank keeps its last two checkpoints
        (testbed.workload.checkpoint): a checkpoint at a sync's step (diloco's outer step, streaming-diloco's first
        fragment, async-diloco's sync due then) keeps every DC within one checkpoint of the others."""
        spec = self.strategies[index]
        if not self.restarts or not self.checkpoint_every or spec.workload_strategy not in DILOCO:
            return
        inner = self.cell_options(index, point).get("inner_steps", OPTIONS["inner_steps"].default)
        if self.checkpoint_every % inner:
            raise SpecError(source, "checkpoint_every",
                            f"{self.checkpoint_every} is not a multiple of inner_steps ({inner}, strategies[{index}], "
                            f"{spec.name}){at}: {spec.workload_strategy}'s DCs wait for each other only at a sync, and a "
                            "DC two checkpoints ahead of another would drop the one that DC still needs")

    def _check_fault_steps(self, steps: int, world: int, at: str, source: Path | None) -> None:
        """Every fault's rank among the cell's ranks and its step among the cell's steps."""
        for index, fault in enumerate(self.faults):
            if fault.rank is not None and fault.rank >= world:
                raise SpecError(source, f"faults[{index}].rank",
                                f"rank {fault.rank} does not exist: the cells run ranks 0-{world - 1}")
            if fault.at.step is not None and fault.at.step >= steps:
                raise SpecError(source, f"faults[{index}].at",
                                f"step {fault.at.step} is never reached: the cells run steps 0-{steps - 1}{at}")

    def _check_fault_links(self, topology: Topology, source: Path | None) -> None:
        """Every link fault names a link of the topology (a fault acts on one link, never a routed path); a DC's
        kill, a DC of it."""
        for index, fault in enumerate(self.faults):
            names = [d.name for d in topology.dcs]
            if fault.dc is not None and fault.dc not in names:
                raise SpecError(source, f"faults[{index}].dc",
                                f"no DC named {fault.dc!r}{did_you_mean(fault.dc, names)} (DCs: {', '.join(names)})")
            if fault.between is None:
                continue
            a, b = fault.between
            for dc in (a, b):
                if dc not in names:
                    raise SpecError(source, f"faults[{index}].between",
                                    f"no DC named {dc!r}{did_you_mean(dc, names)} (DCs: {', '.join(names)})")
            try:
                topology.find_link(a, b)
            except KeyError:
                known = ", ".join(f"[{x.between[0]},{x.between[1]}]" for x in topology.links)
                raise SpecError(source, f"faults[{index}].between",
                                f"no link between {a} and {b} (links: {known})") from None

    def load_topology(self, source: Path | None) -> Topology:
        """The topology: a file relative to the experiment file, or inline; checks sweep link names."""
        if isinstance(self.topology, dict):
            topology = topology_from_data(self.topology, source)
        else:
            base = source.parent if source else Path.cwd()
            path = (base / self.topology) if not Path(self.topology).is_absolute() else Path(self.topology)
            topology = load_topology(path)
        names = [dc.name for dc in topology.dcs]
        for key in self.sweep:
            match = LINK_KEY.match(key)
            if match and match.group(1) != "*":
                a, b = [part.strip() for part in match.group(1).split(",")]
                try:
                    topology.find_link(a, b)
                except KeyError:
                    known = ", ".join(f"[{x.between[0]},{x.between[1]}]" for x in topology.links)
                    unknown = "".join(f": no DC named {dc!r}{did_you_mean(dc, names)}" for dc in (a, b)
                                      if dc not in names)
                    raise SpecError(source, f"sweep.{key}",
                                    f"no link between {a} and {b}{unknown} (links: {known})") from None
        self._check_fault_links(topology, source)
        self._check_swept_links(topology, source)
        return topology

    def _swept(self, link: tuple[str, str], name: str) -> list[tuple[str, float]]:
        """(sweep key, number) of every swept value of link field `name` on `link` (a distance as its latency)."""
        found = []
        for key, values in self.sweep.items():
            match = LINK_KEY.match(key)
            if match is None or match.group(2) not in ((name, "distance") if name == "latency" else (name,)):
                continue
            target = match.group(1)
            if target == "*" or {part.strip() for part in target.split(",")} == set(link):
                found += [(key, self._swept_number(key, value)) for value in values]
        return found

    @staticmethod
    def _swept_number(key: str, value: Any) -> float:
        field = LINK_KEY.match(key).group(2)  # type: ignore[union-attr]
        number = LINK_PARSERS[field](value)
        return units.fibre_delay(number) if field == "distance" else number

    def _check_swept_links(self, topology: Topology, source: Path | None) -> None:
        """Each link direction at the worst of its swept values (the cells cross every sweep value with every
        other): jitter within the shortest latency, the queue of the longest, fastest one within this machine's
        memory (testbed.spec.link.check_link)."""
        for link in topology.links:
            latency, jitter, bandwidth = (self._swept(link.between, name) for name in ("latency", "jitter", "bandwidth"))
            if not (latency or jitter or bandwidth):
                continue
            for base in (link.forward(), link.backward()):
                def pick(swept: list[tuple[str, float]], best: Any, fallback: float | None) -> float | None:
                    return best(number for _, number in swept) if swept else fallback

                jitter_max = pick(jitter, max, base.jitter) or 0.0
                checks = (
                    ("jitter", jitter or latency, replace(base, latency=pick(latency, min, base.latency),
                                                          jitter=jitter_max)),
                    ("queue", latency or bandwidth, replace(base, latency=pick(latency, max, base.latency),
                                                            jitter=jitter_max,
                                                            bandwidth=pick(bandwidth, max, base.bandwidth))))
                for name, swept, params in checks:
                    problem = check_link(params)
                    if problem is not None and problem[0] == name and swept:
                        raise SpecError(source, f"sweep.{swept[0][0]}",
                                        f"with the swept values on {link.between[0]}-{link.between[1]}, {problem[0]}: "
                                        f"{problem[1]}")

    def unusual(self) -> list[tuple[str, str]]:
        """(field, why) of each legal but unusual value: a swept or faulted one-way delay beyond what terrestrial
        paths have (the topology's own are said when it loads)."""
        found = []
        for key, values in self.sweep.items():
            match = LINK_KEY.match(key)
            if match is not None and match.group(2) in ("latency", "distance"):
                for index, value in enumerate(values):
                    why = units.unusual_delay(self._swept_number(key, value))
                    if why is not None:
                        found.append((f"sweep.{key}[{index}]", why))
        for index, fault in enumerate(self.faults):
            why = units.unusual_delay(fault.latency) if fault.latency is not None else None
            if why is not None:
                found.append((f"faults[{index}].latency", why))
        return found


def load_experiment(path: str | Path) -> tuple[Experiment, Topology]:
    """Load an experiment file and its topology, and check every cell it will run; raises SpecError (one
    line naming file and field) when anything is unusable."""
    path = Path(path)
    experiment = validate_data(Experiment, load_yaml(path), path)
    topology = experiment.load_topology(path)
    experiment.check_cells(topology, path)
    return experiment, topology
