"""The one bootstrap every backend starts a command in a node through: enter, prepare, exec.

    python -m testbed.agents.bootstrap SPEC     the netns backend and `testbed exec` (SPEC: JSON)
    python -c "<this file>" SPEC                a docker exec (nothing of testbed needs to be importable there)
    python -c "<this file>" -                   an ssh host: SPEC is the first line of stdin, so the environment
                                                never appears on a command line or in `ps`

SPEC keys, applied in this order: "netns" (enter /run/netns/NAME), "mkdirs", "cwd", "env" (added to the
environment), "session" (become the leader of a new session, so the whole group can be signalled), "pid" (print
"pid N" before the exec: N is the process that becomes argv), then exec "argv". With "log" the command is
detached instead: a double fork into a new session, stdin from /dev/null, output appended to the log, and
"pid N" names the detached process (the delay line outlives the ssh session that started it). Read from stdin, the
SPEC is all the command gets there (its stdin becomes /dev/null) unless "stdin" is true: then it reads what follows
the SPEC's line (a fork server's requests; nothing may be sent before "pid N" came back, as Python's buffered read
of the line may take more).

Standard library only, and setns through ctypes rather than pyroute2: this starts every rank, probe and delay
line, pyroute2 takes a few hundred milliseconds to import, and an ssh host may not have it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MODULE = "testbed.agents.bootstrap"
CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"


def enter(name: str) -> None:
    """Move the calling thread into network namespace `name` (a file under /run/netns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_RUN_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def argv_in(netns: str, argv: list[str]) -> list[str]:
    """The command line that runs `argv` inside network namespace `netns` (from this machine)."""
    return [sys.executable, "-m", MODULE, json.dumps({"netns": netns, "argv": list(argv)})]


def source() -> str:
    """This file's text, for `python -c` where testbed is not importable (a container, a host)."""
    with open(__file__) as src:
        return src.read()


def _detach(argv: list[str], env: dict[str, str], log: str) -> int:
    """Run argv as the grandchild of a new session writing to `log`; print its pid and return at once."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(write, str(os.getpid()).encode())
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            try:
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        os._exit(0)
    os.close(write)
    sys.stdout.write(f"pid {os.read(read, 32).decode()}\n")
    sys.stdout.flush()
    return 0


def run(spec: dict, from_stdin: bool = False) -> int:
    """Prepare as `spec` says and exec its argv (returns only when detaching, or raises OSError)."""
    argv = list(spec["argv"])
    if spec.get("netns"):
        enter(spec["netns"])
    for path in spec.get("mkdirs") or ():
        os.makedirs(path, exist_ok=True)
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    if from_stdin and not spec.get("stdin"):  # the spec was all it had to say: the command reads nothing from there
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    if spec.get("log"):
        return _detach(argv, env, spec["log"])
    if spec.get("session"):
        try:
            os.setsid()
        except OSError:  # already a group leader
            pass
    if spec.get("pid"):
        sys.stdout.write(f"pid {os.getpid()}\n")
        sys.stdout.flush()
    os.execvpe(argv[0], argv, env)
    return 0  # not reached


def main(args: list[str]) -> int:
    if len(args) != 1:
        print(f"usage: python -m {MODULE} SPEC_JSON|-", file=sys.stderr)
        return 2
    from_stdin = args[0] == "-"
    spec = json.loads(sys.stdin.readline() if from_stdin else args[0])
    try:
        return run(spec, from_stdin)
    except OSError as error:
        where = f"{spec['netns']}: " if spec.get("netns") else ""
        print(f"bootstrap: {where}{spec['argv'][0]}: {error.strerror or error}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
