"""How a process joins a namespace host: ``enter(name)``, the steps of ``ip netns exec``.

A module of its own: forked.py's children join a host with it, and netns.py
(which makes the hosts) starts programs on them through forked.py, so both
import this one and neither imports the other.
"""

from __future__ import annotations

import ctypes
import os

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_SLAVE, _MNT_DETACH = 0x4000, 0x80000, 2


def enter(name: str) -> None:
    """Moves this process into namespace `name`, as ``ip netns exec`` would.

    Call it first thing in a fresh process, before any thread exists (the
    namespace is the calling thread's and is inherited by threads made later).
    /sys is mounted afresh in a private mount namespace because UCX lists the
    network devices in /sys/class/net, which shows the namespace of its mount.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)
    steps = [
        ("unshare(CLONE_NEWNS)", lambda: libc.unshare(_CLONE_NEWNS)),
        ("make / a slave mount", lambda: libc.mount(b"", b"/", None, _MS_REC | _MS_SLAVE, None)),
        ("unmount /sys", lambda: libc.umount2(b"/sys", _MNT_DETACH)),
        ("mount sysfs", lambda: libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None)),
    ]
    for what, step in steps:
        if step() != 0:
            raise OSError(ctypes.get_errno(), f"{what} for namespace {name}")
