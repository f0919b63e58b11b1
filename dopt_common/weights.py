"""Model weight files read safely: safetensors headers checked before any library parses them, pickles never run.

A hostile or truncated file must end as one ``CheckpointError`` line (exit 2), never as a traceback, a huge
allocation or code run by the unpickler:

- **safetensors**: the 8-byte header length is capped at ``SAFETENSORS_HEADER_CAP`` (100 MiB) and must fit in
  the file, the header must be a UTF-8 JSON object, and every tensor's data offsets must lie inside the file.
  Only then does the ``safetensors`` package open it.
- **torch pickles** (``pytorch_model.bin``, ``.pt``): the globals the pickle names are listed statically
  (``torch.serialization.get_unsafe_globals_in_checkpoint``) and any not allow-listed for ``weights_only`` is
  refused before loading; loading itself is always ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dopt_common.deps import require
from dopt_common.errors import CheckpointError
from dopt_common.files import regular_input
from dopt_common.names import shown

SAFETENSORS_HEADER_CAP = 100 * 2**20  # bytes; the largest real headers (thousands of tensors) are a few MiB
_SAFETENSORS_FIX = "fix: re-download the file or re-save it (save_pretrained, safetensors.torch.save_file)"
_PICKLE_FIX = "fix: re-download the file, or save a plain state dict (torch.save(model.state_dict(), path))"


def _bad_safetensors(path: Path, fault: str) -> CheckpointError:
    return CheckpointError(f"weights file '{shown(str(path))}' is not valid safetensors: {fault}; {_SAFETENSORS_FIX}")


def check_safetensors(path: str | Path) -> dict[str, Any]:
    """The header of a safetensors file, checked (length cap, JSON object, offsets in the file); CheckpointError."""
    path = regular_input(path, "weights file")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise _bad_safetensors(path, f"it is {size} bytes, shorter than the 8-byte header length")
        length = int.from_bytes(head, "little")
        if length > SAFETENSORS_HEADER_CAP:
            raise _bad_safetensors(path, f"its header claims {length:,} bytes, over the {SAFETENSORS_HEADER_CAP:,} cap")
        if length > size - 8:
            raise _bad_safetensors(path, f"its header claims {length:,} bytes, but the file is {size:,} bytes")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad_safetensors(path, f"its header is not UTF-8 JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise _bad_safetensors(path, f"its header is a JSON {type(header).__name__}, not an object")
    _check_offsets(path, header, size - 8 - length)
    return header


def _check_offsets(path: Path, header: dict[str, Any], data_bytes: int) -> None:
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        valid = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
        if not valid or not 0 <= offsets[0] <= offsets[1] <= data_bytes:
            raise _bad_safetensors(
                path,
                f"tensor '{shown(str(name), 80)}' has data_offsets {shown(repr(offsets), 80)} outside its "
                f"{data_bytes:,} data bytes (truncated?)",
            )


@contextmanager
def open_safetensors(path: str | Path, device: str = "cpu") -> Iterator[Any]:
    """``safetensors.safe_open`` (torch tensors) on a file whose header was checked first."""
    check_safetensors(path)
    safetensors = require("safetensors", purpose="reading safetensors weights", extra="llm")
    try:
        handle = safetensors.safe_open(str(path), framework="pt", device=device)
    except safetensors.SafetensorError as exc:
        raise _bad_safetensors(Path(path), str(exc)) from None
    with handle:
        yield handle


def load_safetensors(path: str | Path) -> dict[str, Any]:
    """Every tensor of a checked safetensors file, on the CPU."""
    check_safetensors(path)
    safetensors = require("safetensors", purpose="reading safetensors weights", extra="llm")
    safetensors_torch = require("safetensors.torch", purpose="reading safetensors weights", extra="llm")
    try:
        return safetensors_torch.load_file(str(path))
    except safetensors.SafetensorError as exc:
        raise _bad_safetensors(Path(path), str(exc)) from None


def check_torch_pickle(path: str | Path) -> None:
    """Refuse a ``torch.save`` file whose pickle names a global ``weights_only`` does not allow (code, not data)."""
    import torch

    path = regular_input(path, "weights file")
    if not zipfile.is_zipfile(path):
        load_torch_weights(path)  # the legacy format cannot be listed statically; weights_only still runs nothing
        return
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as exc:  # torch raises many types for a truncated or foreign zip
        raise CheckpointError(
            f"weights file '{shown(str(path))}' is not a readable torch checkpoint ({type(exc).__name__}); "
            f"{_PICKLE_FIX}"
        ) from None
    if unsafe:
        raise CheckpointError(
            f"weights file '{shown(str(path))}' holds a pickle that calls {', '.join(sorted(unsafe)[:3])} (code, "
            f"not weights); refused unopened; {_PICKLE_FIX}"
        )


def load_torch_weights(path: str | Path) -> Any:
    """``torch.load(weights_only=True)`` on the CPU; a refused, truncated or foreign file is a CheckpointError."""
    import torch

    path = regular_input(path, "weights file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for code in the pickle; RuntimeError, EOFError for a cut file
        raise CheckpointError(
            f"weights file '{shown(str(path))}' cannot be loaded with weights_only=True ({type(exc).__name__}: "
            f"{shown(str(exc).splitlines()[0] if str(exc) else '', 120)}); {_PICKLE_FIX}"
        ) from None


def check_weight_folder(folder: str | Path) -> None:
    """Check every weight file of a Hugging Face folder (safetensors headers, pickle globals) before loading it."""
    folder = Path(folder)
    for path in sorted(folder.iterdir()):
        if path.suffix == ".safetensors":
            check_safetensors(path)
        elif path.name.startswith("pytorch_model") and path.suffix == ".bin":  # what from_pretrained loads
            check_torch_pickle(path)
