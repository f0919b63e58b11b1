"""GGUF export: group-wise integer codes packed into ggml's Q4_0, Q4_1 or Q8_0 blocks, in a copy of a source GGUF.

ggml's blocks are 32 consecutive values of a weight row (along ``in_features``), with fp16 parameters (ggml-common.h):

- ``Q4_0``: ``d``, 16 bytes of nibbles; ``x = (q - 8) * d``. Symmetric 4-bit codes with zero point 8 at group 32.
- ``Q4_1``: ``d``, ``m``, 16 bytes of nibbles; ``x = q * d + m``. Asymmetric 4-bit: ``m = -zero * scale``.
- ``Q8_0``: ``d``, 32 int8; ``x = q * d``. Symmetric 8-bit at group 32.

Nibbles: byte ``j`` of a block holds value ``j`` in its low half and value ``j + 16`` in its high half.

The writer copies the source GGUF's metadata (architecture, tokenizer, chat template) and every tensor it is not
given, byte for byte, and writes the given ones in its place (packed, or F32 for a float array), so llama.cpp
loads the result as it loads the source.
Tensors are named as in GGUF (``blk.0.attn_q.weight``); llama.cpp stores a llama's q/k rows permuted for its rotary
layout (``permute_qk``). Never imports deploy_opt.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.deps import require

log = logging.getLogger(__name__)

BLOCK = 32
# ggml's general.file_type (LLAMA_FTYPE_MOSTLY_*) for a file whose big tensors are mostly of one type.
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7}


@dataclass(frozen=True)
class PackedTensor:
    """One tensor in ggml's block layout: ``data`` is uint8 [rows, bytes per row]; ``qtype`` Q4_0/Q4_1/Q8_0."""

    data: np.ndarray
    qtype: str


def _require_gguf() -> Any:
    return require("gguf", purpose="GGUF export", extra="llm")


def _check_blocks(codes: np.ndarray, params: np.ndarray) -> tuple[int, int]:
    rows, cols = codes.shape
    if cols % BLOCK or params.shape != (rows, cols // BLOCK):
        raise ValueError(f"codes {codes.shape} and parameters {params.shape} do not form blocks of {BLOCK}")
    return rows, cols // BLOCK


def _nibbles(codes: np.ndarray, rows: int, blocks: int) -> np.ndarray:
    q = codes.astype(np.uint8).reshape(rows, blocks, BLOCK)
    if q.max(initial=0) > 15:
        raise ValueError("4-bit codes must be in 0..15")
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def _fp16_bytes(values: np.ndarray, rows: int, blocks: int) -> np.ndarray:
    return values.astype(np.float16).reshape(rows, blocks, 1).view(np.uint8).reshape(rows, blocks, 2)


def pack_q4_0(codes: np.ndarray, d: np.ndarray) -> PackedTensor:
    """Codes [rows, cols] in 0..15 (zero point 8) and scales [rows, cols/32] → Q4_0 (18 bytes per block)."""
    rows, blocks = _check_blocks(codes, d)
    data = np.concatenate([_fp16_bytes(d, rows, blocks), _nibbles(codes, rows, blocks)], axis=-1)
    return PackedTensor(data.reshape(rows, blocks * 18), "Q4_0")


def pack_q4_1(codes: np.ndarray, d: np.ndarray, m: np.ndarray) -> PackedTensor:
    """Codes [rows, cols] in 0..15, scales and minimums [rows, cols/32] → Q4_1 (20 bytes per block)."""
    rows, blocks = _check_blocks(codes, d)
    parts = [_fp16_bytes(d, rows, blocks), _fp16_bytes(m, rows, blocks), _nibbles(codes, rows, blocks)]
    return PackedTensor(np.concatenate(parts, axis=-1).reshape(rows, blocks * 20), "Q4_1")


def pack_q8_0(codes: np.ndarray, d: np.ndarray) -> PackedTensor:
    """Signed codes [rows, cols] in -127..127 and scales [rows, cols/32] → Q8_0 (34 bytes per block)."""
    rows, blocks = _check_blocks(codes, d)
    q = codes.astype(np.int8).reshape(rows, blocks, BLOCK).view(np.uint8)
    data = np.concatenate([_fp16_bytes(d, rows, blocks), q], axis=-1)
    return PackedTensor(data.reshape(rows, blocks * 34), "Q8_0")


def permute_qk(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for a llama (convert_hf_to_gguf.py ``LlamaModel.permute``): per head, the two
    rotary halves interleaved. ``n_head`` is the head count of that projection (kv heads for k)."""
    shape = rows.shape
    return rows.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def unpermute_qk(rows: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`permute_qk`: GGUF row order back to Hugging Face's."""
    shape = rows.shape
    return rows.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def write_gguf(source: Path, out: Path, tensors: Mapping[str, PackedTensor | np.ndarray]) -> dict[str, Any]:
    """Write ``out``: ``source``'s metadata and tensors, with ``tensors`` (by GGUF name) in place of its own; a
    float array is written as F32."""
    gguf = _require_gguf()
    reader = gguf.GGUFReader(str(source))
    names = {t.name for t in reader.tensors}
    unknown = sorted(set(tensors) - names)
    if unknown:
        raise ValueError(f"tensors {unknown[:3]} are not in the source GGUF {source.name}")
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    kinds = sorted({t.qtype for t in tensors.values() if isinstance(t, PackedTensor)})
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = FILE_TYPES[kinds[0]] if name == "general.file_type" and len(kinds) == 1 else field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub)
    for tensor in reader.tensors:
        packed = tensors.get(tensor.name)
        if packed is None:  # copied as it is: its type, shape and bytes
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
            continue
        if isinstance(packed, PackedTensor):
            qtype = getattr(gguf.GGMLQuantizationType, packed.qtype)
            writer.add_tensor(tensor.name, packed.data, raw_shape=packed.data.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, np.ascontiguousarray(packed, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    floats = sum(not isinstance(t, PackedTensor) for t in tensors.values())
    return {
        "architecture": arch,
        "tensors": len(reader.tensors),
        "replaced": len(tensors) - floats,
        "replaced_f32": floats,
        "types": kinds,
        "bytes": out.stat().st_size,
    }


def read_gguf(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF dequantized to float32 by the gguf package, shaped [rows, cols] as stored."""
    gguf = _require_gguf()
    reader = gguf.GGUFReader(str(path))
    out = {}
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        out[tensor.name] = np.asarray(values, dtype=np.float32)
    return out


def tensor_types(path: Path) -> dict[str, str]:
    """Each tensor's ggml type name (Q4_0, F32, ...)."""
    gguf = _require_gguf()
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
