# ruff: noqa: F811  (the imported `engine` fixture is taken as a parameter)
"""Every prompt field, speakers and a continuation prefix through ``Engine.stream`` (and
``SyncEngine``) down to the prompt the engine builds, on the demo model.

What reaches the prompt is read where the preparer hands it to the prompt builder (its
:class:`PromptSpec`): the rows themselves are core/prompt.py's business (tests/core). A long
dialogue is spoken in segments; each segment's prompt must carry every speaker's voice.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from long_text_engine import engine  # noqa: F401 (the module's fixture)

from streamtts.core.family import MEMBERS
from streamtts.core.prompt import PromptSpec
from streamtts.engine.assemble import model_member
from streamtts.engine.frontend import Engine
from streamtts.engine.prepare import join_prefix_text
from streamtts.errors import InputError, ModelFileError
from streamtts.request import StreamOptions, Voice
from streamtts.request.voices import speaker_tuple
from streamtts.sync import SyncEngine

SHORT = StreamOptions(seed=1, max_new_tokens=36)
# a dialogue too long for one generation at n_ctx 512: several segments, turns cut mid-way
LONG_DIALOGUE = " ".join(
    f"[S1] Turn {i} of the first speaker goes on for a while. Then it has more to say, at length. "
    f"[S2] And the second one answers turn {i}. At some length, too."
    for i in range(4)
)


def codes(t: int, n_vq: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, (t, n_vq))


@pytest.fixture
def specs(engine: tuple[Engine, Any], monkeypatch: pytest.MonkeyPatch) -> list[PromptSpec]:
    """Every PromptSpec the preparer builds a prompt from, in order."""
    eng, _ = engine
    seen: list[PromptSpec] = []
    build = eng._preparer.prompts.build

    def spy(spec: PromptSpec, **kw: Any) -> Any:
        seen.append(spec)
        return build(spec, **kw)

    monkeypatch.setattr(eng._preparer.prompts, "build", spy)
    return seen


def run(engine: tuple[Engine, asyncio.AbstractEventLoop], text: str, **kw: Any) -> Any:
    eng, loop = engine

    async def main() -> Any:
        s = eng.stream(text, **kw)
        async with s:
            frames = sum([len(c.frames) async for c in s])
        return s, frames

    return loop.run_until_complete(main())


def test_every_option_field_reaches_the_prompt(engine: Any, specs: list[PromptSpec]) -> None:
    opts = StreamOptions(
        seed=1, max_new_tokens=36, instruction="A calm voice.", quality="high", tokens=20,
        sound_event="a door", ambient_sound="rain", language="English",
    )  # fmt: skip
    run(engine, "Hello there.", options=opts)
    (spec,) = specs
    assert (spec.text, spec.instruction, spec.quality, spec.tokens) == ("Hello there.", "A calm voice.", "high", 20)
    assert (spec.sound_event, spec.ambient_sound) == ("a door", "rain")
    assert spec.language == "en"  # moss-tts (the demo model) writes codes: a name becomes its code


def test_language_in_the_members_form(engine: Any, specs: list[PromptSpec], monkeypatch: pytest.MonkeyPatch) -> None:
    eng, _ = engine
    monkeypatch.setattr(eng._preparer, "member", MEMBERS["moss-tts-v1.5"])
    for given in ("en", "English", "EN"):
        run(engine, "Hello there.", options=SHORT, language=given)
    run(engine, "Hello there.", options=SHORT, language="Klingon")  # outside the table: as given
    assert [s.language for s in specs] == ["English", "English", "English", "Klingon"]
    with pytest.raises(InputError, match="language is empty"):
        run(engine, "Hello there.", options=SHORT, language=" ")


def test_a_sound_needs_no_text(engine: Any, specs: list[PromptSpec]) -> None:
    _, frames = run(engine, "", options=StreamOptions(seed=1, max_new_tokens=36, ambient_sound="rain", tokens=8))
    assert frames > 0
    assert specs[0].text is None and specs[0].ambient_sound == "rain"
    with pytest.raises(InputError, match="empty text is valid only with ambient_sound"):
        run(engine, "  ", options=SHORT)


def test_speakers_become_references_by_position(engine: Any, specs: list[PromptSpec]) -> None:
    a, b = Voice.from_codes(codes(6, seed=1)), Voice.from_codes(codes(7, seed=2))
    run(engine, "[S1] Hi. [S3] Hello.", speakers={"S3": b, "s1": a}, options=SHORT)
    refs = specs[0].references
    assert len(refs) == 3 and refs[1] is None and specs[0].reference_codes is None
    assert np.array_equal(refs[0], a.codes) and np.array_equal(refs[2], b.codes)


@pytest.mark.parametrize(
    ("text", "speakers", "error"),
    [
        ("[S1] Hi. [S2] Hello.", {"S1": 1}, r"speaker tag \[S2\] but no voice is given for it"),
        ("[S1] Hi.", {"S1": 1, "S2": 2}, r"a voice is given for speaker \[S2\] but the text has no \[S2\] tag"),
        ("[S1] Hi.", {"Bob": 1}, r"'Bob' is not a speaker tag"),
        ("[S1] Hi.", {"S1": 1, "[S1]": 2}, r"S1 is given twice"),
    ],
)
def test_bad_speakers_are_named(engine: Any, text: str, speakers: dict[str, int], error: str) -> None:
    voices = {k: Voice.from_codes(codes(5, seed=v)) for k, v in speakers.items()}
    with pytest.raises(InputError, match=error):
        run(engine, text, speakers=voices, options=SHORT)


def test_reference_and_speakers_together_is_an_error(engine: Any) -> None:
    v = Voice.from_codes(codes(5))
    with pytest.raises(InputError, match="either reference .* or speakers"):
        run(engine, "[S1] Hi.", reference=v, speakers={"S1": v}, options=SHORT)


def test_voices_are_cut_to_the_models_codebooks(engine: Any, specs: list[PromptSpec]) -> None:
    wide = Voice.from_codes(codes(6, n_vq=40))  # more levels than the model reads: its first 32
    run(engine, "[S1] Hi.", speakers={"S1": wide}, options=SHORT)
    assert np.array_equal(specs[0].references[0], wide.codes[:, :32])
    with pytest.raises(InputError, match=r"speakers.S1: .*\(6, 16\); this model needs \(T, 32\)"):
        run(engine, "[S1] Hi.", speakers={"S1": Voice.from_codes(codes(6, n_vq=16))}, options=SHORT)
    with pytest.raises(InputError, match=r"prefix: .* must be in \[0, 1023\]"):
        run(engine, "Hi.", prefix=Voice(codes=np.full((4, 32), 5000)), options=SHORT)


def test_prefix_and_its_transcript(engine: Any, specs: list[PromptSpec]) -> None:
    p = Voice.from_codes(codes(9, seed=4))
    run(engine, "then the rest of the sentence.", prefix=p, prefix_text="Prefix words", options=SHORT)
    assert specs[0].text == "Prefix words then the rest of the sentence."
    assert np.array_equal(specs[0].prefix_codes, p.codes)
    with pytest.raises(InputError, match="prefix_text is the transcript of a prefix"):
        run(engine, "Hi.", prefix_text="Before", options=SHORT)


def test_a_long_dialogue_keeps_every_voice_in_every_segment(engine: Any, specs: list[PromptSpec]) -> None:
    a, b = Voice.from_codes(codes(6, seed=1)), Voice.from_codes(codes(8, seed=2))
    s, frames = run(engine, LONG_DIALOGUE, speakers={"S1": a, "S2": b}, options=SHORT)
    assert s.segments is not None and len(s.segments) >= 3 and frames > 0
    spoken = specs[1:]  # the first is the whole text's, found too long
    assert len(spoken) == len(s.segments)
    for spec in spoken:  # every segment: both voices, and it starts with whoever speaks first
        assert np.array_equal(spec.references[0], a.codes) and np.array_equal(spec.references[1], b.codes)
        assert spec.text is not None and spec.text.lstrip().startswith(("[S1]", "[S2]")), spec.text


def test_a_long_continuation_continues_in_its_first_segment_only(engine: Any, specs: list[PromptSpec]) -> None:
    p = Voice.from_codes(codes(9, seed=4))
    s, _ = run(engine, LONG_DIALOGUE.replace("[S1] ", "").replace("[S2] ", ""), prefix=p, options=SHORT)
    assert s.segments is not None and len(s.segments) >= 2
    assert [spec.prefix_codes is not None for spec in specs[1:]] == [True] + [False] * (len(s.segments) - 1)


def test_voice_from_codes_checks_its_codes() -> None:
    assert Voice.from_codes(np.zeros((3, 16), np.int32), "x").codes.dtype == np.int64
    for bad, error in [
        (np.zeros((0, 32), int), r"shape \(0, 32\)"),
        (np.zeros(32, int), "shape"),
        (np.zeros((3, 32)), "integers"),
        (np.full((3, 32), 1024), r"in \[0, 1023\]"),
    ]:
        with pytest.raises(InputError, match=error):
            Voice.from_codes(bad)


def test_dialogue_helpers() -> None:
    assert speaker_tuple({"S2": "b"}) == (None, "b")
    assert join_prefix_text("Prefix words", "then") == "Prefix words then"
    assert join_prefix_text("[S1] Hi. ", "[S2] Yo.") == "[S1] Hi. [S2] Yo."


def test_the_member_comes_from_the_model_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    assert model_member(None).kind == "moss-tts"
    cfg.write_text(json.dumps({"n_vq": 16}))
    assert model_member(cfg).kind == "moss-tts"
    cfg.write_text(json.dumps({"model_kind": "moss-ttsd"}))
    assert model_member(cfg).kind == "moss-ttsd"
    cfg.write_text(json.dumps({"model_kind": "moss-tts-9"}))
    with pytest.raises(ModelFileError, match="unknown model kind 'moss-tts-9'"):
        model_member(cfg)


def test_sync_engine_takes_the_same_arguments(demo_model_dir: Path) -> None:
    with SyncEngine(demo_model_dir / "config.yaml", max_streams=1, n_threads=2) as tts:
        v = Voice.from_codes(codes(6))
        opts = StreamOptions(seed=1, max_new_tokens=36, rows=True)
        chunks = list(tts.stream("[S1] Hi. [S2] Yo.", speakers={"S1": v, "S2": v}, options=opts))
        assert chunks and tts.engine.model_kind == "moss-tts"
        rows = np.concatenate([c.rows for c in chunks if c.rows is not None])
        assert rows.shape[1] == 33 and rows.shape[0] >= 1


def test_the_configs_prompt_template_picks_the_template(demo_model_dir: Path) -> None:
    """``prompt_template`` in the engine config picks the template every prompt is built with
    (here MOSS-TTSD's on the demo model): its rules come with it (a tag without a voice allowed,
    a field it does not write refused naming why); an unknown one fails the load, naming the
    known ones."""
    from streamtts.core.prompt import HFTokenizer
    from streamtts.errors import ConfigError

    with SyncEngine(demo_model_dir / "config.yaml", max_streams=1, n_threads=2, warmup=False,
                    prompt_template="moss-ttsd") as tts:  # fmt: skip
        with pytest.raises(InputError, match="tokens: MOSS-TTSD-v1.0's own processor writes Tokens and Scene as None"):
            list(tts.stream("Hi.", options=StreamOptions(seed=1, max_new_tokens=36, tokens=20)))
        v = Voice.from_codes(codes(6))
        got = list(tts.stream("[S1] Hi. [S2] Yo.", speakers={"S2": v}, options=StreamOptions(seed=1, max_new_tokens=36)))
        assert got
        prompt = tts.engine._preparer.prompts.build(PromptSpec(text="[S1] Hi.", references=(None, v.codes))).rows
        text = HFTokenizer(tts.engine.config.tokenizer_dir).decode([int(t) for t in prompt[:, 0]])
        assert "- Reference(s):\n[S1]: None\n[S2]:\n" in text and "- Scene:\nNone\n- Text:\n[S1] Hi." in text
    with pytest.raises(ConfigError, match="unknown prompt_template 'nope'"):
        SyncEngine(demo_model_dir / "config.yaml", max_streams=1, n_threads=2, warmup=False, prompt_template="nope")
