"""The workload tests' ranks are forked from one process that imported torch once (as the runner's fork launcher
does on netns): a fresh python per rank pays torch's import again, seconds each on two cores, in every launch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.fabric.forkserver import ForkServer
from testbed.runner.ranks import server_env
from testbed.workload.local import Rank, Spawn, exec_rank

_server: list[ForkServer] = []  # the session's fork server, once rank_forks has started it


def _fork(module: str, args: list[str], env: dict[str, str], log: Path) -> Rank:
    return _server[0].spawn("rank", module, args, env, log)


def spawner() -> Spawn:
    """How this session's launches start ranks: forked once rank_forks runs, else fresh pythons."""
    return _fork if _server else exec_rank


@pytest.fixture(scope="session", autouse=True)
def rank_forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    log = tmp_path_factory.mktemp("forkserver") / "forkserver.log"
    server = ForkServer.local("testbed.workload.preload", log, server_env(), namespace=lambda node: None)
    _server.append(server)
    try:
        yield
    finally:
        _server.clear()
        server.close()
