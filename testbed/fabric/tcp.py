"""Whether this host's kernel lets emulated nodes run the congestion control a topology names: a network
namespace (a container's too) may only pick one of the host's net.ipv4.tcp_allowed_congestion_control (EPERM
otherwise, root or not), and only one the kernel has (tcp_available_congestion_control)."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc/sys/net/ipv4")


def congestion_control_refusal(name: str, proc: Path = PROC) -> str | None:
    """Why the nodes cannot run `name` here, in one line with what would allow it (None: they can)."""
    try:
        available = (proc / "tcp_available_congestion_control").read_text().split()
        allowed = (proc / "tcp_allowed_congestion_control").read_text().split()
    except OSError as error:
        return f"cannot read this host's congestion controls ({error})"
    if name not in available:
        return (f"{name} is not in this kernel (available: {' '.join(available)}; a module, tcp_{name}, may "
                f"provide it: modprobe tcp_{name})")
    if name not in allowed:
        return (f"this host lets namespaces pick only {' '.join(allowed)} "
                f"(net.ipv4.tcp_allowed_congestion_control); to allow {name}, as root: "
                f"sysctl -w net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, name])}'")
    return None
