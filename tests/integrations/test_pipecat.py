"""Pipecat: a real ``pipecat-ai`` pipeline with :class:`StreamTTSService` against a real server.

Two LLM turns become audio frames at the pipeline's rate; an interruption during the first
stops its audio (no audio of it on the wire after the server acknowledged the cancel) and
the second turn's first audio comes no later than on an idle server (+20 %, medians of
alternating runs); TTFB metrics are reported; token aggregation speaks exactly what the
server's own segmenter makes of the whole text.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pipecat", reason="pip install 'streamtts[pipecat]'")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData  # noqa: E402
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.tts_service import TextAggregationMode  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from streamtts.client import Audio, StreamClient  # noqa: E402
from streamtts.integrations.pipecat import StreamTTSService  # noqa: E402
from streamtts.server.protocol import Done  # noqa: E402

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
RATE = 16000
LONG = " ".join(f"This is sentence number {i} of the first answer, long enough to interrupt." for i in range(6))
SECOND = "Sure, here is the second answer. It comes right after the interruption."
RUNS = 5


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "4", "--n-threads", "2", "--segment-max-new-tokens", "44")


@pytest.fixture(scope="module")
def voice_id(server: Any, voice_wav: Path) -> str:
    return asyncio.run(StreamClient(server.ws).upload_voice(voice_wav.read_bytes()))


class WatchedService(StreamTTSService):
    """The service, with the server's events recorded as they come off the wire."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.wire: list[tuple[float, str, str | None, Any]] = []  # (time, kind, context, event)

    async def _on_server_event(self, ev: Any) -> None:
        kind = type(ev).__name__
        self.wire.append((time.monotonic(), kind, getattr(ev, "context_id", None), ev))
        await super()._on_server_event(ev)


class Collector(FrameProcessor):  # type: ignore[misc]
    """The end of the pipeline: every frame that reaches it, with its time."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[float, Frame]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append((time.monotonic(), frame))
        await self.push_frame(frame, direction)

    def audio(self, cid: str | None = None) -> list[TTSAudioRawFrame]:
        return [f for _, f in self.frames if isinstance(f, TTSAudioRawFrame) and (cid is None or f.context_id == cid)]

    def contexts(self) -> list[str]:
        out: list[str] = []
        for f in self.audio():
            if f.context_id not in out:
                out.append(f.context_id)
        return out


@dataclass
class Agent:
    task: PipelineWorker
    tts: WatchedService
    sink: Collector
    runner: asyncio.Task[None]
    marks: list[float] = field(default_factory=list)

    async def turn(self, text: str, tokens: bool = False) -> float:
        """Queue one LLM turn (token by token with ``tokens``); returns when it was queued."""
        pieces = [w + " " for w in text.split(" ")] if tokens else [text]
        pieces[-1] = pieces[-1].rstrip()
        t = time.monotonic()
        await self.task.queue_frames(
            [LLMFullResponseStartFrame(), *(LLMTextFrame(p) for p in pieces), LLMFullResponseEndFrame()]
        )
        return t

    async def wait(self, cond: Any, timeout: float = 120.0) -> None:
        async with asyncio.timeout(timeout):
            while not cond():
                await asyncio.sleep(0.005)

    async def first_audio_of_new_context(self, known: int, timeout: float = 120.0) -> tuple[str, float]:
        try:
            await self.wait(lambda: len(self.sink.contexts()) > known, timeout)
        except TimeoutError:
            wire = [(k, c, getattr(ev, "reason", "")) for _, k, c, ev in self.tts.wire[-8:]]
            raise AssertionError(f"no audio of a new context; contexts {self.sink.contexts()}, wire {wire}") from None
        cid = self.sink.contexts()[known]
        t = next(t for t, f in self.sink.frames if isinstance(f, TTSAudioRawFrame) and f.context_id == cid)
        return cid, t

    def stopped(self, cid: str) -> bool:
        return any(isinstance(f, TTSStoppedFrame) and f.context_id == cid for _, f in self.sink.frames)


async def agent(
    server: Any, voice: str, mode: TextAggregationMode | None = None, after_tts: tuple[Any, ...] = ()
) -> AsyncIterator[Agent]:
    """A pipeline of the TTS service, ``after_tts`` (e.g. an assistant aggregator) and a sink."""
    tts = WatchedService(url=server.ws, voice=voice, seed=7, sampling=GREEDY, text_aggregation_mode=mode)
    sink = Collector()
    task = PipelineWorker(
        Pipeline([tts, *after_tts, sink]),
        params=PipelineParams(audio_out_sample_rate=RATE, enable_metrics=True),
        idle_timeout_secs=None,
        check_dangling_tasks=False,
    )
    runner_ = WorkerRunner(handle_sigint=False)
    await runner_.add_workers(task)
    runner = asyncio.create_task(runner_.run())
    a = Agent(task, tts, sink, runner)
    try:
        await a.wait(lambda: tts.session is not None, 60)
        yield a
    finally:
        await task.queue_frame(EndFrame())
        try:
            async with asyncio.timeout(30):
                await runner
        except TimeoutError:
            await task.cancel()


async def second_answer(a: Agent) -> tuple[str, float]:
    """Speak SECOND as a turn: its context, and the time from queueing it to its first audio."""
    known = len(a.sink.contexts())
    t0 = await a.turn(SECOND)
    cid, t1 = await a.first_audio_of_new_context(known)
    await a.wait(lambda: a.stopped(cid))
    return cid, t1 - t0


# The bound on the second turn's first audio: the issue's +20 % over the idle server's, both
# the median of RUNS alternating runs, plus 100 ms for the scheduling noise of the 2-core
# machine the suite shares with other jobs (single runs there spread from 0.2 to 2 s). On the
# demo model an uncancelled turn barely slows the next (its steps are cheap), so the check that
# the interruption really stopped the first turn is the wire's: no audio after the cancel's ack.
SLOWDOWN = 1.2
SLACK_S = 0.1


def test_two_turns_an_interruption_and_the_second_turn_as_fast_as_on_an_idle_server(server: Any, voice_id: str) -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {"idle": [], "after": [], "ack_ms": [], "cut_frames": []}
        gen = agent(server, voice_id)
        a = await anext(gen)
        try:
            for run in range(RUNS):
                # alternately first: an idle server speaking the second answer alone, and the
                # first answer interrupted after its first audio, then the second answer
                for part in ("idle", "after") if run % 2 == 0 else ("after", "idle"):
                    if part == "idle":
                        cid, dt = await second_answer(a)
                        out["idle"].append(dt)
                        out.setdefault("idle_audio", []).append(b"".join(f.audio for f in a.sink.audio(cid)))
                        continue
                    known = len(a.sink.contexts())
                    await a.turn(LONG)
                    c1, _ = await a.first_audio_of_new_context(known)
                    n_wire = len(a.tts.wire)
                    t_int = time.monotonic()
                    await a.task.queue_frame(InterruptionFrame())
                    await a.wait(lambda c1=c1: any(k == "Done" and c == c1 for _, k, c, _ in a.tts.wire))
                    t_ack = next(t for t, k, c, _ in a.tts.wire if k == "Done" and c == c1)
                    out["ack_ms"].append(1000 * (t_ack - t_int))
                    c2, dt = await second_answer(a)
                    out["after"].append(dt)
                    # the wire, checked below: c1 cancelled, none of its audio after the ack
                    out.setdefault("c1_wire", []).append([(k, ev) for _, k, c, ev in a.tts.wire if c == c1])
                    out["cut_frames"].append(sum(1 for _, k, c, _ in a.tts.wire[n_wire:] if k == "Audio" and c == c1))
                    out.setdefault("stops", []).append((c2 != c1, a.stopped(c2), a.stopped(c1)))
                    out.setdefault("c2_audio", []).append(b"".join(f.audio for f in a.sink.audio(c2)))
            out["frames"] = a.sink.frames
            out["session_voice"] = a.tts.session.ready.voice if a.tts.session and a.tts.session.ready else None
        finally:
            await gen.aclose()
        return out

    out = asyncio.run(scenario())
    idle, after = statistics.median(out["idle"]), statistics.median(out["after"])
    print(
        f"\nfirst audio of the second turn: idle {[round(x, 3) for x in out['idle']]} s "
        f"(median {idle:.3f}), after an interruption {[round(x, 3) for x in out['after']]} s "
        f"(median {after:.3f}); cancel acknowledged after {[round(x) for x in out['ack_ms']]} ms; "
        f"audio frames of the cancelled turn between interruption and acknowledgement "
        f"{out['cut_frames']}"
    )
    for wire in out["c1_wire"]:
        kinds = [k for k, _ in wire]
        assert kinds.count("Done") == 1 and kinds[-1] == "Done", kinds  # no audio after the ack
        done = wire[-1][1]
        assert isinstance(done, Done) and done.reason == "cancelled"
        # cut short, not spoken to its end (how far the server got before the cancel reached it
        # depends on the machine's speed: the demo model makes audio ~20x faster than real time)
        assert done.frames < 6 * 13, "the first answer was generated to its end"
    assert all(s == (True, True, False) for s in out["stops"])
    assert after <= SLOWDOWN * idle + SLACK_S, (
        f"second turn after an interruption {after:.3f} s > {SLOWDOWN} x idle {idle:.3f} s + {SLACK_S} s"
    )
    # the second answer is the same audio on an idle server and after an interruption
    assert all(x == out["idle_audio"][0] for x in out["idle_audio"] + out["c2_audio"])
    frames = [f for _, f in out["frames"] if isinstance(f, TTSAudioRawFrame)]
    assert frames and all(f.sample_rate == RATE and f.num_channels == 1 for f in frames)
    assert len(out["idle_audio"][0]) > RATE  # the second answer: > 0.5 s of 16-bit audio
    # TTFB metrics for our service
    ttfb = [d.value for _, f in out["frames"] if isinstance(f, MetricsFrame) for d in f.data if isinstance(d, TTFBMetricsData) and d.value > 0]
    assert len(ttfb) >= 2 * RUNS, f"TTFB metrics of the turns that spoke: {ttfb}"
    assert out["session_voice"] == voice_id


def test_token_aggregation_speaks_what_the_server_segments(server: Any, voice_id: str) -> None:
    """LLM tokens streamed into one context: the same audio as the whole text at once."""
    text = "Well, let me think about that one. The answer, as far as I can tell, is forty two."

    async def scenario() -> tuple[bytes, bytes]:
        gen = agent(server, voice_id, TextAggregationMode.TOKEN)
        a = await anext(gen)
        try:
            await a.turn(text, tokens=True)
            cid, _ = await a.first_audio_of_new_context(0)
            await a.wait(lambda: a.stopped(cid))
            got = b"".join(f.audio for f in a.sink.audio(cid))
        finally:
            await gen.aclose()
        c = StreamClient(server.ws, voice=voice_id, seed=7, sampling=GREEDY, format=f"pcm_s16le_{RATE}")
        want = b""
        async with c.session() as s:
            await s.send_text(text)
            await s.end()
            async for ev in s:
                if isinstance(ev, Audio):
                    want += ev.data
        return got, want

    got, want = asyncio.run(scenario())
    assert len(want) > 0 and got == want


def test_sentence_aggregation_speaks_each_sentence(server: Any, voice_id: str) -> None:
    async def scenario() -> tuple[list[Any], bytes]:
        gen = agent(server, voice_id)
        a = await anext(gen)
        try:
            await a.turn("One short sentence. And then a second one!", tokens=True)
            cid, _ = await a.first_audio_of_new_context(0)
            await a.wait(lambda: a.stopped(cid))
            segments = [ev for _, k, c, ev in a.tts.wire if k == "SegmentInfo" and c == cid]
            audio = b"".join(f.audio for f in a.sink.audio(cid))
        finally:
            await gen.aclose()
        return segments, audio

    segments, audio = asyncio.run(scenario())
    assert [s.text for s in segments] == ["One short sentence.", "And then a second one!"]
    assert len(audio) == 2 * RATE * segments[-1].end_frame * 0.08 // 1 or len(audio) > 0
    assert np.frombuffer(audio, dtype="<i2").size > 0


def test_a_voice_change_opens_a_session_with_the_new_voice(server: Any, voice_id: str) -> None:
    from pipecat.frames.frames import TTSUpdateSettingsFrame

    from streamtts.integrations.pipecat import StreamTTSSettings

    async def scenario() -> tuple[str, str, Any, Any, int]:
        gen = agent(server, voice_id)
        a = await anext(gen)
        try:
            assert a.tts.session is not None and a.tts.session.ready is not None
            before = a.tts.session.ready
            await a.task.queue_frame(TTSUpdateSettingsFrame(delta=StreamTTSSettings(voice="alloy")))
            await a.wait(lambda: a.tts.session is not None and a.tts.session.ready is not None
                         and a.tts.session.ready.session != before.session)
            await a.turn("Now in the other voice.")
            cid, _ = await a.first_audio_of_new_context(0)
            await a.wait(lambda: a.stopped(cid))
            after = a.tts.session.ready
            n = len(a.sink.audio(cid))
        finally:
            await gen.aclose()
        return before.voice, after.voice, before.session, after.session, n

    v0, v1, s0, s1, frames = asyncio.run(scenario())
    assert (v0, v1) == (voice_id, "alloy") and s0 != s1 and frames > 0


def test_pipecats_own_openai_service_pointed_at_the_server(server: Any) -> None:
    """Pipecat's OpenAITTSService (OpenAI voice names only, `response_format: "pcm"`, with
    `instructions` and `speed`) works against the server's /v1/audio/speech unchanged."""
    from pipecat.frames.frames import ErrorFrame, TTSSpeakFrame
    from pipecat.services.openai.tts import OpenAITTSService

    text = "Hello there, this is Pipecat's own OpenAI service."

    async def scenario() -> tuple[bytes, list[Any]]:
        tts = OpenAITTSService(
            api_key="unused",
            base_url=server.http + "/v1",
            settings=OpenAITTSService.Settings(voice="alloy", instructions="Calm and warm.", speed=1.25),
        )
        sink = Collector()
        worker = PipelineWorker(Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=24000),
                                idle_timeout_secs=None, check_dangling_tasks=False)
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        run = asyncio.create_task(runner.run())
        try:
            await worker.queue_frame(TTSSpeakFrame(text))
            async with asyncio.timeout(120):
                while not any(isinstance(f, TTSStoppedFrame) for _, f in sink.frames):
                    await asyncio.sleep(0.01)
        finally:
            await worker.queue_frame(EndFrame())
            await asyncio.wait_for(run, 30)
        audio = b"".join(f.audio for f in sink.audio())
        return audio, [f for _, f in sink.frames if isinstance(f, ErrorFrame)]

    audio, errors = asyncio.run(scenario())
    assert errors == [] and len(audio) > 0
    import httpx

    body = {"input": text, "voice": "alloy", "response_format": "pcm", "instructions": "Calm and warm."}
    plain = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=120).content
    # sampled speech (no seed) differs run to run; the length is the speed's doing
    ratio = len(plain) / len(audio)
    assert 1.1 < ratio < 1.45, f"speed 1.25: {len(audio)} bytes vs {len(plain)} at speed 1"


def test_the_example_agent_runs(server: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    import soundfile as sf

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "agent.wav"
    r = subprocess.run(
        [sys.executable, str(root / "examples" / "pipecat_agent.py"), "--server", server.http, "--save", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "interrupting" in r.stdout and "second reply: audio after" in r.stdout
    x, sr = sf.read(out)
    assert sr == 16000 and x.size > sr  # both replies: > 1 s
    bad = subprocess.run(
        [sys.executable, str(root / "examples" / "pipecat_agent.py"), "--server", "http://127.0.0.1:9", "--save", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "is `streamtts serve` running?" in bad.stderr


def test_an_interrupted_turn_enters_the_context_as_the_words_heard(server: Any, voice_id: str) -> None:
    """Barge-in through the real pipeline: the server's word times go to Pipecat's
    ``add_word_timestamps``, so Pipecat's own assistant aggregator puts into the LLM context
    only the words whose audio was played before the interruption, not the whole reply."""
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator

    from streamtts.server.protocol import Alignment

    async def scenario() -> dict[str, Any]:
        context = LLMContext()
        assistant = LLMAssistantAggregator(context)
        stopped: list[Any] = []

        @assistant.event_handler("on_assistant_turn_stopped")  # type: ignore[untyped-decorator]
        async def on_stopped(_agg: Any, message: Any) -> None:
            stopped.append(message)

        gen = agent(server, voice_id, after_tts=(assistant,))
        a = await anext(gen)
        tts, sink = a.tts, a.sink
        try:
            await a.turn(LONG)
            c1, _ = await a.first_audio_of_new_context(0)
            # about 1.5 s of the reply played, then the user barges in
            await a.wait(lambda: sum(len(f.audio) for f in sink.audio(c1)) >= 3 * RATE)
            played_s = sum(len(f.audio) for f in sink.audio(c1)) / (2 * RATE)
            await a.task.queue_frame(InterruptionFrame())
            await a.wait(lambda: any(k == "Done" and c == c1 for _, k, c, _ in tts.wire))
            await a.wait(lambda: bool(stopped))
            await asyncio.sleep(0.2)  # anything still in flight would land now
            words = [w for _, k, c, ev in tts.wire if k == "Alignment" and c == c1 for w in ev.words if isinstance(ev, Alignment)]
            return {
                "played_s": played_s,
                "played_after_s": sum(len(f.audio) for f in sink.audio(c1)) / (2 * RATE),
                "words": words,
                "messages": context.get_messages(),
                "stopped": stopped,
                "done": next(ev for _, k, c, ev in tts.wire if k == "Done" and c == c1),
            }
        finally:
            await gen.aclose()

    out = asyncio.run(scenario())
    said = [m for m in out["messages"] if m.get("role") == "assistant"]
    assert said, f"no assistant message in the context: {out['messages']}"
    content = said[-1]["content"]
    text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
    heard = text.split()
    print(f"\nplayed {out['played_s']:.2f} s ({out['played_after_s']:.2f} s at the cancel), context: {text!r}")
    assert out["stopped"][-1].interrupted
    assert 0 < len(heard) < len(LONG.split()), "the whole reply (or nothing) entered the context"
    assert LONG.split()[: len(heard)] == heard  # the reply's first words, in order
    # every word timed inside the audio the pipeline played is kept; none that had not started
    # in the audio the server had sent when the cancel came (its done says how far that was).
    # Pipecat adds a word to the context when the playback clock reaches the word's *start*, so
    # the context may hold one word more than the server's `sent`, which counts whole words.
    played = sum(1 for w in out["words"] if w.end <= out["played_after_s"])
    sent = out["done"].sent
    assert sent is not None and sent.text is not None and sent.words is not None
    started = sum(1 for w in out["words"] if w.start < sent.audio_s)
    assert played <= len(heard) <= started, (played, len(heard), started, sent)
    assert sent.words <= started and sent.text.split() == LONG.split()[: sent.words]
