"""`--backend docker`: the same testbed as netns, made of containers through the docker SDK (root, in CI)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from testbed.plan.containers import build_containers_plan
from testbed.spec import load_topology
from tests.conftest import ROOT, TOPOLOGIES, run_cli
from tests.runner.test_run import USER_SCRIPT
from tests.support.docker import labelled, router_exec

pytestmark = [pytest.mark.root, pytest.mark.docker]

KILL_DELAY_LINE = ("import json, os, signal; "
                   "os.kill(json.load(open('/run/testbed/router.json'))['delay_line'], signal.SIGKILL)")


def test_two_nodes_a_dc_exec_status_and_a_dead_delay_line(prefix, docker_image):
    """What only docker has, on a DC of two nodes (six containers with the routers); the probe, a live shape, a
    partition and down's leftovers are tests/fabric/test_backends.py's, as on every backend."""
    proc = run_cli("up", "--backend", "docker", "--image", docker_image, str(TOPOLOGIES / "two-dc.yaml"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "intra-DC access links are not shaped" in proc.stdout  # said, never hidden
    status = json.loads(run_cli("status", "--json", check=True).stdout)
    assert status["backend"] == "docker" and status["containers_running"] == status["containers_planned"] == 6
    inter = {link["key"]: link for link in status["links"] if link["kind"] == "inter-dc"}
    assert set(inter) == {"east->west", "west->east"}
    assert all("NOT" not in link["mechanism"] and link["mechanism"].startswith("htb+") for link in inter.values())

    ping = run_cli("exec", "east-0", "--", "ping", "-c", "3", "-i", "0.2", "198.18.1.2", timeout=60)
    assert ping.returncode == 0, ping.stderr
    average = float(re.search(r"= [\d.]+/([\d.]+)/", ping.stdout).group(1))
    assert 20.0 <= average < 30.0  # 10 ms each way, through both routers

    if status["shaper"] == "userspace-delay":  # a dead delay line darkens the links, and the harness says so
        code, output = router_exec(prefix, "west", ["python", "-c", KILL_DELAY_LINE])
        assert code == 0, output
        for _ in range(50):
            dead = run_cli("status")
            if dead.returncode == 1:
                break
        assert dead.returncode == 1 and "west-gw" in dead.stderr, dead.stderr
    assert run_cli("down", timeout=120).returncode == 0
    assert labelled(prefix) == []


def test_clean_without_state_removes_every_labelled_object(prefix, state_dir, docker_image):
    path = TOPOLOGIES / "three-dc-ring.yaml"
    run_cli("up", "--backend", "docker", "--image", docker_image, str(path), timeout=240, check=True)
    plan = build_containers_plan(load_topology(path), prefix=prefix)
    assert len(labelled(prefix)) == len(plan.containers) + len(plan.networks)
    for path in state_dir.glob("*.json"):
        path.unlink()  # as after a crash of the controller
    proc = run_cli("clean", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert labelled(prefix) == []


def test_a_torchrun_style_command_runs_in_the_containers(prefix, docker_image, tmp_path):
    topology = tmp_path / "two-dc.yaml"  # its nodes on reno: not the host's (cubic or bbr), in every allowed list
    topology.write_text((TOPOLOGIES / "two-dc.yaml").read_text() + "tcp: {congestion_control: reno}\n")
    proc = run_cli("run", "--topology", str(topology), "--backend", "docker", "--image", docker_image,
                   "--out", str(tmp_path / "out"), "--", "python", "-c", USER_SCRIPT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = next((tmp_path / "out").glob("command-two-dc/*"))
    result = json.loads((run_dir / "cells" / "command" / "result.json").read_text())
    assert result["status"] == "ok" and result["world"] == 4, result["reason"]
    assert sum(v["tx_bytes"] for v in result["link_bytes"].values()) > (1 << 20)  # 1 MB crossed the routers
    outputs = [json.loads((run_dir / "cells" / "command" / "metrics" / f"user{r}.json").read_text()) for r in range(4)]
    assert [o["node"] for o in outputs] == ["east-0", "east-1", "west-0", "west-1"]
    assert all(o["sum"] == 10.0 and o["world"] == 4 for o in outputs)
    assert [o["dc"] for o in outputs] == ["0", "0", "1", "1"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["backend"] == "docker" and manifest["tcp"]["tcp_congestion_control"] == "reno", manifest["tcp"]
    assert labelled(prefix) == []


def test_ctrl_c_during_up_removes_what_was_created(prefix, docker_image):
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", "--backend", "docker", "--image", docker_image,
                             str(TOPOLOGIES / "chain-4dc-8.yaml")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(name.startswith("container") for name in labelled(prefix)):
        assert time.monotonic() < deadline and proc.poll() is None, "bring-up never created a container"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert labelled(prefix) == []



def test_torchft_replica_groups_and_their_lighthouse_run_in_the_containers(prefix, docker_image, tmp_path):
    """The lighthouse starts in east-0's container with the container's own torchft (testbed.agents.lighthouse:
    the controller's path to it names nothing there); both groups train in every quorum and end equal."""
    from tests.runner.test_torchft_run import EXPERIMENT

    (tmp_path / "exp.yaml").write_text(EXPERIMENT.replace("nodes: 2", "nodes: 1"))  # torchft-ddp and -diloco
    proc = run_cli("run", str(tmp_path / "exp.yaml"), "--backend", "docker", "--image", docker_image,
                   "--out", str(tmp_path / "out"), timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = sorted((tmp_path / "out").glob("tiny/*/cells/*"))
    assert len(cells) == 2
    for cell in cells:
        result = json.loads((cell / "result.json").read_text())
        assert result["status"] == "ok" and result["world"] == 2, result["reason"]
        assert "listening" in (cell / "logs" / "lighthouse.log").read_text().lower()
        figures = result["replica_groups"]
        assert figures["replica_groups"] == 2 and figures["participants_min"] == 2 and figures["params_agree"], figures
        assert all(counts["tx_bytes"] > 0 for counts in result["link_bytes"].values()), result["link_bytes"]
    assert labelled(prefix) == []
