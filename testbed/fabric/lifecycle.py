"""Bring a testbed up, re-attach to it from its state file, tear it down: written once, for every backend.

Bring-up: plan (pure: a bad topology or inventory fails before anything is probed or created), take the
prefix's lock (testbed.fabric.ownership: refused while another live process holds it), resolve the shaper (which
may probe a kernel or hosts), plan with it, tear down a stale testbed of the same prefix (its holder is gone; one
that `testbed up` left for a person is refused while it is there, StillUp, unless `replace` is asked), save the
state (first, so `clean` and a later `up` know about a half-built testbed), bring the plan up, and remove the state
again if that fails and nothing is left to undo. The lock is held until tear_down, or until the process ends
(`testbed up`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic

from testbed.fabric import ownership, registry
from testbed.fabric import state as state_store
from testbed.fabric.backend import Backend, BackendOptions, Progress
from testbed.fabric.base import Fabric, PlanT
from testbed.fabric.errors import FabricError, NotSupported
from testbed.plan.view import LinkEnd
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology


def backend_options(name: str, given: dict[str, Any] | None = None) -> BackendOptions:
    """The options of backend `name` from what a user gave (`given`: only what they set). One line naming the
    option when one does not belong to the backend or a value is wrong."""
    from pydantic import ValidationError

    backend = registry.get(name)
    try:
        return backend.Options(**(given or {}))
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "extra_forbidden":
            option = str(first["loc"][0])
            owners = [b.name for b in registry.backends() if option in b.Options.model_fields]
            flag = "--" + option.replace("_", "-")
            raise FabricError(f"{flag} is for --backend {' or '.join(owners) or '(none)'}, not {name}") from None
        message = str(first["msg"]).removeprefix("Value error, ")
        where = ".".join(str(part) for part in first["loc"])
        raise FabricError(f"--{where.replace('_', '-')}: {message}" if where else message) from None


def make_backend(name: str, **given: Any) -> Backend[Any]:
    """Backend `name` with the options given (see backend_options)."""
    return registry.get(name)(backend_options(name, given))


@dataclass
class Testbed(Generic[PlanT]):
    """A running (or about to run) testbed: what it was built from, its plan (its backend's, a TestbedView: only
    the view's fields are read here) and its backend's fabric."""

    topology: Topology
    plan: PlanT
    fabric: Fabric[PlanT]
    state: state_store.FabricState

    @property
    def backend(self) -> type[Backend[Any]]:
        """The backend this testbed was brought up with (what it is: emulated here, shares files, a shared clock)."""
        return registry.get(self.state.backend)

    def mechanism(self, end: LinkEnd) -> str:
        """Which mechanism shapes this link end, in words for tables and manifests."""
        shaping = end.shaping
        # htb once, whether the link end's own root or a class of its host's (ssh)
        parts = list(dict.fromkeys(obj.kind for obj in shaping.tc if obj.what != "filter" and obj.kind != "pfifo"))
        if shaping.delay_line is not None:
            parts.append("delay-line" if self.fabric.delay_applied(end) else "delay NOT applied")
        if shaping.not_applied:
            parts.append(f"{'/'.join(shaping.not_applied)} NOT applied")
        return "+".join(parts) if parts else "unshaped"

    def describe(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "topology": plan.topology,
            "topology_file": self.state.topology_file,
            "backend": self.state.backend,
            "prefix": plan.prefix,
            "shaper": plan.shaper,
            "nodes": [{"name": n.name, "dc": n.dc, "namespace": n.ns, "address": n.address} for n in plan.nodes],
            "links": [{"key": end.key, "kind": end.kind, "namespace": end.ns, "interface": end.ifname,
                       **end.shaping.params.describe(), "shaper": plan.shaper, "mechanism": self.mechanism(end)}
                      for end in plan.link_ends],
            **self.fabric.status(),
        }

    def shape(self, key: str, params: LinkParams) -> None:
        """Change direction `key` live and record it (a later process sees the link as it is now)."""
        self.fabric.shape(key, params)
        self.state.set_override(key, params)
        state_store.save(self.state)
        assert self.fabric.plan is not None
        self.plan = self.fabric.plan  # the fabric keeps its plan true to what is applied

    def apply_fault(self, fault_id: str, impaired: dict[str, LinkParams]) -> None:
        """Give each direction of `impaired` a fault's parameters; recorded in the state file (with what each
        direction carried before) before anything changes, so `fault --clear`, `down` and `clean` after a crash
        or SIGKILL restore the link exactly. Refused where the backend cannot impose link faults."""
        if not self.fabric.link_faults:
            raise NotSupported(f"link faults are not supported on the {self.state.backend} backend")
        if fault_id in self.state.faults:
            raise FabricError(f"fault {fault_id} is already in force")
        self.state.faults[fault_id] = {key: {"original": asdict(self._original(key)), "impaired": asdict(params)}
                                       for key, params in impaired.items()}
        state_store.save(self.state)  # first: a crash from here on leaves the record `clear` needs
        self.fabric.impair_all(impaired)
        assert self.fabric.plan is not None
        self.plan = self.fabric.plan

    def clear_fault(self, fault_id: str) -> None:
        """Take fault `fault_id` off its directions: each gets back what it carried before, or the fault still
        in force on it that was applied last. The record goes only once the links are restored."""
        record = self.state.faults.get(fault_id)
        if record is None:
            return
        restored = {}
        for key, entry in record.items():
            others = [r[key]["impaired"] for other, r in self.state.faults.items() if other != fault_id and key in r]
            restored[key] = LinkParams(**(others[-1] if others else entry["original"]))
        self.fabric.impair_all(restored)
        del self.state.faults[fault_id]
        state_store.save(self.state)
        assert self.fabric.plan is not None
        self.plan = self.fabric.plan

    def clear_faults(self) -> list[str]:
        """Clear every link fault in force (latest first); their ids."""
        ids = list(self.state.faults)
        for fault_id in reversed(ids):
            self.clear_fault(fault_id)
        return ids

    def _original(self, key: str) -> LinkParams:
        """What direction `key` carries without any fault."""
        for record in self.state.faults.values():
            if key in record:
                return LinkParams(**record[key]["original"])
        return self.plan.link_end(key).shaping.params

    def change(self, key: str, **changes: Any) -> LinkParams:
        """`shape` with some fields of the direction's current parameters replaced; returns the new ones."""
        params = replace(self.plan.link_end(key).shaping.params, **changes)
        self.shape(key, params)
        return params


class StillUp(FabricError):
    """A testbed of the same prefix is still up and nobody said to replace it: one line naming it."""

    def __init__(self, prefix: str, saved: state_store.FabricState | None) -> None:
        self.prefix = prefix
        if saved is None:
            what = f"what a testbed {prefix}* left (no state file says whose)"
            how = f"`testbed clean --prefix {prefix}` removes it"
        else:
            what = f"testbed {prefix} ({saved.describe_origin()}) is still up"
            how = f"`testbed down --prefix {prefix}` removes it"
        super().__init__(f"{what}: {how}, `--replace` replaces it, or give another --prefix")


def bring_up(topology: Topology, *, prefix: str, shaper: str = "auto", topology_file: str | Path | None = None,
             on_progress: Progress | None = None, backend: str | Backend[Any] = registry.DEFAULT,
             replace: bool = False, keep: bool = False) -> Testbed[Any]:
    """Build `topology`. Nothing is left behind on failure. `backend`: a registered name (with its default options)
    or a Backend (make_backend). HeldElsewhere while another live process holds the prefix; this process holds it
    from here to tear_down (or its end). `keep`: the testbed is left up for a person (`testbed up`). A testbed of
    the same prefix whose holder is gone is torn down first (a run's, a crashed one's), unless it was kept by another
    process and what it built is still there (someone uses it by hand): then StillUp, or with `replace` torn down."""
    chosen = backend if isinstance(backend, Backend) else registry.get(backend)()
    source = topology_file or topology.name
    plan_of(chosen, topology, shaper, prefix, source)  # pure: fails before anything is probed or created
    refusal = chosen.host_refusal(topology)
    if refusal:
        raise FabricError(f"{source}: {refusal}")
    held = ownership.holds(prefix)
    ownership.claim(prefix, "another testbed does not come up under its prefix")  # held until tear_down
    try:
        saved = state_store.load(prefix)
        stale = chosen.stale(prefix, saved)
        me = (os.getpid(), ownership.process_start(os.getpid()))
        kept = saved is not None and saved.kept and (saved.pid, saved.pid_start) != me
        if stale and kept and not replace and chosen.still_up(prefix, saved):
            raise StillUp(prefix, saved)  # before anything is probed
        resolved = chosen.resolve_shaper(shaper, topology, on_progress)
        plan = plan_of(chosen, topology, resolved, prefix, source)
        if stale:
            if on_progress:
                why = "replaced (--replace)" if kept else "whose owner is gone"
                on_progress(f"removing a previous testbed ({prefix}*) {why}")
            _remove(prefix)
        state = state_store.FabricState(chosen.name, prefix, resolved,
                                        topology.model_dump(mode="json", exclude_unset=False),
                                        str(topology_file) if topology_file else None, backend_state=chosen.new_state(),
                                        created=datetime.now(UTC).isoformat(timespec="seconds"),
                                        command=ownership.command_line(), kept=keep, pid=os.getpid(),
                                        pid_start=ownership.process_start(os.getpid()))
        state_store.save(state)  # first, so `clean` and a later `up` know about a half-built testbed
        fabric = chosen.make_fabric(prefix, topology, on_progress)
        try:
            fabric.up(plan, state)
        except BaseException:
            if not state.backend_state.holds_changes():
                state_store.remove(prefix)
            raise
    except StillUp:
        if not held:  # the testbed that is up is not this process's to hold
            ownership.release(prefix)
        raise
    except BaseException:
        if not held and state_store.load(prefix) is None:  # nothing of it is left to clean: nor is its lock file
            ownership.release(prefix)
        raise
    assert fabric.plan is not None
    return Testbed(topology, fabric.plan, fabric, state)


def plan_of(backend: Backend[PlanT], topology: Topology, shaper: str, prefix: str, source: str | Path,
            overrides: dict[str, LinkParams] | None = None) -> PlanT:
    """The backend's plan (pure); a layout the topology cannot have here is one FabricError naming `source`."""
    try:
        return backend.plan(topology, shaper, prefix, overrides)
    except ValueError as error:  # a layout the topology cannot have here (SpecError is not a ValueError)
        raise FabricError(f"{source}: {error}") from None


def attach(prefix: str) -> Testbed[Any]:
    """The testbed that `up` left running, rebuilt from the state file."""
    saved = state_store.load(prefix)
    if saved is None:
        raise FabricError(f"no testbed is up with prefix {prefix!r} (run `testbed up TOPOLOGY` first)")
    topology = saved.topology_spec()
    backend = registry.get(saved.backend).from_state(saved)
    fabric = backend.make_fabric(prefix, topology)
    fabric.attach(plan_of(backend, topology, saved.shaper, prefix, saved.topology_file or topology.name,
                        saved.applied_params()), saved)
    assert fabric.plan is not None
    return Testbed(topology, fabric.plan, fabric, saved)


def tear_down(prefix: str, *, force: bool = False) -> list[str]:
    """Remove everything with this prefix, with or without a state file: every registered backend cleans up
    after itself, the one that brought the testbed up first (with its record: ssh hosts are restored from it;
    if one cannot be reached the state file stays for a later `clean`). What was removed, in words. Refused
    (HeldElsewhere) while another live process holds the testbed, unless `force`; this process's hold on it ends."""
    if not force:
        ownership.claim(prefix, "it is not removed while that process lives")
    try:
        return _remove(prefix)
    finally:
        ownership.release(prefix)


def _remove(prefix: str) -> list[str]:
    saved = state_store.load(prefix)
    owner = registry.get(saved.backend) if saved is not None else None
    removed: list[str] = []
    for backend in ([owner] if owner else []) + [b for b in registry.backends() if b is not owner]:
        removed += backend.clean(prefix, saved if backend is owner else None)
    state_store.remove(prefix)
    return removed
