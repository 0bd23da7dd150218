"""A real Slurm on this machine for testbed's Slurm backend and its tests: `scripts/slurm-lab up|down|env`.

    eval "$(scripts/slurm-lab up topologies/two-dc.yaml)"   # prints export lines, waits until all nodes are idle
    sinfo; srun -N4 hostname; srun -N2 --constraint=east hostname
    scripts/slurm-lab down                                   # leaves nothing

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (`scripts/setup --tests` installs them).

What `up TOPOLOGY [--name NAME]` builds (NAME defaults to the topology's name, lowercased):
  - one Slurm node per node of the topology, named as testbed names it (east-0, east-1, west-0, ...), with its DC
    as its Slurm feature (`--constraint=east`), CPUs = this machine's cores (`--cpus`), all in partition `lab`
    (the default one). Each node's slurmd runs in a network namespace `slurmlab.NAME.<node>` and a UTS
    namespace of its own (hostname = node name); its interface `eth0` holds its lab address, no default route.
  - a flat lab network: one bridge inside a namespace of its own (`slurmlab.NAME.lan`, never in the host
    namespace, so dockerd's FORWARD DROP does not apply); a /24 taken from 198.19.240.0/20 (inside testbed's
    default 198.18.0.0/15, apart from the other tests' ranges; the first one no other lab holds; `--subnet`):
        .1   this host, on the host-namespace veth `slab<8 hex>` (alias testbed-slurm-lab:NAME): the Slurm client
             commands run here; srun's callbacks come back to it
        .2   slurmctld, hostname `slurmctld`, in namespace `slurmlab.NAME.ctl` with the lab's munged
        .11  the first node, then one address per node in the topology's order (DCs as listed, nodes by index)
    /etc/netns/<namespace>/hosts lists every lab name and address (ip netns exec mounts it as /etc/hosts, so the
    nodes, their jobs and their Prolog resolve each other's names).
  - munged of the lab's own (own key, own socket under the state directory; slurm.conf's AuthInfo names the socket):
    the system's munge is never used or touched. SlurmUser and SlurmdUser are root.
  - Prolog and Epilog as an admin installs them, with PrologFlags=Alloc,DeferBatch: the Prolog runs as root on
    every allocated node when the allocation starts, no task starts on a node before its Prolog has finished and
    a batch script not before all of them have; the Epilog runs as root on each node at the job's end. By default
    they are the wrappers STATE/prolog and STATE/epilog: each runs `testbed slurm prolog` (or `epilog`) when the
    testbed found at `up` (this checkout's .venv/bin/testbed, else `testbed` on PATH; `--testbed`) has that
    command (`testbed slurm prolog --help` succeeds: asked once at `up`, and at each run if it failed then), and
    exits 0 otherwise; either way it appends one line to STATE/log/prolog.log or epilog.log:
        <time> prolog job=<id> node=<SLURMD_NODENAME> host=<hostname> uid=<uid> testbed=ran|absent rc=<rc>
    and exits with testbed's status (a Prolog that fails drains its node, as on any cluster). `--prolog PATH` and
    `--epilog PATH` install other scripts instead.

What `up` prints on stdout (progress and errors go to stderr), also kept in STATE/env:
    export SLURM_CONF=STATE/slurm.conf       the Slurm commands and testbed's Slurm backend read the lab from it
    export SLURMLAB_NAME=NAME                `down` and `env` take it as their default lab
    export SLURMLAB_DIR=STATE
`up` returns once `sinfo` shows every node idle (`--timeout` seconds after slurmctld answers, 120 by default).
Otherwise, or when a daemon exits, it says which (the nodes not idle and their slurmd logs), takes down what it
made but STATE/log, for reading until `down`, and exits 1. Bad arguments or topology: one line, exit 2, nothing
made. `--slurmd PATH` runs another slurmd (a local build, or a stand-in that never registers, as the tests do).

The state directory STATE = /var/tmp/testbed-slurm-lab-NAME:
    slurm.conf, cgroup.conf (CgroupPlugin=cgroup/v1), plugstack.conf (empty), prolog, epilog, env, lab.json
    (name, subnet, host/controller/node addresses, DCs, ready), lock, munge/ (key, socket, pid, seed), ctld/ (state),
    spool/<node>/, run/ (pid files: slurmctld.pid, slurmd-<node>.pid), log/ (slurmctld.log, slurmd-<node>.log,
    prolog.log, epilog.log, and <daemon>.out: what each daemon wrote on stdout and stderr, munged's log).
ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, no accounting, SchedulerType=sched/builtin,
SelectType=select/cons_tres with CR_Core, ReturnToService=2.

`down [NAME] [--all]` kills every process in the lab's namespaces (slurmd, slurmctld, munged, job steps), removes
the namespaces (with their veths and bridge), the host veth, /etc/netns entries and the state directory, lock
included. It finds all of that by name, so it also clears what an `up` killed halfway left; `up` sweeps the same
way before it builds. SIGTERM, SIGINT or SIGHUP during `up` take down what it made before it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATE_ROOT = Path("/var/tmp")
STATE_PREFIX = "testbed-slurm-lab-"
NS_PREFIX = "slurmlab."
ALIAS_PREFIX = "testbed-slurm-lab:"
POOL = ipaddress.IPv4Network("198.19.240.0/20")
FIRST_NODE = 11
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
CTL_HOST = "slurmctld"
DAEMON_TIMEOUT = 120.0  # seconds for munged and slurmctld to answer
PARTITION = "lab"
DAEMON_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "scontrol", "ip", "unshare")


class UsageError(Exception):
    """Bad arguments or topology: one line, exit 2, before anything is built."""


class LabError(Exception):
    """The lab could not be brought up or down: one line (with the log to read), exit 1."""


class TimedOut(LabError):
    pass


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class LabNode:
    name: str
    dc: str
    address: str


@dataclass(frozen=True)
class Lab:
    """Where everything of one lab lives; pure data, written to STATE/lab.json."""

    name: str
    subnet: str
    nodes: tuple[LabNode, ...]
    cpus: int

    @property
    def dir(self) -> Path:
        return state_dir(self.name)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def host_address(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def ctl_address(self) -> str:
        return str(self.network.network_address + 2)

    @property
    def host_ifname(self) -> str:
        return host_ifname(self.name)

    def ns(self, what: str) -> str:
        return f"{NS_PREFIX}{self.name}.{what}"

    @property
    def lan_ns(self) -> str:
        return self.ns("lan")

    @property
    def ctl_ns(self) -> str:
        return self.ns("ctl")

    def dcs(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node in self.nodes:
            out.setdefault(node.dc, []).append(node.name)
        return out


def state_dir(name: str) -> Path:
    return STATE_ROOT / f"{STATE_PREFIX}{name}"


def host_ifname(name: str) -> str:
    return "slab" + hashlib.sha1(name.encode()).hexdigest()[:8]


def say(message: str) -> None:
    print(f"slurm-lab: {message}", file=sys.stderr, flush=True)


def run(argv: list[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **DAEMON_ENV})
    if check and proc.returncode != 0:
        raise LabError(f"{shlex.join(argv)} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


# --- planning (pure) ---------------------------------------------------------------------------------------------

def default_name(topology_name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", topology_name.lower())[:32].strip("-") or "lab"


def load_nodes(path: str) -> tuple[str, list[tuple[str, str]]]:
    """The topology's name and its (node, DC) pairs, as testbed names them; UsageError for an unusable file."""
    sys.path.insert(0, str(REPO))
    try:
        from testbed.spec.errors import SpecError
        from testbed.spec.topology import load_topology
    except ImportError as error:
        raise UsageError(f"cannot read topologies without testbed's dependencies ({error}): run scripts/setup") from None

    try:
        topology = load_topology(path)
    except SpecError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{path}: {error.strerror}") from None
    return topology.name, [(node, dc.name) for dc in topology.dcs for node in dc.node_names()]


def plan_lab(name: str, subnet: str, nodes: list[tuple[str, str]], cpus: int) -> Lab:
    network = ipaddress.IPv4Network(subnet)
    room = network.num_addresses - FIRST_NODE - 1
    if len(nodes) > room:
        raise UsageError(f"--subnet {subnet}: room for {room} nodes, the topology has {len(nodes)}")
    return Lab(name, str(network), tuple(LabNode(node, dc, str(network.network_address + FIRST_NODE + index))
                                         for index, (node, dc) in enumerate(nodes)), cpus)


def slurm_conf(lab: Lab, prolog: str, epilog: str) -> str:
    d = lab.dir
    lines = [
        f"# Slurm lab {lab.name}, written by scripts/slurm-lab (see its docstring); `scripts/slurm-lab down` removes it",
        f"ClusterName={lab.name.replace('-', '_')}",
        f"SlurmctldHost={CTL_HOST}({lab.ctl_address})",
        "SlurmUser=root", "SlurmdUser=root", "SlurmctldPort=6817", "SlurmdPort=6818",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={d}/munge/munge.socket",
        f"StateSaveLocation={d}/ctld", f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdSpoolDir={d}/spool/%n", f"SlurmdPidFile={d}/run/slurmd-%n.pid", f"SlurmdLogFile={d}/log/slurmd-%n.log",
        f"PlugStackConfig={d}/plugstack.conf",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "ReturnToService=2", "SlurmctldTimeout=30", "SlurmdTimeout=60", "InactiveLimit=0", "KillWait=5",
        "MinJobAge=300", "SlurmctldDebug=info", "SlurmdDebug=info",
        f"Prolog={prolog}", f"Epilog={epilog}", "PrologFlags=Alloc,DeferBatch",
    ]
    lines += [f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.name} CPUs={lab.cpus} Feature={n.dc} State=UNKNOWN"
              for n in lab.nodes]
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def hook_wrapper(lab: Lab, which: str, testbed: str, has_it: bool) -> str:
    """The lab's Prolog or Epilog. `has_it`: `testbed slurm WHICH` answered at `up`, so it is called straight away;
    otherwise each run asks again (a testbed that gains the command later is called from then on)."""
    log = lab.dir / "log" / f"{which}.log"
    ask = "true" if has_it else f'"$tb" slurm {which} --help >/dev/null 2>&1'
    return f"""#!/bin/sh
# {which.capitalize()} of the Slurm lab {lab.name}, installed by scripts/slurm-lab as a site admin installs testbed's:
# runs `testbed slurm {which}` when {testbed} has that command, exits 0 otherwise. One line per run in {log}.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
tb={shlex.quote(testbed)}
node="${{SLURMD_NODENAME:-$(hostname)}}"
host="$(hostname)"
if [ -x "$tb" ] && {ask}; then
  "$tb" slurm {which}
  rc=$?
  ran=ran
else
  rc=0
  ran=absent
fi
echo "$(date +%s.%N) {which} job=$SLURM_JOB_ID node=$node host=$host uid=$(id -u) testbed=$ran rc=$rc" >> {shlex.quote(str(log))}
exit $rc
"""


def hosts_file(lab: Lab) -> str:
    base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "127.0.0.1 localhost\n"
    names = [f"{lab.host_address} slurmlab-host", f"{lab.ctl_address} {CTL_HOST}"]
    names += [f"{node.address} {node.name}" for node in lab.nodes]
    return base.rstrip("\n") + f"\n# Slurm lab {lab.name} (scripts/slurm-lab)\n" + "\n".join(names) + "\n"


def env_lines(lab: Lab) -> str:
    return (f"export SLURM_CONF={shlex.quote(str(lab.dir / 'slurm.conf'))}\n"
            f"export SLURMLAB_NAME={shlex.quote(lab.name)}\n"
            f"export SLURMLAB_DIR={shlex.quote(str(lab.dir))}\n")


# --- what exists -------------------------------------------------------------------------------------------------

def lab_namespaces(name: str | None) -> list[str]:
    """Namespaces of lab `name` (of every lab when None)."""
    try:
        entries = os.listdir("/run/netns")
    except FileNotFoundError:
        return []
    prefix = NS_PREFIX + (f"{name}." if name is not None else "")
    return sorted(entry for entry in entries if entry.startswith(prefix))


def existing_labs() -> set[str]:
    """Names of the labs that have anything on this machine: state directory, namespaces or processes."""
    names = {p.name[len(STATE_PREFIX):] for p in STATE_ROOT.glob(f"{STATE_PREFIX}*") if p.is_dir()}
    names |= {ns[len(NS_PREFIX):].rsplit(".", 1)[0] for ns in lab_namespaces(None)}
    return names | daemon_labs()


def host_links() -> list[dict]:
    return json.loads(run(["ip", "-j", "-d", "link", "show"]).stdout or "[]")


def used_subnets(except_name: str) -> list[ipaddress.IPv4Network]:
    used = []
    for path in STATE_ROOT.glob(f"{STATE_PREFIX}*/lab.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(path.read_text())
            if data["name"] != except_name:
                used.append(ipaddress.IPv4Network(data["subnet"]))
    for route in json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst not in ("default",) and route.get("dev") != host_ifname(except_name):
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return used


def free_subnet(name: str) -> str:
    used = used_subnets(name)
    for candidate in POOL.subnets(new_prefix=24):
        if not any(candidate.overlaps(other) for other in used):
            return str(candidate)
    raise LabError(f"no free /24 left in {POOL} for a lab (other labs: {', '.join(sorted(existing_labs()))})")


def ns_inode(ns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/run/netns/{ns}")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


DAEMONS = (b"munged", b"slurmctld", b"slurmd", b"slurmstepd", b"slurmscriptd")


def proc_read(pid: str, what: str) -> bytes:
    with open(f"/proc/{pid}/{what}", "rb") as source:
        return source.read()


def daemon_lab(pid: str) -> str | None:
    """The lab whose daemon (or job step) this process is, by the state directory in its command line or in its
    SLURM_CONF (slurmscriptd and slurmstepd name no file); None for any other process."""
    if proc_read(pid, "comm").strip() not in DAEMONS:
        return None
    prefix = str(STATE_ROOT / STATE_PREFIX).encode()
    for text in (proc_read(pid, "cmdline"), b"\0".join(entry[len(b"SLURM_CONF="):] for entry in
                                                        proc_read(pid, "environ").split(b"\0")
                                                        if entry.startswith(b"SLURM_CONF="))):
        for arg in text.split(b"\0"):
            start = arg.find(prefix)
            if start >= 0:
                return arg[start + len(prefix):].split(b"/")[0].decode(errors="replace")
    return None


def started_by_lab(name: str, argv: list[bytes]) -> bool:
    """Whether a command line is one the lab starts around its daemons: the netns/UTS wrapper, a --slurmd stand-in,
    its Prolog or Epilog (a user's `tail -f` of a lab log or shell holding SLURM_CONF is not the lab's to kill)."""
    d = str(state_dir(name)).encode()
    if argv[:3] == [b"ip", b"netns", b"exec"] and len(argv) > 3 and argv[3].startswith(f"{NS_PREFIX}{name}.".encode()):
        return True
    if any(a == b"-f" and b == d + b"/slurm.conf" for a, b in itertools.pairwise(argv)):
        return True
    return any(arg in (d + b"/prolog", d + b"/epilog") for arg in argv[:2])


def lab_processes(name: str) -> list[int]:
    """Every process in the lab's namespaces, and any other the lab started: its daemons and job steps even where
    their namespace is gone (by their state directory), what starts them, its Prolog and Epilog."""
    inodes = {inode for ns in lab_namespaces(name) if (inode := ns_inode(ns)) is not None}
    mine = ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
            if ((st.st_dev, st.st_ino) in inodes or daemon_lab(entry) == name
                    or started_by_lab(name, proc_read(entry, "cmdline").split(b"\0"))):
                found.append(int(entry))
        except OSError:
            continue
    return found


def daemon_labs() -> set[str]:
    """Labs that have a daemon or job step running, whatever else of them is left."""
    names = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if (name := daemon_lab(entry)) is not None:
                    names.add(name)
    return names


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# --- taking down -------------------------------------------------------------------------------------------------

def kill_all(pids: list[int], grace: float = 1.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 3.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [pid for pid in pids if alive(pid)]
        if not pids:
            return
    raise LabError(f"processes {pids} outlived SIGKILL")


def sweep(name: str, *, keep_lock: bool, keep_logs: bool = False) -> list[str]:
    """Remove everything lab `name` has on this machine, found by name; returns what was there. `keep_logs` keeps
    STATE/log (and STATE) for a failed `up` to be read; `down` removes them."""
    removed = []
    for _ in range(3):  # a process may be starting (ip netns exec) while we kill: look again
        pids = lab_processes(name)
        if not pids:
            break
        kill_all(pids)
        removed.append(f"{len(pids)} processes")
    for ns in lab_namespaces(name):
        run(["ip", "netns", "delete", ns], check=False)
        if Path(f"/run/netns/{ns}").exists():
            raise LabError(f"namespace {ns} could not be removed (ip netns delete {ns})")
        removed.append(ns)
    for etc in Path("/etc/netns").glob(f"{NS_PREFIX}{name}.*"):
        shutil.rmtree(etc, ignore_errors=True)
    with contextlib.suppress(OSError):
        Path("/etc/netns").rmdir()  # only when empty: it was ours (the netns backend uses none)
    wanted = {host_ifname(name)}
    for link in host_links():
        if link.get("ifname") in wanted or link.get("ifalias") == ALIAS_PREFIX + name:
            run(["ip", "link", "delete", link["ifname"]], check=False)
            removed.append(link["ifname"])
    directory = state_dir(name)
    if directory.exists():
        if any(entry.name != "lock" for entry in directory.iterdir()):
            removed.append(str(directory))
        for entry in directory.iterdir():
            if (entry.name == "lock" and keep_lock) or (entry.name == "log" and keep_logs):
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        if not keep_lock and not keep_logs:
            directory.rmdir()
    return removed


@contextlib.contextmanager
def allocating():
    """Hold a lock on STATE_ROOT itself while a lab picks its subnet and records it (two `up`s at once would pick
    the same one); a lock on the directory leaves no file behind."""
    fd = os.open(STATE_ROOT, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(name: str, wait: float):
    """Hold STATE/lock (an up or a down of this lab at a time); the pid in it says whose it is."""
    directory = state_dir(name)
    directory.mkdir(mode=0o755, exist_ok=True)
    path = directory / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise LabError(f"lab {name} is busy: an up or down of it holds {path} (pid {holder})") from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def down(name: str) -> None:
    if name not in existing_labs() and not any(link.get("ifname") == host_ifname(name) for link in host_links()):
        say(f"no lab {name} here: nothing to take down")
        return
    started = time.monotonic()
    with locked(name, wait=60.0):
        sweep(name, keep_lock=True)
        (state_dir(name) / "lock").unlink()
        state_dir(name).rmdir()
    say(f"lab {name} is down ({time.monotonic() - started:.1f} s)")


# --- bringing up -------------------------------------------------------------------------------------------------

def ip(*args: str) -> None:
    run(["ip", *args])


def build_network(lab: Lab) -> None:
    ip("netns", "add", lab.lan_ns)
    ip("-n", lab.lan_ns, "link", "add", "br0", "type", "bridge")
    ip("-n", lab.lan_ns, "link", "set", "br0", "up")
    ip("-n", lab.lan_ns, "link", "set", "lo", "up")
    plen = lab.network.prefixlen
    # the host's end: created in the host namespace, its peer moved straight into the lan namespace
    ip("link", "add", lab.host_ifname, "type", "veth", "peer", "name", "host", "netns", lab.lan_ns)
    ip("link", "set", lab.host_ifname, "alias", ALIAS_PREFIX + lab.name)
    ip("addr", "add", f"{lab.host_address}/{plen}", "dev", lab.host_ifname)
    ip("link", "set", lab.host_ifname, "up")
    ip("-n", lab.lan_ns, "link", "set", "host", "master", "br0", "up")
    members = [(lab.ctl_ns, "ctl", lab.ctl_address)]
    members += [(lab.ns(node.name), f"n{index}", node.address) for index, node in enumerate(lab.nodes)]
    hosts = hosts_file(lab)
    for ns, port, address in members:
        ip("netns", "add", ns)
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts)
        ip("-n", lab.lan_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("-n", lab.lan_ns, "link", "set", port, "master", "br0", "up")
        ip("-n", ns, "addr", "add", f"{address}/{plen}", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")


HOOKS = ("prolog", "epilog")


def ask_testbed(testbed: str) -> dict[str, subprocess.Popen]:
    """Start asking `testbed slurm prolog|epilog --help` (a Python start: seconds on a loaded machine, so it runs
    while the lab comes up)."""
    if not os.access(testbed, os.X_OK):
        return {}
    return {which: subprocess.Popen([testbed, "slurm", which, "--help"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True) for which in HOOKS}


def answered(proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    try:
        return proc.wait(timeout=timeout) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def install_wrapper(lab: Lab, which: str, testbed: str, *, has_it: bool) -> None:
    """Write STATE/<which> whole before it can run (a new file renamed over the old one)."""
    path = lab.dir / which
    fresh = path.with_name(f".{which}.new")
    fresh.write_text(hook_wrapper(lab, which, testbed, has_it))
    fresh.chmod(0o755)
    fresh.replace(path)


def write_files(lab: Lab, prolog: str | None, epilog: str | None, testbed: str) -> None:
    d = lab.dir
    for sub in ("munge", "ctld", "spool", "run", "log"):
        (d / sub).mkdir(mode=0o755 if sub != "munge" else 0o700, exist_ok=True)
    for node in lab.nodes:
        (d / "spool" / node.name).mkdir(mode=0o755, exist_ok=True)
    key = d / "munge" / "munge.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as out:
        out.write(os.urandom(1024))
    for which in HOOKS:  # written even when others are installed: one to fall back on
        install_wrapper(lab, which, testbed, has_it=False)
    (d / "slurm.conf").write_text(slurm_conf(lab, prolog or str(d / "prolog"), epilog or str(d / "epilog")))
    (d / "cgroup.conf").write_text("# slurmd aborts on 'No filesystem mounted on /sys/fs/cgroup' without it\n"
                                   "CgroupPlugin=cgroup/v1\n")
    (d / "plugstack.conf").write_text("# empty: the lab loads no SPANK plugin (not the system's either)\n")
    (d / "env").write_text(env_lines(lab))
    record = {**asdict(lab), "dir": str(d), "host_address": lab.host_address, "ctl_address": lab.ctl_address,
              "host_ifname": lab.host_ifname, "dcs": lab.dcs(), "ready": False}
    (d / "lab.json").write_text(json.dumps(record, indent=1) + "\n")


def spawn(lab: Lab, ns: str, hostname: str, argv: list[str], log: Path) -> subprocess.Popen:
    """Start `argv` in namespace `ns` and a UTS namespace of its own named `hostname`, in a session of its own
    (it outlives `up`); its own output goes to `log`."""
    command = ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
               hostname, *argv]
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True,
                                env={**DAEMON_ENV, "SLURM_CONF": str(lab.dir / "slurm.conf")})


def tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "(empty)"
    except OSError:
        return "(no log)"


def wait_until(what: str, ready, deadline: float, daemons: dict[str, tuple[subprocess.Popen, Path]]) -> None:
    while True:
        for label, (proc, log) in daemons.items():
            if proc.poll() is not None:
                out = log.with_suffix(".out")  # what it wrote before its log file was open
                raise LabError(f"{label} exited ({proc.returncode}) while waiting for {what}; see {log}: {tail(log)}"
                               f" (its output, {out}: {tail(out)})")
        if ready():
            return
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out waiting for {what}")
        time.sleep(0.2)


def slurm_env(lab: Lab) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(lab.dir / "slurm.conf")}


def node_states(lab: Lab) -> dict[str, str]:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30,
                          env=slurm_env(lab))
    if proc.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)


def start_daemons(lab: Lab, timeout: float, slurmd: str) -> None:
    d = lab.dir
    deadline = time.monotonic() + DAEMON_TIMEOUT
    started = time.monotonic()
    munge_log = d / "log" / "munged.log"
    munged = spawn(lab, lab.ctl_ns, CTL_HOST,
                   ["munged", "--foreground", "--force", f"--socket={d}/munge/munge.socket",
                    f"--key-file={d}/munge/munge.key", f"--pid-file={d}/munge/munged.pid",
                    f"--seed-file={d}/munge/munged.seed", f"--log-file={munge_log}", "--num-threads=4"],
                   d / "log" / "munged.out")
    daemons = {"munged": (munged, munge_log)}
    wait_until("munged's socket", lambda: (d / "munge" / "munge.socket").exists(), deadline, daemons)
    ctl_log = d / "log" / "slurmctld.log"
    ctld = spawn(lab, lab.ctl_ns, CTL_HOST, ["slurmctld", "-D", "-i", "-f", str(d / "slurm.conf")],
                 d / "log" / "slurmctld.out")
    daemons["slurmctld"] = (ctld, ctl_log)

    def ctld_up() -> bool:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30, env=slurm_env(lab))
        return ping.returncode == 0 and "UP" in ping.stdout

    wait_until("slurmctld to answer `scontrol ping`", ctld_up, deadline, daemons)
    say(f"munged and slurmctld up at {lab.ctl_address} ({time.monotonic() - started:.1f} s)")
    for node in lab.nodes:
        log = d / "log" / f"slurmd-{node.name}.log"
        daemons[f"slurmd of {node.name}"] = (
            spawn(lab, lab.ns(node.name), node.name, [slurmd, "-D", "-f", str(d / "slurm.conf")],
                  d / "log" / f"slurmd-{node.name}.out"), log)
    states: dict[str, str] = {}

    def all_idle() -> bool:
        states.update(node_states(lab))
        return all(states.get(node.name) == "idle" for node in lab.nodes)

    try:
        wait_until(f"{len(lab.nodes)} nodes idle in sinfo", all_idle, time.monotonic() + timeout, daemons)
    except TimedOut as error:
        late = [node.name for node in lab.nodes if states.get(node.name) != "idle"]
        logs = ", ".join(f"{name} ({states.get(name, 'not listed')}): {d / 'log' / f'slurmd-{name}.log'}"
                         for name in late)
        raise LabError(f"{error} after {timeout:.0f} s; not idle: {logs}") from None


def find_testbed(given: str | None) -> str:
    if given:
        return str(Path(given).resolve())
    local = REPO / ".venv" / "bin" / "testbed"
    return str(local) if local.exists() else (shutil.which("testbed") or "testbed")


def up(args: argparse.Namespace) -> None:
    topology_name, nodes = load_nodes(args.topology)
    name = args.name or default_name(topology_name)
    if not NAME_RE.match(name):
        raise UsageError(f"--name {name!r}: a lab name is a lowercase letter or digit, then up to 31 of a-z 0-9 _ -")
    for option, given in (("--prolog", args.prolog), ("--epilog", args.epilog), ("--slurmd", args.slurmd)):
        if given and ("/" in given or option != "--slurmd") and not os.access(given, os.X_OK):
            raise UsageError(f"{option} {given}: not an executable file")
    if "/" in args.slurmd:
        args.slurmd = str(Path(args.slurmd).resolve())
    missing = [binary for binary in BINARIES if shutil.which(binary, path=DAEMON_ENV["PATH"]) is None]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}: run scripts/setup --tests (apt-get install "
                         "--no-install-recommends slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        raise UsageError("the lab needs root (network namespaces, slurmd as root)")
    if args.subnet:
        try:
            ipaddress.IPv4Network(args.subnet)
        except ValueError as error:
            raise UsageError(f"--subnet {args.subnet}: {error}") from None
    subnet = args.subnet or str(next(POOL.subnets(new_prefix=24)))
    plan_lab(name, subnet, nodes, 1)  # refuses a topology the subnet has no room for, before anything is made
    ready = state_dir(name) / "lab.json"
    started = time.monotonic()
    asked: dict[str, subprocess.Popen] = {}
    with locked(name, wait=0.0):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(ready.read_text()).get("ready") and lab_processes(name):
                raise UsageError(f"lab {name} is already up ({state_dir(name)}): `scripts/slurm-lab env {name}` "
                                 f"prints its exports, `scripts/slurm-lab down {name}` takes it down")
        try:
            left = sweep(name, keep_lock=True)
            if left:
                say(f"swept what an earlier lab {name} left: {', '.join(left)}")
            testbed = find_testbed(args.testbed)
            asked.update(ask_testbed(testbed))
            with allocating():
                lab = plan_lab(name, args.subnet or free_subnet(name), nodes, args.cpus or os.cpu_count() or 1)
                write_files(lab, args.prolog and str(Path(args.prolog).resolve()),
                            args.epilog and str(Path(args.epilog).resolve()), testbed)
            build_network(lab)
            start_daemons(lab, args.timeout, args.slurmd)
            for which, proc in asked.items():
                if answered(proc):
                    install_wrapper(lab, which, testbed, has_it=True)
            record = json.loads(ready.read_text())
            record.update(ready=True, up_seconds=round(time.monotonic() - started, 2))
            ready.write_text(json.dumps(record, indent=1) + "\n")
        except BaseException as error:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            for proc in asked.values():
                proc.kill()
                proc.wait()
            failed = isinstance(error, LabError)
            say(f"taking down what was made of lab {name}" +
                (f", but its logs: {state_dir(name) / 'log'} (`scripts/slurm-lab down {name}` removes them)"
                 if failed else ""))
            sweep(name, keep_lock=False, keep_logs=failed)
            raise
    say(f"lab {name} up: {len(lab.nodes)} nodes idle on {lab.subnet} ({time.monotonic() - started:.1f} s); "
        f"logs in {lab.dir / 'log'}")
    sys.stdout.write(env_lines(lab))
    sys.stdout.flush()


def pick(name: str | None) -> str | None:
    """The lab a `down` or `env` means: NAME, else $SLURMLAB_NAME, else the only one here."""
    if name:
        return name
    if os.environ.get("SLURMLAB_NAME"):
        return os.environ["SLURMLAB_NAME"]
    labs = sorted(existing_labs())
    if len(labs) > 1:
        raise UsageError(f"several labs here ({', '.join(labs)}): name one, or --all")
    return labs[0] if labs else None


def interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/slurm-lab", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p_up = commands.add_parser("up", help="build the lab of a topology, print its export lines")
    p_up.add_argument("topology")
    p_up.add_argument("--name", help="the lab's name (default: the topology's name)")
    p_up.add_argument("--subnet", help=f"the lab network (default: a free /24 of {POOL})")
    p_up.add_argument("--cpus", type=int, help="CPUs each node declares (default: this machine's cores)")
    p_up.add_argument("--timeout", type=float, default=120.0, help="seconds for every node to be idle once slurmctld answers")
    p_up.add_argument("--prolog", help="the Prolog to install (default: the lab's testbed wrapper)")
    p_up.add_argument("--epilog", help="the Epilog to install (default: the lab's testbed wrapper)")
    p_up.add_argument("--slurmd", default="slurmd", help="the slurmd to run on each node (default: slurmd on PATH)")
    p_up.add_argument("--testbed", help="the testbed executable the wrappers call (default: .venv/bin/testbed)")
    p_down = commands.add_parser("down", help="take a lab down, leaving nothing")
    p_down.add_argument("name", nargs="?")
    p_down.add_argument("--all", action="store_true", help="every lab on this machine")
    p_env = commands.add_parser("env", help="print a lab's export lines again")
    p_env.add_argument("name", nargs="?")
    args = parser.parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, interrupted)
    try:
        if args.command == "up":
            up(args)
        elif args.command == "down":
            if os.geteuid() != 0:
                raise UsageError("taking a lab down needs root")
            names = sorted(existing_labs()) if args.all else [n for n in [pick(args.name)] if n]
            if not names:
                say("no lab here: nothing to take down")
            for name in names:
                down(name)
        else:
            name = pick(args.name)
            env = state_dir(name) / "env" if name else None
            if env is None or not env.exists():
                raise UsageError(f"no lab {name} here" if name else "no lab here")
            sys.stdout.write(env.read_text())
    except UsageError as error:
        say(str(error))
        return 2
    except LabError as error:
        say(str(error))
        return 1
    except Interrupted as error:
        say(f"stopped by {error}")
        return 128 + error.signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
