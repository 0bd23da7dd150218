"""Tables and files for probe results (rich for the terminal, pandas for markdown and JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from rich.table import Table

from testbed.atomic import write_text


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def probe_frame(records: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    frame["goodput_error_pct"] = frame["goodput_error"] * 100
    return frame


def probe_table(records: list[dict], info: dict) -> Table:
    table = Table("pair", "RTT configured", "RTT applied", "p50", "p99", "p50 error", "loss cfg/meas",
                  "rate", "goodput expected", "goodput", "error", "not applied",
                  title=f"probe: {info['topology']} (shaper {info['shaper']})")
    for r in records:
        table.add_row(
            f"{r['src']} -> {r['dst']}", _fmt(r["rtt_configured_ms"], ".3f", " ms"),
            _fmt(r["rtt_applied_ms"], ".3f", " ms"), _fmt(r["rtt_p50_ms"], ".3f", " ms"),
            _fmt(r["rtt_p99_ms"], ".3f", " ms"), _fmt(r["rtt_p50_error_ms"], "+.3f", " ms"),
            f"{r['loss_configured'] * 100:.2f}% / {_fmt(r['ping_loss'] and r['ping_loss'] * 100, '.2f', '%')}",
            _fmt(r["rate_configured_mbps"], ".0f", " Mbit/s"), _fmt(r["goodput_expected_mbps"], ".1f", " Mbit/s"),
            _fmt(r["goodput_mbps"], ".1f", " Mbit/s"),
            _fmt(r["goodput_error"] and r["goodput_error"] * 100, "+.1f", "%"), r["not_applied"] or "-")
    return table


def write_probe_report(directory: Path, info: dict, records: list[dict]) -> Path:
    """probe.json (everything) and probe.md (the table), written atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"testbed": info, "pairs": records}, indent=1)
    write_text(directory / "probe.json", payload)
    frame = probe_frame(records)
    columns = ["src", "dst", "rtt_configured_ms", "rtt_applied_ms", "rtt_p50_ms", "rtt_p99_ms", "rtt_p50_error_ms",
               "loss_configured", "ping_loss", "rate_configured_mbps", "goodput_expected_mbps", "goodput_mbps",
               "goodput_error_pct", "not_applied"]
    lines = [f"# Link probe: {info['topology']}", "",
             f"- shaper: {info['shaper']} (backend {info['backend']})",
             "- goodput expected = configured rate x 1448/1514 (TCP payload per 1514-byte frame at MTU 1500)",
             "- RTT applied = latency of the link ends on the round trip that a running mechanism delays", "",
             frame[columns].to_markdown(index=False, floatfmt=".3f") if not frame.empty else "(no pairs)", ""]
    write_text(directory / "probe.md", "\n".join(lines))
    return directory / "probe.md"
