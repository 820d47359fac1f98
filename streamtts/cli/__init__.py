"""The `streamtts` command line: one module per command family."""

from __future__ import annotations

from . import interrupts


def main(argv: list[str] | None = None) -> int:
    """The ``streamtts`` command: :func:`streamtts.cli.main.main` under a Ctrl-C watch set
    before its modules import (they take the first fraction of a second)."""
    interrupts.watch()
    try:
        from .main import main as run

        globals()["main"] = _entry  # importing the submodule `main` rebound the name to it
        interrupts.imports_done()
        return run(argv)
    except BaseException:
        if not interrupts.seen():
            raise
        return interrupts.report()


_entry = main

__all__ = ["main"]
