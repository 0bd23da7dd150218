"""A process started in a container with the docker API's exec, that looks like subprocess.Popen to the
runner and the probe (poll, wait, communicate, kill; stdout/stderr to a file, PIPE, DEVNULL or ours).

The exec runs the one bootstrap (testbed.agents.bootstrap, as `python -c`): it makes the command the leader of a
new session, prints its pid on the first line and execs it, so `kill` can signal the whole group from the
container's kept-open shell (portable: no host pid, which Docker Desktop's VM would hide). Output arrives on one stream per exec,
demultiplexed by a thread.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from testbed.agents import bootstrap
from testbed.fabric.kept_shell import ShellEnded, run_script
from testbed.fabric.process import PopenLike, recv_some, signal_group_line


class ExecError(RuntimeError):
    pass


def _sink(target: Any, err: bool, owned: list[IO[bytes]]) -> tuple[IO[bytes] | None, IO | None]:
    """(where the pump writes, what the caller reads) for one of Popen's stdout/stderr arguments; pipes the
    pump must close at the end (so readers see EOF) go to `owned`."""
    if target == subprocess.PIPE:
        read, write = os.pipe()
        owned.append(os.fdopen(write, "wb", buffering=0))
        return owned[-1], os.fdopen(read, "rb")
    if target == subprocess.DEVNULL:
        return None, None
    if target is None:
        return (sys.stderr if err else sys.stdout).buffer, None
    return target, None


class DockerProcess(PopenLike):
    """argv running inside `container` (a docker SDK Container); see the module docstring."""

    def __init__(self, api: Any, container: str, argv: list[str], *, env: dict[str, str], cwd: str | None = None,
                 mkdirs: tuple[str, ...] = (), stdout: Any = None, stderr: Any = None, text: bool = False,
                 shell: Callable[[], ExecShell]) -> None:
        """`shell`: the container's kept-open shell, which signals go through (an exec costs 0.15-0.2 s)."""
        self.api, self.container, self.argv, self._shell = api, container, argv, shell
        self.returncode: int | None = None
        spec = {"argv": list(argv), "cwd": cwd, "mkdirs": [*mkdirs, *((cwd,) if cwd else ())], "session": True,
                "pid": True}
        self.exec_id = api.exec_create(container, ["python", "-c", bootstrap.source(), json.dumps(spec)],
                                       environment=env)["Id"]
        self._stream = api.exec_start(self.exec_id, stream=True, demux=True)
        first, early_err = b"", b""
        for out, err in self._stream:
            early_err += err or b""
            first += out or b""
            if b"\n" in first:
                break
        line, _, rest = first.partition(b"\n")
        if not line.startswith(b"pid ") or not line[4:].strip().isdigit():
            detail = (early_err or first).decode(errors="replace").strip().splitlines()[-1:]
            raise ExecError(f"{container}: could not start {argv[0]}: {' '.join(detail) or 'no output'}")
        self.pid = int(line[4:])
        self._owned: list[IO[bytes]] = []
        out_sink, self.stdout = _sink(stdout, False, self._owned)
        if stderr == subprocess.STDOUT:
            err_sink, self.stderr = out_sink, None
        else:
            err_sink, self.stderr = _sink(stderr, True, self._owned)
        if text:
            self.stdout = _text(self.stdout)
            self.stderr = _text(self.stderr)
        self._pump = threading.Thread(target=self._run_pump, args=(rest, early_err, out_sink, err_sink), daemon=True)
        self._pump.start()

    def _run_pump(self, rest: bytes, early_err: bytes, out_sink: IO[bytes] | None, err_sink: IO[bytes] | None) -> None:
        def write(sink: IO[bytes] | None, data: bytes | None) -> None:
            if sink is not None and data:
                sink.write(data)
                sink.flush()

        try:
            write(out_sink, rest)
            write(err_sink, early_err)
            for out, err in self._stream:
                write(out_sink, out)
                write(err_sink, err)
        except Exception:  # the connection dropped: poll() asks the engine for the exit code
            pass
        finally:
            for pipe in self._owned:
                pipe.close()

    def poll(self) -> int | None:
        if self.returncode is None and not self._pump.is_alive():
            info = self.api.exec_inspect(self.exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                code = -9 if code is None else code
                self.returncode = -(code - 128) if code > 128 else code  # 128+N: ended by signal N
        return self.returncode

    def send_signal(self, signal_name: str) -> None:
        """Signal the process's group (the command and its children), else the process alone: a `kill` written
        to the container's kept-open shell."""
        if self.poll() is not None:
            return
        self._shell().script([signal_group_line(signal_name, self.pid)])


STDOUT, STDERR = 1, 2  # docker's stream numbers in a frame's header


def split_frames(raw: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The complete frames at the start of `raw` (docker's stream protocol of an exec without a tty: an 8-byte
    header, stream and length, then the bytes) as (stream, payload), and the incomplete rest."""
    frames, offset = [], 0
    while len(raw) - offset >= 8:
        size = int.from_bytes(raw[offset + 4: offset + 8], "big")
        if len(raw) - offset - 8 < size:
            break
        frames.append((raw[offset], raw[offset + 8: offset + 8 + size]))
        offset += 8 + size
    return frames, raw[offset:]


def _text(stream: IO[bytes] | None) -> IO[str] | None:
    import io

    return io.TextIOWrapper(stream, errors="replace") if stream is not None else None


def exec_socket(api: Any, exec_id: str) -> tuple[Any, Any]:
    """Start exec `exec_id`: its hijacked socket, and what docker-py returned, which its user must keep as long.
    That object holds the HTTP response; when a full garbage collection takes it (the fault driver collects the
    heap before its clock starts), the response closes the socket under whoever uses it: "[Errno 9] Bad file
    descriptor" (CI, 2026-11-27: a router's kept shell; here, two shells opened at once in a loop with a
    gc.collect() before their second script every third time failed 3 of 60, all after a collection)."""
    returned = api.exec_start(exec_id, socket=True)
    return getattr(returned, "_sock", returned), returned


class ExecShell:
    """A `sh` kept open in a container by one docker exec, its stdin and output on the exec's hijacked socket
    (frames of docker's stream protocol: an 8-byte header, stream and length, then the bytes): `script` writes
    to it (testbed.fabric.kept_shell), so a change costs no new exec. Thread-safe; reopened after it ends."""

    def __init__(self, api: Any, container: str) -> None:
        self.api, self.container = api, container
        self._sock: Any = None
        self._keep: Any = None  # what exec_start returned: it keeps the socket open (exec_socket)
        self._raw = b""
        self._lock = threading.Lock()

    def _open(self) -> Any:
        if self._sock is None:
            exec_id = self.api.exec_create(self.container, ["sh"], stdin=True, stdout=True, stderr=True,
                                           tty=False)["Id"]
            (self._sock, self._keep), self._raw = exec_socket(self.api, exec_id), b""
        return self._sock

    def _recv(self, seconds: float) -> bytes:
        """The payload of the frames complete within `seconds` (b"" when none came or the exec ended)."""
        while True:
            frames, self._raw = split_frames(self._raw)
            payload = b"".join(data for _, data in frames)
            if payload:
                return payload
            chunk = recv_some(self._sock, seconds)
            if not chunk:
                return b""
            self._raw += chunk

    def script(self, lines: list[str], timeout: float = 30.0) -> tuple[int, str]:
        """Run shell `lines` (set -e) in the kept shell: (exit code, stdout and stderr together)."""
        with self._lock:
            sock = self._open()
            try:
                return run_script(sock.sendall, self._recv, lines, timeout)
            except (ShellEnded, OSError) as error:
                self.close()
                raise ExecError(f"{self.container}: the kept shell {error}") from None

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = self._keep = None


class ExecChannel:
    """A command in a container whose stdin and stdout are a channel (testbed.fabric.forkserver.Channel): what it
    writes to stdout comes back as bytes, its stderr goes to `log`. Closing ours closes its stdin."""

    def __init__(self, api: Any, container: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        exec_id = api.exec_create(container, argv, stdin=True, stdout=True, stderr=True, tty=False,
                                  environment=env)["Id"]
        self._sock, self._keep = exec_socket(api, exec_id)
        self._raw = b""
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")

    def send(self, data: bytes) -> None:
        self._sock.settimeout(30.0)
        self._sock.sendall(data)

    def recv(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            frames, self._raw = split_frames(self._raw)
            out = b""
            for stream, data in frames:
                if stream == STDERR:
                    self._log.write(data)
                    self._log.flush()
                else:
                    out += data
            if out:
                return out
            chunk = recv_some(self._sock, deadline - time.monotonic())
            if not chunk:
                return chunk
            self._raw += chunk

    def close(self) -> None:
        """Half-close first (as docker's CLI ends an exec's stdin): the SDK's response keeps a reference to the
        socket, so close() alone may leave the connection, and the server, up until a garbage collection. Then let
        the response go, as ExecShell.close does."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        self._keep = None
        self._log.close()
