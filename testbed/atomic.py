"""Write a file so that readers see the old content or the new, never half of it (tmp + rename)."""

from __future__ import annotations

import os
from pathlib import Path


def write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
