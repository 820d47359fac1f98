"""The OpenAI-compatible endpoint, streamed: raw 24 kHz 16-bit PCM as it is generated.

    streamtts serve --port 8000 &
    python examples/openai_speech.py "Hello from the speech endpoint." out.wav

With the OpenAI SDK instead (pip install openai):

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input="Hello!", response_format="pcm") as r:
        for chunk in r.iter_bytes():
            ...
"""

from __future__ import annotations

import argparse
import time
import wave

import httpx


def main(base: str, text: str, out: str) -> None:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
    t0 = time.monotonic()
    pcm = bytearray()
    with httpx.stream("POST", base.rstrip("/") + "/v1/audio/speech", json=body, timeout=None) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            if not pcm:
                print(f"first audio after {1000 * (time.monotonic() - t0):.0f} ms")
            pcm += chunk
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(bytes(pcm))
    print(f"wrote {out}: {len(pcm) / 48000:.2f} s in {time.monotonic() - t0:.2f} s")


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("text")
    p.add_argument("out", nargs="?", default="speech.wav")
    p.add_argument("--server", default="http://127.0.0.1:8000")
    a = p.parse_args()
    main(a.server, a.text, a.out)
