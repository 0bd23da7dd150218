"""The built-in workload's strategies and every option it takes: type, range, default, and which strategies
read it. The one definition: experiment files are checked against it at load time, cells' command lines
are built from it, and the workload's own argument parser (`python -m testbed.workload`) is generated from
it. Pure data and pydantic; no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as validated_dataclass

from testbed.spec.errors import did_you_mean, in_words
from testbed.spec.presets import PRESETS

_EQUAL_SHARDS = ("its reduce-scatter cuts each DC's gradients into one shard per rank, and the shards of "
                 "different DCs must pair up")
_RECTANGULAR_MESH = "its 2-D DeviceMesh (DCs x ranks per DC) must be rectangular"


@dataclass(frozen=True)
class StrategyInfo:
    name: str
    summary: str
    equal_dcs: str | None = None  # why it needs the same number of ranks in every DC; None: any sizes


STRATEGIES: dict[str, StrategyInfo] = {s.name: s for s in (
    StrategyInfo("flat-dp", "one all-reduce of all gradients over all ranks"),
    StrategyInfo("hier-dp", "reduce-scatter in the DC, all-reduce of the shard across DCs, all-gather", _EQUAL_SHARDS),
    StrategyInfo("hier-dp-overlap", "hier-dp per bucket during backward, chunked over several inter-DC lanes",
                 _EQUAL_SHARDS),
    StrategyInfo("pp", "a pipeline stage per DC, data parallel inside each DC"),
    StrategyInfo("diloco", "inner AdamW in the DC, an outer Nesterov step across DCs every inner_steps"),
    StrategyInfo("streaming-diloco", "DiLoCo with fragments synchronised in turn, overlapped with inner steps"),
    StrategyInfo("ddp", "PyTorch DistributedDataParallel: bucketed all-reduce over all ranks, overlapped with "
                        "backward; optionally one of DDP's own comm hooks"),
    StrategyInfo("fsdp", "PyTorch FSDP2 (fully_shard) over all ranks: all-gather weights, reduce-scatter gradients"),
    StrategyInfo("hsdp", "PyTorch FSDP2 on a 2-D DeviceMesh: shard inside a DC, all-reduce the shards across DCs",
                 _RECTANGULAR_MESH),
    StrategyInfo("async-diloco", "DiLoCo whose outer synchronisation runs in the background while inner steps go "
                                 "on, up to max_staleness steps"),
    StrategyInfo("torchft-ddp", "torchft: every DC a replica group, per-step quorums through a lighthouse, "
                                "fault-tolerant DDP across the groups (a group that dies is left out and heals)"),
    StrategyInfo("torchft-diloco", "torchft's DiLoCo: every DC a replica group, an outer step across the groups "
                                   "every inner_steps, quorum per outer step"),
    StrategyInfo("torchft-streaming-diloco", "torchft's Streaming DiLoCo: every DC a replica group, the model's "
                                             "fragments synchronised in turn, each started fragment_sync_delay "
                                             "inner steps before it is due, a quorum per fragment's sync"),
)}

DP = ("flat-dp", "hier-dp", "hier-dp-overlap")
OVERLAP = ("hier-dp-overlap",)
PP = ("pp",)
DILOCO = ("diloco", "streaming-diloco", "async-diloco")
TORCHFT = ("torchft-ddp", "torchft-diloco", "torchft-streaming-diloco")  # torchft's classes: DCs as replica groups
TORCHFT_DILOCO = ("torchft-diloco", "torchft-streaming-diloco")
TORCHFT_STREAMING = ("torchft-streaming-diloco",)
TORCH_NATIVE = ("ddp", "fsdp", "hsdp")  # PyTorch's own wrappers: they communicate from inside autograd's backward
FSDP = ("fsdp", "hsdp")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "overlap")
# What cannot run with the pinned torch (2.13, CPU) and gloo, as tried: one line each, said at load time.
CANNOT_RUN = {
    "comm_hook=bf16": "DDP's bf16_compress_hook needs CUDA 11+ with NCCL 2.10+: on CPU with gloo torch 2.13 raises "
                      "TypeError when the hook is registered (use comm_hook: fp16)",
    "comm_hook=powersgd, several buckets": (
        "DDP's powerSGD_hook needs all gradients in one DDP bucket here: with several, torch 2.13 on gloo issues "
        "each bucket's later all-reduces from future callbacks in a different order on each rank, and the ranks "
        "hang or fail ('Received data size doesn't match expected size')"),
}

StrategyName = Literal[tuple(STRATEGIES)]  # type: ignore[valid-type]
PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
ScheduleName = Literal[SCHEDULES]  # type: ignore[valid-type]
Place = Literal["any", "workload", "harness"]


def option(default: Any, help: str, *, strategies: Sequence[str] = tuple(STRATEGIES), place: Place = "any",
           when: tuple[str, tuple[Any, ...]] | None = None, **constraints: Any) -> Any:
    """One option's definition. place: 'any' (a strategy's options, the workload mapping or a sweep),
    'workload' (the workload mapping or a sweep only), 'harness' (set by the runner, never by a file).
    when: (other option, values) it is only read with."""
    return Field(default, description=help, json_schema_extra={"strategies": tuple(strategies), "place": place,
                                                                "when": when}, **constraints)


@validated_dataclass(config=ConfigDict(extra="forbid"))
class Options:
    """Every knob of the workload (validated on construction: types and ranges)."""

    strategy: StrategyName = option("flat-dp", "training strategy", place="harness")
    steps: int = option(10, "training steps", place="workload", ge=1)
    preset: PresetName = option("tiny", "model size", place="workload")
    micro_batch: int = option(4, "samples per micro-batch", ge=1)
    micro_batches: int = option(1, "micro-batches per step and data-parallel replica (pipeline: m)", ge=1)
    seq_len: int | None = option(None, "tokens per sample (default: the preset's)", ge=8)
    lr: float = option(3e-3, "learning rate (the inner optimizer's for DiLoCo)", gt=0)
    seed: int = option(1234, "initial weights and the order of samples")
    optimizer: Literal["adamw", "sgd"] = option("adamw", "sgd makes strategies exactly comparable")
    # data parallel
    compression: Literal["none", "fp16", "bf16", "int8"] = option(
        "none", "of the inter-DC step (the whole all-reduce for flat-dp)", strategies=DP)
    bucket_mb: float = option(1.0, "gradient bucket size, MB", strategies=OVERLAP, gt=0)
    chunks: int = option(4, "inter-DC chunks per bucket, all in flight at once", strategies=OVERLAP, ge=1)
    lanes: int = option(2, "inter-DC process groups (connections) the chunks are spread over", strategies=OVERLAP,
                        ge=1, le=64)
    # PyTorch's own data parallelism
    bucket_cap_mb: float = option(25.0, "DDP's gradient bucket size, MB (DDP's default: 25)", strategies=("ddp",), gt=0)
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = option(
        "none", "DDP comm hook: none (DDP's built-in all-reduce), fp16 (fp16_compress_hook), powersgd (powerSGD_hook); "
                "bf16 (bf16_compress_hook) needs CUDA and NCCL and is refused here",
        strategies=("ddp",))
    powersgd_rank: int = option(1, "PowerSGD's matrix_approximation_rank", strategies=("ddp",),
                                when=("comm_hook", ("powersgd",)), ge=1)
    powersgd_start_iter: int = option(2, "PowerSGD's start_powerSGD_iter: plain all-reduce before this step",
                                      strategies=("ddp",), when=("comm_hook", ("powersgd",)), ge=2)
    reshard_after_forward: bool = option(True, "FSDP2: free each block's gathered weights after forward and gather "
                                               "them again in backward (False: keep them, ZeRO-2-like)",
                                         strategies=FSDP, strict=True)
    # pipeline
    schedule: ScheduleName = option("1f1b", "pipeline schedule", strategies=PP)
    virtual_chunks: int = option(2, "model chunks per stage (v)", strategies=PP,
                                 when=("schedule", ("interleaved-1f1b",)), ge=1)
    lookahead: int = option(-1, "extra warm-up micro-batches; -1: enough to cover the measured round trip",
                            strategies=PP, when=("schedule", ("overlap",)), ge=-1)
    # diloco
    inner_steps: int = option(10, "H: inner steps between outer synchronisations", strategies=DILOCO + TORCHFT_DILOCO,
                              ge=1)
    outer_lr: float = option(0.7, "outer Nesterov SGD learning rate", strategies=DILOCO + TORCHFT_DILOCO, gt=0)
    outer_momentum: float = option(0.9, "outer Nesterov SGD momentum", strategies=DILOCO + TORCHFT_DILOCO, ge=0,
                                   lt=1)
    outer_shard: bool = option(True, "each node of a DC syncs 1/n of the pseudo-gradient", strategies=("diloco",),
                               strict=True)
    fragments: int = option(2, "parameter fragments synchronised in turn",
                            strategies=("streaming-diloco", *TORCHFT_STREAMING), ge=1)
    fragment_sync_delay: int = option(0, "torchft: inner steps between a fragment's all-reduce starting and its "
                                         "outer step waiting for it", strategies=TORCHFT_STREAMING, ge=0)
    heartbeat_timeout_ms: int = option(5000, "torchft: the lighthouse's heartbeat timeout (a silent group leaves "
                                             "the quorum after it)", strategies=TORCHFT, ge=100)
    min_replicas: int = option(1, "torchft: the fewest groups a quorum needs (the lighthouse's min_replicas and "
                                  "the Manager's min_replica_size). 1, as torchft's examples: a group back from a "
                                  "partition after the others ended trains its last steps alone and its replica "
                                  "ends apart; a majority: it waits for others (and fails past quorum_timeout_s)",
                               strategies=TORCHFT, ge=1)
    quorum_timeout_s: float = option(30.0, "torchft: how long a group waits for a quorum and for a collective or "
                                           "a heal (the Manager's timeout)", strategies=TORCHFT,
                                     gt=0)
    overlap_steps: int = option(1, "inner steps an outer synchronisation may take (tau)",
                                strategies=("streaming-diloco",), ge=0)
    max_staleness: int = option(20, "inner steps an outer synchronisation may lag before the DC waits for it",
                                strategies=("async-diloco",), ge=1)
    # synthetic compute
    synthetic: bool = option(False, "replace forward/backward by a calibrated sleep (real bytes still move)",
                             place="workload", strict=True)
    compute_ms: float | None = option(None, "synthetic: forward+backward ms per micro-batch (whole model)",
                                      place="workload", gt=0)
    device_tflops: float | None = option(None, "synthetic: derive compute time from FLOPs per token at this speed",
                                         place="workload", gt=0)
    # loopback studies
    inject_delay_ms: float = option(0.0, "added to cross-DC point-to-point sends", strategies=PP, ge=0)
    # outputs
    metrics_dir: str | None = option(None, "where rank<r>.jsonl goes (default: $TESTBED_METRICS_DIR)",
                                     place="harness")
    dump_dir: str | None = option(None, "write final gradients and parameters here (tests)", place="harness")


@dataclass(frozen=True)
class OptionDef:
    """An option's definition, read from Options."""

    name: str
    default: Any
    help: str
    annotation: Any
    strategies: tuple[str, ...]
    place: Place
    when: tuple[str, tuple[Any, ...]] | None
    adapter: TypeAdapter

    @property
    def choices(self) -> tuple[Any, ...] | None:
        return getattr(self.annotation, "__args__", None) if getattr(self.annotation, "__origin__", None) is Literal \
            else None


def _definitions() -> dict[str, OptionDef]:
    out = {}
    for name, info in Options.__pydantic_fields__.items():
        extra = info.json_schema_extra or {}
        out[name] = OptionDef(name, info.default, info.description or "", info.annotation, extra["strategies"],
                              extra["place"], extra["when"],
                              TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation))
    return out


OPTIONS: dict[str, OptionDef] = _definitions()


class OptionError(ValueError):
    """An option (`field`) that cannot work; str() is the problem, one line."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(problem)


def problem_of(error: ValidationError) -> tuple[str, str]:
    """(field, one-line problem) of pydantic's first error."""
    first = error.errors()[0]
    loc = ".".join(str(part) for part in first.get("loc", ()))
    if first.get("type") == "unexpected_keyword_argument":
        return loc, "unknown option" + did_you_mean(loc, OPTIONS)
    return loc, in_words(first)


def check_option(name: str, value: Any) -> Any:
    """The value of option `name`, validated against its type and range; ValueError (one line) otherwise."""
    definition = OPTIONS.get(name)
    if definition is None:
        raise ValueError("unknown option")
    try:
        return definition.adapter.validate_python(value)
    except ValidationError as error:
        raise ValueError(problem_of(error)[1]) from None


def check_options(opts: Options, dc_sizes: Sequence[int], dc_names: Sequence[str] | None = None) -> None:
    """What no single option shows: the options together, against the model and the ranks per DC
    (`dc_sizes`, DC by DC). Raises OptionError naming the option at fault."""
    info = STRATEGIES[opts.strategy]
    if info.equal_dcs and len(set(dc_sizes)) > 1:
        sizes = ", ".join(f"{name}={n}" for name, n in zip(dc_names, dc_sizes)) if dc_names else \
            "+".join(str(n) for n in dc_sizes)
        raise OptionError("strategy", f"{opts.strategy} needs the same number of ranks in every DC ({info.equal_dcs}); "
                                      f"the DCs hold {sizes} ranks")
    if opts.strategy == "ddp" and opts.comm_hook == "bf16":
        raise OptionError("comm_hook", CANNOT_RUN["comm_hook=bf16"])
    if opts.strategy == "ddp" and opts.comm_hook == "powersgd":
        grad_mb = PRESETS[opts.preset].parameters(opts.seq_len) * 4 / 2**20
        if grad_mb > opts.bucket_cap_mb:
            raise OptionError("bucket_cap_mb", f"{CANNOT_RUN['comm_hook=powersgd, several buckets']}: preset "
                                               f"{opts.preset!r} has {grad_mb:.3f} MB of gradients, so set "
                                               f"bucket_cap_mb >= {math.ceil(grad_mb * 100) / 100:.2f}")
    if opts.synthetic and opts.strategy in TORCH_NATIVE:
        raise OptionError("synthetic", f"{opts.strategy} communicates from inside autograd's backward (PyTorch's own "
                                       "hooks): synthetic compute has no backward to hook; use compute: real")
    if not opts.synthetic:
        for name in ("compute_ms", "device_tflops"):
            if getattr(opts, name) is not None:
                raise OptionError(name, "only used with synthetic compute (workload.compute: synthetic)")
    elif opts.compute_ms is not None and opts.device_tflops is not None:
        raise OptionError("device_tflops", "give compute_ms or device_tflops, not both")
    if opts.strategy == "pp":
        stages = len(dc_sizes)
        v = opts.virtual_chunks if opts.schedule == "interleaved-1f1b" else 1
        model = PRESETS[opts.preset]
        if stages * v > model.modules:
            field = "virtual_chunks" if v > 1 else "strategy"
            raise OptionError(field, f"{stages} stages x {v} chunks = {stages * v} pipeline chunks, but preset "
                                     f"{opts.preset!r} has {model.modules} layers to cut (embedding, "
                                     f"{model.n_layers} blocks, head)")
        if opts.schedule == "interleaved-1f1b" and opts.micro_batches % stages:
            raise OptionError("micro_batches", f"interleaved-1f1b needs micro_batches ({opts.micro_batches}) to be "
                                               f"a multiple of the stages ({stages})")
    if opts.strategy in DILOCO + TORCHFT_DILOCO and opts.inner_steps > opts.steps:
        raise OptionError("inner_steps", f"{opts.inner_steps} is more than the {opts.steps} steps: the DCs would "
                                         "never synchronise")
    if opts.strategy in TORCHFT and opts.min_replicas > len(dc_sizes):
        raise OptionError("min_replicas", f"{opts.min_replicas} is more than the {len(dc_sizes)} DCs (replica groups): "
                                          "no quorum could form")
    if opts.strategy in TORCHFT and opts.synthetic:
        raise OptionError("synthetic", f"{opts.strategy}: torchft's DDP and DiLoCo hook a real backward and "
                                       "optimizer step; use compute: real")
    if opts.strategy in TORCHFT_STREAMING:  # torchft's DiLoCo refuses these at its start, in every rank: here first
        if opts.inner_steps % opts.fragments:
            raise OptionError("fragments", f"{opts.fragments} fragments must divide inner_steps ({opts.inner_steps}): "
                                           "torchft syncs one fragment every inner_steps / fragments steps")
        if opts.fragment_sync_delay >= opts.inner_steps // opts.fragments:
            raise OptionError("fragment_sync_delay", f"{opts.fragment_sync_delay} must be less than inner_steps / "
                                                     f"fragments ({opts.inner_steps // opts.fragments}): a fragment "
                                                     "would be reduced again before its last sync ended")
    if opts.strategy == "streaming-diloco" and opts.overlap_steps >= opts.inner_steps:
        raise OptionError("overlap_steps", f"{opts.overlap_steps} must be less than inner_steps "
                                           f"({opts.inner_steps}): a fragment's sync would overlap its next one")
