"""``streamtts synth`` with every prompt field, speakers, a prefix, and the conformance
outputs (``--prompt-out``, ``--rows-out``), as real processes on the demo model; each bad
voice argument is one line naming the flag, said before the engine loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts.config import find_model_config, load_config
from streamtts.core.prompt import HFTokenizer
from streamtts.core.tokens import load_token_ids

NO_ENGINE = {"STREAMTTS_BRIDGE_LIB": "/nonexistent/libstreamtts_bridge.so"}


def synth(*args: str, config: Path | None = None, env: dict[str, str] | None = None) -> Any:
    cfg = ["--config", str(config)] if config is not None else []
    return subprocess.run(
        [sys.executable, "-m", "streamtts", "-q", "synth", *cfg, "--seed", "1", "--max-new-tokens", "36", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "100", **(env or {})},
    )  # fmt: skip


def one_line(r: Any, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture(scope="module")
def codes_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("codes") / "alice.npy"
    np.save(path, np.random.default_rng(0).integers(0, 1024, (6, 32)))
    return path


def test_synth_writes_the_prompt_and_the_rows(demo_model_dir: Path, codes_npy: Path, voice_wav: Path, tmp_path: Path) -> None:
    p, r = tmp_path / "p.npy", tmp_path / "r.npy"
    res = synth(
        "--text", "[S1] Hi there. [S2] Hello.", "--speaker", f"S1={codes_npy}", "--speaker", f"S2={voice_wav}",
        "--instruction", "A calm voice.", "--language", "English", "--quality", "high",
        "--sound-event", "a door", "--out", str(tmp_path / "a.wav"), "--prompt-out", str(p), "--rows-out", str(r),
        config=demo_model_dir / "config.yaml",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    prompt, rows = np.load(p), np.load(r)
    assert prompt.dtype == rows.dtype == np.int64
    assert prompt.shape[1] == rows.shape[1] == 33 and 1 <= rows.shape[0] <= 36
    tokenizer_dir = load_config(demo_model_dir / "config.yaml").tokenizer_dir
    text = HFTokenizer(tokenizer_dir).decode([int(t) for t in prompt[:, 0]])
    for part in ("- Instruction:\nA calm voice.", "- Quality:\nhigh", "- Sound Event:\na door",
                 "- Language:\nen", "[S1] Hi there. [S2] Hello."):  # fmt: skip
        assert part in text, (part, text)
    # the .npy speaker's codes are in the prompt as given (delay layout: codebook 0 undelayed)
    col0 = prompt[:, 1]
    starts = [i for i in range(len(col0) - 6) if np.array_equal(col0[i : i + 6], np.load(codes_npy)[:, 0])]
    assert starts, "S1's codes are not in the prompt"


def test_synth_a_sound_without_text(demo_model_dir: Path, tmp_path: Path) -> None:
    res = synth("--text", "", "--ambient-sound", "rain on a roof", "--tokens", "8",
                "--out", str(tmp_path / "s.wav"), config=demo_model_dir / "config.yaml")  # fmt: skip
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--text", ""], ["--text is empty"]),
        (["--speaker", "Bob=x.wav"], ["--speaker", "'Bob' is not a speaker tag"]),
        (["--speaker", "S1"], ["--speaker", "expected TAG=FILE"]),
        (["--speaker", "S1=missing.npy"], ["--speaker S1 missing.npy: no such file"]),
        (["--reference", "{npy}", "--speaker", "S1={npy}"], ["--reference and --speaker"]),
        (["--speaker", "S1={npy}", "--speaker", "s1={npy}"], ["--speaker S1 is given twice"]),
        (["--prefix", "{floats}"], ["--prefix", "must be integers"]),
        (["--prefix-text", "Before"], ["--prefix-text is the transcript of --prefix"]),
        (["--reference-codes", "{wav}"], ["--reference-codes and --prefix-codes take a .npy"]),
        (["--prefix-codes", "{wav}"], ["--reference-codes and --prefix-codes take a .npy"]),
        (["--reference-codes", "{npy}", "--reference", "{npy}"], ["--reference-codes and --reference/--speaker"]),
        (["--prefix-codes", "{npy}", "--prefix", "{npy}"], ["--prefix-codes and --prefix"]),
        (["--reference-codes", "{floats}"], ["--reference", "must be integers"]),
    ],
)
def test_bad_voice_arguments_before_loading(codes_npy: Path, tmp_path: Path, args: list[str], needles: list[str]) -> None:
    floats = tmp_path / "floats.npy"
    np.save(floats, np.zeros((4, 32)))
    args = [a.format(npy=codes_npy, floats=floats, wav=tmp_path / "x.wav") for a in args]
    if "--text" not in args:
        args = ["--text", "[S1] Hi.", *args]
    one_line(synth(*args, "--out", str(tmp_path / "x.wav"), env=NO_ENGINE), *needles)


def test_a_tag_without_a_voice_is_one_line(demo_model_dir: Path, codes_npy: Path, tmp_path: Path) -> None:
    res = synth("--text", "[S1] Hi. [S2] Yo.", "--speaker", f"S1={codes_npy}", "--out", str(tmp_path / "x.wav"),
                config=demo_model_dir / "config.yaml")  # fmt: skip
    one_line(res, "the text has the speaker tag [S2] but no voice is given for it")


def test_synth_continues_a_prefix_of_codes(demo_model_dir: Path, codes_npy: Path, tmp_path: Path) -> None:
    p = tmp_path / "p.npy"
    res = synth("--text", "then the rest.", "--reference", str(codes_npy), "--prefix", str(codes_npy),
                "--prefix-text", "Prefix words", "--tokens", "20", "--out", str(tmp_path / "c.wav"),
                "--prompt-out", str(p), config=demo_model_dir / "config.yaml")  # fmt: skip
    assert res.returncode == 0, res.stderr
    prompt = np.load(p)
    tokenizer_dir = load_config(demo_model_dir / "config.yaml").tokenizer_dir
    text = HFTokenizer(tokenizer_dir).decode([int(t) for t in prompt[:, 0]])
    assert "- Text:\nPrefix words then the rest." in text and "- Tokens:\n20" in text
    # continuation: the prompt ends inside the assistant's audio block, on its 6 gen-slot rows
    ids = load_token_ids(find_model_config(load_config(demo_model_dir / "config.yaml")))
    assert np.all(prompt[-6:, 0] == ids.gen_slot)
    assert np.array_equal(prompt[-6:, 1], np.load(codes_npy)[:, 0])  # codebook 0 is not delayed


def test_reference_codes_in_speaker_order_and_prefix_codes(demo_model_dir: Path, codes_npy: Path, tmp_path: Path) -> None:
    """--reference-codes twice: the voices of [S1] and [S2], in that order; --prefix-codes: the
    audio continued (the prompt ends on its gen-slot rows)."""
    other = tmp_path / "bob.npy"
    np.save(other, np.random.default_rng(1).integers(0, 1024, (5, 32)))
    p = tmp_path / "p.npy"
    res = synth("--text", "[S1] Hi. [S2] Hello.", "--reference-codes", str(codes_npy), "--reference-codes", str(other),
                "--prefix-codes", str(codes_npy), "--out", str(tmp_path / "d.wav"), "--prompt-out", str(p),
                config=demo_model_dir / "config.yaml")  # fmt: skip
    assert res.returncode == 0, res.stderr
    prompt = np.load(p)
    text = HFTokenizer(load_config(demo_model_dir / "config.yaml").tokenizer_dir).decode([int(t) for t in prompt[:, 0]])
    assert text.index("[S1]:") < text.index("[S2]:") < text.index("- Instruction:")
    col0 = prompt[:, 1]

    def at(codes: np.ndarray) -> list[int]:
        n = codes.shape[0]
        return [i for i in range(len(col0) - n + 1) if np.array_equal(col0[i : i + n], codes[:, 0])]

    alice, bob = at(np.load(codes_npy)), at(np.load(other))
    assert len(alice) == 2 and len(bob) == 1  # S1's block and the prefix; S2's block
    assert alice[0] < bob[0] < alice[1] == len(col0) - 6  # S1, S2, then the prefix ending the prompt


def test_scene_is_refused_by_the_default_template(demo_model_dir: Path, tmp_path: Path) -> None:
    res = synth("--text", "Hi.", "--scene", "a studio", "--out", str(tmp_path / "x.wav"),
                config=demo_model_dir / "config.yaml")  # fmt: skip
    one_line(res, "scene: not a field of the prompt template 'moss'")
