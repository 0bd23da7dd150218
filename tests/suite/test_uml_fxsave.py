"""tests/support/uml/fxsave.py's seccomp filter: ptrace(PTRACE_GETREGSET, _, NT_X86_XSTATE, _) fails with EIO (so UML 6.1
falls back to the FXSAVE state on CPUs with AMX), every other ptrace and syscall goes through unchanged."""

from __future__ import annotations

import subprocess
import sys

from tests.support.uml import fxsave

PROBE = """
import ctypes, errno, os, sys
sys.path.insert(0, {root!r})
from tests.support.uml import fxsave
libc = ctypes.CDLL(None, use_errno=True)
def ptrace(request, addr):
    ctypes.set_errno(0)
    libc.ptrace(ctypes.c_long(request), ctypes.c_long(999999), ctypes.c_void_p(addr), ctypes.c_void_p(0))
    return errno.errorcode.get(ctypes.get_errno(), "0")
if {install}:
    fxsave.install()
print(ptrace(fxsave.PTRACE_GETREGSET, fxsave.NT_X86_XSTATE), ptrace(fxsave.PTRACE_GETREGSET, 1), os.getpid() > 0)
"""


def probe(install: bool) -> list[str]:
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=root, install=install)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return out.split()


def test_only_the_xstate_regset_is_refused():
    # no such process: ESRCH, whatever the request, until the filter answers the xstate one itself
    assert probe(False) == ["ESRCH", "ESRCH", "True"]
    assert probe(True) == ["EIO", "ESRCH", "True"]


def test_needed_reads_the_cpu_flags(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(fxsave, "Path", lambda _: cpuinfo)
    cpuinfo.write_text("processor : 0\nflags : fpu sse avx512f amx_bf16 amx_tile\n")
    assert fxsave.needed()
    cpuinfo.write_text("processor : 0\nflags : fpu sse avx512f\n")
    assert not fxsave.needed()
