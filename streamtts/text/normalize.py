"""Robustness normalisation of the text to speak, before it is tokenised.

The official MOSS-TTS-Delay HF processor passes every user ``text`` (not the
``instruction`` or other fields) through a robustness normaliser, and the
model was trained on text that went through it. Feeding raw text (markdown,
CRLF, ``！！！``, arrows, stray spaces inside Chinese) puts the model
off-distribution, so the engine applies the same rules. This is not semantic
text normalisation: numbers, dates and units are left for the model to read.

Rules, applied in this order:

1. Unicode clean-up: CRLF / CR become LF, U+3000 becomes a space, and every
   control, format (zero-width), private-use or unassigned character except
   tab and LF is dropped.
2. Markdown: ``[text](http…)`` becomes ``text http…``; each line is trimmed,
   blank lines are dropped, one heading ``#``, quote ``>``, bullet and
   ``1.`` / ``1)`` marker is removed from its start, and the lines are joined
   with ``。``.
3. Protection: URLs, e-mails, @handles, ``u/``/``r/`` names, #tags,
   dot-files (``.env``) and file / version-like tokens (``app.js.map``,
   ``v2.3.1``) are swapped for opaque placeholders that no later rule edits.
4. Spaces: runs collapse to one; none inside CJK text, nor between CJK and
   digits; exactly one between CJK and Latin words or protected tokens; none
   around Chinese punctuation nor before ``, . ; ! ?``.
5. Headline brackets ``【】〖〗『』「」`` at a sentence start are unwrapped and
   end the sentence; a stand-alone ``《title》`` is unwrapped, an embedded one
   kept.
6. Arrows (``->``, ``=>``, ``<-``, ``→`` …) become ``，``.
7. Runs of two or more dashes become ``。``.
8. Ellipses (``...``, ``……``) become ``。``; repeated ``。``/``，`` collapse to
   one; a run of ``!``/``?`` becomes ``！``, ``？`` or ``？！``.
9. Spaces again, then placeholders are restored and the ends trimmed.

``[...]`` and ``{...}`` (speaker tags, sound events) are kept as they are. A ``[...]``
on one line (up to ``MAX_BRACKET_CHARS`` inside) is protected like the tokens of rule 3,
before them: ``[pause 1.5s]``, ``[S1]``, ``[laughs]`` pass unchanged, contents included, but
for runs of spaces inside, which collapse to one. The official code means to keep them so
("preserve the contents of [] and {}") but still rewrites arrows, dashes and repeated
punctuation inside them; v1.5 reads ``[pause X.Ys]`` as a pause and TTSD ``[S1]`` as a turn.

The behaviour follows ``moss_tts_delay/tts_robust_normalizer_single_script.py``
of OpenMOSS/MOSS-TTS (reimplemented, not copied), with one deliberate fix:
a protected token nested inside another (``.@user``, ``#tag`` glued to a
URL) is restored in full, where the official code leaks its placeholder.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["MAX_BRACKET_CHARS", "normalize_text"]

# -- character classes (regex class bodies) ---------------------------------------------

# Scripts written without spaces between words: CJK ext. A, CJK unified, kana.
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff"

# Placeholders are single characters from plane-15 private use. Rule 1 drops
# every private-use character, so they can never clash with the input.
_SLOT_BASE = 0xF0000
_SLOT_COUNT = 0xFFFFE - _SLOT_BASE
_SLOT = "\U000f0000-\U000ffffd"

# Characters that make a neighbouring "@", "#", "." etc. part of a bigger word.
# A placeholder counts as one, as the official "___PROTn___" placeholder does.
_IDENT = f"A-Za-z0-9_{_SLOT}"
# Characters of file names, paths and version strings, and the letters among them
# (a placeholder counts as both, like the official one).
_PATH = rf"A-Za-z0-9._/+:\-{_SLOT}"
_LETTER = f"A-Za-z{_SLOT}"
# Characters of a dot-file name (".env", ".gitignore").
_DOTNAME = rf"A-Za-z0-9._\-{_SLOT}"

# Chinese punctuation that takes no space before / after it.
_CLOSING_ZH = "，。！？；：、”’」』】）》"
_OPENING_ZH = "（【「『《“‘"
_PAUSE_ZH = "，。！？；：、"
# Punctuation after which a new sentence (clause) starts.
_SENTENCE_END = "。！？!?；;"
_DASH = r"—–―\-"

# -- rule 1: Unicode clean-up -----------------------------------------------------------

_KEEP_CONTROLS = frozenset("\n\t")


def _clean_unicode(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u3000", " ")
    unwanted = {
        ord(ch)
        for ch in set(text)
        if ch not in _KEEP_CONTROLS and unicodedata.category(ch).startswith("C")
    }
    return text.translate(dict.fromkeys(unwanted)) if unwanted else text


# -- rule 2: markdown and lines ---------------------------------------------------------

_MD_LINK = re.compile(r"\[ ([^\[\]]+) \] \( (https?://[^)\s]+) \)", re.X)
_LINE_MARKERS = re.compile(
    r"""
    ^ (?: \#{1,6} \s+ )?     # heading
      (?: > \s+ )?           # block quote
      (?: [-*+] \s+ )?       # bullet
      (?: \d+ [.)] \s+ )?    # numbered item
    """,
    re.X,
)


def _strip_markdown(text: str) -> str:
    text = _MD_LINK.sub(r"\1 \2", text)
    lines = (line.strip() for line in text.splitlines())
    return "。".join(_LINE_MARKERS.sub("", line, count=1) for line in lines if line)


# -- rule 3: protected tokens -----------------------------------------------------------

# Highest priority first; each pattern runs over the output of the previous one.
_PROTECTED = tuple(
    re.compile(pattern, re.X)
    for pattern in (
        # URL, up to whitespace or Chinese punctuation
        r"https?:// [^\s，。！？；、）】》〉」』]+",
        # e-mail address
        rf"(?<![\w.+\-{_SLOT}]) [A-Za-z0-9._%+\-{_SLOT}]+ @ [A-Za-z0-9.\-]+ \. [A-Za-z]{{2,}}"
        rf" (?![\w.\-{_SLOT}])",
        # @handle
        rf"(?<![{_IDENT}]) @ [{_IDENT}]{{1,32}}",
        # reddit u/name, r/name
        rf"(?<![{_IDENT}]) [ur] / [{_IDENT}]+",
        # #tag (anything up to whitespace or the next '#')
        rf"(?<![{_IDENT}]) \# [^\s\#]+",
        # dot-file
        rf"(?<![{_IDENT}]) \. (?=[{_DOTNAME}]*[A-Za-z0-9{_SLOT}]) [{_DOTNAME}]+",
        # file / path / version: has a letter and a separator, ends alphanumeric
        rf"""(?<![{_IDENT}])
            (?=[{_PATH}]*[{_LETTER}]) (?=[{_PATH}]*[._/+:\-{_SLOT}])
            [A-Za-z0-9] (?:[{_PATH}]*[A-Za-z0-9])?
            (?![{_IDENT}])""",
    )
)
_ANY_SLOT = re.compile(f"[{_SLOT}]")


def _restore_tokens(text: str, spans: list[str]) -> str:
    return _ANY_SLOT.sub(lambda m: spans[ord(m[0]) - _SLOT_BASE], text)


# Bracket spans get placeholders from plane-16 private use (also dropped by rule 1): unlike
# rule 3's they are no Latin word, so the spacing rules treat them as they treat "[" and "]".
MAX_BRACKET_CHARS = 64
_BRACKET = re.compile(rf"\[ [^\[\]\n]{{0,{MAX_BRACKET_CHARS}}} \]", re.X)
_BRACKET_BASE = 0x100000
_BRACKET_COUNT = 0x10FFFE - _BRACKET_BASE
_ANY_BRACKET = re.compile("[\U00100000-\U0010fffd]")


def _protect_brackets(text: str) -> tuple[str, list[str]]:
    """Stash each ``[...]`` (spaces collapsed), before rule 3: a token that holds one (a URL,
    a #tag) holds its placeholder, restored after the token's."""
    brackets: list[str] = []

    def stash(match: re.Match[str]) -> str:
        if len(brackets) >= _BRACKET_COUNT:
            return match[0]
        brackets.append(_INLINE_SPACE_RUN.sub(" ", match[0]))
        return chr(_BRACKET_BASE + len(brackets) - 1)

    return _BRACKET.sub(stash, text), brackets


def _restore_brackets(text: str, brackets: list[str]) -> str:
    return _ANY_BRACKET.sub(lambda m: brackets[ord(m[0]) - _BRACKET_BASE], text)


def _protect_tokens(text: str) -> tuple[str, list[str]]:
    spans: list[str] = []

    def stash(match: re.Match[str]) -> str:
        if len(spans) >= _SLOT_COUNT:  # absurdly many tokens: leave the rest unprotected
            return match[0]
        spans.append(_restore_tokens(match[0], spans))  # store nested tokens expanded
        return chr(_SLOT_BASE + len(spans) - 1)

    for pattern in _PROTECTED:
        text = pattern.sub(stash, text)
    return text, spans


# -- rule 4: spaces ---------------------------------------------------------------------

_LATIN_WORD = rf"(?=[{_PATH}]*[{_LETTER}]) [A-Za-z0-9{_SLOT}][{_PATH}]*"

_INLINE_SPACE_RUN = re.compile(r"[ \t\r\f\v]+")
_SPACE_INSIDE_CJK = re.compile(rf"(?<=[{_CJK}]) \s+ (?=[{_CJK}])", re.X)
_SPACE_CJK_DIGIT = re.compile(rf"(?<=[{_CJK}]) \s+ (?=\d) | (?<=\d) \s+ (?=[{_CJK}])", re.X)
_CJK_THEN_LATIN = re.compile(rf"(?<=[{_CJK}]) (?={_LATIN_WORD})", re.X)
_LATIN_THEN_CJK = re.compile(rf"({_LATIN_WORD}) (?=[{_CJK}])", re.X)
_MULTI_SPACE = re.compile(r" {2,}")
_SPACE_BEFORE_CLOSING_ZH = re.compile(rf"\s+(?=[{_CLOSING_ZH}])")
_SPACE_AFTER_OPENING_ZH = re.compile(rf"(?<=[{_OPENING_ZH}])\s+")
_SPACE_AFTER_PAUSE_ZH = re.compile(rf"(?<=[{_PAUSE_ZH}])\s+")
_SPACE_BEFORE_ASCII_PUNCT = re.compile(r"\s+(?=[,.;!?])")


def _collapse_spaces(text: str) -> str:
    text = _INLINE_SPACE_RUN.sub(" ", text)
    text = _SPACE_INSIDE_CJK.sub("", text)
    text = _SPACE_CJK_DIGIT.sub("", text)
    text = _CJK_THEN_LATIN.sub(" ", text)
    text = _LATIN_THEN_CJK.sub(r"\1 ", text)
    text = _MULTI_SPACE.sub(" ", text)
    text = _SPACE_BEFORE_CLOSING_ZH.sub("", text)
    text = _SPACE_AFTER_OPENING_ZH.sub("", text)
    text = _SPACE_AFTER_PAUSE_ZH.sub("", text)
    text = _SPACE_BEFORE_ASCII_PUNCT.sub("", text)
    return _MULTI_SPACE.sub(" ", text).strip()


# -- rule 5: headline brackets and titles -----------------------------------------------

_AT_SENTENCE_START = rf"(?P<lead> ^ | [{_SENTENCE_END}] \s* )"
_HEADLINE = re.compile(
    rf"{_AT_SENTENCE_START} [【〖『「] (?P<body>[^】〗』」]+) [】〗』」] \s*", re.X
)
_STANDALONE_TITLE = re.compile(
    rf"""{_AT_SENTENCE_START} 《 (?P<body>[^》]+) 》
    (?= \s* (?: [{_SLOT}] | [{_DASH}]{{2,}} | \Z | [{_SENTENCE_END}，,] ) )""",
    re.X,
)


def _unwrap_headline_brackets(text: str) -> str:
    # A second pass catches a bracket that directly follows one just unwrapped.
    for _ in range(2):
        text = _HEADLINE.sub(r"\g<lead>\g<body>。", text)
    return _STANDALONE_TITLE.sub(r"\g<lead>\g<body>", text)


# -- rules 6 and 7: arrows and dashes ---------------------------------------------------

_ARROW = re.compile(r"\s* (?: <[-=]+>? | [-=]+> | [→←↔⇒⇐⇔⟶⟵⟷⟹⟸⟺↦↤↪↩] ) \s*", re.X)
_DASH_RUN = re.compile(rf"\s* [{_DASH}]{{2,}} \s*", re.X)


def _arrows_to_commas(text: str) -> str:
    return _ARROW.sub("，", text)


def _dashes_to_full_stop(text: str) -> str:
    return _DASH_RUN.sub("。", text)


# -- rule 8: repeated punctuation -------------------------------------------------------

_ELLIPSIS = re.compile(r"\.{3,}|…{2,}")
_FULL_STOP_RUN = re.compile(r"[。．]{2,}")
_COMMA_RUN = re.compile(r"[，,]{2,}")
_BANG_QUERY_RUN = re.compile(r"[!?！？]{2,}")


def _merge_bang_query(match: re.Match[str]) -> str:
    run = match[0]
    query = "?" in run or "？" in run
    bang = "!" in run or "！" in run
    return "？！" if query and bang else "？" if query else "！"


def _collapse_repeated_punctuation(text: str) -> str:
    text = _ELLIPSIS.sub("。", text)
    text = _FULL_STOP_RUN.sub("。", text)
    text = _COMMA_RUN.sub("，", text)
    return _BANG_QUERY_RUN.sub(_merge_bang_query, text)


# -- entry point ------------------------------------------------------------------------


def normalize_text(text: str) -> str:
    """Normalise ``text`` the way the official MOSS-TTS-Delay processor does."""
    text = _clean_unicode(text)
    text = _strip_markdown(text)
    text, brackets = _protect_brackets(text)
    text, spans = _protect_tokens(text)
    text = _collapse_spaces(text)
    text = _unwrap_headline_brackets(text)
    text = _arrows_to_commas(text)
    text = _dashes_to_full_stop(text)
    text = _collapse_repeated_punctuation(text)
    text = _collapse_spaces(text)
    return _restore_brackets(_restore_tokens(text, spans), brackets).strip()
