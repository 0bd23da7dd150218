"""Progress of a run on the terminal (rich): cells done, the current cell's step, ETA."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class RunProgress:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TimeRemainingColumn(), console=console, transient=False)
        self.cells = None
        self.steps = None

    def start(self, total: int, done: int, run_dir: Path) -> None:
        self.console.print(f"[dim]results: {run_dir}[/dim]")
        self.bar.start()
        self.cells = self.bar.add_task("cells", total=total, completed=done)

    def cell(self, cell) -> None:
        if self.steps is not None:
            self.bar.remove_task(self.steps)
        self.steps = self.bar.add_task(f"  {cell.id}", total=max(1, cell.options.get("steps") or 1))

    def tick(self, metrics_dir: Path, steps: int) -> None:
        try:
            done = (metrics_dir / "rank0.jsonl").read_text().count('"event": "step"')
        except OSError:
            return
        self.bar.update(self.steps, completed=done)

    def done(self, cell, result: dict) -> None:
        self.bar.advance(self.cells)
        if result["status"] != "ok":
            self.console.print(f"[red]cell {cell.id} failed:[/red] {result['reason']}")
            for line in (result.get("log_tail") or [])[-6:]:
                self.console.print(f"[dim]    {line}[/dim]", highlight=False)

    def stop(self) -> None:
        self.bar.stop()
