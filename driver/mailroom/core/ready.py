"""A worker says it is ready (connected, listening, serving): to `mailroom run` and to systemd.

`mailroom run` starts each command with MAILROOM_READY_FD, the write end of a pipe; a worker
writes one byte there once it serves, and `run` says "running" only when every child has. Under
systemd (Type=notify) NOTIFY_SOCKET gets READY=1 the same way. Outside both it does nothing.
"""

from __future__ import annotations

import os
import socket

_done = False


def notify_ready() -> None:
    """Tell whoever waits that this process serves now (once; later calls do nothing)."""
    global _done
    if _done:
        return
    _done = True
    # (taken out of the environment: a process this one spawns later must not write to that number)
    fd = os.environ.pop("MAILROOM_READY_FD", "")
    if fd.isdigit():
        try:
            os.write(int(fd), b".")
            os.close(int(fd))
        except OSError:
            pass
    path = os.environ.get("NOTIFY_SOCKET", "")
    if path:
        address = "\0" + path[1:] if path.startswith("@") else path
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(b"READY=1", address)
        except OSError:
            pass
