"""Gradient checksums: clean backward passes (micro-batches accumulated) match them; an exponent flip of any
element that is not rounding-sized breaks them, in every kind of layer the model has; parameters of other
layers are said to be uncovered."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from testbed.spec.presets import PRESETS
from testbed.workload.gradsums import GradientChecksums
from testbed.workload.model import GPT, loss_fn
from testbed.workload.sdc import flip_bit

CFG = PRESETS["tiny"]


def _backward(model: nn.Module, sums: GradientChecksums, seed: int, micro_batches: int = 2) -> None:
    generator = torch.Generator().manual_seed(seed)
    model.zero_grad(set_to_none=False)
    sums.reset()
    for _ in range(micro_batches):
        x = torch.randint(0, CFG.vocab // 4, (2, CFG.seq_len), generator=generator)  # some tokens never used
        y = torch.randint(0, CFG.vocab, (2, CFG.seq_len), generator=generator)
        (loss_fn(model(x), y) / micro_batches).backward()


@pytest.fixture(scope="module")
def trained() -> tuple[nn.Module, GradientChecksums]:
    torch.manual_seed(0)
    model = GPT(CFG)
    sums = GradientChecksums(model)
    optimizer = torch.optim.AdamW(model.parameters(), 1e-2)
    for step in range(5):  # away from the initial weights, where attention is uniform
        _backward(model, sums, step)
        optimizer.step()
    return model, sums


def test_clean_steps_match_their_checksums(trained):
    model, sums = trained
    assert set(sums.covered) == {name for name, _ in model.named_parameters()}
    for seed in range(100, 110):
        _backward(model, sums, seed)
        assert sums.mismatches() == {}, seed


@pytest.mark.parametrize("bit", range(23, 31))
def test_an_exponent_flip_of_the_largest_gradient_of_every_tensor_is_caught(trained, bit):
    model, sums = trained
    _backward(model, sums, 7)
    for name, param in model.named_parameters():
        index = int(param.grad.abs().argmax())
        flip_bit(param.grad, index, bit)
        assert name in sums.mismatches(), (name, bit)
        flip_bit(param.grad, index, bit)
    assert sums.mismatches() == {}


@pytest.mark.parametrize("bit", [23, 26, 29])
def test_a_flip_of_a_typical_element_is_caught_in_most_places(trained, bit):
    """Elements drawn at random from every tensor: at least 90 % caught (the misses are elements of the
    rounding's own size, such as the attention key bias whose gradient is zero but for rounding)."""
    model, sums = trained
    _backward(model, sums, 8)
    generator = torch.Generator().manual_seed(bit)
    caught = total = 0
    for _, param in model.named_parameters():
        for index in torch.randint(0, param.numel(), (20,), generator=generator).tolist():
            flip_bit(param.grad, index, bit)
            caught += bool(sums.mismatches())
            total += 1
            flip_bit(param.grad, index, bit)
    assert caught / total >= 0.9, (caught, total)


def test_a_flip_in_an_embedding_row_no_token_used_is_caught(trained):
    model, sums = trained
    _backward(model, sums, 9)
    weight = model[0].tok.weight
    row = CFG.vocab - 1  # the inputs draw from the first quarter of the vocabulary only
    assert float(weight.grad[row].abs().max()) == 0.0
    flip_bit(weight.grad, row * CFG.d_model + 3, 23)  # 0.0 becomes 2^-126: the row's sum, exactly 0, is not
    assert sums.mismatches() == {"0.tok.weight": float("inf")}
    flip_bit(weight.grad, row * CFG.d_model + 3, 23)


def test_the_sums_follow_micro_batches_and_reset(trained):
    model, sums = trained
    _backward(model, sums, 10, micro_batches=3)
    assert sums.mismatches() == {}
    model.zero_grad(set_to_none=False)  # zeroed gradients against the last step's sums (not the embeddings':
    assert set(sums.mismatches()) >= {"1.attn.weight", "5.out.weight"}  # their rows sum to 0, as a norm's input)
    sums.reset()  # with the gradients: nothing to compare until the next backward
    assert sums.mismatches() == {}


def test_parameters_of_other_layers_are_not_covered():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.scale = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * self.scale

    model = Scaled()
    sums = GradientChecksums(model)
    assert set(sums.covered) == {"linear.weight", "linear.bias"}
    model(torch.randn(3, 4)).sum().backward()
    assert sums.mismatches() == {}
    sums.close()
    assert not model.linear._forward_hooks
