"""What runs on a Slurm node, as root (the Prolog/Epilog, or `sudo -n` in a job step) or as the job's user:
`python -m testbed.fabric.slurm.node inspect|apply|reshape|counters|restore ...`, one JSON line on stdout.

- inspect PEER: the interface that reaches PEER, whether the kernel has sch_netem, whether we are root or
  `sudo -n` works (as the job's user; nothing changes).
- apply PLANFILE: shape this node as the job plan says (testbed.fabric.slurm.jobplan derives the commands), start
  its userspace delay line if it receives a delayed link, chown its run directory to the job's user.
- reshape PLANFILE KEY...: the live change of those directions (`tc class/qdisc change`, the delay line's new
  configuration and SIGHUP).
- counters PREFIX: the tc statistics and the accounting rules' counters of this node.
- restore PREFIX [DIR...]: what testbed changed undone (DIR: this node's own by default): processes whose working
  directory is in DIR, iptables rules tagged testbed:PREFIX, testbed's root qdisc, the
  directories. Safe to run again, and on a node never shaped.
The node's name is $SLURMD_NODENAME (set in the Prolog/Epilog and in job steps), else its host name."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from testbed.fabric.slurm.jobplan import PREFIX_PATTERN, WORKDIR_ROOT, JobPlan, hosts_plan, node_plan

DELAY_LINE_MODULE = "testbed.agents.delayline"
MEMORY_ROOT = "/dev/shm"
ROOT_HANDLE = "7e57:"
READY_S = 15.0


class NodeError(Exception):
    """One line saying what failed on this node."""


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise NodeError(f"{node_name()}: {shlex.join(argv[:4])}: {(out.stderr or out.stdout).strip()[:300]}")
    return out


def route_interface(peer: str) -> str:
    """The interface the kernel sends to `peer` through."""
    out = json.loads(run(["ip", "-j", "route", "get", peer]).stdout or "[]")
    if not out or "dev" not in out[0]:
        raise NodeError(f"{node_name()}: no route to {peer}")
    return out[0]["dev"]


def has_netem() -> bool:
    """sch_netem loaded, built in, or a module the kernel can load on first use."""
    names = [line.split()[0] for line in open("/proc/modules")] if os.path.exists("/proc/modules") else []
    found = os.path.isdir("/sys/module/sch_netem") or "sch_netem" in names
    for name in ("modules.dep", "modules.builtin"):
        path = f"/lib/modules/{os.uname().release}/{name}"
        found = found or (os.path.exists(path) and "sch_netem.ko" in open(path).read())
    return found


def inspect(peer: str) -> dict:
    root = os.geteuid() == 0
    sudo = root or subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0 \
        if not root and _which("sudo") else root
    return {"node": node_name(), "interface": route_interface(peer), "netem": has_netem(), "root": root,
            "sudo": bool(sudo), "python": sys.executable, "uid": os.getuid()}


def _which(command: str) -> bool:
    return any(os.access(os.path.join(d, command), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep))


def dirs_of(prefix: str, slurm: str) -> tuple[str, str]:
    """(workdir, memory dir) of a node (the same paths testbed.plan.hosts names)."""
    return f"{WORKDIR_ROOT}/{prefix}{slurm}", f"{MEMORY_ROOT}/{prefix}{slurm}"


def _root_qdisc(dev: str) -> tuple[str, str]:
    root = json.loads(run(["tc", "-j", "qdisc", "show", "dev", dev, "root"]).stdout or "[]")
    return (root[0].get("kind", "?"), root[0].get("handle", "?")) if root else ("none", "0:")


def _delay_files(memory: str, slurm: str) -> tuple[Path, Path]:
    """(config, status) of the node's delay line."""
    base = Path(memory) / f"{slurm}.delayline"
    return base.with_suffix(".delayline.json"), base.with_suffix(".delayline.status")


def _start_delay_line(config: Path, workdir: str) -> int:
    """The supervisor, detached from this step (its own session, cwd the workdir so restore finds it)."""
    log = open(config.with_suffix(".log"), "ab")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-m", DELAY_LINE_MODULE, "supervise", str(config)], cwd=workdir, env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


def apply(plan_file: str, uid: int | None = None, gid: int | None = None) -> dict:
    """Shape this node as the plan says; on failure undo what was done and raise NodeError."""
    plan = JobPlan.load(Path(plan_file).read_text())
    slurm = node_name()
    placed = plan.placed(slurm)
    peers = [item.address for item in plan.nodes if item.dc != placed.dc]
    dev = route_interface(peers[0]) if peers else "lo"
    item = node_plan(plan, placed.slurm, dev)
    kind, handle = _root_qdisc(dev)
    if handle == ROOT_HANDLE:
        raise NodeError(f"{slurm}: {dev} is already shaped by testbed (root qdisc {handle}); run `testbed clean "
                        "--backend slurm` for that testbed first")
    if handle != "0:":
        raise NodeError(f"{slurm}: {dev} has a configured root qdisc ({kind} {handle}); testbed will not replace it")
    workdir, memory = dirs_of(plan.prefix, placed.slurm)
    try:
        for path in (workdir, f"{workdir}/run", f"{workdir}/out", memory):
            os.makedirs(path, exist_ok=True)
            if uid is not None:
                os.chown(path, uid, gid if gid is not None else -1)
        for argv in item.apply:
            run(list(argv))
        pid = None
        if item.delay_line:
            from testbed.plan.delayline import dump_config

            config, status = _delay_files(memory, placed.slurm)
            config.write_text(dump_config(item.delay_line))
            pid = _start_delay_line(config, workdir)
            deadline = time.monotonic() + READY_S
            while not _ready(status):
                if time.monotonic() > deadline or not _alive(pid):
                    tail = config.with_suffix(".log").read_text(errors="replace").strip().splitlines()[-1:]
                    raise NodeError(f"{slurm}: delay line did not start: {' '.join(tail) or 'timed out'}")
                time.sleep(0.05)
    except BaseException:
        restore(plan.prefix, [workdir, memory], dev)
        raise
    return {"node": slurm, "interface": dev, "delay_line_pid": pid, "workdir": workdir}


def _ready(status: Path) -> bool:
    try:
        return bool(json.loads(status.read_text()).get("ready"))
    except (OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child is gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def reshape(plan_file: str, keys: list[str]) -> dict:
    """Directions `keys` as the plan file carries them now: `tc change` where this node sends them, the delay
    line's new configuration (and SIGHUP) where it receives one."""
    from testbed.plan.delayline import dump_config

    plan = JobPlan.load(Path(plan_file).read_text())
    placed = plan.placed(node_name())
    dev = _our_interface()
    full = hosts_plan(plan, interfaces={placed.slurm: dev})
    item = full.host(placed.slurm)
    commands, reload = full.reshape_commands(item, keys)  # every pair routed over a changed direction
    for argv in commands:
        run(argv)
    done = [f"tc {pair}" for pair in full.crossing(keys) if pair.split("->")[0] == placed.dc]
    if reload:
        _, memory = dirs_of(plan.prefix, placed.slurm)
        config, status = _delay_files(memory, placed.slurm)
        pid = json.loads(status.read_text()).get("supervisor") if status.exists() else None
        if not pid or not _alive(pid):
            raise NodeError(f"{placed.slurm}: its delay line is not running; run `testbed up` again")
        config.with_suffix(".tmp").write_text(dump_config(item.delay_line))
        os.replace(config.with_suffix(".tmp"), config)
        os.kill(pid, signal.SIGHUP)
        done.append("delay line")
    return {"node": placed.slurm, "changed": done}


def _our_interface() -> str:
    """The interface whose root qdisc is testbed's."""
    for qdisc in json.loads(run(["tc", "-j", "qdisc", "show"]).stdout or "[]"):
        if qdisc.get("root") and qdisc.get("handle") == ROOT_HANDLE:
            return qdisc["dev"]
    raise NodeError(f"{node_name()}: no interface is shaped by testbed")


def counters(prefix: str) -> dict:
    """The node's tc statistics on testbed's interface and its tagged iptables rules with counters."""
    dev = _our_interface()
    qdiscs = json.loads(run(["tc", "-s", "-j", "qdisc", "show", "dev", dev]).stdout or "[]")
    return {"node": node_name(), "interface": dev, "qdiscs": qdiscs,
            "rules": _rules(prefix, counters=True)}


def _rules(prefix: str, counters: bool = False) -> list[str]:
    """`iptables -S` lines of mangle PREROUTING tagged testbed:PREFIX (or testbed:PREFIX:...)."""
    out = run(["iptables", "-w", "-t", "mangle", "-S", "PREROUTING", *(["-v"] if counters else [])], check=False)
    ours = f"testbed:{prefix}"
    found = []
    for line in (out.stdout if out.returncode == 0 else "").splitlines():
        tokens = shlex.split(line)
        if tokens[:2] == ["-A", "PREROUTING"] and "--comment" in tokens:
            tag = tokens[tokens.index("--comment") + 1]
            if tag == ours or tag.startswith(ours + ":"):
                found.append(line)
    return found


def _in_dirs(roots: list[str]) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if any(cwd == root or cwd.startswith(root.rstrip("/") + "/") for root in roots):
            out.append(int(pid))
    return out


def restore(prefix: str, dirs: list[str], dev: str | None = None) -> dict:
    """Undo testbed's changes of `prefix` on this node (see the module's docstring); what was found, in numbers."""
    if not prefix_ok(prefix):
        raise NodeError(f"prefix {prefix!r}: refused")
    roots = [d for d in dirs if d.startswith((WORKDIR_ROOT + "/", MEMORY_ROOT + "/")) and prefix in d]
    killed = _in_dirs(roots)
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
        for pid in _in_dirs(roots):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while _in_dirs(roots) and time.monotonic() < deadline:
            time.sleep(0.05)
    rules = _rules(prefix)
    for line in rules:
        run(["iptables", "-w", "-t", "mangle", "-D", *shlex.split(line)[1:]], check=False)
    qdiscs = 0
    for qdisc in json.loads(run(["tc", "-j", "qdisc", "show"], check=False).stdout or "[]"):
        if qdisc.get("root") and qdisc.get("handle") == ROOT_HANDLE and dev in (None, qdisc.get("dev")):
            run(["tc", "qdisc", "del", "dev", qdisc["dev"], "root", "handle", ROOT_HANDLE], check=False)
            qdiscs += 1
    removed = 0
    for root in roots:
        if os.path.isdir(root):
            subprocess.run(["rm", "-rf", "--", root], check=False)
            removed += 1
    with contextlib.suppress(OSError):  # testbed's own directory goes too once no testbed has anything in it
        os.rmdir(WORKDIR_ROOT)
    return {"node": node_name(), "processes": len(killed), "rules": len(rules), "qdiscs": qdiscs, "dirs": removed}


def prefix_ok(prefix: str) -> bool:
    return bool(PREFIX_PATTERN.match(prefix))


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["inspect"] and len(argv) == 2:
            result = inspect(argv[1])
        elif argv[:1] == ["apply"] and len(argv) in (2, 4):
            result = apply(argv[1], *(int(value) for value in argv[2:]))
        elif argv[:1] == ["reshape"] and len(argv) >= 3:
            result = reshape(argv[1], argv[2:])
        elif argv[:1] == ["counters"] and len(argv) == 2:
            result = counters(argv[1])
        elif argv[:1] == ["restore"] and len(argv) >= 2:
            result = restore(argv[1], argv[2:] or list(dirs_of(argv[1], node_name())))
        else:
            print("usage: python -m testbed.fabric.slurm.node inspect PEER | apply PLANFILE [UID GID] | "
                  "reshape PLANFILE KEY... | counters PREFIX | restore PREFIX [DIR...]", file=sys.stderr)
            return 2
    except (NodeError, OSError, KeyError, ValueError) as error:
        print(f"testbed: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
