"""Ctrl-C at any moment of a command is ``streamtts: interrupted`` (exit 130), never a traceback.

While the command's modules import (the first fraction of a second), a C extension may turn
the ``KeyboardInterrupt`` into an ``ImportError`` (numpy does): so the signal is noted as it
arrives, and whatever it turned into is reported as the interruption it was; one that
landed where Python can only drop it (a weakref's callback, which the imports run) is
raised once they are done (:func:`imports_done`). For the
asynchronous commands, asyncio's own handler takes over (:func:`hand_to_asyncio`): it cancels
the command's task, whose clean-up (a file kept, a socket closed) then runs. Once reported,
CPython's own note of an unhandled interrupt is cleared (:func:`report`), or
``python -m streamtts`` would still die by the signal instead of exiting 130.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

_seen = False
_hook_before = sys.unraisablehook


def _note(signum: int, frame: FrameType | None) -> None:
    global _seen
    _seen = True
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt


def _dropped(info: sys.UnraisableHookArgs) -> None:
    # A KeyboardInterrupt raised in a callback cannot propagate: Python prints it as ignored
    # and carries on, the command would run as if no Ctrl-C came. It was noted (_note);
    # imports_done() raises it.
    if not isinstance(info.exc_value, KeyboardInterrupt):
        _hook_before(info)


def watch() -> None:
    """Note Ctrl-C from now on (the main thread only, as Python's signals), those dropped in
    callbacks while the command's modules import too."""
    global _hook_before
    signal.signal(signal.SIGINT, _note)
    if sys.unraisablehook is not _dropped:
        _hook_before, sys.unraisablehook = sys.unraisablehook, _dropped


def imports_done() -> None:
    """The command's modules are imported: a Ctrl-C that came meanwhile is raised now, if
    nothing raised it yet (it was dropped in a callback)."""
    if sys.unraisablehook is _dropped:
        sys.unraisablehook = _hook_before
    if _seen:
        raise KeyboardInterrupt


def seen() -> bool:
    """Whether Ctrl-C came since :func:`watch`."""
    return _seen


def report() -> int:
    """Say that the command was interrupted; returns its exit status (130). CPython's note
    that a ``KeyboardInterrupt`` went unhandled is cleared first.

    A string ``exec`` that ends in a ``KeyboardInterrupt`` (dataclasses build their methods
    so; modules being imported build many) sets that note even when a caller catches the
    exception, and under ``python -m`` the interpreter then kills itself with SIGINT at exit,
    whatever the exit code asked for: the CI saw ``streamtts: interrupted`` and a death by
    signal (-2) instead of 130, once in a few dozen Ctrl-Cs while modules imported. Every
    string ``exec`` clears the note as it starts, so an empty one forgets it (harmless where
    an interpreter keeps no such note)."""
    exec("pass", {})
    print("streamtts: interrupted", file=sys.stderr)
    return 130


def hand_to_asyncio() -> None:
    """Before ``asyncio.run``: it installs its own handler only over Python's default one."""
    if signal.getsignal(signal.SIGINT) is _note:
        signal.signal(signal.SIGINT, signal.default_int_handler)
