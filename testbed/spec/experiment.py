"""The experiment file: a topology x strategies x a parameter sweep, the workload, repetitions, thresholds."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed import units
from testbed.spec.errors import SpecError
from testbed.spec.loader import load_yaml, validate_data
from testbed.spec.topology import Topology, load_topology, topology_from_data

LINK_KEY = re.compile(r"^links\[(\*|[a-z][a-z0-9_]*\s*,\s*[a-z][a-z0-9_]*)\]\.(latency|distance|bandwidth|jitter|loss)$")
LINK_PARSERS = {"latency": units.parse_duration, "distance": units.parse_distance, "bandwidth": units.parse_rate,
                "jitter": units.parse_duration, "loss": units.parse_fraction}


def _option_fields() -> dict[str, Any]:
    from testbed.workload.options import Options

    return {f.name: f for f in dataclasses.fields(Options)}


class WorkloadSpec(BaseModel):
    """What every rank runs (the built-in workload); strategy options come from each strategy entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str = "tiny"
    micro_batch: int = Field(4, ge=1)
    micro_batches: int = Field(2, ge=1)
    seq_len: int | None = Field(None, ge=8)
    steps: int = Field(12, ge=1)
    warmup_steps: int = Field(2, ge=0)
    seed: int = 1234
    lr: float = Field(3e-3, gt=0)
    compute: Literal["real", "synthetic"] = "real"
    compute_ms: float | None = Field(None, gt=0)
    device_tflops: float | None = Field(None, gt=0)
    ranks_per_node: int = Field(1, ge=1, le=8)

    @field_validator("preset")
    @classmethod
    def _preset(cls, value: str) -> str:
        from testbed.workload.model import PRESETS

        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r} (known: {', '.join(PRESETS)})")
        return value

    @model_validator(mode="after")
    def _warmup(self) -> "WorkloadSpec":
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps: {self.warmup_steps} leaves no measured step of {self.steps}")
        return self


class StrategySpec(BaseModel):
    """One strategy to compare: a label, the workload strategy, and its options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}$")
    strategy: str | None = None
    options: dict[str, Any] = {}

    @model_validator(mode="after")
    def _known(self) -> "StrategySpec":
        from testbed.workload.strategies import STRATEGIES

        strategy = self.strategy or self.name
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: unknown strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
        fields = _option_fields()
        for key, value in self.options.items():
            if key not in fields or key in ("strategy", "metrics_dir", "dump_dir", "steps"):
                raise ValueError(f"options.{key}: unknown strategy option")
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

    metric: Literal["scaling_efficiency", "tokens_per_s", "step_s_median", "exposed_comm_share", "bubble_ratio",
                    "inter_dc_gb_per_step", "final_loss"]
    strategy: str | None = None
    where: dict[str, Any] = {}
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> "Threshold":
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        return self


class Experiment(BaseModel):
    """A whole experiment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    topology: str | dict[str, Any]
    workload: WorkloadSpec = WorkloadSpec()
    strategies: list[StrategySpec] = Field(min_length=1)
    sweep: dict[str, list[Any]] = {}
    repetitions: int = Field(1, ge=1, le=20)
    baseline: Literal["auto", "none"] = "auto"
    calibrate: Literal["rtt", "full", "none"] = "rtt"
    cell_timeout: float = Field(300.0, gt=0)
    thresholds: list[Threshold] = []

    @field_validator("strategies", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _sweep(self) -> "Experiment":
        names = [s.name for s in self.strategies]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"strategies[{index}].name: duplicate strategy name {name!r}")
        fields = _option_fields()
        for key, values in self.sweep.items():
            if not values:
                raise ValueError(f"sweep.{key}: give at least one value")
            match = LINK_KEY.match(key)
            if match:
                parser = LINK_PARSERS[match.group(2)]
                for value in values:
                    try:
                        parser(value)
                    except ValueError as error:
                        raise ValueError(f"sweep.{key}: {error}") from None
            elif key.startswith("workload."):
                field = key.split(".", 1)[1]
                if field not in fields or field in ("strategy", "metrics_dir", "dump_dir"):
                    raise ValueError(f"sweep.{key}: unknown workload option {field!r}")
            else:
                raise ValueError(f"sweep.{key}: expected links[A,B].latency|distance|bandwidth|jitter|loss, "
                                 "links[*].<field> or workload.<option>")
        return self

    def load_topology(self, source: Path | None) -> Topology:
        """The topology: a file relative to the experiment file, or inline; checks sweep link names."""
        if isinstance(self.topology, dict):
            topology = topology_from_data(self.topology, source)
        else:
            base = source.parent if source else Path.cwd()
            path = (base / self.topology) if not Path(self.topology).is_absolute() else Path(self.topology)
            topology = load_topology(path)
        dcs = {dc.name for dc in topology.dcs}
        for key in self.sweep:
            match = LINK_KEY.match(key)
            if match and match.group(1) != "*":
                a, b = [part.strip() for part in match.group(1).split(",")]
                try:
                    topology.find_link(a, b)
                except KeyError:
                    known = ", ".join(f"[{x.between[0]},{x.between[1]}]" for x in topology.links)
                    raise SpecError(source, f"sweep.{key}", f"no link between {a} and {b} (links: {known})") from None
                assert a in dcs and b in dcs
        return topology


def load_experiment(path: str | Path) -> tuple[Experiment, Topology]:
    """Load an experiment file and its topology; raises SpecError (one line) when unusable."""
    path = Path(path)
    experiment = validate_data(Experiment, load_yaml(path), path)
    return experiment, experiment.load_topology(path)
