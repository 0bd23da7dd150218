"""A GPT-style decoder-only transformer in plain torch, sized by preset, splittable into pipeline chunks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from testbed.spec.presets import PRESETS, ModelConfig, split_points


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model))
        self.n_heads = cfg.n_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def layers(cfg: ModelConfig) -> list[nn.Module]:
    """The model as an ordered list of modules: embedding, blocks, head (pipeline chunks cut this list)."""
    return [Embed(cfg), *[Block(cfg) for _ in range(cfg.n_layers)], Head(cfg)]


class GPT(nn.Sequential):
    """The whole model in one module (data-parallel strategies and the unpipelined reference)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(*layers(cfg))
        self.cfg = cfg
        init_weights(self)


def init_weights(module: nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=0.02)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.Embedding):
            nn.init.normal_(sub.weight, std=0.02)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def flops_per_token(cfg: ModelConfig, n_params: int) -> float:
    """Training FLOPs per token: 6N plus attention (Kaplan et al.), for the synthetic device profile."""
    return 6 * n_params + 12 * cfg.n_layers * cfg.d_model * cfg.seq_len


__all__ = ["GPT", "PRESETS", "ModelConfig", "init_weights", "layers", "loss_fn", "math", "split_points"]
