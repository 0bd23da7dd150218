"""Where a delay line keeps its files, and its status file's content: what the supervisor and worker write and
the controller (or a docker router) reads. All files sit next to the config, named after it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.atomic import write_text

MODULE = "testbed.agents.delayline"


@dataclass(frozen=True)
class DelayLineFiles:
    config: Path  # the directions it serves (testbed.plan.delayline.dump_config)
    status: Path  # DelayLineStatus, written by the supervisor
    stats: Path  # release figures, written by the worker every second and on SIGUSR2
    log: Path  # both processes' output

    @classmethod
    def named(cls, directory: Path, name: str) -> DelayLineFiles:
        """The files of the delay line `name` (a gateway namespace, or a router) in `directory`."""
        return cls.of_config(directory / f"{name}.delayline.json")

    @classmethod
    def of_config(cls, config: str | Path) -> DelayLineFiles:
        config = Path(config)
        base = config.with_suffix("")
        return cls(config, base.with_suffix(".delayline.status"), base.with_suffix(".delayline.stats"),
                   base.with_suffix(".delayline.log"))


@dataclass
class DelayLineStatus:
    """What the supervisor says about itself: its pid, its worker's, restarts, whether the rules are in."""

    supervisor: int
    worker: int | None = None
    restarts: int = 0
    ready: bool = False
    rules: list[str] = field(default_factory=list)

    def write(self, path: Path) -> None:
        write_text(path, json.dumps(asdict(self)))

    @classmethod
    def parse(cls, text: str) -> DelayLineStatus | None:
        """None for no status yet (an empty or foreign file)."""
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError):
            return None

    @classmethod
    def read(cls, path: Path) -> DelayLineStatus | None:
        """None while the supervisor has not written one (it is written atomically: never torn)."""
        try:
            return cls.parse(path.read_text())
        except OSError:
            return None
