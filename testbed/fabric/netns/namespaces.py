"""Our network namespaces on this machine: list them, run sysctls inside one, remove them with their processes
(no state needed: everything is found by its prefix)."""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pyroute2.config
from pyroute2 import IPRoute, netns

from testbed.plan import owned_by
from testbed.waiting import alive, wait_for

# A netlink socket in a namespace comes from a child process pyroute2 forks (NetNS): 6 ms on a host, 1 s inside
# user-mode Linux, where pyroute2's 2 s for the child's answer (10 s in all) ran out beside 25 % CPU steal
# (2026-12-02: "could not start netns socket within timeout" in the suite's netem tests). Each retry forks again,
# so a longer wait for one answer is what helps; a healthy host never comes near either bound.
pyroute2.config.default_communicate_timeout = max(pyroute2.config.default_communicate_timeout, 15)
pyroute2.config.default_create_socket_timeout = max(pyroute2.config.default_create_socket_timeout, 45)


def list_namespaces(prefix: str) -> list[str]:
    """The namespaces of the testbed with this prefix (not those of a longer prefix that starts with it)."""
    return sorted(name for name in netns.listnetns() if owned_by(name, prefix))


@contextmanager
def entered(ns: str) -> Iterator[None]:
    """This thread inside namespace `ns` for the block, and back in its own after it.

    Not pyroute2's pushns/popns: they keep one stack for every thread and save the namespace of the process's main
    thread (/proc/self), so two threads entering at once can pop each other's entry and one stays inside. This
    saves and restores the calling thread's own (/proc/thread-self)."""
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        netns.setns(ns, flags=0)
        try:
            yield
        finally:
            netns.setns(saved, flags=0)
    finally:
        os.close(saved)


def set_sysctls(ns: str, values: dict[str, str]) -> None:
    """Write /proc/sys entries as seen from inside `ns` (the net sysctls follow the thread's namespace).

    IPv6 entries are skipped on a kernel without IPv6: they only switch it off inside our namespaces."""
    with entered(ns):
        for key, value in values.items():
            if key.startswith("net/ipv6/") and not os.path.isdir("/proc/sys/net/ipv6"):
                continue
            with open(f"/proc/sys/{key}", "w") as out:
                out.write(value)


def kill_namespace_processes(names: list[str], timeout: float = 3.0) -> int:
    """SIGTERM, then SIGKILL, every process living in the namespaces `names`; returns how many there were."""
    wanted = set(names)
    pids = [pid for ns, members in netns.ns_pids().items() if ns in wanted for pid in members]
    if not pids:
        return 0
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 1.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        wait_for(lambda: not any(alive(pid) for pid in pids), wait)
    return len(pids)


def remove(prefix: str) -> list[str]:
    """Remove the namespaces of the testbed with this prefix (and their processes); works with no state at all.

    Interfaces live only inside our namespaces (veths are created there directly), so removing the
    namespaces removes them; a `prefix*` interface found in the host namespace is deleted too.
    """
    names = list_namespaces(prefix)
    kill_namespace_processes(names)
    for name in names:
        try:
            netns.remove(name)
        except OSError as error:
            if error.errno != errno.ENOENT:
                raise
    with IPRoute() as host:
        for link in host.get_links():
            ifname = link.get_attr("IFLA_IFNAME") or ""
            if ifname.startswith(prefix):
                host.link("del", index=link["index"])
                names.append(ifname)
    return names
