"""What a Slurm site's Prolog and Epilog run (`testbed slurm prolog|epilog`, installed by its admin for --backend
slurm): shape this node as a testbed job's plan says at the job's start, restore it at its end."""

from __future__ import annotations


def slurm_hook(which: str) -> int:
    """Run as slurmd's Prolog (`prolog`) or Epilog (`epilog`) with the environment it gives; the exit status (0
    unless called outside slurmd: a bad plan never drains a node)."""
    from testbed.fabric.slurm.prolog import main

    return main([which])
