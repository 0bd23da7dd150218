"""A fork server (Android's zygote): imports what a program needs once, then forks a copy of itself for every
command, each entering its node's network namespace before any socket exists, so that many ranks share one
process's pages copy-on-write instead of each importing torch afresh.

    python -m testbed.agents.forkserver FD PRELOAD

FD is one end of a socketpair the controller keeps the other end of; PRELOAD is a module imported once before
the first fork (the workload's `testbed.workload.preload`: torch, the training loop, the corpus). Messages are
JSON lines. The server says {"ready": true, "pid": P, "threads": T} once it has imported PRELOAD (T: its
threads then; forking copies only the calling thread, so T must be 1). The controller asks

    {"spawn": ID, "netns": NAME, "module": MODULE, "args": [...], "env": {...}, "log": PATH}

(NAME null: the child stays in the server's own namespace, as ranks on loopback do)

and the server forks a child that: becomes the leader of a new session (the controller signals its group), dies
with the server (PR_SET_PDEATHSIG), enters /run/netns/NAME, sends stdout and stderr to PATH (truncated) and
reads /dev/null, replaces its environment by `env`, and runs MODULE as `python -m MODULE ARGS` would (runpy);
its exit status is the module's SystemExit. The server answers {"id": ID, "pid": PID} (or {"id": ID, "error":
...}) and, when a child ends, {"exit": PID, "code": C} (C as subprocess reports it: negative for a signal).

When the controller's end closes (it exited, or was killed) or the controller's process is gone, the server
SIGKILLs every child's group, reaps them and exits: nothing outlives the run. Standard library only (and the
bootstrap's setns); PRELOAD is imported by name, so this module depends on no workload.
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
PR_SET_PDEATHSIG = 1
POLL_S = 0.2  # also woken by SIGCHLD


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _exit_code(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _child(request: dict, server: int, wakeup: tuple[int, int]) -> int:
    """In the forked child: become the rank `request` describes and run it; its exit status."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in wakeup:
        os.close(fd)
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # the server died between fork and prctl
        return 1
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh python has them (SIGPIPE stays ignored)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
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


def _spawn(sock: socket.socket, request: dict, children: set[int], wakeup: tuple[int, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            sock.close()
            code = _child(request, server, wakeup)
        except BaseException:  # anything the rank raised: its traceback goes to its log
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    children.add(pid)
    _send(sock, {"id": request["spawn"], "pid": pid})


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _kill_all(children: set[int]) -> None:
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    children.clear()


def serve(sock: socket.socket, controller: int) -> int:
    """Fork what the controller asks for; report each child's end as soon as SIGCHLD says it came (the order of
    the reports is the order the ranks died in: the runner names the first)."""
    children: set[int] = set()
    pending = b""
    wakeup = os.pipe()
    for fd in wakeup:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wakeup[1])
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    try:
        while True:
            readable, _, _ = select.select([sock, wakeup[0]], [], [], POLL_S)
            if wakeup[0] in readable:
                try:
                    os.read(wakeup[0], 4096)
                except BlockingIOError:
                    pass
            if sock in readable:
                data = sock.recv(1 << 16)
                if not data:
                    return 0  # the controller closed its end: the run is over
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    try:
                        _spawn(sock, request, children, wakeup)
                    except OSError as error:
                        _send(sock, {"id": request.get("spawn"), "error": str(error)})
            _reap(sock, children)
            if os.getppid() != controller:
                return 0  # the controller is gone (killed) even if a copy of its end lingers
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        _kill_all(children)


def main(args: list[str]) -> int:
    if len(args) != 2:
        print(f"usage: python -m {MODULE} FD PRELOAD_MODULE", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(args[0]))
    controller = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller stops us by closing its end
    importlib.import_module(args[1])
    threads = len(os.listdir("/proc/self/task"))
    gc.collect()
    gc.disable()  # children re-enable it; frozen objects are never scanned, so their pages stay shared
    gc.freeze()
    _send(sock, {"ready": True, "pid": os.getpid(), "threads": threads})
    return serve(sock, controller)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
