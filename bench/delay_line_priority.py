"""Does SCHED_FIFO help under CPU load, for the delay-line worker or for the probe's pinger and echo? Measured.

A pair of DCs (10 ms one way, 1 Gbit/s); per repetition and scheduling mode (normal vs SCHED_FIFO, alternating)
of the part under test (--part delay-line, or probe: the other keeps its default, SCHED_FIFO): bring the link
up, start N busy processes (none, or more than this machine's cores; --hog python: a busy loop, torch: a
matrix product on torch's threads, as ranks are; disk: writing 512 MB files, beside the delay line's own files,
over and over), run pings and a TCP flow paced at 200 Mbit/s across it for a
few seconds, and read the delay line's lateness figures (how late it released each packet against its due time:
its own error) and the probe's RTT error (endpoints included). Medians over repetitions.

Usage: .venv/bin/python bench/delay_line_priority.py [--part delay-line|probe] [--hog python|torch|disk] [--reps 3]
       [--busy 0,4] [--seconds 5]   (root)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pandas as pd

from testbed import api
from testbed.agents.delayline.release import lateness_delta, lateness_summary  # the delay line's own figures
from testbed.fabric.state import state_dir  # where the delay line writes: the disk hog writes beside it

if TYPE_CHECKING:
    from testbed.api.types import Testbed

PREFIX = "tb-prio-"
PORT = 5201
# the part under test: its scheduling switch
PARTS = {"delay-line": api.settings.DELAY_LINE_RT, "probe": api.settings.PROBE_RT}
DISK_HOG = "tb-prio-disk-"  # the disk hog's files, in the state directory's parent (removed after)
HOGS = {"python": "while True: pass",
        "disk": f"import os, sys\npath = os.path.join(sys.argv[1], '{DISK_HOG}' + str(os.getpid()))\n"
                "while True:\n    with open(path, 'wb') as f:\n        for _ in range(512): f.write(bytes(1 << 20))\n"
                "    os.remove(path)",
        "torch": "import torch\na = torch.randn(512, 512)\nwhile True: a @ a"}


def agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "testbed.agents.probe", *args]


def measure(testbed: Testbed, seconds: float) -> tuple[dict, dict, dict]:
    """The delay line's figures before and after, and the pings' answer, over a paced flow of `seconds`."""
    dst = testbed.plan.node("west-0").address
    server = testbed.fabric.popen("west-0", agent("serve", "--port", str(PORT)), stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        before = testbed.fabric.delay_line_stats()
        flow = testbed.fabric.popen("east-0", agent("send", dst, "--port", str(PORT), "--seconds", str(seconds),
                                                    "--pace", "2e8"), stdout=subprocess.PIPE, text=True)
        pings = testbed.fabric.popen("east-0", agent("rtt", dst, "--port", str(PORT), "--count",
                                                     str(int(seconds / 0.01)), "--interval", "0.01"),
                                     stdout=subprocess.PIPE, text=True)
        ping = json.loads(pings.communicate(timeout=seconds + 60)[0])
        flow.communicate(timeout=seconds + 60)
        return testbed.fabric.delay_line_stats(), before, ping
    finally:
        server.kill()
        server.wait()


def one(part: str, mode: str, busy: int, hog: str, seconds: float) -> dict:
    for name, switch in PARTS.items():
        os.environ[switch] = "0" if name == part and mode == "other" else "1"
    topology = {"name": "prio", "dcs": [{"name": "east", "nodes": 1}, {"name": "west", "nodes": 1}],
                "links": [{"between": ["east", "west"], "latency": "10ms", "bandwidth": "1gbit"}]}
    disk = state_dir().parent  # the delay line's files are in state_dir()
    hogs = [subprocess.Popen([sys.executable, "-c", HOGS[hog], str(disk)]) for _ in range(busy)]
    try:
        with api.testbed(topology, prefix=PREFIX, shaper="userspace-delay") as testbed:
            after, before, ping = measure(testbed, seconds)
    finally:
        for process in hogs:
            process.kill()
            process.wait()
        for path in disk.glob(f"{DISK_HOG}*"):
            path.unlink()
    rtts = ping["rtts"]
    scheduling = after["east->west"].get("scheduling", "?") if part == "delay-line" else ping.get("scheduling", "?")
    row = {"busy processes": busy, "scheduling": scheduling}
    for key in ("east->west", "west->east"):
        late = lateness_summary(lateness_delta(before.get(key, {}), after[key]))
        row[f"{key} late p50 ms"], row[f"{key} late p99 ms"] = late["p50_ms"], late["p99_ms"]
        row[f"{key} late max ms"] = late["max_ms"]
    ordered = sorted(rtts)
    row["ping RTT p50 err ms"] = (ordered[len(ordered) // 2] - 0.020) * 1e3
    row["ping RTT p99 err ms"] = (ordered[int(len(ordered) * 0.99)] - 0.020) * 1e3
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=sorted(PARTS), default="delay-line")
    parser.add_argument("--hog", choices=sorted(HOGS), default="python")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", default=f"0,{2 * (os.cpu_count() or 1)}")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    api.handle_signals()  # SIGTERM and Ctrl-C take the testbed down before the script ends
    rows = []
    for rep in range(args.reps):
        for busy in [int(b) for b in args.busy.split(",")]:
            for mode in ("other", "fifo") if rep % 2 == 0 else ("fifo", "other"):
                rows.append(one(args.part, mode, busy, args.hog, args.seconds))
                print(f"rep {rep}: {json.dumps(rows[-1])}", file=sys.stderr)
    frame = pd.DataFrame(rows)
    table = frame.groupby(["busy processes", "scheduling"]).median(numeric_only=True).reset_index()
    table.insert(2, "reps", frame.groupby(["busy processes", "scheduling"]).size().values)
    print(f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}, scheduling of the {args.part}, {args.hog} busy "
          "processes, medians over repetitions")
    print(table.to_markdown(index=False, floatfmt=".3g"))


if __name__ == "__main__":
    main()  # each testbed is torn down as its `with` ends
