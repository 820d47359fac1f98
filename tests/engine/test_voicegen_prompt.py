"""A MOSS-VoiceGenerator model gets its own normalisers (text/voicegen.py): the instruction through
its ``normalize_instruction`` and the text through its ``normalize_text``, when normalisation is
on and only then; another member's instruction is written as given.

Real components: ``streamtts demo-model DIR --member moss-voice-generator`` (16 codebooks,
``model_kind`` in its config.json, so the engine serves it as that member), the prompt rows read
back through ``synth --prompt-out`` and the engine's preparer, column 0 decoded with the
model's tokenizer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import decode_prompt, prepared_requests

from streamtts.engine import Engine
from streamtts.engine.prepare import LongText
from streamtts.request import StreamOptions

INSTRUCTION = "A middle-aged man's voice\n[calm]{slow}, deep!!"
TEXT = 'Hello [pause 1.5s] "world"!!'
WANT_INSTRUCTION = "- Instruction:\nA middle，aged man's voice , deep!\n"  # noqa: RUF001
WANT_TEXT = "- Text:\nHello  world!\n"


@pytest.fixture(scope="module")
def vg_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from streamtts.cli.main import main

    d = tmp_path_factory.mktemp("vg") / "voicegen"
    assert main(["demo-model", str(d), "--member", "moss-voice-generator"]) == 0
    return d / "config.yaml"




def test_synth_writes_the_normalised_instruction_and_text(vg_yaml: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.npy"
    res = subprocess.run(
        [sys.executable, "-m", "streamtts", "-q", "synth", "--config", str(vg_yaml), "--seed", "1",
         "--max-new-tokens", "20", "--instruction", INSTRUCTION, "--text", TEXT,
         "--out", str(tmp_path / "x.wav"), "--prompt-out", str(prompt)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    text = decode_prompt(vg_yaml, np.load(prompt))
    assert WANT_INSTRUCTION in text and WANT_TEXT in text, text




def test_normalisation_off_writes_them_as_given(vg_yaml: Path) -> None:
    (req,) = prepared_requests(vg_yaml, [(TEXT, StreamOptions(instruction=INSTRUCTION, normalize=False))])
    text = decode_prompt(vg_yaml, req.prompt)
    assert f"- Instruction:\n{INSTRUCTION}\n" in text and f"- Text:\n{TEXT}\n" in text, text


def test_a_long_texts_segments_carry_the_normalised_instruction(vg_yaml: Path) -> None:
    """Each segment's request normalises nothing again: the instruction goes to them prepared."""
    long = " ".join(f"Sentence number {i} is here." for i in range(60))
    options = StreamOptions(instruction=INSTRUCTION, max_new_tokens=20, seed=1)
    want = "A middle，aged man's voice , deep!"  # noqa: RUF001
    (req,) = prepared_requests(vg_yaml, [(long, options)], n_ctx=512)
    assert isinstance(req, LongText) and len(req.segments) > 1 and req.instruction == want

    async def first_segment() -> str:
        eng = Engine.from_config(vg_yaml, n_threads=1, max_streams=1, warmup=False, n_ctx=512)
        async with eng:
            async with eng.stream(long, options=options) as s:
                async for _ in s:
                    break
                assert s._long is not None  # spoken in segments
                return str(s._long._options.instruction)

    assert asyncio.run(first_segment()) == want


def test_another_member_keeps_its_instruction(demo_model_dir: Path) -> None:
    """The demo model (MOSS-TTS, the GitHub normaliser on the text only)."""
    yaml = demo_model_dir / "config.yaml"
    (req,) = prepared_requests(yaml, [("Hello there.", StreamOptions(instruction=INSTRUCTION))])
    assert f"- Instruction:\n{INSTRUCTION}\n" in decode_prompt(yaml, req.prompt)
