"""What a run reads off the links of a running testbed: each DC pair's round trip (and goodput) as the links
are now, the kernel's byte counters of every inter-DC link end, and the TCP its nodes run."""

from __future__ import annotations

import dataclasses
import subprocess

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


TCP_SETTINGS = ("tcp_congestion_control", "tcp_slow_start_after_idle")


def node_tcp(testbed: Testbed) -> dict[str, str]:
    """The TCP settings a node's sockets get, read on the first node (a namespace takes the host's congestion
    control: this project's CI host runs BBR, a laptop CUBIC, and the cost model's slow start is CUBIC's); {}
    where they cannot be read."""
    node = testbed.plan.nodes[0].name
    paths = [f"/proc/sys/net/ipv4/{name}" for name in TCP_SETTINGS]
    try:
        proc = testbed.fabric.popen(node, ["cat", *paths], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out, _ = proc.communicate(timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    values = out.decode().split() if proc.returncode == 0 else []
    return dict(zip(TCP_SETTINGS, values, strict=True)) if len(values) == len(TCP_SETTINGS) else {}
