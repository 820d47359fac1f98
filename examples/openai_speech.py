"""The OpenAI-compatible endpoint, streamed: raw 24 kHz 16-bit PCM as it is generated.

    streamtts serve --port 8000 &
    python examples/openai_speech.py "Hello from the speech endpoint." --save speech.wav
    python examples/openai_speech.py "The same with the OpenAI SDK." --sdk --save sdk.wav

Every example takes the same flags: --server (default $STREAMTTS_SERVER, else
http://127.0.0.1:8000, where `streamtts serve` listens) and --save. Dependencies (httpx,
openai): `pip install 'streamtts[examples]'` (scripts/setup.sh installs them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import wave
from collections.abc import Iterator

DEFAULT_SERVER = os.environ.get("STREAMTTS_SERVER") or "http://127.0.0.1:8000"
BODY = {"model": "tts-1", "voice": "alloy", "response_format": "pcm"}


class Refused(Exception):
    """The server answered with an error (its message names what to do)."""


def with_httpx(base: str, text: str, token: str | None) -> Iterator[bytes]:
    import httpx

    url = base.rstrip("/") + "/v1/audio/speech"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.stream("POST", url, json={**BODY, "input": text}, headers=headers, timeout=None) as r:
        if r.status_code >= 400:
            r.read()
            try:
                why = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                why = r.text
            raise Refused(f"HTTP {r.status_code}: {why}")
        yield from r.iter_bytes()


def with_sdk(base: str, text: str, token: str | None) -> Iterator[bytes]:
    from openai import OpenAI

    client = OpenAI(base_url=base.rstrip("/") + "/v1", api_key=token or "unused")
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=text, response_format="pcm"
    ) as r:
        yield from r.iter_bytes()


def main(chunks: Iterator[bytes], out: str) -> None:
    t0 = time.monotonic()
    pcm = bytearray()
    for chunk in chunks:
        if not pcm:
            print(f"first audio after {1000 * (time.monotonic() - t0):.0f} ms")
        pcm += chunk
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(bytes(pcm))
    print(f"wrote {out}: {len(pcm) / 48000:.2f} s in {time.monotonic() - t0:.2f} s")


def fail(message: str) -> None:
    """One line on stderr and exit status 2, as `streamtts` does for a user's mistake."""
    print(f"openai_speech.py: error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("text", help="what to say")
    p.add_argument("--server", default=DEFAULT_SERVER, help="the server's base URL")
    p.add_argument("--save", default="speech.wav", help="wav file to write")
    p.add_argument("--sdk", action="store_true", help="use the OpenAI SDK instead of httpx")
    p.add_argument(
        "--token", default=os.environ.get("STREAMTTS_TOKEN"), help="the server's --token (default $STREAMTTS_TOKEN)"
    )
    a = p.parse_args()
    try:
        main((with_sdk if a.sdk else with_httpx)(a.server, a.text, a.token), a.save)
    except Refused as exc:
        fail(f"the server refused the request ({exc})")
    except ImportError as exc:
        fail(f"{exc.name} is missing: pip install 'streamtts[examples]'")
    except Exception as exc:  # httpx's ConnectError and the SDK's APIConnectionError are no OSError
        status = getattr(exc, "status_code", None)  # the SDK's APIStatusError (401: AuthenticationError)
        if status is not None:
            body = getattr(exc, "body", None)
            why = body.get("message", body) if isinstance(body, dict) else exc
            fail(f"the server refused the request (HTTP {status}: {why})")
        if not isinstance(exc, OSError) and type(exc).__name__ not in ("ConnectError", "APIConnectionError"):
            raise
        fail(f"cannot reach {a.server} ({exc}); is `streamtts serve` running?")
