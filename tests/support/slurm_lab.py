"""The Slurm lab of scripts/slurm-lab from the tests: bring one up, run Slurm commands against it, take it down,
and list what is left of one (processes, namespaces, host veth, /etc/netns entries, state directory)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-lab"
STATE_ROOT = Path("/var/tmp")  # scripts/slurm_lab.py's STATE_ROOT: a lab's state is <root>/testbed-slurm-lab-<name>


def state_dir(name: str) -> Path:
    return STATE_ROOT / f"testbed-slurm-lab-{name}"


def exports(text: str) -> dict[str, str]:
    """The variables of `export NAME=value` lines, as a shell would set them."""
    found = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            found[key] = value
    return found


@dataclass
class SlurmLab:
    """A lab that is up: its name, state directory, the environment its exports give, lab.json's record and what
    `up` said on stderr."""

    name: str
    dir: Path
    env: dict[str, str]
    record: dict
    said: str

    @property
    def nodes(self) -> dict[str, dict]:
        """node name -> {"name", "dc", "address"}, in the topology's order."""
        return {node["name"]: node for node in self.record["nodes"]}

    def slurm(self, *argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm command (sinfo, srun, ...) run against the lab, as a user who evaluated its exports."""
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and proc.returncode != 0:
            raise AssertionError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def states(self) -> dict[str, tuple[str, str]]:
        """node -> (state, features) as sinfo lists them."""
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %t %f").stdout
        return {name: (state, features) for name, state, features in (line.split() for line in out.splitlines())}

    def wait_idle(self, timeout: float = 60) -> dict[str, tuple[str, str]]:
        """Until every node is idle again (a job's Epilog may still be running): sinfo's view then."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if all(state == "idle" for state, _ in states.values()) or time.monotonic() > deadline:
                return states
            time.sleep(0.2)

    def log(self, name: str) -> str:
        path = self.dir / "log" / name
        return path.read_text() if path.exists() else ""


def run_script(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURMLAB_", "SLURM_"))}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def lab_up(topology: Path, name: str, *options: str, timeout: float = 180) -> SlurmLab:
    proc = run_script("up", str(topology), "--name", name, *options, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"slurm-lab up {topology} exited {proc.returncode}: {proc.stderr.strip()}")
    variables = exports(proc.stdout)
    directory = Path(variables["SLURMLAB_DIR"])
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURMLAB_", "SLURM_"))}
    return SlurmLab(name, directory, {**env, **variables}, json.loads((directory / "lab.json").read_text()),
                    proc.stderr)


def lab_down(name: str) -> subprocess.CompletedProcess:
    proc = run_script("down", name, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"slurm-lab down {name} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _zombie(pid: str) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def lab_processes(name: str) -> list[str]:
    """Live processes of the lab: its daemons and their job steps all carry its state directory in their command
    line or environment (SLURM_CONF). Zombies are not counted: they are dead, waiting for init to reap them."""
    marker = str(state_dir(name)).encode()
    mine = {os.getpid(), os.getppid()}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) in mine:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/environ", "rb") as environ:
                text = cmdline.read() + b"\0" + environ.read()
            if marker in text and not _zombie(pid):
                command = text.split(b"\0")[0].decode(errors="replace")
                found.append(f"{pid} {command}")
        except OSError:
            continue
    return found


def leftovers(name: str) -> list[str]:
    """Everything of lab `name` still on this machine: empty once it is down."""
    left = lab_processes(name)
    prefix = f"slurmlab.{name}."
    netns = Path("/run/netns")
    left += [f"namespace {ns}" for ns in sorted(os.listdir(netns)) if ns.startswith(prefix)] if netns.exists() else []
    etc = Path("/etc/netns")
    left += [f"/etc/netns/{ns}" for ns in sorted(os.listdir(etc)) if ns.startswith(prefix)] if etc.exists() else []
    veth = "slab" + hashlib.sha1(name.encode()).hexdigest()[:8]
    if Path(f"/sys/class/net/{veth}").exists():
        left.append(f"host veth {veth}")
    if state_dir(name).exists():
        left.append(f"state directory {state_dir(name)}")
    return left


@contextmanager
def running_lab(topology: Path, name: str, *options: str) -> Iterator[SlurmLab]:
    """A lab up for the block, taken down after it whatever happened; nothing of it may be left."""
    try:
        yield lab_up(topology, name, *options)
    finally:
        lab_down(name)
        left = leftovers(name)
        assert not left, f"slurm-lab down {name} left: {left}"
