"""One scenario, run against every backend this machine has (Mininet's test_nets: one test, one mixin per
implementation): bring a two-DC testbed up with `testbed up`, check what `status` says, probe the round trip
against the configured latency and the goodput against the rate, change the link live, probe again, partition it
by hand (`testbed fault`) and see the partition applied within 0.25 s and cleared, take it down, and find nothing
left. Where ranks run elsewhere (docker, ssh), an experiment's scheduled link faults come on time too.

netns runs wherever the tests have root; docker where an engine answers; ssh where sshd is installed (the hosts are
sshd in namespaces, and the commands run from a controller node inside their network). CI has all three: there
a missing one fails instead of skipping."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from testbed.fabric.lifecycle import bring_up
from testbed.plan.hosts import MEMORY_ROOT
from tests.conftest import namespaces_with, run_cli
from tests.needs import unavailable
from tests.support.topologies import make_topology, pair_data

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]

PAIR = pair_data(latency="10ms", bandwidth="200mbit")
# above the configured round trip: endpoints, veths, a loaded 2-core machine, and its hypervisor: on 2026-11-26
# 16:40 netns measured 11.14 ms for 8 ms (p50 of 30 pings) while 9-33 % of the CPU was stolen (/proc/stat);
# 5 ms still tells the reshaped 8 ms from the 20 ms the link had before, and 20 ms from an unshaped link (~0)
RTT_SLACK_MS = 5.0


@dataclass
class Backend:
    """How the scenario drives one backend: the CLI (where it must run from), the options `up` needs, and
    what would be left of a testbed (nothing, after `down`)."""

    name: str
    cli: Callable[..., subprocess.CompletedProcess]
    up_options: list[str] = field(default_factory=list)
    leftovers: Callable[[], list[str]] = list
    # how late a hand-made link fault may be applied and cleared. Measured here 2026-11-23/24 (issue 16's goal is
    # 0.25 s): netns 0.002-0.011 s; ssh 0.008-0.023 s (a script to each host's kept-open shell; with an SSH exec
    # per host it was 0.21-0.27 s here and 0.53 s once in CI); docker applied 0.018-0.027 s, cleared 0.020-0.024 s
    # late (a script to each router's kept-open exec shell, 2026-11-24; with one `docker exec` per router per change
    # 0.098-0.148 / 0.083-0.113 s in the same session). The bounds leave room for a busier machine.
    fault_bound_s: float = 0.25


def netns(prefix: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    return Backend("netns", run_cli, leftovers=lambda: namespaces_with(prefix))


def docker(prefix: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    from testbed.fabric.docker.engine import engine_available

    if not engine_available():
        unavailable("no docker engine here")
    from tests.support.docker import labelled

    image = request.getfixturevalue("docker_image")
    return Backend("docker", run_cli, ["--backend", "docker", "--image", image], leftovers=lambda: labelled(prefix),
                   fault_bound_s=0.5)


def ssh(prefix: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    from tests.support.ssh import SSHD, start_hosts

    if not os.access(SSHD, os.X_OK):
        unavailable(f"no {SSHD}")
    lab = bring_up(make_topology("lab", {"lab": 3}), prefix=prefix)
    hosts = start_hosts(lab, tmp_path, {"east": ["lab-0"], "west": ["lab-1"]}, workdir=str(tmp_path / "remote"))
    request.addfinalizer(hosts.stop)
    ssh_prefix = f"{prefix}s-"

    def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return hosts.cli("lab-2", *args, env={"TESTBED_PREFIX": ssh_prefix}, timeout=timeout)  # the controller

    def leftovers() -> list[str]:
        from testbed.agents.bootstrap import argv_in

        left = []
        for node in ("lab-0", "lab-1"):
            root = subprocess.run(argv_in(lab.plan.node(node).ns, ["tc", "qdisc", "show", "dev", "eth0", "root"]),
                                  capture_output=True, text=True).stdout
            if "7e57:" in root:
                left.append(f"{node}: {root.strip()}")
        left += [str(path) for path in (tmp_path / "remote").glob(f"{ssh_prefix}*")]
        left += [str(path) for path in Path(MEMORY_ROOT).glob(f"{ssh_prefix}*")]  # the delay lines' files
        return left

    options = ["--backend", "ssh", "--inventory", str(hosts.inventory), "--known-hosts", str(hosts.known_hosts)]
    return Backend("ssh", cli, options, leftovers)


@pytest.fixture(params=["netns", "docker", "ssh"])
def backend(request, prefix, tmp_path) -> Backend:
    mixins = {"netns": netns, "docker": docker, "ssh": ssh}
    return mixins[request.param](prefix, tmp_path, request)


def probe(backend: Backend, seconds: float = 0.5) -> dict[tuple[str, str], dict]:
    """Each direction's RTT (30 pings) and goodput: a flow of `seconds`, of which the agent skips 0.5 s of slow
    start, so only a longer one measures goodput at all."""
    proc = backend.cli("probe", "--json", "--pings", "30", "--seconds", f"{seconds}s", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {(pair["src"], pair["dst"]): pair for pair in json.loads(proc.stdout)["pairs"]}


def test_up_status_probe_shape_down(backend, tmp_path):
    topology = tmp_path / "pair.yaml"
    topology.write_text(yaml.safe_dump(PAIR))
    up = backend.cli("up", str(topology), *backend.up_options, timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    assert "up pair: 2 DCs, 2 nodes, shaper " in up.stdout

    status = backend.cli("status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    info = json.loads(status.stdout)
    assert info["backend"] == backend.name and info["dead_delay_lines"] == []
    assert [node["name"] for node in info["nodes"]] == ["east-0", "west-0"]
    inter = {link["key"]: link for link in info["links"] if link["kind"] == "inter-dc"}
    assert set(inter) == {"east->west", "west->east"}
    for link in inter.values():
        assert link["latency"] == "10ms" and link["bandwidth"] == "200mbit" and "NOT" not in link["mechanism"]

    for pair in probe(backend, seconds=1.5).values():
        assert pair["rtt_applied_ms"] == pytest.approx(20.0) and pair["not_applied"] == ""
        assert 20.0 <= pair["rtt_p50_ms"] <= 20.0 + RTT_SLACK_MS, pair
        assert abs(pair["goodput_error"]) < 0.10, pair  # 200 Mbit/s each way, as the probe tests' bound

    shaped = backend.cli("shape", "east", "west", "--latency", "4ms")
    assert shaped.returncode == 0, shaped.stderr[-2000:]
    for pair in probe(backend).values():
        assert pair["rtt_applied_ms"] == pytest.approx(8.0)
        assert 8.0 <= pair["rtt_p50_ms"] <= 8.0 + RTT_SLACK_MS, pair

    partition(backend)

    down = backend.cli("down")
    assert down.returncode == 0, down.stderr[-2000:]
    assert backend.leftovers() == []
    gone = backend.cli("status")
    assert gone.returncode == 2 and "no testbed is up" in gone.stderr


def inter_dc_loss(backend: Backend) -> dict[str, str]:
    status = backend.cli("status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    return {link["key"]: link["loss"] for link in json.loads(status.stdout)["links"] if link["kind"] == "inter-dc"}


def partition(backend: Backend, seconds: float = 3.0, watch_s: float = 30.0) -> None:
    """`testbed fault partition` for `seconds`: both directions at 100 % loss while it lasts (as `status`, reading
    the state file, sees it; watched for up to `watch_s`), applied and cleared within the backend's bound of their
    schedule, and the link as it was after."""
    done: dict[str, subprocess.CompletedProcess] = {}
    thread = threading.Thread(target=lambda: done.setdefault("fault", backend.cli(
        "fault", "partition", "east", "west", "--for", f"{seconds:g}s", timeout=120)))
    thread.start()
    deadline, seen = time.monotonic() + watch_s, {}
    while thread.is_alive() and time.monotonic() < deadline:
        seen = inter_dc_loss(backend)
        if set(seen.values()) == {"100%"}:
            break
        time.sleep(0.2)
    thread.join()
    fault = done["fault"]
    assert fault.returncode == 0, fault.stderr[-2000:]
    assert set(seen.values()) == {"100%"}, (seen, fault.stdout)
    ((applied, cleared),) = re.findall(r"applied at ([0-9.]+)s, cleared at ([0-9.]+)s", fault.stdout)
    bound = backend.fault_bound_s
    assert float(applied) <= bound and seconds <= float(cleared) <= seconds + bound, fault.stdout
    assert set(inter_dc_loss(backend).values()) == {"0%"}
    for pair in probe(backend).values():
        assert 8.0 <= pair["rtt_p50_ms"] <= 8.0 + RTT_SLACK_MS and pair["ping_loss"] == 0, pair


@pytest.fixture(params=["docker", "ssh"])
def elsewhere(request, prefix, tmp_path) -> Backend:
    """The backends whose ranks run on other machines (netns: tests/runner/test_faults_run.py)."""
    return {"docker": docker, "ssh": ssh}[request.param](prefix, tmp_path, request)


PARTITION_AT, PARTITION_S = 3, 1.5
STRAGGLER_AT, STRAGGLER_S, SLOWDOWN = 8.0, 2.0, 4
# the loss burst comes after the straggler's window: a step caught in a burst can stall for seconds past its end
# (TCP's retransmission timer doubles with each lost retransmission). With the burst at 6 s, a step begun at
# 6.21 s took 6.2 s (docker, 2026-11-27), no step began inside the straggler's window and its check had nothing
# to measure. The partition's own stall (retransmissions at 0.2, 0.4, 0.8, 1.6 s...) is over well before 8 s.
BURST_AT, BURST_S = 11.0, 1.0
KILL_AT, STEPS, CHECKPOINT_EVERY = 100, 110, 10  # a step after the straggler's window (about 65 steps in, here)
# a kill, and a straggler's loop, go through the rank's node's shell opened ahead (its container's kept exec, its
# host's kept SSH shell), as link faults do through the routers' and hosts': issue 16's 0.25 s. Measured here
# (2026-11-25, three runs each): kills 0.011-0.022 s late; stragglers, whose applied_at is when the loop's first
# STOP had been sent, docker 0.017-0.026 s, ssh 0.015-0.018 s (docker 0.090-0.136 s, ssh 0.208-0.300 s when the
# loop started with a new docker exec or SSH channel)
RANK_FAULT_BOUND_S = 0.25


def test_a_runs_scheduled_faults_come_on_time_where_ranks_run_elsewhere(elsewhere, tmp_path):
    """`testbed run` with a faults: timeline where rank 0 writes its step starts in a container or on an SSH host
    (followed live, testbed.runner.follow): a partition at a step and a loss burst at a time are applied within
    issue 16's 0.25 s of their schedule and cleared after their duration; a straggler (rank 1 stopped and
    continued by a loop in its container or on its host) slows the steps of its window; a kill (SIGKILL to rank
    1's process group there) is ridden out by a restart: every rank starts again from the checkpoint it kept on
    its own node (they share no files), the ranks agreeing on the step, and the cell finishes; nothing is left."""
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump({
        "name": "faults-elsewhere", "topology": PAIR, "baseline": "none", "calibrate": "none", "cell_timeout": "120s",
        "workload": {"steps": STEPS, "warmup_steps": 1, "micro_batch": 2, "micro_batches": 1, "compute": "synthetic",
                     "compute_ms": 50},
        "strategies": ["flat-dp"], "restarts": 1, "checkpoint_every": CHECKPOINT_EVERY,
        "faults": [{"kind": "partition", "between": ["east", "west"], "at": f"step {PARTITION_AT}",
                    "duration": f"{PARTITION_S}s"},
                   {"kind": "loss-burst", "between": ["east", "west"], "at": f"{BURST_AT}s", "duration": f"{BURST_S}s",
                    "loss": "20%"},
                   {"kind": "straggler", "rank": 1, "at": f"{STRAGGLER_AT}s", "duration": f"{STRAGGLER_S}s",
                    "slowdown": SLOWDOWN},
                   {"kind": "kill", "rank": 1, "at": f"step {KILL_AT}"}]}))
    proc = elsewhere.cli("run", str(path), *elsewhere.up_options, "--out", str(tmp_path / "out"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the restart rides the kill out
    (cell,) = list(next((tmp_path / "out" / "faults-elsewhere").glob("*")).glob("cells/*"))
    record = json.loads((cell / "faults.json").read_text())
    assert record["errors"] == [], record
    partition, burst, straggler, kill = record["faults"]
    assert 0 <= kill["applied_at"] - kill["scheduled_at"] < RANK_FAULT_BOUND_S, (elsewhere.name, kill)
    print(f"{elsewhere.name}: late by", {e["kind"]: round(e["applied_at"] - e["scheduled_at"], 3)
                                         for e in record["faults"]})  # for the record (pytest -s)
    for entry, seconds in ((partition, PARTITION_S), (burst, BURST_S)):
        assert 0 <= entry["applied_at"] - entry["scheduled_at"] < 0.25, (elsewhere.name, entry)
        assert entry["cleared_at"] - entry["applied_at"] == pytest.approx(seconds, abs=0.25), (elsewhere.name, entry)
    # the straggler's loop, started through the kept shell, has sent its first STOP by applied_at; it ends by
    # itself when its window is due to clear, however late it started
    assert 0 <= straggler["applied_at"] - STRAGGLER_AT < RANK_FAULT_BOUND_S, (elsewhere.name, straggler)
    assert 0 <= straggler["cleared_at"] - (STRAGGLER_AT + STRAGGLER_S) < 0.25, (elsewhere.name, straggler)
    assert burst["scheduled_at"] == pytest.approx(BURST_AT) and straggler["scheduled_at"] == pytest.approx(STRAGGLER_AT)
    assert straggler["cleared_at"] < kill["scheduled_at"], (straggler, kill)  # the windows stay apart
    live = [json.loads(line) for line in (cell / "logs" / "rank0.live.jsonl").read_text().splitlines()]
    restarted = [i for i, e in enumerate(live) if e["event"] == "start"]
    assert len(restarted) == 2, restarted  # rank 0 followed live across the restart
    live = live[:restarted[1]]  # the first attempt's steps
    begun = {e["step"]: e["time"] for e in live if e["event"] == "step_begin"}
    assert partition["scheduled_at"] == pytest.approx(begun[PARTITION_AT] - begun[0], abs=1e-3)
    # rank 0 waits for rank 1 in every all-reduce: its steps begun inside the straggler's window are slower than
    # those begun after it (none was slowed if the loop never ran)
    walls = {e["step"]: e["wall_s"] for e in live if e["event"] == "step"}
    at = {step: when - begun[0] for step, when in begun.items()}
    inside = [walls[s] for s in walls if straggler["applied_at"] + 0.1 <= at[s] <= straggler["cleared_at"] - 0.3]
    after = [walls[s] for s in walls if at[s] >= straggler["cleared_at"] + 0.5]
    assert len(inside) >= 3 and len(after) >= 5, (inside, after)
    assert statistics.median(inside) >= 1.5 * statistics.median(after), (elsewhere.name, inside, after)
    assert kill["scheduled_at"] == pytest.approx(begun[KILL_AT] - begun[0], abs=1e-3)
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "ok", result["reason"]
    (restart,) = result["restarts"]
    assert restart["failed_rank"] == 1 and "signal 9" in restart["reason"], restart
    # rank 1 may be killed before its own checkpoint of step 99 is written: then both agree on step 89
    assert restart["resumed_after_step"] in (KILL_AT - 1, KILL_AT - 1 - CHECKPOINT_EVERY), restart
    for rank in range(2):
        lines = [json.loads(line) for line in (cell / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]
        assert [e["resumed_after_step"] for e in lines if e["event"] == "start"] == [None, restart["resumed_after_step"]]
        assert sorted({e["step"] for e in lines if e["event"] == "step"}) == list(range(STEPS)), rank
    assert elsewhere.leftovers() == []
