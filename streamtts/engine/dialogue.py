"""Dialogue requests: speaker tags in the text, one voice per speaker (MOSS-TTSD).

The text carries ``[S1]``..``[Sn]`` tags; ``speakers`` maps each tag to its voice. The
prompt's references are numbered by position (``[S1]`` is the first, a missing number is a
``None`` entry that keeps its place), so a mapping becomes a tuple here.

A dialogue longer than one generation is spoken in segments (long_text.py, the server's
segmenter). It stays one conversation because every segment's prompt carries every
speaker's reference (not only the speakers it tags), and a segment that does not begin with
a tag gets the tag of the turn it continues (:class:`TagCarry`): each generation knows who
speaks its first words and what every voice of the conversation sounds like.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

from ..errors import InputError

__all__ = ["SegmentSpeakers", "TagCarry", "check_tags", "speaker_number", "speaker_tuple", "tags_in"]

_TAG = re.compile(r"\[S(\d+)\]")
_KEY = re.compile(r"^\[?[Ss](\d+)\]?$")
MAX_SPEAKERS = 16  # the model cards use [S1]..[S5]; more is surely a mistake

T = TypeVar("T")


def speaker_number(key: str) -> int:
    """``"S1"`` (also ``"s1"``, ``"[S1]"``) -> 1; anything else is an error naming the key."""
    m = _KEY.match(key.strip()) if isinstance(key, str) else None
    n = int(m.group(1)) if m else 0
    if not 1 <= n <= MAX_SPEAKERS:
        raise InputError(
            f"speakers: {key!r} is not a speaker tag; use S1, S2, ... (the text's [S1], [S2], ...)"
        )
    return n


def speaker_tuple(speakers: Mapping[str, T]) -> tuple[T | None, ...]:
    """The voices by position: entry i is speaker ``S{i+1}``'s (None where none is given)."""
    by_number: dict[int, T] = {}
    for key, voice in speakers.items():
        n = speaker_number(key)
        if n in by_number:
            raise InputError(f"speakers: S{n} is given twice")
        by_number[n] = voice
    if not by_number:
        return ()
    return tuple(by_number.get(i) for i in range(1, max(by_number) + 1))


def tags_in(text: str | None) -> set[int]:
    """The speaker numbers the text tags (``[S2]`` -> 2)."""
    return {int(m) for m in _TAG.findall(text or "")}


def check_tags(text: str | None, numbers: set[int], *, every_voice: bool = True) -> None:
    """Each tag in the text has a voice and (``every_voice``) each voice a tag; the error
    names them."""
    tags = tags_in(text)
    missing = sorted(tags - numbers)
    if missing:
        raise InputError(
            f"the text tags {', '.join(f'[S{n}]' for n in missing)} but speakers has no "
            f"{', '.join(f'S{n}' for n in missing)}: give a voice for every tagged speaker"
        )
    unused = sorted(numbers - tags)
    if unused and every_voice:
        raise InputError(
            f"speakers {', '.join(f'S{n}' for n in unused)} never speak: the text has no "
            f"{', '.join(f'[S{n}]' for n in unused)} tag (start each turn with its speaker's tag)"
        )


class TagCarry:
    """Segments of one dialogue in order: a segment that does not begin with a speaker tag
    gets the tag of the turn it continues (the last tag of the segments before it)."""

    def __init__(self) -> None:
        self.last: int | None = None

    def apply(self, segment: str) -> str:
        found = _TAG.findall(segment)
        out = segment
        if self.last is not None and not _TAG.match(segment.lstrip()):
            out = f"[S{self.last}] {segment.lstrip()}"
        if found:
            self.last = int(found[-1])
        return out


class SegmentSpeakers(dict[str, T]):
    """The speakers of one segment of a longer dialogue (what segmented.py passes): the
    segment carries every voice of the conversation but need not tag each of them (the
    whole text was checked, or is streamed and cannot be)."""
