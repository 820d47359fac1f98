"""What the asyncio side sends the engine thread (EngineCore's command queue)."""

from __future__ import annotations

from dataclasses import dataclass

from ..request import PreparedRequest

__all__ = ["Abort", "Command", "EndSession", "Stop", "Submit"]


@dataclass(frozen=True, slots=True)
class Submit:
    """A prepared request, to wait for a slot."""

    req: PreparedRequest


@dataclass(frozen=True, slots=True)
class Abort:
    """Stop request ``rid`` (running or waiting) and drop its audio."""

    rid: int


@dataclass(frozen=True, slots=True)
class EndSession:
    """Session ``session`` will start no more streams: the room it holds is free."""

    session: int


@dataclass(frozen=True, slots=True)
class Stop:
    """End the loop (every stream fails with EngineClosedError)."""


Command = Submit | Abort | EndSession | Stop
