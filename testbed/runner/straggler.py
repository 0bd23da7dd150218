"""A straggler: a rank stopped and continued so that it runs 1/slowdown of every period, by a shell loop on the
rank's own node (this machine's namespace, a container, an SSH host), so each signal costs a `kill` builtin
there, not a command sent from here (a docker exec or an SSH round trip is tens of milliseconds, a period's
share). The loop continues the rank when it ends, when it is terminated, and when whoever started it is gone.

Where the fabric keeps a shell open on each node (docker, ssh: Fabric.node_shells, opened before the cell's clock
starts, as for a kill) the loop is started in the background by a script written to that shell: its start costs
a round trip and a fork there, where a new docker exec or SSH channel made it 0.07-0.37 s late. Elsewhere
(netns) it is a process started in the node, a local fork. Either way the start returns once the loop has sent
its first STOP, so that a fault's applied_at is no earlier than the rank was first stopped."""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Any

PERIOD_S = 0.1  # a straggler is stopped for (1 - 1/slowdown) of every such period
END_TIMEOUT_S = 1.0  # how long a loop told to end may take before it is killed (it ends within milliseconds)

# sh (dash, bash; GNU date): $1 the rank's pid (the leader of its process group), $2 seconds stopped, $3 seconds
# running, $4 the period in ns, $5 when to end (ns since the epoch, on the node's clock, which must agree with
# the runner's as for step anchors): no period starts that would end after it, so the loop has ended when the
# runner clears the fault (ending it then would cost a command). $6 a process to watch, checked every period:
# the node's kept shell that started it (which exits when its channel closes, as when the runner dies), or the
# runner itself (netns); when it is gone the loop ends, the rank continued. A signal goes to the rank's group,
# else (not a leader) to the pid alone.
#
# It says one line: "stopped PID TICKS" once its first STOP is sent (its own pid and start time, which name it
# to END), "gone" when there is no rank to stop, "over" when the window ends before a period could begin; then
# its output is /dev/null (a reader that went costs it no SIGPIPE, and the reader sees the end of its output).
# Its sleeps are waited for, so TERM (`wait` returns at once on a trapped signal) ends it at once.
STAT = r"""stat() { st=; read -r st 2>/dev/null </proc/"$1"/stat || return 1; st=${st##*") "}; set -- $st; st="$1 ${20}"; }"""
# (stat PID: `st` set to the process's state letter and start time, fields 3 and 22 of /proc/PID/stat, the name
# in field 2 skipped whatever it holds; fails when there is no such process)
DUTY_CYCLE = STAT + r"""
pid=$1 stopped=$2 running=$3 period=$4 until=$5 watch=$6 napping=
sig() { kill -s "$1" -- "-$pid" 2>/dev/null || kill -s "$1" "$pid" 2>/dev/null; }
nap() { sleep "$1" & napping=$!; wait "$napping"; napping=; }
end() { sig CONT; [ -z "$napping" ] || { kill "$napping"; wait "$napping"; } 2>/dev/null; exit 0; }
trap end TERM INT HUP
stat $$
me="$$ ${st#* }"
if [ $(($(date +%s%N) + period)) -gt "$until" ]; then echo over; exit 0; fi
sig STOP || { echo gone; exit 0; }
echo "stopped $me"
exec >/dev/null
while :; do
  nap "$stopped"
  sig CONT || exit 0
  if ! stat "$watch" || [ "${st%% *}" = Z ]; then exit 0; fi
  nap "$running"
  [ $(($(date +%s%N) + period)) -le "$until" ] || exit 0
  sig STOP || exit 0
done
"""

# Written to the node's kept-open shell (testbed.fabric.kept_shell runs it in a subshell, with set -e) after a
# line setting `pid` (the rank) and `loop` (DUTY_CYCLE), with the loop's other arguments as "$@": the loop in the
# background, in the rank's directory (so that what ends the processes working in a workdir, as `testbed clean`
# on an SSH host does, ends it too), watching the kept shell ($$ is the shell's pid, also in the subshell). The
# command substitution returns the loop's line when the loop closes its output, as soon as its first STOP is
# sent. Its parent, that substitution's subshell, exits at once: the loop's is its pid namespace's init (in a
# container whose init reaps nothing, it stays a zombie once it has ended, so END reads its state in /proc).
START = ['cd "/proc/$pid/cwd" 2>/dev/null || true',
         'said=$(sh -c "$loop" testbed-straggler "$@" "$$" 2>/dev/null </dev/null &)',
         'echo "$said"']

# After a line setting `loop` and `ticks` (the loop's pid and start time: lest its pid be another process's by
# now), `pid` (the rank) and `tries`: ends the loop if it still runs (it continues the rank as it goes), waits for
# it to be gone and says "ended" and the rank's state letter (T: still stopped; "gone": no rank), or "killed"
# when it did not end in time.
END = [STAT,
       'ours() { stat "$loop" && [ "${st%% *}" != Z ] && [ "${st#* }" = "$ticks" ]; }',
       'if ours; then kill -s TERM "$loop" 2>/dev/null || true; fi',
       'n=0',
       'while ours; do',
       '  if [ "$n" -ge "$tries" ]; then kill -s KILL "$loop" 2>/dev/null || true; echo killed; exit 0; fi',
       '  sleep 0.005; n=$((n + 1))',
       'done',
       'if stat "$pid"; then echo "ended ${st%% *}"; else echo "ended gone"; fi']
END_POLL_S = 0.005


def duty_cycle(slowdown: float, period_s: float = PERIOD_S) -> tuple[float, float]:
    """(seconds stopped, seconds running) of each period for a rank `slowdown` times slower."""
    running = period_s / slowdown
    return period_s - running, running


def loop_args(pid: int, slowdown: float, until: float) -> list[str]:
    """DUTY_CYCLE's arguments but the last (what to watch): `pid` slowed `slowdown` times until `until` (epoch
    seconds)."""
    stopped, running = duty_cycle(slowdown)
    return [str(pid), f"{stopped:.4f}", f"{running:.4f}", str(int(PERIOD_S * 1e9)), str(int(until * 1e9))]


def first_stop(said: str, node: str, pid: int) -> list[str]:
    """The loop's line, split, when it sent its first STOP; else why it did not, as a RuntimeError (the fault
    was not applied)."""
    words = said.split()
    if words[:1] == ["stopped"] and len(words) == 3:
        return words
    if words == ["gone"]:
        raise RuntimeError(f"{node}: no process {pid} to slow (the rank has gone)")
    if words == ["over"]:
        raise RuntimeError(f"{node}: its window ends before a period ({PERIOD_S:g} s) could begin")
    raise RuntimeError(f"{node}: the straggler's loop did not start ({said.strip()[-200:] or 'no output'})")


def start_straggler(fabric: Any, node: str, pid: int, slowdown: float, until: float) -> Straggler | ShellStraggler:
    """The loop slowing `pid` on `node` `slowdown` times until `until` (seconds since the epoch): through the node's
    kept-open shell where the fabric keeps one, else as a process in the node. Returns once it sent its first STOP."""
    return (ShellStraggler if fabric.node_shells else Straggler)(fabric, node, pid, slowdown, until)


class Straggler:
    """The loop as a process started in `node` (netns: a local fork), watching this process; stop() ends it early
    (the rank continued)."""

    def __init__(self, fabric: Any, node: str, pid: int, slowdown: float, until: float) -> None:
        self._proc = fabric.popen(node, ["sh", "-c", DUTY_CYCLE, "testbed-straggler", *loop_args(pid, slowdown, until),
                                         str(os.getpid())],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            first_stop(self._proc.stdout.readline().decode(errors="replace"), node, pid)
        except RuntimeError:
            self._proc.wait(timeout=10)
            raise

    def stop(self, timeout: float = 5.0) -> bool:
        """End the loop now if it has not ended by itself (it continues the rank as it goes). Whether it continued
        the rank (False: it had to be killed, or died otherwise, and the rank may still be stopped)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=timeout)
                return False
        return self._proc.returncode == 0


class ShellStraggler:
    """The loop started in the background by a script to `node`'s kept-open shell (docker, ssh); stop() ends it
    early by another (the rank continued). When that shell exits (its channel closed: the runner died, or closed
    it), the loop ends within a period, the rank continued."""

    def __init__(self, fabric: Any, node: str, pid: int, slowdown: float, until: float) -> None:
        self.fabric, self.node, self.pid = fabric, node, pid
        setup = f"{assign(pid=pid, loop=DUTY_CYCLE)}; set -- {shlex.join(loop_args(pid, slowdown, until))}"
        code, said = fabric.node_script(node, [setup, *START])
        if code != 0:
            raise RuntimeError(f"{node}: the straggler's loop did not start (exit {code}: "
                               f"{said.strip()[-200:] or 'no output'})")
        _, loop, ticks = first_stop(said, node, pid)
        self.loop, self.ticks = int(loop), int(ticks)

    def stop(self, timeout: float = 5.0) -> bool:
        """End the loop now if it has not ended by itself (it continues the rank as it goes): a script to the node's
        kept shell. Whether it continued the rank (False: it had to be killed, and the rank may still be
        stopped)."""
        setup = assign(loop=self.loop, ticks=self.ticks, pid=self.pid, tries=int(END_TIMEOUT_S / END_POLL_S))
        code, said = self.fabric.node_script(self.node, [setup, *END], timeout=timeout + END_TIMEOUT_S)
        words = said.split()
        return code == 0 and words[:1] == ["ended"] and words[1:2] != ["T"]


def assign(**values: object) -> str:
    """A shell line setting each variable to its value, quoted."""
    return " ".join(f"{name}={shlex.quote(str(value))}" for name, value in values.items())
