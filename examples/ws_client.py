"""The /v1/stream protocol with the plain `websockets` library: text in, a wav file out.

    streamtts serve --port 8000 &
    python examples/ws_client.py "Hello there. How are you today?" out.wav

No streamtts import: this is what any client in any language does (see docs/protocol.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import wave

import websockets


async def main(url: str, text: str, out: str, seed: int | None) -> None:
    async with websockets.connect(url, max_size=None, compression=None) as ws:
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


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("text")
    p.add_argument("out", nargs="?", default="out.wav")
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/stream")
    p.add_argument("--seed", type=int)
    a = p.parse_args()
    asyncio.run(main(a.url, a.text, a.out, a.seed))
