"""Signals reach a delay line only through a pid that still is one: status files outlive their processes and
Linux reuses pids (a stale status once sent SIGHUP to an unrelated test run that had taken the number)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testbed.agents.delayline import control
from testbed.agents.delayline.files import MODULE, DelayLineFiles, DelayLineStatus
from testbed.plan.delayline import dump_config


@pytest.fixture
def sleeper():
    """Start a process with `argv` after `python -c sleep`, so its /proc cmdline reads like that program's."""
    procs = []

    def start(*argv: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_only_a_delay_line_of_that_config_counts(tmp_path, sleeper):
    config = DelayLineFiles.named(tmp_path, "tb-x-west-gw").config
    other = DelayLineFiles.named(tmp_path, "tb-x-east-gw").config
    line = sleeper("-m", MODULE, "supervise", str(config))
    stranger = sleeper("--some", "other", "program")
    neighbour = sleeper("-m", MODULE, "supervise", str(other))
    assert control.serves(line.pid, config)
    assert not control.serves(stranger.pid, config)
    assert not control.serves(neighbour.pid, config)
    assert not control.serves(None, config)
    line.kill()
    line.wait()
    assert not control.serves(line.pid, config)  # gone: its number may be anyone's next


def test_a_stale_status_signals_no_one(tmp_path, sleeper):
    """The recorded supervisor's pid now belongs to another program: reconfigure refuses, the program lives."""
    files = DelayLineFiles.named(tmp_path, "tb-x-west-gw")
    files.config.write_text(dump_config([]))
    stranger = sleeper("unrelated")
    DelayLineStatus(supervisor=stranger.pid, worker=stranger.pid, ready=True).write(files.status)
    with pytest.raises(RuntimeError, match="not running"):
        control.reconfigure(tmp_path, "tb-x-west-gw", "west->east", None)
    control._signal_worker(tmp_path, "tb-x-west-gw")
    assert stranger.poll() is None
