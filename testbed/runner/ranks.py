"""Start one process per rank inside its node with torchrun's environment plus the TESTBED_* contract;
watch them: fail fast (which rank, why, its last log lines) when one dies, enforce the cell timeout.

Two launchers: `exec` starts every rank as a fresh python through the fabric (any command, any backend); `fork`
asks a fork server that imported the built-in workload once (testbed.agents.forkserver) to fork each rank into
its node, so ranks start in milliseconds and share torch's pages. Both give a rank the same environment, log,
exit status and signals."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from testbed import rankenv
from testbed.fabric.forkserver import Forks
from testbed.plan.network import NetworkPlan, Node
from testbed.rankenv import RankEnv
from testbed.runner.straggler import ShellStraggler, Straggler, start_straggler
from testbed.spec.topology import Topology
from testbed.steplog import closed

LOG_TAIL = 12
WORKLOAD = "testbed.workload"  # the built-in workload: what the fork launcher runs
PRELOAD = "testbed.workload.preload"  # what its fork server imports once
FORKABLE = (WORKLOAD, "testbed.workload.calibrate")  # modules that need nothing PRELOAD did not import
LAUNCHERS = ("auto", "fork", "exec")  # auto: fork where the backend can, else exec
# a bring-your-own command's ranks start with this directory first on PYTHONPATH: its sitecustomize installs the
# optimizer step hook of testbed.workload.autostep (step metrics without a line of the script changed)
AUTOSTEP_SITE = Path(__file__).resolve().parents[1] / "workload" / "autostep_site"
INTERPRETER_NOTE = "testbed: no torch in the interpreter this rank ran: "  # that hook's line, then the path
# signals a process raises on itself when its native teardown fails at exit (std::terminate's abort, a crash in a
# destructor); never a fault's or a user's kill (SIGKILL, SIGTERM, SIGINT)
TEARDOWN_SIGNALS = (signal.SIGABRT, signal.SIGSEGV)
# DDP keeps gloo's process group (its threads, rank 0's TCPStore server) alive after destroy_process_group(), so
# exit() can race them: "terminate called without an active exception" (see teardown_note)
TORCH_TEARDOWN = "https://github.com/pytorch/pytorch/issues/129477"


def workload_argv(args: list[str]) -> list[str]:
    """The command line of the built-in workload with `args` (what the exec launcher runs)."""
    return [sys.executable, "-m", WORKLOAD, *args]


def forked_module(argv: list[str]) -> str | None:
    """The module a fork server can run for `argv` (`python -m MODULE ...` of a FORKABLE module), else None."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in FORKABLE:
        return argv[2]
    return None


def base_env() -> dict[str, str]:
    """This process's environment without the variables the runner sets per rank."""
    return {k: v for k, v in os.environ.items() if not k.startswith((rankenv.PREFIX, "MASTER_", "RANK", "WORLD_"))}


def server_env() -> dict[str, str]:
    """The fork server's environment: what every rank's environment shares that is read at start-up (a fork
    has started already): one OpenMP thread (so torch's import starts none), unbuffered output."""
    return {**base_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def command_env(tokens_per_step: int | None = None) -> dict[str, str]:
    """What a bring-your-own command's ranks get beyond the contract: AUTOSTEP_SITE first on PYTHONPATH (before
    this process's own), and TESTBED_TOKENS_PER_STEP (all ranks together) when the user named it. (netns: the ranks
    see this machine's files; the docker and ssh fabrics set a PYTHONPATH of their own.)"""
    own = os.environ.get("PYTHONPATH")
    env = {"PYTHONPATH": os.pathsep.join([str(AUTOSTEP_SITE), *([own] if own else [])])}
    if tokens_per_step:
        env.update(RankEnv(tokens_per_step=tokens_per_step).to_env())
    return env


def missing_torch(argv: list[str], tail: list[str] | None) -> str | None:
    """Why a command's rank died when its interpreter has no torch, naming that interpreter (the rank printed its
    path: testbed.workload.autostep) and how the command named it; None for any other death."""
    ran = next((line.strip()[len(INTERPRETER_NOTE):] for line in reversed(tail or [])
                if line.startswith(INTERPRETER_NOTE)), None)
    if ran is None:
        return None
    typed = f"`{argv[0]}`" + (" (on the rank's PATH)" if os.sep not in argv[0] else "")
    return (f"{typed} ran {ran}, which cannot import torch: put the interpreter that has torch after --, e.g. "
            "`testbed run --topology T -- .venv/bin/python train.py`")


@dataclass(frozen=True)
class RankSpec:
    rank: int
    node: Node
    local_rank: int
    env: dict[str, str]


@dataclass
class Outcome:
    ok: bool
    reason: str = ""
    failed_rank: int | None = None
    log_tail: list[str] | None = None
    seconds: float = 0.0
    died: bool = False  # a rank exited non-zero (rather than a timeout or a health problem)


# NCCL between GPUs of one machine would use NVLink, PCIe or shared memory: under the emulated links, not through
# every backend: RDMA (InfiniBand, RoCE) bypasses the kernel's qdiscs, so NCCL must take TCP sockets for the shaped
# links to apply to it (real hosts over ssh included: there it would otherwise cross DCs unshaped)
SHAPED_NCCL = {"NCCL_IB_DISABLE": "1"}
# emulated nodes share one machine: its GPUs' peer-to-peer and shared-memory paths would bypass the emulated links
EMULATED_NCCL = {**SHAPED_NCCL, "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}


def rank_layout(topology: Topology, plan: NetworkPlan, ranks_per_node: int, metrics_dir: Path,
                extra_env: dict[str, str] | None = None, master_port: int | None = None,
                emulated: bool = True) -> list[RankSpec]:
    """Ranks numbered DC by DC, node by node. DCs may differ in size: TESTBED_DC_SIZES lists the ranks of
    every DC; TESTBED_NODES_PER_DC is set too when they are all the same. `emulated` (Backend.emulated): every
    node runs on this machine, so every rank shares its GPUs (TESTBED_GPU_SHARERS, TESTBED_GPU_SLOT: NCCL only
    when each rank has one of its own) and NCCL must take the emulated links like gloo: no peer-to-peer or
    shared-memory transport between GPUs of one machine, sockets on eth0 (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE,
    NCCL_SOCKET_IFNAME). On real hosts (ssh) a host's ranks share its GPUs and may use them."""
    sizes = [dc.nodes * ranks_per_node for dc in topology.dcs]
    world = len(plan.nodes) * ranks_per_node
    # below Linux's ephemeral range (32768-60999): a port in it can be taken by a connection's local end
    port = master_port or random.randint(20000, 32000)
    rtts = [2 * end.shaping.params.latency for end in plan.link_ends if end.kind == "inter-dc"]
    specs: list[RankSpec] = []
    for node in plan.nodes:  # plan order: DC by DC, node by node
        for local in range(ranks_per_node):
            rank = len(specs)
            told = RankEnv(master_addr=plan.nodes[0].address, master_port=port, rank=rank, world_size=world,
                           local_rank=local, local_world_size=ranks_per_node, group_rank=rank // ranks_per_node,
                           dc=node.dc_index, num_dcs=len(topology.dcs), dc_sizes=tuple(sizes),
                           nodes_per_dc=sizes[0] if len(set(sizes)) == 1 else None, node=node.name,
                           metrics_dir=str(metrics_dir), link_rtt_ms=max(rtts, default=0.0) * 1e3,
                           gpu_sharers=world if emulated else ranks_per_node, gpu_slot=rank if emulated else local)
            env = {
                **told.to_env(),
                "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                **(EMULATED_NCCL if emulated else SHAPED_NCCL),
                **(extra_env or {}),
            }
            specs.append(RankSpec(rank, node, local, env))
    return specs


def teardown_note(spec: RankSpec, code: int | None) -> str | None:
    """Why a rank that ended by a TEARDOWN_SIGNALS signal after its script closed its StepLog (testbed.steplog's end
    line: every step recorded) still counts as finished: the note the cell keeps. None for any other end, and where
    the rank's metrics file is not on this machine (docker, ssh: such a rank counts as dead)."""
    if code is None or -code not in TEARDOWN_SIGNALS or rankenv.METRICS_DIR not in spec.env:
        return None
    end = closed(Path(spec.env[rankenv.METRICS_DIR]) / f"rank{spec.rank}.jsonl")
    if end is None:
        return None
    return (f"rank {spec.rank} on {spec.node.name} ended by signal {-code} ({signal.Signals(-code).name}) after its "
            f"script closed its step log ({end.get('steps')} steps recorded): an abort in the interpreter's native "
            f"teardown at exit, after the work; results kept (torch: {TORCH_TEARDOWN})")


def died_order(proc) -> tuple[int, int]:
    """When its fork server saw `proc` end among the run's ranks (ForkedProcess.order: smaller is earlier, equal
    is not known apart); (0, 0) for an exec'd one (unknown)."""
    order = getattr(proc, "order", None)
    return order if order is not None else (0, 0)


class RankGroup:
    """The processes of one cell; always reaped (killed if needed) on close()."""

    def __init__(self, fabric, specs: list[RankSpec], argv: list[str], log_dir: Path,
                 forks: Forks | None = None) -> None:
        """Start every rank: forked by `forks` when argv runs a FORKABLE module, else exec'd by `fabric`."""
        self.fabric, self.specs = fabric, specs
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list = []
        self._logs = []
        self._argv, self._forks, self._base = argv, forks, base_env()
        self._module = forked_module(argv) if forks is not None else None
        self.launcher = "fork" if self._module is not None else "exec"  # how its ranks started, for the records
        self.held: set[int] = set()  # ranks killed by a fault whose death does not end the cell (hold())
        self.restarted: dict[int, int] = {}  # rank -> how many times restart() started it again
        try:
            for spec in specs:
                self.procs.append(self._spawn(spec, log_dir / f"rank{spec.rank}.log"))
        except BaseException:
            self.close()
            raise

    def _spawn(self, spec: RankSpec, log_path: Path):
        if self._module is not None:
            assert self._forks is not None
            return self._forks.spawn(spec.node.name, self._module, self._argv[3:], {**self._base, **spec.env},
                                     log_path)
        log = open(log_path, "wb")
        self._logs.append(log)
        return self.fabric.popen(spec.node.name, self._argv, env={**self._base, **spec.env}, stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def hold(self, rank: int) -> None:
        """Rank `rank` is about to be killed by a fault and the others train on (torchft's replica groups): its
        death does not end the cell, and the cell may end without it."""
        self.held.add(rank)

    def restart(self, rank: int) -> None:
        """Start rank `rank` again, as it was started (its log: rank<r>.restart<k>.log); it counts again."""
        old = self.procs[rank]
        if old.poll() is None:
            raise RuntimeError(f"rank {rank} is still running: only a killed rank is started again")
        number = self.restarted.get(rank, 0) + 1
        spec = self.specs[rank]
        again = replace(spec, env={**spec.env, **RankEnv(rank_restarted=True).to_env()})
        self.procs[rank] = self._spawn(again, self.log_dir / f"rank{rank}.restart{number}.log")
        self.restarted[rank] = number
        self.held.discard(rank)

    def tail(self, rank: int, lines: int = LOG_TAIL) -> list[str]:
        try:
            return (self.log_dir / f"rank{rank}.log").read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return []

    def watch(self, timeout: float, on_tick: Callable[[], None] | None = None,
              health: Callable[[], str | None] | None = None) -> Outcome:
        """Until every rank exits 0 (ok), one exits non-zero, health() names a problem, or time runs out."""
        start = time.monotonic()
        notes: dict[int, str] = {}  # ranks that ended by a signal in teardown, after their steps (teardown_note)
        while True:
            codes = [proc.poll() for proc in self.procs]
            # held ranks a fault killed while the others train on: neither a death nor a rank to wait for
            gone = {spec.rank for spec, code in zip(self.specs, codes) if spec.rank in self.held and code is not None}
            for spec, code in zip(self.specs, codes):
                if code not in (None, 0) and spec.rank not in notes and spec.rank not in gone:
                    note = teardown_note(spec, code)
                    if note is not None:
                        notes[spec.rank] = note
            dead = [(died_order(proc), spec, code) for spec, proc, code in zip(self.specs, self.procs, codes)
                    if code not in (None, 0) and spec.rank not in notes and spec.rank not in gone]
            if dead:  # the first to die (where known; else one ended by a signal, as a killed rank is, before one that
                # exited with an error, as its peers do when its connections reset), then the lowest rank
                _, spec, code = min(dead, key=lambda item: (item[0], item[2] > 0, item[1].rank))
                why = f"signal {-code}" if code < 0 else f"exit code {code}"
                return Outcome(False, f"rank {spec.rank} on {spec.node.name} died ({why})", spec.rank,
                               self.tail(spec.rank), time.monotonic() - start, died=True)
            if all(code == 0 or spec.rank in notes or spec.rank in gone for spec, code in zip(self.specs, codes)):
                return Outcome(True, "; ".join(notes.values()), seconds=time.monotonic() - start)
            problem = health() if health else None
            if problem:
                return Outcome(False, problem, None, None, time.monotonic() - start)
            if time.monotonic() - start > timeout:
                waiting = [s.rank for s, c in zip(self.specs, codes) if c is None]
                return Outcome(False, f"timed out after {timeout:.0f}s (ranks still running: {waiting})",
                               waiting[0] if waiting else None, self.tail(waiting[0]) if waiting else None,
                               time.monotonic() - start)
            if on_tick:
                on_tick()
            time.sleep(0.1)

    def signal(self, rank: int, number: int) -> None:
        """Send signal `number` to rank `rank`'s whole process group (a fault: SIGKILL, SIGSTOP, SIGCONT): here
        by killpg, in a container or on an SSH host by a command there (PopenLike.send_signal)."""
        proc = self.procs[rank]
        if isinstance(proc, subprocess.Popen):
            os.killpg(proc.pid, number)
        else:  # forked here (the leader of its own session, like an exec'd rank), or on another machine
            proc.send_signal(signal.Signals(number).name.removeprefix("SIG"))

    def straggle(self, rank: int, slowdown: float, until: float) -> Straggler | ShellStraggler:
        """Slow rank `rank` `slowdown` times until `until` (seconds since the epoch): stopped and continued by a
        loop on its node (started from the node's kept-open shell where the fabric keeps one); returns once the
        loop sent its first STOP."""
        return start_straggler(self.fabric, self.specs[rank].node.name, self.procs[rank].pid, slowdown, until)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    if isinstance(proc, subprocess.Popen):
                        os.killpg(proc.pid, signal.SIGKILL)
                    else:  # a remote process: it kills its own group
                        proc.kill()
                except Exception:  # already gone, or its host unreachable: nothing more to kill from here
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs:
            log.close()
