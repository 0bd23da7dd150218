"""The ssh fabric: real hosts (a lab rack, cloud VMs) driven over paramiko, behind the same Fabric interface.

`up` ships this package to every host's workdir (SFTP, one archive), runs the plan's tc/iptables commands
(testbed.plan.hosts) and, without netem, starts a userspace delay line on each receiving host. Everything
it changes is recorded in the controller's state file before and as it is changed, so `down`, Ctrl-C and
`clean` (also after a crash of the controller) undo it: processes whose cwd lies in the workdir are killed,
iptables rules with our comment deleted, our root qdisc removed (the kernel's default comes back), the
workdir removed.

Probe agents and commands start as RemoteProcess (Popen-like), the workload's ranks forked by a fork server on
each host started the same way (fork_server): only the env contract crosses (PASS_ENV), never the controller's
whole environment; TESTBED_METRICS_DIR becomes a directory in the host's workdir and
`fetch_outputs` brings its files back over SFTP.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed import rankenv
from testbed.agents import forkserver
from testbed.agents.delayline.control import fresh_stats
from testbed.agents.delayline.files import MODULE as DELAY_LINE_MODULE
from testbed.agents.delayline.files import DelayLineFiles, DelayLineStatus
from testbed.agents.tc import LinkCounters
from testbed.fabric import cancel
from testbed.fabric.base import Fabric
from testbed.fabric.errors import FabricError
from testbed.fabric.forkserver import NodeForkServers
from testbed.fabric.parallel import each_at_once
from testbed.fabric.shipping import pass_env, source_archive
from testbed.fabric.ssh.connection import Connection, RemoteError
from testbed.fabric.ssh.process import RemoteProcess, SessionChannel
from testbed.fabric.ssh.state import HostRecord, SshState
from testbed.fabric.state import FabricState
from testbed.fabric.state import save as save_state
from testbed.plan.delayline import dump_config
from testbed.plan.hosts import (
    MEMORY_ROOT,
    ROOT_HANDLE,
    HopTotals,
    HostPlan,
    HostsPlan,
    build_hosts_plan,
    comment,
    memory_dir,
)
from testbed.plan.network import LinkEnd
from testbed.spec.inventory import HostSpec, Inventory
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology
from testbed.waiting import wait_for

DELAY_LINE_START_S = 15.0
HEALTH_CACHE_S = 2.0

EXTRACT = ("import sys, tarfile\n"
           "with tarfile.open(sys.argv[1]) as t:\n"
           "    t.extractall(sys.argv[2], **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))")
KILL_IN_DIR = r"""
import os, signal, sys, time
root = sys.argv[1].rstrip("/")
def victims():
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cwd = os.readlink("/proc/%s/cwd" % pid)
            except OSError:
                continue
            if cwd == root or cwd.startswith(root + "/"):
                out.append(int(pid))
    return out
found = victims()
for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
    for pid in victims():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.time() + wait
    while victims() and time.time() < deadline:
        time.sleep(0.05)
print(len(found))
"""
DELAY_LINE_GONE = 17  # a re-shape script's exit status when the host's delay line is not there to reload


class SshFabric(Fabric[HostsPlan]):
    """Shaping and processes on inventory hosts; the controller keeps the record of every change."""

    delays_on_nodes = True  # the userspace delay line runs on the receiving host (testbed.plan.hosts)
    link_faults = True  # a fault is a live re-shape: `tc change` on the sending hosts, the receiving delay lines
    node_shells = True  # each host's kept-open shell (re-shapes, signals, a straggler's loop)

    def __init__(self, prefix: str, topology: Topology, inventory: Inventory, inventory_file: Path,
                 known_hosts: Path, accept_new: bool = False, on_progress: Callable[[str], None] | None = None) -> None:
        self.prefix, self.topology, self.inventory = prefix, topology, inventory
        self.inventory_file, self.known_hosts, self.accept_new = inventory_file, known_hosts, accept_new
        self.hosts_plan: HostsPlan | None = None
        self.state: FabricState | None = None
        self._progress = on_progress or (lambda message: None)
        self._connections: dict[str, Connection] = {}
        self._outputs: dict[str, set[str]] = {}  # local dir -> hosts that wrote into their copy of it
        self._health: tuple[float, list[str]] | None = None
        self._state_lock = threading.RLock()  # hosts are changed at once: one record change and save at a time

    @property
    def plan(self) -> HostsPlan | None:
        return self.hosts_plan

    def _require(self) -> HostsPlan:
        if self.hosts_plan is None:
            raise FabricError("no testbed is up (run `testbed up --backend ssh` first)")
        return self.hosts_plan

    def connect(self, host: HostSpec) -> Connection:
        if host.name not in self._connections:
            self._connections[host.name] = Connection(host, host.key_path(self.inventory_file.parent),
                                                      self.known_hosts, self.accept_new)
        return self._connections[host.name]

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    def _records(self) -> dict[str, HostRecord]:
        """What the state file holds about each host changed so far."""
        record = self.state.backend_state if self.state is not None else None
        return record.hosts if isinstance(record, SshState) else {}

    def _save(self) -> None:
        assert self.state is not None
        with self._state_lock:
            save_state(self.state)

    # --- bring-up ---------------------------------------------------------------------------------
    def attach(self, plan: HostsPlan, state: FabricState) -> None:
        self.hosts_plan, self.state = plan, state

    def up(self, plan: HostsPlan, state: FabricState | None = None) -> None:
        """Prepare and shape every host; on any failure or interrupt, undo what was done and raise."""
        self.hosts_plan, self.state = plan, state
        try:
            archive = source_archive()

            def prepare_and_shape(item: HostPlan) -> None:
                cancel.check()
                self._progress(f"{item.host.name}: shipping code and shaping {item.host.interface}")
                self._prepare(item, archive)
                self._shape_host(item)

            each_at_once(prepare_and_shape, plan.hosts)  # each checks cancel between its steps
            if any(item.delay_line for item in plan.hosts):
                cancel.check()
                self._start_delay_lines(plan)
        except BaseException as error:
            try:
                self.down()
            except FabricError as undo:
                raise FabricError(f"{error}; and then {undo}") from None
            if isinstance(error, RemoteError):
                raise FabricError(str(error)) from None
            raise

    def _prepare(self, item: HostPlan, archive: bytes) -> None:
        connection = self.connect(item.host)
        dev = item.host.interface
        root = json.loads(connection.check(["tc", "-j", "qdisc", "show", "dev", dev, "root"],
                                           f"reading the qdisc of {dev}") or "[]")
        kind, handle = (root[0].get("kind", "?"), root[0].get("handle", "?")) if root else ("none", "0:")
        if handle == ROOT_HANDLE:
            raise RemoteError(f"host {item.host.name}: {dev} is already shaped by testbed (root qdisc {handle}); "
                              "run `testbed clean` with that testbed's prefix first")
        if handle != "0:":
            raise RemoteError(f"host {item.host.name}: {dev} has a configured root qdisc ({kind} {handle}); "
                              "testbed will not replace it: remove it or name another interface")
        memory = self._memory_dir(connection, item)
        with self._state_lock:
            self._records()[item.host.name] = HostRecord(item.workdir, dev, f"{kind} {handle}", memory_dir=memory)
            self._save()
        connection.check(["mkdir", "-p", f"{item.workdir}/src", *([memory] if memory else [])], "creating the workdir",
                         sudo=False)
        connection.sftp().putfo(io.BytesIO(archive), f"{item.workdir}/src.tar.gz")
        connection.check([item.host.python, "-c", EXTRACT, f"{item.workdir}/src.tar.gz", f"{item.workdir}/src"],
                         "unpacking testbed", sudo=False)

    def _shape_host(self, item: HostPlan) -> None:
        connection = self.connect(item.host)
        record = self._records()[item.host.name]
        for argv in item.apply:
            cancel.check()
            with self._state_lock:
                record.changed.append(list(argv))
                self._save()  # recorded before it runs: a crash mid-way is undone
            connection.check(list(argv), shlex.join(argv[:3]))

    def _memory_dir(self, connection: Connection, item: HostPlan) -> str:
        """plan.hosts.memory_dir where the host's MEMORY_ROOT is a tmpfs (or ramfs), else "" (the workdir)."""
        if not item.delay_line:
            return ""
        kind = connection.run(["stat", "-f", "-c", "%T", MEMORY_ROOT], sudo=False)
        return memory_dir(item.host, self.prefix) if kind.code == 0 and kind.stdout.strip() in ("tmpfs", "ramfs") \
            else ""

    def _delay_files(self, item: HostPlan) -> DelayLineFiles:
        """The host's delay-line files: in its memory directory where it has one (recorded), else its workdir."""
        record = self._records().get(item.host.name)
        return DelayLineFiles.named(Path(record.memory_dir if record and record.memory_dir else item.workdir),
                                    item.host.name)

    def _write_delay_config(self, item: HostPlan) -> None:
        config = str(self._delay_files(item).config)
        sftp = self.connect(item.host).sftp()
        with sftp.open(config + ".tmp", "w") as out:
            out.write(dump_config(item.delay_line))
        sftp.posix_rename(config + ".tmp", config)

    def _start_delay_lines(self, plan: HostsPlan) -> None:
        started: list[HostPlan] = []
        for item in plan.hosts:
            if not item.delay_line:
                continue
            self._progress(f"{item.host.name}: starting the userspace delay line")
            files = self._delay_files(item)
            self._write_delay_config(item)
            proc = RemoteProcess(self.connect(item.host), [item.host.python, "-m", DELAY_LINE_MODULE, "supervise",
                                                           str(files.config)],
                                 env={"PYTHONPATH": f"{item.workdir}/src"}, cwd=item.workdir, sudo=item.host.sudo,
                                 log=str(files.log))
            self._records()[item.host.name].delay_line_pid = proc.pid
            self._save()
            started.append(item)
        waiting = list(started)

        def all_ready() -> bool:
            cancel.check()
            for item in list(waiting):
                status = self._delay_status(item)
                if status is not None and status.ready:
                    waiting.remove(item)
                elif self._delay_line_dead(item):
                    raise self._did_not_start(item)
            return not waiting

        if not wait_for(all_ready, DELAY_LINE_START_S, interval=0.05):
            raise self._did_not_start(waiting[0])

    def _did_not_start(self, item: HostPlan) -> RemoteError:
        log = self._read(item, str(self._delay_files(item).log)).strip().splitlines()[-1:]
        return RemoteError(f"host {item.host.name}: delay line did not start: {' '.join(log) or 'timed out'}")

    def _read(self, item: HostPlan, path: str) -> str:
        try:
            with self.connect(item.host).sftp().open(path) as src:
                return src.read().decode(errors="replace")
        except OSError:
            return ""

    def _delay_status(self, item: HostPlan) -> DelayLineStatus | None:
        return DelayLineStatus.parse(self._read(item, str(self._delay_files(item).status)))

    def _supervisor_pid(self, item: HostPlan) -> int | None:
        """The delay-line supervisor started on this host, as recorded in the state."""
        record = self._records().get(item.host.name)
        return record.delay_line_pid if record is not None else None

    def delay_line_stats(self) -> dict[str, dict]:
        """Each receiving host's delay-line figures (its worker is asked for them: kill -USR2)."""
        items = [item for item in self._require().hosts if item.delay_line]

        def ask(item: HostPlan) -> None:
            status = self._delay_status(item)
            if status is not None and status.worker:
                self.connect(item.host).run(["kill", "-USR2", str(status.worker)], sudo=item.host.sudo)

        return fresh_stats(items, lambda item: self._read(item, str(self._delay_files(item).stats)), ask,
                           timeout=3.0)

    def _delay_line_dead(self, item: HostPlan) -> bool:
        pid = self._supervisor_pid(item)
        return pid is None or self.connect(item.host).run(["kill", "-0", str(pid)], sudo=item.host.sudo).code != 0

    # --- teardown ---------------------------------------------------------------------------------
    def down(self) -> None:
        """Undo every recorded change on every host; hosts that cannot be reached are named in one line."""
        plan = self._require()
        recorded = self._records()

        def undo(item: HostPlan) -> str | None:
            try:
                self._undo(item)
            except RemoteError as error:
                return str(error)
            return None

        touched = [item for item in plan.hosts if self.state is None or item.host.name in recorded]  # others: never
        failed = [error for error in each_at_once(undo, touched) if error is not None]
        self.close()
        if failed:
            raise FabricError("could not restore every host (the state file is kept; run `testbed clean` again): "
                              + "; ".join(failed))

    def _undo(self, item: HostPlan) -> None:
        host, dev = item.host, item.host.interface
        connection = self.connect(host)
        connection.check([host.python, "-c", KILL_IN_DIR, item.workdir], "stopping testbed processes")
        for tokens, _ in self._our_rules(connection, required=False):
            connection.check(["iptables", "-w", "-t", "mangle", "-D", *tokens[1:]], "removing an iptables rule")
        root = json.loads(connection.check(["tc", "-j", "qdisc", "show", "dev", dev, "root"],
                                           f"reading the qdisc of {dev}") or "[]")
        if root and root[0].get("handle") == ROOT_HANDLE:
            connection.check(["tc", "qdisc", "del", "dev", dev, "root", "handle", ROOT_HANDLE], "removing the qdisc")
        record = self._records().get(host.name)
        ours = [d for d in (item.workdir, record.memory_dir if record else "") if d and self.prefix in d]
        if ours:  # never remove a directory we did not name
            connection.check(["rm", "-rf", "--", *ours], "removing the workdir")
        if self.state is not None:
            with self._state_lock:
                self._records().pop(host.name, None)
                self._save()

    def _our_rules(self, connection: Connection, counters: bool = False,
                   required: bool = True) -> list[tuple[list[str], str]]:
        """This testbed's mangle PREROUTING rules on a host: (`iptables -S` tokens, comment tag)."""
        argv = ["iptables", "-w", "-t", "mangle", "-S", "PREROUTING", *(["-v"] if counters else [])]
        if required:
            text = connection.check(argv, "reading iptables rules")
        else:  # undo on a host that may never have had iptables
            out = connection.run(argv)
            text = out.stdout if out.code == 0 else ""
        ours = comment(self.prefix)
        rules = []
        for line in text.splitlines():
            tokens = shlex.split(line)
            if tokens[:2] == ["-A", "PREROUTING"] and "--comment" in tokens:
                tag = tokens[tokens.index("--comment") + 1]
                if tag == ours or tag.startswith(ours + ":"):
                    rules.append((tokens, tag))
        return rules

    # --- use --------------------------------------------------------------------------------------
    def popen(self, node: str, argv: list[str], **kwargs: Any) -> RemoteProcess:
        """Start argv on the host playing `node` (a node name such as east-0, or the host's inventory name)."""
        item = self._host(node)
        argv = [item.host.python, *argv[1:]] if argv and argv[0] == sys.executable else list(argv)
        env, run, mkdirs = self._node_env(item, kwargs.get("env"))
        try:
            return RemoteProcess(self.connect(item.host), argv, env=env, cwd=run, mkdirs=mkdirs,
                                 stdout=kwargs.get("stdout"), stderr=kwargs.get("stderr"), text=kwargs.get("text", False))
        except RemoteError as error:
            raise FabricError(str(error)) from None

    def _host(self, node: str) -> HostPlan:
        try:
            return self._require().host(node)
        except KeyError as error:
            raise FabricError(str(error.args[0])) from None

    def _node_env(self, item: HostPlan, env: dict[str, str] | None) -> tuple[dict[str, str], str, tuple[str, ...]]:
        """A command's environment on `item`'s host (the env contract, the shipped sources, its interface and
        directories the host's own), its working directory and the directories to create there first."""
        env = pass_env(env)
        env["PYTHONPATH"] = f"{item.workdir}/src"
        if "GLOO_SOCKET_IFNAME" in env:
            env["GLOO_SOCKET_IFNAME"] = item.host.interface
        run = f"{item.workdir}/run"
        mkdirs = [run]
        if rankenv.METRICS_DIR in env:
            local = env[rankenv.METRICS_DIR]
            env[rankenv.METRICS_DIR] = self._remote_dir(item, local)
            mkdirs.append(env[rankenv.METRICS_DIR])
            self._outputs.setdefault(local, set()).add(item.host.name)
        if rankenv.CHECKPOINT_DIR in env:  # the host's own copy (restarts find it there; not fetched)
            env[rankenv.CHECKPOINT_DIR] = self._remote_dir(item, env[rankenv.CHECKPOINT_DIR])
        return env, run, tuple(mkdirs)

    def fork_server(self, preload: str, log: Path, env: dict[str, str]) -> NodeForkServers:
        """A fork server on every node's host (its output to log's forkserver-NODE.log), all importing `preload`
        at once: a rank then starts in a fraction of a second instead of importing torch itself."""
        def open_channel(node: str, node_log: Path) -> SessionChannel:
            item = self._host(node)
            there, run, mkdirs = self._node_env(item, env)
            return SessionChannel(self.connect(item.host), [item.host.python, "-m", forkserver.MODULE, forkserver.STDIO,
                                                            preload], env=there, cwd=run, mkdirs=mkdirs, log=node_log)

        return NodeForkServers.start([node.name for node in self._require().nodes], log, open_channel,
                                     lambda node, env: self._node_env(self._host(node), env))

    @staticmethod
    def _remote_dir(item: HostPlan, local: str) -> str:
        return f"{item.workdir}/out/{hashlib.sha1(local.encode()).hexdigest()[:12]}"

    def fetch_outputs(self, local: Path) -> None:
        """Copy what the hosts wrote into their copy of `local` (metrics files) back into `local`."""
        plan = self._require()
        local.mkdir(parents=True, exist_ok=True)
        for name in sorted(self._outputs.pop(str(local), set())):
            item = plan.host(name)
            sftp = self.connect(item.host).sftp()
            remote = self._remote_dir(item, str(local))
            for entry in sftp.listdir(remote):
                sftp.get(f"{remote}/{entry}", str(local / entry))

    def shape(self, key: str, params: LinkParams) -> None:
        """Change one direction live: `tc change` on the sending hosts, the delay line on the receiving ones."""
        self.impair_all({key: params})

    def impair(self, key: str, params: LinkParams) -> None:
        self.impair_all({key: params})

    def prepare_rank_faults(self, nodes: list[str]) -> None:
        """Open the kept-open shell of every host running a rank on `nodes` (a kill is a `kill` written to it, a
        straggler's loop is started from it)."""
        plan = self._require()
        hosts = {plan.host(node).host.name: plan.host(node).host for node in nodes}
        each_at_once(lambda host: self.connect(host).open_shell(), list(hosts.values()))

    def node_script(self, node: str, lines: list[str], timeout: float = 30.0) -> tuple[int, str]:
        """Run shell `lines` in the kept-open shell of the host playing `node` (no new SSH session)."""
        try:
            host = self._require().host(node).host
        except KeyError as error:
            raise FabricError(str(error.args[0])) from None
        out = self.connect(host).script(lines, timeout)  # a RemoteError (a FabricError) names the host
        return out.code, out.stdout

    def prepare_link_faults(self) -> None:
        """Connect to every host in parallel and open its kept-open shell: an SSH handshake and a new session
        are most of a first change (which needs no SFTP: impair_all writes the delay line's configuration in
        the same script)."""
        each_at_once(lambda item: self.connect(item.host).open_shell(), self._require().hosts)

    def impair_all(self, changes: dict[str, LinkParams]) -> None:
        """Change directions live, every host at once (its own connection's kept-open shell): `tc change` of
        each pair it sends whose route crosses a changed direction (the direction itself, and every pair composed
        over it), one new delay-line configuration (and SIGHUP) if it receives any."""
        plan = self._require()
        assert self.state is not None
        new = build_hosts_plan(self.topology, self.inventory, plan.shaper, self.prefix,
                               {**self.state.applied_params(), **changes}, plan.inventory_file)

        def update(item: HostPlan) -> None:
            """One script per host: its tc changes, then the delay line's new configuration and reload."""
            commands, reload = new.reshape_commands(item, changes)
            script = list(map(shlex.join, commands))
            gone = f"host {item.host.name}: its delay line is not running; run `testbed up` again"
            if reload:
                pid = self._supervisor_pid(item)
                if not pid:
                    raise RemoteError(gone)
                config = str(self._delay_files(item).config)  # written in the same exec: no SFTP round trips
                script += [f"printf %s {shlex.quote(dump_config(item.delay_line))} > {shlex.quote(config + '.tmp')}",
                           f"mv {shlex.quote(config + '.tmp')} {shlex.quote(config)}",
                           f"kill -HUP {pid} || exit {DELAY_LINE_GONE}"]
            if not script:
                return
            connection = self.connect(item.host)
            out = connection.script(script)
            if out.code == DELAY_LINE_GONE:
                raise RemoteError(gone)
            if out.code != 0:
                raise connection.failure(out, f"re-shaping {', '.join(changes)}")

        pairs = [pair.split("->") for pair in new.crossing(changes)]
        touched = [item for item in new.hosts if any(item.node.dc in pair for pair in pairs)]
        try:
            each_at_once(update, touched)
        except RemoteError as error:
            raise FabricError(str(error)) from None
        self.hosts_plan = new

    def counters(self) -> dict[str, LinkCounters]:
        """Per direction: bytes/packets/drops of the leaf under each sending host's class for the peer DC,
        and what the receiving hosts' accounting rules counted arriving from it; a pair routed over several
        links counts on each link it crosses, as the netns backend's gateways count it."""
        plan = self._require()
        totals = HopTotals(plan)
        for item in plan.hosts:
            connection = self.connect(item.host)
            qdiscs = json.loads(connection.check(["tc", "-s", "-j", "qdisc", "show", "dev", item.host.interface],
                                                 "reading tc counters") or "[]")
            totals.add_qdiscs(item, qdiscs)
            for tokens, tag in self._our_rules(connection, counters=True):
                peer = tag.rsplit(":rx:", 1)[1] if ":rx:" in tag else None
                if peer is not None:
                    at = tokens.index("-c")
                    totals.add_received(f"{peer}->{item.node.dc}", int(tokens[at + 2]), int(tokens[at + 1]))
        return {key: LinkCounters(*values) for key, values in totals.counters().items()}

    def status(self) -> dict[str, Any]:
        plan = self._require()
        return {"backend": "ssh", "summary": f"{len(plan.hosts)} hosts shaped over SSH",
                "inventory": str(self.inventory_file), "composed": dict(plan.composed()),
                "hosts": [{"node": item.node.name, "host": item.host.name, "address": item.host.address,
                           "interface": item.host.interface} for item in plan.hosts]}

    def delay_applied(self, end: LinkEnd) -> bool:
        plan = self._require()
        if plan.shaper == "netem":
            return True
        dst = end.key.split("->")[1]
        dead = set(self.dead_delay_lines())
        return not any(item.node.dc == dst and item.host.name in dead for item in plan.hosts)

    def dead_delay_lines(self) -> list[str]:
        """Hosts whose delay line is planned but not running (checked over SSH at most every 2 s)."""
        plan = self._require()
        now = time.monotonic()
        if self._health is None or now - self._health[0] > HEALTH_CACHE_S:
            try:
                dead = [item.host.name for item in plan.hosts if item.delay_line and self._delay_line_dead(item)]
            except RemoteError as error:
                raise FabricError(str(error)) from None
            self._health = (now, dead)
        return list(self._health[1])
