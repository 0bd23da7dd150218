"""What a run reads off the links of a running testbed: each DC pair's round trip (and goodput) as the links
are now, and the kernel's byte counters of every inter-DC link end."""

from __future__ import annotations

import dataclasses

from testbed.fabric.lifecycle import Testbed
from testbed.runner.probe import as_records, probe_all


def calibrate(testbed: Testbed, mode: str) -> list[dict]:
    """Measured RTT (and goodput with mode 'full') per ordered DC pair, as the cell's links are now."""
    if mode == "none":
        return []
    results = probe_all(testbed.fabric, testbed.plan, testbed.topology, pings=30 if mode == "rtt" else 100,
                        seconds=0.0 if mode == "rtt" else 2.0, applied=testbed.fabric.delay_applied)
    keep = ("src", "dst", "rtt_configured_ms", "rtt_applied_ms", "rtt_p50_ms", "rtt_p99_ms", "not_applied")
    return [{k: r[k] for k in keep + (("goodput_mbps", "goodput_expected_mbps") if mode == "full" else ())}
            for r in as_records(results)]


def inter_dc_counters(testbed: Testbed) -> dict[str, dict[str, int]]:
    counters = testbed.fabric.counters()
    return {key: dataclasses.asdict(value) for key, value in counters.items()
            if testbed.plan.link_end(key).kind == "inter-dc"}


def counter_delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    return {key: {name: after[key][name] - before[key][name] for name in after[key]} for key in after}
