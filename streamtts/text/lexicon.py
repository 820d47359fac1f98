"""Pronunciation lexicons: words and phrases rewritten as they should be read, before the
text is tokenised.

A lexicon is a map ``{"word or phrase": "how to read it", ...}``: a respelling
(``"nginx": "engine x"``), or inline Pinyin / IPA where the member reads it. It is applied to
the text after normalisation and before tokenisation; only the prompt changes (the word
times report the words as written, engine/prepare.py keeps the text as given for them).

Matching (:func:`apply_lexicons`):

* **Whole words.** A key matches only where it is not part of a longer word: the text has
  no letter, digit or ``_`` (a word character) just before it nor just after it ("cat" does
  not match in "cats" nor "concat"; "e.g." matches in "e.g., this"; ".NET" matches in
  "a .NET app", not in "ASP.NET").
* **CJK.** Chinese and Japanese write no spaces, so a Han or kana character on a key's
  edge needs no boundary there: a CJK key matches as a plain substring ("重庆" anywhere in
  "我去重庆了"), and CJK characters next to a Latin key count as a boundary ("我在New York工作").
* **Case.** A key written in lower case (no upper-case letter) matches whatever the case of
  the text ("nginx" matches "Nginx" and "NGINX"); a key with an upper-case letter matches
  only that exact spelling ("US" matches "US", not "us").
* **Longest first.** Where several keys match at one place the longest wins ("New York
  City" before "New York"); of two of one length, an exact-case key before a lower-case one.
* **One pass.** Replacements are never looked up again: with ``"AI": "A I"`` and
  ``"I": "eye"``, "AI" is read "A I". A cycle (a key whose replacement holds a key whose
  replacement ... holds the first again: ``"a": "b", "b": "a"``; ``"Java": "Java language"``)
  cannot mean anything and is refused, naming its first key. A key mapped to itself
  (``"Smith": "Smith"``: read as written) is no cycle: it overrides a layer below.
* **Layers.** A request's lexicon, a stored one it names and the server's are matched
  together in that order: the longest match wins, and a tie goes to the earlier layer (a
  request's entry overrides the server's entry for the same key).

Every rule broken is a :class:`~streamtts.errors.FieldError` on ``lexicon`` naming the
entry at fault: ``lexicon["nginx"]: the replacement is empty``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import FieldError
from ..request.stream import LexiconLayer

__all__ = [
    "MAX_ENTRIES",
    "MAX_KEY_CHARS",
    "MAX_LEXICON_BYTES",
    "MAX_REPLACEMENT_CHARS",
    "Lexicon",
    "apply_lexicons",
    "lexicon_id",
]

MAX_ENTRIES = 10_000
MAX_KEY_CHARS = 100
MAX_REPLACEMENT_CHARS = 200
MAX_LEXICON_BYTES = 1 << 20  # keys and replacements together, UTF-8

# Han (+ extension A, compatibility) and kana: no spaces between words (timing/words.py's set)
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff"
_IS_CJK = re.compile(f"[{_CJK}]")
_IS_WORD = re.compile(rf"[^\W{_CJK}]")  # a word character that is not CJK: boundaries need it
# the text's tokens: a run of (non-CJK) word characters, or any one other character
_TOKEN = re.compile(rf"[^\W{_CJK}]+|.", re.DOTALL)
_FIRST_RUN = re.compile(rf"[^\W{_CJK}]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

T = TypeVar("T")


def _word(ch: str) -> bool:
    return bool(_IS_WORD.match(ch))


@dataclass(frozen=True, slots=True)
class _Key:
    key: str
    replacement: str
    exact: bool  # has an upper-case letter: matches only as written
    right_boundary: bool  # does not end with a CJK character: no word character may follow


@dataclass(frozen=True, slots=True)
class Lexicon:
    """A checked lexicon, indexed for matching (build one with :meth:`compile`)."""

    entries: dict[str, str]
    name: str = ""
    # keys that start with a word character, by their first run of word characters (folded)
    _by_run: dict[str, tuple[_Key, ...]] = field(default_factory=dict, repr=False, compare=False)
    # the others (CJK or punctuation first), by their first character (folded)
    _by_char: dict[str, tuple[_Key, ...]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def compile(cls, entries: object, *, what: str = "lexicon", name: str = "") -> Lexicon:
        """``entries`` checked (a map of non-empty strings within the limits, no replacement
        holding another key) and indexed. ``what``: how errors name the lexicon (the field
        ``lexicon``, a file's flag). Raises :class:`FieldError` (field ``lexicon``)."""
        if not isinstance(entries, Mapping):
            raise FieldError(
                "lexicon",
                f"{what} must be a JSON object mapping words to how they are read "
                f'({{"nginx": "engine x"}}), got {_kind(entries)}',
            )
        if len(entries) > MAX_ENTRIES:
            raise FieldError(
                "lexicon", f"{what} has {len(entries)} entries; the limit is {MAX_ENTRIES}"
            )
        size = 0
        checked: dict[str, str] = {}
        for key, value in entries.items():
            at = f"{what}[{_show(key)}]"
            if not isinstance(key, str) or not key.strip():
                raise FieldError("lexicon", f"{at}: a key must be a non-empty word or phrase")
            if key != key.strip():
                raise FieldError("lexicon", f"{at}: the key starts or ends with a space")
            if len(key) > MAX_KEY_CHARS:
                raise FieldError(
                    "lexicon",
                    f"{at}: the key is {len(key)} characters; the limit is {MAX_KEY_CHARS}",
                )
            if not isinstance(value, str):
                raise FieldError(
                    "lexicon", f"{at}: the replacement must be a string, got {_kind(value)}"
                )
            if not value.strip():
                raise FieldError("lexicon", f"{at}: the replacement is empty")
            if len(value) > MAX_REPLACEMENT_CHARS:
                raise FieldError(
                    "lexicon",
                    f"{at}: the replacement is {len(value)} characters; the limit is {MAX_REPLACEMENT_CHARS}",
                )
            if _CONTROL.search(key) or _CONTROL.search(value):
                raise FieldError(
                    "lexicon", f"{at}: control characters (line breaks, tabs) are not allowed"
                )
            size += len(key.encode("utf-8", "surrogatepass")) + len(
                value.encode("utf-8", "surrogatepass")
            )
            if size > MAX_LEXICON_BYTES:
                raise FieldError(
                    "lexicon", f"{what} is over {MAX_LEXICON_BYTES} bytes of keys and replacements"
                )
            checked[key] = value
        lex = cls._index(checked, name)
        lex._check_cycles(what)
        return lex

    @classmethod
    def _index(cls, entries: dict[str, str], name: str) -> Lexicon:
        by_run: dict[str, list[_Key]] = {}
        by_char: dict[str, list[_Key]] = {}
        for key, value in entries.items():
            k = _Key(
                key, value, exact=key != key.lower(), right_boundary=not _IS_CJK.match(key[-1])
            )
            run = _FIRST_RUN.match(key)
            if run is not None:
                by_run.setdefault(run.group().lower(), []).append(k)
            else:
                by_char.setdefault(key[0].lower(), []).append(k)

        def order(table: dict[str, list[_Key]]) -> dict[str, tuple[_Key, ...]]:
            # longest first; of one length, exact-case keys first
            return {
                t: tuple(sorted(ks, key=lambda k: (-len(k.key), not k.exact)))
                for t, ks in table.items()
            }

        return cls(entries, name, order(by_run), order(by_char))

    def _check_cycles(self, what: str) -> None:
        """No key leads back to itself through the keys its replacement holds (``a -> b``,
        ``b -> a``): with one pass nothing loops, but such a lexicon cannot say what it means.
        A key mapped to itself (read as written: it overrides a layer below) is no cycle."""
        edges: dict[str, list[str]] = {}
        for key, value in self.entries.items():
            if value != key:
                found = [k.key for _, _, k in _matches(value, (self._find,))]
                if found:
                    edges[key] = found
        state: dict[str, int] = {}  # 1: on the path now, 2: done
        for root in edges:
            if state.get(root):
                continue
            path = [root]
            stack = [iter(edges[root])]
            state[root] = 1
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    state[path.pop()] = 2
                    stack.pop()
                    continue
                if state.get(nxt) == 1:
                    loop = path[path.index(nxt) :] + [nxt]
                    raise FieldError(
                        "lexicon",
                        f"{what}[{_show(loop[0])}]: a cycle: {' -> '.join(_show(k) for k in loop)} "
                        "(each replacement holds the next key); replacements are not looked up "
                        "again, so write each reading in full",
                    )
                if nxt in edges and not state.get(nxt):
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(edges[nxt]))

    def __len__(self) -> int:
        return len(self.entries)

    def match(self, text: str, pos: int, token: str) -> tuple[int, str] | None:
        """The longest key matching ``text`` at ``pos`` (``token``: the text's token there):
        (its end, its replacement); None when none does."""
        found = self._find(text, pos, token)
        return None if found is None else (found[0], found[1].replacement)

    def _find(self, text: str, pos: int, token: str) -> tuple[int, _Key] | None:
        if _word(token[0]):
            cands = self._by_run.get(token.lower(), ())
        else:
            cands = self._by_char.get(token.lower(), ())
        for k in cands:
            end = pos + len(k.key)
            piece = text[pos:end]
            if piece != k.key and (k.exact or piece.lower() != k.key.lower()):
                continue
            if k.right_boundary and end < len(text) and _word(text[end]):
                continue
            return end, k
        return None

    @property
    def id(self) -> str:
        return lexicon_id(self.entries)


def _matches(
    text: str, finders: Sequence[Callable[[str, int, str], tuple[int, T] | None]]
) -> Iterator[tuple[int, int, T]]:
    """(start, end, what the finder found) of each match in ``text``, left to right, without
    overlaps; at one place the longest, of two the earlier finder's."""
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        assert m is not None  # "." with DOTALL matches any character
        token = m.group()
        # a key starts after no word character, unless it starts with a CJK character
        best: tuple[int, T] | None = None
        if pos == 0 or not _word(text[pos - 1]) or _IS_CJK.match(token):
            for find in finders:
                found = find(text, pos, token)
                if found is not None and (best is None or found[0] > best[0]):
                    best = found
        if best is not None:
            yield pos, best[0], best[1]
            pos = best[0]
        else:
            pos = m.end()


def apply_lexicons(text: str, layers: Sequence[LexiconLayer]) -> str:
    """``text`` with every match of the ``layers`` (earlier layers win ties) replaced, in one
    pass (see the module's rules)."""
    finders = [lx.match for lx in layers if len(lx)]
    if not finders or not text:
        return text
    out: list[str] = []
    last = 0
    for start, end, replacement in _matches(text, finders):
        out.append(text[last:start])
        out.append(replacement)
        last = end
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def lexicon_id(entries: Mapping[str, str]) -> str:
    """The content address of a lexicon: its entries, sorted, as JSON."""
    data = json.dumps(dict(sorted(entries.items())), ensure_ascii=False, separators=(",", ":"))
    return "lx_" + hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _show(value: object) -> str:
    """A key or value as an error quotes it (JSON's quotes; cut when long)."""
    s = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)
    return s if len(s) <= 60 else s[:57] + '..."'


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
             bool: "a boolean", type(None): "null"}  # fmt: skip
    return names.get(type(value), type(value).__name__)
