"""The fabric's errors: str() is one line for the user (the CLI prints it and exits 2)."""

from __future__ import annotations


class FabricError(RuntimeError):
    """A fabric operation that failed."""


class NotSupported(FabricError):
    """An operation this backend cannot do (raised by it, so no caller asks which backend it has)."""
