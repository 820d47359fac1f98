"""One message style for every line streamtts prints: ``streamtts: warning: ...``.

The command line formats its log records with :class:`Formatter`; a program using the
Python API that configured no logging gets the same lines from :func:`install_fallback`
(``import streamtts`` installs it), in place of Python's bare last-resort output. Once the
program configures logging (a handler on the root logger), its own handlers print instead.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["Formatter", "install_fallback"]


class Formatter(logging.Formatter):
    """``streamtts: warning: message`` (the level in lower case; none for plain notices)."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"streamtts: {record.levelname.lower()}: {text}"


class _Fallback(logging.Handler):
    """Warnings and errors on stderr while the program has no logging of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the program's (or the command line's) root handlers print it
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - as logging.Handler: a closed stderr is not our error
            self.handleError(record)


def install_fallback() -> None:
    """Give the ``streamtts`` logger the fallback handler, once."""
    logger = logging.getLogger("streamtts")
    if not any(isinstance(h, _Fallback) for h in logger.handlers):
        handler = _Fallback(logging.WARNING)
        handler.setFormatter(Formatter())
        logger.addHandler(handler)
