"""What the runner and probe use of subprocess.Popen, for processes that run elsewhere (a container, an SSH host)."""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from typing import Any

from testbed.waiting import wait_for


def signal_group_line(signal_name: str, pid: int) -> str:
    """A shell line that sends SIG`signal_name` to the process group led by `pid`, else to `pid` alone (not a
    leader), and succeeds when the process is already gone: for a shell kept open on the process's machine."""
    name = shlex.quote(signal_name)
    return f"kill -s {name} -- -{pid} 2>/dev/null || kill -s {name} {pid} 2>/dev/null || true"


def recv_some(sock: Any, seconds: float) -> bytes | None:
    """What a socket (docker's exec) or a paramiko channel (an SSH session) has within `seconds` (0: what is there
    now; None: nothing came; b"": it closed)."""
    sock.settimeout(max(seconds, 0.0))
    try:
        return sock.recv(65536)
    except (TimeoutError, BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


class PopenLike:
    """What the runner and probe use of subprocess.Popen, for processes elsewhere (an SSH host, a container).

    Subclasses set `argv`, `returncode`, `stdout`, `stderr` and implement poll() and send_signal(NAME)."""

    argv: list[str]
    returncode: int | None
    stdout: Any
    stderr: Any

    def poll(self) -> int | None:
        raise NotImplementedError

    def send_signal(self, signal_name: str) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        if not wait_for(lambda: self.poll() is not None, timeout):
            raise subprocess.TimeoutExpired(self.argv, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Read both pipes to the end while waiting (a full pipe would otherwise stall the process)."""
        results: dict[str, Any] = {}
        readers = [threading.Thread(target=lambda n=name, s=stream: results.__setitem__(n, s.read()), daemon=True)
                   for name, stream in (("out", self.stdout), ("err", self.stderr)) if stream is not None]
        for thread in readers:
            thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in readers:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.argv, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results.get("out"), results.get("err")

    def kill(self) -> None:
        self.send_signal("KILL")

    def terminate(self) -> None:
        self.send_signal("TERM")
