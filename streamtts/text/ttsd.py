"""MOSS-TTSD's own text path: its normaliser, and the text of a continuation.

MOSS-TTSD-v1.0's processor applies no normaliser (unlike the GitHub one, text/normalize.py);
its inference code (OpenMOSS/MOSS-TTSD ``generation_utils.py`` and ``gradio_demo.py``, whose
app turns it on by default) has its own ``normalize_text``, reimplemented here:

1. ``[1]`` becomes ``[S1]``; line breaks become spaces; the text is cut into turns at each
   ``[S{n}]`` tag (a turn is the tag and what follows, up to the next tag).
2. In each turn's words: the characters ``【】《》（）『』「」"-_“”～~‘’`` are dropped; ``哈哈..``
   becomes ``[笑]`` and ``haha..`` (any case, spaces between) ``[laugh]``; dashes and ellipses
   (``——`` ``……`` ``...`` ``⸺`` ``―`` ``—`` ``…``) become ``，``; ``；;：:、`` become ``，,，,，``;
   a run of punctuation keeps its first mark; the turn is trimmed.
3. A turn longer than one character ends with ``。`` where it ended with ``，`` (``.`` for
   ``,``), and every ``。`` before its last character becomes ``，``.
4. Consecutive turns of one speaker are merged; the turns are joined with no space after their
   tags or between them.

A continuation's text (``_build_prefixed_text``): each prompt speaker's transcript, tagged with
its speaker unless it starts with that tag, in speaker order, then the dialogue; consecutive
turns of one speaker merged (``_merge_consecutive_speaker_tags``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["merge_speaker_turns", "normalize_ttsd", "prefixed_text"]

_NUMBER_TAG = re.compile(r"\[(\d+)\]")
_TURNS = re.compile(r"(?=\[S\d+\])")
_TURN = re.compile(r"^(\[S\d+\])\s*(.*)", re.DOTALL)
_DROPPED = re.compile("[" + re.escape("【】《》（）『』「」\"-_“”～~‘’") + "]")  # noqa: RUF001 - the characters dropped
_HA_ZH = re.compile(r"哈{2,}")
_HA_EN = re.compile(r"\b(ha(\s*ha)+)\b", re.IGNORECASE)
# longest first: "——" before "—", "……" before "…"
_PAUSES = ("——", "……", "...", "⸺", "―", "—", "…")
_INNER = str.maketrans({"；": "，", ";": ",", "：": "，", ":": ",", "、": "，"})  # noqa: RUF001
_PUNCT_RUN = re.compile(r"([，。？！,.?!])[，。？！,.?!]+")  # noqa: RUF001


def _turns(text: str) -> list[tuple[str, str]]:
    """(tag or "", words) of each non-empty piece of ``text`` cut before each ``[S{n}]``."""
    out: list[tuple[str, str]] = []
    for piece in _TURNS.split(text):
        piece = piece.strip()
        if not piece:
            continue
        m = _TURN.match(piece)
        out.append((m[1], m[2]) if m else ("", piece))
    return out


def _clean_words(words: str) -> str:
    words = _DROPPED.sub("", words)
    words = _HA_ZH.sub("[笑]", words)
    words = _HA_EN.sub("[laugh]", words)
    for mark in _PAUSES:
        words = words.replace(mark, "，")  # noqa: RUF001
    words = words.translate(_INNER).strip()
    words = _PUNCT_RUN.sub(r"\1", words)
    if len(words) > 1:
        last = {"，": "。", ",": "."}.get(words[-1], words[-1])  # noqa: RUF001
        words = words[:-1].replace("。", "，") + last  # noqa: RUF001
    return words


def normalize_ttsd(text: str) -> str:
    """``text`` through MOSS-TTSD's ``normalize_text`` (the module's rules 1-4)."""
    text = _NUMBER_TAG.sub(r"[S\1]", text).replace("\n", " ")
    turns = [(tag, _clean_words(words)) for tag, words in _turns(text)]
    if not turns:
        return ""
    merged: list[str] = []
    tag, parts = turns[0][0], [turns[0][1]]
    for t, words in turns[1:]:
        if t == tag and tag:
            parts.append(words)
        else:
            merged.append(f"{tag}{''.join(parts)}".strip())
            tag, parts = t, [words]
    merged.append(f"{tag}{''.join(parts)}".strip())
    return "".join(merged).replace("‘", "'").replace("’", "'")  # noqa: RUF001


def merge_speaker_turns(text: str) -> str:
    """Consecutive turns of one speaker as one (``_merge_consecutive_speaker_tags``): the
    repeated tag and the spaces after each tag dropped, turns joined with nothing between."""
    out: list[str] = []
    current: str | None = None
    for tag, words in _turns(text):
        if not tag:
            out.append(words)
        elif tag == current:
            out.append(words)
        else:
            current = tag
            out.append(f"{tag}{words}")
    return "".join(out)


def prefixed_text(text: str, transcripts: Mapping[int, str]) -> str:
    """A continuation's text: each prompt speaker's transcript (speaker number -> what its clip
    says), tagged ``[S{n}]`` unless it starts so, in speaker order, then ``text``; consecutive
    turns of one speaker merged (``_build_prefixed_text``)."""
    parts = []
    for n in sorted(transcripts):
        said = transcripts[n].strip()
        tag = f"[S{n}]"
        parts.append(said if said.startswith(tag) else f"{tag}{said}")
    return merge_speaker_turns("".join(parts) + text)
