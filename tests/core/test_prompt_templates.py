"""The prompt templates (core/prompt.py TEMPLATES): each member's own processor's. The GitHub
processor's for the members served with it; MOSS-TTSD's (its checkpoint's own processor: a Scene
line and a Tokens line always ``None``, references listed by speaker position) checked against
the user messages that processor wrote for the five cases of tests/fixtures/ttsd. A field a
template does not write is an error naming why, never dropped. The tokenizer is the official
fixture's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fixtures.hf_checkpoint import tokenizer_json
from fixtures.ttsd import CASES, cases_dir
from tokenizers import Tokenizer

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

IDS = TokenIds(n_vq=16)
CONTRACT_LINES = (  # ../shared/moss-tts-delay.md, section 3, between Reference(s) and Text
    "- Instruction:\n{instruction}\n- Tokens:\n{tokens}\n- Quality:\n{quality}\n- Sound Event:\n"
    "{sound_event}\n- Ambient Sound:\n{ambient_sound}\n- Language:\n{language}\n"
)


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return HFTokenizer(tokenizer_json())


def _text(tok: HFTokenizer, rows: np.ndarray) -> str:
    return tok.decode([int(t) for t in rows[:, 0]])


def _user_message(tok: HFTokenizer, rows: np.ndarray) -> str:
    """The user turn of a prompt as a processor writes it: each audio block one placeholder."""
    text = Tokenizer.from_file(str(tokenizer_json())).decode([int(t) for t in rows[:, 0]], skip_special_tokens=False)
    start, end = (re.escape(tok.id_to_token(i) or "") for i in (IDS.audio_start, IDS.audio_end))
    body = text[text.index("<user_inst>") : text.index("</user_inst>") + len("</user_inst>")]
    return re.sub(f"{start}.*?{end}", "<|audio|>", body, flags=re.DOTALL)


def test_the_members_templates() -> None:
    assert {k: m.template for k, m in MEMBERS.items()} == {
        "moss-tts": DEFAULT_TEMPLATE, "moss-tts-v1.5": DEFAULT_TEMPLATE, "moss-ttsd": "moss-ttsd",
        "moss-voice-generator": DEFAULT_TEMPLATE, "moss-sound-effect": "moss-sound-effect",
    }  # fmt: skip
    spec = PromptSpec(text="Hi.", instruction="calm", tokens=20, quality="high", sound_event="door",
                      ambient_sound="rain", language="English")  # fmt: skip
    assert field_lines(spec, TEMPLATES["moss"]) == CONTRACT_LINES.format(
        instruction="calm", tokens=20, quality="high", sound_event="door", ambient_sound="rain", language="English"
    )
    assert field_lines(PromptSpec(text="Hi."), TEMPLATES["moss"]) == CONTRACT_LINES.format(
        **{f: None for f in FIELDS if f != "scene"}
    )


def test_sound_effect_asks_for_125_frames_unless_told() -> None:
    """MOSS-SoundEffect's processor: ``build_user_message(..., tokens=125, ...)``, so a request
    without a duration writes ``- Tokens:\n125`` (10 s); one with a duration writes it."""
    t = TEMPLATES["moss-sound-effect"]
    assert t.fields() == TEMPLATES["moss"].fields()
    sound = PromptSpec(text=None, ambient_sound="rain on a tin roof")
    assert "- Tokens:\n125\n" in field_lines(sound, t)
    assert "- Tokens:\n40\n" in field_lines(PromptSpec(text=None, ambient_sound="rain", tokens=40), t)
    assert "- Tokens:\nNone\n" in field_lines(sound, TEMPLATES["moss"])


@pytest.mark.parametrize("name", CASES)
def test_the_ttsd_template_writes_the_checkpoints_user_message(tok: HFTokenizer, name: str) -> None:
    """Our prompt's user turn is the one MOSS-TTSD's own processor wrote (``user_content``), and
    the whole prompt its rows; the references as the checkpoint lists them."""
    d = cases_dir()
    meta = json.loads((d / f"{name}.json").read_text(encoding="utf-8"))
    refs = tuple(None if f is None else np.load(d / f) for f in meta["references"])
    user = dict(meta["user"])
    spec = PromptSpec(
        text=user.pop("text"), references=refs,
        prefix_codes=np.load(d / meta["prefix"]) if meta["prefix"] else None, **user,
    )  # fmt: skip
    rows = build_prompt(tok, IDS, spec, TEMPLATES["moss-ttsd"])
    assert _user_message(tok, rows) == meta["user_content"]
    want = np.load(d / f"{name}.prompt.npy")
    np.testing.assert_array_equal(rows if meta["prefix"] else rows[:-1], want)


@pytest.mark.parametrize(
    ("refs", "want"),
    [
        ((None, "v"), "[S1]: None\n[S2]:\n<|audio|>"),
        (("v", None), "[S1]:\n<|audio|>"),  # up to the last speaker with a voice
        ((None, None), "None"),
        ((None, "v", None, "v"), "[S1]: None\n[S2]:\n<|audio|>\n[S3]: None\n[S4]:\n<|audio|>"),
    ],
)
def test_ttsd_lists_references_by_position(tok: HFTokenizer, refs: tuple[str | None, ...], want: str) -> None:
    codes = np.arange(48, dtype=np.int64).reshape(3, 16)
    spec = PromptSpec(text="[S1] A. [S2] B. [S4] C.", references=tuple(None if r is None else codes for r in refs))
    got = _user_message(tok, build_prompt(tok, IDS, spec, TEMPLATES["moss-ttsd"]))
    assert got.startswith(f"<user_inst>\n- Reference(s):\n{want}\n- Instruction:\n")
    # the GitHub template lists only the voiced speakers, and a tag without a voice is an error
    with pytest.raises(InputError, match=r"speaker tag \[S\d\] but no voice"):
        build_prompt(tok, IDS, spec, TEMPLATES["moss"])


def test_the_builder_uses_its_template(tok: HFTokenizer) -> None:
    spec = PromptSpec(text="[S1] Hi.")
    built = PromptBuilder(tok, IDS, tmpl=TEMPLATES["moss-ttsd"]).build(spec, prefix=True)
    np.testing.assert_array_equal(built.rows, build_prompt(tok, IDS, spec, TEMPLATES["moss-ttsd"]))
    assert "- Scene:\nNone\n- Text:\n" in _text(tok, built.rows)
    assert built.prefix_rows > 0 and built.text_rows == len(tok.encode("[S1] Hi."))


@pytest.mark.parametrize(
    ("name", "spec", "needle"),
    [
        ("moss", PromptSpec(text="Hi.", scene="a hall"), "scene: not a field of the prompt template 'moss'"),
        ("moss-ttsd", PromptSpec(text="Hi.", tokens=20), "tokens: MOSS-TTSD-v1.0's own processor writes Tokens and Scene as None"),
        ("moss-ttsd", PromptSpec(text="Hi.", scene="a hall"), "scene: MOSS-TTSD-v1.0's own processor .* ignores a duration and a scene"),
    ],
)  # fmt: skip
def test_a_field_the_template_does_not_write_is_an_error(tok: HFTokenizer, name: str, spec: PromptSpec, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        build_prompt(tok, IDS, spec, TEMPLATES[name])


def test_an_unknown_template_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown prompt_template 'ttsd'; known: moss, moss-ttsd"):
        template("ttsd")


def test_the_docs_name_every_template() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "family.md").read_text(encoding="utf-8")
    for name in TEMPLATES:
        assert f"`{name}`" in doc, name
