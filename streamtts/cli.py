"""Command line: ``streamtts synth | speak | demo-model | bench | serve | say | ...``.

The only modules that print are the CLI ones; everything else logs, on stderr (stdout
carries results: the file written, the table, the port).

How a command runs (:func:`main`):

1. parse; an unknown option gets a "did you mean" from that command's own options;
2. logging: warnings and errors on stderr by default, ``-v`` info, ``-vv`` debug, ``-q`` errors
   only (``-q``/``-v`` work before or after the command name);
3. ``check(args)``: every file, folder, text and port the command names is validated before
   anything expensive starts (loading real weights takes many seconds per mistake);
4. ``handler(args)``.

A mistake a user can make ends as one line, ``streamtts: error: ...`` with the next step, exit
status 2: a :class:`~streamtts.errors.StreamTTSError`, an argparse error, or an ``OSError``
from the system (add ``-vv`` for its traceback). A bug still shows its traceback.

Commands in other modules register with ``add_parser(sub)`` and ``set_defaults(handler=...,
check=...)``; the ``check_*`` helpers in ``cli_common.py`` are theirs to use.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from .cli_common import (
    check_config,
    check_output_device,
    check_output_file,
    check_reference,
    check_text,
    demo_notice,
    env_device,
    save_instead,
)
from .config import SamplingParams
from .constants import SAMPLE_RATE
from .errors import PlaybackError, StreamTTSError, UsageError

log = logging.getLogger("streamtts")

SAMPLING_FLAGS = (
    ("--text-temperature", float, "text_temperature", "text-channel temperature (0 = greedy); default: the config's"),
    ("--text-top-k", int, "text_top_k", "text-channel top-k; default: the config's"),
    ("--text-top-p", float, "text_top_p", "text-channel top-p; default: the config's"),
    ("--audio-temperature", float, "audio_temperature", "audio-codebook temperature (0 = greedy); default: the config's"),
    ("--audio-top-k", int, "audio_top_k", "audio-codebook top-k; default: the config's"),
    ("--audio-top-p", float, "audio_top_p", "audio-codebook top-p; default: the config's"),
    ("--audio-repetition-penalty", float, "audio_repetition_penalty", "per-codebook repetition penalty (1 = off); default: the config's"),
)  # fmt: skip


# -- the parser ------------------------------------------------------------------------------
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` shows each option's default, as ``ArgumentDefaultsHelpFormatter`` does,
    but not the noise of ``None`` and ``False`` defaults."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default:" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
            or default == []
            or (default == 0 and action.nargs == 0)  # a count (-v) starts at 0
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every streamtts parser: defaults in ``--help``, errors as one line with a suggestion."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, Parser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"streamtts: error: {self.suggest(message)} (see `{self.prog} --help`)\n")

    def suggest(self, message: str) -> str:
        """``message`` with a "did you mean" for a mistyped option or choice."""
        m = re.match(r"unrecognized arguments: (.*)", message)
        if m:
            hints = []
            for word in m.group(1).split():
                if word.startswith("-"):
                    close = difflib.get_close_matches(word.split("=")[0], list(self._option_string_actions), n=1, cutoff=0.6)
                    if close:
                        hints.append(f"did you mean {close[0]}?")
            return "; ".join([message, *hints])
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2))
            close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
            if close:
                return f"{message}; did you mean {close[0]!r}?"
        return message


def _add_log_args(p: argparse.ArgumentParser, top: bool) -> None:
    # On a command they default to SUPPRESS, so they leave the top-level values alone unless given.
    p.add_argument("-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS,
                   help="more log lines on stderr (-v: info, -vv: debug and tracebacks)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="errors only: no notices, warnings or progress")  # fmt: skip


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (official MOSS-TTS llama.cpp keys work); default: the demo model")
    p.add_argument("--max-streams", type=_positive_int, help="streams generated at once; default: the config's (4)")
    p.add_argument(
        "--n-threads", type=_non_negative_int,
        help="llama.cpp CPU threads; default: the config's, whose 0 = the physical cores not kept busy by "
        "other processes at start-up (1 on a 2-core machine with a busy neighbour)",
    )  # fmt: skip


def _add_request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reference", help="reference voice clip (wav/flac/ogg, 0.5-30 s) to clone")
    p.add_argument("--language", help="language tag for the prompt, e.g. en, zh")
    p.add_argument("--instruction", help="style instruction for the prompt")
    p.add_argument("--tokens", type=_positive_int, help="desired duration in audio frames (12.5 per second)")
    p.add_argument("--seed", type=int, help="sampling seed (reproducible per request); default: random")
    p.add_argument("--max-new-tokens", type=_positive_int, help="generation steps at most; default: the config's")
    for flag, typ, _, text in SAMPLING_FLAGS:
        p.add_argument(flag, type=typ, help=text)
    p.add_argument("--greedy", action="store_true", help="both temperatures 0")
    p.add_argument("--no-normalize", action="store_true", help="skip text normalisation")
    p.add_argument("--profile", action="store_true", help="print per-stage timings and stream numbers")


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _non_negative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


# -- shared by synth and speak ----------------------------------------------------------------
def _engine(args: argparse.Namespace) -> Any:
    from .engine.frontend import Engine

    demo_notice(args)
    return Engine.from_config(args.config, max_streams=args.max_streams, n_threads=args.n_threads)


def _options(args: argparse.Namespace, engine: Any) -> Any:
    from .request import StreamOptions

    base = engine.config.sampling
    changes = {name: getattr(args, name) for _, _, name, _ in SAMPLING_FLAGS if getattr(args, name) is not None}
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


def _check_request(args: argparse.Namespace) -> None:
    check_config(args)
    check_reference(args.reference)
    if args.tokens is not None and args.max_new_tokens is not None and args.tokens > args.max_new_tokens:
        raise UsageError(f"--tokens {args.tokens} is more than --max-new-tokens {args.max_new_tokens}")


# Steps slower than this many times the fastest one: something else is using the CPU.
SLOW_STEP_RATIO = 3.0


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
    console = Console(stderr=True)
    console.print(t)
    fastest = engine.fastest_backbone_ms()
    mean = prof.get("backbone", 0.0)
    if fastest and mean > SLOW_STEP_RATIO * fastest:
        console.print(
            f"[yellow]warning:[/] llama.cpp steps took {mean:.1f} ms on average, {mean / fastest:.1f}x "
            f"the fastest ({fastest:.1f} ms): another process is probably using the CPU. "
            f"Try fewer threads (--n-threads 1); the engine uses {engine.info.get('threads')}."
        )


# -- synth ---------------------------------------------------------------------------------------
def _check_synth(args: argparse.Namespace) -> None:
    check_text(args.text, "--text")
    check_output_file(args.out, "--out")
    check_output_file(args.codes_out, "--codes-out", audio=False)
    check_output_file(args.timestamps, "--timestamps", audio=False)
    _check_request(args)


async def _synth(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .audio.formats import file_subtype
    from .audio.reference import loudness_normalize

    engine = _engine(args)
    async with engine:
        opts = _options(args, engine)
        if args.timestamps:
            opts = msgspec.structs.replace(opts, timestamps="words")
        ref = await engine.encode_voice(args.reference) if args.reference else None
        s = engine.stream(args.text, reference=ref, options=opts)
        words: list[Any] = []
        pcm: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
            transient=True, console=Console(stderr=True), disable=args.quiet,
        )  # fmt: skip
        with progress as prog:
            task = prog.add_task("generating", total=None)
            async with s:
                async for chunk in s:
                    pcm.append(chunk.pcm)
                    codes.append(chunk.codes)
                    words.extend(chunk.words or [])
                    prog.update(task, description=f"generating: {sum(len(c) for c in codes)} frames")
        wav = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
        frames = np.concatenate(codes) if codes else np.zeros((0, engine.ids.n_vq), np.int64)
        if wav.size == 0:
            raise UsageError("the model produced no audio frames (try another --seed or a longer --text)")
        out = wav if args.no_loudness else loudness_normalize(wav)
        sf.write(args.out, out, SAMPLE_RATE, subtype=file_subtype(args.out))
        if args.codes_out:
            np.save(args.codes_out, frames.astype(np.int64))
        if args.timestamps:
            _write_timestamps(args.timestamps, words)
        st = s.stats
        print(
            f"wrote {args.out}: {frames.shape[0]} frames, {wav.size / SAMPLE_RATE:.2f} s "
            f"(TTFA {1000 * st.ttfa_s:.0f} ms, RTF {st.rtf:.3f}, {st.finish_reason})"
        )
        if args.profile:
            _print_profile(engine, st)
    return 0


def _write_timestamps(path: str, words: list[Any]) -> None:
    """``{"words": [{"word", "start", "end"}, ...], "estimated": true}`` (seconds of the file)."""
    doc = {"words": [{"word": w.word, "start": w.start, "end": w.end} for w in words], "estimated": True}
    Path(path).expanduser().write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


# -- speak ---------------------------------------------------------------------------------------
def _check_speak(args: argparse.Namespace) -> None:
    if args.list_devices:
        return
    if args.text != "-":
        check_text(args.text, "TEXT")
    check_output_file(args.save, "--save")
    _check_request(args)
    check_output_device(args.output_device, args.save)


async def _speak(args: argparse.Namespace) -> int:
    from .audio import playback as player
    from .audio.devices import list_devices

    if args.list_devices:
        print(list_devices())
        return 0
    text = sys.stdin.read() if args.text == "-" else args.text
    if args.text == "-":
        check_text(text, "stdin")
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
            await save_instead(pcm_chunks(), args.save, exc, args.quiet)
            return 0
        if not args.quiet:
            print(report.summary(), file=sys.stderr)
        if args.profile:
            _print_profile(engine, s.stats)
    return 0


# -- demo-model -------------------------------------------------------------------------------
def _check_demo_model(args: argparse.Namespace) -> None:
    d = Path(args.dir).expanduser()
    if d.exists() and not d.is_dir():
        raise UsageError(f"DIR {args.dir}: exists and is not a folder")
    if not d.parent.is_dir():
        raise UsageError(f"DIR {args.dir}: folder {d.parent} does not exist (create it: mkdir -p {d.parent})")


def _demo_model(args: argparse.Namespace) -> int:
    import time

    from .demo.model import write_demo_model

    t0 = time.perf_counter()
    cfg = write_demo_model(args.dir, args.preset, args.seed, codec=args.codec)
    size = sum(f.stat().st_size for f in Path(args.dir).rglob("*") if f.is_file())
    print(f"wrote the {args.preset} demo model ({size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    print(f"try it: streamtts synth --config {cfg} --text 'Hello there.' --out hello.wav")
    return 0


# -- wiring ------------------------------------------------------------------------------------
def build_parser() -> Parser:
    p = Parser(prog="streamtts", description="Real-time streaming TTS for MOSS-TTS-Delay.")
    _add_log_args(p, top=True)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=Parser)

    s = sub.add_parser("synth", help="synthesise text to a file")
    _add_model_args(s)
    s.add_argument("--text", required=True, help="the text to speak")
    s.add_argument("--out", default="out.wav", help="audio file to write (.wav, .flac, .ogg, ...)")
    s.add_argument("--codes-out", help="also write the de-delayed (T, 32) int64 codes as .npy")
    s.add_argument("--no-loudness", action="store_true", help="skip the whole-file loudness normalisation")
    s.add_argument(
        "--timestamps", metavar="FILE.json",
        help="also write each word's estimated start and end (seconds) as JSON (docs/timing.md)",
    )  # fmt: skip
    _add_request_args(s)
    s.set_defaults(handler=_synth, check=_check_synth)

    sp = sub.add_parser("speak", help="speak text through the speakers as it is generated")
    _add_model_args(sp)
    sp.add_argument("text", nargs="?", default="Hello! This is streamtts, speaking while it thinks.", help="text, or - for stdin")
    sp.add_argument(
        "--output-device", default=env_device(),
        help="output device index or name substring (--list-devices), or null: paced like a sound "
        "card, audio discarded; default: $STREAMTTS_OUTPUT_DEVICE, else the system's",
    )  # fmt: skip
    sp.add_argument("--list-devices", action="store_true", help="list the output devices and exit")
    sp.add_argument("--save", help="also write what was played to this file; without a sound card, only write it")
    _add_request_args(sp)
    sp.set_defaults(handler=_speak, check=_check_speak)

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
    d.set_defaults(handler=_demo_model, check=_check_demo_model)

    _add_convert_hf(sub)

    from . import bench

    bench.add_parser(sub)
    _add_optional_commands(sub)
    for cmd, cp in sub.choices.items():
        if isinstance(cp, Parser):
            p.commands[cmd] = cp
        _add_log_args(cp, top=False)
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


def _setup_logging(verbose: int, quiet: bool) -> None:
    """Log lines go to stderr: rich's columns on a terminal, one plain line each otherwise
    (a log file or a pipe gets no wrapping at 80 columns)."""
    level = logging.ERROR if quiet else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False, log_time_format="%X")
        fmt = "%(message)s"
    else:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "streamtts: %(levelname)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        cmd = parser.commands.get(args.cmd, parser)
        cmd.error(f"unrecognized arguments: {' '.join(extra)}")
    _setup_logging(args.verbose, args.quiet)
    try:
        check = getattr(args, "check", None)
        if check is not None:
            check(args)
        result = args.handler(args)
        return int(asyncio.run(result) if asyncio.iscoroutine(result) else result or 0)
    except StreamTTSError as exc:
        return _fail(exc, args.verbose)
    except OSError as exc:  # the system's answer (a file, a socket): not a bug of ours
        return _fail(exc, args.verbose)
    except KeyboardInterrupt:
        print("streamtts: interrupted", file=sys.stderr)
        return 130


def _fail(exc: StreamTTSError | OSError, verbose: int) -> int:
    if verbose >= 2:
        log.debug("traceback", exc_info=exc)
    text = str(exc)
    if isinstance(exc, OSError) and exc.strerror:  # "No space left on device: out.wav"
        text = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    print(f"streamtts: error: {text}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
