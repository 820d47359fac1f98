"""The native layer end to end: real llama.cpp through native/bridge.c on tiny GGUFs."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TinyModel

from streamtts.errors import BackboneError, ConfigError, ModelFileError, NativeLibraryError
from streamtts.model import _llama
from streamtts.model.backbone import Backbone, BackboneParams, flash_attn_id, kv_type_id

N_EMBD = 64


def rows(n: int, seed: int, width: int = N_EMBD) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width), dtype=np.float32)


def i32(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int32)


def ones8(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.int8)


def prefill(
    b: Backbone, seq: int, embd: np.ndarray, start: int = 0, hidden: bool = True
) -> np.ndarray:
    """Decode embd as sequence seq from position start, every row an output; returns hidden."""
    n = embd.shape[0]
    hid = np.zeros((n, b.n_embd), np.float32)
    n_out = b.decode(
        embd, np.arange(start, start + n, dtype=np.int32), np.full(n, seq, np.int32), ones8(n), hid
    )
    assert n_out == n
    return hid


# -- batching -------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_unified", [False, True])
def test_two_sequences_in_one_batch_match_each_alone(make_backbone: Any, kv_unified: bool) -> None:
    b = make_backbone(kv_unified=kv_unified)
    a_rows, b_rows = rows(7, 1), rows(5, 2)
    step_a, step_b = rows(1, 3), rows(1, 4)

    # each sequence alone: prompt, then one step
    alone_a = np.concatenate([prefill(b, 0, a_rows), prefill(b, 0, step_a, start=7)])
    alone_b = np.concatenate([prefill(b, 1, b_rows), prefill(b, 1, step_b, start=5)])
    b.seq_rm(0)
    b.seq_rm(1)

    # both prompts in one batch (interleaved), then both steps in one batch
    embd = np.concatenate([a_rows[:3], b_rows, a_rows[3:]])
    pos = np.concatenate([np.arange(3), np.arange(5), np.arange(3, 7)]).astype(np.int32)
    seq = np.array([0] * 3 + [1] * 5 + [0] * 4, np.int32)
    hid = np.zeros((12, N_EMBD), np.float32)
    assert b.decode(embd, pos, seq, ones8(12), hid) == 12
    hid2 = np.zeros((2, N_EMBD), np.float32)
    assert b.decode(np.concatenate([step_b, step_a]), i32(5, 7), i32(1, 0), ones8(2), hid2) == 2

    together_a = np.concatenate([hid[:3], hid[8:], hid2[1:]])
    together_b = np.concatenate([hid[3:8], hid2[:1]])
    diff = max(np.abs(together_a - alone_a).max(), np.abs(together_b - alone_b).max())
    print(
        f"\nkv_unified={kv_unified}: max |batched - alone| = {diff:.3g} (hidden max {np.abs(alone_a).max():.3g})"
    )
    # Not required to be bit-exact: ggml picks its matmul kernels by the number of rows
    # (and converts activations to f16 in different chunks), so sums may round differently.
    assert diff < 1e-3
    assert b.seq_pos_max(0) == 7 and b.seq_pos_max(1) == 5


def test_hidden_to_logits_matches_output_layer(make_backbone: Any, tiny_gguf: TinyModel) -> None:
    b = make_backbone()
    assert b.n_vocab == tiny_gguf.shape.n_vocab and b.n_embd == tiny_gguf.shape.n_embd
    n = 6
    hid = np.zeros((n, N_EMBD), np.float32)
    lg = np.zeros((n, b.n_vocab), np.float32)
    assert (
        b.decode(rows(n, 5), np.arange(n, dtype=np.int32), np.zeros(n, np.int32), ones8(n), hid, lg)
        == n
    )
    ref = hid @ tiny_gguf.output.T
    err = np.abs(lg - ref).max()
    print(f"\nmax |logits - output @ hidden| = {err:.3g} (logits max {np.abs(ref).max():.3g})")
    # f16 weights: ggml rounds the hidden state to f16 for the dot products
    assert err <= 2e-3 * max(1.0, np.abs(ref).max())
    assert np.isfinite(hid).all() and np.abs(hid).max() > 0


def test_logit_column_selection_and_full_rows(make_backbone: Any) -> None:
    b = make_backbone()
    n = 4
    embd, pos, seq = rows(n, 6), np.arange(n, dtype=np.int32), np.zeros(n, np.int32)
    out = np.array([1, 0, 1, 1], np.int8)
    full = np.zeros((3, b.n_vocab), np.float32)
    assert b.decode(embd, pos, seq, out, logits_out=full) == 3
    b.seq_rm(0)

    cols = np.array([5, 0, 299, 17, 5], np.int32)
    b.set_logit_columns(cols)
    assert b.n_logit_columns == 5
    sel = np.zeros((3, 5), np.float32)
    hid = np.zeros((3, N_EMBD), np.float32)
    assert b.decode(embd, pos, seq, out, hid, sel) == 3
    np.testing.assert_array_equal(sel, full[:, cols])

    # the full row of each output of the last decode, whatever the selection
    row = np.zeros(b.n_vocab, np.float32)
    for i in range(3):
        b.copy_logits_row(i, row)
        np.testing.assert_array_equal(row, full[i])
    with pytest.raises(BackboneError, match="out of range"):
        b.copy_logits_row(3, row)

    with pytest.raises(BackboneError, match="column 300"):
        b.set_logit_columns([1, 300])
    assert b.n_logit_columns == 5  # a rejected selection keeps the previous one
    b.set_logit_columns(None)
    assert b.n_logit_columns == b.n_vocab


def test_embeddings_off_prefill_then_step(make_backbone: Any) -> None:
    b = make_backbone()
    prompt, step = rows(9, 7), rows(1, 8)
    n = prompt.shape[0]

    # prefill with no output rows and embeddings off (hidden_out None): nothing comes back
    assert (
        b.decode(prompt, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.zeros(n, np.int8))
        == 0
    )
    assert b.seq_pos_max(0) == n - 1
    h_off = np.zeros((1, N_EMBD), np.float32)
    l_off = np.zeros((1, b.n_vocab), np.float32)
    assert b.decode(step, i32(n), i32(0), ones8(1), h_off, l_off) == 1

    # reference: the same with embeddings on during the prefill (llama.cpp then outputs every row)
    b.seq_rm(0)
    prefill(b, 0, prompt)
    h_on = np.zeros((1, N_EMBD), np.float32)
    l_on = np.zeros((1, b.n_vocab), np.float32)
    assert b.decode(step, i32(n), i32(0), ones8(1), h_on, l_on) == 1
    np.testing.assert_allclose(h_off, h_on, atol=1e-5)
    np.testing.assert_allclose(l_off, l_on, atol=1e-5)

    # logits only (no hidden): only the marked row goes through the output layer
    b.seq_rm(0)
    lg = np.zeros((1, b.n_vocab), np.float32)
    out = np.zeros(n, np.int8)
    out[-1] = 1
    assert (
        b.decode(prompt, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), out, logits_out=lg)
        == 1
    )
    assert np.isfinite(lg).all()


# -- KV cache -------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_unified", [False, True])
def test_seq_rm_really_frees_cells(make_backbone: Any, kv_unified: bool) -> None:
    b = make_backbone(kv_unified=kv_unified, n_ctx=512, n_seq_max=2, n_batch=64)
    cap = b.n_ctx_seq if not kv_unified else b.n_ctx // 2
    assert b.n_ctx_seq == (256 if not kv_unified else 512)
    other = rows(3, 9)
    prefill(b, 1, other)  # a neighbour that must survive every refill of sequence 0
    chunk = rows(64, 10)
    for _ in range(8):
        for start in range(0, cap, 64):
            n = min(64, cap - start)
            b.decode(
                chunk[:n],
                np.arange(start, start + n, dtype=np.int32),
                np.zeros(n, np.int32),
                np.zeros(n, np.int8),
            )
        assert b.seq_pos_max(0) == cap - 1
        b.seq_rm(0)
        assert b.seq_pos_max(0) == -1
    assert b.seq_pos_max(1) == 2


def test_full_sequence_is_rejected_and_context_stays_usable(make_backbone: Any) -> None:
    b = make_backbone(n_ctx=512, n_seq_max=2, n_batch=64)
    full = b.n_ctx_seq  # 256
    chunk = rows(64, 11)
    for start in range(0, full, 64):
        b.decode(
            chunk,
            np.arange(start, start + 64, dtype=np.int32),
            np.zeros(64, np.int32),
            np.zeros(64, np.int8),
        )
    with pytest.raises(BackboneError, match="full") as ei:
        b.decode(rows(1, 12), i32(full), i32(0), ones8(1), np.zeros((1, N_EMBD), np.float32))
    assert ei.value.code == _llama.STT_E_NO_SLOT
    assert b.seq_pos_max(0) == full - 1
    prefill(b, 1, rows(2, 13))  # the other sequence still works


def test_unified_cache_out_of_slots_maps_llama_code(make_backbone: Any) -> None:
    # with one shared buffer the bridge cannot tell in advance; llama_decode returns 1
    b = make_backbone(kv_unified=True, n_ctx=256, n_seq_max=2, n_batch=64)
    assert b.n_ctx == 256
    chunk = rows(64, 14)
    for s in (0, 1):
        for start in range(0, 128, 64):
            b.decode(
                chunk,
                np.arange(start, start + 64, dtype=np.int32),
                np.full(64, s, np.int32),
                np.zeros(64, np.int8),
            )
    with pytest.raises(BackboneError, match="no KV cache slot") as ei:
        b.decode(rows(1, 15), i32(128), i32(0), ones8(1), np.zeros((1, N_EMBD), np.float32))
    assert ei.value.code == _llama.STT_E_NO_SLOT
    assert b.seq_pos_max(0) == 127 and b.seq_pos_max(1) == 127
    b.seq_rm(1)
    prefill(b, 0, rows(1, 16), start=128)  # room again


# -- bad input ------------------------------------------------------------------------------


def _still_usable(b: Backbone, seq: int = 0) -> None:
    p = b.seq_pos_max(seq)
    prefill(b, seq, rows(1, 99), start=p + 1)
    assert b.seq_pos_max(seq) == p + 1


@pytest.mark.parametrize(
    "case, match",
    [
        ("seq_out_of_range", r"sequence id 5 out of range \[0, 2\)"),
        ("negative_seq", r"sequence id -1 out of range"),
        ("position_gap", r"continues at position 7.*expected 5"),
        ("position_restart", r"continues at position 0.*expected 5"),
        ("not_consecutive_in_batch", r"position 3 after position 0 in the same batch"),
        ("negative_pos", r"negative position"),
        ("too_many_rows", r"65 rows, must be in \[1, n_batch = 64\]"),
        ("embd_float64", r"embd must be a 2-D float32"),
        ("embd_width", r"rows have 32 values, the model's n_embd is 64"),
        ("embd_not_contiguous", r"C-contiguous"),
        ("pos_int64", r"pos must be a 1-D int32"),
        ("seq_length", r"seq has 3 entries, embd has 2 rows"),
        ("output_float", r"output must be a 1-D int8 or bool"),
        ("hidden_too_small", r"hidden_out has shape \(1, 64\), needs at least \(2, 64\)"),
        ("logits_wrong_cols", r"logits_out has shape \(2, 10\)"),
        ("hidden_float64", r"hidden_out must be a writable C-contiguous 2-D float32"),
    ],
)
def test_bad_inputs_raise_and_leave_context_usable(
    make_backbone: Any, case: str, match: str
) -> None:
    b = make_backbone()
    prefill(b, 0, rows(5, 20))  # sequence 0 holds positions 0..4
    embd = rows(2, 21)
    pos, seq, out = i32(5, 6), i32(0, 0), ones8(2)
    hid = np.zeros((2, N_EMBD), np.float32)
    logits: np.ndarray | None = None
    if case == "seq_out_of_range":
        seq = i32(0, 5)
    elif case == "negative_seq":
        seq = i32(-1, 0)
    elif case == "position_gap":
        pos = i32(7, 8)
    elif case == "position_restart":
        pos = i32(0, 1)
    elif case == "not_consecutive_in_batch":
        seq, pos = i32(1, 1), i32(0, 3)
    elif case == "negative_pos":
        seq, pos = i32(1, 1), i32(-2, -1)
    elif case == "too_many_rows":
        embd = rows(65, 22)
        pos, seq, out = np.arange(5, 70, dtype=np.int32), np.zeros(65, np.int32), ones8(65)
        hid = np.zeros((65, N_EMBD), np.float32)
    elif case == "embd_float64":
        embd = embd.astype(np.float64)
    elif case == "embd_width":
        embd = rows(2, 23, width=32)
    elif case == "embd_not_contiguous":
        embd = np.asfortranarray(embd)
    elif case == "pos_int64":
        pos = pos.astype(np.int64)
    elif case == "seq_length":
        seq = i32(0, 0, 0)
    elif case == "output_float":
        out = out.astype(np.float32)
    elif case == "hidden_too_small":
        hid = np.zeros((1, N_EMBD), np.float32)
    elif case == "logits_wrong_cols":
        logits = np.zeros((2, 10), np.float32)
    elif case == "hidden_float64":
        hid = np.zeros((2, N_EMBD), np.float64)
    with pytest.raises(BackboneError, match=match) as ei:
        b.decode(embd, pos, seq, out, hid, logits)
    assert ei.value.op == "decode"
    assert b.seq_pos_max(0) == 4 and b.seq_pos_max(1) == -1  # nothing was decoded
    _still_usable(b)


def test_c_level_validation_never_aborts(bridge_lib: Any, make_backbone: Any) -> None:
    """The bridge checks its arguments itself (not only the Python wrapper)."""
    b = make_backbone()
    h = ctypes.c_void_p(b._handle)
    embd = rows(2, 30)
    pos, seq, out = i32(0, 1), i32(0, 0), ones8(2)
    p = [embd.ctypes.data, pos.ctypes.data, seq.ctypes.data, out.ctypes.data, None, None]
    assert bridge_lib.stt_decode(h, 0, *p) == _llama.STT_E_INVALID
    assert b"n_rows = 0" in bridge_lib.stt_last_error(h)
    assert bridge_lib.stt_decode(h, 65, *p) == _llama.STT_E_INVALID
    assert bridge_lib.stt_decode(h, 2, None, *p[1:]) == _llama.STT_E_INVALID
    assert b"must not be NULL" in bridge_lib.stt_last_error(h)
    assert bridge_lib.stt_decode(None, 2, *p) == _llama.STT_E_INVALID
    assert bridge_lib.stt_seq_rm(h, 7, 0) == _llama.STT_E_INVALID
    assert bridge_lib.stt_copy_logits_row(h, 0, None) == _llama.STT_E_INVALID
    # outputs marked but no buffers: counted, nothing copied
    assert bridge_lib.stt_decode(h, 2, *p) == 2
    assert b.seq_pos_max(0) == 1
    with pytest.raises(BackboneError, match="out of range"):
        b.seq_rm(2)
    with pytest.raises(BackboneError, match="out of range"):
        b.seq_pos_max(-1)


def test_bad_params(tiny_gguf: TinyModel, bridge_lib: Any) -> None:
    base = dict(model_path=str(tiny_gguf.path), n_ctx=512, n_batch=16)
    with pytest.raises(ConfigError, match="KV cache type 'q3'"):
        Backbone(BackboneParams(**base, type_k="q3"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="flash_attn"):
        Backbone(BackboneParams(**base, flash_attn="sometimes"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="n_seq_max"):
        Backbone(BackboneParams(**base, n_seq_max=0))  # type: ignore[arg-type]
    assert kv_type_id("Q8_0") == 8 and kv_type_id("bf16") == 30
    assert (
        flash_attn_id("enabled") == 1 and flash_attn_id(False) == 0 and flash_attn_id("auto") == -1
    )


def test_quantized_kv_cache_with_flash_attention(make_backbone: Any, small_gguf: TinyModel) -> None:
    path = str(small_gguf.path)  # head_dim 32: q8_0 blocks are 32 wide
    ref = make_backbone(model_path=path, flash_attn="disabled")
    q = make_backbone(model_path=path, type_k="q8_0", type_v="q8_0", flash_attn="enabled")
    prompt = rows(10, 40, width=ref.n_embd)
    h_ref, h_q = prefill(ref, 0, prompt), prefill(q, 0, prompt)
    err = np.abs(h_ref - h_q).max()
    print(
        f"\nq8_0 KV + flash attention vs f16 KV: max |diff| = {err:.3g} (hidden max {np.abs(h_ref).max():.3g})"
    )
    assert err < 0.05 * np.abs(h_ref).max()


def test_kv_type_must_fit_head_dim(make_backbone: Any) -> None:
    # tiny model: head_dim 16 is not a multiple of the q8_0 block (32); llama.cpp's reason comes through
    with pytest.raises(BackboneError, match="does not divide n_embd_head_k") as ei:
        make_backbone(type_k="q8_0")
    assert ei.value.op == "create"


# -- files ----------------------------------------------------------------------------------


def test_missing_model_file(bridge_lib: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelFileError, match="nope.gguf") as ei:
        Backbone(BackboneParams(model_path=str(missing), n_ctx=256, n_batch=8))
    assert ei.value.path == str(missing)


@pytest.mark.parametrize("kind", ["garbage", "truncated"])
def test_corrupt_model_file(
    bridge_lib: Any, tiny_gguf: TinyModel, tmp_path: Path, kind: str
) -> None:
    bad = tmp_path / f"{kind}.gguf"
    if kind == "garbage":
        bad.write_bytes(b"this is not a gguf file" * 100)
    else:
        bad.write_bytes(tiny_gguf.path.read_bytes()[:5000])
    with pytest.raises(ModelFileError) as ei:
        Backbone(BackboneParams(model_path=str(bad), n_ctx=256, n_batch=8))
    msg = str(ei.value)
    print(f"\n{kind}: {msg}")
    assert str(bad) in msg and "failed to load model" in msg


# -- threads and lifetime --------------------------------------------------------------------


def test_decode_releases_the_gil(bridge_lib: Any, small_gguf: TinyModel) -> None:
    n, reps = 512, 4
    params = BackboneParams(
        model_path=str(small_gguf.path), n_ctx=n * (reps + 1), n_batch=n, n_threads=1
    )
    with Backbone(params) as b:
        embd = rows(n, 50, width=b.n_embd)
        seq, out = np.zeros(n, np.int32), np.zeros(n, np.int8)
        b.decode(embd, np.arange(n, dtype=np.int32), seq, out)  # warm-up (graph allocation)

        stamps: list[float] = []
        stop = threading.Event()

        def tick() -> None:
            while not stop.is_set():
                stamps.append(time.perf_counter())  # needs the GIL
                time.sleep(0.001)

        t = threading.Thread(target=tick)
        t.start()
        time.sleep(0.02)
        spans = []
        for r in range(1, reps + 1):
            pos = np.arange(r * n, (r + 1) * n, dtype=np.int32)
            t0 = time.perf_counter()
            b.decode(embd, pos, seq, out)
            spans.append((t0, time.perf_counter()))
        stop.set()
        t.join()
    # stamps taken while the main thread was inside the native call (edges excluded)
    inside = [s for s in stamps if any(t0 + 0.005 < s < t1 - 0.005 for t0, t1 in spans)]
    busy = sum(t1 - t0 for t0, t1 in spans)
    print(
        f"\n{reps} decodes of {n} rows: {1e3 * busy:.0f} ms; the other thread ran {len(inside)} times meanwhile"
    )
    assert busy > 0.04, "decodes too fast to tell; make the model bigger"
    assert len(inside) >= 5


def test_close_is_idempotent(make_backbone: Any) -> None:
    b = make_backbone()
    prefill(b, 0, rows(2, 60))
    b.close()
    b.close()
    assert b.closed
    with pytest.raises(BackboneError, match="closed"):
        b.decode(rows(1, 61), i32(2), i32(0), ones8(1))
    with pytest.raises(BackboneError, match="closed"):
        b.seq_pos_max(0)
    with pytest.raises(BackboneError, match="closed"):
        b.decode_bound(1)


def test_context_manager(tiny_gguf: TinyModel, bridge_lib: Any) -> None:
    with Backbone(BackboneParams(model_path=str(tiny_gguf.path), n_ctx=256, n_batch=8)) as b:
        assert not b.closed
    assert b.closed


def test_output_copy_cut_across_the_tick_threads_is_the_same(make_backbone: Any, bridge_lib: Any) -> None:
    """stt_decode's copy of 40 output rows, whole or as runs of columns, on a pool's threads
    (stt_set_pool) gives the bytes the caller's thread alone gives."""
    from streamtts.kernels.tick_pool import TickPool

    n = 40  # above the bridge's COPY_MIN_ROWS: the copy is cut
    embd, pos, seq, out = rows(n, 9), np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.ones(n, np.int8)
    pool = TickPool(bridge_lib, 3)
    try:
        for cols in (None, np.array([0, 1, 2, 10, 11, 5, 299, 298, 3, 4], np.int32)):
            got = []
            for attach in (False, True):
                b = make_backbone()
                b.set_logit_columns(cols)
                if attach:
                    b.set_tick_pool(pool.handle)
                hid, lg = np.zeros((n, N_EMBD), np.float32), np.zeros((n, b.n_logit_columns), np.float32)
                assert b.decode(embd, pos, seq, out, hid, lg) == n
                b.set_tick_pool(None)
                got.append((hid, lg))
            np.testing.assert_array_equal(got[0][0], got[1][0])
            np.testing.assert_array_equal(got[0][1], got[1][1])
            if cols is not None:
                full = np.zeros(b.n_vocab, np.float32)
                b.copy_logits_row(7, full)
                np.testing.assert_array_equal(got[1][1][7], full[cols])
    finally:
        pool.close()


def test_decode_lend_hands_out_llama_cpps_rows_or_copies(make_backbone: Any) -> None:
    """decode_bound(lend=True): with whole rows selected the logits stay where llama.cpp put
    them (lent_logits, output j at row j), byte for byte the rows a copy gives, and nothing is
    copied; with a selection of columns they cannot be read in place and are copied."""
    n, cap = 5, 8
    for cols in (None, np.arange(0, 300, dtype=np.int32), np.array([3, 1, 4, 1, 5], np.int32)):
        got = []
        for lend in (False, True):
            b = make_backbone(n_seq_max=4)
            b.set_logit_columns(cols)
            embd = np.zeros((cap, N_EMBD), np.float32)
            pos, seq, out = np.zeros(cap, np.int32), np.zeros(cap, np.int32), np.zeros(cap, np.int8)
            lg = np.full((cap, b.n_logit_columns), -7.0, np.float32)
            b.bind(embd, pos, seq, out, None, lg)
            embd[:n] = rows(n, 31)
            seq[:n] = (0, 1, 2, 3, 3)
            pos[:n] = (0, 0, 0, 0, 1)
            out[:n] = (1, 1, 0, 1, 1)  # four outputs, batch rows 0, 1, 3, 4
            assert b.decode_bound(n, want_hidden=False, lend=lend) == 4
            whole = cols is None or cols.size == b.n_vocab
            if lend and whole:
                assert b.lent_logits and (lg == -7.0).all(), "lent rows were copied too"
                buf = (ctypes.c_float * (4 * b.n_vocab)).from_address(b.lent_logits)
                got.append(np.ctypeslib.as_array(buf).reshape(4, b.n_vocab).copy())
            else:
                assert b.lent_logits == 0
                got.append(lg[:4].copy())
        np.testing.assert_array_equal(got[0], got[1])
        assert np.isfinite(got[1]).all() and not (got[1] == -7.0).any()
    pos[0] = 1  # sequence 0's next row
    assert b.decode_bound(1, want_hidden=False) == 1 and b.lent_logits == 0  # no lend asked: none


# -- zero-allocation hot path -------------------------------------------------------------------


def test_bind_and_decode_bound_match_decode(make_backbone: Any) -> None:
    b = make_backbone(n_seq_max=4)
    cols = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int32)
    b.set_logit_columns(cols)
    cap = 8
    embd = np.zeros((cap, N_EMBD), np.float32)
    pos, seq, out = np.zeros(cap, np.int32), np.zeros(cap, np.int32), np.zeros(cap, np.int8)
    hid, lg = np.zeros((cap, N_EMBD), np.float32), np.zeros((cap, cols.size), np.float32)
    b.bind(embd, pos, seq, out, hid, lg)

    ref = make_backbone(n_seq_max=4)
    ref.set_logit_columns(cols)
    for tick in range(5):
        n = 3  # three streams, one row each
        embd[:n] = rows(n, 100 + tick)
        pos[:n] = tick
        seq[:n] = (0, 2, 3)
        out[:n] = 1
        assert b.decode_bound(n) == n
        h2, l2 = np.zeros((n, N_EMBD), np.float32), np.zeros((n, cols.size), np.float32)
        assert (
            ref.decode(embd[:n].copy(), pos[:n].copy(), seq[:n].copy(), out[:n].copy(), h2, l2) == n
        )
        np.testing.assert_array_equal(hid[:n], h2)
        np.testing.assert_array_equal(lg[:n], l2)
    # logits only
    embd[:1] = rows(1, 200)
    pos[:1], seq[:1], out[:1] = 5, 0, 1
    hid[:] = 0
    assert b.decode_bound(1, want_hidden=False) == 1
    assert not hid.any()
    with pytest.raises(BackboneError, match=r"n_rows = 9, must be in \[1, 8\]"):
        b.decode_bound(9)
    b.set_logit_columns(None)  # the bound logits_out no longer fits
    with pytest.raises(BackboneError, match="bind\\(\\) again"):
        b.decode_bound(1)
    b.set_logit_columns(cols[:4])  # narrower: rows would be misaligned
    with pytest.raises(BackboneError, match="bind\\(\\) again"):
        b.decode_bound(1)


def test_decode_bound_needs_bind(make_backbone: Any) -> None:
    with pytest.raises(BackboneError, match="bind"):
        make_backbone().decode_bound(1)


# -- library discovery --------------------------------------------------------------------------


def test_missing_library_says_how_to_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STREAMTTS_BRIDGE_LIB", raising=False)
    monkeypatch.setenv("STREAMTTS_CACHE", str(tmp_path))
    monkeypatch.delenv("STREAMTTS_CUDA", raising=False)
    with pytest.raises(NativeLibraryError, match="native/build.sh") as ei:
        _llama.open_bridge()
    assert "current-cuda" in str(ei.value) and "current-cpu" in str(ei.value)
    monkeypatch.setenv("STREAMTTS_BRIDGE_LIB", str(tmp_path / "libnothing.so"))
    with pytest.raises(NativeLibraryError, match="libnothing.so"):
        _llama.open_bridge()
    (tmp_path / "libbroken.so").write_bytes(b"not an ELF file")
    monkeypatch.setenv("STREAMTTS_BRIDGE_LIB", str(tmp_path / "libbroken.so"))
    with pytest.raises(NativeLibraryError, match="cannot load"):
        _llama.open_bridge()


def test_version_and_system_info(bridge_lib: Any) -> None:
    v = _llama.bridge_version()
    assert v.startswith("llama.cpp ") and "llama-cpp-python==0.3.36" in v
    assert "CPU" in _llama.system_info()


@pytest.mark.parametrize("poll", [None, 0, 50])
def test_thread_pool_settings_give_the_same_results(
    make_backbone: Any, bridge_lib: Any, poll: int | None
) -> None:
    ref = make_backbone(thread_poll=None, n_threads=1)
    b = make_backbone(thread_poll=poll, n_threads=2)
    assert bridge_lib.stt_has_threadpool(b._h) == (poll is not None)
    assert b.n_threads == 2
    prompt = rows(20, 70)
    np.testing.assert_allclose(prefill(b, 0, prompt), prefill(ref, 0, prompt), atol=1e-5)


@pytest.mark.parametrize("poll", [None, 0])
def test_threads_change_between_decodes_and_give_the_same_bits(make_backbone: Any, poll: int | None) -> None:
    """The engine chooses each decode's thread count from measured decodes
    (engine/thread_tuner.py), so a stream's output must not depend on it: ggml computes each
    output element on one thread, whatever the count (the work is cut by rows and blocks,
    never a sum), so the bits are the same by construction, on any CPU kernels."""
    ref = make_backbone(thread_poll=poll, n_threads=1)
    b = make_backbone(thread_poll=poll, n_threads=3)
    assert b.n_threads_max == 3 and b.threads == (3, 3) and b.cpu_decodes
    prompt, steps = rows(20, 80), rows(6, 81)
    want = np.concatenate([prefill(ref, 0, prompt)] + [prefill(ref, 0, steps[i : i + 1], start=20 + i) for i in range(6)])
    got = [prefill(b, 0, prompt)]
    for i, (one, many) in enumerate([(1, 2), (2, 1), (3, 3), (1, 1), (2, 3), (3, 1)]):
        b.set_threads(one, many)
        assert b.threads == (one, many)
        got.append(prefill(b, 0, steps[i : i + 1], start=20 + i))
    np.testing.assert_array_equal(np.concatenate(got), want)
    b.seq_rm(0)
    b.set_threads(2)  # a multi-row decode on 2 of 3
    np.testing.assert_array_equal(prefill(b, 0, prompt), want[:20])
    for bad in [(0, 1), (1, 0), (4, 1), (1, 4)]:
        with pytest.raises(ConfigError, match="threads must be 1 to 3"):
            b.set_threads(*bad)
    assert b.threads == (2, 2)  # unchanged by a refused call


def test_decode_bound_out_offset_and_output_capacity(make_backbone: Any) -> None:
    """The engine's layout: many input rows, few output rows, outputs placed at an offset."""
    b = make_backbone(n_seq_max=2)
    b.set_logit_columns([7, 8])
    rows_max, out_rows = 64, 4
    embd = np.zeros((rows_max, N_EMBD), np.float32)
    pos, seq, out = (
        np.zeros(rows_max, np.int32),
        np.zeros(rows_max, np.int32),
        np.zeros(rows_max, np.int8),
    )
    hid, lg = (
        np.full((out_rows, N_EMBD), -7.0, np.float32),
        np.full((out_rows, 2), -7.0, np.float32),
    )
    b.bind(embd, pos, seq, out, hid, lg)

    # a 10-row prompt whose last row is an output, written at output row 3
    embd[:10] = rows(10, 300)
    pos[:10] = np.arange(10)
    out[:10] = 0
    out[9] = 1
    assert b.decode_bound(10, True, 3) == 1
    assert (hid[:3] == -7).all() and (lg[:3] == -7).all()
    ref = make_backbone(n_seq_max=2)
    ref.set_logit_columns([7, 8])
    h_ref, l_ref = np.zeros((1, N_EMBD), np.float32), np.zeros((1, 2), np.float32)
    o_ref = np.zeros(10, np.int8)
    o_ref[9] = 1
    ref.decode(embd[:10].copy(), pos[:10].copy(), seq[:10].copy(), o_ref, h_ref, l_ref)
    np.testing.assert_array_equal(hid[3], h_ref[0])
    np.testing.assert_array_equal(lg[3], l_ref[0])

    # more outputs than the output buffers hold (from the offset on): refused, nothing decoded
    embd[:3] = rows(3, 301)
    pos[:3], seq[:3], out[:3] = (10, 11, 12), 0, 1
    with pytest.raises(
        BackboneError, match="3 rows are marked as outputs but the output buffers have room for 2"
    ):
        b.decode_bound(3, True, 2)
    assert b.seq_pos_max(0) == 9
    with pytest.raises(BackboneError, match="out_offset = 5"):
        b.decode_bound(3, True, 5)
    assert b.decode_bound(3, True, 1) == 3
    assert b.seq_pos_max(0) == 12
    # logits only, at an offset
    embd[:1], pos[:1], out[:1] = rows(1, 302), 13, 1
    hid[:] = -7
    assert b.decode_bound(1, False, 2) == 1
    assert (hid == -7).all() and (lg[2] != -7).all()


# -- sequence snapshots (the prefix cache's primitive) ---------------------------------------


def test_seq_state_snapshot_continues_bit_identically_in_another_sequence(make_backbone: Any) -> None:
    b = make_backbone(n_seq_max=3)
    prefix, rest = rows(20, 31), rows(6, 32)
    prefill(b, 0, prefix)
    snap = b.seq_state(0)
    assert snap.dtype == np.uint8 and snap.nbytes > 0
    original = prefill(b, 0, rest, start=20)
    b.load_seq_state(2, snap)
    assert b.seq_pos_max(2) == 19
    restored = prefill(b, 2, rest, start=20)
    np.testing.assert_array_equal(restored, original)


def test_seq_state_load_rejects_busy_sequence_and_bad_bytes(make_backbone: Any) -> None:
    b = make_backbone(n_seq_max=2)
    prefill(b, 0, rows(8, 33))
    snap = b.seq_state(0)
    with pytest.raises(BackboneError, match="sequence 0 is not empty"):
        b.load_seq_state(0, snap)
    with pytest.raises(BackboneError, match="could not load a 40-byte snapshot into sequence 1"):
        b.load_seq_state(1, snap[:40])
    assert b.seq_pos_max(1) == -1  # left empty, not half-loaded
    with pytest.raises(BackboneError, match="out of range"):
        b.load_seq_state(5, snap)
    b.load_seq_state(1, snap)  # still usable
    assert b.seq_pos_max(1) == 7


def test_the_cxx_runtime_is_global_before_the_bridge_loads() -> None:
    """libllama's std:: calls must reach the system's libstdc++: a GPU build of libggml that
    exports its own copy (seen with CUDA 13 on the lent H200) otherwise shadows it and the
    first std::ostream call segfaults. In a fresh process: after the bridge loads, the global
    scope (dlopen(NULL)) resolves a libstdc++ symbol, which it does only if libstdc++ was put
    there first (the bridge's own dependencies are loaded into a local scope)."""
    import subprocess
    import sys

    code = (
        "import ctypes\n"
        "from streamtts.model import _llama\n"
        "_llama.load_bridge()\n"
        "ctypes.CDLL(None)['_ZNSt8ios_base4InitC1Ev']\n"
        "print('global')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "global", res.stderr[-2000:]


def _affinity_of_new_threads(before: set[int]) -> dict[int, set[int]]:
    from streamtts.engine.priority import thread_ids

    return {t: os.sched_getaffinity(t) for t in thread_ids() - before}


@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2+ CPUs allowed")
def test_pinned_threads_each_keep_one_cpu_and_the_creator_keeps_its_own(make_backbone: Any) -> None:
    """``pin_threads``: our pool's worker takes the first allowed CPU, the thread that calls
    pin_caller (the engine's, which decodes) the second until it calls pin_caller(False);
    the thread that made the context keeps every CPU it had (ggml pins a pool's creator: the
    bridge gives them back); the bits are the same as unpinned."""
    from streamtts.engine.priority import thread_ids

    mine = os.sched_getaffinity(0)
    first, second = sorted(mine)[:2]
    before = thread_ids()
    b = make_backbone(thread_poll=0, n_threads=2, pin_threads=True)
    assert os.sched_getaffinity(0) == mine
    assert set(map(frozenset, _affinity_of_new_threads(before).values())) == {frozenset({first})}
    ref = make_backbone(thread_poll=0, n_threads=2)
    assert ref.pin_caller() is None and os.sched_getaffinity(0) == mine  # not pinned: nothing changes
    prompt = rows(20, 90)
    got: dict[str, Any] = {}

    def decoder() -> None:  # as the engine thread: pin, decode, unpin
        got["cpu"] = b.pin_caller()
        got["affinity"] = os.sched_getaffinity(0)
        got["hidden"] = prefill(b, 0, prompt)
        got["unpinned"] = b.pin_caller(False), os.sched_getaffinity(0)

    t = threading.Thread(target=decoder)
    t.start()
    t.join()
    assert got["cpu"] == second and got["affinity"] == {second}
    assert got["unpinned"] == (None, mine)  # its own CPUs back
    np.testing.assert_array_equal(got["hidden"], prefill(ref, 0, prompt))


def test_pinning_needs_our_pool_and_two_threads(make_backbone: Any) -> None:
    """llama.cpp's own pool (thread_poll None) and one thread: nothing is pinned."""
    from streamtts.engine.priority import thread_ids

    mine = os.sched_getaffinity(0) if sys.platform == "linux" else set()
    before = thread_ids()
    for kw in ({"thread_poll": None, "n_threads": 2}, {"thread_poll": 0, "n_threads": 1}):
        b = make_backbone(pin_threads=True, **kw)
        assert b.pin_caller() is None
    if sys.platform == "linux":
        assert os.sched_getaffinity(0) == mine
        assert all(a == mine for a in _affinity_of_new_threads(before).values())
