"""A torchft heal at two link rates: measured against testbed.model.heal (issue 56).

Two DCs of one node, torchft-diloco (its survivors stay off the link between outer steps, so the heal's fetch has it
to itself), west killed at step 30 and started again 1 s later: it fetches east's whole state (the model, AdamW's
two moments, DiLoCo's global copy and outer momentum) with one HTTP GET. Per rate: heal_s (from west's start again
to the end of the step its heal ended in) in its parts, the GET's own fetch_s, the model's fetch and heal predictions
and their parts; then the difference between the two rates, measured and as the state over the rates says. Each
point is the median of --reps runs (one cell a rate a run).

Usage: .venv/bin/python bench/torchft_heal.py [--rates 20mbit,40mbit] [--latency 5ms] [--reps 3]   (root)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from testbed.spec.units import parse_rate

HERE = Path(__file__).resolve().parents[1]
EXPERIMENT = """name: heal
topology:
  name: pair
  dcs: [{{name: east, nodes: 1}}, {{name: west, nodes: 1}}]
  links: [{{between: [east, west], latency: {latency}, bandwidth: {first}}}]
workload: {{preset: tiny, steps: 100, warmup_steps: 1, micro_batch: 2, micro_batches: 1}}
strategies:
  - {{name: torchft-diloco, options: {{inner_steps: 10, heartbeat_timeout_ms: 1000}}}}
sweep:
  links[east,west].bandwidth: [{rates}]
baseline: none
calibrate: none
cell_timeout: 300s
faults:
  - {{kind: kill, dc: west, at: step 30, restart_after: 1s}}
"""


def run_once(rates: list[str], latency: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "heal.yaml"
        path.write_text(EXPERIMENT.format(latency=latency, first=rates[0], rates=", ".join(rates)))
        proc = subprocess.run([str(HERE / ".venv/bin/testbed"), "run", str(path), "--out", str(Path(work) / "out")],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"testbed run failed: {proc.stderr[-2000:]}")
        rows = []
        for result_file in sorted(Path(work).glob("out/*/*/cells/*/result.json")):
            result = json.loads(result_file.read_text())
            (heal,) = result["replica_groups"]["heals"]
            rows.append({"rate": result["links"]["east->west"]["bandwidth"], "heal_s": heal["heal_s"],
                         "setup_s": heal["setup_s"], "fetch_s": heal["fetch_s"],
                         "fetch_predicted_s": heal["fetch_predicted_s"], "healed_bytes": heal["healed_bytes"],
                         "heal_predicted_s": heal.get("heal_predicted_s"),
                         **{k: heal.get(k) for k in ("before_quorum_s", "quorum_wait_s", "reconfigure_s", "rest_s")},
                         **{f"predicted {k}": v for k, v in (heal.get("heal_predicted") or {}).items()
                            if k not in ("quorum_wait_range_s", "survivors_waiting", "setup_s", "fetch_s")},
                         **{f"predicted {k}": v for k, v in heal["fetch_predicted"].items()}})
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="20mbit,40mbit")
    parser.add_argument("--latency", default="5ms")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rates = args.rates.split(",")
    rows = [row | {"rep": rep} for rep in range(args.reps) for row in run_once(rates, args.latency)]
    frame = pd.DataFrame(rows).drop(columns="rep").groupby("rate").median(numeric_only=True)
    frame = frame.loc[sorted(frame.index, key=parse_rate)]  # the slowest first
    frame["fetch measured/predicted"] = frame["fetch_s"] / frame["fetch_predicted_s"]
    frame["heal measured/predicted"] = frame["heal_s"] / frame["heal_predicted_s"]
    print(frame.round(4).to_markdown())
    slow, fast = frame.iloc[0], frame.iloc[-1]
    measured = slow["fetch_s"] - fast["fetch_s"]
    predicted = slow["fetch_predicted_s"] - fast["fetch_predicted_s"]
    heal = slow["heal_s"] - fast["heal_s"]
    print(f"\n{frame.index[0]} less {frame.index[-1]}: fetch {measured:.3f} s measured, {predicted:.3f} s as the state "
          f"({statistics.median(r['healed_bytes'] for r in rows):,.0f} bytes) over the rates says "
          f"(ratio {measured / predicted:.3f}); heal_s {heal:.3f} s (ratio {heal / predicted:.3f})")


if __name__ == "__main__":
    main()
