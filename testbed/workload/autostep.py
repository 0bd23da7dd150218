"""Step metrics from a training script nobody changed: a global optimizer step hook, installed at the rank's start.

`testbed run --topology T -- python train.py` puts testbed/workload/autostep_site first on every rank's PYTHONPATH;
its sitecustomize.py loads this file by its path (the rank's interpreter may not have testbed installed) and calls
install(). Nothing but testbed/steplog.py (standard library, and rankenv through it) is loaded then: when
torch.optim.optimizer is first imported (by `import torch`), a global post-step hook is registered
(torch.optim.optimizer.register_optimizer_step_post_hook), and every step of the first optimizer that steps
becomes one line of testbed.steplog's format in $TESTBED_METRICS_DIR/rank<RANK>.jsonl:

    {"event": "step", "step": 3, "rank": 0, "wall_s": 0.41, "tokens": 2048.0, "loss": null, "source": "autostep"}

- wall_s: from the previous step's end (step 0: from the hook's registration, so it carries start-up; the warm-up
  steps are left out of every figure);
- tokens: $TESTBED_TOKENS_PER_STEP (`testbed run --tokens-per-step N`: all ranks together) over $WORLD_SIZE, else
  null (step times and efficiency still, no tokens/s);
- only the first optimizer that steps counts (a script with two optimizers, or one wrapping another, steps once per
  step of the first);
- a script that reports its own steps with testbed.steplog says more: testbed.collect then reads its lines and
  leaves these out (testbed.steplog.step_records).

Also: a rank that dies because its interpreter has no torch says which interpreter it ran (INTERPRETER_NOTE and
sys.executable, the last line of its log: the runner puts it in the cell's reason).

Standard library only at import (torch is the script's): this file runs in every Python process a rank starts."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any

OPTIMIZER_MODULE = "torch.optim.optimizer"
INTERPRETER_NOTE = "testbed: no torch in the interpreter this rank ran: "  # then its path (the runner reads it)


def _steplog() -> Any:
    """testbed/steplog.py, loaded by its path (testbed need not be importable by the rank's interpreter)."""
    loaded = sys.modules.get("testbed.steplog")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("_testbed_steplog", Path(__file__).resolve().parents[1] / "steplog.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


steplog = _steplog()
rankenv = steplog.rankenv  # the one steplog loaded (by its path, where the interpreter has no testbed)


def tokens_per_rank(environ: dict[str, str] | os._Environ = os.environ) -> float | None:
    """$TESTBED_TOKENS_PER_STEP (all ranks together) over $WORLD_SIZE; None when not given."""
    total = environ.get(rankenv.TOKENS_PER_STEP)
    if not total:
        return None
    return float(total) / max(1, int(environ.get("WORLD_SIZE", "1")))


class AutoStep:
    """The hook: one steplog line per step of the first optimizer that steps (opened at that first step, so a
    Python process that never steps writes nothing)."""

    def __init__(self) -> None:
        self.clock = time.perf_counter()
        self.optimizer: weakref.ref | None = None
        self.log: Any = None
        self.source = ""
        self.tokens = tokens_per_rank()

    def __call__(self, optimizer: Any, args: Any = (), kwargs: Any = None) -> None:
        if self.optimizer is None:
            self.optimizer = weakref.ref(optimizer)
            self.source = steplog.AUTOMATIC
            self.log = steplog.StepLog(source=self.source, python=sys.executable, optimizer=type(optimizer).__name__)
        elif self.optimizer() is not optimizer:
            return
        now = time.perf_counter()
        self.log.step(self.tokens, wall_s=now - self.clock, source=self.source)
        self.clock = now


class _OnImport:
    """A meta path finder that runs `then(module)` once `name` is imported (the import itself unchanged)."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once; the finders after it find the module
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                self.then(module)
            except Exception as error:  # never the script's failure: it trains without step metrics
                print(f"testbed: no automatic step metrics ({type(error).__name__}: {error})", file=sys.stderr)

        loader.exec_module = exec_module  # this module's loader only (one per module)
        return spec


def _register(optimizer_module: Any) -> None:
    register = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
    if register is None:
        print("testbed: no automatic step metrics (this torch has no global optimizer step hook: 2.0 or later has)",
              file=sys.stderr)
        return
    register(AutoStep())


def _excepthook(previous: Any) -> Any:
    def hook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        previous(kind, value, traceback)
        if issubclass(kind, ModuleNotFoundError) and (getattr(value, "name", None) or "").split(".")[0] == "torch":
            print(INTERPRETER_NOTE + sys.executable, file=sys.stderr, flush=True)

    return hook


def install() -> None:
    """Register the step hook when torch's optimizers are imported; name the interpreter if torch is missing."""
    if OPTIMIZER_MODULE in sys.modules:
        _register(sys.modules[OPTIMIZER_MODULE])
    else:
        sys.meta_path.insert(0, _OnImport(OPTIMIZER_MODULE, _register))
    sys.excepthook = _excepthook(sys.excepthook)
