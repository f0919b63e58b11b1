"""A GGUF file's fixed header read and checked before any GGUF reader sees it.

The header is ``GGUF``, a uint32 version and two uint64 counts (tensors, metadata pairs). A hostile file that
claims 2**62 tensors makes a reader allocate or loop for ever, so each count is capped at ``GGUF_COUNT_CAP``
(1,000,000; real models have hundreds of tensors and a few dozen pairs) and must fit in the file's size.
``gguf_tensor_types`` then counts the tensors by ggml type (Q4_K, Q6_K, F32, ...) from their infos alone.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from dopt_common.deps import require
from dopt_common.errors import ModelError
from dopt_common.files import regular_input
from dopt_common.names import shown

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_COUNT_CAP = 1_000_000
# The smallest possible entries: a tensor info is a name length, n_dims, a type and an offset; a pair is a
# key length, a type and a one-byte value.
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8
_MIN_PAIR_BYTES = 8 + 4 + 1
_FIX = "fix: re-download it or convert the model again with llama.cpp's convert_hf_to_gguf.py"


@dataclass(frozen=True)
class GGUFHeader:
    """The fixed header of a GGUF file."""

    version: int
    tensors: int
    pairs: int
    byte_order: str  # "<" little-endian (usual) or ">" big-endian


def _bad(path: Path, fault: str) -> ModelError:
    return ModelError(f"GGUF file '{shown(str(path))}' {fault}; {_FIX}")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF at ``path``, checked (magic, version, counts capped and fitting); else ModelError."""
    path = regular_input(path, "GGUF file")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(24)
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise _bad(path, "does not start with a GGUF header (magic 'GGUF', version, counts)")
    order = "<"
    version = struct.unpack("<I", head[4:8])[0]
    if version & 0xFFFF == 0:  # a big-endian file, as the gguf package detects it
        order, version = ">", struct.unpack(">I", head[4:8])[0]
    if version not in GGUF_VERSIONS:
        raise _bad(path, f"has version {version}; readable versions are {', '.join(map(str, GGUF_VERSIONS))}")
    tensors, pairs = struct.unpack(f"{order}QQ", head[8:24])
    for what, count in (("tensors", tensors), ("metadata pairs", pairs)):
        if count > GGUF_COUNT_CAP:
            raise _bad(path, f"claims {count:,} {what}, over the {GGUF_COUNT_CAP:,} cap")
    need = 24 + tensors * _MIN_TENSOR_BYTES + pairs * _MIN_PAIR_BYTES
    if need > size:
        raise _bad(
            path,
            f"claims {tensors:,} tensors and {pairs:,} metadata pairs, which need at least {need:,} bytes, "
            f"but it is {size:,} bytes (truncated?)",
        )
    return GGUFHeader(version, tensors, pairs, order)


def gguf_tensor_types(path: str | Path) -> dict[str, int]:
    """How many tensors of each ggml type the GGUF at ``path`` holds (``{"Q4_K": 120, "Q6_K": 25, "F32": 65}``,
    most first), from the tensor infos through a memory map: no tensor data is read."""
    read_gguf_header(path)  # the counts are checked before the reader trusts them
    gguf = require("gguf", purpose="reading a GGUF's tensor types", extra="llm")
    try:
        counts = Counter(tensor.tensor_type.name for tensor in gguf.GGUFReader(str(path), "r").tensors)
    except (ValueError, KeyError, OSError) as exc:
        raise _bad(Path(path), f"has tensor infos the gguf package cannot read ({exc})") from exc
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
