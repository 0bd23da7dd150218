"""Collectives and point-to-point transfers that account their time and bytes in the step's Meter."""

from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist

from testbed.workload.compression import Codec
from testbed.workload.metrics import Meter


def reduce_scatter_into(shard: torch.Tensor, flat: torch.Tensor, group: dist.ProcessGroup) -> None:
    """`shard` = this rank's part of `flat` summed over the group (flat's length is shard's times the group's size).
    On gloo, one exchange of the parts (all_to_all) and a local sum: torch's gloo backend has no reduce-scatter of
    its own (the tensor form all-reduces the whole input and keeps a part; the list form, used here before, was
    slower still). 20 MB over 16 ranks on loopback, medians of 5, 2026-11-28: list form 0.687 s, tensor form
    0.144 s, all-reduce 0.194 s, this 0.065 s; 128 ranks in 4 DCs, hier-dp's step 19.6 s -> 1.23 s
    (docs/validation/scale.md). NCCL's is native."""
    if dist.get_backend(group) != "gloo":
        dist.reduce_scatter_tensor(shard, flat, group=group)
        return
    parts = torch.empty_like(flat)
    dist.all_to_all_single(parts, flat, group=group)
    torch.sum(parts.view(-1, shard.numel()), dim=0, out=shard)


class Comm:
    def __init__(self, meter: Meter, inject_delay: float = 0.0) -> None:
        self.meter = meter
        # seconds added to cross-DC point-to-point sends (loopback studies with gloo: the sending thread
        # would share an NCCL communicator with the training thread, which NCCL does not allow)
        self.inject_delay = inject_delay
        self._delayed: dict[int, queue.Queue] = {}

    # --- collectives (synchronous; the caller decides whether the wait is exposed) -------------------
    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup, ranks: list[int]) -> None:
        self.meter.traffic("all_reduce", tensor.numel() * tensor.element_size(), ranks)
        if len(ranks) > 1:
            with self.meter.comm_timed(ranks):
                dist.all_reduce(tensor, group=group)

    def all_reduce_async(self, tensor: torch.Tensor, group: dist.ProcessGroup, ranks: list[int]):
        self.meter.traffic("all_reduce", tensor.numel() * tensor.element_size(), ranks)
        return dist.all_reduce(tensor, group=group, async_op=True) if len(ranks) > 1 else None

    def reduce_scatter(self, flat: torch.Tensor, group: dist.ProcessGroup, ranks: list[int]) -> torch.Tensor:
        """Sum `flat` (length divisible by the group size) over the group; return this rank's shard."""
        g = len(ranks)
        if g == 1:
            return flat.clone()
        self.meter.traffic("reduce_scatter", flat.numel() * flat.element_size(), ranks)
        shard = torch.empty(flat.numel() // g, dtype=flat.dtype, device=flat.device)
        with self.meter.comm_timed(ranks):
            reduce_scatter_into(shard, flat, group)
        return shard

    def all_gather(self, shard: torch.Tensor, group: dist.ProcessGroup, ranks: list[int],
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's shard end to end (into `out` when given: as long as the group's shards together)."""
        g = len(ranks)
        if g == 1:
            return out.copy_(shard) if out is not None else shard.clone()
        self.meter.traffic("all_gather", shard.numel() * shard.element_size(), ranks)
        if out is None:
            out = torch.empty(shard.numel() * g, dtype=shard.dtype, device=shard.device)
        with self.meter.comm_timed(ranks):
            dist.all_gather_into_tensor(out, shard, group=group)
        return out

    def compressed_all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup, ranks: list[int],
                              codec: Codec, key: str) -> torch.Tensor:
        """Sum over the group through `codec`: all-gather the encoded parts, decode and sum locally."""
        if codec.name == "none":
            out = tensor.clone()
            self.all_reduce(out, group, ranks)
            return out
        parts = codec.encode(tensor, key)
        if len(ranks) == 1:
            return codec.decode([parts], tensor.numel())
        gathered: list[list[torch.Tensor]] = [[] for _ in ranks]
        for part in parts:
            self.meter.traffic("all_gather", part.numel() * part.element_size(), ranks)
            buffers = [torch.empty_like(part) for _ in ranks]
            with self.meter.comm_timed(ranks):
                dist.all_gather(buffers, part, group=group)
            for index, buffer in enumerate(buffers):
                gathered[index].append(buffer)
        return codec.decode(gathered, tensor.numel())

    # --- point to point ------------------------------------------------------------------------------
    def isend(self, tensor: torch.Tensor, peer: int, tag: int, cross_dc: bool):
        """Start sending; returns something with .wait(). Cross-DC sends get the injected delay, if any."""
        self.meter.p2p(tensor.numel() * tensor.element_size(), peer)
        if cross_dc and self.inject_delay > 0:
            return self._delayed_send(tensor, peer, tag)
        return dist.isend(tensor, peer, tag=tag)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int):
        return dist.irecv(tensor, peer, tag=tag)

    def _delayed_send(self, tensor: torch.Tensor, peer: int, tag: int):
        """A per-peer FIFO thread that sends each tensor `inject_delay` after it was handed over."""
        if peer not in self._delayed:
            q: queue.Queue = queue.Queue()
            self._delayed[peer] = q

            def pump() -> None:
                while True:
                    item = q.get()
                    if item is None:
                        return
                    due, data, item_tag, done = item
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    dist.send(data, peer, tag=item_tag)
                    done.set()

            threading.Thread(target=pump, daemon=True).start()
        done = threading.Event()
        self._delayed[peer].put((time.monotonic() + self.inject_delay, tensor, tag, done))

        class _Handle:
            def wait(self_inner) -> bool:
                done.wait()
                return True

        return _Handle()

    def close(self) -> None:
        for q in self._delayed.values():
            q.put(None)
