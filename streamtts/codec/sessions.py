"""One ONNX Runtime session per codec graph in a process, whoever loads it.

Several engines in one process (a server serving several family members, server/models.py)
that point at the same codec files share its sessions, so the codec's weights are in memory
once, not once a member. A session is keyed by the file (resolved path, size, change time)
and everything that shapes it (threads, providers); the cache holds it weakly, so when the
last engine using it closes (a model unloaded when idle) its memory goes with it. Sessions
are safe to call from several threads at once (ONNX Runtime's ``Run`` is); the per-stream
state a streaming graph keeps lives in each decoder's own buffers, not in the session.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

__all__ = ["shared_session", "shared_sessions"]

_lock = threading.Lock()
_sessions: weakref.WeakValueDictionary[tuple[Hashable, ...], Any] = weakref.WeakValueDictionary()


def shared_session(path: Path, shape: tuple[Hashable, ...], make: Callable[[], Any]) -> Any:
    """The session of ``path`` made with the options ``shape`` names (one per process while
    any holder lives); ``make()`` builds it the first time."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, *shape)
    with _lock:  # two engines loading at once build it once
        sess = _sessions.get(key)
        if sess is None:
            sess = make()
            _sessions[key] = sess
        return sess


def shared_sessions() -> int:
    """How many sessions are alive in the cache (tests, /v1/info)."""
    with _lock:
        return len(_sessions)
