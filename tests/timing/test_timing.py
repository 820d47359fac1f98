"""Estimated word times (streamtts.timing): the duration model, the streamed estimator's
promises (monotonic, inside the audio, a word no later than its audio), and its error
against eSpeak NG's own word boundaries (benchmarks/timing_espeak.py has the full table)."""

from __future__ import annotations

import numpy as np
import pytest

from streamtts.request import WordTime
from streamtts.timing import StreamAligner, align_words, char_times, split_words
from streamtts.timing.nuclei import BandEnvelope, peak_hops

SR = 24000


def test_words_attach_punctuation_and_split_cjk() -> None:
    words = split_words('"Hello there," she said — twice. 你好，世界。')
    assert [w.text for w in words] == ['"Hello', 'there,"', "she", "said —", "twice.", "你", "好，", "世", "界。"]
    text = '"Hello there," she said — twice. 你好，世界。'
    assert all(text[w.start_char : w.end_char] == w.text for w in words)
    by = {w.text: w for w in words}
    assert by["twice."].pause == 2 and by['there,"'].pause == 1 and by["she"].pause == 0
    assert by["你"].units == 1.0
    # syllables and letters: a long word lasts longer than a short one
    assert split_words("extraordinary")[0].units > split_words("cat")[0].units > 0
    # the nuclei a word should make: vowel groups, less a silent final e or "ed"
    syl = {w.text: w.syllables for w in split_words("time opened needed extraordinary 42 你")}
    assert syl == {"time": 1, "opened": 2, "needed": 2, "extraordinary": 5, "42": 3, "你": 1}


def test_nuclei_count_the_syllables_of_a_voice_like_envelope() -> None:
    # a 220 Hz buzz with a vowel-band formant, its loudness rising and falling once per
    # syllable (syllables 150 to 300 ms long, a 250 ms pause after the 4th)
    rng = np.random.default_rng(3)
    lengths = [0.15, 0.22, 0.3, 0.18, 0.25, 0.2, 0.16]
    parts = []
    for i, d in enumerate(lengths):
        t = np.arange(int(d * SR)) / SR
        tone = sum(np.sin(2 * np.pi * 220 * k * t) / k for k in range(1, 12))
        parts.append((0.2 * np.sin(np.pi * t / d) ** 2 * tone).astype(np.float32))
        if i == 3:
            parts.append(np.zeros(int(0.25 * SR), np.float32))
    pcm = np.concatenate(parts) + rng.normal(0, 1e-4, sum(p.shape[0] for p in parts)).astype(np.float32)
    hop = SR // 100
    env = BandEnvelope(SR, hop)
    n = pcm.shape[0] // hop
    for i in range(0, n, 8):  # fed in 80 ms pieces, as the aligner does
        env.push(pcm[i * hop : min(n, i + 8) * hop].reshape(-1, hop).astype(np.float64))
    peaks = peak_hops(env.db)
    assert peaks.shape[0] == len(lengths), peaks
    # each peak inside its syllable
    edges = np.cumsum([0.0] + [d + (0.25 if i == 3 else 0.0) for i, d in enumerate(lengths)])
    for k, p in enumerate(peaks):
        assert edges[k] <= p * 0.01 <= edges[k + 1] - (0.25 if k == 3 else 0.0), (k, p)


def bursts(durations: list[float], gap: float = 0.15, lead: float = 0.2) -> tuple[np.ndarray, list[float]]:
    """A tone burst per word with silence between: the true word starts are known."""
    parts = [np.zeros(int(lead * SR), np.float32)]
    starts = []
    t = lead
    for i, d in enumerate(durations):
        starts.append(t)
        n = int(d * SR)
        tt = np.arange(n) / SR
        parts.append((0.3 * np.sin(2 * np.pi * (180 + 40 * i) * tt)).astype(np.float32))
        parts.append(np.zeros(int(gap * SR), np.float32))
        t += d + gap
    return np.concatenate(parts), starts


TEXT = "one seven banana extraordinary cat window"


def test_whole_generation_words_land_on_the_pauses() -> None:
    durs = [0.2 * w.units for w in split_words(TEXT)]
    pcm, truth = bursts(durs)
    words = align_words(TEXT, pcm, SR)
    assert [w.word for w in words] == TEXT.split()
    err = [abs(w.start - t) for w, t in zip(words, truth, strict=True)]
    assert max(err) <= 0.03, err
    assert words[-1].end <= pcm.shape[0] / SR


@pytest.mark.parametrize("chunk_s", [0.08, 0.32, 0.01])
def test_streamed_words_are_ordered_inside_and_never_after_their_audio(chunk_s: float) -> None:
    durs = [0.2 * w.units for w in split_words(TEXT)]
    pcm, _ = bursts(durs)
    al = StreamAligner(TEXT, SR)
    step = int(chunk_s * SR)
    got: list[WordTime] = []
    for i in range(0, pcm.shape[0], step):
        last = i + step >= pcm.shape[0]
        new = al.push(pcm[i : i + step], last=last)
        heard = min(pcm.shape[0], i + step) / SR
        for w in new:
            assert w.start <= heard + 1e-9 or last, (w, heard)  # never later than its audio
        got += new
    assert [w.word for w in got] == TEXT.split()
    ends = [0.0] + [x for w in got for x in (w.start, w.end)]
    assert ends == sorted(ends), "not monotonic"
    assert got[-1].end <= pcm.shape[0] / SR + 1e-9
    assert al.measured_rate is not None and al.measured_rate > 0


def test_silence_only_and_empty_text() -> None:
    assert StreamAligner("", SR).push(np.zeros(SR, np.float32), last=True) == []
    al = StreamAligner("two words", SR)
    assert al.push(np.zeros(SR, np.float32)) == []  # nothing said yet: nothing sent
    rest = al.push(np.zeros(0, np.float32), last=True)
    assert [w.word for w in rest] == ["two", "words"] and rest[0].start <= rest[1].start


def test_char_times_cover_the_text_in_order() -> None:
    text = "Hi, you there."
    words = [WordTime("Hi,", 0.0, 0.2, 0, 3), WordTime("you", 0.3, 0.5, 4, 7), WordTime("there.", 0.5, 0.9, 8, 14)]
    ct = char_times(text, words)
    assert "".join(ct.characters) == text
    assert ct.starts == sorted(ct.starts) and all(a <= b for a, b in zip(ct.starts, ct.ends, strict=True))
    assert ct.starts[4] == pytest.approx(0.3) and ct.ends[-1] == pytest.approx(0.9)


def _espeak() -> None:
    from benchmarks import espeak_words

    if not espeak_words.available():
        pytest.skip("libespeak-ng is not installed (Debian: apt-get install espeak-ng; scripts/setup.sh --test)")


# Loose bounds (the benchmark's figures are in docs/timing.md): a regression shows, noise does not.
@pytest.mark.parametrize(
    ("lang", "voice", "mode", "median_ms", "p90_ms"),
    [
        ("English", "en", "whole", 40, 250),
        ("Chinese", "cmn", "whole", 40, 400),
        ("English", "en", "stream", 60, 350),
        ("English", "en", "stream, rate known", 60, 350),
    ],
)
def test_error_against_espeaks_word_boundaries(lang: str, voice: str, mode: str, median_ms: float, p90_ms: float) -> None:
    _espeak()
    from benchmarks import timing_espeak

    texts = timing_espeak.ENGLISH if lang == "English" else timing_espeak.CHINESE
    e = np.array(timing_espeak.errors(texts, voice, mode))
    assert e.shape[0] >= 0.8 * sum(len(split_words(t)) - 1 for t in texts)
    med, p90 = float(np.median(e)), float(np.percentile(e, 90))
    print(f"\n{lang} {mode}: median {med:.1f} ms, p90 {p90:.1f} ms over {e.shape[0]} words")
    assert med <= median_ms and p90 <= p90_ms, (med, p90)
