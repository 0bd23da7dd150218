"""The embedded backend: every node, DC switch and DC gateway a network namespace on this machine."""

from testbed.fabric.netns.backend import NetnsBackend

__all__ = ["NetnsBackend"]
