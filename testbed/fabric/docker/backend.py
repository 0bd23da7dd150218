"""The docker backend as the registry knows it: plan with testbed.plan.containers, build with DockerFabric."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from testbed import settings
from testbed.fabric.backend import Backend, BackendOptions, Progress
from testbed.fabric.docker.engine import clean, engine_available
from testbed.fabric.docker.fabric import DockerFabric
from testbed.fabric.state import BackendState, FabricState
from testbed.plan.containers import DEFAULT_IMAGE, ContainersPlan, build_containers_plan
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology


def default_image() -> str:
    return os.environ.get(settings.IMAGE, DEFAULT_IMAGE)


class DockerOptions(BackendOptions):
    image: str = Field(default_factory=default_image)  # compose/Dockerfile's build (env TESTBED_IMAGE)
    adopt: bool = False  # use the containers `docker compose up` started; never remove them


@dataclass
class DockerState(BackendState):
    image: str = DEFAULT_IMAGE
    adopted: bool = False


class DockerBackend(Backend[ContainersPlan]):
    name: ClassVar[str] = "docker"
    summary: ClassVar[str] = "containers"
    forks_ranks: ClassVar[bool] = True  # a fork server per container
    Options = DockerOptions
    State = DockerState
    options: DockerOptions

    @classmethod
    def from_state(cls, saved: FabricState) -> DockerBackend:
        record = saved.backend_state
        assert isinstance(record, DockerState)
        return cls(DockerOptions(image=record.image, adopt=record.adopted))

    def plan(self, topology: Topology, shaper: str, prefix: str,
             overrides: dict[str, LinkParams] | None = None) -> ContainersPlan:
        """`auto` stays auto: each router decides on the docker host's kernel."""
        return build_containers_plan(topology, shaper, prefix, overrides)

    def stale(self, prefix: str, saved: FabricState | None) -> bool:
        return saved is not None and not self.options.adopt  # compose's containers are compose's to remove

    def new_state(self) -> DockerState:
        return DockerState(self.options.image, self.options.adopt)

    def make_fabric(self, prefix: str, topology: Topology, on_progress: Progress | None = None) -> DockerFabric:
        return DockerFabric(prefix, topology, self.options.image, self.options.adopt, on_progress)

    @classmethod
    def clean(cls, prefix: str, saved: FabricState | None) -> list[str]:
        """Containers and networks labelled with the prefix, unless docker compose started them (adopted)."""
        adopted = saved is not None and isinstance(saved.backend_state, DockerState) and saved.backend_state.adopted
        return clean(prefix) if not adopted and engine_available() else []
