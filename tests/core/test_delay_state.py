"""DelayStates: the contract's state machine, vectorised over slots."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL_IDS, SWAPPED_IDS, random_sampling_params
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.config import SamplingParams
from streamtts.core.delay import de_delay, drop_pad_frames
from streamtts.core.delay_state import (
    NONE,
    DelayStates,
    OfficialState,
    official_init,
    official_step,
)
from streamtts.core.frames import FrameAssembler
from streamtts.core.sampling import (
    TEXT_STREAM,
    NonFiniteLogitsError,
    counter_uniforms,
    sample_rows_plain,
)
from streamtts.core.tokens import TokenIds
from streamtts.errors import InputError

REAL = TokenIds()
K = REAL.n_vq
A = REAL.audio_rows
PAD = REAL.audio_pad_code
V_REAL = 151663

SMALL = SMALL_IDS  # 4 codebooks of 16 codes, a 12-token text vocabulary
SWAPPED = SWAPPED_IDS  # the gen slot's id above the delay slot's (pair columns swap)
V_SMALL = 12


def tts_prompt(ids: TokenIds, n_text: int = 6) -> np.ndarray:
    """A prompt of plain text rows ending with <|audio_start|> (the TTS case)."""
    p = np.full((n_text + 1, 1 + ids.n_vq), ids.audio_pad_code, np.int64)
    p[:-1, 0] = 100 if ids.im_start > 100 else 8
    p[-1, 0] = ids.audio_start
    return p


def no_full(b: int) -> np.ndarray:
    raise AssertionError(f"full text logits requested for row {b}")


def _sampled_pair(gen: float, delay: float) -> np.ndarray:
    return np.array([[gen, delay]], np.float32)


# -- reset ------------------------------------------------------------------------------


def test_reset_initialises_like_the_official_init() -> None:
    st_ = DelayStates(4, REAL)
    assert st_.is_stopping.all()  # slots never reset are idle
    p = tts_prompt(REAL)
    st_.reset(0, p, SamplingParams(), seed=1)
    assert st_.audio_length[0] == 1 and st_.is_audio[0] and not st_.is_stopping[0]
    assert st_.delayed_length[0] == NONE and st_.time_step[0] == 0

    q = np.full((10, 1 + K), PAD, np.int64)
    q[:, 0] = 100
    q[5, 0] = REAL.audio_start
    q[6:, 0] = REAL.gen_slot
    q[6, 1] = 17
    st_.reset(1, q, SamplingParams(audio_repetition_penalty=1.2), seed=2)
    assert st_.audio_length[1] == 5 and st_.is_audio[1]
    assert st_.seen[1, 0, 17] and st_.seen[1, 0, PAD] and not st_.seen[1, 0, 18]
    assert not st_.seen[1, 1, 17]
    assert np.isclose(st_.audio_penalty[1], 1.2)

    q[5, 0] = 100  # gen slot but no audio_start: not audio
    st_.reset(2, q, SamplingParams(), seed=3)
    assert st_.audio_length[2] == 0 and not st_.is_audio[2]
    q[-1, 0] = 100  # plain text end
    st_.reset(3, q, SamplingParams(), seed=3)
    assert st_.audio_length[3] == 0 and not st_.is_audio[3]

    with pytest.raises(InputError):
        st_.reset(0, np.zeros((3, 5), np.int64), SamplingParams(), 0)
    bad = tts_prompt(REAL)
    bad[0, 1] = A
    with pytest.raises(InputError):
        st_.reset(0, bad, SamplingParams(), 0)


# -- the lifecycle, scripted ------------------------------------------------------------


def _audio_for_step(t: int, b: int = 1) -> np.ndarray:
    """Audio logits whose argmax for codebook k at step t is code (t - k) mod 1000,
    so greedy frame f carries code f on every codebook."""
    a = np.zeros((b, K, A), np.float32)
    a[:, np.arange(K), (t - np.arange(K)) % 1000] = 10.0
    a[:, :, PAD] = 100.0  # must be masked
    return a


@pytest.mark.parametrize("d", [1, 2, 40])
def test_lifecycle_delay_at_step_d(d: int) -> None:
    st_ = DelayStates(2, REAL)
    st_.reset(1, tts_prompt(REAL), SamplingParams.greedy(), seed=0)
    slots = np.array([1])
    asm = FrameAssembler(2, K, PAD)
    rows, frames = [], []
    calls: list[int] = []

    def full(b: int) -> np.ndarray:
        calls.append(b)
        row = np.zeros(V_REAL, np.float32)
        row[[REAL.pad, REAL.gen_slot, REAL.delay_slot, REAL.audio_end]] = 50.0  # banned
        row[REAL.im_end] = 20.0
        return row

    for t in range(d + 40):
        if t == 0:
            pair = _sampled_pair(1.0, 5.0)  # delay preferred but banned at step 0
        elif t < d:
            pair = _sampled_pair(5.0, 1.0)
        else:
            pair = _sampled_pair(1.0, 5.0)
        out = st_.step(slots, pair, _audio_for_step(t), full)
        rows.append(out[0].copy())
        f, ready, idx = asm.push(slots, out[:, 1:])
        if ready[0]:
            frames.append((int(idx[0]), f[0].copy()))
        text = out[0, 0]
        codes = out[0, 1:]
        if t < d:
            assert text == REAL.gen_slot
            assert st_.delayed_length[1] == NONE
            # codebook k sampled iff k < audio_length = t + 1
            want = np.where(np.arange(K) <= t, (t - np.arange(K)) % 1000, PAD)
            np.testing.assert_array_equal(codes, want)
            assert st_.audio_length[1] == t + 2
        elif t <= d + 31:
            assert text == REAL.delay_slot
            dl = t - d  # delayed_length before this step (NONE at t == d)
            sampled = (np.arange(K) >= dl) & (np.arange(K) < t + 1)
            np.testing.assert_array_equal(codes, np.where(sampled, (t - np.arange(K)) % 1000, PAD))
            assert st_.delayed_length[1] == dl + 1
            assert st_.is_audio[1]
        elif t == d + 32:
            assert text == REAL.audio_end
            assert np.all(codes == PAD)
            assert st_.audio_ended[1] and not st_.is_audio[1]
            assert st_.audio_length[1] == 0 and st_.delayed_length[1] == NONE
            assert calls == []
        elif t == d + 33:
            assert text == REAL.im_end and calls == [0]
            assert st_.is_stopping[1] and not st_.audio_ended[1]
            assert st_.time_step[1] == d + 34
        else:
            assert text == REAL.pad and np.all(codes == PAD)
            assert st_.time_step[1] == d + 34  # a stopped slot does not advance
            assert calls == [0]
    all_rows = np.array(rows)
    offline = drop_pad_frames(de_delay(all_rows[:, 1:]), PAD)
    assert offline.shape == (d + 1, K)  # the utterance has d + 1 frames
    np.testing.assert_array_equal(offline, np.repeat(np.arange(d + 1)[:, None], K, axis=1))
    assert [i for i, _ in frames] == list(range(d + 1))
    np.testing.assert_array_equal(np.array([f for _, f in frames]), offline)


def test_max_new_tokens_cut_leaves_frames_0_to_n_minus_32() -> None:
    n = 45
    st_ = DelayStates(1, REAL)
    st_.reset(0, tts_prompt(REAL), SamplingParams.greedy(), seed=0)
    rows = np.array(
        [
            st_.step(np.array([0]), _sampled_pair(5.0, 1.0), _audio_for_step(t), no_full)[0]
            for t in range(n)
        ]
    )
    frames = de_delay(rows[:, 1:])
    assert frames.shape[0] == n - 31  # frames 0 .. n-32
    assert not np.any(frames == PAD)
    np.testing.assert_array_equal(frames, np.repeat(np.arange(n - 31)[:, None], K, axis=1))


def test_text_mode_masks_and_im_end_ban() -> None:
    st_ = DelayStates(1, REAL)
    p = tts_prompt(REAL)
    p[-1, 0] = 100  # ends in plain text: not audio mode
    st_.reset(0, p, SamplingParams.greedy(), seed=0)
    seen_ts = []

    def full(b: int) -> np.ndarray:
        row = np.zeros(V_REAL, np.float32)
        row[[REAL.pad, REAL.gen_slot, REAL.delay_slot, REAL.audio_end]] = 50.0
        row[REAL.im_end] = 20.0
        row[777] = 10.0
        seen_ts.append(int(st_.time_step[0]))
        return row

    texts = [
        int(st_.step(np.array([0]), _sampled_pair(0, 0), _audio_for_step(0), full)[0, 0])
        for _ in range(35)
    ]
    assert texts[:33] == [777] * 33  # im_end banned while time_step <= 32
    assert texts[33] == REAL.im_end
    assert texts[34] == REAL.pad
    assert seen_ts == list(range(34))


def test_audio_start_in_text_mode_enters_audio() -> None:
    st_ = DelayStates(1, REAL)
    p = tts_prompt(REAL)
    p[-1, 0] = 100
    st_.reset(0, p, SamplingParams.greedy(), seed=0)

    def full(b: int) -> np.ndarray:
        row = np.zeros(V_REAL, np.float32)
        row[REAL.audio_start] = 5.0
        return row

    out = st_.step(np.array([0]), _sampled_pair(0, 0), _audio_for_step(0), full)
    assert out[0, 0] == REAL.audio_start and np.all(out[0, 1:] == PAD)
    assert st_.is_audio[0] and st_.audio_length[0] == 1
    out = st_.step(np.array([0]), _sampled_pair(3.0, 1.0), _audio_for_step(1), no_full)
    assert out[0, 0] == REAL.gen_slot and out[0, 1] == 1 and np.all(out[0, 2:] == PAD)


def test_time_step_0_bans_delay_slot_when_sampling() -> None:
    n = 300
    st_ = DelayStates(n, REAL)
    for s in range(n):
        st_.reset(s, tts_prompt(REAL), SamplingParams(), seed=s)
    pair = np.tile(np.array([[-30.0, 30.0]], np.float32), (n, 1))
    audio = np.zeros((n, K, A), np.float32)
    out = st_.step(np.arange(n), pair, audio, no_full)
    assert np.all(out[:, 0] == REAL.gen_slot)
    out = st_.step(np.arange(n), pair, np.zeros((n, K, A), np.float32), no_full)
    assert np.all(out[:, 0] == REAL.delay_slot)


# -- vectorised == reference ------------------------------------------------------------


def _random_prompt(rng: np.random.Generator, ids: TokenIds, v: int) -> np.ndarray:
    s = int(rng.integers(2, 9))
    p = np.full((s, 1 + ids.n_vq), ids.audio_pad_code, np.int64)
    p[:, 0] = rng.integers(8, v, s) if v > 8 else 1
    codes = rng.integers(0, ids.audio_vocab_size, (s, ids.n_vq))
    keep = rng.random((s, ids.n_vq)) < 0.3
    p[:, 1:][keep] = codes[keep]
    end = rng.choice(["audio_start", "gen", "text"])
    if end == "audio_start":
        p[-1, 0] = ids.audio_start
    elif end == "gen":
        p[0, 0] = ids.audio_start
        p[1:, 0] = ids.gen_slot
    return p


def _check_state(st_: DelayStates, slot: int, ref: OfficialState) -> None:
    assert st_.audio_length[slot] == ref.audio_length
    assert st_.delayed_length[slot] == (NONE if ref.delayed_length is None else ref.delayed_length)
    assert st_.is_audio[slot] == ref.is_audio
    assert st_.is_stopping[slot] == ref.is_stopping
    assert st_.time_step[slot] == ref.time_step


def _compare_run(
    ids: TokenIds,
    v: int,
    seed: int,
    n_slots: int,
    steps: int,
    capacity: int,
    delay_bias: tuple[float, ...] = (-4.0, 0.0, 2.0),
) -> dict[int, int]:
    """Run random batches through DelayStates and official_step side by side.

    Returns how often each text token was produced (key -1: sampled codes).
    """
    rng = np.random.default_rng(seed)
    stats: dict[int, int] = {}
    k_n, a_n = ids.n_vq, ids.audio_rows
    st_ = DelayStates(capacity, ids)
    slots = [int(s) for s in rng.permutation(capacity)[:n_slots]]
    refs: dict[int, tuple[OfficialState, SamplingParams, int]] = {}
    for s in slots:
        prompt = _random_prompt(rng, ids, v)
        params = random_sampling_params(rng)
        seed_s = int(rng.integers(0, 2**63))
        st_.reset(s, prompt, params, seed_s)
        refs[s] = (official_init(prompt, ids), params, seed_s)
    for _ in range(steps):
        batch = [int(s) for s in rng.permutation(slots)[: int(rng.integers(1, n_slots + 1))]]
        b_n = len(batch)
        full = (rng.standard_normal((b_n, v)) * rng.choice([0.5, 3.0])).astype(np.float32)
        if rng.random() < 0.3:
            full = np.round(full)
        full[:, ids.delay_slot] += rng.choice(delay_bias, b_n).astype(np.float32)
        full[:, ids.im_end] += 2.0
        audio = (rng.standard_normal((b_n, k_n, a_n)) * 2).astype(np.float32)
        if rng.random() < 0.3:
            audio = np.round(audio)
        expected = np.stack(
            [
                official_step(refs[s][0], full[j], audio[j], refs[s][1], refs[s][2], ids)
                for j, s in enumerate(batch)
            ]
        )
        pair = full[:, [ids.gen_slot, ids.delay_slot]].copy()
        calls: list[int] = []

        def ftl(b: int, full: np.ndarray = full, calls: list[int] = calls) -> np.ndarray:
            calls.append(b)
            row: np.ndarray = full[b].copy()
            return row

        out = np.full((b_n, 1 + k_n), -5, np.int64)
        got = st_.step(np.array(batch), pair, audio.copy(), ftl, out=out)
        assert got is out
        np.testing.assert_array_equal(got, expected)
        assert len(set(calls)) == len(calls)
        for j, s in enumerate(batch):
            _check_state(st_, s, refs[s][0])
            assert st_.audio_ended[s] == (expected[j, 0] == ids.audio_end)
            stats[int(expected[j, 0])] = stats.get(int(expected[j, 0]), 0) + 1
            stats[-1] = stats.get(-1, 0) + int(
                np.count_nonzero(expected[j, 1:] != ids.audio_pad_code)
            )
    return stats


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_batch_step_equals_reference_small(seed: int) -> None:
    _compare_run(SMALL, V_SMALL, seed, n_slots=5, steps=25, capacity=8)


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=15, deadline=None)
def test_batch_step_equals_reference_swapped_pair_ids(seed: int) -> None:
    _compare_run(SWAPPED, V_SMALL, seed, n_slots=4, steps=20, capacity=4)


def test_batch_step_equals_reference_real_shapes() -> None:
    ids = TokenIds(
        **{
            **{f: getattr(SMALL, f) for f in SMALL.__struct_fields__},
            "n_vq": 32,
            "audio_pad_code": 1024,
            "audio_vocab_size": 1024,
        }
    )
    stats = _compare_run(
        ids, V_SMALL, 1, n_slots=3, steps=80, capacity=5, delay_bias=(-8.0,) * 30 + (2.0,)
    )
    assert stats[-1] > 1500  # many codebooks actually sampled
    assert stats.get(ids.audio_end, 0) >= 1


# -- pair sampling == full masked-vocabulary sampling -----------------------------------


@pytest.mark.parametrize("ids", [SMALL, SWAPPED])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(text_temperature=0.7, text_top_k=1),
        SamplingParams(text_temperature=1.0, text_top_p=0.6),
        SamplingParams(text_temperature=0.0),
    ],
)
def test_pair_sampling_equals_full_masked_vocab(ids: TokenIds, params: SamplingParams) -> None:
    n = 1500
    rng = np.random.default_rng(4)
    st_ = DelayStates(n, ids)
    for s in range(n):
        st_.reset(s, tts_prompt(ids), params, seed=s * 7919)
    slots = np.arange(n)
    audio = np.zeros((n, ids.n_vq, ids.audio_rows), np.float32)
    st_.step(slots, np.zeros((n, 2), np.float32), audio, no_full)  # past the step-0 ban
    full = (rng.standard_normal((n, V_SMALL)) * 4).astype(np.float32)
    full[:, ids.delay_slot] = full[:, ids.gen_slot] + rng.choice([-1.0, 0.0, 0.3], n).astype(
        np.float32
    )
    pair = full[:, [ids.gen_slot, ids.delay_slot]].copy()
    got = st_.step(slots, pair, np.zeros_like(audio), no_full)[:, 0]

    # official: full vocabulary, everything but the two slots masked
    masked = np.full_like(full, -np.inf)
    masked[:, [ids.gen_slot, ids.delay_slot]] = full[:, [ids.gen_slot, ids.delay_slot]]
    u = counter_uniforms(st_.seed[slots], np.ones(n, np.uint64), 1, TEXT_STREAM)[:, 0]
    ref = sample_rows_plain(
        masked,
        np.full(n, params.text_temperature),
        np.full(n, params.text_top_k),
        np.full(n, params.text_top_p),
        u,
    )
    np.testing.assert_array_equal(got, ref)


def test_pair_sampling_distribution_matches_two_way_softmax() -> None:
    n = 20000
    st_ = DelayStates(n, SMALL)
    params = SamplingParams(text_temperature=1.5, text_top_k=50, text_top_p=1.0)
    for s in range(n):
        st_.reset(s, tts_prompt(SMALL), params, seed=s)
    slots = np.arange(n)
    audio = np.zeros((n, SMALL.n_vq, SMALL.audio_rows), np.float32)
    st_.step(slots, np.zeros((n, 2), np.float32), audio, no_full)
    pair = np.tile(np.array([[1.0, 0.0]], np.float32), (n, 1))
    got = st_.step(slots, pair, np.zeros_like(audio), no_full)[:, 0]
    p_delay = 1.0 / (1.0 + np.exp(1.0 / 1.5))
    frac = float(np.mean(got == SMALL.delay_slot))
    assert abs(frac - p_delay) < 4 * np.sqrt(p_delay * (1 - p_delay) / n)


# -- reproducibility, errors --------------------------------------------------------------


def test_slot_output_independent_of_batch_and_slot_number() -> None:
    rng = np.random.default_rng(8)
    steps = 40
    pairs = rng.standard_normal((steps, 2)).astype(np.float32)
    pairs[:, 1] -= 3
    audios = rng.standard_normal((steps, K, A)).astype(np.float32)
    params = SamplingParams(audio_repetition_penalty=1.1)
    solo = DelayStates(1, REAL)
    solo.reset(0, tts_prompt(REAL), params, seed=99)
    crowd = DelayStates(16, REAL)
    crowd.reset(11, tts_prompt(REAL), params, seed=99)
    for s in range(16):
        if s != 11:
            crowd.reset(s, tts_prompt(REAL), SamplingParams(), seed=s)
    for t in range(steps):
        a = solo.step(np.array([0]), pairs[t : t + 1], audios[t : t + 1].copy(), no_full)
        others = [
            int(x)
            for x in rng.permutation([s for s in range(16) if s != 11])[: rng.integers(0, 15)]
        ]
        batch = others + [11]
        rng.shuffle(batch)
        b = len(batch)
        pp = rng.standard_normal((b, 2)).astype(np.float32) + np.array([0, -9], np.float32)
        aa = rng.standard_normal((b, K, A)).astype(np.float32)
        j = batch.index(11)
        pp[j] = pairs[t]
        aa[j] = audios[t]
        out = crowd.step(np.array(batch), pp, aa, no_full)
        np.testing.assert_array_equal(out[j], a[0])


def test_non_finite_logits_name_the_slot_and_leave_state_unchanged() -> None:
    st_ = DelayStates(4, REAL)
    for s in range(4):
        st_.reset(s, tts_prompt(REAL), SamplingParams(), seed=s)
    before = {
        n: getattr(st_, n).copy()
        for n in ("audio_length", "delayed_length", "time_step", "is_audio", "seen")
    }
    audio = np.zeros((3, K, A), np.float32)
    audio[1, 0, 5] = np.nan
    with pytest.raises(NonFiniteLogitsError) as err:
        st_.step(np.array([0, 2, 3]), np.zeros((3, 2), np.float32), audio, no_full)
    assert err.value.rows == (2,)
    for n, v in before.items():
        np.testing.assert_array_equal(getattr(st_, n), v)


def test_step_shape_checks_and_empty_batch() -> None:
    st_ = DelayStates(2, REAL)
    st_.reset(0, tts_prompt(REAL), SamplingParams(), seed=0)
    out = st_.step(
        np.array([], np.int64),
        np.zeros((0, 2), np.float32),
        np.zeros((0, K, A), np.float32),
        no_full,
    )
    assert out.shape == (0, 1 + K)
    with pytest.raises(ValueError):
        st_.step(
            np.array([0]), np.zeros((1, 3), np.float32), np.zeros((1, K, A), np.float32), no_full
        )
    with pytest.raises(ValueError):
        st_.step(
            np.array([0]), np.zeros((1, 2), np.float32), np.zeros((1, K, A), np.float64), no_full
        )
    for bad in ([0, 0], [-1, 0], [0, 2]):
        with pytest.raises(ValueError, match="distinct"):
            st_.step(
                np.array(bad),
                np.zeros((2, 2), np.float32),
                np.zeros((2, K, A), np.float32),
                no_full,
            )
