"""What a client may ask for: ``timestamps`` = none | words | chars."""

from __future__ import annotations

__all__ = ["TIMESTAMP_MODES", "check_timestamps"]

TIMESTAMP_MODES = ("none", "words", "chars")


def check_timestamps(mode: str | None) -> str:
    """The mode (None = "none"), or ValueError naming the choices."""
    m = mode or "none"
    if m not in TIMESTAMP_MODES:
        raise ValueError(f"timestamps must be one of {', '.join(TIMESTAMP_MODES)}, got {mode!r}")
    return m
