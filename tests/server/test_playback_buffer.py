"""The ``playback_buffer_ms`` option over real sockets (issue 39 item 3): a client that says it
buffers more gets a smaller first chunk; a bad value is refused naming the field (WebSocket
``start``: an ``error``, the session waits for a corrected ``start``; the speech body: a 400
with ``param``). The server runs ``--chunk-frames 4,8``, so the rule has room to act: 500 ms
is 400 ms beyond the 100 ms the first chunk is chosen for, five frames, so the first chunk
is one frame instead of four (engine/chunk_policy.py first_chunk_frames)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import websockets

FRAME_BYTES = 1920 * 2  # one 80 ms frame of pcm_s16le_24000 (the default format)
TEXT = "Hello there, this is a test of the playback buffer option."


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "2", "--n-threads", "2", "--chunk-frames", "4,8", "--segment-max-new-tokens", "60")


async def first_audio(server: Any, start: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The size of the session's first binary frame (its first chunk), and its JSON messages
    up to ``done``; the whole session is read, so nothing depends on when frames came."""
    first = 0
    msgs: list[dict[str, Any]] = []
    async with websockets.connect(server.ws, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", **start}))
        await ws.send(json.dumps({"type": "text", "text": TEXT}))
        await ws.send(json.dumps({"type": "end"}))
        async for m in ws:
            if isinstance(m, bytes):
                first = first or len(m)
                continue
            msgs.append(json.loads(m))
            if msgs[-1]["type"] == "done":
                break
    return first, msgs


async def refused(server: Any, start: dict[str, Any]) -> dict[str, Any]:
    """The error a bad ``start`` gets (the session stays open, waiting for a corrected one)."""
    async with websockets.connect(server.ws, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", **start}))
        async for m in ws:
            if isinstance(m, str) and (msg := json.loads(m))["type"] == "error":
                return dict(msg)
    raise AssertionError("closed without an error")


def test_a_larger_playback_buffer_gets_a_smaller_first_chunk(server: Any) -> None:
    plain, msgs = asyncio.run(first_audio(server, {"seed": 1}))
    assert msgs[-1]["type"] == "done" and msgs[-1]["frames"] > 4, msgs
    assert plain == 4 * FRAME_BYTES  # the configured first chunk
    buffered, msgs = asyncio.run(first_audio(server, {"seed": 1, "playback_buffer_ms": 500}))
    assert msgs[-1]["type"] == "done", msgs
    assert buffered == FRAME_BYTES
    small, _ = asyncio.run(first_audio(server, {"seed": 1, "playback_buffer_ms": 100}))
    assert small == 4 * FRAME_BYTES  # no more than the first chunk is chosen for: unchanged


@pytest.mark.parametrize(
    ("value", "code", "needle"),
    [
        (-1, "invalid_option", "playback_buffer_ms must be in [0, 60000]"),
        (1e9, "invalid_option", "playback_buffer_ms must be in [0, 60000]"),
        ("lots", "invalid_message", "playback_buffer_ms"),
    ],
)
def test_ws_a_bad_playback_buffer_is_named(server: Any, value: object, code: str, needle: str) -> None:
    err = asyncio.run(refused(server, {"playback_buffer_ms": value}))
    assert (err["code"], err["fatal"]) == (code, False), err
    assert needle in err["message"], err


def test_http_a_bad_playback_buffer_is_named(server: Any) -> None:
    r = httpx.post(
        server.http + "/v1/audio/speech",
        json={"input": "Hi.", "response_format": "pcm", "playback_buffer_ms": -5},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_option", "playback_buffer_ms"), err


def test_http_a_playback_buffer_is_accepted(server: Any) -> None:
    r = httpx.post(
        server.http + "/v1/audio/speech",
        json={"input": "Hi.", "response_format": "pcm", "playback_buffer_ms": 300},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert len(r.content) > 0
