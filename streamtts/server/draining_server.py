"""``DrainingServer``: uvicorn's server, with SIGTERM starting a drain (``drain.py``).

Apart from ``drain.py`` so that what only reads the server's settings (the CLI's parser, the
GPU check's benchmarks) does not import uvicorn.
"""

from __future__ import annotations

import asyncio
import signal
from types import FrameType
from typing import Any

import uvicorn

from .drain import Drain

__all__ = ["DrainingServer"]


class DrainingServer(uvicorn.Server):
    """uvicorn's server, except that SIGTERM drains (see the module doc) before it stops.

    SIGINT (Ctrl+C) still stops at once, as uvicorn does. uvicorn re-raises the signals it
    handled once it has shut down; SIGTERM is not recorded, so a drained server exits 0.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        drain.on_finished = self._drained
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._loop is not None and not self.should_exit:
            # A signal handler runs between two bytecodes of the loop's thread: hand over.
            self._loop.call_soon_threadsafe(self.drain.start, "SIGTERM")
            return
        super().handle_exit(sig, frame)

    def _drained(self) -> None:
        self.config.timeout_graceful_shutdown = self.drain.flush_grace_s()
        self.should_exit = True
