"""The `streamtts` command line: one module per command family."""

from .main import main

__all__ = ["main"]
