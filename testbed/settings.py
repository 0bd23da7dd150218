"""What the harness reads from its own environment (not a rank's: testbed.rankenv), named once.

Standard library only: the CLI, the backends, the plans and the agents read it (agents never import fabric)."""

import os

PREFIX = "TESTBED_PREFIX"  # name prefix of every kernel object (`--prefix`)
STATE_DIR = "TESTBED_STATE_DIR"  # where state files live (testbed.fabric.state; a DC router's, in its container)
LOG_DIR = "TESTBED_LOG_DIR"  # where an unexpected failure's traceback is written (testbed.cli)
IMAGE = "TESTBED_IMAGE"  # the docker backend's image
OWNERS_DIR = "TESTBED_OWNERS_DIR"  # where the lock files of who holds a testbed live (testbed.fabric.ownership)
NEIGH_RECORD = "TESTBED_NEIGH_RECORD"  # where `up` records the ARP table limit it raised
ROUTER = "TESTBED_ROUTER"  # a DC router's configuration, RouterConfig as JSON (testbed.agents.router)
DELAY_LINE_RT = "TESTBED_DELAY_LINE_RT"  # 0: the delay line's worker runs without SCHED_FIFO (testbed.agents.delayline)
DELAY_LINE_COMPENSATE = "TESTBED_DELAY_LINE_COMPENSATE"  # 0: the delay line does not take its own path back
DELAY_LINE_BATCH = "TESTBED_DELAY_LINE_BATCH"  # 0: the delay line watches its queue all the time
DELAY_LINE_WARM = "TESTBED_DELAY_LINE_WARM"  # 0: the delay line does not warm its verdict's path before a release
GSO = "TESTBED_GSO"  # 0: the netns fabric leaves every interface's GSO size at the kernel's 64 KiB (plan/gso.py)
PROBE_RT = "TESTBED_PROBE_RT"  # 0: the probe agent's pinger runs without SCHED_FIFO (testbed.agents.probe)
FAULTS_RT = "TESTBED_FAULTS_RT"  # 0: the fault driver's thread runs without SCHED_FIFO (testbed.runner.faults)


def switched_on(name: str) -> bool:
    """Whether the switch variable `name` leaves its behaviour on: every switch here is on unless set to 0."""
    return os.environ.get(name, "1") != "0"
