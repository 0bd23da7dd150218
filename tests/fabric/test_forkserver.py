"""The fork server reached through a command's stdin and stdout, as docker exec and ssh reach it (no root): ranks'
output comes back into their logs here, signals go through the server, servers of different nodes pumped together
tie, and closing our end ends the server and its ranks."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.agents import forkserver
from testbed.fabric.forkserver import ForkServer, NodeForkServers
from testbed.waiting import alive, wait_for


class PipeChannel:
    """A server started here with `stdio`, its stdin and stdout a pipe each (what an exec's socket carries)."""

    def __init__(self, log: Path) -> None:
        """Started in log's directory, where the tests write the modules its ranks run (`python -m` puts the
        working directory on sys.path)."""
        self.proc = subprocess.Popen([sys.executable, "-m", forkserver.MODULE, forkserver.STDIO, "json"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "wb"),
                                     cwd=log.parent, env={**os.environ, "STARTED_WITH": "this"},
                                     start_new_session=True)
        os.set_blocking(self.proc.stdout.fileno(), False)

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return os.read(self.proc.stdout.fileno(), 1 << 16) if ready else None

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def module(where: Path, name: str, code: str) -> str:
    """A module the servers started in `where` can run (as the runner's workload module is run)."""
    (where / f"{name}.py").write_text(code)
    return name


@pytest.fixture
def servers(tmp_path):
    made: list[ForkServer] = []

    def start(count: int = 1) -> list[ForkServer]:
        for i in range(count):
            made.append(ForkServer(PipeChannel(tmp_path / f"server{i}.log"), tmp_path / f"server{i}.log",
                                   lambda node: None, remote=True, wait=False))
        return made[-count:]

    yield start
    for server in made:
        server.close()
    assert all(server.channel.proc.poll() is not None for server in made)


def test_a_remote_ranks_output_environment_and_directories(servers, tmp_path):
    (server,) = servers()
    server.ready()
    made = tmp_path / "made" / "deeper"
    # its output pipe made big enough that it ends with 500 KB not yet read: the server reads it all before the exit
    rank = module(tmp_path, "rank_env", "import fcntl, os, sys\n"
                                        "fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
                                        "print(os.environ['ONLY'], sorted(os.environ), os.getcwd())\n"
                                        "print('to stderr', file=sys.stderr)\n"
                                        "print('x' * 500_000 + 'end')\n"
                                        "sys.exit(3)\n")
    proc = server.spawn("east-0", rank, [], {"ONLY": "this"}, tmp_path / "rank0.log", cwd=str(made),
                        mkdirs=(str(made),))
    assert proc.wait(timeout=30) == 3
    log = (tmp_path / "rank0.log").read_text()
    assert f"this {sorted({**server.environ, 'ONLY': 'this'})} {made}" in log and "to stderr" in log, log[:300]
    assert server.environ["STARTED_WITH"] == "this"  # what the server started with: a remote rank's basis
    assert log.endswith("x" * 1000 + "end\n"), len(log)  # all of it, before the exit was reported


def test_a_signal_goes_through_the_server_to_the_ranks_group(servers, tmp_path):
    (server,) = servers()
    server.ready()
    rank = module(tmp_path, "rank_up", "import time; print('up', flush=True); time.sleep(60)")
    proc = server.spawn("east-0", rank, [], {}, tmp_path / "rank0.log")
    assert wait_for(lambda: "up" in (tmp_path / "rank0.log").read_text() or proc.poll() is not None, 30)
    proc.send_signal("TERM")
    assert proc.wait(timeout=10) == -15


def test_ranks_of_two_nodes_seen_ending_in_one_pump_tie_and_closing_ends_everything(servers, tmp_path):
    east, west = servers(2)
    group = NodeForkServers({"east-0": east, "west-0": west}, lambda node, env: (env, None, ()))
    sleep = module(tmp_path, "rank_sleeps", "import time; time.sleep(60)")
    killed = group.spawn("east-0", sleep, [], {}, tmp_path / "rank0.log")
    failing = group.spawn("west-0", module(tmp_path, "rank_fails", "import time, sys; time.sleep(0.3); sys.exit(1)"),
                          [], {}, tmp_path / "rank1.log")
    killed.send_signal("KILL")
    time.sleep(1.5)  # both have ended, neither seen yet
    assert killed.poll() == -9 and failing.poll() == 1
    assert killed.order == failing.order  # which came first is not known: the runner prefers the signal
    left = group.spawn("west-0", sleep, [], {}, tmp_path / "rank2.log")
    assert left.poll() is None and alive(left.pid)
    group.close()
    assert wait_for(lambda: not alive(left.pid), 10)  # the server killed and reaped it when its stdin closed


class OneRead:
    """A channel whose server answers a spawn with its reply, the rank's output and its exit in one read (as a
    docker exec or sshd may hand them over when a rank fails at once)."""

    def __init__(self) -> None:
        self.waiting = [b'{"ready": true, "pid": 1, "threads": 1, "env": {}}\n']

    def send(self, data: bytes) -> None:
        if b'"spawn"' in data:
            self.waiting.append(b'{"id": "east-0", "pid": 42}\n{"out": 42, "data": "boom\\n"}\n'
                                b'{"exit": 42, "code": 2}\n')

    def recv(self, timeout: float) -> bytes | None:
        return self.waiting.pop(0) if self.waiting else None

    def close(self) -> None:
        pass


def test_a_ranks_output_and_exit_read_with_its_spawn_reply_are_kept(tmp_path):
    server = ForkServer(OneRead(), tmp_path / "server.log", lambda node: None, remote=True)
    proc = server.spawn("east-0", "rank", [], {}, tmp_path / "rank0.log")
    assert proc.poll() == 2 and (tmp_path / "rank0.log").read_text() == "boom\n"
    assert server.live == set()


def test_a_spawn_sent_while_the_server_still_imports_waits_for_it(servers, tmp_path):
    """A run starts its fork server and goes on (the report's plotting is readied while torch imports): a spawn
    before ready() must wait for the server's first message, not take it for the spawn's reply."""
    (server,) = servers()
    assert not server.is_ready
    proc = server.spawn("east-0", module(tmp_path, "rank_ok", "print('ok')"), [], {}, tmp_path / "rank0.log")
    assert server.is_ready and server.environ["STARTED_WITH"] == "this"
    assert proc.wait(timeout=30) == 0 and (tmp_path / "rank0.log").read_text() == "ok\n"
    server.ready()  # once is enough: a second call reads nothing
    assert server.live == set()
