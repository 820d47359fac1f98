"""Commands for the GPU path: ``streamtts convert | build-engine | download``.

Registered by ``cli._add_optional_commands``. Handlers print (this is CLI output);
the work is in ``fused.py``, ``codec/trt_build.py`` and ``download.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .errors import ConfigError, UsageError


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "convert",
        help="write a fused-heads GGUF (head logits computed by llama.cpp in the backbone's graph)",
    )
    c.add_argument(
        "--config", help="YAML config: takes backbone_gguf and lm_head_dir from it; default: the "
        "demo model (unless --gguf and --lm-heads are given)",
    )  # fmt: skip
    c.add_argument("--gguf", help="source backbone GGUF (default: the config's backbone_gguf)")
    c.add_argument(
        "--lm-heads", help="folder with lm_head_audio_XX.npy (default: the config's lm_head_dir)"
    )
    c.add_argument(
        "--out", help="output file (default: <backbone>.fused.gguf, picked up automatically)"
    )
    c.add_argument(
        "--include-text-head", action="store_true", help="also append the full text head"
    )
    c.add_argument(
        "--audio-dtype", choices=["f16", "f32", "text"], default="f16",
        help="type of the fused output layer: f16 (as published, half the memory) or f32 "
        "(llama.cpp's CPU matmul then keeps the hidden state in f32, like the NumPy heads); "
        "text: no audio rows, only the gen/delay rows in the backbone's own type (what the "
        "engine writes for itself on CPU; the audio heads stay in NumPy)",
    )  # fmt: skip
    c.add_argument(
        "--text-source", choices=["gguf", "npy"], default="gguf",
        help="gen/delay text rows from the GGUF's output layer (default; what the NumPy-heads "
        "engine uses) or from lm_head_text.npy",
    )  # fmt: skip
    c.set_defaults(handler=_convert, check=_check_convert)

    b = sub.add_parser(
        "build-engine", help="build a TensorRT engine for the codec decoder (needs a GPU)"
    )
    b.add_argument(
        "--kind", choices=["decoder", "encoder", "streaming"], default="decoder",
        help="decoder (streaming windows), encoder (reference clips, batch 1) or streaming "
        "(the exact stateful decoder, decoder_streaming.onnx)",
    )  # fmt: skip
    b.add_argument(
        "--slots", type=int,
        help="streaming: stream slots in the engine's state tables (default: the config's "
        "max_streams)",
    )  # fmt: skip
    b.add_argument(
        "--max-reference-seconds", type=float, default=40.0, help="encoder: longest clip"
    )
    b.add_argument(
        "--config", help="YAML config: takes audio_decoder_onnx / audio_decoder_trt from it; "
        "default: the demo model (unless --onnx is given)",
    )  # fmt: skip
    b.add_argument(
        "--onnx", help="decoder.onnx (default: the config's audio_decoder_onnx; streaming: "
        "decoder_streaming.onnx beside it)",
    )  # fmt: skip
    b.add_argument(
        "--out",
        help="engine file (default: the config's audio_decoder_trt, else decoder.engine next to the ONNX)",
    )
    b.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="largest batch of windows (the scheduler's codec batch)",
    )
    b.add_argument(
        "--batch-buckets",
        type=int,
        nargs="+",
        help="upper batch bound of each profile (default 1 4 16 <max>)",
    )
    b.add_argument(
        "--context-frames", type=int, default=125, help="left context per streaming window"
    )
    b.add_argument(
        "--chunk-frames", type=int, default=8, help="largest number of new frames per window"
    )
    b.add_argument(
        "--max-frames", type=int,
        help="longest window in frames (default context + chunk; streaming: most new frames "
        "per call, default 16)",
    )  # fmt: skip
    b.add_argument(
        "--precision", choices=["tf32", "fp32", "fp16"], default="tf32", help="TensorRT precision"
    )
    b.add_argument("--workspace-gb", type=float, default=4.0, help="TensorRT builder workspace")
    b.add_argument(
        "--dry-run", action="store_true", help="print the profiles and buffer plan, build nothing"
    )
    b.set_defaults(handler=_build_engine, check=_check_build_engine)

    d = sub.add_parser("download", help="download the official weights, check them, write a config")
    d.add_argument(
        "--dest", default="weights", help="folder for both repositories and streamtts.yaml"
    )
    d.add_argument("--quant", default="Q4_K_M", help="backbone quant: Q4_K_M, Q5_K_M, Q6_K or Q8_0")
    d.add_argument("--from-dir", help="copy from a local folder laid out like the hub repositories")
    d.add_argument("--revision", help="hub revision (branch, tag or commit)")
    d.add_argument(
        "--no-text-head",
        action="store_true",
        help="skip lm_head_text.npy (1.2 GB; read only outside audio mode)",
    )
    d.add_argument("--no-codec", action="store_true", help="skip the codec repository")
    d.add_argument(
        "--no-streaming-codec",
        action="store_true",
        help="skip the codec checkpoint and the exact streaming decoder built from it "
        "(the engine then decodes in windows)",
    )
    d.add_argument(
        "--fuse", action="store_true", help="also write the fused-heads GGUF (streamtts convert)"
    )
    d.add_argument(
        "--cpu", action="store_true", help="write a CPU config even when a GPU is visible"
    )
    d.set_defaults(handler=_download)


def _load_cfg(path: str | None, demo: bool = True) -> Any:
    """The config; without one, the demo model's (as every other command), unless ``demo``
    is False (the command was given explicit files instead)."""
    from .config import load_config

    if path:
        return load_config(path)
    if not demo:
        return None
    from .demo.model import ensure_demo_model

    print("streamtts: no --config: using the synthetic demo model's files", file=sys.stderr)
    return load_config(ensure_demo_model())


def _check_convert(args: argparse.Namespace) -> None:
    from .cli_common import check_config, check_input_file, check_output_file

    check_config(args)
    check_input_file(args.gguf, "--gguf")
    if args.lm_heads is not None and not Path(args.lm_heads).is_dir():
        raise UsageError(f"--lm-heads {args.lm_heads}: no such folder")
    check_output_file(args.out, "--out", audio=False)


def _check_build_engine(args: argparse.Namespace) -> None:
    from .cli_common import check_config, check_input_file, check_output_file

    check_config(args)
    check_input_file(args.onnx, "--onnx")
    check_output_file(args.out, "--out", audio=False)


def _convert(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from .model.fused import config_line
    from .model.fused_convert import convert

    cfg = _load_cfg(args.config, demo=not (args.gguf and args.lm_heads))
    src = args.gguf or (cfg.backbone_gguf if cfg else "")
    heads: Any = args.lm_heads or cfg
    if not src or heads is None:
        raise ConfigError("streamtts convert needs --config, or --gguf and --lm-heads")
    if args.lm_heads and cfg is not None:
        heads = args.lm_heads
    t0 = time.monotonic()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        transient=True, console=_stderr_console(),
    ) as prog:  # fmt: skip
        task = prog.add_task("writing", total=None)

        def progress(name: str, done: int, total: int) -> None:
            prog.update(task, completed=done, total=total, description=f"writing {name}")

        info = convert(
            src, heads, args.out, include_text_head=args.include_text_head,
            audio_dtype=args.audio_dtype, text_source=args.text_source, progress=progress,
        )  # fmt: skip
    print(
        f"wrote {info.path}: {info.rows} output rows ({info.dtype}; text rows from {info.text_source}"
        f"{', full text head' if info.has_text_head else ''}) in {time.monotonic() - t0:.1f} s"
    )
    print("add to your config:")
    print(f"  {config_line(info.path, src)}")
    return 0


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _build_engine(args: argparse.Namespace) -> int:
    from .codec.trt_build import BuildOptions, build_engine, describe_plan

    cfg = _load_cfg(args.config, demo=not args.onnx)
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
    from .codec import STREAMING_NAME
    from .codec.trt_build import BuildOptions, build_streaming_engine, describe_streaming_plan

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


def _download(args: argparse.Namespace) -> int:
    from .model.download import download

    streaming = not args.no_codec and not args.no_streaming_codec
    cfg, rep = download(
        args.dest, args.quant, from_dir=args.from_dir, revision=args.revision,
        text_head=not args.no_text_head, codec=not args.no_codec, codec_checkpoint=streaming,
        fuse=args.fuse, gpu=False if args.cpu else None,
    )  # fmt: skip
    print(f"weights checked ({rep.quant}, hidden size {rep.n_embd}): {Path(args.dest).resolve()}")
    if streaming:
        _build_streaming_codec(Path(args.dest))
    print(f"config: {cfg}")
    print(f"try it: streamtts synth --config {cfg} --text 'Hello there.' --out hello.wav")
    return 0


def _build_streaming_codec(dest: Path) -> None:
    """decoder_streaming.onnx beside decoder.onnx, from the fetched checkpoint (the engine
    picks it up there); skipped when it is already built from these weights."""
    from .codec.build import build_decoders
    from .codec.stamp import weights_stamp
    from .model.download import CODEC_CKPT_DIR, CODEC_DIR

    ckpt = dest / CODEC_CKPT_DIR
    if not (ckpt / "config.json").is_file():
        print("codec: no checkpoint, so no streaming decoder: the engine decodes in windows")
        return
    out = dest / CODEC_DIR / "decoder_streaming.onnx"
    if out.is_file() and _stamp_of(out) == weights_stamp(ckpt):
        print(f"codec: {out} is up to date")
        return
    res = build_decoders(ckpt, out=out, progress=sys.stderr.isatty())
    print(
        f"codec: built {out} in {res.seconds:.0f} s (exact streaming; "
        f"{res.state_bytes_per_slot / 2**20:.0f} MiB of state per stream)"
    )


def _stamp_of(path: Path) -> str:
    import onnx

    from .codec.stamp import KEY_STAMP

    model = onnx.load(str(path), load_external_data=False)
    return next((p.value for p in model.metadata_props if p.key == KEY_STAMP), "")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: streamtts convert | build-engine | download")
