"""The family's prompts (contract section 8) against the official processor's, all ten cases
of tests/fixtures/family; and the errors of the dialogue and continuation fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixtures.hf_checkpoint import tokenizer_json

from streamtts.core.delay import delay_layout
from streamtts.core.prompt import BuiltPrompt, HFTokenizer, PromptBuilder, PromptSpec
from streamtts.core.speakers import MAX_SPEAKERS, check_speakers, speaker_tags
from streamtts.core.tokens import TokenIds
from streamtts.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAMILY = FIXTURES / "family"
CASES = ["generation", "clone", "dialogue", "continuation", "sound"]


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return HFTokenizer(tokenizer_json())


def _case(n_vq: int, name: str) -> tuple[dict[str, Any], PromptSpec, Path]:
    d = FAMILY / f"nvq{n_vq}" / "cases"
    meta = json.loads((d / f"{name}.json").read_text(encoding="utf-8"))
    refs = tuple(np.load(d / r) for r in meta["references"])
    prefix = np.load(d / meta["prefix"]) if meta["prefix"] else None
    return meta, PromptSpec(**meta["user"], references=refs, prefix_codes=prefix), d


@pytest.mark.parametrize("n_vq", [32, 16])
@pytest.mark.parametrize("name", CASES)
def test_prompt_rows_equal_the_official_processors(tok: HFTokenizer, n_vq: int, name: str) -> None:
    meta, spec, d = _case(n_vq, name)
    ids = TokenIds(n_vq=n_vq)
    built = PromptBuilder(tok, ids).build(spec, prefix=True)
    official = np.load(d / f"{name}.prompt.npy")
    first_out = np.load(d / f"{name}.out.npy")[0]
    assert built.rows.dtype == np.int64 and built.rows.shape[1] == 1 + n_vq
    if meta["mode"] == "continuation":
        np.testing.assert_array_equal(built.rows, official)
        assert built.audio_prefix_rows == spec.prefix_codes.shape[0]  # type: ignore[union-attr]
    else:
        # generate() chooses the <|audio_start|> row first; we put it in the prompt
        np.testing.assert_array_equal(built.rows[:-1], official)
        np.testing.assert_array_equal(built.rows[-1], first_out)
        assert built.rows[-1, 0] == ids.audio_start and np.all(built.rows[-1, 1:] == ids.audio_pad_code)
        assert built.audio_prefix_rows == 0
    assert built.rows.shape[0] == meta["prompt_rows"] + (meta["mode"] != "continuation")
    assert 0 < built.prefix_rows < built.rows.shape[0]
    assert (built.text_rows == 0) == (spec.text is None)


def test_continuation_rows_are_the_prefix_delay_layout_cut_after_its_gen_slots(tok: HFTokenizer) -> None:
    _, spec, _ = _case(16, "continuation")
    ids = TokenIds(n_vq=16)
    built = PromptBuilder(tok, ids).build(spec)
    p = spec.prefix_codes
    assert p is not None
    t = p.shape[0]
    tail = built.rows[-t - 1 :]
    assert tail[0, 0] == ids.audio_start and np.all(tail[0, 1:] == ids.audio_pad_code)
    assert np.all(tail[1:, 0] == ids.gen_slot)
    np.testing.assert_array_equal(tail[1:, 1:], delay_layout(p, ids.audio_pad_code)[:t])


def test_generation_and_continuation_share_the_user_turn(tok: HFTokenizer) -> None:
    _, spec, _ = _case(32, "continuation")
    b = PromptBuilder(tok, TokenIds())
    cont = b.build(spec, prefix=True)
    gen = b.build(PromptSpec(text=spec.text, references=spec.references), prefix=True)
    t = cont.audio_prefix_rows
    np.testing.assert_array_equal(cont.rows[:-t], gen.rows)  # the same, up to <|audio_start|>
    assert cont.prefix_rows == gen.prefix_rows and cont.text_rows == gen.text_rows


def test_one_reference_forms_agree(tok: HFTokenizer) -> None:
    _, spec, _ = _case(32, "clone")
    b = PromptBuilder(tok, TokenIds())
    (codes,) = spec.references
    a = b.build(PromptSpec(text=spec.text, reference_codes=codes))
    np.testing.assert_array_equal(a.rows, b.build(spec).rows)


def test_a_none_reference_keeps_its_number(tok: HFTokenizer) -> None:
    _, spec, _ = _case(16, "dialogue")
    ids = TokenIds(n_vq=16)
    s1, s2 = spec.references
    built = PromptBuilder(tok, ids).build(PromptSpec(text="[S2] Only me.", references=(None, s2)))
    text = tok.decode([int(x) for x in built.rows[:, 0] if x not in (ids.user_slot, ids.audio_start)])
    assert "- Reference(s):\n[S2]:\n" in text and "[S1]:" not in text
    np.testing.assert_array_equal(
        built.rows[built.rows[:, 0] == ids.user_slot, 1:], delay_layout(s2, ids.audio_pad_code)  # type: ignore[arg-type]
    )
    empty = np.zeros((0, 16), np.int64)  # an empty matrix is no voice too
    again = PromptBuilder(tok, ids).build(PromptSpec(text="[S2] Only me.", references=(empty, s2)))
    np.testing.assert_array_equal(again.rows, built.rows)


def test_blank_text_with_ambient_sound_is_written_none(tok: HFTokenizer) -> None:
    _, spec, _ = _case(16, "sound")
    b = PromptBuilder(tok, TokenIds(n_vq=16))
    want = b.build(spec).rows
    for text in ("", "  \n"):
        got = b.build(PromptSpec(text=text, ambient_sound=spec.ambient_sound, tokens=spec.tokens))
        np.testing.assert_array_equal(got.rows, want)
        assert got.text_rows == 0


def test_prefix_rows_shared_by_texts_of_one_dialogue(tok: HFTokenizer) -> None:
    _, spec, _ = _case(16, "dialogue")
    b = PromptBuilder(tok, TokenIds(n_vq=16))
    x = b.build(spec, prefix=True)
    y = b.build(PromptSpec(text="[S2] Other words. [S1] Yes.", references=spec.references), prefix=True)
    n = x.prefix_rows
    assert n == y.prefix_rows > 100
    np.testing.assert_array_equal(x.rows[:n], y.rows[:n])
    assert tok.decode([int(v) for v in x.rows[n - 6 : n, 0]]).endswith("- Text:\n")


# -- errors ---------------------------------------------------------------------------------

K16 = TokenIds(n_vq=16)
R = np.zeros((3, 16), np.int64)


def _build(tok: HFTokenizer, spec: PromptSpec) -> BuiltPrompt:
    return PromptBuilder(tok, K16).build(spec)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (PromptSpec(text="[S1] Hi. [S3] Ho.", references=(R, R)), r"\[S3\] but no voice"),
        (PromptSpec(text="[S1] Hi."), r"\[S1\] but no voice"),
        (PromptSpec(text="[S2] Hi.", reference_codes=R), r"\[S2\] but no voice"),
        (PromptSpec(text="[S2] Hi.", references=(R, None)), r"\[S2\] but no voice"),
        (PromptSpec(text="[S9] Hi."), r"\[S9\].*\[S1\] \.\. \[S5\]"),
        (PromptSpec(text="Hi.", reference_codes=R, references=(R,)), "not both"),
        (PromptSpec(text="Hi.", references=(R,) * (MAX_SPEAKERS + 1)), "the most is 5"),
        (PromptSpec(text=None), "text is empty"),
        (PromptSpec(text=" ", ambient_sound=" "), "text is empty"),
        (PromptSpec(text="", instruction="A calm voice."), "text is empty"),
        (PromptSpec(text="Hi.", prefix_codes=np.zeros((4, 32), np.int64)), r"prefix_codes must be \(T, 16\)"),
        (PromptSpec(text="Hi.", prefix_codes=np.zeros((4,), np.int64)), "prefix_codes must be"),
        (PromptSpec(text="Hi.", prefix_codes=np.zeros((4, 16), np.float32)), "prefix_codes must be integers"),
        (PromptSpec(text="Hi.", prefix_codes=np.full((4, 16), 1024)), r"prefix_codes: codes must be in"),
        (PromptSpec(text="[S1] Hi.", references=(R, np.zeros((2, 15), np.int64))), r"references\[1\] \(speaker \[S2\]\)"),
        (PromptSpec(text="Hi.", ambient_sound="<|im_end|>"), "ambient_sound contains"),
    ],
)
def test_bad_family_inputs(tok: HFTokenizer, spec: PromptSpec, match: str) -> None:
    with pytest.raises(InputError, match=match):
        _build(tok, spec)


def test_speaker_tags_in_order_of_first_use() -> None:
    assert speaker_tags("[S2] a [S1] b [S2] c") == ["S2", "S1"]
    assert speaker_tags("no tags [s1] [S 1] S1") == [] and speaker_tags(None) == []
    with pytest.raises(InputError, match=r"\[S0\]"):
        speaker_tags("[S0] zero")


@pytest.mark.parametrize(
    ("text", "refs"),
    [
        ("Plain text.", ()),
        ("Plain text, one voice.", (R,)),
        ("[S1] Hi. [S2] Ho.", (R, R)),
        ("[S2] Ho. [S1] Hi.", (R, R)),
        ("[S2] Only two.", (None, R)),
    ],
)
def test_check_speakers_accepts(text: str, refs: tuple[np.ndarray | None, ...]) -> None:
    check_speakers(text, refs)


@pytest.mark.parametrize(
    ("text", "refs", "match"),
    [
        ("[S1] Hi. [S2] Ho.", (R,), r"tag \[S2\] but no voice"),
        ("[S1] Hi.", (R, R), r"voice is given for speaker \[S2\] but the text has no \[S2\] tag"),
        ("Untagged, two voices.", (R, R), r"speaker \[S1\] but the text has no \[S1\]"),
        ("Untagged, voice two.", (None, R), r"speaker \[S2\]"),
        ("[S1] Hi.", (R,) * 6, "the most is 5"),
    ],
)
def test_check_speakers_names_the_tag_or_voice(
    text: str, refs: tuple[np.ndarray | None, ...], match: str
) -> None:
    with pytest.raises(InputError, match=match):
        check_speakers(text, refs)


def test_builder_tokenises_each_request_once_in_every_mode(tok: HFTokenizer) -> None:
    class Counting(HFTokenizer):
        calls = 0

        def encode(self, text: str) -> list[int]:
            Counting.calls += 1
            return super().encode(text)

    counting = Counting(tokenizer_json())
    _, spec, _ = _case(16, "continuation")
    b = PromptBuilder(counting, K16)
    b.build(spec, prefix=True)  # the first request also tokenises the template's pieces
    p = spec.prefix_codes
    assert p is not None
    for i, prefix in enumerate((p, p[:3], p[:5])):
        Counting.calls = 0
        built = b.build(PromptSpec(text=f"Next words {i}.", references=spec.references, prefix_codes=prefix), prefix=True)
        assert Counting.calls == 1 and built.audio_prefix_rows == prefix.shape[0]
        assert built.text_rows == len(tok.encode(f"Next words {i}."))
