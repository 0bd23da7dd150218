"""How large a unit every interface of a netns testbed passes whole: the GSO/GRO size limit, IPv4 (BIG TCP).

TCP hands its stack units of about 1 ms of its pacing rate (tcp_tso_autosize), capped by the interface's
`gso_ipv4_max_size`, 64 KiB by default; a veth or a bridge passes them whole, and so do the delay line's queue and
its verdicts. The delay line's work is per unit (a wake-up, a verdict, the kernel carrying the unit on): at
2.5 Gbit/s, 64 KiB units are 4 300 a second and cost it 18-23 % of a core on this project's 2-core machine; 156 kB
units, 1 800 a second and 8-10 % (2026-11-29, bench/link_fidelity.py). Larger units also make traffic burstier at
the scale of one unit, so the cap is what the fastest inter-DC link carries in UNIT_TIME, as 64 KiB was at
1 Gbit/s: links up to 1 Gbit/s keep the kernel's default. One size for every interface: a unit that meets a smaller
cap on its way is cut into packets of the MTU there, in software (160 000 a second at 2 Gbit/s). Set at `up` from
the topology's links: a sweep of `bandwidth` or a live `shape` keeps it."""

from __future__ import annotations

from testbed.spec.topology import Topology

KERNEL_DEFAULT = 65536  # bytes: gso_ipv4_max_size of a new interface
KERNEL_MOST = 524280  # bytes: the most a veth or a bridge takes (its tso_max_size)
UNIT_TIME = 0.5e-3  # seconds of the fastest inter-DC link one unit may take (64 KiB at 1 Gbit/s: 0.52 ms)


def gso_max_bytes(topology: Topology) -> int:
    """The GSO/GRO size limit every interface of `topology`'s testbed gets (bytes): UNIT_TIME of its fastest
    inter-DC link's rate, within [KERNEL_DEFAULT, KERNEL_MOST]; a link without a rate cap counts as the most."""
    rates = [params.bandwidth for link in topology.links for params in (link.forward(), link.backward())]
    if not rates:
        return KERNEL_DEFAULT
    fastest = max(float("inf") if rate is None else rate for rate in rates)
    return int(min(max(fastest / 8 * UNIT_TIME, KERNEL_DEFAULT), KERNEL_MOST))
