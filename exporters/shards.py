"""Sharded safetensors written in a stream: tensors go to disk as they come, shards are assembled at the end.

A model larger than memory cannot hand ``safetensors.torch.save_file`` one dict of every tensor. ``ShardWriter``
spools each group of tensors (one decoder layer's, say) to its own small file as soon as it exists, and
``finish`` copies them, one tensor at a time, into shards of at most ``max_shard_bytes``: the Hugging Face layout
(``model.safetensors`` when one shard suffices, else ``model-0000i-of-0000N.safetensors`` and
``model.safetensors.index.json``). Peak memory is one group plus one tensor, whatever the model's size.

A shard's bytes are those ``save_file`` writes for the same tensors (``tests/test_llm_onload.py`` compares them):
the header is compact JSON with ``__metadata__`` first and the tensors ordered by dtype (widest first, in
safetensors' ``Dtype`` order) then name, padded with spaces to 8 bytes; the data follows in the same order.
So a run that feeds the same groups in the same order writes the same files, in memory or streamed.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from dopt_common.deps import require
from dopt_common.errors import OutputError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 * 1024**3
# safetensors' Dtype enum order (safetensors/src/tensor.rs); serialization sorts by it, largest first.
_DTYPE_ORDER = ("BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64")
_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    spool: Path


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _header(entries: list[_Entry], metadata: Mapping[str, str]) -> bytes:
    fields: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for entry in entries:
        fields[entry.name] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    text = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _serialization_order(entries: list[_Entry]) -> list[_Entry]:
    return sorted(entries, key=lambda e: (-_DTYPE_ORDER.index(e.dtype), e.name))


class ShardWriter:
    """Spool groups of tensors into ``folder`` as they are made; ``finish`` writes the shards and the index."""

    def __init__(self, folder: str | os.PathLike[str], max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        self.folder = Path(folder)
        self.max_shard_bytes = max_shard_bytes
        self._spool_dir = self.folder / ".spool"
        self._entries: list[_Entry] = []
        self._names: set[str] = set()

    def add(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Spool one group (kept together in one shard unless it alone exceeds the shard size)."""
        if not tensors:
            return
        safetensors_torch = require("safetensors.torch", purpose="writing a checkpoint", extra="llm")
        for name, tensor in tensors.items():
            if name in self._names:
                raise OutputError(f"tensor '{name}' was written twice; a checkpoint holds each name once")
            if tensor.dtype not in _DTYPES:
                raise OutputError(f"tensor '{name}' has dtype {tensor.dtype}, which this writer does not store")
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        spool = self._spool_dir / f"{len(self._entries):08d}.safetensors"
        safetensors_torch.save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(spool))
        for name, tensor in tensors.items():
            self._names.add(name)
            nbytes = tensor.numel() * tensor.element_size()
            self._entries.append(_Entry(name, _DTYPES[tensor.dtype], tuple(tensor.shape), nbytes, spool))

    def _plan(self) -> list[list[_Entry]]:
        shards: list[list[_Entry]] = [[]]
        size = 0
        groups: dict[Path, list[_Entry]] = {}
        for entry in self._entries:
            groups.setdefault(entry.spool, []).append(entry)
        for group in groups.values():
            group_bytes = sum(e.nbytes for e in group)
            if shards[-1] and size + group_bytes > self.max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].extend(group)
            size += group_bytes
        return shards

    def finish(self, metadata: Mapping[str, str] | None = None) -> list[Path]:
        """Write the shards (and the index when there are several), remove the spool; the shard paths."""
        from safetensors import safe_open

        metadata = {"format": "pt", **(metadata or {})}
        shards = self._plan()
        count = len(shards)
        names = [SINGLE_FILE] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
        weight_map: dict[str, str] = {}
        for name, shard in zip(names, shards, strict=True):
            ordered = _serialization_order(shard)
            with open(self.folder / name, "wb") as out:
                out.write(_header(ordered, metadata))
                for entry in ordered:
                    # Opened per tensor: a spool kept open stays mapped, and its pages would count as resident.
                    with safe_open(str(entry.spool), framework="pt") as spool:
                        out.write(_raw_bytes(spool.get_tensor(entry.name)))
                    weight_map[entry.name] = name
        if count > 1:
            total = sum(e.nbytes for e in self._entries)
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (self.folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        for spool in {e.spool for e in self._entries}:
            spool.unlink()
        if self._spool_dir.is_dir():
            self._spool_dir.rmdir()
        return [self.folder / name for name in names]
