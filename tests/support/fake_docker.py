"""A stand-in for the docker SDK client, as much of it as the docker fabric uses: networks and containers that
filter by label, exec_run answered by a function, and the low-level exec API a DockerProcess streams and an
ExecShell writes scripts to."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from docker.errors import APIError


def _matches(labels: dict[str, str], filters: dict | None) -> bool:
    wanted = (filters or {}).get("label")
    if wanted is None:
        return True
    for item in [wanted] if isinstance(wanted, str) else wanted:
        key, _, value = item.partition("=")
        if labels.get(key) != value:
            return False
    return True


@dataclass
class FakeNetwork:
    client: FakeClient
    name: str
    labels: dict[str, str]
    subnet: str
    members: list[tuple[str, str]] = field(default_factory=list)  # (container, address)

    @property
    def attrs(self) -> dict:
        return {"Labels": self.labels, "IPAM": {"Config": [{"Subnet": self.subnet}]}}

    def connect(self, container: FakeContainer, ipv4_address: str) -> None:
        self.members.append((container.name, ipv4_address))

    def remove(self) -> None:
        self.client.removed.append(f"network {self.name}")
        self.client.networks.items.remove(self)


@dataclass
class FakeContainer:
    client: FakeClient
    name: str
    image: str
    command: list[str]
    kwargs: dict[str, Any]
    status: str = "created"
    archives: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"id-{self.name}"

    @property
    def labels(self) -> dict[str, str]:
        return self.kwargs.get("labels") or {}

    @property
    def attrs(self) -> dict:
        health = "healthy" if self.status == "running" and self.kwargs.get("healthcheck") else "starting"
        return {"State": {"Health": {"Status": health}}}

    def put_archive(self, path: str, data: bytes) -> bool:
        self.archives.append((path, data))
        return True

    def start(self) -> None:
        self.status = "running" if self.client.start_as is None else self.client.start_as(self)

    def reload(self) -> None:
        pass

    def logs(self, tail: int = 5) -> bytes:
        return b"router east: this kernel lacks sch_htb\n"

    def exec_run(self, argv: list[str]) -> tuple[int, bytes]:
        self.client.execs.append((self.name, list(argv)))
        return self.client.answer(self, list(argv))

    def remove(self, force: bool = False) -> None:
        self.client.removed.append(f"container {self.name}")
        self.client.containers.items.remove(self)


class FakeNetworks:
    def __init__(self, client: FakeClient) -> None:
        self.client, self.items = client, []

    def create(self, name: str, driver: str, options: dict, labels: dict, ipam: Any) -> FakeNetwork:
        network = FakeNetwork(self.client, name, labels, ipam["Config"][0]["Subnet"])
        self.client.created.append(("network", name, {"driver": driver, "options": options, "ipam": ipam}))
        self.items.append(network)
        return network

    def list(self, filters: dict | None = None) -> list[FakeNetwork]:
        return [n for n in self.items if _matches(n.labels, filters)]


class FakeContainers:
    def __init__(self, client: FakeClient) -> None:
        self.client, self.items = client, []

    def create(self, image: str, command: list[str], **kwargs: Any) -> FakeContainer:
        if self.client.fail_create is not None and kwargs["name"].endswith(self.client.fail_create):
            raise APIError(f"cannot create {kwargs['name']}")
        container = FakeContainer(self.client, kwargs["name"], image, command, kwargs)
        self.client.created.append(("container", container.name, kwargs))
        self.items.append(container)
        return container

    def list(self, all: bool = False, filters: dict | None = None, ignore_removed: bool = False) -> list[FakeContainer]:
        return [c for c in self.items if _matches(c.labels, filters)]


class FakeAPI:
    """The low-level exec API: exec_create records the command, exec_start streams (stdout, stderr) chunks."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.created: list[dict] = []

    def create_endpoint_config(self, ipv4_address: str) -> dict:
        return {"IPAMConfig": {"IPv4Address": ipv4_address}}

    def exec_create(self, container: str, cmd: list[str], environment: dict | None = None, **options: Any) -> dict:
        self.created.append({"container": container, "cmd": cmd, "environment": environment or {}, **options})
        return {"Id": f"exec-{len(self.created)}"}

    def exec_start(self, exec_id: str, stream: bool = False, demux: bool = False, socket: bool = False) -> Any:
        if socket:  # a kept-open shell (ExecShell): its scripts are played by the client's answer()
            container_id = self.created[int(exec_id.removeprefix("exec-")) - 1]["container"]
            return FakeShellSocket(self.client, next(c for c in self.client.containers.items if c.id == container_id))
        if not stream:
            return b""
        return iter([(b"pid 4242\n", None), (b"hello\n", None)])

    def exec_inspect(self, exec_id: str) -> dict:
        return {"Running": False, "ExitCode": 0}


class FakeShellSocket:
    """The hijacked socket of an exec'd `sh`: each script written to it (in testbed.fabric.kept_shell's form) is
    recorded in client.execs line by line as argv and played by client.answer(); the reply comes back as one
    docker stream frame holding the output and the marker line."""

    def __init__(self, client: FakeClient, container: FakeContainer) -> None:
        self.client, self.container, self.out = client, container, b""

    def sendall(self, data: bytes) -> None:
        text = data.decode()
        body = text.split("\nset -e\n", 1)[1].split("\n) </dev/null", 1)[0]
        marker = text.rsplit("echo ", 1)[1].split()[0]
        code, output = 0, b""
        for line in body.splitlines():
            argv = shlex.split(line)
            self.client.execs.append((self.container.name, argv))
            code, output = self.client.answer(self.container, argv)
            if code:
                break
        payload = output + b"\n" + f"{marker} {code}\n".encode()
        self.out += bytes([1, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload

    def settimeout(self, seconds: float) -> None:
        pass

    def recv(self, size: int) -> bytes:
        chunk, self.out = self.out[:size], self.out[size:]
        return chunk

    def close(self) -> None:
        pass


class FakeClient:
    """`answer(container, argv) -> (code, output)` plays what runs inside; by default the router agent."""

    def __init__(self, shaper: str = "netem", answer: Callable | None = None,
                 start_as: Callable[[FakeContainer], str] | None = None, fail_create: str | None = None) -> None:
        self.networks = FakeNetworks(self)
        self.containers = FakeContainers(self)
        self.api = FakeAPI(self)
        self.created: list[tuple[str, str, Any]] = []
        self.removed: list[str] = []
        self.execs: list[tuple[str, list[str]]] = []
        self.shaper, self.start_as, self.fail_create = shaper, start_as, fail_create
        self.answer = answer or self.router_agent

    def router_agent(self, container: FakeContainer, argv: list[str]) -> tuple[int, bytes]:
        if argv[:1] == ["cat"]:
            return 0, json.dumps({"shaper": self.shaper, "delay_line": None, "params": {}}).encode()
        if argv[-1] == "counters":
            dc = container.labels["testbed.dc"]
            peers = [c.labels["testbed.dc"] for c in self.containers.items
                     if c.labels.get("testbed.role") == "router" and c.labels["testbed.dc"] != dc]
            return 0, json.dumps({f"{dc}->{peer}": {"tx_bytes": 1000, "tx_packets": 10, "rx_bytes": 2000,
                                                    "rx_packets": 20, "qdisc_drops": 0} for peer in peers}).encode()
        if argv[-1] == "lateness":
            return 0, b"{}"
        return 0, b""

    def close(self) -> None:
        pass
