"""Every kernel's compiled twin against its specification: one table, one measure.

As llama.cpp's test-backend-ops does for its backends: ``CASES`` names each kernel of
``streamtts.kernels.TABLE`` with a driver that plays a whole lifecycle of random inputs
(drawn by hypothesis) through the entry a :class:`Kernels` hands out, the way the engine
calls it (buffers bound once, steps cut into row ranges now and then), and records a trace of
everything it produced: rows, frames, embeddings, every state array, and the errors raised.
The trace with the kernel's twin on must equal the one with its spec, by one measure,
:func:`assert_identical`: bit for bit, since every twin promises identity (the same
arithmetic in the same order), and the same error type and message.

A driver also reports that the twin did the work (``compiled``, and for the delay step how
many steps it handed to the spec), so a twin that silently fell back could not pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SMALL_IDS, SWAPPED_IDS, random_sampling_params
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.config import KERNEL_NAMES
from streamtts.core.delay import delay_layout
from streamtts.core.frames import FrameAssembler
from streamtts.core.tokens import TokenIds
from streamtts.errors import NonFiniteLogitsError
from streamtts.kernels import TABLE, Kernels, SpecDelayStep, SpecFramePush, SpecStepEmbed
from streamtts.model.tables import Embedder

REAL = TokenIds()
FAMILY16 = TokenIds(n_vq=16)  # TTSD, VoiceGenerator, SoundEffect: the real ids, 16 codebooks
IDS = {"small": SMALL_IDS, "swapped": SWAPPED_IDS, "real": REAL, "real16": FAMILY16}
STATE = ("audio_length", "delayed_length", "is_audio", "is_stopping", "audio_ended", "time_step", "seen")


@dataclass
class Run:
    """What one lifecycle produced (``trace``) and what ran it."""

    trace: list[Any] = field(default_factory=list)
    compiled: bool = False
    handed_back: int = 0  # delay step: steps the twin left to the spec
    steps: int = 0
    lent: int = 0  # delay step: steps that read lent rows (read_logits_at)

    def record(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        """``fn(*args, **kw)``'s result, or the error it raised."""
        try:
            self.trace.append(("ok", fn(*args, **kw)))
        except (ValueError, IndexError, NonFiniteLogitsError) as exc:  # the errors both promise
            self.trace.append(("error", type(exc).__name__, str(exc), getattr(exc, "rows", None)))


def assert_identical(spec: Any, twin: Any, where: str = "trace") -> None:
    """The one error measure: the same structure, arrays of the same dtype, shape and bytes."""
    if isinstance(spec, np.ndarray) or isinstance(twin, np.ndarray):
        assert isinstance(spec, np.ndarray) and isinstance(twin, np.ndarray), where
        assert (spec.dtype, spec.shape) == (twin.dtype, twin.shape), f"{where}: {spec.dtype} {spec.shape} != {twin.dtype} {twin.shape}"
        if spec.tobytes() != twin.tobytes():
            bad = np.argwhere(spec != twin) if spec.shape else []
            raise AssertionError(f"{where}: differs at {bad[:5]}: spec {spec[tuple(bad[0])] if len(bad) else spec}, twin {twin[tuple(bad[0])] if len(bad) else twin}")
    elif isinstance(spec, (list, tuple)):
        assert isinstance(twin, (list, tuple)) and len(spec) == len(twin), f"{where}: {spec!r:.200} != {twin!r:.200}"
        for i, (a, b) in enumerate(zip(spec, twin, strict=True)):
            assert_identical(a, b, f"{where}[{i}]")
    else:
        assert spec == twin, f"{where}: {spec!r} != {twin!r}"


def _ranges(rng: np.random.Generator, n: int, split: bool) -> list[tuple[int, int]]:
    """A step of n rows as one call, or (split) as two calls on row ranges."""
    if not split or n < 2:
        return [(0, n)]
    m = int(rng.integers(1, n))
    return [(0, m), (m, n)]


# -- row sampler -------------------------------------------------------------------------------


def drive_row_sampler(kernels: Kernels, p: dict[str, Any], ctx: Ctx) -> Run:
    """Calls of one sampler on rows of every kind: ties, masked tokens, rows of equal values,
    extreme temperatures, top-k/top-p on and off (sorted path), the penalty, bad rows; laid
    out plainly, as strided (B, K, A) views, reversed, or as selected rows."""
    rng = np.random.default_rng(p["seed"])
    sample = kernels.row_sampler
    strided_ok = "row_sampler" in kernels.twins  # the spec takes 2-D rows only
    run = Run(compiled=strided_ok)
    for _call in range(p["calls"]):
        v = int(rng.choice(p["widths"]))
        n = int(rng.integers(1, 40))
        kind = int(rng.integers(0, 12))
        lg = (rng.standard_normal((n, v)) * rng.choice([0.5, 2.0, 30.0])).astype(np.float32)
        if kind % 3 == 0:
            lg = np.round(lg, 1)  # many equal values: ids decide
        if kind % 4 == 0:
            lg[:, rng.integers(0, v, size=max(1, v // 3))] = -np.inf  # masked tokens
        if kind % 5 == 0:
            lg[:, : v // 2] = lg[:, :1]  # half the row one value
        if kind == 7:  # a few distinct values only
            pool = np.array([-np.inf, -3.0, -0.5, 0.0, 0.25, 1.0, 2.5, 7.0], np.float32)
            lg = rng.choice(pool, size=(n, v)).astype(np.float32)
            lg[:, -1] = 1.0
        if rng.random() < p["bad"]:  # NaN, +inf, all -inf, or overflowing at a tiny temperature
            r = int(rng.integers(0, n))
            lg[r, int(rng.integers(0, v))] = rng.choice([np.nan, np.inf])
            if rng.random() < 0.3:
                lg[r] = -np.inf
        temp = rng.choice([0.0, 0.3, 1.0, 1.7, 1e-3, 50.0, 1e6], size=n).astype(np.float32)
        top_k = rng.choice([0, 1, 2, 25, 50, 300, v + 5], size=n).astype(np.int64)
        top_p = rng.choice([1.0, 0.8, 0.3, 0.0, 0.999], size=n)
        u = rng.random(n)
        kw: dict[str, Any] = {}
        if rng.random() < 0.3:
            kw["seen"] = rng.random((n, v)) < 0.2
            kw["penalty"] = rng.choice([1.0, 1.3, 0.7], size=n).astype(np.float32)
        layout = rng.choice(["plain", "strided", "reversed", "selected"])
        if layout == "strided" and n % 4 == 0 and strided_ok:  # the fused heads' (B, K, A) rows
            wide = np.zeros((n // 4, 2 + 4 * v), np.float32)
            wide[:, 2:] = lg.reshape(n // 4, -1)
            rows_in = wide[:, 2:].reshape(n // 4, 4, v)
        elif layout == "reversed":
            rows_in, lg = lg[::-1].copy()[::-1], lg  # a negative row stride, the same rows
        else:
            rows_in = lg.copy()
        if layout == "selected" and n > 1:
            pick = np.sort(rng.choice(n, size=int(rng.integers(1, n)), replace=False)).astype(np.int64)
            args = (temp[pick], top_k[pick], top_p[pick], u[pick])
            kw = {k: a[pick] for k, a in kw.items()}
            run.record(sample, rows_in if strided_ok else rows_in.copy(), *args, rows=pick, **kw)
        else:
            run.record(sample, rows_in if strided_ok else np.ascontiguousarray(rows_in), temp, top_k, top_p, u, **kw)
        run.steps += 1
    return run


# -- delay step ---------------------------------------------------------------------------------


def _prompt(rng: np.random.Generator, ids: TokenIds, text: float = 0.1) -> np.ndarray:
    s = int(rng.integers(2, 9))
    p = np.full((s, 1 + ids.n_vq), ids.audio_pad_code, np.int64)
    p[:, 0] = 8 if ids.im_start < 100 else 100
    keep = rng.random((s, ids.n_vq)) < 0.3
    p[:, 1:][keep] = rng.integers(0, ids.audio_vocab_size, (s, ids.n_vq))[keep]
    end = rng.choice(["audio_start", "gen", "text"], p=[0.65 - text / 2, 0.35 - text / 2, text])
    if end == "audio_start":
        p[-1, 0] = ids.audio_start
    elif end == "gen":
        p[0, 0] = ids.audio_start
        p[1:, 0] = ids.gen_slot
    return p


def drive_delay_step(kernels: Kernels, p: dict[str, Any], ctx: Ctx) -> Run:
    """Streams from reset to stop on the engine's buffers: audio, the delay flush,
    ``<|audio_end|>``, text mode (full text rows), ``<|im_end|>``; any sampling parameters,
    the fused heads' strided logits, swapped pair ids, bad rows and repeated slots. With
    ``lent`` (fused), a step that can reads its logits from other rows, lent as a backbone
    lends its own (the bound ones then hold NaN), with a pair logit masked through
    ``pair_logits`` now and then, as the engine forces a stream's length."""
    ids = IDS[p["ids"]]
    rng = np.random.default_rng(p["seed"])
    cap, fused = p["capacity"], p["fused"]
    k_n, a_n = ids.n_vq, ids.audio_rows
    v = max(ids.pad, ids.im_start, ids.im_end, ids.audio_start, ids.audio_end, ids.user_slot, ids.gen_slot, ids.delay_slot) + 3  # text vocabulary
    states = kernels.delay_states(cap, ids)
    slot_buf = np.zeros(cap, np.int64)
    logits = np.zeros((cap, 2 + (k_n * a_n if fused else 0)), np.float32)
    audio = logits[:, 2:].reshape(cap, k_n, a_n) if fused else np.zeros((cap, k_n, a_n), np.float32)
    out = np.zeros((cap, 1 + k_n), np.int64)
    tick = [0]

    def full_text(i: int) -> np.ndarray:  # bound row i's full text logits, the same for both
        row = (np.random.default_rng((p["seed"], tick[0], i)).standard_normal(v) * 2).astype(np.float32)
        wide = v > 1000  # the real vocabulary: random ids would win in text mode for ever
        row[ids.im_end] += 9.0 if wide else 1.0
        row[ids.audio_start] += 10.0 if wide else 2.0
        return row

    step = kernels.bind_delay_step(SpecDelayStep(states, slot_buf, logits[:, :2], audio, out, full_text))
    run = Run(compiled=step.compiled)
    lend = bool(p.get("lent")) and step.reads_lent
    lent = np.zeros_like(logits)
    live = [int(s) for s in rng.permutation(cap)[: int(rng.integers(p.get("min_live", 1), cap + 1))]]

    def reset(s: int) -> None:
        states.reset(s, _prompt(rng, ids, p.get("text", 0.1)), random_sampling_params(rng, (0, 1, 5, 25, 300)), int(rng.integers(0, 2**63)))

    for s in live:
        reset(s)
    for tick[0] in range(p["steps"]):
        for s in live:  # a stopped stream's slot starts the next one now and then
            if states.is_stopping[s] and rng.random() < 0.2:
                reset(s)
        batch = np.array(rng.permutation(live)[: int(rng.integers(1, len(live) + 1))], dtype=np.int64)
        b = batch.size
        if b > 1 and rng.random() < 0.03 and p.get("repeat", True):
            batch[1] = batch[0]  # a repeated slot: an error, nothing changed
        slot_buf[:b] = batch
        pair = (rng.standard_normal((b, 2)) * 2).astype(np.float32)
        pair[:, 1] += rng.choice(p["delay"], b).astype(np.float32)  # the delay slot now and then
        logits[:b, :2] = pair
        audio[:b] = (rng.standard_normal((b, k_n, a_n)) * 2).astype(np.float32)
        if rng.random() < 0.3:
            audio[:b] = np.round(audio[:b])  # ties: ids decide
        if rng.random() < p["bad"]:
            (audio if rng.random() < 0.7 else logits)[int(rng.integers(0, b))].flat[int(rng.integers(0, 2))] = np.nan
        if lend:  # the rows where a backbone left them: what the step reads must be there
            lent[:b] = logits[:b]
            logits[:b] = np.nan
            step.read_logits_at(lent.ctypes.data)
            run.lent += 1
        if p.get("lent") and rng.random() < 0.3:
            step.pair_logits(b)[int(rng.integers(0, b)), int(rng.integers(0, 2))] = -np.inf
        for lo, hi in _ranges(rng, b, p["split"]):
            run.record(lambda lo, hi: (step(lo, hi), out[lo:hi].copy())[1], lo, hi)
        run.trace.append([getattr(states, n).copy() for n in STATE])
        run.steps += 1
    run.handed_back = int(getattr(step, "handed_back", 0))  # the twin's count (the spec has none)
    return run


# -- frame push ---------------------------------------------------------------------------------


def _row_stream(rng: np.random.Generator, k: int, pad: int) -> np.ndarray:
    """Rows like a generation: pad stretches, delay-laid utterances, random rows."""
    parts = [np.zeros((0, k), np.int64)]
    for _ in range(int(rng.integers(1, 5))):
        kind = rng.choice(["pad", "utt", "random"])
        if kind == "pad":
            parts.append(np.full((int(rng.integers(1, 6)), k), pad, np.int64))
        elif kind == "utt":
            parts.append(delay_layout(rng.integers(0, pad, size=(int(rng.integers(1, 7)), k)), pad))
        else:
            parts.append(rng.integers(0, pad + 1, size=(int(rng.integers(1, 4)), k)))
    return np.concatenate(parts).astype(np.int64)


def drive_frame_push(kernels: Kernels, p: dict[str, Any], ctx: Ctx) -> Run:
    """Streams of rows pushed to slots in random batches until each ends (and a slot reused)."""
    rng = np.random.default_rng(p["seed"])
    k, cap, pad = p["n_vq"], p["capacity"], 1024
    asm = FrameAssembler(cap, k, pad)
    slot_buf = np.zeros(cap, np.int64)
    out = np.full((cap, 1 + k), -7, np.int64)  # the engine's rows: codes after a text column
    push = kernels.bind_frame_push(SpecFramePush(asm, slot_buf, out[:, 1:]))
    run = Run(compiled=push.compiled)
    for _life in range(2):
        streams = [_row_stream(rng, k, pad) for _ in range(int(rng.integers(1, cap + 1)))]
        slot_of = rng.permutation(cap)[: len(streams)]
        for s in slot_of:
            asm.reset(int(s))
        pos = [0] * len(streams)
        while any(pos[i] < len(s) for i, s in enumerate(streams)):
            live = [i for i, s in enumerate(streams) if pos[i] < len(s)]
            batch = [int(i) for i in rng.permutation(live)[: int(rng.integers(1, len(live) + 1))]]
            b = len(batch)
            slot_buf[:b] = [slot_of[i] for i in batch]
            out[:b, 1:] = np.stack([streams[i][pos[i]] for i in batch])
            for lo, hi in _ranges(rng, b, p["split"]):
                run.record(lambda lo, hi: (push(lo, hi), push.frames[lo:hi].copy(), push.ready[lo:hi].copy(), push.index[lo:hi].copy()), lo, hi)
            run.trace.append((asm.ring.copy(), asm.count.copy()))
            for i in batch:
                pos[i] += 1
            run.steps += 1
    return run


# -- step embedding -----------------------------------------------------------------------------


def drive_step_embed(kernels: Kernels, p: dict[str, Any], ctx: Ctx) -> Run:
    """The next rows of random slots embedded, step after step, float16 or float32 text
    tables (every kind of half: subnormals, signed zeros, the largest, inf)."""
    ids = IDS[p["ids"]]
    emb = ctx.embedder(ids, p["n_embd"], p["dtype"])
    rng = np.random.default_rng(p["seed"])
    cap, k, text_rows = p.get("capacity", 6), ids.n_vq, emb.text.shape[0]
    rows = np.zeros((cap, 1 + k), np.int64)  # the engine's next rows, one per slot
    slots = np.zeros(2 * cap, np.int64)
    out = np.full((cap + 3, emb.n_embd), np.nan, np.float32)
    embed = kernels.bind_step_embed(SpecStepEmbed(emb, slots, rows, out))
    run = Run(compiled=embed.compiled)
    for step in range(p["steps"]):
        rows[:, 0] = rng.integers(0, text_rows, cap)
        rows[:, 1:] = rng.integers(0, ids.audio_rows, (cap, k))
        if step % 5 == 0:
            rows[:, 0] = np.resize([1, 2], cap)  # the special halves
        b = int(rng.integers(1, cap + 1)) if cap <= 8 else int(rng.integers(cap // 2, cap + 1))
        slots[:b] = rng.permutation(cap)[:b]
        for lo, hi in _ranges(rng, b, p["split"]):
            run.record(lambda lo, hi: (embed(lo, hi), out[lo:hi].copy())[1], lo, hi)
        run.steps += 1
    return run


class Ctx:
    """What drivers share across examples: the embedding tables, written once per kind."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._tables: dict[tuple[str, int, str], Embedder] = {}

    def embedder(self, ids: TokenIds, h: int, dtype: str) -> Embedder:
        key = (str(ids.n_vq), h, dtype)
        if key not in self._tables:
            d = self._root / "-".join(map(str, key))
            d.mkdir()
            rng = np.random.default_rng(h)
            text = (rng.standard_normal((40, h)) * 3).astype(dtype)
            if dtype == "float16":
                specials = np.array([0.0, -0.0, 6e-8, -6e-8, 3e-5, 65504.0, -65504.0, np.inf, -np.inf], np.float16)
                text[1, : min(h, specials.size)] = specials[:h]
                text[2, :] = (rng.standard_normal(h) * 1e-6).astype(np.float16)  # subnormals
            np.save(d / "embed_tokens.npy", text)
            for c in range(ids.n_vq):
                np.save(d / f"emb_ext_{c:02d}.npy", (rng.standard_normal((ids.audio_rows, h)) * 0.1).astype(np.float16))
            self._tables[key] = Embedder(d, ids)
        return self._tables[key]


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kernel: str
    name: str
    drive: Callable[[Kernels, dict[str, Any], Ctx], Run]
    params: st.SearchStrategy[dict[str, Any]]
    examples: int
    min_handed_back: int = 0  # delay step: text mode must have reached the spec this often
    threads: int = 1  # the twin's steps cut across this many threads (tick_threads)


SEED = st.integers(0, 2**32 - 1)
CASES = [
    Case("row_sampler", "short rows", drive_row_sampler,
         st.fixed_dictionaries({"seed": SEED, "calls": st.just(8), "widths": st.just((1, 2, 7, 300, 700)), "bad": st.just(0.2)}), 60),
    Case("row_sampler", "audio and long rows", drive_row_sampler,
         st.fixed_dictionaries({"seed": SEED, "calls": st.just(4), "widths": st.just((1025, 3000, 20000)), "bad": st.just(0.2)}), 12),
    Case("delay_step", "small ids", drive_delay_step,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("small"), "capacity": st.just(6), "fused": st.booleans(),
                                "split": st.booleans(), "steps": st.just(40), "bad": st.just(0.05), "delay": st.just((-6.0, -3.0, 0.0, 2.0))}), 60),
    Case("delay_step", "swapped pair ids", drive_delay_step,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("swapped"), "capacity": st.just(4), "fused": st.booleans(),
                                "split": st.booleans(), "steps": st.just(30), "bad": st.just(0.05), "delay": st.just((-6.0, -3.0, 0.0, 2.0))}), 15),
    Case("delay_step", "real shapes", drive_delay_step,
         st.fixed_dictionaries({"seed": st.integers(0, 2**32 - 1), "ids": st.just("real"), "capacity": st.just(4), "fused": st.booleans(),
                                "split": st.booleans(), "steps": st.just(120), "bad": st.just(0.0), "delay": st.just((-9.0,) * 12 + (3.0,))}), 3,
         min_handed_back=1),
    # the 16-codebook members: the same twins, the model's n_vq from the structs they get
    Case("delay_step", "16 codebooks", drive_delay_step,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("real16"), "capacity": st.just(4), "fused": st.booleans(),
                                "split": st.booleans(), "steps": st.just(80), "bad": st.just(0.02), "delay": st.just((-9.0,) * 8 + (3.0,))}), 4,
         min_handed_back=1),
    Case("frame_push", "16 codebooks", drive_frame_push,
         st.fixed_dictionaries({"seed": SEED, "n_vq": st.just(16), "capacity": st.just(4), "split": st.booleans()}), 10),
    Case("step_embed", "16 codebooks", drive_step_embed,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("real16"), "n_embd": st.just(64), "dtype": st.sampled_from(["float16", "float32"]),
                                "split": st.booleans(), "steps": st.just(30)}), 4),
    Case("frame_push", "4 codebooks", drive_frame_push,
         st.fixed_dictionaries({"seed": SEED, "n_vq": st.just(4), "capacity": st.just(8), "split": st.booleans()}), 60),
    Case("frame_push", "32 codebooks", drive_frame_push,
         st.fixed_dictionaries({"seed": SEED, "n_vq": st.just(32), "capacity": st.just(3), "split": st.booleans()}), 10),
    Case("step_embed", "small tables", drive_step_embed,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("small"), "n_embd": st.just(24), "dtype": st.sampled_from(["float16", "float32"]),
                                "split": st.booleans(), "steps": st.just(30)}), 20),
    Case("step_embed", "real codebooks", drive_step_embed,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("real"), "n_embd": st.just(96), "dtype": st.just("float16"),
                                "split": st.booleans(), "steps": st.just(30)}), 5),
    # cut across threads (tick_threads, a GPU's many streams): steps of up to 96 streams in
    # chunks on 3 threads; the engine's slots are distinct and an error fails the whole step,
    # so these lifecycles have neither repeated slots nor bad rows. With text mode, chunks
    # holding a stream outside audio mode go to the spec while the others ran in C.
    Case("delay_step", "across threads", drive_delay_step,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("small"), "capacity": st.just(96), "fused": st.booleans(),
                                "split": st.just(False), "steps": st.just(30), "bad": st.just(0.0), "repeat": st.just(False),
                                "text": st.just(0.0), "delay": st.just((-9.0,) * 40 + (3.0,))}), 12, threads=3),
    Case("delay_step", "across threads, text mode", drive_delay_step,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("real"), "capacity": st.just(96), "fused": st.booleans(),
                                "split": st.just(False), "steps": st.just(40), "bad": st.just(0.0), "repeat": st.just(False),
                                "text": st.just(0.3), "min_live": st.just(64), "delay": st.just((-9.0,) * 12 + (3.0,))}),
         3, min_handed_back=1, threads=3),
    # the logits rows a backbone lends (fused heads: not copied), cut across threads, with
    # chunks in text mode handed to the spec (which reads the bound rows: copied there first)
    Case("delay_step", "lent rows", drive_delay_step,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("real"), "capacity": st.just(48), "fused": st.just(True),
                                "split": st.booleans(), "steps": st.just(40), "bad": st.just(0.0), "repeat": st.just(False),
                                "text": st.just(0.3), "min_live": st.just(40), "lent": st.just(True),
                                "delay": st.just((-9.0,) * 12 + (3.0,))}),
         3, min_handed_back=1, threads=3),
    Case("step_embed", "across threads", drive_step_embed,
         st.fixed_dictionaries({"seed": SEED, "ids": st.just("small"), "n_embd": st.just(24), "dtype": st.just("float16"),
                                "split": st.just(False), "steps": st.just(20), "capacity": st.just(96)}), 8, threads=3),
]  # fmt: skip


def test_every_kernel_has_cases() -> None:
    assert {k.name for k in TABLE} == {c.kernel for c in CASES} == set(KERNEL_NAMES)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Ctx:
    return Ctx(tmp_path_factory.mktemp("tables"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.kernel}-{c.name.replace(' ', '_')}")
def test_twin_is_its_spec(bridge_lib: Any, ctx: Ctx, case: Case) -> None:
    spec_kernels, twin_kernels = Kernels(), Kernels({case.kernel}, bridge_lib, threads=case.threads)
    if case.threads > 1:
        assert twin_kernels.pool is not None and twin_kernels.pool.threads == case.threads

    @given(case.params)
    @settings(max_examples=case.examples, deadline=None)
    def check(p: dict[str, Any]) -> None:
        spec = case.drive(spec_kernels, p, ctx)
        twin = case.drive(twin_kernels, p, ctx)
        assert not spec.compiled and twin.compiled, "the twin did not run"
        assert twin.handed_back < twin.steps  # it took steps itself
        assert twin.handed_back >= case.min_handed_back, twin.handed_back
        assert_identical(spec.trace, twin.trace)
        assert twin.lent == (twin.steps if p.get("lent") else 0)

    check()
    if case.threads > 1:
        assert twin_kernels.pool is not None and twin_kernels.pool.parallel_runs > 0, "no step was cut across threads"
