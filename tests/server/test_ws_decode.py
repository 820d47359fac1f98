"""The WebSocket endpoint decodes each client frame once (issue 25): the voice look-up
before a `start` reaches the session reads the message the session then acts on.

The app runs in this process (uvicorn on a loopback port, the demo engine) so that the
decoders can be counted; the client is a real `websockets` client.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import uvicorn
import websockets

from streamtts.engine.frontend import Engine
from streamtts.server import protocol
from streamtts.server.app import create_app
from streamtts.server.app_state import ServerSettings
from streamtts.server.uvicorn_ws import WebSocketProtocol


class CountingDecoder:
    """The protocol's decoder, counting the frames it decodes."""

    def __init__(self, inner: Any, seen: list[str]) -> None:
        self.inner, self.seen = inner, seen

    def decode(self, data: str | bytes) -> Any:
        self.seen.append(data if isinstance(data, str) else data.decode())
        return self.inner.decode(data)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every JSON decode of a client frame from now on (the protocol's decoder or any other)."""
    seen: list[str] = []
    monkeypatch.setattr(protocol, "DECODER", CountingDecoder(protocol.DECODER, seen))
    loose = msgspec.json.decode

    def counting(data: Any, *args: Any, **kw: Any) -> Any:
        seen.append(data if isinstance(data, str) else bytes(data).decode())
        return loose(data, *args, **kw)

    monkeypatch.setattr(msgspec.json, "decode", counting)
    return seen


@pytest.fixture(scope="module")
def server_url(demo_model_dir: Path) -> Iterator[str]:
    engine = Engine.from_config(demo_model_dir / "config.yaml", max_streams=2, n_threads=2)
    app = create_app(engine, ServerSettings(warmup=False))
    server = uvicorn.Server(  # port 0: the kernel picks a free one
        uvicorn.Config(app, host="127.0.0.1", port=0, ws=WebSocketProtocol, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"ws://127.0.0.1:{port}/v1/stream"
    server.should_exit = True
    thread.join()


async def talk(url: str, frames: list[str], until: str) -> list[dict[str, Any]]:
    """Send ``frames``; the JSON messages received up to the first of type ``until``."""
    out: list[dict[str, Any]] = []
    async with websockets.connect(url, max_size=None) as ws:
        for f in frames:
            await ws.send(f)
        async for msg in ws:
            if isinstance(msg, str):
                out.append(json.loads(msg))
                if out[-1]["type"] == until:
                    break
    return out


def test_each_client_frame_is_decoded_once(server_url: str, decodes: list[str]) -> None:
    frames = [
        json.dumps({"type": "start", "seed": 1, "max_new_tokens": 40}),
        json.dumps({"type": "text", "text": "Decode me once."}),
        json.dumps({"type": "end"}),
    ]
    got = asyncio.run(talk(server_url, frames, until="done"))
    assert got[0]["type"] == "ready" and got[-1]["type"] == "done", got
    assert [decodes.count(f) for f in frames] == [1, 1, 1]


def test_a_start_naming_an_unknown_voice_is_decoded_once_and_refused(
    server_url: str, decodes: list[str]
) -> None:
    start = json.dumps({"type": "start", "voice": "v_nowhere"})
    got = asyncio.run(talk(server_url, [start], until="error"))
    assert got[0]["type"] == "error" and "v_nowhere" in got[0]["message"], got
    assert decodes.count(start) == 1
