"""Every knob of the workload, with defaults; parsed from the command line by __main__."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    strategy: str = "flat-dp"
    steps: int = 10
    preset: str = "tiny"
    micro_batch: int = 4  # samples per micro-batch
    micro_batches: int = 1  # per step and data-parallel replica (pipeline: m)
    seq_len: int | None = None  # default: the preset's
    lr: float = 3e-3
    seed: int = 1234
    optimizer: str = "adamw"  # adamw | sgd (sgd makes strategies exactly comparable)
    # data-parallel
    compression: str = "none"  # none | fp16 | bf16 | int8
    bucket_mb: float = 1.0  # hier-dp-overlap bucket size
    chunks: int = 4  # inter-DC chunks per bucket
    lanes: int = 2  # inter-DC process groups (connections) chunks are spread over
    # pipeline
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved-1f1b | overlap
    virtual_chunks: int = 2  # v for interleaved-1f1b
    lookahead: int = -1  # overlap: extra warm-up micro-batches; -1 = auto from measured latency
    # diloco
    inner_steps: int = 10  # H
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    outer_shard: bool = True  # each node of a DC syncs 1/n of the pseudo-gradient
    fragments: int = 2  # streaming-diloco
    overlap_steps: int = 1  # streaming-diloco: inner steps an outer sync may take (tau)
    # synthetic compute
    synthetic: bool = False
    compute_ms: float | None = None  # forward+backward per micro-batch (whole model); default: measured
    device_tflops: float | None = None  # or: derive compute time from FLOPs per token at this speed
    # loopback studies
    inject_delay_ms: float = 0.0  # added to cross-DC point-to-point sends
    # outputs
    metrics_dir: str | None = None
    dump_dir: str | None = None  # write final gradients/parameters here (tests)
    eval_every: int = 0
