"""Two people on one machine: a testbed one brought up with `testbed up` and uses by hand is not destroyed by the
other's `up` of the same prefix (one line naming it), until `--replace` is asked (issue 53, item 3)."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TOPOLOGIES, namespaces_with

pytestmark = pytest.mark.root


def shell(user: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """`testbed ARGS` from a login shell of its own (a session, HOME and USER of `user`), as a second person types."""
    env = {**os.environ, "HOME": f"/tmp/{user}", "USER": user, "LOGNAME": user}
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env, start_new_session=True)


def test_an_idle_testbed_is_refused_to_a_second_user_until_replace(prefix):
    first = shell("alice", "up", "topologies/two-dc.yaml")
    assert first.returncode == 0, first.stderr
    built = namespaces_with(prefix)
    assert built

    second = shell("bob", "up", "topologies/three-dc-ring.yaml")
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert re.match(rf"error: testbed {re.escape(prefix)} \(topology two-dc \(topologies/two-dc.yaml\), brought up "
                    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC by `testbed up topologies/two-dc.yaml`\) is still up: "
                    rf"`testbed down --prefix {re.escape(prefix)}` removes it, `--replace` replaces it", lines[0]), lines
    assert namespaces_with(prefix) == built  # untouched
    status = shell("alice", "status", "--output", "json")
    assert status.returncode == 0 and '"two-dc"' in status.stdout, status.stderr

    replaced = shell("bob", "up", str(TOPOLOGIES / "three-dc-ring.yaml"), "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert "replaced (--replace)" in replaced.stderr + replaced.stdout
    status = shell("bob", "status", "--output", "json")
    assert status.returncode == 0 and '"three-dc-ring"' in status.stdout, status.stderr
    assert shell("bob", "down").returncode == 0
    assert namespaces_with(prefix) == []
