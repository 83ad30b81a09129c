"""Run a command under the seccomp filters examples/corral.service asks systemd for.

    python -m tests.e2e.syscall_sandbox -- corral serve --config FILE

Three filters, built with libseccomp (which systemd itself links) and inherited across
exec and fork, so the server and every worker it spawns run under them:

- SystemCallFilter=@system-service ~@privileged: an allow list resolved by the installed
  systemd (`systemd-analyze syscall-filter`), so it is the same list systemd would load.
  A call outside it kills the process (SIGSYS) rather than failing with EPERM as the unit's
  SystemCallErrorNumber=EPERM would: a test must see a denied call, not a fallback path.
- MemoryDenyWriteExecute=yes, as systemd 252 implements it: mmap with PROT_WRITE|PROT_EXEC,
  mprotect/pkey_mprotect with PROT_EXEC, and shmat with SHM_EXEC fail with EPERM.
- RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6: socket() with any other family fails
  with EAFNOSUPPORT.

Like NoNewPrivileges=yes, it sets no_new_privs (libseccomp does, before loading).
The unit's other settings (mount namespaces, users, devices) need systemd to apply; these
are the ones that decide whether llama.cpp, numpy and llguidance can run at all.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket
import subprocess
import sys
from typing import Iterable

SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
SCMP_CMP_GT = 6
SCMP_CMP_MASKED_EQ = 7
SHM_EXEC = 0o100000

ALLOW_SETS = ["@system-service"]
DENY_SETS = ["@privileged"]
ADDRESS_FAMILIES = sorted({socket.AF_UNIX, socket.AF_INET, socket.AF_INET6})


def scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp)
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def syscall_set(name: str) -> set[str]:
    """The system calls in a systemd set such as @system-service, nested sets expanded, as
    the installed systemd lists them."""
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, check=True
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        calls |= syscall_set(item) if item.startswith("@") else {item}
    return calls


class Filter:
    def __init__(self, lib: ctypes.CDLL, default: int) -> None:
        self.lib = lib
        self.ctx = lib.seccomp_init(default)
        if not self.ctx:
            raise OSError("seccomp_init failed")

    def rule(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> bool:
        """Add a rule; False if this architecture has no such call (systemd skips those)."""
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return False
        arr = (ArgCmp * max(1, len(cmps)))(*(ArgCmp(*c) for c in cmps))
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(cmps), arr)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add({name}): {os.strerror(-rc)}")
        return True

    def load(self) -> None:
        rc = self.lib.seccomp_load(self.ctx)
        self.lib.seccomp_release(self.ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")


def allowed_calls() -> set[str]:
    allowed: set[str] = set()
    for name in ALLOW_SETS:
        allowed |= syscall_set(name)
    for name in DENY_SETS:
        allowed -= syscall_set(name)
    return allowed


def _gaps(allowed: Iterable[int]) -> list[tuple[int, int, int, int]]:
    """Comparisons on socket()'s first argument that match every family not allowed: each
    gap below the largest allowed one, then everything above it (as systemd builds it)."""
    ok = sorted(allowed)
    cmps = [(0, SCMP_CMP_EQ, f, 0) for f in range(ok[-1]) if f not in ok]
    return cmps + [(0, SCMP_CMP_GT, ok[-1], 0)]


def load_filters() -> None:
    lib = _lib()
    wx = mmap.PROT_WRITE | mmap.PROT_EXEC
    mdwe = Filter(lib, SCMP_ACT_ALLOW)
    eperm = scmp_act_errno(errno.EPERM)
    mdwe.rule(eperm, "mmap", (2, SCMP_CMP_MASKED_EQ, wx, wx))
    mdwe.rule(eperm, "mprotect", (2, SCMP_CMP_MASKED_EQ, mmap.PROT_EXEC, mmap.PROT_EXEC))
    mdwe.rule(eperm, "pkey_mprotect", (2, SCMP_CMP_MASKED_EQ, mmap.PROT_EXEC, mmap.PROT_EXEC))
    mdwe.rule(eperm, "shmat", (2, SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC))
    mdwe.load()

    families = Filter(lib, SCMP_ACT_ALLOW)
    for cmp in _gaps(ADDRESS_FAMILIES):
        families.rule(scmp_act_errno(errno.EAFNOSUPPORT), "socket", cmp)
    families.load()

    # Last: seccomp() itself is outside the allow list, so nothing loads after it.
    calls = Filter(lib, SCMP_ACT_KILL_PROCESS)
    for name in sorted(allowed_calls()):
        calls.rule(SCMP_ACT_ALLOW, name)
    calls.load()


def main(argv: list[str]) -> int:
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: python -m tests.e2e.syscall_sandbox -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    load_filters()
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
