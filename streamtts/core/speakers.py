"""Dialogue speakers: the ``[S1]`` .. ``[S5]`` tags in a text and the voices given for them.

MOSS-TTSD reads one reference per speaker, numbered by position (reference ``i`` is the voice
of ``[S{i+1}]``; a ``None`` entry keeps its number), and a text whose turns start with those
tags. A voice no tag uses is a mistake in the request: an error, found here before anything is
generated. A tag whose speaker has no voice is spoken in a voice the model invents: MOSS-TTSD's
own processor lists such a speaker (``[S1]: None``) and allows it (``voiceless=True``); a
template that cannot say so (the GitHub processor's) makes it an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..constants import MAX_SPEAKERS, SPEAKER_TAG_PATTERN
from ..errors import InputError

__all__ = [
    "MAX_SPEAKERS",
    "check_speaker_count",
    "check_speakers",
    "check_tags_have_voices",
    "speaker_tags",
]

_TAG = re.compile(SPEAKER_TAG_PATTERN)


def speaker_tags(text: str | None) -> list[str]:
    """The speaker tags of ``text`` (``"S1"``, ``"S2"``, ...), each once, in order of first use.

    Raises :class:`InputError` for a tag outside ``[S1]`` .. ``[S{MAX_SPEAKERS}]``.
    """
    seen: list[str] = []
    for m in _TAG.finditer(text or ""):
        n = int(m[1])
        if not 1 <= n <= MAX_SPEAKERS:
            raise InputError(
                f"speaker tag {m[0]} in the text: speakers are [S1] .. [S{MAX_SPEAKERS}]"
            )
        name = f"S{n}"
        if name not in seen:
            seen.append(name)
    return seen


def check_speaker_count(n: int) -> None:
    """At most ``MAX_SPEAKERS`` references (one per speaker)."""
    if n > MAX_SPEAKERS:
        raise InputError(
            f"{n} speaker references given; the most is {MAX_SPEAKERS} ([S1] .. [S{MAX_SPEAKERS}])"
        )


def _voiced(references: Sequence[object | None]) -> list[str]:
    check_speaker_count(len(references))
    return [f"S{i + 1}" for i, ref in enumerate(references) if ref is not None]


def check_tags_have_voices(text: str | None, references: Sequence[object | None]) -> None:
    """Every speaker tag in ``text`` has a voice in ``references`` (position i: ``[S{i+1}]``).

    This half of :func:`check_speakers` holds for each segment of a valid dialogue as well as
    for the whole, so the prompt builder checks it on every prompt.
    """
    voiced = _voiced(references)
    for name in speaker_tags(text):
        if name not in voiced:
            given = ", ".join(f"[{v}]" for v in voiced) or "none"
            raise InputError(
                f"the text has the speaker tag [{name}] but no voice is given for it "
                f"(voices given: {given}); give one reference per tagged speaker"
            )


def check_speakers(text: str | None, references: Sequence[object | None], *, voiceless: bool = False) -> None:
    """A dialogue's tags and voices match: every voice has a tag, and every tag a voice unless
    ``voiceless`` (the template lists a speaker without one: MOSS-TTSD's).

    One reference and a text without tags is a plain voice clone (the voice is ``[S1]``).
    Check a request's whole text once: a segment of a long dialogue carries every speaker's
    voice but may hold only some of the tags. Raises :class:`InputError` naming the tag or
    the voice.
    """
    if not voiceless:
        check_tags_have_voices(text, references)
    tags = speaker_tags(text)
    voiced = _voiced(references)
    if not tags and voiced in ([], ["S1"]):
        return
    for name in voiced:
        if name not in tags:
            raise InputError(
                f"a voice is given for speaker [{name}] but the text has no [{name}] tag: "
                f"start that speaker's turns with [{name}], or drop the voice"
            )
