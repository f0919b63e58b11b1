"""Data sources by file type, so a build needs no Python data module.

- ``.npy`` / ``.npz``: arrays keyed by input name (an ``.npy`` feeds a one-input model), cut into batches of
  ``data.batch_size`` along axis 0; an ``.npz`` may hold ``labels``. Float and integer arrays are cast to the
  declared dtype of their kind (float64 → float32).
- An image folder: the ImageFolder convention (each sub-folder is a class; ``data.classes`` gives their index
  order, default sorted) or a flat folder without labels; ``data.preprocess`` turns each image into the input
  tensor (``images.py``).
- A ``.txt`` (one sample a line) or ``.jsonl`` (``text`` and an optional ``label`` a line), tokenized with the
  ``tokenizer.json`` of ``data.tokenizer`` (a Hugging Face model folder), truncated to ``data.max_length`` and
  padded per batch to its longest sample.
- A ``datasets`` folder written with ``save_to_disk`` (one split): columns named as the model's inputs (arrays), or
  a ``text`` column (tokenized as above), or an ``image`` column (preprocessed as an image folder's); a ``label``
  or ``labels`` column gives the labels.

Each yields ``(inputs, label)`` items, the data-function contract, which ``sources.iter_batches`` validates. A
sample's id is then the hash of its content, so the same image, row or sentence in calibration and evaluation is
refused as an overlap, and the same samples from an image folder and from an ``.npz`` of it are the same samples.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.arrays import open_array_file
from deploy_opt.data.dataset_folder import dataset_items
from deploy_opt.data.file_rows import Item, StratifiedItem, cast_array
from deploy_opt.data.images import IMAGE_SUFFIXES, load_image
from deploy_opt.data.text_files import (
    TOKEN_INPUTS,
    load_tokenizer,
    read_texts,
    text_labels,
    tokenize,
)
from dopt_common.errors import InputError
from dopt_common.files import regular_input

log = logging.getLogger(__name__)
ARRAY_SUFFIXES = (".npy", ".npz")
TEXT_SUFFIXES = (".txt", ".jsonl")
LABEL_KEYS = ("labels", "label")
DATASET_MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")  # what save_to_disk writes


def file_path(ref: str, base_dir: str | Path) -> Path | None:
    """The path ``ref`` names when it is a file source (an array or text file, or a folder), else None."""
    path = Path(ref) if Path(ref).is_absolute() else Path(base_dir) / ref
    if path.suffix.lower() in ARRAY_SUFFIXES + TEXT_SUFFIXES or path.is_dir():
        return path
    # a device or FIFO (/dev/zero) is a file source too, so that file_items refuses it
    return path if os.path.exists(path) and not os.path.isfile(path) else None


def _model_batch(specs: tuple[InputSpec, ...], data: DataConfig) -> DataConfig:
    """``data`` with ``batch_size`` set to the model's batch when every input declares the same fixed one (a
    detector exported at batch 1 takes one image a run, whatever ``data.batch_size`` says)."""
    fixed = {s.shape[0] if s.shape and isinstance(s.shape[0], int) else None for s in specs}
    if len(fixed) != 1 or None in fixed or fixed == {data.batch_size}:
        return data
    (size,) = fixed
    log.debug("file rows %d at a time: the model's inputs declare batch %d", size, size)
    return dataclasses.replace(data, batch_size=size)


def file_items(
    path: Path, specs: tuple[InputSpec, ...], data: DataConfig, base_dir: str | Path, what: str
) -> Iterator[Item | StratifiedItem]:
    """The items of the file source at ``path``, by its type (``base_dir``: where data.tokenizer is relative to)."""
    if not path.exists():
        raise InputError(f"{what} '{path}' does not exist; fix the path (relative paths are from the config file)")
    if not path.is_dir():
        regular_input(path, what)  # a FIFO or a device would block or never end
    suffix = path.suffix.lower()
    data = _model_batch(specs, data)
    tokenizer = None if data.tokenizer is None else str(Path(base_dir) / data.tokenizer)
    if suffix in ARRAY_SUFFIXES:
        return _array_items(path, specs, data.batch_size, data.strata, what)
    if suffix in TEXT_SUFFIXES:
        return _text_items(path, specs, data, tokenizer, what)
    if any((path / marker).is_file() for marker in DATASET_MARKERS):
        return dataset_items(path, specs, data, tokenizer, what)
    if data.strata is not None:
        raise InputError(
            f"data.strata '{data.strata}' names a column; {what} '{path}' is an image folder (its class is the label)"
        )
    return _image_items(path, specs, data, what)


def _array_items(
    path: Path, specs: tuple[InputSpec, ...], batch_size: int, strata_key: str | None, what: str
) -> Iterator[Item | StratifiedItem]:
    arrays, labels, strata = _read_arrays(path, specs, strata_key, what)
    total = next(iter(arrays.values())).shape[0]
    for name, array in arrays.items():
        if array.shape[0] != total:
            raise InputError(f"{what} '{path.name}': array '{name}' has {array.shape[0]} rows, others {total}")
    if labels is not None and labels.shape[0] != total:
        raise InputError(f"{what} '{path.name}': 'labels' has {labels.shape[0]} rows, the inputs {total}")
    for start in range(0, total, batch_size):
        rows = slice(start, start + batch_size)
        item = ({k: v[rows] for k, v in arrays.items()}, None if labels is None else labels[rows])
        yield item if strata is None else StratifiedItem(item, list(strata[rows]))


def _read_arrays(
    path: Path, specs: tuple[InputSpec, ...], strata_key: str | None, what: str
) -> tuple[dict[str, np.ndarray], Any, Any]:
    """The declared inputs' arrays (cast to their dtypes), the labels and the ``data.strata`` array (None where
    absent), from one read of an .npy or .npz file."""
    loaded = open_array_file(path, what)
    if isinstance(loaded, np.ndarray):
        if len(specs) != 1:
            names = [s.name for s in specs]
            raise InputError(f"{what} '{path.name}' holds one array; the model has inputs {names}: save an .npz")
        found: dict[str, np.ndarray] = {specs[0].name: loaded}
        labels = strata = None
        keys = []
    else:
        with loaded:
            keys = list(loaded.files)
            missing = [s.name for s in specs if s.name not in keys]
            if missing:
                raise InputError(
                    f"{what} '{path.name}' has no array for input(s) {missing}; it holds {keys}; fix: save one "
                    "array per model input under its name (np.savez(file, **{name: array}))"
                )
            found = {s.name: loaded[s.name] for s in specs}
            label_key = next((k for k in LABEL_KEYS if k in keys), None)
            labels = None if label_key is None else loaded[label_key]
            strata = loaded[strata_key] if strata_key in keys else None
    if strata_key is not None and strata is None:
        raise InputError(f"{what} '{path.name}' has no array '{strata_key}' (data.strata); it holds {keys}")
    return {s.name: cast_array(found[s.name], s, path.name, what) for s in specs}, labels, strata


def _image_items(folder: Path, specs: tuple[InputSpec, ...], data: DataConfig, what: str) -> Iterator[Item]:
    if len(specs) != 1:
        raise InputError(f"{what}: an image folder feeds a one-input model; this one takes {[s.name for s in specs]}")
    files, labels = image_files(folder, data.classes, what)
    for start in range(0, len(files), data.batch_size):
        chunk = files[start : start + data.batch_size]
        rows = [load_image(f, specs[0], data.preprocess, what) for f in chunk]
        label = None if labels is None else np.asarray(labels[start : start + data.batch_size], dtype=np.int64)
        yield {specs[0].name: np.stack(rows)}, label


def image_files(folder: Path, classes: tuple[str, ...], what: str) -> tuple[list[Path], list[int] | None]:
    """The folder's images in a fixed order, and each one's class index (None for a flat folder)."""
    subfolders = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subfolders:
        files = _images_in(folder)
        if not files:
            raise InputError(f"{what} '{folder}' holds no images ({', '.join(IMAGE_SUFFIXES)}) and no class folders")
        return files, None
    order = list(classes) or subfolders
    if sorted(order) != subfolders:
        raise InputError(
            f"{what} '{folder}': data.classes {list(classes)} are not its class folders {subfolders}; fix: list "
            "every sub-folder once, in class-index order"
        )
    files, labels = [], []
    for index, name in enumerate(order):
        found = _images_in(folder / name)
        files += found
        labels += [index] * len(found)
    if not files:
        raise InputError(f"{what} '{folder}': its class folders {subfolders} hold no images")
    return files, labels


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _text_items(
    path: Path, specs: tuple[InputSpec, ...], data: DataConfig, tokenizer_dir: str | None, what: str
) -> Iterator[Item | StratifiedItem]:
    unknown = [s.name for s in specs if s.name not in TOKEN_INPUTS]
    if unknown:
        raise InputError(f"{what}: a text file feeds token inputs {list(TOKEN_INPUTS)}; the model also takes {unknown}")
    samples = read_texts(path, what, data.strata)
    tokenizer = load_tokenizer(tokenizer_dir, data.max_length, what)
    for start in range(0, len(samples.texts), data.batch_size):
        rows = slice(start, start + data.batch_size)
        inputs = tokenize(tokenizer, samples.texts[rows], specs)
        label = None if samples.labels is None else np.asarray(samples.labels[rows])
        item = (inputs, text_labels(inputs, label, data.metric))
        yield item if samples.strata is None else StratifiedItem(item, samples.strata[rows])
