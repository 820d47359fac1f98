"""Graceful drain: how a replica leaves a cluster without cutting the speech it is producing.

Started by SIGTERM (what ``docker stop`` and Kubernetes send) or ``POST /admin/drain``:

1. The replica stops admitting: ``/readyz`` answers 503 (the balancer stops sending
   sessions here), a new WebSocket session gets ``error`` ``server_draining`` and close
   1013, a new ``POST /v1/audio/speech`` gets 503 with ``Retry-After``. ``/healthz``,
   ``/metrics`` and the rest keep answering.
2. Running streams finish. A session with nothing in progress (no segment generating,
   no audio left to send, no partial text waiting for more) is closed right away with
   ``error`` ``server_draining`` and close 1001: a voice agent between two replies
   reconnects, through the balancer, to another replica, and nothing it asked for is lost.
   Checked every ``POLL_S``, so a session is closed as soon as its reply is delivered.
3. At ``drain_timeout_s`` whatever is still running is cut: ``error`` ``server_shutdown``
   (fatal) and close 1001 on a WebSocket, an ``error`` event (SSE) or an incomplete body
   (raw audio) on HTTP. Counted in ``streamtts_drain_streams_cut_total``.
4. The process exits 0 (``DrainingServer``, in ``draining_server.py``): uvicorn closes the listener, the engine stops.

``streamtts_draining`` is 1 from step 1 on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from .protocol import CloseCode, Error, ErrorCode, encode

if TYPE_CHECKING:
    from starlette.websockets import WebSocket

    from .metrics import ServerMetrics

log = logging.getLogger(__name__)

__all__ = ["Drain", "Drainable", "HttpStream", "refuse_websocket"]

POLL_S = 0.1  # how often quiet sessions are looked for
# After the cut: time for the error and close frames to go out. They queue behind audio already
# buffered for the client (the transport's 64 KB and the kernel's socket buffers); a client
# that reads that slowly may see the connection end without them.
CLOSE_GRACE_S = 0.75
# uvicorn's own graceful-shutdown wait once the drain has run. When every session ended by
# itself, its last audio may still be on the way to a client reading at real-time pace: in the
# transport's and both kernels' socket buffers and the client library's queue (websockets keeps
# 16 messages: up to 10 s of audio in 0.64 s chunks). Wait for the connections to close (at
# once when they do) up to what is left of the drain timeout, at least FLUSH_GRACE_S: 5 s
# alone cut such a client with 1006 one shutdown in four (tests/deploy). When streams were
# cut they have had CLOSE_GRACE_S: what is left is cancelled at once.
FLUSH_GRACE_S = 5
EXIT_GRACE_S = 0
RETRY_AFTER_S = 1  # Retry-After of a refusal: a retry through the balancer lands elsewhere


class Drainable(Protocol):
    """A live session the drain can see: a WebSocket connection or an HTTP speech stream."""

    kind: str

    @property
    def quiet(self) -> bool:
        """Nothing in progress: closing it now loses nothing the client asked for."""

    def leave(self) -> None:
        """Close it now (it is quiet): ``server_draining``, 1001."""

    def cut(self, timeout_s: float) -> None:
        """The drain time is over: stop it (``server_shutdown``, 1001)."""


class HttpStream:
    """A ``POST /v1/audio/speech`` body being streamed: never quiet; a cut ends the body."""

    kind = "http"
    quiet = False

    def __init__(self) -> None:
        self.cut_message: str | None = None
        self.was_cut = asyncio.Event()

    def leave(self) -> None:  # pragma: no cover - never quiet
        pass

    def cut(self, timeout_s: float) -> None:
        self.cut_message = (
            f"the server is shutting down: its drain time ({timeout_s:g} s) ran out and this "
            "stream was cut"
        )
        self.was_cut.set()


class Drain:
    """The drain of one server. ``on_finished`` runs once every session has ended or been cut."""

    def __init__(self, metrics: ServerMetrics, timeout_s: float) -> None:
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.active = False
        self.reason = ""
        self.left = 0  # quiet sessions closed
        self.cut = 0  # streams cut at the timeout
        self.finished = asyncio.Event()
        self.on_finished: Callable[[], None] = lambda: None
        self._live: set[Drainable] = set()
        self._task: asyncio.Task[None] | None = None
        self.deadline = 0.0  # the loop time the drain cuts at (set when it starts)

    def add(self, item: Drainable) -> None:
        """``item`` is a live session the drain waits for (until :meth:`discard`)."""
        self._live.add(item)

    def discard(self, item: Drainable) -> None:
        self._live.discard(item)

    @contextlib.contextmanager
    def tracking(self, item: Drainable) -> Iterator[None]:
        """``item`` is live while the block runs."""
        self.add(item)
        try:
            yield
        finally:
            self.discard(item)

    @property
    def live(self) -> int:
        return len(self._live)

    def flush_grace_s(self) -> int:
        """Whole seconds the server may still wait for its connections to close once drained
        (uvicorn takes an int)."""
        if self.cut:
            return EXIT_GRACE_S
        return max(FLUSH_GRACE_S, math.ceil(self.deadline - asyncio.get_running_loop().time()))

    def refusal_message(self) -> str:
        return (
            "the server is draining (shutting down or restarting) and takes no new sessions; "
            "connect again: the balancer sends you to another replica"
        )

    def start(self, reason: str) -> bool:
        """Begin draining (idempotent); False when a drain was already under way."""
        if self.active:
            log.info("drain already under way (%s); %s ignored", self.reason, reason)
            return False
        self.active = True
        self.reason = reason
        self.metrics.draining.set(1)
        log.warning(
            "draining (%s): %d live session(s), up to %g s before the rest are cut",
            reason,
            len(self._live),
            self.timeout_s,
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="drain")
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        m = self.metrics
        deadline = self.deadline = loop.time() + self.timeout_s
        while self._live and loop.time() < deadline:
            for item in list(self._live):
                if item.quiet:
                    item.leave()
                    self.left += 1
                    m.drain_closed_total.inc(kind=item.kind)
            await asyncio.sleep(POLL_S)
        for item in list(self._live):
            item.cut(self.timeout_s)
            self.cut += 1
            m.drain_cut_total.inc(kind=item.kind)
        if self.cut:
            end = loop.time() + CLOSE_GRACE_S
            while self._live and loop.time() < end:
                await asyncio.sleep(0.02)
        log.warning(
            "drained (%s): %d quiet session(s) closed, %d stream(s) cut at the %g s timeout",
            self.reason,
            self.left,
            self.cut,
            self.timeout_s,
        )
        self.finished.set()
        self.on_finished()


async def refuse_websocket(ws: WebSocket, drain: Drain) -> None:
    """A new WebSocket while draining: accept, then ``server_draining`` and close 1013 (browsers
    cannot see a refused handshake's status, only the close code and the message)."""
    drain.metrics.refused_total.inc(kind="ws")
    drain.metrics.errors_total.inc(code=ErrorCode.SERVER_DRAINING)
    await ws.accept()
    msg = Error(code=ErrorCode.SERVER_DRAINING, message=drain.refusal_message(), fatal=True)
    with contextlib.suppress(Exception):
        await ws.send_text(encode(msg))
        await ws.close(CloseCode.TRY_AGAIN_LATER, "draining")
