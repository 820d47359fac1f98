"""Cut streamed text into segments at clause or sentence boundaries.

Why: each segment is one generation. Synthesising word by word (as tokens
arrive from an LLM) ruins prosody, and one generation must fit the context, so
text is spoken in clause- or sentence-sized pieces, back to back.

Rules (all of them look only at the text up to one character past a boundary,
so feeding the text in any pieces, one token at a time or whole, yields the
same segments; ``tests/text/test_segmenter.py`` checks this property):

* A *sentence end* is a run of ``. ! ? …`` (or ``。！？``), a *clause end* a
  run of ``, ; :`` (or ``，、；：``), optionally followed by closing quotes or
  brackets. A newline is a sentence end too.
* Latin punctuation ends a segment only when followed by whitespace (so
  ``3.14``, ``a,b`` and ``example.com`` never split). ``Mr.``, ``e.g.`` and
  single-letter initials (``J. Smith``) are not sentence ends. CJK
  punctuation needs no space after it.
* A segment is cut at a sentence end once it holds at least ``min_chars``, at
  a clause end once it holds at least ``clause_min_chars`` (clause cuts hurt
  prosody more, so they wait for longer text). Length is counted without
  whitespace, a CJK character as ``CJK_WEIGHT`` (one CJK character carries
  about as much speech as three Latin letters).
* With no boundary in sight, a segment is cut at the last space once it
  exceeds ``max_chars`` (an LLM that never punctuates), or hard at
  ``max_chars`` when there is no space (CJK).
* :meth:`Segmenter.flush` emits whatever is pending, however short. Pieces
  without any letter or digit (a lone ``"..."``) are dropped, since there is
  nothing to say.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CJK_WEIGHT",
    "DEFAULT_CLAUSE_MIN_CHARS",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MIN_CHARS",
    "Segmenter",
    "SegmenterConfig",
    "split_text",
]

DEFAULT_MIN_CHARS = 20
DEFAULT_CLAUSE_MIN_CHARS = 60
DEFAULT_MAX_CHARS = 300
CJK_WEIGHT = 3

_LATIN_SENTENCE = ".!?…"
_LATIN_CLAUSE = ",;:"
_CJK_SENTENCE = "。！？｡"
_CJK_CLAUSE = "，、；：､"
_SENTENCE = _LATIN_SENTENCE + _CJK_SENTENCE
_PUNCT = _SENTENCE + _LATIN_CLAUSE + _CJK_CLAUSE
_CJK_PUNCT = _CJK_SENTENCE + _CJK_CLAUSE
_CLOSERS = "\"')]}»”’」』】》〉）］｝"

# Lower-case words that a "." after them does not end a sentence.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al fig no nos vol approx inc ltd co corp dept est".split()
)


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0x3040 <= o <= 0x30FF
        or 0xAC00 <= o <= 0xD7AF
        or 0xF900 <= o <= 0xFAFF
    )


def _weight(ch: str) -> int:
    if ch.isspace():
        return 0
    return CJK_WEIGHT if _is_cjk(ch) else 1


def speakable(text: str) -> bool:
    """Whether ``text`` has anything to say: a letter or a digit (``"..."`` has not)."""
    return any(ch.isalnum() for ch in text)


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    min_chars: int = DEFAULT_MIN_CHARS
    clause_min_chars: int = DEFAULT_CLAUSE_MIN_CHARS
    max_chars: int = DEFAULT_MAX_CHARS

    def validate(self) -> SegmenterConfig:
        if self.min_chars < 0 or self.clause_min_chars < 0:
            raise ValueError("min_chars and clause_min_chars must be >= 0")
        if self.max_chars < 8:
            raise ValueError(f"max_chars must be >= 8, got {self.max_chars}")
        return self


class Segmenter:
    """Incremental segmenter: ``feed(text) -> segments``, ``flush() -> segments``.

    Not thread-safe; one per text stream.
    """

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = (config or SegmenterConfig()).validate()
        self._buf = ""  # text of the current segment and beyond, not yet emitted
        self._pos = 0  # scan position in _buf: boundaries before it are decided
        self._w = 0  # weight of _buf[:_pos]

    @property
    def pending(self) -> str:
        """Text received but not yet emitted as a segment."""
        return self._buf

    def feed(self, text: str) -> list[str]:
        """Add text; return the segments it completed (possibly none)."""
        if not text:
            return []
        self._buf += text
        return self._scan(final=False)

    def flush(self) -> list[str]:
        """Emit everything pending (``flush`` / ``end``); the segmenter is empty after."""
        out = self._scan(final=True)
        rest = self._buf.strip()
        self._buf, self._pos, self._w = "", 0, 0
        if rest and speakable(rest):
            out.append(rest)
        return out

    # -- the scanner ---------------------------------------------------------------------
    def _scan(self, final: bool) -> list[str]:
        cfg = self.config
        buf = self._buf
        n = len(buf)
        out: list[str] = []
        start = 0
        i = self._pos
        w = self._w
        while i < n:
            ch = buf[i]
            if ch in _PUNCT or ch == "\n":
                j = i + 1
                while j < n and (buf[j] in _PUNCT or buf[j] in _CLOSERS or buf[j] == "\n"):
                    j += 1
                if j == n and not final:
                    break  # the run may continue, or the next character decides: wait for it
                run = buf[i:j]
                nxt = buf[j] if j < n else ""
                cut = self._boundary(buf, start, i, run, nxt, w + sum(_weight(c) for c in run))
                if cut:
                    piece = buf[start:j].strip()
                    if speakable(piece):
                        out.append(piece)
                        start, w = j, 0
                    else:
                        w += sum(_weight(c) for c in run)
                else:
                    w += sum(_weight(c) for c in run)
                i = j
                continue
            w += _weight(ch)
            i += 1
            if w > cfg.max_chars:
                cut_at = self._overflow_cut(buf, start, i)
                piece = buf[start:cut_at].strip()
                if piece and speakable(piece):
                    out.append(piece)
                start = cut_at
                w = sum(_weight(c) for c in buf[start:i])
        self._buf = buf[start:]
        self._pos = i - start
        self._w = w
        return out

    def _boundary(self, buf: str, start: int, i: int, run: str, nxt: str, weight: int) -> bool:
        cfg = self.config
        cjk = any(c in _CJK_PUNCT for c in run)
        if not cjk and "\n" not in run and nxt and not nxt.isspace():
            return False  # "3.14", "a,b", "example.com", "Hello!World"
        sentence = "\n" in run or any(c in _SENTENCE for c in run)
        if (
            sentence
            and run[0] == "."
            and not cjk
            and "\n" not in run
            and _abbreviation(buf, start, i)
        ):
            return False
        need = cfg.min_chars if sentence else cfg.clause_min_chars
        return weight >= need

    def _overflow_cut(self, buf: str, start: int, end: int) -> int:
        """Where to cut ``buf[start:end]``, whose weight just went over ``max_chars``."""
        # Prefer the last whitespace (a word boundary), but not one that leaves a tiny piece.
        k = buf.rfind(" ", start, end)
        if k > start and sum(_weight(c) for c in buf[start:k]) >= self.config.max_chars // 2:
            return k
        return end - 1  # hard cut before the character that went over


def _abbreviation(buf: str, start: int, i: int) -> bool:
    """Is the word ending at ``buf[i]`` (a ".") an abbreviation or an initial?"""
    k = i
    while k > start and not buf[k - 1].isspace() and buf[k - 1] not in "\"'([{“‘":
        k -= 1
    word = buf[k:i]
    if not word:
        return False
    if len(word) == 1 and word.isalpha() and word.isupper():
        return True  # an initial: "J. Smith"
    return word.lower() in _ABBREVIATIONS


def split_text(text: str, config: SegmenterConfig | None = None) -> list[str]:
    """Segments of a whole text: the same as feeding it in any pieces, then flushing."""
    seg = Segmenter(config)
    return seg.feed(text) + seg.flush()
