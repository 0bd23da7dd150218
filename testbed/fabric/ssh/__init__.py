"""The ssh backend: real hosts over SSH (paramiko), shaped with tc on their interfaces."""

from testbed.fabric.ssh.backend import SshBackend

__all__ = ["SshBackend"]
