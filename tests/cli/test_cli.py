"""The CLI as a user drives it: errors, dry runs, exec, shape, Ctrl-C and SIGKILL during up, clean."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TOPOLOGIES, namespaces_with, run_cli

pytestmark = pytest.mark.root


def test_malformed_topology_gives_one_line_and_creates_nothing(prefix, state_dir, tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndcs:\n  - {name: east, nodes: 2}\n  - {name: west, nodes: 2}\n"
                   "links: [{between: [east, west], latency: 10 parsecs}]\n")
    proc = run_cli("up", str(bad))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"{bad}: links[0].latency" in lines[0] and "Traceback" not in proc.stderr
    assert namespaces_with(prefix) == [] and not state_dir.exists()


def test_dry_run_prints_the_plan_and_creates_nothing(prefix):
    proc = run_cli("up", str(TOPOLOGIES / "two-dc.yaml"), "--dry-run", check=True)
    assert f"{prefix}east-gw" in proc.stdout and "htb" in proc.stdout and "198.18.1.0/24" in proc.stdout
    assert namespaces_with(prefix) == []


def with_tcp(tmp_path: Path, congestion_control: str) -> Path:
    """two-dc.yaml whose nodes run `congestion_control` (tcp.congestion_control)."""
    path = tmp_path / f"two-dc-{congestion_control}.yaml"
    path.write_text((TOPOLOGIES / "two-dc.yaml").read_text() + f"tcp: {{congestion_control: {congestion_control}}}\n")
    return path


def test_a_congestion_control_the_kernel_lacks_is_one_line_before_anything_is_built(prefix, state_dir, tmp_path):
    path = with_tcp(tmp_path, "nosuchcc")
    proc = run_cli("up", str(path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert f"{path}: tcp.congestion_control: nosuchcc is not in this kernel (available: " in lines[0], lines
    assert namespaces_with(prefix) == [] and not state_dir.exists()


def test_up_exec_shape_down(prefix, tmp_path):
    # reno: in every kernel and every host's allowed list, and not the default anywhere (cubic, bbr)
    run_cli("up", str(with_tcp(tmp_path, "reno")), check=True)
    proc = run_cli("exec", "west-1", "--", sys.executable, "-c",
                       "import socket; s=socket.socket(); print(s.getsockname(), "
                       "s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).strip(bytes(1)).decode())",
                       check=True)
    assert "0.0.0.0" in proc.stdout and proc.stdout.split()[-1] == "reno", proc.stdout
    unknown = run_cli("exec", "north-0", "--", "true")
    assert unknown.returncode == 2 and "no node named 'north-0'" in unknown.stderr
    run_cli("shape", "east", "west", "--latency", "25ms", "--bandwidth", "200mbit", check=True)
    info = json.loads(run_cli("status", "--json", check=True).stdout)
    links = {link["key"]: link for link in info["links"]}
    assert links["east->west"]["latency"] == "25ms" and links["west->east"]["bandwidth"] == "200mbit"
    # refused against the link as it is now (25 ms; east->west then jittered by 2 ms), before either direction
    # changes (west->east, checked first, would take 1 ms)
    run_cli("shape", "east", "west", "--jitter", "2ms", "--one-way", check=True)
    for argv, needle in ((("east", "west", "--jitter", "30ms"), "--jitter: 30ms is more than east->west's latency "
                                                                 "now (25ms)"),
                         (("west", "east", "--latency", "1ms"), "--latency: 1ms is less than east->west's jitter now "
                                                                "(2ms)"),
                         (("east", "west", "--bandwidth", "100tbit"), "--bandwidth: east->west's queue: auto sizes "
                                                                       "it from bandwidth x round trip")):
        refused = run_cli("shape", *argv)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert f"testbed shape: {needle}" in refused.stderr, refused.stderr
    links = {link["key"]: link for link in json.loads(run_cli("status", "--json", check=True).stdout)["links"]}
    assert [(links[key]["latency"], links[key]["jitter"], links[key]["bandwidth"])
            for key in ("east->west", "west->east")] == [("25ms", "2ms", "200mbit"), ("25ms", "0", "200mbit")]
    bad = run_cli("shape", "east", "west", "--latency", "soon")
    assert bad.returncode == 2 and "--latency" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    nolink = run_cli("shape", "east", "north", "--latency", "1ms")
    assert nolink.returncode == 2 and "no direct link" in nolink.stderr
    run_cli("down", check=True)
    assert namespaces_with(prefix) == []


def _start_up(topology: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", str(TOPOLOGIES / topology)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_namespaces(prefix: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not namespaces_with(prefix):
        assert time.monotonic() < deadline, "bring-up never started"
        time.sleep(0.005)


def test_ctrl_c_during_up_leaves_nothing(prefix):
    proc = _start_up("chain-4dc-8.yaml")
    _wait_for_namespaces(prefix)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert namespaces_with(prefix) == []


def test_sigterm_during_up_leaves_nothing(prefix):
    proc = _start_up("chain-4dc-8.yaml")
    _wait_for_namespaces(prefix)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert namespaces_with(prefix) == []


def test_clean_after_sigkill_removes_everything(prefix, state_dir):
    run_cli("up", str(TOPOLOGIES / "three-dc-ring.yaml"), check=True)
    proc = _start_up("chain-4dc-8.yaml")
    _wait_for_namespaces(prefix)
    proc.kill()  # no chance to clean: the state file and half the namespaces stay behind
    proc.communicate()
    for path in state_dir.glob("*.json"):
        path.unlink()  # and even without any state file...
    assert namespaces_with(prefix)
    run_cli("clean", check=True)
    assert namespaces_with(prefix) == []
    leftover = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"{state_dir}" not in leftover  # no delay line of ours still running
