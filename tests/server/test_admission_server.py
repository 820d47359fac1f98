"""`streamtts serve` admits by measured capacity: a new session is refused at once when the
engine is full, over a real WebSocket (``overloaded``, 1013) and HTTP (503 + Retry-After).

``--realtime-margin 1000`` leaves a tick 80 us of a frame: the measured capacity is one
stream on any machine, so one stream nobody reads fills it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

# one long segment (no sentence end, under --max-chars): ~70 s of audio on the demo model
HELD = " ".join(["word"] * 250)


def stalled_session(port: int, text: str) -> socket.socket:
    """A session on a raw socket that sends ``text`` and never reads."""
    from websockets.client import ClientProtocol
    from websockets.protocol import State
    from websockets.uri import parse_uri

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/stream"))
    proto.send_request(proto.connect())
    sock.sendall(b"".join(proto.data_to_send()))
    while proto.state is State.CONNECTING:
        proto.receive_data(sock.recv(1))
    for m in ({"type": "start"}, {"type": "text", "text": text}, {"type": "end"}):
        proto.send_text(json.dumps(m).encode())
    sock.sendall(b"".join(proto.data_to_send()))
    return sock


async def ws_session(url: str, text: str) -> tuple[list[dict[str, Any]], int | None, float]:
    """(messages, close code, seconds from connecting to the close)."""
    t0 = time.monotonic()
    msgs = []
    async with websockets.connect(url, max_size=None) as ws:
        for m in ({"type": "start"}, {"type": "text", "text": text}, {"type": "end"}):
            await ws.send(json.dumps(m))
        try:
            async for frame in ws:
                if isinstance(frame, str):
                    msgs.append(json.loads(frame))
        except ConnectionClosed:
            pass
    return msgs, ws.close_code, time.monotonic() - t0


@pytest.mark.slow
def test_a_full_engine_refuses_new_sessions_at_once(serve: Any) -> None:
    srv = serve(
        "--admission", "capacity", "--max-streams", "4", "--n-threads", "2", "--realtime-margin", "1000",
        "--first-audio-deadline", "0.01", "--max-chars", "2000", "--send-stall", "120",
    )  # fmt: skip
    h = srv.health()  # the warm-up's ticks paid one-off costs: not measured; the slow start's two
    assert h["admission"] == "capacity" and h["capacity_streams"] == 2, h
    for _ in range(2):  # ticks are timed, and two streams end: the rate slots free at too
        r = httpx.post(srv.http + "/v1/audio/speech", json={"input": "Hello.", "response_format": "pcm"}, timeout=60)
        assert r.status_code == 200
    h = srv.health()
    assert h["capacity_streams"] == 1
    # short texts: each stream's first 32 steps made no frame
    assert 0.1 <= h["frames_per_step"] < 0.9, h
    assert srv.metric("streamtts_frames_per_step") == pytest.approx(h["frames_per_step"], abs=0.001)
    sock = stalled_session(srv.port, HELD)
    try:
        while srv.health()["active_streams"] < 1:  # its one long stream holds the capacity
            time.sleep(0.01)
        msgs, code, _ = asyncio.run(ws_session(srv.ws, "Is there room?"))
        errors = [m for m in msgs if m["type"] == "error"]
        assert code == 1013 and [e["code"] for e in errors] == ["overloaded"], msgs
        assert errors[0]["fatal"] and "capacity" in errors[0]["message"]
        r = httpx.post(srv.http + "/v1/audio/speech", json={"input": "And now?"}, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert srv.health()["active_streams"] == 1  # the admitted stream was not cut
        assert srv.metric('streamtts_admission_total{decision="refused"}') == 2
        assert srv.metric("streamtts_capacity_streams") == 1
        assert 1 <= srv.metric("streamtts_capacity_limit_streams") <= srv.health()["max_streams"]
    finally:
        sock.close()
    srv.wait_idle(30)
    msgs, code, _ = asyncio.run(ws_session(srv.ws, "Room again."))
    assert code == 1000 and msgs[-1]["type"] == "done", msgs
