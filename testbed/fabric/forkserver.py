"""The controller's side of testbed.agents.forkserver: start a server (on this machine for netns, one per container
or host for docker and ssh), ask it for one rank at a time, and see each rank as a process (PopenLike) that the
runner polls, signals and reaps as it does one it exec'd.

A server is reached through a Channel: a socketpair to a local process, or a command's stdin and stdout (a docker
exec, an ssh session) that ends when the command does. A local server's ranks write their logs themselves and are
signalled here (killpg); a remote server sends their output back and signals them where it runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from testbed.agents import forkserver
from testbed.fabric import cancel
from testbed.fabric.errors import FabricError
from testbed.fabric.process import PopenLike

READY_TIMEOUT_S = 120.0  # importing torch on a busy 2-core machine
LOST = -signal.SIGKILL  # a rank whose server died: its PR_SET_PDEATHSIG killed it


class Channel(Protocol):
    """Bytes to and from one server."""

    def send(self, data: bytes) -> None:
        """All of `data`; OSError when the server is gone."""

    def recv(self, timeout: float) -> bytes | None:
        """What came within `timeout` s (None: nothing; b"": the server's end closed)."""

    def close(self) -> None:
        """Close our end and let the server go (it kills and reaps its children when our end closes)."""


class LocalChannel:
    """A server on this machine, started here with one end of a socketpair; its own output to `log`."""

    def __init__(self, preload: str, log: Path, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            try:
                self.proc = subprocess.Popen([sys.executable, "-m", forkserver.MODULE, str(theirs.fileno()), preload],
                                             pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                theirs.close()
        self.sock = ours

    def send(self, data: bytes) -> None:
        self.sock.settimeout(30.0)
        self.sock.sendall(data)

    def recv(self, timeout: float) -> bytes | None:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return None
        except OSError:
            return b""

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkServer:
    """One fork server; `namespace` maps a node's name to its network namespace (None: the server's own: ranks on
    loopback, in a container, on a host). `remote`: the server runs elsewhere, so ranks' output comes back
    through it into their logs here and their signals go through it."""

    def __init__(self, channel: Channel, log: Path, namespace: Callable[[str], str | None], remote: bool = False,
                 wait: bool = True) -> None:
        self.channel, self.log, self.namespace, self.remote = channel, log, namespace, remote
        self.exits: dict[int, int] = {}  # pid -> exit status, as the server reported them
        # pid -> (the pump that saw it end, its place among this server's reports in that pump): one server reports
        # in the order its ranks died; servers pumped together (one per node) tie within a pump
        self.deaths: dict[int, tuple[int, int]] = {}
        self.peers: list[ForkServer] = [self]  # the servers pumped together
        # one lock for the peers' channels and books: the fault driver's thread signals ranks while the runner polls
        self.lock = threading.RLock()
        self._log_for_reply: IO[bytes] | None = None  # the log of the rank whose spawn awaits its reply (remote)
        self._pumps = [0]  # how many pumps so far, shared by the peers
        self._taken = 0  # exits reported in the current pump
        self.live: set[int] = set()
        self.dead = False
        self._pending = b""
        self._replies: list[dict] = []
        self._outputs: dict[int, IO[bytes]] = {}  # pid -> its log here (remote)
        self.environ: dict[str, str] = {}  # the server's environment as it started (a remote rank's starts from it)
        self.is_ready = False
        if wait:
            self.ready()

    @classmethod
    def local(cls, preload: str, log: Path, env: dict[str, str],
              namespace: Callable[[str], str | None], wait: bool = True) -> ForkServer:
        """A server on this machine (netns, loopback); with `wait` False it is still importing when this returns."""
        return cls(LocalChannel(preload, log, env), log, namespace, wait=wait)

    def ready(self) -> None:
        """Wait for the server's first message (it has imported the preload), once; closes it on any failure.
        A spawn waits for it too: until then the server's first message is not a spawn's reply."""
        if self.is_ready:
            return
        try:
            ready = self._reply(READY_TIMEOUT_S)
            self.environ = ready.get("env", {})
            if ready.get("threads") != 1:
                raise FabricError(f"fork server: {ready.get('threads')} threads after importing the preload "
                                  "(a fork copies only one: it must have started none)")
        except BaseException:
            self.close()
            raise
        self.is_ready = True

    # --- messages -------------------------------------------------------------------------------------
    def _take(self, message: dict) -> None:
        if "out" in message:
            out = self._outputs.get(message["out"])
            if out is not None:
                out.write(message["data"].encode("latin-1"))
                out.flush()
        elif "exit" in message:
            pid = message["exit"]
            self.exits[pid] = message["code"]
            self._died(pid)
            self.live.discard(pid)
            out = self._outputs.pop(pid, None)
            if out is not None:
                out.close()
        else:
            if "id" in message and "pid" in message:  # taken here: its output and exit may come in the same read
                pid = message["pid"]
                self.exits.pop(pid, None)  # a pid the kernel gave again
                self.deaths.pop(pid, None)
                self.live.add(pid)
                if self._log_for_reply is not None:
                    self._outputs[pid], self._log_for_reply = self._log_for_reply, None
            self._replies.append(message)

    def _read(self, timeout: float) -> bool:
        """Take what the server has sent, waiting up to `timeout` s for something (0: not at all); whether
        anything came. EOF marks the server dead."""
        data = self.channel.recv(timeout)
        if data is None:
            return False
        if not data:
            self._lost()
            return False
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            self._take(json.loads(line))
        return True

    def _lost(self) -> None:
        self.dead = True
        for pid in self.live:
            self.exits.setdefault(pid, LOST)
            self._died(pid)
        self.live.clear()
        for out in self._outputs.values():
            out.close()
        self._outputs.clear()

    def _died(self, pid: int) -> None:
        self.deaths[pid] = (self._pumps[0], self._taken)
        self._taken += 1

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while not self._replies:
            if self.dead:
                tail = self.log.read_text(errors="replace").splitlines()[-8:] if self.log.exists() else []
                raise FabricError("fork server died: " + (" | ".join(tail) or f"see {self.log}"))
            left = deadline - time.monotonic()
            if left <= 0:
                raise FabricError(f"fork server did not answer in {timeout:.0f}s (see {self.log})")
            self._read(left)
        return self._replies.pop(0)

    def _send(self, message: dict) -> None:
        if self.dead:
            raise FabricError(f"fork server died (see {self.log})")
        try:
            with self.lock:
                self.channel.send((json.dumps(message) + "\n").encode())
        except OSError:
            self._lost()
            raise FabricError(f"fork server died (see {self.log})") from None

    def pump(self) -> None:
        """Take every exit (and output) this server and its peers have reported so far (never blocks)."""
        with self.lock:
            self._pumps[0] += 1
            for server in self.peers:
                server._taken = 0
                while not server.dead and server._read(0):
                    pass

    # --- ranks ----------------------------------------------------------------------------------------
    def spawn(self, node: str, module: str, args: list[str], env: dict[str, str], log: Path,
              cwd: str | None = None, mkdirs: tuple[str, ...] = ()) -> ForkedProcess:
        """Fork `python -m module args` into `node` with exactly `env` (remote: the server's own environment
        updated by `env`, as an exec'd command's there), in `cwd` after creating `mkdirs` (paths where the server
        runs), its output to `log` (here)."""
        request: dict[str, Any] = {"spawn": node, "netns": self.namespace(node), "module": module, "args": list(args),
                                   "env": {**self.environ, **env} if self.remote else env,
                                   "log": None if self.remote else str(log), "cwd": cwd, "mkdirs": list(mkdirs)}
        self.ready()
        with self.lock:
            self._log_for_reply = open(log, "wb") if self.remote else None
            try:
                self._send(request)
                reply = self._reply(30.0)
                if "error" in reply:
                    raise FabricError(f"{node}: fork failed: {reply['error']}")
            finally:
                if self._log_for_reply is not None:  # no rank took it
                    self._log_for_reply.close()
                    self._log_for_reply = None
        return ForkedProcess(self, reply["pid"], ["python" if self.remote else sys.executable, "-m", module, *args])

    def signal(self, pid: int, signal_name: str) -> None:
        """SIG`signal_name` to rank `pid`'s whole group, where it runs."""
        if self.remote:
            try:
                self._send({"signal": pid, "name": signal_name})
            except FabricError:
                pass  # the server is gone, and its ranks with it
            return
        try:
            os.killpg(pid, getattr(signal, f"SIG{signal_name}"))
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """Kill what still runs, let the server go (it kills and reaps its children when our end closes)."""
        if not self.remote:
            for pid in list(self.live):
                self.signal(pid, "KILL")
        self.channel.close()
        for out in self._outputs.values():
            out.close()
        self._outputs.clear()


Prepare = Callable[[str, dict[str, str]], tuple[dict[str, str], str | None, tuple[str, ...]]]


class NodeForkServers:
    """One server per node (a container, a host), started together; a rank is forked by its node's server.
    `prepare(node, env)`: the rank's environment there, its working directory and the directories to create."""

    @classmethod
    def start(cls, nodes: list[str], log: Path, open_channel: Callable[[str, Path], Channel],
              prepare: Prepare) -> NodeForkServers:
        """A server per node through `open_channel(node, its log)` (log's name with -NODE), all importing at once;
        those started are closed if one fails."""
        servers: dict[str, ForkServer] = {}
        try:
            for node in nodes:
                cancel.check()
                node_log = log.with_name(f"{log.stem}-{node}{log.suffix}")
                servers[node] = ForkServer(open_channel(node, node_log), node_log, lambda name: None, remote=True,
                                           wait=False)
        except BaseException:
            for server in servers.values():
                server.close()
            raise
        return cls(servers, prepare)

    def __init__(self, servers: dict[str, ForkServer], prepare: Prepare) -> None:
        self.servers, self.prepare = servers, prepare
        pumps, lock = [0], threading.RLock()
        for server in servers.values():
            server.peers, server._pumps, server.lock = list(servers.values()), pumps, lock

    def ready(self) -> None:
        """Wait until every server has imported the preload; all are closed if one fails."""
        try:
            for server in self.servers.values():
                server.ready()
        except BaseException:
            self.close()
            raise

    def spawn(self, node: str, module: str, args: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
        self.ready()
        there, cwd, mkdirs = self.prepare(node, env)
        return self.servers[node].spawn(node, module, args, there, log, cwd=cwd, mkdirs=mkdirs)

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


Forks = ForkServer | NodeForkServers  # what a fabric's fork_server() gives the runner


class ForkedProcess(PopenLike):
    """A rank a fork server forked: the leader of its own session; its exit status comes from the server.
    `order`: when it was seen to end among the run's forked ranks (the runner names the first to die; ranks of
    different nodes seen in one pump tie)."""

    def __init__(self, server: ForkServer, pid: int, argv: list[str]) -> None:
        self.server = server
        self.pid = pid
        self.argv = argv
        self.returncode: int | None = None
        self.stdout = self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump()
            self.returncode = self.server.exits.get(self.pid)
        return self.returncode

    @property
    def order(self) -> tuple[int, int] | None:
        if self.poll() is None:
            return None
        return self.server.deaths[self.pid]

    def send_signal(self, signal_name: str) -> None:
        if self.poll() is not None:
            return
        self.server.signal(self.pid, signal_name)
