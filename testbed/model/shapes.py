"""What the built-in workload moves and computes, from the preset's shape alone (no torch): the parameter
tensors in the order the model registers them, gradient buckets, DiLoCo fragments, pipeline chunks,
activation bytes and FLOPs. The same rules as testbed.workload (tests hold them against the real model)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from testbed.spec.presets import PRESETS, ModelConfig, split_points
from testbed.spec.strategies import Options

FLOAT_BYTES = 4  # gradients, parameters and activations travel as fp32
COMPRESSED_BYTES = {"none": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0 + 4.0 / 4096}  # per element, int8: + scales


def config(opts: Options) -> ModelConfig:
    cfg = PRESETS[opts.preset]
    return dataclasses.replace(cfg, seq_len=opts.seq_len) if opts.seq_len else cfg


def module_shapes(cfg: ModelConfig) -> list[list[tuple[int, ...]]]:
    """Per module (embedding, each block, head), the shape of each parameter, in registration order."""
    d, r = cfg.d_model, cfg.mlp_ratio
    embed = [(cfg.vocab, d), (cfg.seq_len, d)]
    block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (r * d, d), (r * d,), (d, r * d), (d,)]
    head = [(d,), (d,), (cfg.vocab, d)]
    return [embed, *[list(block) for _ in range(cfg.n_layers)], head]


def module_tensors(cfg: ModelConfig) -> list[list[int]]:
    """Per module (embedding, each block, head), the element count of each parameter, in registration order."""
    return [[math.prod(shape) for shape in module] for module in module_shapes(cfg)]


def tensors(cfg: ModelConfig) -> list[int]:
    return [n for module in module_tensors(cfg) for n in module]


def parameter_count(cfg: ModelConfig) -> int:
    return sum(tensors(cfg))


def _closed_at(cfg: ModelConfig, limit: int) -> list[int]:
    """The parameters in reverse (the order backward produces their gradients), cut into buckets of element
    counts, each closed once it reaches `limit` elements."""
    out, current = [], 0
    for n in reversed(tensors(cfg)):
        current += n
        if current >= limit:
            out.append(current)
            current = 0
    if current:
        out.append(current)
    return out


def buckets(cfg: ModelConfig, bucket_mb: float) -> list[int]:
    """Element counts of hier-dp-overlap's gradient buckets, in the order they become ready (last layer first)."""
    return _closed_at(cfg, max(1, int(bucket_mb * 1e6 / 4)))


def ddp_buckets(cfg: ModelConfig, bucket_cap_mb: float) -> list[int]:
    """Element counts of DDP's gradient buckets after its rebuild (end of step 0), in the order they become ready,
    each closed once it reaches bucket_cap_mb MiB. The workload always passes bucket_cap_mb, and DDP then caps its
    first bucket at it too (its 1 MiB first bucket is for the default only); step 0 runs every gradient in one."""
    return _closed_at(cfg, max(1, int(bucket_cap_mb * (1 << 20)) // FLOAT_BYTES))


POWERSGD_MIN_COMPRESSION_RATE = 2  # PowerSGDState's default min_compression_rate


def powersgd_elements(cfg: ModelConfig, rank: int) -> tuple[int, int, int]:
    """(uncompressed, P, Q) element counts DDP's powerSGD_hook all-reduces, one after the other, for a bucket of
    the whole model: each gradient viewed as shape[0] x the rest (n x m) is compressed to P (n x k) and Q (m x k),
    k = min(n, m, rank), where (n + m) k x min_compression_rate < n m; the others (the vectors) go as they are."""
    plain = p = q = 0
    for module in module_shapes(cfg):
        for shape in module:
            n, m = shape[0], math.prod(shape[1:])
            k = min(n, m, rank)
            if (n + m) * k * POWERSGD_MIN_COMPRESSION_RATE < n * m:
                p, q = p + n * k, q + m * k
            else:
                plain += n * m
    return plain, p, q


def fsdp_units(cfg: ModelConfig) -> list[int]:
    """Element counts of FSDP2's units as the workload wraps them, in forward order: the root (embeddings, final
    norm and head: what no block holds), then each block."""
    modules = module_tensors(cfg)
    return [sum(modules[0]) + sum(modules[-1]), *[sum(block) for block in modules[1:-1]]]


def fragments(cfg: ModelConfig, count: int) -> list[int]:
    """Element counts of streaming DiLoCo's fragments (parameters cut into `count` runs of tensors)."""
    sizes = tensors(cfg)
    count = max(1, min(count, len(sizes)))
    bounds = [round(i * len(sizes) / count) for i in range(count + 1)]
    return [sum(sizes[bounds[f]:bounds[f + 1]]) for f in range(count)]


def chunk_parameters(cfg: ModelConfig, chunks: int) -> list[int]:
    """Element counts of the pipeline's `chunks` contiguous model chunks."""
    modules = module_tensors(cfg)
    return [sum(sum(modules[i]) for i in range(lo, hi)) for lo, hi in split_points(len(modules), chunks)]


def activation_bytes(cfg: ModelConfig, micro_batch: int) -> int:
    """One micro-batch's activations (or their gradient) at a pipeline stage boundary."""
    return micro_batch * cfg.seq_len * cfg.d_model * FLOAT_BYTES


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6N plus attention (as the workload's synthetic device profile counts them)."""
    return 6 * parameter_count(cfg) + 12 * cfg.n_layers * cfg.d_model * cfg.seq_len


def padded(n: int, multiple: int) -> int:
    return n + (-n) % max(1, multiple)


@dataclass(frozen=True)
class WorkloadFigures:
    """A cell's workload as the model sees it."""

    parameters: int
    gradient_bytes: int
    tokens_per_sample: int
    micro_batch: int
    micro_batches: int

    @classmethod
    def of(cls, opts: Options) -> WorkloadFigures:
        cfg = config(opts)
        n = parameter_count(cfg)
        return cls(n, n * FLOAT_BYTES, cfg.seq_len, opts.micro_batch, opts.micro_batches)
