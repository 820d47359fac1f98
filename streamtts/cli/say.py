"""``streamtts say --server http://HOST:PORT TEXT``: speak through a remote server."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from ..errors import PlaybackError, UsageError
from .serve import TOKEN_ENV

SERVER_ENV = "STREAMTTS_SERVER"
DEFAULT_SERVER = "http://127.0.0.1:8000"


def default_server() -> str:
    """``$STREAMTTS_SERVER``, else the port ``streamtts serve`` listens on by default."""
    return os.environ.get(SERVER_ENV) or DEFAULT_SERVER


def add_parser(sub: Any) -> None:
    from .common import env_device

    p: argparse.ArgumentParser = sub.add_parser(
        "say", help="speak text through a remote `streamtts serve`"
    )
    p.add_argument(
        "text", nargs="?",
        help="text to speak; - (or no TEXT with text piped in) streams stdin line by line, "
        "e.g. from an LLM; text longer than the server takes in one message is sent in pieces",
    )  # fmt: skip
    p.add_argument(
        "--server", default=default_server(),
        help=f"the server's base URL (http:// or ws://); default: ${SERVER_ENV}, else {DEFAULT_SERVER}",
    )  # fmt: skip
    p.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token (or ${TOKEN_ENV})"
    )
    p.add_argument("--voice", help="voice id from an earlier upload (POST /v1/voices)")
    p.add_argument("--model", help="which of the server's models speaks (streamtts models --server URL lists them)")
    p.add_argument(
        "--lexicon", metavar="FILE.json",
        help='a pronunciation lexicon sent with the request: a JSON object {"word or phrase": "how to read it", ...} '
        "(checked here first; docs/protocol.md, Pronunciation lexicons)",
    )  # fmt: skip
    p.add_argument("--reference", help="reference clip to upload and speak with")
    p.add_argument("--language", help="language tag for the prompt, e.g. en, zh")
    p.add_argument("--instruction", help="style instruction for the prompt")
    p.add_argument("--seed", type=int, help="sampling seed (segment i uses seed + i)")
    p.add_argument(
        "--output-device", default=env_device(),
        help="output device index or name substring, or null (paced, discarded); "
        "default: $STREAMTTS_OUTPUT_DEVICE, else the system's",
    )  # fmt: skip
    p.add_argument(
        "--save",
        help="also write what was played to this file; without a sound card, only write it",
    )
    p.set_defaults(handler=say, check=_check_say)


def _check_say(args: argparse.Namespace) -> None:
    from .common import (
        check_input_file,
        check_output_device,
        check_output_file,
        check_text,
        read_lexicon,
        stdin_piped,
    )

    if args.text is None:
        if not stdin_piped():
            raise UsageError(
                'give the text to say: streamtts say "Hello there." (or pipe it in: '
                "echo Hello | streamtts say)"
            )
        args.text = "-"
    if args.text != "-":
        check_text(args.text, "TEXT")
    check_input_file(args.reference, "--reference")
    args.lexicon_read = read_lexicon(args.lexicon)  # a bad entry: one line naming it, before connecting
    check_output_file(args.save, "--save")
    check_output_device(args.output_device, args.save)


async def _stdin_lines() -> AsyncIterator[str]:
    import asyncio

    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        yield line


class _Progress:
    """On a terminal, for a long text given whole: how much of it the server has spoken,
    by segment, and the time left at that pace (a line redrawn on stderr, gone at the end)."""

    LONG = 400  # characters: below this a text is said before progress would tell anything

    def __init__(self, text: object, quiet: bool) -> None:
        self.total = len(text) if isinstance(text, str) else 0
        self.on = bool(self.total >= self.LONG and not quiet and sys.stderr.isatty())
        self.done = 0
        self.segments = 0
        self._t0 = time.monotonic()
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        if self.on:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn

            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 console=Console(stderr=True), transient=True)  # fmt: skip
            self._bar.start()
            self._task = self._bar.add_task(f"speaking: 0 of {self.total} characters")
        return self

    def segment(self, info: Any) -> None:
        if self._bar is None:
            return
        from .common import time_left

        self.segments += 1
        self.done = min(self.total, self.done + len(info.text))
        left = time_left(self.done, self.total, time.monotonic() - self._t0)
        self._bar.update(
            self._task,
            description=f"speaking: segment {self.segments}, {self.done} of {self.total} characters{left}",
        )

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


async def say(args: argparse.Namespace) -> int:
    import asyncio

    from ..audio import playback as player
    from ..client import StreamClient
    from .common import save_instead, wrote

    client = StreamClient(
        args.server,
        token=args.token,
        voice=args.voice,
        language=args.language,
        instruction=args.instruction,
        seed=args.seed,
        format="pcm_f32le_24000",  # what the player takes, bit-exact
        model=args.model,
        lexicon=None if args.lexicon_read is None else dict(args.lexicon_read.entries),
    )
    report = None
    try:
        if args.reference:
            client.settings["voice"] = await client.upload_voice(args.reference)
        text: Any = _stdin_lines() if args.text == "-" else args.text
        with _Progress(text, args.quiet) as progress:
            # strict: a text the server refuses is an error (exit 2 with its reason), not a
            # warning before a short file and exit 0
            chunks = client.stream(text, strict=True, on_segment=progress.segment)
            try:
                report = await player.play(chunks, device=args.output_device, save=args.save)
            except PlaybackError as exc:
                if not args.save:
                    raise
                # No sound card: the player failed before reading the stream, so save it all.
                await save_instead(chunks, args.save, exc, args.quiet)
    except asyncio.CancelledError:  # Ctrl-C: the file keeps what came so far
        if args.save and not args.quiet:
            wrote(args.save, interrupted=True)
        raise
    except OSError as exc:
        raise UsageError(
            f"cannot reach {client.url}: {exc.strerror or exc} (is `streamtts serve` running "
            f"there? start it with `streamtts serve`, or point --server at it)"
        ) from exc
    if not args.quiet:
        if report is not None:
            print(f"streamtts: {report.summary()}", file=sys.stderr)
        if args.save:
            wrote(args.save)
    return 0
