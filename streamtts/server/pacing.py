"""How far a WebSocket's audio may run ahead of its listener (sans-I/O; ws.py drives it).

A listener plays audio at real time: by the clock, it has consumed at least what a player
started at the first audio would have played (``played``: it advances 1 s per s while
audio sent is ahead of it, and waits at the end of what was sent). It has provably read
everything sent before a ping it answered (``acked``): the pong comes back only after
the client has read the frames in front of the ping. What it has consumed is the larger
of the two, so a client that reads faster than real time (one writing a file) is sent to
at its own pace, and one that plays gets real time.

The sender keeps at most ``lead_s`` seconds of audio beyond that: the socket never holds
tens of seconds of audio in front of a keepalive ping, and the rest waits in the outbox
and the engine, whose buffered-ahead pause then holds generation. A client is too slow
(``too_slow``) only when it falls ``stall_s`` behind a real-time listener (``behind_s``):
slower than real time, not slower than the generator; or when it has read nothing of
what was sent for ``stall_s`` plus ``lead_s`` (``unread_for_s``: it stopped reading,
however little of its audio the socket's buffers hold; a real-time reader reaches the ping
behind the audio sent last within ``lead_s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["PING_EXTENSION", "Listener"]

# The ASGI scope extension through which the server's protocol (uvicorn_ws.py) offers
# acknowledgement pings: a function returning a future done when the pong is back.
PING_EXTENSION = "streamtts.ping"
_SLACK_S = 1e-6  # audio seconds are sums of frame lengths: equal up to float rounding


class Listener:
    """One connection's listener: audio sent, read (acked) and played, in seconds."""

    def __init__(
        self, lead_s: float, acks: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lead_s = lead_s
        self._clock = clock
        self.sent_s = 0.0  # audio written to the socket
        self.acked_s = 0.0  # audio the client has read (answered a ping sent after it)
        self.played_s = 0.0  # audio a real-time listener has played by now
        self.acks = acks  # whether pings acknowledge reads (ws.py: the server sends them)
        self._t: float | None = None  # when played_s was last brought up to date
        self._read_at: float | None = None  # since when sent audio waits unread (None: none)

    def _advance(self) -> None:
        if self._t is None:
            return
        now = self._clock()
        self.played_s = min(self.sent_s, self.played_s + (now - self._t))
        self._t = now

    def sent(self, seconds: float) -> None:
        """``seconds`` of audio were written to the socket."""
        if self._t is None:
            self._t = self._clock()  # playback starts with the first audio
        self._advance()
        if self._read_at is None and self.sent_s <= self.acked_s:
            self._read_at = self._clock()  # the client had read everything until now
        self.sent_s += seconds

    def acked(self, upto_s: float) -> None:
        """The client has read every frame sent before audio second ``upto_s``."""
        if upto_s > self.acked_s:
            self.acked_s = upto_s
            self._read_at = None if upto_s >= self.sent_s else self._clock()

    @property
    def consumed_s(self) -> float:
        self._advance()
        return max(self.played_s, self.acked_s)

    def wait_s(self) -> float:
        """Seconds until more audio may be sent: 0 now, else when the real-time listener has
        played enough (an ack may come sooner and wakes the sender).

        Only the clock moves ``played_s``; ``acked_s`` moves when an acknowledgement comes.
        So the wait is the clock's, even while the acknowledged audio is ahead of it: timed
        from ``acked_s`` it did not end when it ran out, and with the acknowledged audio at
        the lead to a float's last bit (10.080000000000002 sent, 6.08 read, 4 s lead) the
        sender woke every 2e-15 s: 80,000 turns of the event loop a second, a core taken
        from the engine, whose ticks on the tiny demo model went from 2 to 47 ms."""
        need = self.sent_s - self.lead_s  # what must be consumed before more audio goes
        if self.consumed_s >= need - _SLACK_S:
            return 0.0
        return need - self.played_s

    def too_slow(self, stall_s: float) -> bool:
        return self.behind_s() > stall_s or self.unread_for_s() > stall_s + self.lead_s

    def unread_for_s(self) -> float:
        """How long the client has read nothing while sent audio waits (0 without acks)."""
        if not self.acks or self._read_at is None:
            return 0.0
        return self._clock() - self._read_at

    def behind_s(self) -> float:
        """How far the client's reading lags a real-time listener (0 without acks: unknown)."""
        if not self.acks:
            return 0.0
        self._advance()
        return max(0.0, self.played_s - self.acked_s)
