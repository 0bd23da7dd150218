"""What a front end needs to show the api's answers, re-exported: the plan types `dry_run` returns (a table
each), units and labels in the project's words, the verdict lines of `check`.
Imported when shown (pydantic, pandas, rich), never by `import testbed.api`."""

from __future__ import annotations

from testbed.collect.gates import check_line, regression_line
from testbed.fabric.lifecycle import Testbed
from testbed.model.labels import key_label, value_label
from testbed.plan.containers import ContainersPlan
from testbed.plan.hosts import HostsPlan
from testbed.plan.network import NetworkPlan
from testbed.spec.units import format_duration, format_fraction

__all__ = ["ContainersPlan", "HostsPlan", "NetworkPlan", "Testbed", "check_line", "format_duration",
           "format_fraction", "key_label", "regression_line", "value_label"]
