"""A process on a remote host that looks like subprocess.Popen to the runner and the probe.

The remote side is the one bootstrap (testbed.agents.bootstrap as `python -c`, no shell): it reads one JSON line
from stdin (argv, env, cwd), so the environment never appears on a command line (nor in `ps`), then prints its
pid and execs argv. sshd makes every non-pty session its own process group, so `kill -- -PID` takes the
command and its children. Given a `log` file, the bootstrap double-forks into a new session writing to a log
file instead (the delay line outlives the SSH session that started it).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from testbed.agents import bootstrap
from testbed.fabric.process import PopenLike, recv_some, signal_group_line
from testbed.fabric.ssh.connection import Connection, RemoteError


class _TextReader:
    """Text lines from a paramiko binary channel file (what Popen(text=True).stdout offers)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def readline(self) -> str:
        return self._raw.readline().decode(errors="replace")

    def read(self) -> str:
        return self._raw.read().decode(errors="replace")


def _bootstrap_command(python: str, sudo: bool) -> str:
    return ("sudo -n " if sudo else "") + shlex.join([python, "-c", bootstrap.source(), "-"])


def _first_line(channel: Any) -> bytes:
    """The bootstrap's first line ("pid N" when it started the command), read a byte at a time: what follows is
    the command's own."""
    first = b""
    try:
        while not first.endswith(b"\n"):
            byte = channel.recv(1)
            if not byte:
                break
            first += byte
    except TimeoutError:  # a channel given a timeout: what came before it
        pass
    return first


def _is_pid_line(first: bytes) -> bool:
    return first.startswith(b"pid ") and first[4:].strip().isdigit()


class RemoteProcess(PopenLike):
    """argv running on `connection`'s host; stdout/stderr: a file (streamed live), PIPE, DEVNULL or None."""

    def __init__(self, connection: Connection, argv: list[str], *, env: dict[str, str], cwd: str,
                 mkdirs: tuple[str, ...] = (), sudo: bool = False, stdout: Any = None, stderr: Any = None,
                 text: bool = False, log: str | None = None) -> None:
        self.connection, self.argv, self.sudo = connection, argv, sudo
        self.returncode: int | None = None
        self.stdout: Any = None
        self.stderr: Any = None
        self._pumps: list[threading.Thread] = []
        transport = connection.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(f"host {connection.host.name}: the SSH connection is closed")
        channel = transport.open_session()
        self.channel = channel
        if stderr == subprocess.STDOUT:
            channel.set_combine_stderr(True)
        channel.exec_command(_bootstrap_command(connection.host.python, sudo))
        spec = {"argv": argv, "env": env, "cwd": cwd, "mkdirs": list(mkdirs), "log": log, "pid": True}
        channel.sendall(json.dumps(spec).encode() + b"\n")
        channel.shutdown_write()  # the command's stdin is /dev/null
        first = _first_line(channel)
        if not _is_pid_line(first):
            tail = channel.makefile_stderr("rb").read().decode(errors="replace").strip().splitlines()[-1:]
            raise RemoteError(f"host {connection.host.name}: could not start {argv[0]}: "
                              f"{' '.join(tail) or first.decode(errors='replace').strip() or 'no output'}")
        self.pid = int(first[4:])
        self._route(stdout, text, err=False)
        if stderr != subprocess.STDOUT:
            self._route(stderr, text, err=True)

    def _route(self, target: Any, text: bool, err: bool) -> None:
        channel = self.channel
        if target == subprocess.PIPE:
            raw = channel.makefile_stderr("rb") if err else channel.makefile("rb")
            setattr(self, "stderr" if err else "stdout", _TextReader(raw) if text else raw)
            return
        if target is None:
            sink: IO[bytes] | None = (sys.stderr if err else sys.stdout).buffer
        elif target == subprocess.DEVNULL:
            sink = None
        else:
            sink = target
        receive = channel.recv_stderr if err else channel.recv

        def pump() -> None:
            while True:
                data = receive(65536)
                if not data:
                    return
                if sink is not None:
                    sink.write(data)
                    sink.flush()

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        self._pumps.append(thread)

    def poll(self) -> int | None:
        if self.returncode is None and self.channel.exit_status_ready():
            code = self.channel.recv_exit_status()
            for thread in self._pumps:  # the log is complete when poll() reports the exit
                thread.join(timeout=5)
            self.returncode = -9 if code == -1 else code  # -1: ended by a signal (no exit status)
        return self.returncode

    def send_signal(self, signal_name: str) -> None:
        """Signal the remote process group (the command and its children), else the process alone, from the
        connection's kept-open shell (no new SSH session: 0.1-0.5 s each)."""
        if self.poll() is not None:
            return
        self.connection.script([signal_group_line(signal_name, self.pid)])


START_TIMEOUT_S = 60.0  # for the bootstrap's first line


class SessionChannel:
    """A command on `connection`'s host whose stdin and stdout are a channel (testbed.fabric.forkserver.Channel),
    started by the bootstrap like any other (its environment on stdin, not on a command line); its stderr goes to
    `log`. Closing ours ends the SSH session, and with it the command's stdin."""

    def __init__(self, connection: Connection, argv: list[str], *, env: dict[str, str], cwd: str,
                 mkdirs: tuple[str, ...], log: Path) -> None:
        transport = connection.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(f"host {connection.host.name}: the SSH connection is closed")
        self.channel = transport.open_session()
        self.channel.exec_command(_bootstrap_command(connection.host.python, False))
        spec = {"argv": argv, "env": env, "cwd": cwd, "mkdirs": list(mkdirs), "pid": True, "stdin": True}
        self.channel.sendall(json.dumps(spec).encode() + b"\n")
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")
        self.channel.settimeout(START_TIMEOUT_S)  # nothing more is sent before the command's first message
        first = _first_line(self.channel)
        if not _is_pid_line(first):
            self._stderr()
            self.close()
            said = first.decode(errors="replace").strip()[:80]
            raise RemoteError(f"host {connection.host.name}: could not start {argv[0]} "
                              f"({f'it said {said!r}; ' if said else ''}see {log})")

    def _stderr(self) -> None:
        while self.channel.recv_stderr_ready():
            self._log.write(self.channel.recv_stderr(65536))
        self._log.flush()

    def send(self, data: bytes) -> None:
        self.channel.settimeout(30.0)
        self.channel.sendall(data)

    def recv(self, timeout: float) -> bytes | None:
        self._stderr()
        return recv_some(self.channel, timeout)

    def close(self) -> None:
        try:
            self._stderr()
        except OSError:
            pass
        self.channel.close()
        self._log.close()
