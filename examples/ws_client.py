"""The /v1/stream protocol with the plain `websockets` library: text in, a wav file out.

    streamtts serve --port 8000 &
    python examples/ws_client.py "Hello there. How are you today?" --save ws.wav

No streamtts import: this is what any client in any language does (see docs/protocol.md).
Every example takes the same flags: --server (default $STREAMTTS_SERVER, else
http://127.0.0.1:8000, where `streamtts serve` listens), --token (a server started with
--token; default $STREAMTTS_TOKEN) and --save.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import wave

import websockets

DEFAULT_SERVER = os.environ.get("STREAMTTS_SERVER") or "http://127.0.0.1:8000"
DEFAULT_TOKEN = os.environ.get("STREAMTTS_TOKEN")


def stream_url(server: str) -> str:
    """http://host:port (or ws://host:port) -> ws://host:port/v1/stream."""
    base = server.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return base if base.endswith("/v1/stream") else base + "/v1/stream"


async def main(url: str, text: str, out: str, seed: int | None, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with websockets.connect(url, additional_headers=headers, max_size=None, compression=None) as ws:
        start = {"type": "start", "format": "pcm_s16le_24000"}
        if seed is not None:
            start["seed"] = seed
        await ws.send(json.dumps(start))
        t0 = time.monotonic()
        await ws.send(json.dumps({"type": "text", "text": text}))
        await ws.send(json.dumps({"type": "end"}))
        audio = bytearray()
        rate = 24000
        async for msg in ws:  # ends when the server closes after `done`
            if isinstance(msg, bytes):
                if not audio:
                    print(f"first audio after {1000 * (time.monotonic() - t0):.0f} ms")
                audio += msg
                continue
            event = json.loads(msg)
            if event["type"] == "ready":
                rate = event["sample_rate"]
            elif event["type"] == "segment":
                print(f"  {event['start_s']:6.2f}-{event['end_s']:6.2f} s  {event['text']}")
            elif event["type"] == "done":
                print(
                    f"done: {event['audio_s']} s of audio, TTFA {event['ttfa_ms']} ms, RTF {event['rtf']}"
                )
            elif event["type"] == "error":
                print(f"error {event['code']}: {event['message']}")
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(audio))
    print(f"wrote {out} ({len(audio) // 2 / rate:.2f} s)")


def fail(message: str) -> None:
    """One line on stderr and exit status 2, as `streamtts` does for a user's mistake."""
    print(f"ws_client.py: error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("text", help="what to say")
    p.add_argument("--server", default=DEFAULT_SERVER, help="the server's base URL")
    p.add_argument("--save", default="ws.wav", help="wav file to write")
    p.add_argument("--seed", type=int, help="sampling seed")
    p.add_argument("--token", default=DEFAULT_TOKEN, help="the server's --token (default $STREAMTTS_TOKEN)")
    a = p.parse_args()
    try:
        asyncio.run(main(stream_url(a.server), a.text, a.save, a.seed, a.token))
    except websockets.InvalidStatus as exc:  # the handshake refused: 401 without the token
        body = exc.response.body.decode(errors="replace") if exc.response.body else ""
        try:
            body = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        fail(f"the server refused the connection (HTTP {exc.response.status_code}): {body}")
    except OSError as exc:
        fail(f"cannot reach {a.server} ({exc}); is `streamtts serve` running?")
