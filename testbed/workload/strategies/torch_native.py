"""PyTorch's own data parallelism as strategies, on the same model, data and metrics as ours: the baselines
users actually run.

- ddp: DistributedDataParallel over all ranks: gradients in buckets (`bucket_cap_mb`), each bucket
  all-reduced as soon as its gradients are final, overlapped with the rest of backward (DDP's reducer);
  `no_sync()` for all but the last micro-batch. `comm_hook` swaps DDP's built-in all-reduce for one of its
  own hooks: fp16_compress_hook, or powerSGD_hook (PowerSGDState with `powersgd_rank` as
  matrix_approximation_rank and `powersgd_start_iter`).
- fsdp: FSDP2 (`fully_shard`, each block, then the whole model) on a 1-D DeviceMesh of all ranks.
- hsdp: FSDP2 on a 2-D DeviceMesh (DCs x ranks per DC; dim 0 replicates, dim 1 shards): weights are
  all-gathered and gradients reduce-scattered inside the DC, and each rank's gradient shard is all-reduced
  across DCs: PyTorch's form of hier-dp.

FSDP1 (`FullyShardedDataParallel`, also with ShardingStrategy.HYBRID_SHARD) was tried: in torch 2.13 it
refuses to run without an accelerator ("FSDP needs a non-CPU accelerator device"), so fsdp and hsdp are
FSDP2. On CPU FSDP2 has no CUDA streams to overlap with: every all-gather, reduce-scatter and HSDP
all-reduce blocks the training thread, so all its communication is exposed here.

Metering, without changing what PyTorch does: DDP's bytes are its buckets (every gradient, once per step;
the hooks' actual payloads: fp16 halves, PowerSGD's low-rank P and Q plus the tensors it leaves
uncompressed, from its own counters); its exposed time is how long backward kept running after the last
gradient was final (DDP waits for its buckets at the end of backward). FSDP2's collectives go through
counting subclasses of its own comms (`set_custom_all_gather`, `set_custom_reduce_scatter`) and HSDP's
all-reduce is seen by `set_all_reduce_hook`, which FSDP2 calls right after it.

Silent data corruption (testbed.workload.sdc): parameters in all (fsdp's shards, which no replica holds, by
each rank's seal); gradients in all:
DDP's buckets go through a comm hook that checks each before DDP's own all-reduce (or the chosen hook) sends it,
FSDP2's unsharded gradients are checked by a hook on each unsharded parameter before its unit's reduce-scatter.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from testbed.workload.model import Block, loss_fn
from testbed.workload.sdc import guard_from_env, poison
from testbed.workload.strategies.base import (
    Context,
    MicroBatch,
    Strategy,
    build_model,
    make_optimizer,
    restore_weights_and_optimizer,
    weights_and_optimizer,
)


class TorchNative(Strategy):
    """Shared: the same initial model, a wrapper from PyTorch, gradient accumulation over micro-batches."""

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.model = build_model(ctx)
        self.names = [name for name, _ in self.model.named_parameters()]
        self.wrapped = self.wrap(self.model)
        self.optimizer = make_optimizer(list(self.wrapped.parameters()), ctx.opts)
        local = [_local(param) for param in self.model.parameters()]
        refused = self.gradients_refused()
        self.guard = guard_from_env(ctx.layout.rank, self.names, local, self.replicas, ctx.opts.seed,
                                    None if refused else self.model, refused, in_buckets=not refused,
                                    samples_together=self.reference_communicates)
        self.buckets_checked = self.guard is not None and not refused
        self.step_index = 0

    reference_communicates = False  # whether local_gradients takes collectives (then every rank samples alike)

    def local_gradients(self, micro_batches: list[MicroBatch]) -> dict[str, torch.Tensor]:
        """This rank's own gradient of the step, computed without communicating (by parameter name): a step
        sampled for a replay computes it beforehand, and each bucket leaving in the step must match it."""
        raise NotImplementedError

    def gradients_refused(self) -> str | None:
        """Why no check reaches this strategy's gradients before their collective (None: they are checked as
        they leave during backward, testbed.workload.sdc.Guard.bucket_ready)."""
        return None

    def replicas(self) -> tuple[object, list[int]]:
        """The process group whose ranks hold the same parameters (their local shards) after every step."""
        return dist.group.WORLD, list(range(self.ctx.layout.world))

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def accumulating(self, last: bool):
        """Context for one micro-batch's forward and backward: gradient sync only on the last."""
        return nullcontext()

    def exposed(self) -> float:
        """Seconds of this step the training thread spent waiting on communication."""
        return 0.0

    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        self.step_index = index
        if self.buckets_checked and self.guard.samples(index):
            self.guard.sample_reference(index, self.local_gradients(micro_batches))  # its time is in the step
        total, apply = self.forward_backward(micro_batches), True
        if self.buckets_checked:
            apply, replayed = self.guard.after_sync(  # a replay sets new gradients (zero_grad to None)
                index, lambda: [_local(p.grad) for p in self.model.parameters() if p.grad is not None],
                lambda: self.forward_backward(micro_batches))
            total = replayed if replayed is not None else total
        if apply:
            self.optimizer.step()
        self.checked_parameters(index)
        return self.with_sdc({"loss": total, **self.step_fields()})

    def forward_backward(self, micro_batches: list[MicroBatch]) -> float:
        """Every micro-batch's forward and backward, gradients reduced; the step's loss."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.guard is not None:
            self.guard.gradients_zeroed()
        self.begin_step()
        total = 0.0
        start = time.perf_counter()
        for number, (x, y) in enumerate(micro_batches):
            with self.accumulating(number == len(micro_batches) - 1):
                loss = loss_fn(self.wrapped(x), y) / len(micro_batches)
                loss.backward()
            total += loss.item()
        self.ctx.synchronize()
        exposed = self.exposed()
        self.ctx.meter.add("compute_s", time.perf_counter() - start - exposed)
        self.ctx.meter.add("exposed_s", exposed)
        return total

    def begin_step(self) -> None:
        pass

    def step_fields(self) -> dict:
        return {}

    def named_gradients(self) -> dict[str, torch.Tensor]:
        return {name: _full(p.grad).detach().clone() for name, p in zip(self.names, self.model.parameters())}

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {name: _full(p).detach().clone() for name, p in zip(self.names, self.model.parameters())}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view: a flip in it is a flip in the parameter), a plain tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local().detach() if to_local is not None else tensor.detach()


def _locals(tree):
    """A state dict with every DTensor as a copy of its local shard (plain tensors, values and containers kept)."""
    if isinstance(tree, dict):
        return {key: _locals(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_locals(value) for value in tree)
    if isinstance(tree, torch.Tensor):
        return _local(tree).clone()
    return tree


def _shards_like(template, saved):
    """`saved` (from _locals) with each tensor made a DTensor laid out as the same entry of `template`."""
    if isinstance(template, dict):
        missing = template.keys() - saved.keys()
        if missing:
            raise ValueError(f"checkpoint: no saved state for {sorted(map(str, missing))[:3]}")
        return {key: _shards_like(value, saved[key]) for key, value in template.items()}
    if isinstance(template, list | tuple):
        return type(template)(_shards_like(t, v) for t, v in zip(template, saved, strict=True))
    if hasattr(template, "device_mesh"):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(saved.to(template.device), template.device_mesh, template.placements,
                                  shape=template.shape, stride=template.stride())
    return saved


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective over its mesh), a plain tensor as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor


class DDP(TorchNative):
    name = "ddp"

    def checkpoint_state(self) -> dict:
        """The parameters and the optimizer's state: the same on every replica after a step."""
        return weights_and_optimizer(self.names, list(self.model.parameters()), self.optimizer)

    def restore(self, state: dict) -> None:
        restore_weights_and_optimizer(state, self.names, list(self.model.parameters()), self.optimizer)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ctx = self.ctx
        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=ctx.opts.bucket_cap_mb)
        self.world = list(range(ctx.layout.world))
        self.grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.hook = MeteredHook(ctx, ctx.opts) if ctx.opts.comm_hook != "none" else None
        self._syncing = False
        self._last_ready = 0.0
        for param in model.parameters():
            param.register_post_accumulate_grad_hook(self._grad_ready)
        return ddp

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        if self.buckets_checked:  # DDP takes one comm hook, before the first backward
            self.name_of = {id(param): name for name, param in self.model.named_parameters()}
            self.wrapped.register_comm_hook(None, self._checked_bucket)
        elif self.hook is not None:
            self.wrapped.register_comm_hook(self.hook.state, self.hook.run)

    def local_gradients(self, micro_batches: list[MicroBatch]) -> dict[str, torch.Tensor]:
        """Every micro-batch's backward under no_sync (DDP's reducer stays idle: nothing is sent)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.guard.gradients_zeroed()
        with self.wrapped.no_sync():
            for x, y in micro_batches:
                (loss_fn(self.wrapped(x), y) / len(micro_batches)).backward()
        return {name: param.grad for name, param in zip(self.names, self.model.parameters()) if param.grad is not None}

    def gradients_refused(self) -> str | None:
        if self.ctx.opts.comm_hook == "powersgd":
            return "ddp with PowerSGD: its error feedback would carry a poisoned bucket into every later step"
        return None

    def _checked_bucket(self, state, bucket):  # no annotations: DDP checks them (see MeteredHook.run)
        """Inject into and check a bucket before it leaves (poisoned when found corrupt), then reduce it as
        DDP's own all-reduce (allreduce_hook) or the chosen comm hook would."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        grads = {self.name_of[id(param)]: grad for param, grad in zip(bucket.parameters(), bucket.gradients())}
        if self.guard.bucket_ready(self.step_index, bucket.index(), grads):
            poison(bucket.buffer())
        if self.hook is not None:
            return self.hook.run(self.hook.state, bucket)
        return default_hooks.allreduce_hook(None, bucket)

    def _grad_ready(self, param: torch.nn.Parameter) -> None:
        if self._syncing:
            self._last_ready = time.perf_counter()

    def accumulating(self, last: bool):
        self._syncing = last
        return _backward_end(self) if last else self.wrapped.no_sync()

    def begin_step(self) -> None:
        self._backward_end = self._last_ready = 0.0
        if self.hook is not None:
            self.hook.begin_step()

    def exposed(self) -> float:
        return max(0.0, self._backward_end - self._last_ready) if self._last_ready else 0.0

    def step_fields(self) -> dict:
        if self.hook is None:
            # DDP's built-in reducer all-reduces every bucket once per step; its in-flight time is not observable
            # without replacing it by a Python hook, so comm_s is left unknown rather than guessed
            self.ctx.meter.traffic("all_reduce", self.grad_bytes, self.world)
            return {"comm_s": None}
        return {}


class _backward_end:
    """Records when the last micro-batch's backward (DDP's wait for its buckets included) returned."""

    def __init__(self, strategy: DDP) -> None:
        self.strategy = strategy

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        self.strategy._backward_end = time.perf_counter()


class MeteredHook:
    """One of DDP's own comm hooks, with its payload and in-flight time counted in the step's Meter."""

    def __init__(self, ctx: Context, opts) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        self.ctx = ctx
        self.world = list(range(ctx.layout.world))
        self.kind = opts.comm_hook
        if self.kind == "fp16":
            self.state, self.inner = None, default_hooks.fp16_compress_hook
        elif self.kind == "powersgd":
            self.state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=opts.powersgd_rank,
                                                     start_powerSGD_iter=opts.powersgd_start_iter)
            self.inner = powerSGD_hook.powerSGD_hook
        else:
            raise ValueError(f"comm_hook {self.kind!r} cannot run here")
        self.compressed = False

    def begin_step(self) -> None:
        self.compressed = False

    def run(self, state, bucket):  # a method, not __call__, and no annotations: DDP checks both; annotations would be strings here
        started = time.perf_counter()
        buffer = bucket.buffer()
        if self.kind == "fp16":
            nbytes = buffer.numel() * 2
        else:  # PowerSGD: plain all-reduce before start_powerSGD_iter, then what its own counters say it sent
            plain = state.iter < state.start_powerSGD_iter
            before = state.total_numel_after_compression
        future = self.inner(state, bucket)
        if self.kind == "powersgd":
            nbytes = buffer.numel() * buffer.element_size() if plain else \
                (state.total_numel_after_compression - before) * buffer.element_size()
            self.compressed = self.compressed or not plain
        self.ctx.meter.traffic("all_reduce", nbytes, self.world)
        meter, world = self.ctx.meter, self.world

        def done(fut: torch.futures.Future) -> torch.Tensor:
            meter.add_comm(time.perf_counter() - started, world)
            return fut.value()

        return future.then(done)


class FSDP(TorchNative):
    name = "fsdp"

    def mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.ctx.device.type, (self.ctx.layout.world,), mesh_dim_names=("shard",))

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh = self.mesh()
        self.comms = FSDPComms(self.ctx, mesh)
        units = []
        for module in model.modules():
            if isinstance(module, Block):
                units.append(fully_shard(module, mesh=mesh, reshard_after_forward=self.ctx.opts.reshard_after_forward))
        units.append(fully_shard(model, mesh=mesh))
        self.units = units
        for unit in units:
            self.comms.attach(unit)
        return model

    def replicas(self) -> tuple[object, list[int]]:
        """None: fsdp shards every parameter over all ranks, no replica holds a shard twice to compare with (hsdp
        keeps one per DC); each rank checks its own shards' seal (testbed.workload.sdc.Seal)."""
        return None, [self.ctx.layout.rank]

    def setup(self, ctx: Context) -> None:
        self._syncing = False
        super().setup(ctx)
        if self.buckets_checked:
            self._watch_unsharded_gradients()

    checkpoint_per_rank = True  # each rank holds its own shards (hsdp: one per DC of each)

    def checkpoint_state(self) -> dict:
        """This rank's shards of the parameters and of the optimizer's state, as PyTorch's distributed
        checkpointing lays them out (get_state_dict: names, not positions), each DTensor as its local tensor: a
        restart runs on the same mesh, so every rank takes up its own shards again."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        params, optimizer = get_state_dict(self.wrapped, self.optimizer)
        return {"params": _locals(params), "optimizer": _locals(optimizer)}

    def restore(self, state: dict) -> None:
        """Take up this rank's shards: each saved local tensor in place of the live DTensor's (the optimizer's
        state made first by get_state_dict, with a step of zero learning rate), then set_state_dict."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        params, optimizer = get_state_dict(self.wrapped, self.optimizer)
        set_state_dict(self.wrapped, self.optimizer, model_state_dict=_shards_like(params, state["params"]),
                       optim_state_dict=_shards_like(optimizer, state["optimizer"]))

    def _watch_unsharded_gradients(self) -> None:
        """FSDP2 reduce-scatters each unit's unsharded gradients inside backward: a hook on every unsharded
        parameter (which FSDP2 keeps from step to step, its storage freed between uses; made here by one unshard)
        checks its gradient when the last micro-batch has accumulated it, before the unit's reduce-scatter. A
        corrupt one is filled with NaN whole, so that every rank's shard of it comes back non-finite."""
        shards = self.device_mesh.size(self.device_mesh.ndim - 1)
        prefix = {module: name for name, module in self.model.named_modules()}
        number = 0
        self.unsharded: dict[str, object] = {}  # parameter name -> FSDP2's FSDPParam
        for unit in self.units:
            unit.unshard()
            for fsdp_param in unit._get_fsdp_state()._fsdp_param_group.fsdp_params:  # FSDP2's own, not public
                info = fsdp_param._module_info
                name = ".".join(part for part in (prefix[info.module], info.param_name) if part)
                if fsdp_param.unsharded_param.shape[0] < shards:
                    raise ValueError(f"sdc: {name} has fewer rows ({fsdp_param.unsharded_param.shape[0]}) than the "
                                     f"{shards} ranks it is sharded over: a rank with no shard of it could not see "
                                     "its poison")
                fsdp_param.unsharded_param.register_post_accumulate_grad_hook(self._checked_gradient(number, name))
                self.unsharded[name] = fsdp_param
                number += 1
            unit.reshard()

    reference_communicates = True  # every forward all-gathers the weights: the ranks sample the same steps

    def local_gradients(self, micro_batches: list[MicroBatch]) -> dict[str, torch.Tensor]:
        """Every micro-batch's backward with FSDP2's gradient sync off (no reduce-scatter, no HSDP all-reduce:
        the unsharded gradients accumulate as in the step's own first micro-batches), taken out of FSDP2's unsharded
        parameters so that the step itself starts from none. The weights are all-gathered for each forward as in
        the step: that moves no gradient."""
        self.optimizer.zero_grad(set_to_none=True)
        self.guard.gradients_zeroed()
        self._syncing = False
        self.wrapped.set_requires_gradient_sync(False)
        for x, y in micro_batches:
            (loss_fn(self.wrapped(x), y) / len(micro_batches)).backward()
        grads = {}
        for name, fsdp_param in self.unsharded.items():
            unsharded = fsdp_param._unsharded_param  # its storage may be freed after backward, its .grad is kept
            if unsharded.grad is not None:
                grads[name], unsharded.grad = unsharded.grad, None
        return grads

    def _checked_gradient(self, number: int, name: str):
        def hook(param: torch.nn.Parameter) -> None:
            if self._syncing and self.guard.bucket_ready(self.step_index, number, {name: param.grad}):
                with torch.no_grad():
                    param.grad.fill_(float("nan"))
        return hook

    def accumulating(self, last: bool):
        self._syncing = last
        self.wrapped.set_requires_gradient_sync(last)
        return nullcontext()

    def begin_step(self) -> None:
        self.comms.blocked = 0.0

    def exposed(self) -> float:
        return self.comms.blocked


class HSDP(FSDP):
    name = "hsdp"

    def mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        layout = self.ctx.layout
        return init_device_mesh(self.ctx.device.type, (layout.num_dcs, layout.dc_size),
                                mesh_dim_names=("replicate", "shard"))

    def replicas(self) -> tuple[object, list[int]]:
        """The ranks holding the same shard: one per DC (the mesh's replicate dimension)."""
        group = self.device_mesh.get_group("replicate")
        return group, dist.get_process_group_ranks(group)


class FSDPComms:
    """FSDP2's default collectives, counted: payload by group in the Meter, and the time the training thread
    spent in them (on CPU every one blocks it)."""

    def __init__(self, ctx: Context, mesh) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

        self.ctx = ctx
        self.blocked = 0.0
        self._mark = time.perf_counter()
        self.replicate = dist.get_process_group_ranks(mesh.get_group("replicate")) \
            if mesh.mesh_dim_names and "replicate" in mesh.mesh_dim_names else None
        comms = self

        class CountedAllGather(DefaultAllGather):
            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                return comms.timed("all_gather", input_tensor, group,
                                   lambda: super(CountedAllGather, self).__call__(output_tensor, input_tensor, group,
                                                                                  async_op))

        class CountedReduceScatter(DefaultReduceScatter):
            def allocate(self, size, *, dtype, device):
                comms._mark = time.perf_counter()  # FSDP2 allocates right before reducing (also with 1 rank)
                return super().allocate(size, dtype=dtype, device=device)

            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                return comms.timed("reduce_scatter", input_tensor, group,
                                   lambda: super(CountedReduceScatter, self).__call__(output_tensor, input_tensor,
                                                                                      group, op, async_op))

        assert issubclass(CountedAllGather, AllGather) and issubclass(CountedReduceScatter, ReduceScatter)
        self.all_gather, self.reduce_scatter = CountedAllGather(), CountedReduceScatter()

    def attach(self, unit) -> None:
        unit.set_custom_all_gather(self.all_gather)
        unit.set_custom_reduce_scatter(self.reduce_scatter)
        if self.replicate is not None:
            unit.set_all_reduce_hook(self.all_reduced)

    def timed(self, kind: str, tensor: torch.Tensor, group, call):
        ranks = dist.get_process_group_ranks(group)
        self.ctx.meter.traffic(kind, tensor.numel() * tensor.element_size(), ranks)
        start = time.perf_counter()
        try:
            return call()
        finally:
            self._mark = time.perf_counter()
            self._blocked(self._mark - start, ranks)

    def all_reduced(self, output: torch.Tensor) -> None:
        """FSDP2 calls this right after HSDP's all-reduce of `output` across the replicas (the DCs)."""
        self.ctx.meter.traffic("all_reduce", output.numel() * output.element_size(), self.replicate)
        now = time.perf_counter()
        self._blocked(now - self._mark, self.replicate)
        self._mark = now

    def _blocked(self, seconds: float, ranks: list[int]) -> None:
        self.blocked += seconds
        self.ctx.meter.add_comm(seconds, ranks)
