"""Backends by name: the one place a backend's name is turned into its class (Kathará's factory, containerlab's
runtime registry). Each backend package exports one class (testbed.fabric.backend.Backend); it is imported only
when its name is asked for, so `testbed --help` or a netns run never loads the docker SDK or paramiko. An
unknown name's error lists the registered ones. A new backend (a Kubernetes one, say) is one more line here."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping

from testbed.fabric.errors import FabricError

_BACKENDS: dict[str, str] = {
    "netns": "testbed.fabric.netns:NetnsBackend",  # namespaces on this machine (the default)
    "docker": "testbed.fabric.docker:DockerBackend",  # containers on a docker engine
    "ssh": "testbed.fabric.ssh:SshBackend",  # real hosts over SSH
    "slurm": "testbed.fabric.slurm:SlurmBackend",  # Slurm nodes, shaped by a Prolog or sudo -n
}
DEFAULT = "netns"


def register(name: str, target: str) -> None:
    """Add a backend: `target` is "package.module:Class" (imported when the name is first asked for)."""
    _BACKENDS[name] = target


@contextlib.contextmanager
def registered(backends: Mapping[str, str], *, only: bool = False) -> Iterator[None]:
    """`backends` (name -> "package.module:Class") registered for a `with` block, alone when `only` (the others
    hidden), and the registry put back as it was after, whatever was registered meanwhile: how a test (or a backend
    being tried out) adds one without leaving it behind."""
    saved = dict(_BACKENDS)
    if only:
        _BACKENDS.clear()
    _BACKENDS.update(backends)
    try:
        yield
    finally:
        _BACKENDS.clear()
        _BACKENDS.update(saved)


def targets() -> dict[str, str]:
    """Every registered name and its "package.module:Class", in registration order (a copy)."""
    return dict(_BACKENDS)


def names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def get(name: str) -> type:
    """The Backend class registered as `name`; a FabricError naming the registered ones otherwise."""
    target = _BACKENDS.get(name)
    if target is None:
        raise FabricError(f"--backend: expected one of {', '.join(_BACKENDS)}, got {name!r}")
    module, _, attribute = target.partition(":")
    backend = getattr(importlib.import_module(module), attribute)
    if backend.name != name:
        raise FabricError(f"backend {target} calls itself {backend.name!r}, registered as {name!r}")
    return backend


def backends() -> list[type]:
    """Every registered Backend class, in registration order (tear_down asks each of them to clean)."""
    return [get(name) for name in _BACKENDS]
