"""testbed's use cases as functions that return plain data: the one door every front end goes through. The
`testbed` command is one (testbed.cli parses, calls these, prints); a notebook, a batch step or a test is
another, and copies no orchestration:

    from pathlib import Path
    from testbed import api

    print(api.plan(Path("experiments/quickstart.yaml"))["cells"][0])       # the cost model, no root
    with api.testbed(Path("topologies/two-dc.yaml"), prefix="nb-") as tb:  # brought up, always torn down
        print(api.status(prefix="nb-")["links"])
        print(api.probe(prefix="nb-", pings=50, flow_seconds=0)["pairs"])

Errors the user can fix are UserError (one line, an exit status). Importing this is cheap: every use case
imports what it needs when called; the types a front end shows are in testbed.api.types."""

from __future__ import annotations

from testbed import settings
from testbed.api.compose_file import compose
from testbed.api.emulate import emulate, emulate_dry_run
from testbed.api.errors import UserError, as_user_error, user_errors
from testbed.api.measure import calibrate, probe, seconds
from testbed.api.predictions import plan, whatif
from testbed.api.runs import cells, check, compare, report, run, run_command, run_progress
from testbed.api.slurm import slurm_hook
from testbed.api.testbeds import (
    backend,
    check_hosts,
    check_shaper,
    clean,
    clear_faults,
    dead_delay_lines_line,
    down,
    dry_run,
    exec_,
    fault,
    handle_signals,
    load_topology,
    reset_stop,
    shape,
    status,
    testbed,
    up,
)
from testbed.plan import DEFAULT_PREFIX

__all__ = ["DEFAULT_PREFIX", "UserError", "as_user_error", "backend", "calibrate", "cells", "check", "check_hosts",
           "check_shaper", "clean", "clear_faults", "compare", "compose", "dead_delay_lines_line", "down", "dry_run",
           "emulate", "emulate_dry_run",
           "exec_", "fault", "handle_signals", "load_topology", "plan", "probe", "report", "reset_stop", "run",
           "run_command", "run_progress", "seconds", "settings", "shape", "slurm_hook", "status", "testbed", "up", "user_errors",
           "whatif"]
