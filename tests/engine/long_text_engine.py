"""The long-text engine fixture shared by test_text_flow and test_fields (imported by both: a
conftest.py here would shadow tests/conftest.py, which test modules import by name)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamtts.engine.frontend import Engine


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Iterator[tuple[Engine, asyncio.AbstractEventLoop]]:
    """The demo model with a 512-row context per stream (a long text is spoken in segments),
    two streams, and the event loop it runs on."""
    eng = Engine.from_config(demo_model_dir / "config.yaml", max_streams=2, n_threads=2, n_ctx=512)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    yield eng, loop
    loop.run_until_complete(eng.aclose())
    loop.close()
