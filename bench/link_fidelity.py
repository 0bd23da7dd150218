"""Link fidelity: RTT error (p50/p99) idle and under load, goodput vs configured, delay-line CPU.

RTT error is by the definition `testbed probe` uses (testbed.runner.fidelity): the measured round trip less the
configured one less the floor, measured in the same cell with the same pinger at the same time: the same path
unshaped (east-0 -> west-0, pings marked to cross the shaping undelayed), or the mean of the two DCs' own round
trips (east-1 -> east-0, west-1 -> west-0) where the link delays marked pings too; the DCs' own come beside either. With
the userspace delay line, each point runs twice, one after the other: as it is, without the compensation of its own
path ("userspace-delay uncompensated") and watching its queue all the time ("userspace-delay unbatched": two
wake-ups a packet, its CPU before the change), so the table shows what each change buys; the delay line's own figures
(what it measured of its path, the residual it still adds) come beside. `--before REV` runs, beside them, the delay
line's code as it was at git revision REV (the testbed package of that revision, exported to a temporary directory,
is what its processes import): a change that no switch undoes is measured against the code before it in the same
run.

One-way delay {1, 5, 20, 50} ms x rate {100 Mbit, 1 Gbit, 2.5 Gbit}, for each shaper asked for (default: every
shaper this kernel has: netem beside userspace-delay where sch_netem exists), in one run on one kernel.
"Loaded" RTT is measured while a TCP flow paced at 90 % of the rate runs the same way (an unpaced flow fills
the BDP-sized queue: that queueing delay is real link behaviour, not shaper error); goodput comes from a
separate unpaced flow and is held against rate x 1448/1514. CPU, from 1 s into the paced flow to its end: the
delay-line worker serving the data direction, as % of one core and as CPU-seconds per GB of payload the paced
flow carried (utime + stime of /proc/PID/stat: less sensitive to what else runs than % of a core; x rate/8 gives
% of a core at any rate), and the whole machine's busy time (% of one core: probes included, the same for both
shapers, so the difference is the shaper's cost; netem's work is in the kernel, charged to no process). The
worker's figure includes the kernel carrying each released packet on (bridge, routing, the receiver's TCP), work
that the sender's own send does on an unshaped path.
"late p99" is the delay line's own figure of how late it released packets during the loaded phase (netem
keeps none).

To compare both shapers where this kernel has no netem, run it in user-mode Linux (timing there is looser):
    scripts/uml-run -- .venv/bin/python bench/link_fidelity.py --shaper netem,userspace-delay

Usage: .venv/bin/python bench/link_fidelity.py [--shaper netem,userspace-delay] [--delays 1,5,20,50]
                                               [--rates 100mbit,1gbit,2.5gbit] [--reps 1] [--out bench/out]
                                               [--variants uncompensated,unbatched] [--before REV]
       (root; with --reps N every figure is the median of N runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from testbed.agents.delayline import control as delay_lines
from testbed.agents.delayline.release import lateness_delta, lateness_summary
from testbed.fabric.lifecycle import bring_up, tear_down
from testbed.fabric.netns.kernel import has_netem
from testbed.fabric.state import state_dir
from testbed.runner.fidelity import DEFINITION, PATH, held_floor, pair_floor_ms, path_floor_measurable, round_trip
from testbed.runner.probe import PAYLOAD_PER_FRAME, floors_beside, path_ends
from testbed.spec import units
from testbed.spec.topology import topology_from_data

PREFIX = "tb-fid-"
PORT = 5201
DCS = ("east", "west")  # the two DCs of the benchmark's topology
TICKS = os.sysconf("SC_CLK_TCK")
VARIANTS = {  # the delay line as it was before a change, beside it in the same run: the switch that undoes it
    "uncompensated": {"TESTBED_DELAY_LINE_COMPENSATE": "0"},  # aims at the due time itself
    "unbatched": {"TESTBED_DELAY_LINE_BATCH": "0"},  # watches its queue all the time: two wake-ups a packet
    "64k": {"TESTBED_GSO": "0"},  # units of at most 64 KiB, the kernel's default, whatever the link's rate
    "cold": {"TESTBED_DELAY_LINE_WARM": "0"},  # releases after a sleep without warming the verdict's path first
}
BEFORE = "before"  # the variant that runs an earlier revision's code (--before)
REPO = Path(__file__).resolve().parent.parent


def code_of(revision: str, into: Path) -> dict[str, str]:
    """Export the testbed package as it was at git `revision` under `into`; the environment that makes a Python
    process import it instead of this checkout's (PYTHONSAFEPATH: not the working directory first)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "testbed"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return {"PYTHONPATH": str(into), "PYTHONSAFEPATH": "1"}


def agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "testbed.agents.probe", *args]


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / TICKS


def busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / TICKS, sum(fields) / TICKS


def run_json(testbed, node: str, args: list[str], timeout: float) -> dict:
    proc = testbed.fabric.popen(node, agent(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode:
        raise RuntimeError(err.strip()[-400:])
    return json.loads(out)


def cell(delay_ms: float, rate: str, shaper: str, pings: int, seconds: float,
         before: dict[str, str] | None = None) -> dict:
    topology = topology_from_data({"name": "fidelity", "dcs": [{"name": "east", "nodes": 2},
                                                               {"name": "west", "nodes": 2}],
                                   "links": [{"between": ["east", "west"], "latency": f"{delay_ms}ms",
                                              "bandwidth": rate}]})
    variant = shaper.removeprefix("userspace-delay ")
    switches = (before or {}) if variant == BEFORE else VARIANTS.get(variant, {})
    os.environ.update(switches)  # the delay line's processes inherit them
    try:
        testbed = bring_up(topology, prefix=PREFIX, shaper=shaper.split()[0])
    finally:
        for name in switches:
            os.environ.pop(name, None)
    rate_bps = units.parse_rate(rate)
    rtt = 2 * delay_ms / 1e3
    dst = testbed.plan.node("west-0").address
    server = testbed.fabric.popen("west-0", agent("serve", "--port", str(PORT), "--warmup", "1.5"),
                                  stdout=subprocess.PIPE, text=True)
    east = testbed.fabric.popen("east-0", agent("serve", "--port", str(PORT)), stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        east.stdout.readline()
        ping_args = ["rtt", dst, "--port", str(PORT), "--count", str(pings), "--interval", "0.005"]
        # the same path unshaped, where the delay lines let marked pings through (an earlier revision's do not)
        ends = path_ends(testbed.plan, topology, *DCS) + path_ends(testbed.plan, topology, *DCS[::-1])
        path = ("east-0", dst) if variant != BEFORE and path_floor_measurable(ends) else None
        with floors_beside(testbed.fabric, testbed.plan, topology, DCS, pings=pings, interval=0.005,
                           path=path) as floors:
            idle = run_json(testbed, "east-0", ping_args, 120)["rtts"]
        flow = run_json(testbed, "east-0", ["send", dst, "--port", str(PORT), "--seconds", str(seconds)], 120)
        gateway = testbed.plan.delay_line_of("east->west")
        status = delay_lines.read_status(state_dir(), gateway) if gateway else None
        worker = status.worker if status else None
        paced = testbed.fabric.popen("east-0", agent("send", dst, "--port", str(PORT), "--seconds",
                                                     str(seconds + pings * 0.005), "--pace", str(0.9 * rate_bps)),
                                     stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        cpu0, t0 = (cpu_seconds(worker), time.monotonic()) if worker else (float("nan"), time.monotonic())
        busy0, late0 = busy_seconds()[0], testbed.fabric.delay_line_stats()
        with floors_beside(testbed.fabric, testbed.plan, topology, DCS, pings=pings,
                           interval=0.005, path=path) as floors_loaded:
            loaded = run_json(testbed, "east-0", ping_args, 120)["rtts"]
        late1 = testbed.fabric.delay_line_stats()
        late = lateness_summary(lateness_delta(late0.get("east->west", {}), late1["east->west"])) \
            if "east->west" in late1 else {"p99_ms": float("nan")}
        paced_result = json.loads(paced.communicate(timeout=120)[0])
        elapsed = time.monotonic() - t0
        worker_cpu = cpu_seconds(worker) - cpu0 if worker else float("nan")
        machine = (busy_seconds()[0] - busy0) / elapsed * 100
        own = late1.get("east->west", {})
    finally:
        for proc in (server, east):
            proc.kill()
            proc.wait()
        tear_down(PREFIX)

    dc_floor = pair_floor_ms(*(floors[dc] for dc in DCS))
    floor, _ = held_floor(floors.get(PATH), dc_floor, rtt * 1e3)
    idle_trip = round_trip(rtt * 1e3, floor, [value * 1e3 for value in idle])
    loaded_floor, _ = held_floor(floors_loaded.get(PATH), pair_floor_ms(*(floors_loaded[dc] for dc in DCS)),
                                 rtt * 1e3)
    loaded_trip = round_trip(rtt * 1e3, loaded_floor, [value * 1e3 for value in loaded])
    expected = rate_bps * PAYLOAD_PER_FRAME
    return {"shaper": shaper, "one-way ms": delay_ms, "rate": rate, "floor ms": floor, "DC floor ms": dc_floor,
            "idle p50 err vs DC floor ms": idle_trip.p50_ms - rtt * 1e3 - dc_floor,
            "idle p50 err ms": idle_trip.error_ms, "idle p99 err ms": idle_trip.p99_ms - idle_trip.expected_ms,
            "idle p50 err %": idle_trip.error_ms / (rtt * 1e3) * 100 if rtt else float("nan"),
            "loaded p50 err ms": loaded_trip.error_ms, "loaded p99 err ms": loaded_trip.p99_ms - loaded_trip.expected_ms,
            "delay-line residual p50 ms": late.get("p50_ms", float("nan")),
            "delay-line path ms": own.get("path_ms") or float("nan"),
            "delay-line compensation ms": own.get("compensation_ms", float("nan")),
            "goodput/expected": flow["goodput_bps"] / expected,
            "goodput/configured": flow["goodput_bps"] / rate_bps,
            "paced Mbit/s": paced_result["goodput_bps"] / 1e6, "delay-line CPU %": worker_cpu / elapsed * 100,
            "delay-line CPU-s/GB": worker_cpu / (paced_result["goodput_bps"] / 8 * elapsed / 1e9),
            "machine CPU %": machine,
            "delay-line late p99 ms": late["p99_ms"], "load 1 min": os.getloadavg()[0],
            "lost pings": pings * 2 - len(idle) - len(loaded)}


def plot(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (shaper, rate), group in frame.groupby(["shaper", "rate"]):
        axes[0].plot(group["one-way ms"], group["loaded p99 err ms"], marker="o", label=f"{shaper} {rate}")
        axes[1].plot(group["one-way ms"], group["goodput/expected"] * 100, marker="o", label=f"{shaper} {rate}")
    axes[0].set(xlabel="one-way delay (ms)", ylabel="p99 RTT error under load (ms)", xscale="log")
    axes[1].set(xlabel="one-way delay (ms)", ylabel="goodput / expected (%)", xscale="log")
    axes[1].set_ylim(80, 105)
    axes[1].ticklabel_format(axis="y", useOffset=False, style="plain")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delays", default="1,5,20,50")
    parser.add_argument("--rates", default="100mbit,1gbit,2.5gbit")
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--shaper", default="", help="netem,userspace-delay (default: those this kernel has)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions (medians; shaper order alternates)")
    parser.add_argument("--variants", default="uncompensated,unbatched",
                        help=f"beside userspace-delay, the delay line without a change ({', '.join(VARIANTS)}; none)")
    parser.add_argument("--before", metavar="REV", help="beside userspace-delay, the delay line of git revision REV")
    args = parser.parse_args()
    shapers = args.shaper.split(",") if args.shaper else ["userspace-delay"] + (["netem"] if has_netem() else [])
    with tempfile.TemporaryDirectory(prefix="tb-fid-before-") as old:
        before = code_of(args.before, Path(old)) if args.before else None
        if "userspace-delay" in shapers:
            variants = [f"userspace-delay {name}" for name in args.variants.split(",") if name in VARIANTS]
            variants += [f"userspace-delay {BEFORE}"] if before else []
            shapers[shapers.index("userspace-delay") + 1:shapers.index("userspace-delay") + 1] = variants
        rows = measure(args, shapers, before)
    report(args, shapers, rows)


def measure(args: argparse.Namespace, shapers: list[str], before: dict[str, str] | None) -> list[dict]:
    rows = []
    for rep in range(args.reps):
        for rate in args.rates.split(","):
            for delay in [float(d) for d in args.delays.split(",")]:
                order = shapers if rep % 2 == 0 else shapers[::-1]
                for shaper in order:  # side by side: both shapers of a point run one after the other
                    rows.append(cell(delay, rate, shaper, args.pings, args.seconds, before))
                    print(f"done {rep} {shaper} {rate} {delay} ms", file=sys.stderr)
    return rows


def report(args: argparse.Namespace, shapers: list[str], rows: list[dict]) -> None:
    raw = pd.DataFrame(rows)
    keys = ["rate", "one-way ms", "shaper"]
    frame = raw.groupby(keys, sort=False).median(numeric_only=True).reset_index()
    frame.insert(3, "reps", raw.groupby(keys, sort=False).size().values)
    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, load average "
          f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(f"RTT error: {DEFINITION}. \"floor ms\": the same path unshaped (the DCs' own for an earlier revision's "
          f"delay line, which delays every packet); \"DC floor ms\": the DCs' own, measured at the same time, and "
          f"the idle error against it")
    if args.before:
        print(f"userspace-delay {BEFORE}: the delay line of revision {args.before}")
    args.out.mkdir(parents=True, exist_ok=True)
    raw.to_csv(args.out / "link_fidelity.csv", index=False)
    plot(frame, args.out / "link_fidelity.png")
    print(frame.to_markdown(index=False, floatfmt=".3g"))
    if "netem" not in shapers:
        print("\n(no sch_netem on this kernel: the netem columns are measured only where it exists)")


if __name__ == "__main__":
    try:
        main()
    finally:
        tear_down(PREFIX)
