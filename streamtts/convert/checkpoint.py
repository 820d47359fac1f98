"""Reading Hugging Face checkpoints (``model.safetensors``, sharded or not) without torch.

``safetensors`` memory-maps each file and hands out one tensor at a time as a NumPy
array; ``ml_dtypes`` gives NumPy a ``bfloat16`` so bf16 checkpoints read the same way.
Peak memory is one tensor (the caller upcasts or converts it, then drops it);
``iter_rows`` reads a tensor a slab of whole rows at a time with plain file reads, so a
converter's memory stays bounded by its slab size, not by the largest tensor.

Every problem names the file and what was expected: a missing ``model.safetensors``
(or index), a shard the index names but the folder lacks, a file whose header or data
is cut short, a tensor that is absent or of the wrong shape.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from ..closing import Closing
from ..errors import ModelFileError

__all__ = ["Checkpoint", "SINGLE_FILE", "INDEX_FILE"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_EXPECTED = f"a Hugging Face checkpoint ({SINGLE_FILE}, or shards listed by {INDEX_FILE})"
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U8": 1, "BOOL": 1}


def _import() -> Any:
    try:
        import ml_dtypes  # noqa: F401  (registers numpy's bfloat16)
        from safetensors import safe_open
    except ImportError as exc:  # pragma: no cover - an install problem
        raise ModelFileError(
            "safetensors", "the packages safetensors and ml_dtypes",
            "pip install 'streamtts[model]'",
        ) from exc
    return safe_open


def _numpy_dtype(path: Path, name: str, dt: str) -> np.dtype[Any]:
    """NumPy dtype of a safetensors dtype string (float types: what checkpoints hold)."""
    if dt == "BF16":
        _import()  # a clear error when ml_dtypes is missing
        import ml_dtypes

        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    names = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}
    if dt not in names:
        raise ModelFileError(path, f"tensor {name!r} as F32, F16 or BF16", f"it is {dt}")
    return np.dtype(names[dt])


def _check_file(path: Path) -> tuple[dict[str, Any], int]:
    """The header of one safetensors file, checked against the file's size, and the
    offset of its data section."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFileError(path, "a safetensors file", "shorter than its 8-byte header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ModelFileError(path, "a safetensors file", "truncated inside its header")
            header: dict[str, Any] = json.loads(f.read(n))
    except OSError as exc:
        raise ModelFileError(path, "a readable safetensors file", str(exc)) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, "a safetensors file", "its header is not JSON") from exc
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise ModelFileError(path, "a safetensors file", f"bad header entry {name!r}") from exc
    if 8 + n + end > size:
        raise ModelFileError(
            path, "a safetensors file",
            f"truncated: its header needs {8 + n + end} bytes, the file has {size}",
        )
    return header, 8 + n


class Checkpoint(Closing):
    """The tensors of one checkpoint folder, by name, read one at a time.

    ``with Checkpoint(folder) as ck: ck.get("decoder.0.input_proj.weight")``.
    """

    def __init__(self, folder: str | Path, prefixes: tuple[str, ...] = ()) -> None:
        """``prefixes``: read only tensors whose names start with one of them (all when
        empty); shards the index names for other tensors only may be absent."""
        self.folder = Path(folder)
        self._where: dict[str, Path] = {}
        self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._span: dict[str, tuple[int, int]] = {}  # absolute byte offset, byte length
        self._handles: dict[Path, Any] = {}
        self._stack = ExitStack()
        index = self.folder / INDEX_FILE
        single = self.folder / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ModelFileError(index, "a safetensors index with a weight_map") from exc
            files = sorted(
                {self.folder / str(f) for n, f in weight_map.items() if not prefixes or n.startswith(prefixes)}
            )
            for f in files:
                if not f.is_file():
                    raise ModelFileError(f, f"a shard named by {index.name}", "missing")
        elif single.is_file():
            files = [single]
        else:
            raise ModelFileError(self.folder, _EXPECTED, "neither file is there")
        for f in files:
            header, data_start = _check_file(f)
            for name, info in header.items():
                if name == "__metadata__" or (prefixes and not name.startswith(prefixes)):
                    continue
                self._where[name] = f
                self._meta[name] = (str(info.get("dtype")), tuple(int(d) for d in info["shape"]))
                begin, end = (int(x) for x in info["data_offsets"])
                self._span[name] = (data_start + begin, end - begin)

    def close(self) -> None:
        self._handles.clear()
        self._stack.close()

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return sorted(self._where)

    def files(self) -> list[Path]:
        return sorted(set(self._where.values()))

    def file_of(self, name: str) -> Path:
        """The file (shard) that holds tensor ``name``."""
        return self._where[self._require(name)]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._meta[self._require(name)][1]

    def dtype(self, name: str) -> str:
        """The safetensors dtype string: ``F32``, ``F16``, ``BF16``, ..."""
        return self._meta[self._require(name)][0]

    def nbytes(self, name: str) -> int:
        dt, shape = self._meta[self._require(name)]
        return int(np.prod(shape, dtype=np.int64)) * _DTYPE_BYTES.get(dt, 4)

    def _require(self, name: str) -> str:
        if name not in self._where:
            raise ModelFileError(self.folder, f"a tensor named {name!r} in {_EXPECTED}", "absent")
        return name

    def get(self, name: str, shape: Sequence[int] | None = None) -> np.ndarray:
        """The tensor as stored (bf16 arrays have ``ml_dtypes.bfloat16`` dtype)."""
        path = self._where[self._require(name)]
        if shape is not None and tuple(shape) != self.shape(name):
            raise ModelFileError(
                path, f"tensor {name!r} of shape {tuple(shape)}", f"it is {self.shape(name)}"
            )
        handle = self._handles.get(path)
        if handle is None:
            safe_open = _import()
            handle = self._stack.enter_context(safe_open(str(path), framework="numpy"))
            self._handles[path] = handle
        try:
            return handle.get_tensor(name)  # type: ignore[no-any-return]
        except Exception as exc:
            raise ModelFileError(path, f"readable tensor {name!r}", str(exc)) from exc

    def get_f32(self, name: str, shape: Sequence[int] | None = None) -> np.ndarray:
        return np.asarray(self.get(name, shape), dtype=np.float32)

    def iter_rows(self, name: str, max_bytes: int = 32 << 20) -> Iterator[np.ndarray]:
        """Tensor ``name`` as consecutive slabs of whole rows (first axis), in stored dtype.

        Plain file reads, not the safetensors memory map: pages touched through a map
        count in the process's resident memory until it is closed, reads go through the
        page cache, which the kernel reclaims freely. One slab is at most ``max_bytes``
        (at least one row). A 1-D tensor comes as one slab.
        """
        path = self._where[self._require(name)]
        dt, shape = self._meta[name]
        dtype = _numpy_dtype(path, name, dt)
        offset, nbytes = self._span[name]
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes != want:
            raise ModelFileError(
                path, f"tensor {name!r} of {want} bytes ({dt} {shape})", f"its header says {nbytes}"
            )
        if len(shape) <= 1:
            rows, row_shape = 1, tuple(shape)
        else:
            rows, row_shape = shape[0], tuple(shape[1:])
        row_bytes = max(1, nbytes // max(rows, 1))
        step = max(1, max_bytes // row_bytes)
        with path.open("rb") as f:
            for start in range(0, rows, step):
                n = min(step, rows - start)
                f.seek(offset + start * row_bytes)
                buf = f.read(n * row_bytes)
                if len(buf) != n * row_bytes:
                    raise ModelFileError(path, f"readable tensor {name!r}", "file cut short")
                arr = np.frombuffer(buf, dtype=dtype)
                yield arr.reshape(row_shape if len(shape) <= 1 else (n, *row_shape))

    def items(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        for name in self.names():
            if name.startswith(prefix):
                yield name, self.get(name)
