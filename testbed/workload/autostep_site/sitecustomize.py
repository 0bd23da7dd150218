"""Python imports this at start-up in every process of a bring-your-own command's rank: the runner puts this
directory first on the rank's PYTHONPATH. It installs testbed/workload/autostep.py's step hook (loaded by its path:
the rank's interpreter need not have testbed), then runs the sitecustomize this one hides, if any (Debian's, a
venv's), as Python would have."""

import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hidden():
    """The sitecustomize module the rest of sys.path has (the one Python would have imported without this)."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    return importlib.machinery.PathFinder.find_spec("sitecustomize", rest)


try:
    _load("_testbed_autostep", os.path.join(os.path.dirname(HERE), "autostep.py")).install()
except Exception as error:  # never the script's failure: it trains without step metrics
    sys.stderr.write(f"testbed: no automatic step metrics ({type(error).__name__}: {error})\n")

_spec = _hidden()
if _spec is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _module
    _spec.loader.exec_module(_module)
