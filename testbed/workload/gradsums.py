"""Gradient checksums (algorithm-based fault tolerance): what each parameter's gradient must sum to, computed on
the side from the layer's input and its output's gradient, so that a flipped bit in a gradient is caught without
computing the gradient again.

For a linear layer the weight's gradient is dY^T X, so its column sums are (dY 1)^T X: O(tokens x (in + out))
against the gradient's O(tokens x in x out). An embedding's row sums are the output gradient's row sums added at
the looked-up indices; a layer norm's and a bias's gradients are recomputed outright (O(tokens x width)). Every
sum is taken in float64 beside the float32 gradient, with its absolute mass (the same sum over absolute values;
float32, as it is only a scale): a checksum differs from the gradient's own sum by more than TOLERANCE of its
mass only when an element changed. A change of `delta` in one element is seen when |delta| exceeds TOLERANCE
times its checksum's mass; an exponent flip changes an element by half its value or more, so most are caught
(bench/sdc_detection.py measures which).

Hooks on the modules' outputs collect the sums during backward; `reset()` goes with zeroing the gradients,
`mismatches()` compares after the last backward. Parameters of other module kinds are not covered (`covered`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

TOLERANCE = 1e-5  # of a checksum's absolute mass: float32 rounding of the gradient is ~1e-7 of it (measured)

Reduce = Callable[[torch.Tensor], torch.Tensor]  # a gradient -> the sums a checksum holds
Sums = dict[str, list[tuple[Reduce, torch.Tensor, torch.Tensor]]]  # parameter -> (reduce, expected, mass) each


class GradientChecksums:
    """Expected gradient sums of every nn.Linear, nn.Embedding and nn.LayerNorm parameter of `model`."""

    def __init__(self, model: nn.Module) -> None:
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.covered: dict[str, nn.Parameter] = {}
        self._sums: dict[tuple[str, Reduce], tuple[torch.Tensor, torch.Tensor]] = {}  # (value, mass)
        self.seconds = 0.0  # spent on the sums in backward, and on comparing them (their cost)
        for prefix, module in model.named_modules():
            kind = _KINDS.get(type(module))
            if kind is None:
                continue
            for name, param in module.named_parameters(recurse=False):
                self.covered[f"{prefix}.{name}" if prefix else name] = param
            self.handles.append(module.register_forward_hook(self._forward(prefix, kind)))

    def reset(self) -> None:
        """Forget the sums (with the gradients zeroed)."""
        self._sums = {}

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _forward(self, prefix: str, kind: Callable) -> Callable:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
                x = args[0].detach()
                output.register_hook(lambda grad: self._add(prefix, module, kind, x, grad.detach()))
        return hook

    def _add(self, prefix: str, module: nn.Module, kind: Callable, x: torch.Tensor, grad: torch.Tensor) -> None:
        start = time.perf_counter()
        for name, checks in kind(module, x, grad).items():
            full = f"{prefix}.{name}" if prefix else name
            for reduce, value, mass in checks:
                key = (full, reduce)
                if key in self._sums:
                    self._sums[key][0].add_(value)
                    self._sums[key][1].add_(mass)
                else:
                    self._sums[key] = (value, mass)
        self.seconds += time.perf_counter() - start

    def mismatches(self, grads: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Each covered parameter whose gradient does not sum to one of its checksums: the largest
        |difference| / mass (inf where the mass is 0 and the difference is not, or the gradient is not finite).
        `grads`: only these gradients, by parameter name (a bucket's, which may be copies of the parameters' own
        as in DDP's buckets). Every checksum is compared at once (a handful of tensor operations, not a few per
        checksum); the parameters are named only when one is off."""
        start = time.perf_counter()
        if grads is None:
            grads = {name: param.grad for name, param in self.covered.items() if param.grad is not None}
        checks = [(name, reduce(grads[name].detach()), expected, mass)
                  for (name, reduce), (expected, mass) in self._sums.items() if name in grads]
        out: dict[str, float] = {}
        if checks:
            difference = (torch.cat([c[1] for c in checks]) - torch.cat([c[2] for c in checks])).abs()
            within = difference <= TOLERANCE * torch.cat([c[3] for c in checks])  # False for NaN and inf too
            if not bool(within.all()):
                out = self._name(checks)
        self.seconds += time.perf_counter() - start
        return out

    @staticmethod
    def _name(checks: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, actual, expected, mass in checks:
            if not bool(torch.isfinite(actual).all()):
                out[name] = float("inf")
                continue
            difference = (actual - expected).abs()
            over = ~(difference <= TOLERANCE * mass)
            if bool(over.any()):
                out[name] = max(out.get(name, 0.0), float((difference[over] / mass[over]).max()))
        return out


def _columns(grad: torch.Tensor) -> torch.Tensor:
    """Each column's sum (over the rows), in float64."""
    return grad.sum(0, dtype=torch.float64)


def _rows(grad: torch.Tensor) -> torch.Tensor:
    """Each row's sum (over the columns), in float64."""
    return grad.sum(1, dtype=torch.float64)


def _itself(grad: torch.Tensor) -> torch.Tensor:
    return grad.double()


def _linear(module: nn.Linear, x: torch.Tensor, grad: torch.Tensor) -> Sums:
    """weight: column sums (dY 1)^T X and row sums dY^T (X 1) (a row whose gradient is small compared with the
    others' is seen by its own sum); bias: dY summed over tokens."""
    x32, dy32 = x.reshape(-1, module.in_features), grad.reshape(-1, module.out_features)
    inputs, dy = x32.double(), dy32.double()
    size, dy_size = x32.abs(), dy32.abs()
    sums: Sums = {"weight": [(_columns, dy.sum(1) @ inputs, dy_size.sum(1) @ size),
                             (_rows, inputs.sum(1) @ dy, size.sum(1) @ dy_size)]}
    if module.bias is not None:
        sums["bias"] = [(_itself, dy.sum(0), dy_size.sum(0))]
    return sums


def _embedding(module: nn.Embedding, idx: torch.Tensor, grad: torch.Tensor) -> Sums:
    """weight: row sums, each token's output-gradient sum added at its index."""
    flat = idx.reshape(-1)
    dy = grad.reshape(-1, module.embedding_dim)
    value = torch.zeros(module.num_embeddings, dtype=torch.float64, device=dy.device)
    mass = torch.zeros(module.num_embeddings, dtype=dy.dtype, device=dy.device)
    return {"weight": [(_rows, value.index_add_(0, flat, dy.sum(1, dtype=torch.float64)),
                        mass.index_add_(0, flat, dy.abs().sum(1)))]}


def _layer_norm(module: nn.LayerNorm, x: torch.Tensor, grad: torch.Tensor) -> Sums:
    """weight: dY times the normalised input, summed over tokens; bias: dY summed over tokens. The normalised
    input is recomputed as the forward made it (float32, one fused layer_norm) and the products summed in float64:
    each product's rounding is ~6e-8 of it, far inside TOLERANCE of the mass."""
    width = module.normalized_shape[-1] if len(module.normalized_shape) == 1 else None
    if width is None:
        raise ValueError("gradient checksums: LayerNorm over more than one dimension")
    dy = grad.reshape(-1, width)
    sums: Sums = {}
    if module.weight is not None:
        product = dy * nn.functional.layer_norm(x.reshape(-1, width), (width,), eps=module.eps)
        sums["weight"] = [(_itself, product.sum(0, dtype=torch.float64), product.abs_().sum(0))]
    if module.bias is not None:
        sums["bias"] = [(_itself, dy.sum(0, dtype=torch.float64), dy.abs().sum(0))]
    return sums


_KINDS: dict[type, Callable] = {nn.Linear: _linear, nn.Embedding: _embedding, nn.LayerNorm: _layer_norm}
