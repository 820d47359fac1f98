"""Where streamtts keeps what it builds or writes outside the repo."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$STREAMTTS_CACHE``, else ``$XDG_CACHE_HOME/streamtts``, else ``~/.cache/streamtts``.

    native/build.sh computes the same folder.
    """
    env = os.environ.get("STREAMTTS_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "streamtts"
