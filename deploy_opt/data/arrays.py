"""Reading ``.npy`` / ``.npz`` data files defensively: every array's header is checked before numpy allocates it.

An array file is someone else's bytes. Object arrays (which need pickle: never allowed), 0-d scalars, headers that
claim more than ``MAX_ARRAY_BYTES``, truncated files and zip members with a bad CRC are each one ``InputError``
naming the file, the array and the fix, instead of a ``MemoryError`` or a zip traceback.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from dopt_common.errors import InputError

MAX_ARRAY_BYTES = 16 * 2**30  # 16 GiB: one array past this is refused before it is allocated
READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
FIX = "fix: save it again with np.save / np.savez from numeric arrays"


def open_array_file(path: Path, what: str) -> np.ndarray | NpzReader:
    """The array of an ``.npy``, or a reader of an ``.npz``'s arrays; headers are checked before any allocation."""
    if path.suffix.lower() == ".npz":
        return NpzReader(path, what)
    try:
        with path.open("rb") as handle:
            check_header(handle, path.stat().st_size, f"{what} '{path}'")
        return np.load(path, allow_pickle=False)
    except READ_ERRORS as exc:
        raise InputError(f"{what} '{path}' is not a readable .npy file ({type(exc).__name__}: {exc}); {FIX}") from exc


class NpzReader:
    """An ``.npz`` file's arrays by name (``files``, ``reader[name]``), each checked as it is read."""

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = path, what
        try:
            self._npz = np.load(path, allow_pickle=False)
        except READ_ERRORS as exc:
            raise InputError(
                f"{what} '{path}' is not a readable .npz file ({type(exc).__name__}: {exc}); {FIX}"
            ) from exc
        self.files: list[str] = list(self._npz.files)

    def __getitem__(self, key: str) -> np.ndarray:
        where = f"{self.what} '{self.path}' array '{key}'"
        member = f"{key}.npy" if f"{key}.npy" in self._npz.zip.namelist() else key
        try:
            info = self._npz.zip.getinfo(member)
            with self._npz.zip.open(info) as handle:
                check_header(handle, info.file_size, where)
            return self._npz[key]
        except READ_ERRORS as exc:
            raise InputError(f"{where} cannot be read ({type(exc).__name__}: {exc}); {FIX}") from exc

    def __enter__(self) -> NpzReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._npz.close()


def check_header(handle: IO[bytes], size: int, where: str) -> None:
    """Raise InputError when the ``.npy`` header read from ``handle`` (a stream of ``size`` bytes) describes an
    object array, a 0-d scalar, more than ``MAX_ARRAY_BYTES``, or more bytes than the stream holds."""
    version = np.lib.format.read_magic(handle)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(handle)
    if dtype.hasobject:
        raise InputError(
            f"{where} holds Python objects (dtype {dtype}), which only pickle can load and pickle is never "
            f"allowed; {FIX}"
        )
    if shape == ():
        raise InputError(f"{where} is a 0-d scalar, not rows of samples; fix: save an array with a leading batch axis")
    needed = math.prod(shape) * dtype.itemsize
    if needed > MAX_ARRAY_BYTES:
        raise InputError(
            f"{where} claims shape {list(shape)} of {dtype}: {needed / 2**30:,.1f} GiB, over the "
            f"{MAX_ARRAY_BYTES // 2**30} GiB cap (MAX_ARRAY_BYTES); fix: split the data into smaller files"
        )
    available = size - handle.tell()
    if needed > available:
        raise InputError(
            f"{where} is truncated: its header promises {needed:,} bytes of data, the file holds {available:,}; {FIX}"
        )
