"""Run Debian's user-mode Linux 6.1 on a CPU with AMX: exec the kernel under a seccomp filter that fails its
PTRACE_GETREGSET of NT_X86_XSTATE, so it keeps its processes' floating-point state through
PTRACE_GETFPREGS/SETFPREGS (the 512-byte FXSAVE area: x87, SSE, MXCSR) instead.

Why: with AMX the host's XSAVE area (8 KB of tile data included) is larger than the buffer UML 6.1 hands to
PTRACE_SETREGSET, and the host refuses any other size (EFAULT), so init dies at once ("userspace - ptrace set
fp regs failed, errno = 14", "Attempted to kill init"; measured 2026-11-25 on a Xeon with amx_tile; Debian
trixie's UML 6.12 fails the same way, sid's 7.2 boots but has no IPv4 iptables). UML checks once, at start,
whether that regset answers, and falls back to FXSAVE when it does not. What FXSAVE leaves out (the upper
halves of the AVX registers) is not kept across UML's traps, so the harness turns AVX off in what runs
inside (GUEST_ENV): any other program that uses AVX there may compute wrong values.

    python -m tests.support.uml.fxsave /usr/bin/linux.uml ARG...
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from pathlib import Path

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
AUDIT_ARCH_X86_64, NR_PTRACE, PTRACE_GETREGSET, NT_X86_XSTATE, EIO = 0xC000003E, 101, 0x4204, 0x202, 5
LD_ABS, JEQ, RET = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
ERRNO, ALLOW = 0x00050000, 0x7FFF0000

# seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low word first); ptrace(request, pid, addr, data)
FILTER = [
    (LD_ABS, 0, 0, 4), (JEQ, 0, 7, AUDIT_ARCH_X86_64),
    (LD_ABS, 0, 0, 0), (JEQ, 0, 5, NR_PTRACE),
    (LD_ABS, 0, 0, 16), (JEQ, 0, 3, PTRACE_GETREGSET),
    (LD_ABS, 0, 0, 32), (JEQ, 0, 1, NT_X86_XSTATE),
    (RET, 0, 0, ERRNO | EIO),
    (RET, 0, 0, ALLOW),
]
# every process inside: glibc's string and memory functions, numpy's and torch's kernels without AVX (what
# FXSAVE does not keep: measured, modprobe's insert of a module read with AVX copies failed with EINVAL)
GUEST_ENV = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512BW,-AVX512VL,-AVX512DQ,-AVX512CD,"
                               "-AVX_Fast_Unaligned_Load,-EVEX",
             "NPY_DISABLE_CPU_FEATURES": "AVX512_SPR AVX512_ICL X86_V4 X86_V3",  # numpy 2's dispatch groups
             "ATEN_CPU_CAPABILITY": "default"}


def needed() -> bool:
    """Whether this CPU has AMX (its XSAVE area is larger than UML 6.1 can set back)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return "amx_tile" in flags.split()


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """This process and what it execs: ptrace(PTRACE_GETREGSET, _, NT_X86_XSTATE, _) fails with EIO."""
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in FILTER))
    program = _Program(len(FILTER), ctypes.addressof(code))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


if __name__ == "__main__":
    install()
    os.execv(sys.argv[1], sys.argv[1:])
