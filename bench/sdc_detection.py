"""What silent-data-corruption detection costs and what it catches (testbed.workload.sdc), on loopback (no root).

1. Cost and false positives: each of --strategies (flat-dp: checked before the collective; hier-dp-overlap, ddp,
   fsdp, hsdp: bucket by bucket as the gradients leave during backward, BUCKET_MB buckets) on DCS x RANKS ranks
   (real compute, each of --cost-presets' GPTs) for --steps steps, the checks off and then on (alternating over
   --reps), on with each of --cost-replay's shares of steps replayed unasked: the median step with and without
   them, the checks' own time as a share of the step (sdc_check_s / wall_s, median over rank-steps: the digest,
   the norm, the gradient checksums' sums in backward and their comparison; a replay's recomputation is in the
   step, not here), the alarms (checksum or norm) the replay resolved as the data's own (`reproduced`), and the
   false verdicts (nothing is injected: any `transient` or `persistent` is one) over all the clean rank-steps.
2. What is caught, per bit: --flips gradient (and parameter) flips of each bit in --bits, each in a random
   element (seeded) of a random parameter on a random rank at its own step (5 steps apart, the bits in turn, one
   run per strategy, target and replay share: --replay, gradients only; where gradients leave during backward --
   hier-dp-overlap, ddp, fsdp, hsdp -- a sampled step's gradient is computed beforehand without communicating):
   the share detected at the injected rank and step; for the flips missed, the largest change they made to their
   element and the tensors they were in; verdicts at steps and ranks where nothing was injected.

Usage: .venv/bin/python bench/sdc_detection.py [--steps 2500 (0: no cost run)] [--reps 1] [--cost-presets tiny,small]
       [--cost-replay 0,1]
       [--bits 0,10,...,31] [--flips 20] [--replay 0,0.1] [--strategies flat-dp,hier-dp-overlap,ddp]
       [--targets gradient,parameter] [--buddy 0.1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from testbed.workload.local import launch
from testbed.workload.options import Options

DCS, RANKS = 2, 2
BUCKET_MB = 0.25  # several buckets even in the tiny GPT (0.9 MB of gradients): each is checked on its own
BASE = Options(strategy="flat-dp", preset="tiny", micro_batch=4, micro_batches=1, seed=5, bucket_mb=BUCKET_MB,
               bucket_cap_mb=BUCKET_MB)


def records(directory: Path) -> list[dict]:
    out = []
    for path in sorted(directory.glob("rank*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def run(steps: int, env: dict[str, str], preset: str = BASE.preset, strategy: str = BASE.strategy) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics"
        options = replace(BASE, steps=steps, metrics_dir=str(metrics), preset=preset, strategy=strategy)
        launch(DCS, RANKS, [options], Path(tmp) / "launch",
               timeout=7200, env=env)
        return records(metrics)


def step_walls(rows: list[dict], skip: int = 5) -> list[float]:
    """Per step, the slowest rank's wall time (warm-up steps skipped)."""
    walls: dict[int, float] = {}
    for row in rows:
        if row["event"] == "step" and row["step"] >= skip:
            walls[row["step"]] = max(walls.get(row["step"], 0.0), row["wall_s"])
    return list(walls.values())


def cost(steps: int, reps: int, preset: str, strategy: str, replay: float = 0.0, buddy: bool = False) -> dict:
    """The checks' cost; with `replay`, that share of steps also replayed unasked, by the rank itself or, with
    `buddy`, by buddies (TESTBED_SDC_BUDDY)."""
    off, on, shares, alarms, false, rank_steps = [], [], [], 0, 0, 0
    checks = {"TESTBED_SDC_CHECK": "1", "TESTBED_SDC_REPLAY": str(replay)}
    if buddy:
        checks |= {"TESTBED_SDC_BUDDY": "1"}
    for rep in range(reps):
        for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            rows = run(steps, checks if mode == "on" else {}, preset, strategy)
            walls = step_walls(rows)
            (on if mode == "on" else off).append(statistics.median(walls))
            if mode == "on":
                steps_rows = [r for r in rows if r["event"] == "step"]
                rank_steps += len(steps_rows)
                shares += [r["sdc_check_s"] / r["wall_s"] for r in steps_rows if r["step"] >= 5]
                found = [r for r in rows if r["event"] == "sdc_detected"]
                alarms += sum(r["classification"] == "reproduced" for r in found)
                false += sum(r["classification"] != "reproduced" for r in found)
    replays = f" + {'buddy' if buddy else 'self'} replay {replay:.0%}" if replay else ""
    return {"strategy": strategy + replays, "preset": preset,
            "clean rank-steps checked": rank_steps, "alarms (replay: reproduced)": alarms,
            "false positives (SDC verdicts)": false,
            "step median off ms": statistics.median(off) * 1e3, "step median on ms": statistics.median(on) * 1e3,
            "checks / step (median) %": statistics.median(shares) * 100,
            "step median on/off - 1 %": (statistics.median(on) / statistics.median(off) - 1) * 100}


def caught(bits: list[int], flips: int, target: str, seed: int, replay: float = 0.0,
           strategy: str = BASE.strategy) -> list[dict]:
    """One run: `flips` flips of each bit in `bits`, 5 steps apart (the bits in turn), each in a random element of a
    random parameter on a random rank; per bit, how many were caught at their rank and step."""
    rng = random.Random(seed)
    plan = [{"rank": rng.randrange(DCS * RANKS), "step": 10 + 5 * i, "target": target, "bit": bit,
             "tensor": None, "index": None, "seed": rng.randrange(2**62)}
            for i, bit in enumerate(bit for _ in range(flips) for bit in bits)]
    rows = run(10 + 5 * len(plan), {"TESTBED_SDC": json.dumps(plan), "TESTBED_SDC_CHECK": "1",
                                    "TESTBED_SDC_REPLAY": str(replay)}, strategy=strategy)
    verdicts = [r for r in rows if r["event"] == "sdc_detected" and r["classification"] != "reproduced"]
    hits = {(r["rank"], r["step"]): r["detected_by"] for r in verdicts}
    others = len(set(hits) - {(r["rank"], r["step"]) for r in rows if r["event"] == "sdc_injected"})
    out = []
    for bit in bits:
        injected = [r for r in rows if r["event"] == "sdc_injected" and r["bit"] == bit]
        found = [r for r in injected if (r["rank"], r["step"]) in hits]
        missed = [r for r in injected if (r["rank"], r["step"]) not in hits]
        out.append({"strategy": strategy, "target": target, "replay share": replay if target == "gradient" else "-",
                    "bit": bit, "flips": len(injected), "caught at rank and step": len(found),
                    "rate": len(found) / len(injected) if injected else float("nan"),
                    "by": ",".join(sorted({hits[(r["rank"], r["step"])] for r in found})) or "-",
                    "value changed": sum(r["before"] != r["after"] for r in injected),
                    "missed: largest change": max((abs(r["after"] - r["before"]) for r in missed), default="-"),
                    "missed in": ",".join(sorted({r["tensor"].split(".", 1)[1] for r in missed})) or "-",
                    "verdicts at no injection (run)": others})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--cost-presets", default="tiny",
                        help="models the cost is measured on (comma-separated; --steps each; flips: tiny)")
    parser.add_argument("--bits", default="0,10,20,22,23,24,25,26,27,28,29,30,31")
    parser.add_argument("--flips", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", default="0", help="replay shares for the gradient flips (comma-separated)")
    parser.add_argument("--strategies", default="flat-dp",
                        help="comma-separated workload strategies (flat-dp, hier-dp, hier-dp-overlap, ddp, fsdp, hsdp, "
                             "pp, diloco, streaming-diloco, async-diloco)")
    parser.add_argument("--targets", default="gradient,parameter")
    parser.add_argument("--cost-replay", default="0",
                        help="shares of steps each rank replays unasked in the cost runs (comma-separated)")
    parser.add_argument("--buddy", type=float, default=0.0,
                        help="also the cost of flat-dp with this share of steps replayed by buddies")
    args = parser.parse_args()
    started = time.time()
    strategies = args.strategies.split(",")
    print(f"{DCS} DCs x {RANKS} ranks on loopback, real compute, micro-batch {BASE.micro_batch}, "
          f"buckets {BUCKET_MB} MB")
    if args.steps:
        costs = [cost(args.steps, args.reps, preset, strategy, share) for strategy in strategies
                 for preset in args.cost_presets.split(",") for share in map(float, args.cost_replay.split(","))]
        if args.buddy:
            costs += [cost(args.steps, args.reps, preset, "flat-dp", args.buddy, buddy=True)
                      for preset in args.cost_presets.split(",")]
        print(pd.DataFrame(costs).to_markdown(index=False, floatfmt=".4g"))
    bits = [int(b) for b in args.bits.split(",")] if args.bits else []
    targets = args.targets.split(",")
    table = [row for strategy in strategies for share in (float(x) for x in args.replay.split(","))
             if "gradient" in targets
             for row in caught(bits, args.flips, "gradient", args.seed, share, strategy)]
    if "parameter" in targets:
        table += [row for strategy in strategies for row in caught(bits, args.flips, "parameter", args.seed + 1,
                                                                    strategy=strategy)]
    print()
    print(pd.DataFrame(table).to_markdown(index=False, floatfmt=".3g"))
    print(f"\n{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
