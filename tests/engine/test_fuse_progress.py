"""What the first load shows while it writes the fused-heads GGUF: lines without a terminal,
a bar that moves on one."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamtts.engine import fuse_progress
from streamtts.engine.fuse_progress import LABEL, FuseProgress

FIRST_LOAD = """
import sys
from pathlib import Path
from streamtts.config import find_model_config, load_config
from streamtts.core.tokens import load_token_ids
from streamtts.demo.model import write_demo_model
from streamtts.engine.assemble import fused_heads

root = Path(sys.argv[1])
write_demo_model(root, "tiny", seed=0)
cfg = load_config(root / "config.yaml")
print(fused_heads(cfg, load_token_ids(find_model_config(cfg))))
"""


def test_first_load_without_a_terminal_prints_a_line_at_start_and_end(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", FIRST_LOAD, str(tmp_path / "demo")],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(".fused-text.gguf") and Path(r.stdout.strip()).is_file()
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("streamtts: ")]
    assert LABEL == "preparing the model for fast decoding (once)"
    assert len(lines) == 2, r.stderr  # not a line every 10 % (twelve for a file of seconds)
    assert re.fullmatch(rf"streamtts: {re.escape(LABEL)}: reading MOSS_TTS_\w+\.gguf \.\.\. \(\d+ s\)", lines[0])
    assert re.fullmatch(rf"streamtts: {re.escape(LABEL)}: done \(\d+ s\)", lines[1])


def test_a_long_write_without_a_terminal_gets_a_line_every_30_s() -> None:
    now = [0.0]
    err = io.StringIO()
    with FuseProgress(err, clock=lambda: now[0]) as progress:
        progress("reading x.gguf", 0, 0)
        for done in range(0, 1001, 10):  # a 1 MB file written over 100 s
            now[0] = done / 10
            progress("t", done * 1000, 1_000_000)
    lines = err.getvalue().splitlines()
    assert [ln.split(": ", 2)[2] for ln in lines] == [
        "reading x.gguf ... (0 s)", "30 % of 1.0 MB (30 s)", "60 % of 1.0 MB (60 s)",
        "90 % of 1.0 MB (90 s)", "done (100 s)",
    ]  # fmt: skip


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_moves_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each redraw shows the bytes written so far (it showed 0 of the total until the end)."""
    monkeypatch.setattr(fuse_progress, "_REFRESH_S", 0.0)
    term = _Terminal()
    total = 80_100
    with FuseProgress(term) as progress:
        progress("reading x.gguf", 0, 0)
        for done in range(0, total + 1, total // 8):
            progress("blk.0.ffn_up.weight", done, total)
    shown = re.findall(r"([\d.]+)/80\.1 kB", term.getvalue())
    assert "reading x.gguf" in term.getvalue()
    assert len(set(shown)) >= 8 and shown[-1] == "80.1", shown


def test_quiet_shows_nothing() -> None:
    import logging

    logger = logging.getLogger("streamtts")
    old = logger.level
    logger.setLevel(logging.ERROR)  # what `streamtts -q` sets
    try:
        for err in (io.StringIO(), _Terminal()):
            with FuseProgress(err) as progress:
                progress("reading x.gguf", 0, 0)
                progress("t", 50, 100)
                progress("t", 100, 100)
            assert err.getvalue() == ""
    finally:
        logger.setLevel(old)
