"""Training text that needs no download: the English documentation shipped inside CPython (pydoc_data).

Tokens are bytes (vocabulary 256), so tokenisation is exact and deterministic; the corpus hash goes into
every run's metrics so two runs can be checked to have trained on the same text.
"""

from __future__ import annotations

import functools
import hashlib

import torch


@functools.lru_cache(maxsize=1)
def corpus() -> bytes:
    from pydoc_data import topics

    text = "\n\n".join(topics.topics[key] for key in sorted(topics.topics))
    return text.encode("utf-8")


def corpus_hash() -> str:
    return hashlib.sha256(corpus()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def tokens() -> torch.Tensor:
    return torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).long()


def samples(step: int, first: int, count: int, seq_len: int, seed: int,
            holdout: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of global samples first..first+count-1 of `step`.

    Each sample is a pure function of (seed, step, sample index), so every strategy and every process
    layout trains on the same global batch. The last 5 % of the text is held out for evaluation.
    """
    data = tokens()
    split = int(len(data) * 0.95)
    lo, hi = (split, len(data)) if holdout else (0, split)
    starts = []
    for index in range(first, first + count):
        gen = torch.Generator().manual_seed((seed * 1_000_003 + step * 65_537 + index) & 0x7FFFFFFFFFFF)
        starts.append(int(torch.randint(lo, hi - seq_len - 1, (1,), generator=gen)))
    window = torch.stack([data[s: s + seq_len + 1] for s in starts])
    return window[:, :-1], window[:, 1:]


def micro_batches(ranges: list[tuple[int, int]], step: int, seq_len: int, seed: int, micro_batch: int,
                  device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The samples of `ranges` ((first, count) each) of `step`, cut into micro-batches of `micro_batch`."""
    parts = [samples(step, first, count, seq_len, seed) for first, count in ranges]
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return list(zip(x.to(device).split(micro_batch), y.to(device).split(micro_batch)))
