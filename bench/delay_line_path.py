"""Where a delay-line pass spends the time it adds: the kernel's own trace of each packet through a gateway.

A chain of three DCs, east -(LATENCY)- west -(0 ms)- south, on the netns backend with the userspace delay line.
Kernel `ping`s (ICMP echo, answered by the far node's kernel: no process to wake on the far side) from east-0 to
west-0 cross the delayed link, whose delay line holds each packet at the receiving gateway; pings from west-0 to
south-0 cross the 0 ms link, which the delay line does not queue (an unshaped crossing of two gateways). ftrace
(tracefs: net:netif_rx, net:net_dev_queue, syscalls:sys_enter_sendto of the delay lines' workers, trace_clock
mono) follows every packet by its skb through each gateway:

- *due*: when the packet reached the gateway (netif_rx on its inter-DC interface, where the delay line's kernel
  timestamp is taken) plus the configured one-way latency;
- *verdict sent*: the worker's sendto() of the verdict that releases it (syscall entry);
- *leaves*: the packet queued on the gateway's DC side (net_dev_queue on `lan`), inside that verdict call;
- *unshaped crossing*: netif_rx on the inter-DC interface to net_dev_queue on `lan` of a gateway no delay line
  holds: what every pass costs on an unshaped path too.

So (leaves - due) - unshaped crossing is what one pass adds beyond the path's own. Each delayed link's round trip
makes two passes; each gateway a round trip crosses costs the unshaped crossing twice, a cost a DC's own floor
(node to node inside the DC) does not contain. Tracing costs time itself: the figures are upper bounds, the
difference between the shaped and unshaped crossing is measured under the same tracing.

Needs root and tracefs (/sys/kernel/tracing). What it changes there (events, filters, the clock, the buffer) is set
back as it was, and the testbed is torn down, also after a failure.

Each rep runs the delay line as it is and with $TESTBED_DELAY_LINE_WARM=0 (no verdict that accepts nothing before
a release after a sleep, the delay line before 2026-11-29), one after the other, in alternating order.

Usage: .venv/bin/python bench/delay_line_path.py [--latency-ms 0.8] [--pings 200] [--reps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from testbed import settings
from testbed.agents.delayline import control as delay_lines
from testbed.fabric.lifecycle import bring_up, tear_down
from testbed.fabric.state import state_dir
from testbed.spec.topology import topology_from_data

PREFIX = "tb-dlp-"
TRACING = Path("/sys/kernel/tracing")
EVENTS = ("net/netif_rx", "net/net_dev_queue", "syscalls/sys_enter_sendto")
LINE = re.compile(r"\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[\d+\]\s+\S+\s+(?P<t>[\d.]+): (?P<event>[\w]+)[:(] ?(?P<rest>.*)")
SKB = re.compile(r"dev=(?P<dev>\S+) skbaddr=(?P<skb>\S+)")


def _restore(path: Path, old: str) -> None:
    """Write back what `path` held (as tracefs shows it: the selected clock in brackets, a buffer's expanded size,
    `none` for no filter); quietly, so that one failure does not keep the rest from being set back."""
    value = old.strip()
    if path.name == "trace_clock":
        value = re.search(r"\[(\w+)\]", old).group(1) if "[" in old else "local"
    elif path.name == "buffer_size_kb":
        expanded = re.search(r"expanded: (\d+)", old)
        value = expanded.group(1) if expanded else value
        if not value.isdigit():  # per-CPU sizes differ ("X"): nothing one write could restore
            return
    elif path.name == "filter" and value == "none":
        value = "0"
    with contextlib.suppress(OSError):
        path.write_text(value)


@contextlib.contextmanager
def traced(workers: list[int]) -> Iterator[Path]:
    """Trace EVENTS (the sendto of `workers` only) into the returned file when the block ends; every tracefs file
    changed is set back as it was, each on its own, also when a later change or the block failed."""
    events = [TRACING / "events" / event for event in EVENTS]
    missing = [str(path) for path in (TRACING / "trace", *events) if not path.is_dir() and not path.is_file()]
    if missing:
        raise SystemExit(f"delay_line_path: no {', '.join(missing)} (root and a kernel with tracefs and these events)")
    out = Path(f"/tmp/{PREFIX}trace-{os.getpid()}.txt")
    with contextlib.ExitStack() as undo:
        undo.callback(_restore, TRACING / "trace", "")  # last: the buffer emptied

        def change(path: Path, value: str) -> None:
            old = path.read_text()
            path.write_text(value)
            undo.callback(_restore, path, old)

        change(TRACING / "tracing_on", "0")
        change(TRACING / "trace_clock", "mono")  # clears the buffer
        change(TRACING / "buffer_size_kb", "16384")
        change(TRACING / "events/syscalls/sys_enter_sendto/filter",
               " || ".join(f"common_pid == {pid}" for pid in workers) or "0")
        for event in events:
            change(event / "enable", "1")
        change(TRACING / "tracing_on", "1")
        yield out
        (TRACING / "tracing_on").write_text("0")
        out.write_text((TRACING / "trace").read_text())  # before the clock is set back: that clears the buffer


def crossings(text: str, latency_s: float) -> dict[str, list[float]]:
    """Per gateway crossing of the trace, in microseconds: for a delayed pass, verdict sent - due, leaves - due and
    verdict sent -> leaves; for an unshaped one, in -> out."""
    events = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            events.append((float(match["t"]), int(match["pid"]), match["event"], match["rest"]))
    out: dict[str, list[float]] = {"sent - due": [], "leaves - due": [], "sent -> leaves": [], "unshaped": []}
    for index, (t, _, event, rest) in enumerate(events):
        skb = SKB.search(rest)
        if event != "netif_rx" or not skb or not skb["dev"].startswith("to-"):
            continue
        leave = next(((t2, pid2) for t2, pid2, event2, rest2 in events[index + 1:]
                      if event2 == "net_dev_queue" and f"dev=lan skbaddr={skb['skb']}" in rest2), None)
        if leave is None:
            continue
        left, by = leave
        if left - t < latency_s / 2:
            out["unshaped"].append((left - t) * 1e6)
            continue
        sent = [t2 for t2, pid2, event2, _ in events if event2 == "sys_sendto" and pid2 == by and t2 <= left]
        if not sent:
            continue
        due = t + latency_s
        out["sent - due"].append((sent[-1] - due) * 1e6)
        out["leaves - due"].append((left - due) * 1e6)
        out["sent -> leaves"].append((left - sent[-1]) * 1e6)
    return out


def ping(testbed, node: str, target: str, count: int) -> subprocess.Popen:
    # 50.7 ms apart: no round trip here is a multiple of it
    return testbed.fabric.popen(node, ["ping", "-n", "-q", "-i", "0.0507", "-c", str(count), target],
                                stdout=subprocess.DEVNULL)


def run(latency_ms: float, pings: int, warm: bool = True) -> tuple[dict[str, list[float]], dict]:
    topology = topology_from_data({"name": "delay-line-path", "dcs": [{"name": name, "nodes": 1}
                                                                       for name in ("east", "west", "south")],
                                   "links": [{"between": ["east", "west"], "latency": f"{latency_ms}ms",
                                              "bandwidth": "1gbit"},
                                             {"between": ["west", "south"], "latency": "0ms", "bandwidth": "1gbit"}]})
    os.environ[settings.DELAY_LINE_WARM] = "1" if warm else "0"  # the delay line's processes inherit it
    try:
        testbed = bring_up(topology, prefix=PREFIX, shaper="userspace-delay")
    finally:
        os.environ.pop(settings.DELAY_LINE_WARM)
    try:
        workers = sorted({status.worker for gateway in {testbed.plan.delay_line_of(key)
                                                         for key in ("east->west", "west->east")}
                          if gateway and (status := delay_lines.read_status(state_dir(), gateway))})
        west, south = testbed.plan.node("west-0").address, testbed.plan.node("south-0").address
        time.sleep(0.5)
        with traced(workers) as trace:
            shaped, unshaped = ping(testbed, "east-0", west, pings), ping(testbed, "west-0", south, pings)
            shaped.wait(timeout=60 + pings)
            unshaped.wait(timeout=60 + pings)
        own = testbed.fabric.delay_line_stats()
    finally:
        tear_down(PREFIX)
    figures = crossings(trace.read_text(), latency_ms / 1e3)
    trace.unlink()
    return figures, own


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=float, default=0.8)
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for rep in range(args.reps):
        for warm in (True, False) if rep % 2 == 0 else (False, True):
            rows.append(row_of(rep, warm, *run(args.latency_ms, args.pings, warm)))
    frame = pd.DataFrame(rows)
    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{args.latency_ms} ms link, {args.pings} pings a direction a rep; microseconds, medians per rep")
    print(frame.to_markdown(index=False, floatfmt=".1f"))
    summary = frame.groupby("delay line", sort=False).median(numeric_only=True).drop(columns="rep")
    print(f"\nmedians of the {args.reps} reps:")
    print(summary.to_markdown(floatfmt=".1f"))


def row_of(rep: int, warm: bool, figures: dict[str, list[float]], own: dict) -> dict:
    """One rep's table row: each figure's median (us) and how many crossings it has."""
    row = {"rep": rep + 1, "delay line": "warmed" if warm else f"cold ({settings.DELAY_LINE_WARM}=0)"}
    for name, values in figures.items():
        row[f"{name} us"] = statistics.median(values) if values else float("nan")
        row[f"{name} n"] = len(values)
    row["adds per pass us"] = row["leaves - due us"] - row["unshaped us"]
    row["compensation us"] = 1e3 * statistics.median(figure.get("compensation_ms") or 0.0 for figure in own.values()
                                                     if figure.get("latency_ms"))
    return row


if __name__ == "__main__":
    try:
        main()
    finally:
        tear_down(PREFIX)
