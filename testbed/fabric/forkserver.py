"""The controller's side of testbed.agents.forkserver, for backends whose nodes share this machine's kernel (netns):
start the server once per run, ask it for one rank at a time, and see each rank as a process (PopenLike) that
the runner polls, signals and reaps as it does one it exec'd."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from testbed.agents import forkserver
from testbed.fabric.errors import FabricError
from testbed.fabric.process import PopenLike

READY_TIMEOUT_S = 120.0  # importing torch on a busy 2-core machine
LOST = -signal.SIGKILL  # a rank whose server died: its PR_SET_PDEATHSIG killed it


class ForkServer:
    """One fork server per run; `namespace` maps a node's name to its network namespace (None: the server's own,
    for ranks on loopback)."""

    def __init__(self, preload: str, log: Path, env: dict[str, str],
                 namespace: Callable[[str], str | None]) -> None:
        self.namespace = namespace
        self.exits: dict[int, int] = {}  # pid -> exit status, in the order the server reported them
        self.live: set[int] = set()
        self.dead = False
        self._pending = b""
        self._replies: list[dict] = []
        ours, theirs = socket.socketpair()
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        with open(log, "wb") as out:
            try:
                self.proc = subprocess.Popen([sys.executable, "-m", forkserver.MODULE, str(theirs.fileno()), preload],
                                             pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                theirs.close()
        self.sock = ours
        try:
            ready = self._reply(READY_TIMEOUT_S)
            if ready.get("threads") != 1:
                raise FabricError(f"fork server: {ready.get('threads')} threads after importing {preload} "
                                  "(a fork copies only one: it must have started none)")
        except BaseException:
            self.close()
            raise

    # --- messages -------------------------------------------------------------------------------------
    def _take(self, message: dict) -> None:
        if "exit" in message:
            self.exits[message["exit"]] = message["code"]
            self.live.discard(message["exit"])
        else:
            self._replies.append(message)

    def _read(self, timeout: float) -> bool:
        """Take what the server has sent, waiting up to `timeout` s for something (0: not at all); whether
        anything came. EOF marks the server dead."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return False
        except OSError:
            data = b""
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
        self.live.clear()

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

    def pump(self) -> None:
        """Take every exit the server has reported so far (never blocks)."""
        while not self.dead and self._read(0):
            pass

    # --- ranks ----------------------------------------------------------------------------------------
    def spawn(self, node: str, module: str, args: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
        """Fork `python -m module args` into `node` with exactly `env`, its output to `log`."""
        if self.dead:
            raise FabricError(f"fork server died (see {self.log})")
        request = {"spawn": node, "netns": self.namespace(node), "module": module, "args": list(args),
                   "env": env, "log": str(log)}
        self.sock.settimeout(30.0)
        try:
            self.sock.sendall((json.dumps(request) + "\n").encode())
        except OSError:
            self._lost()
            raise FabricError(f"fork server died (see {self.log})") from None
        reply = self._reply(30.0)
        if "error" in reply:
            raise FabricError(f"{node}: fork failed: {reply['error']}")
        self.live.add(reply["pid"])
        return ForkedProcess(self, reply["pid"], [sys.executable, "-m", module, *args])

    def close(self) -> None:
        """Kill what still runs, let the server go (it kills and reaps its children when our end closes)."""
        for pid in list(self.live):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedProcess(PopenLike):
    """A rank the fork server forked: the leader of its own session; its exit status comes from the server.
    `order`: how many of the server's ranks had ended before this one (the runner names the first to die)."""

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
    def order(self) -> int | None:
        if self.poll() is None:
            return None
        return list(self.server.exits).index(self.pid)

    def send_signal(self, signal_name: str) -> None:
        if self.poll() is not None:
            return
        try:
            os.killpg(self.pid, getattr(signal, f"SIG{signal_name}"))
        except (ProcessLookupError, PermissionError):
            pass
