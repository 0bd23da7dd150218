"""Data-parallel strategies: flat all-reduce, Megatron-style hierarchical, and bucketed/chunked overlap.

- flat-dp: one all-reduce of all gradients over all ranks (the baseline).
- hier-dp: as Megatron-Core's partial distributed optimizer moves gradients: reduce-scatter inside the
  DC, all-reduce of only the local shard across DCs, all-gather inside the DC. Cross-DC payload per rank
  falls by the number of nodes per DC.
- hier-dp-overlap: the same per gradient bucket, started as soon as a bucket's gradients are final
  (during backward), with each bucket's inter-DC shard cut into chunks that are all in flight at once over
  several inter-DC process groups ("lanes"): gloo over a long link is app-limited, so one stream at a time
  cannot fill it (NeMo's chunked inter-DC communication). Two threads form a pipeline so that several
  buckets' round trips overlap: one reduce-scatters a bucket and launches its cross-DC chunks, the other
  waits for them and all-gathers on a second intra-DC group. Each process group is driven by one thread
  only, so every rank issues its collectives in the same order.
Compression (fp16/bf16/int8) applies to the inter-DC step (to the whole all-reduce for flat-dp).
"""

from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist

from testbed.workload import data
from testbed.workload.compression import make_codec
from testbed.workload.compute import BACKWARD_SHARE, sleep_until
from testbed.workload.model import loss_fn
from testbed.workload.sdc import checking_from_env, guard_from_env, poison
from testbed.workload.strategies.base import (
    Context,
    MicroBatch,
    Strategy,
    build_model,
    make_optimizer,
    restore_weights_and_optimizer,
    weights_and_optimizer,
)


class DataParallel(Strategy):
    """Shared machinery: model replica, gradient accumulation over micro-batches, optimizer."""

    reads_weights_when_synthetic = False  # synthetic steps fill gradients and never step: the weights go unread

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        # SDC checks digest the weights across replicas: uninitialised ones differ from rank to rank
        weights = (ctx.synthetic_s is None or self.reads_weights_when_synthetic or bool(ctx.opts.dump_dir)
                   or checking_from_env())
        self.model = build_model(ctx, weights)
        self.names = [name for name, _ in self.model.named_parameters()]
        self.params = [param for _, param in self.model.named_parameters()]
        # every gradient is a view of one flat buffer (as DDP's gradient_as_bucket_view): the whole-model
        # collectives then work on it in place instead of on a concatenated copy and a result copy
        self.grad_flat = torch.zeros(sum(p.numel() for p in self.params), device=ctx.device)
        offset = 0
        for param in self.params:
            param.grad = self.grad_flat[offset: offset + param.numel()].view_as(param)
            offset += param.numel()
        self.optimizer = make_optimizer(self.params, ctx.opts)
        self.codec = make_codec(ctx.opts.compression)
        self._last_grads: dict[str, torch.Tensor] = {}
        self.name_of = {id(param): name for name, param in zip(self.names, self.params)}
        self.guard = guard_from_env(ctx.layout.rank, self.names, self.params, self.replicas, ctx.opts.seed,
                                    self.model if ctx.synthetic_s is None else None,
                                    in_buckets=not self.checks_gradients_before_sync, can_recompute_for_others=True)
        self.step_index = 0
        self._quiet = False  # computing a sampled step's gradient beforehand: no bucket leaves

    checks_gradients_before_sync = True  # whether every gradient is final before the collective starts (else each
    # bucket is checked as it leaves: bucket_checked)

    def replicas(self) -> tuple[object, list[int]]:
        """The process group whose ranks hold bit-identical parameters after every step, and its ranks."""
        return dist.group.WORLD, list(range(self.ctx.layout.world))

    def checked_gradients(self, index: int, micro_batches: list[MicroBatch], loss: float | None) -> float | None:
        """Before the collective: inject a gradient corruption due now and check (replaying the step's compute on
        an anomaly); the loss of the gradients that go on."""
        if self.guard is not None and self.checks_gradients_before_sync:
            replayed = self.guard.before_collective(index, lambda: self.compute(index, micro_batches),
                                                    lambda rank: self.compute(index, self.micro_batches_of(rank, index)))
            return replayed if replayed is not None else loss
        return loss

    # --- compute -----------------------------------------------------------------------------------
    def compute(self, index: int, micro_batches: list[MicroBatch]) -> float | None:
        """Forward and backward of every micro-batch, accumulating the mean gradient; returns the loss."""
        for param in self.params:
            param.grad.zero_()
        if self.guard is not None:
            self.guard.gradients_zeroed()
        if self.ctx.synthetic_s is not None:
            with self.ctx.meter.timed("compute_s"):
                self.synthetic_backward(len(micro_batches))
            return None
        total = 0.0
        for number, (x, y) in enumerate(micro_batches):
            self.before_micro_batch(number == len(micro_batches) - 1)
            start = time.perf_counter()
            loss = loss_fn(self.model(x), y) / len(micro_batches)
            loss.backward()
            self.ctx.synchronize()
            self.ctx.meter.add("compute_s", time.perf_counter() - start)
            total += loss.item()
        return total

    def micro_batches_of(self, rank: int, index: int) -> list[MicroBatch]:
        """Rank `rank`'s micro-batches of step `index` (a buddy recomputes its gradient from them)."""
        opts = self.ctx.opts
        return data.micro_batches(self.sample_ranges_of(rank), index, self.ctx.cfg.seq_len, opts.seed,
                                  opts.micro_batch, self.ctx.device)

    def local_gradients(self, index: int, micro_batches: list[MicroBatch]) -> dict[str, torch.Tensor]:
        """This rank's own gradient of the step (copies, by parameter name), computed with no bucket leaving."""
        self._quiet = True
        try:
            self.compute(index, micro_batches)
        finally:
            self._quiet = False
        return {name: param.grad.detach().clone() for name, param in zip(self.names, self.params)}

    def before_micro_batch(self, last: bool) -> None:
        """Hook for strategies that start communication during the last backward."""

    def synthetic_backward(self, micro_batches: int) -> None:
        sleep_until(time.perf_counter() + self.ctx.synthetic_s * micro_batches)
        self.fill_synthetic_gradients()

    def fill_synthetic_gradients(self) -> None:
        value = 1e-3 * (self.ctx.layout.rank + 1)
        for param in self.params:
            param.grad.fill_(value)

    # --- gradient sync -------------------------------------------------------------------------------
    def flat_gradients(self, params: list[torch.nn.Parameter], multiple: int = 1) -> torch.Tensor:
        """The gradients of `params` end to end, zero-padded to a multiple of `multiple`: the flat buffer
        itself (no copy) for all of them when no padding is needed."""
        if params is self.params and self.grad_flat.numel() % multiple == 0:
            return self.grad_flat
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        pad = (-flat.numel()) % multiple
        return torch.nn.functional.pad(flat, (0, pad)) if pad else flat

    def write_gradients(self, params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
        """Set the gradients of `params` to the sum `flat` over the world's ranks, divided by their number."""
        scale = 1.0 / self.ctx.layout.world
        if flat is self.grad_flat:  # summed in place
            flat.mul_(scale)
            return
        offset = 0
        for param in params:
            n = param.numel()
            param.grad.copy_(flat[offset: offset + n].view_as(param)).mul_(scale)
            offset += n

    def hierarchical(self, flat: torch.Tensor, key: str) -> torch.Tensor:
        """Sum `flat` over all ranks: reduce-scatter in the DC, all-reduce the shard across DCs, all-gather."""
        groups, comm = self.ctx.groups, self.ctx.comm
        shard = comm.reduce_scatter(flat, groups.intra, groups.intra_ranks)
        shard = comm.compressed_all_reduce(shard, groups.inter, groups.inter_ranks, self.codec, key)
        return comm.all_gather(shard, groups.intra, groups.intra_ranks, out=flat if flat is self.grad_flat else None)

    def sync(self) -> None:
        raise NotImplementedError

    def bucket_checked(self, b: int, bucket: list[torch.nn.Parameter]) -> None:
        """A bucket's gradients are final and about to leave: inject a corruption due in them, check them, and
        poison the bucket when one is found (testbed.workload.sdc: every rank then drops the step's gradient)."""
        if self.guard is not None:
            grads = {self.name_of[id(param)]: param.grad for param in bucket}
            if self.guard.bucket_ready(self.step_index, b, grads):
                poison(bucket[0].grad)

    def timed_sync(self) -> None:
        start = time.perf_counter()
        self.sync()
        self.ctx.meter.add("exposed_s", time.perf_counter() - start)

    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        self.step_index = index
        in_buckets = self.guard is not None and not self.checks_gradients_before_sync
        kept = self.codec.snapshot() if in_buckets else {}  # error feedback, as before the step: for a replay
        if in_buckets and self.guard.samples(index):
            self.guard.sample_reference(index, self.local_gradients(index, micro_batches))  # its time is in the step
        loss = self.checked_gradients(index, micro_batches, self.compute(index, micro_batches))
        self.timed_sync()
        apply = True
        if in_buckets:
            def replay() -> float | None:
                self.codec.restore(kept)
                replayed = self.compute(index, micro_batches)
                self.timed_sync()
                return replayed

            apply, replayed = self.guard.after_sync(index, lambda: [self.grad_flat], replay)
            loss = replayed if replayed is not None else loss
        if self.ctx.opts.dump_dir:
            self._last_grads = {n: p.grad.detach().clone() for n, p in zip(self.names, self.params)}
        if self.ctx.synthetic_s is None and apply:
            self.optimizer.step()
        self.checked_parameters(index)
        return self.with_sdc({"loss": loss})

    def named_gradients(self) -> dict[str, torch.Tensor]:
        return self._last_grads

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in zip(self.names, self.params)}

    def checkpoint_state(self) -> dict:
        """The parameters and the optimizer's state: the same on every replica after a step."""
        return weights_and_optimizer(self.names, self.params, self.optimizer)

    def restore(self, state: dict) -> None:
        restore_weights_and_optimizer(state, self.names, self.params, self.optimizer)


class FlatDP(DataParallel):
    name = "flat-dp"

    def sync(self) -> None:
        world = list(range(self.ctx.layout.world))
        flat = self.flat_gradients(self.params)
        if flat is self.grad_flat and self.codec.name == "none":
            self.ctx.comm.all_reduce(flat, dist.group.WORLD, world)  # in place: the buffer holds the sum
            summed = flat
        else:
            summed = self.ctx.comm.compressed_all_reduce(flat, dist.group.WORLD, world, self.codec, "all")
        self.write_gradients(self.params, summed)


class HierDP(DataParallel):
    name = "hier-dp"

    def sync(self) -> None:
        flat = self.flat_gradients(self.params, multiple=self.ctx.layout.dc_size)
        self.write_gradients(self.params, self.hierarchical(flat, "all"))


class HierDPOverlap(DataParallel):
    name = "hier-dp-overlap"
    checks_gradients_before_sync = False  # buckets leave during backward: each is checked as it leaves

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        limit = max(1, int(ctx.opts.bucket_mb * 1e6 / 4))
        self.buckets: list[list[torch.nn.Parameter]] = []
        current: list[torch.nn.Parameter] = []
        for param in reversed(self.params):  # gradients become final roughly in reverse order
            current.append(param)
            if sum(p.numel() for p in current) >= limit:
                self.buckets.append(current)
                current = []
        if current:
            self.buckets.append(current)
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._pending: list[int] = [0] * len(self.buckets)
        self._armed = False
        self._queue: queue.Queue = queue.Queue()  # bucket indexes, from backward to the launch thread
        self._launched: queue.Queue = queue.Queue()  # (bucket, chunks, works), to the gather thread
        self._error: list[BaseException] = []
        threading.Thread(target=self._launch_loop, daemon=True).start()
        threading.Thread(target=self._gather_loop, daemon=True).start()
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._grad_ready)

    # backward side ---------------------------------------------------------------------------------
    def micro_batches_of(self, rank: int, index: int) -> list[MicroBatch]:
        """Rank `rank`'s micro-batches of step `index` (a buddy recomputes its gradient from them)."""
        opts = self.ctx.opts
        return data.micro_batches(self.sample_ranges_of(rank), index, self.ctx.cfg.seq_len, opts.seed,
                                  opts.micro_batch, self.ctx.device)

    def before_micro_batch(self, last: bool) -> None:
        self._armed = last and not self._quiet
        self._pending = [len(bucket) for bucket in self.buckets]

    def _grad_ready(self, param: torch.nn.Parameter) -> None:
        if not self._armed:
            return
        b = self.bucket_of[id(param)]
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self.bucket_checked(b, self.buckets[b])
            self._queue.put(b)

    def synthetic_backward(self, micro_batches: int) -> None:
        """Forward, then each bucket's share of backward, handing each bucket over as it is done."""
        total = self.ctx.synthetic_s * micro_batches
        deadline = time.perf_counter() + total * (1 - BACKWARD_SHARE)
        sleep_until(deadline)
        self.fill_synthetic_gradients()
        numel = sum(p.numel() for p in self.params)
        for b, bucket in enumerate(self.buckets):
            deadline += total * BACKWARD_SHARE * sum(p.numel() for p in bucket) / numel
            sleep_until(deadline)
            if not self._quiet:
                self.bucket_checked(b, bucket)
                self._queue.put(b)

    # communication threads ---------------------------------------------------------------------------
    def _launch_loop(self) -> None:
        while True:
            b = self._queue.get()
            try:
                self._launch(b)
            except BaseException as error:  # surfaced in the training thread
                self._error.append(error)
            finally:
                self._queue.task_done()

    def _launch(self, b: int) -> None:
        """Reduce-scatter bucket b in the DC and start every cross-DC chunk of its shard."""
        groups, comm, opts = self.ctx.groups, self.ctx.comm, self.ctx.opts
        chunks = max(1, opts.chunks)
        flat = self.flat_gradients(self.buckets[b], multiple=self.ctx.layout.dc_size * chunks)
        shard = comm.reduce_scatter(flat, groups.intra, groups.intra_ranks)
        pieces = list(shard.chunk(chunks))
        lanes = groups.lanes
        if self.codec.name == "none":
            works = [comm.all_reduce_async(piece, lanes[(b * chunks + i) % len(lanes)], groups.inter_ranks)
                     for i, piece in enumerate(pieces)]
        else:
            pieces = [comm.compressed_all_reduce(piece, lanes[(b * chunks + i) % len(lanes)], groups.inter_ranks,
                                                 self.codec, f"{b}.{i}") for i, piece in enumerate(pieces)]
            works = []
        self._launched.put((b, pieces, works, time.perf_counter()))

    def _gather_loop(self) -> None:
        while True:
            b, pieces, works, started = self._launched.get()
            try:
                for work in works:
                    if work is not None:
                        work.wait()
                groups = self.ctx.groups
                self.ctx.meter.add_comm(time.perf_counter() - started, groups.inter_ranks)
                full = self.ctx.comm.all_gather(torch.cat(pieces), groups.intra_gather, groups.intra_ranks)
                self.write_gradients(self.buckets[b], full)
            except BaseException as error:
                self._error.append(error)
            finally:
                self._launched.task_done()

    def sync(self) -> None:
        self._queue.join()  # the exposed part: what backward did not hide
        self._launched.join()
        if self._error:
            raise RuntimeError(f"gradient communication failed: {self._error[0]}") from self._error[0]
