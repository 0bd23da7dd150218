"""The userspace delay line: one-way delay, jitter and loss on kernels without sch_netem.

Where: the direction a->b is delayed in b's gateway namespace, on packets arriving from a
(`iptables -t mangle -A PREROUTING -i to-a -j NFQUEUE`). PREROUTING still carries the kernel's receive
timestamp (ip_forward clears it before FORWARD), so the delay counts from when the packet really arrived,
not from when this process woke up. The rate limit of a->b is htb on a's egress, before the delay: with
a constant delay, shaping before or after the delay is the same link.

Semantics, same as the netem shaper: every packet is held latency + U(-jitter, +jitter) (never below zero,
and never before the packet ahead of it: FIFO, no reordering, like netem with a rate); loss drops each
packet independently with the configured probability (release.py). On lossy links the queue is bound without
the GSO flag so the kernel segments offload units (testbed.plan.gso) and loss acts per wire packet (costs CPU: 1.56 Gbit/s
at most measured here, bench/link_impairments.py); otherwise GSO units stay whole and are delayed as one.

Process model (`python -m testbed.agents.delayline supervise|worker CONFIG`): control.start_all() launches a
supervisor per gateway (detached, inside the namespace). The supervisor runs a worker, installs the iptables
rules once the worker has bound its queues, restarts the worker if it dies (counting restarts in its status
file) and forwards SIGHUP (re-read config: live `testbed shape`). The rules have no --queue-bypass: if the
supervisor itself is killed the link goes dark rather than silently undelayed, and the fabric reports it.

The supervisor and worker import only the standard library (and testbed's standard-library modules): they start
fast, also on ssh hosts.
"""
