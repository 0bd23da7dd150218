"""A plain PyTorch DDP training script, as a user would write it, that reports its steps to testbed.

    testbed run --topology topologies/two-dc.yaml --baseline -- .venv/bin/python examples/ddp.py

testbed gives every rank torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...). The only testbed
line in it is StepLog: one call per step writes a JSON line to $TESTBED_METRICS_DIR (nothing without it), so
the run directory gets tokens/s, step times, loss and, with --baseline, the efficiency against the same
command on unshaped links, beside the kernel's count of the bytes that crossed DCs. Also runs under plain
`torchrun --standalone --nproc-per-node 4 examples/ddp.py`.

The model: a small causal transformer (torch.nn.TransformerEncoderLayer) on the English documentation that
ships with CPython (pydoc_data), byte tokens; 4.11 M parameters with the defaults.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydoc_data import topics
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from testbed.steplog import StepLog
except ImportError:  # testbed not installed: a copy of testbed/steplog.py next to this script
    from steplog import StepLog


class LM(nn.Module):
    def __init__(self, d_model: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def batch(text: torch.Tensor, step: int, rank: int, size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1_000_003 + rank)
    starts = torch.randint(0, len(text) - seq_len - 1, (size,), generator=gen)
    window = torch.stack([text[s: s + seq_len + 1] for s in starts.tolist()])
    return window[:, :-1], window[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(LM(args.d_model, args.layers, args.heads, args.seq_len), bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    text = torch.frombuffer(bytearray("\n".join(topics.topics.values()).encode()), dtype=torch.uint8).long()
    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"{parameters / 1e6:.2f} M parameters, {dist.get_world_size()} ranks", flush=True)

    log = StepLog(parameters=parameters, world=dist.get_world_size())
    for step in range(args.steps):
        x, y = batch(text, step, rank, args.batch, args.seq_len)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        log.step(tokens=x.numel(), loss=loss.item())
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
