"""LiveKit Agents: the :mod:`streamtts.integrations.livekit` plugin with real ``livekit-agents``
against a real server (no LiveKit server: a ``SynthesizeStream`` is driven directly).

Pushed text becomes audio frames (the same audio as the whole text sent at once), ``flush``
speaks what is pending, ``aclose()`` stops the generation on the server and leaves the
socket open for the next stream, ``synthesize()`` streams a whole text.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("livekit.agents", reason="pip install 'streamtts[livekit]'")

from streamtts.client import Audio, StreamClient  # noqa: E402
from streamtts.integrations.livekit import TTS  # noqa: E402

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
RATE = 16000
TEXT = "Well, let me think about that one. The answer, as far as I can tell, is forty two."
LONG = " ".join(f"This is sentence number {i} of a long answer that gets cut short." for i in range(8))


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "4", "--n-threads", "2", "--segment-max-new-tokens", "44")


@pytest.fixture(scope="module")
def voice_id(server: Any, voice_wav: Path) -> str:
    return asyncio.run(StreamClient(server.ws).upload_voice(voice_wav.read_bytes()))


def make_tts(server: Any, voice: str) -> TTS:
    return TTS(url=server.ws, voice=voice, seed=5, sampling=GREEDY, sample_rate=RATE)


async def whole(server: Any, voice: str, text: str) -> bytes:
    """The same text sent at once over a plain session: what the plugin must give."""
    c = StreamClient(server.ws, voice=voice, seed=5, sampling=GREEDY, format=f"pcm_s16le_{RATE}")
    out = b""
    async with c.session() as s:
        await s.send_text(text)
        await s.end()
        async for ev in s:
            if isinstance(ev, Audio):
                out += ev.data
    return out


def same_audio(got: bytes, want: bytes) -> None:
    """``got`` is ``want``, plus at most LiveKit's 10 ms end-of-segment marker of silence."""
    assert len(want) > 0 and got[: len(want)] == want, f"{len(got)} bytes vs {len(want)}"
    tail = np.frombuffer(got[len(want):], dtype="<i2")
    assert tail.size <= RATE // 100 and not tail.any()


def test_stream_turns_pushed_tokens_into_audio_frames(server: Any, voice_id: str) -> None:
    async def scenario() -> tuple[list[Any], bytes]:
        tts = make_tts(server, voice_id)
        try:
            assert tts.capabilities.streaming and tts.capabilities.aligned_transcript
            stream = tts.stream()
            for word in TEXT.split(" "):
                stream.push_text(word + " ")
            stream.end_input()
            events = [ev async for ev in stream]
            await stream.aclose()
            want = await whole(server, voice_id, TEXT)
        finally:
            await tts.aclose()
        return events, want

    events, want = asyncio.run(scenario())
    assert len(events) > 2
    assert all(ev.frame.sample_rate == RATE and ev.frame.num_channels == 1 for ev in events)
    assert events[-1].is_final and len({ev.segment_id for ev in events}) == 1
    same_audio(b"".join(bytes(ev.frame.data.cast("b")) for ev in events), want)
    # the words ride on the frames as LiveKit's timed transcript (estimated times, in order)
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

    timed = [t for ev in events for t in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    assert "".join(timed).strip() == TEXT
    edges = [x for t in timed for x in (t.start_time, t.end_time)]
    assert edges == sorted(edges) and edges[-1] <= sum(ev.frame.duration for ev in events) + 0.02
    server.wait_idle()


def test_flush_speaks_what_is_pending(server: Any, voice_id: str) -> None:
    async def scenario() -> float:
        tts = make_tts(server, voice_id)
        try:
            stream = tts.stream()
            stream.push_text("Half a thought")  # no sentence end, under min_chars: waits
            stream.flush()
            t0 = time.monotonic()
            async with asyncio.timeout(60):
                first = await anext(aiter(stream))  # audio without end_input
            assert first.frame.samples_per_channel > 0
            waited = time.monotonic() - t0
            await stream.aclose()
        finally:
            await tts.aclose()
        return waited

    print(f"\nflushed text's first audio after {asyncio.run(scenario()):.3f} s")
    server.wait_idle()


def test_aclose_stops_the_generation_and_the_socket_stays_open(server: Any, voice_id: str) -> None:
    async def scenario() -> tuple[float, bytes, bytes]:
        tts = make_tts(server, voice_id)
        try:
            stream = tts.stream()
            stream.push_text(LONG)
            stream.end_input()
            it = aiter(stream)
            async with asyncio.timeout(60):
                for _ in range(3):
                    await anext(it)
            assert server.generating()
            session = tts.shared_session.session
            t0 = time.monotonic()
            await stream.aclose()
            while server.health()["active_streams"] or server.health()["queued_streams"]:
                assert time.monotonic() - t0 < 5, server.health()
                await asyncio.sleep(0.01)
            freed = time.monotonic() - t0
            # nothing more came for it; the next stream runs on the same socket
            assert stream.context is not None and stream.context.done is None
            again = tts.stream()
            again.push_text(TEXT)
            again.end_input()
            audio = b"".join([bytes(ev.frame.data.cast("b")) async for ev in again])
            await again.aclose()
            assert tts.shared_session.session is session
            want = await whole(server, voice_id, TEXT)
        finally:
            await tts.aclose()
        return freed, audio, want

    freed, audio, want = asyncio.run(scenario())
    print(f"\naclose -> engine streams freed after {1000 * freed:.0f} ms")
    same_audio(audio, want)
    server.wait_idle()


def test_synthesize_streams_a_whole_text(server: Any, voice_id: str) -> None:
    async def scenario() -> tuple[list[Any], bytes]:
        tts = make_tts(server, voice_id)
        try:
            async with tts.synthesize(TEXT) as chunked:
                events = [ev async for ev in chunked]
            want = await whole(server, voice_id, TEXT)
        finally:
            await tts.aclose()
        return events, want

    events, want = asyncio.run(scenario())
    assert len(events) > 1 and all(ev.frame.sample_rate == RATE for ev in events)
    same_audio(b"".join(bytes(ev.frame.data.cast("b")) for ev in events), want)
    server.wait_idle()
