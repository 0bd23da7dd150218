"""scripts/slurm-lab: a real Slurm on this machine, one slurmd per topology node in namespaces of its own. What the
Slurm backend's tests rely on: every node idle with its DC as feature, job steps in the right node's namespace,
Prolog and Epilog as root on each allocated node, and nothing left after `down`, even of an `up` killed halfway.
(The backend's own tests against the lab are in test_lab.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.spec.topology import load_topology
from tests.support.slurm_lab import SCRIPT, SlurmLab, lab_down, lab_up, leftovers, run_script, running_lab, state_dir

pytestmark = [pytest.mark.root, pytest.mark.slurm]

TWO_DC = Path(__file__).resolve().parents[3] / "topologies" / "two-dc.yaml"  # east-0, east-1, west-0, west-1


def fresh_name(what: str) -> str:
    """A lab name of this test's own: a lab someone has up on this machine is left alone."""
    return f"t-{what}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def slurm_lab() -> Iterator[SlurmLab]:
    """The lab of topologies/two-dc.yaml, up once for these tests and always taken down, nothing of it left."""
    with running_lab(TWO_DC, fresh_name("lab")) as lab:
        yield lab


def test_every_node_is_idle_with_its_dc_as_feature(slurm_lab: SlurmLab) -> None:
    topology = load_topology(TWO_DC)
    expected = {node: ("idle", dc.name) for dc in topology.dcs for node in dc.node_names()}
    assert slurm_lab.wait_idle() == expected
    assert list(slurm_lab.nodes) == list(expected)  # named as testbed names the topology's nodes, in its order


def test_each_task_runs_in_its_node_namespace_with_the_node_name_and_address(slurm_lab: SlurmLab) -> None:
    script = ('echo "$SLURM_NODEID $(hostname) $(stat -L -c %i /proc/self/ns/net) '
              '$(ip -4 -o addr show dev eth0 | awk \'{print $4}\') $(getent hosts west-1 | cut -d" " -f1)"')
    out = slurm_lab.slurm("srun", "-N4", "--ntasks-per-node=1", "sh", "-c", script).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert [row[0] for row in rows] == ["0", "1", "2", "3"], out
    for _, hostname, netns_inode, address, west_1 in rows:
        node = slurm_lab.nodes[hostname]  # the UTS namespace's name is the node's
        assert int(netns_inode) == os.stat(f"/run/netns/slurmlab.{slurm_lab.name}.{hostname}").st_ino
        assert address == f"{node['address']}/24"
        assert west_1 == slurm_lab.nodes["west-1"]["address"]  # the lab's names resolve inside a node


def test_a_constraint_takes_the_nodes_of_one_dc(slurm_lab: SlurmLab) -> None:
    for dc in ("east", "west"):
        out = slurm_lab.slurm("srun", "-N2", f"--constraint={dc}", "hostname").stdout
        assert sorted(out.split()) == [f"{dc}-0", f"{dc}-1"]
    refused = slurm_lab.slurm("srun", "-N3", "--constraint=east", "--immediate=5", "true", check=False)
    assert refused.returncode != 0 and "node configuration is not available" in refused.stderr, refused.stderr


def hook_lines(lab: SlurmLab, which: str, job: str) -> list[dict]:
    """The lab wrapper's lines for `job`: `<time> prolog job=.. node=.. host=.. uid=.. testbed=.. rc=..`."""
    return [{"at": float(line.split()[0]), **dict(word.split("=", 1) for word in line.split()[2:])}
            for line in lab.log(f"{which}.log").splitlines() if f" {which} job={job} " in line]


def test_prolog_and_epilog_run_as_root_on_every_allocated_node_around_the_job(slurm_lab: SlurmLab,
                                                                              tmp_path: Path) -> None:
    # a batch job steps onto its first node only: the Prolog runs on all four before it (PrologFlags=Alloc)
    started = tmp_path / "started"
    out = slurm_lab.slurm("sbatch", "--wait", "-N4", "-o", "/dev/null", "--parsable",
                          f"--wrap=date +%s.%N > {started}").stdout
    job = out.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while len(hook_lines(slurm_lab, "epilog", job)) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    prolog, epilog = hook_lines(slurm_lab, "prolog", job), hook_lines(slurm_lab, "epilog", job)
    for lines in (prolog, epilog):
        assert sorted(line["node"] for line in lines) == sorted(slurm_lab.nodes), lines
        assert all(line["host"] == line["node"] and line["uid"] == "0" and line["rc"] == "0" for line in lines), lines
    assert max(line["at"] for line in prolog) <= float(started.read_text()) <= min(line["at"] for line in epilog)


def test_an_admins_own_prolog_and_epilog_and_a_second_lab_beside_the_first(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    record = tmp_path / "hooks.log"
    for which in ("prolog", "epilog"):
        hook = tmp_path / which
        hook.write_text(f'#!/bin/sh\necho "{which} $SLURM_JOB_ID $(hostname) $(id -u) '
                        f'$(stat -L -c %i /proc/self/ns/net)" >> {record}\n')
        hook.chmod(0o755)
    name = fresh_name("hooks")
    with running_lab(TWO_DC, name, "--prolog", str(tmp_path / "prolog"), "--epilog", str(tmp_path / "epilog")) as lab:
        assert lab.record["subnet"] != slurm_lab.record["subnet"]  # both labs up at once, each on its own /24
        job = lab.slurm("srun", "-N2", "--constraint=west", "sh", "-c", "echo $SLURM_JOB_ID").stdout.split()[0]
        deadline = time.monotonic() + 60
        while record.read_text().count(f"epilog {job} ") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        lines = sorted(record.read_text().splitlines())
        inode = {node: os.stat(f"/run/netns/slurmlab.{name}.{node}").st_ino for node in ("west-0", "west-1")}
        assert lines == sorted(f"{which} {job} {node} 0 {inode[node]}" for which in ("epilog", "prolog")
                               for node in ("west-0", "west-1"))
        assert lab.log("prolog.log") == ""  # the lab's own wrappers were not installed
    assert slurm_lab.wait_idle()  # the first lab still answers


def test_a_node_that_never_registers_is_named_with_its_log_and_nothing_but_logs_is_left(tmp_path: Path) -> None:
    stand_in = tmp_path / "slurmd"
    stand_in.write_text("#!/bin/sh\nexec sleep 600\n")
    stand_in.chmod(0o755)
    name = fresh_name("late")
    proc = run_script("up", str(TWO_DC), "--name", name, "--slurmd", str(stand_in), "--timeout", "3")
    try:
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        for node in ("east-0", "east-1", "west-0", "west-1"):
            assert f"{node} (unk): {state_dir(name)}/log/slurmd-{node}.log" in proc.stderr
        assert leftovers(name) == [f"state directory {state_dir(name)}"]
        assert sorted(p.name for p in state_dir(name).iterdir()) == ["log"]
    finally:
        lab_down(name)
    assert leftovers(name) == []


def test_a_bad_topology_is_one_line_exit_2_and_makes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndcs:\n  - {name: east, nodes: 0}\n")
    name = fresh_name("bad")
    proc = run_script("up", str(bad), "--name", name)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and str(bad) in proc.stderr and "dcs[0].nodes" in proc.stderr
    assert leftovers(name) == []


def stopped_halfway(name: str) -> subprocess.Popen:
    """An `up` stopped (SIGSTOP) once its slurmctld answers, before any node is idle or any export printed."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "SLURMLAB_"))}
    proc = subprocess.Popen([str(SCRIPT), "up", str(TWO_DC), "--name", name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "slurmctld up" in line:
            proc.send_signal(signal.SIGSTOP)
            return proc
    proc.kill()
    raise AssertionError(f"slurm-lab up ended before its slurmctld answered ({proc.wait()})")


def killed(proc: subprocess.Popen, signum: int) -> tuple[int, str, str]:
    proc.send_signal(signum)
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_sigterm_during_up_takes_down_what_it_made() -> None:
    name = fresh_name("term")
    try:
        returncode, out, err = killed(stopped_halfway(name), signal.SIGTERM)
        assert returncode == 128 + signal.SIGTERM and out == "", err
        assert "stopped by SIGTERM" in err
        assert leftovers(name) == []
    finally:
        lab_down(name)
    assert leftovers(name) == []


@pytest.mark.parametrize("then", ["down", "up again"])
def test_after_sigkill_during_up_down_or_the_next_up_sweeps_everything(then: str) -> None:
    name = fresh_name("kill")
    try:
        returncode, out, _ = killed(stopped_halfway(name), signal.SIGKILL)
        assert returncode == -signal.SIGKILL and out == ""
        left = leftovers(name)
        assert any(item.startswith("namespace ") for item in left) and any("slurmctld" in item for item in left), left
        if then == "up again":
            lab = lab_up(TWO_DC, name)
            assert f"swept what an earlier lab {name} left" in lab.said
            assert lab.wait_idle(timeout=5) == {n: ("idle", n.split("-")[0]) for n in lab.nodes}
    finally:
        lab_down(name)
    assert leftovers(name) == []
