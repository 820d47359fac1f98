"""MOSS-VoiceGenerator's own normalisers (text/voicegen.py): the instruction's and the text's.

The first case of each is the example the source's own tests give (Blaizzy/mlx-audio's port of
the checkpoint's processor, the only code of it that could be read); the others are one or more
per rule of the module's docstring, worked out by hand from the rules."""

from __future__ import annotations

import pytest

from streamtts.text.voicegen import normalize_instruction, normalize_text

INSTRUCTIONS = [
    ("Calm\n[style]{voice}", "Calm"),  # the port's own example
    ("", ""),
    ("A warm voice.\nSpeaks slowly.", "A warm voice. Speaks slowly."),  # line break -> space
    ("[a] gentle [b] voice {c}", "gentle  voice"),  # each tag dropped, shortest match; ends trimmed
    ("{a[b}c]", "{a"),  # [..] first: "[b}c]" goes, and "{a" is no {..}
    ("A middle-aged man", "A middle，aged man"),  # noqa: RUF001 - '-' -> fullwidth comma
    ("deep_voice", "deep，voice"),  # noqa: RUF001
    ("《温柔》的女声（年轻）", "，温柔，的女声，年轻，"),  # noqa: RUF001 - brackets -> commas, then trimmed (no space)
    ("『a』「b」【c】～d", "，a，b，c，d"),  # noqa: RUF001 - a run of commas keeps its last
    ("Excited!!! Really?!", "Excited! Really!"),  # a run keeps its LAST mark
    ("温柔。。！", "温柔！"),  # noqa: RUF001
    ("low, raspy, tired", "low, raspy, tired"),  # no CJK: ',' stays
    ("低沉, 沙哑,疲惫", "低沉， 沙哑，疲惫"),  # noqa: RUF001 - CJK present: ',' -> '，'
    ("Old man, 低沉", "Old man， 低沉"),  # noqa: RUF001 - any ideograph turns every ',' in the instruction
    ('She says "hello" \'softly\'', 'She says "hello" \'softly\''),  # quotes kept
    ("a;;.b", "a.b"),
    ("  \n [x]  ", ""),  # nothing but a tag: empty
]

TEXTS = [
    ('Line1\n[drop]{meta}"Line2"', "Line1 Line2"),  # the port's own example
    ("", ""),
    ("Hello [pause 1.5s] world {laugh}.", "Hello  world ."),  # tags dropped with their contents
    ("A middle-aged man_here", "A middle-aged man_here"),  # '-' and '_' kept in the text
    ("《书名》和「引用」～", "，书名，和，引用，"),  # noqa: RUF001
    ('He said "no".', "He said no."),  # ASCII double quotes dropped
    ("“curly” 'single'", "“curly” 'single'"),  # other quotes kept
    ('Wait,",." now', "Wait. now"),  # quotes dropped before the runs collapse
    ("What?!?", "What?"),
    ("好的。。！", "好的！"),  # noqa: RUF001
    ("a, b", "a, b"),  # no comma rule for the text, CJK or not
    ("中文, 文本", "中文, 文本"),
    ("  padded \n", "padded"),
]


@pytest.mark.parametrize(("given", "want"), INSTRUCTIONS)
def test_normalize_instruction(given: str, want: str) -> None:
    assert normalize_instruction(given) == want


@pytest.mark.parametrize(("given", "want"), TEXTS)
def test_normalize_text(given: str, want: str) -> None:
    assert normalize_text(given) == want


def test_normalising_twice_changes_nothing() -> None:
    """A long text's segments are cut from the normalised text and not normalised again; were
    they, nothing would change."""
    for given, _ in INSTRUCTIONS:
        once = normalize_instruction(given)
        assert normalize_instruction(once) == once
    for given, _ in TEXTS:
        once = normalize_text(given)
        assert normalize_text(once) == once
