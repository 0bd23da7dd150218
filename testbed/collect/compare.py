"""Two runs side by side."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.collect.frames import load_points


def compare_runs(first: Path, second: Path) -> pd.DataFrame:
    a, b = load_points(first), load_points(second)
    if a.empty or b.empty:
        return pd.DataFrame()
    keys = [c for c in a.columns if c in b.columns and (c in ("strategy", "baseline") or c.startswith(("links[", "workload.")))]
    metrics = [c for c in ("tokens_per_s", "scaling_efficiency", "inter_dc_gb_per_step") if c in a and c in b]
    merged = a[keys + metrics].merge(b[keys + metrics], on=keys, suffixes=(" A", " B"))
    for metric in metrics:
        merged[f"{metric} B/A"] = merged[f"{metric} B"] / merged[f"{metric} A"]
    return merged
