"""A fork server (Android's zygote): imports what a program needs once, then forks a copy of itself for every
command, each entering its node's network namespace before any socket exists, so that many ranks share one
process's pages copy-on-write instead of each importing torch afresh.

    python -m testbed.agents.forkserver FD PRELOAD       on the controller's machine (netns)
    python -m testbed.agents.forkserver stdio PRELOAD    in a container or on a host (docker exec, ssh)

FD is one end of a socketpair the controller keeps the other end of; with `stdio` the messages come on stdin and
go out on stdout (whatever else writes to stdout goes to stderr instead). PRELOAD is a module imported once
before the first fork (the workload's `testbed.workload.preload`: torch, the training loop, the corpus).
Messages are JSON lines. The server says {"ready": true, "pid": P, "threads": T, "env": {...}} once it has
imported PRELOAD (T: its threads then; forking copies only the calling thread, so T must be 1; env: the
environment it started with, which a controller elsewhere builds its ranks' on). The controller asks

    {"spawn": ID, "netns": NAME, "module": MODULE, "args": [...], "env": {...}, "log": PATH,
     "cwd": DIR, "mkdirs": [DIR, ...]}            (cwd and mkdirs optional)
    {"signal": PID, "name": "STOP"}               (to a child's whole group; no answer)

(NAME null: the child stays in the server's own namespace, as ranks on loopback and in containers do)

and the server forks a child that: becomes the leader of a new session (the controller signals its group), dies
with the server (PR_SET_PDEATHSIG), sends stdout and stderr to PATH (truncated) and reads /dev/null, creates
`mkdirs`, changes to `cwd`, enters /run/netns/NAME, replaces its environment by `env`, and runs MODULE as
`python -m MODULE ARGS` would (runpy); its exit status is the module's SystemExit. With "log": null the child's
output comes back to the controller instead, as {"out": PID, "data": TEXT} (the bytes as latin-1), all of it
before that child's exit. The server answers {"id": ID, "pid": PID} (or {"id": ID, "error": ...}) and, when a
child ends, {"exit": PID, "code": C} (C as subprocess reports it: negative for a signal).

When the controller's end closes (it exited, or was killed: docker and ssh close the command's stdin) or the
controller's process is gone (FD mode), the server SIGKILLs every child's group, reaps them and exits: nothing
outlives the run. Standard library only (and the bootstrap's setns); PRELOAD is imported by name, so this module
depends on no workload.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback

from testbed.agents.bootstrap import enter

MODULE = "testbed.agents.forkserver"
STDIO = "stdio"
PR_SET_PDEATHSIG = 1
POLL_S = 0.2  # also woken by SIGCHLD
OUTPUT_CHUNK = 1 << 16


class Link:
    """The server's end of the controller's channel: a socket (FD mode) or a pair of pipe descriptors (stdio)."""

    def __init__(self, read_fd: int, write_fd: int, sock: socket.socket | None = None) -> None:
        self.read_fd, self.write_fd, self.sock = read_fd, write_fd, sock

    @classmethod
    def of_socket(cls, fd: int) -> Link:
        sock = socket.socket(fileno=fd)
        return cls(sock.fileno(), sock.fileno(), sock)

    @classmethod
    def of_stdio(cls) -> Link:
        """stdin and stdout, moved to descriptors of their own: fd 1 then goes to stderr (a stray print must not
        corrupt the messages) and fd 0 reads /dev/null."""
        read_fd, write_fd = os.dup(0), os.dup(1)
        os.dup2(2, 1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        return cls(read_fd, write_fd)

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data):]

    def recv(self) -> bytes:
        return os.read(self.read_fd, 1 << 16)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            return
        for fd in {self.read_fd, self.write_fd}:
            os.close(fd)


def _exit_code(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _child(request: dict, server: int, output: int | None) -> int:
    """In the forked child: become the rank `request` describes and run it; its exit status. `output`: the write
    end of the pipe its output goes back through (None: to the request's log file)."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # the server died between fork and prctl
        return 1
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh python has them (SIGPIPE stays ignored)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    log = output if output is not None else os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    for path in request.get("mkdirs") or ():
        os.makedirs(path, exist_ok=True)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    if request["netns"] is not None:
        enter(request["netns"])  # before any socket of the rank exists
    os.environ.clear()
    os.environ.update(request["env"])
    gc.enable()
    sys.argv = [request["module"], *request["args"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as error:
        return _exit_code(error)
    return 0


class Server:
    """The children forked so far, their output pipes (where it comes back), and the channel to the controller."""

    def __init__(self, link: Link, controller: int | None) -> None:
        self.link, self.controller = link, controller
        self.children: set[int] = set()
        self.outputs: dict[int, int] = {}  # child pid -> read end of its output pipe
        self.wakeup = os.pipe()
        for fd in self.wakeup:
            os.set_blocking(fd, False)

    def spawn(self, request: dict) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        server = os.getpid()
        output = os.pipe() if request.get("log") is None else None
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (*self.wakeup, *self.outputs.values(), *((output[0],) if output else ())):
                    os.close(fd)
                self.link.close()
                code = _child(request, server, output[1] if output else None)
            except BaseException:  # anything the rank raised: its traceback goes to its log
                traceback.print_exc()
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        self.children.add(pid)
        if output is not None:
            os.close(output[1])
            os.set_blocking(output[0], False)
            self.outputs[pid] = output[0]
        self.link.send({"id": request["spawn"], "pid": pid})

    def forward(self, pid: int, drain: bool = False) -> None:
        """Send what child `pid` wrote (all there is when `drain`, else one read); its pipe closes at EOF."""
        fd = self.outputs.get(pid)
        while fd is not None:
            try:
                data = os.read(fd, OUTPUT_CHUNK)
            except BlockingIOError:
                data = None
            if data:
                self.link.send({"out": pid, "data": data.decode("latin-1")})
            else:
                if data is not None or drain:  # EOF; or the child is gone, and what a grandchild writes is not ours
                    os.close(self.outputs.pop(pid))
                return
            if not drain:
                return

    def signal(self, request: dict) -> None:
        """A child's whole group (only a child not yet reaped: its pid is not another's yet); a child that has
        not yet made its own group (just forked) alone."""
        pid = request["signal"]
        number = getattr(signal, f"SIG{request['name']}", None)
        if pid not in self.children or number is None:
            return
        try:
            os.killpg(pid, number)
        except ProcessLookupError:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass
        except PermissionError:
            pass

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.forward(pid, drain=True)
            self.link.send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def kill_all(self) -> None:
        for pid in self.children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.children.clear()

    def handle(self, request: dict) -> None:
        if "signal" in request:
            self.signal(request)
            return
        try:
            self.spawn(request)
        except OSError as error:
            self.link.send({"id": request.get("spawn"), "error": str(error)})

    def serve(self) -> int:
        """Fork what the controller asks for; report each child's end as soon as SIGCHLD says it came (the order
        of the reports is the order the ranks died in: the runner names the first)."""
        pending = b""
        signal.set_wakeup_fd(self.wakeup[1])
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        try:
            while True:
                by_fd = {fd: pid for pid, fd in self.outputs.items()}
                readable, _, _ = select.select([self.link.read_fd, self.wakeup[0], *by_fd], [], [], POLL_S)
                if self.wakeup[0] in readable:
                    try:
                        os.read(self.wakeup[0], 4096)
                    except BlockingIOError:
                        pass
                for fd in readable:
                    if fd in by_fd:
                        self.forward(by_fd[fd])
                if self.link.read_fd in readable:
                    data = self.link.recv()
                    if not data:
                        return 0  # the controller closed its end: the run is over
                    pending += data
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        self.handle(json.loads(line))
                self.reap()
                if self.controller is not None and os.getppid() != self.controller:
                    return 0  # the controller is gone (killed) even if a copy of its end lingers
        except (BrokenPipeError, ConnectionResetError):
            return 0
        finally:
            self.kill_all()


def main(args: list[str]) -> int:
    if len(args) != 2:
        print(f"usage: python -m {MODULE} FD|{STDIO} PRELOAD_MODULE", file=sys.stderr)
        return 2
    link = Link.of_stdio() if args[0] == STDIO else Link.of_socket(int(args[0]))
    controller = None if args[0] == STDIO else os.getppid()  # a docker exec's or sshd's parent says nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller stops us by closing its end
    environ = dict(os.environ)
    importlib.import_module(args[1])
    threads = len(os.listdir("/proc/self/task"))
    gc.collect()
    gc.disable()  # children re-enable it; frozen objects are never scanned, so their pages stay shared
    gc.freeze()
    link.send({"ready": True, "pid": os.getpid(), "threads": threads, "env": environ})
    return Server(link, controller).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
