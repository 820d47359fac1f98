"""Logging of refusals: one line each, at INFO, and at most a few per interval.

Anybody who can reach the port can make the server refuse something (a bad
handshake, a frame that is not UTF-8, a body nested too deeply). Each refusal
is worth one line for whoever runs the server, never a traceback, and never
so many that an unauthenticated client can fill the log: past ``burst`` lines
in ``interval_s`` seconds the rest are counted, and the next line that gets
through says how many were left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["REFUSALS", "RateLimitedLog", "UvicornRefusalFilter"]


class RateLimitedLog:
    """``log(fmt, *args)``: at most ``burst`` lines per ``interval_s``, the rest counted."""

    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.INFO,
        burst: int = 10,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.level = level
        self.burst = burst
        self.interval_s = interval_s
        self._clock = clock
        self._window_start = -float("inf")
        self._in_window = 0
        self.suppressed = 0  # lines left out since the last one logged

    def allow(self) -> bool:
        """Whether one more line may be written now (counts it either way)."""
        now = self._clock()
        if now - self._window_start >= self.interval_s:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self.suppressed += 1
            return False
        self._in_window += 1
        return True

    def log(self, fmt: str, *args: object) -> None:
        if not self.logger.isEnabledFor(self.level) or not self.allow():
            return
        if self.suppressed:
            fmt += " (%d similar lines left out)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self.logger.log(self.level, fmt, *args)


# Every refusal the server logs goes through this one budget.
REFUSALS = RateLimitedLog(logging.getLogger("streamtts.server.refused"))


class UvicornRefusalFilter(logging.Filter):
    """Rate-limits (through :data:`REFUSALS`' budget) and strips the tracebacks of the lines
    uvicorn writes when a client sends a malformed HTTP request: they are the client's fault."""

    MESSAGES = frozenset(
        {
            "Invalid HTTP request received.",
            "Unsupported upgrade request.",
            "Invalid UTF-8 sequence received from client.",
        }
    )

    def __init__(self, budget: RateLimitedLog = REFUSALS) -> None:
        super().__init__()
        self.budget = budget

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in self.MESSAGES:
            return True
        record.exc_info = None
        record.exc_text = None
        return self.budget.allow()
