"""Character times from word times (ElevenLabs-style alignment: every character of the
text, spaces included, with a start and an end)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .estimate import WordTime

__all__ = ["CharTimes", "char_times"]


@dataclass(slots=True)
class CharTimes:
    characters: list[str] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)


def char_times(text: str, words: list[WordTime], after_char: int = 0, after_s: float = 0.0) -> CharTimes:
    """The characters from ``after_char`` to the end of the last of ``words``: the ones
    between words share the gap before the next word, a word's letters and digits share
    its time evenly (its punctuation takes none, at the end of the letter before)."""
    out = CharTimes()
    pos, t = after_char, after_s
    for w in words:
        gap = text[pos : w.start_char]
        _spread(out, gap, t, w.start, [1.0] * len(gap))
        token = text[w.start_char : w.end_char]
        _spread(out, token, w.start, w.end, [1.0 if ch.isalnum() else 0.0 for ch in token])
        pos, t = w.end_char, w.end
    return out


def _spread(out: CharTimes, chars: str, a: float, b: float, weights: list[float]) -> None:
    total = sum(weights)
    t = a
    for ch, wt in zip(chars, weights, strict=True):
        d = (b - a) * wt / total if total else 0.0
        out.characters.append(ch)
        out.starts.append(round(t, 4))
        t += d
        out.ends.append(round(t, 4))
