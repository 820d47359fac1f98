"""A request's voices: one reference, or a dialogue's speakers; a continuation's prefix and
its transcript (:class:`VoiceRequest`, its rules), and the speaker tags that name the voices.

Dialogue requests: one voice per speaker tag (MOSS-TTSD), given by name.

The text carries ``[S1]``..``[S5]`` tags (core/speakers.py checks tags against voices);
``speakers`` maps each tag's name to its voice. The prompt's references are numbered by
position (``[S1]`` is the first, a missing number is a ``None`` entry that keeps its place),
so a mapping becomes a tuple here.

A dialogue longer than one generation is spoken in segments (long_text.py, the server's
segmenter). It stays one conversation because every segment's prompt carries every
speaker's reference (not only the speakers it tags), and the segmenter starts a segment cut
inside a turn with that turn's tag again (text/segmenter.py): each generation knows who
speaks its first words and what every voice of the conversation sounds like.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..constants import MAX_SPEAKERS
from ..errors import FieldError

__all__ = ["SegmentSpeakers", "VoiceRequest", "check_speaker_texts", "speaker_number", "speaker_tuple", "tagged_text"]

_KEY = re.compile(r"^\[?[Ss](\d+)\]?$")

T = TypeVar("T")


def speaker_number(key: str) -> int:
    """``"S1"`` (also ``"s1"``, ``"[S1]"``) -> 1; anything else is an error naming the key."""
    m = _KEY.match(key.strip()) if isinstance(key, str) else None
    n = int(m.group(1)) if m else 0
    if not 1 <= n <= MAX_SPEAKERS:
        raise FieldError(
            "speakers",
            f"speakers: {key!r} is not a speaker tag; use S1 .. S{MAX_SPEAKERS} (the text's [S1], [S2], ...)"
        )
    return n


def speaker_tuple(speakers: Mapping[str, T]) -> tuple[T | None, ...]:
    """The voices by position: entry i is speaker ``S{i+1}``'s (None where none is given)."""
    by_number: dict[int, T] = {}
    for key, voice in speakers.items():
        n = speaker_number(key)
        if n in by_number:
            raise FieldError("speakers", f"speakers: S{n} is given twice")
        by_number[n] = voice
    if not by_number:
        return ()
    return tuple(by_number.get(i) for i in range(1, max(by_number) + 1))


def tagged_text(text: str, speaker_texts: Mapping[str, str] | None = None, prefix_text: str | None = None) -> str:
    """All the text a dialogue's speaker tags are checked against: the speakers' own
    transcripts (continued clips), a prefix's transcript, then the new text. A voice whose
    speaker talks only in its continued clip is still that speaker's voice."""
    said = "".join(f"[S{speaker_number(k)}]{t}" for k, t in (speaker_texts or {}).items())
    return f"{said}{prefix_text or ''} {text}"


def check_speaker_texts(texts: Mapping[str, str], speakers: Mapping[str, object] | None, prefix: object, prefix_text: object) -> dict[int, str]:
    """``speaker_texts`` (speaker tag -> the transcript of that speaker's clip) by speaker
    number: each a non-empty string for a speaker ``speakers`` gives a voice, and no other
    prefix beside them (their clips joined are the prefix)."""
    if prefix is not None or prefix_text is not None:
        raise FieldError(
            "speaker_texts", "speaker_texts and prefix: continue either the speakers' own clips or one prefix, not both"
        )
    given = {speaker_number(k): k for k in (speakers or {})}
    out: dict[int, str] = {}
    for key, said in texts.items():
        n = speaker_number(key)
        if n in out:
            raise FieldError("speaker_texts", f"speaker_texts: S{n} is given twice")
        if n not in given:
            raise FieldError(
                "speaker_texts", f"speaker_texts.S{n}: the transcript of S{n}'s clip, but speakers gives no S{n}"
            )
        if not isinstance(said, str) or not said.strip():
            raise FieldError("speaker_texts", f"speaker_texts.S{n} must be the non-empty transcript of S{n}'s clip")
        out[n] = said
    return out


class SegmentSpeakers(dict[str, T]):
    """The speakers of one segment of a longer dialogue (what segmented.py passes): the
    segment carries every voice of the conversation but need not tag each of them (the
    whole text was checked, or is streamed and cannot be)."""


@dataclass(frozen=True, slots=True)
class VoiceRequest(Generic[T]):
    """A request's voices, as the front door holds them (names, clips or encoded voices):
    ``reference`` (one voice) or ``speakers`` (``S1`` -> voice of the text's ``[S1]``, ...),
    and ``prefix``, audio the generation continues, with its transcript ``prefix_text``.
    ``reference_name``: what the front door calls the one voice (``voice``, ``reference``)."""

    reference: T | None = None
    speakers: Mapping[str, T] | None = None
    prefix: T | None = None
    prefix_text: str | None = None
    reference_name: str = "reference"
    # a continuation of the speakers' own clips (MOSS-TTSD's app): speaker tag -> what that
    # speaker's clip in ``speakers`` says; the clips joined end to end are the prefix
    speaker_texts: Mapping[str, str] | None = None

    def check(self) -> tuple[T | None, ...]:
        """The rules between the voice fields; the speakers by position (speaker_tuple)."""
        if self.reference is not None and self.speakers:
            raise FieldError(
                "speakers",
                f"{self.reference_name} and speakers: give either {self.reference_name} (one voice) "
                "or speakers (a voice per [S1], [S2], ... tag), not both",
            )
        if self.speaker_texts:
            check_speaker_texts(self.speaker_texts, self.speakers, self.prefix, self.prefix_text)
        if self.prefix_text is not None:
            if not isinstance(self.prefix_text, str):
                raise FieldError("prefix_text", f"prefix_text must be a string, got {type(self.prefix_text).__name__}")
            if self.prefix is None:
                raise FieldError("prefix_text", "prefix_text is the transcript of a prefix: give the prefix audio too")
        return speaker_tuple(self.speakers) if self.speakers else ()
