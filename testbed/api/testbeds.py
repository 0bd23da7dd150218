"""A testbed's life, for any front end: choose a backend, bring a topology up (or only plan it), see it, run a
command in it, change a link, impose a fault, take it down, clean up after a crash. And `testbed()`: the one
context manager for "a testbed, brought up or attached, always torn down" that probe, fault and calibrate share.

Heavy modules (pydantic, pyroute2, the backends) are imported inside the functions: importing testbed.api costs
nothing a `--help` would notice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.api.errors import UserError, user_errors

if TYPE_CHECKING:
    from testbed.fabric.backend import Backend
    from testbed.fabric.lifecycle import Testbed
    from testbed.spec.topology import Topology

Progress = Callable[[str], None]  # told what a long step is doing, in words


def handle_signals() -> None:
    """Route SIGINT and SIGTERM to a flag the long operations check (and a KeyboardInterrupt): a stop lands
    where the testbed can still be taken down. For a command line's main thread; a notebook need not."""
    from testbed.fabric import cancel

    cancel.install()


def backend(name: str, **options: Any) -> Backend:
    """Backend `name` with the options a user set (inventory, known_hosts, accept_new, image, adopt); an option
    the backend does not take, or a wrong value, is a UserError naming the option."""
    from testbed.fabric.lifecycle import make_backend

    with user_errors():
        return make_backend(name, **options)


def reset_stop() -> None:
    """Forget a stop the caller has handled (a benchmark that stopped one run and goes on to the next)."""
    from testbed.fabric import cancel

    cancel.reset()


def load_topology(topology: Path | Topology | dict[str, Any]) -> Topology:
    """The topology in file `topology`, or from its data (a dict as a file holds it), or a loaded one as it is; a
    bad one is a UserError naming file (or the topology's name) and field."""
    from testbed.spec.topology import Topology, load_topology, topology_from_data

    if isinstance(topology, Topology):
        return topology
    with user_errors():
        return topology_from_data(topology) if isinstance(topology, dict) else load_topology(topology)


def check_shaper(shaper: str) -> None:
    """Refuse a shaper that is none of auto, netem, userspace-delay."""
    from testbed.plan.shaping import SHAPERS

    if shaper not in ("auto", *SHAPERS):
        raise UserError(f"--shaper: expected auto, netem or userspace-delay, got {shaper!r}")


def dry_run(topology: Path | Topology | dict[str, Any], *, prefix: str, shaper: str = "auto", backend: str | Backend = "netns",
            source: Path | None = None) -> Any:
    """What `up` would build, as the backend's plan (a NetworkPlan, ContainersPlan or HostsPlan: dataclasses);
    nothing is created and no root is needed."""
    from testbed.fabric.lifecycle import plan_of

    chosen = _backend(backend)
    spec = load_topology(topology)
    with user_errors():
        return plan_of(chosen, spec, shaper, prefix, source or (topology if isinstance(topology, Path) else spec.name))


def up(topology: Path | Topology | dict[str, Any], *, prefix: str, shaper: str = "auto", backend: str | Backend = "netns",
       on_progress: Progress | None = None, source: Path | None = None, replace: bool = False) -> dict[str, Any]:
    """Bring `topology` up and leave it running (this process holds it until it ends or `down`); a testbed of the
    same prefix that is still up is refused in one line naming it (StillUp), or replaced with `replace`. What came up:
    name, dcs, nodes, shaper, and the link parameters this kernel could not apply (not_applied: key -> names,
    reason). A stop requested meanwhile (handle_signals) takes it down again and raises KeyboardInterrupt."""
    from testbed.fabric import cancel
    from testbed.fabric.lifecycle import bring_up, tear_down

    spec = load_topology(topology)
    file = source or (topology if isinstance(topology, Path) else None)
    with user_errors():
        testbed = bring_up(spec, prefix=prefix, shaper=shaper, topology_file=file, on_progress=on_progress,
                           backend=_backend(backend), replace=replace, keep=True)
    if cancel.requested():  # a stop that landed where it could not interrupt: honour it now
        tear_down(prefix)
        raise KeyboardInterrupt
    return {"name": spec.name, "dcs": len(spec.dcs), "nodes": len(testbed.plan.nodes), "shaper": testbed.plan.shaper,
            "not_applied": testbed.plan.not_applied(), "not_applied_reason": testbed.fabric.not_applied_reason()}


@contextmanager
def testbed(topology: Path | Topology | dict[str, Any] | None = None, *, prefix: str, shaper: str = "auto",
            backend: str | Backend = "netns", on_progress: Progress | None = None,
            source: Path | None = None) -> Iterator[Testbed]:
    """A testbed for the body of a `with`: `topology` brought up and always torn down after it (the body
    returned, raised or was interrupted), or without a topology the running testbed of `prefix`, attached and
    left running. Yields testbed.fabric.lifecycle.Testbed (plan, fabric, describe(), change(), apply_fault()).
    `source`: the file the state and manifests name (default: `topology` where it is a path)."""
    from testbed.fabric.lifecycle import attach, bring_up, tear_down
    from testbed.fabric.ownership import holds

    if topology is None:
        with user_errors():
            attached = attach(prefix)
        yield attached
        return
    spec = load_topology(topology)
    try:
        with user_errors():
            brought = bring_up(spec, prefix=prefix, shaper=shaper, on_progress=on_progress, backend=_backend(backend),
                               topology_file=source or (topology if isinstance(topology, Path) else None))
        yield brought
    finally:
        if holds(prefix):  # not one that another process holds (bring_up refused it), nor one the body took down
            tear_down(prefix)


def status(*, prefix: str) -> dict[str, Any]:
    """The running testbed of `prefix`: topology, backend, shaper, summary, nodes, links (each with its
    parameters and mechanism), dead_delay_lines (names of nodes whose delay line is not running) and each delay
    line's figures (delay_lines: key -> figures, with a note where it runs below its compensation)."""
    from testbed.runner.fidelity import below_compensation
    from testbed.runner.probe import delay_line_figures

    with testbed(prefix=prefix) as attached, user_errors():
        info = attached.describe()
        info["dead_delay_lines"] = attached.fabric.dead_delay_lines()
        info["delay_lines"] = {key: {**figures, "note": below_compensation(key, figures)}
                               for key, figures in delay_line_figures(attached.fabric).items()}
    return info


def dead_delay_lines_line(dead: list[str], what: str = "not running") -> str:
    """The line a front end shows for delay lines that are not running (exit 1)."""
    return f"delay line {what} in {', '.join(dead)}: " + ("those links are dark; run `testbed up` again"
                                                          if what == "not running" else "results are not valid")


def exec_(node: str, command: list[str], *, prefix: str) -> int:
    """Run `command` inside `node` of the running testbed, attached to this terminal; its exit status. A
    command that cannot be started is a UserError with status 127."""
    with testbed(prefix=prefix) as attached:
        try:
            with user_errors():
                return attached.fabric.exec(node, command)
        except OSError as error:
            raise UserError(f"{node}: {command[0]}: {error.strerror or error}", 127) from error


def shape(a: str, b: str, *, prefix: str, latency: str | None = None, distance: str | None = None,
          bandwidth: str | None = None, jitter: str | None = None, loss: str | None = None, one_way: bool = False,
          on_shaped: Callable[[str, dict[str, str]], None] | None = None) -> dict[str, dict[str, str]]:
    """Change the live link between DCs `a` and `b` (both directions, or a->b with `one_way`); values as in a
    topology file ("20ms", "1000km", "500mbit", "0.1%"). Refused before anything changes when a direction would
    carry what no real link has. Each direction's new parameters, described (on_shaped is told each in turn)."""
    from testbed.plan.network import direction_key
    from testbed.spec import units

    def parse(name: str, value: str | None, parser: Any) -> Any:
        if value is None:
            return None
        try:
            return parser(value)
        except ValueError as error:
            raise UserError(f"testbed shape: --{name}: {error}") from None

    changes = {"latency": parse("latency", latency, units.parse_delay),
               "bandwidth": parse("bandwidth", bandwidth, units.parse_rate),
               "jitter": parse("jitter", jitter, units.parse_delay),
               "loss": parse("loss", loss, units.parse_fraction)}
    if distance is not None:
        if latency is not None:
            raise UserError("testbed shape: --distance: give --latency or --distance, not both")
        changes["latency"] = units.fibre_delay(parse("distance", distance, units.parse_distance))
    changes = {key: value for key, value in changes.items() if value is not None}
    if not changes:
        raise UserError("testbed shape: nothing to change: give --latency, --distance, --bandwidth, --jitter or --loss")
    if changes.get("jitter", 0.0) > changes.get("latency", float("inf")):
        raise UserError(f"testbed shape: --jitter: {jitter} is more than the latency ({latency or distance}): jitter "
                        "is the half-width of a spread around the latency, so the delay would go below zero")
    shaped: dict[str, dict[str, str]] = {}
    with testbed(prefix=prefix) as attached:
        keys = [direction_key(a, b)] + ([] if one_way else [direction_key(b, a)])
        known = {end.key for end in attached.plan.link_ends if end.kind == "inter-dc"}
        for key in keys:
            if key not in known:
                raise UserError(f"no direct link {key} (links: {', '.join(sorted(known))})")
        for key in keys:  # each direction as it would be, against what it carries now: nothing changes if one is refused
            _refuse_shape(key, attached.plan.link_end(key).shaping.params, changes,
                          {"latency": latency, "distance": distance, "bandwidth": bandwidth, "jitter": jitter})
        for key in keys:
            with user_errors():
                shaped[key] = attached.change(key, **changes).describe()
            if on_shaped:
                on_shaped(key, shaped[key])
    return shaped


def _refuse_shape(key: str, now: Any, changes: dict[str, float], given: dict[str, str | None]) -> None:
    """Refuse a `shape` that would give direction `key` (carrying `now`) what no real link has: a jitter beyond
    its latency as it is now, a latency below its jitter now, or a queue beyond this machine's memory."""
    from dataclasses import replace

    from testbed.spec import units
    from testbed.spec.link import check_link

    problem = check_link(replace(now, **changes))
    if problem is None:
        return
    field, why = problem
    spread = "jitter is the half-width of a spread around the latency, so the delay would go below zero"
    if field == "jitter" and "jitter" in changes:
        raise UserError(f"testbed shape: --jitter: {given['jitter']} is more than {key}'s latency now "
                        f"({units.format_duration(now.latency)}): {spread} (give --latency too)")
    if field == "jitter":
        flag = "distance" if given["distance"] is not None else "latency"
        what = (f"{given['distance']} of fibre ({units.format_duration(changes['latency'])} one way)"
                if flag == "distance" else given["latency"])
        raise UserError(f"testbed shape: --{flag}: {what} is less than {key}'s jitter now "
                        f"({units.format_duration(now.jitter)}): {spread} (give a smaller --jitter too)")
    flags = [f"--{name}: " for name in ("bandwidth", "latency", "distance", "jitter") if given[name] is not None]
    raise UserError(f"testbed shape: {flags[0] if flags else ''}{key}'s queue: {why}")


def fault(kind: str | None, a: str | None, b: str | None, *, prefix: str, duration: str | None = None,
          loss: str | None = None, latency: str | None = None, jitter: str | None = None,
          bandwidth: str | None = None, period: str | None = None, down: str | None = None) -> dict[str, Any]:
    """Impose one link fault on the running testbed, by hand, for `duration`, and clear it (also when
    interrupted: handle_signals). The fault record: faults (kind, target, applied_at, cleared_at each) and
    errors (a fault that could not be applied or cleared: the caller reports them, exit 1)."""
    from testbed.runner.faults import FaultDriver
    from testbed.spec.errors import SpecError, did_you_mean
    from testbed.spec.faults import LINK_KINDS, Fault
    from testbed.spec.loader import validate_data

    if kind not in LINK_KINDS or a is None or b is None:
        raise UserError(f"testbed fault: KIND A B: give one of {', '.join(LINK_KINDS)} and the two DCs of a link (or "
                        "--clear)" + (f"; {kind!r} is no kind{did_you_mean(kind, LINK_KINDS)}"
                                      if kind is not None and kind not in LINK_KINDS else ""))
    given = {"duration": duration, "loss": loss, "latency": latency, "jitter": jitter, "bandwidth": bandwidth,
             "period": period, "down": down}
    try:
        data = {"kind": kind, "between": [a, b], "at": 0, **{k: v for k, v in given.items() if v is not None}}
        spec = validate_data(Fault, data, "testbed fault")
    except SpecError as error:
        flag = "--for" if error.field == "duration" else f"--{error.field}"
        problem = error.problem.replace("needs duration", "needs --for").replace(", duration", ", --for")
        raise UserError(f"testbed fault: {flag}: {problem}") from None
    with testbed(prefix=prefix) as attached:
        known = {end.key for end in attached.plan.link_ends if end.kind == "inter-dc"}
        if f"{a}->{b}" not in known:
            raise UserError(f"no direct link between {a} and {b} (links: {', '.join(sorted(known))})")
        with user_errors():
            attached.fabric.prepare_link_faults()
        driver = FaultDriver(attached, [spec], "by-hand", 0, None, None, clock_at_start=True)
        try:
            driver.start()
            driver.wait()
        except KeyboardInterrupt:
            pass
        finally:
            record = driver.stop()
    return record


def clear_faults(*, prefix: str) -> list[str]:
    """Restore every link fault still in force on the running testbed (after a fault was killed); their ids."""
    with testbed(prefix=prefix) as attached, user_errors():
        return attached.clear_faults()


def down(*, prefix: str) -> list[str]:
    """Tear the testbed of `prefix` down; what was removed, in words. Refused while a live process holds it."""
    from testbed.fabric.lifecycle import tear_down

    with user_errors():
        return tear_down(prefix)


def clean(*, prefix: str, images: bool = False, force: bool = False) -> list[str]:
    """Remove every object with the prefix, even without a state file, and what runs that are gone left under
    prefixes of their own; with `images`, docker images labelled testbed. Refused while a live process holds
    the testbed, unless `force`. What was removed, in words."""
    from testbed.fabric.lifecycle import tear_down
    from testbed.fabric.ownership import stale_runs

    with user_errors():
        removed = tear_down(prefix, force=force)
        for left in stale_runs():
            removed += tear_down(left)
        if images:
            from testbed.fabric.docker.engine import remove_images

            removed += remove_images()
    return removed


def check_hosts(inventory: Path, *, known_hosts: Path, accept_new: bool = False) -> list[Any]:
    """Connect to every host of an inventory file: what each has (python, torch, tc, netem, clock offset) and
    lacks, as testbed.fabric.ssh.checks.HostCheck rows (reachable, problems, ...)."""
    from testbed.fabric.ssh.checks import check_inventory
    from testbed.spec.inventory import load_inventory

    with user_errors():
        spec = load_inventory(inventory)
    return check_inventory(spec, inventory.parent, known_hosts.expanduser(), accept_new)


def _backend(choice: str | Backend) -> Backend:
    """A Backend from a name (its default options) or as it is."""
    if isinstance(choice, str):
        return backend(choice)
    return choice
