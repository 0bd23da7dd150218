"""DiLoCo and Streaming DiLoCo: low-communication training across DCs.

diloco: every step is plain data parallel inside the DC (all-reduce over the DC's nodes) with the inner
optimizer (AdamW); every H steps the pseudo-gradient (global weights - local weights) is averaged across
DCs and applied to the global weights by the outer optimizer, Nesterov SGD (lr 0.7, momentum 0.9), and
every replica restarts from the new global weights. With `outer_shard` each node of a DC averages only
1/n of the pseudo-gradient across DCs and the DC all-gathers the rest (cross-DC payload per rank per step:
N/(n*H); without sharding N/H). DCs of different sizes: the pseudo-gradient is cut into as many shards as
the smallest DC has ranks (Layout.inter_group), and each DC counts once in the average.

streaming-diloco: the parameters are cut into fragments synchronised in turn (fragment f at steps
f*H/F, f*H/F + H, ...); each fragment's cross-DC all-reduce is started asynchronously and only applied
`overlap_steps` inner steps later, so it hides behind them (at the last step every one still in flight is
waited for and applied). On arrival the fragment becomes the new global fragment plus the local progress made
since its sync started.

async-diloco: the whole pseudo-gradient's cross-DC all-reduce starts every H steps in the background and is
applied as soon as it has arrived (the DC's ranks agree on when, with a one-element all-reduce inside the DC
each step), as streaming-diloco applies a fragment: the new global weights plus the local progress since. Inner
steps go on meanwhile; one sync is in flight at a time (one that falls due meanwhile starts when it is applied:
every DC issues the same syncs in the same order), and only when it is `max_staleness` steps old (or at the last
step) does the DC wait for it. Across a partition the DCs keep training on their own until the bound.

Checkpoints (testbed.workload.checkpoint): every rank writes its own -- its parameters and inner optimizer, the
global weights and every outer optimizer's state (one per fragment in streaming-diloco) -- and, in
streaming-diloco and async-diloco, the syncs in flight. At a checkpoint's step the DC first waits for each of
them (comm_s, exposed) and saves per sync its fragment, the step it started, its reduced pseudo-gradient and the
snapshot of the fragment at its start; a restart puts them back as arrived, and each is applied at the step it
would have been (streaming-diloco: `overlap_steps` after its start; async-diloco: the step after the checkpoint,
as a sync that has arrived). async-diloco first starts and settles every sync that fell due (`owed`), as at the
last step, so that every DC has issued the same syncs when it writes (which of them have started otherwise
depends on when each DC saw the previous one arrive, and a restart's DCs must pair their next all-reduces alike).
"""

from __future__ import annotations

import time

import torch

from testbed.workload.strategies.base import (
    Context,
    MicroBatch,
    average_in_dc,
    fragment_runs,
    restore_weights_and_optimizer,
    weights_and_optimizer,
)
from testbed.workload.strategies.dp import DataParallel


def _outer_optimizer(params: list[torch.Tensor], lr: float, momentum: float) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=momentum > 0)


class DiLoCo(DataParallel):
    name = "diloco"
    reads_weights_when_synthetic = True  # the outer step moves the weights' difference

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.global_params = [p.detach().clone() for p in self.params]
        self.outer = _outer_optimizer(self.global_params, ctx.opts.outer_lr, ctx.opts.outer_momentum)

    def sync(self) -> None:
        """Inner data parallelism: average gradients over this DC's nodes."""
        average_in_dc(self.ctx, self.params)

    def replicas(self) -> tuple[object, list[int]]:
        """Between outer syncs only a DC's ranks hold the same parameters."""
        return self.ctx.groups.intra, list(self.ctx.groups.intra_ranks)

    checkpoint_per_rank = True  # the parameters and inner optimizer's state differ from DC to DC

    def checkpoint_state(self) -> dict:
        """This rank's parameters and inner optimizer, and the global weights and outer optimizer (the same in
        every DC). Written after an outer step: the experiment's checkpoint_every is a multiple of H, so that no DC
        runs two checkpoints ahead of another (testbed.workload.checkpoint keeps each rank's last two)."""
        return {**weights_and_optimizer(self.names, self.params, self.optimizer),
                "global": [p.clone() for p in self.global_params], "outer": self.outer.state_dict()}

    def restore(self, state: dict) -> None:
        restore_weights_and_optimizer(state, self.names, self.params, self.optimizer)
        with torch.no_grad():
            for param, saved in zip(self.global_params, state["global"]):
                param.copy_(saved)
        self.outer.load_state_dict(state["outer"])

    def inner_step(self, index: int, micro_batches: list[MicroBatch]) -> float | None:
        """One step of data parallelism inside the DC with the inner optimizer, its gradients checked before the
        DC's all-reduce and its parameters after the update when SDC is checked; returns the loss."""
        loss = self.checked_gradients(index, micro_batches, self.compute(index, micro_batches))
        start = time.perf_counter()
        self.sync()
        self.ctx.meter.add("exposed_s", time.perf_counter() - start)
        if self.ctx.synthetic_s is None:
            self.optimizer.step()
        self.checked_parameters(index)
        return loss

    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        loss = self.inner_step(index, micro_batches)
        outer = (index + 1) % max(1, self.ctx.opts.inner_steps) == 0
        if outer:
            start = time.perf_counter()
            self.outer_step(list(range(len(self.params))))
            self.ctx.meter.add("exposed_s", time.perf_counter() - start)
        return self.with_sdc({"loss": loss, "outer_step": outer})

    def pseudo_gradient_average(self, indexes: list[int]) -> torch.Tensor:
        """Mean over DCs of (global - local) for the parameters `indexes`, flat."""
        groups, comm, opts = self.ctx.groups, self.ctx.comm, self.ctx.opts
        layout = self.ctx.layout
        delta = torch.cat([(self.global_params[i] - self.params[i].detach()).reshape(-1) for i in indexes])
        n = layout.inter_count  # shards: one per inter-DC group
        if opts.outer_shard and n > 1:
            pad = (-delta.numel()) % n
            padded = torch.nn.functional.pad(delta, (0, pad))
            shard = padded.chunk(n)[layout.inter_index] * layout.inter_weight
            comm.all_reduce(shard, groups.inter, groups.inter_ranks)
            # rank k of the DC holds shard k mod n: the first n of the DC's shards are the whole, in order
            delta = comm.all_gather(shard, groups.intra, groups.intra_ranks)[: delta.numel()]
        else:
            delta = delta * layout.inter_weight
            comm.all_reduce(delta, groups.inter, groups.inter_ranks)
        return delta / layout.num_dcs

    def apply_outer(self, indexes: list[int], delta: torch.Tensor, optimizer: torch.optim.Optimizer,
                    local_progress: list[torch.Tensor] | None = None) -> None:
        offset = 0
        for i in indexes:
            n = self.params[i].numel()
            self.global_params[i].grad = delta[offset: offset + n].view_as(self.params[i]).clone()
            offset += n
        optimizer.step()
        with torch.no_grad():
            for k, i in enumerate(indexes):
                self.params[i].copy_(self.global_params[i])
                if local_progress is not None:
                    self.params[i].add_(local_progress[k])

    def outer_step(self, indexes: list[int]) -> None:
        self.apply_outer(indexes, self.pseudo_gradient_average(indexes), self.outer)

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in zip(self.names, self.params)}


class StreamingDiLoCo(DiLoCo):
    name = "streaming-diloco"

    def setup(self, ctx: Context) -> None:
        DataParallel.setup(self, ctx)
        self.global_params = [p.detach().clone() for p in self.params]
        self.fragments = [list(run) for run in fragment_runs(len(self.params), ctx.opts.fragments)]
        self.outers = [_outer_optimizer([self.global_params[i] for i in frag], ctx.opts.outer_lr,
                                        ctx.opts.outer_momentum) for frag in self.fragments]
        self.in_flight: list[tuple[int, int, object, torch.Tensor, list[torch.Tensor]]] = []

    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        loss = self.inner_step(index, micro_batches)
        opts = self.ctx.opts
        period = max(1, opts.inner_steps)
        started = []
        for f, _frag in enumerate(self.fragments):
            if (index + 1 - f * period // len(self.fragments)) % period == 0 and index + 1 >= f * period // len(
                    self.fragments):
                self._start(f, index)
                started.append(f)
        start = time.perf_counter()
        last = index == opts.steps - 1  # the end: every fragment still in flight is applied, as async-diloco settles
        for item in [x for x in self.in_flight if last or index >= x[1] + opts.overlap_steps]:
            self._finish(item)
        if self.checkpoint_due(index):
            self.drain()
        self.ctx.meter.add("exposed_s", time.perf_counter() - start)
        return self.with_sdc({"loss": loss, "outer_fragments": started})

    def checkpoint_due(self, index: int) -> bool:
        return self.ctx.checkpoints is not None and self.ctx.checkpoints.due(index)

    def drain(self) -> None:
        """Wait for every sync in flight (a checkpoint is written after this step): each keeps its reduced
        pseudo-gradient, marked arrived (work None), and is applied when it would have been."""
        for k, (f, begun, work, delta, snapshot) in enumerate(self.in_flight):
            if work is not None:
                with self.ctx.meter.comm_timed(self.ctx.groups.inter_ranks):
                    work.wait()
                self.in_flight[k] = (f, begun, None, delta, snapshot)

    def checkpoint_state(self) -> dict:
        """DiLoCo's (every fragment's outer optimizer) and the syncs in flight, drained by step(): per sync its
        fragment, the step it started, its reduced pseudo-gradient and the snapshot taken at its start."""
        if any(work is not None for _, _, work, _, _ in self.in_flight):
            raise RuntimeError(f"{self.name}: a checkpoint with a sync still in flight (step() drains them when "
                               "ctx.checkpoints is due)")
        return {**weights_and_optimizer(self.names, self.params, self.optimizer),
                "global": [p.clone() for p in self.global_params], "outers": [o.state_dict() for o in self.outers],
                "in_flight": [{"fragment": f, "started": begun, "delta": delta, "snapshot": snapshot}
                              for f, begun, _, delta, snapshot in self.in_flight]}  # neither changes once arrived

    def restore(self, state: dict) -> None:
        if len(state["outers"]) != len(self.outers):
            raise ValueError(f"checkpoint: {len(state['outers'])} fragments saved, {len(self.outers)} here")
        restore_weights_and_optimizer(state, self.names, self.params, self.optimizer)
        with torch.no_grad():
            for param, saved in zip(self.global_params, state["global"]):
                param.copy_(saved)
        for outer, saved in zip(self.outers, state["outers"]):
            outer.load_state_dict(saved)
        device = self.ctx.device
        self.in_flight = [(item["fragment"], item["started"], None, item["delta"].to(device),
                           [s.to(device) for s in item["snapshot"]]) for item in state["in_flight"]]

    def _start(self, f: int, index: int) -> None:
        groups = self.ctx.groups
        frag = self.fragments[f]
        delta = torch.cat([(self.global_params[i] - self.params[i].detach()).reshape(-1) for i in frag])
        delta *= self.ctx.layout.inter_weight  # a sum over the group then counts every DC once
        snapshot = [self.params[i].detach().clone() for i in frag]
        work = self.ctx.comm.all_reduce_async(delta, groups.inter, groups.inter_ranks)
        self.in_flight.append((f, index, work, delta, snapshot))
        if self.ctx.opts.overlap_steps <= 0:
            self._finish(self.in_flight[-1])

    def _finish(self, item) -> None:
        f, _, work, delta, snapshot = item
        self.in_flight.remove(item)
        if work is not None:
            with self.ctx.meter.comm_timed(self.ctx.groups.inter_ranks):
                work.wait()
        frag = self.fragments[f]
        progress = [self.params[i].detach() - snapshot[k] for k, i in enumerate(frag)]
        self.apply_outer(frag, delta / self.ctx.layout.num_dcs, self.outers[f], progress)


class AsyncDiLoCo(StreamingDiLoCo):
    name = "async-diloco"

    def setup(self, ctx: Context) -> None:
        DataParallel.setup(self, ctx)
        self.global_params = [p.detach().clone() for p in self.params]
        self.fragments = [list(range(len(self.params)))]
        self.outers = [_outer_optimizer(self.global_params, ctx.opts.outer_lr, ctx.opts.outer_momentum)]
        self.in_flight = []
        self.owed = 0  # syncs that fell due and have not started (one is in flight at a time)

    def _arrived(self) -> bool:
        """Whether the sync in flight has arrived on every rank of this DC (they must apply it at the same step)."""
        work = self.in_flight[0][2]
        flag = torch.tensor([1 if work is None or work.is_completed() else 0], dtype=torch.int32)
        groups = self.ctx.groups
        if len(groups.intra_ranks) > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=groups.intra)
        return bool(flag.item())

    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        """Every DC issues the same syncs in the same order (one per H steps but the last step's), whatever
        arrives when: a sync that falls due while one is in flight starts once that one is applied, and at the last
        step every sync still owed is run and waited for. The DCs cannot agree on anything during a partition, so
        nothing here depends on when another DC's data arrived except when a DC waits."""
        loss = self.inner_step(index, micro_batches)
        opts = self.ctx.opts
        last = index == opts.steps - 1
        if (index + 1) % max(1, opts.inner_steps) == 0 and not last:
            self.owed += 1
        start = time.perf_counter()
        applied, started, staleness = 0, 0, None
        if self.in_flight:
            staleness = index - self.in_flight[0][1]
            if last or staleness >= opts.max_staleness or self._arrived():
                self._finish(self.in_flight[0])  # waits only if it has not arrived
                applied += 1
        if not self.in_flight and self.owed:
            self._start(0, index)
            self.owed, started = self.owed - 1, 1
        while last and (self.in_flight or self.owed):  # the end: settle every sync owed, in order
            if self.in_flight:
                self._finish(self.in_flight[0])
                applied += 1
            if self.owed:
                self._start(0, index)
                self.owed, started = self.owed - 1, started + 1
        if self.checkpoint_due(index):  # every DC issues every sync due by now, then waits for the last
            while self.owed:
                if self.in_flight:
                    self._finish(self.in_flight[0])
                    applied += 1
                self._start(0, index)
                self.owed, started = self.owed - 1, started + 1
            self.drain()
        self.ctx.meter.add("exposed_s", time.perf_counter() - start)
        return self.with_sdc({"loss": loss, "outer_started": started, "outer_applied": applied,
                              "staleness": staleness})

    def _start(self, f: int, index: int) -> None:
        groups = self.ctx.groups
        delta = torch.cat([(self.global_params[i] - self.params[i].detach()).reshape(-1) for i in self.fragments[0]])
        delta *= self.ctx.layout.inter_weight  # a sum over the group then counts every DC once
        snapshot = [p.detach().clone() for p in self.params]
        work = self.ctx.comm.all_reduce_async(delta, groups.inter, groups.inter_ranks)
        self.in_flight.append((f, index, work, delta, snapshot))

    def checkpoint_state(self) -> dict:
        """streaming-diloco's, with the syncs owed (0 after step() settled them for the checkpoint)."""
        return {**super().checkpoint_state(), "owed": self.owed}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.owed = int(state["owed"])
