"""Text -> the words a client sees, each with its expected relative duration.

A word is what a voice agent puts back in its context: a run of non-space characters with
its punctuation attached ("world," is one word), or one CJK character (Chinese and Japanese
write no spaces; a character is about one syllable). ``units`` is the duration model: the
word's syllables (vowel groups, English's silent final ``e`` dropped; digits and letters of
an acronym are spoken one by one), one per CJK character or Hangul block; ``syllables`` is
how many syllable nuclei the audio should show for it (nuclei.py). ``pause`` says the
speaker is likely to stop after the word (1 after a comma, 2 after a sentence's end): the
aligner prefers to put such a boundary in a silence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Word", "split_words"]


@dataclass(frozen=True, slots=True)
class Word:
    text: str  # as written in the source (punctuation attached)
    start_char: int  # offset in the source text
    end_char: int  # exclusive
    units: float  # expected duration, in syllables
    pause: int = 0  # 0 none, 1 clause break, 2 sentence end (after this word)
    syllables: float = 1.0  # expected syllable nuclei (what the audio's energy peaks count)


# Han (+ extension A, compatibility) and kana: one word per character (Korean writes spaces).
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+")
_HANGUL = re.compile("[\uac00-\ud7af]")
_WORDLIKE = re.compile(r"\w")
_VOWELS = re.compile(r"[aeiouyàáâãäåæèéêëìíîïòóôõöøùúûüýÿœ"
                     r"аеёиоуыэюяіїєαεηιουωάέήίόύώ]+", re.IGNORECASE)
_DIGITS = re.compile(r"\d")
_CLAUSE = set(",;:，、；：—–")
_SENTENCE = set(".!?。！？…")
# A spoken digit is about 1.5 syllables on average ("seven", "forty" ...).
_DIGIT_UNITS = 1.5
# Each consonant letter adds to a syllable's length ("strength" is longer than "a").
CONSONANT_UNITS = 0.2
# Speakers slow down before a pause: the word before a comma or full stop lasts longer.
FINAL_LENGTHENING = (0.0, 0.5, 0.8)


def _count(token: str) -> tuple[float, float]:
    """(units, syllables) of a word."""
    if _HANGUL.search(token):  # Korean writes spaces: a word of syllable blocks
        n = float(len(_HANGUL.findall(token)))
        return n, n
    if len(token) == 1 and re.match(f"[{_CJK}]", token):
        return 1.0, 1.0
    letters = "".join(ch for ch in token if ch.isalpha())
    digits = len(_DIGITS.findall(token))
    if not letters:
        n = max(1.0, _DIGIT_UNITS * digits) if digits else 0.0
        return n, n
    if len(letters) >= 2 and letters.isupper() and len(letters) <= 5:  # an acronym, spelled
        n = float(len(letters)) + _DIGIT_UNITS * digits
        return n, n
    low = letters.lower()
    groups = len(_VOWELS.findall(low))
    if groups == 0:  # a script without our vowel list, or "hmm": about 3 letters a syllable
        groups = max(1, round(len(low) / 3))
    elif groups > 1 and low.endswith("e") and not low.endswith(("le", "ee", "ye")):
        groups -= 1  # silent final e ("time", "make")
    elif groups > 1 and low.endswith("es") and len(low) > 3 and low[-3] not in "scxzgh":
        groups -= 1  # "times", "makes" (but "boxes", "places")
    consonants = len(low) - sum(len(g) for g in _VOWELS.findall(low))
    units = float(groups) + CONSONANT_UNITS * consonants + _DIGIT_UNITS * digits
    # a final "ed" is no syllable of its own after other than t or d ("opened", "looked";
    # but "hundred", "sacred")
    silent_ed = low.endswith("ed") and low[-3:-2] not in ("t", "d") and not low.endswith(("dred", "cred"))
    nuclei = groups - (1 if groups > 1 and silent_ed else 0)
    return units, float(nuclei) + _DIGIT_UNITS * digits


def _pause(token: str) -> int:
    tail = token.rstrip("\"'”’»)]）」』")
    if not tail:
        return 0
    if tail[-1] in _SENTENCE:
        return 2
    if tail[-1] in _CLAUSE:
        return 1
    return 0


def split_words(text: str) -> list[Word]:
    """The words of ``text`` in order; tokens with nothing to say (a lone dash, quotes)
    join the word before them (or, at the start, the word after)."""
    words: list[Word] = []
    lead: int | None = None  # start of leading punctuation waiting for its word
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if not _WORDLIKE.search(tok):  # punctuation only
            if words and not _is_cjk(tok):
                prev = words[-1]
                if prev.end_char == m.start() or tok[0] not in "\"'“‘«([（「『":
                    words[-1] = _make(text, prev.start_char, m.end())
                    continue
            if words and _is_cjk_punct(tok):
                prev = words[-1]
                words[-1] = _make(text, prev.start_char, m.end())
                continue
            if lead is None:
                lead = m.start()
            continue
        start = m.start() if lead is None else lead
        lead = None
        words.append(_make(text, start, m.end()))
    return words


def _make(text: str, start: int, end: int) -> Word:
    tok = text[start:end]
    core = tok.strip("\"'“”‘’«»()[]（）「」『』")
    pause = _pause(tok)
    units, syllables = _count(core)
    if units and not _is_cjk(core[:1]):
        units += FINAL_LENGTHENING[pause]
    return Word(text=tok, start_char=start, end_char=end, units=units, pause=pause, syllables=syllables)


def _is_cjk(tok: str) -> bool:
    return bool(re.fullmatch(f"[{_CJK}]", tok))


def _is_cjk_punct(tok: str) -> bool:
    return all(ch in "，。、；：！？…「」『』（）—" for ch in tok)
