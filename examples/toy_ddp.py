"""The PyTorch DDP tutorial's ToyModel, trained as the tutorial trains it: no line of it knows about testbed.

    testbed run --topology topologies/two-dc.yaml --baseline -- .venv/bin/python examples/toy_ddp.py

Under `testbed run --topology` every rank gets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), and
testbed sees each optimizer step by itself (a hook it installs when the rank starts): the report has the step time
and, with --baseline, the efficiency against the same command on unshaped links. `--tokens-per-step N` on
`testbed run` adds tokens/s. Runs just as well under `torchrun --standalone --nproc-per-node 4 examples/toy_ddp.py`.
(examples/ddp.py is a script that reports more itself: loss and tokens, with testbed.steplog.)
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, hidden)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(hidden, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=20, help="samples per rank and step")
    parser.add_argument("--hidden", type=int, default=10, help="width of the hidden layer (the tutorial's: 10)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DDP(ToyModel(args.hidden))
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    for _ in range(args.steps):
        optimizer.zero_grad()
        outputs = model(torch.randn(args.batch, 10))
        loss_fn(outputs, torch.randn(args.batch, 5)).backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"trained {args.steps} steps on {dist.get_world_size()} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
