"""Command line: ``streamtts synth | speak | demo-model | bench | serve | say | ...``.

The only module that prints; everything else logs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

import msgspec

from .config import SamplingParams
from .constants import SAMPLE_RATE
from .errors import PlaybackError, StreamTTSError

log = logging.getLogger("streamtts")

SAMPLING_FLAGS = (
    ("--text-temperature", float, "text_temperature"),
    ("--text-top-k", int, "text_top_k"),
    ("--text-top-p", float, "text_top_p"),
    ("--audio-temperature", float, "audio_temperature"),
    ("--audio-top-k", int, "audio_top_k"),
    ("--audio-top-p", float, "audio_top_p"),
    ("--audio-repetition-penalty", float, "audio_repetition_penalty"),
)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * verbose if verbose else logging.INFO
    try:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, rich_tracebacks=False, log_time_format="%X")
        fmt = "%(message)s"
    except ImportError:  # pragma: no cover
        handler = logging.StreamHandler()
        fmt = "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=max(level, logging.DEBUG), format=fmt, handlers=[handler])


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (official MOSS-TTS llama.cpp keys work); default: the demo model")
    p.add_argument("--max-streams", type=int, help="override max_streams")
    p.add_argument("--n-threads", type=int, help="override n_threads")


def _add_request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reference", help="reference voice clip (wav/flac/ogg) to clone")
    p.add_argument("--language", help="language tag for the prompt, e.g. en, zh")
    p.add_argument("--instruction", help="style instruction for the prompt")
    p.add_argument("--tokens", type=int, help="desired duration in audio frames (12.5 per second)")
    p.add_argument("--seed", type=int, help="sampling seed (reproducible per request)")
    p.add_argument("--max-new-tokens", type=int, help="generation steps at most")
    for flag, typ, _ in SAMPLING_FLAGS:
        p.add_argument(flag, type=typ, help="0 temperature = greedy" if "temperature" in flag else None)
    p.add_argument("--greedy", action="store_true", help="both temperatures 0")
    p.add_argument("--no-normalize", action="store_true", help="skip text normalisation")
    p.add_argument("--profile", action="store_true", help="print per-stage timings and stream numbers")


def _engine(args: argparse.Namespace) -> Any:
    from .engine.frontend import Engine

    if not args.config:
        print("streamtts: no --config given: using the synthetic demo model (random weights, soft tones)", file=sys.stderr)
    return Engine.from_config(args.config, max_streams=args.max_streams, n_threads=args.n_threads)


def _options(args: argparse.Namespace, engine: Any) -> Any:
    from .request import StreamOptions

    base = engine.config.sampling
    changes = {name: getattr(args, name) for _, _, name in SAMPLING_FLAGS if getattr(args, name) is not None}
    if args.greedy:
        changes.update(text_temperature=0.0, audio_temperature=0.0)
    sampling: SamplingParams = msgspec.structs.replace(base, **changes).validate()
    return StreamOptions(
        language=args.language,
        instruction=args.instruction,
        tokens=args.tokens,
        seed=args.seed,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        normalize=False if args.no_normalize else None,
    )


def _print_profile(engine: Any, stats: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    d = stats.as_dict()
    prof = engine.step_profile()
    t = Table(title="streamtts profile", show_header=True)
    t.add_column("stage")
    t.add_column("ms", justify="right")
    t.add_row("prompt (normalise, tokenise, reference, embed)", f"{d['prepare_ms']:.1f}")
    t.add_row("prefill", f"{d['prefill_ms'] or 0:.1f}")
    t.add_row(f"steps ({d['steps']})", f"{d['ms_per_step'] * d['steps']:.1f}")
    for k, v in prof.items():
        t.add_row(f"  per step: {k}", f"{v:.3f}")
    t.add_row(f"codec decode ({d['decode_windows']} windows)", f"{d['decode_ms']:.1f}")
    t.add_row("time to first audio", f"{d['ttfa_ms']:.1f}")
    t.add_row("ms per step", f"{d['ms_per_step']:.2f}")
    t.add_row("audio seconds", f"{d['audio_s']:.2f}")
    t.add_row("real-time factor", f"{d['rtf']:.3f}")
    Console(stderr=True).print(t)


# -- synth ---------------------------------------------------------------------------------------
async def _synth(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .audio.reference import loudness_normalize

    engine = _engine(args)
    async with engine:
        opts = _options(args, engine)
        ref = await engine.encode_voice(args.reference) if args.reference else None
        s = engine.stream(args.text, reference=ref, options=opts)
        pcm: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True) as prog:
            task = prog.add_task("generating", total=None)
            async with s:
                async for chunk in s:
                    pcm.append(chunk.pcm)
                    codes.append(chunk.codes)
                    prog.update(task, description=f"generating: {len(codes) and sum(len(c) for c in codes)} frames")
        wav = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
        frames = np.concatenate(codes) if codes else np.zeros((0, engine.ids.n_vq), np.int64)
        if wav.size == 0:
            print("streamtts: the model produced no audio frames", file=sys.stderr)
            return 1
        out = wav if args.no_loudness else loudness_normalize(wav)
        sf.write(args.out, out, SAMPLE_RATE, subtype="PCM_16" if args.out.endswith(".wav") else None)
        if args.codes_out:
            np.save(args.codes_out, frames.astype(np.int64))
        st = s.stats
        print(
            f"wrote {args.out}: {frames.shape[0]} frames, {wav.size / SAMPLE_RATE:.2f} s "
            f"(TTFA {1000 * st.ttfa_s:.0f} ms, RTF {st.rtf:.3f}, {st.finish_reason})"
        )
        if args.profile:
            _print_profile(engine, st)
    return 0


# -- speak ---------------------------------------------------------------------------------------
async def _speak(args: argparse.Namespace) -> int:
    from .audio import playback as player
    from .audio.devices import list_devices

    if args.list_devices:
        print(list_devices())
        return 0
    text = sys.stdin.read() if args.text == "-" else args.text
    engine = _engine(args)
    async with engine:
        opts = _options(args, engine)
        ref = await engine.encode_voice(args.reference) if args.reference else None
        s = engine.stream(text, reference=ref, options=opts)

        async def pcm_chunks() -> Any:
            async with s:
                async for chunk in s:
                    yield chunk.pcm

        try:
            report = await player.play(pcm_chunks(), device=args.output_device, save=args.save)
        except PlaybackError as exc:
            if not args.save:
                raise
            # No sound card: still produce the requested file from the same stream.
            import numpy as np
            import soundfile as sf

            print(f"streamtts: {exc}; writing {args.save} instead", file=sys.stderr)
            pcm = [c async for c in pcm_chunks()]
            sf.write(args.save, np.concatenate(pcm) if pcm else np.zeros(0, np.float32), SAMPLE_RATE)
            return 0
        print(report.summary(), file=sys.stderr)
        if args.profile:
            _print_profile(engine, s.stats)
    return 0


def _demo_model(args: argparse.Namespace) -> int:
    from .demo.model import demo_model_main

    demo_model_main(args.dir, args.preset, args.seed, codec=args.codec)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamtts", description="Real-time streaming TTS for MOSS-TTS-Delay.")
    p.add_argument("-v", "--verbose", action="count", default=0)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("synth", help="synthesise text to a file")
    _add_model_args(s)
    s.add_argument("--text", required=True)
    s.add_argument("--out", default="out.wav")
    s.add_argument("--codes-out", help="write the de-delayed (T, 32) int64 codes as .npy")
    s.add_argument("--no-loudness", action="store_true", help="skip the whole-file loudness normalisation")
    _add_request_args(s)

    sp = sub.add_parser("speak", help="speak text through the speakers as it is generated")
    _add_model_args(sp)
    sp.add_argument("text", nargs="?", default="Hello! This is streamtts, speaking while it thinks.", help="text, or - for stdin")
    sp.add_argument("--output-device", help="output device index or name substring")
    sp.add_argument("--list-devices", action="store_true")
    sp.add_argument("--save", help="also write what was played to this wav file")
    _add_request_args(sp)

    d = sub.add_parser("demo-model", help="write the synthetic demo model (official layout)")
    d.add_argument("dir")
    d.add_argument("--preset", default="tiny", choices=["tiny", "mid"])
    d.add_argument("--seed", type=int, default=0)
    d.add_argument(
        "--codec", default="tones", choices=["tones", "real"],
        help="tones: a toy decoder of soft tones; real: the real decoder architecture "
        "(small, random weights) with its exact streaming graph",
    )

    _add_convert_hf(sub)

    from . import bench

    bench.add_parser(sub)
    _add_optional_commands(sub)
    return p


# -- convert-hf (the work is in model/convert_hf.py) -------------------------------------------------
def _add_convert_hf(sub: Any) -> None:
    c = sub.add_parser(
        "convert-hf",
        help="convert the original MOSS-TTS-Delay checkpoint into the published GGUF bundle (no torch)",
    )
    c.add_argument("src", help="checkpoint folder (config.json, model*.safetensors, tokenizer) or hub id")
    c.add_argument("--out", required=True, help="bundle folder (MOSS_TTS_<QUANT>.gguf, embeddings/, lm_heads/, ...)")
    c.add_argument(
        "--quant", action="append",
        help="GGUF type to write, repeatable: Q4_K_M (default), Q5_K_M, Q6_K, Q8_0, F16, ...; the first is the config's",
    )  # fmt: skip
    c.add_argument("--fused", action="store_true", help="also write the fused-heads GGUF (streamtts convert) of the first --quant")
    c.add_argument("--keep-f16", action="store_true", help="keep the F16 GGUF the quantizer reads")
    c.add_argument("--threads", type=int, default=0, help="llama.cpp quantizer threads (0: all cores)")
    c.add_argument("--revision", help="hub revision when SRC is a hub id")
    c.set_defaults(handler=_convert_hf)


def _convert_hf(args: argparse.Namespace) -> int:
    from .model.convert_hf import convert_hf, rich_progress

    with rich_progress() as progress:
        res = convert_hf(
            args.src, args.out, args.quant or ["Q4_K_M"], fused=args.fused, keep_f16=args.keep_f16,
            n_threads=args.threads, revision=args.revision, progress=progress,
        )  # fmt: skip
    print(
        f"wrote {len(res.written)} file(s) into {res.out_dir} in {res.seconds:.1f} s "
        f"({len(res.skipped)} already there); config: {res.config_yaml}"
    )
    return 0


def _add_optional_commands(sub: Any) -> None:
    """Commands that live in their own modules (server, client, GPU tools, codec build)."""
    for name in ("serve_cli", "client_cli", "gpu_cli", "codec_cli"):
        try:
            mod = __import__(f"streamtts.{name}", fromlist=["add_parser"])
        except ImportError as exc:
            if getattr(exc, "name", "") and str(exc.name).startswith("streamtts"):
                continue
            raise
        mod.add_parser(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        if args.cmd == "synth":
            return asyncio.run(_synth(args))
        if args.cmd == "speak":
            return asyncio.run(_speak(args))
        if args.cmd == "demo-model":
            return _demo_model(args)
        handler = getattr(args, "handler", None)
        if handler is None:  # pragma: no cover
            parser.error(f"unknown command {args.cmd}")
        result = handler(args)
        return int(asyncio.run(result) if asyncio.iscoroutine(result) else result or 0)
    except StreamTTSError as exc:
        print(f"streamtts: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("streamtts: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
