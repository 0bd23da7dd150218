"""A straggler: a rank stopped and continued so that it runs 1/slowdown of every period, by a shell loop on the
rank's own node (this machine's namespace, a container, an SSH host), so each signal costs a `kill` builtin
there, not a command sent from here (a docker exec or an SSH round trip is tens of milliseconds, a period's
share). The loop continues the rank when it ends, and when it is terminated."""

from __future__ import annotations

import subprocess
from typing import Any

PERIOD_S = 0.1  # a straggler is stopped for (1 - 1/slowdown) of every such period

# sh (dash, bash; GNU date): $1 the rank's pid (the leader of its process group), $2 seconds stopped, $3 seconds
# running, $4 the period in ns, $5 when to end (ns since the epoch, on the node's clock, which must agree with
# the runner's as for step anchors): no period starts that would end after it, so the loop has ended when the
# runner clears the fault (ending it then would cost a command: an SSH round trip, a docker exec). A signal to
# the group, else (not a leader) to the pid alone.
DUTY_CYCLE = r"""
pid=$1 stopped=$2 running=$3 period=$4 until=$5
sig() { kill -s "$1" -- "-$pid" 2>/dev/null || kill -s "$1" "$pid" 2>/dev/null; }
trap 'sig CONT; exit 0' TERM INT HUP
echo started
while [ $(($(date +%s%N) + period)) -le "$until" ]; do
  sig STOP || exit 0
  sleep "$stopped"
  sig CONT
  sleep "$running"
done
sig CONT
"""


def duty_cycle(slowdown: float, period_s: float = PERIOD_S) -> tuple[float, float]:
    """(seconds stopped, seconds running) of each period for a rank `slowdown` times slower."""
    running = period_s / slowdown
    return period_s - running, running


class Straggler:
    """The loop slowing `pid` on `node` until `until` (seconds since the epoch); stop() ends it early (the rank
    continued)."""

    def __init__(self, fabric: Any, node: str, pid: int, slowdown: float, until: float) -> None:
        stopped, running = duty_cycle(slowdown)
        self._proc = fabric.popen(node, ["sh", "-c", DUTY_CYCLE, "straggler", str(pid), f"{stopped:.4f}",
                                         f"{running:.4f}", str(int(PERIOD_S * 1e9)), str(int(until * 1e9))],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        # started: the loop's first stop follows within a fork; a node that cannot run it says so now
        if self._proc.stdout.readline().strip() != b"started":
            self._proc.wait(timeout=10)
            raise RuntimeError(f"{node}: the straggler's loop did not start (exit {self._proc.returncode})")

    def stop(self, timeout: float = 5.0) -> bool:
        """End the loop (it continues the rank as it goes): at its end it has ended by itself, or does within a
        period; else (stopped early) it is terminated. Whether it continued the rank (False: it had to be
        killed, or died otherwise, and the rank may still be stopped)."""
        try:
            self._proc.wait(timeout=PERIOD_S + 0.05)
        except subprocess.TimeoutExpired:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=timeout)
                return False
        return self._proc.returncode == 0
