"""Pipeline parallelism with the stage boundary on the DC boundary.

Stage s of a pipeline lives in DC s; the n nodes of a DC are n pipeline replicas (data parallel inside
the DC: the stage's gradients are all-reduced over the DC after the pipeline flush). DCs of different
sizes: there are as many replicas as the largest DC has ranks, and a rank of a smaller DC runs several
replicas' schedules one after the other (its stage is the slow one, as it would be). The model (embedding,
blocks, head) is cut into p*v contiguous chunks; chunk c belongs to stage c mod p (v > 1 only for the
interleaved schedule).

Schedules (lists of F/B operations per stage, executed by one engine):
- gpipe: all forwards, then all backwards.
- 1f1b: p-s-1 warm-up forwards, then one forward / one backward, then the remaining backwards.
- interleaved-1f1b: Megatron's virtual-pipeline order over v chunks per stage (m divisible by p).
- overlap: 1f1b with (p-s-1) x (1 + lookahead) warm-up forwards (enough micro-batches in flight to cover
  the round trip to the last stage) and every receive posted at the start of the step, so activations
  and gradients cross the long link while the stage computes (the GeoPipe idea).
Sends are always asynchronous; in the non-overlapped schedules a receive is posted only when its
operation is next, so the transfer's latency is exposed there.

Bubble: the part of a stage's step that is neither its own compute nor its data-parallel sync
(waiting for activations/gradients and idling), reported per rank.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from testbed import rankenv
from testbed.spec.schedules import overlap_lookahead, schedule_ops
from testbed.workload.compute import BACKWARD_SHARE, sleep_until
from testbed.workload.model import GPT, loss_fn, split_points
from testbed.workload.sdc import checking_from_env, guard_from_env
from testbed.workload.strategies.base import (
    Context,
    MicroBatch,
    Strategy,
    average_in_dc,
    build_model,
    make_optimizer,
    restore_weights_and_optimizer,
    weights_and_optimizer,
)


class Pipeline(Strategy):
    name = "pp"

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        opts, layout = ctx.opts, ctx.layout
        self.p, self.stage = layout.num_dcs, layout.dc
        self.v = opts.virtual_chunks if opts.schedule == "interleaved-1f1b" else 1
        self.m = opts.micro_batches
        # synthetic compute leaves the weights unread, but SDC checks digest them across a stage's replicas
        full: GPT = build_model(ctx, ctx.synthetic_s is None or bool(opts.dump_dir) or checking_from_env())
        modules = list(full)
        bounds = split_points(len(modules), self.p * self.v)
        self.global_chunks = [self.stage + k * self.p for k in range(self.v)]  # virtual k -> global chunk
        self.chunks: list[nn.Sequential] = []
        self.names: list[str] = []
        self.params: list[nn.Parameter] = []
        for g in self.global_chunks:
            lo, hi = bounds[g]
            self.chunks.append(nn.Sequential(*modules[lo:hi]))
            for index in range(lo, hi):
                for name, param in modules[index].named_parameters():
                    self.names.append(f"{index}.{name}")
                    self.params.append(param)
        for param in self.params:
            param.grad = torch.zeros_like(param)
        self.optimizer = make_optimizer(self.params, opts)
        self.last_chunk = self.p * self.v - 1
        self.shape = (opts.micro_batch, ctx.cfg.seq_len, ctx.cfg.d_model)
        # synthetic compute sends activations' and gradients' bytes, never their values: one zero tensor of each
        # shape serves every micro-batch (sends only read it), so no activation is allocated per micro-batch
        self._zeros = torch.zeros(self.shape, device=ctx.device) if ctx.synthetic_s is not None else None
        self._zero_loss = torch.zeros((), device=ctx.device)
        self.lookahead = self._lookahead() if opts.schedule == "overlap" else 0
        self.ops = schedule_ops(opts.schedule, self.p, self.stage, self.m, self.v, self.lookahead)
        # Pipeline replicas: as many as the largest DC has ranks; rank j of a DC with n ranks serves the
        # replicas r with r mod n == j, one after the other (DCs of equal size: one replica per rank).
        self.pipelines = max(layout.dc_sizes)
        self.replicas = [r for r in range(self.pipelines) if r % layout.dc_size == layout.index_in_dc]
        self._last_grads: dict[str, torch.Tensor] = {}
        # a stage's replicas are its DC's ranks; a replay recomputes this stage's gradient alone, from the inputs
        # and incoming gradients each backward used (kept for the step: GPipe's activation memory, when checking)
        self.guard = guard_from_env(layout.rank, self.names, self.params,
                                    lambda: (ctx.groups.intra, list(ctx.groups.intra_ranks)), opts.seed,
                                    nn.ModuleList(self.chunks) if ctx.synthetic_s is None else None)
        self._kept: list[tuple[int, int, torch.Tensor, torch.Tensor | None, torch.Tensor]] | None = None

    def _lookahead(self) -> int:
        """Extra warm-up micro-batches for `overlap`: enough to cover one cross-DC round trip."""
        opts = self.ctx.opts
        rtt = float(os.environ.get(rankenv.LINK_RTT_MS, "0")) / 1e3 or 2 * opts.inject_delay_ms / 1e3
        return overlap_lookahead(opts.lookahead, rtt, (self.ctx.synthetic_s or 0.0) / self.p, self.p, self.m)

    def sample_ranges(self) -> list[tuple[int, int]]:
        per_pipeline = self.ctx.opts.micro_batch * self.m
        return [(replica * per_pipeline, per_pipeline) for replica in self.replicas]

    # --- helpers -----------------------------------------------------------------------------------------
    def owner(self, g: int, replica: int) -> int:
        """Rank holding global chunk g in pipeline replica `replica`."""
        layout = self.ctx.layout
        dc = g % self.p
        return layout.dc_start(dc) + replica % layout.dc_sizes[dc]

    def tag(self, g: int, mb: int, backward: bool, replica: int) -> int:
        return ((replica * self.p * self.v + g) * 4096 + mb) * 2 + int(backward)

    def _synthetic_seconds(self) -> tuple[float, float]:
        per_chunk = self.ctx.synthetic_s / (self.p * self.v)
        return per_chunk * (1 - BACKWARD_SHARE), per_chunk * BACKWARD_SHARE

    # --- one step ------------------------------------------------------------------------------------------
    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        ctx = self.ctx
        step_start = time.perf_counter()
        for param in self.params:
            param.grad.zero_()
        synthetic = ctx.synthetic_s is not None
        if self.guard is not None:
            self.guard.gradients_zeroed()
            self._kept = [] if self.guard.check and not synthetic else None
        losses: list[float] = []
        for k, replica in enumerate(self.replicas):
            losses += self._run(replica, micro_batches[k * self.m: (k + 1) * self.m])
        pipeline_end = time.perf_counter()
        pipeline_compute = ctx.meter.step.compute_s
        if synthetic:
            self._fill_synthetic_gradients()
        loss = self._mean_loss(losses)
        if self.guard is not None:  # this stage's gradient, checked before the DC's all-reduce
            replayed = self.guard.before_collective(index, self._replay)
            loss = replayed if replayed is not None else loss
            self._kept = None
        dp_start = time.perf_counter()
        average_in_dc(ctx, self.params)  # data parallelism among this stage's replicas
        if self.pipelines != ctx.layout.dc_size:  # a rank served several replicas: their mean, not their sum
            for param in self.params:
                param.grad.mul_(ctx.layout.dc_size / self.pipelines)
        ctx.meter.add("exposed_s", time.perf_counter() - dp_start)
        if ctx.opts.dump_dir:
            self._last_grads = {n: p.grad.detach().clone() for n, p in zip(self.names, self.params)}
        if not synthetic:
            self.optimizer.step()
        self.checked_parameters(index)
        pipeline_time = pipeline_end - step_start
        bubble = max(0.0, pipeline_time - pipeline_compute)
        ctx.meter.add("bubble_s", bubble)
        return self.with_sdc({"loss": loss, "stage": self.stage, "lookahead": self.lookahead,
                              "pipeline_s": pipeline_time})

    def _replay(self) -> float | None:
        """This stage's gradient computed again, from the inputs and incoming gradients its backwards used, in
        their order (so a clean replay gives the same bits); the loss (last stage), as step() reports it."""
        for param in self.params:
            param.grad.zero_()
        self.guard.gradients_zeroed()
        start = time.perf_counter()
        if self._kept is None:  # synthetic compute: its gradients are what it fills in
            self._fill_synthetic_gradients()
            return None
        losses = []
        for k, g, x, grad, target in self._kept:
            out = self.chunks[k](x if g == 0 else x.detach().requires_grad_(True))
            if g == self.last_chunk:
                out = loss_fn(out, target) / self.m
                losses.append(out.item())
            out.backward(grad)
        self.ctx.synchronize()
        self.ctx.meter.add("compute_s", time.perf_counter() - start)
        return self._mean_loss(losses)

    def _fill_synthetic_gradients(self) -> None:
        for param in self.params:
            param.grad.fill_(1e-3)

    def _mean_loss(self, losses: list[float]) -> float | None:
        """The step's loss from the last stage's micro-batch losses (None on other stages)."""
        return sum(losses) / len(self.replicas) if losses else None

    def _run(self, replica: int, micro_batches: list[MicroBatch]) -> list[float]:
        """One pipeline replica's schedule on this stage; returns the losses (last stage) of its micro-batches."""
        ctx = self.ctx
        comm, meter, rank = ctx.comm, ctx.meter, ctx.layout.rank
        overlap = ctx.opts.schedule == "overlap"
        synthetic = ctx.synthetic_s is not None
        t_fwd, t_bwd = self._synthetic_seconds() if synthetic else (0.0, 0.0)
        recvs: dict[tuple[int, int, bool], tuple[torch.Tensor, object]] = {}
        local: dict[tuple[int, int, bool], torch.Tensor] = {}
        sends: list[object] = []
        saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
        losses: list[float] = []

        def post(g: int, mb: int, backward: bool) -> None:
            peer = self.owner(g + 1 if backward else g - 1, replica)
            buffer = torch.empty(self.shape, device=ctx.device)
            recvs[(g, mb, backward)] = (buffer, comm.irecv(buffer, peer, self.tag(g, mb, backward, replica)))

        def incoming(g: int, mb: int, backward: bool) -> torch.Tensor:
            key = (g, mb, backward)
            if key in local:
                return local.pop(key)
            if key not in recvs:
                post(g, mb, backward)
            buffer, handle = recvs.pop(key)
            handle.wait()
            return buffer

        def outgoing(g_to: int, mb: int, backward: bool, tensor: torch.Tensor) -> None:
            peer = self.owner(g_to, replica)
            if peer == rank:
                local[(g_to, mb, backward)] = tensor
            else:
                sends.append(comm.isend(tensor.contiguous(), peer, self.tag(g_to, mb, backward, replica),
                                        cross_dc=ctx.layout.dc_of(peer) != ctx.layout.dc))

        if overlap:  # every receive of the step posted now: transfers start the moment peers send
            for kind, k, mb in self.ops:
                g = self.global_chunks[k]
                if kind == "F" and g > 0 and self.owner(g - 1, replica) != rank:
                    post(g, mb, False)
                if kind == "B" and g < self.last_chunk and self.owner(g + 1, replica) != rank:
                    post(g, mb, True)

        for kind, k, mb in self.ops:
            g = self.global_chunks[k]
            if kind == "F":
                x = micro_batches[mb][0] if g == 0 else incoming(g, mb, False)
                start = time.perf_counter()
                if synthetic:
                    sleep_until(start + t_fwd)
                    out = self._zeros if g < self.last_chunk else self._zero_loss
                    saved[(g, mb)] = (None, out)
                else:
                    if g > 0:
                        x = x.detach().requires_grad_(True)
                    out = self.chunks[k](x)
                    if g == self.last_chunk:
                        out = loss_fn(out, micro_batches[mb][1]) / self.m
                        losses.append(out.item())
                    ctx.synchronize()
                    saved[(g, mb)] = (x if g > 0 else None, out)
                meter.add("compute_s", time.perf_counter() - start)
                if g < self.last_chunk:
                    outgoing(g + 1, mb, False, out.detach())
            else:
                grad = None if g == self.last_chunk else incoming(g, mb, True)
                x, out = saved.pop((g, mb))
                if self._kept is not None:
                    self._kept.append((k, g, micro_batches[mb][0] if g == 0 else x, grad, micro_batches[mb][1]))
                start = time.perf_counter()
                if synthetic:
                    sleep_until(start + t_bwd)
                    grad_in = self._zeros if g > 0 else None
                else:
                    out.backward(grad)
                    ctx.synchronize()
                    grad_in = x.grad if g > 0 else None
                meter.add("compute_s", time.perf_counter() - start)
                if g > 0:
                    outgoing(g - 1, mb, True, grad_in)
        for handle in sends:
            handle.wait()
        return losses

    def named_gradients(self) -> dict[str, torch.Tensor]:
        return self._last_grads

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in zip(self.names, self.params)}

    checkpoint_per_rank = True  # each stage holds its own layers

    def checkpoint_state(self) -> dict:
        """This stage's parameters and optimizer (the same on the stage's replicas, another stage's elsewhere)."""
        return weights_and_optimizer(self.names, self.params, self.optimizer)

    def restore(self, state: dict) -> None:
        restore_weights_and_optimizer(state, self.names, self.params, self.optimizer)
