"""What the exactness tests share: a stream's prompt and generated rows, and their comparison
with an official case's (tests/engine/test_family_exact.py, test_ttsd_exact.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from streamtts import Engine
from streamtts.request import StreamOptions


def stream_rows(
    eng: Engine, loop: asyncio.AbstractEventLoop, text: str, opts: StreamOptions, **voices: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt rows, generated rows) of ``text`` through Engine.stream (``opts.rows`` on)."""

    async def main() -> tuple[np.ndarray, np.ndarray]:
        rows: list[np.ndarray] = []
        s = eng.stream(text, options=opts, **voices)
        async with s:
            async for chunk in s:
                if chunk.rows is not None:
                    rows.append(chunk.rows)
        assert s.prompt is not None
        return s.prompt, np.concatenate(rows)

    return loop.run_until_complete(main())


def assert_official(mode: str, prompt: np.ndarray, rows: np.ndarray, want_prompt: np.ndarray, want_rows: np.ndarray) -> None:
    """Our rows are the official ones. Generation mode: the official prompt ends at
    ``assistant\\n`` and ``generate()`` chooses ``<|audio_start|>`` as its first row; ours carries
    that row in the prompt, so our prompt is theirs plus their first row and our rows are theirs
    from the second on. Continuation mode: both identical."""
    if mode == "continuation":
        np.testing.assert_array_equal(prompt, want_prompt)
        np.testing.assert_array_equal(rows[: want_rows.shape[0]], want_rows)
    else:
        np.testing.assert_array_equal(prompt[:-1], want_prompt)
        np.testing.assert_array_equal(prompt[-1], want_rows[0])
        np.testing.assert_array_equal(rows[: want_rows.shape[0] - 1], want_rows[1:])
