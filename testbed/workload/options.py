"""Every knob of the workload: defined once in testbed.spec.strategies (types, ranges, defaults, which
strategies read it), re-exported here for the workload's modules."""

from __future__ import annotations

from testbed.spec.strategies import OPTIONS, Options, check_option, check_options

__all__ = ["OPTIONS", "Options", "check_option", "check_options"]
