"""What runs inside the docker backend's containers: `python -m testbed.agents.router COMMAND`.

  serve     a DC router's main process: read its RouterConfig (env TESTBED_ROUTER, from
            testbed.plan.containers), name interfaces by their address (`lan`, `to-<peer>`: docker attaches
            networks in its own order), claim the DC gateway address, route to the other DCs, shape every
            egress link end (netem where this kernel has it, else htb + the userspace delay line on
            ingress, as in the netns backend), then mark itself ready and keep the delay line running. If
            the delay line dies the router exits: its links go dark and the harness sees a stopped router.
  shape KEY PARAMS_JSON [KEY PARAMS_JSON ...]   change directions live, by hand (the harness writes the same
            request into the serving router's control FIFO instead: no Python to start, see CONTROL)
  counters  the egress link ends' counters, JSON
  lateness  the delay line's release figures per direction (how late it released packets), JSON
  idle      what a node container runs: nothing, until it is stopped
What it applied lives in /run/testbed/router.json (RouterState); its delay line's files in TESTBED_STATE_DIR.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed import settings
from testbed.atomic import write_text
from testbed.plan.containers import ROUTER_ENV, ROUTER_READY, ROUTER_STATE_DIR, RouterConfig
from testbed.plan.delayline import DelayDirection
from testbed.plan.hosts import comment
from testbed.plan.shaping import plan_shaping
from testbed.spec.link import LinkParams

ROUTER_STATE = Path(ROUTER_STATE_DIR) / "router.json"
DELAY_LINE = "router"  # names the delay line's files
# `serve` reads requests here, one JSON line each: {"reply": FIFO, "shape": [[KEY, PARAMS], ...]}; it answers
# "ok" or "error: ..." into the reply FIFO (made by the requester). A `docker exec` of a shell costs ~65 ms here,
# one of this agent's Python with its imports ~0.4 s: that decides how soon a fault is in force.
CONTROL = Path(ROUTER_STATE_DIR) / "router.control"
CONTROL_SCRIPT = (  # what the harness execs in the container: sh -c CONTROL_SCRIPT sh PAIRS_JSON
    # the reply FIFO is open (fd 3, read-write) before the request goes out, so the router can always answer
    f'r={ROUTER_STATE_DIR}/reply.$$; rm -f "$r"; mkfifo "$r" || exit 90; exec 3<>"$r"; '
    f'printf \'{{"reply": "%s", "shape": %s}}\\n\' "$r" "$1" > {CONTROL} || exit 91; '
    'answer=$(timeout 30 head -n 1 <&3); rm -f "$r"; echo "$answer"; [ "$answer" = ok ]')


@dataclass
class RouterState:
    """What the router applies now: the shaper it resolved, its delay line's pid, each direction's parameters."""

    shaper: str
    delay_line: int | None = None
    params: dict[str, LinkParams] = field(default_factory=dict)

    def save(self, path: Path = ROUTER_STATE) -> None:
        write_text(path, json.dumps(asdict(self)))

    @classmethod
    def parse(cls, text: str) -> RouterState:
        data = json.loads(text)
        return cls(data["shaper"], data.get("delay_line"),
                   {key: LinkParams(**value) for key, value in data.get("params", {}).items()})


def _delay_dir() -> Path:
    return Path(os.environ.get(settings.STATE_DIR, ROUTER_STATE_DIR))


def _config() -> RouterConfig:
    return RouterConfig.from_json(os.environ[ROUTER_ENV])


def _resolve(requested: str, ipr) -> str:
    from testbed.agents.kernel import netem_on

    if requested == "auto":
        return "netem" if netem_on(ipr)[0] else "userspace-delay"
    if requested == "netem":
        ok, reason = netem_on(ipr)
        if not ok:
            raise SystemExit(f"router: shaper netem requested but {reason}")
    return requested


def _name_interfaces(ipr, names: dict[str, str]) -> dict[str, int]:
    """Rename every interface that holds one of `names`' addresses; returns name -> index."""
    found: dict[str, int] = {}
    for addr in ipr.get_addr(family=2):
        wanted = names.get(addr.get_attr("IFA_ADDRESS"))
        if wanted is None:
            continue
        index = addr["index"]
        current = ipr.get_links(index)[0].get_attr("IFLA_IFNAME")
        if current != wanted:
            ipr.link("set", index=index, state="down")
            ipr.link("set", index=index, ifname=wanted)
        ipr.link("set", index=index, state="up")
        found[wanted] = index
    missing = sorted(set(names.values()) - set(found))
    if missing:
        raise SystemExit(f"router: no interface holds the address planned for {', '.join(missing)}")
    return found


def _delay_work(config: RouterConfig, shaper: str) -> list[DelayDirection]:
    work: list[DelayDirection] = []
    for end in config.ingress:
        line = plan_shaping(end.params, shaper).delay_line
        if line is not None:
            work.append(DelayDirection.serving(end.key, end.ifname, len(work), line, comment=comment(config.prefix)))
    return work


def serve() -> int:
    from pyroute2 import IPRoute

    from testbed.agents.delayline import control as delay_lines
    from testbed.agents.tc import add_tree

    config = _config()
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))  # PID 1 has no default handlers
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    with IPRoute() as ipr:
        shaper = _resolve(config.shaper, ipr)
        index = _name_interfaces(ipr, config.interfaces)
        ipr.addr("add", index=index["lan"], address=config.gateway)  # pyroute2 reads "address/prefixlen"
        for route in ipr.get_routes(family=2, dst_len=0):  # docker's default route points at ourselves
            ipr.route("del", dst="default", gateway=route.get_attr("RTA_GATEWAY"))
        for route in config.routes:
            ipr.route("add", dst=route.dst, gateway=route.via)
        for end in config.egress:
            add_tree(ipr, index[end.ifname], plan_shaping(end.params, shaper))
    work = _delay_work(config, shaper)
    pid = delay_lines.start_all({DELAY_LINE: work}, _delay_dir(), in_namespace=False)[DELAY_LINE] if work else None
    RouterState(shaper, pid, {end.key: end.params for end in config.egress + config.ingress}).save()
    CONTROL.unlink(missing_ok=True)
    os.mkfifo(CONTROL)
    control = os.open(CONTROL, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(CONTROL, os.O_WRONLY)  # a writer of our own: reads never see end-of-file between requests
    Path(ROUTER_READY).touch()
    print(f"router {config.dc}: ready, shaper {shaper}, {len(config.egress)} links", flush=True)
    pending = b""
    with IPRoute() as ipr:
        while not stop["flag"]:
            if pid is not None and _reaped(pid):
                print(f"router {config.dc}: the delay line died; its links are dark", flush=True)
                return 1
            try:
                ready, _, _ = select.select([control], [], [], 0.2)
            except InterruptedError:
                continue
            if ready:
                pending += os.read(control, 65536)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    _answer(ipr, config, line)
    os.close(keep)
    os.close(control)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
    return 0


def _reaped(pid: int) -> bool:
    """Whether our child `pid` has ended (reaping it)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def apply_changes(ipr, config: RouterConfig, changes: list[tuple[str, LinkParams]]) -> None:
    """Change directions live: `tc change` where one leaves this router, the delay line where one enters; the
    router state records them."""
    from testbed.agents.delayline import control as delay_lines
    from testbed.agents.tc import change_tree

    state = RouterState.parse(ROUTER_STATE.read_text())
    for key, params in changes:
        old = state.params[key]
        for end in config.egress:
            if end.key == key:
                change_tree(ipr, ipr.link_lookup(ifname=end.ifname)[0], plan_shaping(old, state.shaper),
                            plan_shaping(params, state.shaper))
        line = plan_shaping(params, state.shaper).delay_line
        if line is not None and any(end.key == key for end in config.ingress):
            delay_lines.reconfigure(_delay_dir(), DELAY_LINE, key, line)
        state.params[key] = params
    state.save()


def _answer(ipr, config: RouterConfig, line: bytes) -> None:
    """One control request: apply it, answer into its reply FIFO (a requester gone meanwhile is skipped)."""
    try:
        request = json.loads(line)
    except ValueError:
        return
    try:
        apply_changes(ipr, config, [(key, LinkParams(**params)) for key, params in request["shape"]])
        answer = "ok"
    except Exception as error:  # the requester prints it; the router keeps serving
        answer = f"error: {type(error).__name__}: {error}".replace("\n", " ")
    try:
        fd = os.open(request["reply"], os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(answer + "\n")


def shape(*pairs: str) -> int:
    """By hand: `shape KEY PARAMS_JSON [KEY PARAMS_JSON ...]` (a partition: both directions in one call)."""
    from pyroute2 import IPRoute

    if not pairs or len(pairs) % 2:
        print("usage: python -m testbed.agents.router shape KEY PARAMS_JSON [KEY PARAMS_JSON ...]", file=sys.stderr)
        return 2
    with IPRoute() as ipr:
        apply_changes(ipr, _config(), [(key, LinkParams(**json.loads(params)))
                                       for key, params in zip(pairs[::2], pairs[1::2])])
    return 0


def counters() -> int:
    from pyroute2 import IPRoute

    from testbed.agents.tc import interface_counters

    with IPRoute() as ipr:
        print(json.dumps({end.key: asdict(interface_counters(ipr, end.ifname)) for end in _config().egress}))
    return 0


def lateness() -> int:
    """The delay line's release figures per direction it serves, JSON ({} under netem)."""
    from testbed.agents.delayline import control as delay_lines

    state = RouterState.parse(ROUTER_STATE.read_text())
    print(json.dumps(delay_lines.snapshot(_delay_dir(), [DELAY_LINE]) if state.delay_line else {}))
    return 0


def reap_children() -> None:
    """Reap every child as it exits: as a container's PID 1, processes whose parents are gone (a straggler's loop
    started in the background by a kept shell, a rank's orphans) become its children, and would stay zombies."""
    def reap(*_: object) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    signal.signal(signal.SIGCHLD, reap)


def idle() -> int:
    """A node container's main process: wait to be stopped (PID 1 must handle SIGTERM itself), reaping orphans."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    reap_children()
    while True:
        signal.pause()


def main(argv: list[str]) -> int:
    commands = {"serve": serve, "shape": shape, "counters": counters, "lateness": lateness, "idle": idle}
    if not argv or argv[0] not in commands:
        print(f"usage: python -m testbed.agents.router {'|'.join(commands)} [ARGS]", file=sys.stderr)
        return 2
    return commands[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
