"""`testbed run` end to end on the netns fabric (root): report, check, compare, a rank killed mid-cell,
--resume after the runner is SIGKILLed, and a user's own torchrun-style command."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyroute2 import netns

from tests.conftest import ROOT, namespaces_with, run_cli

pytestmark = pytest.mark.root

TOPOLOGY = """  name: pair
  dcs: [{name: east, nodes: 1}, {name: west, nodes: 1}]
  links: [{between: [east, west], latency: 2ms, bandwidth: 1gbit}]
"""


def experiment(tmp: Path, *, steps: int = 4, strategies: str = "[flat-dp, hier-dp]", sweep: str = "[1ms, 5ms]",
               baseline: str = "auto", extra: str = "") -> Path:
    path = tmp / "exp.yaml"
    path.write_text(f"name: tiny\ntopology:\n{TOPOLOGY}workload: {{steps: {steps}, warmup_steps: 1, micro_batch: 2, "
                    f"micro_batches: 1}}\nstrategies: {strategies}\nsweep:\n  links[east,west].latency: {sweep}\n"
                    f"baseline: {baseline}\ncalibrate: none\ncell_timeout: 120s\n{extra}")
    return path


def start_run(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_dir_of(out: Path) -> Path:
    runs = [p for p in (out / "tiny").glob("*") if (p / "manifest.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def test_run_writes_results_report_and_gates(prefix, tmp_path):
    extra = ("thresholds:\n  - {metric: tokens_per_s, strategy: flat-dp, where: {latency: 1ms}, min: 1}\n"
             "  - {metric: tokens_per_s, strategy: flat-dp, where: {latency: 5ms}, max: 1, claim: impossible}\n")
    proc = run_cli("run", str(experiment(tmp_path, extra=extra)), "--out", str(tmp_path / "out"), "--check",
                   timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]  # every cell ran; the impossible threshold is missed
    run_dir = run_dir_of(tmp_path / "out")
    assert f"report: {run_dir / 'report.html'}" in proc.stdout.replace("\n", "")
    assert "PASS: tokens_per_s of flat-dp at latency=1ms" in proc.stdout and "FAIL: impossible" in proc.stdout
    assert namespaces_with(prefix) == []
    rows = list(csv.DictReader(open(run_dir / "summary.csv")))
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    steps = list(csv.DictReader(open(run_dir / "steps.csv")))
    for row in rows:
        assert float(row["inter_dc_bytes_kernel"]) > 0 and float(row["tokens_per_s"]) > 0
        assert float(row["scaling_efficiency"]) > 0 and 0 < float(row["efficiency_vs_single_site"]) <= 1.5
        # throughput is the measured steps' tokens over their summed wall time (slowest rank per step)
        mine = [r for r in steps if r["cell"] == row["cell"] and int(r["step"]) >= 1]
        walls = {}
        for r in mine:
            walls[r["step"]] = max(walls.get(r["step"], 0.0), float(r["wall_s"]))
        tokens = sum(float(r["tokens"]) for r in mine)
        assert float(row["tokens_per_s"]) == pytest.approx(tokens / sum(walls.values()), rel=1e-9)
        assert float(row["step_s_mean"]) == pytest.approx(sum(walls.values()) / len(walls), rel=1e-9)
        assert float(row["step_s_median"]) <= float(row["step_s_p90"])
        # the hypervisor's share of this machine's CPU during the measured steps, from the cell's samples
        samples = json.loads((run_dir / "cells" / row["cell"] / "result.json").read_text())["host_cpu"]["samples"]
        assert len(samples) >= 2 and samples[0][0] <= min(float(r["time"]) - float(r["wall_s"]) for r in mine)
        assert samples[-1][0] >= max(float(r["time"]) for r in mine)
        assert 0 <= float(row["host_steal"]) <= 1 and row["host_steal_flag"] in ("True", "False")
    best = max(float(r["tokens_per_s"]) for r in rows if r["baseline"] == "True")
    for row in rows:
        assert float(row["efficiency_vs_single_site"]) == pytest.approx(float(row["tokens_per_s"]) / best)
    baseline = [r for r in rows if r["baseline"] == "True"]
    assert {r["strategy"] for r in baseline} == {"flat-dp", "hier-dp"}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    if manifest["shaper"] == "userspace-delay":  # the emulator's own lateness, per cell and link
        for row in rows:
            if row["baseline"] == "True":  # 0 ms links: their rules deleted, no packet crossed the delay line
                assert row["delay_late_p99_ms"] == "", row
                continue
            assert 0 <= float(row["delay_late_p99_ms"]) <= float(row["delay_late_max_ms"]), row
            assert row["delay_late_link"] in ("east->west", "west->east")
        result = json.loads(next((run_dir / "cells").glob("flat-dp__latency-east-west=5ms*/result.json")).read_text())
        late = result["delay_line"]["east->west"]
        assert late["packets"] > 100 and late["delay_ms"] == 5.0 and late["bound_ms"] == 1.0
        assert late["scheduling"] == "fifo"  # root here: the worker got real-time priority
        assert 0 < result["delay_line_cpu_s"] < result["seconds"] * os.cpu_count(), result["delay_line_cpu_s"]
        assert all(float(row["delay_line_cpu_s"]) > 0 for row in rows)
        assert "## Emulator lateness" in (run_dir / "report.md").read_text()
    assert manifest["shaper"] in ("netem", "userspace-delay") and manifest["links"]["east->west"]["mechanism"]
    assert manifest["versions"]["torch"].startswith("2.") and manifest["experiment_sha256"]
    assert manifest["links"]["west->east"]["shaper"] == manifest["shaper"] and manifest["finished"]
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as available:  # the node's, as its kernel has it
        assert manifest["tcp"]["tcp_congestion_control"] in available.read().split()
    assert manifest["tcp"]["tcp_slow_start_after_idle"] in ("0", "1")
    assert set(manifest["calibration"]) == {r["cell"] for r in rows}
    html = (run_dir / "report.html").read_text()
    assert '<img src="plots/efficiency.png"' in html and (run_dir / "plots" / "efficiency.png").stat().st_size > 5000
    assert '<img src="plots/throughput.png"' in html
    reading = (run_dir / "report.md").read_text().split("## Reading", 1)[1].split("##", 1)[0]
    first = [line for line in reading.splitlines() if line.startswith("- ")][:2]
    assert all("fastest is **" in line and "tokens/s" in line for line in first), reading
    check = run_cli("check", str(run_dir), "--junit", str(tmp_path / "junit.xml"))
    assert check.returncode == 1
    assert "PASS:" in check.stdout and "FAIL: impossible" in check.stdout
    from xml.etree import ElementTree

    suites = {s.get("name"): s for s in ElementTree.parse(tmp_path / "junit.xml").getroot().iter("testsuite")}
    cases = suites["tiny.thresholds"].findall("testcase")
    assert [c.get("name") for c in cases] == ["tokens_per_s of flat-dp at latency=1ms >= 1.0", "impossible"]
    assert cases[0].find("failure") is None and cases[1].find("failure").get("message").endswith("bound <= 1.0")
    assert len(suites["tiny.cells"].findall("testcase")) == 6 and suites["tiny.cells"].get("failures") == "0"
    (run_dir / "report.html").unlink()
    assert run_cli("report", str(run_dir)).returncode == 0 and (run_dir / "report.html").exists()
    compare = run_cli("compare", str(run_dir), str(run_dir), "--output", "csv", check=True)
    rows = list(csv.DictReader(compare.stdout.splitlines()))
    assert len(rows) == 6 and all(float(row["tokens_per_s B/A"]) == 1.0 for row in rows)
    assert "A against B" in run_cli("compare", str(run_dir), str(run_dir), check=True).stdout


def _workload_pids(namespace: str) -> list[int]:
    pids = []
    for pid in netns.ns_pids().get(namespace, []):
        try:
            if b"testbed.workload" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            pass
    return pids


def test_a_killed_rank_fails_its_cell_and_the_rest_completes(prefix, tmp_path):
    path = experiment(tmp_path, steps=250, strategies="[flat-dp]", sweep="[1ms, 2ms]", baseline="none")
    path.write_text(path.read_text().replace("cell_timeout: 120s", "cell_timeout: 40s"))
    proc = start_run(str(path), "--out", str(tmp_path / "out"))
    try:
        deadline = time.monotonic() + 120
        victim = []
        while not victim:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
            metrics = list((tmp_path / "out").glob("tiny/*/cells/*1ms*/metrics/rank1.jsonl"))
            if metrics and metrics[0].read_text().count("\n") >= 3:
                victim = _workload_pids(f"{prefix}west-0")
            time.sleep(0.05)
        os.kill(victim[0], signal.SIGKILL)
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]  # a cell failed: CI must see it
    assert "1 of 2 cells failed" in err and "FAIL: cell flat-dp__latency-east-west=1ms__r0: rank 1" in err
    run_dir = run_dir_of(tmp_path / "out")
    results = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "cells").glob("*/result.json")}
    killed = next(r for name, r in results.items() if "1ms" in name)
    assert killed["status"] == "failed" and killed["failed_rank"] == 1
    assert "rank 1 on west-0 died (signal 9)" in killed["reason"]
    assert killed["seconds"] < 40  # failed fast, not at the timeout
    assert [r["status"] for name, r in results.items() if "2ms" in name] == ["ok"]
    assert "FAILED: rank 1 on west-0 died" in (run_dir / "report.md").read_text()
    assert namespaces_with(prefix) == []
    assert not _workload_pids(f"{prefix}east-0")


def test_resume_after_the_runner_is_killed(prefix, tmp_path):
    path = experiment(tmp_path, steps=6, baseline="none")
    proc = start_run(str(path), "--out", str(tmp_path / "out"))
    try:
        deadline = time.monotonic() + 180
        while not list((tmp_path / "out").glob("tiny/*/cells/*/result.json")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.kill()  # SIGKILL: no teardown, no report
        proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = run_dir_of(tmp_path / "out")
    first = {p.parent.name: json.loads(p.read_text())["started"] for p in (run_dir / "cells").glob("*/result.json")}
    assert 1 <= len(first) < 4
    resumed = run_cli("run", str(path), "--out", str(tmp_path / "out"), "--resume", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert run_dir_of(tmp_path / "out") == run_dir
    after = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "cells").glob("*/result.json")}
    assert len(after) == 4 and all(r["status"] == "ok" for r in after.values())
    for name, started in first.items():
        assert after[name]["started"] == started, f"{name} was redone"
    assert namespaces_with(prefix) == []


USER_SCRIPT = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1 << 18) * (dist.get_rank() + 1)
dist.all_reduce(t)
out = os.path.join(os.environ["TESTBED_METRICS_DIR"], f"user{dist.get_rank()}.json")
json.dump({"sum": float(t[0]), "dc": os.environ["TESTBED_DC"], "node": os.environ["TESTBED_NODE"],
           "world": dist.get_world_size(), "dcs": os.environ["TESTBED_NUM_DCS"]}, open(out, "w"))
dist.destroy_process_group()
"""


def test_bring_your_own_torchrun_script(prefix, tmp_path):
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    proc = run_cli("run", "--topology", str(ROOT / "topologies" / "two-dc.yaml"), "--out", str(tmp_path / "out"),
                   "--", sys.executable, str(script), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = next((tmp_path / "out").glob("command-two-dc/*"))
    result = json.loads((run_dir / "cells" / "command" / "result.json").read_text())
    assert result["status"] == "ok" and result["world"] == 4
    assert sum(v["tx_bytes"] for v in result["link_bytes"].values()) > (1 << 20)  # 1 MB tensor crossed DCs
    outputs = [json.loads((run_dir / "cells" / "command" / "metrics" / f"user{r}.json").read_text()) for r in range(4)]
    assert [o["dc"] for o in outputs] == ["0", "0", "1", "1"] and all(o["sum"] == 10.0 for o in outputs)
    assert [o["node"] for o in outputs] == ["east-0", "east-1", "west-0", "west-1"]
    assert json.loads((run_dir / "manifest.json").read_text())["command"][-1] == str(script)
    assert "Cell `command` finished" in (run_dir / "report.md").read_text()
    assert namespaces_with(prefix) == []


def test_bring_your_own_ddp_script_reports_its_steps(prefix, tmp_path):
    """examples/ddp.py (PyTorch DDP, steps reported with testbed.steplog) under `--baseline`: the command runs
    on unshaped links, then on the shaped one, and summary.csv has its tokens/s and efficiency."""
    topology = tmp_path / "pair.yaml"
    topology.write_text("\n".join(line[2:] for line in TOPOLOGY.splitlines()) + "\n")
    proc = run_cli("run", "--topology", str(topology), "--baseline", "--warmup-steps", "1", "--out",
                   str(tmp_path / "out"), "--", sys.executable, str(ROOT / "examples" / "ddp.py"), "--steps", "4",
                   "--d-model", "64", "--layers", "1", "--batch", "2", "--seq-len", "32", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = next((tmp_path / "out").glob("command-pair/*"))
    rows = {r["cell"]: r for r in csv.DictReader(open(run_dir / "summary.csv"))}
    assert set(rows) == {"command__baseline", "command"} and rows["command__baseline"]["baseline"] == "True"
    for row in rows.values():
        assert row["status"] == "ok" and int(row["steps"]) == 4 and float(row["tokens_per_s"]) > 0
        assert float(row["final_loss"]) > 0 and float(row["inter_dc_bytes_kernel"]) > 0
    shaped, unshaped = float(rows["command"]["tokens_per_s"]), float(rows["command__baseline"]["tokens_per_s"])
    assert float(rows["command"]["efficiency_vs_single_site"]) == pytest.approx(shaped / unshaped)
    assert float(rows["command__baseline"]["efficiency_vs_single_site"]) == pytest.approx(1.0)
    steps = list(csv.DictReader(open(run_dir / "steps.csv")))
    assert sorted((r["cell"], r["rank"], r["step"]) for r in steps) == sorted(
        (cell, str(rank), str(step)) for cell in rows for rank in range(2) for step in range(4))
    assert all(float(r["tokens"]) == 64 for r in steps)  # 2 samples of 32 tokens per rank and step
    assert "fastest is **command**" in (run_dir / "report.md").read_text()
    assert namespaces_with(prefix) == []


ABORT_AT_EXIT = """import os, sys
sys.path.insert(0, {root!r})
from testbed.steplog import StepLog
log = StepLog()
for _ in range(3):
    log.step(tokens=8)
if {close!r}:
    log.close()
if os.environ["RANK"] == "0":
    os.abort()  # what std::terminate does when torch's threads race exit() (testbed.runner.ranks.teardown_note)
"""


@pytest.mark.parametrize("close", [True, False])
def test_an_abort_after_the_script_closed_its_step_log_keeps_the_cell(prefix, tmp_path, close):
    """Rank 0 aborts (signal 6) after its steps: once its script closed its StepLog the cell is ok and its result
    names the abort; before that, the rank died."""
    topology, script = tmp_path / "pair.yaml", tmp_path / "abort.py"
    topology.write_text("\n".join(line[2:] for line in TOPOLOGY.splitlines()) + "\n")
    script.write_text(ABORT_AT_EXIT.format(root=str(ROOT), close=close))
    proc = run_cli("run", "--topology", str(topology), "--warmup-steps", "1", "--out", str(tmp_path / "out"), "--",
                   sys.executable, str(script), timeout=300)
    (result,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("command-pair/*/cells/*/result.json")]
    if close:
        assert proc.returncode == 0 and result["status"] == "ok", proc.stderr[-2000:]
        assert "rank 0 on east-0 ended by signal 6 (SIGABRT) after its script closed its step log" in result["reason"]
    else:
        assert proc.returncode == 1 and result["status"] == "failed", proc.stderr[-2000:]
        assert "rank 0 on east-0 died (signal 6)" in result["reason"]
    assert namespaces_with(prefix) == []


def test_several_ranks_per_node(prefix, tmp_path):
    path = experiment(tmp_path, strategies="[hier-dp]", sweep="[1ms]", baseline="none")
    path.write_text(path.read_text().replace("micro_batches: 1}", "micro_batches: 1, ranks_per_node: 2}"))
    proc = run_cli("run", str(path), "--out", str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = run_dir_of(tmp_path / "out")
    (result_path,) = list((run_dir / "cells").glob("*/result.json"))
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok" and result["world"] == 4
    starts = [json.loads((result_path.parent / "metrics" / f"rank{r}.jsonl").read_text().splitlines()[0])
              for r in range(4)]
    assert [s["dc"] for s in starts] == [0, 0, 1, 1] and all(s["nodes_per_dc"] == 2 for s in starts)
    logs = [(result_path.parent / "logs" / f"rank{r}.log").exists() for r in range(4)]
    assert all(logs)


UNEQUAL = """name: uneven
dcs: [{name: a, nodes: 2}, {name: b, nodes: 1}, {name: c, nodes: 2}]
links: [{between: [a, b], latency: 2ms, bandwidth: 1gbit}, {between: [b, c], latency: 2ms, bandwidth: 1gbit}]
"""

SIZES_SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1 << 16) * (dist.get_rank() + 1)
dist.all_reduce(t)
keys = ("TESTBED_DC", "TESTBED_DC_SIZES", "TESTBED_NUM_DCS", "TESTBED_NODES_PER_DC", "TESTBED_NODE")
out = os.path.join(os.environ["TESTBED_METRICS_DIR"], f"user{dist.get_rank()}.json")
json.dump({"sum": float(t[0]), **{k: os.environ.get(k) for k in keys}}, open(out, "w"))
dist.destroy_process_group()
code = int(os.environ.get("FAIL_RANK_2_WITH", "0"))
sys.exit(code if os.environ["RANK"] == "2" else 0)
"""


def test_bring_your_own_script_on_unequal_dcs(prefix, tmp_path):
    topology, script = tmp_path / "uneven.yaml", tmp_path / "sizes.py"
    topology.write_text(UNEQUAL)
    script.write_text(SIZES_SCRIPT)
    proc = run_cli("run", "--topology", str(topology), "--out", str(tmp_path / "out"), "--", sys.executable, str(script),
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = next((tmp_path / "out").glob("command-uneven/*"))
    outputs = [json.loads((run_dir / "cells" / "command" / "metrics" / f"user{r}.json").read_text()) for r in range(5)]
    assert [o["TESTBED_DC"] for o in outputs] == ["0", "0", "1", "2", "2"]
    assert [o["TESTBED_NODE"] for o in outputs] == ["a-0", "a-1", "b-0", "c-0", "c-1"]
    assert all(o["TESTBED_DC_SIZES"] == "2,1,2" and o["TESTBED_NUM_DCS"] == "3" for o in outputs)
    assert all(o["TESTBED_NODES_PER_DC"] is None for o in outputs)  # one number cannot describe these DCs
    assert all(o["sum"] == 15.0 for o in outputs)
    assert namespaces_with(prefix) == []


def test_bring_your_own_rank_that_fails_fails_the_run(prefix, tmp_path):
    script = tmp_path / "sizes.py"
    script.write_text(SIZES_SCRIPT)
    env = {**os.environ, "FAIL_RANK_2_WITH": "3"}
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "--topology",
                           str(ROOT / "topologies" / "two-dc.yaml"), "--out", str(tmp_path / "out"), "--",
                           sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAIL: cell command: rank 2 on west-0 died (exit code 3)" in proc.stderr
    run_dir = next((tmp_path / "out").glob("command-two-dc/*"))
    assert json.loads((run_dir / "cells" / "command" / "result.json").read_text())["failed_rank"] == 2
    assert namespaces_with(prefix) == []


def test_flat_dp_and_diloco_train_on_unequal_dcs(prefix, tmp_path):
    path = tmp_path / "exp.yaml"
    topology = "".join(f"  {line}\n" for line in UNEQUAL.splitlines())
    path.write_text(f"name: uneven\ntopology:\n{topology}workload: {{steps: 4, warmup_steps: 1, micro_batch: 2, "
                    "micro_batches: 1}\nstrategies: [flat-dp, {name: diloco, options: {inner_steps: 2}}]\n"
                    "baseline: none\ncalibrate: none\ncell_timeout: 120s\n")
    proc = run_cli("run", str(path), "--out", str(tmp_path / "out"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp_path / "out").glob("uneven/*"))
    rows = {r["strategy"]: r for r in csv.DictReader(open(run_dir / "summary.csv"))}
    assert set(rows) == {"flat-dp", "diloco"} and all(r["status"] == "ok" for r in rows.values())
    for _name, row in rows.items():
        cell = run_dir / "cells" / row["cell"] / "metrics"
        starts = [json.loads((cell / f"rank{r}.jsonl").read_text().splitlines()[0]) for r in range(5)]
        assert [s["dc"] for s in starts] == [0, 0, 1, 2, 2] and all(s["dc_sizes"] == [2, 1, 2] for s in starts)
        assert float(row["inter_dc_bytes_kernel"]) > 0 and float(row["final_loss"]) > 0
    # DiLoCo crosses DCs only every second step, so it moves fewer bytes than flat-dp
    assert float(rows["diloco"]["inter_dc_bytes_kernel"]) < float(rows["flat-dp"]["inter_dc_bytes_kernel"])
    assert namespaces_with(prefix) == []


def test_check_against_an_earlier_run_fails_when_it_got_slower(prefix, tmp_path):
    def once(bandwidth: str) -> Path:
        path = experiment(tmp_path, strategies="[flat-dp]", sweep="[1ms]", baseline="none")
        path.write_text(path.read_text().replace("bandwidth: 1gbit", f"bandwidth: {bandwidth}"))
        before = set((tmp_path / "out" / "tiny").glob("*"))
        proc = run_cli("run", str(path), "--out", str(tmp_path / "out"), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        (run,) = set((tmp_path / "out" / "tiny").glob("*")) - before
        time.sleep(1.1)  # run directories are named by the second
        return run

    last_night, tonight = once("1gbit"), once("20mbit")
    same = run_cli("check", str(last_night), "--against", str(last_night))
    assert same.returncode == 0 and "PASS: tokens_per_s of flat-dp (links[east,west].latency=1ms)" in same.stdout
    slower = run_cli("check", str(tonight), "--against", str(last_night), "--tolerance", "5%",
                     "--junit", str(tmp_path / "junit.xml"))
    assert slower.returncode == 1, slower.stdout
    line = next(x for x in slower.stdout.splitlines() if x.startswith("FAIL: tokens_per_s of flat-dp"))
    assert "fell by" in line and "(tolerance 5%)" in line
    assert 'name="tiny.regression" tests="2" failures="' in (tmp_path / "junit.xml").read_text()
    other = tmp_path / "other"
    other.mkdir()
    manifest = json.loads((last_night / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "experiment": "something-else"}))
    refused = run_cli("check", str(tonight), "--against", str(other))
    assert refused.returncode == 2 and "is a run of 'something-else'" in refused.stderr
    assert namespaces_with(prefix) == []
