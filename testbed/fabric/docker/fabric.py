"""The docker fabric: nodes and DC routers as containers (testbed.plan.containers), driven through the
docker SDK behind the same Fabric interface as netns and ssh.

`up` creates the networks and containers (labelled `testbed=<prefix>`), ships this package's sources
into each one (so containers run the controller's code, whatever the image's copy), starts them and waits
for every router to report ready; the shaper is the one the routers resolved on the docker host's kernel.
`adopt` takes over containers that `docker compose up` started from a generated compose file instead,
and never removes them. Probes and commands start with exec (DockerProcess), the workload's ranks forked by a
fork server in each node's container (fork_server); live `shape` and counters are execs of the router agent
(testbed.agents.router); metrics files come back with get_archive.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shlex
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed import rankenv
from testbed.agents import forkserver
from testbed.agents.router import CONTROL_SCRIPT, ROUTER_STATE, RouterState
from testbed.agents.tc import LinkCounters
from testbed.fabric import cancel
from testbed.fabric.base import Fabric
from testbed.fabric.docker.engine import clean, docker_client
from testbed.fabric.docker.process import DockerProcess, ExecChannel, ExecError, ExecShell
from testbed.fabric.errors import FabricError
from testbed.fabric.forkserver import NodeForkServers
from testbed.fabric.parallel import each_at_once
from testbed.fabric.shipping import pass_env, source_archive
from testbed.fabric.state import FabricState
from testbed.fabric.state import save as save_state
from testbed.plan.containers import (
    LABEL,
    LABEL_DC,
    LABEL_NODE,
    LABEL_ROLE,
    NETWORK_OPTIONS,
    ROUTER_COMMAND,
    ContainerSpec,
    ContainersPlan,
)
from testbed.plan.network import LinkEnd
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology
from testbed.waiting import wait_for

LIVE_CODE = "/opt/testbed-live"  # where `up` puts the controller's sources in every container
WORKDIR = "/tmp/testbed"
READY_TIMEOUT_S = 60.0
HEALTH_CACHE_S = 2.0
SETTLE_AFTER_FAILURE_S = 2.0  # an interrupted request may still be carried out by the engine: keep looking


class DockerFabric(Fabric[ContainersPlan]):
    """Containers on one docker engine; the controller keeps its record in the state file like the others."""

    link_faults = True  # a fault is a live re-shape by the routers: netem's or the delay line's loss, delay, rate
    node_shells = True  # each container's kept-open exec shell (signals, a straggler's loop)

    def __init__(self, prefix: str, topology: Topology, image: str, adopted: bool = False,
                 on_progress: Callable[[str], None] | None = None, client: Any = None) -> None:
        """`client`: a docker SDK client (or what stands in for one in a test); else the engine's own."""
        self.prefix, self.topology, self.image, self.adopted = prefix, topology, image, adopted
        self.plan: ContainersPlan | None = None
        self.state: FabricState | None = None
        self._progress = on_progress or (lambda message: None)
        self.client = client if client is not None else docker_client()
        self._outputs: dict[str, set[str]] = {}  # local dir -> containers that wrote into their copy of it
        self._health: tuple[float, list[str]] | None = None
        self._by_service: dict[str, Any] = {}  # service -> container: containers do not change while up
        self._shells: dict[str, ExecShell] = {}  # router or node -> its kept-open shell (live changes, signals)
        self._shells_lock = threading.Lock()

    # --- bring-up ---------------------------------------------------------------------------------
    def up(self, plan: ContainersPlan, state: FabricState | None = None) -> None:
        """Create, fill and start every network and container; on any failure or interrupt remove them. An
        adopting fabric takes the containers docker compose started instead."""
        if self.adopted:
            self.adopt(plan, state)
            return
        self.state = state
        try:
            self._create(plan)
            self._ready(plan)
        except BaseException as error:
            self.down(settle=SETTLE_AFTER_FAILURE_S)
            if type(error).__module__.startswith(("docker", "requests")):
                raise FabricError(f"docker: {error}") from None
            raise

    def _create(self, plan: ContainersPlan) -> None:
        from docker.types import IPAMConfig, IPAMPool

        self._check_addresses(plan)
        self._progress(f"creating {len(plan.networks)} docker networks")
        networks = {}
        for net in plan.networks:
            cancel.check()
            networks[net.name] = self.client.networks.create(
                net.name, driver="bridge", options=NETWORK_OPTIONS, labels={LABEL: plan.prefix, LABEL_ROLE: net.role},
                ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=net.subnet, gateway=net.gateway)]))
        archive = source_archive(top=f"{Path(LIVE_CODE).name}/testbed")
        self._progress(f"creating {len(plan.containers)} containers from {self.image}")
        created = []
        for spec in plan.containers:
            cancel.check()
            created.append(self._create_container(plan, spec, networks, archive))
        for container in created:
            container.start()

    def _check_addresses(self, plan: ContainersPlan) -> None:
        """Docker refuses overlapping subnets: name who holds ours (another testbed, a compose run) first."""
        import ipaddress

        ours = [ipaddress.ip_network(net.subnet) for net in plan.networks]
        for network in self.client.networks.list():
            for config in (network.attrs.get("IPAM") or {}).get("Config") or []:
                subnet = config.get("Subnet", "")
                if ":" in subnet or not subnet:
                    continue
                if any(ipaddress.ip_network(subnet).overlaps(mine) for mine in ours):
                    owner = network.attrs.get("Labels", {}).get(LABEL)
                    hint = (f"`testbed clean --prefix {owner}` removes it" if owner is not None
                            else "remove it or give the topology another subnet")
                    raise FabricError(f"docker: network {network.name} already uses {subnet}, which this testbed "
                                      f"needs; {hint}")

    def _create_container(self, plan: ContainersPlan, spec: ContainerSpec, networks: dict, archive: bytes) -> Any:
        first, *rest = spec.attachments
        healthcheck = {"test": list(spec.healthcheck), "interval": 200_000_000, "timeout": 5_000_000_000,
                       "retries": 300} if spec.healthcheck else None
        container = self.client.containers.create(
            self.image, list(spec.command), name=plan.container_name(spec), hostname=spec.service,
            labels=spec.labels(plan.prefix), environment={**spec.environment, "PYTHONPATH": LIVE_CODE},
            cap_add=list(spec.cap_add) or None, sysctls=spec.sysctls,
            extra_hosts=[f"{name}:{address}" for name, address in spec.extra_hosts] or None,
            healthcheck=healthcheck, tmpfs=dict.fromkeys(spec.tmpfs, "") or None, network=first.network,
            detach=True,
            networking_config={first.network: self.client.api.create_endpoint_config(ipv4_address=first.address)})
        for attachment in rest:
            networks[attachment.network].connect(container, ipv4_address=attachment.address)
        container.put_archive(str(Path(LIVE_CODE).parent), archive)
        return container

    def adopt(self, plan: ContainersPlan, state: FabricState | None = None) -> None:
        """Use containers that docker compose started from a generated file (never removed by us)."""
        self.state = state
        services = {self._service(x) for x in self._containers().values()}
        missing = [plan.container_name(c) for c in plan.containers if c.service not in services]
        if missing:
            raise FabricError(f"docker: no container with label {LABEL}={self.prefix} for {', '.join(missing)}; "
                              "is the compose file generated from this topology (`testbed compose`)?")
        self._ready(plan)

    def _ready(self, plan: ContainersPlan) -> None:
        """Wait for every router's readiness, then take the shaper the routers resolved."""
        self._progress("waiting for the DC routers")
        waiting = {c.service for c in plan.routers()}

        def all_healthy() -> bool:
            cancel.check()
            for name in sorted(waiting):
                container = self._container(name)
                container.reload()  # fresh state and health
                if container.attrs["State"].get("Health", {}).get("Status") == "healthy":
                    waiting.discard(name)
                elif container.status in ("exited", "dead"):
                    raise self._not_up(name, container)
            return not waiting

        if not wait_for(all_healthy, READY_TIMEOUT_S, interval=0.2):
            name = sorted(waiting)[0]
            raise self._not_up(name, self._container(name))
        shapers = {self._router_state(c.dc).shaper for c in plan.routers()}
        if len(shapers) != 1:
            raise FabricError(f"docker: the routers resolved different shapers ({', '.join(sorted(shapers))})")
        shaper = shapers.pop()
        overrides = self.state.override_params() if self.state else {}
        self.plan = plan.with_shaper(shaper, overrides)
        if self.state is not None:
            self.state.shaper = shaper
            save_state(self.state)

    @staticmethod
    def _not_up(name: str, container: Any) -> FabricError:
        logs = container.logs(tail=5).decode(errors="replace").strip().splitlines()
        return FabricError(f"docker: router {name} did not come up ({container.status}): "
                           f"{' | '.join(logs[-3:]) or 'no output'}")

    def attach(self, plan: ContainersPlan, state: FabricState) -> None:
        """Adopt a testbed an earlier process brought up: the plan as the routers resolved it (the state's)."""
        self.state = state
        self.plan = plan.with_shaper(state.shaper, state.applied_params())

    # --- containers -------------------------------------------------------------------------------
    def _containers(self) -> dict[str, Any]:
        """This testbed's containers by name."""
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.prefix}"},
                                            ignore_removed=True)  # one being removed right now is gone
        return {c.name: c for c in found}

    @staticmethod
    def _service(container: Any) -> str:
        labels = container.labels
        return labels.get(LABEL_NODE) or f"{labels.get(LABEL_DC)}-gw"

    def _container(self, service: str) -> Any:
        """A node (`east-0`) or router (`east-gw`) container, whatever name docker or compose gave it."""
        if service not in self._by_service:
            self._by_service = {self._service(c): c for c in self._containers().values()
                                if c.labels.get(LABEL_ROLE) in ("node", "router")}
        if service in self._by_service:
            return self._by_service[service]
        names = ", ".join(n.name for n in self.plan.nodes) if self.plan else "?"
        raise FabricError(f"no node named {service!r} in docker testbed {self.prefix!r} (nodes: {names})")

    def _router_exec(self, dc: str, argv: list[str], what: str) -> str:
        code, output = self._container(f"{dc}-gw").exec_run(argv)
        text = output.decode(errors="replace")
        if code != 0:
            raise _router_failure(dc, what, text.strip().splitlines()[-1:] or code)
        return text

    def _shell(self, service: str) -> ExecShell:
        """The kept-open shell of container `service` (a router, or a node whose ranks a fault signals)."""
        with self._shells_lock:
            shell = self._shells.get(service)
            if shell is None:
                shell = self._shells[service] = ExecShell(self.client.api, self._container(service).id)
            return shell

    def _router_control(self, dc: str, pairs: list[list]) -> None:
        """Hand changes to router `dc`'s serving agent through its kept-open shell (one exec, once)."""
        shell = self._shell(f"{dc}-gw")
        what = f"re-shaping {', '.join(key for key, _ in pairs)}" if pairs else "opening its shell"
        try:
            code, text = shell.script([shlex.join(["sh", "-c", CONTROL_SCRIPT, "sh", json.dumps(pairs)])]
                                      if pairs else ["true"])
        except ExecError as error:
            raise _router_failure(dc, what, error) from None
        if code != 0:
            raise _router_failure(dc, what, text.strip().splitlines()[-1:] or code)

    def _router_state(self, dc: str) -> RouterState:
        return RouterState.parse(self._router_exec(dc, ["cat", str(ROUTER_STATE)], "reading the router state"))

    # --- teardown ---------------------------------------------------------------------------------
    def down(self, settle: float = 0.0) -> None:
        for shell in self._shells.values():
            shell.close()
        self._shells.clear()
        if not self.adopted:
            clean(self.prefix, settle, client=self.client)

    # --- use --------------------------------------------------------------------------------------
    def popen(self, node: str, argv: list[str], **kwargs: Any) -> DockerProcess:
        """Start argv in the container playing `node` (east-0), or in a router (east-gw)."""
        container = self._container(node)
        argv = ["python", *argv[1:]] if argv and argv[0] == sys.executable else list(argv)
        env, mkdirs = self._node_env(node, kwargs.get("env"))
        try:
            return DockerProcess(self.client.api, container.id, argv, env=env, cwd=f"{WORKDIR}/run", mkdirs=mkdirs,
                                 stdout=kwargs.get("stdout"), stderr=kwargs.get("stderr"),
                                 text=kwargs.get("text", False), shell=lambda: self._shell(node))
        except ExecError as error:
            raise FabricError(str(error)) from None

    def _node_env(self, node: str, env: dict[str, str] | None) -> tuple[dict[str, str], tuple[str, ...]]:
        """A command's environment in `node`'s container (the env contract, its directories the container's
        own) and the directories to create there first."""
        env = pass_env(env)
        mkdirs: tuple[str, ...] = ()
        if rankenv.METRICS_DIR in env:
            local = env[rankenv.METRICS_DIR]
            env[rankenv.METRICS_DIR] = self._remote_dir(local)
            mkdirs = (env[rankenv.METRICS_DIR],)
            self._outputs.setdefault(local, set()).add(node)
        if rankenv.CHECKPOINT_DIR in env:  # the container's own copy (restarts find it there; not fetched)
            env[rankenv.CHECKPOINT_DIR] = self._remote_dir(env[rankenv.CHECKPOINT_DIR])
        return env, mkdirs

    def fork_server(self, preload: str, log: Path, env: dict[str, str]) -> NodeForkServers:
        """A fork server in every node's container (its output to log's forkserver-NODE.log), all importing
        `preload` at once: a rank then starts in a fraction of a second instead of importing torch itself."""
        argv = ["python", "-m", forkserver.MODULE, forkserver.STDIO, preload]
        return NodeForkServers.start(
            [node.name for node in self._require().nodes], log,
            lambda node, node_log: ExecChannel(self.client.api, self._container(node).id, argv, pass_env(env), node_log),
            self._rank_env)

    def _rank_env(self, node: str, env: dict[str, str]) -> tuple[dict[str, str], str | None, tuple[str, ...]]:
        """A forked rank's environment in `node`'s container, its working directory and the directories to
        create there (as popen gives an exec'd one)."""
        there, mkdirs = self._node_env(node, env)
        return there, f"{WORKDIR}/run", (*mkdirs, f"{WORKDIR}/run")

    @staticmethod
    def _remote_dir(local: str) -> str:
        return f"{WORKDIR}/out/{hashlib.sha1(local.encode()).hexdigest()[:12]}"

    def fetch_outputs(self, local: Path) -> None:
        """Copy what the containers wrote into their copy of `local` (metrics files) back into `local`."""
        local.mkdir(parents=True, exist_ok=True)
        for node in sorted(self._outputs.pop(str(local), set())):
            from docker.errors import NotFound

            try:
                chunks, _ = self._container(node).get_archive(self._remote_dir(str(local)))
            except NotFound:  # the rank never created it (died early): nothing to fetch
                continue
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                for member in tar.getmembers():
                    if member.isfile():
                        source = tar.extractfile(member)
                        if source is not None:
                            (local / Path(member.name).name).write_bytes(source.read())

    def shape(self, key: str, params: LinkParams) -> None:
        """Change one direction live: the sending router changes its tc tree, the receiving one its delay line."""
        self.impair_all({key: params})

    def impair(self, key: str, params: LinkParams) -> None:
        self.impair_all({key: params})

    def prepare_rank_faults(self, nodes: list[str]) -> None:
        """Open the kept-open shell of every node container in `nodes` (a kill is a `kill` written to it, a
        straggler's loop is started from it)."""
        each_at_once(lambda node: self._shell(node).script(["true"]), nodes)

    def node_script(self, node: str, lines: list[str], timeout: float = 30.0) -> tuple[int, str]:
        """Run shell `lines` in the kept-open shell of container `node` (one exec, once, not one per script)."""
        try:
            return self._shell(node).script(lines, timeout)
        except ExecError as error:
            raise FabricError(str(error)) from None

    def prepare_link_faults(self) -> None:
        """Open every router's kept-open shell (an exec each, 0.15-0.2 s) before a fault's clock starts."""
        each_at_once(lambda dc: self._router_control(dc.name, []), list(self.topology.dcs))

    def impair_all(self, changes: dict[str, LinkParams]) -> None:
        """Change directions live, the routers involved in parallel: each router's kept-open shell hands every
        change the router makes to its serving agent (testbed.agents.router.CONTROL) and waits for its answer
        (an exec of the agent's own Python took 0.6-1.2 s for a partition, most of it imports; an exec of
        this script 0.16-0.19 s)."""
        plan = self._require()
        for key in changes:
            plan.link_end(key)  # a KeyError for a link that is not there, before any router is touched
        by_router: dict[str, list[list]] = {}
        for key, params in changes.items():
            for dc in dict.fromkeys(key.split("->")):
                by_router.setdefault(dc, []).append([key, dataclasses.asdict(params)])
        each_at_once(lambda item: self._router_control(*item), list(by_router.items()))
        self.plan = plan.with_shaper(plan.shaper, changes)  # what the routers apply

    def counters(self) -> dict[str, LinkCounters]:
        """Interface and qdisc counters of every router's egress link ends (one exec per router)."""
        out: dict[str, LinkCounters] = {}
        for dc in self.topology.dcs:
            data = json.loads(self._router_exec(dc.name, [*ROUTER_COMMAND, "counters"], "reading counters"))
            out.update({key: LinkCounters(**value) for key, value in data.items()})
        return out

    def delay_line_stats(self) -> dict[str, dict]:
        """What each running router's delay lines say of themselves; a router that is not running (its delay line
        died: dead_delay_lines() names it) has nothing to say."""
        out: dict[str, dict] = {}
        dead = set(self.dead_delay_lines())
        for dc in self.topology.dcs:
            if f"{dc.name}-gw" in dead:
                continue
            out.update(json.loads(self._router_exec(dc.name, [*ROUTER_COMMAND, "lateness"],
                                                    "reading the delay line's figures")))
        return out

    def status(self) -> dict[str, Any]:
        plan = self._require()
        containers = self._containers()
        running = sum(c.status == "running" for c in containers.values())
        planned = len(plan.nodes) + len(self.topology.dcs)
        return {"backend": "docker", "image": self.image, "adopted": self.adopted, "containers_running": running,
                "containers_planned": planned, "summary": f"{running}/{planned} containers running"
                + (" (started by docker compose)" if self.adopted else "")}

    def not_applied_reason(self) -> str:
        return "docker: node containers have no capabilities, so intra-DC access links are not shaped"

    def delay_applied(self, end: LinkEnd) -> bool:
        dst = end.key.split("->")[1] if "->" in end.key else None
        if dst is None:
            return not end.shaping.not_applied
        return f"{dst}-gw" not in self.dead_delay_lines()

    def dead_delay_lines(self) -> list[str]:
        """Routers that are not running: their links are dark (a router exits when its delay line dies)."""
        now = time.monotonic()
        if self._health is None or now - self._health[0] > HEALTH_CACHE_S:
            containers = {self._service(c): c for c in self._containers().values()
                          if c.labels.get(LABEL_ROLE) == "router"}
            dead = sorted(f"{dc.name}-gw" for dc in self.topology.dcs
                          if f"{dc.name}-gw" not in containers or containers[f"{dc.name}-gw"].status != "running")
            self._health = (now, dead)
        return list(self._health[1])

    def _require(self) -> ContainersPlan:
        if self.plan is None:
            raise FabricError("no testbed is up (run `testbed up --backend docker` first)")
        return self.plan


def _router_failure(dc: str, what: str, detail: object) -> FabricError:
    """One line naming router `dc`, what failed there and the last thing it said (or its exit code)."""
    return FabricError(f"docker: {what} in router {dc}-gw failed: {detail}")
