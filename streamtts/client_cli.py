"""``streamtts say --server ws://HOST:PORT TEXT``: speak through a remote server."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from .constants import SAMPLE_RATE
from .errors import PlaybackError
from .serve_cli import TOKEN_ENV


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "say", help="speak text through a remote `streamtts serve`"
    )
    p.add_argument(
        "text", help="text to speak, or - to stream stdin line by line (e.g. piped from an LLM)"
    )
    p.add_argument("--server", default="ws://127.0.0.1:8000", help="server URL (ws://host:port)")
    p.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token (or ${TOKEN_ENV})"
    )
    p.add_argument("--voice", help="voice id from an earlier upload")
    p.add_argument("--reference", help="reference clip to upload and speak with")
    p.add_argument("--language")
    p.add_argument("--instruction")
    p.add_argument("--seed", type=int)
    p.add_argument("--output-device", help="output device index or name substring")
    p.add_argument(
        "--save",
        help="also write what was played to this wav file (used alone without a sound card)",
    )
    p.set_defaults(handler=say)


async def _stdin_lines() -> AsyncIterator[str]:
    import asyncio

    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        yield line


async def say(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf

    from .audio import playback as player
    from .client import ServerError, StreamClient

    client = StreamClient(
        args.server,
        token=args.token,
        voice=args.voice,
        language=args.language,
        instruction=args.instruction,
        seed=args.seed,
        format="pcm_f32le_24000",  # what the player takes, bit-exact
    )
    try:
        if args.reference:
            client.settings["voice"] = await client.upload_voice(args.reference)
        text: Any = _stdin_lines() if args.text == "-" else args.text
        chunks = client.stream(text)
        try:
            report = await player.play(chunks, device=args.output_device, save=args.save)
        except PlaybackError as exc:
            if not args.save:
                raise
            # No sound card: the player failed before reading the stream, so save it all.
            print(f"streamtts: {exc}; writing {args.save} instead", file=sys.stderr)
            pcm = [c async for c in chunks]
            sf.write(args.save, np.concatenate(pcm) if pcm else np.zeros(0, np.float32), SAMPLE_RATE)
            return 0
    except ServerError as exc:
        print(f"streamtts: server error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"streamtts: cannot reach {client.url}: {exc}", file=sys.stderr)
        return 1
    print(report.summary(), file=sys.stderr)
    return 0
