"""Estimated word and character times of generated speech (pure NumPy; see estimate.py)."""

from .chars import CharTimes, char_times
from .estimate import StreamAligner, WordTime, align_words
from .words import Word, split_words

__all__ = ["CharTimes", "StreamAligner", "Word", "WordTime", "align_words", "char_times", "split_words"]
