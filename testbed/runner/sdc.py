"""Silent data corruption in a cell: what the ranks are told to inject and check (TESTBED_SDC*), and result.json's
`sdc`, every injection with what caught it."""

from __future__ import annotations

from pathlib import Path

from testbed.plan.faults import fault_seed
from testbed.rankenv import RankEnv
from testbed.spec.faults import Fault
from testbed.steplog import read_records


def sdc_env(faults: list[Fault], cell_id: str, seed: int, replay: float = 0.0, by: str = "self") -> dict[str, str]:
    """TESTBED_SDC (the corruptions the workload injects, each with its fault's seed), TESTBED_SDC_CHECK (the
    checks run in every cell that has one), TESTBED_SDC_REPLAY (the share of steps replayed unasked) and
    TESTBED_SDC_BUDDY (replayed by a buddy); nothing without SDC faults."""
    items = [{"rank": f.rank, "step": f.at.step, "target": f.target, "bit": f.bit, "tensor": f.tensor,
              "index": f.index, "seed": fault_seed(seed, cell_id, i), "sticky": bool(f.sticky)}
             for i, f in enumerate(faults) if f.kind == "sdc"]
    if not items:
        return {}
    return RankEnv(sdc=tuple(items), sdc_check=True, sdc_replay=replay, sdc_buddy=by == "buddy").to_env()


def sdc_record(metrics_dir: Path) -> list[dict]:
    """result.json's `sdc`: every injection with what caught it (detected_by, classification; none: missed), then
    every detection no injection explains (a false positive, target null)."""
    injected, detected = [], []
    for path in sorted(metrics_dir.glob("rank*.jsonl")):
        for record in read_records(path, containing='"event": "sdc_'):
            if record.get("event") == "sdc_injected":
                injected.append(record)
            elif record.get("event") == "sdc_detected":
                detected.append(record)
    out, explained = [], set()
    for item in sorted(injected, key=lambda r: (r["step"], r["rank"])):
        hits = [i for i, d in enumerate(detected) if d["rank"] == item["rank"] and d["target"] == item["target"]
                and d["step"] >= item["step"] and i not in explained]
        first = hits[0] if hits else None
        if first is not None:
            explained.add(first)
        found = detected[first] if first is not None else {}
        out.append({"rank": item["rank"], "step": item["step"], "target": item["target"], "tensor": item["tensor"],
                    "index": item["index"], "bit": item["bit"], "detected_by": found.get("detected_by"),
                    "detected_at_step": found.get("step"), "classification": found.get("classification", "missed")})
    for i, found in enumerate(detected):
        if i not in explained:
            out.append({"rank": found["rank"], "step": found["step"], "target": None, "detected_by": found["detected_by"],
                        "detected_at_step": found["step"], "classification": found["classification"]})
    return out
