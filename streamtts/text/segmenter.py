"""Cut streamed text into segments at clause or sentence boundaries.

Why: each segment is one generation. Synthesising word by word (as tokens
arrive from an LLM) ruins prosody, and one generation must fit the context, so
text is spoken in clause- or sentence-sized pieces, back to back.

Rules (all of them look only at the text up to one character past a boundary or a tag,
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

Tags the model reads (``[pause 1.5s]`` for v1.5, ``[S1]`` for dialogue, sound
events):

* Nothing inside ``[...]`` ends a segment, and no cut falls inside one. A ``[``
  that is not closed within ``MAX_BRACKET_CHARS`` is plain text after all.
* ``[pause ...]`` is a cut point like a sentence end (not before punctuation
  that follows it), and the first choice inside a turn that must be cut.
* Dialogue: from the first speaker tag ``[S{i}]`` on, segments are cut before
  a tag (a *turn boundary*, once the segment holds ``min_chars``: short turns
  share a segment), never at sentence or clause ends, so a turn stays whole in
  one segment. A tag is never cut from the words after it. A turn that grows
  past ``max_chars`` is cut at the best point passed over (the last turn
  boundary, else a pause, a sentence end, a clause end, a space; a hard cut
  last), and the segment that continues it starts with the same tag again, so
  each segment names its speaker (the tag stays active across ``flush``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..constants import SPEAKER_TAG_PATTERN
from .normalize import MAX_BRACKET_CHARS

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

# Speaker tags, what may still grow into one at the end of the text, a tag that ends a
# piece (only spaces after it), pause tags and bracket spans (never cut inside).
_TAG = re.compile(SPEAKER_TAG_PATTERN)
_TAG_PREFIX = re.compile(r"\[(?:S\d*)?")
_TAG_BEFORE = re.compile(SPEAKER_TAG_PATTERN + r"\s*\Z")
_PAUSE = re.compile(r"\[pause\b[^\[\]]*\]", re.IGNORECASE)
_BRACKET_SPAN = re.compile(rf"\[[^\[\]\n]{{0,{MAX_BRACKET_CHARS}}}\]")

# Cut points passed over, by preference when a segment must be cut (higher first).
_CUT_CLAUSE, _CUT_SENTENCE, _CUT_PAUSE, _CUT_TURN = 0, 1, 2, 3

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

    Not thread-safe; one per text stream. A speaker tag stays active across :meth:`flush`
    (a flush ends a segment, not the conversation): text fed after it continues that turn.
    """

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = (config or SegmenterConfig()).validate()
        self._buf = ""  # text of the current segment and beyond, not yet emitted
        self._pos = 0  # scan position in _buf: boundaries before it are decided
        self._w = 0  # weight of _buf[_start:_pos]
        self._start = 0  # where the current segment starts in _buf (0 between scans)
        self._open = -1  # position in _buf of a "[" not closed yet (-1: none)
        self._cands: list[tuple[int, int]] = []  # (position, priority): cuts not taken
        self._tag: str | None = None  # the speaker tag of the turn being read
        self._seg_tag: str | None = None  # the tag whose turn the current segment continues
        self._out: list[str] = []

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
        self._buf, self._pos, self._w, self._open, self._cands = "", 0, 0, -1, []
        if rest and _has_words(rest):
            out.append(self._with_tag(rest))
        self._seg_tag = self._tag
        return out

    # -- the scanner ---------------------------------------------------------------------
    def _scan(self, final: bool) -> list[str]:
        cfg = self.config
        buf = self._buf
        n = len(buf)
        self._out = []
        i = self._pos
        while i < n:
            ch = buf[i]
            if self._open >= 0 and i - self._open > MAX_BRACKET_CHARS + 1:
                self._open = -1  # never closed: a plain "[" after all
            if ch == "[":
                tag = _TAG.match(buf, i)
                if tag is None and not final and _TAG_PREFIX.fullmatch(buf, i):
                    break  # "[S1" may be a tag: wait for the rest
                if tag is not None:
                    self._turn(i, tag[0])
                    self._w += _weight_of(tag[0])
                    i = tag.end()
                    continue
                if self._open < 0:
                    self._open = i
            elif ch == "]" and self._open >= 0:
                if _PAUSE.fullmatch(buf, self._open, i + 1):
                    if i + 1 == n and not final:
                        break  # the next character decides whether it ends a segment
                    nxt = buf[i + 1] if i + 1 < n else ""
                    self._open = -1
                    self._w += 1
                    i += 1
                    if not nxt or (nxt not in _PUNCT and nxt not in _CLOSERS):
                        self._boundary(i, _CUT_PAUSE)
                    continue
                self._open = -1
            elif self._open < 0 and (ch in _PUNCT or ch == "\n"):
                j = i + 1
                while j < n and (buf[j] in _PUNCT or buf[j] in _CLOSERS or buf[j] == "\n"):
                    j += 1
                if j == n and not final:
                    break  # the run may continue, or the next character decides: wait for it
                run = buf[i:j]
                self._w += _weight_of(run)
                kind = self._boundary_kind(buf, i, run, buf[j] if j < n else "")
                if kind is not None:
                    self._boundary(j, kind)
                i = j
                continue
            self._w += _weight(ch)
            i += 1
            # an open "[" defers the cut until it closes or expires (MAX_BRACKET_CHARS at most)
            if self._w > cfg.max_chars and self._open < 0:
                self._cut(self._overflow_cut(i), i, force=True)
        s = self._start
        self._buf = buf[s:]
        self._pos = i - s
        self._open = self._open - s if self._open >= s else -1
        self._cands = [(p - s, k) for p, k in self._cands if p > s]
        self._start = 0
        return self._out

    def _boundary_kind(self, buf: str, i: int, run: str, nxt: str) -> int | None:
        """Whether the punctuation ``run`` at ``buf[i]`` ends a sentence or a clause."""
        cjk = any(c in _CJK_PUNCT for c in run)
        if not cjk and "\n" not in run and nxt and not nxt.isspace():
            return None  # "3.14", "a,b", "example.com", "Hello!World"
        sentence = "\n" in run or any(c in _SENTENCE for c in run)
        if (
            sentence
            and run[0] == "."
            and not cjk
            and "\n" not in run
            and _abbreviation(buf, self._start, i)
        ):
            return None
        return _CUT_SENTENCE if sentence else _CUT_CLAUSE

    def _boundary(self, pos: int, kind: int) -> None:
        """A cut point at ``pos``: taken once long enough outside a dialogue, else kept as a
        candidate for when the segment grows past ``max_chars``."""
        if self._tag is None:
            need = self.config.clause_min_chars if kind == _CUT_CLAUSE else self.config.min_chars
            if self._w >= need and self._cut(pos, pos):
                return
        self._cands.append((pos, kind))

    def _turn(self, pos: int, tag: str) -> None:
        """A speaker tag at ``pos``: a turn starts; cut before it once the segment is long
        enough (shorter turns share a segment)."""
        self._open = -1  # a "[" left open before a tag was no bracket
        self._tag = tag
        if not (self._w >= self.config.min_chars and self._cut(pos, pos)):
            self._cands.append((pos, _CUT_TURN))

    def _cut(self, pos: int, i: int, *, force: bool = False) -> bool:
        """Emit ``_buf[_start:pos]`` as a segment; ``i`` is the scan position. Without
        ``force`` a piece with no words is not cut; with it, it is dropped."""
        buf = self._buf
        piece = buf[self._start : pos].strip()
        if not force and not _cuttable(piece):
            return False
        if _has_words(piece):  # forced (overflow): what has no words is dropped
            self._out.append(self._with_tag(piece))
        self._start = pos
        self._w = _weight_of(buf[pos:i])
        self._cands = [(p, k) for p, k in self._cands if p > pos]
        self._seg_tag = self._tag
        return True

    def _with_tag(self, piece: str) -> str:
        """A piece that continues a turn cut in two starts with that turn's tag again."""
        if self._seg_tag is None or _TAG.match(piece):
            return piece
        return self._seg_tag + ("" if _is_cjk(piece[0]) else " ") + piece

    def _overflow_cut(self, end: int) -> int:
        """Where to cut ``_buf[_start:end]``, whose weight just went over ``max_chars``.

        The best cut point passed over: a turn boundary (keeps the turns before it whole),
        else a pause, a sentence end, a clause end; else a space, else a hard cut; never
        inside ``[...]`` nor between a speaker tag and its words.
        """
        buf, start = self._buf, self._start
        best: tuple[int, int] | None = None
        for pos, kind in self._cands:
            if start < pos < end and _cuttable(buf[start:pos]):
                if best is None or (kind, pos) > (best[1], best[0]):
                    best = (pos, kind)
        if best is not None:
            return best[0]
        spans = [(m.start(), m.end()) for m in _BRACKET_SPAN.finditer(buf, start, end)]
        if self._open >= start:
            spans.append((self._open, end + 1))
        # Prefer the last whitespace (a word boundary), but not one that leaves a tiny piece.
        k = end
        while (k := buf.rfind(" ", start, k)) > start:
            if any(a < k < b for a, b in spans) or _TAG_BEFORE.search(buf, start, k):
                continue
            if _weight_of(buf[start:k]) >= self.config.max_chars // 2:
                return k
            break
        cut = end - 1  # hard cut before the character that went over
        for a, b in spans:
            if a < cut < b:
                cut = a if a > start else min(b, end)
        tag = _TAG_BEFORE.search(buf, start, cut)
        if tag is not None:  # the tag would end this piece: cut before it, or after a word
            cut = tag.start() if tag.start() > start else end
        return cut


def _weight_of(text: str) -> int:
    return sum(_weight(c) for c in text)


def _has_words(piece: str) -> bool:
    """Whether a piece has something to say besides its speaker tags."""
    return speakable(_TAG.sub("", piece))


def _cuttable(piece: str) -> bool:
    """Whether a piece may be a segment: words, and no speaker tag at its end (the tag
    belongs to the words after it)."""
    return _has_words(piece) and _TAG_BEFORE.search(piece) is None


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
