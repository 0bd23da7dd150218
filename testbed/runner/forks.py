"""Whether a run's ranks are forked by a fork server (torch imported once) or started each by a command of its own,
and the run's fork server, ready and closed whatever happens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed.fabric import registry
from testbed.fabric.backend import Backend
from testbed.fabric.errors import FabricError
from testbed.fabric.forkserver import Forks
from testbed.fabric.lifecycle import Testbed
from testbed.runner.ranks import LAUNCHERS, PRELOAD, server_env


def launcher_forks(launcher: str, backend: str | Backend) -> bool:
    """Whether ranks of the built-in workload are forked; refuses (FabricError) fork where the backend cannot."""
    if launcher not in LAUNCHERS:
        raise FabricError(f"--launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    chosen = registry.get(backend) if isinstance(backend, str) else type(backend)
    if launcher == "fork" and not chosen.forks_ranks:
        raise FabricError(f"--launcher fork: the {chosen.name} backend starts every rank with a command of its "
                          "own (use exec or auto)")
    return launcher != "exec" and chosen.forks_ranks


@contextmanager
def fork_server(testbed: Testbed, wanted: bool, run_dir: Path,
                meanwhile: Callable[[], None] | None = None) -> Iterator[Forks | None]:
    """The run's fork server (its output in run_dir/forkserver.log), ready, closed whatever happens; None unless
    wanted. `meanwhile` runs while the server imports torch (seconds), before anything is measured."""
    forks = testbed.fabric.fork_server(PRELOAD, run_dir / "forkserver.log", server_env()) if wanted else None
    try:
        if meanwhile is not None:
            meanwhile()
        if forks is not None:
            forks.ready()
        yield forks
    finally:
        if forks is not None:
            forks.close()
