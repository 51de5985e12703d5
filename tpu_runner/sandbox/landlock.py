"""Landlock: after this, the process (and its children) may write only beneath the directories given, and - when
a list of readable paths is given too - read and execute only beneath those and the writable ones.

Linux's unprivileged sandbox (kernel >= 5.13, ABI version 1 and up), so it works for the runner's own user in a
container or a systemd unit as well as for root. Creating, writing, truncating, renaming or removing anything
outside the allowed trees fails with EACCES; so does opening a file or listing a directory outside the readable
ones. Where
the ABI allows, TCP bind/connect (ABI 4) and signals or abstract sockets to processes outside the sandbox
(ABI 6) are refused too. Only the standard library is used: this runs before anything else is imported.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# LANDLOCK_ACCESS_FS_* bits, and the ABI that introduced each.
_EXECUTE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 2, 1 << 3
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_MAKE = [1 << bit for bit in range(6, 13)]  # char, dir, reg, sock, fifo, block, sym
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class LandlockUnavailable(OSError):
    pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return 0
    version = _libc().syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _write_access(abi: int) -> int:
    access = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE
    for bit in _MAKE:
        access |= bit
    if abi >= 2:
        access |= _REFER
    if abi >= 3:
        access |= _TRUNCATE
    return access


def restrict_writes(writable: list[str], readable: list[str] | None = None, listable: list[str] = ()) -> int:
    """Allow writes only beneath `writable` (and to /dev/null); with `readable`, reads (and execution) only beneath
    it and `writable`, and directory listing alone on `listable` (a directory whose entries may be looked up while
    its files stay closed). Returns the ABI used. Raises LandlockUnavailable."""
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable("Landlock is not available in this kernel (or is disabled)")
    create, add_rule, restrict = _SYSCALLS[platform.machine()]
    libc = _libc()
    write = _write_access(abi)
    access = write | (_READ if readable is not None else 0)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    fields = [access] + ([net] if abi >= 4 else []) + ([scoped] if abi >= 6 else [])
    attr = struct.pack(f"{len(fields)}Q", *fields)
    ruleset = libc.syscall(create, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise LandlockUnavailable(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    rules = [(p, access) for p in [*writable, "/dev/null"]] + [(p, _READ) for p in readable or ()] + \
        [(p, _READ_DIR) for p in listable if readable is not None]
    try:
        for path, wanted in rules:
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                allowed = wanted if os.path.isdir(path) else wanted & (_WRITE_FILE | _TRUNCATE | _READ_FILE | _EXECUTE)
                if not allowed:
                    continue
                rule = struct.pack("=Qi", allowed, fd)  # struct landlock_path_beneath_attr is packed
                if libc.syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.c_char_p(rule), ctypes.c_uint32(0)) != 0:
                    raise LandlockUnavailable(f"landlock_add_rule({path}) failed: "
                                              f"{os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockUnavailable(f"prctl(NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise LandlockUnavailable(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi
