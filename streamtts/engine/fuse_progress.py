"""What the first load shows while it prepares the model for fast decoding (it writes the
fused-heads GGUF: seconds to minutes for a real model, once): a rich bar on a terminal; else
a line when it starts, one every ``LINE_EVERY_S`` while it lasts, and one when it is done,
so a service log or a piped run is never silent that long, nor flooded. Like the bar, the
lines are for the person waiting, on stderr; the log has its own "writing fused heads" record."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

LABEL = "preparing the model for fast decoding (once)"
_REFRESH_S = 0.1  # the bar is redrawn from the writer's thread at most this often too
LINE_EVERY_S = 30.0  # without a terminal: a progress line at most this often


class FuseProgress:
    """A :data:`streamtts.model.fused.Progress` callback ``(what, done, total)``; a context
    manager that removes the bar at the end. ``total`` 0: a phase of unknown size (parsing
    the source GGUF), shown by its name."""

    def __init__(self, err: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._err = err if err is not None else sys.stderr
        self._tty = self._err.isatty()
        self._clock = clock
        self._bar: Any = None
        self._task: Any = None
        self._phase = ""
        self._drawn = 0.0
        self._t0 = clock()
        self._lined: float | None = None  # when the last line was written (no terminal)

    def __enter__(self) -> FuseProgress:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._lined is not None and exc_type is None:
            self._line("done")

    def __call__(self, what: str, done: int, total: int) -> None:
        if not logging.getLogger("streamtts").isEnabledFor(logging.WARNING):
            return  # `streamtts -q` (errors only), or an application that silenced us
        if self._tty:
            self._draw(what, done, total)
        elif self._lined is None:
            self._line(f"{what} ..." if total <= 0 else f"{total / 1e6:.1f} MB to write ...")
        elif self._clock() - self._lined >= LINE_EVERY_S and 0 < done < total:
            self._line(f"{100 * done // total} % of {total / 1e6:.1f} MB")

    def _line(self, text: str) -> None:
        self._lined = self._clock()
        self._err.write(f"streamtts: {LABEL}: {text} ({self._lined - self._t0:.0f} s)\n")
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
