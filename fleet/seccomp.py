"""The process sandbox's seccomp filter (given to bwrap with `--seccomp FD`): no new user namespaces, as docker's
default profile refuses them. Without it a runner (uid 65534, no capabilities) could `unshare(CLONE_NEWUSER)` and
then make mount and network namespaces of its own inside the sandbox (issue 42).

A classic BPF program, assembled here (no libseccomp binding is installed): `unshare` and `clone` with
CLONE_NEWUSER get EPERM; `clone3` gets ENOSYS, as in docker's profile (its flags sit in a struct the filter cannot
read; libc then falls back to `clone`); any other ABI than the machine's own (i386 or x32 calls from an x86_64
process) gets EPERM for every call. Everything else is allowed: the sandbox's other walls are its namespaces, its
uid and its dropped capabilities.
"""
from __future__ import annotations

import errno
import os
import platform
import struct

CLONE_NEWUSER = 0x10000000
# (audit arch, unshare, clone, clone3) per machine; x86_64 also has the x32 ABI (syscall numbers with bit 30 set)
_ABI = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}
_X32_BIT = 0x40000000

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low 32 bits: little-endian)


def program(machine: str | None = None) -> bytes:
    """The filter as `struct sock_filter[]` bytes for this machine (or `machine`)."""
    machine = machine or platform.machine()
    if machine not in _ABI:
        raise OSError(f"no seccomp filter for machine {machine!r} (known: {', '.join(_ABI)})")
    arch, unshare, clone, clone3 = _ABI[machine]
    prog: list[tuple] = [  # (label, code, jt, jf, k): jt/jf name a later label, or are None (the next one)
        (None, _LD_W_ABS, None, None, _ARCH),
        (None, _JEQ, None, "deny", arch),
        (None, _LD_W_ABS, None, None, _NR),
        *([(None, _JGE, "deny", None, _X32_BIT)] if machine == "x86_64" else []),
        (None, _JEQ, "nosys", None, clone3),
        (None, _JEQ, "flags", None, unshare),
        (None, _JEQ, "flags", None, clone),
        (None, _RET, None, None, RET_ALLOW),
        ("flags", _LD_W_ABS, None, None, _ARG0),
        (None, _JSET, "deny", None, CLONE_NEWUSER),
        (None, _RET, None, None, RET_ALLOW),
        ("deny", _RET, None, None, RET_ERRNO | errno.EPERM),
        ("nosys", _RET, None, None, RET_ERRNO | errno.ENOSYS),
    ]
    where = {lab: i for i, (lab, *_rest) in enumerate(prog) if lab}
    out = b""
    for i, (_, code, jt, jf, k) in enumerate(prog):
        rel = [0 if j is None else where[j] - i - 1 for j in (jt, jf)]
        assert all(0 <= r < 256 for r in rel), (i, rel)
        out += struct.pack("<HBBI", code, rel[0], rel[1], k)
    return out


def filter_fd() -> int:
    """A pipe's read end holding the filter, for one bwrap (`--seccomp FD` reads it to its end): the caller passes
    it to the child and closes it after the start."""
    prog = program()
    r, w = os.pipe()
    try:
        os.write(w, prog)  # ~100 bytes: far below a pipe's buffer
    finally:
        os.close(w)
    return r
