"""The Slurm backend: a testbed's nodes are Slurm nodes (a DC's by feature or mapping), shaped by a root step
(the site's Prolog/Epilog or `sudo -n`), ranks started by `srun` job steps."""

from testbed.fabric.slurm.backend import SlurmBackend

__all__ = ["SlurmBackend"]
