"""Word timing (streamtts.timing) against eSpeak NG's own word boundaries.

eSpeak NG speaks English and Chinese sentences and reports where each word starts (its
WORD events, benchmarks/espeak_words.py); the estimator gets only eSpeak's audio and the
text, fed in 80 ms chunks as the engine feeds it. The error of a word is |estimated start -
eSpeak's start|, over every word but each sentence's first (that one is the speech onset).
Three ways the estimator runs:

* ``stream``: as a first segment is streamed: the speaking rate is the prior until the end;
* ``stream, rate known``: as later segments of a session are: the rate measured on the
  previous sentence in the same voice (segmented.py passes it on);
* ``whole``: the generation's end known from the start (what the last chunk's words get).

    python benchmarks/timing_espeak.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's streamtts and benchmarks
from benchmarks.espeak_words import available, speak  # noqa: E402
from streamtts.timing import StreamAligner  # noqa: E402

ENGLISH = [
    "Hello there, my friend. How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Voice agents need word timestamps so that an interrupted reply keeps only the words the user heard.",
    "I would like a large coffee with milk, two sugars, and a blueberry muffin, please.",
    "On Monday morning the weather was cold and windy, but by the afternoon the sun came out.",
    "Please call me back when you get this message, I will be at home all evening.",
    "The meeting has been moved to Thursday at three o'clock in the large conference room.",
    "She opened the window, looked outside, and decided to take a long walk along the river.",
    "Our new product helps small teams plan their work and share what they have learned.",
    "If you have any questions about your order, our support team is happy to help.",
]
CHINESE = [
    "你好，我的朋友。今天天气很好。",
    "我们明天早上八点在火车站见面。",
    "这个问题比我想象的要复杂得多，但是我们一定能够解决。",
    "请在下班之前把报告发给我，谢谢。",
    "他每天早上都会去公园跑步，然后回家吃早饭。",
]
CHUNK_S = 0.08  # one audio frame of the codec


def errors(texts: list[str], voice: str, mode: str) -> list[float]:
    out: list[float] = []
    rate: float | None = None
    for text in texts:
        pcm, sr, ref = speak(text, voice)
        al = StreamAligner(text, sr, rate if mode == "stream, rate known" else None)
        if mode == "whole":
            words = al.push(pcm, last=True)
        else:
            step = int(round(CHUNK_S * sr))
            words = []
            for i in range(0, pcm.shape[0], step):
                words += al.push(pcm[i : i + step], last=i + step >= pcm.shape[0])
        rate = al.measured_rate
        starts = {r.char: r.start for r in ref}
        for w in words[1:]:
            inside = [c for c in starts if w.start_char <= c < w.end_char]
            if inside:
                out.append(1000.0 * abs(w.start - starts[min(inside)]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not available():
        print("espeak-ng is not installed (apt-get install espeak-ng)", file=sys.stderr)
        return 1
    rows = []
    for lang, voice, texts in (("English", "en", ENGLISH), ("Chinese", "cmn", CHINESE)):
        for mode in ("stream", "stream, rate known", "whole"):
            e = np.array(errors(texts, voice, mode))
            rows.append({
                "language": lang, "mode": mode, "words": int(e.shape[0]),
                "median_ms": round(float(np.median(e)), 1), "p90_ms": round(float(np.percentile(e, 90)), 1),
            })  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'language':8s} {'mode':20s} {'words':>5s} {'median ms':>9s} {'p90 ms':>7s}")
        for r in rows:
            print(f"{r['language']:8s} {r['mode']:20s} {r['words']:5d} {r['median_ms']:9.1f} {r['p90_ms']:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
