"""Cut a text into pieces a server takes in one message each (``max_text_chars``, and the
message's JSON under ``max_message_bytes``), at sentence ends where it can.

The server's segmenter cuts text fed in any pieces as it cuts the whole (segmenter.py), so
where a piece ends changes nothing it speaks; sentence ends (then clause ends, then spaces)
only keep each message readable in a log. Joined, the pieces are the text.
"""

from __future__ import annotations

import json

from .segmenter import _CJK_PUNCT, _CLOSERS, _PUNCT, _SENTENCE

__all__ = ["split_for_messages"]

# a text message's JSON besides its text: {"type": "text", "text": "", "context_id": "..."}
_ENVELOPE_BYTES = 512


def split_for_messages(text: str, max_chars: int, max_bytes: int | None = None) -> list[str]:
    """``text`` in pieces of at most ``max_chars`` characters whose JSON string (escapes and
    UTF-8) fits ``max_bytes`` with room for the message around it."""
    budget = None if max_bytes is None else max(64, max_bytes - _ENVELOPE_BYTES)
    pieces = []
    while text:
        n = _fits(text, max_chars, budget)
        if n < len(text):
            n = _best_cut(text[:n]) or n
        pieces.append(text[:n])
        text = text[n:]
    return pieces


def _fits(text: str, max_chars: int, budget: int | None) -> int:
    """How many leading characters fit the limits."""
    n = min(len(text), max(1, max_chars))
    if budget is None:
        return n
    used = 0
    for i, ch in enumerate(text[:n]):
        used += len(json.dumps(ch, ensure_ascii=False).encode("utf-8")) - 2
        if used > budget:
            return max(1, i)
    return n


def _best_cut(window: str) -> int:
    """Where to end a piece within ``window``: after the last sentence end, else clause end,
    else space (keeping the space with the piece before); 0 if none."""
    best = {True: 0, False: 0}  # sentence end?, clause end -> position after it
    space = 0
    for i, ch in enumerate(window):
        if ch.isspace():
            space = i + 1
        if ch not in _PUNCT:
            continue
        j = i + 1
        while j < len(window) and (window[j] in _CLOSERS or window[j] in _PUNCT):
            j += 1
        if ch in _CJK_PUNCT or (j < len(window) and window[j].isspace()):
            while j < len(window) and window[j].isspace():
                j += 1
            best[ch in _SENTENCE] = j
    return best[True] or best[False] or space
