"""uvicorn's ``websockets-sansio`` WebSocket protocol, with three fixes for hostile clients.

``streamtts serve`` passes :class:`WebSocketProtocol` to uvicorn as its ``ws``
class. The WebSocket protocol itself stays the ``websockets`` library's; this
only changes what uvicorn does around it:

* **Closing after a protocol error** (1009 message too big, 1007 text that is
  not UTF-8, 1002): uvicorn closes the TCP connection right after the close
  frame. A client still sending then makes the kernel answer with a reset, and
  the client sees 1006 instead of the code. Here the server sends the close
  frame (and a FIN where the protocol has failed the connection), keeps
  reading and discarding until the client closes or ``ERROR_CLOSE_TIMEOUT_S``
  passes, then closes.
* **Answering the client's close**: uvicorn writes the answer and closes the socket at once.
  A client's frames sent after its close (pongs answering pings still on their way to it)
  then reach a closed socket, and the kernel answers with a reset that drops everything not
  yet delivered: the answer, and the last audio. Here the answer is followed by a FIN, and
  the server reads (and discards) until the client closes its side or
  ``CLIENT_CLOSE_TIMEOUT_S`` passes.
* **Logging**: a text frame that is not UTF-8 is one rate-limited INFO line
  (uvicorn logs a traceback at ERROR); so are the other protocol errors.
* **Shutting down** (Ctrl-C): uvicorn sends each connection a close frame and closes it,
  which waits for its unsent data to go out; a client that stopped reading never takes it,
  and uvicorn waits out its graceful-shutdown timeout, then logs an error. Here such a
  connection is aborted after ``SHUTDOWN_FLUSH_S``.
* **Acknowledgement pings** (``scope["extensions"]["streamtts.ping"]``): a function that
  writes a ping behind the frames sent so far and returns a future done when its pong
  comes back, i.e. once the client has read those frames (ws.py paces audio by it). Its
  pong also answers a keepalive ping in flight: the client is alive.
* **Refused handshakes** (an HTTP response instead of the upgrade: bad token,
  origin or Host): uvicorn logs ``ASGI callable returned without completing
  handshake`` at ERROR for each, though the refusal was complete.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame
from websockets.http11 import Request

from .logs import REFUSALS
from .pacing import PING_EXTENSION

__all__ = ["CLIENT_CLOSE_TIMEOUT_S", "ERROR_CLOSE_TIMEOUT_S", "SHUTDOWN_FLUSH_S", "WebSocketProtocol"]

log = logging.getLogger(__name__)

ERROR_CLOSE_TIMEOUT_S = 2.0  # wait this long for the client's side of an error close
# after answering the client's close, wait this long for it to close its side (it reads what
# was sent before the answer first: the websockets library's own close timeout)
CLIENT_CLOSE_TIMEOUT_S = 10.0
SHUTDOWN_FLUSH_S = 1.0  # at shutdown, a connection's unsent data gets this long to go out

_INVALID_UTF8 = 1007


class WebSocketProtocol(WebSocketsSansIOProtocol):
    _error_closing = False
    _acks: dict[bytes, asyncio.Future[None]] | None = None
    _ack_ids = itertools.count()

    # -- acknowledgement pings ---------------------------------------------------------------
    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the ASGI task created above has not run yet
            scope["extensions"][PING_EXTENSION] = self.ack_ping

    def ack_ping(self) -> asyncio.Future[None] | None:
        """A ping behind everything written so far; None when the connection is closing."""
        if self.close_sent or self.transport.is_closing():
            return None
        if self._acks is None:
            self._acks = {}
        payload = b"ack:%d" % next(self._ack_ids)
        done: asyncio.Future[None] = self.loop.create_future()
        self._acks[payload] = done
        self.conn.send_ping(payload)
        self.transport.write(b"".join(self.conn.data_to_send()))
        return done

    def handle_pong(self, event: Frame) -> None:
        done = self._acks.pop(bytes(event.data), None) if self._acks else None
        if done is None:
            super().handle_pong(event)
            return
        if not done.done():
            done.set_result(None)
        if self.pong_timer is not None:
            # A pong while the keepalive waits for its own: the client is alive and reading.
            # The keepalive's deadline is met; its next ping is chained as after its pong.
            self.pong_timer.cancel()
            self.pong_timer = None
            self.pending_ping_payload = None
            self.schedule_ping()

    def connection_lost(self, exc: Exception | None) -> None:
        for done in (self._acks or {}).values():
            done.cancel()
        self._acks = None
        super().connection_lost(exc)

    # -- refused handshakes: the denial response completes the handshake ---------------------
    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True

    # -- shutdown: a client that does not read cannot hold the server open -------------------
    def shutdown(self) -> None:
        super().shutdown()
        self.loop.call_later(SHUTDOWN_FLUSH_S, self.transport.abort)  # no-op once closed

    # -- text that is not UTF-8: 1007, closed cleanly ----------------------------------------
    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            data = b"".join(self.frames)
            try:
                data.decode()
            except UnicodeDecodeError as exc:
                self.frames = []
                self.conn.send_close(_INVALID_UTF8, "text frame is not valid UTF-8")
                self._close_after_error(f"text frame not UTF-8 ({exc.reason} at byte {exc.start})")
                return
        super().send_receive_event_to_app()

    # -- protocol errors (1009 too big, 1002, ...): closed cleanly ---------------------------
    def handle_parser_exception(self) -> None:
        if self._error_closing:  # data after the failure: the parser discards it
            return
        exc = self.conn.parser_exc
        self._close_after_error(f"{type(exc).__name__}: {exc}")

    def _close_after_error(self, why: str) -> None:
        close = self.conn.close_sent
        code = close.code if close is not None else 1006
        reason = close.reason if close is not None else ""
        REFUSALS.log("closed WebSocket from %s with %d: %s", self._peer(), code, why)
        self._error_closing = True
        self._closed_reading_on(code, reason, ERROR_CLOSE_TIMEOUT_S)

    # -- the client's close: answered, then read on until the client closes ------------------
    def handle_close(self, event: Frame) -> None:
        if self.close_sent or self.transport.is_closing():
            super().handle_close(event)  # the answer to our own close: the handshake is done
            return
        close = self.conn.close_rcvd
        assert close is not None  # the frame was parsed; the protocol wrote its answer
        self._closed_reading_on(close.code, close.reason, CLIENT_CLOSE_TIMEOUT_S)

    def _closed_reading_on(self, code: int, reason: str, timeout_s: float) -> None:
        """The app is told, the close frame the protocol wrote goes out (with a FIN where the
        protocol ended its side), and reading goes on: a client's frames that cross the
        close are read, not answered by a reset that would drop what is still unsent."""
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        if self.conn.eof_sent and self.transport.can_write_eof():
            # A FIN tells the client the close is complete, and the client closes its side.
            self.transport.write_eof()
        self.close_sent = True
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        if self.close_timer is None:
            self.close_timer = self.loop.call_later(timeout_s, self.transport.close)

    def _peer(self) -> str:
        return self.client[0] if self.client else "?"
