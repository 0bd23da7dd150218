"""torchft's lighthouse, run inside a node: `python -m testbed.agents.lighthouse ARGS...` becomes (exec, the same
process) the `torchft_lighthouse` console script beside the interpreter running it, with ARGS.

Every backend starts a node's command with its own interpreter in place of the controller's (a container's
/opt/venv/bin/python, an ssh host's configured python), so the lighthouse is the one installed with the torch and
torchft its ranks import, on any backend; the controller's own path to the script would name nothing in a container
or on another host. Only the standard library.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

PROGRAM = "torchft_lighthouse"  # torchft's console script (its Rust lighthouse, in the wheel)


def program() -> Path:
    """The console script beside this interpreter (a venv's bin/), else the one on PATH."""
    beside = Path(sys.executable).parent / PROGRAM
    if beside.exists():
        return beside
    found = shutil.which(PROGRAM)
    if found:
        return Path(found)
    sys.exit(f"{PROGRAM} not found beside {sys.executable} nor on PATH: torchft is not installed here "
             "(pip install -e '.[torchft]')")


def main() -> None:
    path = program()
    sys.stdout.flush()
    os.execv(path, [str(path), *sys.argv[1:]])


if __name__ == "__main__":
    main()
