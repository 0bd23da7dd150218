"""The one error a bad input file produces: file, field and problem on one line."""

from __future__ import annotations

from pathlib import Path


class SpecError(Exception):
    """A user file that cannot be used. str() is the single line the CLI prints."""

    def __init__(self, source: str | Path | None, field: str, problem: str) -> None:
        self.source = str(source) if source is not None else "<input>"
        self.field = field
        self.problem = problem
        where = f"{self.source}: {field}" if field else self.source
        super().__init__(f"{where}: {problem}")
