"""What the first load shows while it writes the fused-heads GGUF (seconds to minutes for a
real model, once): a rich bar on a terminal, else a line every 10 % on stderr, so a service
log or a piped run is never silent that long. Like the bar, the lines are for the person
waiting, on stderr; the log has its own "writing fused heads" record."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

LABEL = "writing fused heads GGUF (first load, once)"
_REFRESH_S = 0.1  # the bar is redrawn from the writer's thread at most this often too


class FuseProgress:
    """A :data:`streamtts.model.fused.Progress` callback ``(what, done, total)``; a context
    manager that removes the bar at the end. ``total`` 0: a phase of unknown size (parsing
    the source GGUF), shown by its name."""

    def __init__(self, err: TextIO | None = None) -> None:
        self._err = err if err is not None else sys.stderr
        self._tty = self._err.isatty()
        self._bar: Any = None
        self._task: Any = None
        self._phase = ""
        self._next_tenth = 0
        self._drawn = 0.0
        self._t0 = time.monotonic()

    def __enter__(self) -> FuseProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __call__(self, what: str, done: int, total: int) -> None:
        if not logging.getLogger("streamtts").isEnabledFor(logging.WARNING):
            return  # `streamtts -q` (errors only), or an application that silenced us
        if self._tty:
            self._draw(what, done, total)
        elif total <= 0:
            if what != self._phase:
                self._phase = what
                self._line(f"{what} ...")
        else:
            # a line for every 10 % crossed since the last call (one tensor may cross several)
            tenth = min(10, done * 10 // total)
            while self._next_tenth <= tenth:
                self._line(f"{self._next_tenth * 10} % of {total / 1e6:.1f} MB")
                self._next_tenth += 1

    def _line(self, text: str) -> None:
        elapsed = time.monotonic() - self._t0
        self._err.write(f"streamtts: {LABEL}: {text} ({elapsed:.0f} s)\n")
        self._err.flush()

    def _draw(self, what: str, done: int, total: int) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                console=Console(file=self._err), transient=True,
            )  # fmt: skip
            self._bar.start()
            self._task = self._bar.add_task(LABEL, total=None)
        if total <= 0:
            self._bar.update(self._task, description=f"{LABEL}: {what}", total=None, refresh=True)
            return
        # Redrawn from here as the bytes go out, besides rich's own 10 Hz refresh: on a small
        # file all the bytes went out within one refresh period, and the bar showed 0 of
        # the total for the whole wait (spent parsing the source before the first byte).
        now = time.monotonic()
        draw = now - self._drawn >= _REFRESH_S or done >= total
        self._bar.update(self._task, description=LABEL, completed=done, total=total, refresh=draw)
        if draw:
            self._drawn = now
