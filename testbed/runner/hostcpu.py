"""The CPU time the hypervisor took from this machine while a cell ran: /proc/stat's `steal`, sampled in the
background. On a virtual machine (a CI runner, a cloud VM, this project's own) the host's other guests take
CPU in bursts; every rank on an emulated testbed shares this machine's cores, so a stolen second slows the
cell's compute and no model of the configured system accounts for it. Recorded for backends whose ranks run
on this machine (netns, docker); collect turns the samples into the share of CPU time stolen during a cell's
measured steps (testbed.collect.frames.host_steal); `testbed probe` the share during each pair's pings."""

from __future__ import annotations

import threading
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
SAMPLE_S = 0.5  # /proc/stat counts in 10 ms ticks; half a second bounds a measured window within a tick or two
HOST_STEAL_BOUND = 0.02  # share of CPU time stolen during a measurement above which it is flagged


def cpu_times(text: str) -> tuple[int, int] | None:
    """(all CPU time, stolen CPU time) in ticks, summed over CPUs, from /proc/stat's text; None when its `cpu`
    line has no steal column (kernels before 2.6.11)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
            return (sum(ticks), ticks[7]) if len(ticks) == 8 else None
    return None


def read_cpu_times(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """cpu_times() of this machine now; None where /proc/stat cannot be read or has no steal column."""
    try:
        return cpu_times(stat.read_text())
    except OSError:
        return None


def stolen_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all CPU time the hypervisor took between two read_cpu_times(); None without both."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


class StealSampler:
    """Samples (time, all ticks, stolen ticks) every SAMPLE_S in a thread from start() to stop()."""

    def __init__(self, interval: float = SAMPLE_S, stat: Path = PROC_STAT) -> None:
        self.interval, self.stat = interval, stat
        self.samples: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="host-cpu", daemon=True)

    def _sample(self) -> None:
        times = read_cpu_times(self.stat)
        if times is not None:
            self.samples.append([time.time(), *times])

    def _loop(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                return

    def start(self) -> StealSampler:
        self._thread.start()
        return self

    def stop(self) -> dict | None:
        """The record a cell keeps (result.json's host_cpu): the samples, with one taken now; None when this
        machine's /proc/stat says nothing of steal."""
        self._stop.set()
        self._thread.join()
        self._sample()
        return {"interval_s": self.interval, "samples": self.samples} if len(self.samples) >= 2 else None
