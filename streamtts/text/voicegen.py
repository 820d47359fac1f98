"""MOSS-VoiceGenerator's own input normalisers: one for the instruction, one for the text.

MOSS-VoiceGenerator's checkpoint ships its own ``processing_moss_tts.py``: the GitHub prompt
template, and, when the processor is loaded with ``normalize_inputs=True`` (as its model card
and OpenMOSS/MOSS-TTS ``clis/moss_voice_generator_app.py`` load it), a ``normalize_instruction``
applied to the instruction and a ``normalize_text`` applied to the text, in place of the GitHub
processor's robustness normaliser (text/normalize.py).

Source: that file could not be read here. The rules below are those of a third-party port that
calls itself "upstream-compatible" (Blaizzy/mlx-audio ``mlx_audio/tts/models/moss_tts/processor.py``,
commit 60c9c41, unmerged), which match the docstring of the checkpoint's ``normalize_instruction``
(``[]``/``{}`` tags dropped, decorative symbols to commas, repeated punctuation collapsed, line
breaks dropped, ``,`` to ``，`` in Chinese, quotes kept). Reimplemented, not copied; unverified
against the checkpoint's own code.

Instruction (:func:`normalize_instruction`), in this order:

1. line breaks (``\\n``) become spaces;
2. each ``[...]``, then each ``{...}``, is dropped (the shortest match: ``[a] b [c]`` keeps `` b ``);
3. each of ``【】《》（）『』「」～-_`` becomes ``，`` (``middle-aged`` -> ``middle，aged``);
4. a run of marks from ``，。！？,.!?;；`` becomes its last mark (``。。！`` -> ``！``);
5. if the instruction has a CJK ideograph (U+4E00..U+9FFF), every ``,`` becomes ``，``;
6. the ends are trimmed. Quotes are kept.

Text (:func:`normalize_text`): rules 1, 2, 3 without ``-`` and ``_``, then ASCII ``"`` dropped,
then 4 and 6 (no rule 5). ``[pause 1.5s]`` and other bracketed tags are dropped with the rest.

An empty string is returned as it is.
"""

from __future__ import annotations

import re

__all__ = ["normalize_instruction", "normalize_text"]

_SQUARE = re.compile(r"\[.*?\]")
_CURLY = re.compile(r"\{.*?\}")
_COMMA = "，"  # noqa: RUF001 - the fullwidth comma the decorative symbols become
_TEXT_SYMBOLS = str.maketrans(dict.fromkeys("【】《》（）『』「」～", _COMMA))  # noqa: RUF001
_INSTRUCTION_SYMBOLS = str.maketrans(dict.fromkeys("【】《》（）『』「」～-_", _COMMA))  # noqa: RUF001
_PUNCT_RUN = re.compile(r"[，。！？,.!?;；]{2,}")  # noqa: RUF001
_CJK = re.compile(r"[\u4e00-\u9fff]")


def _common(s: str, symbols: dict[int, str]) -> str:
    """Rules 1-3: line breaks to spaces, tags dropped, decorative symbols to commas."""
    s = s.replace("\n", " ")
    s = _SQUARE.sub("", s)
    s = _CURLY.sub("", s)
    return s.translate(symbols)


def _last_of_runs(s: str) -> str:
    """Rule 4: a run of punctuation marks keeps its last."""
    return _PUNCT_RUN.sub(lambda m: m[0][-1], s)


def normalize_instruction(instruction: str) -> str:
    """``instruction`` through MOSS-VoiceGenerator's ``normalize_instruction`` (rules 1-6)."""
    if not instruction:
        return instruction
    s = _last_of_runs(_common(instruction, _INSTRUCTION_SYMBOLS))
    if _CJK.search(s):
        s = s.replace(",", _COMMA)
    return s.strip()


def normalize_text(text: str) -> str:
    """``text`` through MOSS-VoiceGenerator's ``normalize_text`` (rules 1-3, quotes, 4, 6)."""
    if not text:
        return text
    s = _common(text, _TEXT_SYMBOLS).replace('"', "")
    return _last_of_runs(s).strip()
