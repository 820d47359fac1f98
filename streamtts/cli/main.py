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
import difflib
import inspect
import logging
import re
import sys
import types
from typing import Any, NoReturn

from ..errors import StreamTTSError
from . import interrupts

log = logging.getLogger("streamtts")

# -- the parser ------------------------------------------------------------------------------
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` shows each option's default, as ``ArgumentDefaultsHelpFormatter`` does,
    but not the noise of ``None`` and ``False`` defaults."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or re.search(r"\bdefault\b", text)  # says its default its own way
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

    argv: list[str] = []  # the command line being parsed (set by main)

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            # a mistyped option (`synth --txt Hi`) is the mistake to name, not what it left out
            unknown = [w for w in self.argv if re.match(r"--?[A-Za-z]", w) and w.split("=")[0] not in self._option_string_actions]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
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


# -- wiring ------------------------------------------------------------------------------------
def build_parser() -> Parser:
    from .. import __version__

    p = Parser(prog="streamtts", description="Real-time streaming TTS for MOSS-TTS-Delay.")
    p.add_argument("--version", action="version", version=f"streamtts {__version__}")
    _add_log_args(p, top=True)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=Parser)

    from . import bench, demo, speech

    speech.add_parser(sub)
    demo.add_parser(sub)
    bench.add_parser(sub)
    _add_optional_commands(sub)
    for cmd, cp in sub.choices.items():
        if isinstance(cp, Parser):
            p.commands[cmd] = cp
        _add_log_args(cp, top=False)
    return p


def _add_optional_commands(sub: Any) -> None:
    """Commands that live in their own modules (server, client, GPU tools, codec build)."""
    for name in ("serve", "say", "listing", "convert", "codec"):
        try:
            mod = __import__(f"streamtts.cli.{name}", fromlist=["add_parser"])
        except ImportError as exc:
            if getattr(exc, "name", "") and str(exc.name).startswith("streamtts"):
                continue
            raise
        mod.add_parser(sub)


def _setup_logging(verbose: int, quiet: bool) -> None:
    """Log lines go to stderr, one plain ``streamtts: LEVEL: ...`` line each, on a terminal
    or not (the style of every line the command prints)."""
    from ..logstyle import Formatter

    level = logging.ERROR if quiet else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Formatter())
    logging.basicConfig(level=level, handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    Parser.argv = list(sys.argv[1:] if argv is None else argv)
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
        if not inspect.iscoroutine(result):
            return int(result or 0)
        import asyncio

        interrupts.hand_to_asyncio()  # Ctrl-C cancels the command's task: its clean-up runs
        return int(asyncio.run(result))
    except StreamTTSError as exc:
        return _fail(exc, args.verbose)
    except OSError as exc:  # the system's answer (a file, a socket): not a bug of ours
        return _fail(exc, args.verbose)
    except KeyboardInterrupt:
        return interrupts.report()


def _fail(exc: StreamTTSError | OSError, verbose: int) -> int:
    if verbose >= 2:
        log.debug("traceback", exc_info=exc)
    text = str(exc)
    if isinstance(exc, OSError) and exc.strerror:  # "No space left on device: out.wav"
        text = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    print(f"streamtts: error: {text}", file=sys.stderr)
    return 2


class _CallableModule(types.ModuleType):
    """Importing ``streamtts.cli.main`` binds this module over the package's ``main()`` (Python
    sets a package attribute for each submodule it imports); calling it still runs the command,
    so ``streamtts.cli.main([...])`` works whatever was imported first."""

    def __call__(self, argv: list[str] | None = None) -> int:
        return main(argv)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
