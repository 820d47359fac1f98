"""``streamtts demo-model``: write the synthetic demo model (official layout)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..core.family import MEMBERS
from ..errors import UsageError


def _check_demo_model(args: argparse.Namespace) -> None:
    d = Path(args.dir).expanduser()
    if d.exists() and not d.is_dir():
        raise UsageError(f"DIR {args.dir}: exists and is not a folder")
    if not d.parent.is_dir():
        raise UsageError(f"DIR {args.dir}: folder {d.parent} does not exist (create it: mkdir -p {d.parent})")
    if args.n_vq is not None and not 3 <= args.n_vq <= 32:
        raise UsageError(f"--n-vq {args.n_vq}: expected 3..32 (the codec's levels; 16 or 32 in the family)")
    if args.member is not None and args.n_vq is not None:
        from ..core.family import MEMBERS

        m = MEMBERS[args.member]
        if args.n_vq != m.n_vq:
            raise UsageError(f"--n-vq {args.n_vq} --member {args.member}: {m.title} has {m.n_vq} codebooks (drop --n-vq)")


def _demo_model(args: argparse.Namespace) -> int:
    import time

    from ..demo.model import write_demo_model

    t0 = time.perf_counter()
    cfg = write_demo_model(args.dir, args.preset, args.seed, codec=args.codec, n_vq=args.n_vq, member=args.member)
    size = sum(f.stat().st_size for f in Path(args.dir).rglob("*") if f.is_file())
    what = f"{args.preset} {args.member} demo model" if args.member else f"{args.preset} demo model"
    print(f"wrote the {what} ({size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    print(f"try it: streamtts synth --config {cfg} --text 'Hello there.' --out hello.wav")
    return 0


def add_parser(sub: Any) -> None:
    d = sub.add_parser("demo-model", help="write the synthetic demo model (official layout)")
    d.add_argument("dir", help="folder to write it into (config.yaml + the official layout)")
    d.add_argument("--preset", default="tiny", choices=["tiny", "mid", "deep"],
                   help="tiny: seconds to write; mid: 1024 wide, 24 layers, Q4_0 (benchmarks); "
                   "deep: 512 wide, 36 layers, Q8_0 (benchmarks)")
    d.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    d.add_argument(
        "--codec", default="tones", choices=["tones", "real"],
        help="tones: a toy decoder of soft tones; real: the real decoder architecture "
        "(small, random weights) with its exact streaming graph",
    )
    d.add_argument(
        "--n-vq", type=int, default=None,
        help="codebooks per frame: 32 (MOSS-TTS, the default) or 16 (as TTSD, VoiceGenerator, SoundEffect)",
    )  # fmt: skip
    d.add_argument(
        "--member", default=None, choices=list(MEMBERS),
        help="the family member it stands in for: its codebooks, template, presets and normaliser "
        "(its config.json names the member, as a converted bundle's does)",
    )  # fmt: skip
    d.set_defaults(handler=_demo_model, check=_check_demo_model)
