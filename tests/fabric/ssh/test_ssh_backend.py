"""The ssh backend end to end: four "hosts" (sshd in namespaces on one flat lab network) and a controller
node run `testbed up/probe/run --backend ssh`; the hosts' interfaces must be shaped while it runs and come
back exactly as they were afterwards: on `down`, after Ctrl-C, and via `clean` after the controller was
SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testbed.agents.bootstrap import argv_in
from testbed.fabric.lifecycle import bring_up
from testbed.plan.hosts import MEMORY_ROOT
from testbed.runner.cells import plan_cells
from testbed.spec.experiment import load_experiment
from tests.conftest import ROOT, TOPOLOGIES
from tests.support.ssh import Hosts, start_hosts
from tests.support.topologies import make_topology

pytestmark = [pytest.mark.root, pytest.mark.sshd]

HOSTS = {"east": ["lab-0", "lab-1"], "west": ["lab-2", "lab-3"]}
CONTROLLER = "lab-4"


@pytest.fixture
def lab(prefix, tmp_path):
    """One flat, unshaped lab network of five nodes: four play hosts in two DCs, lab-4 the controller."""
    topology = make_topology("lab", {"lab": 5})
    testbed = bring_up(topology, prefix=prefix)
    hosts = start_hosts(testbed, tmp_path, HOSTS, workdir=str(tmp_path / "remote"))
    ssh_prefix = f"{prefix}s-"
    env = {"TESTBED_PREFIX": ssh_prefix}
    yield hosts, env, ssh_prefix
    hosts.cli(CONTROLLER, "clean", env=env)
    hosts.stop()


def in_node(hosts: Hosts, node: str, *argv: str) -> str:
    return subprocess.run(argv_in(hosts.testbed.plan.node(node).ns, list(argv)), capture_output=True, text=True,
                          check=True).stdout


def host_state(hosts: Hosts, node: str, ssh_prefix: str) -> dict:
    """What testbed may have changed on a host: root qdisc, our iptables rules, processes in its workdir, the
    workdir and the delay line's files in memory (plan.hosts.memory_dir: /dev/shm is a tmpfs here)."""
    root = json.loads(in_node(hosts, node, "tc", "-j", "qdisc", "show", "dev", "eth0", "root"))[0]
    rules = [line for line in in_node(hosts, node, "iptables", "-w", "-t", "mangle", "-S").splitlines()
             if f"testbed:{ssh_prefix}" in line]
    workdir = hosts.dir / "remote" / f"{ssh_prefix}{node}"
    procs = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/cwd").startswith(str(workdir)):
                procs.append(int(pid))
        except OSError:
            pass
    memory = sorted(p.name for p in Path(MEMORY_ROOT).glob(f"{ssh_prefix}{node}/*"))
    return {"root": f"{root['kind']} {root['handle']}", "rules": rules, "workdir": workdir.exists(), "procs": procs,
            "memory": memory}


def assert_restored(hosts: Hosts, ssh_prefix: str, before: dict) -> None:
    for node in [n for nodes in HOSTS.values() for n in nodes]:
        now = host_state(hosts, node, ssh_prefix)
        assert now == {**before[node], "rules": [], "workdir": False, "procs": [], "memory": []}, node
        assert not Path(MEMORY_ROOT, f"{ssh_prefix}{node}").exists(), node


def snapshot(hosts: Hosts, ssh_prefix: str) -> dict:
    return {node: host_state(hosts, node, ssh_prefix) for nodes in HOSTS.values() for node in nodes}


def ssh_args(hosts: Hosts) -> list[str]:
    return ["--backend", "ssh", "--inventory", str(hosts.inventory), "--known-hosts", str(hosts.known_hosts)]


def test_up_shapes_every_host_and_down_restores_it(lab):
    hosts, env, ssh_prefix = lab
    before = snapshot(hosts, ssh_prefix)
    assert all(state["root"].endswith(" 0:") for state in before.values())
    proc = hosts.cli(CONTROLLER, "up", str(TOPOLOGIES / "two-dc.yaml"), *ssh_args(hosts), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shaper userspace-delay" in proc.stdout
    for node in HOSTS["east"]:
        state = host_state(hosts, node, ssh_prefix)
        assert state["root"] == "htb 7e57:" and state["workdir"]
        nfqueue = [rule for rule in state["rules"] if "NFQUEUE" in rule]
        west = [hosts.testbed.plan.node(n).address for n in HOSTS["west"]]
        assert sorted(rule.split("-s ")[1].split("/")[0] for rule in nfqueue) == sorted(west)  # one rule per source
        assert len(state["procs"]) == 2  # delay-line supervisor and worker
        # its files in memory, not in the workdir on its disk (the stats come within the worker's first second)
        files = {f"{node}.delayline.{kind}" for kind in ("json", "log", "status")}
        assert files <= set(state["memory"]) <= files | {f"{node}.delayline.stats"}, state["memory"]
        assert not list((hosts.dir / "remote" / f"{ssh_prefix}{node}").glob("*.delayline.*"))
    status = hosts.cli(CONTROLLER, "status", "--json", env=env)
    info = json.loads(status.stdout)
    assert info["backend"] == "ssh" and [n["name"] for n in info["nodes"]] == ["east-0", "east-1", "west-0", "west-1"]
    assert {link["mechanism"] for link in info["links"]} == {"htb+delay-line"}

    probe = hosts.cli(CONTROLLER, "probe", "--json", "--pings", "40", "--seconds", "1s", env=env)
    assert probe.returncode == 0, probe.stderr
    pairs = json.loads(probe.stdout)["pairs"]
    for pair in pairs:  # 10 ms each way through real delay lines on the receiving hosts
        assert abs(pair["rtt_p50_ms"] - 20.0) < 2.0, pair
        assert pair["goodput_mbps"] < 1000, pair

    where = hosts.cli(CONTROLLER, "exec", "east-1", "--", "pwd", env=env)  # runs on lab-1, in its workdir
    assert where.returncode == 0 and where.stdout.strip() == str(hosts.dir / "remote" / f"{ssh_prefix}lab-1" / "run")

    down = hosts.cli(CONTROLLER, "down", env=env)
    assert down.returncode == 0, down.stderr
    assert_restored(hosts, ssh_prefix, before)


@pytest.mark.timeout(600)
def test_quickstart_runs_across_hosts_and_leaves_them_as_they_were(lab, tmp_path):
    hosts, env, ssh_prefix = lab
    before = snapshot(hosts, ssh_prefix)
    experiment = ROOT / "experiments" / "quickstart.yaml"
    out = tmp_path / "results"
    only = "hier-dp-overlap__*20ms*"  # one 20 ms cell (the six take three minutes here): real delay, both the
    # intra- and the inter-DC groups, overlapped (flat-dp crosses the hosts in the backends test's faults run)
    proc = hosts.cli(CONTROLLER, "run", str(experiment), "--only", only, "--out", str(out), *ssh_args(hosts), env=env,
                     timeout=540)  # under the test's own 600 s, so that its output is kept
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    run_dir = next((out / "quickstart").iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["backend"] == "ssh" and manifest["shaper"] == "userspace-delay"
    spec, topology = load_experiment(experiment)
    expected = {cell.id for cell in plan_cells(spec, topology) if "20ms" in cell.id and "hier-dp-overlap" in cell.id}
    assert len(expected) == 1
    results = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "cells").glob("*/result.json")}
    assert set(results) == expected
    for cell_id, result in results.items():
        assert result["status"] == "ok", (cell_id, result["reason"], result["log_tail"])
        metrics = sorted(p.name for p in (run_dir / "cells" / cell_id / "metrics").iterdir())
        assert metrics == [f"rank{r}.jsonl" for r in range(4)]  # fetched back over SFTP
        moved = sum(v["tx_bytes"] for v in result["link_bytes"].values())
        arrived = sum(v["rx_bytes"] for v in result["link_bytes"].values())
        assert moved > 100_000 and 0.9 < arrived / moved < 1.1, result["link_bytes"]
        if "=20ms" in cell_id:
            rtts = [c["rtt_p50_ms"] for c in result["calibration"]]
            assert all(abs(rtt - 40.0) < 3.0 for rtt in rtts), (result["calibration"], result["delay_line"])
    assert (run_dir / "report.html").exists() and (run_dir / "summary.csv").exists()
    failed = run_dir / "calibration-failed.txt"  # a failed calibration is recorded, not fatal: not good enough here
    assert not failed.exists() and (run_dir / "calibration.json").exists(), failed.read_text() if failed.exists() else ""
    assert_restored(hosts, ssh_prefix, before)



@pytest.mark.timeout(600)
def test_torchft_replica_groups_and_their_lighthouse_run_on_the_hosts(lab, tmp_path):
    """Both torchft strategies across the four hosts (two DCs of two): the lighthouse starts on east's first host
    with that host's own interpreter and torchft (testbed.agents.lighthouse), its address reaches every rank
    (TORCHFT_ crosses with the env contract: before, it did not and every rank failed), both groups are in every
    quorum, all four ranks end with one model, and the hosts are as they were."""
    from tests.runner.test_torchft_run import EXPERIMENT, assert_both_strategies_ran_as_groups

    hosts, env, ssh_prefix = lab
    before = snapshot(hosts, ssh_prefix)
    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    proc = hosts.cli(CONTROLLER, "run", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "results"),
                     *ssh_args(hosts), env=env, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert_both_strategies_ran_as_groups(tmp_path / "results")
    assert_restored(hosts, ssh_prefix, before)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _ranks_running(out: Path) -> bool:
    """Ranks run on the hosts: the cost model's calibration ranks (a run's first) or a cell's. Interrupting the
    calibration undoes the hosts as well and saves the suite a minute per test."""
    logs = [*out.glob("*/*/calibration/logs/rank*.log"), *out.glob("*/*/cells/*/logs/rank*.log")]
    return any(p.stat().st_size > 0 for p in logs)


@pytest.mark.parametrize("stop", ["ctrl-c", "sigkill+clean"])
def test_interrupted_run_is_undone(lab, tmp_path, stop):
    hosts, env, ssh_prefix = lab
    before = snapshot(hosts, ssh_prefix)
    out = tmp_path / "results"
    proc = hosts.cli(CONTROLLER, "run", str(ROOT / "experiments" / "quickstart.yaml"), "--out", str(out),
                     *ssh_args(hosts), env=env, background=True)
    try:
        _wait_for(lambda: _ranks_running(out), 120, "ranks to start")
        assert host_state(hosts, "lab-0", ssh_prefix)["root"] == "htb 7e57:"
        if stop == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130
        else:
            proc.kill()
            proc.wait()
            assert host_state(hosts, "lab-0", ssh_prefix)["root"] == "htb 7e57:"  # left shaped by the crash
            clean = hosts.cli(CONTROLLER, "clean", env=env)
            assert clean.returncode == 0, clean.stderr
            assert "(ssh)" in clean.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_restored(hosts, ssh_prefix, before)
