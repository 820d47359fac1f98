"""Text normalisation's speed: one mixed paragraph, and the same paragraph repeated.

Step by step:

1. normalises a paragraph that exercises most rules (CJK and Latin, a URL, an e-mail
   address, arrows, a version number, list items, repeated punctuation) once to warm up;
2. times ``--runs`` calls on it, then on the paragraph repeated 8 and 64 times;
3. prints microseconds per paragraph at each length: the three should be about equal (time
   linear in the text; a rule that backtracks shows up as a growing figure).

A benchmark: it reports, it asserts nothing (a wall-clock bound in the suite failed on a
busy 2-core machine). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time

from streamtts.text.normalize import normalize_text

PARAGRAPH = (
    "【公告】MaaS 主链遵循请求接入 -> 身份与策略判定 -> 域服务处理 -> 推理编排 -> 运行时执行。"
    "Dashboard 不直接承载单次在线推理请求，而是负责统一配置、统一治理和统一展示！！！"
    "详见 https://github.com/example/release 或者发邮件到 ops+tts@example.ai…… "
    "版本 v2.3.1 (Build 15) 已经发布——请升级。\n- 修复 .map 泄露\n- 发布 v2.3.1"
)


def per_paragraph_us(repeat: int, runs: int) -> float:
    text = "\n".join([PARAGRAPH] * repeat)
    normalize_text(text)
    start = time.perf_counter()
    for _ in range(runs):
        normalize_text(text)
    return (time.perf_counter() - start) / runs / repeat * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="calls timed at each length")
    args = ap.parse_args()
    for repeat in (1, 8, 64):
        runs = max(1, args.runs // repeat)
        print(f"x{repeat:<3} {per_paragraph_us(repeat, runs):8.0f} us per paragraph")


if __name__ == "__main__":
    main()
