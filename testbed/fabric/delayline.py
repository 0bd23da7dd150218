"""The userspace delay line: one-way delay, jitter and loss on kernels without sch_netem.

Where: the direction a->b is delayed in b's gateway namespace, on packets arriving from a
(`iptables -t mangle -A PREROUTING -i to-a -j NFQUEUE`). PREROUTING still carries the kernel's receive
timestamp (ip_forward clears it before FORWARD), so the delay counts from when the packet really arrived,
not from when this process woke up. The rate limit of a->b is htb on a's egress, before the delay: with
a constant delay, shaping before or after the delay is the same link.

Semantics, same as the netem shaper: every packet is held latency + U(-jitter, +jitter) (never below zero,
and never before the packet ahead of it: FIFO, no reordering, like netem with a rate); loss drops each
packet independently with the configured probability. On lossy links the queue is bound without the GSO
flag so the kernel segments 64 kB offload units and loss acts per wire packet (costs CPU: 1.56 Gbit/s
at most measured here, bench/link_impairments.py); otherwise GSO units stay whole and are delayed as one.

Process model: `start()` launches a supervisor per gateway (detached, inside the namespace). The
supervisor runs a worker, installs the iptables rules once the worker has bound its queues, restarts the
worker if it dies (counting restarts in its status file) and forwards SIGHUP (re-read config: live
`testbed shape`). The rules have no --queue-bypass: if the supervisor itself is killed the link goes dark
rather than silently undelayed, and `delay_applied()`/`dead_delay_lines()` report it.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from typing import TYPE_CHECKING, Any, Callable

from testbed.atomic import write_text
from testbed.fabric import nsexec
from testbed.fabric.procs import alive
from testbed.fabric.state import state_dir

if TYPE_CHECKING:  # the supervisor and worker import only the standard library: they start fast
    from testbed.plan.network import NetworkPlan
    from testbed.plan.shaping import DelayDirection, DelayLineSpec

EARLY_WAKE = 40e-6  # wake this much before the head is due
RELEASE_SLACK = 20e-6  # release what is due within this much
MAX_SLEEP = 0.002
KERNEL_LACKS = 3  # the worker's exit status when the kernel has no nfnetlink_queue (it printed why)


def assignments(plan: "NetworkPlan") -> dict[str, list[DelayDirection]]:
    """Gateway namespace -> the directions its delay line serves (pure: derived from the plan)."""
    from testbed.plan.shaping import DelayDirection

    out: dict[str, list[DelayDirection]] = {}
    for link in plan.links:
        for key, src, dst in ((link.forward, link.a, link.b), (link.backward, link.b, link.a)):
            spec = plan.link_end(key).shaping.delay_line
            if spec is None:
                continue
            ns = plan.gateways[dst]
            work = out.setdefault(ns, [])
            work.append(DelayDirection.serving(key, f"to-{src}", len(work), spec))
    return out


def _files(ns: str) -> tuple[Path, Path, Path]:
    base = state_dir() / ns
    return base.with_suffix(".delayline.json"), base.with_suffix(".delayline.status"), base.with_suffix(
        ".delayline.log")


# --- control side (the CLI process) ---------------------------------------------------------------
def start_all(work: "dict[str, list[DelayDirection]]", timeout: float = 10.0,
              in_namespace: bool = True) -> dict[str, int]:
    """Start one supervisor per gateway, all at once; returns gateway -> pid once every queue is bound.
    `in_namespace=False`: start it right here (a docker router is its own namespace; `ns` names its files)."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        for ns, items in work.items():
            config, status, log = _files(ns)
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(json.dumps([asdict(a) for a in items]))
            status.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "testbed.fabric.delayline", "supervise", str(config)]
            with open(log, "ab") as out:
                procs[ns] = subprocess.Popen(
                    nsexec.argv_in(ns, argv) if in_namespace else argv,
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        waiting = set(procs)
        while waiting:
            for ns in sorted(waiting):
                if read_status(ns).get("ready"):
                    waiting.discard(ns)
                elif procs[ns].poll() is not None or time.monotonic() > deadline:
                    log = _files(ns)[2]
                    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
                    said = " ".join(tail).removeprefix("delayline: ") or "timed out"
                    raise RuntimeError(f"delay line in {ns} did not start: {said}")
            time.sleep(0.005)
    except BaseException:
        for proc in procs.values():
            proc.kill()
        raise
    return {ns: proc.pid for ns, proc in procs.items()}


def read_status(ns: str) -> dict:
    try:
        return json.loads(_files(ns)[1].read_text())
    except (OSError, ValueError):
        return {}


def gateway_of(plan: "NetworkPlan", key: str) -> str | None:
    """The gateway namespace whose delay line serves direction `key`, if any."""
    for ns, work in assignments(plan).items():
        if any(item.key == key for item in work):
            return ns
    return None


def reconfigure(ns: str, key: str, spec: "DelayLineSpec") -> None:
    """Change direction `key` served by `ns`'s delay line, live (the supervisor forwards SIGHUP)."""
    config = _files(ns)[0]
    work = json.loads(config.read_text())
    for item in work:
        if item["key"] == key:
            item.update(latency=spec.latency, jitter=spec.jitter, loss=spec.loss)
    write_text(config, json.dumps(work))
    pid = read_status(ns).get("supervisor")
    if not pid or not alive(pid):
        raise RuntimeError(f"delay line of {ns} is not running")
    os.kill(pid, signal.SIGHUP)


def stats_path(ns: str) -> Path:
    return _files(ns)[0].with_suffix("").with_suffix(".delayline.stats")


def snapshot(namespaces: list[str], timeout: float = 1.0) -> dict[str, dict]:
    """Direction key -> {worker, released, late} as the delay lines of `namespaces` know it right now (each
    worker is asked to write its figures, SIGUSR2; a dead one contributes what it last wrote)."""
    return fresh_stats(namespaces, lambda ns: stats_path(ns).read_text(), lambda ns: _signal_worker(ns), timeout)


def fresh_stats(places: list, read: Callable[[Any], str], ask: Callable[[Any], None],
                timeout: float = 1.0) -> dict[str, dict]:
    """Ask every place's worker for its stats, then wait (up to `timeout`) until each file was rewritten:
    `written` changes (compared with itself, so clocks of other hosts do not matter)."""

    def load(place: Any) -> dict:
        try:
            return json.loads(read(place))
        except (OSError, ValueError):
            return {}

    before = {id(place): load(place).get("written") for place in places}
    for place in places:
        ask(place)
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    for place in places:
        data = load(place)
        while data.get("written") == before[id(place)] and time.monotonic() < deadline:
            time.sleep(0.01)
            data = load(place)
        out.update(data.get("directions", {}))
    return out


def _signal_worker(ns: str) -> None:
    pid = read_status(ns).get("worker")
    if pid and alive(pid):
        try:
            os.kill(pid, signal.SIGUSR2)
        except ProcessLookupError:
            pass


def remove_files(prefix: str) -> None:
    for path in state_dir().glob(f"{prefix}*.delayline.*"):
        path.unlink(missing_ok=True)


# --- the delay line itself (runs inside the gateway namespace) -----------------------------------
LATE_BUCKET = 1e-5  # seconds per bucket of the lateness histogram (10 us)
RT_ENV, RT_PRIORITY = "TESTBED_DELAY_LINE_RT", 10
STATS_EVERY = 1.0  # seconds between stats files while packets flow (and on request, SIGUSR2)


class Direction:
    """One delayed direction, pure: which packets to drop, when each is due (latency +- jitter, FIFO: never
    before the packet ahead), what to release at a given time, and how late each release was."""

    def __init__(self, queue: int, latency: float, jitter: float, loss: float, rng: random.Random) -> None:
        self.queue = queue
        self.latency, self.jitter, self.loss = latency, jitter, loss
        self.rng = rng
        self.fifo: list[tuple[float, int]] = []  # (due, packet id) in arrival order
        self.head = 0
        self.last_due = 0.0
        self.late: dict[int, int] = {}  # lateness bucket -> packets released that late
        self.released = 0

    def configure(self, latency: float, jitter: float, loss: float) -> None:
        self.latency, self.jitter, self.loss = latency, jitter, loss

    def admit(self, packet_id: int, arrival: float) -> bool:
        """Queue a packet that arrived at `arrival`; False: drop it (loss)."""
        if self.loss and self.rng.random() < self.loss:
            return False
        delay = self.latency
        if self.jitter:
            delay = max(0.0, delay + self.rng.uniform(-self.jitter, self.jitter))
        due = max(arrival + delay, self.last_due)
        self.last_due = due
        self.fifo.append((due, packet_id))
        return True

    def release(self, now: float, slack: float = 0.0) -> int | None:
        """The id of the last packet due by `now + slack` (all before it are released too), or None;
        records each released packet's lateness, now - due (early releases within the slack count as 0)."""
        fifo, head, late = self.fifo, self.head, self.late
        last = None
        while head < len(fifo) and fifo[head][0] <= now + slack:
            due, last = fifo[head]
            bucket = int((now - due) / LATE_BUCKET) if now > due else 0
            late[bucket] = late.get(bucket, 0) + 1
            head += 1
        if last is not None:
            self.released += head - self.head
        if head > 1024 and head * 2 > len(fifo):
            del fifo[:head]
            head = 0
        self.head = head
        return last

    def next_due(self) -> float | None:
        return self.fifo[self.head][0] if self.head < len(self.fifo) else None


def lateness_summary(late: dict, packets: int | None = None) -> dict:
    """p50, p99 and max lateness (ms) of a histogram {bucket: packets} (keys may be strings, from JSON)."""
    counts = sorted((int(bucket), count) for bucket, count in late.items() if count > 0)
    total = sum(count for _, count in counts)
    out = {"packets": total if packets is None else packets, "p50_ms": None, "p99_ms": None, "max_ms": None}
    if not total:
        return out
    for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        rank, seen = q * total, 0
        for bucket, count in counts:
            seen += count
            if seen >= rank:
                out[name] = bucket * LATE_BUCKET * 1e3
                break
    out["max_ms"] = counts[-1][0] * LATE_BUCKET * 1e3
    return out


def lateness_delta(before: dict, after: dict) -> dict:
    """What one direction's histogram gained between two stats snapshots (a restarted worker starts again)."""
    if not before or before.get("worker") != after.get("worker"):
        return dict(after.get("late", {}))
    old = before.get("late", {})
    return {bucket: count - old.get(bucket, 0) for bucket, count in after.get("late", {}).items()
            if count - old.get(bucket, 0) > 0}


def _load(path: str) -> list[dict]:
    with open(path) as src:
        return json.load(src)


def _realtime() -> str:
    """SCHED_FIFO for the worker unless $TESTBED_DELAY_LINE_RT is 0 (the figures say what ran): busy ranks on
    the same cores otherwise delay its releases by milliseconds (bench/delay_line_priority.py)."""
    if os.environ.get(RT_ENV, "1") == "0":
        return "other"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
    except OSError:  # no CAP_SYS_NICE, or an RT budget of 0 (some containers): run as before
        return "other"
    return "fifo"


def _write_stats(path: Path, by_key: dict[str, Direction], sched: str) -> None:
    write_text(path, json.dumps({"worker": os.getpid(), "written": time.time(), "directions": {
        key: {"worker": os.getpid(), "scheduling": sched, "released": line.released, "late": line.late}
        for key, line in by_key.items()}}))


def worker(config_path: str) -> int:
    """Bind the queues, then hold and release packets until killed."""
    from testbed.fabric.nfqueue import NF_DROP, QueueSocket

    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the supervisor
    libc.prctl(29, 1)  # PR_SET_TIMERSLACK: 1 ns, so short sleeps end on time
    items = _load(config_path)
    try:
        sock = QueueSocket(timestamps=True)
        for item in items:
            sock.bind(item["queue"], item["limit"], gso=item["loss"] == 0)
    except OSError as error:
        print(f"delayline: this kernel lacks nfnetlink_queue (NFQUEUE): binding a queue failed "
              f"({error.strerror or error})", flush=True)
        return KERNEL_LACKS
    sched = _realtime()
    rng = random.Random()
    directions = {item["queue"]: Direction(item["queue"], item["latency"], item["jitter"], item["loss"], rng)
                  for item in items}
    by_key = {item["key"]: directions[item["queue"]] for item in items}
    stats_path = Path(config_path).with_suffix("").with_suffix(".delayline.stats")
    flags = {"reload": False, "stats": True}
    signal.signal(signal.SIGHUP, lambda *_: flags.update(reload=True))
    signal.signal(signal.SIGUSR2, lambda *_: flags.update(stats=True))  # a runner wants the figures now
    print(json.dumps({"worker": os.getpid(), "bound": sorted(directions), "scheduling": sched}), flush=True)
    os.kill(os.getppid(), signal.SIGUSR1)  # tell the supervisor the queues are bound
    next_stats, written = time.monotonic() + STATS_EVERY, -1
    while True:
        if flags["reload"]:
            flags["reload"] = False
            for item in _load(config_path):
                if item["queue"] in directions:
                    directions[item["queue"]].configure(item["latency"], item["jitter"], item["loss"])
        if flags["stats"] or (time.monotonic() > next_stats and sum(x.released for x in directions.values()) != written):
            flags["stats"] = False
            next_stats = time.monotonic() + STATS_EVERY
            written = sum(x.released for x in directions.values())
            _write_stats(stats_path, by_key, sched)
        now = time.time()
        for packet in sock.receive():
            line = directions.get(packet.queue)
            if line is None:
                continue
            if not line.admit(packet.packet_id, packet.timestamp if packet.timestamp is not None else now):
                sock.verdict(packet.queue, packet.packet_id, NF_DROP)
        now = time.time()
        wake = None
        for line in directions.values():
            last = line.release(now, RELEASE_SLACK)
            if last is not None:
                sock.accept_up_to(line.queue, last)
            due = line.next_due()
            if due is not None:
                wake = due if wake is None else min(wake, due)
        # select(), not poll(): poll rounds its timeout up to whole milliseconds.
        timeout = 0.2 if wake is None else min(wake - time.time() - EARLY_WAKE, MAX_SLEEP)
        if timeout > 0:
            select.select([sock], [], [], timeout)


def _iptables(rule: list[str]) -> str | None:
    """Add one rule; None, or one line saying what is missing (the command, or the kernel's mangle/NFQUEUE)."""
    try:
        done = subprocess.run(["iptables", "-w", *rule], capture_output=True, text=True)
    except FileNotFoundError:
        return "iptables is not installed (apt-get install iptables)"
    if done.returncode == 0:
        return None
    said = " ".join(done.stderr.split()) or f"exit {done.returncode}"
    return (f"this kernel lacks the mangle table or the NFQUEUE target (iptable_mangle, xt_NFQUEUE): "
            f"iptables {' '.join(rule[:4])} ... failed: {said}")


def supervise(config_path: str) -> int:
    """Run (and re-run) the worker; set the iptables rules once it is bound; keep a status file."""
    items = _load(config_path)
    ns_status = Path(config_path).with_suffix("").with_suffix(".delayline.status")
    state = {"supervisor": os.getpid(), "worker": None, "restarts": 0, "ready": False, "rules": []}
    bound = {"flag": False}
    stop = {"flag": False}

    def write_state() -> None:
        write_text(ns_status, json.dumps(state))

    def on_usr1(*_: object) -> None:
        bound["flag"] = True

    def on_term(*_: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    child: subprocess.Popen | None = None
    signal.signal(signal.SIGHUP, lambda *_: child and child.send_signal(signal.SIGHUP))
    while not stop["flag"]:
        bound["flag"] = False
        child = subprocess.Popen([sys.executable, "-m", "testbed.fabric.delayline", "worker", config_path])
        state["worker"] = child.pid
        deadline = time.monotonic() + 10
        while not bound["flag"] and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if not bound["flag"]:
            if child.poll() != KERNEL_LACKS:  # else the worker said why in one line
                print(f"delayline: worker failed to bind its queues (exit {child.poll()})", flush=True)
            child.kill()
            return 1
        if not state["rules"]:
            for item in items:
                rule = ["-t", "mangle", "-A", "PREROUTING", "-i", item["ifname"]]
                if item.get("sources"):
                    rule += ["-s", ",".join(item["sources"])]
                if item.get("comment"):
                    rule += ["-m", "comment", "--comment", item["comment"]]
                rule += ["-j", "NFQUEUE", "--queue-num", str(item["queue"])]
                problem = _iptables(rule)
                if problem:
                    print(f"delayline: {problem}", flush=True)
                    child.kill()
                    return 1
                state["rules"].append(" ".join(rule))
            state["ready"] = True
        write_state()
        while child.poll() is None and not stop["flag"]:
            time.sleep(0.05)
        if stop["flag"]:
            break
        state["restarts"] += 1
        print(f"delayline: worker {child.pid} died (exit {child.returncode}); restart {state['restarts']}",
              flush=True)
    if child is not None and child.poll() is None:
        child.kill()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "worker":
        return worker(argv[1])
    if len(argv) == 2 and argv[0] == "supervise":
        return supervise(argv[1])
    print("usage: python -m testbed.fabric.delayline supervise|worker CONFIG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
