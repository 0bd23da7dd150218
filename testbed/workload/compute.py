"""Forward/backward of one micro-batch: real autograd, or a calibrated sleep (synthetic mode).

Synthetic mode keeps the bytes real (gradients and activations of the true shapes cross the network)
while replacing the arithmetic by a sleep, so 16-32 ranks fit on two cores, or a big model's
compute/communication ratio can be emulated from a device profile.
"""

from __future__ import annotations

import time

import torch

from testbed.workload.model import GPT, ModelConfig, count_parameters, flops_per_token, loss_fn
from testbed.workload.options import Options

BACKWARD_SHARE = 2 / 3  # backward costs about twice the forward


class ComputeStep:
    """One micro-batch's real forward and backward of the whole model, built once: call it to compute (it
    returns once the device has finished). `parameters`: the model's, for the calibration's optimizer steps."""

    def __init__(self, cfg: ModelConfig, micro_batch: int, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.model = GPT(cfg).to(self.device)
        self.x = torch.randint(0, cfg.vocab, (micro_batch, cfg.seq_len), device=self.device)
        self.parameters = list(self.model.parameters())

    def __call__(self) -> None:
        loss_fn(self.model(self.x), self.x).backward()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def measure_compute_seconds(cfg: ModelConfig, micro_batch: int, device: torch.device | None = None,
                            repeats: int = 3) -> float:
    """Median real forward+backward time of one micro-batch of the whole model on this device."""
    step = ComputeStep(cfg, micro_batch, device)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def synthetic_seconds(cfg: ModelConfig, opts: Options, device: torch.device | None = None) -> float:
    """Forward+backward seconds per micro-batch for the whole model in synthetic mode."""
    if opts.compute_ms is not None:
        return opts.compute_ms / 1e3
    if opts.device_tflops:
        tokens = opts.micro_batch * cfg.seq_len
        return flops_per_token(cfg, count_parameters(GPT(cfg))) * tokens / (opts.device_tflops * 1e12)
    return measure_compute_seconds(cfg, opts.micro_batch, device)


def sleep_until(deadline: float) -> None:
    """Sleep to a perf_counter deadline precisely (short sleeps overshoot on a busy machine)."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left if left > 0.002 else 0)
