"""Child processes that do not outlive the process that started them (Linux).

``inferpath demo`` and ``inferpath up`` start the engine, gateway, server and dashboard as
child processes. A parent stopped by ``kill -9`` (or the OOM killer) runs no clean-up, and
its children would keep the store locked and the ports taken. :func:`die_with_parent` asks
the kernel to send the child SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, see
prctl(2)); the children stop gracefully on SIGTERM. Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """``preexec_fn`` for :class:`subprocess.Popen`: SIGTERM this child when the thread that
    started it ends (its process dying included). Runs in the child between fork and exec;
    never raises."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
