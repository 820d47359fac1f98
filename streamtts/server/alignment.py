"""A context's word times on the wire: `alignment` messages and what a cancel's `done`
reports as heard (sans-I/O, used by session.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..request import WordTime
from ..timing import char_times
from .protocol import AlignedWord, Alignment

__all__ = ["ContextWords"]


@dataclass(slots=True)
class ContextWords:
    texts: dict[int, str] = field(default_factory=dict)  # segment index -> its text
    sent: list[WordTime] = field(default_factory=list)  # in the context's seconds, in order
    _segment: int = -1  # segment of the last word sent
    _char: int = 0  # where that word ended in its segment's text

    def message(self, words: list[WordTime], segment: int, chars: bool, context_id: str | None) -> Alignment:
        """The `alignment` message for ``words`` (of segment ``segment``), recorded as sent."""
        msg = Alignment(
            words=[AlignedWord(w.word, w.start, w.end) for w in words], context_id=context_id
        )
        if chars:
            if segment != self._segment:
                self._segment, self._char = segment, 0
            after_s = self.sent[-1].end if self.sent else 0.0
            ct = char_times(self.texts.get(segment, ""), words, self._char, after_s)
            if self.sent and self._char == 0 and ct.characters:  # a space between segments
                ct.characters.insert(0, " ")
                ct.starts.insert(0, after_s)
                ct.ends.insert(0, ct.starts[1] if len(ct.starts) > 1 else after_s)
            msg.characters = ct.characters
            msg.character_start_times_seconds = ct.starts
            msg.character_end_times_seconds = ct.ends
            self._char = words[-1].end_char
        self.sent.extend(words)
        self._segment = segment
        return msg

    def heard(self, seconds: float) -> tuple[int, str]:
        """Words whose audio lies whole in the first ``seconds``, and their text."""
        n = 0
        for w in self.sent:
            if w.end > seconds + 1e-6:
                break
            n += 1
        return n, _join([w.word for w in self.sent[:n]])


def _join(words: list[str]) -> str:
    out = ""
    for w in words:
        if out and not (_cjk(out[-1]) and _cjk(w[:1])):
            out += " "
        out += w
    return out


def _cjk(ch: str) -> bool:
    return bool(ch) and ("\u3000" <= ch <= "\u9fff" or "\uf900" <= ch <= "\uffef")
