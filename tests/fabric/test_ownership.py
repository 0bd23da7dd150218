"""Who holds a testbed (no root: locks in a test's state directory, holders in subprocesses): a live holder is
named and never displaced, a dead one's testbed is stale and taken over, `run`'s own prefixes go side by side,
and bring-up and tear-down ask first (with the fake backends, as tests/fabric/test_lifecycle.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from testbed.fabric import lifecycle, ownership
from testbed.fabric import state as state_store
from testbed.fabric.ownership import HeldElsewhere
from testbed.waiting import alive, wait_for
from tests.support.fake_backend import LOG
from tests.support.topologies import pair_topology

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPOLOGY = pair_topology("duo", latency="5ms")
PREFIX = "tbo-"
pytestmark = pytest.mark.usefixtures("fakes")  # the fake backends only, lock files of the test's own

HOLD = """
import os, sys, time
from testbed.fabric import ownership
prefix, how = sys.argv[1], sys.argv[2]
if how == "auto":
    prefix = ownership.claim_free(prefix)
else:
    ownership.claim(prefix)
if how == "orphan":  # a child forked without exec keeps the lock after its parent is gone
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print(prefix, flush=True)
if how != "orphan":
    time.sleep(60)
"""


@pytest.fixture
def holders():
    """Start processes that hold a prefix (or claim a free one: how="auto"); each is killed after the test."""
    started: list[subprocess.Popen] = []

    def start(prefix: str, how: str = "hold") -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, prefix, how, "testbed-run-lookalike"], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline().strip()
        assert line, "the holder did not start"
        return proc, line

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_live_holder_is_named_and_a_second_claim_is_refused(holders):
    proc, _ = holders(PREFIX)
    owner = ownership.holder(PREFIX)
    assert owner is not None and owner.pid == proc.pid and owner.prefix == PREFIX
    with pytest.raises(HeldElsewhere) as refused:
        ownership.claim(PREFIX, "not today")
    line = str(refused.value)
    assert "\n" not in line and f"testbed {PREFIX} is held by pid {proc.pid} (" in line
    assert "testbed-run-lookalike" in line and " UTC: not today (" in line
    assert f"testbed clean --force --prefix {PREFIX}" in line
    assert [o.pid for o in ownership.live_owners()] == [proc.pid]


def test_a_dead_holder_leaves_a_stale_testbed_that_the_next_claim_takes(holders):
    proc, _ = holders(PREFIX)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ownership.holder(PREFIX) is None and ownership.live_owners() == []
    ownership.claim(PREFIX)
    assert ownership.holds(PREFIX) and ownership.holder(PREFIX).pid == os.getpid()
    ownership.claim(PREFIX)  # this process holds it already: nothing to do
    ownership.release(PREFIX)
    assert not ownership.holds(PREFIX) and not ownership.lock_path(PREFIX).exists()  # nothing left


def test_a_lock_kept_by_a_dead_holders_child_is_taken_over(holders):
    proc, _ = holders(PREFIX, "orphan")
    proc.wait()
    assert ownership._locked(ownership.lock_path(PREFIX))  # its child still holds the flock
    started = time.monotonic()
    ownership.claim(PREFIX)
    assert ownership.holder(PREFIX).pid == os.getpid()
    assert time.monotonic() - started < ownership.RECORD_WAIT_S + 1.0
    ownership.release(PREFIX)


def test_runs_take_prefixes_of_their_own_side_by_side(holders):
    _, first = holders("tb-", "auto")
    _, second = holders("tb-", "auto")
    assert (first, second) == ("tb-run1-", "tb-run2-")
    # testbeds someone brought up by hand under tb-run3- (`testbed up --prefix`, its process ended) and tb-run4-
    # (before there were lock files) are not a run's to replace
    lifecycle.bring_up(TOPOLOGY, prefix="tb-run3-", backend="fake")
    os.close(ownership._held.pop(str(ownership.lock_path("tb-run3-"))))  # as when `testbed up` exits
    state_store.state_path("tb-run4-").write_text("{}")  # the state directory is there: tb-run3- is up
    assert ownership.claim_free("tb-") == "tb-run5-"
    assert ownership.stale_runs() == []
    ownership.release("tb-run5-")


def test_a_dead_runs_prefix_is_stale_and_taken_again(holders):
    proc, first = holders("tb-", "auto")
    state_store.state_dir().mkdir(parents=True)
    state_store.state_path(first).write_text("{}")  # the run had brought its testbed up
    proc.kill()
    proc.wait()
    assert ownership.stale_runs() == [first]
    assert ownership.claim_free("tb-") == first
    ownership.release(first)


def test_bring_up_and_tear_down_refuse_while_another_process_holds_the_prefix(holders):
    proc, _ = holders(PREFIX)
    with pytest.raises(HeldElsewhere, match=rf"^testbed {PREFIX} is held by pid {proc.pid} .*another testbed does "
                                            "not come up under its prefix"):
        lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake")
    with pytest.raises(HeldElsewhere, match="it is not removed while that process lives"):
        lifecycle.tear_down(PREFIX)
    assert LOG == []  # nothing was probed, built or cleaned
    assert lifecycle.tear_down(PREFIX, force=True) == [f"fake:{PREFIX}", f"other:{PREFIX}"]
    assert ownership.holder(PREFIX).pid == proc.pid  # --force removes the objects, not the holder's lock


def test_bring_up_holds_until_tear_down_and_then_nothing_is_left():
    lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake")
    assert ownership.holder(PREFIX).pid == os.getpid()
    lifecycle.tear_down(PREFIX)
    assert ownership.holder(PREFIX) is None and list(state_store.state_dir().iterdir()) == []
    assert list(ownership.owners_dir().iterdir()) == []


def test_a_testbed_brought_up_by_a_process_that_ended_is_taken_down_from_another(holders):
    """`testbed up` then `testbed down`: the up's process has ended, so its testbed is nobody's."""
    script = ("from testbed.fabric import lifecycle, registry\n"
              "from tests.fabric.test_ownership import TOPOLOGY, PREFIX\n"
              "registry.register('fake', 'tests.support.fake_backend:FakeBackend')\n"
              "lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend='fake')\n")
    up = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    assert state_store.load(PREFIX) is not None and ownership.holder(PREFIX) is None
    assert lifecycle.tear_down(PREFIX) == [f"fake:{PREFIX}", f"other:{PREFIX}"]
    assert state_store.load(PREFIX) is None


def test_a_pid_used_again_is_not_the_holder():
    me = ownership.Owner(PREFIX, os.getpid(), ownership.process_start(os.getpid()), "x", "2026-11-28T00:00:00+00:00")
    assert me.lives()
    assert not ownership.Owner(PREFIX, os.getpid(), me.pid_start + 1, "x", me.started).lives()
    assert alive(os.getpid()) and wait_for(lambda: True, 0)


def test_the_command_reads_as_typed():
    assert ownership.command_line(["/x/.venv/bin/testbed", "run", "e.yaml"]) == "testbed run e.yaml"
    assert ownership.command_line(["/x/testbed/cli/__main__.py", "up", "t.yaml"]) == "testbed up t.yaml"
    assert ownership.command_line(["/usr/bin/pytest", "-q"]) == "pytest -q"


def test_a_bring_up_that_fails_with_nothing_left_leaves_no_lock_file():
    """`up` that fails (a host check, a refused shaper) before anything stays to clean: neither its state nor its
    lock file stays; one that left a change to undo keeps both for `clean`."""
    from tests.support.fake_backend import FakeBackend, FakeOptions

    with pytest.raises(Exception, match="injected failure"):
        lifecycle.bring_up(TOPOLOGY, prefix="tbo-", backend=FakeBackend(FakeOptions(fail="up")))
    assert not ownership.holds("tbo-") and not ownership.lock_path("tbo-").exists()
    with pytest.raises(Exception, match="injected failure"):
        lifecycle.bring_up(TOPOLOGY, prefix="tbo-", backend=FakeBackend(FakeOptions(fail="up-leaving")))
    assert state_store.load("tbo-") is not None and ownership.lock_path("tbo-").exists()
    lifecycle.tear_down("tbo-")
    assert not ownership.lock_path("tbo-").exists()


def _up_in_another_process(keep: bool) -> None:
    """A bring-up in a shell of its own, then the process ends: `testbed up` (keep) or a run that was killed."""
    script = ("import sys\nsys.argv = ['testbed', 'up', 'duo.yaml']\n"
              "from testbed.fabric import lifecycle, registry\n"
              "from tests.fabric.test_ownership import TOPOLOGY, PREFIX\n"
              "registry.register('fake', 'tests.support.fake_backend:FakeBackend')\n"
              f"lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend='fake', topology_file='duo.yaml', keep={keep})\n")
    up = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr


def test_a_testbed_someone_brought_up_is_not_replaced_unless_asked():
    _up_in_another_process(keep=True)
    LOG.clear()
    with pytest.raises(lifecycle.StillUp, match=rf"^testbed {PREFIX} \(topology duo \(duo.yaml\), brought up "
                                                r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC by `testbed up duo.yaml`\) is still "
                                                rf"up: `testbed down --prefix {PREFIX}` removes it, `--replace`"):
        lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake")
    assert LOG == [] and state_store.load(PREFIX).command == "testbed up duo.yaml"  # untouched
    assert ownership.holder(PREFIX) is None  # the refused bring-up does not keep it
    lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake", replace=True)
    assert [entry[0] for entry in LOG].count("clean") == 2
    assert state_store.load(PREFIX).pid == os.getpid()
    lifecycle.tear_down(PREFIX)


def test_what_a_dead_run_left_is_cleaned_without_asking():
    _up_in_another_process(keep=False)
    LOG.clear()
    lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake")
    assert [entry[0] for entry in LOG].count("clean") == 2
    lifecycle.tear_down(PREFIX)


def test_a_testbed_this_process_kept_is_its_own_to_replace():
    lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake", keep=True)
    lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake")
    lifecycle.tear_down(PREFIX)
