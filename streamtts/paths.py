"""Where streamtts keeps what it builds or writes outside the repo, and how it writes files."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


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


@contextmanager
def gguf_writer_at(path: str | os.PathLike[str], arch: str) -> Iterator[Any]:
    """A ``gguf.GGUFWriter`` on a temporary file next to ``path``, renamed into place
    when the block ends; on an error the partial file is removed (never a torn GGUF)."""
    import gguf

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, arch)
    try:
        yield w
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def quiet_gguf() -> Iterator[None]:
    """The gguf package logs every file it opens or writes at INFO: noise next to our own
    progress lines, so it is held at WARNING inside the block."""
    logger = logging.getLogger("gguf")
    old = logger.level
    logger.setLevel(max(old, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(old)
