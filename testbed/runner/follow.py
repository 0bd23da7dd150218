"""A rank's metrics file as it is written on another machine (a container, an SSH host): `tail -F` there, its
output streamed into a local copy, so that the fault driver finds rank 0's step starts (its step anchors) while
the cell runs, as it reads them in place on the netns backend. The copy is what has arrived so far; the whole
file comes back afterwards with the fabric's fetch_outputs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from testbed import rankenv

# GNU tail: from the first byte, following the name (the rank creates the file after tail starts), polling
# every 10 ms where inotify is not used
TAIL = f'exec tail -c +1 -s 0.01 -F "${rankenv.METRICS_DIR}/$0" 2>/dev/null'


class Follower:
    """`name` in TESTBED_METRICS_DIR=`metrics_dir` on `node`, copied into `into` as it grows; close() stops it."""

    def __init__(self, fabric, node: str, metrics_dir: Path, name: str, into: Path) -> None:
        into.parent.mkdir(parents=True, exist_ok=True)
        self.path = into
        self._out = open(into, "wb")
        try:
            self._proc = fabric.popen(node, ["sh", "-c", TAIL, name], env={rankenv.METRICS_DIR: str(metrics_dir)},
                                      stdout=self._out, stderr=subprocess.DEVNULL)
        except BaseException:
            self._out.close()
            raise

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass  # the node is gone with its testbed: so is the tail
        finally:
            self._out.close()
