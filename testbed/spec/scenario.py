"""A what-if scenario file: training at a scale no laptop can emulate (model, GPUs per DC, GPU speed and MFU,
intra- and inter-DC links, parallelism, the collective transport), the strategies to compare, the distances and
inter-DC bandwidths to sweep, and which of its numbers are published and which assumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.spec import units
from testbed.spec.loader import load_model
from testbed.spec.topology import FILE_NAME_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelShape(_Strict):
    parameters: float = Field(gt=0)  # count
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    bytes_per_gradient: float = Field(2.0, gt=0)  # bf16


class GPU(_Strict):
    peak_tflops: float = Field(gt=0)
    mfu: float = Field(gt=0, le=1)  # achieved on one site, pipeline bubble and intra-DC communication included


class Link(_Strict):
    bandwidth: float  # bits/s per GPU (intra) or between the two DCs, each direction (inter)
    latency: float = 0.0  # one-way seconds

    @field_validator("bandwidth", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> float:
        return units.parse_rate(value)

    @field_validator("latency", mode="before")
    @classmethod
    def _latency(cls, value: Any) -> float:
        return units.parse_delay(value)


class Parallelism(_Strict):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    micro_batches: int = Field(1, ge=1)  # per step and pipeline


class Transport(_Strict):
    """The collectives' transport between DCs: NCCL-like ring over RDMA, or TCP. Each flow keeps at most
    `window` bytes in flight (NCCL: its buffer per channel; TCP: the socket window); every collective group
    crossing the link runs `channels` flows at once; payload gets `efficiency` of the line rate; `depth` ring
    steps are pipelined (a flat ring over a long link pays 2(g-1)/depth one-way latencies)."""

    kind: Literal["nccl-ring", "tcp"] = "nccl-ring"
    window: float = 4e6  # bytes (written with its unit: 4MB)
    channels: int = Field(2, ge=1)
    efficiency: float = Field(0.9, gt=0, le=1)
    depth: int = Field(8, ge=1)
    intra_latency: float = 5e-6  # seconds (written with its unit: 5us)

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, value: Any) -> float:
        return units.parse_size(value)

    @field_validator("intra_latency", mode="before")
    @classmethod
    def _intra(cls, value: Any) -> float:
        return units.parse_delay(value)


class ScenarioStrategy(_Strict):
    name: str
    kind: Literal["flat-dp", "hier-dp", "hier-dp-overlap", "pp-across", "pp-across-overlap", "diloco",
                  "streaming-diloco"]
    inner_steps: int = Field(100, ge=1)  # DiLoCo H
    fragments: int = Field(1, ge=1)  # streaming DiLoCo
    overlap_steps: int = Field(1, ge=0)  # streaming DiLoCo tau
    buckets: int = Field(40, ge=1)  # hier-dp-overlap: the last bucket's sync cannot hide behind backward
    channels: int | None = Field(None, ge=1)  # flows per crossing group (default: the transport's)
    # DiLoCo's outer pseudo-gradients: their precision (default: the model's bytes_per_gradient), top-k density
    # (None: dense) with the bits each kept value's index costs, and whether the outer sync may start layer by
    # layer during the last inner step's backward (the published simulator's DAG) or waits for the step's end
    outer_precision: Literal["bf16", "int8", "fp4", "int2"] | None = None
    outer_topk: float | None = Field(None, gt=0, le=1)
    outer_index_bits: float = Field(16, ge=0)
    outer_start: Literal["after-step", "during-backward"] = "after-step"


def _each(parser: Any, values: Any) -> Any:
    """Every value of a list parsed (a value that is not a list is left to the list's own check)."""
    if not isinstance(values, list):
        return values
    parsed = []
    for index, value in enumerate(values):
        try:
            parsed.append(parser(value))
        except ValueError as error:
            raise ValueError(f"[{index}]: {error}") from None
    return parsed


class Sweep(_Strict):
    distance: list[float] = Field(min_length=1)  # metres
    bandwidth: list[float] = Field(min_length=1)  # bits/s

    @field_validator("distance", mode="before")
    @classmethod
    def _distances(cls, value: Any) -> list[float]:
        return _each(units.parse_distance, value)

    @field_validator("bandwidth", mode="before")
    @classmethod
    def _rates(cls, value: Any) -> list[float]:
        return _each(units.parse_rate, value)


class Hop(_Strict):
    """One hop of a ring of replicas over the internet: its bandwidth and one-way latency; a hop that leaves
    either out takes the swept inter-DC bandwidth or the swept distance's fibre delay."""

    bandwidth: float | None = None  # bits/s each direction
    latency: float | None = None  # one-way seconds

    @field_validator("bandwidth", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> float | None:
        return None if value is None else units.parse_rate(value)

    @field_validator("latency", mode="before")
    @classmethod
    def _latency(cls, value: Any) -> float | None:
        return None if value is None else units.parse_delay(value)



class ObjectStore(_Strict):
    """The replicas' outer exchange through object storage instead of an all-reduce: each uploads its
    pseudo-gradients once over its uplink, then downloads `gather` replicas' payloads over its downlink, in
    parallel (the store's own rate unbounded); a rate left out takes the swept inter-DC bandwidth."""

    upload: float | None = None  # bits/s of a replica's uplink
    download: float | None = None  # bits/s of a replica's downlink
    gather: int | None = Field(None, ge=1)  # payloads a replica downloads a round (default: every replica's)

    @field_validator("upload", "download", mode="before")
    @classmethod
    def _rates(cls, value: Any) -> float | None:
        return None if value is None else units.parse_rate(value)

    def gathered(self, dcs: int) -> int:
        """Payloads a replica downloads a round among `dcs` replicas."""
        return dcs if self.gather is None else self.gather


class PublishedFigure(_Strict):
    """A published figure the model must reproduce: `metric` of `strategy` at the reference point (a fraction,
    tolerance in points of it) or the inter-DC bandwidth reaching `utilisation` (bits/s; read on the log grid
    `grid_start` x `grid_ratio`^k when given, tolerance in grid steps, else a ratio)."""

    strategy: str
    metric: Literal["compute_utilisation", "efficiency", "bandwidth_for_utilisation"]
    value: float
    tolerance: float = Field(gt=0)
    utilisation: float | None = Field(None, gt=0, lt=1)
    grid_start: float | None = None
    grid_ratio: float | None = Field(None, gt=1)
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("metric") == "bandwidth_for_utilisation":
            data = dict(data)
            for key in ("value", "grid_start"):
                if isinstance(data.get(key), str):
                    try:
                        data[key] = units.parse_rate(data[key])
                    except ValueError as error:
                        raise ValueError(f"{key}: {error}") from None
        return data

    @model_validator(mode="after")
    def _complete(self) -> PublishedFigure:
        if self.metric == "bandwidth_for_utilisation" and self.utilisation is None:
            raise ValueError("utilisation: bandwidth_for_utilisation needs the utilisation it is for")
        if (self.grid_start is None) != (self.grid_ratio is None):
            raise ValueError("grid_start/grid_ratio: give both or neither")
        return self


class Scenario(_Strict):
    name: str = Field(pattern=FILE_NAME_PATTERN)
    description: str = ""
    model: ModelShape
    dcs: int = Field(2, ge=2)
    gpus_per_dc: int = Field(ge=1)
    global_batch_tokens: float | None = Field(None, gt=0)  # with gpu: the step's compute from FLOPs
    gpu: GPU | None = None
    step_seconds: float | None = Field(None, gt=0)  # instead: the single-site step as published
    ring: list[Hop] | None = None  # the DCs (replicas) as a ring over the internet, hop i from DC i to i+1
    object_store: ObjectStore | None = None  # or the DiLoCos' outer exchange through object storage
    parallelism: Parallelism = Parallelism()
    intra: Link
    transport: Transport = Transport()
    reference: dict[str, Any]  # {distance, bandwidth}: where the per-strategy answers are read
    sweep: Sweep
    strategies: list[ScenarioStrategy] = Field(min_length=1)
    target_efficiency: float = Field(0.96, gt=0, le=1)
    published: dict[str, str] = {}  # field -> source
    assumed: dict[str, str] = {}  # field -> why this value
    published_figures: list[PublishedFigure] = []  # checked by whatif: PASS/FAIL each

    @field_validator("reference", mode="before")
    @classmethod
    def _reference(cls, value: Any) -> dict[str, float]:
        if not isinstance(value, dict) or set(value) != {"distance", "bandwidth"}:
            raise ValueError("give distance and bandwidth")
        parsed = {}
        for key, parser in (("distance", units.parse_distance), ("bandwidth", units.parse_rate)):
            try:
                parsed[key] = parser(value[key])
            except ValueError as error:
                raise ValueError(f"{key}: {error}") from None
        return parsed

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        per_replica = self.parallelism.tp * self.parallelism.pp
        if self.gpus_per_dc % per_replica:
            raise ValueError(f"gpus_per_dc: {self.gpus_per_dc} is not a multiple of tp x pp = {per_replica}")
        names = [s.name for s in self.strategies]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"strategies[{index}].name: duplicate {name!r}")
        if self.step_seconds is None and (self.gpu is None or self.global_batch_tokens is None):
            raise ValueError("gpu/global_batch_tokens: give both (the step from FLOPs) or step_seconds")
        if self.global_batch_tokens is None and any(s.kind.startswith("pp-across") for s in self.strategies):
            raise ValueError("global_batch_tokens: a pipeline across DCs needs it (activations per micro-batch)")
        if self.ring is not None and self.object_store is not None:
            raise ValueError("object_store: give a ring or an object store for the outer exchange, not both")
        if self.ring is not None and len(self.ring) != self.dcs:
            raise ValueError(f"ring: {len(self.ring)} hops for {self.dcs} DCs (one hop from each DC to the next)")
        for index, figure in enumerate(self.published_figures):
            if figure.strategy not in names:
                raise ValueError(f"published_figures[{index}].strategy: no strategy {figure.strategy!r}")
        if not self.published or not self.assumed:
            raise ValueError("published/assumed: say which numbers are published (and where) and which are assumed")
        return self

    @property
    def replicas_per_dc(self) -> int:
        return self.gpus_per_dc // (self.parallelism.tp * self.parallelism.pp)


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario file; raises SpecError (one line naming file and field) when it is unusable."""
    return load_model(Scenario, path)
