"""SSH connections to inventory hosts (paramiko).

Security: host keys are verified against a known_hosts file and unknown hosts are rejected unless the
caller asks to accept new ones (a host whose key *changed* is always rejected); authentication is by key
only (no agent, no password, no keys found by guessing); remote commands are built with shlex.join from
argument lists, so inventory values cannot inject shell syntax; nothing secret is logged.
"""

from __future__ import annotations

import shlex
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from testbed.fabric.errors import FabricError
from testbed.fabric.kept_shell import ShellEnded, run_script
from testbed.spec.inventory import HostSpec


class RemoteError(FabricError):
    """A host that cannot be used; str() is one line naming the host."""


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


_known_hosts_lock = threading.Lock()  # connections opened together (hosts checked at once) add to one file


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Like OpenSSH's StrictHostKeyChecking=accept-new: record unknown hosts, never changed ones. The key is
    added to the file as it is now (not to the copy this client read when it started: a connection opened
    beside it may have recorded its own host since)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _known_hosts_lock:
            recorded = paramiko.HostKeys(str(self.path)) if self.path.exists() else paramiko.HostKeys()
            recorded.add(hostname, key.get_name(), key)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            recorded.save(str(self.path))


class Connection:
    """An open SSH session to one host."""

    def __init__(self, host: HostSpec, key_file: Path, known_hosts: Path, accept_new: bool = False,
                 timeout: float = 10.0) -> None:
        self.host = host
        label = f"host {host.name} ({host.address})"
        client = paramiko.SSHClient()
        if known_hosts.exists():
            client.load_host_keys(str(known_hosts))
        client.set_missing_host_key_policy(_AcceptNew(known_hosts) if accept_new else paramiko.RejectPolicy())
        if not key_file.exists():
            raise RemoteError(f"{label}: key file {key_file} does not exist")
        try:
            client.connect(host.address, port=host.port, username=host.user, key_filename=str(key_file),
                           look_for_keys=False, allow_agent=False, timeout=timeout, banner_timeout=timeout,
                           auth_timeout=timeout)
        except paramiko.BadHostKeyException:
            raise RemoteError(f"{label}: host key does not match {known_hosts} (changed key: refusing to connect)") \
                from None
        except paramiko.SSHException as error:
            text = str(error)
            if "not found in known_hosts" in text:
                raise RemoteError(f"{label}: unknown host key (not in {known_hosts}); add it, or pass --accept-new "
                                  "to record new hosts") from None
            if isinstance(error, paramiko.AuthenticationException):
                raise RemoteError(f"{label}: authentication as {host.user} with key {key_file} failed") from None
            raise RemoteError(f"{label}: SSH failed: {text}") from None
        except (TimeoutError, OSError) as error:
            raise RemoteError(f"{label}: cannot connect to port {host.port}: {getattr(error, 'strerror', None) or error}") \
                from None
        self.client = client
        self._sftp: paramiko.SFTPClient | None = None
        self._shell: paramiko.Channel | None = None
        self._shell_lock = threading.Lock()

    def sftp(self) -> paramiko.SFTPClient:
        """One SFTP session per connection, opened on first use."""
        if self._sftp is None:
            try:
                self._sftp = self.client.open_sftp()
            except paramiko.SSHException as error:
                raise RemoteError(f"host {self.host.name}: SFTP is not available ({error}); sshd needs its "
                                  "`Subsystem sftp` line") from None
        return self._sftp

    def run(self, argv: list[str], timeout: float = 60.0, sudo: bool | None = None) -> Result:
        """Run argv (no shell interpretation of its items); with sudo, as root without a password prompt.

        Its stdin is /dev/null and our end of the channel is never half-closed. paramiko's exec_command hands
        back a stdin file whose release sends the channel's EOF; that EOF can go out after the CLOSE paramiko's
        own thread sends when the command ends (shutdown() sends outside its lock: paramiko issue 1705), and
        OpenSSH then drops the whole connection ("ieof packet referred to nonexistent channel"): seen here as
        `down` failing with "SSH: Unable to open channel" while the disk was busy."""
        command = shlex.join(argv) + " </dev/null"
        if self.host.sudo if sudo is None else sudo:
            command = "sudo -n " + command
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(f"host {self.host.name}: the SSH connection is closed")
        channel = transport.open_session(timeout=timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            out = channel.makefile("rb").read().decode(errors="replace")
            err = channel.makefile_stderr("rb").read().decode(errors="replace")
            code = channel.recv_exit_status()
        finally:
            channel.close()  # EOF and CLOSE together, under the channel's lock
        return Result(code, out, err)

    def open_shell(self) -> None:
        """Start this connection's kept-open `sh` (as root where the host says sudo), which `script` writes
        to, and wait until it answers (sshd's session set-up and the shell's start take 0.1-0.3 s here)."""
        self.script(["true"])

    def _open_shell(self) -> paramiko.Channel:
        if self._shell is None or self._shell.closed or self._shell.exit_status_ready():
            channel = self.client.get_transport().open_session()  # type: ignore[union-attr]
            channel.exec_command("sudo -n sh" if self.host.sudo else "sh")
            self._shell = channel
        return self._shell

    def script(self, lines: list[str], timeout: float = 60.0) -> Result:
        """Run shell `lines` (set -e) in the kept-open shell: no new SSH session, so a change takes a round
        trip and the commands' own time (an exec costs 0.1-0.5 s here: sshd's session set-up and a new shell).
        stdout and stderr come back together in `stdout`."""
        with self._shell_lock:
            channel = self._open_shell()

            def recv(seconds: float) -> bytes:
                channel.settimeout(seconds)
                try:
                    return channel.recv(65536)
                except TimeoutError:
                    return b""

            try:
                code, output = run_script(channel.sendall, recv, lines, timeout)
            except ShellEnded as ended:  # a fresh shell next time; what the shell said last, if anything
                said = channel.recv_stderr(4096).decode(errors="replace").strip().splitlines()[-1:] \
                    if channel.recv_stderr_ready() else []
                channel.close()
                self._shell = None
                raise RemoteError(f"host {self.host.name}: the remote shell "
                                  + (f"ended: {said[0]}" if said else str(ended))) from None
        return Result(code, output, "")

    def check(self, argv: list[str], what: str, timeout: float = 60.0, sudo: bool | None = None) -> str:
        """run(), raising RemoteError (one line naming the host and `what`) on a non-zero exit."""
        out = self.run(argv, timeout=timeout, sudo=sudo)
        if out.code != 0:
            raise self.failure(out, what)
        return out.stdout

    def failure(self, out: Result, what: str) -> RemoteError:
        """One line naming the host, `what` failed and the last line the command printed (or its exit code)."""
        detail = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or [f"exit code {out.code}"]
        return RemoteError(f"host {self.host.name}: {what} failed: {detail[0]}")

    def close(self) -> None:
        if self._shell is not None:
            self._shell.close()
        if self._sftp is not None:
            self._sftp.close()
        self.client.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
