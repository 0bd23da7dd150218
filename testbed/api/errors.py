"""The one error a front end shows: UserError, a problem the user can fix, as one line (str()) with the exit
status a command ends with. The api turns the layers' own errors (SpecError, FabricError, a kernel's or an SSH
server's refusal, a missing privilege) into it, so a front end catches one type and prints one line."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class UserError(Exception):
    """A problem the user can fix. str(): one line naming the file and field (or option); `code`: the exit
    status (2: refused before anything ran; 1: it ran and failed); `rows`: hosts to show first (an inventory
    refused), as testbed.fabric.ssh.checks.HostCheck rows."""

    def __init__(self, message: str, code: int = 2, rows: list[Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.rows = rows


def as_user_error(error: BaseException) -> UserError | None:
    """`error` in the user's words, or None when it is not the user's to fix (a bug: it goes on up).
    Nothing heavy is imported to tell: pyroute2 and paramiko errors only exist once those are loaded."""
    if isinstance(error, UserError):
        return error
    from testbed.fabric.errors import FabricError
    from testbed.spec.errors import SpecError

    if isinstance(error, (SpecError, FabricError)):
        return UserError(str(error), rows=getattr(error, "rows", None))
    if "pyroute2" in sys.modules:
        from pyroute2 import NetlinkError

        if isinstance(error, NetlinkError):
            return UserError(f"the kernel refused a request: {os.strerror(error.code)} ({error})")
    if isinstance(error, PermissionError):
        detail = " ".join(str(x) for x in (error.strerror or error, error.filename or "") if x).strip()
        return UserError(f"permission denied ({detail}): network namespaces and tc need root "
                         "(or CAP_SYS_ADMIN and CAP_NET_ADMIN)")
    if type(error).__module__.startswith("paramiko"):  # a connection lost mid-way, say
        return UserError(f"SSH: {error or type(error).__name__}")
    return None


@contextmanager
def user_errors() -> Iterator[None]:
    """Raise what the body raises as a UserError where it is the user's to fix; anything else unchanged
    (KeyboardInterrupt included: the caller says `interrupted`)."""
    try:
        yield
    except UserError:
        raise
    except Exception as error:
        translated = as_user_error(error)
        if translated is None:
            raise
        raise translated from error
