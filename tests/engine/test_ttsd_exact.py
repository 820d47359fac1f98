"""MOSS-TTSD-v1.0 served exactly as its own checkpoint code serves it: the five cases of
tests/fixtures/ttsd (made with the checkpoint's own processor and ``generate()``), prompt rows
and generated rows.

The checkpoint is converted by name (a folder called ``MOSS-TTSD-v1.0``, with the published
generation_config.json) with ``--quant F32``, so the bundle's own defaults are what is under
test: TTSD's template, references listed by position, the audio repetition penalty 1.1 from
generation_config.json. The cases called ``generate()`` with both temperatures 0 and that
penalty; so do we (the bundle's sampling with the temperatures set to 0), greedily in float32
end to end (``kv_cache_type_k/v: f32``, flash attention off, no prefix cache); rows compared as for
the family's cases (official_rows.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from fixtures.ttsd import CASES, cases_dir, ttsd_checkpoint
from official_rows import assert_official, stream_rows

from streamtts import Engine
from streamtts.convert.hf import convert_hf
from streamtts.demo.codec import write_codec
from streamtts.request import StreamOptions, Voice


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, bridge_lib: Any
) -> Iterator[tuple[Engine, asyncio.AbstractEventLoop, Path]]:
    root = tmp_path_factory.mktemp("ttsd")
    src = ttsd_checkpoint(root / "src")
    bundle = root / "MOSS-TTSD-GGUF"
    convert_hf(src, bundle, ["F32"], gpu=False)
    write_codec(root / "MOSS-Audio-Tokenizer-ONNX", n_vq=16)
    eng = Engine.from_config(
        bundle / "config.yaml", n_threads=1, max_streams=2, flash_attn="off", prefix_cache_mib=0,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    yield eng, loop, bundle
    loop.run_until_complete(eng.aclose())
    loop.close()


def _case(name: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    d = cases_dir()
    meta = json.loads((d / f"{name}.json").read_text(encoding="utf-8"))
    return meta, np.load(d / f"{name}.prompt.npy"), np.load(d / f"{name}.out.npy")


def _run(eng: Engine, loop: asyncio.AbstractEventLoop, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(prompt rows, generated rows) of the case through Engine.stream, as a user would ask:
    a voice for each speaker that has one (none for the others), the text as given."""
    meta, _, _ = _case(name)
    d = cases_dir()
    user = dict(meta["user"])
    text = user.pop("text")
    speakers = {f"S{i + 1}": Voice.from_codes(np.load(d / f)) for i, f in enumerate(meta["references"]) if f}
    kw: dict[str, Any] = {"speakers": speakers} if speakers else {}
    if meta["prefix"]:
        kw["prefix"] = Voice.from_codes(np.load(d / meta["prefix"]))
    # the bundle's sampling (TTSD's preset, generation_config.json's penalty), greedy
    sampling = msgspec.structs.replace(eng.config.sampling, text_temperature=0.0, audio_temperature=0.0)
    opts = StreamOptions(
        sampling=sampling, max_new_tokens=meta["max_new_tokens"], rows=True, normalize=False, **user
    )
    return stream_rows(eng, loop, text, opts, **kw)


def test_the_bundle_is_ttsds(engine: tuple[Engine, asyncio.AbstractEventLoop, Path]) -> None:
    """Converted by name: TTSD's template, its generate()'s text preset, generation_config.json's
    audio preset and length, a context that holds that length after a long prompt."""
    eng, _, bundle = engine
    cfg = eng.config
    assert eng.prompt_template.name == "moss-ttsd"
    assert (cfg.text_temperature, cfg.text_top_p, cfg.text_top_k) == (1.1, 0.9, 50)
    assert (cfg.audio_temperature, cfg.audio_top_p, cfg.audio_top_k, cfg.audio_repetition_penalty) == (
        1.1, 0.9, 50, 1.1,
    )  # fmt: skip
    assert cfg.max_new_tokens == 2000 and cfg.n_ctx >= 2000 + 1024
    assert "max_new_tokens: 2000" in (bundle / "config.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", CASES)
def test_ttsd_case_exactly(engine: tuple[Engine, asyncio.AbstractEventLoop, Path], name: str) -> None:
    eng, loop, _ = engine
    meta, want_prompt, want_rows = _case(name)
    prompt, rows = _run(eng, loop, name)
    assert_official(meta["mode"], prompt, rows, want_prompt, want_rows)


def test_normalisation_is_ttsds_own(engine: tuple[Engine, asyncio.AbstractEventLoop, Path]) -> None:
    """With normalisation on (the default), a TTSD model's text goes through MOSS-TTSD's own
    ``normalize_text`` (text/ttsd.py), not the GitHub processor's v1.5 normaliser."""
    from streamtts.core.prompt import PromptSpec
    from streamtts.text.normalize import normalize_text
    from streamtts.text.ttsd import normalize_ttsd

    eng, loop, _ = engine
    text = "[1] Well... it rained; a lot! [2] Ha ha, really?"
    assert normalize_ttsd(text) != normalize_text(text)

    prompt, _ = stream_rows(eng, loop, text, StreamOptions(seed=1, max_new_tokens=2, rows=True))
    want = eng._preparer.prompts.build(PromptSpec(text=normalize_ttsd(text))).rows
    np.testing.assert_array_equal(prompt, want)


def _wav(path: Path, seconds: float, hz: float, rate: int) -> Path:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, 0.3 * np.sin(2 * np.pi * hz * t), rate, subtype="PCM_16")
    return path


def test_a_continuation_of_the_speakers_own_clips(
    engine: tuple[Engine, asyncio.AbstractEventLoop, Path], tmp_path: Path
) -> None:
    """MOSS-TTSD's app continues the speakers' clips (``voice_clone_and_continuation``): each
    clip is its speaker's reference, the prefix is ONE encode of the clips joined end to end
    (each at 24 kHz first; here they come at 16 and 44.1 kHz), and the prompt's text is the
    transcripts tagged, then the dialogue, one speaker's turns merged (the fixture's
    continuation case has that text)."""
    from streamtts.audio.reference import load_clip
    from streamtts.core.prompt import PromptSpec

    eng, loop, _ = engine
    # 1.05 s and 0.9 s: 13.1 and 11.25 frames, 25 joined (24.4), 26 encoded apart (14 + 12)
    a, b = _wav(tmp_path / "a.wav", 1.05, 180.0, 16000), _wav(tmp_path / "b.wav", 0.9, 260.0, 44100)
    texts = {"S2": "Second prompt words.", "S1": "First prompt words."}
    opts = StreamOptions(seed=1, max_new_tokens=20, normalize=False, rows=True)
    prompt, _ = stream_rows(eng, loop, "[S1] Now the new line.", opts, speakers={"S1": a, "S2": b}, speaker_texts=texts)
    p = eng._preparer
    clip_a, clip_b = load_clip(a), load_clip(b)
    joined = p._encode(np.concatenate([clip_a, clip_b]))
    per_speaker = (p._encode(clip_a), p._encode(clip_b))
    want = p.prompts.build(PromptSpec(
        text="[S1]First prompt words.[S2]Second prompt words.[S1]Now the new line.",
        references=per_speaker, prefix_codes=joined,
    )).rows  # fmt: skip
    np.testing.assert_array_equal(prompt, want)
    assert joined.shape[0] == 25 and sum(c.shape[0] for c in per_speaker) == 26


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"speaker_texts": {"S3": "x"}}, "speaker_texts.S3: the transcript of S3's clip, but speakers gives no S3"),
        ({"speaker_texts": {"S1": " "}}, "speaker_texts.S1 must be the non-empty transcript"),
        ({"speaker_texts": {"S1": "x"}, "prefix_text": "y"}, "speaker_texts and prefix"),
        ({"speaker_texts": {"S2": "x"}}, "S2's voice is given as codes"),
    ],
)
def test_bad_speaker_texts_are_named(
    engine: tuple[Engine, asyncio.AbstractEventLoop, Path], tmp_path: Path, kw: dict[str, Any], match: str
) -> None:
    eng, loop, _ = engine
    speakers = {"S1": _wav(tmp_path / "a.wav", 1.0, 200.0, 24000), "S2": Voice.from_codes(np.zeros((4, 16), np.int64))}

    async def main() -> None:
        async with eng.stream("[S1] Hi. [S2] Yo.", speakers=speakers, options=StreamOptions(max_new_tokens=4), **kw) as s:
            async for _ in s:
                pass

    with pytest.raises(Exception, match=match):
        loop.run_until_complete(main())
