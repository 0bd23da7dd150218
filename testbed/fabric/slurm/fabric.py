"""The Slurm fabric: a job's nodes, shaped by a root step, commands started as `srun --overlap` job steps.

`up` writes the job plan to the shared directory, asks for the allocation (`salloc --no-shell`, the job's comment
naming the plan) unless it runs inside one, asks every node what it has (its interface, netem, root or sudo), then
has the nodes shaped: by the site's Prolog (which ran at the allocation's start: up reads its prolog.json) or by a
`sudo -n` step running testbed.fabric.slurm.node apply. Every change is recorded in the state file first; `down`
restores every node (a root step, else the Epilog at the job's end) and ends the job it asked for.

Ranks, probe agents and commands are `srun` steps of one task on one node (a subprocess here, which Slurm connects
to the task there: its output, exit status and signals); the nodes share the file system the job plan is on (the
metrics directory included), as Slurm clusters do."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from testbed import rankenv
from testbed.agents import forkserver
from testbed.agents.delayline.control import fresh_stats
from testbed.agents.tc import LinkCounters
from testbed.atomic import write_text
from testbed.fabric import cancel
from testbed.fabric.base import Fabric
from testbed.fabric.errors import FabricError, NotSupported
from testbed.fabric.forkserver import NodeForkServers
from testbed.fabric.kept_shell import ShellEnded, run_script
from testbed.fabric.parallel import each_at_once
from testbed.fabric.shipping import pass_env
from testbed.fabric.slurm.cluster import granted_job, parse_job, salloc_argv
from testbed.fabric.slurm.jobplan import COMMENT_TAG, JobPlan, PlacedNode, SlurmPlan, slurm_plan
from testbed.fabric.slurm.node import dirs_of
from testbed.fabric.slurm.state import SlurmState
from testbed.fabric.state import FabricState
from testbed.fabric.state import save as save_state
from testbed.plan.delayline import dump_config
from testbed.plan.hosts import HopTotals, HostPlan
from testbed.plan.view import LinkEnd
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology

NODE_MODULE = "testbed.fabric.slurm.node"
STEP_TIMEOUT_S = 120.0
PROLOG_WAIT_S = 60.0
JOB_END_S = 60.0
HEALTH_CACHE_S = 2.0
COUNTERS_SPLIT = "--testbed-counters--"
INTERFACE = "<the node's interface>"
# what a rank's NCCL is told unless the run's environment says otherwise: InfiniBand and RoCE go around the kernel's
# qdiscs, so cross-DC collectives must take TCP sockets on the shaped interface for the emulated links to apply
RANK_NCCL = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": INTERFACE}
DELAY_LINE_GONE = 17  # a re-shape script's exit status when the node's delay line is not there to reload


def job_name(prefix: str) -> str:
    return f"testbed-{prefix.rstrip('-') or 'testbed'}"


def slurm(argv: list[str], timeout: float = 30.0, what: str = "") -> str:
    """Run a Slurm client command; its stdout, or a FabricError with its last line."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise FabricError(f"{argv[0]}: not found (the Slurm client commands must be on PATH)") from None
    except subprocess.TimeoutExpired:
        raise FabricError(f"{shlex.join(argv[:3])}: no answer within {timeout:g} s") from None
    if out.returncode != 0:
        last = (out.stderr or out.stdout).strip().splitlines()[-1:]
        raise FabricError(f"{what or shlex.join(argv[:3])}: {' '.join(last) or f'exit {out.returncode}'}")
    return out.stdout


def job_state(job_id: str) -> str:
    """The job's state (RUNNING, PENDING, COMPLETED ...), or GONE once slurmctld has forgotten it."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return "GONE"
    return parse_job(out.stdout).state


def end_job(job_id: str, timeout: float = JOB_END_S) -> None:
    """scancel the job and wait until it has ended (its Epilog has then run on every node)."""
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    deadline = time.monotonic() + timeout
    while job_state(job_id) in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"):
        if time.monotonic() > deadline:
            raise FabricError(f"job {job_id} has not ended {timeout:g} s after scancel")
        time.sleep(0.2)


def find_job(prefix: str) -> str:
    """The job testbed asked for under `prefix` (by its name), "" when none is queued or running."""
    try:
        out = subprocess.run(["squeue", "-h", "--me", "-n", job_name(prefix), "-o", "%i"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else ""


def can_be_root() -> bool:
    """Whether a step of ours can run as root on the nodes (we are root, or sudo -n works here)."""
    if os.geteuid() == 0:
        return True
    try:
        return subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def restore_by_job(prefix: str, nodes: list[str], timeout: float = STEP_TIMEOUT_S) -> None:
    """A job of its own on `nodes` that restores each (the testbed's job has ended: scancel, time limit)."""
    argv = ["srun", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}", "--ntasks-per-node=1",
            f"--ntasks={len(nodes)}", "--immediate=60", f"--job-name=testbed-clean-{prefix.rstrip('-')}", "--quiet",
            *(["sudo", "-n", "--preserve-env=PYTHONPATH"] if os.geteuid() != 0 else []),
            sys.executable, "-m", NODE_MODULE, "restore", prefix]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise FabricError(f"the cleanup job on {','.join(nodes)} did not end within {timeout:g} s") from None
    if out.returncode != 0:
        last = (out.stderr or out.stdout).strip().splitlines()[-1:]
        raise FabricError(f"the cleanup job on {','.join(nodes)}: {' '.join(last) or f'exit {out.returncode}'}")


def merge_figures(a: dict, b: dict) -> dict:
    """One direction's delay-line figures from two receiving nodes (each node of the DC runs its own delay line):
    packets released (and warmed) and lateness buckets added up, the rest from the node that released more."""
    first, second = (a, b) if a.get("released", 0) >= b.get("released", 0) else (b, a)
    late = dict(first.get("late", {}))
    for bucket, count in second.get("late", {}).items():
        late[bucket] = late.get(bucket, 0) + count
    return {**first, "released": first.get("released", 0) + second.get("released", 0),
            **{key: first.get(key, 0) + second.get(key, 0) for key in ("warmed", "woke_late", "cold")}, "late": late}


class NodeShell:
    """A root shell kept open on one node (`srun --overlap ... [sudo -n] sh`, its stdin and stdout piped here): a live
    change is a script written to it, not a new job step (whose start and python import took 0.8 s here)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 0.0))
        return os.read(self.proc.stdout.fileno(), 65536) if ready else b""

    def script(self, lines: list[str], timeout: float = 30.0) -> tuple[int, str]:
        return run_script(self.send, self.recv, lines, timeout)

    def close(self) -> None:
        _end(self.proc)


def _end(proc: subprocess.Popen) -> None:
    """Close our end of `proc`'s stdin (the step ends with it), wait for it, and kill it if it does not end."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class SrunChannel:
    """A fork server on one node (testbed.fabric.forkserver.Channel): an `srun` step whose stdin and stdout are
    piped here, its stderr to `log`. Closing our end ends the server's stdin, and the server with its ranks."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                         start_new_session=True)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> bytes | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 0.0))
        if not ready:
            return None
        try:
            return os.read(self.proc.stdout.fileno(), 1 << 16)
        except OSError:
            return b""

    def close(self) -> None:
        _end(self.proc)


class SlurmFabric(Fabric[SlurmPlan]):
    """The nodes of one Slurm job."""

    link_faults = True  # a live change is a root step on the touched nodes (sudo); refused under the Prolog alone
    delays_on_nodes = True  # each receiving node runs its own delay line (jobplan)

    def __init__(self, prefix: str, topology: Topology, options: Any,
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.prefix, self.topology, self.options = prefix, topology, options
        self.hosts_plan: SlurmPlan | None = None
        self.job: JobPlan | None = None
        self.state: FabricState | None = None
        self._progress = on_progress or (lambda message: None)
        self._health: tuple[float, list[str]] | None = None
        self._shells: dict[str, NodeShell] = {}  # Slurm node -> its kept root shell

    @property
    def plan(self) -> SlurmPlan | None:
        return self.hosts_plan

    def _record(self) -> SlurmState:
        assert self.state is not None and isinstance(self.state.backend_state, SlurmState)
        return self.state.backend_state

    def _save(self) -> None:
        assert self.state is not None
        save_state(self.state)

    # --- steps ------------------------------------------------------------------------------------
    def srun_argv(self, slurm_node: str, argv: list[str], root: bool = False, cwd: str | None = None) -> list[str]:
        """One task on one node of the job, sharing its resources with the other steps."""
        record = self._record()
        out = ["srun", f"--jobid={record.job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={slurm_node}",
               "--quiet", "--export=ALL", *([f"--chdir={cwd}"] if cwd else [])]
        if root and os.geteuid() != 0:
            out += ["sudo", "-n", "--preserve-env=PYTHONPATH"]
        return [*out, *argv]

    def _node_call(self, slurm_node: str, args: list[str], root: bool = False,
                   timeout: float = STEP_TIMEOUT_S) -> dict:
        """testbed.fabric.slurm.node on one node, its JSON answer; FabricError naming the node otherwise."""
        argv = self.srun_argv(slurm_node, [sys.executable, "-m", NODE_MODULE, *args], root=root)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self._env({}))
        except subprocess.TimeoutExpired:
            raise FabricError(f"{slurm_node}: {args[0]} did not answer within {timeout:g} s") from None
        if out.returncode != 0:
            last = (out.stderr or out.stdout).strip().splitlines()[-1:]
            raise FabricError(f"{slurm_node}: {args[0]}: {' '.join(last) or f'exit {out.returncode}'}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        """srun's environment: ours (SLURM_CONF, PATH), without another job's SLURM_ step variables, and the env
        contract of `env` (exported to the task by --export=ALL)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_STEP", "SLURM_PROCID", "SLURM_NTASKS",
                                                                          "SLURM_NPROCS", "SLURM_TASKS_PER_NODE"))}
        return {**base, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **pass_env(env)}

    # --- bring-up ---------------------------------------------------------------------------------
    def attach(self, plan: SlurmPlan, state: FabricState) -> None:
        self.hosts_plan, self.job, self.state = plan, plan.job, state

    def up(self, plan: SlurmPlan, state: FabricState) -> None:
        """Allocate (or adopt the allocation), inspect, shape; on any failure or interrupt undo and raise."""
        self.hosts_plan, self.job, self.state = plan, plan.job, state
        record = self._record()
        job = plan.job
        try:
            path = Path(record.plan_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, job.dump())
            if not record.job_id:
                self._allocate(job, record)
            cancel.check()
            self._inspect(job, record)
            cancel.check()
            self._shape(record)
        except BaseException as error:
            try:
                self.down()
            except FabricError as undo:
                raise FabricError(f"{error}; and then {undo}") from None
            raise

    def _allocate(self, job: JobPlan, record: SlurmState) -> None:
        nodes = [item.slurm for item in job.nodes]
        options = self.options
        argv = salloc_argv(nodes, job_name(self.prefix), f"{COMMENT_TAG}{self.prefix}:{record.plan_file}",
                           partition=options.partition, account=options.account, time=options.time, qos=options.qos)
        self._progress(f"asking Slurm for {len(nodes)} nodes: {','.join(nodes)}")
        record.submitted = True  # from here, down and clean look for the job by its name
        self._save()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self._env({}))
        try:
            _, err = proc.communicate(timeout=options.wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err = (err or "") + f"\nnot granted within {options.wait:g} s (--wait)"
        finally:
            if proc.poll() is None:
                proc.kill()
        found = granted_job(err or "")
        if found:
            record.job_id = found
            self._save()
        if proc.returncode != 0 or not found or "Granted" not in (err or ""):
            last = (err or "").strip().splitlines()[-1:]
            raise FabricError(f"salloc: {' '.join(last) or f'exit {proc.returncode}'}")
        self._progress(f"job {found} granted")

    def _inspect(self, job: JobPlan, record: SlurmState) -> None:
        """Every node's interface towards another DC, netem and root; the shaper settled; the plan rewritten."""
        def ask(item: PlacedNode) -> dict:
            peer = next((other.address for other in job.nodes if other.dc != item.dc), item.address)
            return self._node_call(item.slurm, ["inspect", peer])

        answers = dict(zip([item.slurm for item in job.nodes], each_at_once(ask, job.nodes)))
        if record.root == "sudo":
            cannot = [name for name, found in answers.items() if not found["sudo"]]
            if cannot:
                raise FabricError(f"sudo -n does not work for you on {', '.join(cannot)}, and the Prolog was not "
                                  "chosen: ask for passwordless sudo of tc/iptables or the testbed Prolog/Epilog")
        no_netem = [name for name, found in answers.items() if not found["netem"]]
        if self.state is not None and self.state.shaper in ("netem", "auto"):
            if self.state.shaper == "netem" and no_netem:
                raise FabricError(f"shaper netem requested but sch_netem is missing on {', '.join(no_netem)}; "
                                  "use --shaper auto")
            if self.state.shaper == "auto":
                self.state.shaper = "userspace-delay" if no_netem or record.root == "prolog" else "netem"
                job.shaper = self.state.shaper
        job.nodes = [PlacedNode(item.node, item.dc, item.slurm, item.address, answers[item.slurm]["interface"])
                     for item in job.nodes]
        record.nodes = [vars(item) for item in job.nodes]
        self._save()
        write_text(Path(record.plan_file), job.dump())
        self.hosts_plan = slurm_plan(job)

    def _shape(self, record: SlurmState) -> None:
        job = self.job
        assert job is not None
        if record.root == "prolog":
            self._progress("reading what the Prolog did on each node")
            each_at_once(self._prolog_result, job.nodes)
            record.shaped = [item.slurm for item in job.nodes]
            self._save()
            return
        record.shaped = [item.slurm for item in job.nodes]  # recorded before it runs
        self._save()
        self._progress(f"shaping {len(job.nodes)} nodes (sudo -n)")
        uid, gid = str(os.getuid()), str(os.getgid())
        each_at_once(lambda item: self._node_call(item.slurm, ["apply", record.plan_file, uid, gid], root=True),
                     job.nodes)

    def _prolog_result(self, item: PlacedNode) -> None:
        workdir, _ = dirs_of(self.prefix, item.slurm)
        deadline = time.monotonic() + PROLOG_WAIT_S
        while True:
            argv = self.srun_argv(item.slurm, ["cat", f"{workdir}/prolog.json"])
            out = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=self._env({}))
            if out.returncode == 0 and out.stdout.strip():
                result = json.loads(out.stdout)
                if not result.get("ok"):
                    raise FabricError(f"{item.slurm}: the Prolog could not shape: {result.get('error')}")
                return
            if time.monotonic() > deadline:
                raise FabricError(f"{item.slurm}: the Prolog left no {workdir}/prolog.json (is testbed's Prolog "
                                  "installed? `testbed slurm prolog`)")
            time.sleep(0.5)

    # --- teardown ---------------------------------------------------------------------------------
    def down(self) -> None:
        """Restore every node and end the job testbed asked for: a root step in the job while it runs (sudo), its
        Epilog at its end (both), and once it has ended with nodes unrestored, a cleanup job of its own."""
        self.release_link_faults()
        record = self._record()
        failed: list[str] = []
        running = bool(record.job_id) and job_state(record.job_id) == "RUNNING"
        if running and record.root == "sudo" and record.shaped:
            def undo(slurm_node: str) -> str | None:
                try:
                    self._node_call(slurm_node, ["restore", self.prefix], root=True)
                except FabricError as error:
                    return str(error)
                return None

            failed = [error for error in each_at_once(undo, list(record.shaped)) if error]
            if not failed:
                record.shaped = []
                self._save()
        if record.submitted:
            job_id = record.job_id or find_job(self.prefix)
            if job_id:
                end_job(job_id)  # its Epilog restores each of its nodes
            record.job_id, record.submitted = "", False
            if record.root == "prolog":
                record.shaped = []
            self._save()
        if record.shaped and not running and can_be_root():  # the job ended first (scancel, time limit)
            restore_by_job(self.prefix, list(record.shaped))
            record.shaped, failed = [], []
            self._save()
        if failed or record.shaped:
            raise FabricError("could not restore every node (the state file is kept; run `testbed clean` again): "
                              + ("; ".join(failed) or f"{', '.join(record.shaped)}: no job runs there and sudo -n "
                                 "does not work here (the Epilog restores them)"))
        Path(record.plan_file).unlink(missing_ok=True)

    # --- use --------------------------------------------------------------------------------------
    def _placed(self, node: str) -> PlacedNode:
        assert self.job is not None
        try:
            return self.job.placed(node)
        except KeyError as error:
            raise FabricError(str(error.args[0])) from None

    def popen(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """argv as one task on the node that plays `node` (an `srun` step; its cwd the node's run directory)."""
        env, cwd, _ = self._node_env(node, kwargs.get("env"))
        srun = self.srun_argv(self._placed(node).slurm, list(argv), cwd=cwd)
        return subprocess.Popen(srun, env=self._env(env), stdout=kwargs.get("stdout"), stderr=kwargs.get("stderr"),
                                stdin=kwargs.get("stdin", subprocess.DEVNULL), text=kwargs.get("text", False),
                                start_new_session=kwargs.get("start_new_session", True))

    def _node_env(self, node: str, env: dict[str, str] | None) -> tuple[dict[str, str], str, tuple[str, ...]]:
        """A command's environment on `node` (the env contract, its interface for gloo and NCCL), its working
        directory there, and the directories to create first (none: the metrics directory is shared)."""
        placed = self._placed(node)
        there = pass_env(env)
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if name in there and placed.interface:
                there[name] = placed.interface
        if rankenv.RANK in there:  # a rank: NCCL over TCP on the shaped interface (RDMA would bypass the qdiscs)
            for name, value in RANK_NCCL.items():
                there.setdefault(name, placed.interface if value == INTERFACE else value)
        if rankenv.METRICS_DIR in there:
            Path(there[rankenv.METRICS_DIR]).mkdir(parents=True, exist_ok=True)  # shared with the nodes
        workdir, _ = dirs_of(self.prefix, placed.slurm)
        return there, f"{workdir}/run", ()

    def fork_server(self, preload: str, log: Path, env: dict[str, str]) -> NodeForkServers:
        """A fork server on every node (one `srun` step each), all importing `preload` at once."""
        def open_channel(node: str, node_log: Path) -> SrunChannel:
            there, cwd, _ = self._node_env(node, env)
            argv = self.srun_argv(self._placed(node).slurm, [sys.executable, "-m", forkserver.MODULE, forkserver.STDIO,
                                                              preload], cwd=cwd)
            return SrunChannel([*argv[:1], "--unbuffered", *argv[1:]], {**self._env(there), **there}, node_log)

        assert self.job is not None
        return NodeForkServers.start([item.node for item in self.job.nodes], log, open_channel, self._node_env)

    def shape(self, key: str, params: LinkParams) -> None:
        self.impair_all({key: params})

    def impair(self, key: str, params: LinkParams) -> None:
        self.impair_all({key: params})

    def prepare_link_faults(self) -> None:
        """Open every node's kept root shell now (a job step's start), before a fault's clock starts."""
        assert self.job is not None
        if self._record().root == "sudo":
            each_at_once(self._shell, [item.slurm for item in self.job.nodes])

    def release_link_faults(self) -> None:
        for shell in self._shells.values():
            shell.close()
        self._shells.clear()

    def _shell(self, slurm_node: str) -> NodeShell:
        if slurm_node not in self._shells:
            self._shells[slurm_node] = NodeShell(self.srun_argv(slurm_node, ["sh"], root=True), self._env({}))
        return self._shells[slurm_node]

    def impair_all(self, changes: dict[str, LinkParams]) -> None:
        """Change directions live, every touched node at once through its kept root shell: `tc change` of each
        direction it sends, the delay line's new configuration and SIGHUP where it receives one; the job plan is
        rewritten with what the links carry now."""
        record = self._record()
        if record.root != "sudo":
            raise NotSupported("live link changes on Slurm need sudo -n on the nodes (the Prolog shapes only at "
                               "the job's start)")
        assert self.job is not None and self.state is not None
        applied = {**self.state.applied_params(), **changes}
        self.job.overrides = {key: asdict(params) for key, params in applied.items()}
        new = slurm_plan(self.job)

        def update(item: HostPlan) -> None:
            commands, reload = new.reshape_commands(item, changes)  # every pair routed over a changed direction
            lines = [shlex.join(argv) for argv in commands]
            if reload:
                _, memory = dirs_of(self.prefix, item.host.name)
                config = f"{memory}/{item.host.name}.delayline.json"
                status = f"{memory}/{item.host.name}.delayline.status"
                lines += [f"printf %s {shlex.quote(dump_config(item.delay_line))} > {shlex.quote(config + '.tmp')}",
                          f"mv {shlex.quote(config + '.tmp')} {shlex.quote(config)}",
                          f"pid=$(sed -n 's/.*\"supervisor\": *\\([0-9]*\\).*/\\1/p' {shlex.quote(status)})",
                          f'kill -HUP "$pid" || exit {DELAY_LINE_GONE}']
            if not lines:
                return
            try:
                code, said = self._shell(item.host.name).script(lines)
            except (ShellEnded, OSError) as error:
                self._shells.pop(item.host.name, None)
                raise FabricError(f"{item.host.name}: its kept shell: {error}") from None
            if code == DELAY_LINE_GONE:
                raise FabricError(f"{item.host.name}: its delay line is not running; run `testbed up` again")
            if code != 0:
                raise FabricError(f"{item.host.name}: re-shaping {', '.join(changes)}: {said.strip()[-300:]}")

        pairs = [pair.split("->") for pair in new.crossing(changes)]
        touched = [item for item in new.hosts if any(item.node.dc in pair for pair in pairs)]
        each_at_once(update, touched)
        write_text(Path(record.plan_file), self.job.dump())
        self.hosts_plan = new

    def counters(self) -> dict[str, LinkCounters]:
        """Per direction: the sending nodes' leaf counters, the receiving nodes' accounting rules (a pair routed
        over several links counts on each: HopTotals)."""
        plan = self.hosts_plan
        assert plan is not None and self.job is not None
        totals = HopTotals(plan)
        if self._record().root == "sudo":
            answers = each_at_once(self._node_counters, list(plan.hosts))
        else:  # the Prolog's nodes: tc's statistics read as the job's user; the accounting rules need root
            answers = self._qdisc_counters([item.host.name for item in plan.hosts])
        for item, answer in zip(plan.hosts, answers):
            totals.add_qdiscs(item, answer["qdiscs"])
            for line in answer["rules"]:
                tokens = shlex.split(line)
                tag = tokens[tokens.index("--comment") + 1]
                peer = tag.rsplit(":rx:", 1)[1] if ":rx:" in tag else None
                if peer is not None and "-c" in tokens:
                    at = tokens.index("-c")
                    totals.add_received(f"{peer}->{item.node.dc}", int(tokens[at + 2]), int(tokens[at + 1]))
        return {key: LinkCounters(*values) for key, values in totals.counters().items()}

    def _qdisc_counters(self, nodes: list[str]) -> list[dict[str, Any]]:
        """Every node's tc statistics, one job step on all of them (no root: the sending side's counters only;
        what arrived stays 0, which the reports do not read: their bytes are what the senders' qdiscs sent)."""
        argv = ["srun", f"--jobid={self._record().job_id}", "--overlap", f"--nodes={len(nodes)}",
                f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--quiet",
                "sh", "-c", 'echo "$SLURMD_NODENAME $(tc -s -j qdisc show)"']
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=self._env({}))
        except subprocess.TimeoutExpired:
            raise FabricError(f"reading the counters of {','.join(nodes)}: no answer") from None
        if out.returncode != 0:
            last = (out.stderr or out.stdout).strip().splitlines()[-1:]
            raise FabricError(f"reading the counters of {','.join(nodes)}: {' '.join(last)}")
        found = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
        interfaces = {item.slurm: item.interface for item in self.job.nodes} if self.job else {}
        return [{"qdiscs": [q for q in json.loads(found.get(node) or "[]") if q.get("dev") == interfaces.get(node)],
                 "rules": []} for node in nodes]

    def _node_counters(self, item: HostPlan) -> dict[str, Any]:
        """A node's tc statistics and tagged accounting rules, read through its kept root shell."""
        dev = shlex.quote(item.host.interface)
        try:
            code, said = self._shell(item.host.name).script([
                f"tc -s -j qdisc show dev {dev}", f"echo {COUNTERS_SPLIT}",
                "iptables -w -t mangle -S PREROUTING -v"])
        except (ShellEnded, OSError) as error:
            self._shells.pop(item.host.name, None)
            raise FabricError(f"{item.host.name}: its kept shell: {error}") from None
        if code != 0 or COUNTERS_SPLIT not in said:
            raise FabricError(f"{item.host.name}: reading its counters: {said.strip()[-300:]}")
        qdiscs, rules = said.split(COUNTERS_SPLIT, 1)
        tag = f"testbed:{self.prefix}"
        ours = [line for line in rules.splitlines() if line.startswith("-A PREROUTING") and "--comment" in line
                and (f" {tag} " in line or f" {tag}:" in line or line.endswith(f" {tag}"))]
        return {"qdiscs": json.loads(qdiscs.strip() or "[]"), "rules": ours}

    def status(self) -> dict[str, Any]:
        record = self._record()
        assert self.job is not None
        return {"backend": "slurm", "summary": f"job {record.job_id}: {len(self.job.nodes)} nodes shaped by "
                f"{'the Prolog' if record.root == 'prolog' else 'sudo -n'}", "job": record.job_id,
                "composed": dict(self.hosts_plan.composed()) if self.hosts_plan else {},
                "hosts": [{"node": item.node, "host": item.slurm, "address": item.address,
                           "interface": item.interface} for item in self.job.nodes]}

    def delay_applied(self, end: LinkEnd) -> bool:
        assert self.hosts_plan is not None
        if self.hosts_plan.shaper == "netem":
            return True
        dst = end.key.split("->")[1]
        dead = set(self.dead_delay_lines())
        return not any(item.node.dc == dst and item.host.name in dead for item in self.hosts_plan.hosts)

    def delay_line_stats(self) -> dict[str, dict]:
        """Each receiving node's delay-line figures: its worker asked for them (SIGUSR2) and its stats file read,
        both through the node's kept root shell (the files are in the node's own memory)."""
        assert self.hosts_plan is not None
        if self._record().root != "sudo":
            return {}
        items = [item for item in self.hosts_plan.hosts if item.delay_line]

        def path(item: HostPlan, kind: str) -> str:
            _, memory = dirs_of(self.prefix, item.host.name)
            return shlex.quote(f"{memory}/{item.host.name}.delayline.{kind}")

        def read(item: HostPlan) -> str:
            code, said = self._script(item.host.name, [f"cat {path(item, 'stats')} 2>/dev/null || true"])
            return said if code == 0 else ""

        def ask(item: HostPlan) -> None:
            self._script(item.host.name, [
                f"pid=$(sed -n 's/.*\"worker\": *\\([0-9]*\\).*/\\1/p' {path(item, 'status')} 2>/dev/null)",
                '[ -n "$pid" ] && kill -USR2 "$pid" 2>/dev/null || true'])

        merged: dict[str, dict] = {}
        for figures in each_at_once(lambda item: fresh_stats([item], read, ask, timeout=3.0), items):
            for key, one in figures.items():
                merged[key] = merge_figures(merged[key], one) if key in merged else one
        return merged

    def _script(self, slurm_node: str, lines: list[str]) -> tuple[int, str]:
        try:
            return self._shell(slurm_node).script(lines)
        except (ShellEnded, OSError) as error:
            self._shells.pop(slurm_node, None)
            raise FabricError(f"{slurm_node}: its kept shell: {error}") from None

    def dead_delay_lines(self) -> list[str]:
        """Nodes whose delay line is planned but not running: one job step on all of them at once, a shell that
        reads each supervisor's pid from its status file (at most every 2 s)."""
        plan = self.hosts_plan
        assert plan is not None
        now = time.monotonic()
        if self._health is None or now - self._health[0] > HEALTH_CACHE_S:
            nodes = [item.host.name for item in plan.hosts if item.delay_line]
            alive = self._alive(nodes) if nodes else set()
            self._health = (now, [node for node in nodes if node not in alive])
        return list(self._health[1])

    def _alive(self, nodes: list[str]) -> set[str]:
        status = f"/dev/shm/{self.prefix}$SLURMD_NODENAME/$SLURMD_NODENAME.delayline.status"
        check = (f'pid=$(sed -n \'s/.*"supervisor": *\\([0-9]*\\).*/\\1/p\' "{status}" 2>/dev/null); '
                 '[ -n "$pid" ] && [ -d "/proc/$pid" ] && echo "alive $SLURMD_NODENAME" || true')
        argv = ["srun", f"--jobid={self._record().job_id}", "--overlap", f"--nodes={len(nodes)}",
                f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--quiet",
                "sh", "-c", check]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=self._env({}))
        except subprocess.TimeoutExpired:
            raise FabricError(f"asking {','.join(nodes)} for their delay lines: no answer") from None
        if out.returncode != 0:
            last = (out.stderr or out.stdout).strip().splitlines()[-1:]
            raise FabricError(f"asking {','.join(nodes)} for their delay lines: {' '.join(last)}")
        return {line.split()[1] for line in out.stdout.splitlines() if line.startswith("alive ")}
