"""The folder tree is the architecture: imports point down the layers, never in a circle,
and the pure core imports no I/O.

Every import counts, including the ones inside functions and under ``TYPE_CHECKING``:
a lazy import that runs back up a layer is still a dependency that runs back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "streamtts"

# Lower rank = lower layer. A module may import its own package and anything of lower rank.
LAYERS: dict[str, int] = {
    "streamtts.errors": 0,
    "streamtts.closing": 0,
    "streamtts.paths": 0,
    "streamtts.logstyle": 0,  # the one message style (the CLI and the API's fallback handler)
    "streamtts.constants": 0,
    "streamtts.config": 1,
    "streamtts.request": 2,
    "streamtts.core": 3,
    "streamtts.text": 3,
    "streamtts.timing": 3,  # estimated word times: pure NumPy over text and decoded audio
    "streamtts.model": 4,
    "streamtts.audio": 4,
    "streamtts.codec": 4,
    # the per-step kernels: NumPy specifications (core) and their compiled twins (the bridge)
    "streamtts.kernels": 5,
    "streamtts.engine": 6,
    "streamtts.server": 7,
    # offline tooling, above the whole runtime (which calls it only through model/files.py's
    # step, registered by the package): checkpoint/GGUF conversion and downloads, the codec's
    # graph builders (they read checkpoints), and the synthetic demo model (written through both)
    "streamtts.convert": 8,
    "streamtts.codec.build": 9,
    "streamtts.demo": 10,
    # the public face (client, sync, the package itself, the model-files step): may use everything below
    "streamtts": 11,
    # the command line: parses, checks, and calls everything below
    "streamtts.cli": 12,
    # framework plugins (Pipecat, LiveKit): clients of the server built on streamtts.client
    # (its sessions and contexts), so one step above the top-level modules
    "streamtts.integrations": 12,
    # `python -m streamtts`: the command line's entry point
    "streamtts.__main__": 13,
}
CORE_FORBIDDEN = ("threading", "ctypes", "asyncio", "onnx", "onnxruntime", "queue",
                  "concurrent", "multiprocessing", "socket", "tensorrt")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of the streamtts modules (or packages) ``name`` imports."""
    is_pkg = path.name == "__init__.py"
    pkg = name if is_pkg else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            for a in node.names:  # `from . import x` may name a module
                if f"{mod}.{a.name}" in MODULES:
                    found.add(f"{mod}.{a.name}")
    return {m for m in found if m == "streamtts" or m.startswith("streamtts.")}


def _owner(mod: str) -> str:
    """The layer key a module belongs to (longest prefix in LAYERS)."""
    best = "streamtts"
    for key in LAYERS:
        if (mod == key or mod.startswith(key + ".")) and len(key) > len(best):
            best = key
    return best


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    top = {m for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"}
    assert top, "no top-level modules found"
    for m in MODULES:
        assert _owner(m) in LAYERS


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name: str) -> None:
    src = _owner(name)
    for target in GRAPH[name]:
        dst = _owner(target)
        if dst == src:
            continue
        assert LAYERS[dst] < LAYERS[src], (
            f"{name} (layer {src}) imports {target} (layer {dst}): arrows must point down"
        )


def test_no_import_cycles() -> None:
    graph = {m: {t for t in deps if t in MODULES and t != m} for m, deps in GRAPH.items()}
    # A package's __init__ importing its own submodules is not a cycle of the design.
    for m in graph:
        if MODULES[m].name != "__init__.py":
            graph[m] = {t for t in graph[m] if not (MODULES[t].name == "__init__.py" and m.startswith(t + "."))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cyc = stack[stack.index(t):] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cyc))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith(("streamtts.core", "streamtts.timing"))))
def test_core_is_pure(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        for n in names:
            assert n.split(".")[0] not in CORE_FORBIDDEN, f"{name} imports {n}: the core is pure NumPy"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rules above can fail: an upward import in a core module is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ..engine.loop import EngineCore\nimport threading\n")
    deps = _imports("streamtts.core.bad", bad)
    assert "streamtts.engine.loop" in deps
    assert LAYERS[_owner("streamtts.engine.loop")] > LAYERS[_owner("streamtts.core.bad")]


def test_few_modules_at_the_top() -> None:
    """The top of the package is its public face (errors, config, request, client, ...);
    everything else lives in a folder that says what it holds."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 12, f"{len(top)} modules directly in streamtts/: {top}"


@pytest.mark.parametrize("pkg", sorted(p for p in PKG.rglob("__init__.py")))
def test_every_folder_says_what_it_holds(pkg: Path) -> None:
    doc = ast.get_docstring(ast.parse(pkg.read_text(encoding="utf-8")))
    assert doc, f"{pkg.relative_to(PKG.parent)} has no docstring"
