"""A pronunciation lexicon changes the prompt and not the words reported (issue 38 item 5).

Real components: the demo model's engine and tokenizer; the prompt rows read back (column 0
decoded), the word times of a real stream, and ``synth --lexicon --prompt-out``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import decode_prompt, prepared_requests

from streamtts.engine import Engine
from streamtts.engine.prepare import LongText
from streamtts.errors import FieldError
from streamtts.request import StreamOptions
from streamtts.text.lexicon import Lexicon

TEXT = "I like Tomato soup, said the nginx admin."
LEX = {"tomato": "tomahto", "nginx": "engine x"}






@pytest.fixture(scope="module")
def yaml(demo_model_dir: Path) -> Path:
    return demo_model_dir / "config.yaml"


def test_the_prompt_reads_the_lexicon(yaml: Path) -> None:
    server = Lexicon.compile({"soup": "soop", "admin": "administrator"})
    plain, told, layered = prepared_requests(yaml, [
        (TEXT, StreamOptions()),
        (TEXT, StreamOptions(lexicon=LEX)),
        (TEXT, StreamOptions(lexicon={"soup": "zoup"}, lexicons=(server,))),
    ])  # fmt: skip
    assert "I like Tomato soup, said the nginx admin." in decode_prompt(yaml, plain.prompt)
    assert "I like tomahto soup, said the engine x admin." in decode_prompt(yaml, told.prompt)
    # the request's entry over the server's; the server's other entries still apply
    assert "I like Tomato zoup, said the nginx administrator." in decode_prompt(yaml, layered.prompt)


def test_a_bad_lexicon_names_the_entry(yaml: Path) -> None:
    with pytest.raises(FieldError, match=r'lexicon\["tomato"\]: the replacement is empty'):
        prepared_requests(yaml, [(TEXT, StreamOptions(lexicon={"tomato": ""}))])
    with pytest.raises(FieldError, match="names a stored lexicon"):
        prepared_requests(yaml, [(TEXT, StreamOptions(lexicon="lx_000000000000000000000000"))])


def test_a_long_texts_segments_are_cut_as_written_and_each_read_with_the_lexicon(yaml: Path) -> None:
    long = " ".join(f"Sentence {i} is about a tomato." for i in range(60))
    (req,) = prepared_requests(yaml, [(long, StreamOptions(lexicon=LEX, max_new_tokens=20, seed=1))], n_ctx=512)
    assert isinstance(req, LongText) and len(req.segments) > 1
    assert "tomato" in req.segments[0] and "tomahto" not in " ".join(req.segments)
    (seg,) = prepared_requests(yaml, [(req.segments[0], StreamOptions(lexicons=req.lexicons, normalize=False))], n_ctx=512)
    text = decode_prompt(yaml, seg.prompt)
    assert "tomahto" in text and "tomato" not in text


def test_word_times_report_the_words_as_written(yaml: Path) -> None:
    async def words(options: StreamOptions) -> list[str]:
        out: list[str] = []
        async with Engine.from_config(yaml, n_threads=1, max_streams=1, warmup=False) as eng:
            async for chunk in eng.stream(TEXT, options=options):
                out += [w.word for w in chunk.words or []]
        return out

    got = asyncio.run(words(StreamOptions(lexicon=LEX, timestamps="words", seed=1, max_new_tokens=30)))
    assert got == TEXT.split()


def test_synth_lexicon_flag(yaml: Path, tmp_path: Path) -> None:
    lex = tmp_path / "lex.json"
    lex.write_text(json.dumps(LEX), encoding="utf-8")
    prompt = tmp_path / "prompt.npy"
    env = {**os.environ, "COLUMNS": "100"}
    res = subprocess.run(
        [sys.executable, "-m", "streamtts", "-q", "synth", "--config", str(yaml), "--seed", "1",
         "--max-new-tokens", "60", "--text", TEXT, "--lexicon", str(lex),
         "--out", str(tmp_path / "x.wav"), "--prompt-out", str(prompt)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "I like tomahto soup, said the engine x admin." in decode_prompt(yaml, np.load(prompt))
    # a bad file is refused before the model loads, naming the entry
    lex.write_text(json.dumps({"tomato": "tomahto", "nginx": 5}), encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-m", "streamtts", "synth", "--config", str(yaml), "--text", TEXT, "--lexicon", str(lex)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert res.returncode != 0
    assert f'--lexicon {lex}["nginx"]: the replacement must be a string, got a number' in res.stderr, res.stderr
