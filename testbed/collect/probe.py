"""Files of probe results: probe.json (everything) and probe.md (the table, pandas markdown)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from testbed.atomic import write_text
from testbed.runner.fidelity import DEFINITION


def probe_frame(records: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    frame["goodput_error_pct"] = frame["goodput_error"] * 100
    return frame


def write_probe_report(directory: Path, info: dict, records: list[dict]) -> Path:
    """probe.json (everything) and probe.md (the table), written atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"testbed": info, "pairs": records}, indent=1)
    write_text(directory / "probe.json", payload)
    frame = probe_frame(records)
    columns = ["src", "dst", "rtt_configured_ms", "rtt_applied_ms", "rtt_floor_ms", "rtt_floor_of", "rtt_dc_floor_ms",
               "rtt_expected_ms", "rtt_p10_ms", "rtt_p50_ms",
               "rtt_p99_ms", "rtt_p50_error_ms", "delay_line_residual_ms", "delay_line_note", "loss_configured",
               "ping_loss", "rate_configured_mbps", "goodput_expected_mbps", "goodput_mbps", "goodput_error_pct",
               "flow_retransmits", "flow_rwnd_limited", "flow_sndbuf_limited", "flow_cwnd_packets", "flow_reader_gap_s",
               "host_steal", "not_applied"]
    columns = [column for column in columns if column in frame]  # records of an older probe lack the newer ones
    lines = [f"# Link probe: {info['topology']}", "",
             f"- shaper: {info['shaper']} (backend {info['backend']})",
             "- goodput expected = configured rate x 1448/1514 (TCP payload per 1514-byte frame at MTU 1500)",
             "- RTT applied = latency of the link ends on the round trip that a running mechanism delays",
             f"- RTT: {DEFINITION}",
             "- delay_line_residual_ms = what the userspace delay lines of the round trip still add (their own p50)",
             "- flow_retransmits, flow_rwnd_limited, flow_sndbuf_limited, flow_cwnd_packets = the flow sender's"
             " TCP_INFO: segments sent again, the shares of its busy time the receiver's window and its own send"
             " buffer held it back, its congestion window at the end (where a goodput shortfall comes from)",
             "- host_steal = the share of this machine's CPU its hypervisor took during the pair's pings (/proc/stat)",
             *[f"- {r['src']} -> {r['dst']}: {r['host_steal_note']}" for r in records if r.get("host_steal_note")],
             "",
             frame[columns].to_markdown(index=False, floatfmt=".3f") if not frame.empty else "(no pairs)", ""]
    write_text(directory / "probe.md", "\n".join(lines))
    return directory / "probe.md"
