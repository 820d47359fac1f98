"""Ctrl-C at any moment of a command is ``streamtts: interrupted`` (exit 130), never a traceback.

While the command's modules import (the first fraction of a second), a C extension may turn
the ``KeyboardInterrupt`` into an ``ImportError`` (numpy does): so the signal is noted as it
arrives, and whatever it turned into is reported as the interruption it was. For the
asynchronous commands, asyncio's own handler takes over (:func:`hand_to_asyncio`): it cancels
the command's task, whose clean-up (a file kept, a socket closed) then runs.
"""

from __future__ import annotations

import signal
from types import FrameType

_seen = False


def _note(signum: int, frame: FrameType | None) -> None:
    global _seen
    _seen = True
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt


def watch() -> None:
    """Note Ctrl-C from now on (the main thread only, as Python's signals)."""
    signal.signal(signal.SIGINT, _note)


def seen() -> bool:
    """Whether Ctrl-C came since :func:`watch`."""
    return _seen


def hand_to_asyncio() -> None:
    """Before ``asyncio.run``: it installs its own handler only over Python's default one."""
    if signal.getsignal(signal.SIGINT) is _note:
        signal.signal(signal.SIGINT, signal.default_int_handler)
