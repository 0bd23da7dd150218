"""torchft's strategies: every DC is one replica group of torchft, which does the fault-tolerant work.

torchft-ddp: torchft.DistributedDataParallel (its comm hook all-reduces each bucket over the groups in the
quorum through the Manager) and torchft.OptimizerWrapper (a step commits only where the quorum agreed).
torchft-diloco: torchft.local_sgd.DiLoCo over the whole model (one fragment); torchft-streaming-diloco: the same
class over runs of the model's tensors, synchronised in turn (its Streaming DiLoCo). Inside a DC of several ranks
the gradients are first averaged over the DC (the DC's own default process group); torchft's Manager then reduces
across the groups, one rank index at a time.

A group that starts late or again (a fault restarted it) asks the lighthouse for a quorum and heals: torchft's
Manager fetches the state of a healthy group (its HTTP checkpoint transport, over the emulated links) and loads
it through `load_state`. Nothing of torchft's algorithms is copied here.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from datetime import timedelta

import torch
import torch.distributed as dist

from testbed import rankenv
from testbed.workload.model import loss_fn
from testbed.workload.strategies.base import (
    Context,
    MicroBatch,
    Strategy,
    build_model,
    fragment_runs,
    make_optimizer,
)


def tensor_bytes(state: object) -> int:
    """Bytes of every tensor in a (nested) state dict: what a heal moved of it."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(value) for value in state)
    return 0


def _average_in_dc(params: list[torch.nn.Parameter]) -> None:
    """Average the gradients over this DC's ranks (the DC-local default group), when it has more than one."""
    if dist.get_world_size() == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def node_transport(address: str, timeout: timedelta):  # -> torchft's HTTPTransport
    """torchft's HTTP checkpoint transport, announcing `address` (this rank's node) instead of the host's name:
    torchft 0.2.0 announces socket.gethostname(), which every namespace of a netns testbed shares and which
    resolves to an address on no emulated link, so a restarted group's heal from a peer in another DC was refused."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class NodeHTTPTransport(HTTPTransport):
        fetches: list[dict]  # each heal's fetch of a healthy group's state: seconds, and from which address

        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            host = f"[{address}]" if ":" in address else address
            return f"http://{host}:{port}/checkpoint/"

        def recv_checkpoint(self, src_rank, metadata, step, timeout):  # timed: what testbed.model.heal predicts
            at, begun = time.time(), time.perf_counter()
            state = super().recv_checkpoint(src_rank, metadata, step, timeout)
            self.fetches.append({"s": time.perf_counter() - begun, "at": at,
                                 "from": urllib.parse.urlsplit(metadata).hostname})
            return state

    transport = NodeHTTPTransport(timeout=timeout, num_chunks=0)
    transport.fetches = []
    return transport


class ReplicaGroup(Strategy):
    """What the three share: the model, torchft's Manager over a gloo group, the heal's state."""

    name = "torchft"
    use_async_quorum = True

    def setup(self, ctx: Context) -> None:
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        super().setup(ctx)
        self.model = build_model(ctx)
        self.params = list(self.model.parameters())
        self.inner = make_optimizer(self.params, ctx.opts)
        self.wrap()
        host, port = os.environ[rankenv.REPLICA_STORE].rsplit(":", 1)
        timeout = timedelta(seconds=ctx.opts.quorum_timeout_s)
        self.healed_bytes = 0
        node = os.environ.get(rankenv.NODE_ADDRESS, host)  # where its servers are reached: its node's address
        self.transport = node_transport(node, timeout)
        pg = ProcessGroupGloo(timeout=timeout)
        self._time_configures(pg)
        # init_sync=False: every rank builds the same seeded weights (build_model), as torchft asks for it. With
        # its default, the quorum at manager step 0 heals every group but one from a "primary" chosen per rank
        # index (group_rank % groups): under DiLoCo that first quorum is the first outer sync, so the healed ranks
        # took the primary's inner steps as their own (its pseudo-gradient counted twice, theirs lost) and, with
        # two ranks a DC, a DC's ranks healed from different DCs and ended apart for good.
        self.manager = Manager(
            pg=pg, min_replica_size=ctx.opts.min_replicas, use_async_quorum=self.use_async_quorum,
            load_state_dict=self.load_state, state_dict=self.state, replica_id=f"dc{ctx.layout.dc}",
            hostname=node, checkpoint_transport=self.transport,
            store_addr=host, store_port=int(port), rank=ctx.layout.index_in_dc, world_size=ctx.layout.dc_size,
            lighthouse_addr=os.environ[rankenv.TORCHFT_LIGHTHOUSE], timeout=timeout, quorum_timeout=timeout,
            connect_timeout=timeout, init_sync=False)
        self._count_heals()
        self._time_first_ask()
        self.after_manager()

    def _time_configures(self, pg) -> None:
        """How long each new quorum's process group took to build across the groups (gloo's rendezvous through the
        quorum's store and its connections: torchft does it before a heal's fetch), summed per step."""
        configure = pg.configure
        self.configure_s = 0.0

        def timed(*args, **kwargs):
            begun = time.perf_counter()
            try:
                return configure(*args, **kwargs)
            finally:
                self.configure_s += time.perf_counter() - begun

        pg.configure = timed  # type: ignore[method-assign]

    def _time_first_ask(self) -> None:
        """When this process first asked the lighthouse for a quorum (epoch seconds): a heal's wait starts there."""
        ask = self.manager.start_quorum
        self.first_ask: float | None = None

        def timed(*args, **kwargs):
            if self.first_ask is None:
                self.first_ask = time.time()
            return ask(*args, **kwargs)

        self.manager.start_quorum = timed  # type: ignore[method-assign]

    def _count_heals(self) -> None:
        """State torchft's classes register with the Manager (DiLoCo: each fragment's global copy and outer
        optimizer) is healed beside this strategy's own: its loads are counted in healed_bytes too."""
        register = self.manager.register_state_dict_fn

        def counted(key, load_fn, save_fn) -> None:
            def load(state) -> None:
                self.healed_bytes += tensor_bytes(state)
                load_fn(state)
            register(key, load, save_fn)

        self.manager.register_state_dict_fn = counted  # type: ignore[method-assign]

    def wrap(self) -> None:
        """Before the Manager exists: nothing by default."""

    def after_manager(self) -> None:
        """Once the Manager exists: wrap the model or optimizer in torchft's classes."""

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "inner": self.inner.state_dict()}

    def load_state(self, state: dict) -> None:
        """torchft's heal: a healthy group's state arrived, the model and the inner optimizer's (counted: what
        crossed the link for it)."""
        self.healed_bytes += tensor_bytes(state)
        self.model.load_state_dict(state["model"])
        self.inner.load_state_dict(state["inner"])

    def current_step(self) -> int:
        """The step torchft's Manager is at (after a heal: the healthy group's)."""
        return self.manager.current_step()

    def done(self) -> bool:
        return self.current_step() >= self.ctx.opts.steps

    def backward(self, micro_batches: list[MicroBatch]) -> float:
        loss_sum = 0.0
        with self.ctx.meter.timed("compute_s"):
            for x, y in micro_batches:
                loss = loss_fn(self.forward(x), y) / len(micro_batches)
                loss.backward()
                loss_sum += float(loss)
        return loss_sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def quorum(self) -> dict:
        m = self.manager
        configured, self.configure_s = self.configure_s, 0.0
        return {"participants": m.num_participants(), "pg_configure_s": configured, "manager_step": m.current_step(),
                "replica_groups": self.ctx.layout.num_dcs, "healed_bytes": self.healed_bytes,
                "heal_fetch_s": sum(f["s"] for f in self.transport.fetches),
                "heal_fetch_at": self.transport.fetches[0]["at"] if self.transport.fetches else None,
                "quorum_first_asked_at": self.first_ask,
                "healed_from": self.transport.fetches[-1]["from"] if self.transport.fetches else None}

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def shared_parameters(self) -> dict[str, torch.Tensor]:
        """The parameters every group holds alike (torchft's promise, a heal included): the model itself, after
        the step every group committed."""
        return self.named_parameters()

    def sample_ranges(self) -> list[tuple[int, int]]:
        return self.sample_ranges_of(self.ctx.layout.rank)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def _errored_step_hook(state, bucket):
    """torchft.DistributedDataParallel's comm hook, but a step whose all-reduce failed (a peer group died) yields
    its bucket unchanged instead of failing torchft 0.2.0's `assert fut._fut`: the Manager has recorded the error
    and discards the step (should_commit is false), as torchft means to."""
    work = state.allreduce(bucket.buffer())
    work.wait()
    inner = getattr(work.get_future(), "_fut", None)
    if inner is None:
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done
    return inner


class TorchftDDP(ReplicaGroup):
    name = "torchft-ddp"

    def after_manager(self) -> None:
        from torchft.ddp import DistributedDataParallel
        from torchft.optim import OptimizerWrapper

        class DDP(DistributedDataParallel):
            _comm_hook = staticmethod(_errored_step_hook)

        self.ddp = DDP(self.manager, self.model)
        self.optimizer = OptimizerWrapper(self.manager, self.inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ddp(x)

    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        before = self.current_step()
        begun = time.perf_counter()
        self.optimizer.zero_grad()  # starts the quorum (async: during forward)
        loss = self.backward(micro_batches)  # its comm hook all-reduces each bucket over the quorum, in backward
        _average_in_dc(self.params)
        self.optimizer.step()  # steps only where the quorum commits (the Manager's step advances then)
        self.ctx.meter.add("comm_s", max(0.0, time.perf_counter() - begun - self.ctx.meter.step.compute_s))
        return {"loss": loss, "committed": self.current_step() > before, **self.quorum()}


class TorchftDiLoCo(ReplicaGroup):
    name = "torchft-diloco"
    use_async_quorum = False  # torchft's DiLoCo asks for a synchronous quorum

    def fragments(self) -> list[torch.nn.Module]:
        return [self.model]

    def after_manager(self) -> None:
        from torchft.local_sgd import DiLoCo

        opts = self.ctx.opts
        self.parts = self.fragments()
        self.outer = [torch.optim.SGD(p.parameters(), lr=opts.outer_lr, momentum=opts.outer_momentum,
                                      nesterov=opts.outer_momentum > 0) for p in self.parts]
        self.diloco = DiLoCo(self.manager, self.parts, self.inner, self.outer, sync_every=opts.inner_steps,
                             backup_device=torch.device("cpu"), pin_memory=False,
                             fragment_sync_delay=self.sync_delay())
        self.diloco.__enter__()  # hooks the inner optimizer's step; left in shutdown()
        self.inner_steps = 0

    def sync_delay(self) -> int:
        """torchft's fragment_sync_delay: none with one fragment."""
        return 0

    def done(self) -> bool:
        """Inner steps are counted as steps: the Manager counts a step per fragment's sync (every inner_steps /
        fragments inner steps)."""
        return self.current_step() * self.ctx.opts.inner_steps // len(self.parts) >= self.ctx.opts.steps

    def step(self, index: int, micro_batches: list[MicroBatch]) -> dict:
        self.inner.zero_grad()
        loss = self.backward(micro_batches)
        _average_in_dc(self.params)
        begun = time.perf_counter()
        self.inner.step()  # DiLoCo's hook: every inner_steps the quorum and the outer all-reduce
        self.ctx.meter.add("comm_s", time.perf_counter() - begun)
        self.inner_steps += 1
        return {"loss": loss, "committed": True, **self.quorum()}

    def shutdown(self) -> None:
        self.diloco.__exit__(None, None, None)
        super().shutdown()



class TorchftStreamingDiLoCo(TorchftDiLoCo):
    """torchft's DiLoCo over `fragments` runs of the model's tensors (as the built-in streaming-diloco cuts them),
    one fragment synchronised every inner_steps / fragments steps, its all-reduce started fragment_sync_delay inner
    steps before it is applied. The Manager counts a step per fragment's sync."""

    name = "torchft-streaming-diloco"

    def fragments(self) -> list[torch.nn.Module]:
        params = list(self.model.parameters())
        parts = []
        for run in fragment_runs(len(params), self.ctx.opts.fragments):
            part = torch.nn.Module()  # holds the model's own tensors (shared, not copied): torchft syncs a Module
            for i, index in enumerate(run):
                part.register_parameter(f"p{i}", params[index])
            parts.append(part)
        return parts

    def sync_delay(self) -> int:
        return self.ctx.opts.fragment_sync_delay

    def shared_parameters(self) -> dict[str, torch.Tensor]:
        """Each fragment's global copy as of its last outer step (torchft keeps it to restore a failed commit and
        sends it in a heal): the model itself carries each group's own inner steps since its fragments' syncs, so the
        groups' models never agree between two syncs of every fragment. (torchft 0.2.0's fragments, pinned by the
        extra: `DiLoCo._fragments`, each with `original_parameters`.)"""
        return {f"{index}.{name}": tensor.detach().clone()
                for index, fragment in enumerate(self.diloco._fragments)
                for name, tensor in fragment.original_parameters.items()}
