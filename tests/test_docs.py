"""Every fenced block in README.md and docs/*.md runs as written, or says why it does not.

How a block is treated, decided by its language tag and an optional marker:

- ```` ```bash ```` (``sh``, ``shell``) and ```` ```python ````: run, in the order of the file, in
  a scratch folder holding a copy of the checkout (``examples/...``, ``configs/...`` and
  ``scripts/...`` resolve as in a checkout; what a block writes lands in the copy, never in
  the checkout, which the test finds unchanged at the end; ``tests/`` is left out). Shell blocks run with ``bash -euo pipefail``, Python
  blocks with the suite's interpreter. The environment is the one ``scripts/setup.sh`` makes:
  ``.venv`` is the running interpreter's environment, first on ``PATH``.
- a runnable block whose first line is ``# needs: WHAT`` is not run: it needs what the suite
  does not have (the real weights, a GPU, the network). The comment is the visible mark.
- ``<!-- doc-test: skip REASON -->`` on the line before a block: not run, for blocks that are
  no recipe (interface signatures; the test suite itself).
- ``<!-- doc-test: after-setup -->``: run without its ``bash scripts/setup.sh`` (and the
  ``&&`` after it): the suite runs in the environment setup made. This test never runs setup.
- ``<!-- doc-test: usage -->`` before a ```` ```text ```` block: a command synopsis, checked
  against the parser (every option shown exists; a command's options are all shown unless its
  entry ends with ``...``).
- any other tag (``text``, ``json``, ``yaml``, ...) is shown, not run. A block without a tag
  fails this test, with what to do.

Servers: a block may start ``streamtts serve --port 8000 &``; what a block leaves running in
the background keeps running until every block of its file has run, then gets SIGTERM (then
SIGKILL). Port 8000 in runnable blocks becomes a free port, and ``STREAMTTS_SERVER`` points the
examples and ``streamtts say`` at it. Without a sound card, ``STREAMTTS_OUTPUT_DEVICE=null``
makes ``streamtts speak`` play to nowhere at a listener's pace. Every block has a time limit.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
RUNNABLE = SHELL | {"python"}
BLOCK_TIMEOUT_S = 300
MARK_HELP = (
    "Tag every fenced block and mark the ones the suite cannot run:\n"
    "  - ```bash / ```python: run by tests/test_docs.py as written (port 8000 becomes a free port);\n"
    "  - first line `# needs: WHAT IT NEEDS` (e.g. `# needs: the real weights (streamtts download)`):\n"
    "    shown to readers, not run;\n"
    "  - `<!-- doc-test: skip REASON -->` on the line before the block: not run (no recipe);\n"
    "  - ```text / ```json / ```yaml for output, layouts and messages (not run)."
)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # the doc-test marker before it ("" if none)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def needs(self) -> str | None:
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        m = re.match(r"#\s*needs:\s*(.+)", first)
        return m.group(1).strip() if m else None


def blocks(path: Path) -> list[Block]:
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^ {0,3}```\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1).lower()
        j = i + 1
        while j < len(lines) and not re.match(r"^ {0,3}```\s*$", lines[j]):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mk = re.match(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$", lines[k]) if k >= 0 else None
        out.append(Block(path, start + 1, lang, "\n".join(lines[start + 1 : j]) + "\n", mk.group(1) if mk else ""))
        i = j + 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]


def is_run(b: Block) -> bool:
    return b.lang in RUNNABLE and b.needs is None and not b.marker.startswith("skip")


# -- every block accounted for ------------------------------------------------------------------
def test_every_block_is_run_or_marked() -> None:
    problems = []
    for b in ALL:
        if not b.lang:
            problems.append(f"{b.where}: a fenced block without a language tag")
        kind = b.marker.split()[0] if b.marker else ""
        if kind not in ("", "skip", "after-setup", "usage"):
            problems.append(f"{b.where}: unknown marker <!-- doc-test: {b.marker} -->")
        if kind == "skip" and len(b.marker.split()) < 2:
            problems.append(f"{b.where}: <!-- doc-test: skip --> needs a reason after 'skip'")
        if kind == "usage" and b.lang != "text":
            problems.append(f"{b.where}: a usage block is a ```text block")
    assert not problems, "\n".join(problems) + "\n\n" + MARK_HELP
    assert sum(is_run(b) for b in ALL) >= 8  # the suite really runs the recipes


def test_skipped_blocks_say_why() -> None:
    """The blocks not run, and why (printed with `pytest -rA -k skipped_blocks`)."""
    for b in ALL:
        if b.lang in RUNNABLE and not is_run(b):
            reason = b.needs or b.marker
            assert reason, b.where
            print(f"not run: {b.where}: {reason}")


# -- the usage synopsis -------------------------------------------------------------------------
GLOBAL = {"-h", "--help", "-v", "--verbose", "-q", "--quiet"}


def _subcommand(parser: argparse.ArgumentParser, text: str) -> argparse.ArgumentParser:
    """The parser of the subcommand ``text`` names after its command (``streamtts voice
    design ...``: design's), else ``parser``."""
    words = text.split()[2:3]
    for a in parser._actions:
        choices = getattr(a, "choices", None)
        if not a.option_strings and isinstance(choices, dict) and words and words[0] in choices:
            return choices[words[0]]
    return parser


def test_usage_blocks_match_the_parser() -> None:
    from streamtts.cli.main import build_parser

    parser = build_parser()
    usage = [b for b in ALL if b.marker == "usage"]
    assert usage, "README.md's command synopsis carries <!-- doc-test: usage -->"
    problems = []
    for b in usage:
        for cmd, text in usage_entries(b.code):
            sub = parser.commands.get(cmd)
            if sub is None:
                problems.append(f"{b.where}: `streamtts {cmd}` is no command")
                continue
            sub = _subcommand(sub, text)  # `streamtts voice design ...`: design's options
            known = {s for a in sub._actions for s in a.option_strings}
            shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
            problems += [f"{b.where}: `streamtts {cmd}` has no option {f}" for f in sorted(shown - known)]
            if not text.rstrip().endswith("..."):
                longs = {max(a.option_strings, key=len) for a in sub._actions if a.option_strings}
                missing = sorted(longs - shown - GLOBAL)
                problems += [f"{b.where}: `streamtts {cmd}` option {f} is missing" for f in missing]
    assert not problems, "\n".join(problems) + "\n(end a command's entry with ... to show only some options)"


def usage_entries(code: str) -> list[tuple[str, str]]:
    """(command, its text with continuation lines) for each `streamtts CMD` line."""
    entries: list[tuple[str, str]] = []
    for line in code.splitlines():
        m = re.match(r"streamtts ([a-z][a-z-]*)", line)
        if m:
            entries.append((m.group(1), line.split("#")[0]))
        elif line.startswith(" ") and entries:
            cmd, text = entries[-1]
            entries[-1] = (cmd, text + " " + line.split("#")[0])
    return entries


# -- running them -------------------------------------------------------------------------------
RUN_FILES = sorted({b.path for b in ALL if is_run(b)})


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUN_FILES, ids=[str(p.relative_to(ROOT)) for p in RUN_FILES])
def test_doc_blocks_run_as_written(doc: Path, tmp_path: Path) -> None:
    before = checkout_state()
    scratch = mirror_checkout(tmp_path / "checkout")
    port = free_port()
    env = block_env(port)
    groups: list[int] = []
    try:
        for i, b in enumerate(x for x in blocks(doc) if is_run(x)):
            code = re.sub(r"\b8000\b", str(port), b.code)
            if b.marker == "after-setup":
                code = re.sub(r"^bash scripts/setup\.sh( --test)?\s*(&&\s*)?", "", code, flags=re.M)
            run_block(b, code, scratch, env, i, groups)
    finally:
        for pgid in groups:
            stop_group(pgid)
    after = checkout_state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"the blocks of {doc.name} wrote into the checkout: {changed[:10]}"


def run_block(b: Block, code: str, cwd: Path, env: dict[str, str], i: int, groups: list[int]) -> None:
    out, err = cwd / f".block{i}.out", cwd / f".block{i}.err"
    if b.lang == "python":
        script = cwd / f".block{i}.py"
        script.write_text(code, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    # Output to files, not pipes: a server a block leaves running would hold a pipe open.
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fo, stderr=fe, start_new_session=True)
        groups.append(proc.pid)  # its process group: what it leaves running is stopped at the end
        try:
            rc = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_group(proc.pid)
            rc = None
    print(f"ran {b.where} ({b.lang}): exit {rc}\n{tail(out, 8)}")
    if rc != 0:
        what = "timed out" if rc is None else f"exited with {rc}"
        pytest.fail(
            f"{b.where} ({b.lang}) {what}:\n{b.code}\n--- stdout ---\n{tail(out)}\n--- stderr ---\n{tail(err)}\n\n"
            "If the block cannot run in the test suite, mark it:\n" + MARK_HELP,
            pytrace=False,
        )


def tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


# not copied: history, environments, build output, caches, the suite itself (58 MB of fixtures)
_NOT_COPIED = {".git", ".venv", "tests", "build", "__pycache__"}
_CACHES = (".pytest_cache", ".ruff_cache", ".mypy_cache", "__pycache__")


def mirror_checkout(dest: Path) -> Path:
    """A copy of the checkout where its paths resolve, with the environment in ``.venv``
    (a link to an environment, never written by a block)."""
    dest.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in _NOT_COPIED or entry.name.startswith(_CACHES) or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, dest / entry.name, symlinks=True, ignore=shutil.ignore_patterns(*_CACHES))
        else:
            shutil.copy2(entry, dest / entry.name, follow_symlinks=False)
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


def checkout_state() -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file in the checkout but caches and .git: a block that wrote
    there (through a path outside its folder) shows up as a change."""
    state: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in (".git", "build") and not d.startswith(_CACHES) and not d.endswith(".egg-info")]
        for f in files:
            st = os.lstat(os.path.join(top, f))
            state[os.path.relpath(os.path.join(top, f), ROOT)] = (st.st_size, st.st_mtime_ns)
    return state


def block_env(port: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["STREAMTTS_SERVER"] = f"http://127.0.0.1:{port}"
    env["COLUMNS"] = "100"
    if not has_output_device():
        env["STREAMTTS_OUTPUT_DEVICE"] = "null"  # documented: plays at a listener's pace to nowhere
    return env


def has_output_device() -> bool:
    try:
        from streamtts.audio.devices import resolve_output_device

        resolve_output_device(None)
    except Exception:
        return False
    return True


def stop_group(pgid: int, grace_s: float = 15.0) -> None:
    """SIGTERM the process group (a server shuts down cleanly; bash makes background jobs ignore
    SIGINT), SIGKILL what is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
