"""testbed.api called directly, with no command line: the cost model's use cases without privileges, and a whole
testbed's life through api.testbed(), the one "brought up or attached, always torn down" (root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import api
from testbed.fabric import ownership
from testbed.fabric.netns.namespaces import list_namespaces
from testbed.spec.experiment import load_experiment
from testbed.spec.topology import load_topology

from ..conftest import ROOT, TOPOLOGIES

TWO_DC = TOPOLOGIES / "two-dc.yaml"


def without_privileges() -> list[str]:
    """A command prefix that runs with no capability at all (root's bounding set emptied); nothing when the tests
    already run unprivileged."""
    if os.geteuid() != 0:
        return []
    assert shutil.which("setpriv"), "util-linux's setpriv is needed to run a command without capabilities"
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"]


def unprivileged(code: str) -> object:
    """What `code` (Python using `api`, ending by setting `answer`) answers, run without any privilege."""
    script = f"import json\nfrom pathlib import Path\nfrom testbed import api\n{code}\nprint(json.dumps(answer, default=str))"
    proc = subprocess.run([*without_privileges(), sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_plan_predicts_every_cell_and_the_best_per_point_without_privileges():
    from testbed.runner.cells import plan_cells

    result = unprivileged("answer = api.plan(Path('experiments/hierarchical-vs-flat.yaml'))")
    experiment, topology = load_experiment(ROOT / "experiments" / "hierarchical-vs-flat.yaml")
    assert [cell["cell"] for cell in result["cells"]] == [cell.id for cell in plan_cells(experiment, topology)]
    assert all(cell["step_s_predicted"] > 0 for cell in result["cells"])
    assert set(result["best"]) == {f"links[east,west].latency={v}" for v in ("0ms", "5ms", "10ms", "20ms")}
    assert set(result["best"].values()) <= {cell["strategy"] for cell in result["cells"]}


def test_plan_refuses_a_bad_file_in_one_line_with_its_exit_status(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text((ROOT / "experiments" / "quickstart.yaml").read_text().replace("strategies:", "strategy:"))
    with pytest.raises(api.UserError) as refused:
        api.plan(path)
    assert refused.value.code == 2 and str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_whatif_answers_every_strategy_and_writes_its_files_without_privileges(tmp_path):
    out = tmp_path / "whatif"
    out.mkdir()
    out.chmod(0o777)  # written by a process without privileges (root without CAP_DAC_OVERRIDE)
    result = unprivileged(f"r = api.whatif(Path('scenarios/nemotron-340b-two-dc.yaml'), Path({str(out)!r}))\n"
                          "answer = {k: r[k] for k in ('answers', 'recommendation', 'files')}")
    from testbed.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "nemotron-340b-two-dc.yaml")
    assert [row["strategy"] for row in result["answers"]] == [s.name for s in scenario.strategies]
    assert all(0 < row["efficiency"] <= 1.0 + 1e-9 for row in result["answers"])
    assert result["recommendation"]["line"]
    for path in result["files"].values():
        assert Path(path).parent == out and Path(path).stat().st_size > 0


def gone(prefix: str, state_dir: Path) -> None:
    """Nothing of testbed `prefix` is left: no namespace, no state file, no hold on it."""
    assert list_namespaces(prefix) == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [line for line in listed.splitlines() if line.startswith(prefix)]
    assert not list(state_dir.glob(f"{prefix}*")) if state_dir.exists() else True
    assert not ownership.holds(prefix)


@pytest.mark.root
def test_a_whole_testbed_through_the_api_leaves_nothing(prefix, state_dir):
    topology = load_topology(TWO_DC)
    with api.testbed(TWO_DC, prefix=prefix) as testbed:
        assert len(list_namespaces(prefix)) == len(testbed.plan.nodes) + 2 * len(topology.dcs)  # nodes, sw, gw
        status = api.status(prefix=prefix)
        assert status["topology"] == topology.name and status["dead_delay_lines"] == []
        assert {node["name"] for node in status["nodes"]} == {n.name for n in testbed.plan.nodes}
        inter = {link["key"]: link for link in status["links"] if link["kind"] == "inter-dc"}
        assert set(inter) == {"east->west", "west->east"}
        probed = api.probe(prefix=prefix, pings=20, flow_seconds=0)
        assert {(p["src"], p["dst"]) for p in probed["pairs"]} == {("east", "west"), ("west", "east")}
        one_way_ms = api.load_topology(TWO_DC).links[0].latency * 1e3
        for pair in probed["pairs"]:  # a round trip crosses the link both ways; unshaped it would take ~0.1 ms
            assert pair["rtt_configured_ms"] == pytest.approx(2 * one_way_ms)
            assert pair["rtt_p50_ms"] >= 0.9 * pair["rtt_configured_ms"] and pair["pings"] == 20
        assert probed["dead_delay_lines"] == [] and probed["report"] is None
    gone(prefix, state_dir)


@pytest.mark.root
def test_the_context_manager_tears_down_when_the_body_raises(prefix, state_dir):
    with pytest.raises(RuntimeError, match="the body failed"), api.testbed(TWO_DC, prefix=prefix) as testbed:
        assert list_namespaces(prefix) and ownership.holds(prefix)
        assert testbed.plan.prefix == prefix
        raise RuntimeError("the body failed")
    gone(prefix, state_dir)


@pytest.mark.root
def test_attached_is_left_running_and_down_removes_it(prefix, state_dir):
    brought = api.up(TWO_DC, prefix=prefix)
    assert brought["name"] == "two-dc" and brought["dcs"] == 2
    with pytest.raises(RuntimeError), api.testbed(prefix=prefix):  # attached: a failure there is not a teardown
        raise RuntimeError
    assert api.status(prefix=prefix)["topology"] == "two-dc"
    assert api.down(prefix=prefix)
    gone(prefix, state_dir)
    with pytest.raises(api.UserError, match=f"no testbed is up with prefix '{prefix}'"), api.testbed(prefix=prefix):
        pass
