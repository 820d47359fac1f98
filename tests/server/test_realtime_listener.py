"""A WebSocket listener that plays at real time keeps its session for minutes of audio.

The client is what `streamtts say` with speakers, or a voice agent playing as it
receives, is: it takes audio at 1 s per s and reads only while it holds less than
``AHEAD_S`` beyond its playback clock. The tone demo model generates ~50x faster than
real time, the worst case for the gap between generator and listener: before the
server paced its socket by the listener (server/pacing.py), tens of seconds of audio
sat on the socket in front of the keepalive pings, and the client was dropped after
18-50 s (1011 ping timeout, or 1008 "client too slow") while it read at a steady 1 s/s.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

BYTES_PER_S = 2 * 24000  # pcm_s16le_24000, the default format
AHEAD_S = 2.0  # the client's own playback buffer
MIN_AUDIO_S = 150.0  # several minutes of audio: the defect cut clients at 18-50 s
TEXT = " ".join(f"This is sentence number {i}, which is spoken as its own segment." for i in range(45))


@dataclass
class Listened:
    audio_s: float = 0.0
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""


async def listen_in_real_time(url: str) -> Listened:
    out = Listened()
    # the websockets client's own keepalive (ping every 20 s, pong within 20 s) also checks
    # the server's side: its pongs wait behind whatever audio the server queued
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        for m in ({"type": "start"}, {"type": "text", "text": TEXT}, {"type": "end"}):
            await ws.send(json.dumps(m))
        t0: float | None = None
        try:
            while True:
                if t0 is not None:
                    hold = out.audio_s - (time.monotonic() - t0)  # audio in hand, unplayed
                    if hold > AHEAD_S:
                        await asyncio.sleep(hold - AHEAD_S)
                        continue
                frame = await ws.recv()
                if isinstance(frame, bytes):
                    if t0 is None:
                        t0 = time.monotonic()  # playback starts with the first audio
                    out.audio_s += len(frame) / BYTES_PER_S
                else:
                    out.messages.append(json.loads(frame))
        except ConnectionClosed:
            pass
        out.close_code, out.close_reason = ws.close_code, ws.close_reason or ""
    return out


@pytest.mark.slow
def test_a_listener_at_real_time_pace_is_never_dropped(serve: Any) -> None:
    server = serve("--max-streams", "2", "--n-threads", "2")  # keepalive and buffers: defaults
    dropped = server.metric("streamtts_slow_clients_dropped_total")
    got = asyncio.run(listen_in_real_time(server.ws))
    kinds = [m["type"] for m in got.messages]
    errors = [m for m in got.messages if m["type"] == "error"]
    assert errors == [] and got.close_code == 1000, (errors, got.close_code, got.close_reason, got.audio_s)
    done = got.messages[-1]
    assert kinds[-1] == "done" and done["reason"] == "end"
    assert abs(got.audio_s - done["audio_s"]) < 0.1  # all of it came, at the listener's pace
    assert got.audio_s > MIN_AUDIO_S, got.audio_s
    assert server.metric("streamtts_slow_clients_dropped_total") == dropped
    server.wait_idle()
