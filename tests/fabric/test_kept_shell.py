"""The kept-open shell's protocol (testbed.fabric.kept_shell) against a real local `sh`, and the docker exec
shell's reading of docker's framed stream, split anywhere."""

from __future__ import annotations

import os
import select
import socket
import subprocess

import pytest

from testbed.fabric.docker.process import ExecChannel, ExecShell
from testbed.fabric.kept_shell import ShellEnded, run_script


@pytest.fixture
def shell():
    proc = subprocess.Popen(["sh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def send(data: bytes) -> None:
        proc.stdin.write(data)
        proc.stdin.flush()

    def recv(seconds: float) -> bytes:
        ready, _, _ = select.select([proc.stdout], [], [], seconds)
        return os.read(proc.stdout.fileno(), 65536) if ready else b""

    yield proc, send, recv
    proc.kill()
    proc.wait()


def test_a_script_answers_with_its_output_and_exit_code_and_the_shell_goes_on(shell):
    proc, send, recv = shell
    assert run_script(send, recv, ["echo one", "echo two >&2"], 5) == (0, "one\ntwo\n")
    code, output = run_script(send, recv, ["echo before", "false", "echo never"], 5)  # set -e: stops at false
    assert code == 1 and "before" in output and "never" not in output
    assert run_script(send, recv, ["printf 'no newline'", "exit 7"], 5) == (7, "no newline")
    assert run_script(send, recv, ["cat"], 5) == (0, "")  # stdin is /dev/null: nothing read from the channel
    assert proc.poll() is None


def test_a_script_that_outlasts_its_timeout_or_a_shell_that_ended_is_shell_ended(shell):
    proc, send, recv = shell
    with pytest.raises(ShellEnded, match=r"within 0\.3 s"):
        run_script(send, recv, ["sleep 2"], 0.3)
    proc.kill()
    proc.wait()
    with pytest.raises((ShellEnded, BrokenPipeError)):  # the pipe breaks, or the output ends without a marker
        run_script(send, recv, ["true"], 1)


class _Socket:
    """Hands out the bytes it was given in the chunk sizes it was given."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def settimeout(self, seconds: float) -> None:
        pass

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def close(self) -> None:
        self.chunks = []

    def shutdown(self, how: int) -> None:
        self.shut = how


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


@pytest.mark.parametrize("cut", [1, 3, 8, 9, 13, 1000])
def test_the_exec_shell_reads_docker_frames_split_anywhere(cut):
    stream = frame(1, b"hello ") + frame(2, b"from stderr\n") + frame(1, b"")
    chunks = [stream[i:i + cut] for i in range(0, len(stream), cut)]
    shell = ExecShell(api=None, container="c")
    shell._sock = _Socket(chunks)
    got = b""
    while chunk := shell._recv(1.0):
        got += chunk
    assert got == b"hello from stderr\n"


@pytest.mark.parametrize("cut", [1, 3, 8, 9, 13, 1000])
def test_a_fork_servers_exec_channel_returns_stdout_and_logs_stderr(cut, tmp_path):
    """A fork server in a container talks on stdout; what it says on stderr (an import's warning) goes to its
    log, never into its messages, however docker's frames are split."""
    stream = frame(2, b"warning: x\n") + frame(1, b'{"ready": ') + frame(2, b"more\n") + frame(1, b"true}\n")
    chunks = [stream[i:i + cut] for i in range(0, len(stream), cut)]
    sock = _Socket(chunks)

    class Api:
        def exec_create(self, container, argv, **kwargs):
            assert kwargs["stdin"] and not kwargs["tty"]
            return {"Id": "e"}

        def exec_start(self, exec_id, socket):
            return sock

    channel = ExecChannel(Api(), "c", ["python"], {}, tmp_path / "server.log")
    got = b""
    while chunk := channel.recv(1.0):
        got += chunk
    channel.close()
    assert got == b'{"ready": true}\n'
    assert (tmp_path / "server.log").read_bytes() == b"warning: x\nmore\n"
    assert sock.shut == socket.SHUT_WR  # the exec's stdin ends: the SDK may keep the socket itself open
