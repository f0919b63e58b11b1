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


# GGUF metadata value types: the fixed-size ones by struct code, then string (8) and array (9).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_KEY = 65_535


def read_gguf_metadata(path: str | Path, keys: tuple[str, ...]) -> dict[str, object]:
    """The scalar or string values of ``keys`` in the GGUF's metadata (absent keys left out), read by walking the
    pairs in a memory map and skipping every other value by its size: a 262k-token vocabulary costs milliseconds,
    where a full reader parses it all. Stops at the last wanted key; ModelError for a malformed file."""
    import mmap

    header = read_gguf_header(path)
    path = Path(path)
    found: dict[str, object] = {}
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        reader = _Walker(data, header.byte_order, path)
        for _ in range(header.pairs):
            key = reader.string(limit=_MAX_KEY)
            kind = reader.unpack("I")
            if key in keys and (kind in _SCALARS or kind == _STRING):
                found[key] = reader.string() if kind == _STRING else reader.unpack(_SCALARS[kind])
                if len(found) == len(keys):
                    break
            else:
                reader.skip(kind)
    return found


class _Walker:
    """A cursor over a GGUF's bytes that reads or skips metadata values, checking each step stays in the file."""

    def __init__(self, data: object, order: str, path: Path) -> None:
        self.data, self.order, self.path, self.at = data, order, path, 24

    def take(self, size: int) -> bytes:
        end = self.at + size
        if size < 0 or end > len(self.data):  # type: ignore[arg-type]
            raise _bad(self.path, f"has a metadata value running past its end at byte {self.at:,}")
        chunk, self.at = self.data[self.at : end], end  # type: ignore[index]
        return chunk

    def unpack(self, code: str) -> object:
        return struct.unpack(self.order + code, self.take(struct.calcsize(code)))[0]

    def string(self, limit: int | None = None) -> str:
        size = int(self.unpack("Q"))  # type: ignore[call-overload]
        if limit is not None and size > limit:
            raise _bad(self.path, f"has a metadata key of {size:,} bytes at byte {self.at:,}")
        return self.take(size).decode("utf-8", "replace")

    def skip(self, kind: int, depth: int = 0) -> None:
        if kind in _SCALARS:
            self.take(struct.calcsize(_SCALARS[kind]))
        elif kind == _STRING:
            self.take(int(self.unpack("Q")))  # type: ignore[call-overload]
        elif kind == _ARRAY and depth < 2:
            inner, count = int(self.unpack("I")), int(self.unpack("Q"))  # type: ignore[call-overload]
            if inner in _SCALARS:
                self.take(count * struct.calcsize(_SCALARS[inner]))
            else:
                for _ in range(count):
                    self.skip(inner, depth + 1)
        else:
            raise _bad(self.path, f"has a metadata value of unknown type {kind} at byte {self.at:,}")


def gguf_tensor_types(path: str | Path) -> dict[str, int]:
    """How many tensors of each ggml type the GGUF at ``path`` holds (``{"Q4_K": 120, "Q6_K": 25, "F32": 65}``,
    most first), from the tensor infos through a memory map, past the metadata walked as ``read_gguf_metadata``
    walks it: no tensor data is read, and a large vocabulary costs milliseconds."""
    import mmap

    gguf = require("gguf", purpose="reading a GGUF's tensor types", extra="llm")
    header = read_gguf_header(path)
    path = Path(path)
    counts: Counter[str] = Counter()
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        reader = _Walker(data, header.byte_order, path)
        for _ in range(header.pairs):
            reader.string(limit=_MAX_KEY)
            reader.skip(int(reader.unpack("I")))  # type: ignore[call-overload]
        for _ in range(header.tensors):
            reader.string(limit=_MAX_KEY)
            dims = int(reader.unpack("I"))  # type: ignore[call-overload]
            reader.take(8 * dims)
            kind = int(reader.unpack("I"))  # type: ignore[call-overload]
            reader.take(8)  # the data offset
            try:
                counts[gguf.GGMLQuantizationType(kind).name] += 1
            except ValueError:
                raise _bad(path, f"has a tensor of unknown ggml type {kind}") from None
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
