"""Speak an LLM's answer while it is being written: tokens in, audio out, both streamed.

    streamtts serve --port 8000 &
    python examples/llm_stream.py "Tell me about the sea."               # a simulated LLM
    python examples/llm_stream.py "Tell me about the sea." --save llm.wav   # no sound card
    python examples/llm_stream.py --llm http://127.0.0.1:8080/v1 --model my-model "Tell me..."

With --llm, tokens come from any OpenAI-compatible chat endpoint (llama.cpp's server, vLLM,
...), streamed with server-sent events. The server cuts the text into clauses as it arrives,
so speech starts after the first clause, not after the whole answer. Audio is played through
the sound card (`streamtts.audio.playback`), or written with --save.

Every example takes the same flags: --server (default $STREAMTTS_SERVER, else
http://127.0.0.1:8000, where `streamtts serve` listens) and --save. Dependencies (httpx for
--llm): `pip install 'streamtts[examples]'` (scripts/setup.sh installs them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from collections.abc import AsyncIterator

import numpy as np

from streamtts.client import StreamClient
from streamtts.errors import PlaybackError, ServerError

DEFAULT_SERVER = os.environ.get("STREAMTTS_SERVER") or "http://127.0.0.1:8000"

CANNED = (
    "The sea covers about seventy percent of the planet, and most of it has never been explored. "
    "Its deepest point, the Challenger Deep, lies almost eleven kilometres down, where the pressure "
    "is over a thousand times what we feel at the surface. Yet even there, life finds a way."
)


async def fake_llm(prompt: str) -> AsyncIterator[str]:
    """Word pieces at an LLM-like pace (about 30 tokens per second)."""
    for word in CANNED.split(" "):
        for piece in (
            (word[: len(word) // 2], word[len(word) // 2 :] + " ")
            if len(word) > 6
            else (word + " ",)
        ):
            await asyncio.sleep(random.uniform(0.01, 0.05))
            yield piece


async def openai_llm(base: str, model: str, prompt: str) -> AsyncIterator[str]:
    import httpx

    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    async with httpx.AsyncClient(timeout=None) as http:
        async with http.stream("POST", base.rstrip("/") + "/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                if delta:
                    yield delta


async def echo(tokens: AsyncIterator[str]) -> AsyncIterator[str]:
    async for t in tokens:
        sys.stdout.write(t)
        sys.stdout.flush()
        yield t
    print()


async def main(a: argparse.Namespace) -> None:
    tokens = openai_llm(a.llm, a.model, a.prompt) if a.llm else fake_llm(a.prompt)
    client = StreamClient(a.server, seed=a.seed, token=a.token)
    chunks = client.stream(echo(tokens))
    if a.save:
        import soundfile as sf

        pcm = [c async for c in chunks]
        sf.write(a.save, np.concatenate(pcm) if pcm else np.zeros(0, np.float32), 24000)
        print(f"wrote {a.save}")
        return
    from streamtts.audio import playback as player

    report = await player.play(chunks, device=os.environ.get("STREAMTTS_OUTPUT_DEVICE") or None)
    print(report.summary())


def fail(message: str) -> None:
    """One line on stderr and exit status 2, as `streamtts` does for a user's mistake."""
    print(f"llm_stream.py: error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("prompt", nargs="?", default="Tell me about the sea.", help="what to ask the LLM")
    p.add_argument("--server", default=DEFAULT_SERVER, help="the streamtts server's base URL")
    p.add_argument("--llm", help="base URL of an OpenAI-compatible API (default: a simulated LLM)")
    p.add_argument("--model", default="default", help="model name for --llm")
    p.add_argument("--seed", type=int, help="sampling seed")
    p.add_argument("--save", help="write a wav file instead of playing")
    p.add_argument(
        "--token", default=os.environ.get("STREAMTTS_TOKEN"), help="the server's --token (default $STREAMTTS_TOKEN)"
    )
    a = p.parse_args()
    try:
        asyncio.run(main(a))
    except PlaybackError as exc:  # raised before anything was streamed: nothing is lost
        fail(f"{exc.reason}; add --save FILE to write the audio instead")
    except ServerError as exc:
        fail(f"the server said {exc}")
    except ImportError as exc:  # --llm needs httpx
        fail(f"{exc.name} is missing: pip install 'streamtts[examples]'")
    except OSError as exc:
        fail(f"cannot reach {a.server} ({exc}); is `streamtts serve` running?")
