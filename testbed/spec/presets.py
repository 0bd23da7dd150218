"""Model presets of the built-in workload: their shapes only (pure data, no torch), so that experiment
files can be checked against a model (pipeline cuts) before anything runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256  # byte-level tokens
    seq_len: int = 64
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0

    def parameters(self, seq_len: int | None = None) -> int:
        """The built-in GPT's parameter count (embeddings, blocks, head; tests hold it to the torch model's)."""
        d, r = self.d_model, self.mlp_ratio
        embed = (self.vocab + (seq_len or self.seq_len)) * d
        block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (r * d * d + r * d) + (r * d * d + d)
        return embed + self.n_layers * block + 2 * d + d * self.vocab

    @property
    def modules(self) -> int:
        """What a pipeline can cut: the embedding, every block, the head."""
        return self.n_layers + 2


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(d_model=64, n_layers=4, n_heads=4, seq_len=64),  # ~0.2M params: a CPU step in ms
    "small": ModelConfig(d_model=256, n_layers=6, n_heads=8, seq_len=128),  # ~4.8M
    "medium": ModelConfig(d_model=512, n_layers=8, n_heads=8, seq_len=256),  # ~25M
    "gpt-100m": ModelConfig(d_model=768, n_layers=14, n_heads=12, seq_len=512),  # ~99M
}


def split_points(n_modules: int, n_chunks: int) -> list[tuple[int, int]]:
    """Cut `n_modules` consecutive modules into `n_chunks` contiguous, near-equal ranges."""
    if n_chunks > n_modules:
        raise ValueError(f"cannot cut {n_modules} layers into {n_chunks} pipeline chunks")
    base, extra = divmod(n_modules, n_chunks)
    bounds, start = [], 0
    for chunk in range(n_chunks):
        end = start + base + (1 if chunk < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds
