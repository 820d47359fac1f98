"""The family's ten official cases, exactly: prompt rows and generated rows as the official
``MossTTSDelayModel.generate`` makes them (tests/fixtures/family: two random checkpoints made
with the official code, n_vq 32 and 16, five cases each).

Each checkpoint is converted with ``convert-hf --quant F32`` and run by the real engine
greedily in float32 end to end (``kv_cache_type_k/v: f32``, flash attention off, no prefix
cache): the fixture README says why fp32 is what makes the comparison exact. Generation mode:
the official prompt ends at ``assistant\\n`` and ``generate()`` chooses ``<|audio_start|>`` as its
first row; ours carries that row in the prompt, so our prompt is theirs plus their first row and
our rows are theirs from the second on. Continuation mode: both identical.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fixtures.family import Shape, cases_dir, family_checkpoint
from official_rows import assert_official, stream_rows

from streamtts import Engine, SamplingParams
from streamtts.convert.hf import convert_hf
from streamtts.demo.codec import write_codec
from streamtts.request import StreamOptions, Voice

CASES = ("generation", "clone", "dialogue", "continuation", "sound")
# the folder name convert-hf reads the member from: these cases were made with the GitHub
# processor and generate() (v1.5's), so both shapes are served as v1.5 (its template, its
# normaliser, `language` as a name); the 16-codebook members' own code is tested in
# test_ttsd_exact.py (MOSS-TTSD) and tests/core/test_prompt_templates.py
MEMBER_FOLDER = {"nvq32": "MOSS-TTS-v1.5", "nvq16": "MOSS-TTS-v1.5"}
N_VQ = {"nvq32": 32, "nvq16": 16}


@pytest.fixture(scope="module", params=["nvq32", "nvq16"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, bridge_lib: Any
) -> Iterator[tuple[Shape, Engine, asyncio.AbstractEventLoop]]:
    shape: Shape = request.param
    root = tmp_path_factory.mktemp(f"family-{shape}")
    src = family_checkpoint(shape, root / "src", name=MEMBER_FOLDER[shape])
    bundle = root / "MOSS-TTS-GGUF"
    convert_hf(src, bundle, ["F32"], gpu=False)
    write_codec(root / "MOSS-Audio-Tokenizer-ONNX", n_vq=N_VQ[shape])
    eng = Engine.from_config(
        bundle / "config.yaml", n_threads=1, max_streams=2, kv_cache_type_k="f32", kv_cache_type_v="f32",
        flash_attn="off", prefix_cache_mib=0,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    yield shape, eng, loop
    loop.run_until_complete(eng.aclose())
    loop.close()


def _case(shape: Shape, name: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    d = cases_dir(shape)
    meta = json.loads((d / f"{name}.json").read_text(encoding="utf-8"))
    return meta, np.load(d / f"{name}.prompt.npy"), np.load(d / f"{name}.out.npy")


def _run(eng: Engine, loop: asyncio.AbstractEventLoop, shape: Shape, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(prompt rows, generated rows) of the case through Engine.stream."""
    meta, _, _ = _case(shape, name)
    d = cases_dir(shape)
    user = dict(meta["user"])
    text = user.pop("text") or ""
    refs = [Voice.from_codes(np.load(d / f)) for f in meta["references"]]
    kw: dict[str, Any] = {}
    if len(refs) > 1 or "[S" in text:
        kw["speakers"] = {f"S{i + 1}": v for i, v in enumerate(refs)}
    elif refs:
        kw["reference"] = refs[0]
    if meta["prefix"]:
        kw["prefix"] = Voice.from_codes(np.load(d / meta["prefix"]))
    opts = StreamOptions(
        sampling=SamplingParams.greedy(), max_new_tokens=meta["max_new_tokens"], rows=True, **user
    )
    return stream_rows(eng, loop, text, opts, **kw)


@pytest.mark.parametrize("name", CASES)
def test_official_case_exactly(engine: tuple[Shape, Engine, asyncio.AbstractEventLoop], name: str) -> None:
    shape, eng, loop = engine
    meta, want_prompt, want_rows = _case(shape, name)
    prompt, rows = _run(eng, loop, shape, name)
    assert_official(meta["mode"], prompt, rows, want_prompt, want_rows)
