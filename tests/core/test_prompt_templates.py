"""The prompt templates (core/prompt.py TEMPLATES): the default is the official processor's,
the TTSD variant writes a Scene line and a fixed Tokens line, and a field a template does not
write is an error rather than dropped. The tokenizer is the official fixture's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures.hf_checkpoint import tokenizer_json

from streamtts.core.family import MEMBERS
from streamtts.core.prompt import (
    DEFAULT_TEMPLATE,
    FIELDS,
    TEMPLATES,
    HFTokenizer,
    PromptBuilder,
    PromptSpec,
    build_prompt,
    field_lines,
    template,
)
from streamtts.core.tokens import TokenIds
from streamtts.errors import ConfigError, InputError

IDS = TokenIds()
CONTRACT_LINES = (  # ../shared/moss-tts-delay.md, section 3, between Reference(s) and Text
    "- Instruction:\n{instruction}\n- Tokens:\n{tokens}\n- Quality:\n{quality}\n- Sound Event:\n"
    "{sound_event}\n- Ambient Sound:\n{ambient_sound}\n- Language:\n{language}\n"
)


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return HFTokenizer(tokenizer_json())


def _text(tok: HFTokenizer, rows: np.ndarray) -> str:
    return tok.decode([int(t) for t in rows[:, 0]])


def test_every_member_defaults_to_the_official_template() -> None:
    assert {m.template for m in MEMBERS.values()} == {DEFAULT_TEMPLATE} and TEMPLATES["moss"].confirmed
    spec = PromptSpec(text="Hi.", instruction="calm", tokens=20, quality="high", sound_event="door",
                      ambient_sound="rain", language="English")  # fmt: skip
    assert field_lines(spec, TEMPLATES["moss"]) == CONTRACT_LINES.format(
        instruction="calm", tokens=20, quality="high", sound_event="door", ambient_sound="rain", language="English"
    )
    assert field_lines(PromptSpec(text="Hi."), TEMPLATES["moss"]) == CONTRACT_LINES.format(
        **{f: None for f in FIELDS if f != "scene"}
    )


def test_the_ttsd_scene_template_writes_scene_and_a_fixed_tokens_line(tok: HFTokenizer) -> None:
    t = TEMPLATES["moss-ttsd-scene"]
    assert not t.confirmed and "scene" in t.fields() and "tokens" not in t.fields()
    spec = PromptSpec(text="Hi. Hello.", scene="a quiet studio", language="en")
    text = _text(tok, build_prompt(tok, IDS, spec, t))
    assert "- Instruction:\nNone\n- Scene:\na quiet studio\n- Tokens:\nNone\n- Quality:\nNone\n" in text
    assert "- Language:\nen\n- Text:\nHi. Hello.\n</user_inst>" in text
    # the same request under the default template, the Scene line left out, is the same text
    plain = _text(tok, build_prompt(tok, IDS, PromptSpec(text=spec.text, language="en")))
    assert text.replace("- Scene:\na quiet studio\n", "") == plain


def test_the_builder_uses_its_template(tok: HFTokenizer) -> None:
    spec = PromptSpec(text="Hi.", scene="a hall")
    built = PromptBuilder(tok, IDS, tmpl=TEMPLATES["moss-ttsd-scene"]).build(spec, prefix=True)
    np.testing.assert_array_equal(built.rows, build_prompt(tok, IDS, spec, TEMPLATES["moss-ttsd-scene"]))
    assert built.prefix_rows > 0 and built.text_rows == len(tok.encode("Hi."))


@pytest.mark.parametrize(
    ("name", "spec", "needle"),
    [
        ("moss", PromptSpec(text="Hi.", scene="a hall"), "scene: not a field of the prompt template 'moss'"),
        ("moss-ttsd-scene", PromptSpec(text="Hi.", tokens=20), "tokens: not a field of the prompt template 'moss-ttsd-scene'"),
    ],
)
def test_a_field_the_template_does_not_write_is_an_error(tok: HFTokenizer, name: str, spec: PromptSpec, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        build_prompt(tok, IDS, spec, TEMPLATES[name])


def test_an_unknown_template_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown prompt_template 'ttsd'; known: moss, moss-ttsd-scene"):
        template("ttsd")


def test_scene_may_not_hold_a_marker(tok: HFTokenizer) -> None:
    with pytest.raises(InputError, match="scene contains the special token string"):
        build_prompt(tok, IDS, PromptSpec(text="Hi.", scene="<|im_end|>"), TEMPLATES["moss-ttsd-scene"])


def test_the_docs_name_every_template() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "family.md").read_text(encoding="utf-8")
    for name in TEMPLATES:
        assert f"| `{name}` |" in doc, name
