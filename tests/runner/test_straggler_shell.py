"""A straggler's loop started through a node's kept-open shell (docker, ssh: testbed.runner.straggler.ShellStraggler),
here against a local `sh` written to as the fabrics write to theirs (testbed.fabric.kept_shell): the start returns
once the first STOP is sent, the loop ends by itself at its end, stop() ends it early and says the rank was
continued, the loop ends (the rank continued) when its shell exits, and a rank that is not there or a window too
short to slow anything is an error, not a fault applied. No root: the "rank" is a sleeping child of this test."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from testbed.fabric.kept_shell import run_script
from testbed.runner.straggler import PERIOD_S, ShellStraggler, Straggler, start_straggler
from testbed.waiting import wait_for


def state(pid: int) -> str | None:
    """/proc/PID/stat's state letter (Z: ended, not yet reaped), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def gone(pid: int) -> bool:
    return state(pid) in (None, "Z")


class KeptShell:
    """A fabric with one kept-open local `sh` for every node (what docker and ssh keep per container or host)."""

    node_shells = True

    def __init__(self) -> None:
        self.shell = subprocess.Popen(["sh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.scripts = 0

    def node_script(self, node: str, lines: list[str], timeout: float = 30.0) -> tuple[int, str]:
        def send(data: bytes) -> None:
            self.shell.stdin.write(data)
            self.shell.stdin.flush()

        def recv(seconds: float) -> bytes:
            ready, _, _ = select.select([self.shell.stdout], [], [], seconds)
            return os.read(self.shell.stdout.fileno(), 65536) if ready else b""

        self.scripts += 1
        return run_script(send, recv, lines, timeout)

    def close(self) -> None:
        """What a closed channel does to the far shell: its stdin ends, it exits."""
        self.shell.stdin.close()
        self.shell.wait(timeout=5)


@pytest.fixture
def fabric():
    kept = KeptShell()
    yield kept
    if kept.shell.poll() is None:
        kept.shell.kill()
        kept.shell.wait()


@pytest.fixture
def rank():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a group leader, as ranks are
    yield proc.pid
    proc.kill()
    proc.wait()


def test_the_loop_starts_through_the_kept_shell_and_ends_by_itself(fabric, rank):
    until = time.time() + 0.6
    loop = start_straggler(fabric, "east-0", rank, 4, until)
    assert isinstance(loop, ShellStraggler) and fabric.scripts == 1  # one script, no new process from here
    assert wait_for(lambda: state(rank) == "T", 1.0)  # its first STOP was sent before the start returned
    assert state(loop.loop) not in (None, "Z")  # in the background, the shell free again
    assert fabric.node_script("east-0", ["echo free"]) == (0, "free\n")
    # no period starts that would end after `until`: it has ended by then, the rank continued
    assert wait_for(lambda: gone(loop.loop), until - time.time() + 0.3)
    assert time.time() <= until + 0.3 and state(rank) != "T"
    began = time.monotonic()
    assert loop.stop() and time.monotonic() - began < 1.0
    assert fabric.shell.poll() is None


def test_stopped_early_the_loop_ends_at_once_and_the_rank_is_continued(fabric, rank):
    loop = start_straggler(fabric, "east-0", rank, 10, time.time() + 30)
    assert wait_for(lambda: state(rank) == "T", 1.0)  # stopped 90 ms of every 100: stop() must continue it
    began = time.monotonic()
    assert loop.stop() and time.monotonic() - began < 1.0
    assert gone(loop.loop) and state(rank) != "T"
    time.sleep(2 * PERIOD_S)
    assert state(rank) != "T"  # nothing stops it any more
    assert loop.stop()  # again: nothing to end, the rank still running


def test_the_loop_ends_with_the_kept_shell_and_continues_the_rank(fabric, rank):
    """The runner dies (or closes the shell): the channel closes, the far shell exits, the loop follows within a
    period instead of slowing the rank until its end."""
    loop = start_straggler(fabric, "east-0", rank, 10, time.time() + 30)
    fabric.close()
    assert wait_for(lambda: gone(loop.loop), 1.0)
    assert state(rank) != "T"


def test_a_loop_that_cannot_slow_anything_is_an_error_not_a_fault_applied(fabric, rank):
    with pytest.raises(RuntimeError, match="window ends before a period"):
        start_straggler(fabric, "east-0", rank, 4, time.time() + PERIOD_S / 2)
    assert state(rank) != "T"
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(RuntimeError, match=f"no process {dead.pid} to slow"):
        start_straggler(fabric, "east-0", dead.pid, 4, time.time() + 5)


def test_without_kept_shells_the_loop_is_a_process_in_the_node(rank):
    """netns: the loop is started as a process in the node (here: this machine), and ended as one."""

    class Local:
        node_shells = False

        def popen(self, node: str, argv: list[str], **kwargs) -> subprocess.Popen:
            return subprocess.Popen(argv, **kwargs)

    loop = start_straggler(Local(), "east-0", rank, 10, time.time() + 30)
    assert isinstance(loop, Straggler) and wait_for(lambda: state(rank) == "T", 1.0)
    began = time.monotonic()
    assert loop.stop() and time.monotonic() - began < 1.0 and state(rank) != "T"


def test_docker_and_ssh_keep_a_shell_on_each_node_and_netns_does_not():
    from testbed.fabric.docker.fabric import DockerFabric
    from testbed.fabric.netns.fabric import NetnsFabric
    from testbed.fabric.ssh.fabric import SshFabric

    assert DockerFabric.node_shells and SshFabric.node_shells and not NetnsFabric.node_shells


def test_a_node_containers_main_process_reaps_what_exits_under_it():
    """A container's PID 1 (`router idle`) inherits the straggler loops its kept shell started in the background;
    they must not stay zombies until the container goes."""
    import sys
    import textwrap

    code = textwrap.dedent("""
        import os, time
        from testbed.agents import router
        if {reap}:
            router.reap_children()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        time.sleep(0.3)
        print(os.path.exists(f"/proc/{{pid}}"))
    """)
    for reap, still_there in ((True, "False"), (False, "True")):
        out = subprocess.run([sys.executable, "-c", code.format(reap=reap)], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
        assert out == still_there
