# ruff: noqa: F811  (the imported `engine` fixture is taken as a parameter)
"""Each stage a request's text goes through runs once: one normalisation (a long text is
split after it, and its segments are not normalised again), one tokenisation, one end
fade, one codec ``forget`` per stream. Real engine on the demo model; the counters wrap
the real normaliser, tokenizer and codec."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from long_text_engine import engine  # noqa: F401 (the module's fixture)

from streamtts.config import SamplingParams
from streamtts.core.prompt import HFTokenizer
from streamtts.engine import prepare
from streamtts.engine.decoding import END_FADE_SAMPLES
from streamtts.engine.frontend import Engine
from streamtts.engine.segmented import SegmentAudio, speak_segments
from streamtts.request import StreamOptions
from streamtts.text.normalize import normalize_text
from streamtts.text.segmenter import split_text

# greedy: the compared streams run at different times (prefix cache hit or not), and an
# argmax does not flip on llama.cpp's last bits
GREEDY = StreamOptions(seed=5, sampling=SamplingParams.greedy(), max_new_tokens=60)
# normalisation changes where it is cut: "..." and "!!" become "。" and "！" (sentence ends)
LONG = " ".join(f"Sentence number {i} goes on for a while... and part {i} ends!! So {i}" for i in range(7))


def spy(calls: list[Any], fn: Callable[..., Any], arg: int = 0) -> Callable[..., Any]:
    """``fn``, recording its ``arg``-th argument of every call in ``calls``."""

    def wrapper(*args: Any) -> Any:
        calls.append(args[arg])
        return fn(*args)

    return wrapper


def speak(eng: Engine, loop: asyncio.AbstractEventLoop, text: str, options: StreamOptions) -> tuple[Any, np.ndarray]:
    async def main() -> tuple[Any, np.ndarray]:
        s = eng.stream(text, options=options)
        async with s:
            pcm = [c.pcm async for c in s]
        return s, np.concatenate(pcm)

    return loop.run_until_complete(main())


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """(texts normalised, strings tokenised) from now on."""
    normalised: list[str] = []
    tokenised: list[str] = []
    monkeypatch.setattr(prepare, "normalize_text", spy(normalised, prepare.normalize_text))
    monkeypatch.setattr(HFTokenizer, "encode", spy(tokenised, HFTokenizer.encode, arg=1))
    return normalised, tokenised


def test_a_request_is_normalised_once_and_its_text_tokenised_once(
    engine: Any, counted: tuple[list[str], list[str]]
) -> None:
    eng, loop = engine
    normalised, tokenised = counted
    text = "Hello there, this is a request."
    speak(eng, loop, text, StreamOptions(seed=1, max_new_tokens=40))
    assert normalised == [text]
    assert sum(text in t for t in tokenised) == 1  # the whole prompt, once
    # the template's pieces without the text are remembered: the next request of the same
    # voice and fields tokenises nothing but its prompt
    normalised.clear()
    tokenised.clear()
    other = "And a second request, with other words."
    speak(eng, loop, other, StreamOptions(seed=2, max_new_tokens=40))
    assert normalised == [other]
    assert len(tokenised) == 1 and other in tokenised[0]


def test_a_long_text_is_normalised_once_and_split_after_normalisation(
    engine: Any, counted: tuple[list[str], list[str]]
) -> None:
    eng, loop = engine
    normalised, tokenised = counted
    s, pcm = speak(eng, loop, LONG, StreamOptions(seed=3, max_new_tokens=40))
    clean = normalize_text(LONG)
    assert s.segments == split_text(clean) and len(s.segments) >= 3
    assert s.segments != split_text(LONG)  # the test tells the two apart
    assert normalised == [LONG]  # not again per segment
    assert sum(clean in t for t in tokenised) == 1
    for seg in s.segments:  # each segment's own prompt, once
        assert sum(seg in t and clean not in t for t in tokenised) == 1, seg
    assert pcm.size == s.stats.frames * 1920 > 0


def test_a_stream_is_forgotten_by_the_codec_once(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    eng, loop = engine
    codec = eng._decoder.codec
    forgot: list[int] = []
    monkeypatch.setattr(codec, "forget", spy(forgot, codec.forget))
    s, pcm = speak(eng, loop, "Say this and then forget it.", StreamOptions(seed=4, max_new_tokens=40))
    assert pcm.size > 0
    # the decode thread works in order: once a later stream has finished, it is done with the
    # first one (which it may still be forgetting when its consumer learns it is over)
    later, _ = speak(eng, loop, "And then this one.", StreamOptions(seed=4, max_new_tokens=40))
    assert forgot.count(s.rid) == 1 and forgot.count(later.rid) >= 1


def test_a_segment_ends_with_the_engines_fade_only(engine: Any) -> None:
    eng, loop = engine
    text = "One segment on its own, to compare."
    _, single = speak(eng, loop, text, GREEDY)

    async def segmented() -> np.ndarray:
        parts = [ev.pcm async for ev in speak_segments(eng, [text], options=GREEDY) if isinstance(ev, SegmentAudio)]
        return np.concatenate(parts)

    seg = loop.run_until_complete(segmented())
    n = END_FADE_SAMPLES
    assert seg.shape == single.shape and single[-1] == 0.0  # the engine faded the stream's end
    # the same audio, faded in at the start and nothing else (the chunking may differ: the
    # streaming decode equals the offline one to float noise)
    ramp = (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)  # the joiner's
    want = single.copy()
    want[:n] *= ramp
    np.testing.assert_allclose(seg, want, rtol=0, atol=1e-5)
    # fading the end a second time would show: the end is not near 0 before its last samples
    assert np.max(np.abs(single[-n:] * ramp[::-1] - single[-n:])) > 1e-3
