"""Remote hosts for the SSH tests: sshd inside namespaces this test creates, each with its own host key,
one client key and known_hosts generated per test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from testbed.fabric.lifecycle import Testbed
from tests.needs import SSHD


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class Hosts:
    """sshd running in `nodes` of a netns testbed; `inventory` groups them into DCs."""

    testbed: Testbed
    dir: Path
    inventory: Path
    known_hosts: Path
    procs: list = field(default_factory=list)

    def cli(self, node: str, *args: str, env: dict | None = None, timeout: float = 300,
            background: bool = False) -> subprocess.CompletedProcess | subprocess.Popen:
        """`testbed ARGS` run from inside `node` (our namespaces are reachable only from there)."""
        argv = [sys.executable, "-m", "testbed.cli", *args]
        proc = self.testbed.fabric.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env={**os.environ, "COLUMNS": "200", **(env or {})})
        if background:
            return proc
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"testbed {' '.join(args)} timed out:\n{out}\n{err}") from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def wait_listening(testbed: Testbed, node: str, proc, log: Path, timeout: float = 30.0) -> None:
    """Until sshd in `node` accepts TCP connections. A fixed sleep here raced sshd's start on a loaded machine:
    the first SSH connection of a test was then refused (tests/fabric/ssh failed 2 of 10 right after other runs)."""
    from pyroute2 import netns

    address = testbed.plan.node(node).address
    deadline = time.monotonic() + timeout
    while True:
        netns.pushns(testbed.plan.node(node).ns)
        try:
            sock = socket.socket()  # created inside the node's namespace, where its address is reachable
        finally:
            netns.popns()
        try:
            sock.settimeout(1.0)
            sock.connect((address, 22))
            return
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(f"sshd in {node} exited ({proc.returncode}): {log.read_text()[-500:]}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"sshd in {node} not listening after {timeout:.0f}s") from None
            time.sleep(0.05)
        finally:
            sock.close()


def start_hosts(testbed: Testbed, tmp_path: Path, dcs: dict[str, list[str]], **host_fields) -> Hosts:
    """Start sshd in every node named in `dcs` (DC name -> nodes) and write inventory and known_hosts."""
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    client_key = tmp_path / "client"
    (tmp_path / "authorized_keys").write_text(keygen(client_key) + "\n")
    known, procs = [], []
    for node in [n for nodes in dcs.values() for n in nodes]:
        address = testbed.plan.node(node).address
        host_key = tmp_path / f"host-{node}"
        host_pub = keygen(host_key)
        config = tmp_path / f"sshd-{node}.conf"
        config.write_text(f"Port 22\nListenAddress {address}\nHostKey {host_key}\n"
                          f"PidFile {tmp_path}/sshd-{node}.pid\nAuthorizedKeysFile {tmp_path}/authorized_keys\n"
                          "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                          "StrictModes no\nUsePAM no\nMaxSessions 100\nMaxStartups 100\n"
                          "Subsystem sftp internal-sftp\n"
                          # bash runs ~/.bashrc for a command sent over SSH unless SHLVL says it is nested: the
                          # test hosts are this machine, whose root ~/.bashrc may be anything (here `pyenv rehash`,
                          # 0.11 s a command, serialised on a lock file), and not what the tests are about
                          "SetEnv SHLVL=1\n")
        log = open(tmp_path / f"sshd-{node}.log", "wb")
        procs.append(testbed.fabric.popen(node, [SSHD, "-D", "-e", "-f", str(config)], stdout=log,
                                          stderr=subprocess.STDOUT))
        log.close()
        known.append(f"{address} {' '.join(host_pub.split()[:2])}")
    (tmp_path / "known_hosts").write_text("\n".join(known) + "\n")
    inventory = {"dcs": {dc: [{"name": node, "address": testbed.plan.node(node).address, "user": "root",
                               "key": str(client_key), "interface": "eth0", "python": sys.executable, **host_fields}
                              for node in nodes] for dc, nodes in dcs.items()}}
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inventory))
    for node, proc in zip([n for nodes in dcs.values() for n in nodes], procs):
        wait_listening(testbed, node, proc, tmp_path / f"sshd-{node}.log")
    return Hosts(testbed, tmp_path, tmp_path / "inventory.yaml", tmp_path / "known_hosts", procs)
