"""How late does a SCHED_FIFO sleeper wake under the training's load, in Python and in C? The part of the delay
line's lateness that a native hot path would not take away.

Two sleepers run side by side, each as the delay line's worker sleeps (SCHED_FIFO priority 10, timer slack 1 ns, an
absolute aim PERIOD ahead, then how far past the aim it woke): one in Python (time.sleep, as worker.py), one in C
(clock_nanosleep TIMER_ABSTIME, compiled here with cc). With --load quickstart they run while `testbed run
experiments/quickstart.yaml` trains (its ranks, gloo's traffic through the gateways, the delay lines); with none, on
an idle machine. If C wakes as late as Python, the lateness is the kernel's (a non-preemptible kernel: a ranks'
system call or softirq holds the CPU until it ends), not the interpreter's.

Usage: .venv/bin/python bench/delay_line_wakeup.py [--load none|quickstart] [--seconds 60] [--reps 1]   (root)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parents[1]
PERIOD = 500e-6  # seconds between two aims (the delay line wakes a few times a millisecond under traffic)
C_SOURCE = r"""
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
    double seconds = atof(argv[1]), period = atof(argv[2]);
    struct sched_param p = {.sched_priority = 10};
    int fifo = sched_setscheduler(0, SCHED_FIFO, &p) == 0;
    prctl(PR_SET_TIMERSLACK, 1);
    long cap = (long)(seconds / period) + 16, n = 0;
    double *late = malloc(cap * sizeof(double)), end = now() + seconds;
    while (n < cap) {
        double aim = now() + period;
        if (aim > end) break;
        struct timespec t = {(time_t)aim, (long)((aim - (time_t)aim) * 1e9)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
        late[n++] = now() - aim;
    }
    qsort(late, n, sizeof(double), cmp);
    printf("{\"fifo\": %d, \"n\": %ld, \"p50\": %g, \"p99\": %g, \"p999\": %g, \"max\": %g}\n", fifo, n,
           late[n / 2], late[(long)(n * 0.99)], late[(long)(n * 0.999)], late[n - 1]);
    return 0;
}
"""
PY_SOURCE = """
import ctypes, json, os, sys, time
seconds, period = float(sys.argv[1]), float(sys.argv[2])
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10)); fifo = 1
except OSError:
    fifo = 0
ctypes.CDLL(None).prctl(29, 1)
late, end = [], time.monotonic() + seconds
while True:
    aim = time.monotonic() + period
    if aim > end:
        break
    time.sleep(max(0.0, aim - time.monotonic()))
    late.append(time.monotonic() - aim)
late.sort()
n = len(late)
print(json.dumps({"fifo": fifo, "n": n, "p50": late[n // 2], "p99": late[int(n * 0.99)], "p999": late[int(n * 0.999)],
                  "max": late[-1]}))
"""


def sleepers(work: Path, seconds: float) -> dict[str, subprocess.Popen]:
    binary = work / "sleeper"
    subprocess.run(["cc", "-O2", "-o", str(binary), "-x", "c", "-"], input=C_SOURCE, text=True, check=True)
    return {name: subprocess.Popen([*argv, str(seconds), str(PERIOD)], stdout=subprocess.PIPE, text=True)
            for name, argv in (("C", [str(binary)]), ("Python", [sys.executable, "-c", PY_SOURCE]))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load", choices=("none", "quickstart"), default="none")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="tb-dlw-"))
    try:
        for rep in range(args.reps):
            load = Path("/proc/loadavg").read_text().split()[0]
            training = None
            if args.load == "quickstart":
                training = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "experiments/quickstart.yaml",
                                             "-o", str(work / "results")], cwd=HERE, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(HERE)})
                time.sleep(15)  # past the calibration, into the cells
            running = sleepers(work, args.seconds)
            for name, proc in running.items():
                figures = json.loads(proc.communicate()[0])
                rows.append({"rep": rep + 1, "sleeper": name, "load": args.load, "loadavg before": load,
                             "scheduling": "fifo" if figures["fifo"] else "other", "wake-ups": figures["n"],
                             **{f"{q} us": figures[q] * 1e6 for q in ("p50", "p99", "p999", "max")}})
            if training is not None:
                training.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, an aim every "
          f"{PERIOD * 1e6:.0f} us for {args.seconds:.0f} s; how far past its aim each sleeper woke")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".1f"))


if __name__ == "__main__":
    main()
