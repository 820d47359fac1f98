"""What a client may ask for: ``timestamps`` = none | words | chars (the rule: request/rules.py)."""

from __future__ import annotations

from ..request.rules import TIMESTAMP_MODES, check_timestamps

__all__ = ["TIMESTAMP_MODES", "check_timestamps"]
