"""Which weights a built decoder came from, and which builder built it.

The builder writes these into the ONNX ``metadata_props``; a loader compares them with the
weights it is pointed at, so a decoder left over from other weights (or from an older
builder whose graph layout this code no longer reads) fails at load with a message saying
how to rebuild, instead of decoding the wrong sound.

The weights stamp is a SHA-256 over ``config.json`` and, per safetensors file (sorted by
name): its name, size and header (tensor names, dtypes, shapes, offsets), plus its data:
all of it for files up to 16 MiB, else 256 blocks of 4 KiB spread evenly over it (1 MiB
read per file, so checking a 3.5 GB checkpoint stays instant). A change confined to bytes
between those blocks is not seen; retraining or fine-tuning changes every block.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from ..constants import CODEC_DECODER_PREFIXES
from ..errors import ModelFileError

__all__ = [
    "BUILDER_VERSION",
    "KEY_BUILDER",
    "KEY_DTYPE",
    "KEY_KIND",
    "KEY_LAYOUT",
    "KEY_STAMP",
    "KEY_WEIGHTS",
    "weights_stamp",
]

#: Bumped whenever the graphs' inputs, outputs or state layout change.
BUILDER_VERSION = 2

KEY_KIND = "streamtts.codec.kind"  # "streaming" | "offline"
KEY_BUILDER = "streamtts.codec.builder_version"
KEY_STAMP = "streamtts.codec.weights_stamp"
KEY_WEIGHTS = "streamtts.codec.weights_dir"  # informational: where the weights were
KEY_DTYPE = "streamtts.codec.weight_dtype"
KEY_LAYOUT = "streamtts.codec.layout"  # JSON: frame samples, per-stage state shapes

_WHOLE_FILE = 16 << 20
_BLOCKS = 256
_BLOCK = 4096


def _hash_safetensors(h: hashlib._Hash, path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        if size <= _WHOLE_FILE:
            h.update(f.read())
            return
        (n,) = struct.unpack("<Q", f.read(8))
        h.update(f.read(n))
        start = 8 + n
        span = max(size - start - _BLOCK, 0)
        for i in range(_BLOCKS):
            f.seek(start + span * i // (_BLOCKS - 1))
            h.update(f.read(_BLOCK))


def weights_stamp(folder: str | Path) -> str:
    """The stamp of the checkpoint in ``folder`` (see the module docstring)."""
    folder = Path(folder)
    config = folder / "config.json"
    h = hashlib.sha256(b"streamtts codec weights v1\0")
    try:
        h.update(config.read_bytes())
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            # the shards holding decoder tensors (the encoder's need not be there)
            shards = sorted({f for n, f in weight_map.items() if n.startswith(CODEC_DECODER_PREFIXES)})
            files = [folder / s for s in shards]
        else:
            files = [folder / "model.safetensors"]
        for f in files:
            _hash_safetensors(h, f)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ModelFileError(
            folder,
            "a checkpoint folder with config.json and model.safetensors (or shards)",
            str(exc),
        ) from exc
    return h.hexdigest()
