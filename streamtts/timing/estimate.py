"""Word times of one generation, estimated from its text and its audio as it is decoded.

MOSS-TTS-Delay speaks without emitting its text, so there is nothing to read the times off.
What is known exactly is the generation's audio; what is known roughly is how long each word
takes (:func:`streamtts.timing.words.split_words`: syllables, one per CJK character). The
estimate joins the two:

* the audio becomes a 10 ms energy envelope; hops 35 dB under the loud ones are silence;
  the peaks of its vowel band (nuclei.py) count the syllables heard;
* word boundaries are placed by a dynamic programme over the hops: each word should span
  about as many nuclei as it has syllables, its *voiced* time (silence is free, so pauses
  need no model) should match its share of the units, and a boundary should sit in a
  low-energy valley (in a silence after a comma or a full stop most of all); boundaries are
  monotonic and inside the generation's speech;
* a boundary that falls in a silence splits it: the word before ends where the silence
  starts, the next begins where it ends.

Streaming (:meth:`StreamAligner.push`): a word goes out with the chunk that holds its start,
never later, and its start is never put back into audio sent before it. Until the
generation's end is known the programme's end is open (the audio so far holds a prefix of
the text): the speaking rate is the one the nuclei heard so far say, and the audio beyond
the last chunk is assumed valley-like; a word after punctuation starts where the pause ends,
once its nucleus is heard; the words already sent stay as sent (the last one's end is
re-placed), the rest are placed again on each chunk. At the end the remaining words share
the remaining speech exactly. Everything here is NumPy on the caller's thread (the engine
runs it on a worker thread).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..request import WordTime
from .nuclei import BandEnvelope, peak_hops
from .words import Word, split_words

__all__ = ["HOP_S", "StreamAligner", "WordTime", "align_words"]

HOP_S = 0.01
SILENCE_DB = 35.0  # under the loud hops' level (95th percentile) by this much: silence
FLOOR_DB = -65.0  # always silence (dBFS)
# Prior speaking rate: voiced hops (10 ms) per syllable before a generation's end is known
# (about 5.9 syllables per voiced second in English, 5 characters per second in Chinese).
PRIOR_HOPS_PER_UNIT = 17.0
PRIOR_HOPS_PER_CJK = 20.0
# Dynamic-programme weights: a boundary's loudness (0 silent .. 1 loud), the bonus for a
# pause where the text has punctuation, and the squared log-ratio of a word's voiced time to
# its expected time.
W_ENERGY = 2.0
W_PAUSE = 4.0
W_DURATION = 2.5
# ... and the squared log-ratio of the syllable nuclei a word spans (nuclei.py) to its
# syllables: a count, whatever the speaking rate
W_SYL = 8.0
SYL_EPS = 0.5
# A hop not heard yet costs what the quietest quarter of the audio so far costs: dearer
# pulls boundaries into the audio so far (words sent early), cheaper pushes them past it
# (words sent late); 0, 10, 25 and 50 % were tried on benchmarks/timing_espeak.py.
UNKNOWN_PCT = 25.0
# While the end is unknown and too few nuclei are heard, the rate is searched near the prior
# (the one whose placement fits the audio so far best), once this much audio is in.
RATE_MIN_HOPS = 50
# Once this many syllable nuclei are heard, the rate is the one they say (_nuclei_rate) ...
RATE_MIN_NUCLEI = 3.0
# ... and with a rate given, how many nuclei a syllable makes is decided after this many:
# 2 where the rate and the nuclei heard say at least KAPPA_SWITCH (tried on
# benchmarks/timing_espeak.py: English reads 0.8 to 1.7 early on, eSpeak's Mandarin 1.5 to 2.2)
KAPPA_MIN_NUCLEI = 4.0
KAPPA_SWITCH = 1.75
# A word after punctuation starts where a silence this long ends (a stop's closure is
# shorter, CLOSURE_HOPS), once its nucleus is heard; with no such silence it waits until the
# word before has had its expected time and this much more.
PAUSE_SEEN_HOPS = 12
PAUSE_WAIT_HOPS = 30
RATE_FACTORS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.12, 1.25, 1.4, 1.6, 1.8)
PAUSE_FULL_HOPS = 20  # a silence this long earns the whole punctuation bonus
MIN_WINDOW_HOPS = 25  # a boundary may move at least this far (voiced hops) from its prior place
WINDOW_SHARE = 0.35  # ... or this share of the voiced time to the nearer fixed end
MAX_WINDOW_HOPS = 150  # ... but never more (the programme's cost grows with its square)


@dataclass(frozen=True, slots=True)
class _Envelope:
    """The audio so far as the placement reads it: each 10 ms hop silent or not, its level
    (dB), the silence threshold and the loud level (the 95th percentile)."""

    silent: npt.NDArray[np.bool_]
    db: npt.NDArray[np.float64]
    thr: float
    ref: float


class StreamAligner:
    """Word times of one generation of ``text``, fed its audio chunk by chunk."""

    def __init__(self, text: str, sample_rate: int, hops_per_unit: float | None = None) -> None:
        self.text = text
        self.words: list[Word] = split_words(text)
        self.sample_rate = sample_rate
        self.hop = max(1, round(sample_rate * HOP_S))
        self._hop_s = self.hop / sample_rate
        self._kappa_set = hops_per_unit is None  # no rate given: one nucleus a syllable
        if hops_per_unit is None:
            cjk = sum(1 for w in self.words if len(w.text.strip()) >= 1 and _is_cjk_word(w))
            hops_per_unit = PRIOR_HOPS_PER_CJK if cjk * 2 > len(self.words) else PRIOR_HOPS_PER_UNIT
        self.prior = hops_per_unit
        self._db = np.zeros(0, np.float64)  # per hop, dBFS
        self._band = BandEnvelope(sample_rate, self.hop)  # per hop, vowel-band dB
        self._peaks = np.zeros(0, np.float64)  # per hop: 1 at a syllable nucleus
        # nuclei per text syllable: one, unless a rate measured before says otherwise
        self.kappa = 1.0
        self._density = 0.0  # nuclei per voiced hop so far
        self._rest = np.zeros(0, np.float32)  # samples short of a whole hop
        self.samples = 0
        self.sent: list[WordTime] = []
        self._pos: int | None = None  # hop where the next unsent word may start
        self._anchor: int | None = None  # start hop of the last word sent
        self._heard = 0  # hops of audio when words were last placed
        self.finished = False

    @property
    def measured_rate(self) -> float | None:
        """After the end: the generation's own rate (voiced hops per unit), for the next one
        in the same voice."""
        if not self.finished or self._pos is None or not self.words:
            return None
        db = self._db
        if db.shape[0] == 0:
            return None
        thr = max(float(np.percentile(db, 95)) - SILENCE_DB, FLOOR_DB)
        units = sum(max(w.units, 0.3) for w in self.words)
        voiced = float(np.sum(db >= thr))
        return voiced / units if voiced > 0 else None

    @property
    def pending(self) -> int:
        """Words not sent yet."""
        return len(self.words) - len(self.sent)

    def push(self, pcm: npt.ArrayLike, last: bool = False) -> list[WordTime]:
        """Add the next samples; the words whose start lies in the audio so far (with
        ``last``: every remaining word), each returned once."""
        if self.finished:
            return []
        x = np.asarray(pcm, dtype=np.float32).reshape(-1)
        self.samples += x.shape[0]
        buf = np.concatenate([self._rest, x]) if self._rest.shape[0] else x
        n = buf.shape[0] // self.hop
        if last and buf.shape[0] > n * self.hop:
            n += 1
            buf = np.concatenate([buf, np.zeros(n * self.hop - buf.shape[0], np.float32)])
        if n:
            frames = buf[: n * self.hop].reshape(n, self.hop).astype(np.float64)
            rms = np.sqrt(np.mean(frames * frames, axis=1) + 1e-12)
            self._db = np.concatenate([self._db, 20.0 * np.log10(rms)])
            self._band.push(frames)
        self._rest = buf[n * self.hop :].copy()
        out = self._place(last)
        self.sent.extend(out)
        if last:
            self.finished = True
        return out

    # -- placement ----------------------------------------------------------------------------
    def _place(self, final: bool) -> list[WordTime]:
        todo = self.words[len(self.sent) :]
        if not todo:
            return []
        db = self._db
        h = db.shape[0]
        if h == 0:
            if not final:
                return []
            return [self._word(w, 0, 0) for w in todo]
        ref = float(np.percentile(db, 95))
        thr = max(ref - SILENCE_DB, FLOOR_DB)
        silent = db < thr
        env = _Envelope(silent, db, thr, ref)
        self._peaks = np.zeros(h, np.float64)
        self._peaks[peak_hops(self._band.db)] = 1.0
        self._density = float(self._peaks.sum()) / max(1.0, float(np.sum(~silent)))
        if self._pos is None:
            loud = np.flatnonzero(~silent)
            if loud.shape[0] == 0:  # nothing said yet
                if not final:
                    return []
                return self._even(todo, 0, h)
            self._pos = int(loud[0])
        # The last word sent is placed again with the rest (its start stays as sent): its
        # end was a guess when the audio after it was not there yet, and the next word's
        # start follows from where the audio says it ends (never before its sent end).
        anchored = self._anchor is not None
        start = self._anchor if self._anchor is not None else self._pos
        if not final and self._pos >= h:  # the words sent last reach past the audio so far
            return []
        if final:
            loud = np.flatnonzero(~silent[start:])
            end = start + (int(loud[-1]) + 1 if loud.shape[0] else 0)
            end = max(end, min(h, self._pos + len(todo)), self._pos + 1)
        else:
            end = -1
        words = ([self.words[len(self.sent) - 1]] if anchored else []) + todo
        units = np.array([max(w.units, 0.3) for w in words], np.float64)
        first_min = self._pos - start if anchored else 0
        prior = None
        if not final:
            # audio longer than every remaining word at the prior: slower than the prior
            voiced = float(np.sum(~silent[start:h]))
            floor = voiced / float(units.sum())
            # only the words that may start in the audio so far (at the fastest rate tried)
            # matter now: the rest are placed when their audio comes
            cum = np.concatenate([[0.0], np.cumsum(units)])
            reach = int(np.searchsorted(cum, (voiced + MIN_WINDOW_HOPS) / (self.prior * RATE_FACTORS[0]), "right"))
            n = min(len(words), max(2, reach + 1))
            words, units = words[:n], units[:n]
            prior = self._nuclei_rate(silent, h)
            if prior is None:  # too few nuclei heard yet
                prior = self._fit_rate(words, units, env, start, h, first_min, floor)
            prior = max(prior if prior is not None else self.prior, floor)
            todo = todo[: n - (1 if anchored else 0)]
        bounds, _ = self._programme(words, units, env, start, end, h, first_min, prior)
        if anchored:
            bounds = bounds[1:]
        out: list[WordTime] = []
        starts: list[int] = []
        floor = 0  # end of the word before (hops)
        for i, w in enumerate(todo):
            a, b = bounds[i], bounds[i + 1]
            # a word not sent with an earlier chunk starts in this one: its time never
            # points back into audio the client already has without it
            lo = max(self._pos, self._heard, floor)
            k = len(self.sent) + i
            prev = starts[-1] if starts else self._anchor
            if not final and prev is not None and self.words[k - 1].pause:
                # after punctuation: the word starts where the pause ends, once it is heard
                # (the nuclei may have been miscounted; a pause is plain to see)
                p = _pause_end(silent, prev, h)
                if p is not None:
                    if not np.any(self._peaks[p:h]):
                        break
                    a, b = max(p, lo), max(b, p + 1)
                elif h - prev < (prior or self.prior) * self.words[k - 1].units + PAUSE_WAIT_HOPS:
                    break
            if not final and a >= h:  # its audio is not here yet
                break
            a = max(a, lo)
            a, b = _trim(silent, a, max(b, a + 1), h)
            if not final and a >= h:  # only silence after it so far
                break
            a = _closure(silent, a, lo, w.text)
            floor = b
            if not final:
                b = min(b, max(h, a + 1))  # an end past the audio so far is only a guess
            starts.append(a)
            out.append(self._word(w, a, b, out[-1].end if out else None))
        self._heard = h
        if out:
            self._anchor = starts[-1]
            self._pos = max(_hop_of(out[-1].end, self._hop_s), starts[-1] + 1)
        return out

    def _nuclei_rate(self, silent: npt.NDArray[np.bool_], h: int) -> float | None:
        """While the end is unknown: the speaking rate (voiced hops per unit) the nuclei heard
        so far say, once there are a few (None before): the text's syllables they make, in
        units. Given a rate measured on an earlier generation in the same voice, how many
        nuclei a syllable makes (``kappa``) follows, once a few are heard, from that rate and
        the nuclei per voiced hop: 1, or 2 where it is clearly more (eSpeak's Mandarin)."""
        heard = float(self._peaks[:h].sum())
        if not self._kappa_set:
            if heard < KAPPA_MIN_NUCLEI:
                return self.prior
            syl = sum(max(w.syllables, 0.5) for w in self.words)
            units = sum(max(w.units, 0.3) for w in self.words)
            k = self._density * self.prior * units / syl
            self.kappa = 2.0 if k >= KAPPA_SWITCH else 1.0
            self._kappa_set = True
        if heard < RATE_MIN_NUCLEI:
            return None
        syls = np.concatenate([[0.0], np.cumsum([max(w.syllables, 0.5) for w in self.words])])
        cum = np.concatenate([[0.0], np.cumsum([max(w.units, 0.3) for w in self.words])])
        covered = float(np.interp(heard / self.kappa, syls, cum))
        voiced = float(np.sum(~silent[:h]))
        return voiced / covered if covered > 0 else None

    def _fit_rate(
        self,
        words: list[Word],
        units: npt.NDArray[np.float64],
        env: _Envelope,
        start: int,
        h: int,
        first_min: int,
        floor: float,
    ) -> float | None:
        """While the end is unknown: the speaking rate near the prior whose placement fits the
        audio so far best (boundaries in valleys, durations as expected)."""
        if h - start < RATE_MIN_HOPS or len(words) < 2:
            return None
        best, rate = np.inf, None
        for f in RATE_FACTORS:
            r = max(self.prior * f, floor)
            _, c = self._programme(words, units, env, start, -1, h, first_min, r)
            if c < best:
                best, rate = c, r
        return rate

    def _programme(
        self,
        todo: list[Word],
        units: npt.NDArray[np.float64],
        env: _Envelope,
        start: int,
        end: int,
        h: int,
        first_min: int = 0,
        prior: float | None = None,
    ) -> tuple[list[int], float]:
        """Boundary hops b_0 = start < b_1 < ... < b_m (b_m = end when it is known), and the
        programme's cost. ``prior``: the speaking rate to assume while the end is unknown."""
        silent, db, thr, ref = env.silent, env.db, env.thr, env.ref
        m = len(todo)
        cum = np.concatenate([[0.0], np.cumsum(units)])
        final = end >= 0
        # voiced hops from `start`; beyond the audio so far (streaming) every hop counts
        if final:
            span = end - start
            voiced = (~silent[start:end]).astype(np.float64)
        else:
            rate = prior or self.prior
            span = max(h - start, int(np.ceil(rate * cum[-1] * 1.5)) + 1)
            voiced = np.ones(span, np.float64)
            voiced[: h - start] = (~silent[start:h]).astype(np.float64)
        v = np.concatenate([[0.0], np.cumsum(voiced)])  # v[p]: voiced hops in [start, start+p)
        # syllable nuclei from `start`; beyond the audio so far at the density so far
        nuc = np.full(span, self._density)
        k_nuc = max(0, min(span, h - start))
        nuc[:k_nuc] = self._peaks[start : start + k_nuc]
        nc = np.concatenate([[0.0], np.cumsum(nuc)])
        syl = self.kappa * np.array([max(w.syllables, 0.5) for w in todo], np.float64)
        total = v[-1] if final else None
        if final:
            rate = max(float(v[-1]), 1.0) / cum[-1]
        if m == 1:
            if final:
                return [start, end], 0.0
            return [start, start + int(np.searchsorted(v, rate * cum[1]))], 0.0
        # loudness of each hop, smoothed over 30 ms (0 silent .. 1 loud); see UNKNOWN_PCT
        loudness = np.full(span + 1, 0.5)
        known = min(span, h - start)
        if known > 0:
            sm = np.convolve(np.pad(db[start : start + known], 1, mode="edge"), np.ones(3) / 3, "valid")
            loudness[:known] = np.clip((sm - thr) / max(ref - thr, 1e-6), 0.0, 1.0)
            loudness[known:] = float(np.percentile(loudness[:known], UNKNOWN_PCT))
        run = _silence_runs(silent[start : start + known], span + 1)
        pause_bonus = np.minimum(run, PAUSE_FULL_HOPS) / PAUSE_FULL_HOPS
        # candidates of each inner boundary: a window of voiced time around its prior place
        cands: list[npt.NDArray[np.int64]] = [np.array([0], np.int64)]
        for j in range(1, m):
            e = rate * cum[j]
            near = e if total is None else min(e, total - e)
            w = min(max(MIN_WINDOW_HOPS, WINDOW_SHARE * near), MAX_WINDOW_HOPS)
            lo = int(np.searchsorted(v, e - w, "left"))
            hi = int(np.searchsorted(v, e + w, "right")) - 1
            lo, hi = max(lo, j, first_min if j == 1 else 0), min(hi, span - (m - j) if final else span)
            if hi < lo:
                hi = lo = min(max(j, first_min if j == 1 else 0, int(np.searchsorted(v, e))), span)
            cands.append(np.arange(lo, hi + 1, dtype=np.int64))
        if final:
            cands.append(np.array([span], np.int64))
        cost = np.zeros(1)
        back: list[npt.NDArray[np.int64]] = []
        for j in range(1, len(cands)):
            q, p = cands[j - 1], cands[j]
            d = v[p][None, :] - v[q][:, None]
            e = rate * units[j - 1]
            trans = W_DURATION * np.log((np.maximum(d, 0.0) + 3.0) / (e + 3.0)) ** 2
            dn = np.maximum(nc[p][None, :] - nc[q][:, None], 0.0)
            trans = trans + W_SYL * np.log((dn + SYL_EPS) / (syl[j - 1] + SYL_EPS)) ** 2
            trans = np.where(p[None, :] > q[:, None], trans, np.inf)
            node = W_ENERGY * loudness[p]
            if todo[j - 1].pause and j < m:
                node = node - W_PAUSE * todo[j - 1].pause / 2 * pause_bonus[p]
            if j == m:
                node = np.zeros(p.shape[0])
            total_cost = cost[:, None] + trans
            arg = np.argmin(total_cost, axis=0)
            cost = total_cost[arg, np.arange(p.shape[0])] + node
            back.append(arg)
        k = int(np.argmin(cost))
        best = float(cost[k])
        path = [int(cands[-1][k])]
        for j in range(len(back) - 1, -1, -1):
            k = int(back[j][k])
            path.append(int(cands[j][k]))
        path.reverse()
        if not final:  # the last word's end: its expected voiced time after its start
            path.append(min(span, path[-1] + int(np.searchsorted(v[path[-1] :] - v[path[-1]], rate * units[-1]))))
        return [start + p for p in path], best

    def _even(self, todo: list[Word], a: int, b: int) -> list[WordTime]:
        units = np.array([max(w.units, 0.3) for w in todo])
        edges = a + (b - a) * np.concatenate([[0.0], np.cumsum(units)]) / units.sum()
        out: list[WordTime] = []
        for i, w in enumerate(todo):
            out.append(self._word(w, int(round(edges[i])), int(round(edges[i + 1])), out[-1].end if out else None))
        return out

    def _word(self, w: Word, a: int, b: int, prev_end: float | None = None) -> WordTime:
        # inside the audio so far (the last hop is padded), after the word before
        limit = self.samples / self.sample_rate
        if prev_end is None:
            prev_end = self.sent[-1].end if self.sent else 0.0
        start = max(min(a * self._hop_s, limit), prev_end)
        end = max(min(b * self._hop_s, limit), start)
        return WordTime(w.text, round(start, 4), round(end, 4), w.start_char, w.end_char)


def _hop_of(t: float, hop_s: float) -> int:
    return int(round(t / hop_s))


def _pause_end(silent: npt.NDArray[np.bool_], a: int, h: int) -> int | None:
    """The end of the first silence of at least PAUSE_SEEN_HOPS after hop ``a`` that has
    ended by ``h`` (None: none yet)."""
    quiet = silent[a:h]
    if quiet.shape[0] == 0:
        return None
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    for r0, r1 in zip(edges[::2], edges[1::2], strict=True):
        if r1 - r0 >= PAUSE_SEEN_HOPS and a + r1 < h:
            return int(a + r1)
    return None


def _trim(silent: npt.NDArray[np.bool_], a: int, b: int, h: int) -> tuple[int, int]:
    """Move a word's edges out of the silences it starts or ends in (inside the audio so far)."""
    while a < min(b - 1, h) and silent[a]:
        a += 1
    while b - 1 > a and b - 1 < h and silent[b - 1]:
        b -= 1
    return a, b


_PLOSIVE = set("pbtdkgcqPBTDKGCQ")
CLOSURE_HOPS = 10  # a silence this short before a stop consonant is its closure


def _closure(silent: npt.NDArray[np.bool_], a: int, lo: int, word: str) -> int:
    """A word starting with a stop consonant (p, t, k, b, d, g) begins with the silence of
    its closure: a short silence right before its burst is the word's, not the gap's."""
    first = word.lstrip("\"'“‘«([")[:1]
    if first not in _PLOSIVE or a <= lo or a > silent.shape[0] or not silent[a - 1]:
        return a
    r = a
    while r > lo and silent[r - 1]:
        r -= 1
    return r if a - r <= CLOSURE_HOPS else a


def _silence_runs(silent: npt.NDArray[np.bool_], n: int) -> npt.NDArray[np.float64]:
    """For each hop, the length of the silent run it lies in (0 when loud); ``n`` entries."""
    out = np.zeros(n)
    k = silent.shape[0]
    i = 0
    while i < k:
        if not silent[i]:
            i += 1
            continue
        j = i
        while j < k and silent[j]:
            j += 1
        out[i : j + 1] = j - i  # the hop right after the run is its end: a boundary there too
        i = j
    return out


def _is_cjk_word(w: Word) -> bool:
    ch = w.text.strip()[:1]
    return bool(ch) and ("\u3400" <= ch <= "\u9fff" or "\u3040" <= ch <= "\u30ff" or "\uf900" <= ch <= "\ufaff")


def align_words(text: str, pcm: npt.ArrayLike, sample_rate: int) -> list[WordTime]:
    """The whole generation at once (what :meth:`StreamAligner.push` gives with ``last``)."""
    return StreamAligner(text, sample_rate).push(pcm, last=True)
