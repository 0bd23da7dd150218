"""The strategy interface and what every strategy is handed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from testbed.workload.checkpoint import Checkpointing
from testbed.workload.comm import Comm
from testbed.workload.groups import Groups
from testbed.workload.layout import Layout
from testbed.workload.metrics import Meter
from testbed.workload.model import GPT, ModelConfig
from testbed.workload.options import Options
from testbed.workload.sdc import Guard

MicroBatch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Context:
    layout: Layout
    groups: Groups
    meter: Meter
    comm: Comm
    cfg: ModelConfig
    opts: Options
    synthetic_s: float | None  # forward+backward seconds per micro-batch of the whole model, synthetic mode
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (immutable: one shared default is right)
    checkpoints: Checkpointing | None = None  # when the state after a step is written (a strategy may settle first)

    def synchronize(self) -> None:
        """Wait for queued GPU work, so that wall-clock compute timings are true."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class Strategy(ABC):
    """setup() once, then step() per training step with this rank's micro-batches."""

    name = "strategy"
    guard: Guard | None = None  # silent data corruption injected and checked (testbed.workload.sdc), when asked

    def checked_parameters(self, index: int) -> None:
        """After the optimizer: inject a parameter corruption due now, compare the replicas, restore."""
        if self.guard is not None:
            self.guard.after_update(index)

    def with_sdc(self, record: dict) -> dict:
        """The step's record with the SDC events and the checks' time since the last step, when checking."""
        if self.guard is None:
            return record
        events, seconds = self.guard.take()
        return {**record, "sdc_check_s": seconds, "events": events}

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx

    @abstractmethod
    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        """Run one step; return {'loss': float | None, ...}. Counters go to ctx.meter."""

    def sample_ranges(self) -> list[tuple[int, int]]:
        """(first global sample, count) ranges this rank trains on per step."""
        return self.sample_ranges_of(self.ctx.layout.rank)

    def sample_ranges_of(self, rank: int) -> list[tuple[int, int]]:
        """The sample_ranges() of rank `rank` (a data-parallel rank's: its share of the global batch)."""
        per_rank = self.ctx.opts.micro_batch * self.ctx.opts.micro_batches
        return [(rank * per_rank, per_rank)]

    def named_gradients(self) -> dict[str, torch.Tensor]:
        """The averaged gradients the last step applied (tests compare strategies with them)."""
        return {}

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {}

    checkpoint_per_rank = False  # whether each rank writes its own checkpoint (else rank 0's is every rank's)

    def checkpoint_state(self) -> dict:
        """Everything a restarted rank needs to go on from the end of the last step (testbed.workload.checkpoint):
        identical on every rank, or this rank's own (checkpoint_per_rank)."""
        raise NotImplementedError(f"{self.name} keeps no checkpoint")

    def restore(self, state: dict) -> None:
        """Take up a checkpoint_state() written by rank 0 (or by this rank: checkpoint_per_rank)."""
        raise NotImplementedError(f"{self.name} keeps no checkpoint")


def weights_and_optimizer(names: list[str], params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    """A checkpoint of parameters (copied) and an optimizer's state."""
    return {"params": {n: p.detach().clone() for n, p in zip(names, params)}, "optimizer": optimizer.state_dict()}


def restore_weights_and_optimizer(state: dict, names: list[str], params: list[torch.Tensor],
                                  optimizer: torch.optim.Optimizer) -> None:
    """Take up a weights_and_optimizer() checkpoint."""
    with torch.no_grad():
        for name, param in zip(names, params):
            param.copy_(state["params"][name])
    optimizer.load_state_dict(state["optimizer"])


def build_model(ctx: Context, weights: bool = True) -> GPT:
    """The same initial weights on every rank and in every strategy. Without `weights` (synthetic compute that
    never reads them) the parameters are left uninitialised: no random init, and their pages are never touched,
    so they take no memory; only their shapes (and their gradients' bytes) matter."""
    if not weights:
        with torch.device("meta"):
            return GPT(ctx.cfg).to_empty(device=ctx.device)
    torch.manual_seed(ctx.opts.seed)  # initialised on the CPU: identical on every rank and device
    return GPT(ctx.cfg).to(ctx.device)


def average_in_dc(ctx: Context, params: list[torch.nn.Parameter]) -> None:
    """Replace each gradient by its mean over this DC's nodes (one flat all-reduce on the intra-DC group)."""
    groups = ctx.groups
    if len(groups.intra_ranks) == 1:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    ctx.comm.all_reduce(flat, groups.intra, groups.intra_ranks)
    offset = 0
    for param in params:
        param.grad.copy_(flat[offset: offset + param.numel()].view_as(param)).div_(len(groups.intra_ranks))
        offset += param.numel()


def fragment_runs(tensors: int, fragments: int) -> list[range]:
    """Streaming DiLoCo's fragments: `tensors` parameter tensors cut into `fragments` runs of about equal count (no
    more runs than tensors)."""
    count = max(1, min(fragments, tensors))
    bounds = torch.linspace(0, tensors, count + 1).round().long().tolist()
    return [range(bounds[f], bounds[f + 1]) for f in range(count)]


def make_optimizer(params, opts: Options) -> torch.optim.Optimizer:
    if opts.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=opts.lr, weight_decay=0.0)
    if opts.optimizer == "sgd":
        return torch.optim.SGD(params, lr=opts.lr)
    raise ValueError(f"unknown optimizer {opts.optimizer!r} (adamw, sgd)")
