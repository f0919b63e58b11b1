"""A Hugging Face ``datasets`` folder written with ``save_to_disk`` as a data source (one split).

Columns are matched to the model by name: columns named as its inputs are arrays; else a ``text`` column is
tokenized (``data.tokenizer``) and an ``image`` column preprocessed (``data.preprocess``) as the other file sources
do; a ``label`` or ``labels`` column gives the labels. A ``DatasetDict`` folder (several splits) names its splits.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.file_rows import Item, StratifiedItem, cast_array
from deploy_opt.data.images import preprocess_image
from deploy_opt.data.text_files import TOKEN_INPUTS, load_tokenizer, text_labels, tokenize
from dopt_common.deps import require
from dopt_common.errors import DeployOptError, InputError, one_line
from dopt_common.names import shown

LABEL_COLUMNS = ("label", "labels")


def dataset_items(
    path: Path, specs: tuple[InputSpec, ...], data: DataConfig, tokenizer_dir: str | None, what: str
) -> Iterator[Item | StratifiedItem]:
    """The folder's rows in batches of ``data.batch_size``, as (inputs, label) items."""
    _refuse_splits(path, what)
    table = _load(path, what)
    columns = list(table.column_names)
    label = next((c for c in LABEL_COLUMNS if c in columns), None)
    if data.strata is not None and data.strata not in columns:
        raise InputError(f"{what} '{path}' has no column '{data.strata}' (data.strata); its columns: {columns}")
    convert = _converter(columns, specs, data, tokenizer_dir, path, what)
    for index, batch in enumerate(_rows(table, data.batch_size, path, what)):
        with _broken(path, what, f" in row batch {index}"):
            inputs = convert(batch)
        item: Item = (inputs, text_labels(inputs, None if label is None else np.asarray(batch[label]), data.metric))
        yield item if data.strata is None else StratifiedItem(item, list(batch[data.strata]))


def _refuse_splits(path: Path, what: str) -> None:
    """A ``DatasetDict`` folder (``dataset_dict.json``) holds several splits: refuse it, naming them."""
    splits_file = path / "dataset_dict.json"
    if not splits_file.is_file():
        return
    try:
        splits = json.loads(splits_file.read_text(encoding="utf-8")).get("splits") or ["train"]
    except (ValueError, AttributeError, RecursionError):
        raise InputError(
            f"{what} '{splits_file}' is not a JSON object; fix: write the folder with save_to_disk"
        ) from None
    raise InputError(f"{what} '{path}' holds the splits {splits}; fix: point at one, e.g. '{path}/{splits[0]}'")


def _load(path: Path, what: str) -> Any:
    """The folder's one split; whatever the ``datasets`` library raises for a broken folder is an InputError."""
    datasets = require("datasets", purpose="datasets folders (save_to_disk)", extra="datasets")
    with _broken(path, what):
        state = path / "state.json"
        # an empty split lists no .arrow file, and load_from_disk then fails with a bare IndexError
        shards = json.loads(state.read_text(encoding="utf-8")).get("_data_files") if state.is_file() else None
        table = None if shards == [] else datasets.load_from_disk(str(path))
        rows = 0 if table is None else table.num_rows
    if not rows:
        raise InputError(f"{what} '{path}' has no rows (an empty split); fix: point at a split that holds samples")
    return table


def _rows(table: Any, batch_size: int, path: Path, what: str) -> Iterator[dict[str, list[Any]]]:
    iterator = iter(table.iter(batch_size=batch_size))
    for index in itertools.count():
        with _broken(path, what, f" in row batch {index}"):
            batch = next(iterator, None)
        if batch is None:
            return
        yield batch


@contextlib.contextmanager
def _broken(path: Path, what: str, at: str = "") -> Iterator[None]:
    """Any error but ours from the ``datasets`` library (and PIL, pyarrow beneath it) as one InputError: it raises
    IndexError, KeyError, FileNotFoundError, ArrowInvalid, UnidentifiedImageError … for a broken folder."""
    try:
        yield
    except DeployOptError:
        raise
    except Exception as exc:
        raise InputError(
            f"{what} '{path}' cannot be read{at} ({type(exc).__name__}: {shown(one_line(exc), 160)}); fix: write "
            "it again with Dataset.save_to_disk (every .arrow file, state.json and dataset_info.json)"
        ) from exc


def _texts(column: list[Any], path: Path, what: str) -> list[str]:
    for value in column:
        if not isinstance(value, str):
            raise InputError(
                f"{what} '{path}': column 'text' holds {shown(value, 40, quote=True)}, not a string; fix: give every "
                "row its text"
            )
    return column


def _converter(
    columns: list[str], specs: tuple[InputSpec, ...], data: DataConfig, tokenizer_dir: str | None, path: Path, what: str
) -> Any:
    names = [s.name for s in specs]
    if all(n in columns for n in names):
        return lambda batch: {s.name: cast_array(np.asarray(batch[s.name]), s, path.name, what) for s in specs}
    if "text" in columns and all(n in TOKEN_INPUTS for n in names):
        tokenizer = load_tokenizer(tokenizer_dir, data.max_length, what)
        return lambda batch: tokenize(tokenizer, _texts(batch["text"], path, what), specs)
    if "image" in columns and len(specs) == 1:
        spec, pre = specs[0], data.preprocess
        return lambda batch: {
            spec.name: np.stack(
                [preprocess_image(im, path / f"row {i}", spec, pre, what) for i, im in enumerate(batch["image"])]
            )
        }
    raise InputError(
        f"{what} '{path}' has columns {columns}; the model takes {names}; fix: name columns after the inputs, or "
        "give a 'text' column (token inputs) or an 'image' column (one image input)"
    )
