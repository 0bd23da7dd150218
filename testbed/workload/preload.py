"""What a forking launcher (testbed.agents.forkserver) imports once before it forks ranks: torch, torch.distributed,
the training loop with every strategy, and the corpus, so that every rank forked from it shares their pages
instead of importing and reading them again. Importing this module starts no thread (forking copies only the
calling thread) and runs no torch operator; intra-op threads are the rank's to set (testbed.workload.run)."""

from __future__ import annotations

import torch
import torch.distributed  # c10d and gloo's bindings, for the ranks

import testbed.spec.strategies  # noqa: F401  (the command line's definitions; __main__ itself runs per rank)
from testbed.workload import data, run
from testbed.workload.model import PRESETS
from testbed.workload.strategies import diloco, dp, pipeline  # noqa: F401

torch.set_num_threads(1)  # no pool yet: with one thread, no operator below starts one
data.corpus()
data.tokens()
run.parameter_count(PRESETS["tiny"])  # the meta device's first use loads its Python registrations (seconds)
