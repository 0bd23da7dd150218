"""async-diloco on 2 DCs x 2 real ranks (loopback): the outer synchronisation is started every H steps and applied
when it arrives, the ranks of a DC apply it at the same step (their weights stay identical), no sync lags more
than max_staleness steps, and the model trains."""

from __future__ import annotations

from dataclasses import replace

import torch

from tests.workload.test_strategies import BASE, run


def test_async_diloco_applies_each_sync_once_within_the_staleness_bound_and_trains(tmp_path):
    opts = replace(BASE, strategy="async-diloco", steps=9, inner_steps=3, max_staleness=2, optimizer="adamw",
                   lr=3e-3, micro_batches=1)
    out = run(tmp_path, 2, 2, {"async": opts})["async"]
    for rank in range(4):
        records = out[rank]["records"]
        started = [r["step"] for r in records if r["outer_started"]]
        applied = [r["step"] for r in records if r["outer_applied"]]
        assert started == [2, 5], started  # every H steps but the last
        assert len(applied) == 2 and all(0 < a - s <= 3 for s, a in zip(started, applied)), (started, applied)
        assert all(r["staleness"] is None or r["staleness"] <= 3 for r in records)
        assert records[-1]["loss"] < records[0]["loss"]
    for dc in ((0, 1), (2, 3)):
        a, b = (out[r]["params"] for r in dc)
        assert all(torch.equal(a[k], b[k]) for k in a)
