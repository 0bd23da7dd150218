"""The Slurm backend against a real Slurm: scripts/slurm-lab (slurmctld, and one slurmd per node of
topologies/two-dc.yaml, each in a network namespace of its own; testbed's Prolog and Epilog installed as an admin
installs them). The scenario the other backends pass (tests/fabric/test_backends.py: up, status, probe, a live
shape, a partition on schedule), `scancel` in the middle and a SIGKILLed controller each followed by `clean`
leaving every node as before, and a cluster where nobody can shape refused before any job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import QUICKSTART_CELL, run_cli
from tests.fabric.test_backends import RTT_SLACK_MS, Backend, partition, probe
from tests.support.slurm_lab import SlurmLab, running_lab

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
TOPOLOGY = "topologies/two-dc.yaml"  # east-0, east-1, west-0, west-1: 10 ms one way, 1 Gbit/s
NODES = ("east-0", "east-1", "west-0", "west-1")


def left_by(lab: SlurmLab, prefix: str) -> list[str]:
    """What testbed's `prefix` left on the lab: a node's root qdisc or tagged rule, its files and processes, a job."""
    out = []
    for node in NODES:
        def there(*argv: str, node: str = node) -> str:
            return subprocess.run(["ip", "netns", "exec", f"slurmlab.{lab.name}.{node}", *argv], capture_output=True,
                                  text=True, timeout=30).stdout

        root = there("tc", "qdisc", "show", "dev", "eth0", "root")
        if "7e57:" in root:
            out.append(f"{node}: {root.strip()}")
        out += [f"{node}: {line}" for line in there("iptables", "-w", "-t", "mangle", "-S").splitlines()
                if f"testbed:{prefix}" in line]
    for root in ("/var/tmp/testbed", "/dev/shm"):
        out += [str(path) for path in Path(root).glob(f"{prefix}*")]
    if Path("/var/tmp/testbed").exists() and not any(Path("/var/tmp/testbed").iterdir()):
        out.append("/var/tmp/testbed (empty)")  # testbed's node directory, made by the first shaping
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(("/var/tmp/testbed/" + prefix, "/dev/shm/" + prefix)):
            out.append(f"process {pid} in {cwd}")
    jobs = lab.slurm("squeue", "-h", "-o", "%i %j %T").stdout.splitlines()
    return out + [f"job {line}" for line in jobs if f"testbed-{prefix.rstrip('-')}" in line]


@pytest.fixture(scope="module")
def lab() -> Iterator[SlurmLab]:
    with running_lab(ROOT / TOPOLOGY, f"tb{uuid.uuid4().hex[:6]}") as made:
        yield made


def backend_on(lab: SlurmLab, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """The backend as the shared scenario drives it, on `lab`; the test's prefix is torn down with SLURM_CONF still
    set (monkeypatch's environment outlives the test body)."""
    for key in ("SLURM_CONF", "SLURMLAB_NAME", "SLURMLAB_DIR"):
        monkeypatch.setenv(key, lab.env[key])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return Backend("slurm", run_cli, ["--backend", "slurm"], leftovers=lambda: left_by(lab, prefix))


@pytest.fixture
def slurm(lab: SlurmLab, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return backend_on(lab, prefix, monkeypatch)


FAULT_S = 6.0  # longer than tests/fabric/test_backends.py's 3 s: one `status` here takes 2-4 s at load 14-17


def job_of(lab: SlurmLab, prefix: str) -> str:
    return lab.slurm("squeue", "-h", "-n", f"testbed-{prefix.rstrip('-')}", "-o", "%i").stdout.strip()


def test_up_status_probe_shape_partition_down(slurm: Backend, lab: SlurmLab, prefix: str):
    up = run_cli("up", "--backend", "slurm", TOPOLOGY, timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    assert "up two-dc: 2 DCs, 4 nodes, shaper " in up.stdout
    status = json.loads(run_cli("status", "--json", check=True).stdout)
    assert status["backend"] == "slurm" and status["dead_delay_lines"] == []
    assert [(h["node"], h["host"], h["interface"]) for h in status["hosts"]] == [(n, n, "eth0") for n in NODES]
    for link in status["links"]:
        assert "NOT" not in link["mechanism"], link
    assert job_of(lab, prefix)

    for pair in probe(slurm, seconds=3.0).values():
        assert pair["rtt_applied_ms"] == pytest.approx(20.0) and pair["not_applied"] == ""
        assert 20.0 <= pair["rtt_p50_ms"] <= 20.0 + RTT_SLACK_MS, pair
        assert abs(pair["goodput_error"]) < 0.10, pair

    shaped = run_cli("shape", "east", "west", "--latency", "4ms")
    assert shaped.returncode == 0, shaped.stderr[-2000:]
    for pair in probe(slurm).values():
        assert pair["rtt_applied_ms"] == pytest.approx(8.0)
        assert 8.0 <= pair["rtt_p50_ms"] <= 8.0 + RTT_SLACK_MS, pair

    partition(slurm, FAULT_S, watch_s=60)  # a partition on schedule, as on the other backends
    for pair in probe(slurm).values():
        assert 8.0 <= pair["rtt_p50_ms"] <= 8.0 + RTT_SLACK_MS and pair["ping_loss"] == 0, pair

    down = run_cli("down", timeout=300)
    assert down.returncode == 0, down.stderr[-2000:]
    assert slurm.leftovers() == []


def test_scancel_in_the_middle_then_clean_leaves_every_node_as_before(slurm: Backend, lab: SlurmLab, prefix: str):
    assert run_cli("up", "--backend", "slurm", TOPOLOGY, timeout=300).returncode == 0
    job = job_of(lab, prefix)
    assert job and left_by(lab, prefix)  # shaped: there is something to restore
    assert lab.slurm("scancel", job, check=False).returncode == 0
    clean = run_cli("clean", timeout=300)
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert slurm.leftovers() == []
    assert run_cli("status").returncode != 0  # no state left either


def test_a_sigkilled_controller_is_cleaned_up_after(slurm: Backend, lab: SlurmLab, prefix: str, tmp_path: Path):
    """`testbed run` with its ranks sleeping on the nodes (srun steps), SIGKILLed: the allocation, the shaping and
    the ranks outlive it; `clean` ends them all."""
    controller = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "--backend", "slurm", "--topology",
                                   TOPOLOGY, "--out", str(tmp_path), "--", "sleep", "600"], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while lab.slurm("squeue", "-s", "-h", "-o", "%j").stdout.split().count("sleep") < len(NODES):
            assert controller.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.5)
        os.killpg(controller.pid, signal.SIGKILL)
    finally:
        controller.kill()
        controller.wait()
    assert any(line.startswith("process") for line in left_by(lab, prefix))  # the ranks outlived their controller
    clean = run_cli("clean", timeout=300)
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert slurm.leftovers() == []


def test_a_cluster_where_nobody_can_shape_is_refused_before_any_job(prefix: str, monkeypatch: pytest.MonkeyPatch):
    """A Prolog and Epilog that are not testbed's, and a user without sudo: one line naming both ways, no job."""
    from testbed.fabric import lifecycle
    from testbed.fabric.errors import FabricError
    from testbed.fabric.slurm import backend as slurm_backend
    from testbed.spec.topology import load_topology

    with running_lab(ROOT / TOPOLOGY, f"tb{uuid.uuid4().hex[:6]}", "--prolog", "/bin/true", "--epilog",
                     "/bin/true") as other:
        for key in ("SLURM_CONF", "SLURMLAB_NAME", "SLURMLAB_DIR"):
            monkeypatch.setenv(key, other.env[key])
        monkeypatch.setattr(slurm_backend, "can_be_root", lambda: False)  # a user without sudo (tests run as root)
        with pytest.raises(FabricError) as refused:
            lifecycle.bring_up(load_topology(ROOT / TOPOLOGY), prefix=prefix,
                               backend=lifecycle.make_backend("slurm"))
        message = str(refused.value)
        assert "\n" not in message and "testbed slurm prolog|epilog" in message and "sudo -n" in message, message
        assert other.slurm("squeue", "-h").stdout.strip() == ""  # nothing was submitted


def headings(run_dir: Path) -> list[str]:
    return [line for line in (run_dir / "report.md").read_text().splitlines() if line.startswith("#")]


def test_the_quickstart_writes_the_report_the_netns_backend_writes(slurm: Backend, lab: SlurmLab, prefix: str,
                                                                   tmp_path: Path, netns_quickstart):
    """The quickstart's 20 ms cell on 2 DCs x 2 Slurm nodes (a fork server per node, one srun step each): the same
    cells, summary columns and report sections as the netns run of it, its link calibrated at the configured round
    trip, its inter-DC bytes counted by the nodes' qdiscs, and every node as before afterwards."""
    import pandas as pd

    proc = run_cli("run", "--backend", "slurm", "experiments/quickstart.yaml", "--only", QUICKSTART_CELL, "--out",
                   str(tmp_path), timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (run_dir,) = (tmp_path / "quickstart").glob("*")
    assert netns_quickstart.proc.returncode == 0, netns_quickstart.proc.stderr[-2000:]
    netns_dir = netns_quickstart.run_dir
    assert json.loads((run_dir / "manifest.json").read_text())["backend"] == "slurm"
    ours, theirs = pd.read_csv(run_dir / "summary.csv"), pd.read_csv(netns_dir / "summary.csv")
    # this machine's CPU steal is sampled where the ranks run on it (Backend.emulated: netns, docker), not on real
    # nodes (ssh, Slurm): those two columns are the only difference
    steal = ("host_steal", "host_steal_flag")
    assert list(ours.columns) == [column for column in theirs.columns if column not in steal]
    assert sorted(ours["cell"]) == sorted(theirs["cell"]) and len(ours) == 1
    assert (ours["status"] == "ok").all(), ours[["cell", "status", "reason"]]
    assert headings(run_dir) == headings(netns_dir)
    for cell in (run_dir / "cells").iterdir():
        result = json.loads((cell / "result.json").read_text())
        assert result["launcher"] == "fork"
        assert all(40.0 <= c["rtt_p50_ms"] <= 40.0 + RTT_SLACK_MS for c in result["calibration"]), \
            result["calibration"]
        assert sum(v["tx_bytes"] for v in result["link_bytes"].values()) > (1 << 20)
    assert slurm.leftovers() == []


def test_the_prolog_shapes_the_nodes_and_the_epilog_restores_them(slurm: Backend, lab: SlurmLab, prefix: str,
                                                                   tmp_path: Path):
    """`root: prolog`: the lab's Prolog (`testbed slurm prolog`, as an admin installs it) shapes each node when the
    allocation starts; a live change is refused in one line (root is gone by then); `scancel` alone leaves every
    node as before (the Epilog); `clean` then finds nothing left but the state."""
    inventory = tmp_path / "slurm.yaml"
    inventory.write_text("root: prolog\n")
    up = run_cli("up", "--backend", "slurm", "--inventory", str(inventory), TOPOLOGY, timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    assert "reading what the Prolog did" in up.stdout + up.stderr
    job = job_of(lab, prefix)
    for node in NODES:  # the lab's wrapper logs each run of `testbed slurm prolog`
        assert re.search(rf"prolog job={job} node={node} .*testbed=ran rc=0", lab.log("prolog.log")), node
    for pair in probe(slurm).values():
        assert 20.0 <= pair["rtt_p50_ms"] <= 20.0 + RTT_SLACK_MS, pair
    shaped = run_cli("shape", "east", "west", "--latency", "4ms")
    assert shaped.returncode != 0 and "need sudo -n on the nodes" in shaped.stderr, shaped.stderr
    assert len(shaped.stderr.strip().splitlines()) == 1, shaped.stderr
    assert lab.slurm("scancel", job, check=False).returncode == 0
    lab.wait_idle()  # the Epilog has run on every node
    assert [line for line in slurm.leftovers() if not line.startswith("job ")] == []
    clean = run_cli("clean", timeout=300)
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert slurm.leftovers() == []


def test_inside_an_allocation_its_nodes_are_used_and_it_is_left_running(slurm: Backend, lab: SlurmLab, prefix: str,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """With SLURM_JOB_ID set (an sbatch script, an salloc shell) testbed asks for nothing: it shapes that
    allocation's nodes and, at `down`, restores them and leaves the allocation to its owner."""
    said = lab.slurm("salloc", "--no-shell", f"--nodes={len(NODES)}").stderr
    (job,) = re.findall(r"Granted job allocation (\d+)", said)
    try:
        monkeypatch.setenv("SLURM_JOB_ID", job)
        up = run_cli("up", "--backend", "slurm", TOPOLOGY, timeout=300)
        assert up.returncode == 0, up.stderr[-2000:]
        assert "asking Slurm" not in up.stdout + up.stderr
        assert json.loads(run_cli("status", "--json", check=True).stdout)["job"] == job
        for pair in probe(slurm).values():
            assert 20.0 <= pair["rtt_p50_ms"] <= 20.0 + RTT_SLACK_MS, pair
        assert run_cli("down", timeout=300).returncode == 0
        assert slurm.leftovers() == []
        assert lab.slurm("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING"
    finally:
        lab.slurm("scancel", job, check=False)


UNEQUAL = {"name": "unequal", "dcs": [{"name": "east", "nodes": 2}, {"name": "central", "nodes": 1},
                                      {"name": "west", "nodes": 2}],
           "links": [{"between": ["east", "central"], "latency": "4ms", "bandwidth": "1gbit"},
                     {"between": ["central", "west"], "latency": "6ms", "bandwidth": "1gbit"},
                     {"between": ["west", "east"], "latency": "10ms", "bandwidth": "500mbit"}]}


def test_unequal_dcs_two_one_two(prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """DCs of 2, 1 and 2 Slurm nodes (a lab of their own): every node placed by its feature, every pair's round trip
    the configured one, every node as before after `down`."""
    import yaml

    topology = tmp_path / "unequal.yaml"
    topology.write_text(yaml.safe_dump(UNEQUAL))
    with running_lab(topology, f"tb{uuid.uuid4().hex[:6]}") as other:
        for key in ("SLURM_CONF", "SLURMLAB_NAME", "SLURMLAB_DIR"):
            monkeypatch.setenv(key, other.env[key])
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        backend = Backend("slurm", run_cli, ["--backend", "slurm"])
        up = run_cli("up", "--backend", "slurm", str(topology), timeout=300)
        assert up.returncode == 0, up.stderr[-2000:]
        status = json.loads(run_cli("status", "--json", check=True).stdout)
        assert [(h["node"], h["host"]) for h in status["hosts"]] == [
            (n, n) for n in ("east-0", "east-1", "central-0", "west-0", "west-1")]
        pairs = probe(backend)
        assert len(pairs) == 6
        for pair in pairs.values():
            assert pair["rtt_applied_ms"] > 0 and pair["not_applied"] == ""
            assert pair["rtt_applied_ms"] <= pair["rtt_p50_ms"] <= pair["rtt_applied_ms"] + RTT_SLACK_MS, pair
        assert run_cli("down", timeout=300).returncode == 0
        assert other.slurm("squeue", "-h").stdout.strip() == ""
        for node in ("east-0", "central-0", "west-1"):
            root = subprocess.run(["ip", "netns", "exec", f"slurmlab.{other.name}.{node}", "tc", "qdisc", "show",
                                   "dev", "eth0", "root"], capture_output=True, text=True).stdout
            assert "7e57:" not in root, (node, root)


def test_torchft_replica_groups_and_their_lighthouse_run_on_the_slurm_nodes(slurm: Backend, lab: SlurmLab,
                                                                            prefix: str, tmp_path: Path):
    """Both torchft strategies across the lab's four nodes (two DCs of two, srun steps): the lighthouse starts on
    east's first node with that node's interpreter (testbed.agents.lighthouse), torchft's own environment crosses to
    the ranks, both groups are in every quorum, all four ranks end with one model, and every node is as before."""
    from tests.runner.test_torchft_run import EXPERIMENT, assert_both_strategies_ran_as_groups

    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    proc = run_cli("run", "--backend", "slurm", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "results"),
                   timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert_both_strategies_ran_as_groups(tmp_path / "results")
    assert slurm.leftovers() == []
