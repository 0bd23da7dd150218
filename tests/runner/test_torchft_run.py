"""torchft's strategies through `testbed run` on the netns fabric (root): every DC one replica group of two ranks,
the lighthouse in the first node, the groups' quorums and heals across the shaped link. Both strategies finish
with every group in every quorum and every rank with one model, the lighthouse is gone after the run and nothing
is left."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import needs
from tests.conftest import namespaces_with, run_cli
from tests.runner.test_run import run_dir_of

pytestmark = pytest.mark.root

EXPERIMENT = """name: tiny
topology:
  name: pair
  dcs: [{name: east, nodes: 2}, {name: west, nodes: 2}]
  links: [{between: [east, west], latency: 5ms, bandwidth: 1gbit}]
workload: {steps: 8, warmup_steps: 1, micro_batch: 2, micro_batches: 1}
strategies:
  - {name: torchft-ddp, options: {heartbeat_timeout_ms: 2000}}
  - {name: torchft-diloco, options: {inner_steps: 2, heartbeat_timeout_ms: 2000}}
baseline: none
calibrate: none
cell_timeout: 180s
"""


def assert_both_strategies_ran_as_groups(results: Path) -> None:
    """EXPERIMENT's two cells under `results` (any backend's run directory or above it): each ok with four ranks, its
    lighthouse listening, both groups in every quorum and the four ranks with one model."""
    cells = sorted(results.glob("**/cells/*"))
    assert len(cells) == 2, cells
    for cell in cells:
        result = json.loads((cell / "result.json").read_text())
        assert result["status"] == "ok" and result["world"] == 4, (result["reason"], result.get("log_tail"))
        assert "listening" in (cell / "logs" / "lighthouse.log").read_text().lower()
        figures = result["replica_groups"]
        assert figures["replica_groups"] == 2 and figures["participants_min"] == 2 and figures["params_agree"], figures


def run_torchft(tmp_path, text: str, timeout: float) -> Path:
    """`testbed run` of the experiment `text` (torchft's strategies): its run directory, once it exited 0."""
    try:
        import torchft  # noqa: F401
    except ImportError:
        needs.unavailable("torchft is not installed (pip install -e '.[torchft]')")
    (tmp_path / "exp.yaml").write_text(text)
    proc = run_cli("run", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out"), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir_of(tmp_path / "out")


def test_both_torchft_strategies_run_as_replica_groups_across_the_dcs(prefix, tmp_path):
    run_dir = run_torchft(tmp_path, EXPERIMENT, timeout=600)
    cells = sorted((run_dir / "cells").iterdir())
    assert len(cells) == 2
    for cell in cells:
        result = json.loads((cell / "result.json").read_text())
        assert result["status"] == "ok" and result["world"] == 4, result["reason"]
        assert "listening" in (cell / "logs" / "lighthouse.log").read_text().lower()
        for rank in range(4):
            lines = (cell / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
            start = next(r for r in records if r["event"] == "start")
            assert start["replica_group"] == rank // 2 and start["strategy"] == result["cell"]["options"]["strategy"]
            steps = [r for r in records if r["event"] == "step"]
            assert steps and steps[-1]["participants"] == 2, steps[-1:]  # both groups in the last quorum
            # no fault, no heal: with torchft's default init_sync the first quorum healed all groups but one
            assert all(r["healed_bytes"] == 0 for r in steps), [r["healed_bytes"] for r in steps]
        # what crossed the link: the groups' reductions (and quorum traffic), both ways
        assert all(counts["tx_bytes"] > 0 for counts in result["link_bytes"].values()), result["link_bytes"]
        # all four ranks end with one model: under torchft-diloco with torchft's default init_sync, the first
        # outer sync healed each rank index from a different DC and a DC's two ranks ended apart for good
        figures = result["replica_groups"]
        assert figures["params_agree"] and figures["groups_apart"] == [], figures
    assert namespaces_with(prefix) == []
    left = subprocess.run(["pgrep", "-f", "torchft_lighthouse"], capture_output=True, text=True).stdout.split()
    assert left == [], left


THREE_DCS = """name: tiny
topology:
  name: three
  dcs: [{name: east, nodes: 1}, {name: west, nodes: 1}, {name: north, nodes: 1}]
  links: [{between: [east, west], latency: 5ms, bandwidth: 1gbit},
          {between: [west, north], latency: 5ms, bandwidth: 1gbit},
          {between: [east, north], latency: 5ms, bandwidth: 1gbit}]
workload: {steps: STEPS, warmup_steps: 1, micro_batch: 2, micro_batches: 1}
strategies:
  - {name: torchft-ddp, options: {heartbeat_timeout_ms: HEARTBEAT}}
  - {name: torchft-diloco, options: {inner_steps: 8, heartbeat_timeout_ms: HEARTBEAT}}
  - {name: torchft-streaming-diloco, options: {inner_steps: 8, fragments: 2, fragment_sync_delay: 1,
                                               heartbeat_timeout_ms: HEARTBEAT}}
baseline: none
calibrate: none
cell_timeout: 300s
faults:
  - {kind: kill, dc: north, at: step 40, restart_after: 1s}
"""


def test_a_killed_dc_restarts_heals_from_a_peer_and_the_others_never_stop_longer_than_the_heartbeat(prefix, tmp_path):
    """Issue 56's done-means, for each torchft strategy: across 3 DCs, one DC killed at step 40 and started 1 s
    later: every cell ok, the others went on without it (never stopped longer than the heartbeat timeout plus one
    step), the restarted group healed from a peer over the links and rejoined, and every rank ends with the same
    parameters."""
    heartbeat_ms = 1000
    run_dir = run_torchft(tmp_path, THREE_DCS.replace("STEPS", "120").replace("HEARTBEAT", str(heartbeat_ms)), timeout=900)
    for cell in sorted((run_dir / "cells").iterdir()):
        result = json.loads((cell / "result.json").read_text())
        assert result["status"] == "ok", result["reason"]
        (kill,) = result["faults"]["faults"]
        assert kill["target"] == "dc north" and kill["applied_at"] is not None and kill["cleared_at"] is not None
        figures = result["replica_groups"]
        assert figures["replica_groups"] == 3 and figures["participants_min"] == 2, figures
        assert figures["degraded_steps"] > 0, figures  # the others trained on without north
        # never stopped longer than the heartbeat timeout plus one step (the slowest before the kill: in torchft's
        # DiLoCo one with its outer sync)
        assert figures["longest_gap_s"] <= heartbeat_ms / 1e3 + figures["slowest_step_before_s"], figures
        records = {rank: [json.loads(line) for line in (cell / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()
                          if line.strip()] for rank in range(3)}
        (heal,) = figures["heals"]
        parameters = next(r["parameters"] for r in records[2] if r["event"] == "start")
        # the state came from a peer, float32: the model and AdamW's two moments (a scalar step per tensor
        # beside), under DiLoCo also each fragment's global copy and outer momentum; the heal is inside its first step
        copies = 3 if result["cell"]["options"]["strategy"] == "torchft-ddp" else 5
        assert heal["rank"] == 2 and heal["heal_s"] > 0, figures
        assert copies * 4 * parameters <= heal["healed_bytes"] < copies * 4 * parameters + 4096, (copies, figures)
        # the heal in its parts on the rank's own clock, and the model's whole heal beside in the same parts
        parts = [heal[k] for k in ("setup_s", "before_quorum_s", "quorum_wait_s", "reconfigure_s", "fetch_s", "rest_s")]
        assert all(part >= 0 for part in parts) and sum(parts) == pytest.approx(heal["heal_s"], abs=1e-6), heal
        assert heal["heal_predicted_s"] > heal["fetch_predicted_s"] > 0, heal
        assert all(r[-1]["event"] == "end" for r in records.values())
        steps = [r for r in records[0] if r["event"] == "step"]
        assert steps[-1]["participants"] == 3, steps[-1]  # north rejoined
        assert len({r[-1]["params_sha256"] for r in records.values()}) == 1  # every group ends the same
    assert namespaces_with(prefix) == []
    left = subprocess.run(["pgrep", "-f", "torchft_lighthouse"], capture_output=True, text=True).stdout.split()
    assert left == [], left


PARTITION = """name: tiny
topology:
  name: three
  dcs: [{name: east, nodes: 1}, {name: west, nodes: 1}, {name: north, nodes: 1}]
  links: [{between: [east, west], latency: 5ms, bandwidth: 1gbit},
          {between: [west, north], latency: 5ms, bandwidth: 1gbit},
          {between: [east, north], latency: 5ms, bandwidth: 1gbit}]
workload: {steps: 160, warmup_steps: 1, micro_batch: 2, micro_batches: 1}
strategies:
  - {name: majority, strategy: torchft-diloco, options: {inner_steps: 4, heartbeat_timeout_ms: 1000, min_replicas: 2}}
baseline: none
calibrate: none
cell_timeout: 300s
faults:
  - {kind: partition, between: [north, east], at: step 16, duration: 3s}
  - {kind: partition, between: [north, west], at: step 16, duration: 3s}
"""


def test_a_dc_cut_off_under_a_majority_quorum_waits_rejoins_is_healed_and_no_replica_ends_apart(prefix, tmp_path):
    """Issue 56 item 5: north cut off from both other DCs for 3 s under torchft's DiLoCo with min_replicas 2 of 3.
    Where the cut falls decides what the others do: between outer syncs they go on in quorums of two and north,
    cut off from the lighthouse, forms none, joins their next quorum after the partition and is healed from a peer;
    inside an outer sync's all-reduce every group waits in it past the partition (TCP's retransmission backoff
    included). Either way north is in no quorum without a peer and every replica ends equal, which result.json,
    summary.csv and the report all say."""
    run_dir = run_torchft(tmp_path, PARTITION, timeout=600)
    (cell,) = sorted((run_dir / "cells").iterdir())
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "ok", result["reason"]
    assert all(e["applied_at"] is not None and e["cleared_at"] is not None for e in result["faults"]["faults"])
    figures = result["replica_groups"]
    assert figures["group_names"] == ["east", "west", "north"], figures
    north = [json.loads(line) for line in (cell / "metrics" / "rank2.jsonl").read_text().splitlines() if line.strip()]
    if figures["degraded_steps"]:  # the others went on without north, which came back and was healed
        assert figures["participants_min"] == 2 and figures["steps_per_s"]["down"], figures
        assert figures["steps_per_s"]["after"], figures
        assert max(r.get("healed_bytes", 0) for r in north if r["event"] == "step") > 0
        report_says = "every group ended with the same parameters"
    else:  # every group waited in the all-reduce the partition cut, at least as long as it lasted
        assert figures["participants_min"] == 3 and figures["longest_gap_s"] >= 3.0, figures
        report_says = "the slow steps took"
    # north never in a quorum without a peer (of one, it would have trained alone)
    assert figures["participants_min_by_group"]["north"] >= 2, figures
    assert figures["params_agree"] is True and figures["groups_apart"] == [], figures
    assert [r["participants"] for r in north if r["event"] == "step"][-1] == 3  # back in the last quorum
    ends = {json.loads(line)["params_sha256"] for rank in range(3)
            for line in (cell / "metrics" / f"rank{rank}.jsonl").read_text().splitlines() if '"end"' in line}
    assert len(ends) == 1
    summary = (run_dir / "summary.csv").read_text().splitlines()
    assert dict(zip(summary[0].split(","), summary[1].split(",")))["replicas_apart"] in ("0", "0.0")
    assert report_says in (run_dir / "report.md").read_text() and "ended apart" not in (run_dir / "report.md").read_text()
    assert namespaces_with(prefix) == []
