"""The compiled step embedding (native/embed.c through streamtts.kernels.embed) against Embedder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SMALL_IDS

from streamtts.core.tokens import TokenIds
from streamtts.kernels.embed import BoundEmbedder
from streamtts.kernels.sampler import NativeSampler
from streamtts.model.tables import Embedder

REAL = TokenIds()


def _tables(d: Path, ids: TokenIds, h: int, text_rows: int, dtype: type, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    text = (rng.standard_normal((text_rows, h)) * 3).astype(dtype)
    if dtype == np.float16:  # every kind of half: subnormals, signed zeros, the largest, inf
        specials = np.array([0.0, -0.0, 6e-8, -6e-8, 3e-5, 65504.0, -65504.0, np.inf, -np.inf], np.float16)
        text[1, : min(h, specials.size)] = specials[:h]
        text[2, :] = (rng.standard_normal(h) * 1e-6).astype(np.float16)  # subnormals
    np.save(d / "embed_tokens.npy", text)
    for k in range(ids.n_vq):
        np.save(d / f"emb_ext_{k:02d}.npy", (rng.standard_normal((ids.audio_rows, h)) * 0.1).astype(np.float16))
    return d


@pytest.mark.parametrize(("ids", "h", "dtype"), [(SMALL_IDS, 24, np.float32), (SMALL_IDS, 24, np.float16), (REAL, 96, np.float16)])
def test_same_bits_as_the_numpy_embedding(bridge_lib: Any, tmp_path: Path, ids: TokenIds, h: int, dtype: type) -> None:
    emb = Embedder(_tables(tmp_path, ids, h, 40, dtype, 0), ids)
    cap, k = 6, ids.n_vq
    rng = np.random.default_rng(1)
    rows = np.zeros((cap, 1 + k), np.int64)  # the engine's next rows, one per slot
    slots = np.zeros(2 * cap, np.int64)
    out = np.full((cap + 3, h), np.nan, np.float32)
    bound = BoundEmbedder(emb, slots, rows, out)
    for step in range(30):
        rows[:, 0] = rng.integers(0, 40, cap)
        rows[:, 1:] = rng.integers(0, ids.audio_rows, (cap, k))
        if step % 5 == 0:
            rows[:, 0] = [1, 2, 1, 2, 1, 2]  # the special halves
        b = int(rng.integers(1, cap + 1))
        slots[:b] = rng.permutation(cap)[:b]
        bound(b)
        want = emb(rows[slots[:b]])
        np.testing.assert_array_equal(out[:b], want)
        assert out[:b].tobytes() == want.tobytes()  # bit for bit (signed zeros too)


def test_bad_slots_and_ids_write_nothing(bridge_lib: Any, tmp_path: Path) -> None:
    ids = SMALL_IDS
    emb = Embedder(_tables(tmp_path, ids, 8, 10, np.float16, 2), ids)
    rows = np.zeros((3, 1 + ids.n_vq), np.int64)
    slots = np.zeros(3, np.int64)
    out = np.full((3, 8), 7.0, np.float32)
    bound = BoundEmbedder(emb, slots, rows, out)
    slots[:2] = [0, 3]
    with pytest.raises(ValueError, match=r"slots must be in \[0, 3\), got \[0, 3\]"):
        bound(2)
    slots[:2] = [0, 1]
    rows[1, 0] = 10  # text ids run to 9
    with pytest.raises(ValueError, match=r"an id out of range in rows"):
        bound(2)
    rows[1, 0] = 0
    rows[0, 2] = ids.audio_rows
    with pytest.raises(ValueError, match=r"an id out of range in rows"):
        bound(2)
    assert (out == 7.0).all()  # nothing written
    with pytest.raises(ValueError, match="4 streams do not fit the 3 rows bound"):
        bound(4)


def test_layouts_it_cannot_read_fall_back_to_numpy(bridge_lib: Any, tmp_path: Path) -> None:
    ids = SMALL_IDS
    emb = Embedder(_tables(tmp_path, ids, 8, 10, np.float32, 3), ids)
    native = NativeSampler(bridge_lib)
    slots, rows, out = np.zeros(3, np.int64), np.zeros((3, 1 + ids.n_vq), np.int64), np.zeros((3, 8), np.float32)
    assert native.bind_embedder(emb, slots, rows, out) is not None
    assert native.bind_embedder(emb, slots.astype(np.int32), rows, out) is None
    assert native.bind_embedder(emb, slots, rows[:, :-1], out) is None
    assert native.bind_embedder(emb, slots, rows, out[:, ::2]) is None
    emb.text = np.asfortranarray(emb.text)
    assert native.bind_embedder(emb, slots, rows, out) is None
