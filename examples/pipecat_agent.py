"""A Pipecat agent pipeline speaking through `streamtts serve`, with a barge-in.

    pip install 'streamtts[pipecat]'
    streamtts serve --port 8000 &
    python examples/pipecat_agent.py --save agent.wav            # two turns, the first interrupted

Flags as the other examples: --server (default $STREAMTTS_SERVER, else
http://127.0.0.1:8000) and --save.

The pipeline is the speaking half of a voice agent: an LLM's replies (simulated here, token
by token, as Pipecat's LLM services emit them) -> StreamTTSService -> the output. In a real
agent the same service sits between the LLM and the transport:

    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm,
                         StreamTTSService(url="ws://127.0.0.1:8000", voice="alloy"),
                         transport.output(), assistant_aggregator])

When the user talks over the bot, Pipecat sends an InterruptionFrame: the service cancels the
interrupted turn's context on the server (its generation stops at the next engine step) and
the next turn starts on the same socket. Here the interruption is sent by the script after
--interrupt-after seconds of the first reply's audio; the audio is written with --save (the
pipeline's output rate, 16 kHz mono) instead of a transport.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
import wave

try:  # one line naming the extra, not a traceback from deep inside an import
    from loguru import logger
    from pipecat.frames.frames import (
        EndFrame,
        Frame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSStoppedFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from streamtts.integrations.pipecat import StreamTTSService
except ImportError as exc:
    print(
        f"pipecat_agent.py: error: {exc.name} is missing: pip install 'streamtts[pipecat]'",
        file=sys.stderr,
    )
    sys.exit(2)

FIRST = (
    "The sea covers about seventy percent of the planet, and most of it has never been "
    "explored. Its deepest point lies almost eleven kilometres down. Yet even there, life "
    "finds a way, in the dark, under a pressure a thousand times our own."
)
SECOND = "Sorry, go ahead. What would you like to know?"


class WavSink(FrameProcessor):
    """The pipeline's end: keeps the bot's audio, notes when each reply starts and stops."""

    def __init__(self) -> None:
        super().__init__()
        self.pcm = bytearray()
        self.sample_rate = 0
        self.first_audio: dict[str, float] = {}
        self.stopped: set[str] = set()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.pcm += frame.audio
            self.sample_rate = frame.sample_rate
            if frame.context_id is not None:
                self.first_audio.setdefault(frame.context_id, time.monotonic())
        elif isinstance(frame, TTSStoppedFrame) and frame.context_id is not None:
            self.stopped.add(frame.context_id)
        await self.push_frame(frame, direction)


def reply(text: str) -> list[Frame]:
    """An LLM reply as Pipecat's LLM services emit it: start, tokens, end."""
    words = text.split(" ")
    return [
        LLMFullResponseStartFrame(),
        *(LLMTextFrame(w + (" " if i < len(words) - 1 else "")) for i, w in enumerate(words)),
        LLMFullResponseEndFrame(),
    ]


async def until(cond: object, timeout: float = 120.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.01)


DEFAULT_SERVER = os.environ.get("STREAMTTS_SERVER") or "http://127.0.0.1:8000"


class Unreachable(Exception):
    pass


def check_server(server: str, token: str | None) -> None:
    """Before the pipeline starts (whose errors are many lines): is the server there, and
    does it take our token?"""
    base = server.rstrip("/").replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    base = base.removesuffix("/v1/stream")
    try:
        urllib.request.urlopen(base + "/healthz", timeout=5).close()
    except urllib.error.HTTPError:
        pass  # it answers (503 while loading): the session will say more
    except OSError as exc:
        raise Unreachable(f"cannot reach {server} ({exc}); is `streamtts serve` running?") from exc
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        urllib.request.urlopen(urllib.request.Request(base + "/v1/audio/voices", headers=headers), timeout=5).close()
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            try:
                why = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                why = "the server needs its token: --token TOKEN or $STREAMTTS_TOKEN"
            raise Unreachable(f"the server refused us (HTTP 401): {why}") from exc


async def main(server: str, save: str, interrupt_after: float, voice: str | None, token: str | None) -> None:
    check_server(server, token)
    tts = StreamTTSService(url=server, voice=voice, token=token)
    sink = WavSink()
    worker = PipelineWorker(
        Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=16000, enable_metrics=True)
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        await until(lambda: tts.session is not None, 10)
    except TimeoutError:
        await worker.cancel()
        await run
        raise Unreachable(f"no session with {server}; is `streamtts serve` running?") from None

    t0 = time.monotonic()
    await worker.queue_frames(reply(FIRST))
    await until(lambda: len(sink.first_audio) == 1)
    first = next(iter(sink.first_audio))
    print(f"first reply: audio after {sink.first_audio[first] - t0:.2f} s")
    await asyncio.sleep(interrupt_after * random.uniform(0.9, 1.1))
    print("the user talks over the bot: interrupting")
    await worker.queue_frame(InterruptionFrame())
    await asyncio.sleep(0.1)
    t1 = time.monotonic()
    await worker.queue_frames(reply(SECOND))
    await until(lambda: len(sink.first_audio) == 2)
    second = [c for c in sink.first_audio if c != first][0]
    print(f"second reply: audio after {sink.first_audio[second] - t1:.2f} s")
    await until(lambda: second in sink.stopped)
    await worker.queue_frame(EndFrame())
    await run

    with wave.open(save, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sink.sample_rate)
        w.writeframes(bytes(sink.pcm))
    print(f"wrote {save}: {len(sink.pcm) / 2 / sink.sample_rate:.2f} s of audio")


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--server", default=DEFAULT_SERVER, help="the server's base URL")
    p.add_argument("--save", default="agent.wav", help="write the bot's audio here (WAV)")
    p.add_argument("--voice", help="a voice name or id of the server (default: the model's own)")
    p.add_argument(
        "--interrupt-after", type=float, default=1.0, help="seconds of the first reply before the barge-in"
    )
    p.add_argument(
        "--token", default=os.environ.get("STREAMTTS_TOKEN"), help="the server's --token (default $STREAMTTS_TOKEN)"
    )
    a = p.parse_args()
    logger.remove()  # Pipecat logs every frame at DEBUG: warnings only
    logger.add(sys.stderr, level="WARNING")
    try:
        asyncio.run(main(a.server, a.save, a.interrupt_after, a.voice, a.token))
    except Unreachable as exc:
        print(f"pipecat_agent.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
