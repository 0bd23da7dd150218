"""`testbed` command line: the commands (commands.py), the tables they print (render.py), and `main`, which
ends an unexpected exception in one line and the path of its full traceback (exit 70)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from typer.core import TyperOption

from testbed.api import settings
from testbed.cli.commands import app, err

EXIT_INTERNAL = 70  # an unexpected exception: a bug; the traceback is in a log file
_type_placeholder = TyperOption.display_type_rich


def _flag_has_no_placeholder(option: TyperOption, ctx: object) -> str | None:
    """Help shows `--dry-run`, not `--dry-run <bool>`: a flag takes no value (typer prints its type for all)."""
    return None if option.is_flag else _type_placeholder(option, ctx)


TyperOption.display_type_rich = _flag_has_no_placeholder


def crash_log_dir() -> Path:
    """Where tracebacks of unexpected failures go: $TESTBED_LOG_DIR, else $XDG_STATE_HOME/testbed."""
    if os.environ.get(settings.LOG_DIR):
        return Path(os.environ[settings.LOG_DIR])
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "testbed"


def write_crash_log(error: BaseException) -> Path | None:
    """The full traceback of `error` in a new file; None if it cannot be written."""
    import traceback
    from datetime import datetime

    try:
        path = crash_log_dir() / f"crash-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"testbed {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(error)))
        return path
    except OSError:
        return None


def main() -> None:
    """The `testbed` command: an unexpected exception ends in one line and the path of its traceback."""
    from rich.markup import escape

    try:
        app()
    except Exception as error:  # SystemExit and KeyboardInterrupt pass: typer already turned them into statuses
        path = write_crash_log(error)
        where = f"full traceback: {path}" if path else "the traceback could not be written"
        text = " ".join(str(error).split()) or "(no message)"
        err.print(f"[red]error:[/red] {escape(f'unexpected {type(error).__name__}: {text} ({where})')}",
                  highlight=False, soft_wrap=True)  # gloo's messages carry [/path:line], which is no markup
        sys.exit(EXIT_INTERNAL)
