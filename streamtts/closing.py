"""``Closing``: the base of objects that hold a resource until ``close()`` (``with obj:``
closes it on the way out)."""

from __future__ import annotations

from typing import TypeVar

_C = TypeVar("_C", bound="Closing")


class Closing:
    """``with obj:`` returns ``obj`` and calls its ``close()`` on exit, raised or not."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
