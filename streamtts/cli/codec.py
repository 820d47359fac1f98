"""``streamtts codec build | decode``: build the codec decoder graphs, stream codes through one.

``add_parser(sub)`` adds the ``codec`` command to the main CLI; ``main(argv)`` runs the
same commands on their own (``python -m streamtts.cli.codec build --weights DIR``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, StreamTTSError
from .common import load_config_or_demo

log = logging.getLogger(__name__)

_DTYPES = ("float32", "float16")


def _add_commands(csub: Any) -> None:
    b = csub.add_parser(
        "build",
        help="build the exact streaming codec decoder (and the offline one) from the weights",
        description="Read a MOSS-Audio-Tokenizer checkpoint (config.json + model.safetensors) and "
        "write ONNX decoder graphs, without torch.",
    )
    b.add_argument(
        "--weights", required=True, help="checkpoint folder (config.json, model.safetensors)"
    )
    b.add_argument(
        "--out", help="streaming decoder to write (default: WEIGHTS/decoder_streaming.onnx)"
    )
    b.add_argument(
        "--offline-out", help="also write the offline decoder (official I/O contract) here"
    )
    b.add_argument(
        "--dtype", choices=_DTYPES, default="float32", help="storage type of the weights"
    )
    b.add_argument(
        "--n-vq",
        type=int,
        help="codebooks the decoders take: the model's n_vq (its config.json; 16 for TTSD, "
        "VoiceGenerator, SoundEffect), the codec's first N levels (default: all, 32)",
    )
    b.set_defaults(handler=_build)

    d = csub.add_parser(
        "decode",
        help="stream a code file through the streaming decoder in a chunk pattern",
        description="Decode codes (a .npy of shape (n_vq, B, T) or (T, n_vq)) chunk by chunk, as "
        "a stream would arrive, and write the PCM (.npy: (B, T*1920), or (T*1920,) for (T, n_vq)).",
    )
    d.add_argument("--decoder", required=True, help="decoder_streaming.onnx")
    d.add_argument(
        "--codes", required=True, help="codes .npy: (n_vq, B, T) or (T, n_vq) integers"
    )
    d.add_argument(
        "--chunks",
        default="1",
        help="frames per call, comma separated; the last repeats (default 1)",
    )
    d.add_argument("--out", required=True, help="PCM .npy to write (float32, 24 kHz)")
    d.add_argument("--weights", help="checkpoint folder: refuse a decoder built from other weights")
    d.add_argument(
        "--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0 = default)"
    )
    d.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the state tables live and the graph runs (cuda: onnxruntime-gpu)",
    )
    d.set_defaults(handler=_decode)


# `streamtts build-engine`'s options, one row each
_BUILD_ENGINE_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--kind", {"choices": ["decoder", "encoder", "streaming"], "default": "decoder",
                "help": "decoder (streaming windows), encoder (reference clips, batch 1) or streaming "
                "(the exact stateful decoder, decoder_streaming.onnx)"}),
    ("--slots", {"type": int, "help": "streaming: stream slots in the engine's state tables (default: the "
                 "config's max_streams)"}),
    ("--max-reference-seconds", {"type": float, "default": 40.0, "help": "encoder: longest clip"}),
    ("--config", {"help": "YAML config: takes audio_decoder_onnx / audio_decoder_trt from it; default: the "
                  "demo model (unless --onnx is given)"}),
    ("--onnx", {"help": "decoder.onnx (default: the config's audio_decoder_onnx; streaming: "
                "decoder_streaming.onnx beside it)"}),
    ("--out", {"help": "engine file (default: the config's audio_decoder_trt, else decoder.engine next to the ONNX)"}),
    ("--max-batch", {"type": int, "default": 32, "help": "largest batch of windows (the scheduler's codec batch)"}),
    ("--batch-buckets", {"type": int, "nargs": "+", "help": "upper batch bound of each profile (default 1 4 16 <max>)"}),
    ("--context-frames", {"type": int, "default": 125, "help": "left context per streaming window"}),
    ("--chunk-frames", {"type": int, "default": 8, "help": "largest number of new frames per window"}),
    ("--max-frames", {"type": int, "help": "longest window in frames (default context + chunk; streaming: most "
                      "new frames per call, default 16)"}),
    ("--precision", {"choices": ["tf32", "fp32", "fp16"], "default": "tf32", "help": "TensorRT precision"}),
    ("--workspace-gb", {"type": float, "default": 4.0, "help": "TensorRT builder workspace"}),
    ("--dry-run", {"action": "store_true", "help": "print the profiles and buffer plan, build nothing"}),
)  # fmt: skip


def add_parser(sub: Any) -> None:
    """The ``codec`` and ``build-engine`` commands of the main CLI."""
    b = sub.add_parser(
        "build-engine", help="build a TensorRT engine for the codec decoder (needs a GPU)"
    )
    for flag, opts in _BUILD_ENGINE_FLAGS:
        b.add_argument(flag, **opts)
    b.set_defaults(handler=_build_engine, check=_check_build_engine)


    p = sub.add_parser("codec", help="exact streaming codec decoder: build, decode")
    _add_commands(
        p.add_subparsers(
            dest="codec_cmd",
            required=True,
            metavar="{build,decode}",
            help="build: the decoders from a checkpoint; decode: a code file through one",
        )
    )


def _build(args: argparse.Namespace) -> int:
    from ..codec.build.decoders import build_decoders

    r = build_decoders(
        args.weights,
        out=args.out,
        offline_out=args.offline_out,
        dtype=args.dtype,
        progress=sys.stderr.isatty(),
        n_vq=args.n_vq,
    )
    for what, path in (("streaming", r.streaming), ("offline", r.offline)):
        if path is not None:
            print(f"wrote {path} ({what}, {r.dtype})")
    print(
        f"{r.arch.describe()}; {r.arch.quantizer.n_q} codebooks\n"
        f"state per stream slot: {r.state_bytes_per_slot / 1e6:.1f} MB; built in {r.seconds:.1f} s"
    )
    return 0


def parse_chunks(text: str) -> list[int]:
    try:
        chunks = [int(c) for c in text.split(",") if c.strip()]
    except ValueError as exc:
        raise ConfigError(f"--chunks {text!r}: expected comma separated frame counts") from exc
    if not chunks or min(chunks) < 1:
        raise ConfigError(f"--chunks {text!r}: expected positive frame counts, e.g. 1,2,4,8")
    return chunks


def load_codes(path: str | Path, n_vq: int = 32) -> tuple[np.ndarray, bool]:
    """A code file as (B, T, n_vq) int64; True when it was (T, n_vq) (one stream)."""
    try:
        codes = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read codes: {exc}") from exc
    if codes.ndim == 2 and codes.shape[1] == n_vq:
        return codes[None].astype(np.int64), True
    if codes.ndim == 3 and codes.shape[0] == n_vq:
        return np.ascontiguousarray(codes.transpose(1, 2, 0)).astype(np.int64), False
    raise ConfigError(
        f"{path}: codes of shape {codes.shape}; expected ({n_vq}, B, T) or (T, {n_vq}) "
        f"(the decoder's n_vq)"
    )


def stream_decode(decoder: Any, codes: np.ndarray, chunks: list[int]) -> np.ndarray:
    """Decode (B, T, n_vq) codes as B streams fed ``chunks`` frames per call -> (B, T*1920)."""
    b, t, _ = codes.shape
    slots = [decoder.acquire() for _ in range(b)]
    parts: list[np.ndarray] = []
    done, k = 0, 0
    try:
        while done < t:
            n = min(chunks[min(k, len(chunks) - 1)], t - done)
            parts.append(decoder.decode(slots, codes[:, done : done + n]))
            done += n
            k += 1
    finally:
        for s in slots:
            decoder.release(s)
    return np.concatenate(parts, axis=1) if parts else np.zeros((b, 0), np.float32)


def decoder_n_vq(path: str | Path) -> int:
    """The codebooks a streaming decoder takes (its build metadata; 32 when unreadable:
    loading it then says what is wrong)."""
    import json

    from ..codec.build.tensorrt import streaming_onnx_meta
    from ..codec.stamp import KEY_LAYOUT

    try:
        return int(json.loads(streaming_onnx_meta(Path(path))[KEY_LAYOUT])["n_q"])
    except (StreamTTSError, OSError, KeyError, TypeError, ValueError):
        return 32


def _decode(args: argparse.Namespace) -> int:
    from ..codec.streaming import StreamingDecoder

    chunks = parse_chunks(args.chunks)
    codes, single = load_codes(args.codes, decoder_n_vq(args.decoder))
    dec = StreamingDecoder(
        args.decoder,
        n_slots=codes.shape[0],
        weights=args.weights,
        threads=args.threads,
        device=args.device,
    )
    if args.device != "cpu":
        dec.self_check()
    t0 = time.perf_counter()
    pcm = stream_decode(dec, codes, chunks)
    dt = time.perf_counter() - t0
    np.save(args.out, pcm[0] if single else pcm)
    audio_s = codes.shape[1] * dec.frame_samples / dec.sampling_rate
    print(
        f"wrote {args.out}: {codes.shape[0]} stream(s) x {audio_s:.2f} s in {dt:.2f} s "
        f"(chunks {args.chunks}; RTF {dt / max(audio_s, 1e-9):.3f} per stream batch)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamtts codec", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    _add_commands(parser.add_subparsers(dest="codec_cmd", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    try:
        return int(args.handler(args))
    except StreamTTSError as exc:
        print(f"streamtts codec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def _check_build_engine(args: argparse.Namespace) -> None:
    from .common import check_config, check_input_file, check_output_file

    check_config(args)
    check_input_file(args.onnx, "--onnx")
    check_output_file(args.out, "--out", audio=False)


def _build_engine(args: argparse.Namespace) -> int:
    from ..codec import model_n_vq
    from ..codec.build.tensorrt import BuildOptions, build_engine, describe_plan
    from ..constants import N_VQ

    cfg = load_config_or_demo(args.config, demo=not args.onnx)
    kind = args.kind
    if kind == "streaming":
        return _build_streaming_engine(args, cfg)
    onnx = args.onnx or (getattr(cfg, f"audio_{kind}_onnx") if cfg else "")
    if not onnx:
        raise ConfigError(
            f"streamtts build-engine needs --onnx or a --config with audio_{kind}_onnx"
        )
    out = args.out or (getattr(cfg, f"audio_{kind}_trt") if cfg else "")
    out = out or str(Path(onnx).with_name(f"{kind}.engine"))
    opts = BuildOptions(
        max_batch=args.max_batch,
        batch_buckets=tuple(args.batch_buckets) if args.batch_buckets else None,
        context_frames=args.context_frames,
        chunk_frames=args.chunk_frames,
        max_frames=args.max_frames,
        precision=args.precision,
        workspace_bytes=int(args.workspace_gb * (1 << 30)),
        max_reference_seconds=args.max_reference_seconds,
        n_vq=model_n_vq(cfg) if cfg is not None else N_VQ,  # the model's codebooks
    )
    print(describe_plan(opts, kind))
    if args.dry_run:
        return 0
    t0 = time.monotonic()
    path = build_engine(onnx, out, opts, kind)
    print(f"wrote {path} in {time.monotonic() - t0:.0f} s")
    print("use it with:")
    print("  audio_backend: trt")
    print(f"  audio_{kind}_trt: {path}")
    return 0


def _build_streaming_engine(args: argparse.Namespace, cfg: Any) -> int:
    from ..codec import STREAMING_NAME
    from ..codec.build.tensorrt import BuildOptions, build_streaming_engine, describe_streaming_plan

    onnx = args.onnx
    if not onnx and cfg is not None:
        named = str(cfg.codec_streaming or "")
        onnx = named if named.endswith(".onnx") else ""
        if not onnx and cfg.audio_decoder_onnx:
            onnx = str(Path(cfg.audio_decoder_onnx).with_name(STREAMING_NAME))
    if not onnx:
        raise ConfigError(
            "streamtts build-engine --kind streaming needs --onnx decoder_streaming.onnx or a "
            "--config with audio_decoder_onnx (the streaming graph beside it)"
        )
    slots = args.slots or (cfg.max_streams if cfg is not None else 32)
    out = args.out or str(Path(onnx).with_suffix(".engine"))
    opts = BuildOptions(
        max_batch=min(args.max_batch, slots),
        batch_buckets=tuple(args.batch_buckets) if args.batch_buckets else None,
        chunk_frames=args.chunk_frames,
        precision=args.precision,
        workspace_bytes=int(args.workspace_gb * (1 << 30)),
    )
    max_frames = args.max_frames or 16
    print(describe_streaming_plan(opts, slots, max_frames))
    if args.dry_run:
        return 0
    t0 = time.monotonic()
    path = build_streaming_engine(onnx, out, opts, slots, max_frames)
    print(f"wrote {path} (and {path.name}.json) in {time.monotonic() - t0:.0f} s")
    print("use it with:")
    print("  audio_backend: trt")
    print(f"  codec_streaming: {path}   # or leave it beside audio_decoder_trt")
    return 0
