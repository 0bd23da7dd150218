"""Starting and steering delay lines from outside them: the netns backend (one per gateway namespace, started
inside it) and a docker router (its own, started right there) use the same functions. A delay line is named
after where it runs; its files live in a directory the caller names (testbed.agents.delayline.files)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.agents.bootstrap import argv_in
from testbed.agents.delayline.files import MODULE, DelayLineFiles, DelayLineStatus
from testbed.atomic import write_text
from testbed.plan import owned_by
from testbed.plan.delayline import DelayDirection, DelayLineSpec, dump_config, load_config
from testbed.waiting import alive, wait_for

START_TIMEOUT_S = 30.0  # a start that has not bound its queues by then failed; on a loaded machine (the suite's
# user-mode Linux boots, a second test run and its model tests on the same 2 cores) four gateways' delay lines took
# over 10 s, the bound until 2026-11-29; only a failed start waits longer to be reported


def start_all(work: dict[str, list[DelayDirection]], directory: Path, timeout: float = START_TIMEOUT_S,
              in_namespace: bool = True) -> dict[str, int]:
    """Start one supervisor per name (a gateway namespace), all at once; returns name -> pid once every
    queue is bound. `in_namespace=False`: start it right here (a docker router is its own namespace)."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, items in work.items():
            files = DelayLineFiles.named(directory, name)
            files.config.parent.mkdir(parents=True, exist_ok=True)
            files.config.write_text(dump_config(items))
            files.status.unlink(missing_ok=True)
            argv = [sys.executable, "-m", MODULE, "supervise", str(files.config)]
            with open(files.log, "ab") as out:
                procs[name] = subprocess.Popen(argv_in(name, argv) if in_namespace else argv, stdout=out,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
        waiting = set(procs)

        def all_ready() -> bool:
            for name in sorted(waiting):
                status = read_status(directory, name)
                if status is not None and status.ready:
                    waiting.discard(name)
                elif procs[name].poll() is not None:
                    raise RuntimeError(f"delay line in {name} did not start: {_last_words(directory, name)}")
            return not waiting

        if not wait_for(all_ready, timeout, interval=0.005):
            name = sorted(waiting)[0]
            raise RuntimeError(f"delay line in {name} did not start: {_last_words(directory, name)}")
    except BaseException:
        for proc in procs.values():
            proc.kill()
        raise
    return {name: proc.pid for name, proc in procs.items()}


def _last_words(directory: Path, name: str) -> str:
    log = DelayLineFiles.named(directory, name).log
    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    return " ".join(tail).removeprefix("delayline: ") or "timed out"


def read_status(directory: Path, name: str) -> DelayLineStatus | None:
    return DelayLineStatus.read(DelayLineFiles.named(directory, name).status)


def reconfigure(directory: Path, name: str, key: str, spec: DelayLineSpec) -> None:
    """Change direction `key` served by delay line `name`, live (the supervisor forwards SIGHUP)."""
    files = DelayLineFiles.named(directory, name)
    # one change at a time per delay line (two faults of one gateway applied at once, `testbed shape` from another
    # shell): a read-modify-write of the config beside another would lose one of the two
    with open(files.config.with_name(files.config.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        work = [item.reshaped(spec) if item.key == key else item for item in load_config(files.config.read_text())]
        write_text(files.config, dump_config(work))
    status = read_status(directory, name)
    if status is None or not serves(status.supervisor, files.config):
        raise RuntimeError(f"delay line of {name} is not running")
    os.kill(status.supervisor, signal.SIGHUP)


def serves(pid: int | None, config: Path) -> bool:
    """Whether `pid` is a delay line process of config `config`, alive. A status file outlives its processes
    (a crash, SIGKILL) and Linux reuses pids: signalling a recorded pid unchecked once sent SIGHUP to another
    engineer's test run that had taken the number."""
    if not pid or not alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    wanted = config.resolve()
    return MODULE in argv and any(arg.endswith(config.name) and Path(arg).resolve() == wanted for arg in argv)


def snapshot(directory: Path, names: list[str], timeout: float = 1.0) -> dict[str, dict]:
    """Direction key -> {worker, released, late} as the delay lines `names` know it right now (each worker is
    asked to write its figures, SIGUSR2; a dead one contributes what it last wrote)."""
    return fresh_stats(names, lambda name: DelayLineFiles.named(directory, name).stats.read_text(),
                       lambda name: _signal_worker(directory, name), timeout)


def fresh_stats(places: list, read: Callable[[Any], str], ask: Callable[[Any], None],
                timeout: float = 1.0) -> dict[str, dict]:
    """Ask every place's worker for its stats, then wait (up to `timeout`) until each file was rewritten:
    `written` changes (compared with itself, so clocks of other hosts do not matter)."""

    def load(place: Any) -> dict:
        try:
            return json.loads(read(place))
        except (OSError, ValueError):
            return {}

    before = {id(place): load(place).get("written") for place in places}
    for place in places:
        ask(place)
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    for place in places:
        latest = {"data": load(place)}

        def rewritten(place: Any = place, latest: dict = latest) -> bool:
            latest["data"] = load(place)
            return latest["data"].get("written") != before[id(place)]

        wait_for(rewritten, max(0.0, deadline - time.monotonic()), interval=0.01)
        out.update(latest["data"].get("directions", {}))
    return out


def _signal_worker(directory: Path, name: str) -> None:
    status = read_status(directory, name)
    if status is not None and serves(status.worker, DelayLineFiles.named(directory, name).config):
        try:
            os.kill(status.worker, signal.SIGUSR2)
        except ProcessLookupError:
            pass


def remove_files(directory: Path, prefix: str) -> None:
    """The delay-line files of the testbed with this prefix (named after its gateways' namespaces)."""
    for path in directory.glob(f"{prefix}*.delayline.*"):
        if owned_by(path.name.split(".delayline.")[0], prefix):
            path.unlink(missing_ok=True)
