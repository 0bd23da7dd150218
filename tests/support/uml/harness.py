"""Run a command inside user-mode Linux: a 6.1 kernel with sch_netem, booted on the host's own file system.

Debian's `user-mode-linux` package gives `/usr/bin/linux.uml` and its modules under
`/usr/lib/uml/modules/<version>/`. The kernel runs as an ordinary host process (no KVM), with the host's root
file system mounted through hostfs, so the command sees this checkout and its `.venv` as they are. PID 1 is a
small shell script written here: it mounts proc, sysfs, devtmpfs and tmpfs on /run, /tmp and /dev/shm (so
nothing the command writes there reaches the host), points the kernel's module loader at the package's
modules (nothing is written under the host's /lib/modules), loads the modules asked for (ipv6 by default:
distribution kernels have it from boot), runs the command and powers off. Its output and exit status come
back through files in a host directory under /var/tmp (the run's lab), which is removed afterwards. A checkout
(or venv) under /tmp, /run or /dev/shm is bind-mounted back at its own path over the fresh tmpfs, so any path
works, spaces included.

Nothing stays when the run is stopped (tests/support/uml/reaper.py): SIGTERM and SIGHUP end it as Ctrl-C does, through
its clean-up; a watch process that outlives a SIGKILL removes the kernel and the lab; and the next run sweeps
what a killed watch left.

On a CPU with AMX, Debian's UML 6.1 cannot set its processes' extended register state back and dies at init;
there it is started under tests/support/uml/fxsave.py (FXSAVE state only, glibc's AVX functions off inside).

UML has one CPU and its timing is looser than the host's; use it to prove that a kernel path works and is
restored, and keep the host's benchmarks as the fidelity reference.

    python -m tests.support.uml.harness [--timeout S] [--mem 2G] [--modules ipv6,...] -- COMMAND [ARG...]
    python -m tests.support.uml.harness --sweep   (remove what killed runs left)
    (scripts/uml-run is the same)
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.uml import fxsave, reaper

KERNEL = Path("/usr/bin/linux.uml")
# UML's processes are host processes that the kernel (their ptrace tracer) runs; one that outlives its tracer (the
# watch or the sweep SIGKILLs the kernel, whose guest processes' command lines do not name the lab) goes on as a
# host process with the host's root: INIT's next lines then mounted tmpfs over the host's own /run, /tmp and
# /dev/shm and set the host's name to "uml" (three times on 2026-11-28: the docker engine's socket hidden,
# `poweroff -f` next in line). So the kernel is the first process of a PID namespace of its own (the host kernel
# kills every process in it when it ends; a reboot() there ends only it), in a mount namespace (private: no mount
# gets out) and a UTS namespace (its host name) of its own.
SANDBOX = ("unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "--uts", "--")
MODULES = Path("/usr/lib/uml/modules")
INSIDE_ENV = "TESTBED_IN_UML"  # set for the command: tests and benchmarks know where they run
LAB_ENV = "TESTBED_UML_LAB"  # set for the command: its run's lab directory on the host, seen through hostfs
REALTIME_ENV = "TESTBED_UML_RT"  # 0: host_realtime() asks for nothing (to measure what it changes)
REALTIME_ASKED, REALTIME_GIVEN = "realtime.asked", "realtime.given"  # files in the lab: the guest's ask, the answer
SHARE_ASKED, SHARE_GIVEN = "share.asked", "share.given"  # host_share()'s, the same way
SHARE_NICE = -20  # host_share(): the nice of UML's processes and of their session's autogroup for the block
DEFAULT_MODULES = ("ipv6",)
KEEP_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "CI", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "TESTBED_UML_RT")


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str
    seconds: float
    fp_regs_refused: bool = False  # the kernel died setting its processes' register state back (fxsave.py)


class UmlUnavailable(RuntimeError):
    """This machine cannot boot user-mode Linux; str() says why and what to install."""


def kernel_version() -> str:
    versions = sorted(p.name for p in MODULES.iterdir() if p.is_dir()) if MODULES.is_dir() else []
    if not versions:
        raise UmlUnavailable(f"no UML kernel modules under {MODULES} (apt-get install user-mode-linux kmod)")
    return versions[-1]


HIDDEN_INSIDE = ("/tmp", "/run", "/dev/shm")  # INIT mounts a fresh tmpfs on each, and binds back what must be seen
CHECKOUT = Path(__file__).resolve().parents[3]


def unavailable_reason() -> str | None:
    """Why UML cannot run here, or None when it can."""
    if inside():
        return "already inside user-mode Linux"
    if not KERNEL.exists():
        return f"{KERNEL} is missing (apt-get install user-mode-linux kmod; scripts/setup --tests does it)"
    if shutil.which(SANDBOX[0]) is None:
        return f"{SANDBOX[0]} is missing (apt-get install util-linux): UML runs in namespaces of its own"
    if shutil.which("modprobe") is None and not Path("/sbin/modprobe").exists():
        return "modprobe is missing (apt-get install kmod)"
    try:
        kernel_version()
    except UmlUnavailable as error:
        return str(error)
    if os.geteuid() != 0:
        return "needs root (the command inside creates namespaces as the host's root user through hostfs)"
    return None


def hidden_under(path: Path) -> str | None:
    """The directory of HIDDEN_INSIDE that `path` is in (or is), or None."""
    return next((d for d in HIDDEN_INSIDE if path == Path(d) or Path(d) in path.parents), None)


def kept_visible(cwd: Path) -> list[Path]:
    """The host paths the command needs that a tmpfs inside would hide (the checkout, `cwd`, the interpreter's
    prefixes), outermost only: INIT binds each back at its own path."""
    needed = {p for p in (CHECKOUT, cwd.resolve(), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())
              if hidden_under(p)}
    return sorted(p for p in needed if not any(q in p.parents for q in needed))


def bind_lines(paths: list[Path], work: Path) -> tuple[str, str]:
    """INIT's lines that keep `paths` seen: before the tmpfs mounts, each hidden directory holding one is bound
    under the lab (`work`/host-N, made here); after them, each path is bound back from there at its own place."""
    hidden = sorted({hidden_under(p) for p in paths if hidden_under(p)})
    before, after = [], []
    for index, directory in enumerate(hidden):
        stash = work / f"host-{index}"
        stash.mkdir()
        before.append(f"mount --bind {shlex.quote(directory)} {shlex.quote(str(stash))}")
        for path in (p for p in paths if hidden_under(p) == directory):
            inner = stash / path.relative_to(directory)
            after.append(f"mkdir -p {shlex.quote(str(path))} && mount --bind {shlex.quote(str(inner))} "
                         f"{shlex.quote(str(path))}")
    return "\n".join(before), "\n".join(after)


def inside() -> bool:
    """Whether this process runs inside user-mode Linux."""
    try:
        return "User Mode Linux" in Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


INIT = """#!/bin/sh
# PID 1 of a user-mode Linux run (written by tests/support/uml/harness.py)
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc proc /proc
mount -t sysfs sysfs /sys
{stash}
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/shm /dev/pts && mount -t tmpfs tmpfs /dev/shm && mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
{unstash}
cat > /run/uml-env <<'ENV'
{guest_env}
ENV
. /run/uml-env
mkdir -p /run/netns /run/uml-modules/lib/modules
ln -s {modules} /run/uml-modules/lib/modules/{version}
cat > /run/uml-modprobe <<'MODPROBE'
#!/bin/sh
. /run/uml-env  # the kernel starts this with an environment of its own
for arg in "$@"; do
  for denied in {deny}; do [ "$arg" = "$denied" ] && exit 1; done
done
exec /sbin/modprobe -d /run/uml-modules "$@"
MODPROBE
chmod 755 /run/uml-modprobe
echo /run/uml-modprobe > /proc/sys/kernel/modprobe
for module in {load}; do /run/uml-modprobe "$module" || echo "uml: cannot load module $module" >> {output}; done
mkdir -p /run/uml-bin  # UML's kernel has no nf_tables for IPv4 (CONFIG_NF_TABLES_IPV4 unset): legacy iptables
for tool in iptables iptables-save iptables-restore; do ln -s "/usr/sbin/$tool-legacy" "/run/uml-bin/$tool"; done
PATH=/run/uml-bin:$PATH
ip link set lo up
hostname uml
. {envfile}
PATH=/run/uml-bin:$PATH
export PATH
cd {cwd} && {command} >> {output} 2>&1 </dev/null
echo $? > {rcfile}
sync
poweroff -f
"""


_fxsave: bool | None = None  # learnt from a boot: whether this CPU needs tests/support/uml/fxsave.py
_swept = False  # whether this process has swept the labs of killed runs (reaper.sweep) yet


def run(argv: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None, timeout: float = 600,
        mem: str = "2G", modules: tuple[str, ...] = DEFAULT_MODULES, deny: tuple[str, ...] = (),
        stream=None, cancel: threading.Event | None = None) -> Result:
    """Boot UML, run `argv` in `cwd` with `env` (added to a few of this process's variables) and return its
    exit status and output. `modules` are loaded first; the kernel's loader refuses the names in `deny` (a
    kernel without that feature). `stream`: a text file that gets the output as it comes. `cancel`: once set,
    the kernel and everything in it are killed within half a second (status 130). Raises
    UmlUnavailable. Under tests/support/uml/fxsave.py where the CPU has AMX, or where a first boot died setting its
    processes' register state back (another CPU whose XSAVE area is too large for UML 6.1)."""
    global _fxsave, _swept
    why = unavailable_reason()
    if why:
        raise UmlUnavailable(why)
    if not _swept:
        _swept = True
        reaper.sweep()
    options = {"cwd": cwd, "env": env, "timeout": timeout, "mem": mem, "modules": modules, "deny": deny,
               "stream": stream, "cancel": cancel}
    result = _boot(argv, fx=fxsave.needed() if _fxsave is None else _fxsave, **options)
    if result.fp_regs_refused:
        _fxsave = True
        result = _boot(argv, fx=True, **options)
    return result


SHM = Path("/dev/shm")


def memory_dir(work: Path) -> Path:
    """Where UML keeps the file that is its memory: /dev/shm (memory) where the host has it writable and
    executable (UML maps it PROT_EXEC), else `work` (a disk under /var/tmp, whose writeback the guest then waits
    for: boot, torch import and pings took 13.7-14.3 s against 15.8-16.7 s there while another process wrote
    to the disk, 11.1-11.7 s either way on a quiet one; this 2-core machine, 2026-11-27)."""
    try:
        flags = os.statvfs(SHM).f_flag
    except OSError:
        return work
    usable = os.access(SHM, os.W_OK | os.X_OK) and not flags & (os.ST_NOEXEC | os.ST_RDONLY)
    return SHM if usable else work


def _kernel_env(work: Path) -> dict[str, str]:
    """The kernel's environment: its memory file in memory_dir() (UML reads TMP, TEMP, then TMPDIR)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TMP", "TEMP")}
    env["TMPDIR"] = str(memory_dir(work))
    return env


def _boot(argv: list[str], *, cwd: str | Path | None, env: dict[str, str] | None, timeout: float, mem: str,
          modules: tuple[str, ...], deny: tuple[str, ...], stream, cancel: threading.Event | None,
          fx: bool) -> Result:
    version = kernel_version()
    with reaper.lab() as work:
        return _boot_in(work, version, argv, cwd=Path(cwd or os.getcwd()), env=env, timeout=timeout, mem=mem,
                        modules=modules, deny=deny, stream=stream, cancel=cancel, fx=fx)


def _boot_in(work: Path, version: str, argv: list[str], *, cwd: Path, env: dict[str, str] | None, timeout: float,
             mem: str, modules: tuple[str, ...], deny: tuple[str, ...], stream, cancel: threading.Event | None,
             fx: bool) -> Result:
    output, rcfile, envfile, init = work / "output", work / "rc", work / "env", work / "init"
    variables = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    variables.update(env or {})
    variables[INSIDE_ENV] = "1"
    variables[LAB_ENV] = str(work)
    envfile.write_text(_exports(variables))
    output.write_text("")
    # every process inside, the kernel's module loader included: a CPU with AMX keeps only the FXSAVE state
    guest = fxsave.GUEST_ENV if fx else {}
    stash, unstash = bind_lines(kept_visible(cwd), work)
    init.write_text(INIT.format(guest_env=_exports(guest), stash=stash, unstash=unstash,
                                modules=shlex.quote(str(MODULES / version)), version=version,
                                load=" ".join(shlex.quote(m) for m in modules),
                                deny=" ".join(shlex.quote(m) for m in deny) or "''", output=shlex.quote(str(output)),
                                envfile=shlex.quote(str(envfile)), cwd=shlex.quote(str(cwd)),
                                command=shlex.join(argv), rcfile=shlex.quote(str(rcfile))))
    init.chmod(0o755)
    launcher = [sys.executable, str(Path(fxsave.__file__))] if fx else []
    kernel_argv = [*SANDBOX, *launcher, str(KERNEL), f"mem={mem}", "root=/dev/root", "rootfstype=hostfs", "rootflags=/", "rw",
                   f"init={init}", "con=null", "con0=fd:0,fd:1", "ssl=null", "quiet",
                   f"umid={work.name}", f"uml_dir={work}"]  # boots run side by side
    start = time.monotonic()
    with open(work / "console", "wb") as console:
        proc = subprocess.Popen(kernel_argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=work,
                                env=_kernel_env(work))
        shown, realtime, shared = 0, False, False
        try:
            while True:
                try:
                    proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                realtime = _answer_realtime(work, realtime)
                shared = _answer_share(work, shared)
                if stream is not None:
                    shown = _show(output, shown, stream)
                if time.monotonic() - start > timeout or (cancel is not None and cancel.is_set()):
                    break
        finally:
            _kill_group(proc)
    seconds = time.monotonic() - start
    if stream is not None:
        _show(output, shown, stream)
    text = output.read_text(errors="replace")
    try:
        code = int(rcfile.read_text().strip())
    except (OSError, ValueError):
        cancelled = cancel is not None and cancel.is_set()
        reason = (f"timed out after {timeout:.0f}s" if seconds > timeout else "cancelled" if cancelled
                  else f"user-mode Linux ended without the command's exit status (kernel exit {proc.returncode})")
        console = (work / "console").read_text(errors="replace")
        text += f"\numl: {reason}; console:\n" + "\n".join(console.strip().splitlines()[-15:])
        code = 124 if seconds > timeout else 130 if cancelled else 125
        if not fx and "ptrace set fp regs failed" in console:
            return Result(code, text, seconds, fp_regs_refused=True)
    return Result(code, text, seconds)


@contextmanager
def _ask_host(asked_name: str, given_name: str, timeout: float) -> Iterator[bool]:
    """Inside UML: ask the host's boot loop (through the lab's files `asked_name` and `given_name`) for something
    for the block; yields whether it was given within `timeout`, and waits as long for it to be taken back after.
    Outside UML, or with $TESTBED_UML_RT=0, nothing is asked."""
    lab = os.environ.get(LAB_ENV)
    if not lab or not inside() or os.environ.get(REALTIME_ENV) == "0":
        yield False
        return
    asked, given = Path(lab) / asked_name, Path(lab) / given_name
    asked.write_text("1\n")
    deadline = time.monotonic() + timeout
    while not given.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield given.exists()
    finally:
        asked.unlink(missing_ok=True)
        deadline = time.monotonic() + timeout
        while given.exists() and time.monotonic() < deadline:
            time.sleep(0.02)


@contextmanager
def host_realtime(timeout: float = 5.0) -> Iterator[bool]:
    """Inside UML, for a measurement of timing: the host runs this kernel's processes SCHED_RR (priority 1) for the
    block, as the probe's own pinger runs SCHED_FIFO on a host (testbed/agents/probe.py); yields whether it does.

    Why: each netem hop of a path waits on a timer, and each expiry needs the host to wake UML's process; beside
    busy host processes an ordinary wake-up waits for a CPU, so the excess grows with the hops of the path. Measured
    with tests/support/uml/hops.py (ping over a chain of namespaces, netem 5 ms a hop each way, 200 pings, medians beyond
    2 H x 5 ms; 2-core host, other sessions' tests running, 2026-11-28), 1/2/3 hops: two `python3 -c 'while True:
    pass'` beside (load 3): 0.04/0.23/1.21 ms, p90 11.3/23.9/35.9 ms; three beside (load 5): nice -15
    0.11/0.21/1.21 ms, p90 15.0/20.5/36.3; SCHED_RR 0.00/0.19/0.20 ms, p90 10.2/20.4/30.4. None beside (load 2):
    0.03/0.10/0.40 ms, p90 10.2/20.4/33.0.
    Outside UML, or with $TESTBED_UML_RT=0, nothing is asked."""
    with _ask_host(REALTIME_ASKED, REALTIME_GIVEN, timeout) as given:
        yield given


@contextmanager
def host_share(timeout: float = 5.0) -> Iterator[bool]:
    """Inside UML, for a measurement of throughput (a TCP flow): the host gives this kernel's processes the largest
    CPU share for the block (nice -20, SCHED_OTHER; and their session's autogroup nice -20, where the host kernel
    groups by session: there a task's nice only weighs against its own session's tasks, and UML's kernel runs in a
    session of its own); yields whether it does. Not host_realtime(): SCHED_RR shares a CPU among UML's processes in
    100 ms quanta, which stalls a TCP flow (east->north read 18 % under its rate on a quiet host). Without either,
    beside other sessions' tests (load 15, 2026-11-28), east->west read 18 % under its 200 Mbit/s: UML's one CPU
    was a share of the host's two. Outside UML, or with $TESTBED_UML_RT=0, nothing is asked."""
    with _ask_host(SHARE_ASKED, SHARE_GIVEN, timeout) as given:
        yield given


def _answer_share(work: Path, given: bool) -> bool:
    """On the host, from the boot's wait loop: what host_share() inside asks, done; whether it is given now."""
    asked = (work / SHARE_ASKED).exists()
    if asked == given:
        return given
    nice = SHARE_NICE if asked else 0
    for pid in reaper.processes_of(work):
        try:
            Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
        except OSError:
            pass  # a kernel without autogroups (its tasks' nice is what counts), or ended meanwhile
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except OSError:
                continue  # ended meanwhile
    if asked:
        (work / SHARE_GIVEN).write_text("1\n")
    else:
        (work / SHARE_GIVEN).unlink(missing_ok=True)
    return asked


def _answer_realtime(work: Path, given: bool) -> bool:
    """On the host, from the boot's wait loop: what host_realtime() inside asks, done; whether it is given now."""
    asked = (work / REALTIME_ASKED).exists()
    if asked == given:
        return given
    policy, priority = (os.SCHED_RR, 1) if asked else (os.SCHED_OTHER, 0)
    for pid in reaper.processes_of(work):
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            try:
                os.sched_setscheduler(int(task.name), policy, os.sched_param(priority))
            except OSError:
                continue  # ended meanwhile
    if asked:
        (work / REALTIME_GIVEN).write_text("1\n")
    else:
        (work / REALTIME_GIVEN).unlink(missing_ok=True)
    return asked


def _exports(variables: dict[str, str]) -> str:
    """sh lines that export `variables`."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())


def _show(path: Path, offset: int, stream) -> int:
    try:
        with open(path, errors="replace") as src:
            src.seek(offset)
            chunk = src.read()
    except OSError:
        return offset
    if chunk:
        stream.write(chunk)
        stream.flush()
    return offset + len(chunk.encode())


def _kill_group(proc: subprocess.Popen) -> None:
    """UML runs as several host processes in its own session: kill them all, also on success (no stragglers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP (a CI's timeout or cancel, a closed terminal) raise KeyboardInterrupt in the main thread,
    as Ctrl-C does: the run's clean-up then kills the kernel and removes its lab (by default they end the process
    at once, and the watch does it a moment later). In this process only: a fork of it (pyroute2 forks to create a
    namespace or a socket inside one) that a clean SIGTERMs there must end, not unwind pytest's stack and run its
    teardowns a second time (it had removed another test's namespace, and cleaned up from inside a testbed's
    namespace, SIGTERMing its own parent: CI, 2026-11-28)."""
    main_pid = os.getpid()

    def interrupt(number: int, frame) -> None:
        if os.getpid() != main_pid:
            os._exit(128 + number)
        raise KeyboardInterrupt(signal.Signals(number).name)

    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, interrupt)


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="uml-run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--mem", default="2G")
    parser.add_argument("--modules", default=",".join(DEFAULT_MODULES),
                        help="modules to load before the command (comma-separated; others load on demand)")
    parser.add_argument("--deny", default="", help="module names the kernel's loader refuses (comma-separated)")
    parser.add_argument("--sweep", action="store_true",
                        help="only remove what killed runs left (their UML processes and lab directories)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(args)
    if options.sweep:
        for lab in reaper.sweep():
            print(f"uml-run: removed {lab} and its processes")
        return 0
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("give a command after --")
    interrupt_on_termination()
    try:
        result = run(command, timeout=options.timeout, mem=options.mem,
                     modules=tuple(m for m in options.modules.split(",") if m),
                     deny=tuple(m for m in options.deny.split(",") if m), stream=sys.stdout)
    except UmlUnavailable as error:
        print(f"uml-run: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("uml-run: stopped; user-mode Linux and its lab removed", file=sys.stderr)
        return 130
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
