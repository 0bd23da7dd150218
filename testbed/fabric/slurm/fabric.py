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

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed import rankenv
from testbed.agents.tc import LinkCounters
from testbed.atomic import write_text
from testbed.fabric import cancel
from testbed.fabric.base import Fabric
from testbed.fabric.errors import FabricError, NotSupported
from testbed.fabric.parallel import each_at_once
from testbed.fabric.shipping import pass_env
from testbed.fabric.slurm.cluster import granted_job, parse_job, salloc_argv
from testbed.fabric.slurm.jobplan import COMMENT_TAG, JobPlan, PlacedNode, hosts_plan
from testbed.fabric.slurm.node import dirs_of
from testbed.fabric.slurm.state import SlurmState
from testbed.fabric.state import FabricState
from testbed.fabric.state import save as save_state
from testbed.plan.hosts import HostsPlan
from testbed.plan.network import LinkEnd, NetworkPlan
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology

NODE_MODULE = "testbed.fabric.slurm.node"
STEP_TIMEOUT_S = 120.0
PROLOG_WAIT_S = 60.0
JOB_END_S = 60.0
HEALTH_CACHE_S = 2.0


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


class SlurmFabric(Fabric):
    """The nodes of one Slurm job."""

    link_faults = True  # a live change is a root step on the touched nodes (sudo); refused under the Prolog alone

    def __init__(self, prefix: str, topology: Topology, options: Any,
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.prefix, self.topology, self.options = prefix, topology, options
        self.hosts_plan: HostsPlan | None = None
        self.job: JobPlan | None = None
        self.state: FabricState | None = None
        self._progress = on_progress or (lambda message: None)
        self._health: tuple[float, list[str]] | None = None

    @property
    def plan(self) -> NetworkPlan | None:
        return self.hosts_plan.network if self.hosts_plan else None

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
    def attach(self, plan: Any, state: FabricState) -> None:
        self.hosts_plan, self.job, self.state = plan.hosts, plan.job, state

    def up(self, plan: Any, state: FabricState) -> None:
        """Allocate (or adopt the allocation), inspect, shape; on any failure or interrupt undo and raise."""
        self.hosts_plan, self.job, self.state = plan.hosts, plan.job, state
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
        self.hosts_plan = hosts_plan(job)

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
        placed = self._placed(node)
        env = pass_env(kwargs.get("env"))
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if name in env and placed.interface:
                env[name] = placed.interface
        if rankenv.METRICS_DIR in env:
            Path(env[rankenv.METRICS_DIR]).mkdir(parents=True, exist_ok=True)  # shared with the nodes
        workdir, _ = dirs_of(self.prefix, placed.slurm)
        srun = self.srun_argv(placed.slurm, list(argv), cwd=f"{workdir}/run")
        return subprocess.Popen(srun, env=self._env(env), stdout=kwargs.get("stdout"), stderr=kwargs.get("stderr"),
                                stdin=kwargs.get("stdin", subprocess.DEVNULL), text=kwargs.get("text", False),
                                start_new_session=kwargs.get("start_new_session", True))

    def shape(self, key: str, params: LinkParams) -> None:
        self.impair_all({key: params})

    def impair(self, key: str, params: LinkParams) -> None:
        self.impair_all({key: params})

    def impair_all(self, changes: dict[str, LinkParams]) -> None:
        """Rewrite the job plan with the change, then a root step on every node that sends or receives it."""
        record = self._record()
        if record.root != "sudo":
            raise NotSupported("live link changes on Slurm need sudo -n on the nodes (the Prolog shapes only at "
                               "the job's start)")
        assert self.job is not None and self.state is not None
        from dataclasses import asdict

        applied = {**self.state.applied_params(), **changes}
        self.job.overrides = {key: asdict(params) for key, params in applied.items()}
        write_text(Path(record.plan_file), self.job.dump())
        dcs = {dc for key in changes for dc in key.split("->")}
        touched = [item for item in self.job.nodes if item.dc in dcs]
        each_at_once(lambda item: self._node_call(item.slurm, ["reshape", record.plan_file, *changes], root=True),
                     touched)
        self.hosts_plan = hosts_plan(self.job)

    def counters(self) -> dict[str, LinkCounters]:
        """Per direction: the sending nodes' leaf counters, the receiving nodes' accounting rules."""
        plan = self.hosts_plan
        assert plan is not None and self.job is not None
        if self._record().root != "sudo":
            raise NotSupported("link counters on Slurm need sudo -n on the nodes")
        totals: dict[str, list[int]] = {end.key: [0, 0, 0, 0, 0] for end in plan.network.link_ends}
        answers = each_at_once(lambda item: self._node_call(item.slurm, ["counters", self.prefix], root=True),
                               list(plan.hosts))
        for item, answer in zip(plan.hosts, answers):
            for peer, classid in item.classes.items():
                for qdisc in answer["qdiscs"]:
                    if qdisc.get("parent") == classid:
                        row = totals[f"{item.node.dc}->{peer}"]
                        row[0] += qdisc.get("bytes", 0)
                        row[1] += qdisc.get("packets", 0)
                        row[4] += qdisc.get("drops", 0)
            for line in answer["rules"]:
                tokens = shlex.split(line)
                tag = tokens[tokens.index("--comment") + 1]
                peer = tag.rsplit(":rx:", 1)[1] if ":rx:" in tag else None
                if peer is not None and f"{peer}->{item.node.dc}" in totals and "-c" in tokens:
                    at = tokens.index("-c")
                    row = totals[f"{peer}->{item.node.dc}"]
                    row[3] += int(tokens[at + 1])
                    row[2] += int(tokens[at + 2])
        return {key: LinkCounters(*values) for key, values in totals.items()}

    def status(self) -> dict[str, Any]:
        record = self._record()
        assert self.job is not None
        return {"backend": "slurm", "summary": f"job {record.job_id}: {len(self.job.nodes)} nodes shaped by "
                f"{'the Prolog' if record.root == 'prolog' else 'sudo -n'}", "job": record.job_id,
                "hosts": [{"node": item.node, "host": item.slurm, "address": item.address,
                           "interface": item.interface} for item in self.job.nodes]}

    def delay_applied(self, end: LinkEnd) -> bool:
        assert self.hosts_plan is not None
        if self.hosts_plan.network.shaper == "netem":
            return True
        dst = end.key.split("->")[1]
        dead = set(self.dead_delay_lines())
        return not any(item.node.dc == dst and item.host.name in dead for item in self.hosts_plan.hosts)

    def dead_delay_lines(self) -> list[str]:
        """Nodes whose delay line is planned but not running (asked at most every 2 s)."""
        plan = self.hosts_plan
        assert plan is not None
        now = time.monotonic()
        if self._health is None or now - self._health[0] > HEALTH_CACHE_S:
            items = [item for item in plan.hosts if item.delay_line]
            answers = each_at_once(lambda item: self._node_call(item.host.name, ["alive", self.prefix]), items)
            self._health = (now, [item.host.name for item, answer in zip(items, answers)
                                  if answer["delay_line"] is not True])
        return list(self._health[1])
