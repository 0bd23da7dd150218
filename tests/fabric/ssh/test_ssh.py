"""Real hosts over SSH, played by sshd inside namespaces the test creates (root): host-key verification,
key-only authentication, the host check table, and one clear line for each way it can go wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from testbed.fabric.lifecycle import bring_up
from testbed.fabric.ssh.connection import Result
from testbed.spec import load_topology
from tests.conftest import TOPOLOGIES, run_cli
from tests.support.ssh import keygen, start_hosts
from tests.support.topologies import pair_data

pytestmark = [pytest.mark.root, pytest.mark.sshd]


@pytest.fixture
def hosts(prefix, tmp_path):
    """Two DCs of one node each, every node running sshd with its own host key; yields a dict of paths."""
    testbed = bring_up(load_topology(TOPOLOGIES / "asymmetric.yaml"), prefix=prefix)
    lab = start_hosts(testbed, tmp_path, {"east": ["east-0"], "west": ["west-0"]})
    # The checks run from a node of the emulated network, as a controller inside it would.
    yield {"dir": tmp_path, "testbed": testbed, "inventory": lab.inventory, "known_hosts": lab.known_hosts}
    lab.stop()


def check(h: dict, *extra: str) -> subprocess.CompletedProcess:
    """`testbed hosts check` run from inside east-0 (our namespaces are reachable only from there)."""
    argv = [sys.executable, "-m", "testbed.cli", "hosts", "check", "--inventory", str(h["inventory"]),
            "--known-hosts", str(h["known_hosts"]), *extra]
    proc = h["testbed"].fabric.popen("east-0", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "COLUMNS": "200"})
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def connect_to_west(h: dict):
    """A Connection to west-0 from this process, its socket made inside east-0 (where west-0 is reachable)."""
    from pyroute2 import netns

    from testbed.fabric.ssh.connection import Connection
    from testbed.spec.inventory import load_inventory

    host = next(found for _, found in load_inventory(h["inventory"]).hosts() if found.name == "west-0")
    netns.pushns(h["testbed"].plan.node("east-0").ns)
    try:
        return Connection(host, host.key_path(h["dir"]), h["known_hosts"])
    finally:
        netns.popns()


def test_hosts_check_reports_each_host(hosts):
    proc = check(hosts, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["host"] for r in rows] == ["east-0", "west-0"] and all(r["reachable"] for r in rows)
    for row in rows:
        assert row["python"].startswith("3.") and row["torch"].startswith("2.") and row["tc"] != "missing"
        # one machine, one clock: what is left is the estimate's error (read through the kept shell: -1.3 to
        # +0.5 ms under load; through a new SSH command it was 79-238 ms)
        assert row["netem"] in ("yes", "no") and abs(row["clock_offset_ms"]) < 20
    table = check(hosts)
    assert "east-0" in table.stdout and "clock offset" in table.stdout


def test_unknown_host_key_is_refused_in_one_line(hosts):
    hosts["known_hosts"].write_text(hosts["known_hosts"].read_text().splitlines()[0] + "\n")  # forget west-0
    proc = check(hosts)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: host west-0 ({hosts['testbed'].plan.node('west-0').address}): unknown host key "
                      f"(not in {hosts['known_hosts']}); add it, or pass --accept-new to record new hosts"]


def test_accept_new_records_unknown_keys_but_never_changed_ones(hosts):
    real = hosts["known_hosts"].read_text()
    hosts["known_hosts"].write_text("")
    assert check(hosts, "--accept-new").returncode in (0, 1)
    recorded = hosts["known_hosts"].read_text()
    assert recorded.count("ssh-ed25519") == 2
    forged = keygen(hosts["dir"] / "forged").split()
    lines = real.splitlines()
    lines[1] = f"{lines[1].split()[0]} {forged[0]} {forged[1]}"  # west-0's key "changed"
    hosts["known_hosts"].write_text("\n".join(lines) + "\n")
    proc = check(hosts, "--accept-new")
    assert proc.returncode == 2 and "host key does not match" in proc.stderr and "refusing" in proc.stderr


def test_wrong_client_key_fails_in_one_line(hosts):
    keygen(hosts["dir"] / "stranger")
    inventory = yaml.safe_load(hosts["inventory"].read_text())
    inventory["dcs"]["west"][0]["key"] = str(hosts["dir"] / "stranger")
    hosts["inventory"].write_text(yaml.safe_dump(inventory))
    proc = check(hosts)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "authentication as root with key" in errors[0] and "failed" in errors[0]


def test_the_kept_open_shell_answers_each_script_and_replaces_a_dead_or_stuck_one(hosts):
    """Connection.script: output and exit status per script (set -e), `exit` ends only that script, a shell
    that died or did not answer in time is one line and the next script gets a fresh shell."""
    from testbed.fabric.ssh.connection import RemoteError

    connection = connect_to_west(hosts)
    with connection:
        connection.open_shell()
        assert connection.script(["echo one", "echo two >&2", "printf three"]) == Result(0, "one\ntwo\nthree", "")
        assert connection.script(["echo before", "false", "echo after"]) == Result(1, "before\n", "")
        assert connection.script(["exit 7"]).code == 7
        first = connection.script(["echo $$"]).stdout.strip()
        assert connection.script(["echo $$"]).stdout.strip() == first  # the same shell, kept open
        with pytest.raises(RemoteError, match=r"^host west-0: the remote shell ended"):
            connection.script(["kill -9 $$"])
        fresh = connection.script(["echo $$"])
        assert fresh.code == 0 and fresh.stdout.strip() != first
        with pytest.raises(RemoteError, match=r"did not answer within 0\.5 s"):
            connection.script(["sleep 2"], timeout=0.5)
        assert connection.script(["echo back"]) == Result(0, "back\n", "")


def test_bad_inventory_is_one_line(tmp_path, state_dir):
    bad = tmp_path / "inventory.yaml"
    bad.write_text("dcs:\n  east:\n    - {name: e1, address: not-an-ip, user: root, key: k, interface: eth0}\n")
    proc = run_cli("hosts", "check", "--inventory", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {bad}: dcs.east[0].address: expected an IP address, got 'not-an-ip'"


def test_up_stops_at_the_check_table_when_a_host_lacks_something(hosts):
    shadow = hosts["dir"] / "no-torch"  # east-0's python finds a torch that cannot be imported
    shadow.mkdir()
    (shadow / "torch.py").write_text("raise ImportError('built without torch')\n")
    wrapper = hosts["dir"] / "python-without-torch"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={shadow} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    inventory = yaml.safe_load(hosts["inventory"].read_text())
    inventory["dcs"]["east"][0]["python"] = str(wrapper)
    inventory["dcs"]["west"][0]["python"] = "/nonexistent/python3"
    hosts["inventory"].write_text(yaml.safe_dump(inventory))
    topology = hosts["dir"] / "pair.yaml"
    topology.write_text(yaml.safe_dump(pair_data(latency="5ms")))
    argv = [sys.executable, "-m", "testbed.cli", "up", str(topology), "--backend", "ssh",
            "--inventory", str(hosts["inventory"]), "--known-hosts", str(hosts["known_hosts"]), "--prefix", "tb-ssh-x-"]
    proc = hosts["testbed"].fabric.popen("east-0", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env={**os.environ, "COLUMNS": "200"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "west-0" in out and "missing" in out, err  # the table, with what is missing
    errors = [line for line in err.splitlines() if line.startswith("error")]
    # (torch is not tried without its python: the one cause, not its consequence)
    assert errors == ["error: 2 host(s) not ready: east-0: torch not importable (ImportError: built without torch); "
                      "west-0: /nonexistent/python3 not found"]
    assert not list(hosts["dir"].glob("state/tb-ssh-x*.json"))  # nothing was changed, nothing recorded


def test_commands_on_one_connection_never_half_close_their_channel(hosts, monkeypatch):
    """Connection.run, five times on one connection, with paramiko's half-close slowed down where its race lies
    (paramiko issue 1705: shutdown() marks the EOF sent under the channel's lock and sends it after; if the
    command ends in between, paramiko's thread sends the CLOSE first, and OpenSSH drops the whole connection on
    the EOF that follows). A run that half-closed its channel (exec_command's stdin file did) loses the
    connection here from its first command on."""
    import time

    import paramiko

    def slow_shutdown(channel: paramiko.Channel, how: int) -> None:
        with channel.lock:
            message = channel._send_eof() if how in (1, 2) else None
        time.sleep(0.2)  # the command ends meanwhile
        if message is not None:
            channel.transport._send_user_message(message)

    monkeypatch.setattr(paramiko.Channel, "shutdown", slow_shutdown)
    connection = connect_to_west(hosts)
    with connection:
        for index in range(5):
            assert connection.run(["echo", str(index)]) == Result(0, f"{index}\n", "")
        assert connection.run(["sh", "-c", "read line || echo no input"]).stdout == "no input\n"  # stdin: /dev/null
